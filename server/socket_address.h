// The IP address and port of either end of a connected socket, as text
// (what httplib::Stream's get_remote/local_ip_and_port report). Shared by
// the HTTP servers' streams (server/deadline_http_server.cc,
// server/http_connection_io.cc).
#pragma once

#include <string>

namespace drt::server {

enum class SocketEnd { kPeer, kLocal };

// Sets `ip` ("" when unknown or not IPv4/IPv6) and `port` (0 then).
void GetSocketAddress(int sock, SocketEnd end, std::string& ip, int& port);

}  // namespace drt::server

// GetSocketAddress (server/socket_address.h), shared by the HTTP servers'
// streams: both ends of a loopback connection, and a socket with no peer.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "server/socket_address.h"

namespace drt::server {
namespace {

TEST_CASE("socket address: both ends of a loopback connection", "[http][server]") {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(listen(listener, 1) == 0);
  socklen_t length = sizeof(address);
  REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const int server_port = ntohs(address.sin_port);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  const int accepted = accept(listener, nullptr, nullptr);
  REQUIRE(accepted >= 0);

  std::string ip;
  int port = -1;
  GetSocketAddress(accepted, SocketEnd::kLocal, ip, port);
  CHECK(ip == "127.0.0.1");
  CHECK(port == server_port);
  GetSocketAddress(client, SocketEnd::kLocal, ip, port);
  const int client_port = port;
  CHECK(client_port > 0);
  CHECK(client_port != server_port);
  GetSocketAddress(accepted, SocketEnd::kPeer, ip, port);
  CHECK(ip == "127.0.0.1");
  CHECK(port == client_port);

  // No peer: nothing known.
  GetSocketAddress(listener, SocketEnd::kPeer, ip, port);
  CHECK(ip.empty());
  CHECK(port == 0);
  close(accepted);
  close(client);
  close(listener);
}

}  // namespace
}  // namespace drt::server

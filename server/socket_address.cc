#include "server/socket_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace drt::server {

void GetSocketAddress(int sock, SocketEnd end, std::string& ip, int& port) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  ip.clear();
  port = 0;
  auto* raw = reinterpret_cast<sockaddr*>(&address);
  const int got = end == SocketEnd::kPeer ? getpeername(sock, raw, &length)
                                          : getsockname(sock, raw, &length);
  if (got != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    port = ntohs(v4->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    port = ntohs(v6->sin6_port);
  }
  ip = text;
}

}  // namespace drt::server

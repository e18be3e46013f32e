// The OpenAI API's connection stream (server/http_connection_io.h) once the
// server is stopping: a write to a client that reads still goes (the end of
// an answer, an error event and [DONE], must not be cut off), a write to one
// that does not read gives up within the bounded wait, and a read takes only
// what has arrived.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "server/http_connection_io.h"

namespace drt::server {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct SocketPair {
  SocketPair() { REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0); }
  ~SocketPair() {
    close(fds[0]);
    close(fds[1]);
  }
  int fds[2] = {-1, -1};
};

TEST_CASE("connection stream: once stopping, writes to a reading client still go",
          "[openai][server]") {
  SocketPair pair;
  std::atomic<bool> stopping{true};
  const auto far = Clock::now() + std::chrono::seconds(60);
  ConnectionStream stream(pair.fds[0], far, far, std::chrono::seconds(60), stopping);
  const std::string end = "data: [DONE]\n\n0\r\n\r\n";
  CHECK(stream.is_writable());
  REQUIRE(stream.write(end.data(), end.size()) == static_cast<ssize_t>(end.size()));
  std::string received(end.size(), '\0');
  REQUIRE(recv(pair.fds[1], received.data(), received.size(), MSG_WAITALL) ==
          static_cast<ssize_t>(end.size()));
  CHECK(received == end);

  // A read takes what has arrived, and gives up at once when nothing has.
  REQUIRE(send(pair.fds[1], "GET", 3, 0) == 3);
  char buffer[8];
  CHECK(stream.read(buffer, sizeof(buffer)) == 3);
  const auto start = Clock::now();
  CHECK(stream.read(buffer, sizeof(buffer)) == -1);
  CHECK(SecondsSince(start) < 0.5);
}

TEST_CASE("connection stream: once stopping, a write to a client that does not read gives up "
          "within the bounded wait", "[openai][server]") {
  SocketPair pair;
  std::atomic<bool> stopping{false};
  const auto far = Clock::now() + std::chrono::seconds(60);
  ConnectionStream stream(pair.fds[0], far, far, std::chrono::seconds(60), stopping);
  // Fill the socket's buffers: the peer never reads.
  const std::vector<char> block(64 << 10, 'x');
  while (send(pair.fds[0], block.data(), block.size(), MSG_DONTWAIT) > 0) {
  }
  stopping.store(true);
  const auto start = Clock::now();
  CHECK(stream.write(block.data(), block.size()) == -1);
  const double seconds = SecondsSince(start);
  // kStoppingWriteWait (1 s), then 100 ms polls; 3 s leaves room for load.
  CHECK(seconds >= 0.9);
  CHECK(seconds < 3);
}

}  // namespace
}  // namespace drt::server

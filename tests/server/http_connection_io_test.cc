// The OpenAI API's connection stream (server/http_connection_io.h) once the
// server is stopping: a write to a client that reads still goes (the end of
// an answer, an error event and [DONE], must not be cut off), a write to one
// that does not read gives up within the bounded wait, and reads end 0.1 s
// after the first that saw it; a sender that keeps the buffer full cannot
// hold a read past its deadline, nor past a stop.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
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

  // A read takes what has arrived, and gives up within kStoppingReadWait
  // (0.1 s) when nothing has.
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

// Keeps `fd`'s peer supplied with bytes, a thread of its own, until stopped:
// the socket's buffers are filled first, then topped up.
struct Flood {
  explicit Flood(int fd)
      : thread([this, fd] {
          const std::vector<char> block(64 << 10, 'x');
          while (!stop.load()) send(fd, block.data(), block.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        }) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the buffers fill
  }
  ~Flood() {
    stop.store(true);
    thread.join();
  }
  std::atomic<bool> stop{false};
  std::thread thread;
};

// Reads a byte at a time, as httplib reads headers (so the sender stays
// ahead), until a read fails; the seconds that took (capped by `limit`).
double ReadUntilFailure(ConnectionStream& stream, double limit) {
  const auto start = Clock::now();
  char byte;
  while (stream.read(&byte, 1) > 0 && SecondsSince(start) < limit) {
  }
  return SecondsSince(start);
}

TEST_CASE("connection stream: a sender that keeps the buffer full cannot outlive the read "
          "deadline or a stop", "[openai][server]") {
  SECTION("the header deadline") {
    SocketPair pair;
    std::atomic<bool> stopping{false};
    const auto deadline = Clock::now() + std::chrono::milliseconds(300);
    ConnectionStream stream(pair.fds[0], deadline, deadline + std::chrono::seconds(60),
                            std::chrono::seconds(60), stopping);
    Flood flood(pair.fds[1]);
    // 0.3 s, then the next read fails (before: each read found bytes
    // pending and went on, 10 s here). 2 s leaves room for load.
    CHECK(ReadUntilFailure(stream, 10) < 2);
  }
  SECTION("stopping") {
    SocketPair pair;
    std::atomic<bool> stopping{false};
    const auto far = Clock::now() + std::chrono::seconds(60);
    ConnectionStream stream(pair.fds[0], far, far, std::chrono::seconds(60), stopping);
    Flood flood(pair.fds[1]);
    stopping.store(true);
    // kStoppingReadWait (0.1 s) from the first read that saw it (before:
    // counted afresh per read, so never while bytes kept coming).
    CHECK(ReadUntilFailure(stream, 10) < 2);
  }
}

}  // namespace
}  // namespace drt::server

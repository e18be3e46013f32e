#include "server/http_connection_io.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "server/socket_address.h"

namespace drt::server {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

ConnectionStream::ConnectionStream(socket_t sock, Clock::time_point header_deadline,
                                   Clock::time_point request_deadline,
                                   std::chrono::milliseconds write_timeout,
                                   const std::atomic<bool>& stopping)
    : sock_(sock),
      header_deadline_(header_deadline),
      request_deadline_(std::max(header_deadline, request_deadline)),
      write_timeout_(write_timeout),
      stopping_(stopping) {}

bool ConnectionStream::is_readable() const { return Wait(POLLIN, ReadDeadline()); }

bool ConnectionStream::is_writable() const {
  return Wait(POLLOUT, Clock::now() + write_timeout_);
}

Clock::time_point ConnectionStream::ReadDeadline() const {
  return headers_done_ ? request_deadline_ : header_deadline_;
}

void ConnectionStream::Track(const char* data, size_t n) {
  for (size_t i = 0; i < n && !headers_done_; ++i) {
    if (data[i] == '\n') {
      // Only CRLF ends the headers: httplib (built without
      // CPPHTTPLIB_ALLOW_LF_AS_LINE_TERMINATOR) skips a bare-LF line and
      // keeps reading headers, so it must keep the header deadline.
      const bool empty = line_bytes_ == 1 && line_is_cr_;
      if (empty && seen_line_) headers_done_ = true;
      if (line_bytes_ > 0 && !empty) seen_line_ = true;
      line_bytes_ = 0;
    } else {
      ++line_bytes_;
      line_is_cr_ = line_bytes_ == 1 && data[i] == '\r';
    }
  }
}

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  const ssize_t n =
      recv_buffer_.Read(sock_, ptr, size, [this] { return Wait(POLLIN, ReadDeadline()); });
  if (n > 0) Track(ptr, static_cast<size_t>(n));
  return n;
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  if (!Wait(POLLOUT, Clock::now() + write_timeout_)) return -1;
  return send(sock_, ptr, size, MSG_NOSIGNAL);
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  GetSocketAddress(sock_, SocketEnd::kPeer, ip, port);
}

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const {
  GetSocketAddress(sock_, SocketEnd::kLocal, ip, port);
}

bool ConnectionStream::Wait(short events, Clock::time_point deadline) const {
  const bool reading = (events & POLLIN) != 0;
  bool stopping_seen = false;
  while (true) {
    if (!stopping_seen && stopping_.load()) {
      stopping_seen = true;
      // Stopping: reads end kStoppingReadWait after the first one that saw
      // it, once for the stream (Stop does not wait for a client still
      // sending its request, however fast); a write still waits, but at
      // most kStoppingWriteWait, so that the end of an answer (the last
      // chunk, an error event, [DONE]) reaches a client that reads.
      if (reading) {
        if (!stop_reads_by_.has_value()) stop_reads_by_ = Clock::now() + kStoppingReadWait;
        deadline = std::min(deadline, *stop_reads_by_);
      } else {
        deadline = std::min(deadline, Clock::now() + kStoppingWriteWait);
      }
    }
    // Rounded up, so that a wait gives up at its deadline, not up to 1 ms
    // before it (the OpenAI API tells a body that timed out, 408, by the
    // time having passed when the read failed).
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    // A read past its deadline fails even with bytes pending; a write that
    // can go at once still goes (the poll below, with no wait).
    if (reading && deadline <= Clock::now()) return false;
    pollfd p{sock_, events, 0};
    const int ready =
        poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 100)));
    if (ready > 0) return (p.revents & (events | POLLHUP | POLLERR)) != 0;
    if (ready < 0 && errno != EINTR) return false;
    if (left.count() <= 0) return false;
  }
}

DisconnectWatch::DisconnectWatch(socket_t sock, std::function<void()> on_disconnect)
    : thread_([this, sock, on_disconnect = std::move(on_disconnect)] {
        while (!stop_.load()) {
          pollfd p{sock, POLLRDHUP, 0};
          const int ready = poll(&p, 1, 50);
          if (ready > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) {
            on_disconnect();
            return;
          }
          if (ready < 0 && errno != EINTR) return;
        }
      }) {}

DisconnectWatch::~DisconnectWatch() {
  stop_.store(true);
  thread_.join();
}

}  // namespace drt::server

#include "server/deadline_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "server/connection_pool.h"
#include "server/recv_buffer.h"
#include "server/socket_address.h"

namespace drt::server {
namespace {

using Clock = std::chrono::steady_clock;

// A socket stream whose every read and write waits at most until one
// deadline for the whole connection.
class DeadlineStream : public httplib::Stream {
 public:
  DeadlineStream(socket_t sock, Clock::time_point deadline) : sock_(sock), deadline_(deadline) {}

  bool is_readable() const override { return Wait(POLLIN); }
  bool is_writable() const override { return Wait(POLLOUT); }

  ssize_t read(char* ptr, size_t size) override {
    return recv_buffer_.Read(sock_, ptr, size, [this] { return Wait(POLLIN); });
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!Wait(POLLOUT)) return -1;
    return send(sock_, ptr, size, MSG_NOSIGNAL);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    GetSocketAddress(sock_, SocketEnd::kPeer, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    GetSocketAddress(sock_, SocketEnd::kLocal, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  // Whether `events` became ready before the deadline.
  bool Wait(short events) const {
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{sock_, events, 0};
      const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
      if (ready > 0) return (p.revents & (events | POLLHUP | POLLERR)) != 0;
      if (ready == 0) return false;
      if (errno != EINTR) return false;
    }
  }

  socket_t sock_;
  Clock::time_point deadline_;
  RecvBuffer recv_buffer_;
};

}  // namespace

DeadlineHttpServer::DeadlineHttpServer(DeadlineHttpOptions options)
    : options_(options),
      counters_(std::make_unique<ConnectionPoolCounters>()),
      pool_(std::make_unique<ConnectionPool>(
          ConnectionPoolOptions{options_.max_connections, options_.max_waiting,
                                options_.request_deadline, options_.start_thread,
                                CannedResponse(503, "Service Unavailable", "text/plain",
                                               "overloaded: no thread was free to serve this "
                                               "connection before its deadline",
                                               /*retry_after_seconds=*/0)},
          [this](socket_t sock, Clock::time_point deadline) { Serve(sock, deadline); },
          *counters_)) {
  new_task_queue = [this] { return new InlineAcceptQueue([this] { pool_->Drain(); }); };
}

// pool_ is the last member, so it goes first: its destructor drains it
// (joins every serving thread) while everything Serve uses, the base class
// and the counters, is still there.
DeadlineHttpServer::~DeadlineHttpServer() = default;

int64_t DeadlineHttpServer::connections_expired_in_queue() const {
  return counters_->expired.load();
}
int64_t DeadlineHttpServer::connections_rejected() const { return counters_->rejected.load(); }
int64_t DeadlineHttpServer::thread_start_failures() const {
  return counters_->thread_start_failures.load();
}

bool DeadlineHttpServer::process_and_close_socket(socket_t sock) {
  pool_->Push(sock, Clock::now());
  return true;
}

void DeadlineHttpServer::Serve(socket_t sock, Clock::time_point deadline) {
  DeadlineStream stream(sock, deadline);
  bool connection_closed = false;
  process_request(stream, /*close_connection=*/true, connection_closed, nullptr);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

}  // namespace drt::server

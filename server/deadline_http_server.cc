#include "server/deadline_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace drt::server {
namespace {

using Clock = std::chrono::steady_clock;

// httplib's TaskQueue for the accept loop: runs each task at once on the
// accept thread (the task is process_and_close_socket, which only queues
// the socket with its accept time), and on shutdown drains the pool.
class InlineAcceptQueue : public httplib::TaskQueue {
 public:
  explicit InlineAcceptQueue(std::function<void()> on_shutdown)
      : on_shutdown_(std::move(on_shutdown)) {}
  void enqueue(std::function<void()> task) override { task(); }
  void shutdown() override { on_shutdown_(); }

 private:
  std::function<void()> on_shutdown_;
};

}  // namespace

// Accepted sockets waiting for a thread, and the threads: one is started
// whenever a socket would otherwise wait, up to max_threads; started threads
// stay for later sockets until Drain. A socket whose deadline passed while
// it waited is closed unserved; at most max_waiting wait.
class DeadlineHttpServer::ConnectionPool {
 public:
  using Serve = std::function<void(socket_t, Clock::time_point deadline)>;
  ConnectionPool(size_t max_threads, size_t max_waiting, std::chrono::milliseconds deadline,
                 Serve serve, std::atomic<int64_t>& expired, std::atomic<int64_t>& rejected)
      : max_threads_(std::max<size_t>(max_threads, 1)),
        max_waiting_(max_waiting > 0 ? max_waiting : 4 * max_threads_),
        deadline_(deadline),
        serve_(std::move(serve)),
        expired_(expired),
        rejected_(rejected) {}
  ~ConnectionPool() { Drain(); }

  // On the accept thread, in accept order (so waiting_ is in deadline
  // order, the earliest at the front).
  void Push(socket_t sock, Clock::time_point accepted) {
    std::lock_guard<std::mutex> lock(mutex_);
    // Expired ones go now, not when a thread comes free (which may be a
    // whole deadline away when slow clients hold them all).
    while (!waiting_.empty() && accepted >= waiting_.front().deadline) {
      ::close(waiting_.front().sock);
      waiting_.pop_front();
      expired_.fetch_add(1);
    }
    // (Sockets that idle threads are about to take do not count.)
    if (waiting_.size() >= max_waiting_ + idle_) {
      ::close(sock);
      rejected_.fetch_add(1);
      return;
    }
    waiting_.push_back({sock, accepted + deadline_});
    if (waiting_.size() > idle_ && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { Work(); });
    }
    ready_.notify_one();
  }

  // Serves (or, past their deadlines, closes) the waiting sockets, then
  // joins every thread; the pool can take sockets again afterwards.
  void Drain() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads.swap(threads_);
    }
    for (std::thread& thread : threads) thread.join();
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = false;
    idle_ = 0;
  }

 private:
  struct Waiting {
    socket_t sock;
    Clock::time_point deadline;  // accept time + the request deadline
  };

  void Work() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      ++idle_;
      ready_.wait(lock, [this] { return !waiting_.empty() || stopping_; });
      --idle_;
      if (waiting_.empty()) return;  // stopping
      const Waiting next = waiting_.front();
      waiting_.pop_front();
      lock.unlock();
      if (Clock::now() >= next.deadline) {
        // Its time went by in the queue: serving it now could only overrun.
        ::close(next.sock);
        expired_.fetch_add(1);
      } else {
        serve_(next.sock, next.deadline);
      }
      lock.lock();
    }
  }

  const size_t max_threads_;
  const size_t max_waiting_;
  const std::chrono::milliseconds deadline_;
  const Serve serve_;
  std::atomic<int64_t>& expired_;
  std::atomic<int64_t>& rejected_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Waiting> waiting_;
  std::vector<std::thread> threads_;  // grows until Drain joins them
  size_t idle_ = 0;
  bool stopping_ = false;
};

namespace {

// A socket stream whose every read and write waits at most until one
// deadline for the whole connection.
class DeadlineStream : public httplib::Stream {
 public:
  DeadlineStream(socket_t sock, Clock::time_point deadline) : sock_(sock), deadline_(deadline) {}

  bool is_readable() const override { return Wait(POLLIN); }
  bool is_writable() const override { return Wait(POLLOUT); }

  ssize_t read(char* ptr, size_t size) override {
    // httplib reads the request line and headers a byte at a time: serve
    // those from a buffer filled one recv at a time.
    if (begin_ == end_) {
      if (!Wait(POLLIN)) return -1;
      const ssize_t n = recv(sock_, buffer_, sizeof(buffer_), 0);
      if (n <= 0) return n;
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - begin_);
    std::copy(buffer_ + begin_, buffer_ + begin_ + n, ptr);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!Wait(POLLOUT)) return -1;
    return send(sock_, ptr, size, MSG_NOSIGNAL);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(getsockname, ip, port);
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

  template <typename Get>
  void Address(Get get, std::string& ip, int& port) const {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    ip.clear();
    port = 0;
    if (get(sock_, reinterpret_cast<sockaddr*>(&address), &length) != 0) return;
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

  socket_t sock_;
  Clock::time_point deadline_;
  char buffer_[4096];
  size_t begin_ = 0, end_ = 0;
};

}  // namespace

DeadlineHttpServer::DeadlineHttpServer(DeadlineHttpOptions options)
    : options_(options),
      pool_(std::make_unique<ConnectionPool>(
          options_.max_connections, options_.max_waiting, options_.request_deadline,
          [this](socket_t sock, Clock::time_point deadline) { Serve(sock, deadline); },
          expired_in_queue_, rejected_)) {
  new_task_queue = [this] { return new InlineAcceptQueue([this] { pool_->Drain(); }); };
}

// pool_ is the last member, so it goes first: its destructor drains it
// (joins every serving thread) while everything Serve uses, the base class
// and the counters, is still there.
DeadlineHttpServer::~DeadlineHttpServer() = default;

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

#include "server/connection_pool.h"

#include <sys/socket.h>
#include <unistd.h>

#include <exception>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace drt::server {

std::thread StartStdThread(std::function<void()> run) { return std::thread(std::move(run)); }

std::string RenderConnectionPoolMetrics(absl::string_view prefix, absl::string_view what,
                                        const ConnectionPoolCounters& counters) {
  return absl::StrCat(
      "# HELP ", prefix, "_connections_expired_total ", what,
      " closed unserved: their deadline (counted from accept) passed while they waited for a "
      "serving thread.\n"
      "# TYPE ", prefix, "_connections_expired_total counter\n",
      prefix, "_connections_expired_total ", counters.expired.load(), "\n",
      "# HELP ", prefix, "_connections_rejected_total ", what,
      " closed at accept, unserved: as many were already waiting for a serving thread as may "
      "wait, no serving thread could be started, or there was no memory to queue them.\n"
      "# TYPE ", prefix, "_connections_rejected_total counter\n",
      prefix, "_connections_rejected_total ", counters.rejected.load(), "\n",
      "# HELP ", prefix, "_thread_start_failures_total Threads for ", what,
      " that could not be started (a pids or memory limit): serving threads (the connection "
      "waited for the threads that exist, or was rejected when there were none) and the "
      "pool's reaper (retried at each accept that leaves a connection waiting; without it a "
      "waiting connection past its deadline is closed only at the next accept or free "
      "thread, not at its deadline).\n"
      "# TYPE ", prefix, "_thread_start_failures_total counter\n",
      prefix, "_thread_start_failures_total ", counters.thread_start_failures.load(), "\n");
}

std::string CannedResponse(int status, absl::string_view reason, absl::string_view content_type,
                           absl::string_view body, int retry_after_seconds) {
  return absl::StrCat("HTTP/1.1 ", status, " ", reason, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n",
                      retry_after_seconds > 0
                          ? absl::StrCat("Retry-After: ", retry_after_seconds, "\r\n")
                          : std::string(),
                      "\r\n", body);
}

ConnectionPool::ConnectionPool(ConnectionPoolOptions options, Serve serve,
                               ConnectionPoolCounters& counters)
    : max_threads_(options.max_threads > 0 ? options.max_threads : 1),
      max_waiting_(options.max_waiting > 0 ? options.max_waiting : 4 * max_threads_),
      deadline_(options.deadline),
      start_thread_(options.start_thread ? std::move(options.start_thread) : StartStdThread),
      refusal_(std::move(options.refusal)),
      serve_(std::move(serve)),
      counters_(counters) {}

void ConnectionPool::Push(socket_t sock, Clock::time_point accepted) {
  std::vector<socket_t> refused;
  // Whether `sock` is in waiting_ or refused (so closed once, below or by a
  // thread): an allocation that fails before (std::bad_alloc from the
  // deque or the vector) leaves it to the catch.
  bool placed = false;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    // Expired ones go now, not when a thread comes free (which may be a
    // whole deadline away when slow clients hold them all).
    while (!waiting_.empty() && accepted >= waiting_.front().deadline) {
      refused.push_back(waiting_.front().sock);
      waiting_.pop_front();
      counters_.expired.fetch_add(1);
    }
    // (Sockets that idle threads are about to take do not count.)
    if (waiting_.size() >= max_waiting_ + idle_) {
      refused.push_back(sock);
      placed = true;
      counters_.rejected.fetch_add(1);
    } else {
      waiting_.push_back({sock, accepted + deadline_});
      placed = true;
      if (waiting_.size() > idle_ && threads_.size() < max_threads_) {
        std::thread worker;
        if (StartLocked([this] { Work(); }, worker)) {
          threads_.push_back(std::move(worker));  // (room reserved by StartLocked)
        } else if (threads_.empty()) {
          // No thread exists to serve it, ever: refuse it now.
          waiting_.pop_back();
          placed = false;
          refused.push_back(sock);
          placed = true;
          counters_.rejected.fetch_add(1);
        }
      }
      if (!waiting_.empty() && !reaper_.joinable()) StartLocked([this] { Reap(); }, reaper_);
      ready_.notify_one();
      if (waiting_.size() == 1) front_changed_.notify_one();
    }
  } catch (const std::bad_alloc&) {
    // No memory to queue it: refused as when the queue is full. (Push runs
    // on httplib's accept thread, where an exception would end the
    // process.) What `refused` already holds is closed below.
    if (!placed) {
      counters_.rejected.fetch_add(1);
      Refuse(sock);
    }
  }
  for (const socket_t s : refused) Refuse(s);
}

bool ConnectionPool::StartLocked(std::function<void()> run, std::thread& thread) {
  try {
    threads_.reserve(threads_.size() + 1);  // so that a push_back after cannot throw
    thread = start_thread_(std::move(run));
    if (thread.joinable()) return true;
  } catch (const std::exception&) {  // std::system_error, std::bad_alloc
  }
  counters_.thread_start_failures.fetch_add(1);
  return false;
}

void ConnectionPool::Drain() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  front_changed_.notify_all();
  std::thread reaper;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    threads.swap(threads_);
    reaper.swap(reaper_);
  }
  if (reaper.joinable()) reaper.join();
  for (std::thread& thread : threads) thread.join();
  std::lock_guard<std::mutex> lock(mutex_);
  // (With no thread left, e.g. none could be started, what still waits is
  // closed here.)
  while (!waiting_.empty()) {
    Refuse(waiting_.front().sock);
    waiting_.pop_front();
  }
  stopping_ = false;
  idle_ = 0;
}

void ConnectionPool::Work() {
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
      Refuse(next.sock);
      counters_.expired.fetch_add(1);
    } else {
      serve_(next.sock, next.deadline);
    }
    lock.lock();
  }
}

void ConnectionPool::Reap() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (waiting_.empty()) {
      front_changed_.wait(lock);
      continue;
    }
    // The front has the earliest deadline (accept order); a socket pushed
    // behind it cannot expire first, one taken from the front only makes
    // the next deadline later (the wait then ends early and starts again).
    const Waiting front = waiting_.front();
    if (Clock::now() < front.deadline) {
      front_changed_.wait_until(lock, front.deadline);
      continue;
    }
    waiting_.pop_front();
    counters_.expired.fetch_add(1);
    lock.unlock();
    Refuse(front.sock);
    lock.lock();
  }
}

void ConnectionPool::Refuse(socket_t sock) const {
  if (!refusal_.empty()) {
    // A fresh connection's send buffer is empty, so the short answer goes
    // whole or (the client gone) not at all; never waits.
    (void)send(sock, refusal_.data(), refusal_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::shutdown(sock, SHUT_WR);
    // What the client has sent (its request) is read and dropped, so that
    // close() sends a FIN, not a reset that could destroy the answer before
    // it is read. Bounded: a client still sending gets its reset.
    char buffer[4096];
    for (int i = 0; i < 16 && recv(sock, buffer, sizeof(buffer), MSG_DONTWAIT) > 0; ++i) {
    }
  }
  ::close(sock);
}

}  // namespace drt::server

#include "server/background_deleter.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <utility>

namespace drt::server {
namespace {

void Unlink(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    std::fprintf(stderr, "drt-server: cannot delete %s: %s\n", path.c_str(), std::strerror(errno));
  }
}

}  // namespace

BackgroundDeleter::BackgroundDeleter(std::function<void(const std::string&)> before_delete)
    : before_delete_(std::move(before_delete)) {}

BackgroundDeleter::~BackgroundDeleter() { Stop(); }

void BackgroundDeleter::Delete(std::vector<std::string> paths) {
  if (paths.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopped_) {
      if (!thread_.joinable()) {
        try {
          thread_ = std::thread([this] { Run(); });
        } catch (const std::system_error&) {
          // No thread to be had: deleted below, on the calling thread.
        }
      }
      if (thread_.joinable()) {
        for (std::string& path : paths) queue_.push_back(std::move(path));
        changed_.notify_all();
        return;
      }
    }
  }
  for (const std::string& path : paths) {
    if (before_delete_) before_delete_(path);
    Unlink(path);
  }
}

void BackgroundDeleter::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopped, and nothing left
    const std::string path = std::move(queue_.front());
    queue_.pop_front();
    deleting_ = true;
    lock.unlock();
    if (before_delete_) before_delete_(path);
    Unlink(path);
    lock.lock();
    deleting_ = false;
    changed_.notify_all();
  }
}

void BackgroundDeleter::WaitIdle() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return queue_.empty() && !deleting_; });
}

void BackgroundDeleter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
    changed_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace drt::server

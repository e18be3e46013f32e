#include "server/background_deleter.h"

#include <system_error>
#include <utility>

namespace drt::server {

BackgroundDeleter::BackgroundDeleter(std::function<void(const std::string&)> delete_one)
    : delete_one_(std::move(delete_one)) {}

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
  for (const std::string& path : paths) delete_one_(path);
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
    delete_one_(path);
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

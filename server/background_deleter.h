// Deletes files on a thread of its own, so that the thread that hands them
// over does not wait for the unlinks: the state store's removal of a session
// deleted during a write (StateStore::EndWriteLocked), which runs on the
// engine thread in a group commit, where unlinking a chunk log of many GB
// would hold every session of the step (review-durablegen F2).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace drt::server {

class BackgroundDeleter {
 public:
  // `delete_one` deletes one path (the owner's own deletion, so that both
  // delete alike: StateStore::DeleteLog); it runs on the deleter's thread,
  // or on the caller's when there is none.
  explicit BackgroundDeleter(std::function<void(const std::string&)> delete_one);
  // Stop().
  ~BackgroundDeleter();
  BackgroundDeleter(const BackgroundDeleter&) = delete;
  BackgroundDeleter& operator=(const BackgroundDeleter&) = delete;

  // Queues `paths` and returns at once; each goes to `delete_one` in turn.
  // The thread starts with the first call (a store that never needs it has
  // none).
  void Delete(std::vector<std::string> paths);
  // Returns once every path queued before the call is deleted.
  void WaitIdle();
  // Deletes what is queued, then ends the thread; Delete after it deletes
  // on the calling thread.
  void Stop();

 private:
  void Run();

  const std::function<void(const std::string&)> delete_one_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::string> queue_;
  bool deleting_ = false;  // the thread holds a path taken off the queue
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace drt::server

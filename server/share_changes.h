#ifndef DRT_SERVER_SHARE_CHANGES_H_
#define DRT_SERVER_SHARE_CHANGES_H_

#include <atomic>
#include <cstdint>

namespace drt::server {

// Whether the holders of chunk blocks shared by forks have changed since
// the budget last refreshed the idle sessions' shares (review-serverfix
// F1, F3). A session counts each shared block at its share of it, its size
// over the number of holders (SessionEntry::budget_bytes), read when its
// figures refresh; when a holder stops holding a block (its engine session
// freed after a delete, a copy-on-write of a shared tail, a K/V cache trim,
// a block mapped from disk or released), the other holders' shares grow but
// only a refresh shows it. Every such change notes itself here, and the
// manager refreshes the idle sessions before it next adds the figures up
// (SessionManager::Reserve, TotalHostBytes) and once a second, so that the
// budget's sum is never below what is really held for longer than the step
// a busy holder is in. One counter, shared by the manager and its entries;
// thread-safe.
class ShareChanges {
 public:
  // A block's holders changed (or may have).
  void Note() { generation_.fetch_add(1, std::memory_order_acq_rel); }
  // True when something was noted since the last call that returned true.
  // Taken before the refresh it triggers, so that a change noted during
  // that refresh triggers another.
  bool Take() {
    const uint64_t now = generation_.load(std::memory_order_acquire);
    return seen_.exchange(now, std::memory_order_acq_rel) != now;
  }

 private:
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> seen_{0};
};

}  // namespace drt::server

#endif  // DRT_SERVER_SHARE_CHANGES_H_

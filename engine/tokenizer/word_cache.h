// A bounded, thread-safe memo of word -> token ids. Text repeats its words
// so much that most BPE merging is skipped after the first few kilobytes.
#pragma once

#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>


namespace drt {

class WordCache {
 public:
  // Words stop being added once `capacity` are stored (no eviction, as in
  // Hugging Face's cache: the first words seen are the frequent ones).
  explicit WordCache(size_t capacity) : capacity_(capacity) {}

  // Appends the cached ids of `word` to `out`; false if it is not cached.
  bool AppendIfCached(std::string_view word, std::vector<int32_t>* out) const {
    std::shared_lock lock(mu_);
    const auto it = ids_.find(word);
    if (it == ids_.end()) return false;
    out->insert(out->end(), it->second.begin(), it->second.end());
    return true;
  }

  void Insert(std::string_view word, std::vector<int32_t> ids) {
    std::unique_lock lock(mu_);
    if (ids_.size() < capacity_) ids_.try_emplace(std::string(word), std::move(ids));
  }

 private:
  // Lets find() take a string_view without building a std::string.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };

  const size_t capacity_;
  // std::shared_mutex rather than absl::Mutex: the system Abseil is built
  // with deadlock detection on, which costs more than the lookup itself.
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> ids_;  // by mu_
};

}  // namespace drt

// Sliding-window K/V cache of one decoder layer: the last `capacity`
// positions' keys and values in a ring (drt-model.md, "What follows for the
// engine"). Attention at position i needs keys i-W..i, so W past positions
// suffice.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace drt::cpu {

class WindowCache {
 public:
  WindowCache(int64_t capacity, int64_t row_width)
      : capacity_(capacity), width_(row_width), keys_(capacity * row_width),
        values_(capacity * row_width) {}

  int64_t size() const { return size_; }
  size_t bytes() const { return (keys_.capacity() + values_.capacity()) * sizeof(float); }

  // Copies the cached rows, oldest first, into keys/values (size() rows each).
  void CopyOut(float* keys, float* values) const {
    const int64_t oldest = (head_ - size_ + capacity_) % capacity_;
    for (int64_t i = 0; i < size_; ++i) {
      const int64_t slot = (oldest + i) % capacity_;
      std::memcpy(keys + i * width_, keys_.data() + slot * width_, width_ * sizeof(float));
      std::memcpy(values + i * width_, values_.data() + slot * width_, width_ * sizeof(float));
    }
  }

  // Moves past n positions whose rows were not computed (the upper layers'
  // windows over a lower-only forward, StepPlan::lower_only): their slots
  // keep the finite rows they held. The ring then holds as many rows as if
  // they had been pushed, so the attention of the next rows runs over the
  // same number of keys, blocked and rounded as without the skip; the rows
  // a skipped slot feeds are ones whose results cannot reach the kept state
  // (engine/model_rules.h, UpperLayerReach).
  void Skip(int64_t n) {
    head_ = (head_ + n % capacity_) % capacity_;
    size_ = std::min(capacity_, size_ + n);
  }

  // Appends n rows; only the last `capacity` of all rows ever pushed remain.
  void Push(const float* keys, const float* values, int64_t n) {
    const int64_t skip = std::max<int64_t>(0, n - capacity_);
    for (int64_t i = skip; i < n; ++i) {
      std::memcpy(keys_.data() + head_ * width_, keys + i * width_, width_ * sizeof(float));
      std::memcpy(values_.data() + head_ * width_, values + i * width_, width_ * sizeof(float));
      head_ = (head_ + 1) % capacity_;
    }
    size_ = std::min(capacity_, size_ + n);
  }

 private:
  int64_t capacity_;
  int64_t width_;
  std::vector<float> keys_, values_;
  int64_t head_ = 0;  // next slot to write
  int64_t size_ = 0;
};

}  // namespace drt::cpu

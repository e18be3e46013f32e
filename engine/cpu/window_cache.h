// Sliding-window K/V cache of one decoder layer: the last `capacity`
// positions' keys and values (drt-model.md, "What follows for the engine").
// Attention at position i needs keys i-W..i, so W past positions suffice.
//
// The rows lie oldest first in one contiguous stretch of a buffer with room
// for SlackRows(capacity) rows more, so that attention reads them where they
// are: a push writes after the newest row, and only when the buffer's end is
// reached are the rows kept moved to its start (capacity rows every slack
// rows pushed, instead of copying the whole window out for every step). The
// rows pushed last stay right after the rows that were there before, so a
// step of at most slack rows finds its keys, window then new rows, in one
// stretch (Recent).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace drt::cpu {

// Slices of at most this many rows read their window in place
// (CpuStep::Attention): they push their rows first and attend over window
// and rows where they lie, instead of gathering both into one buffer. It
// sets the buffer's least spare rows (WindowCache::SlackRows). Which
// attention kernel a slice's rows then take is kRowByRowQueryRows's
// business (engine/cpu/kernels.h), a separate bound.
constexpr int64_t kInPlaceWindowRows = 8;

class WindowCache {
 public:
  // Rows of room beyond the window: a quarter of it, at most 256 (a large
  // window would otherwise hold much memory for little: moving W rows every
  // 256 pushed is already cheap), and at least kInPlaceWindowRows (the
  // slices that read their keys in place push that many rows at most).
  static constexpr int64_t SlackRows(int64_t capacity) {
    return std::max<int64_t>(kInPlaceWindowRows, std::min<int64_t>(256, capacity / 4));
  }

  WindowCache(int64_t capacity, int64_t row_width)
      : capacity_(capacity), width_(row_width),
        buffer_rows_(capacity + SlackRows(capacity)),
        keys_(buffer_rows_ * row_width), values_(buffer_rows_ * row_width) {}

  int64_t size() const { return size_; }
  size_t bytes() const { return (keys_.capacity() + values_.capacity()) * sizeof(float); }

  // Copies the cached rows, oldest first, into keys/values (size() rows each).
  void CopyOut(float* keys, float* values) const {
    const int64_t first = end_ - size_;
    std::memcpy(keys, keys_.data() + first * width_, size_ * width_ * sizeof(float));
    std::memcpy(values, values_.data() + first * width_, size_ * width_ * sizeof(float));
  }

  // The last `rows` rows pushed, oldest first, in one stretch: keys and
  // values [rows, row_width]. Valid until the next Push or Skip. `rows` may
  // exceed size() by the rows of the last Push when that Push held at most
  // SlackRows(capacity) rows (CanReadInPlace): then the rows before it are
  // still there (the window as it was, then all the pushed rows, even when
  // they are more than the window).
  const float* RecentKeys(int64_t rows) const { return keys_.data() + (end_ - rows) * width_; }
  const float* RecentValues(int64_t rows) const {
    return values_.data() + (end_ - rows) * width_;
  }
  // Rows RecentKeys/RecentValues may be asked for now.
  int64_t recent_rows() const { return recent_; }

  // Whether a push of n rows leaves the window as it was before the push,
  // then the n rows, in one stretch (recent_rows() >= size() + n after it),
  // whatever the window's history: true for any n <= SlackRows(capacity),
  // including n >= capacity. Known before the push, so a caller can choose
  // between reading in place and gathering without advancing anything.
  bool CanReadInPlace(int64_t n) const { return n <= SlackRows(capacity_); }

  // Moves past n positions whose rows were not computed (the upper layers'
  // windows over a lower-only forward, StepPlan::lower_only): their slots
  // keep the finite rows they held. The window then holds as many rows as if
  // they had been pushed, so the attention of the next rows runs over the
  // same number of keys, blocked and rounded as without the skip; the rows
  // a skipped slot feeds are ones whose results cannot reach the kept state
  // (engine/model_rules.h, UpperLayerReach).
  void Skip(int64_t n) { Advance(nullptr, nullptr, n); }

  // Appends n rows; only the last `capacity` of all rows ever pushed remain
  // in the window.
  void Push(const float* keys, const float* values, int64_t n) { Advance(keys, values, n); }

 private:
  // Makes room for n new rows after the newest and writes them there when
  // keys/values are given.
  void Advance(const float* keys, const float* values, int64_t n) {
    if (n <= 0) return;
    // A push of at most the slack writes all its rows, even when n exceeds
    // the window (a window of fewer than SlackRows rows): the window as it
    // was, then all n rows, fit the buffer (size_ + n <= capacity + slack),
    // so a slice read in place finds all its keys in one stretch
    // (CanReadInPlace). A larger push writes only the rows that can stay in
    // the window: the first n - written drop out at once.
    const int64_t written = n <= SlackRows(capacity_) ? n : std::min(n, capacity_);
    // Rows right before the new ones, in the same stretch: none when pushed
    // rows were dropped (the stretch would skip them), the whole window as
    // it was when it fits beside the new rows, else the rows that stay in
    // the window.
    const int64_t before = written < n                           ? 0
                           : size_ + written <= buffer_rows_    ? size_
                                                                 : capacity_ - written;
    if (end_ + written > buffer_rows_) {
      // Move those rows to the buffer's start (memmove: the two may overlap).
      const int64_t kept = before;
      std::memmove(keys_.data(), keys_.data() + (end_ - kept) * width_,
                   kept * width_ * sizeof(float));
      std::memmove(values_.data(), values_.data() + (end_ - kept) * width_,
                   kept * width_ * sizeof(float));
      end_ = kept;
    }
    if (keys != nullptr) {
      std::memcpy(keys_.data() + end_ * width_, keys + (n - written) * width_,
                  written * width_ * sizeof(float));
      std::memcpy(values_.data() + end_ * width_, values + (n - written) * width_,
                  written * width_ * sizeof(float));
    }
    end_ += written;
    size_ = std::min(capacity_, size_ + n);
    recent_ = before + written;
  }

  int64_t capacity_;
  int64_t width_;
  int64_t buffer_rows_;
  std::vector<float> keys_, values_;
  int64_t end_ = 0;     // one past the newest row, in rows of the buffer
  int64_t size_ = 0;    // rows in the window: [end_ - size_, end_)
  int64_t recent_ = 0;  // rows ending at end_ that are in one stretch
};

}  // namespace drt::cpu

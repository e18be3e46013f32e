// The device tier of a CUDA session's closed chunks (CudaChunkTier::kDevice,
// docs/cuda.md "Device tier"): keys and values of every closed chunk in two
// device arrays, [capacity][64][d] each, chunk c at element c x 64 x d of
// both: the host store's K and V blocks (engine/cuda/host/
// chunk_record_layout.h; landmark row zero), in the storage type T. Two
// contiguous arrays rather than slabs so that the GCA kernel reads the
// store as it reads a group's slot buffer, with "slot" = chunk id
// (kernels/gca_attention.h, unchanged), and the encoder's K/V GEMMs write
// into it in place. The price of contiguity: a growth allocates the bigger
// arrays, copies the held chunks device -> device and waits for the stream
// before freeing the old ones (queued kernels may read them), so that for
// one moment both exist (1.5x the new capacity at a doubling) and the
// session's stream drains once per growth. Growth doubles while the doubled
// arrays fit the device's free memory, then takes bounded steps (1/8 of
// the need), then exactly the need (GrownDeviceStoreCapacity,
// engine/cuda/host/chunk_tier_policy.h), so that a store is not refused at
// the size where doubling it no longer fits.
#pragma once

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/cuda_resources.h"

namespace drt::cuda {

template <typename T>
class DeviceChunkStore {
 public:
  DeviceChunkStore() = default;
  // chunk_elements: elements of one chunk's keys (64 x d). cap_chunks: the
  // most chunks a growth makes room for unless more are needed
  // (DeviceStoreGrowthLimits::cap_chunks).
  explicit DeviceChunkStore(int64_t chunk_elements,
                            int64_t cap_chunks = std::numeric_limits<int64_t>::max())
      : chunk_elements_(chunk_elements), cap_chunks_(cap_chunks) {}
  DeviceChunkStore(DeviceChunkStore&&) noexcept = default;
  DeviceChunkStore& operator=(DeviceChunkStore&&) noexcept = default;

  // Chunks stored, and room for.
  int64_t size() const { return size_; }
  int64_t capacity() const { return capacity_; }
  // Device bytes allocated (both arrays, the whole capacity).
  int64_t bytes() const { return static_cast<int64_t>(keys_.bytes() + values_.bytes()); }
  // Bytes of one chunk's keys (and of its values).
  int64_t block_bytes() const { return chunk_elements_ * static_cast<int64_t>(sizeof(T)); }

  // The arrays (chunk c at + c x 64 x d).
  T* keys() const { return keys_.get(); }
  T* values() const { return values_.get(); }
  T* keys(int64_t chunk) const { return keys_.get() + chunk * chunk_elements_; }
  T* values(int64_t chunk) const { return values_.get() + chunk * chunk_elements_; }

  // Room for `chunks` chunks: nothing when there is; else arrays of exactly
  // `chunks` (exact) or of GrownDeviceStoreCapacity (doubling from
  // kFirstCapacity, bounded by the device's free memory measured now and by
  // cap_chunks; when that allocation fails all the same, exactly `chunks`
  // is tried), the held chunks copied on `stream`, which is then waited for
  // before the old arrays go. RESOURCE_EXHAUSTED naming the device chunk
  // store when the device has no room; nothing changes then (the failed
  // allocation's error is cleared, so the next launch is clean).
  absl::Status Reserve(int64_t chunks, bool exact, cudaStream_t stream);
  // Counts `count` more chunks, whose K/V the caller writes (or has queued)
  // at keys(size()) and values(size()) before anything reads them. Room
  // must have been reserved (INTERNAL otherwise).
  absl::Status Append(int64_t count);
  // This store's chunks become copies of `other`'s first `chunks`, copied on
  // `stream` (the caller waits for it). Reserves room first.
  absl::Status CopyFrom(const DeviceChunkStore& other, int64_t chunks, bool exact,
                        cudaStream_t stream);

  static constexpr int64_t kFirstCapacity = 16;

 private:
  // Arrays of `capacity` chunks replace the held ones (Reserve's work once
  // the size is chosen).
  absl::Status GrowTo(int64_t capacity, cudaStream_t stream);

  int64_t chunk_elements_ = 0;
  int64_t cap_chunks_ = std::numeric_limits<int64_t>::max();
  int64_t size_ = 0;
  int64_t capacity_ = 0;
  DeviceArray<T> keys_, values_;
};

}  // namespace drt::cuda

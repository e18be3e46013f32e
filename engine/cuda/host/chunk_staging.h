// The pinned staging of the disk tier: a CUDA session converts a mapped
// chunk's fp32 record (engine/cuda/host/map_host_chunks.h) into one of these
// slots in the storage type, then copies it host -> device asynchronously
// from there (a copy from page-locked memory; the mapping itself is
// pageable). Slots are used in turn; a slot a queued copy may still read is
// handed out with `must_wait`, and the caller waits for that copy (its
// event) before writing. Allocated on first use, so a session that maps
// nothing holds none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/host/host_allocator.h"

namespace drt::cuda {

// Instantiated for Bf16Bits and float (chunk_staging.cc).
template <typename Element>
class ChunkStaging {
 public:
  // `slots` slots of `elements` elements each (one chunk's record).
  ChunkStaging(int64_t slots, int64_t elements, std::shared_ptr<HostAllocator> allocator);
  ~ChunkStaging();
  ChunkStaging(const ChunkStaging&) = delete;
  ChunkStaging& operator=(const ChunkStaging&) = delete;

  struct Slot {
    int64_t index;
    bool must_wait;  // a copy from it was queued (Queued) and may still run
    Element* data;   // `elements` elements
  };
  // Allocates the slots now (a no-op once done), so that a caller can fail
  // before it commits to reading through them.
  absl::Status Allocate();
  // The next slot in turn; allocates the slots on first use.
  absl::StatusOr<Slot> Next();
  // A copy reading slot `index` was queued.
  void Queued(int64_t index) { queued_[index] = true; }

  int64_t slots() const { return static_cast<int64_t>(queued_.size()); }
  size_t bytes() const { return data_ == nullptr ? 0 : bytes_; }

 private:
  int64_t elements_;
  std::shared_ptr<HostAllocator> allocator_;
  std::vector<bool> queued_;
  size_t bytes_;
  void* data_ = nullptr;
  int64_t next_ = 0;
};

}  // namespace drt::cuda

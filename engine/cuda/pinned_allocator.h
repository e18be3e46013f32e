// The production HostAllocator of the chunk store: page-locked memory from
// cudaHostAlloc, so device<->host chunk copies run asynchronously.
#pragma once

#include "engine/cuda/host/host_allocator.h"

namespace drt::cuda {

class PinnedHostAllocator final : public HostAllocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* p, size_t bytes) override;
  bool pinned() const override { return true; }
};

}  // namespace drt::cuda

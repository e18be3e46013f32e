// A HostAllocator (engine/cuda/host/host_allocator.h) over plain aligned
// memory that counts what it hands out and can be told to fail: the pinned
// allocator's stand-in for host-side tests of the CUDA backend's stores.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/host/host_allocator.h"

namespace drt::testing {

class CountingHostAllocator final : public cuda::HostAllocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (fail || (fail_after >= 0 && allocations >= fail_after)) {
      return absl::ResourceExhaustedError("test allocator refuses");
    }
    absl::StatusOr<void*> p = inner_.Allocate(bytes);
    if (p.ok()) {
      live_bytes += bytes;
      ++allocations;
      sizes.push_back(bytes);
    }
    return p;
  }
  void Free(void* p, size_t bytes) override {
    live_bytes -= bytes;
    inner_.Free(p, bytes);
  }
  bool pinned() const override { return false; }

  bool fail = false;          // refuse every allocation while set
  int fail_after = -1;        // refuse once this many succeeded (-1: never)
  size_t live_bytes = 0;      // allocated and not yet freed
  int allocations = 0;        // successful allocations
  std::vector<size_t> sizes;  // of each successful allocation, in order

 private:
  cuda::AlignedHostAllocator inner_;
};

}  // namespace drt::testing

// Where the host chunk store gets its slabs: page-locked memory from the CUDA
// runtime in production (engine/cuda/pinned_allocator.h), plain aligned memory
// in tests. Kept behind this interface so the store's logic runs without a GPU.
#pragma once

#include <cstddef>
#include <new>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace drt::cuda {

class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  // Never returns null on success.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // `bytes` is what Allocate was given.
  virtual void Free(void* p, size_t bytes) = 0;
  // Whether the memory is page-locked (cudaMemcpyAsync from it is truly async).
  virtual bool pinned() const = 0;
};

// Ordinary memory, 256-byte aligned: tests and builds without a GPU.
class AlignedHostAllocator final : public HostAllocator {
 public:
  static constexpr std::align_val_t kAlignment{256};
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = ::operator new(bytes, kAlignment, std::nothrow);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("cannot allocate %d bytes of host memory for the chunk store", bytes));
    }
    return p;
  }
  void Free(void* p, size_t) override { ::operator delete(p, kAlignment); }
  bool pinned() const override { return false; }
};

}  // namespace drt::cuda

// RAII owners of CUDA runtime objects (device memory, pinned host memory,
// streams, events). Creation returns a Status (a failed allocation:
// AllocationFailure, RESOURCE_EXHAUSTED when the memory is full, with the
// runtime's last error cleared); destruction ignores errors
// (there is no one to report them to; the session that owns them has already
// synchronised its streams). The current device must be the owner's device
// when they are created and destroyed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/cuda/allocation_status.h"
#include "kernels/cuda_check.h"

namespace drt::cuda {

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  static absl::StatusOr<DeviceArray> Create(size_t count, absl::string_view what) {
    DeviceArray a;
    if (count == 0) return a;
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, count * sizeof(T));
    if (err != cudaSuccess) return AllocationFailure(err, "cudaMalloc", count * sizeof(T), what);
    a.ptr_ = static_cast<T*>(p);
    a.count_ = count;
    return a;
  }
  DeviceArray(DeviceArray&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { Reset(); }

  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  void Reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    count_ = 0;
  }
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// Page-locked host memory (asynchronous copies to and from it).
template <typename T>
class PinnedArray {
 public:
  PinnedArray() = default;
  static absl::StatusOr<PinnedArray> Create(size_t count, absl::string_view what) {
    PinnedArray a;
    if (count == 0) return a;
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, count * sizeof(T), cudaHostAllocPortable);
    if (err != cudaSuccess) {
      return AllocationFailure(err, "cudaHostAlloc", count * sizeof(T), what);
    }
    a.ptr_ = static_cast<T*>(p);
    a.count_ = count;
    return a;
  }
  PinnedArray(PinnedArray&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  PinnedArray& operator=(PinnedArray&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  ~PinnedArray() { Reset(); }

  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  void Reset() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    count_ = 0;
  }
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

class Stream {
 public:
  Stream() = default;
  static absl::StatusOr<Stream> Create() {
    Stream s;
    DRT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking),
                             "cudaStreamCreateWithFlags");
    return s;
  }
  Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      Reset();
      stream_ = std::exchange(o.stream_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { Reset(); }
  cudaStream_t get() const { return stream_; }

 private:
  void Reset() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() = default;
  static absl::StatusOr<Event> Create() {
    Event e;
    DRT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e.event_, cudaEventDisableTiming),
                             "cudaEventCreateWithFlags");
    return e;
  }
  Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      Reset();
      event_ = std::exchange(o.event_, nullptr);
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { Reset(); }
  cudaEvent_t get() const { return event_; }

 private:
  void Reset() {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = nullptr;
  }
  cudaEvent_t event_ = nullptr;
};

}  // namespace drt::cuda

#include "engine/cuda/device_chunk_store.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "engine/cuda/host/chunk_tier_policy.h"
#include "engine/cuda/status_macros.h"
#include "engine/cuda/storage_type.h"
#include "kernels/cuda_check.h"

namespace drt::cuda {
namespace {

// A failed cudaMalloc (RESOURCE_EXHAUSTED from DeviceArray::Create, the
// runtime's last error cleared there) as RESOURCE_EXHAUSTED naming the
// store (CudaSession adds the tier in use, device or auto); any other
// failure as it came.
template <typename T>
absl::StatusOr<DeviceArray<T>> AllocateStoreArray(int64_t elements, const char* what) {
  auto made = DeviceArray<T>::Create(static_cast<size_t>(elements), what);
  if (made.ok() || made.status().code() != absl::StatusCode::kResourceExhausted) return made;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the device chunk store cannot grow to %d bytes of %s: %s",
      elements * static_cast<int64_t>(sizeof(T)), what, made.status().message()));
}

}  // namespace

template <typename T>
absl::Status DeviceChunkStore<T>::Reserve(int64_t chunks, bool exact, cudaStream_t stream) {
  if (chunks <= capacity_) return absl::OkStatus();
  if (exact) return GrowTo(chunks, stream);
  DeviceStoreGrowthLimits limits;
  limits.cap_chunks = cap_chunks_;
  size_t free_bytes = 0, total_bytes = 0;
  DRT_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (block_bytes() > 0) {
    limits.room_chunks = static_cast<int64_t>(free_bytes) / (2 * block_bytes());
  }
  const int64_t grown = GrownDeviceStoreCapacity(capacity_, chunks, kFirstCapacity, limits);
  absl::Status status = GrowTo(grown, stream);
  if (status.code() == absl::StatusCode::kResourceExhausted && grown > chunks) {
    // The memory went since the measurement (another session, another
    // process): the need alone may still fit.
    status = GrowTo(chunks, stream);
  }
  return status;
}

template <typename T>
absl::Status DeviceChunkStore<T>::GrowTo(int64_t grown, cudaStream_t stream) {
  auto keys = AllocateStoreArray<T>(grown * chunk_elements_, "chunk keys");
  if (!keys.ok()) return keys.status();
  auto values = AllocateStoreArray<T>(grown * chunk_elements_, "chunk values");
  if (!values.ok()) return values.status();
  if (size_ > 0) {
    const size_t held = static_cast<size_t>(size_) * block_bytes();
    DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(keys->get(), keys_.get(), held,
                                             cudaMemcpyDeviceToDevice, stream),
                             "copying chunk keys into the grown device store");
    DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(values->get(), values_.get(), held,
                                             cudaMemcpyDeviceToDevice, stream),
                             "copying chunk values into the grown device store");
  }
  // Kernels queued earlier on the stream (the encoder writing, GCA reading)
  // may use the old arrays, and the copies above read them.
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream),
                           "waiting before the device chunk store grows");
  keys_ = *std::move(keys);
  values_ = *std::move(values);
  capacity_ = grown;
  return absl::OkStatus();
}

template <typename T>
absl::Status DeviceChunkStore<T>::Append(int64_t count) {
  if (count < 0 || size_ + count > capacity_) {
    return absl::InternalError(absl::StrFormat(
        "appending %d chunks to a device chunk store holding %d of %d", count, size_, capacity_));
  }
  size_ += count;
  return absl::OkStatus();
}

template <typename T>
absl::Status DeviceChunkStore<T>::CopyFrom(const DeviceChunkStore& other, int64_t chunks,
                                           bool exact, cudaStream_t stream) {
  if (chunks < 0 || chunks > other.size_ || other.chunk_elements_ != chunk_elements_) {
    return absl::InternalError(absl::StrFormat(
        "copying %d chunks of a device chunk store holding %d", chunks, other.size_));
  }
  DRT_RETURN_IF_ERROR(Reserve(chunks, exact, stream));
  if (chunks > 0) {
    const size_t held = static_cast<size_t>(chunks) * block_bytes();
    DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(keys_.get(), other.keys_.get(), held,
                                             cudaMemcpyDeviceToDevice, stream),
                             "copying the device chunk store's keys");
    DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(values_.get(), other.values_.get(), held,
                                             cudaMemcpyDeviceToDevice, stream),
                             "copying the device chunk store's values");
  }
  size_ = chunks;
  return absl::OkStatus();
}

template class DeviceChunkStore<bf16>;
template class DeviceChunkStore<float>;

}  // namespace drt::cuda

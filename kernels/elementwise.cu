#include "kernels/elementwise.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace drt::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kNormThreads = 256;

// Grid size for a grid-stride loop over `n` items.
unsigned GridFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<size_t>(std::max<size_t>(blocks, 1), 65535u * 8u));
}

template <typename In>
__device__ float ToFloat(In v);
template <>
__device__ float ToFloat<float>(float v) {
  return v;
}
template <>
__device__ float ToFloat<bf16>(bf16 v) {
  return __bfloat162float(v);
}

template <typename Out>
__device__ Out FromFloat(float v);
template <>
__device__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ bf16 FromFloat<bf16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
__global__ void EmbeddingGatherKernel(const int32_t* __restrict__ ids, const T* __restrict__ table,
                                      int d, float* __restrict__ out) {
  const size_t row = blockIdx.x;
  const T* src = table + static_cast<size_t>(ids[row]) * d;
  float* dst = out + row * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) dst[j] = ToFloat<T>(src[j]);
}

// One block per row. Sum of squares in fp32 with a tree reduction.
template <typename In, typename W, typename Out>
__global__ void __launch_bounds__(kNormThreads)
    RmsNormKernel(const In* __restrict__ x, const W* __restrict__ w, int d, float eps,
                  Out* __restrict__ out) {
  __shared__ float partial[kNormThreads / 32];
  __shared__ float scale_shared;
  const In* xr = x + static_cast<size_t>(blockIdx.x) * d;
  Out* yr = out + static_cast<size_t>(blockIdx.x) * d;
  float sum = 0.f;
  for (int j = threadIdx.x; j < d; j += kNormThreads) {
    const float v = ToFloat<In>(xr[j]);
    sum = fmaf(v, v, sum);
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int i = 0; i < kNormThreads / 32; ++i) total += partial[i];
    scale_shared = rsqrtf(total / static_cast<float>(d) + eps);
  }
  __syncthreads();
  const float scale = scale_shared;
  for (int j = threadIdx.x; j < d; j += kNormThreads) {
    yr[j] = FromFloat<Out>(ToFloat<In>(xr[j]) * scale * ToFloat<W>(w[j]));
  }
}

template <typename T>
__global__ void SwiGluKernel(const T* __restrict__ gate_up, int rows, int f, T* __restrict__ out) {
  const size_t total = static_cast<size_t>(rows) * f;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / f;
    const size_t c = i % f;
    const float g = ToFloat<T>(gate_up[r * 2 * f + c]);
    const float u = ToFloat<T>(gate_up[r * 2 * f + f + c]);
    out[i] = FromFloat<T>(g / (1.f + expf(-g)) * u);
  }
}

__global__ void F32ToBf16Kernel(const float* __restrict__ x, size_t n, bf16* __restrict__ out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(x[i]);
  }
}

__global__ void Bf16ToF32Kernel(const bf16* __restrict__ x, size_t n, float* __restrict__ out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __bfloat162float(x[i]);
  }
}

template <typename T>
__global__ void ZeroChunkRowKernel(T* __restrict__ kv, int num_chunks, int row, int width) {
  const size_t total = static_cast<size_t>(num_chunks) * width;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t chunk = i / width;
    const size_t col = i % width;
    kv[(chunk * 64 + row) * width + col] = FromFloat<T>(0.f);
  }
}

__global__ void CopyRowsAtChunkOffsetKernel(const float* __restrict__ src, int n, int d,
                                            const int64_t* __restrict__ device_pos,
                                            int chunk_rows, float* __restrict__ dst) {
  const int64_t first = *device_pos % chunk_rows;
  const size_t total = static_cast<size_t>(n) * d;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t row = first + static_cast<int64_t>(i / d);
    if (row < chunk_rows) dst[row * d + static_cast<int64_t>(i % d)] = src[i];
  }
}

template <typename In, typename W, typename Out>
cudaError_t LaunchNorm(const In* x, const W* w, int rows, int d, float eps, Out* out,
                       cudaStream_t stream) {
  if (rows < 0 || d <= 0 || !(eps >= 0.f)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (x == nullptr || w == nullptr || out == nullptr) return cudaErrorInvalidValue;
  RmsNormKernel<In, W, Out><<<rows, kNormThreads, 0, stream>>>(x, w, d, eps, out);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t LaunchEmbeddingGather(const int32_t* ids, int n, const T* table, int d, float* out,
                                  cudaStream_t stream) {
  if (n < 0 || d <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (ids == nullptr || table == nullptr || out == nullptr) return cudaErrorInvalidValue;
  EmbeddingGatherKernel<T><<<n, kThreads, 0, stream>>>(ids, table, d, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchRmsNorm(const float* x, const T* w, int rows, int d, float eps, T* out,
                          cudaStream_t stream) {
  return LaunchNorm(x, w, rows, d, eps, out, stream);
}

template <typename T>
cudaError_t LaunchRmsNormF32(const float* x, const T* w, int rows, int d, float eps, float* out,
                             cudaStream_t stream) {
  return LaunchNorm(x, w, rows, d, eps, out, stream);
}

cudaError_t LaunchRmsNormBf16In(const bf16* x, const bf16* w, int rows, int d, float eps, bf16* out,
                                cudaStream_t stream) {
  return LaunchNorm(x, w, rows, d, eps, out, stream);
}

template <typename T>
cudaError_t LaunchSwiGlu(const T* gate_up, int rows, int f, T* out, cudaStream_t stream) {
  if (rows < 0 || f <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (gate_up == nullptr || out == nullptr) return cudaErrorInvalidValue;
  SwiGluKernel<T><<<GridFor(static_cast<size_t>(rows) * f), kThreads, 0, stream>>>(gate_up, rows, f, out);
  return cudaGetLastError();
}

cudaError_t LaunchConvertF32ToBf16(const float* x, size_t n, bf16* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (x == nullptr || out == nullptr) return cudaErrorInvalidValue;
  F32ToBf16Kernel<<<GridFor(n), kThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchConvertBf16ToF32(const bf16* x, size_t n, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (x == nullptr || out == nullptr) return cudaErrorInvalidValue;
  Bf16ToF32Kernel<<<GridFor(n), kThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchZeroChunkRow(T* kv, int num_chunks, int row, int width, cudaStream_t stream) {
  if (num_chunks < 0 || row < 0 || row >= 64 || width <= 0) return cudaErrorInvalidValue;
  if (num_chunks == 0) return cudaSuccess;
  if (kv == nullptr) return cudaErrorInvalidValue;
  ZeroChunkRowKernel<T><<<GridFor(static_cast<size_t>(num_chunks) * width), kThreads, 0, stream>>>(
      kv, num_chunks, row, width);
  return cudaGetLastError();
}

cudaError_t LaunchCopyRowsAtChunkOffset(const float* src, int n, int d,
                                        const int64_t* device_pos, int chunk_rows, float* dst,
                                        cudaStream_t stream) {
  if (n < 0 || d <= 0 || chunk_rows <= 0 || n > chunk_rows) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr || device_pos == nullptr) return cudaErrorInvalidValue;
  CopyRowsAtChunkOffsetKernel<<<GridFor(static_cast<size_t>(n) * d), kThreads, 0, stream>>>(
      src, n, d, device_pos, chunk_rows, dst);
  return cudaGetLastError();
}

#define DRT_INSTANTIATE_ELEMENTWISE(T)                                                          \
  template cudaError_t LaunchEmbeddingGather<T>(const int32_t*, int, const T*, int, float*,     \
                                                cudaStream_t);                                  \
  template cudaError_t LaunchRmsNorm<T>(const float*, const T*, int, int, float, T*,            \
                                        cudaStream_t);                                          \
  template cudaError_t LaunchRmsNormF32<T>(const float*, const T*, int, int, float, float*,     \
                                           cudaStream_t);                                       \
  template cudaError_t LaunchSwiGlu<T>(const T*, int, int, T*, cudaStream_t);                   \
  template cudaError_t LaunchZeroChunkRow<T>(T*, int, int, int, cudaStream_t);
DRT_INSTANTIATE_ELEMENTWISE(float)
DRT_INSTANTIATE_ELEMENTWISE(bf16)
#undef DRT_INSTANTIATE_ELEMENTWISE

}  // namespace drt::kernels

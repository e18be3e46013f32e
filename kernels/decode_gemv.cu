#include "kernels/decode_gemv.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/decode_gemv_plan.h"

namespace drt::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kNormThreads = kDecodeGemvNormThreads;
constexpr int kNormWarps = kNormThreads / kWarp;
constexpr int kAccumulateWarps = kDecodeGemvAccumulateThreads / kWarp;

// Elements of T in one 16-byte load.
template <typename T>
struct Vec16;
template <>
struct Vec16<float> {
  static constexpr int kElems = 4;
};
template <>
struct Vec16<bf16> {
  static constexpr int kElems = 8;
};

template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToFloat<bf16>(bf16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 FromFloat<bf16>(float v) {
  return __float2bfloat16_rn(v);
}

// The 16 bytes at p (16-byte aligned) as floats; bf16 widens exactly (its
// bits are the high half of the float's; element 0 is the low half-word).
__device__ __forceinline__ void Unpack(uint4 v, float (&out)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void Load16(const float* p, float (&out)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}
__device__ __forceinline__ void Load16(const bf16* p, float (&out)[8]) {
  Unpack(*reinterpret_cast<const uint4*>(p), out);
}
// Weights: through the read-only data path (nothing writes them).
__device__ __forceinline__ void LoadWeight16(const float* p, float (&out)[4]) {
  const float4 v = __ldg(reinterpret_cast<const float4*>(p));
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}
__device__ __forceinline__ void LoadWeight16(const bf16* p, float (&out)[8]) {
  Unpack(__ldg(reinterpret_cast<const uint4*>(p)), out);
}

// acc[i][r] += the lane's share of w[i] . x[r] (rows of k elements; x rows
// `k` apart, in shared or global memory): lane l takes the 16-byte vectors
// l, l + 32, ..., so a warp reads each W row in coalesced 512-byte sweeps.
// M is 1 (decode) or kMaxDecodeGemvRows with the rows past m skipped.
template <typename T, int R, int M>
__device__ __forceinline__ void LaneDots(const T* const (&w)[R], const T* x, int m, int k,
                                         int lane, float (&acc)[R][M]) {
  constexpr int E = Vec16<T>::kElems;
  const int vectors = k / E;
#pragma unroll 2
  for (int v = lane; v < vectors; v += kWarp) {
    float wv[R][E];
#pragma unroll
    for (int i = 0; i < R; ++i) LoadWeight16(w[i] + v * E, wv[i]);
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (r < m) {
        float xv[E];
        Load16(x + static_cast<size_t>(r) * k + v * E, xv);
#pragma unroll
        for (int i = 0; i < R; ++i) {
#pragma unroll
          for (int e = 0; e < E; ++e) acc[i][r] = fmaf(wv[i][e], xv[e], acc[i][r]);
        }
      }
    }
  }
}

// Sums each accumulator over the warp (every lane gets the total).
template <int R, int M>
__device__ __forceinline__ void WarpSums(float (&acc)[R][M]) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        acc[i][r] += __shfl_xor_sync(0xffffffffu, acc[i][r], offset);
      }
    }
  }
}

// xs[r][:] = T(RMSNorm(h[r][:])) for the m rows, by the block's 256 threads,
// with RmsNormKernel's arithmetic (kernels/elementwise.cu): thread t sums
// the squares of elements t, t + 256, ... with fmaf, warps reduce by
// xor-shuffles, thread 0 adds the 8 warp sums in order, scale =
// rsqrtf(total / k + eps), x = (h * scale) * w rounded to T. The same
// operations in the same order, so the same bits as LaunchRmsNorm.
// `scratch` (shared, m x kDecodeGemvNormScratchBytesPerRow bytes) holds the
// warp sums, [m][kNormWarps], then the m scales: part of the dynamic
// allocation the plan counts, not static arrays it would not see.
template <typename T, int M>
__device__ __forceinline__ void NormRowsToShared(const float* __restrict__ h,
                                                 const T* __restrict__ norm_w, float eps, int m,
                                                 int k, T* xs, float* scratch) {
  float* partial = scratch;              // [m][kNormWarps]
  float* scale = scratch + m * kNormWarps;  // [m]
  float sum[M];
#pragma unroll
  for (int r = 0; r < M; ++r) {
    sum[r] = 0.f;
    if (r < m) {
      const float* hr = h + static_cast<size_t>(r) * k;
      for (int j = threadIdx.x; j < k; j += kNormThreads) {
        const float v = hr[j];
        sum[r] = fmaf(v, v, sum[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
    for (int offset = 16; offset > 0; offset >>= 1) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], offset);
    }
    if (r < m && (threadIdx.x & 31) == 0) partial[r * kNormWarps + (threadIdx.x >> 5)] = sum[r];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int r = 0; r < m; ++r) {
      float total = 0.f;
      for (int i = 0; i < kNormWarps; ++i) total += partial[r * kNormWarps + i];
      scale[r] = rsqrtf(total / static_cast<float>(k) + eps);
    }
  }
  __syncthreads();
  for (int r = 0; r < m; ++r) {
    const float s = scale[r];
    const float* hr = h + static_cast<size_t>(r) * k;
    T* xr = xs + static_cast<size_t>(r) * k;
    for (int j = threadIdx.x; j < k; j += kNormThreads) {
      xr[j] = FromFloat<T>(hr[j] * s * ToFloat<T>(norm_w[j]));
    }
  }
  __syncthreads();
}

// Dynamic shared memory of the norm kernels (DecodeGemvLaunch::shared_bytes):
// the m normed rows as T, then the reduction scratch. m x k x sizeof(T) is a
// multiple of 16 bytes (k is a multiple of 8), so the rows start 16-byte
// aligned (16-byte loads) and the scratch float-aligned.
extern __shared__ __align__(16) unsigned char normed_rows[];

template <typename T>
__device__ __forceinline__ float* NormScratch(int m, int k) {
  return reinterpret_cast<float*>(normed_rows + static_cast<size_t>(m) * k * sizeof(T));
}

// Grid: ceil(n / (8 * R)) blocks of 256 threads; warp w of block b takes W
// rows (8b + w) R .. (8b + w) R + R - 1 (kernels/decode_gemv_plan.h).
template <typename T, int R, int M>
__global__ void __launch_bounds__(kNormThreads)
    NormGemvKernel(NormGemvParams<T> p, int n) {
  T* xs = reinterpret_cast<T*>(normed_rows);
  NormRowsToShared<T, M>(p.h, p.norm_w, p.eps, p.m, p.k, xs, NormScratch<T>(p.m, p.k));
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int first = (blockIdx.x * kNormWarps + warp) * R;
  if (first >= n) return;  // no __syncthreads follows
  const T* w[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    // A row past n (the last warp's second row) rereads row n - 1; its sum
    // is not written.
    const int row = min(first + i, n - 1);
    w[i] = p.w + static_cast<size_t>(row) * p.k;
  }
  float acc[R][M] = {};
  LaneDots<T, R, M>(w, xs, p.m, p.k, lane, acc);
  WarpSums<R, M>(acc);
  if (lane != 0) return;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    int col = first + i;
    if (col >= n) break;
    // The segment holding col (constant indices: no local-memory copy of p).
    T* out = p.out[0];
    int width = p.cols[0];
    if (col >= p.cols[0]) {
      col -= p.cols[0];
      out = p.out[1];
      width = p.cols[1];
      if (col >= p.cols[1]) {
        col -= p.cols[1];
        out = p.out[2];
        width = p.cols[2];
      }
    }
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (r < p.m) out[static_cast<size_t>(r) * width + col] = FromFloat<T>(acc[i][r]);
    }
  }
}

// Grid: ceil(f / 8) blocks of 256 threads; warp w of block b takes the gate
// row j = 8b + w and the up row f + j.
template <typename T, int M>
__global__ void __launch_bounds__(kNormThreads)
    NormGemvSwiGluKernel(const float* __restrict__ h, const T* __restrict__ norm_w, float eps,
                         const T* __restrict__ gate_up, int m, int f, int k,
                         T* __restrict__ act) {
  T* xs = reinterpret_cast<T*>(normed_rows);
  NormRowsToShared<T, M>(h, norm_w, eps, m, k, xs, NormScratch<T>(m, k));
  const int lane = threadIdx.x % kWarp;
  const int j = blockIdx.x * kNormWarps + threadIdx.x / kWarp;
  if (j >= f) return;  // no __syncthreads follows
  const T* const w[2] = {gate_up + static_cast<size_t>(j) * k,
                         gate_up + static_cast<size_t>(f + j) * k};
  float acc[2][M] = {};
  LaneDots<T, 2, M>(w, xs, m, k, lane, acc);
  WarpSums<2, M>(acc);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (r < m) {
      // As the unfused path: the GEMM writes gate and up as T, and
      // SwiGluKernel computes from those values.
      const float g = ToFloat<T>(FromFloat<T>(acc[0][r]));
      const float u = ToFloat<T>(FromFloat<T>(acc[1][r]));
      act[static_cast<size_t>(r) * f + j] = FromFloat<T>(g / (1.f + expf(-g)) * u);
    }
  }
}

// Grid: ceil(n / 4) blocks of 128 threads; warp w of block b takes W row
// 4b + w. x rows are read from global memory (L1/L2: every warp of the
// launch reads the same m x k values).
template <typename T, int M>
__global__ void __launch_bounds__(kDecodeGemvAccumulateThreads)
    GemvAccumulateKernel(const T* __restrict__ x, const T* __restrict__ weights,
                         const float* residual, int m, int n, int k, float* y) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kAccumulateWarps + threadIdx.x / kWarp;
  if (row >= n) return;
  const T* const w[1] = {weights + static_cast<size_t>(row) * k};
  float acc[1][M] = {};
  LaneDots<T, 1, M>(w, x, m, k, lane, acc);
  WarpSums<1, M>(acc);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (r < m) {
      const size_t i = static_cast<size_t>(r) * n + row;
      const float base = residual != nullptr ? residual[i] : y[i];
      y[i] = base + acc[0][r];
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

template <typename T>
cudaError_t LaunchNormGemv(const NormGemvParams<T>& p, cudaStream_t stream) {
  int64_t n = 0;
  for (int s = 0; s < kNormGemvMaxSegments; ++s) {
    if (p.cols[s] < 0 || (p.cols[s] > 0 && p.out[s] == nullptr)) return cudaErrorInvalidValue;
    n += p.cols[s];
  }
  if (n > INT32_MAX || p.h == nullptr || p.norm_w == nullptr || !Aligned16(p.w) ||
      p.w == nullptr || !(p.eps >= 0.f)) {
    return cudaErrorInvalidValue;
  }
  const absl::StatusOr<DecodeGemvLaunch> launch =
      PlanDecodeGemv({DecodeGemvKind::kNorm, p.m, n, p.k, static_cast<int64_t>(sizeof(T))});
  if (!launch.ok()) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(launch->blocks));
  const dim3 block(launch->threads);
  const size_t shared = static_cast<size_t>(launch->shared_bytes);
  const int cols = static_cast<int>(n);
  if (launch->rows_per_warp == 2) {
    if (p.m == 1) {
      NormGemvKernel<T, 2, 1><<<grid, block, shared, stream>>>(p, cols);
    } else {
      NormGemvKernel<T, 2, kMaxDecodeGemvRows><<<grid, block, shared, stream>>>(p, cols);
    }
  } else if (p.m == 1) {
    NormGemvKernel<T, 1, 1><<<grid, block, shared, stream>>>(p, cols);
  } else {
    NormGemvKernel<T, 1, kMaxDecodeGemvRows><<<grid, block, shared, stream>>>(p, cols);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchNormGemvSwiGlu(const float* h, const T* norm_w, float eps, const T* gate_up,
                                 int m, int f, int k, T* act, cudaStream_t stream) {
  if (h == nullptr || norm_w == nullptr || gate_up == nullptr || act == nullptr ||
      !Aligned16(gate_up) || !(eps >= 0.f)) {
    return cudaErrorInvalidValue;
  }
  const absl::StatusOr<DecodeGemvLaunch> launch =
      PlanDecodeGemv({DecodeGemvKind::kNormSwiGlu, m, f, k, static_cast<int64_t>(sizeof(T))});
  if (!launch.ok()) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(launch->blocks));
  const dim3 block(launch->threads);
  const size_t shared = static_cast<size_t>(launch->shared_bytes);
  if (m == 1) {
    NormGemvSwiGluKernel<T, 1><<<grid, block, shared, stream>>>(h, norm_w, eps, gate_up, m, f, k,
                                                                act);
  } else {
    NormGemvSwiGluKernel<T, kMaxDecodeGemvRows>
        <<<grid, block, shared, stream>>>(h, norm_w, eps, gate_up, m, f, k, act);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchGemvAccumulate(const T* x, const T* w, const float* residual, int m, int n,
                                 int k, float* y, cudaStream_t stream) {
  if (x == nullptr || w == nullptr || y == nullptr || !Aligned16(x) || !Aligned16(w)) {
    return cudaErrorInvalidValue;
  }
  const absl::StatusOr<DecodeGemvLaunch> launch =
      PlanDecodeGemv({DecodeGemvKind::kAccumulate, m, n, k, static_cast<int64_t>(sizeof(T))});
  if (!launch.ok()) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(launch->blocks));
  const dim3 block(launch->threads);
  if (m == 1) {
    GemvAccumulateKernel<T, 1><<<grid, block, 0, stream>>>(x, w, residual, m, n, k, y);
  } else {
    GemvAccumulateKernel<T, kMaxDecodeGemvRows>
        <<<grid, block, 0, stream>>>(x, w, residual, m, n, k, y);
  }
  return cudaGetLastError();
}

#define DRT_INSTANTIATE_DECODE_GEMV(T)                                                      \
  template cudaError_t LaunchNormGemv<T>(const NormGemvParams<T>&, cudaStream_t);           \
  template cudaError_t LaunchNormGemvSwiGlu<T>(const float*, const T*, float, const T*, int, \
                                               int, int, T*, cudaStream_t);                 \
  template cudaError_t LaunchGemvAccumulate<T>(const T*, const T*, const float*, int, int,  \
                                               int, float*, cudaStream_t);
DRT_INSTANTIATE_DECODE_GEMV(float)
DRT_INSTANTIATE_DECODE_GEMV(bf16)
#undef DRT_INSTANTIATE_DECODE_GEMV

}  // namespace drt::kernels

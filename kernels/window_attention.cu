#include "kernels/window_attention.h"

#include <algorithm>
#include <type_traits>

#include "kernels/attention_common.cuh"
#include "kernels/window_mma_prefill.cuh"
#include "kernels/window_split_decode.cuh"

namespace drt::kernels {
namespace {

using namespace detail;  // NOLINT: internal helpers of this folder

// Up to this many new positions, a block per (query, head) spreads the window
// over its 8 warps (decode; or, with params.decode_splits > 0, the split
// decode kernel of window_split_decode.cu); above it, a block per (64
// queries, head) shares each K/V tile among its 64 queries (prefill).
constexpr int kRowKernelMaxN = 8;

template <int T, typename E>
__global__ void __launch_bounds__(kTileThreads) WindowTileKernel(WindowAttentionParams<E> p) {
  extern __shared__ float4 smem_raw[];
  const int dh = p.head_dim;
  const TileSmem sm = CarveTileSmem(reinterpret_cast<float*>(smem_raw), dh);
  const int warp = threadIdx.x >> 5;
  const int h = blockIdx.y;
  const int kvh = h / (p.heads / p.kv_heads);
  const int q_stride = p.heads * dh;
  const int kv_stride = p.kv_heads * dh;
  const int i0 = blockIdx.x * kTileQueries;
  const int rows = min(kTileQueries, p.n - i0);
  const int64_t pos0 = p.first_pos + i0;
  const int64_t key_lo = pos0 - p.window > 0 ? pos0 - p.window : 0;
  const int64_t key_hi = pos0 + rows - 1;
  const float scale = 1.f / sqrtf(static_cast<float>(dh));
  const float slope = AlibiSlope(h, p.heads);

  LoadRows<E>(sm.q, dh, kTileQueries, dh, scale, [&](int r) -> const E* {
    return r < rows ? p.q + static_cast<size_t>(i0 + r) * q_stride + h * dh : nullptr;
  });

  const int wrow0 = warp * kRowsPerWarp;
  const bool warp_active = wrow0 < rows;
  const int64_t wpos_lo = pos0 + wrow0;
  const int64_t wpos_hi = pos0 + min(wrow0 + kRowsPerWarp, rows) - 1;
  RowState<T> st;
  st.Reset();

  for (int64_t kt = key_lo; kt <= key_hi; kt += kTileKeys) {
    __syncthreads();  // the previous tile is consumed (and, first time, nothing)
    LoadRows<E>(sm.k, dh + 1, kTileKeys, dh, 1.f, [&](int r) -> const E* {
      const int64_t j = kt + r;
      return j > key_hi ? nullptr
                        : KvRow(p.k_new, p.k_ring, j, p.first_pos, p.ring_slots, kv_stride, kvh, dh);
    });
    LoadRows<E>(sm.v, dh, kTileKeys, dh, 1.f, [&](int r) -> const E* {
      const int64_t j = kt + r;
      return j > key_hi ? nullptr
                        : KvRow(p.v_new, p.v_ring, j, p.first_pos, p.ring_slots, kv_stride, kvh, dh);
    });
    __syncthreads();
    if (!warp_active) continue;
    for (int sub = 0; sub < kTileKeys / 32; ++sub) {
      const int64_t kb = kt + sub * 32;
      // Skip subtiles that no row of this warp sees.
      if (kb > wpos_hi || kb + 31 < wpos_lo - p.window) continue;
      AttendSubtile<T>(sm.q + wrow0 * dh, sm.k + sub * 32 * (dh + 1), sm.v + sub * 32 * dh, sm.p, dh,
                       st, [&](int r, int key, float s) {
                         const int64_t qpos = wpos_lo + r;
                         const int64_t j = kb + key;
                         if (wrow0 + r >= rows || j > qpos || j < qpos - p.window) return -INFINITY;
                         return s - slope * static_cast<float>(qpos - j);
                       });
    }
  }
  if (!warp_active) return;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = wrow0 + r;
    if (row >= rows) break;
    StoreRow<T>(p.out + static_cast<size_t>(i0 + row) * q_stride + h * dh, dh, st.acc[r],
                st.l[r] > 0.f ? 1.f / st.l[r] : 0.f);
  }
}

// One block per (query, head): warp w takes the 32-key groups w, w+8, ... of
// the query's window with its own running softmax; the 8 partial results are
// merged in shared memory. T2 = ceil(dh / 64): a lane owns dims 2 lane + 64 t
// and 2 lane + 64 t + 1 of the output.
template <int T2, typename E>
__global__ void __launch_bounds__(kRowThreads) WindowRowKernel(WindowAttentionParams<E> p) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float warp_m[kRowWarps];
  __shared__ float warp_l[kRowWarps];
  __shared__ float warp_acc[kRowWarps][kMaxHeadDim];
  const int dh = p.head_dim;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int i = blockIdx.x;
  const int h = blockIdx.y;
  const int kvh = h / (p.heads / p.kv_heads);
  const int q_stride = p.heads * dh;
  const int kv_stride = p.kv_heads * dh;
  const int64_t first_pos = p.device_first_pos != nullptr ? *p.device_first_pos : p.first_pos;
  const int64_t pos = first_pos + i;
  const int64_t lo = pos - p.window > 0 ? pos - p.window : 0;
  const float scale = 1.f / sqrtf(static_cast<float>(dh));
  const float slope = AlibiSlope(h, p.heads);
  for (int d = threadIdx.x; d < dh; d += blockDim.x) {
    qs[d] = ToFloat(p.q[static_cast<size_t>(i) * q_stride + h * dh + d]) * scale;
  }
  __syncthreads();

  float m = -INFINITY;
  float l = 0.f;
  float acc[T2][2];
#pragma unroll
  for (int t = 0; t < T2; ++t) acc[t][0] = acc[t][1] = 0.f;
  for (int64_t t0 = lo + warp * 32; t0 <= pos; t0 += kRowWarps * 32) {
    const int64_t j = t0 + lane;
    float s = -INFINITY;
    if (j <= pos) {
      const E* krow = KvRow(p.k_new, p.k_ring, j, first_pos, p.ring_slots, kv_stride, kvh, dh);
      s = DotSharedGlobal(qs, krow, dh) - slope * static_cast<float>(pos - j);
    }
    const float m_new = fmaxf(m, WarpMax(s));  // finite: key t0 is valid
    const float pj = expf(s - m_new);
    const float alpha = expf(m - m_new);
    l = l * alpha + WarpSum(pj);
    m = m_new;
#pragma unroll
    for (int t = 0; t < T2; ++t) {
      acc[t][0] *= alpha;
      acc[t][1] *= alpha;
    }
    const int nk = static_cast<int>(pos - t0 + 1 < 32 ? pos - t0 + 1 : 32);
    for (int k = 0; k < nk; ++k) {
      const float pk = __shfl_sync(0xffffffffu, pj, k);
      const E* vrow = KvRow(p.v_new, p.v_ring, t0 + k, first_pos, p.ring_slots, kv_stride, kvh, dh);
#pragma unroll
      for (int t = 0; t < T2; ++t) {
        const int d = 2 * lane + 64 * t;
        if (d < dh) {
          const float2 v = Load2(vrow + d);
          acc[t][0] = fmaf(pk, v.x, acc[t][0]);
          acc[t][1] = fmaf(pk, v.y, acc[t][1]);
        }
      }
    }
  }
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int t = 0; t < T2; ++t) {
    const int d = 2 * lane + 64 * t;
    if (d < dh) {
      warp_acc[warp][d] = acc[t][0];
      warp_acc[warp][d + 1] = acc[t][1];
    }
  }
  __syncthreads();
  float m_all = -INFINITY;
  for (int w = 0; w < kRowWarps; ++w) m_all = fmaxf(m_all, warp_m[w]);
  for (int d = threadIdx.x; d < dh; d += blockDim.x) {
    float l_all = 0.f;
    float o = 0.f;
    for (int w = 0; w < kRowWarps; ++w) {
      if (warp_m[w] == -INFINITY) continue;  // this warp saw no key
      const float f = expf(warp_m[w] - m_all);
      l_all += warp_l[w] * f;
      o += warp_acc[w][d] * f;
    }
    p.out[static_cast<size_t>(i) * q_stride + h * dh + d] = FromFloat<E>(o / l_all);
  }
}

// Copies 16-byte vectors: 8 bf16 or 4 floats (width is a multiple of 8).
template <typename E>
__global__ void RingWriteKernel(const E* __restrict__ k_new, const E* __restrict__ v_new, int n,
                                int count, int64_t host_first_pos, const int64_t* device_first_pos,
                                int ring_slots, int width, E* __restrict__ k_ring,
                                E* __restrict__ v_ring) {
  const int64_t first_pos = device_first_pos != nullptr ? *device_first_pos : host_first_pos;
  constexpr int kPerVec = 16 / sizeof(E);
  const int vecs = width / kPerVec;
  const size_t total = static_cast<size_t>(count) * vecs;
  for (size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(idx / vecs);
    const int c = static_cast<int>(idx % vecs) * kPerVec;
    const int i = n - count + r;
    const size_t slot = static_cast<size_t>((first_pos + i) % ring_slots);
    const size_t src = static_cast<size_t>(i) * width + c;
    const size_t dst = slot * width + c;
    *reinterpret_cast<uint4*>(k_ring + dst) = *reinterpret_cast<const uint4*>(k_new + src);
    *reinterpret_cast<uint4*>(v_ring + dst) = *reinterpret_cast<const uint4*>(v_new + src);
  }
}

template <typename E>
bool ValidParams(const WindowAttentionParams<E>& p) {
  if (p.n < 0 || p.first_pos < 0 || p.window < 0 || p.heads <= 0 || p.kv_heads <= 0) return false;
  if (p.heads % p.kv_heads != 0 || p.heads > 65535 || !ValidHeadDim(p.head_dim)) return false;
  if (p.ring_slots < p.window + 1) return false;
  if (p.decode_splits != 0 && !ValidDecodeSplits(p.decode_splits)) return false;
  if (p.n == 0) return true;
  for (const void* ptr : {static_cast<const void*>(p.q), static_cast<const void*>(p.k_new),
                          static_cast<const void*>(p.v_new), static_cast<const void*>(p.out)}) {
    if (ptr == nullptr || !Aligned16(ptr)) return false;
  }
  // A position read on the device is known only there: only the decode
  // kernels read it, and the ring must be there whatever first_pos says.
  if (p.device_first_pos != nullptr && p.n > kRowKernelMaxN) return false;
  if ((p.first_pos > 0 || p.device_first_pos != nullptr) && p.window > 0) {
    if (p.k_ring == nullptr || p.v_ring == nullptr || !Aligned16(p.k_ring) || !Aligned16(p.v_ring)) {
      return false;
    }
  }
  return true;
}

template <int T, typename E>
cudaError_t LaunchTile(const WindowAttentionParams<E>& p, cudaStream_t stream) {
  const size_t smem = TileSmemBytes(p.head_dim, 0);
  if (cudaError_t err = PrepareSmem(WindowTileKernel<T, E>, smem); err != cudaSuccess) return err;
  const dim3 grid((p.n + kTileQueries - 1) / kTileQueries, p.heads);
  WindowTileKernel<T, E><<<grid, kTileThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t LaunchWindowAttention(const WindowAttentionParams<T>& p, cudaStream_t stream) {
  if (!ValidParams(p)) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  if (p.n <= kRowKernelMaxN) {
    if (p.decode_splits > 0) return LaunchWindowSplitDecode(p, stream);
    const dim3 grid(p.n, p.heads);
    if (p.head_dim <= 64) {
      WindowRowKernel<1, T><<<grid, kRowThreads, 0, stream>>>(p);
    } else {
      WindowRowKernel<2, T><<<grid, kRowThreads, 0, stream>>>(p);
    }
    return cudaGetLastError();
  }
  if constexpr (std::is_same_v<T, bf16>) {
    if (p.prefill_tensor_cores && MmaPrefillHeadDim(p.head_dim)) return LaunchWindowMmaPrefill(p, stream);
  }
  switch ((p.head_dim + 31) / 32) {
    case 1: return LaunchTile<1, T>(p, stream);
    case 2: return LaunchTile<2, T>(p, stream);
    case 3: return LaunchTile<3, T>(p, stream);
    default: return LaunchTile<4, T>(p, stream);
  }
}

template <typename T>
cudaError_t LaunchWindowRingWrite(const T* k_new, const T* v_new, int n, int64_t first_pos,
                                  int ring_slots, int kv_heads, int head_dim, T* k_ring,
                                  T* v_ring, cudaStream_t stream,
                                  const int64_t* device_first_pos) {
  if (n < 0 || first_pos < 0 || ring_slots <= 0 || kv_heads <= 0 || !ValidHeadDim(head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  for (const void* ptr : {static_cast<const void*>(k_new), static_cast<const void*>(v_new),
                          static_cast<const void*>(k_ring), static_cast<const void*>(v_ring)}) {
    if (ptr == nullptr || !Aligned16(ptr)) return cudaErrorInvalidValue;
  }
  const int count = std::min(n, ring_slots);
  const int width = kv_heads * head_dim;
  const size_t total = static_cast<size_t>(count) * (width * sizeof(T) / 16);
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((total + 255) / 256, 65535));
  RingWriteKernel<T><<<blocks, 256, 0, stream>>>(k_new, v_new, n, count, first_pos,
                                                 device_first_pos, ring_slots, width, k_ring,
                                                 v_ring);
  return cudaGetLastError();
}

template cudaError_t LaunchWindowAttention<float>(const WindowAttentionParams<float>&,
                                                  cudaStream_t);
template cudaError_t LaunchWindowAttention<bf16>(const WindowAttentionParams<bf16>&, cudaStream_t);
template cudaError_t LaunchWindowRingWrite<float>(const float*, const float*, int, int64_t, int,
                                                  int, int, float*, float*, cudaStream_t,
                                                  const int64_t*);
template cudaError_t LaunchWindowRingWrite<bf16>(const bf16*, const bf16*, int, int64_t, int, int,
                                                 int, bf16*, bf16*, cudaStream_t, const int64_t*);

}  // namespace drt::kernels

#include "kernels/gca_attention.h"

#include <type_traits>

#include "kernels/attention_common.cuh"
#include "kernels/gca_mma_prefill.cuh"

namespace drt::kernels {
namespace {

using namespace detail;  // NOLINT: internal helpers of this folder

constexpr int kChunkRows = 64;  // stored rows per chunk, row 63 zero (drt-model.md, Forward pass 7)

// Up to this many positions, a block per (position, head) gives each warp its
// own retrieved chunks (decode); above it, a block per (query chunk, head)
// loads each retrieved chunk's K/V once for all its positions (prefill).
constexpr int kRowKernelMaxN = 4;

// One block per (query chunk, head). For every retrieved chunk i the 64 K/V
// rows of the head come into shared memory once; each warp computes o_i for
// its 8 positions with a fresh softmax over the 64 rows and adds w_i o_i to
// its registers. Nothing per chunk leaves the chip.
template <int T, typename E>
__global__ void __launch_bounds__(kTileThreads) GcaTileKernel(GcaParams<E> p) {
  extern __shared__ float4 smem_raw[];
  const int dh = p.head_dim;
  const TileSmem sm = CarveTileSmem(reinterpret_cast<float*>(smem_raw), dh);
  const int warp = threadIdx.x >> 5;
  const int h = blockIdx.y;
  const size_t stride = static_cast<size_t>(p.heads) * dh;
  const int64_t chunk = p.first_pos / kChunkRows + blockIdx.x;
  const int64_t row_begin64 = chunk * kChunkRows > p.first_pos ? chunk * kChunkRows : p.first_pos;
  const int64_t row_end64 = (chunk + 1) * kChunkRows < p.first_pos + p.n ? (chunk + 1) * kChunkRows
                                                                        : p.first_pos + p.n;
  const int row_begin = static_cast<int>(row_begin64 - p.first_pos);
  const int rows = static_cast<int>(row_end64 - row_begin64);
  const int64_t qc = chunk - p.first_query_chunk;
  const float scale = 1.f / sqrtf(static_cast<float>(dh));

  LoadRows<E>(sm.q, dh, kTileQueries, dh, scale, [&](int r) -> const E* {
    return r < rows ? p.q + static_cast<size_t>(row_begin + r) * stride + h * dh : nullptr;
  });

  const int wrow0 = warp * kRowsPerWarp;
  const bool warp_active = wrow0 < rows;
  float total[kRowsPerWarp][T];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) total[r][t] = 0.f;
  }
  RowState<T> st;
  for (int i = 0; i < p.topk; ++i) {
    const int32_t slot = p.slots[qc * p.topk + i];
    if (slot < 0) continue;
    const float w = p.weights[qc * p.topk + i];
    const E* k_base = p.chunk_k + static_cast<size_t>(slot) * kChunkRows * stride + h * dh;
    const E* v_base = p.chunk_v + static_cast<size_t>(slot) * kChunkRows * stride + h * dh;
    __syncthreads();  // the previous chunk's K/V are consumed
    LoadRows<E>(sm.k, dh + 1, kChunkRows, dh, 1.f, [&](int r) { return k_base + r * stride; });
    LoadRows<E>(sm.v, dh, kChunkRows, dh, 1.f, [&](int r) { return v_base + r * stride; });
    __syncthreads();
    if (!warp_active) continue;
    st.Reset();
    for (int sub = 0; sub < kChunkRows / 32; ++sub) {
      AttendSubtile<T>(sm.q + wrow0 * dh, sm.k + sub * 32 * (dh + 1), sm.v + sub * 32 * dh, sm.p, dh,
                       st, [](int, int, float s) { return s; });
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float f = w / st.l[r];
#pragma unroll
      for (int t = 0; t < T; ++t) total[r][t] = fmaf(f, st.acc[r][t], total[r][t]);
    }
  }
  if (!warp_active) return;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = wrow0 + r;
    if (row >= rows) break;
    StoreRow<T>(p.out + static_cast<size_t>(row_begin + row) * stride + h * dh, dh, total[r], 1.f);
  }
}

// One block per (position, head): warp w handles retrieved chunks w, w+8, ...;
// lane l scores rows l and l+32 of the chunk against the query, the warp
// normalises over the 64 rows and accumulates w_i o_i (a lane owns dims
// 2 lane + 64 t, +1). The 8 warps' sums meet in shared memory.
template <int T2, typename E>
__global__ void __launch_bounds__(kRowThreads) GcaRowKernel(GcaParams<E> p) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float warp_out[kRowWarps][kMaxHeadDim];
  const int dh = p.head_dim;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int i = blockIdx.x;
  const int h = blockIdx.y;
  const size_t stride = static_cast<size_t>(p.heads) * dh;
  const int64_t first_pos = p.device_first_pos != nullptr ? *p.device_first_pos : p.first_pos;
  const int64_t first_query_chunk =
      p.device_first_pos != nullptr ? first_pos / kChunkRows : p.first_query_chunk;
  const int64_t qc = (first_pos + i) / kChunkRows - first_query_chunk;
  const float scale = 1.f / sqrtf(static_cast<float>(dh));
  for (int d = threadIdx.x; d < dh; d += blockDim.x) {
    qs[d] = ToFloat(p.q[static_cast<size_t>(i) * stride + h * dh + d]) * scale;
  }
  __syncthreads();

  float total[T2][2];
#pragma unroll
  for (int t = 0; t < T2; ++t) total[t][0] = total[t][1] = 0.f;
  for (int c = warp; c < p.topk; c += kRowWarps) {
    const int32_t slot = p.slots[qc * p.topk + c];
    if (slot < 0) continue;
    const float w = p.weights[qc * p.topk + c];
    const E* k_base = p.chunk_k + static_cast<size_t>(slot) * kChunkRows * stride + h * dh;
    const E* v_base = p.chunk_v + static_cast<size_t>(slot) * kChunkRows * stride + h * dh;
    const float s0 = DotSharedGlobal(qs, k_base + lane * stride, dh);
    const float s1 = DotSharedGlobal(qs, k_base + (lane + 32) * stride, dh);
    const float m = WarpMax(fmaxf(s0, s1));
    const float p0 = expf(s0 - m);
    const float p1 = expf(s1 - m);
    const float l = WarpSum(p0 + p1);
    float acc[T2][2];
#pragma unroll
    for (int t = 0; t < T2; ++t) acc[t][0] = acc[t][1] = 0.f;
    for (int k = 0; k < kChunkRows; ++k) {
      const float pk = __shfl_sync(0xffffffffu, k < 32 ? p0 : p1, k & 31);
      const E* vrow = v_base + k * stride;
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
    const float f = w / l;
#pragma unroll
    for (int t = 0; t < T2; ++t) {
      total[t][0] = fmaf(f, acc[t][0], total[t][0]);
      total[t][1] = fmaf(f, acc[t][1], total[t][1]);
    }
  }
#pragma unroll
  for (int t = 0; t < T2; ++t) {
    const int d = 2 * lane + 64 * t;
    if (d < dh) {
      warp_out[warp][d] = total[t][0];
      warp_out[warp][d + 1] = total[t][1];
    }
  }
  __syncthreads();
  for (int d = threadIdx.x; d < dh; d += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < kRowWarps; ++w) o += warp_out[w][d];
    p.out[static_cast<size_t>(i) * stride + h * dh + d] = FromFloat<E>(o);
  }
}

template <int T, typename E>
cudaError_t LaunchTile(const GcaParams<E>& p, cudaStream_t stream) {
  const size_t smem = TileSmemBytes(p.head_dim, 0);
  if (cudaError_t err = PrepareSmem(GcaTileKernel<T, E>, smem); err != cudaSuccess) return err;
  const int64_t query_chunks = (p.first_pos + p.n - 1) / kChunkRows - p.first_pos / kChunkRows + 1;
  const dim3 grid(static_cast<unsigned>(query_chunks), p.heads);
  GcaTileKernel<T, E><<<grid, kTileThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t LaunchGcaAttention(const GcaParams<T>& p, cudaStream_t stream) {
  static_assert(kChunkRows == kTileQueries && kChunkRows == kTileKeys);
  if (p.n < 0 || p.first_pos < 0 || p.topk < 0 || p.heads <= 0 || p.heads > 65535 ||
      !ValidHeadDim(p.head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (p.first_query_chunk < 0 || p.first_query_chunk > p.first_pos / kChunkRows) {
    return cudaErrorInvalidValue;
  }
  if (p.device_first_pos != nullptr &&
      (p.n > kRowKernelMaxN || p.first_query_chunk != p.first_pos / kChunkRows)) {
    return cudaErrorInvalidValue;
  }
  if (p.n == 0) return cudaSuccess;
  if (p.q == nullptr || p.out == nullptr || !Aligned16(p.q) || !Aligned16(p.out)) {
    return cudaErrorInvalidValue;
  }
  if (p.topk > 0 && (p.slots == nullptr || p.weights == nullptr || p.chunk_k == nullptr ||
                     p.chunk_v == nullptr || !Aligned16(p.chunk_k) || !Aligned16(p.chunk_v))) {
    return cudaErrorInvalidValue;
  }
  if (p.n <= kRowKernelMaxN) {
    const dim3 grid(p.n, p.heads);
    if (p.head_dim <= 64) {
      GcaRowKernel<1, T><<<grid, kRowThreads, 0, stream>>>(p);
    } else {
      GcaRowKernel<2, T><<<grid, kRowThreads, 0, stream>>>(p);
    }
    return cudaGetLastError();
  }
  if constexpr (std::is_same_v<T, bf16>) {
    if (p.prefill_tensor_cores && MmaPrefillHeadDim(p.head_dim)) return LaunchGcaMmaPrefill(p, stream);
  }
  switch ((p.head_dim + 31) / 32) {
    case 1: return LaunchTile<1, T>(p, stream);
    case 2: return LaunchTile<2, T>(p, stream);
    case 3: return LaunchTile<3, T>(p, stream);
    default: return LaunchTile<4, T>(p, stream);
  }
}

template cudaError_t LaunchGcaAttention<float>(const GcaParams<float>&, cudaStream_t);
template cudaError_t LaunchGcaAttention<bf16>(const GcaParams<bf16>&, cudaStream_t);

}  // namespace drt::kernels

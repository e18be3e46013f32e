#include "kernels/encoder_attention.h"

#include "kernels/attention_common.cuh"

namespace drt::kernels {
namespace {

using namespace detail;  // NOLINT: internal helpers of this folder

constexpr int kChunkRows = 64;  // a chunk is 64 decoder positions (drt-model.md, Shapes)

// rows [0, 64) of one head of a chunk (row r at src + r * stride) rotated by
// RoPE at position r, times scale, into dst[r * dst_stride + :]. The pairing
// (f, f + dh/2) and fp32 cos/sin of r * inv_freq follow engine/cpu ApplyRope.
template <typename E>
__device__ void LoadRope(float* dst, int dst_stride, const E* src, size_t stride, int dh, float scale,
                         const float* inv_freq) {
  const int half = dh / 2;
  for (int i = threadIdx.x; i < kChunkRows * half; i += blockDim.x) {
    const int r = i / half;
    const int f = i - r * half;
    const E* row = src + r * stride;
    const float a = ToFloat(row[f]);
    const float b = ToFloat(row[f + half]);
    const float angle = static_cast<float>(r) * inv_freq[f];
    float s, c;
    sincosf(angle, &s, &c);
    dst[r * dst_stride + f] = (a * c - b * s) * scale;
    dst[r * dst_stride + f + half] = (b * c + a * s) * scale;
  }
}

// One block per (chunk, head): the chunk's 64 queries, keys and values of the
// head sit in shared memory; full bidirectional attention (drt-model.md,
// Forward pass 4).
template <int T, typename E>
__global__ void __launch_bounds__(kTileThreads)
    EncoderAttentionKernel(const E* __restrict__ q, const E* __restrict__ k,
                           const E* __restrict__ v, int heads, int kv_heads, int dh,
                           double rope_theta, E* __restrict__ out) {
  extern __shared__ float4 smem_raw[];
  const TileSmem sm = CarveTileSmem(reinterpret_cast<float*>(smem_raw), dh);
  float* inv_freq = sm.extra;
  const int warp = threadIdx.x >> 5;
  const size_t chunk = blockIdx.x;
  const int h = blockIdx.y;
  const int kvh = h / (heads / kv_heads);
  const size_t q_stride = static_cast<size_t>(heads) * dh;
  const size_t kv_stride = static_cast<size_t>(kv_heads) * dh;
  for (int f = threadIdx.x; f < dh / 2; f += blockDim.x) {
    inv_freq[f] = static_cast<float>(1.0 / pow(rope_theta, static_cast<double>(2 * f) / dh));
  }
  __syncthreads();
  const float scale = 1.f / sqrtf(static_cast<float>(dh));
  LoadRope(sm.q, dh, q + chunk * kChunkRows * q_stride + h * dh, q_stride, dh, scale, inv_freq);
  LoadRope(sm.k, dh + 1, k + chunk * kChunkRows * kv_stride + kvh * dh, kv_stride, dh, 1.f, inv_freq);
  LoadRows<E>(sm.v, dh, kChunkRows, dh, 1.f, [&](int r) -> const E* {
    return v + (chunk * kChunkRows + r) * kv_stride + kvh * dh;
  });
  __syncthreads();

  const int wrow0 = warp * kRowsPerWarp;
  RowState<T> st;
  st.Reset();
  for (int sub = 0; sub < kChunkRows / 32; ++sub) {
    AttendSubtile<T>(sm.q + wrow0 * dh, sm.k + sub * 32 * (dh + 1), sm.v + sub * 32 * dh, sm.p, dh, st,
                     [](int, int, float s) { return s; });
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    StoreRow<T>(out + (chunk * kChunkRows + wrow0 + r) * q_stride + h * dh, dh, st.acc[r],
                1.f / st.l[r]);
  }
}

template <int T, typename E>
cudaError_t Launch(const E* q, const E* k, const E* v, int num_chunks, int heads,
                   int kv_heads, int dh, double rope_theta, E* out, cudaStream_t stream) {
  const size_t smem = TileSmemBytes(dh, kMaxHeadDim / 2);
  if (cudaError_t err = PrepareSmem(EncoderAttentionKernel<T, E>, smem); err != cudaSuccess) return err;
  const dim3 grid(num_chunks, heads);
  EncoderAttentionKernel<T, E><<<grid, kTileThreads, smem, stream>>>(q, k, v, heads, kv_heads, dh, rope_theta, out);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t LaunchEncoderAttention(const T* q, const T* k, const T* v, int num_chunks,
                                   int heads, int kv_heads, int head_dim, double rope_theta,
                                   T* out, cudaStream_t stream) {
  static_assert(kChunkRows == kTileQueries && kChunkRows == kTileKeys);
  if (!(rope_theta > 0) || num_chunks < 0 || heads <= 0 || heads > 65535 || kv_heads <= 0 || heads % kv_heads != 0 ||
      !ValidHeadDim(head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (num_chunks == 0) return cudaSuccess;
  for (const void* ptr : {static_cast<const void*>(q), static_cast<const void*>(k),
                          static_cast<const void*>(v), static_cast<const void*>(out)}) {
    if (ptr == nullptr || !Aligned16(ptr)) return cudaErrorInvalidValue;
  }
  switch ((head_dim + 31) / 32) {
    case 1: return Launch<1, T>(q, k, v, num_chunks, heads, kv_heads, head_dim, rope_theta, out, stream);
    case 2: return Launch<2, T>(q, k, v, num_chunks, heads, kv_heads, head_dim, rope_theta, out, stream);
    case 3: return Launch<3, T>(q, k, v, num_chunks, heads, kv_heads, head_dim, rope_theta, out, stream);
    default: return Launch<4, T>(q, k, v, num_chunks, heads, kv_heads, head_dim, rope_theta, out, stream);
  }
}

template cudaError_t LaunchEncoderAttention<float>(const float*, const float*, const float*, int,
                                                   int, int, int, double, float*, cudaStream_t);
template cudaError_t LaunchEncoderAttention<bf16>(const bf16*, const bf16*, const bf16*, int, int,
                                                  int, int, double, bf16*, cudaStream_t);

}  // namespace drt::kernels

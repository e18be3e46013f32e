// Tensor-core prefill of the causal sliding-window ALiBi attention
// (drt-model.md, Forward pass 3), FlashAttention-2 style, bf16 only.
//
// Why: on an H100, prefill of 4,096 tokens of the 128M config spent 47% of
// its kernel time in WindowTileKernel, which computes QK^T and PV on fp32
// CUDA cores (issue 10). Here both products run on bf16 mma.sync
// (m16n8k16, fp32 accumulation); the softmax stays fp32.
//
// NOT YET RUN ON A GPU (docs/cuda.md, "Tensor-core window prefill"): it is
// selected only by WindowAttentionParams::prefill_tensor_cores, off by
// default.
//
// Layout. A block serves 64 queries of one head with 4 warps; warp w owns
// query rows 16w..16w+15 of the tile (one m16 fragment). Keys go through
// shared memory in tiles of 64 rows, from key_lo = max(0, pos0 - W) to the
// tile's last query. Per key tile a warp computes S = Q K^T as 8 n8
// fragments, masks and biases it (ALiBi, window, causality), updates its
// rows' running max and sum (online softmax), and adds P V, with P rounded
// to bf16 as the A operand of the second product (its fp32 C fragments of
// two adjacent n8 tiles are exactly the A fragment of one k16 step).
//
// Fragment layouts (PTX ISA, "mma.m16n8k16" for .bf16), g = lane / 4,
// t = lane % 4: A a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
// a3 = (g+8, 2t+8..); B b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g);
// C c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1). The lower k (or column)
// of each pair sits in the low 16 bits.
#include "kernels/window_mma_prefill.cuh"

#include <cuda_bf16.h>

#include <cstdint>

namespace drt::kernels::detail {
namespace {

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaQueries = kMmaWarps * 16;
constexpr int kMmaKeys = 64;
// Shared-memory rows are head_dim + 8 bf16 long: 16 extra bytes shift each
// row by 4 banks, so the 8 rows one fragment load touches hit distinct banks.
constexpr int kRowPad = 8;

__device__ inline uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ inline uint32_t PackBf16(bf16 lo, bf16 hi) {
  __nv_bfloat162 v;
  v.x = lo;
  v.y = hi;
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d += a b (m16n8k16, bf16 in, fp32 accumulate).
__device__ inline void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline uint32_t Load32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Copies `rows` rows of DH bf16 into shared memory (stride DH + kRowPad),
// 16 bytes per thread and step; a null source row is written as zeros.
template <int DH, typename RowPtr>
__device__ inline void LoadTile(bf16* dst, int rows, RowPtr row_ptr) {
  constexpr int kChunks = DH / 8;
  for (int idx = threadIdx.x; idx < rows * kChunks; idx += kMmaThreads) {
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const bf16* src = row_ptr(r);
    const uint4 v = src != nullptr ? *reinterpret_cast<const uint4*>(src + c * 8) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(dst + r * (DH + kRowPad) + c * 8) = v;
  }
}

template <int DH>
__global__ void __launch_bounds__(kMmaThreads) WindowMmaPrefillKernel(WindowAttentionParams<bf16> p) {
  constexpr int kStride = DH + kRowPad;
  extern __shared__ uint4 smem_raw[];
  bf16* const qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* const ks = qs + kMmaQueries * kStride;
  bf16* const vs = ks + kMmaKeys * kStride;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int h = blockIdx.y;
  const int kvh = h / (p.heads / p.kv_heads);
  const int q_stride = p.heads * DH;
  const int kv_stride = p.kv_heads * DH;
  const int i0 = blockIdx.x * kMmaQueries;
  const int rows = min(kMmaQueries, p.n - i0);
  const int64_t pos0 = p.first_pos + i0;
  const int64_t key_lo = pos0 - p.window > 0 ? pos0 - p.window : 0;
  const int64_t key_hi = pos0 + rows - 1;
  const float scale = 1.f / sqrtf(static_cast<float>(DH));  // as WindowTileKernel
  const float slope = AlibiSlope(h, p.heads);

  LoadTile<DH>(qs, kMmaQueries, [&](int r) -> const bf16* {
    return r < rows ? p.q + static_cast<size_t>(i0 + r) * q_stride + h * DH : nullptr;
  });
  __syncthreads();

  // This thread's two query rows (g and g + 8 of the warp's 16).
  const int row0 = warp * 16 + g;
  const int row1 = row0 + 8;
  const bool warp_active = warp * 16 < rows;
  const int64_t warp_pos_lo = pos0 + warp * 16;
  const int64_t warp_pos_hi = pos0 + min(warp * 16 + 15, rows - 1);

  uint32_t qf[DH / 16][4];
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk) {
    const bf16* base = qs + row0 * kStride + kk * 16 + 2 * t;
    qf[kk][0] = Load32(base);
    qf[kk][1] = Load32(base + 8 * kStride);
    qf[kk][2] = Load32(base + 8);
    qf[kk][3] = Load32(base + 8 * kStride + 8);
  }

  float acc[DH / 8][4];
#pragma unroll
  for (int dn = 0; dn < DH / 8; ++dn) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};  // this thread's part of each row's sum; the quad adds at the end

  for (int64_t kt = key_lo; kt <= key_hi; kt += kMmaKeys) {
    __syncthreads();  // the previous tile is consumed
    auto key_row = [&](const bf16* fresh, const bf16* ring, int r) -> const bf16* {
      const int64_t j = kt + r;
      if (j > key_hi) return nullptr;
      if (j >= p.first_pos) return fresh + static_cast<size_t>(j - p.first_pos) * kv_stride + kvh * DH;
      return ring + static_cast<size_t>(j % p.ring_slots) * kv_stride + kvh * DH;
    };
    LoadTile<DH>(ks, kMmaKeys, [&](int r) { return key_row(p.k_new, p.k_ring, r); });
    LoadTile<DH>(vs, kMmaKeys, [&](int r) { return key_row(p.v_new, p.v_ring, r); });
    __syncthreads();
    // A tile no row of this warp sees (before its first row's window, or
    // after its last row) is skipped.
    if (!warp_active || kt > warp_pos_hi || kt + kMmaKeys - 1 < warp_pos_lo - p.window) continue;

    float s[kMmaKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kMmaKeys / 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < DH / 16; ++kk) {
        const bf16* kb = ks + (nt * 8 + g) * kStride + kk * 16 + 2 * t;
        MmaBf16(s[nt], qf[kk], Load32(kb), Load32(kb + 8));
      }
    }

    // Scale, ALiBi and the window/causal mask; then the rows' new maxima.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kMmaKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = e < 2 ? row0 : row1;
        const int64_t qpos = pos0 + row;
        const int64_t j = kt + nt * 8 + 2 * t + (e & 1);
        const bool seen = row < rows && j <= qpos && j >= qpos - p.window;
        s[nt][e] = seen ? s[nt][e] * scale - slope * static_cast<float>(qpos - j) : -INFINITY;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[nt][e]);
      }
    }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      // While a row has seen no key, m_new is -inf: exponents against 0 keep
      // every term 0 instead of NaN (-inf - -inf).
      const float base = m_new == -INFINITY ? 0.f : m_new;
      corr[r] = expf(m[r] - base);
      m[r] = m_new;
      l[r] *= corr[r];
#pragma unroll
      for (int nt = 0; nt < kMmaKeys / 8; ++nt) {
        s[nt][2 * r] = expf(s[nt][2 * r] - base);
        s[nt][2 * r + 1] = expf(s[nt][2 * r + 1] - base);
        l[r] += s[nt][2 * r] + s[nt][2 * r + 1];
      }
    }
#pragma unroll
    for (int dn = 0; dn < DH / 8; ++dn) {
      acc[dn][0] *= corr[0];
      acc[dn][1] *= corr[0];
      acc[dn][2] *= corr[1];
      acc[dn][3] *= corr[1];
    }

    // O += P V, 16 keys per k step.
#pragma unroll
    for (int kk = 0; kk < kMmaKeys / 16; ++kk) {
      const uint32_t pa[4] = {PackBf16(s[2 * kk][0], s[2 * kk][1]), PackBf16(s[2 * kk][2], s[2 * kk][3]),
                              PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const bf16* v0 = vs + (kk * 16 + 2 * t) * kStride + g;
#pragma unroll
      for (int dn = 0; dn < DH / 8; ++dn) {
        const bf16* v = v0 + dn * 8;
        const uint32_t b0 = PackBf16(v[0], v[kStride]);
        const uint32_t b1 = PackBf16(v[8 * kStride], v[9 * kStride]);
        MmaBf16(acc[dn], pa, b0, b1);
      }
    }
  }
  if (!warp_active) return;

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row0 : row1;
    if (row >= rows) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    bf16* out = p.out + static_cast<size_t>(i0 + row) * q_stride + h * DH + 2 * t;
#pragma unroll
    for (int dn = 0; dn < DH / 8; ++dn) {
      *reinterpret_cast<__nv_bfloat162*>(out + dn * 8) =
          __floats2bfloat162_rn(acc[dn][2 * r] * inv, acc[dn][2 * r + 1] * inv);
    }
  }
}

template <int DH>
cudaError_t Launch(const WindowAttentionParams<bf16>& p, cudaStream_t stream) {
  const size_t smem = sizeof(bf16) * static_cast<size_t>(kMmaQueries + 2 * kMmaKeys) * (DH + kRowPad);
  if (cudaError_t err = PrepareSmem(WindowMmaPrefillKernel<DH>, smem); err != cudaSuccess) return err;
  const dim3 grid((p.n + kMmaQueries - 1) / kMmaQueries, p.heads);
  WindowMmaPrefillKernel<DH><<<grid, kMmaThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchWindowMmaPrefill(const WindowAttentionParams<bf16>& p, cudaStream_t stream) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  int major = 0;
  if (cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
      err != cudaSuccess) {
    return err;
  }
  if (major < 8) return cudaErrorNotSupported;
  switch (p.head_dim) {
    case 16: return Launch<16>(p, stream);
    case 32: return Launch<32>(p, stream);
    case 48: return Launch<48>(p, stream);
    case 64: return Launch<64>(p, stream);
    case 80: return Launch<80>(p, stream);
    case 96: return Launch<96>(p, stream);
    case 112: return Launch<112>(p, stream);
    default: return Launch<128>(p, stream);
  }
}

}  // namespace drt::kernels::detail

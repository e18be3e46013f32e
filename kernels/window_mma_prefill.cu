// Tensor-core prefill of the causal sliding-window ALiBi attention
// (drt-model.md, Forward pass 3), FlashAttention-2 style, bf16 only.
//
// Why: on an H100, prefill of 4,096 tokens of the 128M config spent 47% of
// its kernel time in WindowTileKernel, which computes QK^T and PV on fp32
// CUDA cores (issue 10). Here both products run on bf16 mma.sync
// (m16n8k16, fp32 accumulation); the softmax stays fp32.
//
// NOT YET RUN ON A GPU (docs/cuda.md, "Tensor-core prefill"): it is
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
// Fragment layouts and the shared building blocks: kernels/mma_bf16.cuh.
#include "kernels/window_mma_prefill.cuh"

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/mma_bf16.cuh"

namespace drt::kernels::detail {
namespace {

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaQueries = kMmaWarps * 16;
constexpr int kMmaKeys = 64;

template <int DH>
__global__ void __launch_bounds__(kMmaThreads) WindowMmaPrefillKernel(WindowAttentionParams<bf16> p) {
  constexpr int kStride = DH + kMmaRowPad;
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

  LoadMmaTile<DH, kMmaThreads>(qs, kMmaQueries, [&](int r) -> const bf16* {
    return r < rows ? p.q + static_cast<size_t>(i0 + r) * q_stride + h * DH : nullptr;
  });
  __syncthreads();

  // This thread's two query rows (g and g + 8 of the warp's 16).
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const bool warp_active = warp * 16 < rows;
  const int64_t warp_pos_lo = pos0 + warp * 16;
  const int64_t warp_pos_hi = pos0 + min(warp * 16 + 15, rows - 1);

  uint32_t qf[DH / 16][4];
  LoadQueryFragments<DH>(qs, row[0], t, qf);

  float acc[DH / 8][4];
#pragma unroll
  for (int dn = 0; dn < DH / 8; ++dn) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};  // this thread's part of each row's sum; the quad adds at the end

  for (int64_t kt = key_lo; kt <= key_hi; kt += kMmaKeys) {
    __syncthreads();  // the previous tile is consumed
    auto key_row = [&](const bf16* fresh, const bf16* ring, int r) -> const bf16* {
      const int64_t j = kt + r;
      return j > key_hi ? nullptr : KvRow(fresh, ring, j, p.first_pos, p.ring_slots, kv_stride, kvh, DH);
    };
    LoadMmaTile<DH, kMmaThreads>(ks, kMmaKeys, [&](int r) { return key_row(p.k_new, p.k_ring, r); });
    LoadMmaTile<DH, kMmaThreads>(vs, kMmaKeys, [&](int r) { return key_row(p.v_new, p.v_ring, r); });
    __syncthreads();
    // A tile no row of this warp sees (before its first row's window, or
    // after its last row) is skipped.
    if (!warp_active || kt > warp_pos_hi || kt + kMmaKeys - 1 < warp_pos_lo - p.window) continue;

    float s[kMmaKeys / 8][4];
    ScoreTile<DH>(qf, ks, g, t, s);

    // Scale, ALiBi and the window/causal mask; then the rows' new maxima.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kMmaKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t qpos = pos0 + row[r];
        const int64_t j = kt + nt * 8 + 2 * t + (e & 1);
        const bool seen = row[r] < rows && j <= qpos && j >= qpos - p.window;
        s[nt][e] = seen ? s[nt][e] * scale - slope * static_cast<float>(qpos - j) : -INFINITY;
        tile_max[r] = fmaxf(tile_max[r], s[nt][e]);
      }
    }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], QuadMax(tile_max[r]));
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
    AccumulatePV<DH>(s, vs, g, t, acc);
  }
  if (!warp_active) return;

  float inv[2];
  bf16* out_row[2];
  bool valid[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = QuadSum(l[r]);
    inv[r] = sum > 0.f ? 1.f / sum : 0.f;
    valid[r] = row[r] < rows;
    out_row[r] = p.out + static_cast<size_t>(i0 + row[r]) * q_stride + h * DH;
  }
  StoreAccumulators<DH>(acc, inv, out_row, valid, t);
}

template <int DH>
cudaError_t Launch(const WindowAttentionParams<bf16>& p, cudaStream_t stream) {
  const size_t smem = sizeof(bf16) * static_cast<size_t>(kMmaQueries + 2 * kMmaKeys) * (DH + kMmaRowPad);
  if (cudaError_t err = PrepareSmem(WindowMmaPrefillKernel<DH>, smem); err != cudaSuccess) return err;
  const dim3 grid((p.n + kMmaQueries - 1) / kMmaQueries, p.heads);
  WindowMmaPrefillKernel<DH><<<grid, kMmaThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchWindowMmaPrefill(const WindowAttentionParams<bf16>& p, cudaStream_t stream) {
  return DispatchMmaHeadDim(p.head_dim, [&](auto dh) { return Launch<decltype(dh)::value>(p, stream); });
}

}  // namespace drt::kernels::detail

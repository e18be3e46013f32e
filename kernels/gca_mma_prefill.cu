// Tensor-core prefill of GCA (drt-model.md, Forward pass 7), bf16 only:
// out = sum_i w_i softmax_j(q.K_i[j]/sqrt(dh)) V_i[j] over the 64 stored
// rows of each retrieved chunk i (row 63 zero: the softmax's off-by-one).
//
// Why: on an H100, prefill of 4,096 tokens of the 128M config spent 19% of
// its kernel time in GcaTileKernel (fp32 CUDA cores; issue 10). Here Q K_i^T
// and P V_i run on bf16 mma.sync (m16n8k16, fp32 accumulation).
//
// NOT YET RUN ON A GPU (docs/cuda.md, "Tensor-core prefill"): selected
// only by GcaParams::prefill_tensor_cores, off by default.
//
// Layout. A block serves one query chunk (its <= 64 positions of this step)
// of one head with 4 warps of 16 rows. For every retrieved chunk the 64 K/V
// rows of the head come into shared memory once; a warp scores them (8 n8
// fragments), takes the softmax over the 64 in registers (one tile: no
// running max needed), folds the chunk's weight and the softmax's 1/sum into
// the probabilities, and adds w_i P V_i straight into its accumulators, the
// probabilities rounded to bf16 as the A operand (kernels/mma_bf16.cuh).
#include "kernels/gca_mma_prefill.cuh"

#include <cuda_bf16.h>

#include <cstdint>

namespace drt::kernels::detail {
namespace {

constexpr int kChunkRows = 64;  // stored rows per chunk (drt-model.md, Forward pass 7)
constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;

template <int DH>
__global__ void __launch_bounds__(kMmaThreads) GcaMmaPrefillKernel(GcaParams<bf16> p) {
  constexpr int kStride = DH + kMmaRowPad;
  extern __shared__ uint4 smem_raw[];
  bf16* const qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* const ks = qs + kChunkRows * kStride;
  bf16* const vs = ks + kChunkRows * kStride;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int h = blockIdx.y;
  const size_t stride = static_cast<size_t>(p.heads) * DH;
  // The positions of this step in query chunk `chunk`, as GcaTileKernel.
  const int64_t chunk = p.first_pos / kChunkRows + blockIdx.x;
  const int64_t row_begin64 = chunk * kChunkRows > p.first_pos ? chunk * kChunkRows : p.first_pos;
  const int64_t row_end64 = (chunk + 1) * kChunkRows < p.first_pos + p.n ? (chunk + 1) * kChunkRows
                                                                        : p.first_pos + p.n;
  const int row_begin = static_cast<int>(row_begin64 - p.first_pos);
  const int rows = static_cast<int>(row_end64 - row_begin64);
  const int64_t qc = chunk - p.first_query_chunk;
  const float scale = 1.f / sqrtf(static_cast<float>(DH));

  LoadMmaTile<DH, kMmaThreads>(qs, kChunkRows, [&](int r) -> const bf16* {
    return r < rows ? p.q + static_cast<size_t>(row_begin + r) * stride + h * DH : nullptr;
  });
  __syncthreads();

  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const bool warp_active = warp * 16 < rows;
  uint32_t qf[DH / 16][4];
  LoadQueryFragments<DH>(qs, row[0], t, qf);

  float total[DH / 8][4];
#pragma unroll
  for (int dn = 0; dn < DH / 8; ++dn) total[dn][0] = total[dn][1] = total[dn][2] = total[dn][3] = 0.f;

  for (int i = 0; i < p.topk; ++i) {
    const int32_t slot = p.slots[qc * p.topk + i];
    if (slot < 0) continue;  // the same for the whole block
    const float w = p.weights[qc * p.topk + i];
    const bf16* k_base = p.chunk_k + static_cast<size_t>(slot) * kChunkRows * stride + h * DH;
    const bf16* v_base = p.chunk_v + static_cast<size_t>(slot) * kChunkRows * stride + h * DH;
    __syncthreads();  // the previous chunk's K/V are consumed
    LoadMmaTile<DH, kMmaThreads>(ks, kChunkRows, [&](int r) { return k_base + r * stride; });
    LoadMmaTile<DH, kMmaThreads>(vs, kChunkRows, [&](int r) { return v_base + r * stride; });
    __syncthreads();
    if (!warp_active) continue;

    float s[8][4];
    ScoreTile<DH>(qf, ks, g, t, s);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        s[nt][2 * r] *= scale;
        s[nt][2 * r + 1] *= scale;
        mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      }
      mx = QuadMax(mx);
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        s[nt][2 * r] = expf(s[nt][2 * r] - mx);
        s[nt][2 * r + 1] = expf(s[nt][2 * r + 1] - mx);
        sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      // sum >= 1 (the maximum's own term), so the division is safe.
      const float f = w / QuadSum(sum);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        s[nt][2 * r] *= f;
        s[nt][2 * r + 1] *= f;
      }
    }
    AccumulatePV<DH>(s, vs, g, t, total);
  }
  if (!warp_active) return;
  const float one[2] = {1.f, 1.f};
  bf16* const out_row[2] = {p.out + static_cast<size_t>(row_begin + row[0]) * stride + h * DH,
                            p.out + static_cast<size_t>(row_begin + row[1]) * stride + h * DH};
  const bool valid[2] = {row[0] < rows, row[1] < rows};
  StoreAccumulators<DH>(total, one, out_row, valid, t);
}

template <int DH>
cudaError_t Launch(const GcaParams<bf16>& p, cudaStream_t stream) {
  const size_t smem = sizeof(bf16) * static_cast<size_t>(3 * kChunkRows) * (DH + kMmaRowPad);
  if (cudaError_t err = PrepareSmem(GcaMmaPrefillKernel<DH>, smem); err != cudaSuccess) return err;
  const int64_t query_chunks = (p.first_pos + p.n - 1) / kChunkRows - p.first_pos / kChunkRows + 1;
  const dim3 grid(static_cast<unsigned>(query_chunks), p.heads);
  GcaMmaPrefillKernel<DH><<<grid, kMmaThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGcaMmaPrefill(const GcaParams<bf16>& p, cudaStream_t stream) {
  return DispatchMmaHeadDim(p.head_dim, [&](auto dh) { return Launch<decltype(dh)::value>(p, stream); });
}

}  // namespace drt::kernels::detail

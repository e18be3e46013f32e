// Internal to kernels/: bf16 tensor-core building blocks of the prefill
// kernels (window_mma_prefill.cu, gca_mma_prefill.cu). Not part of the API.
//
// mma.sync.m16n8k16 with bf16 inputs and fp32 accumulation (compute
// capability 8.0+). Fragment layouts (PTX ISA, "mma.m16n8k16" for .bf16),
// g = lane / 4, t = lane % 4: A a0 = (row g, cols 2t..2t+1), a1 = (g+8,
// 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..); B b0 = (k 2t..2t+1, n g),
// b1 = (k 2t+8.., n g); C c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1).
// The lower k (or column) of each pair sits in the low 16 bits. So the C
// fragments of two adjacent n8 tiles are exactly the A fragment of one k16
// step: softmax probabilities feed the P V product without a shuffle.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "kernels/attention_common.cuh"

namespace drt::kernels::detail {

// Head sizes the prefill kernels have: mma.sync's k step is 16 elements.
inline bool MmaPrefillHeadDim(int dh) { return dh % 16 == 0 && dh > 0 && dh <= kMaxHeadDim; }

// Runs launch(std::integral_constant<int, DH>{}) for head_dim dh, one of
// the sizes MmaPrefillHeadDim accepts (the kernels are instantiated per
// size, so that fragment arrays live in registers); cudaErrorNotSupported
// below compute capability 8.0 (no bf16 mma.sync) and cudaErrorInvalidValue
// for any other dh, launching nothing.
template <typename Launch>
cudaError_t DispatchMmaHeadDim(int dh, Launch&& launch) {
  int major = 0;
  if (cudaError_t err = CurrentDeviceMajor(major); err != cudaSuccess) return err;
  if (major < 8) return cudaErrorNotSupported;
  switch (dh) {
    case 16: return launch(std::integral_constant<int, 16>{});
    case 32: return launch(std::integral_constant<int, 32>{});
    case 48: return launch(std::integral_constant<int, 48>{});
    case 64: return launch(std::integral_constant<int, 64>{});
    case 80: return launch(std::integral_constant<int, 80>{});
    case 96: return launch(std::integral_constant<int, 96>{});
    case 112: return launch(std::integral_constant<int, 112>{});
    case 128: return launch(std::integral_constant<int, 128>{});
    // MmaPrefillHeadDim admits only the sizes above; anything else would
    // read past a row of the kernels' shared tiles.
    default: return cudaErrorInvalidValue;
  }
}

// Shared-memory rows of the prefill kernels are head_dim + 8 bf16 long: 16
// extra bytes shift each row by 4 banks, so the 8 rows one fragment load
// touches hit distinct banks.
constexpr int kMmaRowPad = 8;

__device__ inline uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ inline uint32_t PackBf16(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  __nv_bfloat162 v;
  v.x = lo;
  v.y = hi;
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d += a b (m16n8k16, bf16 in, fp32 accumulate). A build for an older
// architecture compiles a trap instead (CheckMmaDevice refuses such devices
// before any launch).
__device__ inline void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)d, (void)a, (void)b0, (void)b1;
  __trap();
#endif
}

// Two adjacent bf16 (4-byte aligned).
__device__ inline uint32_t Load32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Copies `rows` rows of DH bf16 into shared memory (stride DH + kMmaRowPad)
// with `threads` threads, 16 bytes per thread and step; a null source row is
// written as zeros. Sources 16-byte aligned.
template <int DH, int kThreads, typename RowPtr>
__device__ inline void LoadMmaTile(__nv_bfloat16* dst, int rows, RowPtr row_ptr) {
  constexpr int kChunks = DH / 8;
  for (int idx = threadIdx.x; idx < rows * kChunks; idx += kThreads) {
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const __nv_bfloat16* src = row_ptr(r);
    const uint4 v = src != nullptr ? *reinterpret_cast<const uint4*>(src + c * 8) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(dst + r * (DH + kMmaRowPad) + c * 8) = v;
  }
}

// The A fragments of a warp's 16 query rows, [DH/16][4], from a shared tile
// of stride DH + kMmaRowPad whose row `row0` is the warp's row g.
template <int DH>
__device__ inline void LoadQueryFragments(const __nv_bfloat16* tile, int row0, int t, uint32_t (&qf)[DH / 16][4]) {
  constexpr int kStride = DH + kMmaRowPad;
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk) {
    const __nv_bfloat16* base = tile + row0 * kStride + kk * 16 + 2 * t;
    qf[kk][0] = Load32(base);
    qf[kk][1] = Load32(base + 8 * kStride);
    qf[kk][2] = Load32(base + 8);
    qf[kk][3] = Load32(base + 8 * kStride + 8);
  }
}

// S[nt] = Q K^T for the 64 keys of a shared tile (8 n8 tiles), S zeroed first.
template <int DH>
__device__ inline void ScoreTile(const uint32_t (&qf)[DH / 16][4], const __nv_bfloat16* keys, int g, int t,
                                 float (&s)[8][4]) {
  constexpr int kStride = DH + kMmaRowPad;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DH / 16; ++kk) {
      const __nv_bfloat16* kb = keys + (nt * 8 + g) * kStride + kk * 16 + 2 * t;
      MmaBf16(s[nt], qf[kk], Load32(kb), Load32(kb + 8));
    }
  }
}

// acc += P V for the 64 keys of a shared tile of values; P is s (the
// probabilities in C layout), rounded to bf16.
template <int DH>
__device__ inline void AccumulatePV(const float (&s)[8][4], const __nv_bfloat16* values, int g, int t,
                                    float (&acc)[DH / 8][4]) {
  constexpr int kStride = DH + kMmaRowPad;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t pa[4] = {PackBf16(s[2 * kk][0], s[2 * kk][1]), PackBf16(s[2 * kk][2], s[2 * kk][3]),
                            PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                            PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
    const __nv_bfloat16* v0 = values + (kk * 16 + 2 * t) * kStride + g;
#pragma unroll
    for (int dn = 0; dn < DH / 8; ++dn) {
      const __nv_bfloat16* v = v0 + dn * 8;
      MmaBf16(acc[dn], pa, PackBf16(v[0], v[kStride]), PackBf16(v[8 * kStride], v[9 * kStride]));
    }
  }
}

// Sum over the 4 lanes of a quad (the lanes holding one fragment row).
__device__ inline float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

__device__ inline float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Writes a warp's output rows from C-layout accumulators: row g (r = 0) and
// g + 8 (r = 1) scaled by scale[r], each only if valid[r]; `out_row[r]`
// points at the row's head slice.
template <int DH>
__device__ inline void StoreAccumulators(const float (&acc)[DH / 8][4], const float (&scale)[2],
                                         __nv_bfloat16* const (&out_row)[2], const bool (&valid)[2], int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
#pragma unroll
    for (int dn = 0; dn < DH / 8; ++dn) {
      *reinterpret_cast<__nv_bfloat162*>(out_row[r] + dn * 8 + 2 * t) =
          __floats2bfloat162_rn(acc[dn][2 * r] * scale[r], acc[dn][2 * r + 1] * scale[r]);
    }
  }
}

}  // namespace drt::kernels::detail

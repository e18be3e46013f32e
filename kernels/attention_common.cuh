// Internal to kernels/: the shared-memory attention tile used by the window,
// encoder and GCA kernels, and small warp helpers. Not part of the API.
//
// A tile block has 8 warps (256 threads) and serves up to 64 query rows of one
// head; warp w owns rows 8w..8w+7. Keys come through shared memory in tiles of
// 64 rows, processed as two subtiles of 32 keys in which lane l owns key l for
// the scores and dims l, l+32, ... of the output accumulator. Scores and
// softmax are fp32 with an online (running max) softmax per row.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace drt::kernels::detail {

using bf16 = __nv_bfloat16;

constexpr int kMaxHeadDim = 128;
constexpr int kTileQueries = 64;
constexpr int kTileWarps = 8;
constexpr int kTileThreads = kTileWarps * 32;
constexpr int kRowsPerWarp = kTileQueries / kTileWarps;  // 8
constexpr int kTileKeys = 64;                            // 2 subtiles of 32 keys
constexpr int kRowThreads = 256;                         // one-query-per-block kernels
constexpr int kRowWarps = kRowThreads / 32;

inline bool ValidHeadDim(int dh) { return dh > 0 && dh <= kMaxHeadDim && dh % 8 == 0; }
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Shared memory of a tile block, in floats: Q [64][dh], K [64][dh+1] (odd
// stride: lanes reading different key rows hit different banks), V [64][dh],
// per-warp probabilities [8][8][32], then `extra` floats.
inline size_t TileSmemBytes(int dh, int extra) {
  return sizeof(float) * (static_cast<size_t>(kTileQueries) * dh +
                          static_cast<size_t>(kTileKeys) * (dh + 1) +
                          static_cast<size_t>(kTileKeys) * dh + kTileWarps * kRowsPerWarp * 32 +
                          extra);
}

struct TileSmem {
  float* q;
  float* k;
  float* v;
  float* p;  // this warp's [8][32]
  float* extra;
};

__device__ inline TileSmem CarveTileSmem(float* base, int dh) {
  TileSmem s;
  s.q = base;
  s.k = s.q + kTileQueries * dh;
  s.v = s.k + kTileKeys * (dh + 1);
  // 64 * (3 dh + 1) floats precede: a multiple of 4, so float4 reads of p are aligned.
  float* p_all = s.v + kTileKeys * dh;
  s.p = p_all + (threadIdx.x >> 5) * kRowsPerWarp * 32;
  s.extra = p_all + kTileWarps * kRowsPerWarp * 32;
  return s;
}

__device__ inline float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ inline float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// 8 elements at a 16-byte aligned address, as fp32. T is the storage type
// (bf16 or float; kernels/elementwise.h).
__device__ inline void Load8(const bf16* src, float out[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = __bfloat1622float2(h2[e]);
    out[2 * e] = f.x;
    out[2 * e + 1] = f.y;
  }
}

__device__ inline void Load8(const float* src, float out[8]) {
  const float4 a = *reinterpret_cast<const float4*>(src);
  const float4 b = *reinterpret_cast<const float4*>(src + 4);
  out[0] = a.x;
  out[1] = a.y;
  out[2] = a.z;
  out[3] = a.w;
  out[4] = b.x;
  out[5] = b.y;
  out[6] = b.z;
  out[7] = b.w;
}

// 2 elements at an address aligned to their size, as fp32.
__device__ inline float2 Load2(const bf16* src) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(src));
}
__device__ inline float2 Load2(const float* src) { return *reinterpret_cast<const float2*>(src); }

__device__ inline float ToFloat(bf16 v) { return __bfloat162float(v); }
__device__ inline float ToFloat(float v) { return v; }

template <typename T>
__device__ inline T FromFloat(float v);
template <>
__device__ inline bf16 FromFloat<bf16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ inline float FromFloat<float>(float v) {
  return v;
}

// Block-cooperative copy of `rows` rows of dh elements into dst[r * stride + :]
// as fp32 times `scale`. row_ptr(r) gives the row's 16-byte aligned source
// (const T*), or nullptr for a row of zeros. dh is a multiple of 8.
template <typename T, class RowPtr>
__device__ void LoadRows(float* dst, int stride, int rows, int dh, float scale, RowPtr row_ptr) {
  const int vecs = dh / 8;
  for (int i = threadIdx.x; i < rows * vecs; i += blockDim.x) {
    const int r = i / vecs;
    const int c = (i - r * vecs) * 8;
    float* o = dst + r * stride + c;
    const T* src = row_ptr(r);
    if (src == nullptr) {
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = 0.f;
      continue;
    }
    float f[8];
    Load8(src + c, f);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = f[e] * scale;
  }
}

// Running softmax state of one warp's 8 rows. T = ceil(dh / 32): the output
// dims a lane owns are lane + 32 t.
template <int T>
struct RowState {
  float m[kRowsPerWarp];
  float l[kRowsPerWarp];
  float acc[kRowsPerWarp][T];

  __device__ void Reset() {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.f;
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
    }
  }
};

// One warp: its 8 query rows (qs, stride dh, already scaled by 1/sqrt(dh))
// against 32 keys (ks, stride dh+1) and values (vs, stride dh) in shared
// memory. bias(r, key, s) returns the final score of row r and key `key` (0..31)
// from the dot product s, or -INFINITY to mask the pair. ps: the warp's [8][32]
// scratch. Updates st with the online softmax and P V.
template <int T, class Bias>
__device__ void AttendSubtile(const float* qs, const float* ks, const float* vs, float* ps, int dh,
                              RowState<T>& st, Bias bias) {
  const int lane = threadIdx.x & 31;
  float s[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) s[r] = 0.f;
  const float* krow = ks + lane * (dh + 1);
  for (int d = 0; d < dh; d += 4) {
    const float k0 = krow[d], k1 = krow[d + 1], k2 = krow[d + 2], k3 = krow[d + 3];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float4 q = *reinterpret_cast<const float4*>(qs + r * dh + d);
      s[r] = fmaf(q.x, k0, s[r]);
      s[r] = fmaf(q.y, k1, s[r]);
      s[r] = fmaf(q.z, k2, s[r]);
      s[r] = fmaf(q.w, k3, s[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float x = bias(r, lane, s[r]);
    const float m_new = fmaxf(st.m[r], WarpMax(x));
    float p = 0.f;
    float alpha = 1.f;
    if (m_new != -INFINITY) {
      p = expf(x - m_new);             // 0 for a masked key
      alpha = expf(st.m[r] - m_new);   // 0 while the row had no key yet
    }
    st.l[r] = st.l[r] * alpha + WarpSum(p);
    st.m[r] = m_new;
#pragma unroll
    for (int t = 0; t < T; ++t) st.acc[r][t] *= alpha;
    ps[r * 32 + lane] = p;
  }
  __syncwarp();
  for (int k = 0; k < 32; k += 4) {
    float4 p4[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) p4[r] = *reinterpret_cast<const float4*>(ps + r * 32 + k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const float* vrow = vs + (k + kk) * dh;
      float v[T];
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const int d = lane + 32 * t;
        v[t] = d < dh ? vrow[d] : 0.f;
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float pr = kk == 0 ? p4[r].x : kk == 1 ? p4[r].y : kk == 2 ? p4[r].z : p4[r].w;
#pragma unroll
        for (int t = 0; t < T; ++t) st.acc[r][t] = fmaf(pr, v[t], st.acc[r][t]);
      }
    }
  }
  __syncwarp();  // ps is rewritten by the next call
}

// Writes row r of the warp (dims lane + 32 t) in the storage type E: acc * factor.
template <int T, typename E>
__device__ inline void StoreRow(E* dst, int dh, const float (&acc)[T], float factor) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const int d = lane + 32 * t;
    if (d < dh) dst[d] = FromFloat<E>(acc[t] * factor);
  }
}

// q . k for a query in shared memory (fp32, dh floats) and a key row of dh
// elements (bf16 or float) in global memory (16-byte aligned).
template <typename E>
__device__ inline float DotSharedGlobal(const float* qs, const E* krow, int dh) {
  float s = 0.f;
  for (int c = 0; c < dh; c += 8) {
    float k[8];
    Load8(krow + c, k);
#pragma unroll
    for (int e = 0; e < 8; ++e) s = fmaf(qs[c + e], k[e], s);
  }
  return s;
}

// Raises the kernel's dynamic shared memory limit when it needs more than the
// default 48 KiB.
template <class Kernel>
cudaError_t PrepareSmem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

// Window attention: row j's key (or value) of kv head kvh; new positions
// (j >= first_pos) from `fresh`, older ones from the ring slot j % ring_slots.
template <typename E>
__device__ inline const E* KvRow(const E* fresh, const E* ring, int64_t j, int64_t first_pos,
                                    int ring_slots, int kv_stride, int kvh, int dh) {
  if (j >= first_pos) return fresh + static_cast<size_t>(j - first_pos) * kv_stride + kvh * dh;
  return ring + static_cast<size_t>(j % ring_slots) * kv_stride + kvh * dh;
}

// The current device's compute capability major version.
inline cudaError_t CurrentDeviceMajor(int& major) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
}

// ALiBi slope of head h of `heads` (drt-model.md, Forward pass 3), computed in
// double and rounded as engine/cpu AlibiSlope does.
__device__ inline float AlibiSlope(int h, int heads) {
  const double base = pow(2.0, 8.0 / static_cast<double>(heads));
  return static_cast<float>(1.0 / pow(base, static_cast<double>(h + 1)));
}

}  // namespace drt::kernels::detail

// The split decode kernel of the sliding-window attention (flash-decoding):
// the window of each (query, head) is cut into S consecutive key ranges, one
// block each; the S blocks form a thread block cluster (S > 1, compute
// capability 9.0+) and block rank 0 merges their partial softmax states
// (m, l, acc) through distributed shared memory. No global workspace: the
// partials live in each block's shared memory for the length of the launch.
//
// Inside a block, a group of LPK lanes reads one key row (lane c of the group
// reads elements 8c..8c+7: one 16-byte load for bf16, two for float), so each
// warp load instruction reads 32 / LPK whole rows; every lane first issues the
// loads of kKeysInFlight keys and their values, then computes (the values do
// not wait for the scores). Each group keeps its own running softmax; the
// groups, warps and blocks are merged at the end, skipping any part that saw
// no key (m = -inf), as WindowRowKernel's merge does.
//
// Prediction (not yet run on a GPU; docs/cuda.md): the 128M decode case, n = 1,
// 12 heads = 12 kv heads, head_dim 64, window 512 (513 keys), bf16: K and V
// are 513 x 128 B x 2 = 131 KB per head, 1.58 MB per layer (0.5 us at H100
// HBM bandwidth). WindowRowKernel takes 44 us there: 12 blocks, each lane
// walking a key row's 8 loads and then 32 value rows one after another. With
// S = 8: 96 blocks (of 132 SMs), 65 keys (16.6 KB) each; a block iteration
// covers 8 warps x 4 rows x kKeysInFlight 4 = 128 keys, so every K and V load
// of a block is in flight at once (one DRAM round trip, ~1 us), followed by
// ~100 FMAs and expfs per lane, 3 shuffle rounds, 2 __syncthreads and 2
// cluster barriers. Predicted ~3 us per launch in cudaEvent timing (launch
// overhead included), ~35 us per token for 12 layers instead of 534 us. S = 1
// (12 blocks, 5 iterations of one round trip each): ~6 us.
#include <cooperative_groups.h>

#include "kernels/attention_common.cuh"
#include "kernels/cluster_code.h"
#include "kernels/window_split_decode.cuh"

namespace drt::kernels::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kSplitWarps = 8;
constexpr int kSplitThreads = kSplitWarps * 32;
// Key rows each lane group loads before it computes (per block iteration).
constexpr int kKeysInFlight = 4;

// 8 consecutive elements of a row in their storage type, loaded but not yet
// converted, so that all loads of an iteration are issued before any use.
template <typename E>
struct Raw8;
template <>
struct Raw8<bf16> {
  uint4 a;
};
template <>
struct Raw8<float> {
  float4 a, b;
};

// src is 16-byte aligned; nullptr gives zeros (and loads nothing).
__device__ inline Raw8<bf16> LoadRaw8(const bf16* src) {
  Raw8<bf16> r;
  r.a = src != nullptr ? *reinterpret_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
  return r;
}
__device__ inline Raw8<float> LoadRaw8(const float* src) {
  Raw8<float> r;
  r.a = src != nullptr ? *reinterpret_cast<const float4*>(src) : make_float4(0.f, 0.f, 0.f, 0.f);
  r.b = src != nullptr ? *reinterpret_cast<const float4*>(src + 4) : make_float4(0.f, 0.f, 0.f, 0.f);
  return r;
}

__device__ inline void Unpack(const Raw8<bf16>& r, float out[8]) {
  const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&r.a);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = __bfloat1622float2(h2[e]);
    out[2 * e] = f.x;
    out[2 * e + 1] = f.y;
  }
}
__device__ inline void Unpack(const Raw8<float>& r, float out[8]) {
  out[0] = r.a.x;
  out[1] = r.a.y;
  out[2] = r.a.z;
  out[3] = r.a.w;
  out[4] = r.b.x;
  out[5] = r.b.y;
  out[6] = r.b.z;
  out[7] = r.b.w;
}

// Merges the softmax state (m_o, l_o, acc_o) into (m, l, acc); a state with
// m = -inf saw no key and contributes nothing (its l and acc are 0).
__device__ inline void MergeState(float& m, float& l, float acc[8], float m_o, float l_o,
                                  const float acc_o[8]) {
  const float mx = fmaxf(m, m_o);
  if (mx == -INFINITY) return;  // neither saw a key (exp(-inf - -inf) would be NaN)
  const float f = expf(m - mx);     // 0 when m = -inf
  const float f_o = expf(m_o - mx);  // 0 when m_o = -inf
  l = l * f + l_o * f_o;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = acc[e] * f + acc_o[e] * f_o;
  m = mx;
}

// Grid (n * S, heads): block x = i * S + split; the S blocks of query i are one
// cluster (S > 1). LPK: lanes per key row, a power of 2 with 8 LPK >= head_dim.
template <int LPK, int S, typename E>
__global__ void __launch_bounds__(kSplitThreads) WindowSplitDecodeKernel(WindowAttentionParams<E> p) {
  constexpr int kRowsPerLoad = 32 / LPK;  // key rows one warp load instruction reads
  constexpr int kBlockStep = kSplitWarps * kRowsPerLoad * kKeysInFlight;
  __shared__ float warp_m[kSplitWarps];
  __shared__ float warp_l[kSplitWarps];
  __shared__ float warp_acc[kSplitWarps][kMaxHeadDim];
  // This block's merged state, read by cluster rank 0 (S > 1).
  __shared__ float part_m;
  __shared__ float part_l;
  __shared__ float part_acc[kMaxHeadDim];

  const int dh = p.head_dim;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int group = lane / LPK;  // which of the warp's kRowsPerLoad rows this lane reads
  const int c = lane % LPK;      // its dims 8c .. 8c+7
  const bool dims_active = 8 * c < dh;
  const int i = blockIdx.x / S;
  const int split = blockIdx.x % S;
  const int h = blockIdx.y;
  const int kvh = h / (p.heads / p.kv_heads);
  const int q_stride = p.heads * dh;
  const int kv_stride = p.kv_heads * dh;
  const int64_t first_pos = p.device_first_pos != nullptr ? *p.device_first_pos : p.first_pos;
  const int64_t pos = first_pos + i;
  const int64_t lo = pos - p.window > 0 ? pos - p.window : 0;
  // Keys [lo, pos] (at least key pos) in S ranges of `chunk`; the last ranges
  // are short or empty (b_lo > b_hi) when the window is short.
  const int64_t chunk = (pos - lo + S) / S;  // ceil((pos - lo + 1) / S)
  const int64_t b_lo = lo + split * chunk;
  const int64_t b_hi = b_lo + chunk - 1 < pos ? b_lo + chunk - 1 : pos;
  const float scale = 1.f / sqrtf(static_cast<float>(dh));
  const float slope = AlibiSlope(h, p.heads);

  float q[8];
  if (dims_active) {
    Load8(p.q + static_cast<size_t>(i) * q_stride + h * dh + 8 * c, q);
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) q[e] = dims_active ? q[e] * scale : 0.f;

  // Key j < first_pos is in ring slot j % ring_slots = (base_slot + j - b_lo)
  // mod ring_slots, where j - b_lo <= window < ring_slots: one subtraction
  // instead of a 64-bit modulo per key.
  const int base_slot = static_cast<int>(b_lo % p.ring_slots);
  const int col = kvh * dh + 8 * c;  // this lane's first element in a K or V row

  float m = -INFINITY;
  float l = 0.f;
  float acc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.f;

  // Every lane of the block runs the same iterations (the bounds depend on
  // the block only), so the full-warp shuffles below are never divergent.
  for (int64_t base = b_lo; base <= b_hi; base += kBlockStep) {
    Raw8<E> kr[kKeysInFlight];
    Raw8<E> vr[kKeysInFlight];
    int64_t js[kKeysInFlight];
#pragma unroll
    for (int u = 0; u < kKeysInFlight; ++u) {
      const int64_t j = base + (u * kSplitWarps + warp) * kRowsPerLoad + group;
      js[u] = j;
      const E* krow = nullptr;
      const E* vrow = nullptr;
      if (j <= b_hi && dims_active) {
        if (j >= first_pos) {
          const size_t off = static_cast<size_t>(j - first_pos) * kv_stride + col;
          krow = p.k_new + off;
          vrow = p.v_new + off;
        } else {
          int slot = base_slot + static_cast<int>(j - b_lo);
          if (slot >= p.ring_slots) slot -= p.ring_slots;
          const size_t off = static_cast<size_t>(slot) * kv_stride + col;
          krow = p.k_ring + off;
          vrow = p.v_ring + off;
        }
      }
      kr[u] = LoadRaw8(krow);
      vr[u] = LoadRaw8(vrow);
    }
    float s[kKeysInFlight];
#pragma unroll
    for (int u = 0; u < kKeysInFlight; ++u) {
      float k[8];
      Unpack(kr[u], k);
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(q[e], k[e], dot);
      // Sum over the LPK lanes of the group (aligned, so xor stays inside it).
#pragma unroll
      for (int o = LPK / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      s[u] = js[u] <= b_hi ? dot - slope * static_cast<float>(pos - js[u]) : -INFINITY;
    }
    // Online softmax of the group (every lane of a group holds the same m, l).
    float mx = m;
#pragma unroll
    for (int u = 0; u < kKeysInFlight; ++u) mx = fmaxf(mx, s[u]);
    if (mx != -INFINITY) {
      const float alpha = expf(m - mx);  // 0 while the group had no key
      l *= alpha;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] *= alpha;
#pragma unroll
      for (int u = 0; u < kKeysInFlight; ++u) {
        const float pu = expf(s[u] - mx);  // 0 for a key outside the range
        l += pu;
        float v[8];
        Unpack(vr[u], v);  // zeros for a key outside the range
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = fmaf(pu, v[e], acc[e]);
      }
      m = mx;
    }
  }

  // Merge the warp's groups: a butterfly over the lanes with the same c, so
  // every lane ends with the warp's state for its dims.
#pragma unroll
  for (int o = LPK; o < 32; o <<= 1) {
    const float m_o = __shfl_xor_sync(0xffffffffu, m, o);
    const float l_o = __shfl_xor_sync(0xffffffffu, l, o);
    float acc_o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc_o[e] = __shfl_xor_sync(0xffffffffu, acc[e], o);
    MergeState(m, l, acc, m_o, l_o, acc_o);
  }
  if (lane < LPK && dims_active) {
#pragma unroll
    for (int e = 0; e < 8; ++e) warp_acc[warp][8 * c + e] = acc[e];
  }
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
  __syncthreads();

  // Merge the warps: thread d < dh owns output dim d.
  float m_blk = -INFINITY;
  for (int w = 0; w < kSplitWarps; ++w) m_blk = fmaxf(m_blk, warp_m[w]);
  for (int d = threadIdx.x; d < dh; d += blockDim.x) {
    float l_blk = 0.f;
    float o = 0.f;
    for (int w = 0; w < kSplitWarps; ++w) {
      if (warp_m[w] == -INFINITY) continue;  // this warp saw no key
      const float f = expf(warp_m[w] - m_blk);
      l_blk += warp_l[w] * f;
      o += warp_acc[w][d] * f;
    }
    if constexpr (S == 1) {
      // The only block saw key pos, so l_blk > 0.
      p.out[static_cast<size_t>(i) * q_stride + h * dh + d] = FromFloat<E>(o / l_blk);
    } else {
      part_acc[d] = o;
      if (d == 0) {
        part_m = m_blk;  // -inf when this block's range was empty
        part_l = l_blk;
      }
    }
  }

  if constexpr (S > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Every thread of every block of the cluster reaches both barriers (no
    // return above, no barrier inside a branch).
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // all parts written (release/acquire across the cluster)
    if (cluster.block_rank() == 0) {
      float m_all = -INFINITY;
      for (int r = 0; r < S; ++r) m_all = fmaxf(m_all, *cluster.map_shared_rank(&part_m, r));
      for (int d = threadIdx.x; d < dh; d += blockDim.x) {
        float l_all = 0.f;
        float o = 0.f;
        for (int r = 0; r < S; ++r) {
          const float m_r = *cluster.map_shared_rank(&part_m, r);
          if (m_r == -INFINITY) continue;  // this block's range was empty
          const float f = expf(m_r - m_all);
          l_all += *cluster.map_shared_rank(&part_l, r) * f;
          o += *cluster.map_shared_rank(&part_acc[d], r) * f;
        }
        // Block 0's range starts at lo <= pos, so l_all > 0.
        p.out[static_cast<size_t>(i) * q_stride + h * dh + d] = FromFloat<E>(o / l_all);
      }
    }
    cluster.sync();  // no block exits (freeing its shared memory) while rank 0 reads it
#else
    __trap();  // the host launches S > 1 only on compute capability 9.0+
#endif
  }
}

template <int LPK, int S, typename E>
cudaError_t LaunchSplit(const WindowAttentionParams<E>& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.n * S), static_cast<unsigned>(p.heads));
  if constexpr (S == 1) {
    WindowSplitDecodeKernel<LPK, 1, E><<<grid, kSplitThreads, 0, stream>>>(p);
    return cudaGetLastError();
  } else {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(kSplitThreads);
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = S;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, WindowSplitDecodeKernel<LPK, S, E>, p);
  }
}

template <int LPK, typename E>
cudaError_t LaunchSplitLpk(const WindowAttentionParams<E>& p, cudaStream_t stream) {
  switch (p.decode_splits) {
    case 1: return LaunchSplit<LPK, 1, E>(p, stream);
    case 2: return LaunchSplit<LPK, 2, E>(p, stream);
    case 4: return LaunchSplit<LPK, 4, E>(p, stream);
    default: return LaunchSplit<LPK, 8, E>(p, stream);
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchWindowSplitDecode(const WindowAttentionParams<T>& p, cudaStream_t stream) {
  if (p.decode_splits > 1) {
    int major = 0;
    if (cudaError_t err = CurrentDeviceMajor(major); err != cudaSuccess) return err;
    if (major < 9) return cudaErrorNotSupported;
    // A binary without sm_90 code runs the compute_80 PTX on an H100, where
    // the cluster kernels only trap (a sticky error): refuse instead.
    // MakeCudaBackend refuses such a build first (WindowSplitDecodeCodeVersions);
    // this keeps the kernel tests and other callers safe.
    cudaFuncAttributes attributes{};
    if (cudaError_t err = cudaFuncGetAttributes(
            &attributes, WindowSplitDecodeKernel<8, 2, T>);
        err != cudaSuccess) {
      return err;
    }
    if (!HasClusterCode(attributes.ptxVersion, attributes.binaryVersion)) {
      return cudaErrorNotSupported;
    }
  }
  // 8 LPK >= head_dim (<= 128).
  if (p.head_dim <= 64) return LaunchSplitLpk<8, T>(p, stream);
  return LaunchSplitLpk<16, T>(p, stream);
}

template cudaError_t LaunchWindowSplitDecode<float>(const WindowAttentionParams<float>&,
                                                    cudaStream_t);
template cudaError_t LaunchWindowSplitDecode<bf16>(const WindowAttentionParams<bf16>&,
                                                   cudaStream_t);

}  // namespace drt::kernels::detail

namespace drt::kernels {

cudaError_t WindowSplitDecodeCodeVersions(int* ptx_version, int* binary_version) {
  // Every instantiation of the kernel is compiled from the same file with the
  // same architectures: one stands for all.
  cudaFuncAttributes attributes{};
  if (cudaError_t err =
          cudaFuncGetAttributes(&attributes, detail::WindowSplitDecodeKernel<8, 2, float>);
      err != cudaSuccess) {
    return err;
  }
  *ptx_version = attributes.ptxVersion;
  *binary_version = attributes.binaryVersion;
  return cudaSuccess;
}

}  // namespace drt::kernels

#include "kernels/landmark_topk.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/retrieval_softmax.h"

namespace drt::kernels {
namespace {

// Stage 1: a block scores kBlockLandmarks landmarks against up to
// kMaxQueriesPerBlock queries (each landmark row is read once for all of
// them) and keeps each query's best `topk` of its range in the workspace.
// Stage 2: a block per query merges the candidates of all stage-1 blocks.
constexpr int kBlockLandmarks = 1024;
constexpr int kMaxQueriesPerBlock = 8;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxLandmarks = int64_t{1} << 20;
constexpr int64_t kMaxBlocksPerQuery = kMaxLandmarks / kBlockLandmarks;
constexpr int kMaxTopK = 32;
static_assert(kMaxQueriesPerBlock <= kWarps, "a warp selects for each query of a block");

// Candidate order: higher score first, then lower chunk index (engine/cpu
// Retrieve's partial_sort comparator). Chunk -1 is "none" and loses to all.
__device__ inline bool Better(float a_s, int32_t a_c, float b_s, int32_t b_c) {
  if (a_c < 0) return false;
  if (b_c < 0) return true;
  return a_s > b_s || (a_s == b_s && a_c < b_c);
}

__device__ inline void WarpArgBest(float& s, int32_t& c) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float os = __shfl_xor_sync(0xffffffffu, s, offset);
    const int32_t oc = __shfl_xor_sync(0xffffffffu, c, offset);
    if (Better(os, oc, s, c)) {
      s = os;
      c = oc;
    }
  }
}

struct Workspace {
  float* scores;  // [num_queries][blocks][topk]
  int32_t* chunks;
};

__host__ __device__ inline Workspace CarveWorkspace(void* base, int num_queries, int64_t blocks,
                                                    int topk) {
  Workspace w;
  w.scores = static_cast<float*>(base);
  w.chunks = reinterpret_cast<int32_t*>(w.scores + static_cast<size_t>(num_queries) * blocks * topk);
  return w;
}

__global__ void __launch_bounds__(kThreads)
    TopKStage1(const float* __restrict__ landmarks, int d, const float* __restrict__ queries,
               const int64_t* __restrict__ limits, int num_queries, int queries_per_block, int topk,
               float scale, int64_t blocks_per_query, Workspace ws) {
  extern __shared__ float smem[];
  __shared__ int64_t lim[kMaxQueriesPerBlock];
  const int qpb = queries_per_block;
  float* qsm = smem;                                  // [qpb][d]
  float* ssm = smem + static_cast<size_t>(qpb) * d;   // [qpb][kBlockLandmarks]
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int q0 = blockIdx.y * qpb;
  const int nq = min(qpb, num_queries - q0);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kBlockLandmarks;
  if (threadIdx.x < kMaxQueriesPerBlock) {
    lim[threadIdx.x] = static_cast<int>(threadIdx.x) < nq ? limits[q0 + threadIdx.x] : 0;
  }
  __syncthreads();
  int64_t max_lim = 0;
  for (int r = 0; r < nq; ++r) max_lim = max(max_lim, lim[r]);
  // Block-uniform. Stage 2 reads no candidate of this block. Checked before
  // the queries are loaded: the grid covers the workspace's capacity (up to
  // 1024 blocks per query group), usually far more than the limits.
  if (base >= max_lim) return;
  for (int i = threadIdx.x; i < nq * d; i += kThreads) {
    qsm[i] = queries[static_cast<size_t>(q0) * d + i];
  }
  __syncthreads();

  for (int cl = warp; cl < kBlockLandmarks; cl += kWarps) {
    const int64_t c = base + cl;
    if (c >= max_lim) {
      if (lane < nq) ssm[lane * kBlockLandmarks + cl] = NAN;
      continue;
    }
    const float* row = landmarks + static_cast<size_t>(c) * d;
    float acc[kMaxQueriesPerBlock];
#pragma unroll
    for (int r = 0; r < kMaxQueriesPerBlock; ++r) acc[r] = 0.f;
#pragma unroll 4
    for (int j = lane; j < d; j += 32) {
      const float x = row[j];
#pragma unroll
      for (int r = 0; r < kMaxQueriesPerBlock; ++r) {
        if (r < nq) acc[r] = fmaf(qsm[r * d + j], x, acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kMaxQueriesPerBlock; ++r) {
      if (r >= nq) break;  // block-uniform
      float v = acc[r];
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
      if (lane == r) ssm[r * kBlockLandmarks + cl] = c < lim[r] ? v * scale : NAN;
    }
  }
  __syncthreads();

  // Selection: warp r keeps the best `topk` of query q0 + r in this block's
  // range, one per round, each round the best candidate ranked after the
  // previous round's pick (a strict total order, so nothing needs marking).
  if (warp >= nq) return;
  const int64_t in_range = lim[warp] - base;
  const int valid = in_range <= 0 ? 0 : in_range >= kBlockLandmarks ? kBlockLandmarks
                                                                    : static_cast<int>(in_range);
  const float* scores = ssm + warp * kBlockLandmarks;
  const size_t out_base = (static_cast<size_t>(q0 + warp) * blocks_per_query + blockIdx.x) * topk;
  float prev_s = 0.f;
  int32_t prev_c = -1;
  for (int round = 0; round < topk; ++round) {
    float best_s = 0.f;
    int32_t best_c = -1;
    for (int cl = lane; cl < valid; cl += 32) {
      const float s = scores[cl];
      if (isnan(s)) continue;
      const int32_t c = static_cast<int32_t>(base + cl);
      if (prev_c >= 0 && !Better(prev_s, prev_c, s, c)) continue;
      if (Better(s, c, best_s, best_c)) {
        best_s = s;
        best_c = c;
      }
    }
    WarpArgBest(best_s, best_c);
    if (lane == 0) {
      ws.scores[out_base + round] = best_s;
      ws.chunks[out_base + round] = best_c;
    }
    prev_s = best_s;
    prev_c = best_c;
    if (best_c < 0) {
      // Nothing left: mark the remaining rounds empty.
      for (int rest = round + 1 + lane; rest < topk; rest += 32) ws.chunks[out_base + rest] = -1;
      break;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    TopKStage2(const int64_t* __restrict__ limits, int topk, int64_t blocks_per_query, Workspace ws,
               int64_t* __restrict__ out_chunks, float* __restrict__ out_weights) {
  __shared__ float warp_s[kWarps];
  __shared__ int32_t warp_c[kWarps];
  __shared__ float sel_s[kMaxTopK];
  __shared__ int32_t sel_c[kMaxTopK];
  __shared__ int found_shared;
  const int q = blockIdx.x;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t limit = limits[q];
  int64_t* chunks_out = out_chunks + static_cast<size_t>(q) * topk;
  float* weights_out = out_weights + static_cast<size_t>(q) * topk;
  if (limit > blocks_per_query * kBlockLandmarks) {
    // More landmarks than the workspace was sized for: refuse visibly.
    for (int i = threadIdx.x; i < topk; i += kThreads) {
      chunks_out[i] = -1;
      weights_out[i] = NAN;
    }
    return;
  }
  const int64_t blocks = limit > 0 ? (limit + kBlockLandmarks - 1) / kBlockLandmarks : 0;
  const int64_t candidates = blocks * topk;
  const float* cand_s = ws.scores + static_cast<size_t>(q) * blocks_per_query * topk;
  const int32_t* cand_c = ws.chunks + static_cast<size_t>(q) * blocks_per_query * topk;
  float prev_s = 0.f;
  int32_t prev_c = -1;
  int found = 0;
  for (int round = 0; round < topk; ++round) {
    float best_s = 0.f;
    int32_t best_c = -1;
    for (int64_t i = threadIdx.x; i < candidates; i += kThreads) {
      const int32_t c = cand_c[i];
      if (c < 0) continue;
      const float s = cand_s[i];
      if (prev_c >= 0 && !Better(prev_s, prev_c, s, c)) continue;
      if (Better(s, c, best_s, best_c)) {
        best_s = s;
        best_c = c;
      }
    }
    WarpArgBest(best_s, best_c);
    if (lane == 0) {
      warp_s[warp] = best_s;
      warp_c[warp] = best_c;
    }
    __syncthreads();
    if (warp == 0) {
      best_s = lane < kWarps ? warp_s[lane] : 0.f;
      best_c = lane < kWarps ? warp_c[lane] : -1;
      WarpArgBest(best_s, best_c);
      if (lane == 0) {
        sel_s[round] = best_s;
        sel_c[round] = best_c;
      }
    }
    __syncthreads();
    prev_s = sel_s[round];
    prev_c = sel_c[round];
    if (prev_c < 0) break;
    found = round + 1;
  }
  if (threadIdx.x == 0) found_shared = found;
  __syncthreads();
  if (threadIdx.x != 0) return;
  // Softmax over the selected scores, as engine/cpu Retrieve computes it
  // (kernels/retrieval_softmax.h keeps the best score before the loop).
  SoftmaxOfBestFirstScores(sel_s, found_shared);
  for (int i = 0; i < topk; ++i) {
    chunks_out[i] = i < found_shared ? sel_c[i] : -1;
    weights_out[i] = i < found_shared ? sel_s[i] : 0.f;
  }
}

int64_t BlocksPerQuery(int64_t max_landmarks) {
  const int64_t landmarks = std::clamp<int64_t>(max_landmarks, 1, kMaxLandmarks);
  return (landmarks + kBlockLandmarks - 1) / kBlockLandmarks;
}

size_t Stage1SmemBytes(int queries_per_block, int d) {
  return sizeof(float) * static_cast<size_t>(queries_per_block) * (static_cast<size_t>(d) + kBlockLandmarks);
}

}  // namespace

size_t LandmarkTopKWorkspaceBytes(int64_t max_landmarks, int max_queries, int topk) {
  if (max_queries <= 0 || topk <= 0 || topk > kMaxTopK) return 0;
  return static_cast<size_t>(max_queries) * BlocksPerQuery(max_landmarks) * topk *
         (sizeof(float) + sizeof(int32_t));
}

cudaError_t LaunchLandmarkTopK(const float* landmarks, int d, const float* queries,
                               const int64_t* limits, int num_queries, int topk, float scale,
                               void* workspace, size_t workspace_bytes, int64_t* out_chunks,
                               float* out_weights, cudaStream_t stream) {
  if (d <= 0 || num_queries < 0 || topk <= 0 || topk > kMaxTopK) return cudaErrorInvalidValue;
  if (num_queries == 0) return cudaSuccess;
  if (landmarks == nullptr || queries == nullptr || limits == nullptr || workspace == nullptr ||
      out_chunks == nullptr || out_weights == nullptr ||
      (reinterpret_cast<uintptr_t>(workspace) & 3u) != 0) {
    return cudaErrorInvalidValue;
  }
  const size_t per_block = static_cast<size_t>(num_queries) * topk * (sizeof(float) + sizeof(int32_t));
  const int64_t blocks_per_query =
      std::min<int64_t>(static_cast<int64_t>(workspace_bytes / per_block), kMaxBlocksPerQuery);
  if (blocks_per_query <= 0) return cudaErrorInvalidValue;

  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  int max_smem = 0;
  if (cudaError_t err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      err != cudaSuccess) {
    return err;
  }
  // Static shared memory of stage 1 (the limits) comes on top of the dynamic part.
  const size_t smem_cap = static_cast<size_t>(max_smem) - 1024;
  int qpb = std::min(kMaxQueriesPerBlock, num_queries);
  while (qpb > 1 && Stage1SmemBytes(qpb, d) > smem_cap) --qpb;
  const size_t smem = Stage1SmemBytes(qpb, d);
  if (smem > smem_cap) return cudaErrorInvalidValue;
  if (smem > 48 * 1024) {
    if (cudaError_t err = cudaFuncSetAttribute(TopKStage1, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
        err != cudaSuccess) {
      return err;
    }
  }
  const int64_t query_groups = (num_queries + qpb - 1) / qpb;
  if (query_groups > 65535) return cudaErrorInvalidValue;
  const Workspace ws = CarveWorkspace(workspace, num_queries, blocks_per_query, topk);
  const dim3 grid1(static_cast<unsigned>(blocks_per_query), static_cast<unsigned>(query_groups));
  TopKStage1<<<grid1, kThreads, smem, stream>>>(landmarks, d, queries, limits, num_queries, qpb, topk,
                                                scale, blocks_per_query, ws);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  TopKStage2<<<num_queries, kThreads, 0, stream>>>(limits, topk, blocks_per_query, ws, out_chunks,
                                                   out_weights);
  return cudaGetLastError();
}

}  // namespace drt::kernels

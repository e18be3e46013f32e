// fp32 CPU kernels of the DRT forward pass (drt-model.md, "Forward pass").
// Matrices are row-major; weights are [out, in] as in the checkpoint. Every
// kernel spreads its work over a ThreadPool; BLAS calls inside are
// single-threaded so that the two levels of parallelism never fight. Each
// kernel has a naive twin in tests/cpu_kernels_test.cc.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "engine/cpu/thread_pool.h"

namespace drt::cpu {

// Makes the BLAS library single-threaded (the kernels parallelise around it).
void UseSingleThreadedBlas();

// Linear, WindowAttention and GroupedCrossAttention run their tasks one after
// another on the calling thread when the op has fewer multiply-adds than
// pool.min_parallel_macs() (kDefaultMinParallelMacs, derived in kernels.cc).
// The tasks are the same either way (they depend on pool.size(), not on this
// choice), so the result is bit-identical.

// y[n, out] = x[n, in] * w[out, in]^T. y may not alias x.
void Linear(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
            ThreadPool& pool);

// y[i] = x[i] / sqrt(mean(x[i]^2) + eps) * weight, for n rows of width d.
// y may alias x.
void RmsNorm(const float* x, int64_t n, int64_t d, const float* weight, float eps, float* y,
             ThreadPool& pool);

// out[i] = silu(gate[i]) * up[i] over n floats; out may alias gate.
void SwiGlu(const float* gate, const float* up, int64_t n, float* out, ThreadPool& pool);

// y += x over n floats.
void AddInPlace(float* y, const float* x, int64_t n);

// ALiBi slope of head h of H heads: 1 / (2^(8/H))^(h+1).
float AlibiSlope(int64_t h, int64_t num_heads);

// Causal sliding-window ALiBi attention (drt-model.md, Forward pass 3).
// keys/values hold `num_keys` consecutive positions (row stride
// kv_heads*head_dim); the n query rows (row stride num_heads*head_dim) are the
// last n of those positions: query i is at key index num_keys - n + i and sees
// key indices [that - window, that] (clipped at 0), with score
// q.k/sqrt(dh) - slope_h * distance. GQA: query head h reads K/V head
// h / (num_heads / kv_heads). out: [n, num_heads*head_dim].
void WindowAttention(const float* q, int64_t n, const float* keys, const float* values,
                     int64_t num_keys, int64_t num_heads, int64_t kv_heads, int64_t head_dim,
                     int64_t window, float* out, ThreadPool& pool);

// Query rows up to which window attention (per block of query rows) and GCA
// (per run) take each row through matrix-vector products of its own, over
// exactly the keys it sees, instead of one GEMM for the block: for a few rows
// a GEMM spends more time packing its operands than multiplying them
// (docs/batching.md, "What a mixed step costs"). A row computed this way
// gives the same floats whatever rows it is computed with.
//
// Why 8: the A/B against the GEMM path (docs/batching.md, "What a mixed
// step costs") shows gains at 1 and 2 rows and no loss that the noise of
// this shared machine could tell at 4 (new / old 0.90-1.00) and 8
// (0.98-1.07); a lower bound (2 to 4) may be as good or better, and needs an
// A/B at 3 to 8 rows on a quiet machine before it changes. Independent of
// kInPlaceWindowRows (engine/cpu/window_cache.h): either may change alone.
constexpr int64_t kRowByRowQueryRows = 8;

// The same attention for several independent slices in one parallel loop
// (the slices of a batched step, each over its own session's window): each
// slice is computed exactly as WindowAttention computes it alone.
struct WindowAttentionSlice {
  const float* q = nullptr;  // [n, num_heads*head_dim]
  int64_t n = 0;
  const float* keys = nullptr;  // [num_keys, kv_heads*head_dim]; queries are the last n
  const float* values = nullptr;
  int64_t num_keys = 0;
  float* out = nullptr;  // [n, num_heads*head_dim]
};
void WindowAttention(absl::Span<const WindowAttentionSlice> slices, int64_t num_heads,
                     int64_t kv_heads, int64_t head_dim, int64_t window, ThreadPool& pool);

// Rotary embedding (rotate-half convention) for the rows of each block of
// `rows` rows, at positions 0..rows-1, applied in place to every head of
// x [num_blocks*rows, heads*head_dim].
void ApplyRope(float* x, int64_t num_blocks, int64_t rows, int64_t heads, int64_t head_dim,
               double theta, ThreadPool& pool);

// Bidirectional multi-head attention inside each block of `rows` rows (the
// chunk encoder); q, k, v, out: [num_blocks*rows, num_heads*head_dim].
void BlockAttention(const float* q, const float* k, const float* v, int64_t num_blocks,
                    int64_t rows, int64_t num_heads, int64_t head_dim, float* out, ThreadPool& pool);

// One run of GCA query rows that share a retrieval (drt-model.md, Forward
// pass 7). chunk_k/chunk_v point to num_chunks matrices of
// [rows_per_chunk, num_heads*head_dim]; the landmark row is stored as zeros,
// which makes the softmax off-by-one.
struct GcaBlock {
  const float* q = nullptr;  // [n, num_heads*head_dim]
  int64_t n = 0;
  const float* const* chunk_k = nullptr;
  const float* const* chunk_v = nullptr;
  const float* weights = nullptr;  // [num_chunks], retrieval softmax weights
  int64_t num_chunks = 0;
  float* out = nullptr;  // [n, num_heads*head_dim]; zero when num_chunks == 0
};
// out = sum_i weights[i] * softmax(q.K_i^T / sqrt(dh)) V_i, per head.
void GroupedCrossAttention(absl::Span<const GcaBlock> blocks, int64_t rows_per_chunk,
                           int64_t num_heads, int64_t head_dim, ThreadPool& pool);

// out[j] = scale * dot(q, rows + j * n) for j < count: one query against
// `count` rows of n floats (the retrieval scan of one landmark). Each dot is
// summed in 16 interleaved lanes, then the lanes pairwise, so a row's result
// depends only on q and that row: not on j, count or anything else in the
// call (a row copied to another slot scores exactly the same; exact ties
// stay ties). Memory-bound; measured against sgemm with M = 1 in
// docs/engine.md ("Retrieval scan").
void RowDots(const float* q, const float* rows, int64_t count, int64_t n, float scale, float* out);

}  // namespace drt::cpu

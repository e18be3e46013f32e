#include "engine/cpu/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace drt::cpu {
namespace {

// exp(x) for x <= 0 (softmax arguments after subtracting the maximum), to
// about 2 ulp. Branch-free so that the compiler vectorises the softmax loop;
// std::exp is a scalar libm call and was a fifth of the prefill time.
inline float ExpNonPositive(float x) {
  x = x < -87.0f ? -87.0f : x;  // exp underflows to ~0 below; also maps -inf there
  // x = n ln2 + r, |r| <= ln2 / 2 (Cody-Waite split of ln2).
  // Round to nearest by adding and removing 1.5 * 2^23 (vectorises, unlike
  // nearbyint); exact for |x log2 e| < 2^22.
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  // exp(r) by its Taylor polynomial (Cephes expf coefficients).
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // Times 2^n through the exponent bits.
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// Softmax of one row in place (finite entries).
void SoftmaxRow(float* row, int64_t n) {
  float max_value = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) max_value = std::max(max_value, row[j]);
  // Separate loops: the exp loop vectorises; a float sum would not (its
  // order may not change without -ffast-math).
  for (int64_t j = 0; j < n; ++j) row[j] = ExpNonPositive(row[j] - max_value);
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) sum += row[j];
  const float inv = 1.f / sum;
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
}

// Rows of queries processed together in the window attention: one GEMM of
// kQueryBlock x (window + kQueryBlock) per head instead of per-row dot loops.
constexpr int64_t kQueryBlock = 64;
// Up to this many rows, Linear uses matrix-vector products.
constexpr int64_t kGemvRows = 4;
// Weights (floats) of one block of output features that several rows read in
// turn: 128 KiB, inside a core's L2 cache.
constexpr int64_t kGemvBlockFloats = 32768;

// fn(i) for i in [0, n), in contiguous ranges of at least min_per_task.
template <typename Fn>
void ForEachRange(ThreadPool& pool, int64_t n, int64_t min_per_task, Fn fn) {
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(pool.size(), n / min_per_task));
  const int64_t per_task = (n + tasks - 1) / tasks;
  pool.ParallelFor(tasks, [&](int64_t t) {
    const int64_t end = std::min(n, (t + 1) * per_task);
    for (int64_t i = t * per_task; i < end; ++i) fn(i);
  });
}

// kDefaultMinParallelMacs (thread_pool.h), measured 2026-11-24 01:24 UTC on the 2-core
// VM (load average 10.5, temporary micro-benchmark, medians of 15 x 2,000
// calls, A and B interleaved): one sgemv of in = 192 against the same
// products split into two bands through a 2-thread ParallelFor. Split / serial
// time: 33x at 12k multiply-adds, 3.3x at 74k, 1.85x at 111k, 0.96x at 147k,
// 0.81x at 221k, 0.49x from 442k. An empty 2-thread ParallelFor took 9 us
// (median) there, while a serial sgemv of up to ~100k multiply-adds whose
// weights sit in cache takes 0.5-12 us: below 2^17 (131k) the wake-up costs
// more than the halved work saves. Attention ops use the same count.
//
// Runs fn(t) for t in [0, tasks): on the pool when the op has at least
// pool.min_parallel_macs() multiply-adds, else in order on the calling thread.
template <typename Fn>
void RunTasks(ThreadPool& pool, int64_t tasks, int64_t macs, const Fn& fn) {
  if (macs < pool.min_parallel_macs()) {
    for (int64_t t = 0; t < tasks; ++t) fn(t);
    return;
  }
  pool.ParallelFor(tasks, fn);
}

}  // namespace

void UseSingleThreadedBlas() { openblas_set_num_threads(1); }

void Linear(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
            ThreadPool& pool) {
  if (n <= 0 || out <= 0) return;
  const int threads = pool.size();
  const int64_t macs = n * in * out;
  if (n >= 8 * threads) {
    // Split rows of x: each thread computes a horizontal band of y.
    const int64_t band = (n + threads - 1) / threads;
    RunTasks(pool, threads, macs, [&](int64_t t) {
      const int64_t r0 = t * band;
      const int64_t r1 = std::min(n, r0 + band);
      if (r0 >= r1) return;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, out, in, 1.f, x + r0 * in, in,
                  w, in, 0.f, y + r0 * out, out);
    });
    return;
  }
  // Few rows: split the output features.
  const int64_t band = (out + threads - 1) / threads;
  RunTasks(pool, threads, macs, [&](int64_t t) {
    const int64_t c0 = t * band;
    const int64_t c1 = std::min(out, c0 + band);
    if (c0 >= c1) return;
    if (n == 1) {
      // Decode: a matrix-vector product streams the weights once; sgemm
      // would pack (copy) the whole weight matrix on every call.
      cblas_sgemv(CblasRowMajor, CblasNoTrans, c1 - c0, in, 1.f, w + c0 * in, in, x, 1, 0.f,
                  y + c0, 1);
    } else if (n <= kGemvRows) {
      // A few decode rows (sessions batched in one step): the same products
      // block by block of output features, so that each block of weights is
      // read from memory once for all rows and then from cache.
      const int64_t block = std::max<int64_t>(16, kGemvBlockFloats / in);
      for (int64_t b0 = c0; b0 < c1; b0 += block) {
        const int64_t b1 = std::min(c1, b0 + block);
        for (int64_t r = 0; r < n; ++r) {
          cblas_sgemv(CblasRowMajor, CblasNoTrans, b1 - b0, in, 1.f, w + b0 * in, in, x + r * in,
                      1, 0.f, y + r * out + b0, 1);
        }
      }
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, c1 - c0, in, 1.f, x, in,
                  w + c0 * in, in, 0.f, y + c0, out);
    }
  });
}

void RmsNorm(const float* x, int64_t n, int64_t d, const float* weight, float eps, float* y,
             ThreadPool& pool) {
  ForEachRange(pool, n, 16, [&](int64_t i) {
    const float* xi = x + i * d;
    float* yi = y + i * d;
    double sum_sq = 0.0;
    for (int64_t j = 0; j < d; ++j) sum_sq += static_cast<double>(xi[j]) * xi[j];
    const float scale = static_cast<float>(1.0 / std::sqrt(sum_sq / d + eps));
    for (int64_t j = 0; j < d; ++j) yi[j] = xi[j] * scale * weight[j];
  });
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* out, ThreadPool& pool) {
  ForEachRange(pool, n, 16384, [&](int64_t i) {
    const float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  });
}

void AddInPlace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

float AlibiSlope(int64_t h, int64_t num_heads) {
  const double base = std::pow(2.0, 8.0 / static_cast<double>(num_heads));
  return static_cast<float>(1.0 / std::pow(base, static_cast<double>(h + 1)));
}

void WindowAttention(const float* q, int64_t n, const float* keys, const float* values,
                     int64_t num_keys, int64_t num_heads, int64_t kv_heads, int64_t head_dim,
                     int64_t window, float* out, ThreadPool& pool) {
  WindowAttentionSlice slice;
  slice.q = q;
  slice.n = n;
  slice.keys = keys;
  slice.values = values;
  slice.num_keys = num_keys;
  slice.out = out;
  WindowAttention(absl::MakeConstSpan(&slice, 1), num_heads, kv_heads, head_dim, window, pool);
}

void WindowAttention(absl::Span<const WindowAttentionSlice> slices, int64_t num_heads,
                     int64_t kv_heads, int64_t head_dim, int64_t window, ThreadPool& pool) {
  const int64_t q_stride = num_heads * head_dim;
  const int64_t kv_stride = kv_heads * head_dim;
  const int64_t heads_per_kv = num_heads / kv_heads;
  const float scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  // Tasks are (slice, query block, head); first_task[s] is slice s's first.
  std::vector<int64_t> first_task(slices.size() + 1, 0);
  // Multiply-adds: scores and values, each row over at most window + a query
  // block of keys (an upper bound for the row-by-row path).
  int64_t macs = 0;
  for (size_t s = 0; s < slices.size(); ++s) {
    const int64_t num_blocks = (slices[s].n + kQueryBlock - 1) / kQueryBlock;
    first_task[s + 1] = first_task[s] + num_blocks * num_heads;
    macs += slices[s].n * std::min(slices[s].num_keys, window + kQueryBlock) * head_dim * 2 *
            num_heads;
  }

  RunTasks(pool, first_task.back(), macs, [&](int64_t global_task) {
    const size_t s = static_cast<size_t>(
        std::upper_bound(first_task.begin(), first_task.end(), global_task) - first_task.begin() -
        1);
    const WindowAttentionSlice& slice = slices[s];
    const int64_t task = global_task - first_task[s];
    const int64_t n = slice.n;
    const float* q = slice.q;
    float* out = slice.out;
    const int64_t first_query_key = slice.num_keys - n;
    const int64_t block = task / num_heads;
    const int64_t h = task % num_heads;
    const int64_t kvh = h / heads_per_kv;
    const float slope = AlibiSlope(h, num_heads);
    const int64_t i0 = block * kQueryBlock;
    const int64_t i1 = std::min(n, i0 + kQueryBlock);
    const int64_t rows = i1 - i0;
    const float* keys = slice.keys;
    const float* values = slice.values;
    if (rows <= kRowByRowQueryRows) {
      // Row by row: matrix-vector products over exactly the keys each row
      // sees (for one row, what the GEMM below would compute, without
      // packing its operands).
      std::vector<float> scores(std::min(window + 1, slice.num_keys));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t pos = first_query_key + i0 + r;
        const int64_t lo = std::max<int64_t>(0, pos - window);
        const int64_t cols = pos - lo + 1;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, cols, head_dim, scale,
                    keys + lo * kv_stride + kvh * head_dim, kv_stride,
                    q + (i0 + r) * q_stride + h * head_dim, 1, 0.f, scores.data(), 1);
        for (int64_t c = 0; c < cols; ++c) scores[c] -= slope * static_cast<float>(pos - lo - c);
        SoftmaxRow(scores.data(), cols);
        cblas_sgemv(CblasRowMajor, CblasTrans, cols, head_dim, 1.f,
                    values + lo * kv_stride + kvh * head_dim, kv_stride, scores.data(), 1, 0.f,
                    out + (i0 + r) * q_stride + h * head_dim, 1);
      }
      return;
    }
    // A block of more rows: one GEMM over the keys any of its rows sees,
    // masked per row.
    const int64_t k0 = std::max<int64_t>(0, first_query_key + i0 - window);
    const int64_t k1 = first_query_key + i1;  // exclusive
    const int64_t cols = k1 - k0;
    std::vector<float> scores(rows * cols);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, head_dim, scale,
                q + i0 * q_stride + h * head_dim, q_stride, keys + k0 * kv_stride + kvh * head_dim,
                kv_stride, 0.f, scores.data(), cols);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = first_query_key + i0 + r;
      float* row = scores.data() + r * cols;
      // Keys this query sees: columns [lo, hi]; the rest of the row is zero.
      const int64_t lo = std::max<int64_t>(0, pos - window - k0);
      const int64_t hi = pos - k0;
      std::fill(row, row + lo, 0.f);
      std::fill(row + hi + 1, row + cols, 0.f);
      for (int64_t c = lo; c <= hi; ++c) row[c] -= slope * static_cast<float>(pos - k0 - c);
      SoftmaxRow(row + lo, hi - lo + 1);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, head_dim, cols, 1.f,
                scores.data(), cols, values + k0 * kv_stride + kvh * head_dim, kv_stride, 0.f,
                out + i0 * q_stride + h * head_dim, q_stride);
  });
}

void ApplyRope(float* x, int64_t num_blocks, int64_t rows, int64_t heads, int64_t head_dim,
               double theta, ThreadPool& pool) {
  const int64_t half = head_dim / 2;
  // cos/sin per (position, frequency), as the reference builds them in fp32.
  std::vector<float> cos_table(rows * half), sin_table(rows * half);
  for (int64_t p = 0; p < rows; ++p) {
    for (int64_t f = 0; f < half; ++f) {
      const float inv_freq = static_cast<float>(
          1.0 / std::pow(theta, static_cast<double>(2 * f) / static_cast<double>(head_dim)));
      const float angle = static_cast<float>(p) * inv_freq;
      cos_table[p * half + f] = std::cos(angle);
      sin_table[p * half + f] = std::sin(angle);
    }
  }
  const int64_t stride = heads * head_dim;
  pool.ParallelFor(num_blocks, [&](int64_t b) {
    for (int64_t p = 0; p < rows; ++p) {
      float* row = x + (b * rows + p) * stride;
      const float* c = cos_table.data() + p * half;
      const float* s = sin_table.data() + p * half;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = row + h * head_dim;
        for (int64_t f = 0; f < half; ++f) {
          const float a = v[f];
          const float b2 = v[f + half];
          v[f] = a * c[f] - b2 * s[f];
          v[f + half] = b2 * c[f] + a * s[f];
        }
      }
    }
  });
}

void BlockAttention(const float* q, const float* k, const float* v, int64_t num_blocks,
                    int64_t rows, int64_t num_heads, int64_t head_dim, float* out, ThreadPool& pool) {
  const int64_t stride = num_heads * head_dim;
  const float scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  const int64_t tasks = num_blocks * num_heads;
  pool.ParallelFor(tasks, [&](int64_t task) {
    const int64_t b = task / num_heads;
    const int64_t h = task % num_heads;
    const int64_t offset = b * rows * stride + h * head_dim;
    std::vector<float> scores(rows * rows);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, rows, head_dim, scale, q + offset,
                stride, k + offset, stride, 0.f, scores.data(), rows);
    for (int64_t r = 0; r < rows; ++r) SoftmaxRow(scores.data() + r * rows, rows);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, head_dim, rows, 1.f,
                scores.data(), rows, v + offset, stride, 0.f, out + offset, stride);
  });
}

void GroupedCrossAttention(absl::Span<const GcaBlock> blocks, int64_t rows_per_chunk,
                           int64_t num_heads, int64_t head_dim, ThreadPool& pool) {
  const int64_t stride = num_heads * head_dim;
  const float scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  const int64_t tasks = static_cast<int64_t>(blocks.size()) * num_heads;
  int64_t macs = 0;  // scores and values of every row over its chunks
  for (const GcaBlock& block : blocks) {
    macs += block.n * block.num_chunks * rows_per_chunk * head_dim * 2 * num_heads;
  }
  RunTasks(pool, tasks, macs, [&](int64_t task) {
    const GcaBlock& block = blocks[task / num_heads];
    const int64_t h = task % num_heads;
    const int64_t n = block.n;
    for (int64_t r = 0; r < n; ++r) {
      std::fill_n(block.out + r * stride + h * head_dim, head_dim, 0.f);
    }
    std::vector<float> scores(n * rows_per_chunk);
    for (int64_t c = 0; c < block.num_chunks; ++c) {
      if (n <= kRowByRowQueryRows) {
        // A few rows (decode rows, small prefill pieces): matrix-vector
        // products row by row, which need no packing of the operands; the
        // chunk's keys and values stay in cache from one row to the next.
        for (int64_t r = 0; r < n; ++r) {
          float* row_scores = scores.data() + r * rows_per_chunk;
          cblas_sgemv(CblasRowMajor, CblasNoTrans, rows_per_chunk, head_dim, scale,
                      block.chunk_k[c] + h * head_dim, stride, block.q + r * stride + h * head_dim,
                      1, 0.f, row_scores, 1);
          SoftmaxRow(row_scores, rows_per_chunk);
          // out += w_c * P V_c
          cblas_sgemv(CblasRowMajor, CblasTrans, rows_per_chunk, head_dim, block.weights[c],
                      block.chunk_v[c] + h * head_dim, stride, row_scores, 1, 1.f,
                      block.out + r * stride + h * head_dim, 1);
        }
        continue;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows_per_chunk, head_dim, scale,
                  block.q + h * head_dim, stride, block.chunk_k[c] + h * head_dim, stride, 0.f,
                  scores.data(), rows_per_chunk);
      for (int64_t r = 0; r < n; ++r) SoftmaxRow(scores.data() + r * rows_per_chunk, rows_per_chunk);
      // out += w_c * P V_c
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, head_dim, rows_per_chunk,
                  block.weights[c], scores.data(), rows_per_chunk, block.chunk_v[c] + h * head_dim,
                  stride, 1.f, block.out + h * head_dim, stride);
    }
  });
}

void RowDots(const float* q, const float* rows, int64_t count, int64_t n, float scale, float* out) {
  constexpr int kLanes = 16;  // independent sums: the compiler vectorises them without reordering
  for (int64_t j = 0; j < count; ++j) {
    const float* row = rows + j * n;
    float lanes[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int k = 0; k < kLanes; ++k) lanes[k] += q[i + k] * row[i + k];
    }
    float tail = 0.f;
    for (; i < n; ++i) tail += q[i] * row[i];
    for (int width = kLanes / 2; width >= 1; width /= 2) {
      for (int k = 0; k < width; ++k) lanes[k] += lanes[k + width];
    }
    out[j] = scale * (lanes[0] + tail);
  }
}

}  // namespace drt::cpu

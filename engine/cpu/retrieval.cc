#include "engine/cpu/retrieval.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/cpu/kernels.h"
#include "engine/model_rules.h"

namespace drt::cpu {
namespace {

// The best k (score, chunk) pairs seen, best first; chunks arrive in
// increasing order, so among equal scores the earlier chunk stays ahead (the
// order a sort by score, then chunk, gives).
class TopK {
 public:
  explicit TopK(int64_t k) : k_(k) {
    scores_.reserve(k);
    chunks_.reserve(k);
  }
  void Offer(float score, int64_t chunk) {
    const int64_t n = static_cast<int64_t>(scores_.size());
    if (k_ == 0 || (n == k_ && !(score > scores_.back()))) return;
    int64_t at = n == k_ ? n - 1 : n;  // the slot it takes before moving up
    if (n < k_) {
      scores_.push_back(score);
      chunks_.push_back(chunk);
    }
    while (at > 0 && score > scores_[at - 1]) {
      scores_[at] = scores_[at - 1];
      chunks_[at] = chunks_[at - 1];
      --at;
    }
    scores_[at] = score;
    chunks_[at] = chunk;
  }
  const std::vector<float>& scores() const { return scores_; }
  const std::vector<int64_t>& chunks() const { return chunks_; }

 private:
  int64_t k_;
  std::vector<float> scores_;
  std::vector<int64_t> chunks_;
};

}  // namespace

std::vector<Retrieval> RetrieveAtLandmarks(const ChunkStore& store, const float* lmk_norm,
                                           absl::Span<const float* const> rows,
                                           absl::Span<const int64_t> chunks, int64_t hidden_size,
                                           int64_t top_k, ThreadPool& pool) {
  const int64_t d = hidden_size;
  const int64_t num = static_cast<int64_t>(rows.size());
  std::vector<Retrieval> out(num);
  int64_t scanned = 0;  // chunks [0, scanned) are scored for every landmark
  for (int64_t i = 0; i < num; ++i) scanned = std::max(scanned, chunks[i]);
  if (scanned == 0 || top_k <= 0) return out;
  std::vector<float> queries(num * d);
  for (int64_t i = 0; i < num; ++i) {
    RmsNorm(rows[i], 1, d, lmk_norm, kLandmarkNormEps, queries.data() + i * d, pool);
  }
  std::vector<TopK> best;
  for (int64_t i = 0; i < num; ++i) best.emplace_back(std::min(top_k, chunks[i]));
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  std::vector<float> scores;
  for (const auto& span : store.LandmarkSpans(scanned)) {
    scores.resize(num * span.count);
    // scores[i][j] = scale * q_i . l_(first_chunk + j). One landmark (every
    // decode step that holds one) streams the block through RowDots: sgemm
    // with M = 1 took 4.7x as long (docs/engine.md, "Retrieval scan").
    // Several landmarks (prefill) share each block's read in one sgemm.
    if (num == 1) {
      RowDots(queries.data(), span.landmarks, span.count, d, scale, scores.data());
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, num, span.count, d, scale,
                  queries.data(), d, span.landmarks, d, 0.f, scores.data(), span.count);
    }
    for (int64_t i = 0; i < num; ++i) {
      const int64_t end = std::min(span.count, chunks[i] - span.first_chunk);
      for (int64_t j = 0; j < end; ++j) {
        best[i].Offer(scores[i * span.count + j], span.first_chunk + j);
      }
    }
  }
  for (int64_t i = 0; i < num; ++i) {
    const int64_t k = static_cast<int64_t>(best[i].chunks().size());
    if (k == 0) continue;
    Retrieval& r = out[i];
    r.chunks = best[i].chunks();
    r.weights.resize(k);
    // Softmax against the best score, kept apart from the loop that writes
    // the weights (the bug found in the CUDA top-k: kernels/retrieval_softmax.h).
    const float top = best[i].scores()[0];
    float sum = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      r.weights[j] = std::exp(best[i].scores()[j] - top);
      sum += r.weights[j];
    }
    for (float& w : r.weights) w /= sum;
  }
  return out;
}

}  // namespace drt::cpu

#include "engine/cpu/retrieval.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "engine/cpu/kernels.h"
#include "engine/model_rules.h"

namespace drt::cpu {

Retrieval RetrieveAtLandmark(const ChunkStore& store, const float* lmk_norm, const float* row,
                             int64_t chunk, int64_t hidden_size, int64_t top_k,
                             ThreadPool& pool) {
  const int64_t d = hidden_size;
  const int64_t k = std::min(top_k, chunk);
  Retrieval retrieval;
  if (k <= 0) return retrieval;
  std::vector<float> query(d);
  RmsNorm(row, 1, d, lmk_norm, kLandmarkNormEps, query.data(), pool);
  std::vector<float> scores(chunk);
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  for (const auto& span : store.LandmarkSpans(chunk)) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, span.count, d, scale, span.landmarks, d,
                query.data(), 1, 0.f, scores.data() + span.first_chunk, 1);
  }
  std::vector<int64_t> order(chunk);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  retrieval.chunks.assign(order.begin(), order.begin() + k);
  retrieval.weights.resize(k);
  // Softmax against the best score, kept apart from the loop that writes the
  // weights (the bug found in the CUDA top-k: kernels/retrieval_softmax.h).
  const float best = scores[retrieval.chunks[0]];
  float sum = 0.f;
  for (int64_t i = 0; i < k; ++i) {
    retrieval.weights[i] = std::exp(scores[retrieval.chunks[i]] - best);
    sum += retrieval.weights[i];
  }
  for (float& w : retrieval.weights) w /= sum;
  return retrieval;
}

}  // namespace drt::cpu

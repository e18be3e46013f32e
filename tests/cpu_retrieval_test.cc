// The CPU retrieval (engine/cpu/retrieval.h) against a naive one: scores in
// double precision, a full sort by (score desc, chunk asc), softmax in double.
// Several landmarks of one step are retrieved in one pass; each must only see
// the chunks before its own, and equal scores (duplicated landmarks) must
// keep the earlier chunk first.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cpu/retrieval.h"
#include "engine/model_rules.h"

namespace drt::cpu {
namespace {

constexpr int64_t kD = 32, kRows = 2, kTopK = 5;

TEST_CASE("batched retrieval picks what a naive top-k picks", "[retrieval]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const int64_t num_chunks = 3 * ChunkStore::kChunksPerBlock + 7;
  ChunkStore store(kRows, kD);
  std::vector<std::vector<float>> landmarks(num_chunks, std::vector<float>(kD));
  const std::vector<float> encoder_rows(kRows * kD, 0.f);
  for (int64_t c = 0; c < num_chunks; ++c) {
    // Chunk 100 repeats chunk 30 and 150 repeats 100: exact ties.
    if (c == 100 || c == 150) {
      landmarks[c] = landmarks[c == 100 ? 30 : 100];
    } else {
      for (float& x : landmarks[c]) x = normal(rng);
    }
    store.Append(landmarks[c].data(), encoder_rows.data());
  }
  std::vector<float> norm(kD);
  for (float& w : norm) w = 0.5f + 0.05f * normal(rng);
  const std::vector<int64_t> chunks = {0, 1, 3, 64, 65, 101, 151, num_chunks};
  std::vector<std::vector<float>> hidden(chunks.size(), std::vector<float>(kD));
  for (auto& row : hidden) {
    for (float& x : row) x = normal(rng);
  }
  hidden[6] = landmarks[30];  // scores chunks 30, 100 and 150 equally, and highest
  std::vector<const float*> rows;
  for (const auto& row : hidden) rows.push_back(row.data());
  ThreadPool pool(1);
  const std::vector<Retrieval> got =
      RetrieveAtLandmarks(store, norm.data(), rows, chunks, kD, kTopK, pool);
  REQUIRE(got.size() == chunks.size());
  // One landmark alone takes another scan (RowDots, not sgemm): the same
  // checks hold for it.
  std::vector<Retrieval> alone;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const std::vector<Retrieval> one =
        RetrieveAtLandmarks(store, norm.data(), {rows[i]}, {chunks[i]}, kD, kTopK, pool);
    REQUIRE(one.size() == 1);
    alone.push_back(one[0]);
  }
  // Checks landmark i's retrieval r against a naive one.
  auto check = [&](size_t i, const Retrieval& r, const char* how) {
    // Naive: RMSNorm and scores in double.
    const std::vector<float>& h = hidden[i];
    double mean_square = 0;
    for (float x : h) mean_square += double(x) * x;
    const double inv = 1.0 / std::sqrt(mean_square / kD + kLandmarkNormEps);
    std::vector<double> scores(chunks[i]);
    for (int64_t c = 0; c < chunks[i]; ++c) {
      double dot = 0;
      for (int64_t j = 0; j < kD; ++j) dot += h[j] * inv * norm[j] * landmarks[c][j];
      scores[c] = dot / std::sqrt(double(kD));
    }
    std::vector<int64_t> order(chunks[i]);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
    order.resize(std::min<int64_t>(kTopK, chunks[i]));
    INFO("landmark closing chunk " << chunks[i] << " (" << how << ")");
    REQUIRE(r.chunks == order);
    double sum = 0;
    for (int64_t c : order) sum += std::exp(scores[c] - scores[order[0]]);
    for (size_t j = 0; j < order.size(); ++j) {
      // float scores and exp against double: measured worst 4.3e-8
      // absolute here; 1e-6 leaves room for another BLAS's summation order.
      REQUIRE(r.weights[j] ==
              Approx(std::exp(scores[order[j]] - scores[order[0]]) / sum).margin(1e-6));
    }
  };
  for (size_t i = 0; i < chunks.size(); ++i) {
    check(i, got[i], "batched");
    check(i, alone[i], "alone");
  }
  REQUIRE(got[6].chunks[0] == 30);  // the tie: earlier chunk first
  REQUIRE(got[6].chunks[1] == 100);
  REQUIRE(got[6].chunks[2] == 150);
  REQUIRE(alone[6].chunks == got[6].chunks);  // exact ties in the 1-landmark scan too
}

}  // namespace
}  // namespace drt::cpu

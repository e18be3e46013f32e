// The retrieval softmax the landmark top-k kernel runs on the device
// (kernels/retrieval_softmax.h), checked on the host against a softmax in
// double computed here. The H100 run (issue 9) found the kernel computing
// every weight after the first against exp(0) = 1 instead of the best score.
#include "kernels/retrieval_softmax.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

namespace drt {
namespace {

std::vector<double> NaiveSoftmax(const std::vector<float>& scores) {
  double best = scores[0];
  for (float s : scores) best = std::max(best, static_cast<double>(s));
  std::vector<double> w(scores.size());
  double sum = 0;
  for (size_t i = 0; i < scores.size(); ++i) sum += w[i] = std::exp(scores[i] - best);
  for (double& x : w) x /= sum;
  return w;
}

void CheckAgainstNaive(std::vector<float> scores) {
  const std::vector<double> want = NaiveSoftmax(scores);
  kernels::SoftmaxOfBestFirstScores(scores.data(), static_cast<int>(scores.size()));
  double total = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    INFO("weight " << i << " got " << scores[i] << " want " << want[i]);
    // fp32 exp and sum of at most 32 terms: a few ulp of the weight.
    CHECK(std::abs(scores[i] - want[i]) <= 1e-6 * want[i] + 1e-9);
    total += scores[i];
  }
  CHECK(std::abs(total - 1.0) <= 1e-6);
}

TEST_CASE("retrieval softmax: weights against a double softmax, best score not 1") {
  // A best score far from 1 (and from 0): the old kernel's exp(s_i - 1) for
  // i > 0 was off here by factors of e^(3.25 - 1).
  CheckAgainstNaive({3.25f, 3.0f, 1.5f, -0.75f});
  CheckAgainstNaive({-2.0f, -2.5f, -9.0f});
  // Exact ties keep equal weights.
  std::vector<float> tied = {0.5f, 0.5f, 0.5f};
  kernels::SoftmaxOfBestFirstScores(tied.data(), 3);
  CHECK(tied[0] == tied[1]);
  CHECK(tied[1] == tied[2]);
  CHECK(std::abs(tied[0] - 1.0 / 3) <= 1e-7);
}

TEST_CASE("retrieval softmax: one score, none, and 32 random ones") {
  std::vector<float> one = {7.5f};
  kernels::SoftmaxOfBestFirstScores(one.data(), 1);
  CHECK(one[0] == 1.f);
  std::vector<float> untouched = {4.f};
  kernels::SoftmaxOfBestFirstScores(untouched.data(), 0);
  CHECK(untouched[0] == 4.f);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(2.f, 3.f);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> s(1 + trial % 32);
    for (float& x : s) x = normal(rng);
    std::sort(s.begin(), s.end(), std::greater<float>());  // best first, as the kernel has them
    CheckAgainstNaive(s);
  }
}

}  // namespace
}  // namespace drt

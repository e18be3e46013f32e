// Steps of several sessions on the CUDA backend (engine/batch_step.h,
// engine/cuda/cuda_step.h): a session's logits and retrievals do not depend
// on which sessions share its step (issue 11, "Invariants"), mirroring
// tests/batch_step_test.cc on the CPU.
//
// The bound, 1e-4 worst-row relative difference against the same session
// run alone, is issue 11's stated target for CUDA fp32, not a measurement:
// these tests were compiled without a GPU and have not run yet. The CUDA
// step executes slice by slice, each session's kernels with the same shapes
// and in the same order as alone, so the difference should in fact be zero
// (cuBLAS gives bitwise equal results for equal shapes on one GPU model);
// each test WARNs the worst difference it saw so that the first GPU run
// records it. bf16 is held to the same bound for the same reason: no
// rounding differs between a session batched and alone.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "engine/batch_step.h"
#include "engine/session.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

constexpr double kBatchTolerance = 1e-4;

// One session twice: `alone` runs each step by itself, `batched` in a step
// with the others. Both hold the same history.
struct Pair {
  std::unique_ptr<Session> alone, batched;
  testing::RetrievalLog alone_log, batched_log;
};

std::unique_ptr<Pair> NewPair(Backend& backend, int64_t history, uint64_t seed) {
  auto pair = std::make_unique<Pair>();
  auto session = Session::Create(backend);
  REQUIRE(session.ok());
  if (history > 0) {
    REQUIRE((*session)->Append(testing::RandomTokens(backend.config(), history, seed)).ok());
  }
  auto fork = (*session)->Fork();
  REQUIRE(fork.ok());
  pair->alone = *std::move(session);
  pair->batched = *std::move(fork);
  testing::Record(pair->alone->backend_session(), pair->alone_log);
  testing::Record(pair->batched->backend_session(), pair->batched_log);
  return pair;
}

// Runs `tokens[i]` on pair i: alone one by one, and batched in one RunStep.
// Returns the worst relative difference over every token's logits.
double StepBothWays(Backend& backend, std::vector<std::unique_ptr<Pair>>& pairs,
                    const std::vector<std::vector<int32_t>>& tokens) {
  const int64_t V = backend.config().vocab_size;
  std::vector<std::vector<float>> alone(pairs.size()), batched(pairs.size());
  std::vector<StepEntry> entries(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    StepEntry single;
    single.session = pairs[i]->alone.get();
    single.tokens = tokens[i];
    single.all_logits = &alone[i];
    REQUIRE(RunStep(backend, {single})[0].ok());
    entries[i].session = pairs[i]->batched.get();
    entries[i].tokens = tokens[i];
    entries[i].all_logits = &batched[i];
  }
  for (const absl::Status& s : RunStep(backend, entries)) REQUIRE(s.ok());
  double worst = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    INFO("session " << i);
    const Pair& p = *pairs[i];
    REQUIRE(alone[i].size() == tokens[i].size() * V);
    worst = std::max(worst, testing::WorstRowRelativeDifference(batched[i], alone[i], V));
    REQUIRE(p.batched->num_tokens() == p.alone->num_tokens());
    REQUIRE(p.batched->backend_session().position() == p.alone->backend_session().position());
    REQUIRE(p.batched->num_chunks() == p.alone->num_chunks());
    REQUIRE(std::equal(p.batched->last_logits().begin(), p.batched->last_logits().end(),
                       batched[i].end() - V));
    // The same selections, chunk for chunk, at every landmark and group.
    testing::CheckIdenticalRetrievals(p.alone_log, p.batched_log, kBatchTolerance);
  }
  return worst;
}

TEST_CASE("cuda: a session's logits do not depend on which sessions share its step",
          "[cuda][batch_step]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 61);
  const int64_t k = config.enc_chunk_size;  // 63 real tokens per chunk
  for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    INFO("precision " << CudaPrecisionName(precision));
    auto backend = MakeCudaBackend(config, weights, testing::PrecisionOptions(precision));
    REQUIRE(backend.ok());
    std::vector<std::unique_ptr<Pair>> pairs;
    pairs.push_back(NewPair(**backend, 0, 1));           // new: a prefill piece over 3 chunks
    pairs.push_back(NewPair(**backend, 5 * k + 3, 2));   // mid-chunk: one decode token
    pairs.push_back(NewPair(**backend, 6 * k, 3));       // on a boundary: one decode token
    pairs.push_back(NewPair(**backend, 30 * k + 62, 4)); // retrieves; its token closes a chunk
    pairs.push_back(NewPair(**backend, 12 * k + 2, 5));  // a prefill piece of 100 tokens
    // Retrieval really chooses among more chunks than top-k for the long one.
    REQUIRE(pairs[3]->alone->num_chunks() > config.chunk_topk);

    const std::vector<std::vector<int32_t>> first = {
        testing::RandomTokens(config, 150, 11), testing::RandomTokens(config, 1, 12),
        testing::RandomTokens(config, 1, 13), testing::RandomTokens(config, 1, 14),
        testing::RandomTokens(config, 100, 15)};
    const double worst_first = StepBothWays(**backend, pairs, first);
    // Then decode tokens of all of them together, across the long one's
    // next chunk boundary: the state the batch left is the state each would
    // have alone.
    double worst_decode = 0;
    for (int step = 0; step < 9; ++step) {
      std::vector<std::vector<int32_t>> next;
      for (size_t i = 0; i < pairs.size(); ++i) {
        next.push_back(testing::RandomTokens(config, 1, 100 + step * 10 + i));
      }
      worst_decode = std::max(worst_decode, StepBothWays(**backend, pairs, next));
    }
    WARN("cuda " << CudaPrecisionName(precision)
                 << " batched vs alone, worst relative difference: mixed step " << worst_first
                 << ", decode steps " << worst_decode);
    CHECK(worst_first <= kBatchTolerance);
    CHECK(worst_decode <= kBatchTolerance);
  }
}

TEST_CASE("cuda: a step holding more than the step size runs as several forwards, same results",
          "[cuda][batch_step]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 62);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kFp32);
  options.max_step_positions = 128;  // two chunks
  auto backend = MakeCudaBackend(config, weights, options);
  REQUIRE(backend.ok());
  REQUIRE((*backend)->max_step_positions() == 128);
  std::vector<std::unique_ptr<Pair>> pairs;
  pairs.push_back(NewPair(**backend, 40, 1));
  pairs.push_back(NewPair(**backend, 4 * 63 + 10, 2));
  pairs.push_back(NewPair(**backend, 0, 3));
  // 300 + 1 + 90 tokens: the entries do not fit one forward of 128 positions.
  const std::vector<std::vector<int32_t>> tokens = {testing::RandomTokens(config, 300, 21),
                                                    testing::RandomTokens(config, 1, 22),
                                                    testing::RandomTokens(config, 90, 23)};
  const double worst = StepBothWays(**backend, pairs, tokens);
  WARN("cuda fp32 several forwards, worst relative difference " << worst);
  CHECK(worst <= kBatchTolerance);
}

TEST_CASE("cuda: a batched step agrees with the cpu backend's", "[cuda][batch_step]") {
  if (!testing::HaveGpu()) return;
  // The same mixed step on both backends, fp32: issue 9's parity bound
  // (1e-4, the CPU backend's own bound against the float64 reference).
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 63);
  auto cuda_backend =
      MakeCudaBackend(config, weights, testing::PrecisionOptions(CudaPrecision::kFp32));
  REQUIRE(cuda_backend.ok());
  auto cpu_backend = MakeCpuBackend(config, weights);
  const std::vector<int64_t> histories = {0, 7 * 63 + 62, 3 * 63 + 20};
  const std::vector<std::vector<int32_t>> tokens = {testing::RandomTokens(config, 130, 31),
                                                    testing::RandomTokens(config, 1, 32),
                                                    testing::RandomTokens(config, 50, 33)};
  std::vector<std::vector<float>> logits[2];
  for (int b = 0; b < 2; ++b) {
    Backend& backend = b == 0 ? **cuda_backend : *cpu_backend;
    std::vector<std::unique_ptr<Session>> sessions;
    std::vector<StepEntry> entries(histories.size());
    logits[b].resize(histories.size());
    for (size_t i = 0; i < histories.size(); ++i) {
      auto session = Session::Create(backend);
      REQUIRE(session.ok());
      if (histories[i] > 0) {
        REQUIRE((*session)->Append(testing::RandomTokens(config, histories[i], 40 + i)).ok());
      }
      sessions.push_back(*std::move(session));
      entries[i] = {sessions[i].get(), tokens[i], false, &logits[b][i]};
    }
    for (const absl::Status& s : RunStep(backend, entries)) REQUIRE(s.ok());
  }
  double worst = 0;
  for (size_t i = 0; i < histories.size(); ++i) {
    worst = std::max(worst, testing::WorstRowRelativeDifference(logits[0][i], logits[1][i],
                                                                config.vocab_size));
  }
  WARN("cuda fp32 batched vs cpu batched, worst relative difference " << worst);
  CHECK(worst <= kBatchTolerance);
}

}  // namespace
}  // namespace drt

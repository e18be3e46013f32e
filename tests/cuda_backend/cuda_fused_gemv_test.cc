// The fused decode GEMVs in the decode step (CudaBackendOptions::
// decode_fused_gemv; kernels/decode_gemv.h, engine/cuda/fused_decode_ops.h)
// on every fixture model: a prompt, then 16 greedy tokens generated one at a
// time (crossing a chunk boundary, so one step has the token and its
// landmark: two rows), with the option on against off and against the CPU
// backend fed the same tokens.
//
// Bounds:
// - fp32: the fused path changes only the order of each GEMV's sum (the
//   normed inputs are LaunchRmsNorm's bits, tests/cuda/decode_gemv_test.cc),
//   the kind of difference the fixture parity tests hold the unfused CUDA
//   path to against the CPU: worst-row relative logit difference <= 1e-4
//   (kFp32VsCpuLimit, fixture_parity_test.cc). So the fused path is held to
//   1e-4 against the CPU, and on against off to 2e-4 (both within 1e-4 of
//   the CPU: the triangle inequality), and the selections identical. The
//   logits are compared along one sequence: the on run is fed the off
//   run's greedy tokens (a near-tie between two logits could let the free
//   runs' argmaxes part by a difference well inside the bound); whether
//   the free-running on path chose the same tokens is reported, not
//   required.
// - bf16: the rounding of each value to bf16 is the same as unfused, but a
//   changed summation order can move a rounded value by one bf16 step and
//   the change travels through the layers: the bound of two bf16
//   implementations against each other's reference (0.274 worst row on the
//   H100, fixture_parity_test.cc kBf16WorstRow), against the CPU; the
//   off path's figure is WARNed beside it.
// - With decode graphs the captured kernels are the same launches with the
//   same arguments: bit for bit the eager fused path.
// - That the option reached the engine: BackendSessionStats::
//   fused_gemv_launches is 0 off and at least 4 per decoder layer per
//   generated token on (each one-token step, or token + landmark, has at
//   most 8 rows; every layer runs the fused QKV and O, gate/up and down;
//   upper layers the GCA query and output too).
// Written without a GPU: NOT YET RUN ON ONE.
#include <algorithm>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "engine/model_dir.h"
#include "engine/session.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/fixture_dirs.h"
#include "tests/test_util/golden.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

constexpr int kGenerated = 16;
constexpr double kFp32Limit = testing::kFp32VsCpuLimit;
constexpr double kFp32OnVsOffLimit = 2 * testing::kFp32VsCpuLimit;
constexpr double kBf16WorstRow = 0.2745;

struct GreedyRun {
  std::vector<float> logits;  // every row: the prompt's, then one per generated token
  std::vector<int32_t> generated;
  testing::RetrievalLog log;
  BackendSessionStats stats;
};

// The prompt at once, then kGenerated tokens one at a time: each the argmax
// of the previous logits, or forced[i] when given (the CPU fed the tokens
// another run chose).
GreedyRun PromptAndGreedy(Backend& backend, absl::Span<const int32_t> prompt, int64_t vocab,
                          const std::vector<int32_t>* forced = nullptr) {
  GreedyRun run;
  auto session = Session::Create(backend);
  REQUIRE(session.ok());
  testing::Record((*session)->backend_session(), run.log);
  AppendOptions all;
  all.all_logits = true;
  auto prefill = (*session)->Append(prompt, all);
  REQUIRE(prefill.ok());
  run.logits = prefill->logits;
  for (int i = 0; i < kGenerated; ++i) {
    const float* last = run.logits.data() + run.logits.size() - vocab;
    const int32_t next = forced != nullptr
                             ? (*forced)[i]
                             : static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    run.generated.push_back(next);
    auto result = (*session)->Append(absl::MakeConstSpan(&run.generated.back(), 1), all);
    REQUIRE(result.ok());
    run.logits.insert(run.logits.end(), result->logits.begin(), result->logits.end());
  }
  run.stats = (*session)->backend_session().stats();
  return run;
}

// The fixture's golden tokens cut to 63 q + 55 (q as large as fits): the
// 16 generated tokens' 9th closes a chunk (63 real tokens per chunk in the
// fixtures), so its step has two rows, the token and the landmark.
std::vector<int32_t> PromptOf(const testing::Golden& golden, int64_t chunk) {
  const int64_t n = static_cast<int64_t>(golden.tokens.size());
  REQUIRE(n >= chunk + 55);
  const int64_t length = (n - 55) / chunk * chunk + 55;
  return std::vector<int32_t>(golden.tokens.begin(), golden.tokens.begin() + length);
}

// The selections made at the landmarks of chunks before `chunks`.
testing::RetrievalLog ChunksBefore(const testing::RetrievalLog& log, int64_t chunks) {
  testing::RetrievalLog out;
  for (const auto& [key, r] : log) {
    if (key.first < chunks) out[key] = r;
  }
  return out;
}

// The fewest fused decode GEMV launches of kGenerated eager decode steps
// with the option on: 4 in every decoder layer (QKV, O, gate/up, down).
int64_t MinFusedLaunches(const ModelConfig& config) {
  return kGenerated * 4 * (config.num_lower_layers() + config.num_upper_layers());
}

CudaBackendOptions Options(CudaPrecision precision, bool fused) {
  CudaBackendOptions options = testing::PrecisionOptions(precision);
  options.decode_fused_gemv = fused;
  return options;
}

TEST_CASE("cuda fused decode gemv: fixtures, prompt + 16 greedy tokens, on vs off vs the cpu",
          "[cuda][decode_fused_gemv]") {
  if (!testing::HaveGpu()) return;
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  for (const std::string& dir : dirs) {
    INFO("fixture " << dir);
    auto model = LoadModelDir(dir);
    REQUIRE(model.ok());
    const ModelConfig& config = model->config;
    REQUIRE(config.enc_chunk_size == 63);
    const int64_t V = config.vocab_size;
    const std::vector<int32_t> prompt =
        PromptOf(testing::LoadGolden(dir + "/golden.safetensors"), config.enc_chunk_size);
    auto cpu = MakeCpuBackend(config, model->weights);
    for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
      INFO("precision " << CudaPrecisionName(precision));
      auto off_backend = MakeCudaBackend(config, model->weights, Options(precision, false));
      auto on_backend = MakeCudaBackend(config, model->weights, Options(precision, true));
      REQUIRE(off_backend.ok());
      REQUIRE(on_backend.ok());
      const GreedyRun off = PromptAndGreedy(**off_backend, prompt, V);
      const GreedyRun on = PromptAndGreedy(**on_backend, prompt, V);
      const GreedyRun cpu_off = PromptAndGreedy(*cpu, prompt, V, &off.generated);
      REQUIRE(on.logits.size() == (prompt.size() + kGenerated) * V);
      const double off_vs_cpu = testing::WorstRowRelativeDifference(off.logits, cpu_off.logits, V);
      CHECK(off.stats.fused_gemv_launches == 0);
      CHECK(on.stats.fused_gemv_launches >= MinFusedLaunches(config));
      if (precision == CudaPrecision::kFp32) {
        // Along the off run's tokens: the same sequence on both sides.
        const GreedyRun forced = PromptAndGreedy(**on_backend, prompt, V, &off.generated);
        CHECK(forced.stats.fused_gemv_launches >= MinFusedLaunches(config));
        REQUIRE(forced.logits.size() == off.logits.size());
        const double on_vs_off = testing::WorstRowRelativeDifference(forced.logits, off.logits, V);
        const double on_vs_cpu =
            testing::WorstRowRelativeDifference(forced.logits, cpu_off.logits, V);
        WARN(dir << " fp32 decode_fused_gemv (fed the off run's tokens): worst row on vs off "
                 << on_vs_off << ", on vs cpu " << on_vs_cpu << ", off vs cpu " << off_vs_cpu
                 << "; free-running greedy tokens "
                 << (on.generated == off.generated ? "equal" : "differ") << " on vs off");
        CHECK(on_vs_off <= kFp32OnVsOffLimit);
        CHECK(on_vs_cpu <= kFp32Limit);
        testing::CheckIdenticalRetrievals(cpu_off.log, forced.log, kFp32Limit);
      } else {
        const GreedyRun cpu_on = PromptAndGreedy(*cpu, prompt, V, &on.generated);
        const double on_vs_cpu = testing::WorstRowRelativeDifference(on.logits, cpu_on.logits, V);
        WARN(dir << " bf16 decode_fused_gemv: worst row on vs cpu " << on_vs_cpu
                 << " (off vs cpu " << off_vs_cpu << "); greedy tokens "
                 << (on.generated == off.generated ? "equal" : "differ") << " on vs off");
        CHECK(on_vs_cpu <= kBf16WorstRow);
        // Selections: tie-tolerant between the two bf16 runs (as
        // cuda_batch_step_test.cc). When the greedy tokens part, the chunk
        // closed while generating holds different tokens: only the
        // prompt's chunks are compared then.
        const int64_t prompt_chunks = static_cast<int64_t>(prompt.size()) / config.enc_chunk_size;
        if (on.generated == off.generated) {
          testing::CompareRetrievals(off.log, on.log);
        } else {
          testing::CompareRetrievals(ChunksBefore(off.log, prompt_chunks),
                                     ChunksBefore(on.log, prompt_chunks));
        }
      }
    }
  }
}

TEST_CASE("cuda fused decode gemv: decode graphs replay the eager fused path bit for bit",
          "[cuda][decode_fused_gemv][decode_graphs]") {
  if (!testing::HaveGpu()) return;
  const std::string dir = testing::GoldenFixtureDirs().front();
  INFO("fixture " << dir);
  auto model = LoadModelDir(dir);
  REQUIRE(model.ok());
  const ModelConfig& config = model->config;
  const int64_t V = config.vocab_size;
  const std::vector<int32_t> prompt =
      PromptOf(testing::LoadGolden(dir + "/golden.safetensors"), config.enc_chunk_size);
  for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    INFO("precision " << CudaPrecisionName(precision));
    CudaBackendOptions options = Options(precision, true);
    auto eager_backend = MakeCudaBackend(config, model->weights, options);
    options.decode_graphs = true;
    auto graph_backend = MakeCudaBackend(config, model->weights, options);
    REQUIRE(eager_backend.ok());
    REQUIRE(graph_backend.ok());
    const GreedyRun eager = PromptAndGreedy(**eager_backend, prompt, V);
    const GreedyRun graphs = PromptAndGreedy(**graph_backend, prompt, V);
    CHECK(graphs.generated == eager.generated);
    CHECK(graphs.logits == eager.logits);
    CHECK(graphs.stats.graph_capture_failures == 0);
    // The eager run counts every launch; the graph run the warm-up step's
    // and the capture's (replays add none), fewer but not none.
    CHECK(eager.stats.fused_gemv_launches >= MinFusedLaunches(config));
    CHECK(graphs.stats.fused_gemv_launches > 0);
    CHECK(graphs.stats.fused_gemv_launches < eager.stats.fused_gemv_launches);
    // 16 one-row steps, one of which brings a landmark (eager): the first
    // eligible step is the warm-up, so at least 13 replays.
    CHECK(graphs.stats.graph_replays >= kGenerated - 3);
  }
}

TEST_CASE("cuda fused decode gemv: a model the kernels cannot take is refused at creation",
          "[cuda][decode_fused_gemv]") {
  if (!testing::HaveGpu()) return;
  ModelConfig config = testing::Chunk64Config();
  config.intermediate_size = 132;  // the down projection's k: not a multiple of 8
  const ModelWeights weights = testing::RandomWeights(config, 3);
  CudaBackendOptions options = Options(CudaPrecision::kFp32, true);
  auto refused = MakeCudaBackend(config, weights, options);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(refused.status().message());
  INFO(message);
  CHECK(message.find("decode_fused_gemv cannot run this model") != std::string::npos);
  CHECK(message.find("k=132") != std::string::npos);
  // The same model without the option is fine.
  options.decode_fused_gemv = false;
  CHECK(MakeCudaBackend(config, weights, options).ok());
}

}  // namespace
}  // namespace drt

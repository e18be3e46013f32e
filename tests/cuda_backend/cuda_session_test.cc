// The CUDA backend on its own terms: prefill vs token-by-token decode, small
// step sizes (many copies into the slot buffers), fork, counters, bad input.
#include <algorithm>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"

#include "engine/backend_factory.h"
#include "engine/session.h"
#include "engine/step_plan.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

using testing::Chunk64Config;

std::vector<float> AppendAll(Session& s, absl::Span<const int32_t> tokens, size_t piece) {
  AppendOptions options;
  options.all_logits = true;
  std::vector<float> logits;
  for (size_t done = 0; done < tokens.size();) {
    const size_t n = std::min(piece, tokens.size() - done);
    auto result = s.Append(tokens.subspan(done, n), options);
    REQUIRE(result.ok());
    logits.insert(logits.end(), result->logits.begin(), result->logits.end());
    done += n;
  }
  return logits;
}

// Limits per precision. fp32: issue 9's bound for the CUDA backend against
// the CPU backend (the same arithmetic up to summation order). bf16: CUDA
// prefill vs CUDA token-by-token decode measured 0.008 on an H100 (issue 9);
// bf16 against the CPU is held to the bf16 reference's own error on the
// golden fixtures instead (fixture_parity_test.cc).
struct PrecisionCase {
  CudaPrecision precision;
  double limit;          // worst-row relative logit difference
  size_t element_bytes;  // of the chunk store's K/V
};
constexpr PrecisionCase kFp32Case{CudaPrecision::kFp32, testing::kFp32VsCpuLimit, 4};
constexpr PrecisionCase kBf16Case{CudaPrecision::kBf16, 2e-2, 2};

TEST_CASE("cuda: prefill, pieces and token-by-token decode agree", "[cuda]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 11);
  const auto tokens = testing::RandomTokens(config, 25 * 63 + 17, 12);
  const int64_t V = config.vocab_size;
  // The CPU backend on the same tokens: the reference of the fp32 runs.
  auto cpu_backend = MakeCpuBackend(config, weights);
  auto cpu = Session::Create(*cpu_backend);
  REQUIRE(cpu.ok());
  testing::RetrievalLog cpu_log;
  testing::Record((*cpu)->backend_session(), cpu_log);
  const auto reference = AppendAll(**cpu, tokens, 300);
  for (const PrecisionCase& pc : {kFp32Case, kBf16Case}) {
    for (int64_t step_size : {1024, 128, 64}) {
      INFO("precision " << CudaPrecisionName(pc.precision) << " max_step_positions "
                        << step_size);
      CudaBackendOptions options = testing::PrecisionOptions(pc.precision);
      options.max_step_positions = step_size;
      auto backend = MakeCudaBackend(config, weights, options);
      REQUIRE(backend.ok());
      auto prefill = Session::Create(**backend);
      auto decode = Session::Create(**backend);
      REQUIRE(prefill.ok());
      REQUIRE(decode.ok());
      testing::RetrievalLog prefill_log, decode_log;
      testing::Record((*prefill)->backend_session(), prefill_log);
      testing::Record((*decode)->backend_session(), decode_log);
      const auto whole = AppendAll(**prefill, tokens, tokens.size());
      const auto single = AppendAll(**decode, tokens, 1);
      const double worst = testing::WorstRowRelativeDifference(whole, single, V);
      INFO("worst relative difference, prefill vs decode " << worst);
      CHECK(worst <= pc.limit);
      if (pc.precision == CudaPrecision::kFp32) {
        // Scores agree to fp32 rounding: only chunks within 1e-3 of the
        // k-th score may trade places.
        testing::CompareRetrievals(prefill_log, decode_log, 1e-3, pc.limit);
        const double cpu_worst =
            std::max(testing::WorstRowRelativeDifference(whole, reference, V),
                     testing::WorstRowRelativeDifference(single, reference, V));
        INFO("worst relative difference against the cpu backend " << cpu_worst);
        CHECK(cpu_worst <= pc.limit);
        testing::CompareRetrievals(cpu_log, prefill_log, 1e-3, pc.limit);
        testing::CompareRetrievals(cpu_log, decode_log, 1e-3, pc.limit);
      } else {
        testing::CompareRetrievals(prefill_log, decode_log);
      }

      const BackendSessionStats stats = (*decode)->backend_session().stats();
      const size_t block = 64 * config.hidden_size * pc.element_bytes;  // K or V of a chunk
      CHECK(stats.d2h_bytes == static_cast<int64_t>(25 * 2 * block));
      CHECK(stats.h2d_chunks + stats.d2d_chunks > 0);
      CHECK(stats.h2d_bytes == static_cast<int64_t>(stats.h2d_chunks * 2 * block));
      CHECK(stats.resident_hits > 0);  // decode reuses the selection within a chunk
      const SessionMemory memory = (*decode)->backend_session().memory();
      CHECK(memory.device_bytes > 0);
      CHECK(memory.chunk_store_bytes >= 25 * 2 * block);
      CHECK(memory.window_bytes == 0);  // on the device, in device_bytes
    }
  }
}

TEST_CASE("cuda: a fork continues like the original and shares the chunk store", "[cuda]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 21);
  const auto prefix = testing::RandomTokens(config, 9 * 63 + 20, 22);
  const auto tail_a = testing::RandomTokens(config, 3 * 63 + 5, 23);
  const auto tail_b = testing::RandomTokens(config, 2 * 63 + 40, 24);
  const auto more = testing::RandomTokens(config, 70, 25);
  const int64_t V = config.vocab_size;
  for (const PrecisionCase& pc : {kFp32Case, kBf16Case}) {
    INFO("precision " << CudaPrecisionName(pc.precision));
    auto backend = MakeCudaBackend(config, weights, testing::PrecisionOptions(pc.precision));
    REQUIRE(backend.ok());
    auto original = Session::Create(**backend);
    REQUIRE(original.ok());
    AppendAll(**original, prefix, 100);
    auto fork = (*original)->Fork();
    REQUIRE(fork.ok());
    CHECK((*fork)->backend_session().memory().shared_bytes > 0);
    CHECK((*fork)->backend_session().position() == (*original)->backend_session().position());
    CHECK((*fork)->backend_session().stats().d2h_bytes == 0);  // a fork starts at zero

    // The two sessions go different ways, interleaved piece by piece (any
    // device buffer or store record they wrongly shared would mix them up);
    // each must match a fresh session fed its whole sequence.
    std::vector<float> a, b;
    for (size_t done_a = 0, done_b = 0; done_a < tail_a.size() || done_b < tail_b.size();) {
      if (done_a < tail_a.size()) {
        const size_t n = std::min<size_t>(7, tail_a.size() - done_a);
        const auto got = AppendAll(**original, absl::MakeConstSpan(tail_a).subspan(done_a, n), n);
        a.insert(a.end(), got.begin(), got.end());
        done_a += n;
      }
      if (done_b < tail_b.size()) {
        const auto got = AppendAll(**fork, absl::MakeConstSpan(tail_b).subspan(done_b, 1), 1);
        b.insert(b.end(), got.begin(), got.end());
        done_b += 1;
      }
    }
    // The original still works after its fork is gone.
    fork->reset();
    const auto after = AppendAll(**original, more, 70);
    a.insert(a.end(), after.begin(), after.end());

    std::vector<int32_t> all_a = prefix, all_b = prefix;
    all_a.insert(all_a.end(), tail_a.begin(), tail_a.end());
    all_a.insert(all_a.end(), more.begin(), more.end());
    all_b.insert(all_b.end(), tail_b.begin(), tail_b.end());
    auto cpu_backend = MakeCpuBackend(config, weights);
    for (const auto& [all, got] : {std::pair{all_a, a}, std::pair{all_b, b}}) {
      auto fresh = Session::Create(**backend);
      REQUIRE(fresh.ok());
      const auto expected = AppendAll(**fresh, all, all.size());
      const std::vector<float> expected_tail(expected.end() - got.size(), expected.end());
      // Like prefill vs decode: the same backend fed differently.
      CHECK(testing::WorstRowRelativeDifference(got, expected_tail, V) <= pc.limit);
      if (pc.precision != CudaPrecision::kFp32) continue;
      auto cpu = Session::Create(*cpu_backend);
      REQUIRE(cpu.ok());
      const auto reference = AppendAll(**cpu, all, all.size());
      const std::vector<float> reference_tail(reference.end() - got.size(), reference.end());
      CHECK(testing::WorstRowRelativeDifference(got, reference_tail, V) <= pc.limit);
    }
  }
}

// Runs `plan` on `sessions` through the backend and returns its status.
absl::Status RunPlan(Backend& backend, const StepPlan& plan,
                     std::vector<BackendSession*> sessions) {
  std::vector<float> logits(plan.logit_rows.size() * backend.config().vocab_size);
  return backend.Step(plan, sessions, absl::MakeSpan(logits));
}

StepPlan PlanFor(const ModelConfig& config, const BackendSession& session, int64_t num_tokens,
                 const std::vector<int32_t>& tokens) {
  SliceRequest request;
  request.position = session.position();
  request.num_tokens = num_tokens;
  request.tokens = tokens;
  auto plan = PlanStep(config, {request});
  REQUIRE(plan.ok());
  return *std::move(plan);
}

TEST_CASE("cuda: bad input is refused and leaves the session usable", "[cuda]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 31);
  CudaBackendOptions options;
  options.max_step_positions = 128;
  auto backend = MakeCudaBackend(config, weights, options);
  REQUIRE(backend.ok());
  auto session = Session::Create(**backend);
  REQUIRE(session.ok());
  BackendSession& state = (*session)->backend_session();

  // Ids a client may not send: refused by the step's token check.
  const std::vector<std::vector<int32_t>> bad_tokens = {
      {static_cast<int32_t>(config.vocab_size)}, {5, -1}, {static_cast<int32_t>(config.chunk_id)}};
  for (const auto& tokens : bad_tokens) {
    CHECK((*session)->Append(tokens).status().code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(state.position() == 0);

  // Plans the backend refuses before any state changes (Backend::CheckStep,
  // CudaSession::PrepareSlice).
  const std::vector<int32_t> one = {5};
  const std::vector<int32_t> chunk = testing::RandomTokens(config, 63, 32);
  StepPlan landmark_moved = PlanFor(config, state, 0, chunk);
  REQUIRE(landmark_moved.ids.size() == 64);
  std::swap(landmark_moved.ids[62], landmark_moved.ids[63]);  // a token in the landmark's slot
  CHECK(RunPlan(**backend, landmark_moved, {&state}).code() == absl::StatusCode::kInvalidArgument);
  SliceRequest ahead;
  ahead.position = 64;  // the session is at 0
  ahead.num_tokens = 63;
  ahead.tokens = one;
  auto ahead_plan = PlanStep(config, {ahead});
  REQUIRE(ahead_plan.ok());
  CHECK(RunPlan(**backend, *ahead_plan, {&state}).code() == absl::StatusCode::kInvalidArgument);
  const StepPlan single = PlanFor(config, state, 0, one);
  CHECK(RunPlan(**backend, single, {}).code() == absl::StatusCode::kInvalidArgument);
  SliceRequest start;
  start.tokens = one;
  auto twice = PlanStep(config, {start, start});  // one session in two slices
  REQUIRE(twice.ok());
  CHECK(RunPlan(**backend, *twice, {&state, &state}).code() == absl::StatusCode::kInvalidArgument);
  const StepPlan too_long = PlanFor(config, state, 0, testing::RandomTokens(config, 130, 33));
  CHECK(RunPlan(**backend, too_long, {&state}).code() == absl::StatusCode::kInvalidArgument);
  StepPlan no_landmarks = PlanFor(config, state, 0, chunk);
  no_landmarks.slices[0].landmarks.clear();  // the device buffers follow the plan: refused
  CHECK(RunPlan(**backend, no_landmarks, {&state}).code() == absl::StatusCode::kInvalidArgument);
  auto cpu_backend = MakeCpuBackend(config, weights);
  auto cpu_session = cpu_backend->NewSession();
  REQUIRE(cpu_session.ok());
  CHECK(RunPlan(**backend, single, {cpu_session->get()}).code() ==
        absl::StatusCode::kInvalidArgument);
  // A logits buffer of the wrong size: refused up front, so the session is
  // not marked failed (the appends below would answer FAILED_PRECONDITION).
  std::vector<float> short_logits(config.vocab_size - 1);
  BackendSession* just_this[] = {&state};
  CHECK((*backend)->Step(single, just_this, absl::MakeSpan(short_logits)).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(state.position() == 0);
  CHECK((*session)->num_tokens() == 0);

  // Still usable: a token, then the rest of the chunk closes it.
  REQUIRE((*session)->Append(one).ok());
  CHECK(state.position() == 1);
  REQUIRE((*session)->Append(std::vector<int32_t>(62, 7)).ok());
  CHECK(state.num_chunks() == 1);
  // (The 2^20-chunk limit, OUT_OF_RANGE from PrepareSlice, needs 64M
  // positions of real work to reach and is not tested.)
}

TEST_CASE("cuda: a config or option the kernels do not support is refused", "[cuda]") {
  // Checked before any device is touched: runs without a GPU too.
  const ModelWeights tiny_weights = testing::RandomWeights(testing::TinyConfig(), 41);
  auto backend = MakeCudaBackend(testing::TinyConfig(), tiny_weights, CudaBackendOptions{});
  CHECK(backend.status().code() == absl::StatusCode::kInvalidArgument);  // 8-position chunks
  const ModelConfig config = Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 42);
  for (int64_t step_size : {int64_t{0}, int64_t{1} << 17}) {
    CudaBackendOptions options;
    options.max_step_positions = step_size;
    CHECK(MakeCudaBackend(config, weights, options).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  ModelConfig wide_topk = config;
  wide_topk.chunk_topk = 33;
  CHECK(MakeCudaBackend(wide_topk, weights, CudaBackendOptions{}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  for (int splits : {-1, 3, 16}) {
    CudaBackendOptions options;
    options.window_decode_splits = splits;
    const absl::Status status = MakeCudaBackend(config, weights, options).status();
    INFO(status.message());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(status.message(), "window_decode_splits"));
  }
  // Pinned slabs of no chunk (review of the CUDA host side, finding 8:
  // they were raised to 16 silently).
  for (int64_t slab_chunks : {int64_t{0}, int64_t{-1}}) {
    CudaBackendOptions options;
    options.max_slab_chunks = slab_chunks;
    const absl::Status status = MakeCudaBackend(config, weights, options).status();
    INFO(status.message());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(status.message(), "max_slab_chunks"));
  }
}

// The split decode kernel (CudaBackendOptions::window_decode_splits) in the
// whole model: token-by-token decode and 5-position pieces (both take the
// few-row window kernel) hold the fp32 bound against the cpu backend, as the
// default kernel does in the first test case.
TEST_CASE("cuda: the split window decode kernel decodes like the cpu backend", "[cuda]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();  // head_dim 16, window 100
  const ModelWeights weights = testing::RandomWeights(config, 61);
  const auto tokens = testing::RandomTokens(config, 4 * 63 + 20, 62);
  const int64_t V = config.vocab_size;
  auto cpu_backend = MakeCpuBackend(config, weights);
  auto cpu = Session::Create(*cpu_backend);
  REQUIRE(cpu.ok());
  testing::RetrievalLog cpu_log;
  testing::Record((*cpu)->backend_session(), cpu_log);
  const auto reference = AppendAll(**cpu, tokens, tokens.size());
  int major = 0;
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  std::vector<int> splits_list = {1};
  if (major >= 9) {
    splits_list.insert(splits_list.end(), {2, 8});
  } else {
    WARN("compute capability " << major << ".x: window_decode_splits 2 and 8 not tested");
  }
  for (int splits : splits_list) {
    for (size_t piece : {size_t{1}, size_t{5}}) {
      INFO("window_decode_splits " << splits << ", pieces of " << piece);
      CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kFp32);
      options.window_decode_splits = splits;
      auto backend = MakeCudaBackend(config, weights, options);
      REQUIRE(backend.ok());
      auto session = Session::Create(**backend);
      REQUIRE(session.ok());
      testing::RetrievalLog log;
      testing::Record((*session)->backend_session(), log);
      const auto logits = AppendAll(**session, tokens, piece);
      const double worst = testing::WorstRowRelativeDifference(logits, reference, V);
      INFO("worst relative difference against the cpu backend " << worst);
      CHECK(worst <= kFp32Case.limit);
      testing::CompareRetrievals(cpu_log, log, 1e-3, kFp32Case.limit);
    }
  }
}

// The tensor-core prefill kernels, window attention and GCA
// (CudaBackendOptions::prefill_tensor_cores, bf16 only), in the whole model:
// whole-prompt prefill and 100-position pieces (both take them;
// token-by-token decode takes the row kernels) against token-by-token decode,
// and against prefill with the option off. Limit: kBf16Case's
// prefill-vs-decode bound (2e-2; the default kernels measured 0.008 on an
// H100). The option changes only how the prefill kernels round (they also
// round softmax probabilities to bf16, each by at most 2^-8 relative; the
// kernels alone: 0.24-0.49%, tests/cuda/mma_prefill_rounding.py), well
// inside that bound; the figures are printed because they have not been seen
// on a GPU yet.
TEST_CASE("cuda: the tensor-core prefill kernels agree with decode", "[cuda]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();  // head_dim 16, window 100
  const ModelWeights weights = testing::RandomWeights(config, 71);
  const auto tokens = testing::RandomTokens(config, 12 * 63 + 30, 72);
  const int64_t V = config.vocab_size;
  CudaBackendOptions off_options = testing::PrecisionOptions(CudaPrecision::kBf16);
  CudaBackendOptions on_options = off_options;
  on_options.prefill_tensor_cores = true;
  auto off_backend = MakeCudaBackend(config, weights, off_options);
  auto on_backend = MakeCudaBackend(config, weights, on_options);
  REQUIRE(off_backend.ok());
  REQUIRE(on_backend.ok());
  auto decode = Session::Create(**on_backend);
  auto off_prefill = Session::Create(**off_backend);
  REQUIRE(decode.ok());
  REQUIRE(off_prefill.ok());
  testing::RetrievalLog decode_log;
  testing::Record((*decode)->backend_session(), decode_log);
  const auto single = AppendAll(**decode, tokens, 1);
  const auto off_whole = AppendAll(**off_prefill, tokens, tokens.size());
  for (size_t piece : {tokens.size(), size_t{100}}) {
    INFO("pieces of " << piece);
    auto prefill = Session::Create(**on_backend);
    REQUIRE(prefill.ok());
    testing::RetrievalLog prefill_log;
    testing::Record((*prefill)->backend_session(), prefill_log);
    const auto on = AppendAll(**prefill, tokens, piece);
    const double vs_decode = testing::WorstRowRelativeDifference(on, single, V);
    const double vs_off = testing::WorstRowRelativeDifference(on, off_whole, V);
    WARN("tensor-core prefill, pieces of " << piece << ": worst row vs decode " << vs_decode
                                           << ", vs the default prefill kernel " << vs_off);
    CHECK(vs_decode <= kBf16Case.limit);
    CHECK(vs_off <= kBf16Case.limit);
    CHECK(vs_off > 0);  // the option reached the kernels (their rounding differs)
    testing::CompareRetrievals(prefill_log, decode_log);
  }
}

TEST_CASE("cuda: disable_gca runs the base LM without retrieval", "[cuda]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 51);
  const auto tokens = testing::RandomTokens(config, 5 * 63, 52);
  const int64_t V = config.vocab_size;
  // fp32, so that "equal" and "different" are told apart at 1e-4.
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kFp32);
  options.disable_gca = true;
  auto backend = MakeCudaBackend(config, weights, options);
  REQUIRE(backend.ok());
  auto session = Session::Create(**backend);
  REQUIRE(session.ok());
  testing::RetrievalLog log;
  testing::Record((*session)->backend_session(), log);
  const auto logits = AppendAll(**session, tokens, 100);
  CHECK(logits.size() == tokens.size() * config.vocab_size);
  CHECK(log.empty());
  const BackendSessionStats stats = (*session)->backend_session().stats();
  CHECK(stats.h2d_bytes == 0);
  CHECK(stats.d2h_bytes == 0);
  CHECK((*session)->backend_session().memory().chunk_store_bytes == 0);

  // Chunks 0 and 1 have no retrieval, so there the base LM is the model
  // (GCA output zero: h = r + MLP(RMSNorm2(r))); from chunk 2 on GCA must
  // change the logits by more than the fp32 parity tolerance, else the
  // parity tests could not tell a working GCA from none.
  auto cpu_backend = MakeCpuBackend(config, weights);
  auto cpu = Session::Create(*cpu_backend);
  REQUIRE(cpu.ok());
  const auto reference = AppendAll(**cpu, tokens, tokens.size());
  const size_t early = 2 * 63 * V;
  const double early_worst = testing::WorstRowRelativeDifference(
      std::vector<float>(logits.begin(), logits.begin() + early),
      std::vector<float>(reference.begin(), reference.begin() + early), V);
  const double late_worst = testing::WorstRowRelativeDifference(
      std::vector<float>(logits.begin() + early, logits.end()),
      std::vector<float>(reference.begin() + early, reference.end()), V);
  INFO("chunks 0-1: " << early_worst << ", chunks 2-4: " << late_worst);
  CHECK(early_worst <= kFp32Case.limit);
  CHECK(late_worst > kFp32Case.limit);
}

}  // namespace
}  // namespace drt

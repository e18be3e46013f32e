// Backend::CheckStep, the guard every backend's Step makes before any state
// changes (engine/backend.h), exercised through the CPU backend: each bad
// plan is refused with INVALID_ARGUMENT naming the problem, and the session
// then computes exactly what a fresh one computes. The step size, a stale
// position, a request named twice and the logits buffer are
// tests/batch_step_test.cc's; here one session in two requests and ids that
// put a token in a landmark's slot. The CUDA backend makes the same checks
// (tests/cuda_backend/cuda_session_test.cc, GPU only).
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/session.h"
#include "engine/step_plan.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

StepPlan Plan(const ModelConfig& config, const std::vector<SliceRequest>& requests) {
  auto plan = PlanStep(config, requests);
  REQUIRE(plan.ok());
  return *std::move(plan);
}

SliceRequest At(int64_t num_tokens, const ModelConfig& config,
                const std::vector<int32_t>& tokens) {
  SliceRequest request;
  request.num_tokens = num_tokens;
  request.position = num_tokens + num_tokens / config.enc_chunk_size;
  request.tokens = tokens;
  return request;
}

absl::Status Run(Backend& backend, const StepPlan& plan, std::vector<BackendSession*> sessions) {
  std::vector<float> logits(plan.logit_rows.size() * backend.config().vocab_size);
  return backend.Step(plan, sessions, absl::MakeSpan(logits));
}

TEST_CASE("a backend refuses one session in two slices, or a token in a landmark slot",
          "[engine]") {
  const ModelConfig config = testing::TinyConfig();  // 8 decoder positions per chunk
  const ModelWeights weights = testing::RandomWeights(config, 71);
  auto backend = MakeCpuBackend(config, weights);
  auto session = Session::Create(*backend);
  REQUIRE(session.ok());
  const std::vector<int32_t> history = testing::RandomTokens(config, 10, 72);
  REQUIRE((*session)->Append(history).ok());
  BackendSession& state = (*session)->backend_session();
  const int64_t position = state.position();
  REQUIRE(position == 11);  // 10 tokens and one landmark
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 3, 73);

  struct Case {
    const char* what;
    StepPlan plan;
    std::vector<BackendSession*> sessions;
  };
  std::vector<Case> cases;
  cases.push_back({"another slice of the step already holds",
                   Plan(config, {At(10, config, tokens), At(10, config, tokens)}),
                   {&state, &state}});
  StepPlan moved = Plan(config, {At(10, config, std::vector<int32_t>{5, 6, 7, 8, 9})});
  // Position 15 is the landmark slot of chunk 1: put a token there instead.
  REQUIRE(moved.ids[4] == config.chunk_id);
  std::swap(moved.ids[3], moved.ids[4]);
  cases.push_back({"is not a chunk end", std::move(moved), {&state}});
  // The upper-layer split (StepPlan::upper_slices(), derived from the
  // slices' flags, and lower_only) broken: two sessions, the second slice
  // lower-only. (Figures stored beside the slices that disagreed with them,
  // an upper_rows too large or a single-slice plan with both left 0, cannot
  // be made any more: they are derived.)
  auto second = Session::Create(*backend);
  REQUIRE(second.ok());
  REQUIRE((*second)->Append(history).ok());
  BackendSession& other = (*second)->backend_session();
  SliceRequest upper = At(10, config, tokens);
  SliceRequest lower = At(10, config, tokens);
  lower.lower_only = true;
  const StepPlan mixed = Plan(config, {upper, lower});
  REQUIRE(mixed.upper_slices() == 1);
  REQUIRE(mixed.upper_rows() == mixed.slices[0].num_rows);
  {
    StepPlan p = mixed;  // the lower-only slice first
    std::swap(p.slices[0].lower_only, p.slices[1].lower_only);
    cases.push_back({"lower-only slices must come after", std::move(p), {&state, &other}});
  }
  {
    StepPlan p = mixed;  // a logit row in the lower-only slice
    p.logit_rows.push_back({p.slices[1].first_row, 1, 0});
    cases.push_back({"which is not one that runs the upper layers", std::move(p),
                     {&state, &other}});
  }
  {
    StepPlan p = Plan(config, {At(10, config, tokens)});
    p.lower_only = true;
    p.logit_rows.clear();  // (else refused first as a lower-only forward asking for logits)
    cases.push_back({"lower_only is true", std::move(p), {&state}});
  }
  for (const Case& c : cases) {
    INFO(c.what);
    const absl::Status status = Run(*backend, c.plan, c.sessions);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(status.message()), Catch::Matchers::Contains(c.what));
    CHECK(state.position() == position);
    CHECK(other.position() == position);
  }

  // Nothing changed: the same tokens give, to the bit, what a fresh session
  // holding the same history gives.
  auto fresh = Session::Create(*backend);
  REQUIRE(fresh.ok());
  REQUIRE((*fresh)->Append(history).ok());
  auto after = (*session)->Append(tokens);
  auto expected = (*fresh)->Append(tokens);
  REQUIRE(after.ok());
  REQUIRE(expected.ok());
  const auto a = (*session)->last_logits(), b = (*fresh)->last_logits();
  CHECK(std::vector<float>(a.begin(), a.end()) == std::vector<float>(b.begin(), b.end()));
}

}  // namespace
}  // namespace drt

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


// Finding F2 of the engine review: CheckStep checked only each logit row's
// slice, so a logit row on a landmark or past the rows was computed from
// stale scratch (OK returned, the session advanced), and a slice starting
// past the ids threw std::out_of_range. Each case edits one field of a
// PlanStep plan.
TEST_CASE("a backend refuses a plan whose rows, landmarks, runs or logit rows disagree",
          "[engine]") {
  const ModelConfig config = testing::TinyConfig();  // 8 decoder positions per chunk
  REQUIRE(config.chunk_positions() == 8);
  const ModelWeights weights = testing::RandomWeights(config, 81);
  auto backend = MakeCpuBackend(config, weights);
  const std::vector<int32_t> history = testing::RandomTokens(config, 10, 82);
  auto first = Session::Create(*backend);
  auto second = Session::Create(*backend);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  REQUIRE((*first)->Append(history).ok());
  REQUIRE((*second)->Append(history).ok());
  BackendSession& a = (*first)->backend_session();
  BackendSession& b = (*second)->backend_session();
  const int64_t position = a.position();
  REQUIRE(position == 11);
  // 8 tokens from position 11: rows 0-3 at positions 11-14, the landmark
  // closing chunk 1 at row 4 (position 15), rows 5-8 at positions 16-19.
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 8, 83);
  SliceRequest all = At(10, config, tokens);
  all.all_logits = true;
  const StepPlan one = Plan(config, {all});
  REQUIRE(one.num_rows == 9);
  REQUIRE(one.slices[0].landmarks.size() == 1);
  REQUIRE(one.slices[0].landmarks[0].row == 4);
  REQUIRE(one.slices[0].runs.size() == 2);
  REQUIRE(one.logit_rows.size() == 8);
  REQUIRE(one.logit_rows[4].row == 5);
  const StepPlan two = Plan(config, {At(10, config, tokens), At(10, config, tokens)});
  REQUIRE(two.logit_rows.size() == 2);
  REQUIRE(two.slices[1].first_row == 9);

  struct Case {
    const char* what;
    StepPlan plan;
    std::vector<BackendSession*> sessions;
  };
  std::vector<Case> cases;
  auto edit = [&](const char* what, const StepPlan& base, auto change) {
    StepPlan p = base;
    change(p);
    cases.push_back({what, std::move(p),
                     base.slices.size() == 1 ? std::vector<BackendSession*>{&a}
                                             : std::vector<BackendSession*>{&a, &b}});
  };
  edit("logit row 4 is a landmark position", one, [](StepPlan& p) {
    p.logit_rows = {{4, 0, 4}};  // the landmark row (the token index its place would have)
  });
  edit("logit row 0 (row 500) lies outside its slice 0 (rows 0 to 8)", one, [](StepPlan& p) {
    p.logit_rows = {{500, 0, 7}};
  });
  edit("logit row 0 (row 10) lies outside its slice 0 (rows 0 to 8)", two, [](StepPlan& p) {
    p.logit_rows[0].row = 10;  // slice 0's row moved into slice 1's rows
  });
  // Rows in row order whose slice index goes back (review-enginefix R1): the
  // second row names slice 0 but lies past slice 1; before, CheckStep handed
  // it to no slice's check and the step read past its rows.
  edit("logit row 1 (row 1000000) lies outside its slice 0", two, [](StepPlan& p) {
    p.logit_rows = {{17, 1, 7}, {1000000, 0, 7}};
  });
  edit("the plan has 9 rows but holds 8 ids", one, [](StepPlan& p) { p.ids.pop_back(); });
  edit("the plan has 9 rows but holds 8 ids", one, [](StepPlan& p) {
    p.ids.pop_back();
    p.slices[0].num_rows = 8;  // num_rows left at 9
  });
  edit("slice 0 holds rows [1000, 1009)", one, [](StepPlan& p) { p.slices[0].first_row = 1000; });
  edit("slice 1 holds rows [8, 17)", two, [](StepPlan& p) { p.slices[1].first_row = 8; });
  edit("landmark 0 should be row 4 closing chunk 1", one,
       [](StepPlan& p) { p.slices[0].landmarks[0].row = 5; });
  edit("landmark 0 should be row 4 closing chunk 1", one,
       [](StepPlan& p) { p.slices[0].landmarks[0].chunk = 2; });
  edit("slice 0 lists 2 landmarks", one,
       [](StepPlan& p) { p.slices[0].landmarks.push_back({8, 2}); });
  REQUIRE(two.num_encoded_chunks == 2);
  edit("num_encoded_chunks is 3", two, [](StepPlan& p) { p.num_encoded_chunks = 3; });
  edit("slice 1's first_encoded is 0", two, [](StepPlan& p) { p.slices[1].first_encoded = 0; });
  edit("is not the run of chunk 2's rows from row 4", one,
       [](StepPlan& p) { p.slices[0].runs[0].num_rows = 4; });
  edit("slice 0's GCA run 1", one, [](StepPlan& p) { p.slices[0].runs[1].made_at = GcaRun::kInForce; });
  edit("slice 0's GCA run 1", one, [](StepPlan& p) { p.slices[0].runs[1].chunk = 1; });
  edit("slice 0's GCA runs cover rows [0, 5)", one, [](StepPlan& p) { p.slices[0].runs.pop_back(); });
  edit("logit row 4 (row 5) says token 5", one, [](StepPlan& p) { p.logit_rows[4].token = 5; });
  edit("logit rows go in row order", one,
       [](StepPlan& p) { std::swap(p.logit_rows[1], p.logit_rows[2]); });
  for (const Case& c : cases) {
    INFO(c.what);
    const absl::Status status = Run(*backend, c.plan, c.sessions);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(status.message()), Catch::Matchers::Contains(c.what));
    CHECK(a.position() == position);
    CHECK(b.position() == position);
  }
  // Nothing changed: both sessions continue, to the bit, as a fresh one
  // holding the same history (windows, selections and logits untouched).
  auto fresh = Session::Create(*backend);
  REQUIRE(fresh.ok());
  REQUIRE((*fresh)->Append(history).ok());
  for (Session* s : {first->get(), second->get()}) {
    REQUIRE(std::vector<float>(s->last_logits().begin(), s->last_logits().end()) ==
            std::vector<float>((*fresh)->last_logits().begin(), (*fresh)->last_logits().end()));
  }
  auto expected = (*fresh)->Append(tokens);
  REQUIRE(expected.ok());
  for (Session* s : {first->get(), second->get()}) {
    REQUIRE(s->Append(tokens).ok());
    CHECK(std::vector<float>(s->last_logits().begin(), s->last_logits().end()) ==
          std::vector<float>((*fresh)->last_logits().begin(), (*fresh)->last_logits().end()));
  }
}


std::vector<float> Floats(absl::Span<const float> span) {
  return std::vector<float>(span.begin(), span.end());
}

// review-enginefix R2: CheckStep checked the plan's rows, landmarks, runs and
// logit rows but not the figures beside them that the CUDA backend reads
// (open_rows_before, selection_serves_in_step, ends_on_landmark; the plan's
// selection_serves_in_step decides whether RunForward waits for the
// selections made in the step). The CPU backend reads none of them, so a
// plan corrupted in one ran to OK and advanced the session: each case below
// did before CheckSliceCounts and the plan-level check existed (checked by
// taking them out). Each case edits one field of a PlanStep plan.
TEST_CASE("a backend refuses a plan whose flags or counts beside its rows disagree",
          "[engine][step_plan]") {
  const ModelConfig config = testing::TinyConfig();  // 8 decoder positions per chunk
  REQUIRE(config.chunk_positions() == 8);
  const ModelWeights weights = testing::RandomWeights(config, 91);
  auto backend = MakeCpuBackend(config, weights);
  REQUIRE(backend->runs_mixed_lower_only_forwards());
  const std::vector<int32_t> history = testing::RandomTokens(config, 10, 92);
  auto first = Session::Create(*backend);
  auto second = Session::Create(*backend);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  REQUIRE((*first)->Append(history).ok());
  REQUIRE((*second)->Append(history).ok());
  BackendSession& a = (*first)->backend_session();
  BackendSession& b = (*second)->backend_session();
  const int64_t position = a.position();
  REQUIRE(position == 11);  // 10 tokens and chunk 0's landmark at 7: 3 rows of chunk 1 open
  const std::vector<float> logits_before = Floats((*first)->last_logits());
  REQUIRE(Floats((*second)->last_logits()) == logits_before);

  // `across`: 8 tokens from position 11, the landmark closing chunk 1 at row
  // 4 (position 15), rows 5-8 (positions 16-19) in chunk 2 served by the
  // selection made there. `ending`: 4 tokens, rows at 11-14 and the landmark
  // at 15 last, all in chunk 1 under the selection in force.
  const std::vector<int32_t> eight = testing::RandomTokens(config, 8, 93);
  const std::vector<int32_t> four = testing::RandomTokens(config, 4, 94);
  const StepPlan across = Plan(config, {At(10, config, eight)});
  const StepPlan ending = Plan(config, {At(10, config, four)});
  // Independent of PlanStep: the values its derivation must give here.
  REQUIRE(across.num_rows == 9);
  REQUIRE(across.slices[0].num_new_tokens == 8);
  REQUIRE(across.slices[0].open_rows_before == 3);
  REQUIRE(across.slices[0].selection_serves_in_step);
  REQUIRE(across.selection_serves_in_step);
  REQUIRE_FALSE(across.slices[0].ends_on_landmark);
  REQUIRE(ending.num_rows == 5);
  REQUIRE(ending.slices[0].num_new_tokens == 4);
  REQUIRE_FALSE(ending.slices[0].selection_serves_in_step);
  REQUIRE_FALSE(ending.selection_serves_in_step);
  REQUIRE(ending.slices[0].ends_on_landmark);
  // Two sessions: the corruption in the second slice (rows 9-13).
  const StepPlan two = Plan(config, {At(10, config, eight), At(10, config, four)});
  REQUIRE(two.slices[1].first_row == 9);
  // A mixed plan: `ending` runs the upper layers, `across` only the lower
  // ones; the plan's flag counts only the first (the lower-only slice makes
  // no selection), so it is false while the lower-only slice's is true.
  SliceRequest lower = At(10, config, eight);
  lower.lower_only = true;
  const StepPlan mixed = Plan(config, {At(10, config, four), lower});
  REQUIRE(mixed.upper_slices() == 1);
  REQUIRE(mixed.slices[1].selection_serves_in_step);
  REQUIRE_FALSE(mixed.selection_serves_in_step);

  struct Case {
    const char* what;
    StepPlan plan;
  };
  std::vector<Case> cases;
  auto edit = [&](const char* what, const StepPlan& base, auto change) {
    StepPlan p = base;
    change(p);
    cases.push_back({what, std::move(p)});
  };
  edit("slice 0's num_new_tokens is 7; its rows (decoder positions [11, 20)) hold 8", across,
       [](StepPlan& p) { p.slices[0].num_new_tokens = 7; });
  edit("slice 0's open_rows_before is 0; a session at decoder position 11 holds 3", across,
       [](StepPlan& p) { p.slices[0].open_rows_before = 0; });
  edit("slice 0's open_rows_before is 11;", across,
       [](StepPlan& p) { p.slices[0].open_rows_before = 11; });
  edit("slice 0's selection_serves_in_step is false; its GCA runs (2, over chunks 1 to 2) say "
       "true",
       across, [](StepPlan& p) { p.slices[0].selection_serves_in_step = false; });
  edit("slice 0's selection_serves_in_step is true; its GCA runs (1, over chunks 1 to 1) say "
       "false",
       ending, [](StepPlan& p) { p.slices[0].selection_serves_in_step = true; });
  edit("the plan's selection_serves_in_step is false; slice 0, which runs the upper layers, "
       "says true",
       across, [](StepPlan& p) { p.selection_serves_in_step = false; });
  edit("the plan's selection_serves_in_step is true; none of its 1 slices", ending,
       [](StepPlan& p) { p.selection_serves_in_step = true; });
  edit("the plan's selection_serves_in_step is true; none of its 1 slices", mixed,
       [](StepPlan& p) { p.selection_serves_in_step = true; });
  edit("slice 0's ends_on_landmark is true; its last row (decoder position 19) is not a landmark",
       across, [](StepPlan& p) { p.slices[0].ends_on_landmark = true; });
  edit("slice 0's ends_on_landmark is false; its last row (decoder position 15) is a landmark",
       ending, [](StepPlan& p) { p.slices[0].ends_on_landmark = false; });
  edit("slice 1's open_rows_before is 4", two,
       [](StepPlan& p) { p.slices[1].open_rows_before = 4; });
  edit("slice 1's selection_serves_in_step is true", two,
       [](StepPlan& p) { p.slices[1].selection_serves_in_step = true; });
  edit("slice 1's ends_on_landmark is false", two,
       [](StepPlan& p) { p.slices[1].ends_on_landmark = false; });
  edit("slice 1's selection_serves_in_step is false", mixed,
       [](StepPlan& p) { p.slices[1].selection_serves_in_step = false; });
  for (const Case& c : cases) {
    INFO(c.what);
    const std::vector<BackendSession*> sessions =
        c.plan.slices.size() == 1 ? std::vector<BackendSession*>{&a}
                                  : std::vector<BackendSession*>{&a, &b};
    const absl::Status status = Run(*backend, c.plan, sessions);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(status.message()), Catch::Matchers::Contains(c.what));
    CHECK(a.position() == position);
    CHECK(b.position() == position);
    for (Session* s : {first->get(), second->get()}) {
      CHECK(s->num_tokens() == 10);
      CHECK(Floats(s->last_logits()) == logits_before);
    }
  }
  // Nothing changed: both sessions continue, to the bit, as a fresh one
  // holding the same history (windows, open chunk, selections untouched).
  auto fresh = Session::Create(*backend);
  REQUIRE(fresh.ok());
  REQUIRE((*fresh)->Append(history).ok());
  REQUIRE((*fresh)->Append(eight).ok());
  for (Session* s : {first->get(), second->get()}) {
    REQUIRE(s->Append(eight).ok());
    CHECK(s->num_tokens() == 18);
    CHECK(Floats(s->last_logits()) == Floats((*fresh)->last_logits()));
  }
}

// The same checks do not refuse what PlanStep makes, at the chunk size of
// the bundled models (64 real tokens + 1 landmark: position 64 is chunk
// 0's landmark, 129 chunk 1's): a session at 62, 63 or 65 (a session is
// never at 64: the landmark comes with the 64th token), steps ending just
// before, exactly on and just after a landmark, and steps in which the
// selection made at a landmark serves the rows after it. Each plan's
// figures are compared with hand-computed values, then run directly through
// Backend::Step; its last logits equal those of a session that appended
// the same tokens.
TEST_CASE("a backend runs plans at and around landmark boundaries", "[engine][step_plan]") {
  ModelConfig config = testing::TinyConfig();
  config.enc_chunk_size = 64;
  REQUIRE(config.chunk_positions() == 65);
  const ModelWeights weights = testing::RandomWeights(config, 101);
  auto backend = MakeCpuBackend(config, weights);
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 200, 102);
  struct Case {
    int64_t held;  // real tokens the session holds
    int64_t take;  // new tokens
    int64_t first_position, num_rows, open_rows_before;
    bool ends_on_landmark, selection_serves_in_step;
  };
  const Case cases[] = {
      {62, 1, 62, 1, 62, false, false},    // position 62: one before chunk 0's last token
      {62, 2, 62, 3, 62, true, false},     // 62, 63, landmark 64
      {63, 1, 63, 2, 63, true, false},     // 63 and the landmark: ends exactly on it
      {63, 2, 63, 3, 63, false, true},     // 63, 64, 65: chunk 0's selection serves 65
      {64, 1, 65, 1, 0, false, false},     // 65: the first row of chunk 1
      {64, 64, 65, 65, 0, true, false},    // the whole of chunk 1, ending on its landmark
      {126, 4, 127, 5, 62, false, true},   // 127, 128, landmark 129, 130, 131
      {63, 65, 63, 67, 63, true, true},    // 63 to 129: both landmarks, ends on the second
      {63, 130, 63, 133, 63, false, true}, // 63 to 195: three landmarks, each serving rows
  };
  for (const Case& c : cases) {
    INFO("holding " << c.held << " tokens, " << c.take << " new");
    const std::vector<int32_t> held(tokens.begin(), tokens.begin() + c.held);
    const std::vector<int32_t> added(tokens.begin() + c.held, tokens.begin() + c.held + c.take);
    auto session = Session::Create(*backend);
    auto reference = Session::Create(*backend);
    REQUIRE(session.ok());
    REQUIRE(reference.ok());
    REQUIRE((*session)->Append(held).ok());
    REQUIRE((*reference)->Append(held).ok());
    const StepPlan plan = Plan(config, {At(c.held, config, added)});
    const SlicePlan& slice = plan.slices[0];
    REQUIRE(slice.first_position == c.first_position);
    REQUIRE(slice.num_rows == c.num_rows);
    REQUIRE(slice.num_new_tokens == c.take);
    REQUIRE(slice.open_rows_before == c.open_rows_before);
    REQUIRE(slice.ends_on_landmark == c.ends_on_landmark);
    REQUIRE(slice.selection_serves_in_step == c.selection_serves_in_step);
    REQUIRE(plan.selection_serves_in_step == c.selection_serves_in_step);
    BackendSession& state = (*session)->backend_session();
    REQUIRE(state.position() == c.first_position);
    std::vector<float> logits(plan.logit_rows.size() * config.vocab_size);
    const absl::Status status =
        backend->Step(plan, std::vector<BackendSession*>{&state}, absl::MakeSpan(logits));
    REQUIRE(status.ok());
    CHECK(state.position() == c.first_position + c.num_rows);
    REQUIRE((*reference)->Append(added).ok());
    CHECK(logits == Floats((*reference)->last_logits()));
  }
}

// review-stepcheck finding 1: a valid two-slice plan in which only one
// slice crosses a chunk (the other ends on a landmark, whose selection
// serves nothing in the step), at the bundled models' chunk size. The plan's
// selection_serves_in_step comes from the second slice alone. Every figure
// is compared with a hand-computed value; a corruption of the slice that
// does not cross is refused naming its field, before anything changes; the
// plan then runs and gives each session what a plain Append gives (to the
// batching bound).
TEST_CASE("a backend runs a two-slice plan of which only the second crosses a chunk",
          "[engine][step_plan]") {
  ModelConfig config = testing::TinyConfig();
  config.enc_chunk_size = 64;
  REQUIRE(config.chunk_positions() == 65);
  const ModelWeights weights = testing::RandomWeights(config, 111);
  auto backend = MakeCpuBackend(config, weights);
  const std::vector<int32_t> tokens = testing::RandomTokens(config, 130, 112);
  const std::vector<int32_t> held_a(tokens.begin(), tokens.begin() + 60);
  const std::vector<int32_t> held_b(tokens.begin(), tokens.begin() + 126);
  const std::vector<int32_t> new_a = testing::RandomTokens(config, 4, 113);
  const std::vector<int32_t> new_b = testing::RandomTokens(config, 4, 114);
  auto a = Session::Create(*backend);
  auto b = Session::Create(*backend);
  auto reference_a = Session::Create(*backend);
  auto reference_b = Session::Create(*backend);
  for (auto* s : {&a, &b, &reference_a, &reference_b}) REQUIRE(s->ok());
  REQUIRE((*a)->Append(held_a).ok());
  REQUIRE((*reference_a)->Append(held_a).ok());
  REQUIRE((*b)->Append(held_b).ok());
  REQUIRE((*reference_b)->Append(held_b).ok());
  BackendSession& state_a = (*a)->backend_session();
  BackendSession& state_b = (*b)->backend_session();
  REQUIRE(state_a.position() == 60);   // 60 tokens, no landmark yet
  REQUIRE(state_b.position() == 127);  // 126 tokens and chunk 0's landmark at 64

  const StepPlan plan = Plan(config, {At(60, config, new_a), At(126, config, new_b)});
  REQUIRE(plan.slices.size() == 2);
  // Slice 0: tokens at 60-63 and chunk 0's landmark at 64, its last row; the
  // selection made there serves no row of the step.
  const SlicePlan& s0 = plan.slices[0];
  CHECK(s0.first_row == 0);
  CHECK(s0.first_position == 60);
  CHECK(s0.num_rows == 5);
  CHECK(s0.num_new_tokens == 4);
  CHECK(s0.open_rows_before == 60);
  CHECK(s0.ends_on_landmark);
  CHECK_FALSE(s0.selection_serves_in_step);
  // Slice 1: tokens at 127 and 128, chunk 1's landmark at 129, tokens at 130
  // and 131, which the selection made at 129 serves.
  const SlicePlan& s1 = plan.slices[1];
  CHECK(s1.first_row == 5);
  CHECK(s1.first_position == 127);
  CHECK(s1.num_rows == 5);
  CHECK(s1.num_new_tokens == 4);
  CHECK(s1.open_rows_before == 62);
  CHECK_FALSE(s1.ends_on_landmark);
  CHECK(s1.selection_serves_in_step);
  CHECK(plan.num_rows == 10);
  CHECK(plan.upper_slices() == 2);
  CHECK(plan.selection_serves_in_step);  // from slice 1 alone

  struct Case {
    const char* what;
    StepPlan plan;
  };
  std::vector<Case> cases;
  auto edit = [&](const char* what, auto change) {
    StepPlan p = plan;
    change(p);
    cases.push_back({what, std::move(p)});
  };
  edit("slice 0's selection_serves_in_step is true; its GCA runs (1, over chunks 0 to 0) say "
       "false",
       [](StepPlan& p) { p.slices[0].selection_serves_in_step = true; });
  edit("slice 0's ends_on_landmark is false; its last row (decoder position 64) is a landmark",
       [](StepPlan& p) { p.slices[0].ends_on_landmark = false; });
  edit("slice 0's open_rows_before is 0; a session at decoder position 60 holds 60",
       [](StepPlan& p) { p.slices[0].open_rows_before = 0; });
  edit("slice 0's num_new_tokens is 5; its rows (decoder positions [60, 65)) hold 4",
       [](StepPlan& p) { p.slices[0].num_new_tokens = 5; });
  edit("the plan's selection_serves_in_step is false; slice 1, which runs the upper layers, "
       "says true",
       [](StepPlan& p) { p.selection_serves_in_step = false; });
  const std::vector<float> logits_a = Floats((*a)->last_logits());
  const std::vector<float> logits_b = Floats((*b)->last_logits());
  for (const Case& c : cases) {
    INFO(c.what);
    const absl::Status status = Run(*backend, c.plan, {&state_a, &state_b});
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(status.message()), Catch::Matchers::Contains(c.what));
    CHECK(state_a.position() == 60);
    CHECK(state_b.position() == 127);
    CHECK(Floats((*a)->last_logits()) == logits_a);
    CHECK(Floats((*b)->last_logits()) == logits_b);
  }

  // The plan as made runs, and each session's logits are a plain Append's,
  // within the batching bound (tests/batch_step_test.cc, kBatchTolerance:
  // two sessions in one forward share GEMMs of another row count than one
  // alone; measured here 0 for slice 0 and 3.7e-7 for slice 1).
  constexpr double kBatchTolerance = 1e-5;
  REQUIRE(plan.logit_rows.size() == 2);
  std::vector<float> logits(plan.logit_rows.size() * config.vocab_size);
  REQUIRE(backend->Step(plan, std::vector<BackendSession*>{&state_a, &state_b},
                        absl::MakeSpan(logits))
              .ok());
  CHECK(state_a.position() == 65);
  CHECK(state_b.position() == 132);
  REQUIRE((*reference_a)->Append(new_a).ok());
  REQUIRE((*reference_b)->Append(new_b).ok());
  const auto vocab = static_cast<std::ptrdiff_t>(config.vocab_size);
  const double worst_a = testing::WorstRowRelativeDifference(
      std::vector<float>(logits.begin(), logits.begin() + vocab),
      Floats((*reference_a)->last_logits()), vocab);
  const double worst_b = testing::WorstRowRelativeDifference(
      std::vector<float>(logits.begin() + vocab, logits.end()),
      Floats((*reference_b)->last_logits()), vocab);
  INFO("relative difference to a plain Append: slice 0 " << worst_a << ", slice 1 " << worst_b);
  CHECK(worst_a <= kBatchTolerance);
  CHECK(worst_b <= kBatchTolerance);
}

}  // namespace
}  // namespace drt

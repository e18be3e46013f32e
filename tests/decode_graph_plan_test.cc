// Which slices replay a CUDA decode graph and which run eagerly
// (engine/cuda/host/decode_graph_plan.h), on plans made by PlanStep for a
// tiny chunk (3 real tokens + 1 landmark: decoder positions 3, 7, 11, ...
// are landmarks; tests/test_util/tiny_step_plan.h), and the one-slice plan a
// graph is captured from, against hand-computed rows.
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cuda/host/decode_graph_plan.h"
#include "engine/step_plan.h"
#include "tests/test_util/tiny_step_plan.h"

namespace drt::cuda {
namespace {

using testing::kTinyPlanLandmark;
using testing::TinyPlanConfig;
using testing::TinyPlanRequest;

StepPlan Plan(const std::vector<SliceRequest>& requests, bool lower_only = false) {
  auto plan = PlanStep(TinyPlanConfig(), requests, lower_only);
  REQUIRE(plan.ok());
  return *std::move(plan);
}

TEST_CASE("decode graph plan: one token inside a chunk replays, keyed by its one row",
          "[decode_graph_plan]") {
  static const std::vector<int32_t> token = {7};
  // Holding 1 token: the new one is at decoder position 1, chunk 0.
  const StepPlan plan = Plan({TinyPlanRequest(1, token)});
  REQUIRE(plan.slices[0].num_rows == 1);
  REQUIRE(plan.slices[0].first_position == 1);
  const DecodeGraphDecision d = DecideDecodeGraph(plan, 0);
  CHECK(d.replays());
  CHECK(d.eager == EagerReason::kNone);
  CHECK(d.key == DecodeGraphKey{1});
}

TEST_CASE("decode graph plan: the token completing a chunk brings its landmark and runs eagerly",
          "[decode_graph_plan]") {
  static const std::vector<int32_t> token = {7};
  // Holding 2 tokens (positions 0, 1): the third is at position 2 and the
  // landmark at 3 follows it in the same slice.
  const StepPlan plan = Plan({TinyPlanRequest(2, token)});
  REQUIRE(plan.slices[0].num_rows == 2);
  REQUIRE(plan.slices[0].landmarks.size() == 1);
  REQUIRE(plan.ids[1] == kTinyPlanLandmark);
  const DecodeGraphDecision d = DecideDecodeGraph(plan, 0);
  CHECK_FALSE(d.replays());
  CHECK(d.eager == EagerReason::kLandmark);
}

TEST_CASE("decode graph plan: the step after a landmark replays (its selection is staged on "
          "the host before the launch)",
          "[decode_graph_plan]") {
  static const std::vector<int32_t> token = {7};
  // Holding 3 tokens (positions 0..2, landmark 3): the new token opens chunk
  // 1, the first position the selection made at chunk 0's landmark serves.
  const StepPlan plan = Plan({TinyPlanRequest(3, token)});
  REQUIRE(plan.slices[0].first_position == 4);
  REQUIRE(plan.slices[0].open_rows_before == 0);
  REQUIRE(plan.slices[0].runs.size() == 1);
  REQUIRE(plan.slices[0].runs[0].made_at == GcaRun::kInForce);
  REQUIRE(plan.slices[0].runs[0].chunk == 1);
  const DecodeGraphDecision d = DecideDecodeGraph(plan, 0);
  CHECK(d.replays());
  CHECK(d.key == DecodeGraphKey{1});
}

TEST_CASE("decode graph plan: prefill and two-row slices run eagerly", "[decode_graph_plan]") {
  static const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  static const std::vector<int32_t> two = {1, 2};
  static const std::vector<int32_t> two_more = {3, 4};
  SECTION("a prefill of 5 tokens, landmark at row 3") {
    const StepPlan plan = Plan({TinyPlanRequest(0, five, true)});
    REQUIRE(plan.slices[0].num_rows == 6);
    CHECK(DecideDecodeGraph(plan, 0).eager == EagerReason::kLandmark);
  }
  SECTION("two tokens inside a chunk (positions 0 and 1)") {
    const StepPlan plan = Plan({TinyPlanRequest(0, two)});
    REQUIRE(plan.slices[0].num_rows == 2);
    REQUIRE(plan.slices[0].landmarks.empty());
    CHECK(DecideDecodeGraph(plan, 0).eager == EagerReason::kSeveralRows);
  }
  SECTION("two tokens opening chunk 1 (positions 4 and 5)") {
    const StepPlan plan = Plan({TinyPlanRequest(3, two_more)});
    REQUIRE(plan.slices[0].num_rows == 2);
    REQUIRE(plan.slices[0].first_position == 4);
    CHECK(DecideDecodeGraph(plan, 0).eager == EagerReason::kSeveralRows);
  }
}

TEST_CASE("decode graph plan: each slice of a step is decided on its own",
          "[decode_graph_plan]") {
  static const std::vector<int32_t> a = {10};
  static const std::vector<int32_t> b = {11};
  static const std::vector<int32_t> c = {12, 13, 14};
  static const std::vector<int32_t> e = {15};
  // A decode inside chunk 1 (position 5), a decode completing chunk 0 (with
  // its landmark), a prefill of 3 tokens (with its landmark), a decode at
  // position 0.
  const StepPlan plan = Plan({TinyPlanRequest(4, a), TinyPlanRequest(2, b),
                              TinyPlanRequest(0, c), TinyPlanRequest(0, e)});
  REQUIRE(plan.slices.size() == 4);
  CHECK(DecideDecodeGraph(plan, 0).replays());
  CHECK(DecideDecodeGraph(plan, 1).eager == EagerReason::kLandmark);
  CHECK(DecideDecodeGraph(plan, 2).eager == EagerReason::kLandmark);
  CHECK(DecideDecodeGraph(plan, 3).replays());
}

TEST_CASE("decode graph plan: a lower-only forward runs eagerly", "[decode_graph_plan]") {
  static const std::vector<int32_t> token = {7};
  const StepPlan plan = Plan({TinyPlanRequest(1, token)}, /*lower_only=*/true);
  REQUIRE(plan.lower_only);
  CHECK(DecideDecodeGraph(plan, 0).eager == EagerReason::kLowerOnly);
}

TEST_CASE("decode graph plan: a one-row slice unlike PlanStep's runs eagerly",
          "[decode_graph_plan]") {
  static const std::vector<int32_t> token = {7};
  StepPlan plan = Plan({TinyPlanRequest(1, token)});
  REQUIRE(DecideDecodeGraph(plan, 0).replays());
  SECTION("its run served by a selection of the step") {
    plan.slices[0].runs[0].made_at = 0;
    CHECK(DecideDecodeGraph(plan, 0).eager == EagerReason::kSelectionOfStep);
  }
  SECTION("two runs") {
    plan.slices[0].runs.push_back(plan.slices[0].runs[0]);
    CHECK(DecideDecodeGraph(plan, 0).eager == EagerReason::kSelectionOfStep);
  }
  SECTION("no logit row") {
    plan.logit_rows.clear();
    CHECK(DecideDecodeGraph(plan, 0).eager == EagerReason::kLogitRows);
  }
  SECTION("a logit row of another row") {
    plan.logit_rows[0].row = 5;
    CHECK(DecideDecodeGraph(plan, 0).eager == EagerReason::kLogitRows);
  }
}

TEST_CASE("decode graph plan: every reason has its own name", "[decode_graph_plan]") {
  const std::vector<EagerReason> reasons = {
      EagerReason::kNone,     EagerReason::kLowerOnly,        EagerReason::kSeveralRows,
      EagerReason::kLandmark, EagerReason::kSelectionOfStep, EagerReason::kLogitRows};
  for (size_t i = 0; i < reasons.size(); ++i) {
    for (size_t j = i + 1; j < reasons.size(); ++j) {
      CHECK(std::string(EagerReasonName(reasons[i])) != EagerReasonName(reasons[j]));
    }
  }
  CHECK(std::string(EagerReasonName(EagerReason::kSeveralRows)) == "several rows");
}

TEST_CASE("decode graph plan: the single-slice plan moves a slice's rows to row 0",
          "[decode_graph_plan]") {
  static const std::vector<int32_t> one = {6};
  static const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  // Rows: 0 the decode of a session holding 1 token (position 1); 1..6 a new
  // session's 5 tokens with all logits (t t t L t t, positions 0..5).
  const StepPlan plan = Plan({TinyPlanRequest(1, one), TinyPlanRequest(0, five, true)});
  REQUIRE(plan.num_rows == 7);

  SECTION("the decode slice, already at row 0") {
    const StepPlan single = SingleSlicePlan(plan, 0);
    CHECK(single.num_rows == 1);
    CHECK(single.ids == std::vector<int32_t>{6});
    REQUIRE(single.slices.size() == 1);
    CHECK(single.slices[0].request == 0);
    CHECK(single.slices[0].first_row == 0);
    CHECK(single.slices[0].first_position == 1);
    REQUIRE(single.logit_rows.size() == 1);
    CHECK(single.logit_rows[0].row == 0);
    CHECK(single.logit_rows[0].slice == 0);
    CHECK(single.logit_rows[0].token == 0);
    CHECK(single.num_encoded_chunks == 0);
    // Its upper-layer split: the one slice runs every layer.
    CHECK_FALSE(single.lower_only);
    CHECK(single.upper_slices() == 1);
    CHECK(single.upper_rows() == 1);
    CHECK(DecideDecodeGraph(single, 0).replays());
  }
  SECTION("the prefill slice, moved from row 1") {
    const StepPlan single = SingleSlicePlan(plan, 1);
    CHECK(single.num_rows == 6);
    CHECK(single.ids == std::vector<int32_t>{1, 2, 3, kTinyPlanLandmark, 4, 5});
    REQUIRE(single.slices.size() == 1);
    const SlicePlan& s = single.slices[0];
    CHECK(s.request == 0);
    CHECK(s.first_row == 0);
    CHECK(s.first_position == 0);
    CHECK(s.first_encoded == 0);
    REQUIRE(s.landmarks.size() == 1);
    CHECK(s.landmarks[0].row == 3);
    CHECK(s.landmarks[0].chunk == 0);
    REQUIRE(s.runs.size() == 2);
    CHECK(s.runs[0].first_row == 0);
    CHECK(s.runs[0].num_rows == 4);
    CHECK(s.runs[1].first_row == 4);
    CHECK(s.runs[1].num_rows == 2);
    CHECK(s.runs[1].made_at == 0);
    CHECK(single.selection_serves_in_step);
    CHECK(single.num_encoded_chunks == 1);
    CHECK(single.upper_slices() == 1);
    CHECK(single.upper_rows() == 6);
    // Logits of the 5 tokens: rows 0, 1, 2, 4, 5 (the landmark has none).
    REQUIRE(single.logit_rows.size() == 5);
    const std::vector<int64_t> rows = {0, 1, 2, 4, 5};
    for (size_t i = 0; i < rows.size(); ++i) {
      CHECK(single.logit_rows[i].row == rows[i]);
      CHECK(single.logit_rows[i].slice == 0);
      CHECK(single.logit_rows[i].token == static_cast<int64_t>(i));
    }
  }
}

}  // namespace
}  // namespace drt::cuda

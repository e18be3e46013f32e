// The host side of the batched CUDA step (engine/cuda/host/step_rows.h):
// which plans its step-wide buffers hold, and how the logit rows split into
// runs of consecutive rows, against hand-computed cases. A tiny chunk (3
// real tokens + 1 landmark, tests/test_util/tiny_step_plan.h) as in
// tests/step_plan_test.cc.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cuda/host/step_rows.h"
#include "engine/step_plan.h"
#include "tests/test_util/tiny_step_plan.h"

namespace drt::cuda {
namespace {

using testing::TinyPlanConfig;
using testing::TinyPlanRequest;

// A new session's 5 tokens with all logits (rows t t t L t t: 0..5) and a
// decode token of a session holding 1 token (row 6).
StepPlan MixedPlan() {
  static const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  static const std::vector<int32_t> one = {6};
  const std::vector<SliceRequest> requests = {TinyPlanRequest(0, five, true),
                                              TinyPlanRequest(1, one, false)};
  auto plan = PlanStep(TinyPlanConfig(), requests);
  REQUIRE(plan.ok());
  REQUIRE(plan->num_rows == 7);
  REQUIRE(plan->slices.size() == 2);
  return *std::move(plan);
}

bool Mentions(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != absl::string_view::npos;
}

TEST_CASE("step rows: a planned step fits buffers of its row count, not fewer", "[step_rows]") {
  const StepPlan plan = MixedPlan();
  CHECK(CheckStepRows(plan, 7).ok());
  CHECK(CheckStepRows(plan, 1024).ok());
  const absl::Status small = CheckStepRows(plan, 6);
  CHECK(small.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Mentions(small, "a plan of 7 rows: the step's buffers hold 1..6"));
}

TEST_CASE("step rows: a plan whose rows are not laid out slice after slice is refused",
          "[step_rows]") {
  SECTION("a gap between slices") {
    StepPlan plan = MixedPlan();
    plan.slices[1].first_row = 7;
    plan.num_rows = 8;
    plan.ids.push_back(0);
    const absl::Status s = CheckStepRows(plan, 64);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Mentions(s, "slice 1 holds rows 7..7: the slices must tile the step's rows in order "
                      "from row 6"));
  }
  SECTION("slices covering fewer rows than the plan") {
    StepPlan plan = MixedPlan();
    plan.num_rows = 8;
    plan.ids.push_back(0);
    const absl::Status s = CheckStepRows(plan, 64);
    CHECK(Mentions(s, "the slices hold 7 rows, the plan 8"));
  }
  SECTION("ids not matching the rows") {
    StepPlan plan = MixedPlan();
    plan.ids.pop_back();
    CHECK(Mentions(CheckStepRows(plan, 64), "the plan has 6 ids for 7 rows"));
  }
  SECTION("a logit row outside its slice") {
    StepPlan plan = MixedPlan();
    plan.logit_rows.back().row = 2;  // slice 1 holds row 6 only
    CHECK(Mentions(CheckStepRows(plan, 64),
                   "logit row 5 (step row 2) lies outside its slice (rows 6..6)"));
  }
  SECTION("a lower-only plan") {
    static const std::vector<int32_t> two = {1, 2};
    const std::vector<SliceRequest> requests = {TinyPlanRequest(0, two, false)};
    auto plan = PlanStep(TinyPlanConfig(), requests, /*lower_only=*/true);
    REQUIRE(plan.ok());
    CHECK(Mentions(CheckStepRows(*plan, 64), "lower-only"));
  }
}

TEST_CASE("step rows: logit rows split into runs of consecutive rows", "[step_rows]") {
  const StepPlan plan = MixedPlan();
  // All logits of slice 0 skip its landmark (row 3); slice 1's row 6
  // continues rows 4, 5.
  REQUIRE(plan.logit_rows.size() == 6);
  const std::vector<RowRun> expected = {{0, 3, 0}, {4, 3, 3}};
  CHECK(ConsecutiveRowRuns(plan.logit_rows) == expected);
  // A batch starting mid-run begins a run of its own at output row 0.
  const std::vector<RowRun> tail = {{2, 1, 0}, {4, 3, 1}};
  CHECK(ConsecutiveRowRuns(absl::Span<const LogitRow>(plan.logit_rows).subspan(2)) == tail);
  CHECK(ConsecutiveRowRuns({}).empty());
}

}  // namespace
}  // namespace drt::cuda

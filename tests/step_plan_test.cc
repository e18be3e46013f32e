// The step planner (engine/step_plan.h) against hand-computed plans. A tiny
// chunk (3 real tokens + 1 landmark = 4 decoder positions) keeps the cases
// small enough to write out by hand.
#include <vector>

#include <catch2/catch.hpp>

#include "engine/step_plan.h"
#include "tests/test_util/tiny_step_plan.h"

namespace drt {
namespace {

using testing::TinyPlanConfig;
using testing::TinyPlanRequest;
constexpr int32_t kLandmark = testing::kTinyPlanLandmark;
constexpr int32_t kPad = testing::kTinyPlanPad;

void RequireRun(const GcaRun& run, int64_t first_row, int64_t num_rows, int64_t chunk,
                int64_t made_at) {
  INFO("run at row " << run.first_row);
  REQUIRE(run.first_row == first_row);
  REQUIRE(run.num_rows == num_rows);
  REQUIRE(run.chunk == chunk);
  REQUIRE(run.made_at == made_at);
}

TEST_CASE("step plan: a slice ending exactly on a landmark", "[step_plan]") {
  // One token held (position 1): tokens at positions 1 and 2, then chunk
  // 0's landmark at position 3 closes the slice.
  const std::vector<int32_t> tokens = {10, 11};
  const SliceRequest requests[] = {TinyPlanRequest(1, tokens)};
  auto plan = PlanStep(TinyPlanConfig(), requests);
  REQUIRE(plan.ok());
  REQUIRE(plan->ids == std::vector<int32_t>{10, 11, kLandmark});
  REQUIRE(plan->num_rows == 3);
  REQUIRE(plan->num_encoded_chunks == 1);
  REQUIRE_FALSE(plan->selection_serves_in_step);
  const SlicePlan& s = plan->slices.at(0);
  REQUIRE(s.first_position == 1);
  REQUIRE(s.open_rows_before == 1);
  REQUIRE(s.num_new_tokens == 2);
  REQUIRE(s.landmarks.size() == 1);
  REQUIRE(s.landmarks[0].row == 2);
  REQUIRE(s.landmarks[0].chunk == 0);
  REQUIRE(s.runs.size() == 1);
  RequireRun(s.runs[0], 0, 3, 0, GcaRun::kInForce);
  REQUIRE(s.ends_on_landmark);
  REQUIRE_FALSE(s.selection_serves_in_step);
  // Only the last real token's logits, never the landmark's.
  REQUIRE(plan->logit_rows.size() == 1);
  REQUIRE(plan->logit_rows[0].row == 1);
  REQUIRE(plan->logit_rows[0].token == 1);
}

TEST_CASE("step plan: a slice of one token", "[step_plan]") {
  // Four tokens held: positions 0-2, landmark 3, 4; the new token is at
  // position 5, chunk 1, still served by the selection in force, and leaves
  // the chunk open.
  const std::vector<int32_t> tokens = {7};
  const SliceRequest requests[] = {TinyPlanRequest(4, tokens)};
  auto plan = PlanStep(TinyPlanConfig(), requests);
  REQUIRE(plan.ok());
  REQUIRE(plan->ids == std::vector<int32_t>{7});
  const SlicePlan& s = plan->slices.at(0);
  REQUIRE(s.first_position == 5);
  REQUIRE(s.open_rows_before == 1);
  REQUIRE(s.landmarks.empty());
  REQUIRE(s.runs.size() == 1);
  RequireRun(s.runs[0], 0, 1, 1, GcaRun::kInForce);
  REQUIRE_FALSE(s.ends_on_landmark);
  REQUIRE(plan->num_encoded_chunks == 0);
  REQUIRE(plan->logit_rows.size() == 1);
  REQUIRE(plan->logit_rows[0].row == 0);
}

TEST_CASE("step plan: a slice spanning three chunks, every token's logits", "[step_plan]") {
  // Two tokens held (position 2). Rows: t0@2, L@3 (closes 0), t1@4, t2@5,
  // t3@6, L@7 (closes 1), t4@8. Chunk 1's rows are served by the selection
  // made at chunk 0's landmark (landmark 0 of the slice), chunk 2's by the
  // one made at chunk 1's (landmark 1).
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  const SliceRequest requests[] = {TinyPlanRequest(2, tokens, /*all_logits=*/true)};
  auto plan = PlanStep(TinyPlanConfig(), requests);
  REQUIRE(plan.ok());
  REQUIRE(plan->ids == std::vector<int32_t>{1, kLandmark, 2, 3, 4, kLandmark, 5});
  const SlicePlan& s = plan->slices.at(0);
  REQUIRE(s.landmarks.size() == 2);
  REQUIRE(s.landmarks[0].row == 1);
  REQUIRE(s.landmarks[0].chunk == 0);
  REQUIRE(s.landmarks[1].row == 5);
  REQUIRE(s.landmarks[1].chunk == 1);
  REQUIRE(s.runs.size() == 3);
  RequireRun(s.runs[0], 0, 2, 0, GcaRun::kInForce);
  RequireRun(s.runs[1], 2, 4, 1, 0);
  RequireRun(s.runs[2], 6, 1, 2, 1);
  REQUIRE(s.selection_serves_in_step);
  REQUIRE(plan->selection_serves_in_step);
  REQUIRE_FALSE(s.ends_on_landmark);
  std::vector<int64_t> rows, token_indices;
  for (const LogitRow& r : plan->logit_rows) {
    rows.push_back(r.row);
    token_indices.push_back(r.token);
  }
  REQUIRE(rows == std::vector<int64_t>{0, 2, 3, 4, 6});
  REQUIRE(token_indices == std::vector<int64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("step plan: several slices are consecutive rows with their own chunks",
          "[step_plan]") {
  const std::vector<int32_t> a = {10, 11}, b = {1, 2, 3, 4, 5}, c = {7};
  const SliceRequest requests[] = {TinyPlanRequest(1, a), TinyPlanRequest(2, b),
                                   TinyPlanRequest(4, c)};
  auto plan = PlanStep(TinyPlanConfig(), requests);
  REQUIRE(plan.ok());
  REQUIRE(plan->num_rows == 3 + 7 + 1);
  REQUIRE(plan->num_encoded_chunks == 3);
  REQUIRE(plan->slices.size() == 3);
  REQUIRE(plan->slices[0].first_row == 0);
  REQUIRE(plan->slices[1].first_row == 3);
  REQUIRE(plan->slices[2].first_row == 10);
  REQUIRE(plan->slices[0].first_encoded == 0);
  REQUIRE(plan->slices[1].first_encoded == 1);
  REQUIRE(plan->slices[2].first_encoded == 3);
  // Landmark rows and runs are rows of the step, chunks the session's own.
  REQUIRE(plan->slices[1].landmarks[1].row == 8);
  REQUIRE(plan->slices[1].landmarks[1].chunk == 1);
  RequireRun(plan->slices[1].runs[2], 9, 1, 2, 1);
  RequireRun(plan->slices[2].runs[0], 10, 1, 1, GcaRun::kInForce);
  // One logit row per slice (its last token), slice by slice.
  REQUIRE(plan->logit_rows.size() == 3);
  REQUIRE(plan->logit_rows[0].row == 1);
  REQUIRE(plan->logit_rows[1].row == 9);
  REQUIRE(plan->logit_rows[1].slice == 1);
  REQUIRE(plan->logit_rows[2].row == 10);
  REQUIRE(plan->logit_rows[2].slice == 2);
}

TEST_CASE("step plan: pad ids are real tokens and landmarks go by count", "[step_plan]") {
  const std::vector<int32_t> pads = {kPad, kPad, kPad, kPad};
  const SliceRequest requests[] = {TinyPlanRequest(0, pads)};
  auto plan = PlanStep(TinyPlanConfig(), requests);
  REQUIRE(plan.ok());
  REQUIRE(plan->ids == std::vector<int32_t>{kPad, kPad, kPad, kLandmark, kPad});
  REQUIRE(plan->slices[0].landmarks.size() == 1);

  // A model whose pad id is its landmark id: pads never count as landmarks.
  ModelConfig same = TinyPlanConfig();
  same.pad_id = kLandmark;
  const std::vector<int32_t> landmark_pads = {kLandmark, kLandmark};
  const SliceRequest pad_requests[] = {TinyPlanRequest(0, landmark_pads)};
  auto padded = PlanStep(same, pad_requests);
  REQUIRE(padded.ok());
  REQUIRE(padded->ids == std::vector<int32_t>{kLandmark, kLandmark});
  REQUIRE(padded->slices[0].landmarks.empty());
}

TEST_CASE("step plan: requests without tokens or with a wrong position are refused",
          "[step_plan]") {
  const std::vector<int32_t> none, one = {5};
  const SliceRequest empty[] = {TinyPlanRequest(0, none)};
  auto refused = PlanStep(TinyPlanConfig(), empty);
  REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(refused.status().message()), Catch::Matchers::Contains("no tokens"));

  SliceRequest wrong = TinyPlanRequest(3, one);
  wrong.position = 3;  // 3 tokens mean positions 0-2 plus the landmark at 3: 4
  const SliceRequest wrong_requests[] = {wrong};
  auto mismatch = PlanStep(TinyPlanConfig(), wrong_requests);
  REQUIRE(mismatch.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(mismatch.status().message()),
               Catch::Matchers::Contains("position 3 does not match 3 real tokens"));
}

TEST_CASE("step plan: tokens fitting a step size count their landmarks", "[step_plan]") {
  const ModelConfig c = TinyPlanConfig();
  // Two tokens held: the next token closes chunk 0 and brings its landmark
  // (2 positions), then 1 each: 2 + 1 + 1 = 4 positions for 3 tokens.
  REQUIRE(TokensFitting(c, 2, 10, 4) == 3);
  REQUIRE(TokensFitting(c, 2, 10, 5) == 3);  // the 4th token would bring a landmark
  REQUIRE(TokensFitting(c, 2, 10, 6) == 4);
  REQUIRE(TokensFitting(c, 2, 2, 100) == 2);  // no more than available
  REQUIRE(TokensFitting(c, 2, 10, 1) == 0);   // a token never leaves its landmark behind
  REQUIRE(TokensFitting(c, 0, 10, 1) == 1);
}

}  // namespace
}  // namespace drt

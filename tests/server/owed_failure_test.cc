// An Append whose item fails after a piece with tokens following
// (server/scheduler.h): that piece computed no logits, and maybe skipped
// upper-layer rows, that the item's later pieces were to make whole. The
// session then holds tokens its last logits and upper-layer state do not
// cover; Generate, Complete, Fork and SaveSession refuse it by name
// (SessionEntry::CheckStateWhole) until an Append of at least the
// upper-layer reach + 1 tokens completes it. The failure is injected by a
// wrapper that refuses the session in PrepareSessionForStep, the path a
// failed backend step takes for the scheduler
// (tests/test_util/wrapping_backend.h).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/session.h"
#include "server/scheduler.h"
#include "server/session_manager.h"
#include "tests/server/test_util/scheduler_items.h"
#include "tests/test_util/random_model.h"
#include "tests/test_util/wrapping_backend.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

std::vector<float> LastLogits(SessionEntry& entry) {
  std::vector<float> logits;
  REQUIRE(entry
              .RunStep([&](Session& s) {
                logits.assign(s.last_logits().begin(), s.last_logits().end());
                return absl::OkStatus();
              })
              .ok());
  return logits;
}

TEST_CASE("an Append that fails after a piece with tokens following leaves its session refused "
          "for reading, by name, until an Append of the reach + 1 tokens completes it",
          "[server][scheduler]") {
  const ModelConfig config = drt::testing::TinyConfig();
  const ModelWeights weights = drt::testing::RandomWeights(config, 31);
  drt::testing::WrappingBackend backend(MakeCpuBackend(config, weights, {}));
  REQUIRE(backend.runs_mixed_lower_only_forwards());
  const int64_t reach = backend.upper_layer_reach();
  SessionManager manager(backend, SessionLimits{});

  // 3 pieces of kPiece tokens; the second step fails for the session.
  constexpr int64_t kPiece = 40;
  const BackendSession* failing = nullptr;
  SchedulerOptions options;
  options.step_tokens = kPiece;
  options.on_step_formed = [&](const StepRecord& step) {
    if (step.index == 2) backend.Refuse(failing, absl::InternalError("injected step failure"));
  };
  Scheduler scheduler(backend, options);

  const std::vector<int32_t> prompt = drt::testing::RandomTokens(config, 3 * kPiece, 5);
  const std::vector<int32_t> one = drt::testing::RandomTokens(config, 1, 6);
  const std::vector<int32_t> more = drt::testing::RandomTokens(config, reach + 1, 7);
  auto entry = NewEntry(manager);
  REQUIRE(entry
              ->RunStep([&](Session& s) {
                failing = &s.backend_session();
                return absl::OkStatus();
              })
              .ok());
  const WorkResult failed = scheduler.Run(Prefill(*entry, prompt));
  REQUIRE_FALSE(failed.status.ok());
  CHECK_THAT(std::string(failed.status.message()), Contains("injected step failure"));
  CHECK(entry->tokens() == kPiece);  // the first piece ran, with tokens following

  const absl::Status refused = entry->CheckStateWhole();
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.message()), Contains("its last Append failed"));
  CHECK_THAT(std::string(refused.message()), Contains(entry->id()));
  entry->End();
  auto fork = manager.Fork(entry->id());
  REQUIRE_FALSE(fork.ok());
  CHECK(fork.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(fork.status().message()), Contains("its last Append failed"));
  CHECK(manager.count() == 1);  // nothing was forked

  // One more token is not enough: the skipped rows may lie up to the reach
  // before it.
  backend.Allow(failing);
  REQUIRE(entry->Begin(Activity::kAppending).ok());
  REQUIRE(scheduler.Run(Prefill(*entry, one)).status.ok());
  CHECK(entry->CheckStateWhole().code() == absl::StatusCode::kFailedPrecondition);
  // The reach + 1 tokens in one Append complete it.
  REQUIRE(scheduler.Run(Prefill(*entry, more)).status.ok());
  REQUIRE(entry->CheckStateWhole().ok());
  const std::vector<float> repaired = LastLogits(*entry);
  entry->End();
  CHECK(manager.Fork(entry->id()).ok());

  // Its last logits are those of a session that appended the same tokens
  // without failing, cut the same way by the scheduler except at the
  // failure (other GEMM groupings: issue 11's batching bound, 1e-5 relative
  // to the largest logit, as the other cut comparisons use; the value here
  // was not recorded, the INFO prints it on failure).
  std::vector<int32_t> held(prompt.begin(), prompt.begin() + kPiece);
  held.insert(held.end(), one.begin(), one.end());
  held.insert(held.end(), more.begin(), more.end());
  auto reference = NewEntry(manager);
  REQUIRE(scheduler.Run(Prefill(*reference, held)).status.ok());
  const std::vector<float> expected = LastLogits(*reference);
  reference->End();
  REQUIRE(repaired.size() == expected.size());
  float largest = 0, difference = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    largest = std::max(largest, std::abs(expected[i]));
    difference = std::max(difference, std::abs(repaired[i] - expected[i]));
  }
  INFO("relative difference " << difference / largest);
  CHECK(difference <= 1e-5f * largest);
}

}  // namespace
}  // namespace drt::server

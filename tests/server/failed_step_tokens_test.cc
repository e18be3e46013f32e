// WorkResult::tokens_done of an item whose step failed part way: a step's
// piece larger than one forward runs as several (engine/batch_step.h), and
// the tokens of the forwards before the failing one stay applied. The count
// is the session's growth, so an Append's accounting (PromptIngest,
// drt_tokens_ingested) matches what the session holds (review of the
// scheduler, finding 4: before, the step's applied tokens were left out).
// The failure is injected by a wrapper that refuses the session in
// PrepareSessionForStep on its second forward of the step, the path a CUDA
// session's chunk store finding no room to grow takes
// (tests/test_util/wrapping_backend.h).
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

TEST_CASE("an item whose step fails after an earlier forward of it ran counts the tokens that "
          "forward applied",
          "[server][scheduler]") {
  const ModelConfig config = drt::testing::TinyConfig();
  const ModelWeights weights = drt::testing::RandomWeights(config, 41);
  // Forwards of 4 chunks (8 positions each: 7 tokens and a landmark), so a
  // piece of 60 tokens runs as forwards of 28, 28 and 4.
  CpuBackendOptions cpu;
  cpu.max_step_positions = 32;
  drt::testing::WrappingBackend backend(MakeCpuBackend(config, weights, cpu));
  REQUIRE(backend.max_step_positions() == 32);
  SessionManager manager(backend, SessionLimits{});
  auto entry = NewEntry(manager);
  const BackendSession* failing = nullptr;
  REQUIRE(entry
              ->RunStep([&](Session& s) {
                failing = &s.backend_session();
                return absl::OkStatus();
              })
              .ok());

  // Steps of 60 tokens; the item fails in the step given, in the second
  // forward of its piece there.
  const int64_t failing_step = GENERATE(1, 2);
  INFO("fails in step " << failing_step);
  SchedulerOptions options;
  options.step_tokens = 60;
  options.on_step_formed = [&](const StepRecord& step) {
    if (step.index == failing_step) {
      backend.RefuseAfter(failing, 1, absl::InternalError("injected forward failure"));
    }
  };
  Scheduler scheduler(backend, options);
  const std::vector<int32_t> prompt = drt::testing::RandomTokens(config, 180, 5);
  const WorkResult result = scheduler.Run(Prefill(*entry, prompt));
  REQUIRE_FALSE(result.status.ok());
  CHECK_THAT(std::string(result.status.message()), Contains("injected forward failure"));

  // The session grew by the steps before and the first forward of the
  // failing one; tokens_done says so.
  const int64_t held = entry->tokens();
  CHECK(held > 60 * (failing_step - 1));
  CHECK(held < 60 * failing_step);
  CHECK(result.tokens_done == held);
  entry->End();
}

}  // namespace
}  // namespace drt::server

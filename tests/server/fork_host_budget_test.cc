// SessionManager::Fork and the host-memory budget: a backend session whose
// fork may copy chunks into new host memory (the CUDA auto chunk tier's
// device-tier session forked onto the host tier when the device has no
// room, BackendSession::fork_host_bytes_at_most) is forked only when that
// fits the budget, together with the window and open chunk every fork
// copies; RESOURCE_EXHAUSTED naming the budget otherwise, and nothing
// changes. A wrapper around the CPU backend reports those bytes
// (tests/test_util/wrapping_backend.h).
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/session.h"
#include "server/session_manager.h"
#include "tests/test_util/random_model.h"
#include "tests/test_util/wrapping_backend.h"

namespace drt::server {
namespace {

using Catch::Matchers::Contains;

constexpr int64_t kMiB = int64_t{1} << 20;

TEST_CASE("a fork that may copy chunks to host memory must fit the host budget",
          "[server][memory]") {
  const ModelConfig config = drt::testing::TinyConfig();
  const ModelWeights weights = drt::testing::RandomWeights(config, 12);
  drt::testing::WrappingBackend backend(MakeCpuBackend(config, weights, {}));
  SessionLimits limits;
  limits.host_memory_budget_bytes = 64 * kMiB;
  SessionManager manager(backend, limits);
  auto created = manager.Create({});
  REQUIRE(created.ok());
  std::shared_ptr<SessionEntry> parent = *created;
  const std::vector<int32_t> tokens = drt::testing::RandomTokens(config, 40, 3);
  auto run = [&](int64_t fork_bytes) {
    REQUIRE(parent->Begin(Activity::kAppending).ok());
    absl::Status s = parent->RunStep([&](Session& session) -> absl::Status {
      if (session.num_tokens() == 0) {
        if (auto appended = session.Append(tokens); !appended.ok()) return appended.status();
      }
      static_cast<drt::testing::WrappedSession&>(session.backend_session())
          .set_fork_host_bytes(fork_bytes);
      return absl::OkStatus();
    });
    parent->End();
    REQUIRE(s.ok());
  };
  run(0);
  const int64_t held = manager.TotalHostBytes();
  REQUIRE(held > 0);
  REQUIRE(held < kMiB);  // the tiny model's session: a few KiB
  // What every fork allocates besides (review-server F2): its own window,
  // open chunk and selections (it shares the closed chunks).
  SessionMemory memory;
  REQUIRE(parent->Begin(Activity::kAppending).ok());
  REQUIRE(parent
              ->RunStep([&](Session& session) {
                memory = session.backend_session().memory();
                return absl::OkStatus();
              })
              .ok());
  parent->End();
  const int64_t copied =
      static_cast<int64_t>(memory.window_bytes + memory.open_chunk_bytes + memory.selection_bytes);
  REQUIRE(copied > 0);

  // The held bytes plus the fork's copies pass 64 MiB by one byte: refused.
  run(64 * kMiB - held - copied + 1);
  auto refused = manager.Fork(parent->id());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused.status().message()), Contains("host memory budget exhausted"));
  CHECK_THAT(std::string(refused.status().message()), Contains("--host_memory_budget_gb"));
  CHECK(manager.count() == 1);
  CHECK(manager.TotalHostBytes() == held);
  CHECK(parent->activity() == Activity::kIdle);  // the parent goes on

  // Exactly at the budget: forked.
  run(64 * kMiB - held - copied);
  auto fits = manager.Fork(parent->id());
  REQUIRE(fits.ok());
  CHECK(manager.count() == 2);
  // A fork that copies no chunks (every backend by default) still reserves
  // its own copies, which fit here.
  run(0);
  CHECK(manager.Fork(parent->id()).ok());
  CHECK(manager.count() == 3);
}

}  // namespace
}  // namespace drt::server

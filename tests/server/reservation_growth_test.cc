// An attached reservation (SessionEntry::AttachGrowthReservation) gives up
// only the net growth, since attach, of what its estimate covers (the
// session's chunk store and landmarks), not every increase of the session's
// total: the chunk K/V cache goes up and down from step to step, and each
// up-swing used to be taken from the reservation, so it could reach 0 before
// the work had allocated its chunks and let other requests pass the budget.
// The session's memory figures are scripted (tests/test_util/wrapping_backend.h).
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

constexpr int64_t kMiB = int64_t{1} << 20;

TEST_CASE("a reservation gives up the net growth of the chunks it covers, not fluctuations",
          "[server][memory]") {
  const ModelConfig config = drt::testing::TinyConfig();
  const ModelWeights weights = drt::testing::RandomWeights(config, 12);
  drt::testing::WrappingBackend backend(MakeCpuBackend(config, weights, {}));
  SessionLimits limits;
  limits.host_memory_budget_bytes = 64 * kMiB;
  SessionManager manager(backend, limits);
  auto created = manager.Create({});
  REQUIRE(created.ok());
  std::shared_ptr<SessionEntry> entry = *created;
  REQUIRE(entry->Begin(Activity::kAppending).ok());
  // One "step" that only makes the session report `memory`; the step's
  // refresh of the figures is what moves the reservation.
  auto step = [&](const SessionMemory& memory) {
    absl::Status s = entry->RunStep([&](Session& session) -> absl::Status {
      static_cast<drt::testing::WrappedSession&>(session.backend_session()).set_memory(memory);
      return absl::OkStatus();
    });
    REQUIRE(s.ok());
    REQUIRE(manager.TotalHostBytes() == static_cast<int64_t>(memory.total()));
  };
  SessionMemory memory;
  memory.window_bytes = 5000;
  memory.chunk_store_bytes = 100000;
  memory.landmark_bytes = 1000;
  step(memory);  // the figures before the work

  constexpr int64_t kReserved = 50000;
  auto reservation = manager.Reserve(kReserved, "the test's work");
  REQUIRE(reservation.ok());
  REQUIRE(manager.ReservedHostBytes() == kReserved);
  {
    ScopedGrowthReservation growth(*entry, *reservation);
    // The chunk K/V cache up, down, up again: no chunk was allocated, so
    // the whole reservation is still outstanding (the old code took each
    // up-swing: 50000 - 2 * 20000 = 10000 left).
    for (size_t kv : {20000, 0, 20000}) {
      memory.chunk_kv_cache_bytes = kv;
      step(memory);
      INFO("chunk K/V cache " << kv);
      CHECK(manager.ReservedHostBytes() == kReserved);
      CHECK(reservation->bytes() == kReserved);
    }
    // Window rings growing are not what it was reserved for either.
    memory.window_bytes += 7000;
    step(memory);
    CHECK(manager.ReservedHostBytes() == kReserved);
    // A chunk (rows and landmark): taken.
    memory.chunk_store_bytes += 12000;
    memory.landmark_bytes += 500;
    step(memory);
    CHECK(manager.ReservedHostBytes() == kReserved - 12500);
    // Rows mapped from disk (chunk store shrinks by 8000): net growth since
    // attach is 4500, so that much is taken, no more.
    memory.chunk_store_bytes -= 8000;
    step(memory);
    CHECK(manager.ReservedHostBytes() == kReserved - 4500);
    // Shrunk below the baseline: nothing taken, never more than reserved.
    memory.chunk_store_bytes = 10000;
    step(memory);
    CHECK(manager.ReservedHostBytes() == kReserved);
    // A chunk-store block larger than what is left: clamped at 0.
    memory.chunk_store_bytes = 100000 + 80000;
    step(memory);
    CHECK(manager.ReservedHostBytes() == 0);
    CHECK(reservation->bytes() == 0);
  }
  // Detached: a refresh changes the figure only.
  memory.chunk_store_bytes = 100000;
  step(memory);
  CHECK(manager.ReservedHostBytes() == 0);
  reservation->Release();
  CHECK(manager.ReservedHostBytes() == 0);
  entry->End();
}

}  // namespace
}  // namespace drt::server

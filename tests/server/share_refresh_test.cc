// The budget's shares of chunks shared by forks follow every change of a
// shared block's holders, not only Fork and Delete (review-serverfix F1,
// F3): a session deleted while its step runs is freed when the step ends,
// after Delete's own refresh, and a fork's copy-on-write of the shared
// tail block leaves the parent sole holder of the old one. In each case
// the idle holders' shares grow; the budget's sum (TotalHostBytes) must
// show that once the step has ended, without anyone else's activity.
//
// Sizes are hand-computed from the CPU chunk store (engine/cpu/chunk_store.h):
// blocks of 64 chunks, each chunk its encoder rows (enc_chunk_size x hidden)
// and its landmark (hidden), floats, the block's capacity reserved whole.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/session.h"
#include "server/session_manager.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

constexpr int64_t kChunksPerBlock = 64;  // engine/cpu/chunk_store.h

int64_t ChunkBytes() {
  const ModelConfig& config = FixtureModel::Get().model->config();
  return (config.enc_chunk_size + 1) * config.hidden_size * sizeof(float);
}

// A session holding `chunks` closed chunks (and a few tokens of an open one).
std::shared_ptr<SessionEntry> NewDocument(SessionManager& manager, int64_t chunks) {
  auto created = manager.Create({});
  REQUIRE(created.ok());
  std::shared_ptr<SessionEntry> entry = *created;
  const int64_t chunk = FixtureModel::Get().chunk_size();
  const std::vector<int32_t> tokens = RandomTokens(static_cast<size_t>(chunks * chunk + 10), 93);
  REQUIRE(entry->Begin(Activity::kAppending).ok());
  REQUIRE(entry->RunStep([&](Session& s) { return s.Append(tokens).status(); }).ok());
  entry->End();
  return entry;
}

// Runs a step on `entry` that deletes it meanwhile (as DeleteSession does
// while an Append's or a Generate's step runs): ABORTED, and the engine
// session is freed as the step ends.
void DeleteDuringStep(SessionManager& manager, SessionEntry& entry) {
  REQUIRE(entry.Begin(Activity::kAppending).ok());
  const absl::Status step = entry.RunStep([&](Session&) { return manager.Delete(entry.id()); });
  CHECK(step.code() == absl::StatusCode::kAborted);
  entry.End();
}

// A step that changes nothing: the session's figures refresh as it ends.
void NoOpStep(SessionEntry& entry) {
  REQUIRE(entry.Begin(Activity::kAppending).ok());
  REQUIRE(entry.RunStep([](Session&) { return absl::OkStatus(); }).ok());
  entry.End();
}

TEST_CASE("a parent deleted during its step leaves its idle fork counting the chunks in full",
          "[server][memory][fork]") {
  SessionManager manager(*FixtureModel::Get().backend, SessionLimits{});
  std::shared_ptr<SessionEntry> parent = NewDocument(manager, 2 * kChunksPerBlock);
  auto fork = manager.Fork(parent->id());
  REQUIRE(fork.ok());
  REQUIRE((*fork)->shared_bytes() == 2 * kChunksPerBlock * ChunkBytes());
  REQUIRE(manager.TotalHostBytes() < parent->host_bytes() + (*fork)->host_bytes());

  DeleteDuringStep(manager, *parent);
  // The fork alone holds the chunks now: the sum is all of its memory
  // (before the fix it still counted half of the shared blocks, until
  // someone forked or deleted something).
  INFO("sum " << manager.TotalHostBytes() << ", the fork holds " << (*fork)->host_bytes());
  CHECK(manager.TotalHostBytes() == (*fork)->host_bytes());
  REQUIRE(manager.Delete((*fork)->id()).ok());
  CHECK(manager.TotalHostBytes() == 0);
}

TEST_CASE("forks deleted during their steps leave the idle parent counting its chunks in full",
          "[server][memory][fork]") {
  SessionManager manager(*FixtureModel::Get().backend, SessionLimits{});
  std::shared_ptr<SessionEntry> parent = NewDocument(manager, 2 * kChunksPerBlock);
  const int64_t alone = manager.TotalHostBytes();
  REQUIRE(alone == parent->host_bytes());
  std::vector<std::shared_ptr<SessionEntry>> forks;
  for (int i = 0; i < 3; ++i) {
    auto fork = manager.Fork(parent->id());
    REQUIRE(fork.ok());
    forks.push_back(*fork);
  }
  for (const auto& fork : forks) DeleteDuringStep(manager, *fork);
  INFO("sum " << manager.TotalHostBytes() << ", the parent holds " << parent->host_bytes());
  CHECK(parent->shared_bytes() == 0);
  CHECK(manager.TotalHostBytes() == parent->host_bytes());
  CHECK(manager.TotalHostBytes() == alone);
}

TEST_CASE("a fork's copy-on-write of the shared tail block refreshes the idle parent's share",
          "[server][memory][fork]") {
  SessionManager manager(*FixtureModel::Get().backend, SessionLimits{});
  // Two full blocks and half of a third: the third (the tail) is shared,
  // not full, so the fork's next chunk copies it.
  std::shared_ptr<SessionEntry> parent =
      NewDocument(manager, 2 * kChunksPerBlock + kChunksPerBlock / 2);
  auto forked = manager.Fork(parent->id());
  REQUIRE(forked.ok());
  SessionEntry& fork = **forked;
  const int64_t block = kChunksPerBlock * ChunkBytes();  // capacity reserved whole
  REQUIRE(fork.shared_bytes() == 3 * block);

  // One chunk more on the fork: it copies the tail, and shares 2 blocks.
  const std::vector<int32_t> more =
      RandomTokens(static_cast<size_t>(FixtureModel::Get().chunk_size()), 94);
  REQUIRE(fork.Begin(Activity::kAppending).ok());
  REQUIRE(fork.RunStep([&](Session& s) { return s.Append(more).status(); }).ok());
  fork.End();
  REQUIRE(fork.shared_bytes() == 2 * block);

  // What the sum is once every session's figures are fresh (steps that
  // change nothing refresh them) must be what it already was: before the
  // fix the parent still counted half of the old tail (half a block short).
  const int64_t after_copy = manager.TotalHostBytes();
  NoOpStep(*parent);
  NoOpStep(fork);
  const int64_t fresh = manager.TotalHostBytes();
  INFO("after the copy " << after_copy << ", all refreshed " << fresh << ", half a block "
                         << block / 2);
  CHECK(after_copy == fresh);
  CHECK(parent->shared_bytes() == 2 * block);
}

}  // namespace
}  // namespace drt::server

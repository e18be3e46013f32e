// The host-memory budget and forks (review-server F2): a fork shares its
// parent's closed chunks, so the budget counts each shared chunk-store block
// once over all its holders (each at its share, SessionEntry::budget_bytes),
// not once per fork; and a fork is checked against the budget for what it
// does allocate, its own window and open chunk, on every backend.
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
using Catch::Matchers::Contains;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kChunksPerBlock = 64;  // engine/cpu/chunk_store.h
constexpr int64_t kBlocks = 3;

// Tokens that close kBlocks full blocks of chunks (and leave a few in the
// open chunk).
std::vector<int32_t> Document() {
  const int64_t chunk = FixtureModel::Get().chunk_size();
  return RandomTokens(static_cast<size_t>(kBlocks * kChunksPerBlock * chunk + 10), 91);
}

// The bytes of kBlocks full blocks of the fixture's chunk store, by hand.
int64_t DocumentChunkBytes() {
  const ModelConfig& config = FixtureModel::Get().model->config();
  const int64_t per_chunk = (config.enc_chunk_size + 1) * config.hidden_size * sizeof(float);
  return kBlocks * kChunksPerBlock * per_chunk;
}

SessionMemory MemoryOf(SessionEntry& entry) {
  SessionMemory memory;
  REQUIRE(entry.Begin(Activity::kAppending).ok());
  REQUIRE(entry
              .RunStep([&](Session& s) {
                memory = s.backend_session().memory();
                return absl::OkStatus();
              })
              .ok());
  entry.End();
  return memory;
}

std::shared_ptr<SessionEntry> NewDocument(SessionManager& manager) {
  auto created = manager.Create({});
  REQUIRE(created.ok());
  std::shared_ptr<SessionEntry> entry = *created;
  const std::vector<int32_t> tokens = Document();
  REQUIRE(entry->Begin(Activity::kAppending).ok());
  REQUIRE(entry->RunStep([&](Session& s) { return s.Append(tokens).status(); }).ok());
  entry->End();
  return entry;
}

// What a fork copies (it shares the closed chunks, landmarks and K/V cache).
int64_t CopiedBytes(const SessionMemory& memory) {
  return static_cast<int64_t>(memory.window_bytes + memory.open_chunk_bytes +
                              memory.selection_bytes);
}

TEST_CASE("N forks of a session count its chunks about once in the host budget, not N + 1 times",
          "[server][memory][fork]") {
  SessionManager manager(*FixtureModel::Get().backend, SessionLimits{});
  std::shared_ptr<SessionEntry> parent = NewDocument(manager);
  const SessionMemory parent_memory = MemoryOf(*parent);
  const int64_t chunk_bytes = DocumentChunkBytes();  // 6 MiB on the fixture
  REQUIRE(static_cast<int64_t>(parent_memory.chunk_store_bytes + parent_memory.landmark_bytes) ==
          chunk_bytes);
  REQUIRE(parent_memory.shared_bytes == 0);
  const int64_t before = manager.TotalHostBytes();
  REQUIRE(before == static_cast<int64_t>(parent_memory.total()));

  constexpr int kForks = 4;
  std::vector<std::shared_ptr<SessionEntry>> forks;
  int64_t forks_copied = 0;
  for (int i = 0; i < kForks; ++i) {
    auto fork = manager.Fork(parent->id());
    REQUIRE(fork.ok());
    forks.push_back(*fork);
    forks_copied += CopiedBytes(MemoryOf(**fork));
  }
  // Each shared block (and K/V cache entry) counts once over its holders,
  // to within a byte per holder of the integer shares; each fork adds what
  // it copied. Before the fix: `before` + 4 x (chunks + K/V cache + copy),
  // over 24 MiB more.
  const int64_t expected = before + forks_copied;
  const int64_t after = manager.TotalHostBytes();
  INFO("before " << before << ", after " << after << ", forks copied " << forks_copied);
  CHECK(after <= expected);
  CHECK(after >= expected - 4096);
  // SessionInfo's host_bytes still reports all the memory each reads.
  for (const auto& fork : forks) CHECK(fork->host_bytes() >= chunk_bytes);
  CHECK(parent->shared_bytes() == chunk_bytes);

  // The parent goes: its chunks live on in the forks, still counted once.
  REQUIRE(manager.Delete(parent->id()).ok());
  const int64_t without_parent = manager.TotalHostBytes();
  const int64_t expected_without = before - CopiedBytes(parent_memory) + forks_copied;
  INFO("without the parent " << without_parent << ", expected " << expected_without);
  CHECK(without_parent <= expected_without);
  CHECK(without_parent >= expected_without - 4096);
  for (const auto& fork : forks) REQUIRE(manager.Delete(fork->id()).ok());
  CHECK(manager.TotalHostBytes() == 0);
}

TEST_CASE("a fork is refused when its own copy does not fit the host budget, and changes nothing",
          "[server][memory][fork]") {
  SessionLimits limits;
  limits.host_memory_budget_bytes = 64 * kMiB;
  SessionManager manager(*FixtureModel::Get().backend, limits);
  std::shared_ptr<SessionEntry> parent = NewDocument(manager);
  const int64_t held = manager.TotalHostBytes();
  const int64_t copied = CopiedBytes(MemoryOf(*parent));
  REQUIRE(copied > 0);
  REQUIRE(held + copied < 64 * kMiB);
  {
    // Running requests leave one byte less than the fork's copy.
    auto others = manager.Reserve(64 * kMiB - held - copied + 1, "others");
    REQUIRE(others.ok());
    auto refused = manager.Fork(parent->id());
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK_THAT(std::string(refused.status().message()), Contains("host memory budget exhausted"));
    CHECK_THAT(std::string(refused.status().message()), Contains("the fork's own copy"));
    CHECK(manager.count() == 1);
    CHECK(manager.TotalHostBytes() == held);
    CHECK(manager.ReservedHostBytes() == others->bytes());
    CHECK(parent->activity() == Activity::kIdle);
  }
  {
    // Exactly the fork's copy left: forked, and its reservation released.
    auto others = manager.Reserve(64 * kMiB - held - copied, "others");
    REQUIRE(others.ok());
    auto fork = manager.Fork(parent->id());
    REQUIRE(fork.ok());
    CHECK(manager.count() == 2);
    CHECK(manager.ReservedHostBytes() == others->bytes());
  }
  CHECK(manager.ReservedHostBytes() == 0);
}

// The reviewer's scenario through the service: a budget that holds the
// document about twice, the document forked 4 times (a question each),
// then small Appends on a fork and on a new session. Before the fix the
// forks were counted 5 times over, past the budget, and both Appends were
// refused "host memory budget exhausted".
TEST_CASE("after forking a long session several times, small Appends still fit the budget",
          "[server][memory][fork]") {
  int64_t document_bytes = 0;
  {
    SessionManager measure(*FixtureModel::Get().backend, SessionLimits{});
    document_bytes = NewDocument(measure)->host_bytes();
  }
  ServiceOptions options = SmallOptions();
  options.host_memory_budget_bytes = document_bytes * 5 / 2;
  InProcessServer server(options);
  drt::v1::Drt::Stub& stub = server.stub();
  const std::string id = NewSession(stub);
  REQUIRE(AppendOnce(stub, id, Document()).ok());
  std::vector<std::string> forks;
  for (int i = 0; i < 4; ++i) {
    InfoResult fork = ForkSession(stub, id);
    INFO("fork " << i << ": " << fork.status.error_message());
    REQUIRE(fork.status.ok());
    forks.push_back(fork.info.session_id());
  }
  const std::vector<int32_t> question = RandomTokens(50, 92);
  const grpc::Status on_fork = AppendOnce(stub, forks[0], question);
  INFO("Append on a fork: " << on_fork.error_message());
  CHECK(on_fork.ok());
  const std::string other = NewSession(stub);
  const grpc::Status on_new = AppendOnce(stub, other, question);
  INFO("Append on a new session: " << on_new.error_message());
  CHECK(on_new.ok());
}

}  // namespace
}  // namespace drt::server

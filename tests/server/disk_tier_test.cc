// The disk tier (docs/state_format.md, "Disk tier"): with --state_dir, whole
// blocks of closed chunks on disk are read from the memory-mapped chunk logs
// and freed from RAM. Checked against the same sessions on a store that
// keeps every chunk in RAM (disk_tier off): the same tokens and logprobs,
// exactly, before and after a restart, for a fork whose block straddles its
// parent's log and its own; and RAM figures that drop by exactly the mapped
// blocks' K/V.
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/session_state.h"
#include "server/chunk_log_mapping.h"
#include "server/state_store.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using Catch::Matchers::Contains;
using testing::DurableOptions;
using testing::DurableServer;
using testing::FixtureModel;
using testing::GreedyOnFork;
using testing::Memory;
using testing::RandomTokens;

TEST_CASE("the disk tier reads chunks from the logs and continues exactly", "[disk_tier]") {
  const ModelConfig& config = FixtureModel::Get().model->config();
  const int64_t chunk = config.enc_chunk_size;
  // Stored bytes of one closed chunk besides its landmark (fp32 encoder
  // rows, enc_chunk_size x d; K/V are made from them when read).
  const size_t chunk_kv = config.enc_chunk_size * config.hidden_size * sizeof(float);
  drt::testing::TempDir tier_dir, ram_dir;
  StateStoreOptions ram_options = DurableOptions(ram_dir.path());
  ram_options.disk_tier = false;
  const std::vector<int32_t> prompt = RandomTokens(150 * chunk + 17, 7);  // 150 closed chunks
  const std::vector<int32_t> more = RandomTokens(50 * chunk, 8);
  std::string parent, child;
  std::pair<std::vector<int32_t>, std::vector<float>> parent_next, child_next;
  {
    DurableServer tier(tier_dir.path());
    DurableServer ram(ram_options);
    parent = tier.Create();
    const std::string ram_parent = ram.Create();
    tier.Append(parent, prompt);
    ram.Append(ram_parent, prompt);
    const int64_t unit = 64;  // the CPU backend maps whole 64-chunk blocks
    const SessionMemory mapped = Memory(tier, parent);
    const SessionMemory in_ram = Memory(ram, ram_parent);
    REQUIRE(mapped.mapped_chunk_bytes == 2 * unit * chunk_kv);  // chunks 0..127; 128..149 stay
    REQUIRE(in_ram.mapped_chunk_bytes == 0);
    REQUIRE(in_ram.chunk_store_bytes - mapped.chunk_store_bytes == 2 * unit * chunk_kv);
    REQUIRE(mapped.landmark_bytes == in_ram.landmark_bytes);  // landmarks stay in RAM
    // What ListSessions reports (SessionInfo.host_bytes, .mapped_bytes).
    auto entry = tier.sessions->Find(parent);
    REQUIRE(entry.ok());
    REQUIRE((*entry)->mapped_bytes() == static_cast<int64_t>(mapped.mapped_chunk_bytes));
    REQUIRE((*entry)->host_bytes() == static_cast<int64_t>(mapped.total()));

    REQUIRE(GreedyOnFork(tier, parent, 12) == GreedyOnFork(ram, ram_parent, 12));

    // The fork's block 2 (chunks 128..191) lies in its parent's log up to
    // chunk 149 and in its own after: one mapping over two files.
    child = tier.Fork(parent);
    const std::string ram_child = ram.Fork(ram_parent);
    tier.Append(child, more);
    ram.Append(ram_child, more);
    REQUIRE(Memory(tier, child).mapped_chunk_bytes == 3 * unit * chunk_kv);
    REQUIRE(Memory(tier, parent).mapped_chunk_bytes == 2 * unit * chunk_kv);
    REQUIRE(tier.Greedy(child, 12) == ram.Greedy(ram_child, 12));
    REQUIRE(tier.Greedy(parent, 5) == ram.Greedy(ram_parent, 5));
    parent_next = GreedyOnFork(ram, ram_parent, 12);
    child_next = GreedyOnFork(ram, ram_child, 12);
  }
  // After a restart the sessions are restored through the mapping: their
  // mapped blocks' encoder rows are never read into RAM.
  DurableServer tier(tier_dir.path());
  REQUIRE(tier.report.quarantined.empty());
  REQUIRE(Memory(tier, parent).mapped_chunk_bytes == 2 * 64 * chunk_kv);
  REQUIRE(Memory(tier, child).mapped_chunk_bytes == 3 * 64 * chunk_kv);
  REQUIRE(tier.Greedy(parent, 12) == parent_next);
  REQUIRE(tier.Greedy(child, 12) == child_next);
}

TEST_CASE("chunk log mappings refuse what is not on disk, naming it", "[disk_tier]") {
  const ModelConfig& config = FixtureModel::Get().model->config();
  drt::testing::TempDir dir;
  {
    DurableServer server(dir.path());
    const std::string id = server.Create();
    server.Append(id, RandomTokens(3 * config.enc_chunk_size, 9));
  }
  const std::string log = dir.path() + "/chunks/missing.log";
  auto missing = MapChunkLogs({{"missing", 3}}, {log}, 0, 3, config);
  REQUIRE(missing.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(missing.status().message()), Contains(log));
  // Beyond the segments' chunks.
  std::vector<ChunkSegment> segments = {{"x", 2}};
  auto beyond = MapChunkLogs(segments, {log}, 2, 3, config);
  REQUIRE(beyond.status().code() == absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace drt::server

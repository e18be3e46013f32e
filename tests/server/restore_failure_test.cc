// Start-up restores that fail after every file check passed
// (server/state_store.h, RestoreAll): the data is whole, the environment
// is not (vm.max_map_count, EMFILE). A session whose chunks cannot all be
// mapped keeps the blocks it mapped, comes back with the rest in memory and
// continues exactly; a session whose restore fails otherwise, or whose
// unmapped chunks do not fit the host budget, goes to DIR/quarantine/ with
// every chunk log it needs that no restored session uses, and nothing of it
// is deleted. (These used to lose the session's chunk log: it was neither
// moved nor kept, and the sweep of unused logs deleted it.)
//
// The failures are injected through StateStoreOptions::restore_io_for_test,
// which wraps the mapper and reader a session's restore uses.
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

#include "engine/cpu/chunk_store.h"
#include "server/state_store.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using testing::DurableOptions;
using testing::DurableServer;
using testing::FixtureModel;
using testing::GreedyOnFork;
using testing::Memory;
using testing::RandomTokens;

// Options whose restore of the sessions in `no_map` fails every mapping
// (as mmap does at vm.max_map_count) and of those in `no_read` fails every
// chunk read (as an open does at EMFILE).
StateStoreOptions FailingOptions(const std::string& dir, std::set<std::string> no_map,
                                 std::set<std::string> no_read) {
  StateStoreOptions options = DurableOptions(dir);
  options.restore_io_for_test = [no_map, no_read](std::string_view id, ChunkMapper& map,
                                                  ChunkReader& read) {
    if (no_map.contains(std::string(id)) && map != nullptr) {
      map = [](int64_t, int64_t) -> absl::StatusOr<std::shared_ptr<const MappedChunks>> {
        return absl::ResourceExhaustedError("cannot map chunks: Cannot allocate memory (test)");
      };
    }
    if (no_read.contains(std::string(id))) {
      read = [](int64_t, ChunkData&) {
        return absl::ResourceExhaustedError("cannot open: Too many open files (test)");
      };
    }
  };
  return options;
}

// Options whose restore of session `id` maps its first `units` blocks and
// then fails every mapping with `error` (by default as mmap does at
// vm.max_map_count, reached part-way).
StateStoreOptions MapFailsAfter(
    const std::string& dir, const std::string& id, int units,
    absl::Status error = absl::ResourceExhaustedError(
        "cannot map chunks: Cannot allocate memory (test)")) {
  StateStoreOptions options = DurableOptions(dir);
  options.restore_io_for_test = [id, units, error](std::string_view restoring, ChunkMapper& map,
                                                   ChunkReader&) {
    if (restoring != id) return;
    REQUIRE(map != nullptr);
    auto mapped = std::make_shared<int>(0);
    map = [inner = map, mapped, units, error](int64_t first, int64_t count)
        -> absl::StatusOr<std::shared_ptr<const MappedChunks>> {
      if (*mapped >= units) return error;
      ++*mapped;
      return inner(first, count);
    };
  };
  return options;
}

// The files in the session's quarantine directory (DIR/quarantine/<id>-<time>/).
std::set<std::string> QuarantinedFiles(const std::string& dir, const std::string& id) {
  std::set<std::string> names;
  for (const auto& sub : fs::directory_iterator(dir + "/quarantine")) {
    if (sub.path().filename().string().rfind(id + "-", 0) != 0) continue;
    for (const auto& file : fs::directory_iterator(sub.path())) {
      names.insert(file.path().filename().string());
    }
  }
  return names;
}

TEST_CASE("a session whose chunks cannot be mapped at start-up is restored in memory",
          "[state_store][restore_failure]") {
  const int64_t chunk = FixtureModel::Get().chunk_size();
  drt::testing::TempDir dir;
  std::string mapped, unmapped;
  std::pair<std::vector<int32_t>, std::vector<float>> mapped_next, unmapped_next;
  {
    DurableServer server(dir.path());
    mapped = server.Create();
    unmapped = server.Create();
    server.Append(mapped, RandomTokens(130 * chunk + 3, 21));    // 2 whole 64-chunk blocks
    server.Append(unmapped, RandomTokens(130 * chunk + 9, 22));  // 2 whole 64-chunk blocks
    REQUIRE(Memory(server, unmapped).mapped_chunk_bytes > 0);
    mapped_next = GreedyOnFork(server, mapped, 8);
    unmapped_next = GreedyOnFork(server, unmapped, 8);
  }
  {
    DurableServer server(FailingOptions(dir.path(), {unmapped}, {}));
    INFO((server.report.quarantined.empty() ? "" : server.report.quarantined[0]));
    REQUIRE(server.report.quarantined.empty());
    REQUIRE(server.Tokens().size() == 2);
    REQUIRE(Memory(server, mapped).mapped_chunk_bytes > 0);
    REQUIRE(Memory(server, unmapped).mapped_chunk_bytes == 0);  // all its chunks in RAM
    REQUIRE(server.Greedy(unmapped, 8) == unmapped_next);        // exact
    REQUIRE(server.Greedy(mapped, 8) == mapped_next);
    // Later writes of it keep its chunks in memory, as at run time after a
    // failed mapping, and its log stays whole.
    server.Append(unmapped, RandomTokens(2 * chunk, 23));
    REQUIRE(Memory(server, unmapped).mapped_chunk_bytes == 0);
    unmapped_next = GreedyOnFork(server, unmapped, 4);
  }
  // The next start maps it again.
  DurableServer server(dir.path());
  REQUIRE(server.report.quarantined.empty());
  REQUIRE(Memory(server, unmapped).mapped_chunk_bytes > 0);
  REQUIRE(server.Greedy(unmapped, 4) == unmapped_next);
}

TEST_CASE("a session whose mappings fail part-way at start-up keeps the blocks it mapped",
          "[state_store][restore_failure]") {
  FixtureModel& f = FixtureModel::Get();
  const ModelConfig& config = f.model->config();
  const int64_t chunk = f.chunk_size();
  // The encoder rows of one 64-chunk block (engine/cpu/chunk_store.h): what
  // mapping it frees, and what a block in RAM holds (its rows are reserved
  // for the whole block at its first chunk).
  const size_t block_rows = cpu::ChunkStore::kChunksPerBlock * config.enc_chunk_size *
                            config.hidden_size * sizeof(float);
  const int64_t per_chunk = f.backend->host_bytes_per_chunk();
  constexpr int64_t kClosed = 3 * 64 + 60;  // three whole blocks and 60 chunks
  drt::testing::TempDir dir;
  std::string id;
  std::pair<std::vector<int32_t>, std::vector<float>> next;
  {
    DurableServer server(dir.path());
    id = server.Create();
    server.Append(id, RandomTokens(kClosed * chunk + 5, 41));
    const SessionMemory m = Memory(server, id);
    REQUIRE(m.mapped_chunk_bytes == 3 * block_rows);
    REQUIRE(m.chunk_store_bytes == block_rows);  // the open block
    next = GreedyOnFork(server, id, 8);
  }

  SECTION("the first block stays mapped, the rest is read into RAM, the logits are the same") {
    {
      DurableServer server(MapFailsAfter(dir.path(), id, 1));
      INFO((server.report.quarantined.empty() ? "" : server.report.quarantined[0]));
      REQUIRE(server.report.quarantined.empty());
      const SessionMemory m = Memory(server, id);
      REQUIRE(m.mapped_chunk_bytes == block_rows);
      REQUIRE(m.chunk_store_bytes == 3 * block_rows);  // blocks 1 and 2 read in, and the open one
      REQUIRE(server.Greedy(id, 8) == next);           // exact
      // As at run time after a failed mapping, this process maps no more of
      // it: block 3 fills, and stays in RAM.
      server.Append(id, RandomTokens(10 * chunk, 42));
      REQUIRE(Memory(server, id).mapped_chunk_bytes == block_rows);
    }
    // The next start maps every whole block again.
    DurableServer server(dir.path());
    REQUIRE(server.report.quarantined.empty());
    REQUIRE(Memory(server, id).mapped_chunk_bytes == 4 * block_rows);
  }
  SECTION("a fork made after it maps none of the blocks its parent could not") {
    // The fork shares the parent's log, its mapped block 0 and its blocks
    // 1 and 2 in RAM. Mapping those in the fork would free nothing while
    // the parent lives (the parent keeps its copy) and take more of the
    // mappings whose lack stopped the parent's, so the fork inherits the
    // failed mapping: it asks the mapper for nothing, also once it fills
    // block 3 (as the parent, above). (It used to map blocks 1 and 2 with
    // its first write, each a second mapping of chunks already in RAM.)
    StateStoreOptions options = MapFailsAfter(dir.path(), id, 1);
    auto asked = std::make_shared<std::vector<std::pair<std::string, int64_t>>>();
    options.map_for_test = [asked](std::string_view session, ChunkMapper& map) {
      map = [asked, inner = map, session = std::string(session)](int64_t first, int64_t count) {
        asked->emplace_back(session, first);
        return inner(first, count);
      };
    };
    std::string fork;
    {
      DurableServer server(options);
      REQUIRE(server.report.quarantined.empty());
      fork = server.Fork(id);
      const SessionMemory m = Memory(server, fork);
      REQUIRE(m.mapped_chunk_bytes == block_rows);     // block 0, shared, mapped
      REQUIRE(m.chunk_store_bytes == 3 * block_rows);  // blocks 1 and 2 and the open one, shared
      REQUIRE(Memory(server, id).mapped_chunk_bytes == block_rows);  // the parent maps no more
      REQUIRE(server.Greedy(fork, 8) == next);
      // 252 + 10 chunks: block 3 of the fork fills and is written to its
      // own log; it stays in RAM too.
      server.Append(fork, RandomTokens(10 * chunk, 43));
      REQUIRE(Memory(server, fork).mapped_chunk_bytes == block_rows);
      INFO("mapper calls: " << asked->size());
      REQUIRE(asked->empty());
    }
    // The next start maps every whole block of both again.
    DurableServer server(dir.path());
    REQUIRE(server.report.quarantined.empty());
    REQUIRE(Memory(server, id).mapped_chunk_bytes == 3 * block_rows);
    REQUIRE(Memory(server, fork).mapped_chunk_bytes == 4 * block_rows);
  }
  SECTION("a host budget that fits the chunks left but not all of them restores it") {
    // Two blocks mapped: 252 - 128 = 124 chunks to read. The budget holds
    // those (and the session's RAM afterwards: 2 blocks of rows, landmarks,
    // windows), not all 252 chunks, which the old retry read.
    SessionLimits limits = testing::DurableLimits();
    limits.host_memory_budget_bytes = 200 * per_chunk;
    DurableServer server(MapFailsAfter(dir.path(), id, 2), limits);
    INFO((server.report.quarantined.empty() ? "" : server.report.quarantined[0]));
    REQUIRE(server.report.quarantined.empty());
    const SessionMemory m = Memory(server, id);
    REQUIRE(m.mapped_chunk_bytes == 2 * block_rows);
    REQUIRE(m.chunk_store_bytes == 2 * block_rows);
    REQUIRE(server.Greedy(id, 8) == next);
  }
  SECTION("a host budget short of the chunks left: quarantined, before they are read") {
    SessionLimits limits = testing::DurableLimits();
    limits.host_memory_budget_bytes = 120 * per_chunk;  // < 124 chunks
    // Counts the chunk reads: none may happen once the mapping failed.
    auto reads = std::make_shared<int64_t>(0);
    StateStoreOptions options = MapFailsAfter(dir.path(), id, 2);
    options.restore_io_for_test = [reads, wrap = options.restore_io_for_test](
                                      std::string_view restoring, ChunkMapper& map,
                                      ChunkReader& read) {
      wrap(restoring, map, read);
      read = [reads, inner = read](int64_t c, ChunkData& out) {
        ++*reads;
        return inner(c, out);
      };
    };
    DurableServer server(options, limits);
    REQUIRE(server.report.quarantined.size() == 1);
    const std::string& line = server.report.quarantined[0];
    INFO(line);
    REQUIRE_THAT(line, Contains(id));
    REQUIRE_THAT(line, Contains("vm.max_map_count"));
    REQUIRE_THAT(line, Contains("Cannot allocate memory (test)"));
    REQUIRE_THAT(line, Contains(absl::StrFormat("those 124 chunks into memory (%d bytes", 124 * per_chunk)));
    REQUIRE_THAT(line, Contains(absl::StrFormat("host memory budget (%d bytes", 120 * per_chunk)));
    REQUIRE(*reads == 0);
    REQUIRE(QuarantinedFiles(dir.path(), id) == std::set<std::string>{id + ".state", id + ".log"});
    REQUIRE(server.Tokens().empty());
  }
  SECTION("out of file descriptors part-way: the line says to raise the open-file limit") {
    SessionLimits limits = testing::DurableLimits();
    limits.host_memory_budget_bytes = 120 * per_chunk;  // < 124 chunks
    DurableServer server(
        MapFailsAfter(dir.path(), id, 2,
                      absl::FailedPreconditionError(
                          "cannot open x.log to map its chunks: Too many open files (test)")),
        limits);
    REQUIRE(server.report.quarantined.size() == 1);
    const std::string& line = server.report.quarantined[0];
    INFO(line);
    REQUIRE_THAT(line, Contains("Too many open files (test)"));
    REQUIRE_THAT(line, Contains("ulimit -n"));
    REQUIRE_THAT(line, !Contains("vm.max_map_count"));
  }
}

TEST_CASE("a fork whose first unmapped block spans its parent's log and its own reads across both",
          "[state_store][restore_failure]") {
  FixtureModel& f = FixtureModel::Get();
  const ModelConfig& config = f.model->config();
  const int64_t chunk = f.chunk_size();
  const size_t block_rows = cpu::ChunkStore::kChunksPerBlock * config.enc_chunk_size *
                            config.hidden_size * sizeof(float);
  drt::testing::TempDir dir;
  std::string parent, fork;
  std::pair<std::vector<int32_t>, std::vector<float>> next;
  {
    DurableServer server(dir.path());
    parent = server.Create();
    server.Append(parent, RandomTokens(100 * chunk + 2, 61));
    fork = server.Fork(parent);  // names the parent's log (100 chunks), then its own
    server.Append(fork, RandomTokens(60 * chunk, 62));
    // 160 closed chunks: block 1, [64, 128), is 36 of the parent's log and
    // 28 of the fork's.
    REQUIRE(Memory(server, fork).mapped_chunk_bytes == 2 * block_rows);
    next = GreedyOnFork(server, fork, 8);
  }
  DurableServer server(MapFailsAfter(dir.path(), fork, 1));
  INFO((server.report.quarantined.empty() ? "" : server.report.quarantined[0]));
  REQUIRE(server.report.quarantined.empty());
  const SessionMemory m = Memory(server, fork);
  REQUIRE(m.mapped_chunk_bytes == block_rows);
  REQUIRE(m.chunk_store_bytes == 2 * block_rows);  // block 1 read in, and the open one
  REQUIRE(server.Greedy(fork, 8) == next);          // exact
}

// The store records which leading chunks a restored session maps
// (chunks_mapped), and its writes after the restart map from there on: the
// next whole block with one mapping call, never the blocks the restore
// mapped again. Mapping those again changes nothing in the session (a block
// mapped already stays as it is, and the new mapping is unmapped when the
// call returns) but wastes an open, mmap and munmap per such block at the
// first write after the restart (or after a fork). So the test counts the
// mapper's calls. A fork made then starts from the same prefix.
TEST_CASE("a restored session's next write maps only its next whole block",
          "[state_store][restore_failure][disk_tier]") {
  FixtureModel& f = FixtureModel::Get();
  const ModelConfig& config = f.model->config();
  const int64_t chunk = f.chunk_size();
  const size_t block_rows = cpu::ChunkStore::kChunksPerBlock * config.enc_chunk_size *
                            config.hidden_size * sizeof(float);
  drt::testing::TempDir dir;
  std::string id;
  {
    DurableServer server(dir.path());
    id = server.Create();
    server.Append(id, RandomTokens(100 * chunk + 7, 71));  // block 0 mapped, 36 chunks in RAM
    REQUIRE(Memory(server, id).mapped_chunk_bytes == block_rows);
  }
  StateStoreOptions options = DurableOptions(dir.path());
  auto asked = std::make_shared<std::vector<std::pair<int64_t, int64_t>>>();
  options.map_for_test = [asked](std::string_view, ChunkMapper& map) {
    map = [asked, inner = map](int64_t first,
                               int64_t count) -> absl::StatusOr<std::shared_ptr<const MappedChunks>> {
      asked->emplace_back(first, count);
      return inner(first, count);
    };
  };
  DurableServer server(options);  // maps block 0 at start-up (not through map_for_test)
  REQUIRE(server.report.quarantined.empty());
  REQUIRE(Memory(server, id).mapped_chunk_bytes == block_rows);
  // 100 + 30 closed chunks: block 1, [64, 128), is whole and on disk.
  server.Append(id, RandomTokens(30 * chunk, 72));
  REQUIRE(*asked == std::vector<std::pair<int64_t, int64_t>>{{64, 64}});
  const SessionMemory m = Memory(server, id);
  REQUIRE(m.mapped_chunk_bytes == 2 * block_rows);
  REQUIRE(m.chunk_store_bytes == block_rows);  // only the open block 2 in RAM
  // A fork starts from its parent's mapped prefix (128 chunks): its first
  // write asks for no mapping of the blocks it shares mapped already.
  const std::string fork = server.Fork(id);
  REQUIRE(asked->size() == 1);
  REQUIRE(Memory(server, fork).mapped_chunk_bytes == 2 * block_rows);
}

// As after a failed mapping at start-up (above), a fork of a session whose
// mapping failed at run time inherits the failure: it shares the parent's
// unmapped blocks in RAM, so it asks the mapper for nothing, neither for
// those nor once a block of its own fills, and its mapped chunks stay its
// parent's prefix. (Before, its fork record's write mapped the parent's
// block 1 again, then its own block 2.)
TEST_CASE("a fork of a session whose mapping failed at run time maps nothing",
          "[state_store][restore_failure][disk_tier]") {
  FixtureModel& f = FixtureModel::Get();
  const ModelConfig& config = f.model->config();
  const int64_t chunk = f.chunk_size();
  const size_t block_rows = cpu::ChunkStore::kChunksPerBlock * config.enc_chunk_size *
                            config.hidden_size * sizeof(float);
  drt::testing::TempDir dir;
  StateStoreOptions options = DurableOptions(dir.path());
  // The mapper maps the parent's first block and fails its second, as mmap
  // does at vm.max_map_count; every call is recorded.
  std::string parent;
  auto parent_maps = std::make_shared<int>(0);
  auto asked = std::make_shared<std::vector<std::pair<std::string, int64_t>>>();
  options.map_for_test = [&parent, parent_maps, asked](std::string_view session,
                                                       ChunkMapper& map) {
    map = [&parent, parent_maps, asked, inner = map, session = std::string(session)](
              int64_t first, int64_t count) -> absl::StatusOr<std::shared_ptr<const MappedChunks>> {
      asked->emplace_back(session, first);
      if (session == parent && ++*parent_maps > 1) {
        return absl::ResourceExhaustedError("cannot map chunks: Cannot allocate memory (test)");
      }
      return inner(first, count);
    };
  };
  DurableServer server(options);
  parent = server.Create();
  // 130 closed chunks: blocks 0 and 1 whole; block 1's mapping fails.
  server.Append(parent, RandomTokens(130 * chunk + 5, 91));
  REQUIRE(*asked == std::vector<std::pair<std::string, int64_t>>{{parent, 0}, {parent, 64}});
  REQUIRE(Memory(server, parent).mapped_chunk_bytes == block_rows);
  const std::string fork = server.Fork(parent);
  REQUIRE(Memory(server, fork).mapped_chunk_bytes == block_rows);  // block 0, shared
  // 130 + 64 chunks: the fork's block 2 fills and is written to its own log.
  server.Append(fork, RandomTokens(64 * chunk, 92));
  INFO("mapper calls: " << asked->size());
  REQUIRE(asked->size() == 2);  // the parent's, above
  REQUIRE(Memory(server, fork).mapped_chunk_bytes == block_rows);
  REQUIRE(Memory(server, parent).mapped_chunk_bytes == block_rows);
}

// The budget a failed mapping's chunks must fit is what the sessions
// restored before it left (RestoreAll restores in id order), to the byte.
TEST_CASE("a partly mapped session's chunks must fit beside the sessions restored before it",
          "[state_store][restore_failure]") {
  FixtureModel& f = FixtureModel::Get();
  const int64_t chunk = f.chunk_size();
  const int64_t per_chunk = f.backend->host_bytes_per_chunk();
  drt::testing::TempDir dir;
  std::string early, target;
  {
    DurableServer server(dir.path());
    early = server.Create();
    target = server.Create();
    if (target < early) std::swap(early, target);  // `early` restores first
    server.Append(early, RandomTokens(10 * chunk + 1, 51));          // no whole block
    server.Append(target, RandomTokens((3 * 64 + 60) * chunk + 5, 52));
  }
  // What `early` holds once restored (it maps nothing, so always the same),
  // from a start with the default, ample budget.
  int64_t early_bytes = 0;
  {
    DurableServer server(MapFailsAfter(dir.path(), target, 2));
    REQUIRE(server.report.quarantined.empty());
    early_bytes = static_cast<int64_t>(Memory(server, early).total());
    REQUIRE(early_bytes >= 10 * per_chunk);
  }
  // Two of the target's blocks map: 252 - 128 = 124 chunks to read.
  const int64_t needed = early_bytes + 124 * per_chunk;
  SECTION("a budget of exactly that restores both") {
    SessionLimits limits = testing::DurableLimits();
    limits.host_memory_budget_bytes = needed;
    DurableServer server(MapFailsAfter(dir.path(), target, 2), limits);
    INFO((server.report.quarantined.empty() ? "" : server.report.quarantined[0]));
    REQUIRE(server.report.quarantined.empty());
    REQUIRE(server.Tokens().size() == 2);
  }
  SECTION("one byte less quarantines the target, not the session before it") {
    SessionLimits limits = testing::DurableLimits();
    limits.host_memory_budget_bytes = needed - 1;
    DurableServer server(MapFailsAfter(dir.path(), target, 2), limits);
    REQUIRE(server.report.quarantined.size() == 1);
    const std::string& line = server.report.quarantined[0];
    INFO(line);
    REQUIRE_THAT(line, Contains(target));
    REQUIRE_THAT(line, Contains(absl::StrFormat("those 124 chunks into memory (%d bytes",
                                                124 * per_chunk)));
    REQUIRE_THAT(line, Contains(absl::StrFormat("sessions restored before it hold %d bytes",
                                                early_bytes)));
    REQUIRE(server.Tokens() == std::map<std::string, int64_t>{{early, 10 * chunk + 1}});
  }
}

TEST_CASE("a session whose restore fails goes to quarantine with the chunk logs it needs",
          "[state_store][restore_failure]") {
  const int64_t chunk = FixtureModel::Get().chunk_size();
  drt::testing::TempDir dir;
  std::string lone, parent, child, other;
  std::pair<std::vector<int32_t>, std::vector<float>> child_next;
  {
    DurableServer server(dir.path());
    lone = server.Create();
    parent = server.Create();
    other = server.Create();
    server.Append(lone, RandomTokens(65 * chunk + 1, 31));  // one whole 64-chunk block to map
    server.Append(parent, RandomTokens(4 * chunk + 2, 32));
    child = server.Fork(parent);  // names the parent's log, then its own
    server.Append(child, RandomTokens(3 * chunk, 33));
    server.Append(other, RandomTokens(2 * chunk, 34));
    child_next = GreedyOnFork(server, child, 6);
  }
  const std::string chunks = dir.path() + "/chunks/";

  SECTION("alone: its own log goes with its state") {
    DurableServer server(FailingOptions(dir.path(), {}, {lone}));
    REQUIRE(server.report.quarantined.size() == 1);
    INFO(server.report.quarantined[0]);
    REQUIRE_THAT(server.report.quarantined[0], Contains(lone));
    REQUIRE_THAT(server.report.quarantined[0], Contains("Too many open files (test)"));
    REQUIRE(QuarantinedFiles(dir.path(), lone) ==
            std::set<std::string>{lone + ".state", lone + ".log"});
    REQUIRE_FALSE(fs::exists(chunks + lone + ".log"));
    REQUIRE(server.Tokens().size() == 3);  // parent, child, other restored
  }
  SECTION("a parent whose fork restores: its log stays for the fork, and is linked") {
    DurableServer server(FailingOptions(dir.path(), {}, {parent}));
    REQUIRE(server.report.quarantined.size() == 1);
    REQUIRE(QuarantinedFiles(dir.path(), parent) ==
            std::set<std::string>{parent + ".state", parent + ".log"});
    REQUIRE(fs::exists(chunks + parent + ".log"));
    REQUIRE(server.Greedy(child, 6) == child_next);  // the fork reads the parent's log
    // Deleting the fork (or its idle expiry) unlinks chunks/<parent>.log;
    // the quarantine keeps its own link, so the parent's data stays.
    REQUIRE(server.sessions->Delete(child).ok());
    REQUIRE_FALSE(fs::exists(chunks + parent + ".log"));
    REQUIRE(QuarantinedFiles(dir.path(), parent) ==
            std::set<std::string>{parent + ".state", parent + ".log"});
  }
  SECTION("a parent and its fork: each directory holds every log it names") {
    DurableServer server(FailingOptions(dir.path(), {}, {parent, child}));
    REQUIRE(server.report.quarantined.size() == 2);
    // The shared log is hard-linked into both, whatever the id order.
    REQUIRE(QuarantinedFiles(dir.path(), parent) ==
            std::set<std::string>{parent + ".state", parent + ".log"});
    REQUIRE(QuarantinedFiles(dir.path(), child) ==
            std::set<std::string>{child + ".state", child + ".log", parent + ".log"});
    REQUIRE_FALSE(fs::exists(chunks + parent + ".log"));
    REQUIRE_FALSE(fs::exists(chunks + child + ".log"));
    REQUIRE(server.Tokens() == std::map<std::string, int64_t>{
                                   {lone, 65 * chunk + 1}, {other, 2 * chunk}});
  }
  SECTION("reading the chunks it cannot map fails too: quarantined, the line names both errors") {
    // Its mapper fails; its reads fail only after that (a read before the
    // mapping would be another problem).
    auto map_failed = std::make_shared<bool>(false);
    StateStoreOptions options = DurableOptions(dir.path());
    options.restore_io_for_test = [&lone, map_failed](std::string_view id, ChunkMapper& map,
                                                      ChunkReader& read) {
      if (id != lone) return;
      REQUIRE(map != nullptr);
      map = [map_failed](int64_t, int64_t) -> absl::StatusOr<std::shared_ptr<const MappedChunks>> {
        *map_failed = true;
        return absl::ResourceExhaustedError("cannot map chunks: Cannot allocate memory (test)");
      };
      read = [map_failed, inner = read](int64_t chunk, ChunkData& out) -> absl::Status {
        if (*map_failed) return absl::ResourceExhaustedError("cannot open: Too many open files (test)");
        return inner(chunk, out);
      };
    };
    DurableServer server(options);
    REQUIRE(server.report.quarantined.size() == 1);
    INFO(server.report.quarantined[0]);
    REQUIRE_THAT(server.report.quarantined[0], Contains(lone));
    REQUIRE_THAT(server.report.quarantined[0], Contains("Cannot allocate memory (test)"));
    REQUIRE_THAT(server.report.quarantined[0], Contains("Too many open files (test)"));
    REQUIRE(QuarantinedFiles(dir.path(), lone) ==
            std::set<std::string>{lone + ".state", lone + ".log"});
    REQUIRE(server.Tokens().size() == 3);
  }
  SECTION("chunks it cannot map that pass the host budget are not read: quarantined") {
    // lone holds 65 closed chunks, none mapped; a budget of 2 chunks cannot
    // hold them in memory. (The other sessions map theirs, so they fit.)
    const int64_t per_chunk = FixtureModel::Get().backend->host_bytes_per_chunk();
    SessionLimits limits = testing::DurableLimits();
    limits.host_memory_budget_bytes = 2 * per_chunk;
    const StateStoreOptions options = FailingOptions(dir.path(), {lone}, {});
    DurableServer server(options, limits);
    REQUIRE(server.report.quarantined.size() == 1);
    INFO(server.report.quarantined[0]);
    REQUIRE_THAT(server.report.quarantined[0], Contains(lone));
    REQUIRE_THAT(server.report.quarantined[0], Contains("host memory budget"));
    REQUIRE_THAT(server.report.quarantined[0], Contains("vm.max_map_count"));
    REQUIRE(QuarantinedFiles(dir.path(), lone) ==
            std::set<std::string>{lone + ".state", lone + ".log"});
  }
  SECTION("a session that cannot be quarantined stays, with its logs") {
    // DIR/quarantine a file, so that making the session's directory in it
    // fails (ENOTDIR). (Names taken no longer do: another is chosen,
    // review-durable F7.)
    fs::remove_all(dir.path() + "/quarantine");
    std::ofstream(dir.path() + "/quarantine") << "x";
    {
      DurableServer server(FailingOptions(dir.path(), {}, {lone}));
      REQUIRE(server.report.quarantined.size() == 1);
      INFO(server.report.quarantined[0]);
      REQUIRE_THAT(server.report.quarantined[0], Contains("could not be quarantined"));
      REQUIRE(fs::exists(dir.path() + "/sessions/" + lone + ".state"));
      REQUIRE(fs::exists(chunks + lone + ".log"));
    }
    fs::remove(dir.path() + "/quarantine");
    // Tried again at the next start, whole.
    DurableServer server(dir.path());
    REQUIRE(server.report.quarantined.empty());
    REQUIRE(server.Tokens().at(lone) == 65 * chunk + 1);
  }
}

}  // namespace
}  // namespace drt::server

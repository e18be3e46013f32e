// The watch around a restore's reads and mappings (server/restore_mapped.h,
// RestoreWithinBudget), driven by stand-in backends that keep to the order
// ImportState promises (every mapping before the first read) or break it.
// The real backends are covered by restore_failure_test.cc; these pin that
// the budget cannot be got past by the order of the reads, and that a
// mapping after a read is refused, not taken.
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "server/restore_mapped.h"

namespace drt::server {
namespace {

using Catch::Matchers::Contains;

constexpr int64_t kUnit = 64;
constexpr int64_t kClosed = 3 * kUnit + 60;  // 252
constexpr int64_t kPerChunk = 1000;          // host bytes per chunk (any value)

// A mapping of chunks [first, first + count) with no contents.
class RangeMapping final : public MappedChunks {
 public:
  RangeMapping(int64_t first, int64_t count) : first_(first), count_(count) {}
  int64_t first() const override { return first_; }
  int64_t size() const override { return count_; }
  const float* landmark(int64_t) const override { return nullptr; }
  const float* encoder_rows(int64_t) const override { return nullptr; }
  size_t encoder_row_bytes() const override { return 0; }

 private:
  int64_t first_, count_;
};

// The reader and mapper a restore is given: maps `good` units, then fails
// with `error`; records every chunk read.
struct Io {
  int good = 1;
  absl::Status error = absl::ResourceExhaustedError("cannot map: Cannot allocate memory");
  int maps = 0;
  std::vector<int64_t> reads;

  ChunkMapper Map() {
    return [this](int64_t first, int64_t count)
               -> absl::StatusOr<std::shared_ptr<const MappedChunks>> {
      if (maps >= good) return error;
      ++maps;
      return std::make_shared<RangeMapping>(first, count);
    };
  }
  ChunkReader Read() {
    return [this](int64_t chunk, ChunkData&) {
      reads.push_back(chunk);
      return absl::OkStatus();
    };
  }
};

// A stand-in backend's import: maps units from 0 until one fails, then
// reads the chunks from there on in `order` (a permutation of them).
WatchedRestore MapThenRead(std::function<std::vector<int64_t>(int64_t from)> order) {
  return [order](const ChunkReader& read,
                 const ChunkMapper& map) -> absl::StatusOr<std::unique_ptr<Session>> {
    int64_t c = 0;
    for (; c + kUnit <= kClosed; c += kUnit) {
      if (!map(c, kUnit).ok()) break;
    }
    ChunkData data;
    for (int64_t chunk : order(c)) {
      if (absl::Status s = read(chunk, data); !s.ok()) return s;
    }
    return std::unique_ptr<Session>();  // (no session: only the watch is looked at)
  };
}

std::vector<int64_t> Descending(int64_t from) {
  std::vector<int64_t> chunks;
  for (int64_t c = kClosed - 1; c >= from; --c) chunks.push_back(c);
  return chunks;
}

TEST_CASE("the restore budget counts every chunk after the mapped ones, whatever the read order",
          "[restore_failure]") {
  // One unit maps: 252 - 64 = 188 chunks are read. Read from the last one
  // down, the first read is chunk 251, which `closed - chunk` counted as 1.
  Io io;
  SECTION("one byte short of them: refused before any read") {
    auto restored = RestoreWithinBudget(kClosed, kPerChunk, io.Read(), io.Map(),
                                        188 * kPerChunk - 1, 0, MapThenRead(Descending));
    REQUIRE(restored.status().code() == absl::StatusCode::kResourceExhausted);
    INFO(restored.status().message());
    REQUIRE_THAT(std::string(restored.status().message()),
                 Contains(absl::StrFormat("those 188 chunks into memory (%d bytes", 188 * kPerChunk)));
    REQUIRE_THAT(std::string(restored.status().message()), Contains("from chunk 64 on"));
    REQUIRE(io.reads.empty());
  }
  SECTION("exactly them: every one read") {
    auto restored = RestoreWithinBudget(kClosed, kPerChunk, io.Read(), io.Map(),
                                        188 * kPerChunk, 0, MapThenRead(Descending));
    REQUIRE(restored.ok());
    REQUIRE(restored->chunks_mapped == 64);
    REQUIRE(restored->chunks_read_after_failure == 188);
    REQUIRE(restored->bytes_read_after_failure == 188 * kPerChunk);
    REQUIRE(io.reads.size() == 188);
  }
}

TEST_CASE("a restore whose backend maps after it read is refused", "[restore_failure]") {
  Io io;
  io.good = 10;  // the mapper itself never fails here
  // Reads chunk 0, then maps [0, 64) and reads the rest: a mapping after a
  // read, which the budget cannot account for.
  const WatchedRestore read_first = [](const ChunkReader& read, const ChunkMapper& map)
      -> absl::StatusOr<std::unique_ptr<Session>> {
    ChunkData data;
    if (absl::Status s = read(0, data); !s.ok()) return s;
    if (!map(0, kUnit).ok()) {
      // As MapLeadingUnits does: a failed mapping is read instead.
      for (int64_t c = 1; c < kClosed; ++c) {
        if (absl::Status s = read(c, data); !s.ok()) return s;
      }
    }
    return std::unique_ptr<Session>();
  };
  auto restored = RestoreWithinBudget(kClosed, kPerChunk, io.Read(), io.Map(),
                                      int64_t{1} << 62, 0, read_first);
  REQUIRE(restored.status().code() == absl::StatusCode::kInternal);
  INFO(restored.status().message());
  REQUIRE_THAT(std::string(restored.status().message()),
               Contains("map chunks [0, 64) after it had read chunks"));
  REQUIRE(io.maps == 0);                          // the mapper was not asked
  REQUIRE(io.reads == std::vector<int64_t>{0});  // and nothing was read after it
}

TEST_CASE("the restore's quarantine line names what to raise for the mapping error",
          "[restore_failure]") {
  // The messages MapChunkLogs gives (server/chunk_log_mapping.cc).
  const absl::Status emfile = absl::FailedPreconditionError(absl::StrFormat(
      "cannot open /d/chunks/a.log to map its chunks: %s", std::strerror(EMFILE)));
  const absl::Status enfile = absl::FailedPreconditionError(absl::StrFormat(
      "cannot open /d/chunks/a.log to map its chunks: %s", std::strerror(ENFILE)));
  const absl::Status enomem = absl::ResourceExhaustedError(
      absl::StrFormat("cannot map chunks 0..63 of /d/chunks/a.log: %s", std::strerror(ENOMEM)));
  REQUIRE(MapErrorAdvice(emfile) == "raise the open-file limit, ulimit -n");
  REQUIRE(MapErrorAdvice(enfile) == "raise the open-file limit, ulimit -n");
  REQUIRE(MapErrorAdvice(enomem) == "raise vm.max_map_count");
  REQUIRE(MapErrorAdvice(absl::InternalError("something else")) ==
          "raise vm.max_map_count or the open-file limit, ulimit -n");

  // And the refusal carries it.
  Io io;
  io.error = emfile;
  auto restored = RestoreWithinBudget(kClosed, kPerChunk, io.Read(), io.Map(), 0, 0,
                                      MapThenRead(Descending));
  REQUIRE(restored.status().code() == absl::StatusCode::kResourceExhausted);
  INFO(restored.status().message());
  REQUIRE_THAT(std::string(restored.status().message()), Contains("ulimit -n"));
  REQUIRE_THAT(std::string(restored.status().message()), !Contains("vm.max_map_count"));
}

}  // namespace
}  // namespace drt::server

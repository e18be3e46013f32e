// MapLeadingUnits (engine/mapped_chunks.h), the disk tier's rule for a
// restore: leading whole units are mapped until the mapper fails, and the
// caller reads every chunk from there on (BackendSession::ImportState).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "engine/mapped_chunks.h"

namespace drt {
namespace {

using Catch::Matchers::Contains;

// A mapping of chunks [first, first + count) with no contents (only the
// range is read here).
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

// A mapper that maps `good` units, then fails (as mmap at vm.max_map_count);
// `calls` records each request.
ChunkMapper FailingAfter(int good, std::vector<std::pair<int64_t, int64_t>>& calls) {
  return [good, &calls](int64_t first, int64_t count)
             -> absl::StatusOr<std::shared_ptr<const MappedChunks>> {
    calls.emplace_back(first, count);
    if (static_cast<int>(calls.size()) > good) {
      return absl::ResourceExhaustedError("cannot map (test)");
    }
    return std::make_shared<RangeMapping>(first, count);
  };
}

TEST_CASE("map leading units: mapped up to the first failure, none tried after it",
          "[disk_tier]") {
  constexpr int64_t kUnit = 4;
  for (int good : {0, 1, 2, 5}) {
    INFO("units mapped before the failure: " << good);
    std::vector<std::pair<int64_t, int64_t>> calls;
    std::vector<int64_t> taken;
    // 18 chunks: 4 whole units and 2 left over.
    auto mapped = MapLeadingUnits(FailingAfter(good, calls), kUnit, 18,
                                  [&](std::shared_ptr<const MappedChunks> m) {
                                    taken.push_back(m->first());
                                    return absl::OkStatus();
                                  });
    REQUIRE(mapped.ok());
    const int64_t units = std::min(good, 4);
    REQUIRE(*mapped == units * kUnit);
    std::vector<int64_t> want_taken;
    for (int64_t u = 0; u < units; ++u) want_taken.push_back(u * kUnit);
    REQUIRE(taken == want_taken);
    // One request per unit mapped, one for the unit that failed (if any
    // was left), none after it and none for the partial unit.
    std::vector<std::pair<int64_t, int64_t>> want_calls;
    for (int64_t u = 0; u < std::min<int64_t>(units + 1, 4); ++u) {
      want_calls.emplace_back(u * kUnit, kUnit);
    }
    REQUIRE(calls == want_calls);
  }
}

TEST_CASE("map leading units: nothing without a mapper or a unit", "[disk_tier]") {
  std::vector<std::pair<int64_t, int64_t>> calls;
  const auto take = [](std::shared_ptr<const MappedChunks>) { return absl::OkStatus(); };
  REQUIRE(*MapLeadingUnits(nullptr, 4, 18, take) == 0);
  REQUIRE(*MapLeadingUnits(FailingAfter(9, calls), 0, 18, take) == 0);
  REQUIRE(*MapLeadingUnits(FailingAfter(9, calls), 4, 3, take) == 0);
  REQUIRE(calls.empty());
}

TEST_CASE("map leading units: a broken mapping or a refusal is an error", "[disk_tier]") {
  const auto take = [](std::shared_ptr<const MappedChunks>) { return absl::OkStatus(); };
  SECTION("null") {
    auto r = MapLeadingUnits(
        [](int64_t, int64_t) -> absl::StatusOr<std::shared_ptr<const MappedChunks>> {
          return nullptr;
        },
        4, 8, take);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(r.status().message()), Contains("[0, 4) gave nothing"));
  }
  SECTION("other chunks than asked") {
    auto r = MapLeadingUnits(
        [](int64_t first, int64_t count) -> absl::StatusOr<std::shared_ptr<const MappedChunks>> {
          return std::make_shared<RangeMapping>(first + 1, count);
        },
        4, 8, take);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(r.status().message()), Contains("[0, 4) gave chunks [1, 5)"));
  }
  SECTION("the backend refuses the second unit") {
    std::vector<std::pair<int64_t, int64_t>> calls;
    int taken = 0;
    auto r = MapLeadingUnits(FailingAfter(9, calls), 4, 12,
                             [&](std::shared_ptr<const MappedChunks>) {
                               return ++taken == 2 ? absl::FailedPreconditionError("refused (test)")
                                                   : absl::OkStatus();
                             });
    REQUIRE(r.status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE(calls.size() == 2);  // stops there
  }
}

}  // namespace
}  // namespace drt

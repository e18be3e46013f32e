// The launch plan of the fused decode GEMVs (kernels/decode_gemv_plan.h),
// without a GPU: which slices take the fused path, the refusals with the
// problem named, and the launch geometry against hand-computed counts for
// the 128M model's shapes (d 768, kv width 768, F 2048:
// tests/fixtures/reference_configs/drt-config_63.json), and the shared
// memory boundary (the normed rows plus 36 bytes of reduction scratch per
// row, within 48 KiB).
#include <string>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "kernels/decode_gemv_plan.h"

namespace drt::kernels {
namespace {

// The norm kernels' reduction scratch per row: 8 warp sums and a scale, fp32.
constexpr int64_t kScratch = (8 + 1) * 4;

DecodeGemvShape Shape(DecodeGemvKind kind, int64_t m, int64_t n, int64_t k, int64_t bytes = 2) {
  return DecodeGemvShape{kind, m, n, k, bytes};
}

// The refusal of `shape`, with every `words` in its message.
void CheckRefused(const DecodeGemvShape& shape, std::initializer_list<const char*> words) {
  const absl::StatusOr<DecodeGemvLaunch> launch = PlanDecodeGemv(shape);
  REQUIRE_FALSE(launch.ok());
  CHECK(launch.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(launch.status().message());
  INFO(message);
  for (const char* w : words) CHECK(absl::StrContains(message, w));
}

TEST_CASE("decode gemv plan: slices of 1..8 rows take the fused path when the option is on",
          "[decode_gemv_plan]") {
  CHECK_FALSE(UseDecodeGemv(false, 1));
  CHECK_FALSE(UseDecodeGemv(false, 8));
  CHECK(UseDecodeGemv(true, 1));
  CHECK(UseDecodeGemv(true, 8));
  CHECK_FALSE(UseDecodeGemv(true, 9));    // prefill keeps cuBLAS
  CHECK_FALSE(UseDecodeGemv(true, 64));
  CHECK_FALSE(UseDecodeGemv(true, 0));
}

TEST_CASE("decode gemv plan: the 128M model's launches", "[decode_gemv_plan]") {
  SECTION("Q, K, V stacked (n = 768 + 2 x 768): 2 rows per warp, 2304 / 16 = 144 blocks") {
    for (int64_t m : {1, 3, 8}) {
      const auto launch = PlanDecodeGemv(Shape(DecodeGemvKind::kNorm, m, 2304, 768));
      REQUIRE(launch.ok());
      CHECK(*launch == DecodeGemvLaunch{256, 2, 144, m * 768 * 2 + m * kScratch});
    }
  }
  SECTION("the GCA query (n = 768): 768 / 16 = 48 < 132 blocks, so 1 row per warp, 96 blocks") {
    const auto launch = PlanDecodeGemv(Shape(DecodeGemvKind::kNorm, 1, 768, 768, 4));
    REQUIRE(launch.ok());
    CHECK(*launch == DecodeGemvLaunch{256, 1, 96, 768 * 4 + kScratch});
  }
  SECTION("gate/up (F = 2048 pairs): one pair per warp, 2048 / 8 = 256 blocks") {
    const auto launch = PlanDecodeGemv(Shape(DecodeGemvKind::kNormSwiGlu, 8, 2048, 768, 4));
    REQUIRE(launch.ok());
    CHECK(*launch == DecodeGemvLaunch{256, 1, 256, 8 * 768 * 4 + 8 * kScratch});
  }
  SECTION("O and down (n = 768): 4 warps of one row, 768 / 4 = 192 blocks, no shared memory") {
    for (int64_t k : {768, 2048}) {
      const auto launch = PlanDecodeGemv(Shape(DecodeGemvKind::kAccumulate, 8, 768, k));
      REQUIRE(launch.ok());
      CHECK(*launch == DecodeGemvLaunch{128, 1, 192, 0});
    }
  }
}

TEST_CASE("decode gemv plan: n not a multiple of the block's rows rounds the blocks up",
          "[decode_gemv_plan]") {
  // 8 warps x 1 row: 100 rows need 13 blocks (the last has 4 rows).
  auto launch = PlanDecodeGemv(Shape(DecodeGemvKind::kNorm, 3, 100, 192));
  REQUIRE(launch.ok());
  CHECK(launch->rows_per_warp == 1);
  CHECK(launch->blocks == 13);
  // 2 rows per warp from 132 x 16 = 2112 rows; 2113 rows: 133 blocks, the
  // last warp with one real row.
  launch = PlanDecodeGemv(Shape(DecodeGemvKind::kNorm, 1, 2113, 192));
  REQUIRE(launch.ok());
  CHECK(launch->rows_per_warp == 2);
  CHECK(launch->blocks == 133);
  // 2111 rows: 2 rows per warp would give 132 blocks... (2111 + 15) / 16 =
  // 132, still at the target, so 2 rows.
  launch = PlanDecodeGemv(Shape(DecodeGemvKind::kNorm, 1, 2111, 192));
  REQUIRE(launch.ok());
  CHECK(launch->rows_per_warp == 2);
  CHECK(launch->blocks == 132);
  // 2096 rows: 131 blocks of 16 < 132, so 1 row per warp: 262 blocks.
  launch = PlanDecodeGemv(Shape(DecodeGemvKind::kNorm, 1, 2096, 192));
  REQUIRE(launch.ok());
  CHECK(launch->rows_per_warp == 1);
  CHECK(launch->blocks == 262);
  launch = PlanDecodeGemv(Shape(DecodeGemvKind::kAccumulate, 1, 1001, 192));
  REQUIRE(launch.ok());
  CHECK(launch->blocks == 251);  // ceil(1001 / 4)
}

TEST_CASE("decode gemv plan: bad shapes are refused, naming the problem", "[decode_gemv_plan]") {
  CheckRefused(Shape(DecodeGemvKind::kNorm, 9, 768, 768), {"9 input rows", "1..8", "cuBLAS"});
  CheckRefused(Shape(DecodeGemvKind::kAccumulate, 0, 768, 768), {"0 input rows"});
  CheckRefused(Shape(DecodeGemvKind::kNormSwiGlu, 1, 2048, 764),
               {"k=764", "multiple of 8", "16-byte"});
  // 4 fp32 per load would do for k = 764, but both types take the same rule.
  CheckRefused(Shape(DecodeGemvKind::kAccumulate, 1, 768, 764, 4), {"k=764", "multiple of 8"});
  CheckRefused(Shape(DecodeGemvKind::kNorm, 1, 0, 768), {"empty shape", "n=0"});
  CheckRefused(Shape(DecodeGemvKind::kNorm, 1, 768, 768, 3), {"element size 3"});
  // 8 fp32 rows of k = 2048: 64 KiB of normed rows + 288 bytes of scratch,
  // past the 48 KiB a launch gets without opting in.
  CheckRefused(Shape(DecodeGemvKind::kNorm, 8, 2048, 2048, 4),
               {"288 bytes of reduction scratch", "65824 bytes of shared memory", "past 49152"});
  // The same k in bf16, or fewer rows, fits: 32 KiB.
  CHECK(PlanDecodeGemv(Shape(DecodeGemvKind::kNorm, 8, 2048, 2048, 2)).ok());
  CHECK(PlanDecodeGemv(Shape(DecodeGemvKind::kNorm, 4, 2048, 2048, 4)).ok());
  // The accumulating GEMV keeps nothing in shared memory: any k.
  CHECK(PlanDecodeGemv(Shape(DecodeGemvKind::kAccumulate, 8, 768, 16384, 4)).ok());
}

TEST_CASE("decode gemv plan: shared memory counts the normed rows and the scratch, to 48 KiB",
          "[decode_gemv_plan]") {
  // 8 rows: 8 k e + 288 <= 49152. bf16 (e = 2): k <= 3054, so 3048 is the
  // largest multiple of 8 (49,056 bytes) and 3056 is refused (49,184: the
  // normed rows alone, 48,896, would have fit). fp32 (e = 4): k <= 1527,
  // so 1520 (48,928) and not 1528 (49,184).
  for (DecodeGemvKind kind : {DecodeGemvKind::kNorm, DecodeGemvKind::kNormSwiGlu}) {
    INFO(DecodeGemvKindName(kind));
    auto launch = PlanDecodeGemv(Shape(kind, 8, 256, 3048, 2));
    REQUIRE(launch.ok());
    CHECK(launch->shared_bytes == 49056);
    CheckRefused(Shape(kind, 8, 256, 3056, 2), {"49184 bytes of shared memory", "past 49152"});
    CheckRefused(Shape(kind, 8, 256, 3072, 2), {"49440 bytes of shared memory"});
    launch = PlanDecodeGemv(Shape(kind, 8, 256, 1520, 4));
    REQUIRE(launch.ok());
    CHECK(launch->shared_bytes == 48928);
    CheckRefused(Shape(kind, 8, 256, 1528, 4), {"49184 bytes of shared memory"});
    CheckRefused(Shape(kind, 8, 256, 1536, 4), {"49440 bytes of shared memory"});
    // One row of the same k: 3072 x 2 + 36 = 6180 bytes.
    launch = PlanDecodeGemv(Shape(kind, 1, 256, 3072, 2));
    REQUIRE(launch.ok());
    CHECK(launch->shared_bytes == 6180);
  }
}

TEST_CASE("decode gemv plan: a model is checked at its largest launches", "[decode_gemv_plan]") {
  CHECK(CheckDecodeGemvModel(768, 768, 2048, 2).ok());
  CHECK(CheckDecodeGemvModel(768, 768, 2048, 4).ok());
  CHECK(CheckDecodeGemvModel(64, 32, 128, 4).ok());  // the tests' tiny models
  // F = 2044: the down projection's k is not a multiple of 8.
  absl::Status s = CheckDecodeGemvModel(768, 768, 2044, 2);
  REQUIRE_FALSE(s.ok());
  CHECK(absl::StrContains(s.message(), "decode_fused_gemv cannot run this model"));
  CHECK(absl::StrContains(s.message(), "intermediate_size 2044"));
  CHECK(absl::StrContains(s.message(), "k=2044"));
  // d = 2048 in fp32: 8 normed rows need 64 KiB of shared memory.
  s = CheckDecodeGemvModel(2048, 512, 8192, 4);
  REQUIRE_FALSE(s.ok());
  CHECK(absl::StrContains(s.message(), "shared memory"));
  CHECK(CheckDecodeGemvModel(2048, 512, 8192, 2).ok());
  // The shared memory boundary (see above) at d: bf16 d = 3048 is the
  // largest taken, 3056 and 3072 are refused; fp32 1520 and 1528, 1536.
  CHECK(CheckDecodeGemvModel(3048, 1024, 8192, 2).ok());
  for (int64_t d : {3056, 3072}) {
    INFO("bf16 d " << d);
    s = CheckDecodeGemvModel(d, 1024, 8192, 2);
    REQUIRE_FALSE(s.ok());
    CHECK(absl::StrContains(s.message(), "decode_fused_gemv cannot run this model"));
    CHECK(absl::StrContains(s.message(), "shared memory"));
  }
  CHECK(CheckDecodeGemvModel(1520, 512, 4096, 4).ok());
  for (int64_t d : {1528, 1536}) {
    INFO("fp32 d " << d);
    s = CheckDecodeGemvModel(d, 512, 4096, 4);
    REQUIRE_FALSE(s.ok());
    CHECK(absl::StrContains(s.message(), "shared memory"));
  }
}

}  // namespace
}  // namespace drt::kernels

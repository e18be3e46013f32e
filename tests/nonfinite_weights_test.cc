// NaN and infinity in the weights are refused at load, naming the tensor and
// the element. The scan works on the stored bits (F32, F16, BF16) and is
// checked here against std::isfinite of the converted values.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/finite_scan.h"
#include "engine/safetensors.h"
#include "tests/test_util/safetensors_writer.h"
#include "tests/test_util/temp_dir.h"
#include "tests/test_util/tiny_model.h"
#include "tests/test_util/tiny_model_dir.h"

namespace drt {
namespace {

using Catch::Contains;
using testing::LoadTinyDirStatus;
using testing::MakeTinyModel;
using testing::TempDir;
using testing::TinyModel;

// The naive answer: convert each element and ask std::isfinite.
int64_t NaiveFirstNonFinite(const std::vector<uint16_t>& bits, DType dtype) {
  for (size_t i = 0; i < bits.size(); ++i) {
    const float value = dtype == DType::kF16 ? HalfToFloat(bits[i]) : BFloat16ToFloat(bits[i]);
    if (!std::isfinite(value)) return static_cast<int64_t>(i);
  }
  return -1;
}

int64_t NaiveFirstNonFinite(const std::vector<uint32_t>& bits) {
  for (size_t i = 0; i < bits.size(); ++i) {
    float value;
    std::memcpy(&value, &bits[i], sizeof(value));
    if (!std::isfinite(value)) return static_cast<int64_t>(i);
  }
  return -1;
}

template <typename T>
int64_t Scan(const std::vector<T>& bits, DType dtype) {
  return FirstNonFinite(reinterpret_cast<const std::byte*>(bits.data()), bits.size(), dtype);
}

TEST_CASE("FirstNonFinite agrees with std::isfinite on every f16 and bf16 pattern",
          "[loader][finite]") {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (uint32_t pattern = 0; pattern < 0x10000; ++pattern) {
      const std::vector<uint16_t> one = {static_cast<uint16_t>(pattern)};
      const int64_t expected = NaiveFirstNonFinite(one, dtype);
      if (Scan(one, dtype) != expected) {
        FAIL(DTypeName(dtype) << " pattern " << pattern);
      }
    }
  }
}

TEST_CASE("FirstNonFinite agrees with std::isfinite on f32 patterns", "[loader][finite]") {
  std::vector<uint32_t> patterns = {0x00000000u, 0x80000000u, 0x00000001u, 0x007FFFFFu,
                                    0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F800000u, 0xFF800000u,
                                    0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x3F800000u};
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) patterns.push_back(rng());
  for (uint32_t pattern : patterns) {
    const std::vector<uint32_t> one = {pattern};
    if (Scan(one, DType::kF32) != NaiveFirstNonFinite(one)) FAIL("f32 pattern " << pattern);
  }
}

TEST_CASE("FirstNonFinite finds the first bad element anywhere in a long tensor",
          "[loader][finite]") {
  // Positions around the scan's block edges and the ends, in a tensor that
  // is not a whole number of blocks.
  constexpr size_t kCount = 10007;
  for (size_t position : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{1023},
                          size_t{1024}, size_t{4097}, kCount - 1}) {
    INFO("position " << position);
    std::vector<uint32_t> f32(kCount, 0x3F800000u);  // 1.0f
    f32[position] = 0x7FC00000u;                      // NaN
    if (position + 5 < kCount) f32[position + 5] = 0x7F800000u;  // a later inf
    CHECK(Scan(f32, DType::kF32) == static_cast<int64_t>(position));
    std::vector<uint16_t> half(kCount, 0x3C00u);  // 1.0 in f16
    half[position] = 0xFC00u;                     // -inf
    CHECK(Scan(half, DType::kF16) == static_cast<int64_t>(position));
    std::vector<uint16_t> brain(kCount, 0x3F80u);  // 1.0 in bf16
    brain[position] = 0x7FC1u;                     // NaN
    CHECK(Scan(brain, DType::kBF16) == static_cast<int64_t>(position));
  }
  const std::vector<uint32_t> clean(kCount, 0x7F7FFFFFu);  // the largest finite float
  CHECK(Scan(clean, DType::kF32) == -1);
  CHECK(FirstNonFinite(nullptr, 0, DType::kF32) == -1);
}

// A tiny model whose tensor `name` holds `bits` at element `index`.
absl::Status LoadWithBadElement(const std::string& dtype, const std::string& name, size_t index,
                                uint32_t bits) {
  TempDir dir;
  TinyModel model = MakeTinyModel(dtype);
  const std::vector<int64_t> shape = {8, 8};
  std::vector<float> values = model.values.at(name);
  if (dtype == "F32") {
    std::vector<uint32_t> raw(values.size());
    std::memcpy(raw.data(), values.data(), values.size() * 4);
    raw[index] = bits;
    model.weights.SetValues(name, "F32", shape, raw);
  } else {
    std::vector<uint16_t> raw;
    for (float v : values) {
      raw.push_back(dtype == "F16" ? testing::ExactHalfBits(v) : testing::ExactBFloat16Bits(v));
    }
    raw[index] = static_cast<uint16_t>(bits);
    model.weights.SetValues(name, dtype, shape, raw);
  }
  return LoadTinyDirStatus(dir, model);
}

TEST_CASE("weights: NaN or infinity is refused naming the tensor and element",
          "[loader][weights][finite]") {
  struct Case {
    const char* dtype;
    uint32_t bits;
    const char* what;
  };
  const Case cases[] = {
      {"F32", 0x7FC00000u, "NaN"},  {"F32", 0x7F800000u, "infinity"},
      {"F32", 0xFF800000u, "infinity"}, {"F16", 0x7E00u, "NaN"},
      {"F16", 0xFC00u, "infinity"}, {"BF16", 0x7FC0u, "NaN"},
      {"BF16", 0x7F80u, "infinity"},
  };
  const std::string name = "model.upper_layers.0.1.gca.q_proj.weight";  // [8, 8]
  for (const Case& c : cases) {
    INFO(c.dtype << " bits " << c.bits);
    const absl::Status status = LoadWithBadElement(c.dtype, name, 13, c.bits);
    INFO(status.message());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(status.message()),
               Contains("tensor '" + name + "' holds " + c.what + " at element 13 of 64"));
  }
}

TEST_CASE("weights: an optional lm_head with NaN is refused too", "[loader][weights][finite]") {
  TempDir dir;
  TinyModel model = MakeTinyModel();
  std::vector<float> head(11 * 8, 0.5f);
  head[87] = std::numeric_limits<float>::quiet_NaN();
  model.weights.SetFloats("lm_head.weight", "F32", {11, 8}, head);
  const absl::Status status = LoadTinyDirStatus(dir, model);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()),
             Contains("tensor 'lm_head.weight' holds NaN at element 87 of 88"));
}

}  // namespace
}  // namespace drt

// The CUDA backend on every fixture model under tests/fixtures, in both
// precisions (engine/cuda/cuda_options.h CudaPrecision):
// - fp32 against the CPU backend (which matches the Python reference within
//   1e-4: tests/golden_parity_test.cc): worst-row relative logit difference
//   <= 1e-4 and identical retrievals, for the whole prompt, uneven pieces and
//   token-by-token decode. Same arithmetic up to summation order, so these
//   are the tests that catch kernel bugs.
// - bf16 against the float64 goldens, held to what bf16 itself costs: the
//   project's PyTorch reference run in bf16 on an H100 against the same
//   goldens (issue 9), per fixture.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "engine/model_dir.h"
#include "engine/session.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/fixture_dirs.h"
#include "tests/test_util/golden.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

// The fp32 bound of issue 9 ("worst-row relative difference <= 1e-4";
// cuda_test_support.h).
constexpr double kFp32Limit = testing::kFp32VsCpuLimit;

struct Run {
  std::vector<float> logits;  // every token
  testing::RetrievalLog retrievals;
};

Run RunSession(Backend& backend, const std::vector<int32_t>& tokens,
               const std::vector<size_t>& pieces) {
  auto session = Session::Create(backend);
  REQUIRE(session.ok());
  Run run;
  testing::Record((*session)->backend_session(), run.retrievals);
  AppendOptions options;
  options.all_logits = true;
  size_t done = 0;
  for (size_t i = 0; done < tokens.size(); ++i) {
    const size_t piece = std::min(pieces[i % pieces.size()], tokens.size() - done);
    auto result = (*session)->Append(absl::MakeConstSpan(tokens).subspan(done, piece), options);
    REQUIRE(result.ok());
    run.logits.insert(run.logits.end(), result->logits.begin(), result->logits.end());
    done += piece;
  }
  return run;
}

// CUDA fp32 vs CPU on one fixture, the CUDA session fed in `pieces`; the CPU
// session takes the whole prompt (its own pieces-vs-prefill agreement is
// tests/golden_parity_test.cc's).
void CheckFp32Fixture(const std::string& dir, const std::vector<size_t>& pieces,
                      CudaChunkStore chunk_store = CudaChunkStore::kKeysValues) {
  INFO("fixture " << dir << ", chunk store " << CudaChunkStoreName(chunk_store));
  auto model = LoadModelDir(dir);
  REQUIRE(model.ok());
  const ModelConfig& config = model->config;
  const testing::Golden golden = testing::LoadGolden(dir + "/golden.safetensors");
  auto cpu_backend = MakeCpuBackend(config, model->weights);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kFp32);
  options.chunk_store = chunk_store;
  auto cuda_backend = MakeCudaBackend(config, model->weights, options);
  REQUIRE(cuda_backend.ok());
  const Run cpu = RunSession(*cpu_backend, golden.tokens, {golden.tokens.size()});
  const Run gpu = RunSession(**cuda_backend, golden.tokens, pieces);
  REQUIRE(gpu.logits.size() == cpu.logits.size());
  const int64_t V = config.vocab_size;
  double worst = 0;
  for (size_t p = 0; p < golden.tokens.size(); ++p) {
    worst = std::max(worst, testing::RelativeDifference(gpu.logits.data() + p * V,
                                                        cpu.logits.data() + p * V, V));
  }
  INFO("worst relative logit difference " << worst);
  CHECK(worst <= kFp32Limit);
  REQUIRE(!cpu.retrievals.empty());
  testing::CheckIdenticalRetrievals(cpu.retrievals, gpu.retrievals, kFp32Limit);
  WARN(dir << " fp32 (chunk store " << CudaChunkStoreName(chunk_store)
           << "): worst relative logit difference " << worst << " over "
           << golden.tokens.size() << " rows; " << cpu.retrievals.size()
           << " selections identical");
}

TEST_CASE("cuda fp32 matches the cpu backend on the fixtures: whole prompt", "[cuda]") {
  if (!testing::HaveGpu()) return;
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  for (const auto& dir : dirs) CheckFp32Fixture(dir, {size_t{1} << 30});
}

TEST_CASE("cuda fp32 matches the cpu backend on the fixtures: uneven pieces", "[cuda]") {
  if (!testing::HaveGpu()) return;
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  for (const auto& dir : dirs) CheckFp32Fixture(dir, {100, 1, 1, 1, 37, 1, 250, 63, 1, 5});
}

// The chunk store of encoder rows (docs/cuda.md, "Chunk store of C"; not
// yet run on a GPU): K/V made on the device from the stored rows, held to
// the same bound (issue 10: CPU and CUDA stay in parity in fp32).
TEST_CASE("cuda fp32 with the chunk store of encoder rows matches the cpu backend on the "
          "fixtures: uneven pieces",
          "[cuda]") {
  if (!testing::HaveGpu()) return;
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  for (const auto& dir : dirs) {
    CheckFp32Fixture(dir, {100, 1, 1, 1, 37, 1, 250, 63, 1, 5}, CudaChunkStore::kEncoderRows);
  }
}

TEST_CASE("cuda fp32 matches the cpu backend on the fixtures: token-by-token decode",
          "[cuda]") {
  if (!testing::HaveGpu()) return;
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  for (const auto& dir : dirs) CheckFp32Fixture(dir, {1});
}

// What bf16 costs on each fixture: the project's PyTorch reference
// (weights_tools/drt_reference.py) run in bf16 on an H100 against the
// float64 goldens (issue 9). Per-row relative difference = max |a - b| /
// max |golden| over the row, at the golden's stored positions (655, 756 and
// 957 of them). The figures were reported rounded, so each limit is the
// reported value plus half its last digit, and the top-1 counts are the only
// ones that round to the reported percentages.
struct Bf16Floor {
  const char* fixture;
  double median;       // median row: 0.013 / 0.014 / 0.010 reported
  int64_t top1;        // argmax agreement: 98.3% of 655, 98.7% of 756, 99.9% of 957
  int64_t positions;   // the golden's stored positions
  int64_t identical;   // selections equal (as sets) to the golden's: 36/40, 78/96, 97/128
  int64_t selections;
};
constexpr Bf16Floor kBf16Floors[] = {
    {"gqa_one_group", 0.0135, 644, 655, 36, 40},
    {"two_groups", 0.0145, 746, 756, 78, 96},
    {"unittest_like", 0.0105, 956, 957, 97, 128},
};
// The worst row is a single-row maximum, and two bf16 implementations trade
// places on it from fixture to fixture: on the H100 the reference's worst rows
// were 0.274 / 0.232 / 0.096, the CUDA backend's (against the CPU) 0.158 /
// 0.132 / 0.105. The bound is the largest the reference reached on these
// models (0.274 reported), for every fixture.
constexpr double kBf16WorstRow = 0.2745;

void CheckBf16Fixture(const std::string& dir, const std::vector<size_t>& pieces) {
  const std::string name = std::filesystem::path(dir).filename().string();
  INFO("fixture " << name);
  const Bf16Floor* floor = nullptr;
  for (const Bf16Floor& f : kBf16Floors) {
    if (name == f.fixture) floor = &f;
  }
  // A new fixture needs its bf16 reference measured first.
  REQUIRE(floor != nullptr);
  auto model = LoadModelDir(dir);
  REQUIRE(model.ok());
  const ModelConfig& config = model->config;
  const testing::Golden golden = testing::LoadGolden(dir + "/golden.safetensors");
  auto backend =
      MakeCudaBackend(config, model->weights, testing::PrecisionOptions(CudaPrecision::kBf16));
  REQUIRE(backend.ok());
  const Run gpu = RunSession(**backend, golden.tokens, pieces);
  const int64_t V = config.vocab_size;
  REQUIRE(gpu.logits.size() == golden.tokens.size() * V);

  std::vector<double> rows;
  int64_t top1_agree = 0;
  for (size_t p = 0; p < golden.logit_positions.size(); ++p) {
    const float* mine = gpu.logits.data() + golden.logit_positions[p] * V;
    const float* want = golden.logits.data() + p * V;
    rows.push_back(testing::RelativeDifference(mine, want, V));
    if (std::max_element(mine, mine + V) - mine == std::max_element(want, want + V) - want) {
      ++top1_agree;
    }
  }
  REQUIRE(!rows.empty());
  REQUIRE(static_cast<int64_t>(rows.size()) == floor->positions);
  std::sort(rows.begin(), rows.end());
  const double worst = rows.back();
  const double median = rows[rows.size() / 2];

  const int64_t G = golden.retrieval_shape[0], C = golden.retrieval_shape[1],
                K = golden.retrieval_shape[2];
  int64_t identical = 0;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < C; ++t) {
      std::vector<int64_t> want;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t idx = golden.retrieval_indices[(g * C + t) * K + j];
        if (idx >= 0) want.push_back(idx);
      }
      auto it = gpu.retrievals.find({t, g});
      REQUIRE(it != gpu.retrievals.end());
      std::vector<int64_t> got = it->second.chunks;
      REQUIRE(got.size() == want.size());
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      if (got == want) ++identical;
    }
  }
  REQUIRE(G * C == floor->selections);
  WARN(name << " bf16 vs float64 golden: worst row " << worst << ", median " << median
            << ", top-1 " << top1_agree << "/" << rows.size() << ", "
            << identical << "/" << G * C << " selections identical");
  CHECK(worst <= kBf16WorstRow);
  CHECK(median <= floor->median);
  CHECK(top1_agree >= floor->top1);
  CHECK(identical >= floor->identical);
}

TEST_CASE("cuda bf16 is within the bf16 reference's error on the fixtures: whole prompt",
          "[cuda]") {
  if (!testing::HaveGpu()) return;
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  for (const auto& dir : dirs) CheckBf16Fixture(dir, {size_t{1} << 30});
}

TEST_CASE("cuda bf16 is within the bf16 reference's error on the fixtures: uneven pieces",
          "[cuda]") {
  if (!testing::HaveGpu()) return;
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  for (const auto& dir : dirs) CheckBf16Fixture(dir, {100, 1, 1, 1, 37, 1, 250, 63, 1, 5});
}

}  // namespace
}  // namespace drt

// CUDA backend vs CPU backend on every fixture model under tests/fixtures
// (the CPU backend itself matches the Python reference within 1e-4:
// tests/golden_parity_test.cc): logits within 2e-2 relative, the same
// retrieval choices where scores are not tied.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/model_dir.h"
#include "engine/safetensors.h"
#include "engine/session.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/fixture_dirs.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

std::vector<int32_t> GoldenTokens(const std::string& dir) {
  auto file = SafetensorsFile::Open(dir + "/golden.safetensors");
  REQUIRE(file.ok());
  auto tokens = (*file)->ReadI64("tokens");
  REQUIRE(tokens.ok());
  return std::vector<int32_t>(tokens->begin(), tokens->end());
}

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

void CheckFixture(const std::string& dir, const std::vector<size_t>& pieces) {
  INFO("fixture " << dir);
  auto model = LoadModelDir(dir);
  REQUIRE(model.ok());
  const ModelConfig& config = model->config;
  const std::vector<int32_t> tokens = GoldenTokens(dir);
  auto cpu_backend = MakeCpuBackend(config, model->weights);
  auto cuda_backend = MakeCudaBackend(config, model->weights, CudaBackendOptions{});
  REQUIRE(cuda_backend.ok());
  const Run cpu = RunSession(*cpu_backend, tokens, pieces);
  const Run gpu = RunSession(**cuda_backend, tokens, pieces);
  REQUIRE(gpu.logits.size() == cpu.logits.size());
  const int64_t V = config.vocab_size;
  double worst = 0;
  for (size_t p = 0; p < tokens.size(); ++p) {
    worst = std::max(worst, testing::RelativeDifference(gpu.logits.data() + p * V,
                                                        cpu.logits.data() + p * V, V));
  }
  INFO("worst relative logit difference " << worst);
  CHECK(worst <= 2e-2);
  REQUIRE(!cpu.retrievals.empty());
  const int64_t identical = testing::CompareRetrievals(cpu.retrievals, gpu.retrievals);
  WARN(dir << ": worst relative logit difference " << worst << "; " << identical << " of "
           << cpu.retrievals.size() << " selections identical");
}

TEST_CASE("cuda backend matches the cpu backend on the fixtures: whole prompt", "[cuda]") {
  if (!testing::HaveGpu()) return;
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  for (const auto& dir : dirs) CheckFixture(dir, {size_t{1} << 30});
}

TEST_CASE("cuda backend matches the cpu backend on the fixtures: uneven pieces and decode",
          "[cuda]") {
  if (!testing::HaveGpu()) return;
  for (const auto& dir : testing::GoldenFixtureDirs()) {
    CheckFixture(dir, {100, 1, 1, 1, 37, 1, 250, 63, 1, 5});
  }
}

}  // namespace
}  // namespace drt

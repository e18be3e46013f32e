// The CPU engine against the Python reference forward (weights_tools/
// drt_reference.py, float64) on every fixture under tests/fixtures: logits at
// the stored positions within 1e-4 relative, the same retrieval choices.
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/model_dir.h"
#include "engine/safetensors.h"
#include "engine/session.h"
#include "tests/test_util/fixture_dirs.h"
#include "tests/test_util/golden.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

void CheckFixture(const std::string& dir, const std::vector<int64_t>& pieces_pattern) {
  INFO("fixture " << dir);
  auto model = LoadModelDir(dir);
  REQUIRE(model.ok());
  const ModelConfig& config = model->config;
  const testing::Golden golden = testing::LoadGolden(dir + "/golden.safetensors");
  const int64_t V = config.vocab_size;
  const int64_t L = static_cast<int64_t>(golden.tokens.size());
  REQUIRE(L % config.enc_chunk_size == 0);
  const int64_t G = golden.retrieval_shape[0], C = golden.retrieval_shape[1],
                K = golden.retrieval_shape[2];
  REQUIRE(G == config.num_groups());
  REQUIRE(C == L / config.enc_chunk_size);
  REQUIRE(K == config.chunk_topk);

  auto backend = MakeCpuBackend(config, model->weights);
  auto session = Session::Create(*backend);
  REQUIRE(session.ok());
  std::map<std::pair<int64_t, int64_t>, Retrieval> seen;
  (*session)->backend_session().set_retrieval_observer(
      [&](int64_t chunk, int64_t group, const Retrieval& r) { seen[{chunk, group}] = r; });

  AppendOptions options;
  options.all_logits = true;
  std::vector<float> logits;
  size_t done = 0;
  for (size_t i = 0; done < golden.tokens.size(); ++i) {
    const size_t piece = std::min<size_t>(pieces_pattern[i % pieces_pattern.size()],
                                          golden.tokens.size() - done);
    auto result = (*session)->Append(absl::MakeConstSpan(golden.tokens).subspan(done, piece), options);
    REQUIRE(result.ok());
    logits.insert(logits.end(), result->logits.begin(), result->logits.end());
    done += piece;
  }

  double worst = 0;
  for (size_t p = 0; p < golden.logit_positions.size(); ++p) {
    const int64_t pos = golden.logit_positions[p];
    worst = std::max(worst, testing::RelativeDifference(logits.data() + pos * V,
                                                        golden.logits.data() + p * V, V));
  }
  INFO("worst relative logit difference " << worst);
  CHECK(worst <= 1e-4);

  int64_t compared = 0;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < C; ++t) {
      const Retrieval& mine = seen.at({t, g});
      std::vector<int64_t> expected;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t idx = golden.retrieval_indices[(g * C + t) * K + j];
        if (idx >= 0) expected.push_back(idx);
      }
      INFO("group " << g << " chunk " << t);
      REQUIRE(mine.chunks == expected);
      for (size_t j = 0; j < expected.size(); ++j) {
        REQUIRE(mine.weights[j] ==
                Approx(golden.retrieval_weights[(g * C + t) * K + j]).margin(1e-5));
      }
      compared += static_cast<int64_t>(expected.size());
    }
  }
  REQUIRE(compared > 0);
}

TEST_CASE("golden parity with the Python reference: whole-prompt prefill", "[golden]") {
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  for (const auto& dir : dirs) CheckFixture(dir, {1 << 30});
}

TEST_CASE("golden parity with the Python reference: uneven pieces and single tokens", "[golden]") {
  // Pieces that cut chunks anywhere, with runs of one-token decode steps.
  for (const auto& dir : testing::GoldenFixtureDirs()) {
    CheckFixture(dir, {100, 1, 1, 1, 37, 1, 250, 63, 1, 5});
  }
}

}  // namespace
}  // namespace drt

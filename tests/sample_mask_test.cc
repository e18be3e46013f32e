// Session::SampleNext never emits the pad or landmark id, and draws once
// from the logits with those two masked: the token a seed gives equals what
// the sampler gives on the masked logits, under top_k and top_p too
// (review-api F12: it drew from the unmasked logits and drew again only when
// that hit a masked id, which is another distribution under top_k / top_p
// and another token per seed).
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

TEST_CASE("SampleNext draws once from the logits with pad and landmark masked",
          "[sampler][session]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 51);
  std::unique_ptr<Backend> backend = MakeCpuBackend(config, weights);
  auto created = Session::Create(*backend);
  REQUIRE(created.ok());
  Session& s = **created;
  REQUIRE(s.Append(testing::RandomTokens(config, 40, 52)).ok());
  const std::vector<float> logits(s.last_logits().begin(), s.last_logits().end());
  std::vector<float> masked = logits;
  masked[config.pad_id] = -std::numeric_limits<float>::infinity();
  masked[config.chunk_id] = -std::numeric_limits<float>::infinity();

  // How many seeds the old draw-then-redraw rule gives another token for:
  // the test can tell the two rules apart only if this is above 0.
  int old_rule_differs = 0;
  for (const SamplingParams base : {SamplingParams{2.f, 0, 1.f, 0}, SamplingParams{2.f, 60, 1.f, 0},
                                    SamplingParams{2.f, 0, 0.95f, 0}}) {
    INFO("temperature " << base.temperature << " top_k " << base.top_k << " top_p " << base.top_p);
    for (uint64_t seed = 0; seed < 1500; ++seed) {
      SamplingParams params = base;
      params.seed = seed;
      Sampler engine_sampler(params);
      auto token = s.SampleNext(engine_sampler);
      REQUIRE(token.ok());
      Sampler masked_sampler(params);
      const auto expected = masked_sampler.Sample(masked);
      REQUIRE(expected.ok());
      INFO("seed " << seed);
      CHECK(token->token == *expected);
      CHECK(token->token != config.pad_id);
      CHECK(token->token != config.chunk_id);

      Sampler old_sampler(params);
      auto old = old_sampler.Sample(logits);
      REQUIRE(old.ok());
      if (*old == config.pad_id || *old == config.chunk_id) old = old_sampler.Sample(masked);
      old_rule_differs += *old != *expected;
    }
  }
  INFO("seeds where the old rule gives another token: " << old_rule_differs);
  CHECK(old_rule_differs > 0);
}

}  // namespace
}  // namespace drt

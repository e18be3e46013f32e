// Prefill and decode compute the same function: the same tokens appended at
// once, in random pieces, and one by one give the same logits at every real
// position and the same retrievals (design.md, "One position through the
// engine").
#include <map>
#include <random>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/session.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

using RetrievalLog = std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>>;

struct Run {
  std::vector<float> logits;  // every real token
  RetrievalLog retrievals;
};

Run AppendInPieces(Backend& backend, const std::vector<int32_t>& tokens,
                   const std::vector<int64_t>& pieces) {
  auto session = Session::Create(backend);
  REQUIRE(session.ok());
  Run run;
  (*session)->backend_session().set_retrieval_observer(
      [&](int64_t chunk, int64_t group, const Retrieval& r) { run.retrievals[{chunk, group}] = r.chunks; });
  AppendOptions options;
  options.all_logits = true;
  size_t done = 0;
  for (int64_t piece : pieces) {
    auto result = (*session)->Append(
        absl::MakeConstSpan(tokens).subspan(done, static_cast<size_t>(piece)), options);
    REQUIRE(result.ok());
    run.logits.insert(run.logits.end(), result->logits.begin(), result->logits.end());
    done += piece;
  }
  REQUIRE(done == tokens.size());
  return run;
}

void RequireSameLogits(const Run& a, const Run& b, int64_t vocab) {
  REQUIRE(a.logits.size() == b.logits.size());
  double worst = 0;
  for (size_t row = 0; row * vocab < a.logits.size(); ++row) {
    worst = std::max(worst, testing::RelativeDifference(a.logits.data() + row * vocab,
                                                        b.logits.data() + row * vocab, vocab));
  }
  INFO("worst relative difference " << worst);
  REQUIRE(worst <= 1e-4);
}

TEST_CASE("prefill, random pieces and one-by-one decode agree", "[engine][prefill_decode]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 7);
  CpuBackendOptions small_segments;
  small_segments.max_step_positions = 32;  // several steps per append
  auto backend = MakeCpuBackend(config, weights);
  auto segmented_backend = MakeCpuBackend(config, weights, small_segments);

  const int64_t n = 29 * config.enc_chunk_size + 4;  // 29 chunks and an open one
  const std::vector<int32_t> tokens = testing::RandomTokens(config, n, 11);

  const Run at_once = AppendInPieces(*backend, tokens, {n});
  REQUIRE(at_once.logits.size() == static_cast<size_t>(n * config.vocab_size));
  // Retrieval really chooses: later chunks have more candidates than top-k.
  REQUIRE(at_once.retrievals.at({28, 0}).size() == static_cast<size_t>(config.chunk_topk));

  std::mt19937_64 rng(3);
  std::vector<int64_t> random_pieces;
  for (int64_t left = n; left > 0;) {
    const int64_t piece = std::min<int64_t>(left, 1 + rng() % 37);
    random_pieces.push_back(piece);
    left -= piece;
  }
  const std::vector<int64_t> ones(n, 1);

  SECTION("random piece sizes") {
    const Run pieces = AppendInPieces(*backend, tokens, random_pieces);
    RequireSameLogits(pieces, at_once, config.vocab_size);
    REQUIRE(pieces.retrievals == at_once.retrievals);
  }
  SECTION("one token at a time") {
    const Run decode = AppendInPieces(*backend, tokens, ones);
    RequireSameLogits(decode, at_once, config.vocab_size);
    REQUIRE(decode.retrievals == at_once.retrievals);
  }
  SECTION("bounded internal segments") {
    const Run segmented = AppendInPieces(*segmented_backend, tokens, {n});
    RequireSameLogits(segmented, at_once, config.vocab_size);
    REQUIRE(segmented.retrievals == at_once.retrievals);
  }
}

TEST_CASE("windows of at most 8 rows: prefill, pieces of 5 and 8 and decode agree",
          "[engine][prefill_decode]") {
  // Windows no larger than the 8 rows a slice may read in place
  // (kInPlaceWindowRows): a push of up to 8 rows can exceed the window, and
  // the window before it must still lie right before the pushed rows. Every
  // way of feeding the tokens must give the prefill's logits and retrievals
  // (the prefill gathers its keys; the others read them in place).
  for (int64_t window : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{8}}) {
    INFO("slide_window " << window);
    ModelConfig config = testing::TinyConfig();
    config.slide_window = window;
    const ModelWeights weights = testing::RandomWeights(config, 17);
    auto backend = MakeCpuBackend(config, weights);
    const int64_t n = 6 * config.enc_chunk_size + 3;  // several steps past the window
    const std::vector<int32_t> tokens = testing::RandomTokens(config, n, 19);
    const Run at_once = AppendInPieces(*backend, tokens, {n});
    for (int64_t piece : {int64_t{1}, int64_t{5}, int64_t{8}}) {
      INFO("pieces of " << piece);
      std::vector<int64_t> pieces;
      for (int64_t left = n; left > 0; left -= std::min(left, piece)) {
        pieces.push_back(std::min(left, piece));
      }
      const Run run = AppendInPieces(*backend, tokens, pieces);
      RequireSameLogits(run, at_once, config.vocab_size);
      REQUIRE(run.retrievals == at_once.retrievals);
    }
  }
}

TEST_CASE("chunks 0 and 1 see no retrieval, later chunks choose from earlier ones only",
          "[engine][retrieval]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 5);
  auto backend = MakeCpuBackend(config, weights);
  const Run run = AppendInPieces(*backend, testing::RandomTokens(config, 10 * config.enc_chunk_size, 2),
                                 {10 * config.enc_chunk_size});
  for (int64_t g = 0; g < config.num_groups(); ++g) {
    REQUIRE(run.retrievals.at({0, g}).empty());
    for (int64_t t = 1; t < 10; ++t) {
      const auto& chosen = run.retrievals.at({t, g});
      REQUIRE(static_cast<int64_t>(chosen.size()) == std::min<int64_t>(t, config.chunk_topk));
      for (int64_t c : chosen) REQUIRE(c < t);
    }
  }
}

}  // namespace
}  // namespace drt

// A Session::Append that fails after a piece with tokens following leaves
// a session whose last logits are not its last token's (the piece computed
// none) and whose upper-layer state is short (its rows skipped the upper
// layers for the later pieces to make up for). The engine session itself
// refuses to serve that state (Session::CheckStateWhole): last_logits() is
// empty, sampling and ExportState fail by name, until an Append covers the
// skipped rows by the upper-layer reach. It used to sample from the stale
// logits. The failure is injected by a backend wrapper that refuses the
// session in PrepareSessionForStep (tests/test_util/wrapping_backend.h).
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/model_rules.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "tests/test_util/random_model.h"
#include "tests/test_util/wrapping_backend.h"

namespace drt {
namespace {

using Catch::Matchers::Contains;

std::unique_ptr<Backend> Cpu(const ModelConfig& config, const ModelWeights& weights, bool mixed) {
  CpuBackendOptions options;
  options.num_threads = 2;
  options.lower_only_forwards = true;
  options.mixed_lower_only_forwards = mixed;
  // 8 chunks (64 positions) a forward: an Append of 400 tokens takes 8 pieces.
  options.max_step_positions = 8 * config.chunk_positions();
  return MakeCpuBackend(config, weights, options);
}

void CheckRefused(Session& s, const std::string& names) {
  const absl::Status whole = s.CheckStateWhole();
  CHECK(whole.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(whole.message()), Contains(names));
  CHECK(s.last_logits().empty());
  Sampler sampler(SamplingParams{});
  const int64_t tokens = s.num_tokens();
  for (const absl::Status& refused :
       {s.SampleNext(sampler).status(), s.GenerateStep(sampler).status(),
        s.Generate(GenerateOptions{}).status(), s.ExportState().status()}) {
    CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(refused.message()), Contains(names));
  }
  CHECK(s.num_tokens() == tokens);  // nothing was generated
}

TEST_CASE("a session whose Append failed after a piece with tokens following refuses its stale "
          "logits until an Append covers the skipped rows",
          "[session][mixed_lower_only]") {
  const bool mixed = GENERATE(true, false);
  INFO("mixed lower-only forwards " << mixed);
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 41);
  testing::WrappingBackend backend(Cpu(config, weights, mixed));
  const int64_t reach = backend.upper_layer_reach();
  REQUIRE(reach == UpperLayerReach(config));
  const std::vector<int32_t> prompt = testing::RandomTokens(config, 100, 42);
  const std::vector<int32_t> message = testing::RandomTokens(config, 400, 43);
  const std::vector<int32_t> one = testing::RandomTokens(config, 1, 44);
  const std::vector<int32_t> more = testing::RandomTokens(config, reach + 1, 45);

  auto created = Session::Create(backend);
  REQUIRE(created.ok());
  Session& s = **created;
  REQUIRE(s.Append(prompt).ok());
  REQUIRE(s.CheckStateWhole().ok());
  REQUIRE_FALSE(s.last_logits().empty());

  // The message's second piece fails: the first ran with 300-odd tokens
  // following (far more than the reach), so it skipped the upper layers and
  // computed no logits.
  int64_t first_piece = 0;
  AppendOptions options;
  options.on_progress = [&](const AppendProgress& progress) {
    if (first_piece == 0) first_piece = progress.tokens_done;
    backend.Refuse(&s.backend_session(), absl::InternalError("injected step failure"));
  };
  const auto failed = s.Append(message, options);
  REQUIRE_FALSE(failed.ok());
  CHECK_THAT(std::string(failed.status().message()), Contains("injected step failure"));
  REQUIRE(first_piece > 0);
  REQUIRE(first_piece < static_cast<int64_t>(message.size()) - reach);
  REQUIRE(s.num_tokens() == 100 + first_piece);
  REQUIRE(s.backend_session().stats().upper_rows_skipped > 0);
  CheckRefused(s, "last logits are those of its token 100,");

  // A fork is as short as its parent.
  auto fork = s.Fork();
  REQUIRE(fork.ok());
  CheckRefused(**fork, "last logits are those of its token 100,");

  // One more token brings its own logits, but the skipped rows lie within
  // the reach of its end: still refused, naming the rows.
  backend.Allow(&s.backend_session());
  REQUIRE(s.Append(one).ok());
  CheckRefused(s, "skipped the upper layers and lie within the upper-layer reach");
  // The reach + 1 tokens more complete it.
  REQUIRE(s.Append(more).ok());
  REQUIRE(s.CheckStateWhole().ok());
  Sampler sampler(SamplingParams{});
  REQUIRE(s.SampleNext(sampler).ok());
  // And it exports again (the wrapper exports the CPU session's state).
  auto exported = s.ExportState();
  REQUIRE(exported.ok());
  CHECK(exported->num_tokens == s.num_tokens());

  // Its logits are those of a session that appended the same tokens in the
  // same cuts without the failure, bit for bit: the lower-only forwards
  // leave the state a full computation leaves once the skipped rows lie
  // beyond the reach (Backend::runs_lower_only_forwards, batch_step.h).
  auto reference = Session::Create(backend);
  REQUIRE(reference.ok());
  REQUIRE((*reference)->Append(prompt).ok());
  REQUIRE((*reference)->Append(absl::MakeConstSpan(message).subspan(0, first_piece)).ok());
  REQUIRE((*reference)->Append(one).ok());
  REQUIRE((*reference)->Append(more).ok());
  REQUIRE((*reference)->num_tokens() == s.num_tokens());
  const std::vector<float> got(s.last_logits().begin(), s.last_logits().end());
  const std::vector<float> expected((*reference)->last_logits().begin(),
                                    (*reference)->last_logits().end());
  CHECK(got == expected);
}

TEST_CASE("a fresh session, and one whose Append returned, are whole and export", "[session]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 51);
  auto backend = Cpu(config, weights, true);
  auto s = Session::Create(*backend);
  REQUIRE(s.ok());
  CHECK((*s)->CheckStateWhole().ok());
  CHECK((*s)->last_logits().empty());  // no token yet
  Sampler sampler(SamplingParams{});
  CHECK_THAT(std::string((*s)->SampleNext(sampler).status().message()),
             Contains("holds no tokens yet"));
  // 400 tokens in 8 pieces, the early ones lower-only: whole once it returns.
  REQUIRE((*s)->Append(testing::RandomTokens(config, 400, 52)).ok());
  REQUIRE((*s)->backend_session().stats().upper_rows_skipped > 0);
  CHECK((*s)->CheckStateWhole().ok());
  CHECK((*s)->last_logits().size() == static_cast<size_t>(config.vocab_size));
  auto state = (*s)->ExportState();
  REQUIRE(state.ok());
  CHECK(state->num_tokens == 400);
}

}  // namespace
}  // namespace drt

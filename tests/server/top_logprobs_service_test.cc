// GenerateRequest.top_logprobs through the drt.v1 service (Generate and
// Complete, on the scheduler's sampling path): each generated token's
// alternatives equal a brute-force ranking of the engine's own logits for
// that position, replayed on a separate engine session; out-of-range values
// are refused by name, changing nothing.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/sampling_reference.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

// The n most likely listable ids (never the landmark or the pad id) of
// `logits`, ranked by the brute-force reference.
drt::testing::RankedLogProbs BruteForceTop(absl::Span<const float> logits, int32_t n) {
  const ModelConfig& config = FixtureModel::Get().model->config();
  const std::vector<int32_t> unlisted = {static_cast<int32_t>(config.chunk_id),
                                         static_cast<int32_t>(config.pad_id)};
  return drt::testing::BruteForceTopLogProbs(logits, n, unlisted);
}

// Replays `prompt` then `generated` on an engine session and checks each
// token's alternatives against BruteForceTop of the logits it was drawn from.
void CheckAgainstEngine(const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated,
                        const std::vector<drt::v1::TokenTopLogprobs>& tops, int32_t n) {
  REQUIRE(tops.size() == generated.size());
  auto session = Session::Create(*FixtureModel::Get().backend);
  REQUIRE(session.ok());
  REQUIRE((*session)->Append(prompt).ok());
  for (size_t i = 0; i < generated.size(); ++i) {
    INFO("generated token " << i);
    const drt::testing::RankedLogProbs want = BruteForceTop((*session)->last_logits(), n);
    const auto& got = tops[i].alternatives();
    REQUIRE(static_cast<size_t>(got.size()) == want.ids.size());
    for (int j = 0; j < got.size(); ++j) {
      CHECK(got[j].token_id() == want.ids[j]);
      // The server and this session run the same forward on the same CPU
      // backend; float rounding of the log-softmax is within 1e-6 here.
      CHECK(got[j].logprob() == Approx(static_cast<double>(want.logprobs[j])).epsilon(1e-5).margin(1e-5));
      // The byte tokenizer: ids < 256 are their byte, the rest have no text.
      CHECK(got[j].token_bytes() ==
            (want.ids[j] < 256 ? std::string(1, static_cast<char>(want.ids[j])) : std::string()));
    }
    CHECK(tops[i].token_bytes() ==
          (generated[i] < 256 ? std::string(1, static_cast<char>(generated[i])) : std::string()));
    REQUIRE((*session)->Append(std::vector<int32_t>{generated[i]}).ok());
  }
}

TEST_CASE("Generate returns each greedy token's top alternatives, the token first",
          "[server][top_logprobs]") {
  InProcessServer server;
  const auto prompt = RandomTokens(300, 71);
  const std::string id = NewSession(server.stub());
  REQUIRE(AppendOnce(server.stub(), id, prompt).ok());
  drt::v1::GenerateRequest request = GreedyRequest(id, 12);
  request.set_return_logprobs(true);
  request.set_top_logprobs(5);
  GenerateResult generated = Generate(server.stub(), request);
  INFO(generated.status.error_message());
  REQUIRE(generated.status.ok());
  REQUIRE(generated.tokens == EngineGreedy(prompt, 12));
  REQUIRE(generated.top_logprobs.size() == 12);
  for (size_t i = 0; i < generated.tokens.size(); ++i) {
    const auto& alternatives = generated.top_logprobs[i].alternatives();
    REQUIRE(alternatives.size() == 5);  // 300 ids, far more than 5 finite
    // Greedy: the most likely token is the generated one, with its logprob
    // to the bit (both computed as Sampler::LogProb does).
    CHECK(alternatives[0].token_id() == generated.tokens[i]);
    CHECK(alternatives[0].logprob() == generated.logprobs[i]);
    for (int j = 1; j < alternatives.size(); ++j) {
      CHECK(alternatives[j].logprob() <= alternatives[j - 1].logprob());
    }
  }
  CheckAgainstEngine(prompt, generated.tokens, generated.top_logprobs, 5);
}

TEST_CASE("Sampled tokens' alternatives are of the raw distribution (temperature 1)",
          "[server][top_logprobs]") {
  InProcessServer server;
  const auto prompt = RandomTokens(200, 72);
  const std::string id = NewSession(server.stub());
  REQUIRE(AppendOnce(server.stub(), id, prompt).ok());
  drt::v1::GenerateRequest request = GreedyRequest(id, 16);
  request.mutable_sampling()->set_temperature(3.0f);
  request.mutable_sampling()->set_seed(11);
  request.set_return_logprobs(true);
  request.set_top_logprobs(20);
  GenerateResult generated = Generate(server.stub(), request);
  INFO(generated.status.error_message());
  REQUIRE(generated.status.ok());
  REQUIRE(generated.tokens.size() == 16);
  // The alternatives do not depend on the temperature (BruteForceTop is at
  // temperature 1); a sampled token listed among them has its own logprob.
  CheckAgainstEngine(prompt, generated.tokens, generated.top_logprobs, 20);
  int listed = 0;
  for (size_t i = 0; i < generated.tokens.size(); ++i) {
    for (const auto& alternative : generated.top_logprobs[i].alternatives()) {
      if (alternative.token_id() != generated.tokens[i]) continue;
      CHECK(alternative.logprob() == generated.logprobs[i]);
      ++listed;
    }
  }
  CHECK(listed > 0);  // at temperature 3 over 300 ids, most draws are outside the top 1
}

TEST_CASE("Complete returns top alternatives as Generate does", "[server][top_logprobs]") {
  InProcessServer server;
  const auto prompt = RandomTokens(500, 73);
  grpc::ClientContext context;
  SetDeadline(context, 60);
  auto stream = server.stub().Complete(&context);
  drt::v1::CompleteRequest first;
  first.mutable_generate()->set_max_tokens(6);
  first.mutable_generate()->set_top_logprobs(3);
  REQUIRE(stream->Write(first));
  drt::v1::CompleteRequest ids;
  ids.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
  REQUIRE(stream->Write(ids));
  stream->WritesDone();
  std::vector<int32_t> tokens;
  std::vector<drt::v1::TokenTopLogprobs> tops;
  drt::v1::GenerateResponse response;
  while (stream->Read(&response)) {
    for (int32_t t : response.piece().token_ids()) tokens.push_back(t);
    for (const auto& top : response.piece().top_logprobs()) tops.push_back(top);
    CHECK(response.piece().logprobs_size() == 0);  // return_logprobs not asked
  }
  grpc::Status status = stream->Finish();
  INFO(status.error_message());
  REQUIRE(status.ok());
  CHECK(tokens == EngineGreedy(prompt, 6));
  CheckAgainstEngine(prompt, tokens, tops, 3);
}

TEST_CASE("top_logprobs out of [0, 20] is refused by name and generates nothing",
          "[server][top_logprobs]") {
  InProcessServer server;
  const auto prompt = RandomTokens(100, 74);
  const std::string id = NewSession(server.stub());
  REQUIRE(AppendOnce(server.stub(), id, prompt).ok());
  for (int32_t bad : {-1, 21}) {
    drt::v1::GenerateRequest request = GreedyRequest(id, 4);
    request.set_top_logprobs(bad);
    GenerateResult generated = Generate(server.stub(), request);
    CHECK(generated.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(generated.status.error_message(), Contains("top_logprobs must be in [0, 20]"));
    CHECK(generated.tokens.empty());
  }
  CHECK(GetSession(server.stub(), id).info.tokens() == 100);
  // Without top_logprobs, pieces carry none.
  GenerateResult plain = GenerateGreedy(server.stub(), id, 3);
  REQUIRE(plain.status.ok());
  CHECK(plain.top_logprobs.empty());
}

}  // namespace
}  // namespace drt::server

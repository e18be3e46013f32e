// drt.v1 SamplingParams' penalties, min_p and logit_bias through the gRPC
// service: Generate draws what the engine's Session::Generate draws with the
// same parameters (the same tokens, the raw log-probabilities), concurrent
// calls keep their own counts, and bad values are refused by name with the
// session unchanged.
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/sampler.h"
#include "engine/session.h"
#include "tests/server/test_util/check_status.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

struct Controls {
  float temperature;
  float presence;
  float frequency;
  float min_p;
  std::map<int32_t, float> bias;
};

constexpr int32_t kTokens = 24;
constexpr uint64_t kSeed = 11;

drt::v1::GenerateRequest Request(const std::string& id, const Controls& c) {
  drt::v1::GenerateRequest request = GreedyRequest(id, kTokens);
  request.set_ignore_eos(true);
  request.set_pad_to_chunk_boundary(false);
  request.set_return_logprobs(true);
  drt::v1::SamplingParams& s = *request.mutable_sampling();
  s.set_temperature(c.temperature);
  s.set_seed(kSeed);
  s.set_presence_penalty(c.presence);
  s.set_frequency_penalty(c.frequency);
  s.set_min_p(c.min_p);
  s.mutable_logit_bias()->insert(c.bias.begin(), c.bias.end());
  return request;
}

// The engine alone: a session of the same prompt generating with the same
// parameters (no stop ids: the request ignores end of text).
struct Reference {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};
Reference EngineReference(const std::vector<int32_t>& prompt, const Controls& c) {
  auto session = Session::Create(*FixtureModel::Get().backend);
  REQUIRE(session.ok());
  REQUIRE((*session)->Append(prompt).ok());
  GenerateOptions options;
  options.max_tokens = kTokens;
  options.sampling.temperature = c.temperature;
  options.sampling.seed = kSeed;
  options.sampling.presence_penalty = c.presence;
  options.sampling.frequency_penalty = c.frequency;
  options.sampling.min_p = c.min_p;
  options.sampling.logit_bias = c.bias;
  Reference ref;
  options.on_token = [&](int32_t, float logprob) {
    ref.logprobs.push_back(logprob);
    return true;
  };
  auto result = (*session)->Generate(options);
  REQUIRE(result.ok());
  ref.tokens = result->tokens;
  return ref;
}

GenerateResult GenerateOnNewSession(drt::v1::Drt::Stub& stub, const std::vector<int32_t>& prompt,
                                    const Controls& c) {
  const std::string id = NewSession(stub);
  REQUIRE(AppendOnce(stub, id, prompt).ok());
  return Generate(stub, Request(id, c));
}

}  // namespace

TEST_CASE("Generate applies penalties, min_p and logit_bias as the engine does",
          "[server][sampling]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::vector<int32_t> prompt = RandomTokens(100, 7);
  const std::vector<Controls> cases = {
      {0.f, 0.f, 1.5f, 0.f, {}},
      {0.f, 2.f, 0.f, 0.f, {{65, 2.f}}},
      {1.f, 0.5f, 0.5f, 0.05f, {{65, 3.f}, {66, -100.f}}},
      {0.8f, -1.f, 2.f, 0.1f, {}},
      {1.2f, 0.f, 0.f, 0.2f, {}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << i);
    const GenerateResult got = GenerateOnNewSession(stub, prompt, cases[i]);
    REQUIRE(got.status.ok());
    const Reference want = EngineReference(prompt, cases[i]);
    CHECK(got.tokens == want.tokens);
    // The raw distribution's log-probabilities (temperature 1, no bias or
    // penalty), as the engine reports them.
    CHECK(got.logprobs == want.logprobs);
  }
  // The penalty is applied: greedy with frequency 1.5 differs from plain
  // greedy on this prompt (which, on the random fixture model, repeats).
  const GenerateResult plain = GenerateOnNewSession(stub, prompt, {0.f, 0.f, 0.f, 0.f, {}});
  const GenerateResult penalised = GenerateOnNewSession(stub, prompt, cases[0]);
  REQUIRE(plain.status.ok());
  CHECK(plain.tokens != penalised.tokens);
  // A +100 bias forces its token under greedy; the log-probabilities stay
  // the unbiased model's (the engine's raw LogProb of that token).
  const Controls forced = {0.f, 0.f, 0.f, 0.f, {{70, 100.f}}};
  const GenerateResult f = GenerateOnNewSession(stub, prompt, forced);
  REQUIRE(f.status.ok());
  CHECK(f.tokens == std::vector<int32_t>(kTokens, 70));
  CHECK(f.logprobs == EngineReference(prompt, forced).logprobs);
}

TEST_CASE("Concurrent Generate calls with penalties keep their own counts", "[server][sampling]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::vector<int32_t> prompt = RandomTokens(90, 21);
  const Controls c = {0.9f, 0.7f, 0.9f, 0.f, {}};
  const Reference want = EngineReference(prompt, c);
  // Four sessions generating at once share the scheduler's decode steps;
  // each call's penalties count only its own tokens.
  std::vector<GenerateResult> got(4);
  std::vector<std::string> ids;
  for (size_t i = 0; i < got.size(); ++i) {
    ids.push_back(NewSession(stub));
    REQUIRE(AppendOnce(stub, ids.back(), prompt).ok());
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = Generate(stub, Request(ids[i], c)); });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("call " << i);
    REQUIRE(got[i].status.ok());
    CHECK(got[i].tokens == want.tokens);
  }
}

// docs/api.md: a Generate's penalties count only the tokens that call chose;
// earlier calls on the session do not count. So a second penalised Generate
// on the same session draws what a fresh session holding the prompt and the
// first answer draws. A Sampler kept per session or per process would carry
// the first call's counts into the second and fail this.
TEST_CASE("Two penalised Generates on one session do not share counts", "[server][sampling]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::vector<int32_t> prompt = RandomTokens(100, 7);
  const Controls c = {0.f, 0.f, 1.5f, 0.f, {}};
  const std::string id = NewSession(stub);
  REQUIRE(AppendOnce(stub, id, prompt).ok());
  const GenerateResult first = Generate(stub, Request(id, c));
  REQUIRE(first.status.ok());
  REQUIRE(first.tokens == EngineReference(prompt, c).tokens);
  // The session now holds the prompt and the whole first answer.
  REQUIRE(GetSession(stub, id).info.tokens() == static_cast<int64_t>(prompt.size()) + kTokens);
  const GenerateResult second = Generate(stub, Request(id, c));
  REQUIRE(second.status.ok());
  std::vector<int32_t> held = prompt;
  held.insert(held.end(), first.tokens.begin(), first.tokens.end());
  // Tokens only: the reference appends the first answer in one piece, the
  // session decoded it token by token, and their logits differ in the last
  // bits (the log-probabilities here agree to 5 decimals, not bit for bit).
  CHECK(second.tokens == EngineReference(held, c).tokens);
  // The penalty did matter: without it the second answer differs.
  CHECK(second.tokens != EngineReference(held, {0.f, 0.f, 0.f, 0.f, {}}).tokens);
}

TEST_CASE("Bad penalties, min_p and logit_bias are refused by name, changing nothing",
          "[server][sampling][errors]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::string id = NewSession(stub);
  REQUIRE(AppendOnce(stub, id, RandomTokens(10, 1)).ok());
  auto refused = [&](const Controls& c, const std::string& words) {
    INFO(words);
    CHECK_STATUS(Generate(stub, Request(id, c)).status, grpc::StatusCode::INVALID_ARGUMENT, words);
  };
  refused({1.f, 2.5f, 0.f, 0.f, {}}, "presence_penalty must be in [-2, 2], got 2.5");
  refused({1.f, 0.f, -3.f, 0.f, {}}, "frequency_penalty must be in [-2, 2], got -3");
  refused({1.f, 0.f, 0.f, 1.5f, {}}, "min_p must be in [0, 1]");
  refused({1.f, 0.f, 0.f, 0.f, {{5, 101.f}}}, "logit_bias for token 5 must be in [-100, 100]");
  refused({0.f, 0.f, 0.f, 0.f, {{300, 1.f}}},
          "logit_bias names token 300, outside the vocabulary [0, 300)");
  refused({0.f, 0.f, 0.f, 0.f, {{-1, 1.f}}}, "logit_bias names token -1");
  refused({0.f, 0.f, 0.f, 0.f, {{299, 1.f}}}, "logit_bias names token 299, the landmark (chunk) id");
  refused({0.f, 0.f, 0.f, 0.f, {{298, -1.f}}}, "logit_bias names token 298, the pad id");
  std::map<int32_t, float> many;
  for (int32_t t = 0; t <= kMaxLogitBiasEntries; ++t) many[t] = 1.f;
  refused({0.f, 0.f, 0.f, 0.f, many}, "logit_bias has 301 entries; at most 300");
  CHECK(GetSession(stub, id).info.tokens() == 10);
  // (The same values as CreateSession defaults: session_defaults_test.cc.)
}

}  // namespace drt::server

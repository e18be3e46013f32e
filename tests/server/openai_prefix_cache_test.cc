// The prefix cache through the OpenAI API (docs/api.md, "Prefix reuse"):
// usage.prompt_tokens_details.cached_tokens says what a request reused, and
// lm-eval's loglikelihood requests for three choices of one context (echo +
// logprobs) reuse the context from the third on, with the scores a server
// without the cache gives (within the bound measured in
// prefix_cache_test.cc).
#include <catch2/catch.hpp>

#include <httplib.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"
#include "server/openai_http_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/openai_server.h"

namespace drt::server {
namespace {

using Json = nlohmann::json;

// prefix_cache_test.cc's kHitTolerance (measured there: 1.9e-5 at most).
constexpr double kHitTolerance = 1e-4;

ServiceOptions CacheOptions() {
  ServiceOptions options = testing::SmallOptions();
  options.prefix_cache.max_entries = 32;
  options.prefix_cache.max_bytes = int64_t{1} << 32;
  return options;
}

Json Post(testing::OpenAiServer& server, const Json& body) {
  auto res = server.Post(body);
  REQUIRE(res);
  INFO(res->body.substr(0, 600));
  REQUIRE(res->status == 200);
  return Json::parse(res->body);
}

int64_t CachedTokens(const Json& answer) {
  return answer["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
}

TEST_CASE("OpenAI API: a prompt sent again reports its cached tokens in usage",
          "[server][openai][prefix_cache]") {
  testing::OpenAiServer server(CacheOptions());
  const Json body = {{"model", "two_groups"},
                     {"prompt", std::string(500, 'x') + " and then some more text"},
                     {"max_tokens", 4},
                     {"temperature", 0}};
  const Json first = Post(server, body);
  const Json second = Post(server, body);
  CHECK(CachedTokens(first) == 0);
  const int64_t prompt_tokens = second["usage"]["prompt_tokens"].get<int64_t>();
  CHECK(prompt_tokens > 500);
  CHECK(CachedTokens(second) == prompt_tokens);
  CHECK(second["choices"][0]["text"] == first["choices"][0]["text"]);

  SECTION("with the cache off: 0") {
    testing::OpenAiServer off;
    Post(off, body);
    CHECK(CachedTokens(Post(off, body)) == 0);
  }
}

TEST_CASE("OpenAI API: lm-eval's third choice of one context reuses the context",
          "[server][openai][prefix_cache][lmeval]") {
  testing::OpenAiServer server(CacheOptions());
  testing::OpenAiServer cold;  // no cache: the reference
  const std::vector<int32_t> context = testing::RandomTokens(400, 401);
  for (int32_t choice = 0; choice < 3; ++choice) {
    std::vector<int32_t> ids = context;
    std::vector<int32_t> tail = testing::RandomTokens(20, 402 + choice);
    tail[0] = 20 + choice;  // the continuations differ from their first token
    ids.insert(ids.end(), tail.begin(), tail.end());
    // lm-eval's loglikelihood payload (openai_lmeval_test.cc), one prompt.
    const Json payload = {{"model", "two_groups"}, {"prompt", {ids}}, {"temperature", 0},
                          {"max_tokens", 1},       {"logprobs", 1},   {"seed", 1234},
                          {"echo", true}};
    const Json got = Post(server, payload);
    const Json want = Post(cold, payload);
    INFO("choice " << choice);
    // The second snapshots the 400 shared tokens on its way; the third starts there.
    CHECK(CachedTokens(got) == (choice == 2 ? 400 : 0));
    const Json& got_lp = got["choices"][0]["logprobs"]["token_logprobs"];
    const Json& want_lp = want["choices"][0]["logprobs"]["token_logprobs"];
    REQUIRE(got_lp.size() == want_lp.size());
    REQUIRE(got_lp.size() == ids.size() + 1);
    CHECK(got_lp[0].is_null());
    for (size_t i = 1; i < got_lp.size(); ++i) {
      INFO("token " << i);
      CHECK(got_lp[i].get<double>() == Approx(want_lp[i].get<double>()).margin(kHitTolerance));
    }
    CHECK(got["choices"][0]["logprobs"]["tokens"] == want["choices"][0]["logprobs"]["tokens"]);
  }
}

}  // namespace
}  // namespace drt::server

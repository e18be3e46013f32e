// The prefix cache (server/prefix_cache.h; docs/api.md, "Prefix reuse")
// through a real in-process server: a Complete whose prompt begins with an
// earlier one's reports the reused tokens, prefills only the rest (counted
// in the engine's prefill tokens, not wall time), and answers as a cold run
// (a server without the cache) does, within the measured bound; scored
// prompts get the stored scores of the reused tokens and live ones for the
// rest; LRU eviction by entries and bytes; the cache never makes a real
// request fail (host memory, --max_sessions); the longest common prefix
// snapshot (lm-eval's choices).
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "server/prefix_cache.h"
#include "server/session_manager.h"
#include "tests/server/test_util/check_status.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

// Measured 2026-11-25 on the fixture model (tests/fixtures/two_groups) with
// the prompts below, every comparison of this file: generated-token
// logprobs differ from a cold run's by at most 2.6e-6 (71 tokens), prompt
// scores and their alternatives' logprobs by at most 1.9e-5 (2097 scores,
// 5943 alternatives): the step cuts differ (the cold run prefills the whole
// prompt in its own pieces, a hit only the rest after the snapshot). 1e-4,
// the bound of the other step-cut comparisons (complete_prompt_logprobs_test.cc).
constexpr double kHitTolerance = 1e-4;

ServiceOptions CacheOptions(int64_t entries = 32, int64_t bytes = int64_t{1} << 32) {
  ServiceOptions options = SmallOptions();
  options.prefix_cache.max_entries = entries;
  options.prefix_cache.max_bytes = bytes;
  return options;
}

// `absent`: the value of a series not in `text` yet (none when it must be).
int64_t Metric(const std::string& text, const std::string& name,
               std::optional<int64_t> absent = std::nullopt) {
  const std::string key = name + " ";
  const size_t at = text.find("\n" + key);
  if (at == std::string::npos && absent.has_value()) return *absent;
  REQUIRE(at != std::string::npos);
  return std::stoll(text.substr(at + 1 + key.size()));
}

// Tokens the engine ran as prompt work (prefill and padding) so far (the
// series appears with the first step).
int64_t PrefillTokens(InProcessServer& server) {
  return Metric(server.metrics().RenderPrometheus(),
                "drt_engine_step_tokens_total{kind=\"prefill\"}", 0);
}

struct Completed {
  grpc::Status status;
  std::vector<int32_t> tokens;  // choice 0's
  std::vector<float> logprobs;
  std::vector<int32_t> tokens_1;  // choice 1's (n = 2)
  std::vector<int32_t> score_ids;
  std::vector<float> scores;
  std::vector<drt::v1::TokenTopLogprobs> tops;
  drt::v1::GenerateTimings timings;
  int64_t prefilled = 0;  // engine prefill tokens this call ran
};

struct Request {
  int32_t max_tokens = 6;
  std::optional<int32_t> score_top;
  int32_t n = 1;
  bool prompt_only = false;
};

// A Complete of `prompt` in three messages (the prompt arrives in pieces, as
// a streamed one does), greedy, no padding.
Completed Complete(InProcessServer& server, const std::vector<int32_t>& prompt,
                   const Request& r = {}) {
  const int64_t prefill_before = PrefillTokens(server);
  grpc::ClientContext context;
  SetDeadline(context, 120);
  auto stream = server.stub().Complete(&context);
  const size_t third = prompt.size() / 3;
  const size_t cuts[] = {0, third, 2 * third, prompt.size()};
  for (int i = 0; i < 3; ++i) {
    drt::v1::CompleteRequest message;
    if (i == 0) {
      message.mutable_generate()->set_max_tokens(r.max_tokens);
      message.mutable_generate()->set_pad_to_chunk_boundary(false);
      message.mutable_generate()->set_return_logprobs(true);
      if (r.score_top.has_value()) message.set_prompt_logprobs(*r.score_top);
      message.set_n(r.n);
      message.set_prompt_only(r.prompt_only);
    }
    message.mutable_tokens()->mutable_ids()->Add(prompt.begin() + cuts[i],
                                                 prompt.begin() + cuts[i + 1]);
    stream->Write(message);
  }
  stream->WritesDone();
  Completed out;
  drt::v1::GenerateResponse response;
  while (stream->Read(&response)) {
    if (response.has_prompt_logprobs()) {
      const auto& event = response.prompt_logprobs();
      CHECK(event.first_token_index() == static_cast<int64_t>(out.score_ids.size()));
      out.score_ids.insert(out.score_ids.end(), event.token_ids().begin(), event.token_ids().end());
      out.scores.insert(out.scores.end(), event.logprobs().begin(), event.logprobs().end());
      out.tops.insert(out.tops.end(), event.top_logprobs().begin(), event.top_logprobs().end());
    } else if (response.has_piece()) {
      const auto& piece = response.piece();
      auto& ids = piece.choice() == 0 ? out.tokens : out.tokens_1;
      ids.insert(ids.end(), piece.token_ids().begin(), piece.token_ids().end());
      if (piece.choice() == 0) {
        out.logprobs.insert(out.logprobs.end(), piece.logprobs().begin(), piece.logprobs().end());
      }
    } else if (response.has_done() && response.done().choice() == 0) {
      out.timings = response.done().timings();
    }
  }
  out.status = stream->Finish();
  out.prefilled = PrefillTokens(server) - prefill_before;
  return out;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `got` answers as `cold` does: the same greedy tokens, logprobs within the
// measured bound.
void CheckSameAnswer(const Completed& got, const Completed& cold) {
  REQUIRE(got.status.ok());
  REQUIRE(cold.status.ok());
  CHECK(got.tokens == cold.tokens);
  REQUIRE(got.logprobs.size() == cold.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    INFO("generated token " << i);
    CHECK(got.logprobs[i] == Approx(cold.logprobs[i]).margin(kHitTolerance));
  }
}

void CheckSameScores(const Completed& got, const Completed& cold, int32_t top) {
  REQUIRE(got.score_ids == cold.score_ids);
  REQUIRE(got.scores.size() == cold.scores.size());
  REQUIRE(got.tops.size() == (top > 0 ? cold.scores.size() : 0));
  CHECK(std::isnan(got.scores[0]));  // the prompt's first token: nothing before it
  for (size_t i = 1; i < got.scores.size(); ++i) {
    INFO("prompt token " << i);
    CHECK(got.scores[i] == Approx(cold.scores[i]).margin(kHitTolerance));
    if (top > 0) {
      REQUIRE(got.tops[i].alternatives_size() == top);
      for (int k = 0; k < top; ++k) {
        CHECK(got.tops[i].alternatives(k).token_id() == cold.tops[i].alternatives(k).token_id());
        CHECK(got.tops[i].alternatives(k).logprob() ==
              Approx(cold.tops[i].alternatives(k).logprob()).margin(kHitTolerance));
      }
    }
  }
}

TEST_CASE("prefix cache: a Complete sent twice prefills nothing the second time",
          "[server][prefix_cache]") {
  InProcessServer cold_server;  // no cache: the reference
  InProcessServer server(CacheOptions());
  const std::vector<int32_t> prompt = RandomTokens(900, 301);
  const Completed cold = Complete(cold_server, prompt);
  REQUIRE(cold.status.ok());
  CHECK(cold.prefilled == 900);

  const Completed first = Complete(server, prompt);
  CheckSameAnswer(first, cold);
  CHECK(first.timings.cached_prompt_tokens() == 0);
  CHECK(first.prefilled == 900);
  CHECK(server.service().prefix_cache().entries() == 1);

  const Completed second = Complete(server, prompt);
  CheckSameAnswer(second, cold);
  CHECK(second.timings.cached_prompt_tokens() == 900);
  CHECK(second.timings.prompt_tokens() == 900);
  CHECK(second.prefilled == 0);  // the snapshot's fork holds the last logits
  CHECK(server.service().prefix_cache().entries() == 1);  // no second copy

  const std::string text = server.metrics().RenderPrometheus();
  CHECK(Metric(text, "drt_prefix_cache_hits_total") == 1);
  CHECK(Metric(text, "drt_prefix_cache_misses_total") == 1);
  CHECK(Metric(text, "drt_prefix_cache_reused_tokens_total") == 900);
  CHECK(Metric(text, "drt_prefix_cache_entries") == 1);
  CHECK(Metric(text, "drt_prefix_cache_bytes") > 0);
  // The snapshot holds no slot of --max_sessions and is not listed.
  CHECK(Metric(text, "drt_active_sessions") == 0);
}

TEST_CASE("prefix cache: a prompt extending a cached one ingests only the new tokens",
          "[server][prefix_cache]") {
  InProcessServer cold_server;
  InProcessServer server(CacheOptions());
  const std::vector<int32_t> turn1 = RandomTokens(700, 302);
  const std::vector<int32_t> turn2 = Concat(turn1, RandomTokens(200, 303));
  const std::vector<int32_t> turn3 = Concat(turn2, RandomTokens(150, 304));
  REQUIRE(Complete(server, turn1).status.ok());
  const Completed second = Complete(server, turn2);
  CheckSameAnswer(second, Complete(cold_server, turn2));
  CHECK(second.timings.cached_prompt_tokens() == 700);
  CHECK(second.timings.prompt_tokens() == 900);
  CHECK(second.prefilled == 200);
  // The longest snapshot that begins the prompt wins (turn2's, not turn1's).
  const Completed third = Complete(server, turn3);
  CheckSameAnswer(third, Complete(cold_server, turn3));
  CHECK(third.timings.cached_prompt_tokens() == 900);
  CHECK(third.prefilled == 150);

  SECTION("n = 2 from a hit: both choices as a cold run's") {
    Request two;
    two.n = 2;
    two.max_tokens = 5;
    const Completed cold = Complete(cold_server, turn3, two);
    const Completed hit = Complete(server, turn3, two);
    CheckSameAnswer(hit, cold);
    CHECK(hit.tokens_1 == cold.tokens_1);
    CHECK(hit.timings.cached_prompt_tokens() == 1050);
    CHECK(hit.prefilled == 0);
  }
  SECTION("a prompt shorter than a snapshot does not use it") {
    const std::vector<int32_t> part(turn1.begin(), turn1.begin() + 500);
    const Completed got = Complete(server, part);
    CheckSameAnswer(got, Complete(cold_server, part));
    CHECK(got.timings.cached_prompt_tokens() == 0);
    CHECK(got.prefilled == 500);
  }
}

TEST_CASE("prefix cache: scored prompts get stored scores for the reused tokens and live ones after",
          "[server][prefix_cache][score]") {
  InProcessServer cold_server;
  InProcessServer server(CacheOptions());
  const std::vector<int32_t> context = RandomTokens(600, 305);
  const std::vector<int32_t> longer = Concat(context, RandomTokens(250, 306));
  Request scored3;
  scored3.score_top = 3;
  scored3.prompt_only = true;  // lm-eval's loglikelihood (echo, max_tokens 0)
  const Completed first = Complete(server, context, scored3);
  REQUIRE(first.status.ok());
  CHECK(first.timings.cached_prompt_tokens() == 0);

  SECTION("fewer alternatives than stored: the snapshot is used, its scores cut to them") {
    Request scored2 = scored3;
    scored2.score_top = 2;
    const Completed hit = Complete(server, longer, scored2);
    REQUIRE(hit.status.ok());
    CHECK(hit.timings.cached_prompt_tokens() == 600);
    CHECK(hit.prefilled == 250);
    // Token 600 (the seam) is scored from the snapshot's last logits.
    CheckSameScores(hit, Complete(cold_server, longer, scored2), 2);
  }
  SECTION("more alternatives than stored: the snapshot is not used") {
    Request scored5 = scored3;
    scored5.score_top = 5;
    const Completed miss = Complete(server, longer, scored5);
    REQUIRE(miss.status.ok());
    CHECK(miss.timings.cached_prompt_tokens() == 0);
    CHECK(miss.prefilled == 850);
    CheckSameScores(miss, Complete(cold_server, longer, scored5), 5);
  }
  SECTION("an unscored prompt may use a scored snapshot") {
    const Completed hit = Complete(server, longer);
    CheckSameAnswer(hit, Complete(cold_server, longer));
    CHECK(hit.timings.cached_prompt_tokens() == 600);
  }
  SECTION("an unscored snapshot serves no scored prompt") {
    const std::vector<int32_t> other = RandomTokens(400, 307);
    REQUIRE(Complete(server, other).status.ok());  // unscored: its snapshot has no scores
    Request scored0 = scored3;
    scored0.score_top = 0;
    const Completed miss = Complete(server, other, scored0);
    REQUIRE(miss.status.ok());
    CHECK(miss.timings.cached_prompt_tokens() == 0);
    CheckSameScores(miss, Complete(cold_server, other, scored0), 0);
  }
}

TEST_CASE("prefix cache: the longest common prefix is snapshotted so the third choice reuses it",
          "[server][prefix_cache]") {
  InProcessServer cold_server;
  InProcessServer server(CacheOptions());
  const std::vector<int32_t> context = RandomTokens(400, 308);
  // Three continuations that differ from their first token.
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t first : {11, 12, 13}) {
    std::vector<int32_t> tail = RandomTokens(60, 309 + first);
    tail[0] = first;
    prompts.push_back(Concat(context, tail));
  }
  const Completed a = Complete(server, prompts[0]);
  const Completed b = Complete(server, prompts[1]);
  const Completed c = Complete(server, prompts[2]);
  CheckSameAnswer(a, Complete(cold_server, prompts[0]));
  CheckSameAnswer(b, Complete(cold_server, prompts[1]));
  CheckSameAnswer(c, Complete(cold_server, prompts[2]));
  CHECK(a.timings.cached_prompt_tokens() == 0);
  // The second shares 400 tokens with the first's snapshot but is no
  // extension of it: a miss that snapshots at 400 on its way.
  CHECK(b.timings.cached_prompt_tokens() == 0);
  CHECK(b.prefilled == 460);
  CHECK(c.timings.cached_prompt_tokens() == 400);
  CHECK(c.prefilled == 60);
  // a's and the context's: b and c end 60 tokens past the context's
  // snapshot, under kMinCommonPrefixTokens, so their prompt ends are not kept.
  CHECK(server.service().prefix_cache().entries() == 2);
}

TEST_CASE("prefix cache: a prompt end less than 64 tokens past the call's start is not snapshotted",
          "[server][prefix_cache]") {
  InProcessServer server(CacheOptions());
  SECTION("a short prompt") {
    const std::vector<int32_t> prompt = RandomTokens(kMinCommonPrefixTokens - 1, 370);
    REQUIRE(Complete(server, prompt).status.ok());
    CHECK(server.service().prefix_cache().entries() == 0);
    const Completed again = Complete(server, prompt);
    REQUIRE(again.status.ok());
    CHECK(again.timings.cached_prompt_tokens() == 0);
    // At the threshold it is kept.
    const std::vector<int32_t> at = RandomTokens(kMinCommonPrefixTokens, 371);
    REQUIRE(Complete(server, at).status.ok());
    CHECK(server.service().prefix_cache().entries() == 1);
    CHECK(Complete(server, at).timings.cached_prompt_tokens() == kMinCommonPrefixTokens);
  }
  SECTION("a short extension of a hit: the hit's snapshot serves, no second one") {
    const std::vector<int32_t> doc = RandomTokens(300, 372);
    REQUIRE(Complete(server, doc).status.ok());
    const std::vector<int32_t> question = Concat(doc, RandomTokens(30, 373));
    const Completed hit = Complete(server, question);
    REQUIRE(hit.status.ok());
    CHECK(hit.timings.cached_prompt_tokens() == 300);
    CHECK(hit.prefilled == 30);
    CHECK(server.service().prefix_cache().entries() == 1);
    const Completed other = Complete(server, Concat(doc, RandomTokens(30, 374)));
    CHECK(other.timings.cached_prompt_tokens() == 300);
    // A longer turn is kept (64 past the hit).
    const std::vector<int32_t> turn = Concat(doc, RandomTokens(kMinCommonPrefixTokens, 375));
    REQUIRE(Complete(server, turn).status.ok());
    CHECK(server.service().prefix_cache().entries() == 2);
    CHECK(Complete(server, turn).timings.cached_prompt_tokens() == 300 + kMinCommonPrefixTokens);
  }
  SECTION("short one-off prompts leave a document's snapshot in place") {
    ServiceOptions options = CacheOptions(/*entries=*/2);
    InProcessServer small(options);
    const std::vector<int32_t> doc = RandomTokens(300, 376);
    REQUIRE(Complete(small, doc).status.ok());
    for (uint64_t seed = 377; seed < 381; ++seed) {
      REQUIRE(Complete(small, RandomTokens(20, seed)).status.ok());
    }
    CHECK(Complete(small, doc).timings.cached_prompt_tokens() == 300);
  }
}

TEST_CASE("prefix cache: entries are evicted least recently used first, by count and by bytes",
          "[server][prefix_cache]") {
  const std::vector<int32_t> p1 = RandomTokens(300, 320);
  const std::vector<int32_t> p2 = RandomTokens(300, 321);
  const std::vector<int32_t> p3 = RandomTokens(300, 322);
  SECTION("--prefix_cache_entries 2") {
    InProcessServer server(CacheOptions(/*entries=*/2));
    REQUIRE(Complete(server, p1).status.ok());
    REQUIRE(Complete(server, p2).status.ok());
    CHECK(Complete(server, p1).timings.cached_prompt_tokens() == 300);  // p1 used last
    REQUIRE(Complete(server, p3).status.ok());  // evicts p2, the least recently used
    CHECK(server.service().prefix_cache().entries() == 2);
    CHECK(Metric(server.metrics().RenderPrometheus(), "drt_prefix_cache_evictions_total") == 1);
    CHECK(Complete(server, p1).timings.cached_prompt_tokens() == 300);
    CHECK(Complete(server, p3).timings.cached_prompt_tokens() == 300);
    CHECK(Complete(server, p2).timings.cached_prompt_tokens() == 0);
  }
  SECTION("--prefix_cache_bytes for one and a half snapshots") {
    int64_t one = 0;
    {
      InProcessServer probe(CacheOptions());
      REQUIRE(Complete(probe, p1).status.ok());
      one = probe.service().prefix_cache().bytes();
    }
    REQUIRE(one > 0);
    InProcessServer server(CacheOptions(/*entries=*/32, /*bytes=*/one * 3 / 2));
    REQUIRE(Complete(server, p1).status.ok());
    REQUIRE(Complete(server, p2).status.ok());  // p1 goes
    CHECK(server.service().prefix_cache().entries() == 1);
    CHECK(server.service().prefix_cache().bytes() <= one * 3 / 2);
    CHECK(Complete(server, p2).timings.cached_prompt_tokens() == 300);
    CHECK(Complete(server, p1).timings.cached_prompt_tokens() == 0);
  }
  SECTION("the bytes are checked again once the Complete's own session is gone") {
    // While its Complete runs, a new snapshot counts half the chunks it
    // shares with the call's session; once that goes, all of them.
    int64_t one = 0;
    {
      InProcessServer probe(CacheOptions());
      REQUIRE(Complete(probe, p1).status.ok());
      one = probe.service().prefix_cache().bytes();
    }
    InProcessServer server(CacheOptions(/*entries=*/32, /*bytes=*/2 * one - 1));
    REQUIRE(Complete(server, p1).status.ok());
    REQUIRE(Complete(server, p2).status.ok());
    CHECK(server.service().prefix_cache().entries() == 1);
    CHECK(server.service().prefix_cache().bytes() <= 2 * one - 1);
    CHECK(Complete(server, p2).timings.cached_prompt_tokens() == 300);
  }
  SECTION("a snapshot bigger than --prefix_cache_bytes alone is not kept and evicts nothing") {
    // review-prefix finding 2: it used to evict every other snapshot, then
    // itself once its Complete's session was gone.
    const std::vector<int32_t> big = RandomTokens(3000, 323);
    int64_t small_bytes = 0;
    int64_t big_bytes = 0;
    {
      InProcessServer probe(CacheOptions());
      REQUIRE(Complete(probe, p1).status.ok());
      small_bytes = probe.service().prefix_cache().bytes();
      REQUIRE(Complete(probe, big).status.ok());
      big_bytes = probe.service().prefix_cache().bytes() - small_bytes;
    }
    INFO("snapshot bytes: " << small_bytes << " for 300 tokens, " << big_bytes << " for 3000");
    REQUIRE(big_bytes > small_bytes);
    const int64_t bound = (small_bytes + big_bytes) / 2;
    InProcessServer server(CacheOptions(/*entries=*/32, bound));
    REQUIRE(Complete(server, p1).status.ok());
    REQUIRE(server.service().prefix_cache().entries() == 1);
    const Completed got = Complete(server, big);
    REQUIRE(got.status.ok());
    CHECK(server.service().prefix_cache().entries() == 1);
    CHECK(Metric(server.metrics().RenderPrometheus(), "drt_prefix_cache_evictions_total") == 0);
    CHECK(Complete(server, p1).timings.cached_prompt_tokens() == 300);
    // Sent again: not kept again, and p1 still there.
    CHECK(Complete(server, big).timings.cached_prompt_tokens() == 0);
    CHECK(server.service().prefix_cache().entries() == 1);
    CHECK(Complete(server, p1).timings.cached_prompt_tokens() == 300);
  }
  SECTION("a snapshot replaced by one with the same tokens and more scores is no eviction") {
    InProcessServer server(CacheOptions());
    Request scored;
    scored.prompt_only = true;
    scored.score_top = 2;
    REQUIRE(Complete(server, p1, scored).status.ok());
    scored.score_top = 4;  // the 2-alternative snapshot cannot serve it: replaced
    const Completed more = Complete(server, p1, scored);
    REQUIRE(more.status.ok());
    CHECK(more.timings.cached_prompt_tokens() == 0);
    CHECK(server.service().prefix_cache().entries() == 1);
    CHECK(Metric(server.metrics().RenderPrometheus(), "drt_prefix_cache_evictions_total") == 0);
    scored.score_top = 3;
    CHECK(Complete(server, p1, scored).timings.cached_prompt_tokens() == 300);
  }
  SECTION("0 is off") {
    for (const auto& [entries, bytes] : {std::pair<int64_t, int64_t>{0, 1 << 30}, {32, 0}}) {
      InProcessServer server(CacheOptions(entries, bytes));
      REQUIRE(Complete(server, p1).status.ok());
      const Completed again = Complete(server, p1);
      REQUIRE(again.status.ok());
      CHECK(again.timings.cached_prompt_tokens() == 0);
      CHECK(again.prefilled == 300);
      CHECK(server.service().prefix_cache().entries() == 0);
    }
  }
}

TEST_CASE("prefix cache: snapshots never make a real request fail", "[server][prefix_cache]") {
  SECTION("they hold no slot of --max_sessions") {
    ServiceOptions options = CacheOptions();
    options.max_sessions = 1;
    InProcessServer server(options);
    for (uint64_t seed = 330; seed < 334; ++seed) {
      const Completed got = Complete(server, RandomTokens(200, seed));
      INFO(got.status.error_message());
      REQUIRE(got.status.ok());
    }
    CHECK(server.service().prefix_cache().entries() == 4);
    // The one slot is free for a real session (the snapshots hold none).
    const CreateResult created = CreateSession(server.stub());
    INFO(created.status.error_message());
    CHECK(created.status.ok());
  }
  SECTION("they are evicted before a request is refused for host memory") {
    // One snapshot's bytes and one prompt's reservation, measured.
    const std::vector<int32_t> probe_prompt = RandomTokens(600, 340);
    int64_t one = 0;
    {
      InProcessServer probe(CacheOptions());
      REQUIRE(Complete(probe, probe_prompt).status.ok());
      one = probe.service().prefix_cache().bytes();
    }
    ServiceOptions options = CacheOptions();
    // Room for a request and about two snapshots beside it: the six
    // prompts' snapshots do not fit, the cache's own byte bound does not
    // apply (4 GiB), so only the budget's reclaimer evicts.
    InProcessServer sizing(options);
    const int64_t request = sizing.service().session_manager().HostBytesForTokens(600);
    options.host_memory_budget_bytes = 3 * one + 2 * request;
    InProcessServer server(options);
    for (uint64_t seed = 341; seed < 347; ++seed) {
      const Completed got = Complete(server, RandomTokens(600, seed));
      INFO(got.status.error_message());
      REQUIRE(got.status.ok());
    }
    const std::string text = server.metrics().RenderPrometheus();
    CHECK(Metric(text, "drt_prefix_cache_evictions_total") > 0);
    CHECK(server.service().prefix_cache().entries() < 6);
    CHECK(server.service().session_manager().TotalHostBytes() <= options.host_memory_budget_bytes);
  }
}

TEST_CASE("prefix cache: a server at --max_sessions refuses a Complete before reading its prompt",
          "[server][prefix_cache]") {
  // review-prefix finding 7: the call's session is made only once the
  // prompt decides its start, and while a snapshot matches the prompt is
  // held; the refusal must still come at once, as with the cache off.
  ServiceOptions options = CacheOptions();
  options.max_sessions = 1;
  InProcessServer server(options);
  const std::vector<int32_t> prompt = RandomTokens(600, 390);
  REQUIRE(Complete(server, prompt).status.ok());
  REQUIRE(server.service().prefix_cache().entries() == 1);
  const CreateResult created = CreateSession(server.stub());  // the one slot
  REQUIRE(created.status.ok());

  grpc::ClientContext context;
  SetDeadline(context, 10);
  auto stream = server.stub().Complete(&context);
  drt::v1::CompleteRequest message;
  message.mutable_generate()->set_max_tokens(4);
  // The snapshot's first 200 tokens: it still matches, more could come.
  message.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.begin() + 200);
  REQUIRE(stream->Write(message));
  // No WritesDone: the answer must come without the rest of the prompt.
  drt::v1::GenerateResponse response;
  while (stream->Read(&response)) {
  }
  const grpc::Status status = stream->Finish();
  INFO(status.error_message());
  CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(status.error_message().find("maximum of 1 sessions") != std::string::npos);
}

TEST_CASE("prefix cache: a Complete that fails leaves no snapshot of its partial prompt",
          "[server][prefix_cache]") {
  ServiceOptions options = CacheOptions();
  options.max_context_tokens = 500;
  InProcessServer server(options);
  // The third message passes the context limit: the call fails after two
  // messages ran.
  const Completed got = Complete(server, RandomTokens(600, 350));
  CHECK(got.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(server.service().prefix_cache().entries() == 0);
}

TEST_CASE("prefix cache: snapshots are never written to --state_dir and a restart starts empty",
          "[server][prefix_cache][durable]") {
  drt::testing::TempDir dir;
  const std::vector<int32_t> prompt = RandomTokens(500, 360);
  auto session_files = [&] {
    int files = 0;
    for (const auto& file : std::filesystem::directory_iterator(dir.path() + "/sessions")) {
      (void)file;
      ++files;
    }
    return files;
  };
  {
    DurableService durable(dir.path(), CacheOptions());
    REQUIRE(Complete(durable.server, prompt).status.ok());
    const Completed hit = Complete(durable.server, prompt);
    REQUIRE(hit.status.ok());
    CHECK(hit.timings.cached_prompt_tokens() == 500);
    CHECK(durable.server.service().prefix_cache().entries() == 1);
    CHECK(session_files() == 0);  // the snapshot (and the calls' sessions) left nothing
  }
  DurableService restarted(dir.path(), CacheOptions());
  CHECK(restarted.server.service().session_manager().count() == 0);
  CHECK(Complete(restarted.server, prompt).timings.cached_prompt_tokens() == 0);
}

TEST_CASE("prefix cache: a snapshot evicted after it matched cannot be forked, and the Complete starts cold",
          "[server][prefix_cache]") {
  InProcessServer server(CacheOptions());
  const std::vector<int32_t> prompt = RandomTokens(300, 370);
  REQUIRE(Complete(server, prompt).status.ok());
  PrefixCache& cache = server.service().prefix_cache();
  // What a Complete's matcher holds: the snapshot, found before the evict.
  const auto candidates = cache.Candidates(std::nullopt);
  REQUIRE(candidates.size() == 1);
  REQUIRE(cache.EvictOne());
  CHECK(cache.entries() == 0);
  const auto fork = cache.Fork(*candidates[0]);
  CHECK_FALSE(fork.ok());  // the Complete's decide then makes a new session
  CHECK(fork.status().code() == absl::StatusCode::kNotFound);
  const Completed cold = Complete(server, prompt);
  REQUIRE(cold.status.ok());
  CHECK(cold.timings.cached_prompt_tokens() == 0);
  CHECK(cold.prefilled == 300);
}

TEST_CASE("PrefixMatcher holds tokens while a longer snapshot may match, then names the hit",
          "[server][prefix_cache]") {
  auto entry = [](std::vector<int32_t> tokens) {
    auto e = std::make_shared<PrefixEntry>();
    e->tokens = std::move(tokens);
    return std::shared_ptr<const PrefixEntry>(e);
  };
  const auto ab = entry({1, 2});
  const auto abcd = entry({1, 2, 3, 4});
  const auto abx = entry({1, 2, 9, 9, 9});
  PrefixMatcher matcher({ab, abcd, abx});
  CHECK(matcher.open());
  const int32_t first[] = {1, 2};
  matcher.Push(first);
  CHECK(matcher.hit() == ab);  // all of ab's tokens came
  CHECK(matcher.open());       // abcd and abx still may
  const int32_t next[] = {3};
  matcher.Push(next);
  CHECK(matcher.open());  // abcd
  CHECK(matcher.common_tokens() == 3);
  const int32_t rest[] = {5, 6, 7};
  matcher.Push(rest);  // abcd falls out at its 4th token
  CHECK_FALSE(matcher.open());
  CHECK(matcher.hit() == ab);
  CHECK(matcher.hit_tokens() == 2);
  CHECK(matcher.common_tokens() == 3);  // 1 2 3, shared with abcd
  CHECK(matcher.held() == 6);
  CHECK(matcher.TakeHeld() == std::vector<int32_t>{1, 2, 3, 5, 6, 7});

  PrefixMatcher none({abcd});
  const int32_t other[] = {7, 1, 2};
  none.Push(other);
  CHECK_FALSE(none.open());
  CHECK(none.hit() == nullptr);
  CHECK(none.common_tokens() == 0);
  CHECK(none.held() == 3);
}

}  // namespace
}  // namespace drt::server

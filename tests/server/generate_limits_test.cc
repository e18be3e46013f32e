// Generate against the session's context limit and the call's deadline:
// padding never overruns the limit, a Generate with no room is refused with
// the session unchanged, and a deadline ends the stream with a final message
// that counts what joined the context, so the client has seen every token
// the session holds. Fixture chunks hold 63 tokens; limits are hand-picked
// around 126 = 2 x 63.
#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

std::string SessionWith(drt::v1::Drt::Stub& stub, int64_t limit, size_t tokens, uint64_t seed) {
  const std::string id = NewSession(stub, limit);
  if (!AppendTokens(stub, id, RandomTokens(tokens, seed), {tokens}).status.ok()) {
    throw std::runtime_error("Append failed");
  }
  return id;
}

drt::v1::GenerateRequest Request(const std::string& id, int32_t max_tokens, bool pad) {
  drt::v1::GenerateRequest request = GreedyRequest(id, max_tokens);
  request.set_pad_to_chunk_boundary(pad);
  request.set_ignore_eos(true);
  return request;
}

TEST_CASE("Generate at the context limit is refused and adds nothing", "[server][limits]") {
  InProcessServer server;
  auto& stub = server.stub();

  SECTION("a full session, with padding (the issue: OK, 0 tokens, 126 held)") {
    const std::string id = SessionWith(stub, 100, 100, 1);
    GenerateResult g = Generate(stub, Request(id, 16, /*pad=*/true));
    INFO("status '" << g.status.error_message() << "'");
    CHECK(g.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    // 100 = 63 + 37: 26 pads to the boundary.
    CHECK_THAT(g.status.error_message(),
               Contains("session " + id + " holds 100 tokens of its context limit of 100: padding "
                        "to the chunk boundary needs 26 more and generating at least 1, so "
                        "nothing was added"));
    CHECK(g.tokens.empty());
    CHECK(WaitIdle(stub, id).tokens() == 100);

    // An Append of one unfinished word says what it brings, held back or not.
    grpc::Status appended = AppendTexts(stub, id, {"x"}).status;
    INFO("Append: '" << appended.error_message() << "'");
    CHECK(appended.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK_THAT(appended.error_message(), !Contains("brings 0 more"));
    CHECK_THAT(appended.error_message(),
               Contains("would exceed its context limit of 100 tokens (it holds 100, the text "
                        "so far brings 1 more: 0 now and 1 of the last word, which waits for the "
                        "next piece or the end of the stream)"));
    CHECK(WaitIdle(stub, id).tokens() == 100);
  }

  SECTION("a full session, without padding") {
    const std::string id = SessionWith(stub, 100, 100, 2);
    GenerateResult g = Generate(stub, Request(id, 16, /*pad=*/false));
    INFO("status '" << g.status.error_message() << "'");
    CHECK(g.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK_THAT(g.status.error_message(),
               Contains("session " + id + " holds 100 tokens, its context limit: there is no "
                        "room to generate, and nothing was added"));
    CHECK(WaitIdle(stub, id).tokens() == 100);
  }

  SECTION("padding that would pass the limit") {
    // 90 = 63 + 27: padding needs 36, 126 > 100.
    const std::string id = SessionWith(stub, 100, 90, 3);
    GenerateResult g = Generate(stub, Request(id, 16, /*pad=*/true));
    CHECK(g.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK_THAT(g.status.error_message(),
               Contains("padding to the chunk boundary needs 36 more and generating at least 1, "
                        "so nothing was added (without pad_to_chunk_boundary there is room for "
                        "10 tokens)"));
    CHECK(WaitIdle(stub, id).tokens() == 90);
    // Without padding the 10 tokens of room are generated, then LENGTH.
    g = Generate(stub, Request(id, 16, /*pad=*/false));
    REQUIRE(g.status.ok());
    CHECK(g.tokens.size() == 10);
    REQUIRE(g.done.has_value());
    CHECK(g.done->finish_reason() == drt::v1::FINISH_REASON_LENGTH);
    CHECK(g.done->padding_tokens() == 0);
    CHECK(g.done->tokens_appended() == 10);
    CHECK(g.done->session_tokens() == 100);
    CHECK(WaitIdle(stub, id).tokens() == 100);
  }

  SECTION("padding that fits: pads, then generates up to the limit") {
    const std::string id = SessionWith(stub, 130, 100, 4);
    GenerateResult g = Generate(stub, Request(id, 16, /*pad=*/true));
    REQUIRE(g.status.ok());
    CHECK(g.tokens.size() == 4);  // 130 - 126
    REQUIRE(g.done.has_value());
    CHECK(g.done->finish_reason() == drt::v1::FINISH_REASON_LENGTH);
    CHECK(g.done->padding_tokens() == 26);
    CHECK(g.done->tokens_appended() == 30);
    CHECK(g.done->session_tokens() == 130);
    CHECK(WaitIdle(stub, id).tokens() == 130);
  }
}

TEST_CASE("Generate ends before the deadline with every token delivered and counted",
          "[server][limits]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::string id = SessionWith(stub, 0, 100, 5);
  constexpr double kDeadline = 3.0;
  const auto start = std::chrono::steady_clock::now();
  GenerateResult g = Generate(stub, Request(id, 1 << 20, /*pad=*/true), {}, kDeadline);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("status " << g.status.error_code() << " '" << g.status.error_message() << "' after "
                 << seconds << " s, " << g.tokens.size() << " tokens");
  // Without the fix: DEADLINE_EXCEEDED, and the session held tokens the
  // client never saw (generated after its last read, plus the padding).
  REQUIRE(g.status.ok());
  REQUIRE(g.done.has_value());
  CHECK(g.done->finish_reason() == drt::v1::FINISH_REASON_DEADLINE);
  CHECK(seconds < kDeadline);
  CHECK(g.tokens.size() > 0);
  CHECK(g.done->padding_tokens() == 26);
  CHECK(g.done->tokens_appended() == 26 + static_cast<int64_t>(g.tokens.size()));
  CHECK(g.done->session_tokens() == 126 + static_cast<int64_t>(g.tokens.size()));
  CHECK(g.done->timings().generated_tokens() == static_cast<int32_t>(g.tokens.size()));
  // The session holds exactly what the client saw.
  CHECK(WaitIdle(stub, id).tokens() == 126 + static_cast<int64_t>(g.tokens.size()));
}

TEST_CASE("a Generate whose deadline leaves no time for a token changes nothing",
          "[server][limits]") {
  // (review-api F5: it ran its padding, then generated nothing, every time.)
  InProcessServer server;
  auto& stub = server.stub();
  const std::string id = SessionWith(stub, 0, 100, 6);  // 26 short of the chunk boundary
  for (int call = 0; call < 2; ++call) {
    GenerateResult g = Generate(stub, Request(id, 8, /*pad=*/true), {}, /*deadline=*/0.1);
    INFO("status " << g.status.error_code() << " '" << g.status.error_message() << "'");
    // The answer normally comes well within 0.1 s; on a loaded machine the
    // client may see its deadline pass first, which is fine: what matters is
    // the session.
    if (g.status.ok()) {
      REQUIRE(g.done.has_value());
      CHECK(g.done->finish_reason() == drt::v1::FINISH_REASON_DEADLINE);
      CHECK(g.done->padding_tokens() == 0);
      CHECK(g.done->tokens_appended() == 0);
      CHECK(g.tokens.empty());
    } else {
      CHECK(g.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
    }
    CHECK(WaitIdle(stub, id).tokens() == 100);
  }
}

}  // namespace
}  // namespace drt::server

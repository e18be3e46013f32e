// Every error code drt.v1.Drt returns, provoked over a real loopback channel,
// with its message checked; authentication on and off; draining.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/server/test_util/check_status.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/waiting.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

drt::v1::GenerateRequest WithSampling(const std::string& id, float temperature, int32_t top_k,
                                      float top_p) {
  drt::v1::GenerateRequest request = GreedyRequest(id, 4);
  request.mutable_sampling()->set_temperature(temperature);
  request.mutable_sampling()->set_top_k(top_k);
  request.mutable_sampling()->set_top_p(top_p);
  return request;
}

TEST_CASE("INVALID_ARGUMENT: bad tokens, sampling, max_tokens, session ids", "[server][errors]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::string id = NewSession(stub);

  SECTION("token ids out of range, landmark and pad ids; nothing of the message is applied") {
    REQUIRE(AppendOnce(stub, id, RandomTokens(70, 1)).ok());
    CHECK_STATUS(AppendOnce(stub, id, {1, 2, 300}), grpc::StatusCode::INVALID_ARGUMENT,
                 "message 0: token 300 (index 2) is outside the vocabulary [0, 300)");
    CHECK_STATUS(AppendOnce(stub, id, {7, -1}), grpc::StatusCode::INVALID_ARGUMENT,
                 "token -1 (index 1) is outside the vocabulary [0, 300)");
    CHECK_STATUS(AppendOnce(stub, id, {5, 299}), grpc::StatusCode::INVALID_ARGUMENT,
                 "token 299 (index 1) is the landmark id, which only the engine inserts");
    CHECK_STATUS(AppendOnce(stub, id, {298}), grpc::StatusCode::INVALID_ARGUMENT,
                 "token 298 (index 0) is the pad id, which only the engine inserts");
    // A bad id in a later message: the earlier messages stay, the bad one is
    // refused whole.
    std::vector<int32_t> three = RandomTokens(30, 2);
    three.push_back(299);
    for (int32_t t : RandomTokens(20, 3)) three.push_back(t);
    CHECK_STATUS(AppendTokens(stub, id, three, {10, 10, 31}).status,
                 grpc::StatusCode::INVALID_ARGUMENT, "message 2: token 299 (index 10)");
    drt::v1::SessionInfo info = WaitIdle(stub, id);
    CHECK(info.tokens() == 70 + 20);
    CHECK(info.chunks() == 1);
    // A bad id past the first engine step (4032 tokens) of one message: none
    // of the message is applied either.
    std::vector<int32_t> long_message = RandomTokens(6000, 4);
    long_message[5000] = 300;
    CHECK_STATUS(AppendOnce(stub, id, long_message), grpc::StatusCode::INVALID_ARGUMENT,
                 "token 300 (index 5000)");
    CHECK(WaitIdle(stub, id).tokens() == 70 + 20);
    // Still usable.
    REQUIRE(AppendOnce(stub, id, {65, 66}).ok());
    CHECK(GenerateGreedy(stub, id, 2).status.ok());
  }

  SECTION("sampling values") {
    REQUIRE(AppendOnce(stub, id, RandomTokens(10, 1)).ok());
    // top_p: the range drt.v1 takes, 0 (off) included (review-grpc finding 9:
    // the message said "(0, 1]"), on Generate, CreateSession and Complete.
    CHECK_STATUS(Generate(stub, WithSampling(id, 1.f, 0, 2.f)).status,
                 grpc::StatusCode::INVALID_ARGUMENT,
                 "top_p must be in [0, 1] (0 or 1: off), got 2");
    CHECK_STATUS(Generate(stub, WithSampling(id, 1.f, 0, -0.0001f)).status,
                 grpc::StatusCode::INVALID_ARGUMENT,
                 "top_p must be in [0, 1] (0 or 1: off), got -0.0001");
    CHECK(Generate(stub, WithSampling(id, 1.f, 0, 0.f)).status.ok());  // 0: off
    drt::v1::CreateSessionRequest bad_top_p;
    bad_top_p.mutable_sampling()->set_top_p(std::nanf(""));
    CHECK_STATUS(CreateSession(stub, bad_top_p).status, grpc::StatusCode::INVALID_ARGUMENT,
                 "top_p must be in [0, 1] (0 or 1: off), got nan");
    {
      grpc::ClientContext context;
      SetDeadline(context, 30);
      auto stream = stub.Complete(&context);
      drt::v1::CompleteRequest first;
      first.mutable_generate()->mutable_sampling()->set_top_p(1.5f);
      first.set_text("x");
      stream->Write(first);
      stream->WritesDone();
      drt::v1::GenerateResponse ignored;
      while (stream->Read(&ignored)) {
      }
      CHECK_STATUS(stream->Finish(), grpc::StatusCode::INVALID_ARGUMENT,
                   "top_p must be in [0, 1] (0 or 1: off), got 1.5");
    }
    CHECK_STATUS(Generate(stub, WithSampling(id, -1.f, 0, 1.f)).status,
                 grpc::StatusCode::INVALID_ARGUMENT,
                 "temperature must be a finite number >= 0, got -1");
    CHECK_STATUS(Generate(stub, WithSampling(id, 1.f, -3, 1.f)).status,
                 grpc::StatusCode::INVALID_ARGUMENT, "top_k must be >= 0 (0 disables it), got -3");
    // Session defaults are checked when the session is created.
    drt::v1::CreateSessionRequest create;
    create.mutable_sampling()->set_temperature(-1.f);
    CHECK_STATUS(CreateSession(stub, create).status, grpc::StatusCode::INVALID_ARGUMENT,
                 "temperature must be a finite number >= 0");
    // A refused Generate changes nothing (the accepted one above added 4).
    CHECK(GetSession(stub, id).info.tokens() == 10 + 4);
  }

  SECTION("max_tokens, stop sequences, session limits") {
    REQUIRE(AppendOnce(stub, id, RandomTokens(10, 1)).ok());
    CHECK_STATUS(Generate(stub, GreedyRequest(id, -1)).status, grpc::StatusCode::INVALID_ARGUMENT,
                 "max_tokens must be in [0, 1048576] (0: 64), got -1");
    drt::v1::GenerateRequest empty_stop = GreedyRequest(id, 4);
    empty_stop.add_stop("");
    CHECK_STATUS(Generate(stub, empty_stop).status, grpc::StatusCode::INVALID_ARGUMENT,
                 "stop sequences must not be empty");
    drt::v1::CreateSessionRequest create;
    create.set_max_context_tokens(SmallOptions().max_context_tokens + 1);
    CHECK_STATUS(CreateSession(stub, create).status, grpc::StatusCode::INVALID_ARGUMENT,
                 "max_context_tokens must be in [0, 4000000] (0: the server's limit), got 4000001");
    create.set_max_context_tokens(0);
    create.set_idle_ttl_seconds(-5);
    CHECK_STATUS(CreateSession(stub, create).status, grpc::StatusCode::INVALID_ARGUMENT,
                 "idle_ttl_seconds must be in [0, 600] (0: the server's TTL, --idle_ttl_seconds), "
                 "got -5");
    // Above the server's TTL (SmallOptions: 600 s) is refused too, and
    // nothing is created (until review-api F4 any TTL was taken).
    const auto count_sessions = [&] {
      grpc::ClientContext context;
      drt::v1::ListSessionsResponse list;
      REQUIRE(stub.ListSessions(&context, {}, &list).ok());
      return list.sessions_size();
    };
    const int sessions_before = count_sessions();
    for (int64_t ttl : {int64_t{601}, int64_t{1} << 62}) {
      create.set_idle_ttl_seconds(ttl);
      CHECK_STATUS(CreateSession(stub, create).status, grpc::StatusCode::INVALID_ARGUMENT,
                   "idle_ttl_seconds must be in [0, 600]");
    }
    CHECK(count_sessions() == sessions_before);
    create.set_idle_ttl_seconds(600);  // the server's own TTL is allowed
    CHECK(CreateSession(stub, create).status.ok());
    CHECK(GetSession(stub, id).info.tokens() == 10);
  }

  SECTION("the first Append message must name the session; later ones must match") {
    {
      grpc::ClientContext context;
      SetDeadline(context, 10);
      auto stream = stub.Append(&context);
      drt::v1::AppendRequest request;
      request.mutable_tokens()->add_ids(65);
      stream->Write(request);
      stream->WritesDone();
      drt::v1::AppendResponse response;
      while (stream->Read(&response)) {
      }
      CHECK_STATUS(stream->Finish(), grpc::StatusCode::INVALID_ARGUMENT,
                   "the first Append message must set session_id");
    }
    {
      grpc::ClientContext context;
      SetDeadline(context, 10);
      auto stream = stub.Append(&context);
      stream->WritesDone();
      drt::v1::AppendResponse response;
      while (stream->Read(&response)) {
      }
      CHECK_STATUS(stream->Finish(), grpc::StatusCode::INVALID_ARGUMENT,
                   "Append needs at least one message naming the session");
    }
    const std::string other = NewSession(stub);
    grpc::ClientContext context;
    SetDeadline(context, 10);
    auto stream = stub.Append(&context);
    stream->Write(TokensMessage(id, std::vector<int32_t>{65, 66}.data(), 2));
    stream->Write(TokensMessage(other, std::vector<int32_t>{67}.data(), 1));
    stream->WritesDone();
    drt::v1::AppendResponse response;
    while (stream->Read(&response)) {
    }
    CHECK_STATUS(stream->Finish(), grpc::StatusCode::INVALID_ARGUMENT,
                 "message 1 names session " + other + " but this Append is for " + id);
    CHECK(WaitIdle(stub, id).tokens() == 2);
    CHECK(GetSession(stub, other).info.tokens() == 0);
  }
}

TEST_CASE("NOT_FOUND: unknown session ids", "[server][errors]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::string unknown = "s-000000000000000000000000";
  const std::string message = "no session '" + unknown + "'";
  CHECK_STATUS(AppendOnce(stub, unknown, {1, 2, 3}), grpc::StatusCode::NOT_FOUND, message);
  CHECK_STATUS(GenerateGreedy(stub, unknown, 4).status, grpc::StatusCode::NOT_FOUND, message);
  CHECK_STATUS(GetSession(stub, unknown).status, grpc::StatusCode::NOT_FOUND, message);
  CHECK_STATUS(DeleteSession(stub, unknown), grpc::StatusCode::NOT_FOUND, message);
  CHECK_STATUS(ForkSession(stub, unknown).status, grpc::StatusCode::NOT_FOUND, message);
  // A deleted session is gone for every call.
  const std::string id = NewSession(stub);
  REQUIRE(DeleteSession(stub, id).ok());
  CHECK_STATUS(GetSession(stub, id).status, grpc::StatusCode::NOT_FOUND, "no session '" + id + "'");
  CHECK_STATUS(DeleteSession(stub, id), grpc::StatusCode::NOT_FOUND, "no session '" + id + "'");
  CHECK_STATUS(AppendOnce(stub, id, {1}), grpc::StatusCode::NOT_FOUND, "no session '" + id + "'");
}

TEST_CASE("RESOURCE_EXHAUSTED: session count, context limit, host memory", "[server][errors]") {
  SECTION("session count") {
    ServiceOptions options = SmallOptions();
    options.max_sessions = 2;
    InProcessServer server(options);
    auto& stub = server.stub();
    const std::string a = NewSession(stub);
    const std::string b = NewSession(stub);
    const std::string hint =
        "the server holds its maximum of 2 sessions; delete one or wait for idle ones to expire";
    CHECK_STATUS(CreateSession(stub).status, grpc::StatusCode::RESOURCE_EXHAUSTED, hint);
    CHECK_STATUS(ForkSession(stub, a).status, grpc::StatusCode::RESOURCE_EXHAUSTED, hint);
    REQUIRE(DeleteSession(stub, b).ok());
    CHECK(CreateSession(stub).status.ok());
  }

  SECTION("context limit") {
    InProcessServer server;
    auto& stub = server.stub();
    const std::string id = NewSession(stub, /*max_context_tokens=*/100);
    CHECK_STATUS(AppendOnce(stub, id, RandomTokens(200, 1)), grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "session " + id + " would exceed its context limit of 100 tokens (it holds 0, "
                 "this piece brings 200 more)");
    CHECK(WaitIdle(stub, id).tokens() == 0);
    REQUIRE(AppendOnce(stub, id, RandomTokens(60, 2)).ok());
    CHECK_STATUS(AppendOnce(stub, id, RandomTokens(60, 3)), grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "would exceed its context limit of 100 tokens (it holds 60");
    CHECK(WaitIdle(stub, id).tokens() == 60);
    // A message larger than one engine step is refused whole, not in part.
    const std::string big = NewSession(stub, /*max_context_tokens=*/4500);
    CHECK_STATUS(AppendOnce(stub, big, RandomTokens(5000, 5)), grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "this piece brings 5000 more");
    CHECK(WaitIdle(stub, big).tokens() == 0);
    // Generation stops at the limit with finish reason LENGTH.
    REQUIRE(AppendOnce(stub, id, RandomTokens(35, 4)).ok());
    GenerateResult g = GenerateGreedy(stub, id, 16);
    REQUIRE(g.status.ok());
    CHECK(g.tokens.size() == 5);
    REQUIRE(g.done.has_value());
    CHECK(g.done->finish_reason() == drt::v1::FINISH_REASON_LENGTH);
    CHECK(GetSession(stub, id).info.tokens() == 100);
  }

  SECTION("host memory budget") {
    ServiceOptions options = SmallOptions();
    // The fixture holds about 0.6 MiB per session plus 66 KiB per chunk, in
    // 4 MiB chunk-store blocks.
    options.host_memory_budget_bytes = 16 << 20;
    InProcessServer server(options);
    auto& stub = server.stub();
    const std::string id = NewSession(stub);
    REQUIRE(AppendOnce(stub, id, RandomTokens(500, 1)).ok());
    // Keep appending until the budget refuses; it must, long before 100k tokens.
    grpc::Status refused;
    for (int i = 0; i < 50 && refused.ok(); ++i) refused = AppendOnce(stub, id, RandomTokens(2000, i));
    CHECK_STATUS(refused, grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "host memory budget exhausted: sessions hold");
    CHECK_THAT(refused.error_message(), Contains("of 16 MiB"));
    CHECK_THAT(refused.error_message(), Contains("delete sessions or raise --host_memory_budget_gb"));
    // A new session cannot append either; deleting the full one frees room.
    const std::string other = NewSession(stub);
    CHECK(AppendOnce(stub, other, RandomTokens(2000, 99)).error_code() ==
          grpc::StatusCode::RESOURCE_EXHAUSTED);
    drt::v1::SessionInfo info = WaitIdle(stub, id);
    CHECK(info.tokens() > 500);
    CHECK(info.tokens() < 100000);
    // The check estimates what the next piece adds; the store allocates in
    // blocks, so a session may pass the budget by up to one block.
    CHECK(info.host_bytes() <= options.host_memory_budget_bytes + (4 << 20));
    REQUIRE(DeleteSession(stub, id).ok());
    CHECK(AppendOnce(stub, other, RandomTokens(2000, 99)).ok());
  }
}

TEST_CASE("FAILED_PRECONDITION: busy sessions and empty sessions", "[server][errors]") {
  InProcessServer server;
  auto& stub = server.stub();

  SECTION("Generate on an empty session") {
    const std::string id = NewSession(stub);
    CHECK_STATUS(GenerateGreedy(stub, id, 4).status, grpc::StatusCode::FAILED_PRECONDITION,
                 "session " + id + " holds no tokens yet: Append a prompt before Generate");
    drt::v1::GenerateRequest padded = GreedyRequest(id, 4);
    padded.set_pad_to_chunk_boundary(true);
    CHECK(Generate(stub, padded).status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    CHECK(GetSession(stub, id).info.tokens() == 0);
  }

  SECTION("Generate, Append and Fork while an Append is still streaming") {
    const std::string id = NewSession(stub);
    const auto tokens = RandomTokens(300, 1);
    grpc::ClientContext context;
    SetDeadline(context, 30);
    auto stream = stub.Append(&context);
    REQUIRE(stream->Write(TokensMessage(id, tokens.data(), 100)));
    // The session is claimed once the server has read the first message.
    WaitFor([&] { return GetSession(stub, id).info.busy(); }, 10, "the Append to start");
    const std::string busy = "session " + id +
                             " is busy with an Append; wait until it ends (GetSession says busy "
                             "false) and retry: a call that was cancelled or passed its deadline "
                             "first ends its current engine step";
    CHECK_STATUS(GenerateGreedy(stub, id, 4).status, grpc::StatusCode::FAILED_PRECONDITION, busy);
    CHECK_STATUS(AppendOnce(stub, id, {1, 2}), grpc::StatusCode::FAILED_PRECONDITION, busy);
    CHECK_STATUS(ForkSession(stub, id).status, grpc::StatusCode::FAILED_PRECONDITION, busy);
    // The running Append is unharmed.
    REQUIRE(stream->Write(TokensMessage(id, tokens.data() + 100, 200)));
    stream->WritesDone();
    drt::v1::AppendResponse response;
    int64_t ingested = -1;
    while (stream->Read(&response)) {
      if (response.has_summary()) ingested = response.summary().tokens_ingested();
    }
    REQUIRE(stream->Finish().ok());
    CHECK(ingested == 300);
    CHECK(GenerateGreedy(stub, id, 4).tokens == EngineGreedy(tokens, 4));
  }

  SECTION("Append while a Generate is streaming") {
    const std::string id = NewSession(stub);
    REQUIRE(AppendOnce(stub, id, RandomTokens(100, 2)).ok());
    grpc::ClientContext context;
    SetDeadline(context, 30);
    drt::v1::GenerateRequest request = GreedyRequest(id, 1 << 20);
    request.set_ignore_eos(true);
    auto reader = stub.Generate(&context, request);
    drt::v1::GenerateResponse response;
    REQUIRE(reader->Read(&response));  // generating now
    CHECK_STATUS(AppendOnce(stub, id, {1, 2}), grpc::StatusCode::FAILED_PRECONDITION,
                 "session " + id + " is busy with a Generate");
    CHECK_STATUS(GenerateGreedy(stub, id, 2).status, grpc::StatusCode::FAILED_PRECONDITION,
                 "is busy with a Generate");
    context.TryCancel();
    while (reader->Read(&response)) {
    }
    CHECK(reader->Finish().error_code() == grpc::StatusCode::CANCELLED);
    WaitIdle(stub, id);
    CHECK(AppendOnce(stub, id, {1, 2}).ok());
  }
}

TEST_CASE("UNAUTHENTICATED without the bearer token and auth off accepts any call", "[server][errors]") {
  SECTION("auth on") {
    ServiceOptions options = SmallOptions();
    options.bearer_token = "s3cret-token";
    InProcessServer server(options);
    auto& stub = server.stub();
    const Metadata good = {{"authorization", "Bearer s3cret-token"}};
    const std::string hint =
        "missing or wrong credentials: send metadata 'authorization: Bearer <token>'";
    CHECK_STATUS(CreateSession(stub).status, grpc::StatusCode::UNAUTHENTICATED, hint);
    CHECK_STATUS(CreateSession(stub, {}, {{"authorization", "Bearer wrong"}}).status,
                 grpc::StatusCode::UNAUTHENTICATED, hint);
    CHECK_STATUS(CreateSession(stub, {}, {{"authorization", "s3cret-token"}}).status,
                 grpc::StatusCode::UNAUTHENTICATED, hint);
    CHECK_STATUS(CreateSession(stub, {}, {{"authorization", "Bearer s3cret-token-and-more"}}).status,
                 grpc::StatusCode::UNAUTHENTICATED, hint);

    CreateResult created = CreateSession(stub, {}, good);
    REQUIRE(created.status.ok());
    const std::string id = created.id;
    CHECK_STATUS(AppendOnce(stub, id, {65, 66, 67}), grpc::StatusCode::UNAUTHENTICATED, hint);
    CHECK_STATUS(GetSession(stub, id).status, grpc::StatusCode::UNAUTHENTICATED, hint);
    CHECK_STATUS(GenerateGreedy(stub, id, 2).status, grpc::StatusCode::UNAUTHENTICATED, hint);
    REQUIRE(AppendOnce(stub, id, {65, 66, 67}, good).ok());
    GenerateResult g = Generate(stub, GreedyRequest(id, 2), good);
    REQUIRE(g.status.ok());
    CHECK(g.tokens.size() == 2);
    InfoResult info = GetSession(stub, id, good);
    REQUIRE(info.status.ok());
    CHECK(info.info.tokens() == 5);
    // The scheme in any case (RFC 9110, 11.1), the token exactly.
    for (const char* scheme : {"bearer", "BEARER", "bEARER"}) {
      INFO(scheme);
      const Metadata other_case = {{"authorization", std::string(scheme) + " s3cret-token"}};
      CHECK(GetSession(stub, id, other_case).status.ok());
      CHECK(AppendOnce(stub, id, {68}, other_case).ok());
    }
    CHECK(GetSession(stub, id, good).info.tokens() == 8);
    CHECK_STATUS(GetSession(stub, id, {{"authorization", "Bearer S3CRET-TOKEN"}}).status,
                 grpc::StatusCode::UNAUTHENTICATED, hint);
    // Health checks need no token (load balancers probe without one).
    CHECK(CheckHealth(*server.channel(), "").serving_status == 1);
  }

  SECTION("auth off") {
    InProcessServer server;
    auto& stub = server.stub();
    const std::string id = NewSession(stub);
    CHECK(AppendOnce(stub, id, {65, 66, 67}).ok());
    CHECK(AppendOnce(stub, id, {68}, {{"authorization", "Bearer anything"}}).ok());
    CHECK(GetSession(stub, id).info.tokens() == 4);
  }
}

TEST_CASE("UNAVAILABLE while draining but running streams go on", "[server][errors]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::string id = NewSession(stub);
  const auto tokens = RandomTokens(400, 1);
  grpc::ClientContext context;
  SetDeadline(context, 30);
  auto stream = stub.Append(&context);
  REQUIRE(stream->Write(TokensMessage(id, tokens.data(), 200)));
  WaitFor([&] { return GetSession(stub, id).info.busy(); }, 10, "the Append to start");

  server.service().StartDraining();
  const std::string hint = "the server is shutting down; retry on another replica";
  CHECK_STATUS(CreateSession(stub).status, grpc::StatusCode::UNAVAILABLE, hint);
  CHECK_STATUS(GetSession(stub, id).status, grpc::StatusCode::UNAVAILABLE, hint);
  CHECK_STATUS(GenerateGreedy(stub, id, 2).status, grpc::StatusCode::UNAVAILABLE, hint);
  CHECK_STATUS(AppendOnce(stub, id, {1}), grpc::StatusCode::UNAVAILABLE, hint);
  CHECK_STATUS(ForkSession(stub, id).status, grpc::StatusCode::UNAVAILABLE, hint);
  CHECK_STATUS(DeleteSession(stub, id), grpc::StatusCode::UNAVAILABLE, hint);

  // The Append that started before draining finishes normally.
  REQUIRE(stream->Write(TokensMessage(id, tokens.data() + 200, 200)));
  stream->WritesDone();
  drt::v1::AppendResponse response;
  int64_t ingested = -1;
  while (stream->Read(&response)) {
    if (response.has_summary()) ingested = response.summary().tokens_ingested();
  }
  grpc::Status status = stream->Finish();
  INFO(status.error_message());
  CHECK(status.ok());
  CHECK(ingested == 400);
}

}  // namespace
}  // namespace drt::server

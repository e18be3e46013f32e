// GetModelInfo reports the limits a client must respect (review-grpc
// finding 8): each field equals the server's option or the constant the
// check uses, and each is the boundary the service enforces: the value
// passes, one more is refused naming the field.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/sampler.h"
#include "engine/top_logprobs.h"
#include "server/limits.h"
#include "server/session_id.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

drt::v1::ModelInfo Info(drt::v1::Drt::Stub& stub) {
  grpc::ClientContext context;
  SetDeadline(context, 30);
  drt::v1::ModelInfo info;
  const grpc::Status status = stub.GetModelInfo(&context, {}, &info);
  INFO(status.error_message());
  REQUIRE(status.ok());
  return info;
}

bool Names(const grpc::Status& status, const std::string& field) {
  return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
         status.error_message().find(field) != std::string::npos;
}

// A Complete of `n` choices that only ingests its prompt (prompt_only: no
// generation); its status.
grpc::Status CompleteWithN(drt::v1::Drt::Stub& stub, int32_t n) {
  grpc::ClientContext context;
  SetDeadline(context, 60);
  auto stream = stub.Complete(&context);
  drt::v1::CompleteRequest first;
  first.set_n(n);
  first.set_prompt_only(true);
  first.set_text("abc");
  stream->Write(first);
  stream->WritesDone();
  drt::v1::GenerateResponse response;
  while (stream->Read(&response)) {
  }
  return stream->Finish();
}

TEST_CASE("GetModelInfo reports the server's limits, which are the ones it enforces",
          "[server][model_info]") {
  ServiceOptions options = SmallOptions();
  options.max_sessions = 7;  // below kMaxCompleteChoices: n's cap is the session limit
  options.idle_ttl_seconds = 123;
  options.max_message_bytes = 5 << 20;
  InProcessServer server(options);
  auto& stub = server.stub();
  const drt::v1::ModelInfo info = Info(stub);
  CHECK(info.max_message_bytes() == 5 << 20);
  CHECK(info.max_sessions() == 7);
  CHECK(info.max_idle_ttl_seconds() == 123);
  CHECK(info.max_tokens_limit() == kMaxTokensLimit);
  CHECK(info.default_max_tokens() == kDefaultMaxTokens);
  CHECK(info.max_complete_choices() == 7);
  CHECK(info.max_top_logprobs() == kMaxTopLogprobs);
  CHECK(info.max_logit_bias_entries() == kMaxLogitBiasEntries);
  CHECK(info.max_session_id_bytes() == static_cast<int32_t>(kMaxSessionIdBytes));

  SECTION("idle TTL") {
    drt::v1::CreateSessionRequest request;
    request.set_idle_ttl_seconds(info.max_idle_ttl_seconds());
    CHECK(CreateSession(stub, request).status.ok());
    request.set_idle_ttl_seconds(info.max_idle_ttl_seconds() + 1);
    CHECK(Names(CreateSession(stub, request).status, "idle_ttl_seconds"));
  }
  SECTION("logit_bias entries") {
    // Ids 0..N-1: the count check comes before the ids' (the fixture's
    // vocabulary is smaller than the cap, so some ids are refused by name
    // at the cap, but not the count).
    drt::v1::CreateSessionRequest request;
    auto& bias = *request.mutable_sampling()->mutable_logit_bias();
    for (int32_t id = 0; id < info.max_logit_bias_entries(); ++id) bias[id] = 1.0f;
    const grpc::Status at_cap = CreateSession(stub, request).status;
    CHECK(at_cap.error_message().find("entries") == std::string::npos);
    bias[info.max_logit_bias_entries()] = 1.0f;
    CHECK(Names(CreateSession(stub, request).status,
                "logit_bias has " + std::to_string(info.max_logit_bias_entries() + 1) +
                    " entries"));
  }
  SECTION("max_tokens and top_logprobs") {
    const std::string id = NewSession(stub);  // empty: a request that passes its checks
                                              // is refused for the empty session
    drt::v1::GenerateRequest request = GreedyRequest(id, info.max_tokens_limit());
    request.set_top_logprobs(info.max_top_logprobs());
    GenerateResult passes = Generate(stub, request);
    CHECK(passes.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    request.set_max_tokens(info.max_tokens_limit() + 1);
    CHECK(Names(Generate(stub, request).status, "max_tokens"));
    request.set_max_tokens(info.max_tokens_limit());
    request.set_top_logprobs(info.max_top_logprobs() + 1);
    CHECK(Names(Generate(stub, request).status, "top_logprobs"));
  }
  SECTION("Complete's n") {
    CHECK(CompleteWithN(stub, info.max_complete_choices()).ok());
    CHECK(Names(CompleteWithN(stub, info.max_complete_choices() + 1), "n must be"));
  }
  SECTION("session id bytes") {
    const std::string at_most(info.max_session_id_bytes(), 'a');
    CHECK(GetSession(stub, at_most).status.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(Names(GetSession(stub, at_most + "a").status,
                "session ids are at most " + std::to_string(info.max_session_id_bytes())));
  }
  SECTION("sessions") {
    for (int64_t i = 0; i < info.max_sessions(); ++i) {
      REQUIRE(CreateSession(stub).status.ok());
    }
    CHECK(CreateSession(stub).status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
}

TEST_CASE("GetModelInfo's Complete n cap is the fixed cap when --max_sessions is larger",
          "[server][model_info]") {
  ServiceOptions options = SmallOptions();
  options.max_sessions = kMaxCompleteChoices + 10;
  InProcessServer server(options);
  const drt::v1::ModelInfo info = Info(server.stub());
  CHECK(info.max_complete_choices() == kMaxCompleteChoices);
  CHECK(Names(CompleteWithN(server.stub(), kMaxCompleteChoices + 1), "n must be"));
  // The default --max_message_bytes, as drt-server gives gRPC.
  CHECK(info.max_message_bytes() == ServiceOptions{}.max_message_bytes);
}

}  // namespace
}  // namespace drt::server

// Session ids in errors: ids longer than the documented limit are refused
// with INVALID_ARGUMENT without being echoed (a 20,000-character id used to
// come back in the status message and overflow gRPC's metadata limit), and
// NOT_FOUND says that sessions do not survive a restart, with the server's
// start time; with a state directory, where they do survive, it names the
// causes that remain (deleted, expired, refused at start-up) and the
// quarantine directory instead.
#include <chrono>
#include <ctime>
#include <string>

#include <catch2/catch.hpp>

#include "tests/server/test_util/check_status.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

// The documented limit (docs/api.md, "Sessions").
constexpr size_t kMaxIdBytes = 128;

TEST_CASE("session ids over the limit are refused and not echoed", "[server][errors]") {
  InProcessServer server;
  auto& stub = server.stub();
  for (const size_t length : {kMaxIdBytes + 1, size_t{20000}}) {
    const std::string id(length, 'x');
    INFO("id of " << length << " bytes");
    const std::string expected = "session ids are at most 128 bytes; this one has " +
                                 std::to_string(length);
    CHECK_STATUS(GetSession(stub, id).status, grpc::StatusCode::INVALID_ARGUMENT, expected);
    CHECK_STATUS(DeleteSession(stub, id), grpc::StatusCode::INVALID_ARGUMENT, expected);
    CHECK_STATUS(ForkSession(stub, id).status, grpc::StatusCode::INVALID_ARGUMENT, expected);
    CHECK_STATUS(GenerateGreedy(stub, id, 2).status, grpc::StatusCode::INVALID_ARGUMENT,
                 expected);
    CHECK_STATUS(AppendOnce(stub, id, {65}), grpc::StatusCode::INVALID_ARGUMENT, expected);
    // Not echoed: the message stays short.
    CHECK(GetSession(stub, id).status.error_message().size() < 300);
  }
  // At the limit the id is looked up (and not found).
  const std::string at_limit(kMaxIdBytes, 'y');
  CHECK_STATUS(GetSession(stub, at_limit).status, grpc::StatusCode::NOT_FOUND,
               "no session '" + at_limit + "'");
}

TEST_CASE("an empty session id is INVALID_ARGUMENT, not NOT_FOUND", "[server][errors]") {
  // (Until review-api F6 every call but Append answered NOT_FOUND "no session
  // '': it was deleted, expired ...".)
  InProcessServer server;
  auto& stub = server.stub();
  const std::string expected = "session_id is required";
  CHECK_STATUS(GetSession(stub, "").status, grpc::StatusCode::INVALID_ARGUMENT, expected);
  CHECK_STATUS(DeleteSession(stub, ""), grpc::StatusCode::INVALID_ARGUMENT, expected);
  CHECK_STATUS(ForkSession(stub, "").status, grpc::StatusCode::INVALID_ARGUMENT, expected);
  CHECK_STATUS(GenerateGreedy(stub, "", 2).status, grpc::StatusCode::INVALID_ARGUMENT, expected);
  // Append already named the field.
  CHECK_STATUS(AppendOnce(stub, "", {65}), grpc::StatusCode::INVALID_ARGUMENT,
               "the first Append message must set session_id");
}

TEST_CASE("an Append message naming a long other id is refused without echoing it",
          "[server][errors]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::string id = NewSession(stub);
  grpc::ClientContext context;
  SetDeadline(context, 10);
  auto stream = stub.Append(&context);
  stream->Write(TokensMessage(id, std::vector<int32_t>{65, 66}.data(), 2));
  stream->Write(TokensMessage(std::string(20000, 'z'), std::vector<int32_t>{67}.data(), 1));
  stream->WritesDone();
  drt::v1::AppendResponse response;
  while (stream->Read(&response)) {
  }
  const grpc::Status status = stream->Finish();
  CHECK_STATUS(status, grpc::StatusCode::INVALID_ARGUMENT,
               "message 1: session ids are at most 128 bytes; this one has 20000");
  CHECK(status.error_message().size() < 300);
  CHECK(WaitIdle(stub, id).tokens() == 2);
}

TEST_CASE("ids with control bytes are echoed escaped", "[server][errors]") {
  InProcessServer server;
  // (proto3 strings must be UTF-8, so the non-ASCII byte comes as a whole
  // character: U+00E9, bytes C3 A9.)
  const std::string id = std::string("s-\n\x01") + "\xc3\xa9";
  CHECK_STATUS(GetSession(server.stub(), id).status, grpc::StatusCode::NOT_FOUND,
               "no session 's-\\n\\x01\\xc3\\xa9'");
}

TEST_CASE("NOT_FOUND says sessions do not survive a restart and gives the start time",
          "[server][errors]") {
  // The start time is printed in UTC to the second; bracket it.
  const std::time_t before = std::time(nullptr);
  InProcessServer server;
  const std::time_t after = std::time(nullptr);
  auto& stub = server.stub();
  const grpc::Status status = GetSession(stub, "s-000000000000000000000000").status;
  REQUIRE(status.error_code() == grpc::StatusCode::NOT_FOUND);
  const std::string& message = status.error_message();
  INFO(message);
  CHECK_THAT(message, Contains("sessions are held in memory and do not survive a restart"));
  bool found_time = false;
  for (std::time_t t = before; t <= after; ++t) {
    char text[32];
    std::tm tm{};
    gmtime_r(&t, &tm);
    std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
    found_time |= message.find(std::string("this server started at ") + text) != std::string::npos;
  }
  CHECK(found_time);
  // The same wording for every call that takes an id.
  const std::string unknown = "s-111111111111111111111111";
  CHECK_STATUS(DeleteSession(stub, unknown), grpc::StatusCode::NOT_FOUND, "do not survive a restart");
  CHECK_STATUS(GenerateGreedy(stub, unknown, 2).status, grpc::StatusCode::NOT_FOUND,
               "do not survive a restart");
  CHECK_STATUS(AppendOnce(stub, unknown, {65}), grpc::StatusCode::NOT_FOUND,
               "do not survive a restart");
  CHECK_STATUS(ForkSession(stub, unknown).status, grpc::StatusCode::NOT_FOUND,
               "do not survive a restart");
}

TEST_CASE("with a state directory NOT_FOUND names start-up refusals, not a restart",
          "[server][errors][state_store]") {
  drt::testing::TempDir dir;
  DurableServer server(dir.path());
  const std::string unknown = "s-222222222222222222222222";
  for (const absl::Status& status :
       {server.sessions->Find(unknown).status(), server.sessions->Delete(unknown)}) {
    INFO(status.message());
    REQUIRE(status.code() == absl::StatusCode::kNotFound);
    CHECK_THAT(std::string(status.message()), Contains("no session '" + unknown + "'"));
    CHECK_THAT(std::string(status.message()), Contains("deleted, expired after being idle"));
    CHECK_THAT(std::string(status.message()),
               Contains("refused when this server started at "));
    CHECK_THAT(std::string(status.message()), Contains(dir.path() + "/quarantine/"));
    CHECK_THAT(std::string(status.message()), !Contains("do not survive a restart"));
  }
}

TEST_CASE("shared_bytes drops to 0 once the only fork is deleted", "[server]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::string parent = NewSession(stub);
  const auto prompt = RandomTokens(700, 3);  // 11 closed chunks
  REQUIRE(AppendTokens(stub, parent, prompt, EvenPieces(prompt.size(), 100)).status.ok());
  REQUIRE(GetSession(stub, parent).info.shared_bytes() == 0);

  InfoResult fork = ForkSession(stub, parent);
  REQUIRE(fork.status.ok());
  const int64_t shared = GetSession(stub, parent).info.shared_bytes();
  CHECK(shared > 0);
  CHECK(fork.info.shared_bytes() == shared);

  // Two forks: deleting one leaves the chunks shared with the other.
  InfoResult second = ForkSession(stub, parent);
  REQUIRE(second.status.ok());
  REQUIRE(DeleteSession(stub, fork.info.session_id()).ok());
  CHECK(GetSession(stub, parent).info.shared_bytes() == shared);
  CHECK(GetSession(stub, second.info.session_id()).info.shared_bytes() == shared);

  // The last fork deleted: nothing is shared any more, on either side.
  REQUIRE(DeleteSession(stub, second.info.session_id()).ok());
  CHECK(GetSession(stub, parent).info.shared_bytes() == 0);

  // And the other way round: deleting the parent unshares the fork.
  InfoResult third = ForkSession(stub, parent);
  REQUIRE(third.status.ok());
  REQUIRE(GetSession(stub, third.info.session_id()).info.shared_bytes() == shared);
  REQUIRE(DeleteSession(stub, parent).ok());
  CHECK(GetSession(stub, third.info.session_id()).info.shared_bytes() == 0);
}

}  // namespace
}  // namespace drt::server

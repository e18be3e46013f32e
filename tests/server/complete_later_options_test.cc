// A Complete's options (generate, n, prompt_logprobs, prompt_only) are read
// from its first message. A later message setting one was ignored: the
// client got 64 tokens where it asked for 2, one choice for n 3, no scores
// (review-grpc finding 7). It is refused by name, as an Append refuses
// prompt_logprobs on a later message: INVALID_ARGUMENT naming the field and
// the message, nothing generated.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

struct CompleteResult {
  grpc::Status status;
  int pieces = 0;
  int dones = 0;
  int scores = 0;
};

CompleteResult RunComplete(drt::v1::Drt::Stub& stub,
                           const std::vector<drt::v1::CompleteRequest>& messages) {
  grpc::ClientContext context;
  SetDeadline(context, 60);
  auto stream = stub.Complete(&context);
  for (const drt::v1::CompleteRequest& m : messages) {
    if (!stream->Write(m)) break;
  }
  stream->WritesDone();
  CompleteResult result;
  drt::v1::GenerateResponse response;
  while (stream->Read(&response)) {
    result.pieces += response.has_piece() ? 1 : 0;
    result.dones += response.has_done() ? 1 : 0;
    result.scores += response.has_prompt_logprobs() ? 1 : 0;
  }
  result.status = stream->Finish();
  return result;
}

drt::v1::CompleteRequest Text(const std::string& text) {
  drt::v1::CompleteRequest m;
  m.set_text(text);
  return m;
}

TEST_CASE("Complete: an option on a later message is refused by name, nothing generated",
          "[server][complete_options]") {
  InProcessServer server;
  drt::v1::CompleteRequest first = Text("a prompt ");
  first.mutable_generate()->set_max_tokens(2);
  first.mutable_generate()->set_pad_to_chunk_boundary(false);

  // The same stream with no option on message 1 completes: 2 tokens.
  CompleteResult plain = RunComplete(server.stub(), {first, Text("and the rest")});
  REQUIRE(plain.status.ok());
  CHECK(plain.dones == 1);
  CHECK(plain.pieces >= 1);

  struct Case {
    const char* field;
    drt::v1::CompleteRequest later;
  };
  std::vector<Case> cases;
  cases.push_back({"generate", Text("and the rest")});
  cases.back().later.mutable_generate()->set_max_tokens(5);
  cases.push_back({"generate", Text("x")});  // present, even empty
  cases.back().later.mutable_generate();
  cases.push_back({"n", Text("x")});
  cases.back().later.set_n(3);
  cases.push_back({"prompt_logprobs", Text("x")});
  cases.back().later.set_prompt_logprobs(0);
  cases.push_back({"prompt_only", Text("x")});
  cases.back().later.set_prompt_only(true);
  for (const Case& c : cases) {
    INFO(c.field << ": " << c.later.ShortDebugString());
    // Message 2 sets the option (message 1 carries only text).
    CompleteResult r = RunComplete(server.stub(), {first, Text("more "), c.later});
    INFO("status " << r.status.error_code() << " '" << r.status.error_message() << "'");
    CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(r.status.error_message(),
               Contains(std::string("message 2 sets ") + c.field +
                        ", which only the first message of a Complete may set"));
    CHECK(r.pieces == 0);
    CHECK(r.dones == 0);
    CHECK(r.scores == 0);
  }
  // Neutral values are no option: n 0, prompt_only false.
  drt::v1::CompleteRequest neutral = Text(" end");
  neutral.set_n(0);
  neutral.set_prompt_only(false);
  CompleteResult r = RunComplete(server.stub(), {first, neutral});
  CHECK(r.status.ok());
  CHECK(r.dones == 1);
}

}  // namespace
}  // namespace drt::server

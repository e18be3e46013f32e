// Client text is bytes for the bundled byte-vocabulary model: the spellings
// of its pad and landmark tokens ("<|pad|>", "<|chunk|>") in text encode as
// their bytes, not as the ids only the engine inserts; and a refused text
// message leaves nothing of itself while the earlier messages stay whole,
// their held-back last word included (review-api F3).
#include <atomic>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/model.h"
#include "server/scheduler.h"
#include "server/session_manager.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

FixtureModel& TextModel() {
  static FixtureModel* model = new FixtureModel(
      FixtureModel::Load(std::string(drt::testing::SourceDir()) + "/models/drt-text-byte"));
  return *model;
}

std::vector<int32_t> Bytes(const std::string& text) {
  return std::vector<int32_t>(text.begin(), text.end());  // all ASCII here
}

TEST_CASE("the model's tokenizer encodes pad and landmark spellings as bytes", "[server][text]") {
  const Model& model = *TextModel().model;
  REQUIRE(model.config().pad_id == 256);  // what tokenizer.json's added tokens name
  REQUIRE(model.config().chunk_id == 257);
  for (const std::string text : {"x <|chunk|>", "a <|pad|> b", "<|pad|><|chunk|>"}) {
    auto ids = model.tokenizer->Encode(text);
    REQUIRE(ids.ok());
    CHECK(*ids == Bytes(text));
  }
  // They still decode (the engine's own ids, in generated output).
  auto decoded = model.tokenizer->Decode({256, 257});
  REQUIRE(decoded.ok());
  CHECK(*decoded == "<|pad|><|chunk|>");
}

TEST_CASE("text with pad and landmark spellings is appended as its bytes", "[server][text]") {
  InProcessServer server(*TextModel().model, *TextModel().backend, SmallOptions());
  const std::string id = NewSession(server.stub());
  AppendResult one = AppendTexts(server.stub(), id, {"x <|chunk|>"});
  INFO(one.status.error_message());
  REQUIRE(one.status.ok());
  CHECK(GetSession(server.stub(), id).info.tokens() == 11);
  AppendResult two = AppendTexts(server.stub(), id, {"hello world, ", "and <|pad|> b"});
  REQUIRE(two.status.ok());
  CHECK(GetSession(server.stub(), id).info.tokens() == 11 + 13 + 13);
}

TEST_CASE("a text message over the context limit leaves nothing of itself, the earlier ones whole",
          "[server][text]") {
  InProcessServer server(*TextModel().model, *TextModel().backend, SmallOptions());
  SECTION("a later message") {
    const std::string id = NewSession(server.stub(), 30);
    // Message 0 ends inside a word ("wor" is held back until more text
    // comes); message 1 does not fit.
    AppendResult r = AppendTexts(server.stub(), id, {"hello wor", "ld and much more text than fits"});
    CHECK(r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(GetSession(server.stub(), id).info.tokens() == 9);  // all of message 0
  }
  SECTION("a later message of one word, all of it held back with the earlier word") {
    const std::string id = NewSession(server.stub(), 30);
    // Message 1 gives no cut: its text joins "wor" in one held-back word,
    // refused as a whole; "wor" still runs alone.
    AppendResult r = AppendTexts(server.stub(), id, {"hello wor", std::string(40, 'x')});
    CHECK(r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(GetSession(server.stub(), id).info.tokens() == 9);  // all of message 0
  }
  SECTION("its own held-back last word") {
    const std::string id = NewSession(server.stub(), 10);
    // The start ("abc ") fits and could run at once; the last word, held
    // back to the end of the stream, does not: nothing of it may run.
    AppendResult r = AppendTexts(server.stub(), id, {"abc defghijkl"});
    CHECK(r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK_THAT(r.status.error_message(), Contains("context limit"));
    CHECK(GetSession(server.stub(), id).info.tokens() == 0);
  }
}

TEST_CASE("a message naming another session keeps the earlier messages' held-back word",
          "[server][text]") {
  InProcessServer server(*TextModel().model, *TextModel().backend, SmallOptions());
  const std::string id = NewSession(server.stub());
  const std::string other = NewSession(server.stub());
  grpc::ClientContext context;
  SetDeadline(context, 60);
  int i = 0;
  AppendResult r = RunAppend(server.stub(), context, [&](drt::v1::AppendRequest* request) {
    if (i == 2) return false;
    request->set_session_id(i == 0 ? id : other);
    request->set_text(i == 0 ? "hello wor" : "ld");
    ++i;
    return true;
  });
  CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status.error_message(), Contains("message 1 names session"));
  CHECK(GetSession(server.stub(), id).info.tokens() == 9);  // "hello wor", whole
  CHECK(GetSession(server.stub(), other).info.tokens() == 0);
}


TEST_CASE("a refused message whose earlier held-back word cannot run names both, with its own code",
          "[server][text]") {
  // review-cleanup3 R2: KeepEarlier runs the earlier messages' held-back
  // word after a refusal; when that fails too (here the session is deleted
  // in the step that runs it), the refusal keeps its code and its message
  // gains why the earlier text was not completed.
  std::string id;
  SessionManager* sessions = nullptr;
  std::atomic<int> deletes{0};
  absl::Status deleted = absl::UnknownError("the hook never deleted the session");
  ServiceOptions options = SmallOptions();
  options.on_step_formed_for_test = [&](const StepRecord& step, const Scheduler&) {
    for (const StepPiece& piece : step.pieces) {
      // "hello" (5 tokens) of message 0 ran before: this step runs its
      // held-back " wor".
      if (piece.entry->id() == id && piece.entry->tokens() == 5 && deletes.fetch_add(1) == 0) {
        deleted = sessions->Delete(id);  // while the step holds it: it ends ABORTED
      }
    }
  };
  InProcessServer server(*TextModel().model, *TextModel().backend, options);
  sessions = &server.service().session_manager();
  id = NewSession(server.stub(), 30);
  const std::string not_completed =
      "(the text of the earlier messages was not completed either: session " + id + " was deleted";
  SECTION("a message over the context limit") {
    AppendResult r = AppendTexts(server.stub(), id, {"hello wor", "ld and much more text than fits"});
    INFO(r.status.error_message());
    CHECK(r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK_THAT(r.status.error_message(), Contains("context limit") && Contains(not_completed));
  }
  SECTION("a message naming another session") {
    const std::string other = NewSession(server.stub());
    grpc::ClientContext context;
    SetDeadline(context, 60);
    int i = 0;
    AppendResult r = RunAppend(server.stub(), context, [&](drt::v1::AppendRequest* request) {
      if (i == 2) return false;
      request->set_session_id(i == 0 ? id : other);
      request->set_text(i == 0 ? "hello wor" : "ld");
      ++i;
      return true;
    });
    INFO(r.status.error_message());
    CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(r.status.error_message(),
               Contains("message 1 names session") && Contains(not_completed));
  }
  CHECK(deletes.load() == 1);
  CHECK(deleted.ok());
  CHECK(GetSession(server.stub(), id).status.error_code() == grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace drt::server

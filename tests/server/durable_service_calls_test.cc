// The service with a state directory attached (as drt-server --state_dir
// wires it): Complete's temporary session never reaches the directory, and
// a durable Append's progress reports only tokens that are on disk.
#include <algorithm>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/session_state.h"
#include "server/session_manager.h"
#include "server/state_files.h"
#include "server/state_store.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

TEST_CASE("with a state directory, Complete's temporary session is never written to it",
          "[server][state_store]") {
  drt::testing::TempDir dir;
  DurableService durable(dir.path(), SmallOptions());
  auto& stub = durable.server.stub();
  grpc::ClientContext context;
  SetDeadline(context, 60);
  auto stream = stub.Complete(&context);
  drt::v1::CompleteRequest first;
  first.mutable_generate()->set_max_tokens(100000);
  first.mutable_generate()->set_ignore_eos(true);
  const auto prompt = RandomTokens(500, 11);
  first.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
  REQUIRE(stream->Write(first));
  stream->WritesDone();
  // Generating: the prompt was ingested and tokens are appended.
  drt::v1::GenerateResponse response;
  int pieces = 0;
  while (pieces < 5 && stream->Read(&response)) pieces += response.has_piece();
  REQUIRE(pieces == 5);
  CHECK(durable.server.service().session_manager().count() == 1);
  // Nothing of it on disk: no state file, no chunk log.
  CHECK(Names(dir.path() + "/sessions").empty());
  CHECK(Names(dir.path() + "/chunks").empty());
  context.TryCancel();
  while (stream->Read(&response)) {}
  stream->Finish();
  CHECK(Names(dir.path() + "/sessions").empty());
  // A session created by CreateSession still is written.
  const std::string id = NewSession(stub);
  CHECK(Names(dir.path() + "/sessions") == std::vector<std::string>{id + ".state"});
}

TEST_CASE("a Complete call's temporary session cannot be forked and leaves nothing on disk",
          "[server][state_store]") {
  // Until review-api F8 the temporary session was listed and another client
  // could fork it (the fork then had to leave the parent unwritten); it is
  // hidden now: no other call finds it, and its own call deletes it.
  drt::testing::TempDir dir;
  DurableService durable(dir.path(), SmallOptions());
  SessionManager& manager = durable.server.service().session_manager();
  auto parent = manager.CreateEphemeral(SessionSettings{});
  REQUIRE(parent.ok());
  const std::string parent_id = (*parent)->id();
  CHECK(manager.Fork(parent_id).status().code() == absl::StatusCode::kNotFound);
  CHECK(manager.Delete(parent_id).code() == absl::StatusCode::kNotFound);
  CHECK(Names(dir.path() + "/sessions").empty());
  REQUIRE(manager.Delete(parent_id, /*hidden_too=*/true).ok());
  CHECK(manager.count() == 0);
  CHECK(Names(dir.path() + "/sessions").empty());
  for (const std::string& name : Names(dir.path() + "/chunks")) {
    CHECK(name.find(parent_id) == std::string::npos);
  }
}

TEST_CASE("a durable Append's progress reports only acknowledged tokens, which are on disk",
          "[server][state_store]") {
  drt::testing::TempDir dir;
  ServiceOptions options = SmallOptions();
  const int64_t chunk = FixtureModel::Get().chunk_size();
  // Written and acknowledged every 40 chunks (2520 tokens), in steps of one
  // chunk: the steps more than the upper-layer reach (386 positions) before
  // a stretch's end skip the upper layers and are neither written nor
  // acknowledged, so after each acknowledgement the engine runs on with
  // dozens of steps that are not on disk.
  options.durable_ack_tokens = 40 * chunk;
  options.step_tokens = chunk;
  // The handler is late to report each acknowledgement (as a descheduled
  // thread on a loaded machine is): the engine runs steps meanwhile.
  options.before_progress_for_test = [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  DurableService durable(dir.path(), options);
  auto& stub = durable.server.stub();
  const std::string id = NewSession(stub);
  const auto prompt = RandomTokens(1200 * chunk, 12);
  grpc::ClientContext context;
  SetDeadline(context, 300);
  auto stream = stub.Append(&context);
  struct Seen {
    int64_t session_tokens, tokens_ingested, chunks_ingested, on_disk;
  };
  std::vector<Seen> seen;
  std::thread reader([&] {
    drt::v1::AppendResponse response;
    while (stream->Read(&response)) {
      if (!response.has_progress()) continue;
      const auto& p = response.progress();
      // Read the state file as the progress arrives: what a crash now
      // would leave.
      seen.push_back({p.session_tokens(), p.tokens_ingested(), p.chunks_ingested(),
                      TokensOnDisk(dir.path(), id)});
    }
  });
  drt::v1::AppendRequest request;
  request.set_session_id(id);
  request.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
  REQUIRE(stream->Write(request));
  stream->WritesDone();
  reader.join();
  grpc::Status status = stream->Finish();
  INFO(status.error_message());
  REQUIRE(status.ok());
  INFO("progress messages: " << seen.size());
  REQUIRE(seen.size() >= 3);
  for (const Seen& s : seen) {
    INFO("session_tokens " << s.session_tokens << ", on disk " << s.on_disk);
    // The session started empty: everything it holds came from this call.
    CHECK(s.session_tokens == s.tokens_ingested);
    CHECK(s.chunks_ingested == s.session_tokens / chunk);
    // A client resending from session_tokens after a crash loses nothing.
    CHECK(s.session_tokens <= s.on_disk);
  }
}

TEST_CASE("with --state_sync=interval, an Append or Generate whose final write fails ends with "
          "its error, not OK",
          "[server][state_store]") {
  drt::testing::TempDir dir;
  DurableService durable(dir.path(), SmallOptions(), StateSync::kInterval);
  auto& stub = durable.server.stub();
  const std::string id = NewSession(stub);  // written at once (forced)
  REQUIRE(std::filesystem::exists(dir.path() + "/sessions/" + id + ".state"));
  // From now on no state file can be written: the directory is gone.
  std::filesystem::rename(dir.path() + "/sessions", dir.path() + "/sessions-away");
  AppendResult append = AppendTokens(stub, id, RandomTokens(300, 13), {300});
  INFO(append.status.error_message());
  CHECK_FALSE(append.status.ok());
  CHECK_THAT(append.status.error_message(),
             Catch::Matchers::Contains("could not be written to the state directory"));
  CHECK_FALSE(append.summary.has_value());
  // The tokens are in memory: the session answers, and a Generate's done
  // message is not sent while its write fails either.
  CHECK(GetSession(stub, id).info.tokens() == 300);
  drt::v1::GenerateRequest request = GreedyRequest(id, 3);
  request.set_pad_to_chunk_boundary(false);
  GenerateResult g = Generate(stub, request);
  CHECK_FALSE(g.status.ok());
  CHECK_THAT(g.status.error_message(),
             Catch::Matchers::Contains("could not be written to the state directory"));
  CHECK_FALSE(g.done.has_value());
  // Once writes work again, the next call writes everything.
  std::filesystem::rename(dir.path() + "/sessions-away", dir.path() + "/sessions");
  REQUIRE(AppendOnce(stub, id, RandomTokens(10, 14)).ok());
}

// Review durable F2: a step write that failed for a full disk reached the
// Append's client as RESOURCE_EXHAUSTED (ENOSPC's code, which says "wait" in
// docs/api.md) with only the errno message, not the documented INTERNAL, and
// did not say the Append's tokens were in the session (a client resending
// them got them twice). /dev/full gives the write a real ENOSPC: the
// session's chunk log, opened by its first write that closes a chunk, is a
// link to it.
TEST_CASE("an Append whose state write finds the disk full ends INTERNAL and says how many of the "
          "session's tokens are durable",
          "[server][state_store]") {
  drt::testing::TempDir dir;
  DurableService durable(dir.path(), SmallOptions(), StateSync::kStep);
  auto& stub = durable.server.stub();
  const std::string id = NewSession(stub);
  const int64_t chunk = FixtureModel::Get().chunk_size();
  REQUIRE(AppendOnce(stub, id, RandomTokens(chunk - 3, 31)).ok());  // no chunk closed yet
  REQUIRE(TokensOnDisk(dir.path(), id) == chunk - 3);
  const std::string log = dir.path() + "/chunks/" + id + ".log";
  std::filesystem::create_symlink("/dev/full", log);
  AppendResult append = AppendTokens(stub, id, RandomTokens(2 * chunk, 32),
                                     {static_cast<size_t>(2 * chunk)});
  INFO(append.status.error_message());
  CHECK(append.status.error_code() == grpc::StatusCode::INTERNAL);
  CHECK_FALSE(append.summary.has_value());
  const int64_t in_memory = GetSession(stub, id).info.tokens();
  CHECK(in_memory > chunk);  // the failed step's tokens are in the session
  const std::string& message = append.status.error_message();
  CHECK_THAT(message, Catch::Matchers::Contains("session " + id));
  CHECK_THAT(message, Catch::Matchers::Contains("could not be written to the state directory"));
  CHECK_THAT(message, Catch::Matchers::Contains("No space left on device"));
  CHECK_THAT(message, Catch::Matchers::Contains(log));
  CHECK_THAT(message, Catch::Matchers::Contains(
                          "holds all its " + std::to_string(in_memory) + " tokens"));
  CHECK_THAT(message, Catch::Matchers::Contains(std::to_string(chunk - 3) +
                                                " of them were on disk when this write failed"));
  // The failed first write of the log deleted the link it opened, so the
  // write the call's end tries (the session still owes one) made a log of
  // its own and wrote everything, the failed step's tokens included.
  CHECK(std::filesystem::is_regular_file(std::filesystem::symlink_status(log)));
  CHECK(TokensOnDisk(dir.path(), id) == in_memory);
  REQUIRE(AppendOnce(stub, id, RandomTokens(10, 33)).ok());
  CHECK(TokensOnDisk(dir.path(), id) == in_memory + 10);
}

}  // namespace
}  // namespace drt::server

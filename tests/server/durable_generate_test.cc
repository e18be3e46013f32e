// A durable session's Generate is written once, when the call ends (all or
// nothing: SessionEntry::WritesAtActivityEnd), not after each token: one
// write for K tokens, a restart after the call restores all of them, a
// kill -9 during it restores the session as it was before it. And that end
// write runs without the entry's engine lock: a DeleteSession during it
// returns at once, the memory and the files go when the write ends.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/sampler.h"
#include "engine/session.h"
#include "server/session_manager.h"
#include "server/state_store.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/waiting.h"
#include "tests/test_util/temp_dir.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

// Greedy, no padding, with log-probabilities: the check of a session's
// content (the same request on the same state gives the same answer).
drt::v1::GenerateRequest CheckRequest(const std::string& id, int32_t tokens) {
  drt::v1::GenerateRequest request = GreedyRequest(id, tokens);
  request.set_ignore_eos(true);
  request.set_pad_to_chunk_boundary(false);
  request.set_return_logprobs(true);
  return request;
}

TEST_CASE("a durable Generate is written once, when it ends, and a restart after it restores "
          "all of its tokens",
          "[server][state_store][durable_generate]") {
  const StateSync sync = GENERATE(StateSync::kStep, StateSync::kInterval);
  INFO("--state_sync=" << (sync == StateSync::kStep ? "step" : "interval"));
  drt::testing::TempDir dir;
  std::mutex mutex;
  std::string watched;          // the session whose writes are recorded
  std::vector<int64_t> writes;  // the tokens each of its state writes held
  StateStoreOptions store_options = DurableService::StoreOptions(dir.path(), sync);
  store_options.state_written_for_test = [&](const std::string& id, int64_t tokens) {
    std::lock_guard<std::mutex> lock(mutex);
    if (id == watched) writes.push_back(tokens);
  };
  const auto prompt = RandomTokens(300, 21);
  std::string id;
  int64_t total = 0;
  GenerateResult without_restart;
  {
    DurableService durable(store_options, SmallOptions());
    auto& stub = durable.server.stub();
    id = NewSession(stub);
    REQUIRE(AppendOnce(stub, id, prompt).ok());
    {
      std::lock_guard<std::mutex> lock(mutex);
      watched = id;
    }
    // Padding (300 is not a multiple of the chunk) and 100 tokens, which
    // close chunks: before, each token was written on the engine thread.
    drt::v1::GenerateRequest request = GreedyRequest(id, 100);
    request.set_ignore_eos(true);
    request.set_pad_to_chunk_boundary(true);
    GenerateResult generated = Generate(stub, request);
    INFO(generated.status.error_message());
    REQUIRE(generated.status.ok());
    REQUIRE(generated.done.has_value());
    REQUIRE(generated.tokens.size() == 100);
    REQUIRE(generated.done->padding_tokens() > 0);
    total = static_cast<int64_t>(prompt.size()) + generated.done->tokens_appended();
    REQUIRE(generated.done->session_tokens() == total);
    {
      std::lock_guard<std::mutex> lock(mutex);
      CHECK(writes == std::vector<int64_t>{total});  // one write, with all of it
      watched.clear();
    }
    CHECK(TokensOnDisk(dir.path(), id) == total);
    // What the session gives next without a restart: a fork of it.
    InfoResult fork = ForkSession(stub, id);
    REQUIRE(fork.status.ok());
    without_restart = Generate(stub, CheckRequest(fork.info.session_id(), 8));
    REQUIRE(without_restart.status.ok());
    REQUIRE(DeleteSession(stub, fork.info.session_id()).ok());
  }
  DurableService restarted(store_options, SmallOptions());
  auto& stub = restarted.server.stub();
  InfoResult info = GetSession(stub, id);
  REQUIRE(info.status.ok());
  CHECK(info.info.tokens() == total);
  GenerateResult after_restart = Generate(stub, CheckRequest(id, 8));
  REQUIRE(after_restart.status.ok());
  CHECK(after_restart.tokens == without_restart.tokens);
  CHECK(after_restart.logprobs == without_restart.logprobs);
}

TEST_CASE("a durable Generate whose end write fails ends with that error and no done message",
          "[server][state_store][durable_generate]") {
  // --state_sync=step: the write that fails is the Generate's only one, at
  // its end (interval mode: durable_service_calls_test.cc).
  drt::testing::TempDir dir;
  DurableService durable(dir.path(), SmallOptions(), StateSync::kStep);
  auto& stub = durable.server.stub();
  const std::string id = NewSession(stub);
  REQUIRE(AppendOnce(stub, id, RandomTokens(300, 23)).ok());
  std::filesystem::rename(dir.path() + "/sessions", dir.path() + "/sessions-away");
  GenerateResult g = Generate(stub, CheckRequest(id, 5));
  CHECK(g.status.error_code() != grpc::StatusCode::OK);
  CHECK_THAT(g.status.error_message(),
             Catch::Matchers::Contains("could not be written to the state directory"));
  CHECK_FALSE(g.done.has_value());
  CHECK(g.tokens.size() == 5);  // streamed, and in memory
  CHECK(GetSession(stub, id).info.tokens() == 305);
  std::filesystem::rename(dir.path() + "/sessions-away", dir.path() + "/sessions");
  REQUIRE(AppendOnce(stub, id, RandomTokens(10, 24)).ok());
  CHECK(TokensOnDisk(dir.path(), id) == 315);
}

// The engine's greedy tokens and log-probabilities after `prompt`.
std::pair<std::vector<int32_t>, std::vector<float>> EngineContinuation(
    const std::vector<int32_t>& prompt, int n) {
  FixtureModel& f = FixtureModel::Get();
  auto session = Session::Create(*f.backend);
  REQUIRE(session.ok());
  REQUIRE((*session)->Append(prompt).ok());
  std::pair<std::vector<int32_t>, std::vector<float>> out;
  Sampler sampler(SamplingParams{});
  for (int i = 0; i < n; ++i) {
    auto step = (*session)->GenerateStep(sampler);
    REQUIRE(step.ok());
    out.first.push_back(step->token);
    out.second.push_back(step->logprob);
  }
  return out;
}

TEST_CASE("kill -9 during a durable Generate restores the session as it was before the Generate",
          "[server][process][crash][durable_generate]") {
  drt::testing::TempDir dir;
  std::vector<std::string> args = ServerProcessArgs(1, "");
  args.insert(args.end(), {"--state_dir", dir.File("state")});
  const auto prompt = RandomTokens(300, 25);
  std::string id;
  {
    ServerProcess server(drt::testing::ServerBinary(), args);
    auto stub = drt::v1::Drt::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    id = NewSession(*stub);
    REQUIRE(AppendOnce(*stub, id, prompt).ok());
    BackgroundGenerate generate(*stub, id, 120);
    // Two chunks' worth of tokens streamed: each was written before it was
    // sent, before this change.
    WaitFor([&] { return generate.generated() >= 130; }, 60, "130 generated tokens");
    server.Signal(SIGKILL);
    REQUIRE(server.WaitExit(10).has_value());
    generate.Join();
    CHECK_FALSE(generate.status().ok());
  }
  ServerProcess server(drt::testing::ServerBinary(), args);
  auto stub = drt::v1::Drt::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  InfoResult info = GetSession(*stub, id);
  REQUIRE(info.status.ok());
  CHECK(info.info.tokens() == static_cast<int64_t>(prompt.size()));
  // And it is that state exactly: it continues as the engine does after the prompt.
  GenerateResult got = Generate(*stub, CheckRequest(id, 4));
  REQUIRE(got.status.ok());
  const auto want = EngineContinuation(prompt, 4);
  CHECK(got.tokens == want.first);
  CHECK(got.logprobs == want.second);
}

// F7 of the durablegen review: a Generate stopped by a drain (SIGTERM, the
// grace period over) writes nothing, so the restart restores the session as
// it was before it and a client can send it again (as after a crash).
// Before, the end write stored the tokens it had generated.
TEST_CASE("SIGTERM during a durable Generate: the restart restores the session as it was before "
          "the Generate",
          "[server][process][drain][durable_generate]") {
  drt::testing::TempDir dir;
  std::vector<std::string> args = ServerProcessArgs(1, "");
  args.insert(args.end(), {"--state_dir", dir.File("state")});
  const auto prompt = RandomTokens(300, 29);
  std::string id, cancelled_id;
  int64_t cancelled_held = -1;
  {
    ServerProcess server(drt::testing::ServerBinary(), args);
    auto stub = drt::v1::Drt::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    // The contrast: a Generate its client cancels is written as it ends.
    cancelled_id = NewSession(*stub);
    REQUIRE(AppendOnce(*stub, cancelled_id, prompt).ok());
    {
      BackgroundGenerate cancelled(*stub, cancelled_id, 120);
      WaitFor([&] { return cancelled.generated() >= 10; }, 60, "10 generated tokens");
    }  // cancelled by the client here
    WaitFor([&] { return !GetSession(*stub, cancelled_id).info.busy(); }, 30,
            "the cancelled Generate to end");
    cancelled_held = GetSession(*stub, cancelled_id).info.tokens();
    CHECK(cancelled_held >= static_cast<int64_t>(prompt.size()) + 10);
    id = NewSession(*stub);
    REQUIRE(AppendOnce(*stub, id, prompt).ok());
    BackgroundGenerate generate(*stub, id, 120);
    WaitFor([&] { return generate.generated() >= 20; }, 60, "20 generated tokens");
    server.Signal(SIGTERM);
    generate.Join();
    INFO("Generate: " << generate.status().error_code() << " "
                      << generate.status().error_message());
    CHECK(generate.status().error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK(generate.generated() >= 20);
    const std::optional<int> exited = server.WaitExit(20);
    REQUIRE(exited.has_value());
    CHECK(WIFEXITED(*exited));
    CHECK(WEXITSTATUS(*exited) == 0);
  }
  ServerProcess server(drt::testing::ServerBinary(), args);
  auto stub = drt::v1::Drt::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  InfoResult info = GetSession(*stub, id);
  REQUIRE(info.status.ok());
  CHECK(info.info.tokens() == static_cast<int64_t>(prompt.size()));
  GenerateResult got = Generate(*stub, CheckRequest(id, 4));
  REQUIRE(got.status.ok());
  const auto want = EngineContinuation(prompt, 4);
  CHECK(got.tokens == want.first);
  CHECK(got.logprobs == want.second);
  CHECK(GetSession(*stub, cancelled_id).info.tokens() == cancelled_held);
}

// Holds a write inside StateStoreOptions::chunks_written_for_test until the
// test releases it.
class WriteGate {
 public:
  void Park() {
    std::unique_lock<std::mutex> lock(mutex_);
    parked_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return released_; });
  }
  bool WaitUntilParked(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return parked_; });
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      released_ = true;
    }
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool parked_ = false, released_ = false;
};

TEST_CASE("a DeleteSession during a call's end write returns at once, and the memory and the files "
          "go when the write ends",
          "[server][state_store][delete][durable_generate]") {
  drt::testing::TempDir dir;
  WriteGate gate;
  std::atomic<bool> armed{false};
  StateStoreOptions options = DurableService::StoreOptions(dir.path(), StateSync::kInterval);
  options.chunks_written_for_test = [&](const std::string&) {
    if (armed.load()) gate.Park();
  };
  DurableServer server(options);
  const std::string id = server.Create();
  auto found = server.sessions->Find(id);
  REQUIRE(found.ok());
  std::shared_ptr<SessionEntry> entry = *found;
  REQUIRE(entry->Begin(Activity::kGenerating).ok());
  const auto tokens = RandomTokens(300, 26);
  // Not written by the step (the activity's end writes it): its chunks and
  // state are written by EndAndReport below.
  REQUIRE(entry->RunStep([&](Session& s) { return s.Append(tokens).status(); }).ok());
  armed = true;
  absl::Status ended;
  std::thread ender([&] { ended = entry->EndAndReport(); });
  REQUIRE(gate.WaitUntilParked(std::chrono::seconds(30)));
  auto deleted = std::async(std::launch::async, [&] { return server.sessions->Delete(id); });
  // Before, the write held the entry's engine lock, which the delete takes.
  const bool returned = deleted.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  CHECK(returned);
  if (returned) {
    CHECK(deleted.get().ok());
    CHECK(server.sessions->count() == 0);
    CHECK(entry->engine_session_alive());  // the write still reads it
  }
  gate.Release();
  ender.join();
  CHECK(ended.code() == absl::StatusCode::kAborted);
  CHECK_FALSE(entry->engine_session_alive());
  CHECK(entry->host_bytes() == 0);
  // The write removed the session's files as it ended (its logs on the
  // store's deleter thread).
  CHECK(server.store->sessions_registered() == 0);
  CHECK(std::filesystem::is_empty(dir.path() + "/sessions"));
  server.store->WaitForLogDeletions();
  CHECK(std::filesystem::is_empty(dir.path() + "/chunks"));
}

// F1 of the durablegen review: an OK DeleteSession means the state file is
// gone, also while a write of the session runs (a crash after the answer
// cannot bring the session back), and that write does not publish it again.
TEST_CASE("a DeleteSession during a write deletes the state file before it returns, and the write "
          "does not write it again",
          "[server][state_store][delete][durable_generate]") {
  drt::testing::TempDir dir;
  WriteGate gate;
  std::atomic<bool> armed{false};
  StateStoreOptions options = DurableService::StoreOptions(dir.path(), StateSync::kInterval);
  options.chunks_written_for_test = [&](const std::string&) {
    if (armed.load()) gate.Park();
  };
  DurableServer server(options);
  const std::string id = server.Create();
  auto found = server.sessions->Find(id);
  REQUIRE(found.ok());
  std::shared_ptr<SessionEntry> entry = *found;
  const std::string state = server.store->StatePath(id);
  // A first activity, written at its end: the state file exists.
  REQUIRE(entry->Begin(Activity::kGenerating).ok());
  REQUIRE(entry->RunStep([&](Session& s) { return s.Append(RandomTokens(300, 27)).status(); }).ok());
  REQUIRE(entry->EndAndReport().ok());
  REQUIRE(std::filesystem::exists(state));
  // A second one, whose end write is parked once its chunks are on disk.
  REQUIRE(entry->Begin(Activity::kGenerating).ok());
  REQUIRE(entry->RunStep([&](Session& s) { return s.Append(RandomTokens(300, 28)).status(); }).ok());
  armed = true;
  absl::Status ended;
  std::thread ender([&] { ended = entry->EndAndReport(); });
  REQUIRE(gate.WaitUntilParked(std::chrono::seconds(30)));
  auto deleted = std::async(std::launch::async, [&] { return server.sessions->Delete(id); });
  const bool returned = deleted.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  CHECK(returned);
  if (returned) {
    CHECK(deleted.get().ok());
    // Before the fix the removal was left whole to the parked writer.
    CHECK_FALSE(std::filesystem::exists(state));
  }
  gate.Release();
  ender.join();
  CHECK(ended.code() == absl::StatusCode::kAborted);
  // Not published after the delete, and no temporary file left; the
  // writer handed the logs to the store's deleter.
  CHECK_FALSE(std::filesystem::exists(state));
  CHECK(std::filesystem::is_empty(dir.path() + "/sessions"));
  server.store->WaitForLogDeletions();
  CHECK(std::filesystem::is_empty(dir.path() + "/chunks"));
  CHECK(server.store->sessions_registered() == 0);
}

}  // namespace
}  // namespace drt::server

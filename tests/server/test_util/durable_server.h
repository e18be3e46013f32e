// In-process durable server sessions for tests: a SessionManager wired to a
// StateStore as server/main.cc wires them, restored from its directory at
// construction (a "restart" is a new DurableServer on the same directory).
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/sampler.h"
#include "engine/session_state.h"
#include "server/session_manager.h"
#include "server/state_files.h"
#include "server/state_store.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server::testing {

inline SessionLimits DurableLimits() {
  SessionLimits limits;
  limits.host_memory_budget_bytes = 4LL << 30;
  return limits;
}

inline StateStoreOptions DurableOptions(const std::string& dir) {
  StateStoreOptions options;
  options.dir = dir;
  return options;
}

// A server's sessions with a state store, as main wires them.
struct DurableServer {
  std::unique_ptr<StateStore> store;
  std::unique_ptr<SessionManager> sessions;
  StateStore::RestoreReport report;

  explicit DurableServer(const std::string& dir) : DurableServer(DurableOptions(dir)) {}
  explicit DurableServer(const StateStoreOptions& options, SessionLimits limits = DurableLimits()) {
    FixtureModel& f = FixtureModel::Get();
    auto opened = StateStore::Open(options, f.model->config());
    if (!opened.ok()) throw std::runtime_error(std::string(opened.status().message()));
    store = *std::move(opened);
    sessions = std::make_unique<SessionManager>(*f.backend, limits);
    auto restored =
        store->RestoreAll(*f.backend, limits.max_sessions, limits.host_memory_budget_bytes);
    if (!restored.ok()) throw std::runtime_error(std::string(restored.status().message()));
    sessions->AttachStateStore(store.get());
    for (auto& r : restored->sessions) {
      REQUIRE(sessions->Adopt(r.id, r.settings, std::move(r.session)).ok());
    }
    restored->sessions.clear();
    report = *std::move(restored);
  }
  ~DurableServer() {
    sessions.reset();  // the manager goes first: it writes to the store
  }

  std::string Create(const SessionSettings& settings = {}) {
    auto entry = sessions->Create(settings);
    REQUIRE(entry.ok());
    return (*entry)->id();
  }
  void Append(const std::string& id, const std::vector<int32_t>& tokens) {
    auto entry = sessions->Find(id);
    REQUIRE(entry.ok());
    REQUIRE((*entry)->Begin(Activity::kAppending).ok());
    // Steps of 200 tokens, as the service runs them in bounded steps.
    for (size_t done = 0; done < tokens.size(); done += 200) {
      const auto piece = absl::MakeConstSpan(tokens).subspan(done, std::min<size_t>(200, tokens.size() - done));
      REQUIRE((*entry)->RunStep([&](Session& s) { return s.Append(piece).status(); }).ok());
    }
    (*entry)->End();
  }
  // Greedy tokens and their logprobs; also applied to the session.
  std::pair<std::vector<int32_t>, std::vector<float>> Greedy(const std::string& id, int n) {
    auto entry = sessions->Find(id);
    REQUIRE(entry.ok());
    REQUIRE((*entry)->Begin(Activity::kGenerating).ok());
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    Sampler sampler(SamplingParams{});
    for (int i = 0; i < n; ++i) {
      REQUIRE((*entry)->RunStep([&](Session& s) -> absl::Status {
        auto step = s.GenerateStep(sampler);
        if (!step.ok()) return step.status();
        tokens.push_back(step->token);
        logprobs.push_back(step->logprob);
        return absl::OkStatus();
      }).ok());
    }
    (*entry)->End();
    return {tokens, logprobs};
  }
  std::string Fork(const std::string& id) {
    auto child = sessions->Fork(id);
    REQUIRE(child.ok());
    return (*child)->id();
  }
  std::map<std::string, int64_t> Tokens() const {
    std::map<std::string, int64_t> out;
    for (const auto& e : sessions->List()) out[e->id()] = e->tokens();
    return out;
  }
};

// An in-process gRPC server whose sessions are written to a state
// directory (as drt-server --state_dir wires it), restored from it at
// construction: a restart is a new DurableService on the same directory,
// once the old one is destroyed.
struct DurableService {
  std::unique_ptr<StateStore> store;
  InProcessServer server;
  DurableService(const std::string& dir, ServiceOptions options,
                 StateSync sync = StateSync::kStep)
      : DurableService(StoreOptions(dir, sync), std::move(options)) {}
  DurableService(const StateStoreOptions& store_options, ServiceOptions options)
      : DurableService(store_options, std::move(options), FixtureModel::Get()) {}
  // Serves `fixture` (another copy of the model, e.g. with other generation
  // defaults; it must outlive this).
  DurableService(const StateStoreOptions& store_options, ServiceOptions options,
                 FixtureModel& fixture)
      : server(*fixture.model, *fixture.backend, std::move(options)) {
    auto opened = StateStore::Open(store_options, fixture.model->config());
    REQUIRE(opened.ok());
    store = *std::move(opened);
    SessionManager& manager = server.service().session_manager();
    auto restored = store->RestoreAll(*fixture.backend);
    REQUIRE(restored.ok());
    manager.AttachStateStore(store.get());
    for (auto& r : restored->sessions) {
      REQUIRE(manager.Adopt(r.id, r.settings, std::move(r.session)).ok());
    }
  }
  // `sync`; interval mode with an interval of an hour: only forced writes.
  static StateStoreOptions StoreOptions(const std::string& dir, StateSync sync) {
    StateStoreOptions options;
    options.dir = dir;
    options.sync = sync;
    options.sync_interval_ms = 3'600'000;
    return options;
  }
};

// The tokens of session `id`'s state file in `dir` (-1: none readable).
inline int64_t TokensOnDisk(const std::string& dir, const std::string& id) {
  const std::string path = dir + "/sessions/" + id + ".state";
  auto bytes = ReadWholeFile(path);
  if (!bytes.ok()) return -1;
  auto record = DecodeSessionRecord(*bytes, path);
  if (!record.ok()) return -1;
  auto state = DecodeSessionState(record->state, FixtureModel::Get().model->config());
  if (!state.ok()) return -1;
  return state->num_tokens;
}

// A session's memory figures as its backend reports them (an Appending
// turn, so that no step runs meanwhile).
inline SessionMemory Memory(DurableServer& server, const std::string& id) {
  auto entry = server.sessions->Find(id);
  REQUIRE(entry.ok());
  SessionMemory memory;
  REQUIRE((*entry)->Begin(Activity::kAppending).ok());
  REQUIRE((*entry)
              ->RunStep([&](Session& s) {
                memory = s.backend_session().memory();
                return absl::OkStatus();
              })
              .ok());
  (*entry)->End();
  return memory;
}

// What a session generates without any restart: a fork of it, in memory.
inline std::pair<std::vector<int32_t>, std::vector<float>> GreedyOnFork(DurableServer& server,
                                                                const std::string& id, int n) {
  const std::string fork = server.Fork(id);
  auto result = server.Greedy(fork, n);
  REQUIRE(server.sessions->Delete(fork).ok());
  return result;
}

}  // namespace drt::server::testing

// A state directory's sessions met by a server of another model
// (server/state_store.h, RestoreAll; docs/state_format.md, "Start-up"): a
// wrong --model, or a new model rolled onto a durable StatefulSet. Every
// session fails the model check, so the cause is the configuration, not the
// data: the start is refused with nothing moved, and the right model then
// restores every session. --quarantine_other_model_sessions moves them to
// DIR/quarantine/ (what every start did before), and the documented steps
// put them back by hand.
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <csignal>
#include <iterator>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_format.h"
#include "engine/model_fingerprint.h"
#include "server/state_store.h"
#include "tests/server/test_util/directory_snapshot.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/run_program.h"
#include "tests/test_util/build_paths.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using testing::DurableOptions;
using testing::DurableServer;
using testing::FixtureModel;
using testing::RandomTokens;

// Every file under `dir`, LOCK left out (its lock is the process's, not
// content).
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  return testing::DirectorySnapshot(dir, {"LOCK"});
}

// RestoreAll of `dir` by a store opened for `config`'s model (with `backend`).
absl::StatusOr<StateStore::RestoreReport> RestoreFor(const StateStoreOptions& options,
                                                     const ModelConfig& config,
                                                     Backend& backend) {
  auto store = StateStore::Open(options, config);
  REQUIRE(store.ok());
  return (*store)->RestoreAll(backend);
}

// A second model of another shape (vocab_size 258, not the fixture's 300).
FixtureModel& OtherShapeModel() {
  static FixtureModel* other = new FixtureModel(
      FixtureModel::Load(std::string(drt::testing::SourceDir()) + "/tests/fixtures/gqa_one_group"));
  return *other;
}

TEST_CASE("sessions written for another model refuse the start with nothing moved",
          "[state_store][other_model]") {
  FixtureModel& f = FixtureModel::Get();
  const int64_t chunk = f.chunk_size();
  drt::testing::TempDir dir;
  std::map<std::string, int64_t> tokens;
  {
    DurableServer server(dir.path());
    const std::string a = server.Create();
    const std::string b = server.Create();
    server.Append(a, RandomTokens(3 * chunk + 5, 41));
    server.Append(b, RandomTokens(2 * chunk, 42));
    const std::string child = server.Fork(a);  // names a's log, then its own
    server.Append(child, RandomTokens(chunk + 1, 43));
    tokens = server.Tokens();
  }
  REQUIRE(tokens.size() == 3);
  // A write that never finished: deleted by a start that goes ahead, kept by
  // a refusal (which changes nothing).
  { std::ofstream(dir.path() + "/sessions/.x.state.tmp-1") << "partial"; }
  const auto before = Snapshot(dir.path());
  const uint32_t fingerprint = *f.model->config().model_fingerprint();

  SECTION("another shape: refused, naming the field, both values and the flag") {
    StateStoreOptions options = DurableOptions(dir.path());
    options.model_dir = "models/other";
    auto restored = RestoreFor(options, OtherShapeModel().model->config(), *OtherShapeModel().backend);
    REQUIRE(restored.status().code() == absl::StatusCode::kFailedPrecondition);
    const std::string message(restored.status().message());
    INFO(message);
    REQUIRE_THAT(message, Contains(dir.path() + ": 3 of its 3 sessions (e.g. s-"));
    REQUIRE_THAT(message, Contains(absl::StrFormat(
                              ") were written for another model, not for this --model "
                              "models/other: vocab_size 300 (fingerprint %08x); this model has "
                              "vocab_size 258. Start with the model that wrote them",
                              fingerprint)));
    REQUIRE_THAT(message, Contains("--quarantine_other_model_sessions"));
    REQUIRE(Snapshot(dir.path()) == before);
  }
  SECTION("the same shape, another fingerprint: refused, naming both fingerprints") {
    ModelConfig other = f.model->config();
    other.fingerprint = std::make_shared<const ModelFingerprint>(fingerprint ^ 0x5a5a5a5au);
    auto restored = RestoreFor(DurableOptions(dir.path()), other, *f.backend);
    REQUIRE(restored.status().code() == absl::StatusCode::kFailedPrecondition);
    const std::string message(restored.status().message());
    INFO(message);
    REQUIRE_THAT(message, Contains(absl::StrFormat("fingerprint %08x; this model's is %08x (the same "
                                                   "shape",
                                                   fingerprint, fingerprint ^ 0x5a5a5a5au)));
    REQUIRE(Snapshot(dir.path()) == before);
  }
  // After either refusal the right model restores every session.
  DurableServer server(dir.path());
  REQUIRE(server.report.quarantined.empty());
  REQUIRE(server.Tokens() == tokens);
  REQUIRE_FALSE(fs::exists(dir.path() + "/sessions/.x.state.tmp-1"));
}

TEST_CASE("a session of another model whose logit_bias names ids this model lacks refuses the "
          "start too",
          "[state_store][other_model]") {
  // Id 280 is in the fixture's vocabulary (300) and past the other model's
  // (258): checked against this model first, the record looked corrupt and
  // was quarantined as damage, so the start went ahead without it
  // (review-userfix U2).
  FixtureModel& f = FixtureModel::Get();
  drt::testing::TempDir dir;
  {
    DurableServer server(dir.path());
    SessionSettings settings;
    settings.sampling.logit_bias = {{280, 1.f}};
    const std::string id = server.Create(settings);
    server.Append(id, RandomTokens(2 * f.chunk_size(), 44));
  }
  const auto before = Snapshot(dir.path());
  StateStoreOptions options = DurableOptions(dir.path());
  options.model_dir = "models/other";
  auto restored = RestoreFor(options, OtherShapeModel().model->config(), *OtherShapeModel().backend);
  REQUIRE(restored.status().code() == absl::StatusCode::kFailedPrecondition);
  const std::string message(restored.status().message());
  INFO(message);
  REQUIRE_THAT(message, Contains(": 1 of its 1 sessions (e.g. s-"));
  REQUIRE_THAT(message, Contains("were written for another model"));
  REQUIRE(Snapshot(dir.path()) == before);
}

TEST_CASE("the flag --quarantine_other_model_sessions moves them aside, and moved back they restore",
          "[state_store][other_model]") {
  FixtureModel& f = FixtureModel::Get();
  const int64_t chunk = f.chunk_size();
  drt::testing::TempDir dir;
  std::map<std::string, int64_t> tokens;
  {
    DurableServer server(dir.path());
    const std::string a = server.Create();
    server.Append(a, RandomTokens(2 * chunk + 3, 44));
    server.Append(server.Fork(a), RandomTokens(chunk, 45));
    tokens = server.Tokens();
  }
  StateStoreOptions options = DurableOptions(dir.path());
  options.quarantine_other_model_sessions = true;
  {
    auto restored = RestoreFor(options, OtherShapeModel().model->config(), *OtherShapeModel().backend);
    REQUIRE(restored.ok());
    REQUIRE(restored->sessions.empty());
    REQUIRE(restored->quarantined.size() == 2);
    for (const std::string& line : restored->quarantined) {
      INFO(line);
      REQUIRE_THAT(line, Contains("the state was written for another model: vocab_size 300 ("));
    }
  }
  REQUIRE(fs::is_empty(dir.path() + "/sessions"));
  REQUIRE(fs::is_empty(dir.path() + "/chunks"));

  // docs/state_format.md, "Start-up": each quarantine/<id>-<time>/<id>.state
  // back to sessions/, its .log files to chunks/ (when not already there).
  for (const auto& sub : fs::directory_iterator(dir.path() + "/quarantine")) {
    for (const auto& file : fs::directory_iterator(sub.path())) {
      const std::string name = file.path().filename().string();
      const std::string to =
          dir.path() + (name.ends_with(".state") ? "/sessions/" : "/chunks/") + name;
      if (!fs::exists(to)) fs::rename(file.path(), to);
    }
  }
  DurableServer server(dir.path());
  REQUIRE(server.report.quarantined.empty());
  REQUIRE(server.Tokens() == tokens);
}

// drt-server's own start-up: the refusal is its error and exit status 1;
// the flag lets it start with the sessions quarantined.
TEST_CASE("drt-server with another --model on a --state_dir exits 1 naming it, and the flag starts it",
          "[state_store][other_model][process]") {
  FixtureModel& f = FixtureModel::Get();
  drt::testing::TempDir dir;
  std::map<std::string, int64_t> tokens;
  {
    DurableServer server(dir.path());
    server.Append(server.Create(), RandomTokens(2 * f.chunk_size() + 1, 46));
    server.Create();
    tokens = server.Tokens();
  }
  const std::string other_dir =
      std::string(drt::testing::SourceDir()) + "/tests/fixtures/gqa_one_group";
  std::vector<std::string> args = {"--model",  other_dir, "--listen",    "127.0.0.1:0",
                                   "--http_listen", "",   "--device=cpu", "--state_dir",
                                   dir.path()};
  const auto before = Snapshot(dir.path());
  const testing::ProgramRun refused = testing::RunProgram(drt::testing::ServerBinary(), args, 60);
  INFO("stderr:\n" << refused.errors);
  CHECK(refused.exit_status == 1);
  CHECK_THAT(refused.errors, Contains("drt-server: error: " + dir.path() + ": 2 of its 2 sessions"));
  CHECK_THAT(refused.errors, Contains("were written for another model, not for this --model " +
                                      other_dir + ": vocab_size 300 ("));
  CHECK_THAT(refused.errors, Contains("--quarantine_other_model_sessions"));
  CHECK(Snapshot(dir.path()) == before);

  args.push_back("--quarantine_other_model_sessions");
  drt::testing::TempDir logs;
  const std::optional<std::string> stopped =
      testing::StderrOfStartAndStop(drt::testing::ServerBinary(), args, logs.path());
  REQUIRE(stopped.has_value());
  const std::string& err = *stopped;
  INFO("stderr:\n" << err);
  CHECK_THAT(err, Contains("restored 0 sessions, 0 tokens"));
  CHECK_THAT(err, Contains("2 quarantined"));
  CHECK(fs::is_empty(dir.path() + "/sessions"));
}

}  // namespace
}  // namespace drt::server

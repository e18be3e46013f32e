// A state directory's sessions met by a server of another engine state
// version (server/state_store.h, RestoreAll; docs/state_format.md,
// "Start-up"): an upgrade or a rollback across engine state versions meets
// every session at once, so the start is refused with nothing moved (it
// quarantined every session before, a silent loss after an upgrade).
// --quarantine_other_version_sessions moves them to DIR/quarantine/.
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/session_state.h"
#include "server/state_files.h"
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

std::map<std::string, std::string> Snapshot(const std::string& dir) {
  return testing::DirectorySnapshot(dir, {"LOCK"});
}

std::string StatePath(const std::string& dir, const std::string& id) {
  return dir + "/sessions/" + id + ".state";
}

// Rewrites session `id`'s state file (a whole, valid record) with its
// engine state changed by `change`, as a server of that version would have
// written it; returns the file's bytes before.
template <typename Change>
std::string RewriteEngineState(const std::string& dir, const std::string& id, Change change) {
  const std::string path = StatePath(dir, id);
  absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  REQUIRE(bytes.ok());
  absl::StatusOr<SessionRecord> record = DecodeSessionRecord(*bytes, path);
  REQUIRE(record.ok());
  change(record->state);
  REQUIRE(WriteFileAtomically(path, EncodeSessionRecord(*record)).ok());
  return *bytes;
}

// The version after the magic ("DRTENGST", 8 bytes), as a newer server
// writing version `version` would have it.
void SetVersion(std::string& state, uint32_t version) {
  REQUIRE(EngineStateVersionOf(state) == kEngineStateVersion);
  std::memcpy(state.data() + 8, &version, sizeof version);
}

// The layout before engine state versions: no magic, the shape field count
// (an i64 8) first.
void MakeVersion1(std::string& state) {
  const int64_t fields = 8;
  state = std::string(reinterpret_cast<const char*>(&fields), sizeof fields) + state.substr(12);
}

TEST_CASE("the engine state version is read from a state's header", "[state_store][other_version]") {
  FixtureModel& f = FixtureModel::Get();
  auto session = Session::Create(*f.backend);
  REQUIRE(session.ok());
  absl::StatusOr<SessionState> state = (*session)->ExportState();
  REQUIRE(state.ok());
  absl::StatusOr<std::string> bytes = EncodeSessionState(*state, f.model->config());
  REQUIRE(bytes.ok());
  CHECK(EngineStateVersionOf(*bytes) == std::optional<uint32_t>(2));
  std::string newer = *bytes;
  SetVersion(newer, 7);
  CHECK(EngineStateVersionOf(newer) == std::optional<uint32_t>(7));
  std::string old = *bytes;
  MakeVersion1(old);
  CHECK(EngineStateVersionOf(old) == std::optional<uint32_t>(1));
  CHECK_FALSE(EngineStateVersionOf("DRTENGST").has_value());  // no version after it
  CHECK_FALSE(EngineStateVersionOf("not an engine state").has_value());
}

TEST_CASE("sessions of another engine state version refuse the start with nothing moved",
          "[state_store][other_version]") {
  FixtureModel& f = FixtureModel::Get();
  const int64_t chunk = f.chunk_size();
  drt::testing::TempDir dir;
  std::map<std::string, int64_t> tokens;
  std::string a, b, child;
  {
    DurableServer server(dir.path());
    a = server.Create();
    b = server.Create();
    server.Append(a, RandomTokens(3 * chunk + 5, 51));
    server.Append(b, RandomTokens(2 * chunk, 52));
    child = server.Fork(a);  // names a's log, then its own
    server.Append(child, RandomTokens(chunk + 1, 53));
    tokens = server.Tokens();
  }
  REQUIRE(tokens.size() == 3);
  { std::ofstream(dir.path() + "/sessions/.x.state.tmp-1") << "partial"; }
  const std::string a_bytes =
      RewriteEngineState(dir.path(), a, [](std::string& s) { SetVersion(s, 3); });
  const std::string b_bytes = RewriteEngineState(dir.path(), b, MakeVersion1);
  const auto before = Snapshot(dir.path());

  {
    auto store = StateStore::Open(DurableOptions(dir.path()), f.model->config());
    REQUIRE(store.ok());
    auto restored = (*store)->RestoreAll(*f.backend);
    REQUIRE(restored.status().code() == absl::StatusCode::kFailedPrecondition);
    const std::string message(restored.status().message());
    INFO(message);
    CHECK_THAT(message, Contains(dir.path() + ": 2 of its 3 sessions (e.g. "));
    CHECK_THAT(message, Contains("hold an engine state of another version than this server's 2 "
                                 "(1 with version 1, 1 with version 3)"));
    CHECK_THAT(message, Contains("its contexts must be re-ingested"));
    CHECK_THAT(message, Contains("written by a newer drt-server"));
    CHECK_THAT(message, Contains("pass --quarantine_other_version_sessions to move them to " +
                                 dir.path() + "/quarantine/"));
    CHECK_THAT(message, Contains("nothing was restored or changed"));
  }
  REQUIRE(Snapshot(dir.path()) == before);

  SECTION("the server that wrote them restores every session") {
    // (Here: the files as this server wrote them, put back.)
    REQUIRE(WriteFileAtomically(StatePath(dir.path(), a), a_bytes).ok());
    REQUIRE(WriteFileAtomically(StatePath(dir.path(), b), b_bytes).ok());
    DurableServer server(dir.path());
    CHECK(server.report.quarantined.empty());
    CHECK(server.Tokens() == tokens);
    CHECK_FALSE(fs::exists(dir.path() + "/sessions/.x.state.tmp-1"));
  }
  SECTION("the flag quarantines them with their logs and the others restore") {
    StateStoreOptions options = DurableOptions(dir.path());
    options.quarantine_other_version_sessions = true;
    DurableServer server(options);
    REQUIRE(server.report.quarantined.size() == 2);
    for (const std::string& line : server.report.quarantined) {
      INFO(line);
      CHECK_THAT(line, Contains("; this server reads version 2; its state file was moved to " +
                                dir.path() + "/quarantine/"));
    }
    CHECK_THAT(server.report.quarantined[0] + server.report.quarantined[1],
               Contains("engine state version 3"));
    CHECK_THAT(server.report.quarantined[0] + server.report.quarantined[1],
               Contains("engine state version 1"));
    // The fork reads a's log, which stays in chunks/ for it.
    CHECK(server.Tokens() == std::map<std::string, int64_t>{{child, tokens.at(child)}});
  }
}

// drt-server's own start-up: the refusal is its error and exit status 1;
// the flag lets it start with the sessions quarantined.
TEST_CASE("drt-server on a --state_dir of another engine state version exits 1 and the flag starts it",
          "[state_store][other_version][process]") {
  FixtureModel& f = FixtureModel::Get();
  drt::testing::TempDir dir;
  std::string id;
  {
    DurableServer server(dir.path());
    id = server.Create();
    server.Append(id, RandomTokens(2 * f.chunk_size() + 1, 54));
  }
  RewriteEngineState(dir.path(), id, [](std::string& s) { SetVersion(s, 3); });
  std::vector<std::string> args = {"--model",       testing::FixtureDir(), "--listen",
                                   "127.0.0.1:0",   "--http_listen",       "",
                                   "--device=cpu",  "--state_dir",         dir.path()};
  const auto before = Snapshot(dir.path());
  const testing::ProgramRun refused = testing::RunProgram(drt::testing::ServerBinary(), args, 60);
  INFO("stderr:\n" << refused.errors);
  CHECK(refused.exit_status == 1);
  CHECK_THAT(refused.errors, Contains("drt-server: error: " + dir.path() + ": 1 of its 1 sessions"));
  CHECK_THAT(refused.errors, Contains("(1 with version 3)"));
  CHECK_THAT(refused.errors, Contains("--quarantine_other_version_sessions"));
  CHECK(Snapshot(dir.path()) == before);

  args.push_back("--quarantine_other_version_sessions");
  drt::testing::TempDir logs;
  const std::optional<std::string> stopped =
      testing::StderrOfStartAndStop(drt::testing::ServerBinary(), args, logs.path());
  REQUIRE(stopped.has_value());
  const std::string& err = *stopped;
  INFO("stderr:\n" << err);
  CHECK_THAT(err, Contains("the state has engine state version 3; this server reads version 2"));
  CHECK_THAT(err, Contains("restored 0 sessions, 0 tokens"));
  CHECK_THAT(err, Contains("1 quarantined"));
  CHECK(fs::is_empty(dir.path() + "/sessions"));
}

}  // namespace
}  // namespace drt::server

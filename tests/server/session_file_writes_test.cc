// SaveSession / LoadSession beyond the basic round trip (session_file_test):
// temporary files of unique names (a save never destroys another file, two
// saves to one name never share a file), a save written a record at a time
// (AtomicFileWriter), a load refused by the host-memory budget before it
// reads any chunk, and a crafted file whose state and record count disagree.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/session_state.h"
#include "server/session_file.h"
#include "server/session_manager.h"
#include "server/state_files.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/peak_memory.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> DirectoryNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A session of `tokens` random tokens on `server`.
std::string SessionWith(InProcessServer& server, size_t tokens, uint64_t seed) {
  const std::string id = NewSession(server.stub());
  const auto prompt = RandomTokens(tokens, seed);
  REQUIRE(AppendTokens(server.stub(), id, prompt, EvenPieces(prompt.size(), 1000)).status.ok());
  return id;
}

TEST_CASE("saving to a name ending in .tmp and then to the name without it keeps both files",
          "[server][session_file]") {
  drt::testing::TempDir files;
  ServiceOptions options = SmallOptions();
  options.session_files_dir = files.path();
  InProcessServer server(options);
  const std::string a = SessionWith(server, 300, 1);
  const std::string b = SessionWith(server, 700, 2);
  REQUIRE(SaveSession(server.stub(), a, "x.tmp").ok());
  const std::string first = ReadFile(files.File("x.tmp"));
  REQUIRE(SaveSession(server.stub(), b, "x").ok());
  // The second save's temporary file was not "x.tmp": the first file is
  // intact, and both load with their own sessions.
  CHECK(ReadFile(files.File("x.tmp")) == first);
  InfoResult loaded_a = LoadSession(server.stub(), "x.tmp");
  InfoResult loaded_b = LoadSession(server.stub(), "x");
  REQUIRE(loaded_a.status.ok());
  REQUIRE(loaded_b.status.ok());
  CHECK(loaded_a.info.tokens() == 300);
  CHECK(loaded_b.info.tokens() == 700);
  // No temporary file is left behind.
  CHECK(DirectoryNames(files.path()) == std::vector<std::string>{"x", "x.tmp"});
}

TEST_CASE("concurrent saves to one name each write a whole file: the last rename wins and every "
          "acknowledged save loads",
          "[server][session_file]") {
  drt::testing::TempDir files;
  ServiceOptions options = SmallOptions();
  options.session_files_dir = files.path();
  InProcessServer server(options);
  const int64_t chunk = FixtureModel::Get().chunk_size();
  // Large enough (60 chunks, about 4 MiB) that two saves overlap in time.
  const std::string a = SessionWith(server, 60 * chunk + 5, 3);
  const std::string b = SessionWith(server, 60 * chunk + 40, 4);
  for (int round = 0; round < 5; ++round) {
    INFO("round " << round);
    std::atomic<bool> go{false};
    grpc::Status status_a, status_b;
    std::thread ta([&] {
      while (!go.load()) {}
      status_a = SaveSession(server.stub(), a, "shared");
    });
    std::thread tb([&] {
      while (!go.load()) {}
      status_b = SaveSession(server.stub(), b, "shared");
    });
    go = true;
    ta.join();
    tb.join();
    REQUIRE(status_a.ok());
    REQUIRE(status_b.ok());
    // Whichever save renamed last, the file is one whole save: it loads
    // (its CRCs hold) and holds one of the two sessions.
    InfoResult loaded = LoadSession(server.stub(), "shared");
    INFO(loaded.status.error_message());
    REQUIRE(loaded.status.ok());
    const int64_t tokens = loaded.info.tokens();
    CHECK((tokens == 60 * chunk + 5 || tokens == 60 * chunk + 40));
    REQUIRE(DeleteSession(server.stub(), loaded.info.session_id()).ok());
  }
  CHECK(DirectoryNames(files.path()) == std::vector<std::string>{"shared"});
}

TEST_CASE("AtomicFileWriter writes each piece through to a hidden temporary file and renames it "
          "only on Commit",
          "[server][session_file]") {
  drt::testing::TempDir dir;
  const std::string path = dir.File("target");
  std::ofstream(path, std::ios::binary) << "old";
  {
    auto writer = AtomicFileWriter::Create(path);
    REQUIRE(writer.ok());
    const std::string temp = (*writer)->temp_path();
    CHECK(std::filesystem::path(temp).parent_path() == std::filesystem::path(dir.path()));
    const std::string name = std::filesystem::path(temp).filename().string();
    CHECK(name.rfind(".target.tmp-", 0) == 0);
    CHECK(IsTemporaryFileName(name));
    // A session file name cannot start with a dot: no save can name it.
    CHECK_FALSE(CheckSessionFileName(name).ok());
    const std::string piece(100000, 'p');
    for (int i = 1; i <= 3; ++i) {
      REQUIRE((*writer)->Append(piece).ok());
      // On disk at once: nothing of it waits in memory for the end.
      CHECK(std::filesystem::file_size(temp) == static_cast<uintmax_t>(i) * piece.size());
      CHECK(ReadFile(path) == "old");
    }
    struct stat st {};
    REQUIRE(::stat(temp.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0644);
    // A second writer of the same path gets its own temporary file.
    auto other = AtomicFileWriter::Create(path);
    REQUIRE(other.ok());
    CHECK((*other)->temp_path() != temp);
    REQUIRE((*other)->Append("other").ok());
    REQUIRE((*writer)->Commit().ok());
    CHECK(ReadFile(path) == piece + piece + piece);
    CHECK_FALSE(std::filesystem::exists(temp));
    // `other` goes without Commit: its temporary file goes, the path stays.
  }
  CHECK(ReadFile(path).size() == 300000);
  CHECK(DirectoryNames(dir.path()) == std::vector<std::string>{"target"});
}

TEST_CASE("a save holds one chunk record in memory, not the session: its peak resident memory "
          "grows far less than the file",
          "[server][session_file]") {
  drt::testing::TempDir dir;
  FixtureModel& f = FixtureModel::Get();
  auto session = Session::Create(*f.backend);
  REQUIRE(session.ok());
  const int64_t chunk = f.chunk_size();
  REQUIRE((*session)->Append(RandomTokens(400 * chunk + 3, 5)).ok());
  REQUIRE((*session)->num_chunks() == 400);
  const int64_t rss = ResetPeakResident();
  const int64_t peak_before = ProcStatusBytes("VmHWM");
  REQUIRE(rss > 0);
  REQUIRE(peak_before <= rss + (1 << 20));  // the reset took
  auto written = SaveSessionFile(dir.File("s"), "s-test", SessionSettings{}, **session);
  REQUIRE(written.ok());
  const int64_t growth = ProcStatusBytes("VmHWM") - rss;
  INFO("file " << *written << " bytes, peak resident growth " << growth << " bytes");
  // 400 records of about 34 KiB (the fixture's encoder rows): a file of
  // about 13 MiB. A save that built it in one buffer would raise the peak by
  // at least that (more while the string grows by doubling); one record at a
  // time holds two copies of one (the payload and the record). Measured
  // here: 1.2 MB of growth (the chunk reads' own buffers, the allocator). A
  // quarter of the file leaves room for that noise and still fails a
  // whole-file buffer.
  REQUIRE(*written > 12 << 20);
  CHECK(growth < *written / 4);
}

TEST_CASE("LoadSession past the host-memory budget is refused before it reads a chunk and leaves "
          "the server unchanged",
          "[server][session_file]") {
  drt::testing::TempDir files;
  const int64_t chunk = FixtureModel::Get().chunk_size();
  {
    ServiceOptions options = SmallOptions();
    options.session_files_dir = files.path();
    InProcessServer server(options);
    const std::string id = SessionWith(server, 150 * chunk + 10, 6);
    REQUIRE(SaveSession(server.stub(), id, "big").ok());
  }
  ServiceOptions options = SmallOptions();
  options.session_files_dir = files.path();
  // 150 chunks of about 66 KiB (FixtureModel) are about 10 MiB: more than
  // the 4 MiB budget.
  options.host_memory_budget_bytes = 4 << 20;
  InProcessServer server(options);
  SessionManager& sessions = server.service().session_manager();
  const std::string before = ReadFile(files.File("big"));
  InfoResult r = LoadSession(server.stub(), "big");
  CHECK(r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK_THAT(r.status.error_message(), Contains("host memory budget exhausted"));
  CHECK_THAT(r.status.error_message(), Contains("the 150 chunks of big"));
  CHECK_THAT(r.status.error_message(), Contains("of 4 MiB"));
  CHECK(sessions.count() == 0);
  CHECK(sessions.TotalHostBytes() == 0);
  CHECK(sessions.ReservedHostBytes() == 0);
  CHECK(ReadFile(files.File("big")) == before);
  // With room, the same file loads.
  ServiceOptions roomy = SmallOptions();
  roomy.session_files_dir = files.path();
  InProcessServer other(roomy);
  InfoResult ok = LoadSession(other.stub(), "big");
  REQUIRE(ok.status.ok());
  CHECK(ok.info.tokens() == 150 * chunk + 10);
  CHECK(other.service().session_manager().ReservedHostBytes() == 0);
}

TEST_CASE("a CRC-valid session file whose state names more closed chunks than it holds records "
          "is DATA_LOSS",
          "[server][session_file]") {
  drt::testing::TempDir files;
  ServiceOptions options = SmallOptions();
  options.session_files_dir = files.path();
  InProcessServer server(options);
  const int64_t chunk = FixtureModel::Get().chunk_size();
  const std::string id = SessionWith(server, 20 * chunk + 7, 7);
  REQUIRE(SaveSession(server.stub(), id, "whole").ok());
  const std::string bytes = ReadFile(files.File("whole"));
  // Rewrite the record to name 19 chunk records and drop the last one: the
  // header, the CRC and the record count all agree; the state (20 closed
  // chunks) does not.
  uint64_t body = 0;
  std::memcpy(&body, bytes.data() + 16, sizeof body);
  const size_t record_bytes = 24 + body;
  auto record = DecodeSessionRecord(std::string_view(bytes).substr(0, record_bytes), "whole");
  REQUIRE(record.ok());
  REQUIRE(record->segments.size() == 1);
  REQUIRE(record->segments[0].chunks == 20);
  record->segments[0].chunks = 19;
  const size_t one = kChunkRecordHeaderBytes + ChunkPayloadBytes(FixtureModel::Get().model->config());
  const std::string crafted = EncodeSessionRecord(*record) +
                              bytes.substr(record_bytes, 19 * one);
  std::ofstream(files.File("crafted"), std::ios::binary) << crafted;
  InfoResult r = LoadSession(server.stub(), "crafted");
  CHECK(r.status.error_code() == grpc::StatusCode::DATA_LOSS);
  CHECK_THAT(r.status.error_message(), Contains(files.File("crafted")));
  CHECK_THAT(r.status.error_message(), Contains("20 closed chunks"));
  CHECK(server.service().session_manager().count() == 1);  // the saved one only
}

}  // namespace
}  // namespace drt::server

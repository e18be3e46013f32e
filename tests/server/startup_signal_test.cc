// The real drt-server binary, signalled in the middle of restoring its
// --state_dir sessions (review-deploy #10): it exits within a second with
// status 128 + the signal and a line saying so, without listening, and the
// next start restores every session exactly. Before the fix the signal
// waited for the end of the restore, then the server listened, drained and
// exited 0 (a pod deleted during a long restore was SIGKILLed after its
// grace period; Ctrl-C did nothing).
//
// The restore is slowed by the binary's test hook DRT_TEST_RESTORE_DELAY_MS
// (server/main.cc), which holds each session's restore that long after a
// line on stderr; the test signals after the first such line. Before the
// signalled starts the state directory gets a torn chunk-log tail and a
// damaged state file, so the restore has written (cut the tail, moved the
// damaged session to quarantine/) by the time the hook runs: the signal
// lands after those writes, and the next start still finds everything as an
// unsignalled start would have left it (review-startsig #3).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <httplib.h>

#include "server/startup_signals.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/waiting.h"
#include "tests/test_util/build_paths.h"
#include "tests/test_util/temp_dir.h"

extern char** environ;

namespace drt::server {
namespace {

using namespace drt::server::testing;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// drt-server started with `extra_env` added to the environment and its
// stdout and stderr in files; it is not waited for (ServerProcess waits for
// the listening line). Killed at the end if it is still running.
class StartingServer {
 public:
  StartingServer(const std::vector<std::string>& args, const std::string& extra_env,
                 const std::string& out_path, const std::string& err_path)
      : out_path_(out_path), err_path_(err_path) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    // Default signal handling and an empty mask, as ServerProcess starts it.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t empty, all;
    sigemptyset(&empty);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &empty);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    const std::string binary = drt::testing::ServerBinary();
    std::vector<std::string> argv_strings = {binary};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : argv_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    std::string env_entry = extra_env;
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    envp.push_back(env_entry.data());
    envp.push_back(nullptr);
    const int rc = posix_spawn(&pid_, binary.c_str(), &actions, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) throw std::runtime_error("posix_spawn " + binary + " failed");
  }
  ~StartingServer() {
    if (!exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  StartingServer(const StartingServer&) = delete;
  StartingServer& operator=(const StartingServer&) = delete;

  void Signal(int signal) { kill(pid_, signal); }
  std::string out() const { return ReadFile(out_path_); }
  std::string err() const { return ReadFile(err_path_); }
  std::optional<int> WaitExit(double timeout_seconds) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(
                                             static_cast<int64_t>(timeout_seconds * 1000));
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::nullopt;
  }

 private:
  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

std::map<std::string, int64_t> ListTokens(drt::v1::Drt::Stub& stub) {
  grpc::ClientContext context;
  SetDeadline(context, 30);
  drt::v1::ListSessionsResponse list;
  REQUIRE(stub.ListSessions(&context, {}, &list).ok());
  std::map<std::string, int64_t> tokens;
  for (const auto& info : list.sessions()) tokens[info.session_id()] = info.tokens();
  return tokens;
}

GenerateResult GreedyTokens(drt::v1::Drt::Stub& stub, const std::string& id, int32_t n) {
  drt::v1::GenerateRequest request = GreedyRequest(id, n);
  request.set_pad_to_chunk_boundary(false);
  request.set_ignore_eos(true);
  return Generate(stub, request);
}

TEST_CASE("a shutdown signal during the restore of --state_dir ends drt-server at once",
          "[server][process][startup]") {
  drt::testing::TempDir temp;
  const std::string state = temp.File("state");
  std::vector<std::string> args = ServerProcessArgs(1);
  args.push_back("--state_dir=" + state);

  // Three durable sessions: two appended, one forked from the first and
  // generated on; its tokens are what the first must generate after the
  // restarts.
  constexpr int32_t kGenerate = 8;
  std::map<std::string, int64_t> before;
  std::string parent;
  std::vector<int32_t> continuation;
  {
    ServerProcess server(drt::testing::ServerBinary(), args);
    auto stub = drt::v1::Drt::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    parent = NewSession(*stub);
    const auto a = RandomTokens(700, 11);
    REQUIRE(AppendTokens(*stub, parent, a, EvenPieces(a.size(), 200)).status.ok());
    const std::string other = NewSession(*stub);
    const auto b = RandomTokens(1500, 12);
    REQUIRE(AppendTokens(*stub, other, b, EvenPieces(b.size(), 500)).status.ok());
    InfoResult fork = ForkSession(*stub, parent);
    REQUIRE(fork.status.ok());
    GenerateResult generated = GreedyTokens(*stub, fork.info.session_id(), kGenerate);
    REQUIRE(generated.status.ok());
    continuation = generated.tokens;
    REQUIRE(continuation.size() == kGenerate);
    before = ListTokens(*stub);
    REQUIRE(before == std::map<std::string, int64_t>{
                          {parent, 700}, {other, 1500}, {fork.info.session_id(), 700 + kGenerate}});
    server.Signal(SIGTERM);
    const std::optional<int> status = server.WaitExit(30);
    REQUIRE(status.has_value());
    REQUIRE(WIFEXITED(*status));
    REQUIRE(WEXITSTATUS(*status) == 0);
  }

  // A torn tail on the largest chunk log (a write cut short, as a crash
  // leaves it: 100 bytes, less than a record) and a state file that does
  // not decode (sessions/zz.state). A start cuts the first and quarantines
  // the second before it restores any session.
  namespace fs = std::filesystem;
  fs::path torn;
  for (const auto& entry : fs::directory_iterator(state + "/chunks")) {
    if (torn.empty() || fs::file_size(entry.path()) > fs::file_size(torn)) torn = entry.path();
  }
  REQUIRE_FALSE(torn.empty());
  const uintmax_t torn_bytes = fs::file_size(torn);
  std::ofstream(torn, std::ios::app) << std::string(100, '\x5a');
  REQUIRE(fs::file_size(torn) == torn_bytes + 100);
  const std::string damaged = state + "/sessions/zz.state";
  std::ofstream(damaged) << "not a session record";
  // The quarantine/zz-* directories and what each holds.
  const auto quarantined_zz = [&] {
    std::vector<std::vector<std::string>> dirs;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(state + "/quarantine", ec)) {
      if (entry.path().filename().string().rfind("zz-", 0) != 0) continue;
      std::vector<std::string> names;
      for (const auto& file : fs::directory_iterator(entry.path())) {
        names.push_back(file.path().filename().string());
      }
      dirs.push_back(names);
    }
    return dirs;
  };
  REQUIRE(quarantined_zz().empty());

  // Each session's restore is held 5 s, 15 s in all: a signal the server
  // held to the end of the restore (the old behaviour) would exit after
  // ~15 s and with status 0. How soon it exits: the main thread polls
  // sigtimedwait every 20 ms (server/startup_signals.cc), then _exit; six
  // runs here (2 shared cores, load average 1-5, 2026-11-24) measured
  // 0.030-0.094 s from kill to the waitpid that saw the exit (printed
  // below), so the 1 s bound leaves 10x that.
  constexpr double kPromptSeconds = 1.0;
  for (int signal : {SIGTERM, SIGINT}) {
    INFO("signal " << strsignal(signal));
    StartingServer starting(args, "DRT_TEST_RESTORE_DELAY_MS=5000", temp.File("out"),
                            temp.File("err"));
    WaitFor([&] { return starting.err().find("DRT_TEST_RESTORE_DELAY_MS: restoring session") !=
                         std::string::npos; },
            60, "the restore to begin");
    const auto signalled = Clock::now();
    starting.Signal(signal);
    const std::optional<int> status = starting.WaitExit(10);
    const double seconds = SecondsSince(signalled);
    const std::string err = starting.err();
    INFO("stderr:\n" << err);
    REQUIRE(status.has_value());
    std::printf("startup_signal_test: %s during the restore: exit after %.3f s\n",
                strsignal(signal), seconds);
    CHECK(seconds < kPromptSeconds);
    REQUIRE(WIFEXITED(*status));
    CHECK(WEXITSTATUS(*status) == 128 + signal);
    CHECK(WEXITSTATUS(*status) == StartupSignalExitStatus(signal));
    const std::string line = std::string("drt-server: ") + strsignal(signal) +
                             " during start-up (restoring the sessions in " + state +
                             "): exiting with status " + std::to_string(128 + signal) +
                             " before serving";
    CHECK(err.find(line) != std::string::npos);
    CHECK(starting.out().find("listening") == std::string::npos);
    // The first signalled start made the restore's writes before its first
    // session's hook (their lines on stderr come after the restore, so the
    // files are checked): the tail is cut back to the whole records and zz
    // is in quarantine/, once; the second finds nothing left to do.
    CHECK(fs::file_size(torn) == torn_bytes);
    CHECK_FALSE(fs::exists(damaged));
    CHECK(quarantined_zz() == std::vector<std::vector<std::string>>{{"zz.state"}});
  }

  // The next start restores every session, exactly: the same token counts,
  // none quarantined and no tail cut (both were done before the first
  // signal, and not undone), zz still in quarantine/ once, and the parent
  // continues as its fork did.
  const std::string err_path = temp.File("restart.err");
  ServerProcess server(drt::testing::ServerBinary(), args, 60, err_path);
  auto stub = drt::v1::Drt::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  CHECK(ListTokens(*stub) == before);
  GenerateResult generated = GreedyTokens(*stub, parent, kGenerate);
  REQUIRE(generated.status.ok());
  CHECK(generated.tokens == continuation);
  const std::string err = ReadFile(err_path);
  INFO("stderr:\n" << err);
  CHECK(err.find("restored 3 sessions") != std::string::npos);
  CHECK(err.find("0 quarantined, 0 chunk log tails cut") != std::string::npos);
  CHECK(fs::file_size(torn) == torn_bytes);
  CHECK(quarantined_zz() == std::vector<std::vector<std::string>>{{"zz.state"}});
  // What quarantine/ keeps, said at start and on /metrics: zz's state file
  // ("not a session record", 20 bytes; no chunk log).
  CHECK(err.find("drt-server: " + state + "/quarantine/ holds 1 refused sessions, 0 MiB") !=
        std::string::npos);
  const std::string& listening = server.startup_output();
  const size_t http_at = listening.find(", 127.0.0.1:");
  REQUIRE(http_at != std::string::npos);
  httplib::Client http("127.0.0.1", std::stoi(listening.substr(http_at + 12)));
  auto metrics = http.Get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->body.find("\ndrt_quarantined_sessions 1\n") != std::string::npos);
  CHECK(metrics->body.find("\ndrt_quarantined_bytes 20\n") != std::string::npos);
}

// The value of Prometheus sample `name` in `text`, or -1.
int64_t Sample(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + name.size() + 2));
}

// review-deploy F5: the HTTP endpoint starts before the --state_dir restore,
// so that a probe sees a live process (/livez 200 "restoring") and a
// not-ready one (/healthz and /readyz 503 "restoring") with the restore's
// progress on /metrics, instead of no answer at all until it ends (a
// startup probe shorter than the restore killed the pod at every start).
TEST_CASE("during the restore of --state_dir /livez answers 200 and /healthz and /readyz 503",
          "[server][process][startup][restore_progress]") {
  drt::testing::TempDir temp;
  const std::string state = temp.File("state");
  std::vector<std::string> args = ServerProcessArgs(1);  // HTTP on 127.0.0.1:0
  args.push_back("--state_dir=" + state);
  {
    ServerProcess server(drt::testing::ServerBinary(), args);
    auto stub = drt::v1::Drt::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    for (int i = 0; i < 2; ++i) {
      const std::string id = NewSession(*stub);
      const auto tokens = RandomTokens(300 + 400 * i, 21 + i);
      REQUIRE(AppendTokens(*stub, id, tokens, EvenPieces(tokens.size(), 200)).status.ok());
    }
    server.Signal(SIGTERM);
    REQUIRE(server.WaitExit(30).has_value());
  }
  int64_t log_bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(state + "/chunks")) {
    log_bytes += static_cast<int64_t>(std::filesystem::file_size(entry.path()));
  }
  REQUIRE(log_bytes > 0);

  // Each session's restore is held 2 s: the probes are asked during the
  // first one's.
  StartingServer starting(args, "DRT_TEST_RESTORE_DELAY_MS=2000", temp.File("out"),
                          temp.File("err"));
  WaitFor([&] { return starting.err().find("DRT_TEST_RESTORE_DELAY_MS: restoring session") !=
                       std::string::npos; },
          60, "the restore to begin");
  const std::string err = starting.err();
  INFO("stderr:\n" << err);
  const std::string endpoint_line = "drt-server: HTTP endpoint on 127.0.0.1:";
  const size_t at = err.find(endpoint_line);
  REQUIRE(at != std::string::npos);
  const int port = std::stoi(err.substr(at + endpoint_line.size()));
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(10, 0);
  const auto get = [&](const char* path) {
    auto response = client.Get(path);
    REQUIRE(response);
    return std::make_pair(response->status, response->body);
  };
  CHECK(get("/livez") == std::make_pair(200, std::string("restoring")));
  CHECK(get("/healthz") == std::make_pair(503, std::string("restoring")));
  CHECK(get("/readyz") == std::make_pair(503, std::string("restoring")));
  const auto [metrics_status, during] = get("/metrics");
  CHECK(metrics_status == 200);
  CHECK(Sample(during, "drt_restore_running") == 1);
  CHECK(Sample(during, "drt_restore_log_bytes_to_check") == log_bytes);
  CHECK(Sample(during, "drt_restore_log_bytes_checked") == log_bytes);  // checked before any restore
  CHECK(Sample(during, "drt_restore_sessions_to_restore") == 2);
  CHECK(Sample(during, "drt_restore_sessions_restored") == 0);
  CHECK(starting.out().find("listening") == std::string::npos);  // gRPC not yet

  WaitFor([&] { return starting.out().find("drt-server listening on") != std::string::npos; }, 60,
          "the server to listen");
  CHECK(get("/livez") == std::make_pair(200, std::string("ok")));
  CHECK(get("/healthz") == std::make_pair(200, std::string("ok")));
  CHECK(get("/readyz") == std::make_pair(200, std::string("ok")));
  const std::string after = get("/metrics").second;
  CHECK(Sample(after, "drt_restore_running") == 0);
  CHECK(Sample(after, "drt_restore_sessions_restored") == 2);
  starting.Signal(SIGTERM);
  const std::optional<int> status = starting.WaitExit(30);
  REQUIRE(status.has_value());
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 0);
}

}  // namespace
}  // namespace drt::server

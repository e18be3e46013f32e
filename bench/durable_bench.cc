// drt-durable-bench: what --state_dir costs. Appends a prompt to one session
// through SessionManager in the server's step size (--step_tokens), with no
// state directory, with --state_sync=step and with interval sync, and prints
// tokens/s (median of --runs); then writes --sessions sessions of
// --session_tokens tokens and times their restore (the server's start-up);
// then times group commit: --group_commit_sessions sessions appending at once
// through the server's scheduler with every step written, the writes of a
// step at once (SchedulerOptions::concurrent_writes) against one after
// another, and in memory only, the three interleaved run by run.
#include <fcntl.h>
#include <stdlib.h>  // mkdtemp
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "bench/batch/latency_stats.h"
#include "bench/load_average.h"
#include "bench/signal_stop.h"
#include "cli/command_line.h"
#include "engine/backend.h"
#include "engine/model_rules.h"
#include "engine/model.h"
#include "engine/session.h"
#include "server/scheduler.h"
#include "server/session_manager.h"
#include "server/state_store.h"

ABSL_FLAG(std::string, model, "models/drt-passkey-byte", "model directory");
ABSL_FLAG(std::string, dir, "",
          "directory under which the bench makes its own fresh scratch directory "
          "(drt-durable-bench.XXXXXX) and removes only that one (empty: the system's temporary "
          "directory); nothing else under --dir is touched");
ABSL_FLAG(int64_t, tokens, 200000, "tokens appended per throughput run");
ABSL_FLAG(int32_t, runs, 3,
          "runs per mode, and cold and warm restores (alternating which comes first); the medians "
          "are printed");
ABSL_FLAG(int32_t, threads, 0,
          "CPU threads (0: the CPUs this process may use; engine/cpu/cpu_threads.h)");
ABSL_FLAG(int64_t, sessions, 8, "sessions written for the start-up measurement");
ABSL_FLAG(int64_t, session_tokens, 100000, "tokens per session for the start-up measurement");
ABSL_FLAG(int64_t, step_tokens, 0,
          "tokens per Append step, and the backend's step size, as drt-server's --step_tokens "
          "(0: the backend's own, the server's default)");
ABSL_FLAG(int64_t, group_commit_sessions, 0,
          "group commit: sessions appending at once through the server's scheduler, every "
          "engine step written (as --state_ack_tokens=0), the writes of a step at once and one "
          "after another (docs/state_format.md, \"Group commit\"); 0 (the default) skips it");
ABSL_FLAG(int64_t, group_commit_tokens, 32768, "group commit: tokens each session appends");

namespace {

using drt::server::SessionManager;
using drt::server::StateStore;
using drt::server::StateStoreOptions;
using drt::server::StateSync;
using drt::bench::LoadAverageText;
// main() refuses --runs < 1, so no sample vector is empty.
using drt::bench::Median;
using drt::bench::SignalStop;
using Clock = std::chrono::steady_clock;


std::vector<int32_t> Tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 256);
  return t;
}

// Returns a failed status from the enclosing function. Every error after
// the scratch directory is made returns to main (no std::exit), so that the
// directory's owner removes it on the way out.
#define RETURN_IF_ERROR(expr)                     \
  do {                                            \
    const absl::Status status_ = (expr);          \
    if (!status_.ok()) return status_;            \
  } while (0)

// Declares `lhs` as the value of the StatusOr `expr`, or returns its status
// from the enclosing function.
#define ASSIGN_OR_RETURN(lhs, expr)               \
  auto lhs##_or_ = (expr);                        \
  if (!lhs##_or_.ok()) return lhs##_or_.status(); \
  auto lhs = *std::move(lhs##_or_)

// The most sessions a server of this bench holds (SessionLimits in Start):
// --sessions and --group_commit_sessions are refused above it before any work.
constexpr int64_t kMaxSessions = 1024;

// Refuses a bad flag value before any work, naming the flag.
void Require(bool ok, const char* message) {
  if (!ok) {
    std::fprintf(stderr, "drt-durable-bench: %s\n", message);
    std::exit(1);
  }
}

// A new, empty directory under `parent` that this process made, so that the
// bench can empty and remove it without touching anything it did not create
// (review-tools 2026-11-24 #3: --dir was removed recursively as given). It is
// removed with everything in it when this object goes, on every return from
// main, the error returns included (review-toolsfix3: a failed run left it).
class ScratchDirectory {
 public:
  explicit ScratchDirectory(const std::string& parent_flag) {
    std::error_code error;
    const std::filesystem::path parent =
        parent_flag.empty() ? std::filesystem::temp_directory_path(error)
                            : std::filesystem::path(parent_flag);
    Require(!error, "no temporary directory; pass --dir");
    Require(std::filesystem::is_directory(parent, error),
            ("--dir " + parent.string() + " is not an existing directory").c_str());
    std::string pattern = (parent / "drt-durable-bench.XXXXXX").string();
    Require(mkdtemp(pattern.data()) != nullptr,
            ("--dir " + parent.string() + ": cannot create a scratch directory in it").c_str());
    path_ = pattern;
  }
  ~ScratchDirectory() {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
    if (error) {
      std::fprintf(stderr, "drt-durable-bench: cannot remove the scratch directory %s: %s\n",
                   path_.c_str(), error.message().c_str());
    }
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct Server {
  std::unique_ptr<StateStore> store;
  std::unique_ptr<SessionManager> sessions;
  ~Server() { sessions.reset(); }
};

absl::StatusOr<std::unique_ptr<Server>> Start(drt::Backend& backend, const std::string& dir,
                                              StateSync sync,
                                              StateStore::RestoreReport* report = nullptr) {
  auto owned = std::make_unique<Server>();
  Server& server = *owned;
  drt::server::SessionLimits limits;
  limits.host_memory_budget_bytes = 64LL << 30;
  limits.max_sessions = kMaxSessions;
  server.sessions = std::make_unique<SessionManager>(backend, limits);
  if (dir.empty()) return owned;
  StateStoreOptions options;
  options.dir = dir;
  options.sync = sync;
  ASSIGN_OR_RETURN(store, StateStore::Open(options, backend.config()));
  server.store = std::move(store);
  ASSIGN_OR_RETURN(restored, server.store->RestoreAll(backend));
  server.sessions->AttachStateStore(server.store.get());
  for (auto& r : restored.sessions) {
    RETURN_IF_ERROR(server.sessions->Adopt(r.id, r.settings, std::move(r.session)).status());
  }
  restored.sessions.clear();
  if (report != nullptr) *report = std::move(restored);
  return owned;
}

// Appends `tokens` to session `id` in steps of `step_tokens`; a signal
// (`stop`) ends it between steps.
absl::Status Append(SessionManager& sessions, const std::string& id,
                    const std::vector<int32_t>& tokens, size_t step_tokens,
                    const SignalStop& stop) {
  ASSIGN_OR_RETURN(entry, sessions.Find(id));
  RETURN_IF_ERROR(entry->Begin(drt::server::Activity::kAppending));
  absl::Status status;
  for (size_t done = 0; done < tokens.size() && status.ok(); done += step_tokens) {
    if (status = stop.Check(); !status.ok()) break;
    const auto piece = absl::MakeConstSpan(tokens).subspan(
        done, std::min<size_t>(step_tokens, tokens.size() - done));
    status = entry->RunStep([&](drt::Session& s) { return s.Append(piece).status(); });
  }
  entry->End();
  return status;
}

// Aggregate tokens/s of tokens.size() sessions appending their tokens at
// once, one item each, through a Scheduler (as drt-server's Append handlers
// do), in steps of `step_tokens` tokens shared by all; durable when `dir` is
// not empty, every step written (durable_ack_tokens 0), a step's writes at
// once (`concurrent`) or one after another.
absl::StatusOr<double> GroupCommitRun(drt::Backend& backend, const std::string& dir,
                                      const std::vector<std::vector<int32_t>>& tokens,
                                      int64_t step_tokens, bool concurrent) {
  if (!dir.empty()) std::filesystem::remove_all(dir);
  ASSIGN_OR_RETURN(server, Start(backend, dir, StateSync::kStep));
  drt::server::SchedulerOptions options;
  options.step_tokens = step_tokens;
  options.durable_ack_tokens = 0;
  options.concurrent_writes = concurrent;
  std::vector<std::shared_ptr<drt::server::SessionEntry>> entries;
  absl::Status made;
  for (size_t i = 0; i < tokens.size() && made.ok(); ++i) {
    auto entry = server->sessions->Create({});
    made = entry.status();
    if (made.ok()) made = (*entry)->Begin(drt::server::Activity::kAppending);
    if (made.ok()) entries.push_back(*entry);
  }
  if (!made.ok()) {
    for (const auto& entry : entries) entry->End();
    return made;
  }
  std::vector<absl::Status> statuses(tokens.size());
  double seconds = 0;
  int64_t total = 0;
  {
    drt::server::Scheduler scheduler(backend, options);
    std::vector<std::thread> threads;
    const auto start = Clock::now();
    for (size_t i = 0; i < tokens.size(); ++i) {
      threads.emplace_back([&, i] {
        drt::server::WorkItem item;
        item.entry = entries[i].get();
        item.tokens = tokens[i];
        item.kind = drt::server::WorkKind::kPrefill;
        statuses[i] = scheduler.Run(item).status;
      });
    }
    for (std::thread& t : threads) t.join();
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  absl::Status status;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (status.ok()) status = statuses[i];
    total += static_cast<int64_t>(tokens[i].size());
    entries[i]->End();
  }
  RETURN_IF_ERROR(status);
  return static_cast<double>(total) / seconds;
}

// Pages of the regular files under `dir` in the page cache, and all their
// pages (mincore over a read-only mapping of each file).
struct CachedPages {
  uint64_t cached = 0;
  uint64_t total = 0;
};
CachedPages CountCachedPages(const std::string& dir) {
  const long page = sysconf(_SC_PAGESIZE);
  CachedPages pages;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (!f.is_regular_file() || f.file_size() == 0) continue;
    const int fd = open(f.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const size_t size = f.file_size();
    void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) continue;
    std::vector<unsigned char> resident((size + page - 1) / page);
    if (mincore(map, size, resident.data()) == 0) {
      for (unsigned char r : resident) pages.cached += r & 1;
      pages.total += resident.size();
    }
    munmap(map, size);
  }
  return pages;
}

// Drops the files under `dir` from the page cache, so that a restore reads
// them from the disk, as a server started on another node or after a reboot
// does (review-tools #11: the restore was timed right after the files were
// written, from the cache). Each file is fsynced first: dirty pages are not
// dropped. POSIX_FADV_DONTNEED is advice: what stayed cached is measured
// (CountCachedPages) and printed beside the time.
absl::Status EvictFromPageCache(const std::string& dir) {
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (!f.is_regular_file()) continue;
    const int fd = open(f.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::InternalError(
          absl::StrFormat("cannot open %s to evict it from the page cache", f.path().string()));
    }
    const bool evicted = fsync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
    close(fd);
    if (!evicted) {
      return absl::InternalError(
          absl::StrFormat("cannot evict %s from the page cache", f.path().string()));
    }
  }
  return absl::OkStatus();
}


// The measurements, in `dir` (inside the scratch directory); an error
// returns, and main removes the scratch directory on its way out. So does a
// signal (`stop`), checked between steps, sessions, restores and group-commit
// runs (a group-commit run itself goes to its end).
absl::Status Run(drt::Backend& backend, size_t step_tokens, const std::string& dir,
                 const SignalStop& stop) {
  const auto tokens = Tokens(absl::GetFlag(FLAGS_tokens), 1);

  struct Mode {
    const char* name;
    bool durable;
    StateSync sync;
  };
  const Mode modes[] = {{"memory only", false, StateSync::kStep},
                        {"--state_sync=step", true, StateSync::kStep},
                        {"--state_sync=interval (1000 ms)", true, StateSync::kInterval}};
  std::vector<std::vector<double>> rates(std::size(modes));
  // Modes interleaved run by run, so that load from other processes on a
  // shared machine falls on all of them alike.
  for (int run = 0; run < absl::GetFlag(FLAGS_runs); ++run) {
    for (size_t m = 0; m < std::size(modes); ++m) {
      std::filesystem::remove_all(dir);
      ASSIGN_OR_RETURN(server, Start(backend, modes[m].durable ? dir : "", modes[m].sync));
      ASSIGN_OR_RETURN(entry, server->sessions->Create({}));
      const auto start = Clock::now();
      RETURN_IF_ERROR(Append(*server->sessions, entry->id(), tokens, step_tokens, stop));
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      rates[m].push_back(static_cast<double>(tokens.size()) / seconds);
      std::printf("run %d %-32s %8.0f tokens/s\n", run, modes[m].name, rates[m].back());
      std::fflush(stdout);
    }
  }
  // The same appends with the engine step and the step-sync write timed
  // apart in each step (the write the SessionEntry hook makes): their ratio
  // is the cost of durability, and both halves see the same machine load.
  std::vector<double> overheads;
  for (int run = 0; run < absl::GetFlag(FLAGS_runs); ++run) {
    std::filesystem::remove_all(dir);
    ASSIGN_OR_RETURN(server, Start(backend, "", StateSync::kStep));
    StateStoreOptions options;
    options.dir = dir;
    ASSIGN_OR_RETURN(store, StateStore::Open(options, backend.config()));
    ASSIGN_OR_RETURN(entry, server->sessions->Create({}));
    // (This store is not the manager's: the session is registered with it here.)
    const drt::server::StateRegistration registration = store->Register(entry->id());
    RETURN_IF_ERROR(entry->Begin(drt::server::Activity::kAppending));
    double engine = 0, write = 0;
    absl::Status step;
    for (size_t done = 0; done < tokens.size() && step.ok(); done += step_tokens) {
      if (step = stop.Check(); !step.ok()) break;
      const auto piece = absl::MakeConstSpan(tokens).subspan(
          done, std::min<size_t>(step_tokens, tokens.size() - done));
      step = entry->RunStep([&](drt::Session& s) -> absl::Status {
        const auto t0 = Clock::now();
        RETURN_IF_ERROR(s.Append(piece).status());
        const auto t1 = Clock::now();
        RETURN_IF_ERROR(store->Persist(registration, entry->settings(), s));
        const auto t2 = Clock::now();
        engine += std::chrono::duration<double>(t1 - t0).count();
        write += std::chrono::duration<double>(t2 - t1).count();
        return absl::OkStatus();
      });
    }
    entry->End();
    RETURN_IF_ERROR(step);
    overheads.push_back(write / engine);
    std::printf("run %d step sync timed apart: engine %.2f s, writes %.3f s (%.1f%% of the engine)\n",
                run, engine, write, 100.0 * write / engine);
    std::fflush(stdout);
  }
  std::printf("median step-sync write cost: %.1f%% of the engine time\n",
              100.0 * Median(overheads));
  const double base = Median(rates[0]);
  for (size_t m = 0; m < std::size(modes); ++m) {
    std::printf("median %-32s %8.0f tokens/s (%+.1f%%)\n", modes[m].name, Median(rates[m]),
                100.0 * (Median(rates[m]) / base - 1.0));
  }

  // Start-up: N sessions of M tokens written, then a new store restores them.
  std::filesystem::remove_all(dir);
  const int64_t n = absl::GetFlag(FLAGS_sessions);
  const auto session_tokens = Tokens(absl::GetFlag(FLAGS_session_tokens), 2);
  {
    ASSIGN_OR_RETURN(server, Start(backend, dir, StateSync::kStep));
    for (int64_t i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(entry, server->sessions->Create({}));
      RETURN_IF_ERROR(Append(*server->sessions, entry->id(), session_tokens, step_tokens, stop));
    }
  }
  uintmax_t bytes = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (f.is_regular_file()) bytes += f.file_size();
  }
  // Timed cold (the files evicted from the page cache first: a pod moved to
  // another node, a reboot) and warm (the files cached, as a restart on the
  // same node finds them while memory lasts), --runs times each. One untimed
  // restore comes first, so that neither kind pays for the process's first
  // restore (first allocations, first mappings), and the order alternates
  // from run to run (cold first in even runs, warm first in odd ones) so
  // that neither always comes second (review-toolsfix3 #1: cold was always
  // the first restore).
  {
    RETURN_IF_ERROR(Start(backend, dir, StateSync::kStep).status());
  }
  std::vector<double> restore_seconds[2];  // [0]: cold, [1]: warm
  long long restored_sessions = 0;
  for (int run = 0; run < absl::GetFlag(FLAGS_runs); ++run) {
    const bool cold_first = run % 2 == 0;
    for (const bool cold : {cold_first, !cold_first}) {
      RETURN_IF_ERROR(stop.Check());
      if (cold) RETURN_IF_ERROR(EvictFromPageCache(dir));
      const CachedPages before = CountCachedPages(dir);
      const auto start = Clock::now();
      StateStore::RestoreReport report;
      ASSIGN_OR_RETURN(restored, Start(backend, dir, StateSync::kStep, &report));
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      restored_sessions = static_cast<long long>(restored->sessions->count());
      restore_seconds[cold ? 0 : 1].push_back(seconds);
      std::printf("restore: %lld sessions x %lld tokens (%.1f MiB on disk) %s, run %d %s, %.0f%% of "
                  "its pages in the page cache before: %.3f s (%zu quarantined)\n",
                  restored_sessions, static_cast<long long>(session_tokens.size()),
                  bytes / 1048576.0, cold ? "cold (page cache evicted)" : "warm (files cached)", run,
                  cold == cold_first ? "first" : "second",
                  before.total ? 100.0 * before.cached / before.total : 0.0, seconds,
                  report.quarantined.size());
      std::fflush(stdout);
    }
  }
  std::printf("restore: %lld sessions x %lld tokens, median of %zu: cold %.3f s, warm %.3f s\n",
              restored_sessions, static_cast<long long>(session_tokens.size()),
              restore_seconds[0].size(), Median(restore_seconds[0]), Median(restore_seconds[1]));

  // Group commit: the same N concurrent Appends in memory, with a step's
  // writes one after another, and at once; interleaved run by run (the two
  // durable modes in alternating order), with the load average printed.
  if (const int64_t sessions = absl::GetFlag(FLAGS_group_commit_sessions); sessions > 0) {
    std::vector<std::vector<int32_t>> appends;
    for (int64_t i = 0; i < sessions; ++i) {
      appends.push_back(Tokens(absl::GetFlag(FLAGS_group_commit_tokens), 100 + i));
    }
    std::printf("group commit: %lld sessions x %lld tokens appended at once, steps of %zu tokens, "
                "every step written; load average before: %s\n",
                static_cast<long long>(sessions),
                static_cast<long long>(absl::GetFlag(FLAGS_group_commit_tokens)), step_tokens,
                LoadAverageText().c_str());
    struct GroupMode {
      const char* name;
      bool durable, concurrent;
    };
    const GroupMode group_modes[] = {{"memory only", false, true},
                                     {"written one after another", true, false},
                                     {"written at once (group commit)", true, true}};
    std::vector<std::vector<double>> group_rates(std::size(group_modes));
    std::vector<double> gains;
    for (int run = 0; run < absl::GetFlag(FLAGS_runs); ++run) {
      double serial = 0, concurrent = 0;
      for (size_t k = 0; k < std::size(group_modes); ++k) {
        // Memory first, then the durable two in alternating order.
        const size_t m = (k == 0 || run % 2 == 0) ? k : 3 - k;
        const GroupMode& mode = group_modes[m];
        RETURN_IF_ERROR(stop.Check());
        ASSIGN_OR_RETURN(rate, GroupCommitRun(backend, mode.durable ? dir : "", appends,
                                              static_cast<int64_t>(step_tokens), mode.concurrent));
        group_rates[m].push_back(rate);
        if (m == 1) serial = rate;
        if (m == 2) concurrent = rate;
        std::printf("run %d group %-32s %8.0f tokens/s\n", run, mode.name, rate);
        std::fflush(stdout);
      }
      gains.push_back(concurrent / serial);
    }
    for (size_t m = 0; m < std::size(group_modes); ++m) {
      std::printf("median group %-32s %8.0f tokens/s\n", group_modes[m].name,
                  Median(group_rates[m]));
    }
    std::printf("median per-run ratio, at once / one after another: %.2f; load average after: %s\n",
                Median(gains), LoadAverageText().c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  drt::cli::ParseCommandLine(
      {"drt-durable-bench",
       "Measures Append throughput with durable sessions (--state_dir) off and on, and the\n"
       "start-up time to restore sessions.\n"
       "Example: drt-durable-bench --model models/drt-passkey-byte --tokens 200000",
       {"bench/durable_bench.cc"}},
      argc, argv);
  // Before the backend starts its threads, so that they inherit the mask.
  const std::shared_ptr<SignalStop> stop = SignalStop::Install("drt-durable-bench");
  Require(absl::GetFlag(FLAGS_runs) >= 1, "--runs must be at least 1");
  Require(absl::GetFlag(FLAGS_tokens) >= 1, "--tokens must be at least 1");
  Require(absl::GetFlag(FLAGS_sessions) >= 0, "--sessions must not be negative");
  Require(absl::GetFlag(FLAGS_session_tokens) >= 1, "--session_tokens must be at least 1");
  Require(absl::GetFlag(FLAGS_step_tokens) >= 0, "--step_tokens must not be negative");
  Require(absl::GetFlag(FLAGS_sessions) <= kMaxSessions,
          absl::StrFormat("--sessions must be at most %d (the bench's session limit)", kMaxSessions)
              .c_str());
  Require(absl::GetFlag(FLAGS_group_commit_sessions) >= 0,
          "--group_commit_sessions must not be negative");
  Require(absl::GetFlag(FLAGS_group_commit_sessions) <= kMaxSessions,
          absl::StrFormat("--group_commit_sessions must be at most %d (the bench's session limit)",
                          kMaxSessions)
              .c_str());
  Require(absl::GetFlag(FLAGS_group_commit_tokens) >= 1,
          "--group_commit_tokens must be at least 1");
  auto model = drt::LoadModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  drt::CpuBackendOptions cpu;
  cpu.num_threads = absl::GetFlag(FLAGS_threads);
  const drt::ModelConfig& config = (*model)->config();
  if (const int64_t asked = absl::GetFlag(FLAGS_step_tokens); asked > 0) {
    // As drt-server does: the step's tokens with their landmarks, whole chunks.
    cpu.max_step_positions = drt::StepPositionsForTokens(config, asked);
  }
  auto backend = drt::MakeCpuBackend(config, (*model)->weights(), cpu);
  const size_t step_tokens =
      absl::GetFlag(FLAGS_step_tokens) > 0
          ? static_cast<size_t>(absl::GetFlag(FLAGS_step_tokens))
          : static_cast<size_t>(
                drt::StepTokensForPositions(config, backend->max_step_positions()));
  std::printf("Append steps of %zu tokens\n", step_tokens);
  // The state directory lives inside the scratch directory, which is the
  // only thing removed at the end. Armed first: a signal from here on stops
  // the run, and main returns through the directory's destructor.
  stop->Arm();
  const ScratchDirectory scratch(absl::GetFlag(FLAGS_dir));
  std::printf("scratch directory %s (removed at the end, also when the bench fails or gets "
              "Ctrl-C or SIGTERM; a second signal exits at once and leaves it)\n",
              scratch.path().c_str());
  std::fflush(stdout);
  absl::Status status;
  try {
    status = Run(*backend, step_tokens, (scratch.path() / "state").string(), *stop);
  } catch (const std::exception& e) {
    // std::filesystem's calls here throw on an I/O error; caught so that
    // the scratch directory still goes.
    status = absl::InternalError(e.what());
  }
  if (!status.ok() && stop->ExitStatus() != 0 && absl::IsCancelled(status)) {
    // As a shell reports a process the signal ended: 130 or 143.
    std::fprintf(stderr, "drt-durable-bench: %s\n", std::string(status.message()).c_str());
    return stop->ExitStatus();
  }
  if (!status.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

// drt-server: loads a model, serves drt.v1.Drt (plus grpc.health.v1 and
// server reflection) over gRPC and /metrics, /healthz over HTTP, and drains
// gracefully on SIGTERM/SIGINT (one during start-up ends it at once,
// server/startup_signals.h). See --help.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/cpu/cpu_threads.h"
#include "engine/model.h"
#include "engine/model_rules.h"
#include "engine/session.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/background_fingerprint.h"
#include "server/bearer_token_config.h"
#include "server/drt_service.h"
#include "server/engine_watchdog.h"
#include "server/failed_call_log.h"
#include "server/grpc_keepalive.h"
#include "server/host_memory.h"
#include "server/http_endpoint.h"
#include "server/metrics.h"
#include "server/openai_http_server.h"
#include "server/quarantine_usage.h"
#include "server/request_parsing.h"
#include "server/restore_progress.h"
#include "server/server_credentials.h"
#include "server/server_flags.h"
#include "server/session_manager.h"
#include "server/startup_signals.h"
#include "server/state_store.h"

namespace drt::server {
namespace {

// At the end of the grace period running calls end at their next engine
// step (one token, or a few thousand prompt tokens) with UNAVAILABLE; after
// this much longer gRPC cancels what is left.
constexpr int64_t kStopSlackSeconds = 5;
// Handlers get this much longer than grace + stop slack to return before the
// process gives up on a clean exit.
constexpr int64_t kForcedExitSlackSeconds = 15;
// The most threads the OpenAI HTTP API's pool gets (--max_sessions + 4 below that).
constexpr int64_t kMaxOpenAiThreads = 1024;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "drt-server: error: %s\n", std::string(status.message()).c_str());
  return 1;
}

sigset_t ShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}

// The main thread, for ForwardToMainThread. Written once in main, before
// the handler is installed, and only read afterwards (a signal handler can
// reach nothing but a global).
pthread_t g_main_thread;

// Runs only in a thread that has the shutdown signals unblocked: one started
// by a library before main (OpenBLAS starts its pool from a constructor).
// Without it the signal's default action would kill the process whenever the
// kernel picks such a thread, which it does while the main thread is not
// inside sigwait (for instance between the "listening" line and sigwait).
// pthread_kill is async-signal-safe (signal-safety(7)).
void ForwardToMainThread(int signal) { pthread_kill(g_main_thread, signal); }

void ForwardShutdownSignalsToMainThread(const sigset_t& signals) {
  g_main_thread = pthread_self();
  struct sigaction action = {};
  action.sa_handler = ForwardToMainThread;
  action.sa_mask = signals;
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGTERM, SIGINT}) {
    if (sigismember(&signals, signal) == 1) sigaction(signal, &action, nullptr);
  }
}

int WaitForSignal(const sigset_t& signals) {
  int signal = 0;
  while (sigwait(&signals, &signal) != 0) {
  }
  return signal;
}

// The model's name as clients see it: the model directory's last component.
std::string ModelName(const std::string& dir) {
  std::error_code error;
  std::filesystem::path path = std::filesystem::absolute(dir, error).lexically_normal();
  if (error) path = std::filesystem::path(dir).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  return path.filename().string();
}

// Waits, in the calling thread, until `drained` is set (true), or a second
// SIGTERM/SIGINT arrives or `limit` passes (false). Kept in the main thread,
// where ForwardToMainThread sends the signals other threads catch.
bool WaitUntilDrained(const sigset_t& signals, const std::atomic<bool>& drained,
                      std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  const timespec poll = {0, 50'000'000};
  while (!drained.load()) {
    if (sigtimedwait(&signals, nullptr, &poll) > 0) {
      std::fprintf(stderr, "drt-server: second signal, exiting without draining\n");
      return false;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "drt-server: calls still running after the grace period, exiting\n");
      return false;
    }
  }
  return true;
}

// --state_dir: the directory opened, checked and locked; refused when the
// backend cannot export session state.
absl::StatusOr<std::unique_ptr<StateStore>> OpenStateStore(const StateStoreOptions& options,
                                                           Backend& backend) {
  auto probe = Session::Create(backend);
  if (!probe.ok()) return probe.status();
  if (auto state = (*probe)->ExportState(); !state.ok()) {
    return absl::Status(state.status().code(),
                        absl::StrCat("--state_dir needs a backend that can export session state; ",
                                     backend.name(), " cannot: ", state.status().message()));
  }
  return StateStore::Open(options, backend.config());
}

// Reads every durable session back into `sessions` before the server
// listens: all of a session or, when its files are damaged, none of it
// (moved to DIR/quarantine/ and named on stderr). `progress` follows it (the
// HTTP endpoint serves it meanwhile).
absl::Status RestoreSessions(StateStore& store, Backend& backend, SessionManager& sessions,
                             RestoreProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  // (More sessions than --max_sessions: refused before any is read in.)
  // (A session the disk tier cannot map completely keeps what it mapped and
  // reads the rest into memory only when that fits the host budget beside
  // those restored before it.)
  auto report = store.RestoreAll(backend, sessions.limits().max_sessions,
                                 sessions.limits().host_memory_budget_bytes, &progress);
  if (!report.ok()) return report.status();
  for (const std::string& line : report->quarantined) {
    std::fprintf(stderr, "drt-server: %s\n", line.c_str());
  }
  // Attached first, so that the adopted sessions are written like new ones.
  sessions.AttachStateStore(&store);
  int64_t tokens = 0;
  const size_t restored = report->sessions.size();
  for (StateStore::Restored& r : report->sessions) {
    tokens += r.session->num_tokens();
    auto entry = sessions.Adopt(r.id, r.settings, std::move(r.session));
    if (!entry.ok()) return entry.status();
  }
  std::fprintf(stderr,
               "drt-server: state %s (sync %s): restored %zu sessions, %lld tokens in %.3f s; %zu "
               "quarantined, %lld chunk log tails cut\n",
               store.dir().c_str(), store.sync() == StateSync::kStep ? "step" : "interval",
               restored, static_cast<long long>(tokens),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
               report->quarantined.size(), static_cast<long long>(report->torn_tails_truncated));
  // Nothing deletes DIR/quarantine/: what it keeps on the volume, said at
  // every start (this one's refusals included) and on /metrics.
  if (absl::StatusOr<QuarantineUsage> usage = ReadQuarantineUsage(store.dir()); !usage.ok()) {
    std::fprintf(stderr, "drt-server: %s\n", std::string(usage.status().message()).c_str());
  } else if (usage->sessions > 0) {
    std::fprintf(stderr,
                 "drt-server: %s/quarantine/ holds %lld refused sessions, %lld MiB; nothing "
                 "deletes them (docs/deploy.md, \"Quarantined sessions\")\n",
                 store.dir().c_str(), static_cast<long long>(usage->sessions),
                 static_cast<long long>(usage->bytes >> 20));
  }
  // Restored sessions are not refused for the host memory budget (that
  // would lose them). They may hold more than it for two reasons: a restart
  // with a smaller budget, and forks, which restore each with its own copy
  // of the chunks they shared with their parent or siblings in memory
  // before the restart (StateStore::RestoreReport::sessions_sharing_chunk_logs;
  // review-serverfix F2). Said here, once, with the figures.
  const int64_t held = sessions.TotalHostBytes();
  const int64_t budget = sessions.limits().host_memory_budget_bytes;
  std::fprintf(stderr, "drt-server: restored sessions hold %lld MiB of host memory (budget %lld MiB)\n",
               static_cast<long long>(held >> 20), static_cast<long long>(budget >> 20));
  const int64_t forks = report->sessions_sharing_chunk_logs;
  if (forks > 0) {
    std::fprintf(stderr,
                 "drt-server: %lld restored sessions are forks (or parents of forks) that shared "
                 "chunks in memory before the restart; a restart restores each with its own copy "
                 "of them (the chunks the disk tier maps excepted), so they hold and count "
                 "those chunks once each now, not once in all\n",
                 static_cast<long long>(forks));
  }
  if (held > budget) {
    std::fprintf(stderr,
                 "drt-server: WARNING: the restored sessions hold more host memory than "
                 "--host_memory_budget_gb allows (%lld MiB > %lld MiB, %s): every Append, "
                 "ForkSession and LoadSession is refused until sessions are deleted or the budget "
                 "is raised\n",
                 static_cast<long long>(held >> 20), static_cast<long long>(budget >> 20),
                 forks > 0 ? "forks restored without sharing their chunks, see above, or a "
                             "smaller budget than before the restart"
                           : "a smaller budget than before the restart");
  }
  return absl::OkStatus();
}

// What start-up makes, in the order it makes them (destroyed in reverse:
// the service first, the model last). The metrics it records into are
// Run's, which the HTTP endpoint serves from before start-up ends.
struct Started {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  ServiceOptions service_options;
  std::unique_ptr<StateStore> state_store;
  std::unique_ptr<BackgroundFingerprint> background_fingerprint;
  std::unique_ptr<DrtService> service;
};

// Everything before the server listens for gRPC: the model, the backend,
// the HTTP endpoint (--http_listen; started before the restore, so that
// /livez, /healthz and /metrics answer while it runs: review-deploy F5), the
// state directory's sessions. Runs on a thread of its own
// (RunStartUpUnlessSignalled) and says what it is doing in `phase`.
absl::StatusOr<std::unique_ptr<Started>> StartUp(const ServerConfig& config, StartupPhase& phase,
                                                 Metrics& metrics, HttpEndpoint& http,
                                                 RestoreProgress& restore_progress) {
  auto started = std::make_unique<Started>();
  auto credentials = MakeServerCredentials(config.tls_cert_path, config.tls_key_path);
  if (!credentials.ok()) return credentials.status();
  started->credentials = *std::move(credentials);

  phase.Set(absl::StrCat("loading the model in ", config.model_dir));
  auto model = LoadModel(config.model_dir);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("cannot load the model in '", config.model_dir,
                                     "': ", model.status().message()));
  }
  started->model = *std::move(model);
  const Model& loaded = *started->model;
  BackendOptions backend_options;
  absl::StatusOr<Device> device = ParseDevice(config.device);
  if (!device.ok()) return device.status();
  backend_options.device = *device;
  // --threads=0: the CPUs this process may use (a container's quota, not
  // the host's CPUs; engine/cpu/cpu_threads.h), said once the backend is
  // known to be the CPU's.
  std::string threads_why = "--threads";
  backend_options.cpu.num_threads = config.threads;
  if (config.threads == 0) {
    const cpu::CpuThreads threads = cpu::DefaultCpuThreads();
    backend_options.cpu.num_threads = threads.threads;
    threads_why = absl::StrCat("--threads=0: ", threads.why);
  }
  backend_options.cpu.mixed_lower_only_forwards = config.mixed_lower_only_forwards;
  backend_options.cuda.device_index = config.cuda_device;
  backend_options.cuda.precision = config.cuda_precision;
  backend_options.cuda.state_export = config.cuda_state_export;
  backend_options.cuda.chunk_store = config.cuda_chunk_store;
  backend_options.cuda.chunk_tier = config.cuda_chunk_tier;
  // auto sizes each session's device store for the largest context a
  // session may reach.
  backend_options.cuda.auto_tier_max_tokens = config.service.max_context_tokens;
  backend_options.cuda.batched_step_rows = config.cuda_batched_step_rows;
  backend_options.cuda.decode_graphs = config.cuda_decode_graphs;
  backend_options.cuda.decode_fused_gemv = config.cuda_decode_fused_gemv;
  if (config.service.step_tokens > 0) {
    // One knob: the scheduler's step budget is also the backend's forward
    // size, in decoder positions (whole chunks, landmarks included).
    const int64_t positions = StepPositionsForTokens(loaded.config(), config.service.step_tokens);
    backend_options.cpu.max_step_positions = positions;
    backend_options.cuda.max_step_positions = positions;
  }
  phase.Set("starting the backend");
  absl::StatusOr<std::unique_ptr<Backend>> made_backend =
      MakeBackend(loaded.config(), loaded.weights(), backend_options);
  if (!made_backend.ok()) {
    if (config.device_note.empty() || config.device != "cuda") return made_backend.status();
    // auto chose the GPU; say so, and how to get the CPU.
    return absl::Status(made_backend.status().code(),
                        absl::StrCat(made_backend.status().message(), " (", config.device_note,
                                     "; --device=cpu uses the CPU)"));
  }
  started->backend = *std::move(made_backend);
  Backend& backend = *started->backend;
  std::fprintf(stderr, "drt-server: backend %s, %s storage\n", backend.name().c_str(),
               config.service.precision.c_str());
  if (backend.name() == "cpu") {
    std::fprintf(stderr, "drt-server: %d CPU threads (%s)\n", backend_options.cpu.num_threads,
                 threads_why.c_str());
  }

  metrics.SetBackend(backend.name(), config.service.precision);
  ServiceOptions& service_options = started->service_options;
  service_options = config.service;
  service_options.model_name = ModelName(config.model_dir);
  {
    // Read now, with the weights loaded, so that they are not counted twice;
    // the budget in force is said with its source, and a flag's value above
    // the usable memory is warned about.
    absl::StatusOr<HostBudget> budget =
        ChooseHostBudget(service_options.host_memory_budget_bytes, ReadMemorySnapshot());
    if (!budget.ok()) return budget.status();
    service_options.host_memory_budget_bytes = budget->bytes;
    for (const std::string& line : budget->log_lines) {
      std::fprintf(stderr, "drt-server: %s\n", line.c_str());
    }
  }
  {
    // --prefix_cache_bytes -1: a quarter of the budget (docs/deploy.md); on
    // --device cuda the flags' parse made it 0 already (PrefixCacheBytesForDevice).
    PrefixCacheLimits& cache = service_options.prefix_cache;
    if (cache.max_bytes < 0) cache.max_bytes = service_options.host_memory_budget_bytes / 4;
    if (cache.max_bytes > 0 && cache.max_entries > 0) {
      std::fprintf(stderr,
                   "drt-server: prefix cache: up to %lld snapshots, %lld MiB "
                   "(--prefix_cache_entries, --prefix_cache_bytes)\n",
                   static_cast<long long>(cache.max_entries),
                   static_cast<long long>(cache.max_bytes >> 20));
    } else {
      std::fprintf(stderr, "drt-server: prefix cache off\n");
    }
  }
  if (const std::string& files = service_options.session_files_dir;
      !files.empty() && !std::filesystem::is_directory(files)) {
    return absl::NotFoundError(absl::StrCat("--session_files_dir ", files, " is not a directory"));
  }
  // Opened before the service, so that it outlives the sessions that write to it.
  if (!config.state.dir.empty()) {
    phase.Set(absl::StrCat("opening the state directory ", config.state.dir));
    auto store = OpenStateStore(config.state, backend);
    if (!store.ok()) return store.status();
    started->state_store = *std::move(store);
    // Every write of a durable session carries the model's fingerprint,
    // which reads the whole weights file once (engine/model_fingerprint.h):
    // taken now, before the server listens, not in the first call that
    // writes. Without --state_dir it waits for a SaveSession or LoadSession.
    phase.Set("reading the model fingerprint");
    const auto fingerprint_start = std::chrono::steady_clock::now();
    const absl::StatusOr<uint32_t> fingerprint = backend.config().model_fingerprint();
    if (!fingerprint.ok()) return fingerprint.status();
    std::fprintf(stderr, "drt-server: model fingerprint %08x (%.2f s)\n", *fingerprint,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                               fingerprint_start)
                     .count());
  }
  // With SaveSession/LoadSession but no --state_dir, the fingerprint is
  // read now on a thread of its own, so that the first such call does not
  // read the whole weights file (server/background_fingerprint.h).
  if (config.state.dir.empty() && !service_options.session_files_dir.empty()) {
    started->background_fingerprint =
        std::make_unique<BackgroundFingerprint>(backend.config().fingerprint);
  }
  started->service = std::make_unique<DrtService>(loaded, backend, metrics, service_options);
  if (config.http.has_value()) {
    // /healthz and /readyz answer 503 until gRPC listens (Run).
    http.SetStarting(started->state_store != nullptr ? "restoring" : "starting");
    if (absl::Status s = http.Start(config.http->host, config.http->port); !s.ok()) return s;
    std::fprintf(stderr,
                 "drt-server: HTTP endpoint on %s: /livez answers, /healthz and /readyz answer "
                 "503 \"%s\" until the server listens for gRPC\n",
                 FormatHostPort({config.http->host, http.port()}).c_str(),
                 started->state_store != nullptr ? "restoring" : "starting");
  }
  if (started->state_store != nullptr) {
    phase.Set(absl::StrCat("restoring the sessions in ", config.state.dir));
    if (absl::Status s = RestoreSessions(*started->state_store, backend,
                                         started->service->session_manager(), restore_progress);
        !s.ok()) {
      return s;
    }
    http.SetStarting("starting");
  }
  return started;
}

// Tests only (tests/server/startup_signal_test.cc): DRT_TEST_RESTORE_DELAY_MS
// holds the restore of each --state_dir session that long, after a line on
// stderr, so that a test can signal the process in the middle of a restore.
void AddRestoreDelayForTests(StateStoreOptions& state) {
  const char* value = std::getenv("DRT_TEST_RESTORE_DELAY_MS");
  int64_t ms = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &ms) || ms <= 0) return;
  state.restore_io_for_test = [ms](std::string_view id, ChunkMapper&, ChunkReader&) {
    std::fprintf(stderr,
                 "drt-server: DRT_TEST_RESTORE_DELAY_MS: restoring session %.*s in %lld ms\n",
                 static_cast<int>(id.size()), id.data(), static_cast<long long>(ms));
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  };
}

int Run(const ServerConfig& config, const sigset_t& signals) {
  if (!config.device_note.empty()) std::fprintf(stderr, "drt-server: %s\n", config.device_note.c_str());
  if (!config.cuda_flags_note.empty()) {
    std::fprintf(stderr, "drt-server: %s\n", config.cuda_flags_note.c_str());
  }
  if (!config.prefix_cache_note.empty()) {
    std::fprintf(stderr, "drt-server: %s\n", config.prefix_cache_note.c_str());
  }
  for (const std::string& note : config.deprecation_notes) {
    std::fprintf(stderr, "drt-server: %s\n", note.c_str());
  }
  std::fprintf(stderr, "drt-server: %s\n", BearerTokenLogLine(config.service.bearer_token).c_str());

  // Start-up runs on a thread of its own so that this thread, where the
  // shutdown signals arrive, can end the process when one comes before the
  // server listens (review-deploy #10; server/startup_signals.h).
  StartupPhase phase;
  // The HTTP endpoint is made here and started by start-up, before the
  // --state_dir restore: until the service exists, /livez follows the
  // restore's progress (RestoreLiveness) and /metrics shows it.
  Metrics metrics;
  RestoreProgress restore_progress;
  std::atomic<DrtService*> live_service{nullptr};
  std::atomic<OpenAiHttpServer*> openai_for_metrics{nullptr};
  const std::chrono::milliseconds stall_limit =
      std::chrono::seconds(config.engine_stall_seconds);
  HttpEndpointOptions http_options;
  http_options.liveness = [&live_service, &restore_progress, stall_limit] {
    const auto now = std::chrono::steady_clock::now();
    if (DrtService* service = live_service.load()) {
      return EngineLiveness(service->engine_progress(), now, stall_limit);
    }
    return RestoreLiveness(restore_progress, now, stall_limit);
  };
  http_options.more_metrics = [&restore_progress, &openai_for_metrics, &config] {
    std::string text = RenderRestoreMetrics(restore_progress);
    // Read at each scrape: an operator may empty DIR/quarantine/ while the
    // server runs (a few directory entries; an error leaves the gauges out).
    if (!config.state.dir.empty()) {
      if (absl::StatusOr<QuarantineUsage> usage = ReadQuarantineUsage(config.state.dir);
          usage.ok()) {
        text += RenderQuarantineMetrics(*usage);
      }
    }
    if (OpenAiHttpServer* openai = openai_for_metrics.load()) text += openai->RenderMetrics();
    return text;
  };
  HttpEndpoint http(metrics, http_options);
  // Stops the endpoint, whose handlers read what is declared after it,
  // before that goes (declared after each such thing; Stop is idempotent).
  struct StopHttp {
    HttpEndpoint& http;
    ~StopHttp() { http.Stop(); }
  };
  absl::StatusOr<std::unique_ptr<Started>> made = absl::InternalError("start-up did not run");
  StopHttp stop_http_before_service{http};
  RunStartUpUnlessSignalled(
      [&] { made = StartUp(config, phase, metrics, http, restore_progress); }, signals, phase);
  if (!made.ok()) return Fail(made.status());
  Started& started = **made;
  DrtService& service = *started.service;
  live_service.store(&service);
  const ServiceOptions& service_options = started.service_options;

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(config.grpc_address, started.credentials, &grpc_port);
  // gRPC sets SO_REUSEPORT by default, which would let a second server share
  // a busy port silently instead of failing with "address in use".
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  AddKeepaliveArguments(builder);
  // Above --max_message_bytes, so that the service sees a message somewhat
  // over it and refuses it by name (server/request_parsing.h).
  builder.SetMaxReceiveMessageSize(GrpcReceiveLimit(config.max_message_bytes));
  builder.SetMaxSendMessageSize(config.max_message_bytes);
  builder.RegisterService(&service);
  // A line on stderr for each call that ends INTERNAL, DATA_LOSS or UNKNOWN
  // (server/failed_call_log.h); declared before the server, which it outlives.
  FailedCallLog failed_calls(
      [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); },
      [] { return std::chrono::steady_clock::now(); });
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  AccessLogSink access_log;  // --log_requests: a line for every call
  if (config.log_requests) {
    access_log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  }
  interceptors.push_back(MakeFailedCallLogInterceptor(&failed_calls, std::move(access_log)));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    const bool tls = !config.tls_cert_path.empty();
    return Fail(absl::UnavailableError(absl::StrCat(
        "cannot listen for gRPC on ", config.grpc_address, " (address in use or not local?",
        tls ? " or a TLS certificate and key that do not match?" : "",
        " gRPC's log above says which)")));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(drt::v1::Drt::service_full_name(), true);
  health->SetServingStatus(kEngineHealthService, true);
  health->SetServingStatus(true);
  // Liveness of the engine (server/engine_watchdog.h): the gRPC service
  // kEngineHealthService follows it; "" and drt.v1.Drt follow the drain.
  std::unique_ptr<EngineWatchdog> watchdog;
  if (stall_limit.count() > 0) {
    watchdog = std::make_unique<EngineWatchdog>(
        [&service] { return service.engine_progress(); }, stall_limit,
        std::chrono::milliseconds(1000), [health](bool live) {
          if (!live) std::fprintf(stderr, "drt-server: engine stuck: liveness fails\n");
          health->SetServingStatus(kEngineHealthService, live);
        });
  }

  // The OpenAI-compatible API calls this server's own service in-process,
  // so every gRPC rule (auth, limits, scheduling, metrics, the drain)
  // applies to it as to any client.
  OpenAiHttpOptions openai_options;
  openai_options.model_name = service_options.model_name;
  openai_options.bearer_token = service_options.bearer_token;
  // (A running completion holds a session per choice, so at most
  // --max_sessions run at once, fewer with n > 1; the 4 more answer what
  // needs no session. Capped: threads start as connections need them, but a
  // large --max_sessions should not allow that many at once.)
  openai_options.threads =
      static_cast<size_t>(std::min<int64_t>(service_options.max_sessions + 4, kMaxOpenAiThreads));
  openai_options.request_read_timeout =
      std::chrono::seconds(config.openai_request_timeout_seconds);
  openai_options.max_request_bytes = static_cast<size_t>(config.openai_max_request_bytes);
  openai_options.max_inflight_request_bytes =
      static_cast<size_t>(config.openai_max_inflight_request_bytes);
  // (The probe endpoint's /metrics reads its counters from now on; the
  // endpoint stops before it is destroyed, stop_http_before_openai.)
  // The client side of that channel takes answers of any size (gRPC's
  // default is 4 MiB): a /tokenize answer is bounded by the server's
  // --max_message_bytes, which it sends under.
  grpc::ChannelArguments openai_channel_args;
  openai_channel_args.SetMaxReceiveMessageSize(-1);
  OpenAiHttpServer openai(server->InProcessChannel(openai_channel_args), openai_options);
  StopHttp stop_http_before_openai{http};
  if (config.openai.has_value()) openai_for_metrics.store(&openai);
  std::string http_address = "disabled";
  if (config.http.has_value()) {
    http_address = FormatHostPort({config.http->host, http.port()});
  }

  std::string openai_address;
  if (config.openai.has_value()) {
    if (absl::Status started = openai.Start(config.openai->host, config.openai->port);
        !started.ok()) {
      http.Stop();
      server->Shutdown(std::chrono::system_clock::now());
      return Fail(started);
    }
    openai_address = FormatHostPort({config.openai->host, openai.port()});
  }

  std::string grpc_address = config.grpc_address;
  if (auto parsed = ParseHostPort(config.grpc_address); parsed.ok()) {
    grpc_address = FormatHostPort({parsed->host, grpc_port});
  }
  http.SetServing();  // gRPC listens: /healthz and /readyz answer 200
  std::printf("drt-server listening on %s (grpc), %s (http), %smodel %s\n", grpc_address.c_str(),
              http_address.c_str(),
              openai_address.empty() ? "" : (openai_address + " (openai), ").c_str(),
              service_options.model_name.c_str());
  std::fflush(stdout);

  const int signal = WaitForSignal(signals);
  std::fprintf(stderr, "drt-server: %s, draining (grace %lld s)\n", strsignal(signal),
               static_cast<long long>(config.shutdown_grace_seconds));
  const std::chrono::seconds grace(config.shutdown_grace_seconds);
  watchdog.reset();  // the drain owns the health status from here
  health->SetServingStatus(false);
  service.StartDraining();
  http.StartDraining();
  openai.StartDraining();
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    // gRPC keeps listening through the grace period, so that a call made now
    // gets the service's UNAVAILABLE "the server is shutting down" rather
    // than "Connection refused"; running calls go on until they end or the
    // grace period does.
    service.WaitForRunningCalls(std::chrono::steady_clock::now() + grace);
    // Then the calls still running end at their next engine step with
    // UNAVAILABLE, gRPC stops listening, and what has not ended after the
    // slack (a call waiting for its client's next message) gRPC cancels.
    const auto stop_by = std::chrono::steady_clock::now() + std::chrono::seconds(kStopSlackSeconds);
    const auto shutdown_by =
        std::chrono::system_clock::now() + std::chrono::seconds(kStopSlackSeconds);
    service.StopRunningCalls();
    // The calls that end at their next step end with the service's
    // UNAVAILABLE "the server is shutting down ... retry on another
    // replica"; the OpenAI API's handlers read that status unless gRPC's
    // Shutdown closes the in-process transport first ("Transport closed").
    // So, within the same slack, wait for them before shutting down.
    openai.WaitForCalls(stop_by);
    server->Shutdown(shutdown_by);
    server->Wait();
    drained.store(true);
  });
  if (!WaitUntilDrained(signals, drained,
                        grace + std::chrono::seconds(kStopSlackSeconds + kForcedExitSlackSeconds))) {
    _exit(1);  // handlers may still run; no destructors
  }
  drainer.join();
  // Its requests ended with the gRPC server (their calls, in-process, were
  // drained like any other), so this only closes the listener.
  openai.Stop();
  http.Stop();
  std::fprintf(stderr, "drt-server: stopped\n");
  return 0;
}

}  // namespace
}  // namespace drt::server

int main(int argc, char** argv) {
  // Blocked before this program starts any thread, so all of them inherit the
  // mask and the signals reach the main thread's waits in Run (during
  // start-up, RunStartUpUnlessSignalled; then sigwait): no handler runs in
  // them.
  // Threads that libraries start before main (OpenBLAS's) keep them
  // unblocked; a signal the kernel hands to one of those is forwarded to the
  // main thread (ForwardToMainThread), where it stays pending until sigwait.
  const sigset_t signals = drt::server::ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  drt::server::ForwardShutdownSignalsToMainThread(signals);

  auto config = drt::server::ParseServerFlags(argc, argv);
  if (!config.ok()) return drt::server::Fail(config.status());
  drt::server::AddRestoreDelayForTests(config->state);
  return drt::server::Run(*config, signals);
}

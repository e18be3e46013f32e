#include "server/server_flags.h"

#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/types/span.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/command_line.h"
#include "engine/backend_factory.h"
#include "server/bearer_token_config.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051",
          "gRPC address, host:port ([::]:port for IPv6, port 0 picks a free port) or "
          "unix:/path/to/socket");
ABSL_FLAG(std::string, http_listen, "0.0.0.0:9090",
          "HTTP address for GET /metrics (Prometheus), GET /healthz and /readyz (readiness) and "
          "GET /livez (liveness), host:port; empty disables the HTTP endpoint. It answers from "
          "before a --state_dir restore: /livez 200 and /healthz 503 \"restoring\" until it ends, "
          "with its progress on /metrics");
ABSL_FLAG(std::string, openai_listen, "",
          "address for the OpenAI-compatible HTTP API (POST /v1/completions, GET /v1/models, "
          "POST /tokenize and /detokenize, GET /health), host:port; empty (the default) turns "
          "it off. Not the --http_listen endpoint: its answers may stream for as long as "
          "generation runs");
ABSL_FLAG(int64_t, openai_request_timeout_seconds,
          drt::server::ServerConfig{}.openai_request_timeout_seconds,
          "time an OpenAI API connection has, from its accept, to send its whole request (the "
          "headers within min(10 s, this), then the body); then it is closed, so a stalled or "
          "slow body holds a serving thread at most this long. 1 to 3600; the default, 30 s, "
          "takes the largest body accepted (64 MiB) at 18 Mbit/s or more");
ABSL_FLAG(std::string, model, "",
          "model directory (config.json, model.safetensors, optional tokenizer.json); required");
ABSL_FLAG(std::string, device, "auto",
          "compute device: cpu, cuda, or auto (the default). auto picks cuda when this build has the CUDA "
          "backend and GPU --cuda_device is visible, and cpu otherwise (the log says which and "
          "why); cuda fails at startup when this build has no CUDA backend or no GPU is found");
ABSL_FLAG(int32_t, cuda_device, 0, "index of the GPU the CUDA backend uses");
ABSL_FLAG(std::string, cuda_precision, "bf16",
          "number format of the CUDA backend: bf16 (fast) or fp32 (fp32 storage and GEMMs "
          "without TF32: the CPU backend's logits within 1e-4 relative)");
ABSL_FLAG(bool, cuda_batched_step_rows, false,
          "CUDA only: runs the row-wise work of all sessions of a step as one op over "
          "step-wide buffers (one GEMM for the decode rows of N sessions). Written but not yet "
          "run on a GPU, so off by default (docs/cuda.md, \"Batched steps\")");
ABSL_FLAG(bool, cuda_decode_graphs, false,
          "CUDA only: a session's decode steps (one token, no chunk closed) replay a captured "
          "CUDA graph instead of launching each kernel. Written but not yet run on a GPU, so "
          "off by default (docs/cuda.md, \"Decode graphs\")");
ABSL_FLAG(bool, cuda_decode_fused_gemv, false,
          "CUDA only: decode-sized slices (at most 8 rows) run fused GEMV kernels (the RMSNorm "
          "in the projection's prologue, SwiGLU and residual adds in epilogues) instead of "
          "norm + cuBLAS launches. Written but not yet run on a GPU, so off by default "
          "(docs/cuda.md, \"Fused decode GEMVs\")");
ABSL_FLAG(std::string, cuda_chunk_store, "kv",
          "CUDA only: what the pinned host chunk store keeps per closed chunk: kv (keys and "
          "values, the default) or encoder_rows (the encoder output C: half the host memory "
          "and host->device bytes; K/V are made on the GPU after each fetch by two GEMMs). "
          "encoder_rows is written but not yet run on a GPU (docs/cuda.md, \"Chunk store of "
          "C\"). --cuda_state_export selects encoder_rows (the state format holds a chunk's "
          "encoder rows)");
ABSL_FLAG(std::string, cuda_chunk_tier, "host",
          "CUDA only: where closed chunks' keys and values live: host (the pinned host "
          "chunk store, fetched to the GPU per landmark; the default), device (a device "
          "store per session, read in place by GCA: no host memory per chunk, no "
          "host->device fetches) or auto (per session at creation: device when a store for "
          "--max_context_tokens still fits beside the stores granted before (all sessions' "
          "stores together get 90% of the GPU memory free after the weights, and the GPU "
          "keeps 10% of it free for everything else), else host). device and auto need --cuda_chunk_store=kv and no --cuda_state_export. "
          "Written but NOT YET RUN ON A GPU, hence host by default (docs/cuda.md, \"Device "
          "tier\")");
ABSL_FLAG(bool, cuda_state_export, false,
          "lets the CUDA backend export and import session state, which --state_dir "
          "(durable sessions) and SaveSession/LoadSession need. Written but not yet run on a "
          "GPU, so off by default (docs/state_format.md); without it those are refused with "
          "--device cuda");
ABSL_FLAG(int32_t, threads, 0,
          "CPU backend threads (0: the CPUs this process may use, the smallest of the host's, "
          "the affinity mask's and the cgroup CPU quota's)");
ABSL_FLAG(bool, mixed_lower_only_forwards, true,
          "CPU backend: a prefill slice whose rows lie more than the upper-layer reach before "
          "the end of its message runs only the lower layers also in a step beside slices "
          "that run every layer (a generated token), and a piece with tokens following gets "
          "no logits (docs/batching.md, \"Lower-only slices in mixed steps\"). false: a "
          "forward skips the upper layers only when all of it may, as before; for rollback "
          "and A/B comparisons (docs/api.md, Scheduling). No effect with --device cuda, which "
          "runs neither");
ABSL_FLAG(double, host_memory_budget_gb, 0,
          "host memory all sessions may hold together, in GiB (2^30 bytes); sessions that "
          "would exceed it get RESOURCE_EXHAUSTED. 0: 3/4 of the memory available when the "
          "server starts, after the model is loaded (MemAvailable, or less under a cgroup "
          "memory limit)");
ABSL_FLAG(int64_t, max_sessions, drt::server::ServiceOptions{}.max_sessions,
          "sessions open at once");
ABSL_FLAG(int64_t, prefix_cache_bytes, -1,
          "host bytes the prefix cache's snapshots of Complete prompts (and so of OpenAI API "
          "requests) may hold: a later prompt that begins with a snapshot's tokens prefills "
          "only the rest (docs/api.md, \"Prefix reuse\"). Snapshots are evicted, least "
          "recently used first, before any request is refused for host memory. -1 (the "
          "default): a quarter of the host memory budget on --device cpu, 0 on --device cuda "
          "(there snapshots also hold GPU memory this does not bound: docs/cuda.md); 0: no "
          "cache");
ABSL_FLAG(int64_t, prefix_cache_entries, 32,
          "snapshots the prefix cache keeps at most (outside --max_sessions); 0: no cache");
ABSL_FLAG(int64_t, max_context_tokens, drt::server::ServiceOptions{}.max_context_tokens,
          "tokens one session may hold (CreateSession may ask for less). The default, 2^32, "
          "leaves memory (--host_memory_budget_gb) as the real limit");
ABSL_FLAG(int64_t, idle_ttl_seconds, drt::server::ServiceOptions{}.idle_ttl_seconds,
          "a session unused this long is deleted (default; CreateSession may ask for less)");
ABSL_FLAG(int64_t, openai_max_request_bytes, drt::server::ServerConfig{}.openai_max_request_bytes,
          "largest OpenAI API request body, in bytes; a larger one gets 413 naming this flag. "
          "Parsing a body's JSON can take up to about 33 times its size (deeply nested "
          "arrays), so it also bounds that: lower it when no long prompts are sent (1M "
          "prompt bytes, or 1M token ids as JSON, about 7 MB, fit in 8 MiB)");
ABSL_FLAG(int64_t, openai_max_inflight_request_bytes,
          drt::server::ServerConfig{}.openai_max_inflight_request_bytes,
          "bytes of OpenAI API request bodies parsed at once (each counted once read), at least "
          "--openai_max_request_bytes; a request whose body does not fit beside those gets 503 "
          "with Retry-After at once (not queued). Size the host for about 33 times this on top "
          "of --host_memory_budget_gb and the model (docs/deploy.md, Resources)");
ABSL_FLAG(int32_t, max_message_bytes,
          static_cast<int32_t>(drt::server::ServiceOptions{}.max_message_bytes),
          "largest gRPC message received or sent, in bytes. A larger request message is "
          "refused by name (INVALID_ARGUMENT); gRPC itself reads messages up to twice this, "
          "and refuses a larger one with its own RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain file; with --tls_key enables TLS (otherwise plaintext)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key file for --tls_cert");
ABSL_FLAG(std::string, bearer_token, "",
          "when set, every call must carry metadata 'authorization: Bearer <token>'. "
          "Prefer the environment variable DRT_BEARER_TOKEN, which is used when this flag is "
          "empty and does not show in the process list. Refused at start with leading or "
          "trailing whitespace, a control character (a newline from a file) or a byte outside "
          "printable ASCII: no client could send it");
ABSL_FLAG(bool, require_bearer_token, false,
          "refuse to start without a non-empty bearer token (--bearer_token or "
          "DRT_BEARER_TOKEN), so that an empty or missing secret cannot leave the server open "
          "to every caller; the shipped Kubernetes manifests set it");
ABSL_FLAG(int64_t, shutdown_grace_seconds, 10,
          "on SIGTERM/SIGINT, running streams get this long to finish before they are "
          "cancelled");
ABSL_FLAG(int64_t, engine_stall_seconds, 300,
          "liveness (grpc.health.v1 service drt.v1.Drt.engine, GET /livez) fails once work has "
          "been queued this long with no engine step finished: a stuck engine (hung kernel, "
          "deadlock). Well above the longest legitimate step (about 90 s for a 1M-token step "
          "on the CPU backend at 11K tokens/s); 0: never fails; at most 10^9. Readiness is not "
          "affected (docs/deploy.md, Probes)");
ABSL_FLAG(int64_t, step_tokens, 0,
          "the step size, the one knob of it: tokens per engine step, shared by the sessions in "
          "it; it also sets the backend's forward size (these tokens with their landmarks, whole "
          "chunks). 0: the backend's own (1008 tokens, 1024 positions); at most 1048576. Larger "
          "steps ingest long prompts with less overhead per token and take more memory; every "
          "waiting generated token joins the next step only up to this many (docs/api.md, "
          "Scheduling)");
ABSL_FLAG(double, decode_slowdown_limit, drt::server::kDefaultDecodeSlowdownLimit,
          "a step that carries generated tokens takes only as many prefill tokens (at least "
          "one) as keep its predicted time within this many times a decode-only step, from "
          "the measured times of recent steps: a generating session's time per token while "
          "others prefill stays within about this factor of idle, and prefill keeps about "
          "(limit - 1) / limit of the engine meanwhile. At least 1; 0 turns the time limit "
          "off (docs/api.md, Scheduling)");
ABSL_FLAG(int64_t, decode_step_prefill_tokens, drt::server::kNoPrefillTokenCap,
          "a fixed cap on the prefill tokens of a step that carries generated tokens, on top "
          "of --decode_slowdown_limit; -1 (default): no cap. 0: such steps carry no prefill, "
          "so prefill moves only while no generated token waits. (Before "
          "--decode_slowdown_limit this was the only bound, default 63; "
          "--decode_slowdown_limit=0 --decode_step_prefill_tokens=63 is that policy)");
ABSL_FLAG(int32_t, compute_workers, 0,
          "deprecated and ignored: one engine thread now forms batched steps over all "
          "sessions (docs/api.md, Scheduling); --threads sets the CPU backend's threads");
ABSL_FLAG(std::string, session_files_dir, "",
          "directory where SaveSession writes and LoadSession reads session files (one session "
          "per file, movable between replicas of the same model); empty: both RPCs refused");
ABSL_FLAG(std::string, state_dir, "",
          "durable sessions: keep every session's state in this directory (created if "
          "missing, not its parents) and restore them all at start-up; empty: sessions live "
          "in memory only (docs/state_format.md), and --state_sync, --state_sync_interval_ms, "
          "--state_ack_tokens, --disk_tier, --quarantine_other_model_sessions and "
          "--quarantine_other_version_sessions at other than their defaults are refused (they "
          "would do nothing)");
ABSL_FLAG(bool, log_requests, false,
          "log one line on stderr for every gRPC call as it ends (the OpenAI API's calls into "
          "the service included): method, peer, status code and seconds; off: only calls "
          "that end INTERNAL, DATA_LOSS or UNKNOWN are logged, at most 10 a minute");
ABSL_FLAG(bool, quarantine_other_model_sessions, false,
          "with --state_dir, sessions written for another model (another shape or "
          "fingerprint than --model's) are moved to DIR/quarantine/ at start-up and the server "
          "starts without them; false (the default) refuses to start instead, nothing moved, "
          "naming the model they were written for (docs/state_format.md, \"Start-up\")");
ABSL_FLAG(bool, quarantine_other_version_sessions, false,
          "with --state_dir, sessions whose engine state has another version than this "
          "server's (written before 2026-11-24, or by a newer drt-server) are moved to "
          "DIR/quarantine/ at start-up and the server starts without them; false (the default) "
          "refuses to start instead, nothing moved, naming how many and their versions "
          "(docs/state_format.md, \"Start-up\"; docs/deploy.md, upgrades)");
ABSL_FLAG(std::string, state_sync, "step",
          "with --state_dir, when a session's changes reach the disk: step (each Append step "
          "and generated token is fsynced before it is acknowledged) or interval (at most every "
          "--state_sync_interval_ms per session and at the end of each call; a crash may lose "
          "that much acknowledged work)");
ABSL_FLAG(bool, disk_tier, true,
          "with --state_dir, closed chunks on disk are read from the memory-mapped chunk logs, "
          "64 chunks at a time, and freed from RAM: the page cache keeps what is used, and the "
          "host memory budget bounds RAM instead of context (docs/state_format.md, \"Disk "
          "tier\"); false keeps every chunk in RAM as well. On --device cuda only with "
          "--cuda_state_export (not yet run on a GPU): fetches of mapped chunks then go through "
          "a pinned staging buffer");
ABSL_FLAG(int64_t, state_ack_tokens, drt::server::kDefaultDurableAckTokens,
          "with --state_dir, an Append is written and acknowledged (progress) at least every "
          "this many tokens of a message; between those points its prefill skips the upper "
          "layers where later tokens make them unread (docs/state_format.md, \"Durability "
          "rule\"). 0: every engine step is written and nothing is skipped");
ABSL_FLAG(int64_t, state_sync_interval_ms, 1000,
          "with --state_sync=interval, the longest a session's acknowledged changes stay "
          "unwritten");

namespace drt::server {
namespace {

constexpr char kUsage[] =
    "serves a DRT long-context model over gRPC (drt.v1.Drt, grpc.health.v1, "
    "server reflection)\nand Prometheus metrics over HTTP.\n\n"
    "Example:\n"
    "  drt-server --model models/drt-text-byte --listen 0.0.0.0:50051 --http_listen "
    "0.0.0.0:9090\n\n"
    "It prints 'drt-server listening on ...' once ready and drains on SIGTERM/SIGINT.\n\n"
    "Sessions are held in memory: a restart loses them (clients get NOT_FOUND and must\n"
    "create a session and send the prompt again), unless --state_dir keeps them on disk.";

// The most --engine_stall_seconds takes. main converts it to milliseconds,
// which overflowed int64 above INT64_MAX / 1000 s (about 9.2e15) and wrapped
// to a limit <= 0: the watchdog and /livez were off without a word. 10^9 s
// also fits steady_clock's int64 nanoseconds (up to 9.2e9 s), so any
// conversion of it is exact; nobody needs a longer limit than 0 (never).
constexpr int64_t kMaxEngineStallSeconds = 1'000'000'000;

absl::Status CheckAtLeast(const char* flag, int64_t value, int64_t minimum) {
  if (value >= minimum) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": must be at least ", minimum));
}

absl::Status CheckAtMost(const char* flag, int64_t value, int64_t maximum,
                         absl::string_view why) {
  if (value <= maximum) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": must be at most ", maximum, " (", why, ")"));
}

absl::StatusOr<int> ParsePort(absl::string_view text, absl::string_view address) {
  int port = -1;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad port in address '", address, "': expected 0..65535"));
  }
  return port;
}

// Resolves --device to a backend name. auto is decided here, by probing for
// GPU `cuda_device` (engine/backend_factory.h, ResolveDevice), with a note
// saying which and why. For cuda only the build is checked here; whether the
// GPU is there is found out when main makes the backend, which fails with the
// reason.
absl::Status ResolveDeviceFlag(const std::string& device, int cuda_device,
                               ServerConfig& config) {
  absl::StatusOr<Device> parsed = ParseDevice(device);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", device, ": expected cpu, cuda or auto"));
  }
  if (*parsed == Device::kCuda) {
    if (!CudaBackendBuilt()) {
      return absl::InvalidArgumentError(
          "--device=cuda: this build has no CUDA backend (no CUDA toolkit at build time); use "
          "--device=cpu");
    }
    config.device = "cuda";
    return absl::OkStatus();
  }
  absl::StatusOr<DeviceChoice> choice = ResolveDevice(*parsed, cuda_device);
  if (!choice.ok()) return choice.status();
  config.device = DeviceName(choice->device);
  config.device_note = choice->note;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  absl::string_view host;
  absl::string_view port;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("bad address '", address, "': expected [ipv6]:port"));
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad address '", address, "': expected host:port"));
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad address '", address, "': write IPv6 hosts in brackets, e.g. [::]:50051"));
    }
  }
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad address '", address, "': the host is missing (0.0.0.0 listens everywhere)"));
  }
  auto port_number = ParsePort(port, address);
  if (!port_number.ok()) return port_number.status();
  return HostPort{std::string(host), *port_number};
}

std::string FormatHostPort(const HostPort& address) {
  if (address.host.find(':') != std::string::npos) {
    return absl::StrCat("[", address.host, "]:", address.port);
  }
  return absl::StrCat(address.host, ":", address.port);
}

namespace {

// The --cuda_* flags set to other than their defaults, named in one note
// when the backend is the CPU, which ignores them (review-cuda F7);
// --cuda_device is left out: auto reads it to choose. Empty otherwise.
std::string IgnoredCudaFlagsNote(const ServerConfig& config) {
  if (config.device != "cpu") return "";
  std::vector<std::string> given;
  if (config.cuda_precision != CudaPrecision::kBf16) {
    given.push_back("--cuda_precision=" + absl::GetFlag(FLAGS_cuda_precision));
  }
  if (config.cuda_chunk_store != CudaChunkStore::kKeysValues) {
    given.push_back("--cuda_chunk_store=" + absl::GetFlag(FLAGS_cuda_chunk_store));
  }
  if (config.cuda_chunk_tier != CudaChunkTier::kHost) {
    given.push_back("--cuda_chunk_tier=" + absl::GetFlag(FLAGS_cuda_chunk_tier));
  }
  if (config.cuda_state_export) given.push_back("--cuda_state_export");
  if (config.cuda_batched_step_rows) given.push_back("--cuda_batched_step_rows");
  if (config.cuda_decode_graphs) given.push_back("--cuda_decode_graphs");
  if (config.cuda_decode_fused_gemv) given.push_back("--cuda_decode_fused_gemv");
  if (given.empty()) return "";
  return absl::StrCat(absl::StrJoin(given, ", "), " ignored: backend cpu (they apply to ",
                      "--device=cuda only)");
}

// The flags that only --state_dir reads (durable sessions). One of them at
// a value other than its default without --state_dir is refused: the server
// would start with sessions in memory only and the flag doing nothing
// (serverops item 1). "Set" means "not at its default": absl's public API
// does not say whether a flag came from the command line (and tests set
// flags in-process), and a flag at its default changes nothing either way.
constexpr const char* kStateDirFlags[] = {
    "state_sync",
    "state_sync_interval_ms",
    "state_ack_tokens",
    "disk_tier",
    "quarantine_other_model_sessions",
    "quarantine_other_version_sessions",
};

// "--name=value" for each of `names` whose current value is not its
// default.
std::vector<std::string> FlagsAwayFromDefault(absl::Span<const char* const> names) {
  std::vector<std::string> given;
  for (const char* name : names) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    if (flag->CurrentValue() != flag->DefaultValue()) {
      given.push_back(absl::StrCat("--", name, "=", flag->CurrentValue()));
    }
  }
  return given;
}

}  // namespace

absl::StatusOr<ServerConfig> ServerConfigFromFlags() {
  ServerConfig config;
  std::vector<std::string> errors;
  auto check = [&errors](const absl::Status& status) {
    if (!status.ok()) errors.emplace_back(status.message());
  };

  config.grpc_address = absl::GetFlag(FLAGS_listen);
  if (!absl::StartsWith(config.grpc_address, "unix:")) {
    check(ParseHostPort(config.grpc_address).status());
  }

  const std::string http = absl::GetFlag(FLAGS_http_listen);
  if (!http.empty()) {
    auto parsed = ParseHostPort(http);
    check(parsed.status());
    if (parsed.ok()) config.http = *parsed;
  }

  const std::string openai = absl::GetFlag(FLAGS_openai_listen);
  if (!openai.empty()) {
    auto parsed = ParseHostPort(openai);
    if (parsed.ok()) {
      config.openai = *parsed;
    } else {
      errors.emplace_back(absl::StrCat("--openai_listen: ", parsed.status().message()));
    }
  }

  config.openai_request_timeout_seconds = absl::GetFlag(FLAGS_openai_request_timeout_seconds);
  check(CheckAtLeast("openai_request_timeout_seconds", config.openai_request_timeout_seconds, 1));
  check(CheckAtMost("openai_request_timeout_seconds", config.openai_request_timeout_seconds, 3600,
                    "an hour; a request that takes longer holds a serving thread as long"));

  config.openai_max_request_bytes = absl::GetFlag(FLAGS_openai_max_request_bytes);
  check(CheckAtLeast("openai_max_request_bytes", config.openai_max_request_bytes, 1024));
  check(CheckAtMost("openai_max_request_bytes", config.openai_max_request_bytes,
                    kMaxOpenAiRequestBytes, "1 GiB; its JSON could take about 33 GiB to parse"));
  config.openai_max_inflight_request_bytes = absl::GetFlag(FLAGS_openai_max_inflight_request_bytes);
  if (config.openai_max_inflight_request_bytes < config.openai_max_request_bytes) {
    errors.emplace_back(absl::StrCat(
        "--openai_max_inflight_request_bytes=", config.openai_max_inflight_request_bytes,
        ": must be at least --openai_max_request_bytes (", config.openai_max_request_bytes,
        "), or a body of the largest size could never be read"));
  }
  check(CheckAtMost("openai_max_inflight_request_bytes", config.openai_max_inflight_request_bytes,
                    int64_t{1} << 40, "1 TiB"));

  config.model_dir = absl::GetFlag(FLAGS_model);
  if (config.model_dir.empty()) errors.emplace_back("--model is required (a model directory)");

  config.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  check(CheckAtLeast("cuda_device", config.cuda_device, 0));
  check(ResolveDeviceFlag(absl::GetFlag(FLAGS_device), config.cuda_device, config));
  if (auto precision = ParseCudaPrecision(absl::GetFlag(FLAGS_cuda_precision)); precision.ok()) {
    config.cuda_precision = *precision;
  } else {
    errors.emplace_back(absl::StrCat("--cuda_precision: ", precision.status().message()));
  }
  if (auto store = ParseCudaChunkStore(absl::GetFlag(FLAGS_cuda_chunk_store)); store.ok()) {
    config.cuda_chunk_store = *store;
  } else {
    errors.emplace_back(absl::StrCat("--cuda_chunk_store: ", store.status().message()));
  }
  if (auto tier = ParseCudaChunkTier(absl::GetFlag(FLAGS_cuda_chunk_tier)); tier.ok()) {
    config.cuda_chunk_tier = *tier;
  } else {
    errors.emplace_back(absl::StrCat("--cuda_chunk_tier: ", tier.status().message()));
  }
  config.cuda_state_export = absl::GetFlag(FLAGS_cuda_state_export);
  config.cuda_batched_step_rows = absl::GetFlag(FLAGS_cuda_batched_step_rows);
  config.cuda_decode_graphs = absl::GetFlag(FLAGS_cuda_decode_graphs);
  config.cuda_decode_fused_gemv = absl::GetFlag(FLAGS_cuda_decode_fused_gemv);
  config.cuda_flags_note = IgnoredCudaFlagsNote(config);

  config.threads = absl::GetFlag(FLAGS_threads);
  config.mixed_lower_only_forwards = absl::GetFlag(FLAGS_mixed_lower_only_forwards);
  check(CheckAtLeast("threads", config.threads, 0));

  const double budget_gb = absl::GetFlag(FLAGS_host_memory_budget_gb);
  // Beyond 2^33 GiB the byte count would overflow int64.
  if (!(budget_gb >= 0.0) || budget_gb > static_cast<double>(1LL << 33)) {
    errors.emplace_back(absl::StrCat("--host_memory_budget_gb=", budget_gb,
                                     ": must be a positive number of GiB, or 0 for 3/4 of the "
                                     "memory available at start"));
  } else {
    // 0 stays 0: main derives the budget once the model is loaded.
    config.service.host_memory_budget_bytes =
        static_cast<int64_t>(std::llround(budget_gb * static_cast<double>(1LL << 30)));
  }

  config.service.prefix_cache.max_bytes = absl::GetFlag(FLAGS_prefix_cache_bytes);
  check(CheckAtLeast("prefix_cache_bytes", config.service.prefix_cache.max_bytes, -1));
  config.service.prefix_cache.max_entries = absl::GetFlag(FLAGS_prefix_cache_entries);
  check(CheckAtLeast("prefix_cache_entries", config.service.prefix_cache.max_entries, 0));
  config.service.prefix_cache.max_bytes =
      PrefixCacheBytesForDevice(config.service.prefix_cache.max_bytes, config.device);
  if (config.device == "cuda" && config.service.prefix_cache.max_bytes > 0 &&
      config.service.prefix_cache.max_entries > 0) {
    config.prefix_cache_note = absl::StrCat(
        "WARNING: --prefix_cache_bytes=", config.service.prefix_cache.max_bytes,
        " turns the prefix cache on with --device cuda, where it bounds only host memory: "
        "each snapshot also holds GPU memory (a CUDA session's buffers, and with "
        "--cuda_chunk_tier device or auto a copy of its chunks) that neither the flag nor the "
        "host-memory budget counts and nothing reclaims when a GPU allocation fails "
        "(docs/cuda.md, \"The prefix cache on the GPU\")");
  }
  config.service.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  check(CheckAtLeast("max_sessions", config.service.max_sessions, 1));
  config.service.max_context_tokens = absl::GetFlag(FLAGS_max_context_tokens);
  check(CheckAtLeast("max_context_tokens", config.service.max_context_tokens, 1));
  config.service.idle_ttl_seconds = absl::GetFlag(FLAGS_idle_ttl_seconds);
  check(CheckAtLeast("idle_ttl_seconds", config.service.idle_ttl_seconds, 1));
  config.service.step_tokens = absl::GetFlag(FLAGS_step_tokens);
  check(CheckAtLeast("step_tokens", config.service.step_tokens, 0));
  check(CheckAtMost("step_tokens", config.service.step_tokens, kMaxStepTokens,
                    "tokens per engine step; the backend sizes its forwards for them"));
  config.service.decode_slowdown_limit = absl::GetFlag(FLAGS_decode_slowdown_limit);
  if (const double limit = config.service.decode_slowdown_limit; !(limit == 0 || limit >= 1) ||
                                                                  std::isinf(limit)) {
    errors.emplace_back(absl::StrCat("--decode_slowdown_limit=", limit,
                                     ": must be at least 1 (times a decode-only step), or 0 "
                                     "for no time limit"));
  }
  config.service.decode_step_prefill_tokens = absl::GetFlag(FLAGS_decode_step_prefill_tokens);
  check(CheckAtLeast("decode_step_prefill_tokens", config.service.decode_step_prefill_tokens,
                     drt::server::kNoPrefillTokenCap));
  // Accepted so that existing command lines keep working; main logs that it
  // is ignored.
  if (const int32_t workers = absl::GetFlag(FLAGS_compute_workers); workers != 0) {
    config.deprecation_notes.push_back(absl::StrCat(
        "--compute_workers=", workers,
        " is deprecated and ignored: one engine thread forms batched steps over all sessions "
        "(docs/api.md, Scheduling); --threads sets the CPU backend's threads"));
  }
  config.service.session_files_dir = absl::GetFlag(FLAGS_session_files_dir);
  config.state.dir = absl::GetFlag(FLAGS_state_dir);
  if (auto sync = ParseStateSync(absl::GetFlag(FLAGS_state_sync)); sync.ok()) {
    config.state.sync = *sync;
  } else {
    check(sync.status());
  }
  config.state.sync_interval_ms = absl::GetFlag(FLAGS_state_sync_interval_ms);
  config.service.durable_ack_tokens = absl::GetFlag(FLAGS_state_ack_tokens);
  check(CheckAtLeast("state_ack_tokens", config.service.durable_ack_tokens, 0));
  config.state.disk_tier = absl::GetFlag(FLAGS_disk_tier);
  config.state.quarantine_other_model_sessions =
      absl::GetFlag(FLAGS_quarantine_other_model_sessions);
  config.state.quarantine_other_version_sessions =
      absl::GetFlag(FLAGS_quarantine_other_version_sessions);
  config.log_requests = absl::GetFlag(FLAGS_log_requests);
  config.state.model_dir = config.model_dir;
  check(CheckAtLeast("state_sync_interval_ms", config.state.sync_interval_ms, 1));
  if (const std::vector<std::string> given = FlagsAwayFromDefault(kStateDirFlags);
      config.state.dir.empty() && !given.empty()) {
    errors.emplace_back(absl::StrCat(
        absl::StrJoin(given, ", "), given.size() == 1 ? " needs" : " need",
        " --state_dir (durable sessions): without it sessions live in memory only and ",
        given.size() == 1 ? "this flag does" : "these flags do",
        " nothing; add --state_dir=DIR, or drop ", given.size() == 1 ? "it" : "them"));
  }

  config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  // Below this not even a small prompt piece plus headers fits.
  check(CheckAtLeast("max_message_bytes", config.max_message_bytes, 1024));
  config.service.max_message_bytes = config.max_message_bytes;

  config.tls_cert_path = absl::GetFlag(FLAGS_tls_cert);
  config.tls_key_path = absl::GetFlag(FLAGS_tls_key);
  if (config.tls_cert_path.empty() != config.tls_key_path.empty()) {
    errors.emplace_back("--tls_cert and --tls_key go together: give both or neither");
  }

  config.service.bearer_token = absl::GetFlag(FLAGS_bearer_token);
  if (config.service.bearer_token.empty()) {
    if (const char* token = std::getenv("DRT_BEARER_TOKEN")) config.service.bearer_token = token;
  }
  config.require_bearer_token = absl::GetFlag(FLAGS_require_bearer_token);
  check(CheckBearerToken(config.service.bearer_token, config.require_bearer_token));

  config.shutdown_grace_seconds = absl::GetFlag(FLAGS_shutdown_grace_seconds);
  check(CheckAtLeast("shutdown_grace_seconds", config.shutdown_grace_seconds, 0));
  config.engine_stall_seconds = absl::GetFlag(FLAGS_engine_stall_seconds);
  check(CheckAtLeast("engine_stall_seconds", config.engine_stall_seconds, 0));
  check(CheckAtMost("engine_stall_seconds", config.engine_stall_seconds, kMaxEngineStallSeconds,
                    "about 31 years; 0 turns the check off"));

  config.service.device = config.device;
  config.service.precision =
      config.device == "cuda" ? CudaPrecisionName(config.cuda_precision) : "fp32";
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
  return config;
}

int64_t PrefixCacheBytesForDevice(int64_t flag_bytes, const std::string& device) {
  if (flag_bytes == -1 && device == "cuda") return 0;
  return flag_bytes;
}

absl::StatusOr<ServerConfig> ParseServerFlags(int argc, char** argv) {
  // --help lists the flags of this file; --helpfull adds gRPC's and absl's.
  const cli::Program program{"drt-server", kUsage, {"server/server_flags.cc"}};
  std::vector<char*> positional = cli::ParseCommandLine(program, argc, argv);
  if (positional.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unexpected argument '", positional[1], "' (flags are --name=value; see --help)"));
  }
  return ServerConfigFromFlags();
}

}  // namespace drt::server

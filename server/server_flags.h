// drt-server's command line: the flags, their validation, and the resulting
// configuration. Flags are read once, in main; everything else takes a
// ServerConfig.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/cuda/cuda_options.h"
#include "server/drt_service.h"
#include "server/state_store.h"

namespace drt::server {

struct HostPort {
  std::string host;  // IPv6 without brackets
  int port = 0;      // 0: any free port
};

// "host:port", "[v6]:port". The host must be non-empty.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);
// The inverse of ParseHostPort (brackets IPv6 hosts).
std::string FormatHostPort(const HostPort& address);

// The most --step_tokens takes: tokens per engine step. The backend sizes a
// forward's buffers for that many (with their landmarks), so a larger value
// is a typo that would allocate for it, and INT64_MAX would overflow the
// conversion to positions (StepPositionsForTokens). 2^20 is 260 times the
// largest step measured (4032 tokens, docs/state_format.md).
constexpr int64_t kMaxStepTokens = int64_t{1} << 20;

// The most --openai_max_request_bytes takes (1 GiB).
constexpr int64_t kMaxOpenAiRequestBytes = int64_t{1} << 30;

// --prefix_cache_bytes as given (-1: the default) on `device` ("cpu" or
// "cuda"): on cuda the default is 0 (no cache), because the cache's bounds
// and its reclaimer count host memory only, while each snapshot there is a
// CUDA session with device memory of its own (docs/cuda.md, "The prefix
// cache on the GPU"); on cpu -1 stays, for main to make a quarter of the
// host-memory budget once that is known.
int64_t PrefixCacheBytesForDevice(int64_t flag_bytes, const std::string& device);

struct ServerConfig {
  std::string grpc_address;      // as gRPC takes it: host:port or unix:path
  std::optional<HostPort> http;  // empty: no HTTP endpoint
  // --openai_listen; empty: no OpenAI-compatible HTTP API
  std::optional<HostPort> openai;
  // --openai_request_timeout_seconds: time from the accept until a request
  // to the OpenAI API has arrived whole, its body too (1 to 3600).
  int64_t openai_request_timeout_seconds = 30;
  // --openai_max_request_bytes (OpenAiHttpOptions::max_request_bytes).
  int64_t openai_max_request_bytes = int64_t{64} << 20;
  // --openai_max_inflight_request_bytes
  // (OpenAiHttpOptions::max_inflight_request_bytes): two bodies of the
  // largest size parse at once, about 4 GB at the measured worst (2 GB for
  // a 64 MiB body nested 63 deep), where --max_sessions + 4 (68 by
  // default) could before; small requests never wait for each other.
  int64_t openai_max_inflight_request_bytes = int64_t{128} << 20;
  std::string model_dir;
  // "cpu" or "cuda" (engine/backend_factory.h). "auto" resolves to "cuda"
  // when the build has the CUDA backend and GPU cuda_device is visible, to
  // "cpu" otherwise, with device_note saying which and why; "cuda" is checked
  // against the GPU only when main makes the backend.
  std::string device = "cpu";
  std::string device_note;
  // One line each, logged at start: flags that are accepted but ignored.
  std::vector<std::string> deprecation_notes;
  // One line, logged at start when the backend is the CPU and --cuda_* flags
  // ask for something other than their defaults (they then do nothing; auto
  // must accept them, so they are not refused); empty otherwise.
  std::string cuda_flags_note;
  // One line, logged at start as a WARNING when the prefix cache is on with
  // --device cuda (only by an explicit --prefix_cache_bytes: its default is
  // off there, PrefixCacheBytesForDevice); empty otherwise.
  std::string prefix_cache_note;
  int cuda_device = 0;  // GPU index for the CUDA backend
  CudaPrecision cuda_precision = CudaPrecision::kBf16;  // --cuda_precision
  // --cuda_chunk_store (CudaBackendOptions::chunk_store)
  CudaChunkStore cuda_chunk_store = CudaChunkStore::kKeysValues;
  // --cuda_chunk_tier (CudaBackendOptions::chunk_tier)
  CudaChunkTier cuda_chunk_tier = CudaChunkTier::kHost;
  bool cuda_state_export = false;  // --cuda_state_export (CudaBackendOptions::state_export)
  // --cuda_batched_step_rows (CudaBackendOptions::batched_step_rows)
  bool cuda_batched_step_rows = false;
  // --cuda_decode_graphs (CudaBackendOptions::decode_graphs)
  bool cuda_decode_graphs = false;
  // --cuda_decode_fused_gemv (CudaBackendOptions::decode_fused_gemv)
  bool cuda_decode_fused_gemv = false;
  int threads = 0;  // CPU backend threads; 0: the CPUs this process may use (cpu_threads.h)
  // --mixed_lower_only_forwards (CpuBackendOptions::mixed_lower_only_forwards):
  // off, a forward skips the upper layers only when all of it may, and every
  // prefill piece gets its logits (the behaviour before; rollback and A/B).
  bool mixed_lower_only_forwards = true;
  int max_message_bytes = static_cast<int>(ServiceOptions{}.max_message_bytes);
  bool log_requests = false;  // --log_requests (server/failed_call_log.h)
  // --require_bearer_token: start only with a non-empty token
  // (server/bearer_token_config.h checks the token either way).
  bool require_bearer_token = false;
  std::string tls_cert_path;  // both set or both empty
  std::string tls_key_path;
  int64_t shutdown_grace_seconds = 10;
  // Liveness fails after this long with work queued and no step finished;
  // 0: never (server/engine_watchdog.h).
  int64_t engine_stall_seconds = 300;
  StateStoreOptions state;  // dir empty: no durable sessions
  // model_name is filled by main once the model is loaded, and so is
  // host_memory_budget_bytes when it is 0 (no --host_memory_budget_gb).
  ServiceOptions service;
};

// Parses argv with absl flags (--help, --version and friends print and exit
// 0 there; cli/command_line.h), then ServerConfigFromFlags().
absl::StatusOr<ServerConfig> ParseServerFlags(int argc, char** argv);

// Builds and validates a ServerConfig from the current flag values and the
// environment (DRT_BEARER_TOKEN when --bearer_token is empty).
absl::StatusOr<ServerConfig> ServerConfigFromFlags();

}  // namespace drt::server

#include "server/metrics.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>

namespace drt::server {
namespace {

// Upper bounds in seconds, shared by the latency histograms: 1 ms to 120 s
// (a first token behind a long prefill under load, or a 1M-token step,
// takes tens of seconds: with 10 s as the top bucket their p99 read +Inf).
constexpr std::array<double, 16> kLatencyBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0};

// drt_errors_total{code} has a series for each of these from the start, at 0,
// so that rate() sees the first error burst (a series that appears with its
// first error has no earlier sample to rate against).
constexpr std::array<const char*, 16> kErrorCodes = {
    "CANCELLED",          "UNKNOWN",      "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
    "NOT_FOUND",          "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED",     "OUT_OF_RANGE",     "UNIMPLEMENTED",
    "INTERNAL",           "UNAVAILABLE",  "DATA_LOSS",        "UNAUTHENTICATED"};

// drt_requests_total{method} likewise has a series for each drt.v1.Drt
// method from the start, at 0 (review-deploy F9); tests/server/metrics_test.cc
// checks this list against the service's descriptor.
constexpr std::array<const char*, 13> kMethods = {
    "CreateSession", "Append",       "Generate",    "Complete",    "ForkSession",
    "GetSession",    "ListSessions", "DeleteSession", "GetModelInfo", "SaveSession",
    "LoadSession",   "Tokenize",     "Detokenize"};

struct Histogram {
  std::array<int64_t, kLatencyBuckets.size()> counts{};  // per bucket, not cumulative
  int64_t count = 0;
  double sum = 0.0;

  void Observe(double value) {
    for (size_t i = 0; i < kLatencyBuckets.size(); ++i) {
      if (value <= kLatencyBuckets[i]) {
        ++counts[i];
        break;
      }
    }
    ++count;
    sum += value;
  }
};

// Shortest text that reads back as the same double; Prometheus spellings for
// the special values.
std::string FormatDouble(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

void AppendHeader(std::string& out, std::string_view name, std::string_view type,
                  std::string_view help) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n");
  out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void AppendSample(std::string& out, std::string_view name, std::string_view value) {
  out.append(name).append(" ").append(value).append("\n");
}

void AppendScalar(std::string& out, std::string_view name, std::string_view type,
                  std::string_view help, std::string_view value) {
  AppendHeader(out, name, type, help);
  AppendSample(out, name, value);
}

void AppendLabeledCounter(std::string& out, std::string_view name, std::string_view help,
                          std::string_view label, const std::map<std::string, int64_t>& values) {
  AppendHeader(out, name, "counter", help);
  for (const auto& [label_value, count] : values) {
    out.append(name).append("{").append(label).append("=\"");
    out.append(EscapeLabelValue(label_value)).append("\"} ");
    out.append(std::to_string(count)).append("\n");
  }
}

void AppendHistogram(std::string& out, std::string_view name, std::string_view help,
                     const Histogram& histogram) {
  AppendHeader(out, name, "histogram", help);
  const std::string bucket = std::string(name) + "_bucket{le=\"";
  int64_t cumulative = 0;
  for (size_t i = 0; i < kLatencyBuckets.size(); ++i) {
    cumulative += histogram.counts[i];
    out.append(bucket).append(FormatDouble(kLatencyBuckets[i])).append("\"} ");
    out.append(std::to_string(cumulative)).append("\n");
  }
  out.append(bucket).append("+Inf\"} ").append(std::to_string(histogram.count)).append("\n");
  AppendSample(out, std::string(name) + "_sum", FormatDouble(histogram.sum));
  AppendSample(out, std::string(name) + "_count", std::to_string(histogram.count));
}

// Counters only go up, and a NaN or negative observation is a caller bug
// that must not poison the exported series.
bool IsValidObservation(double value) { return std::isfinite(value) && value >= 0.0; }

}  // namespace

struct Metrics::State {
  mutable std::mutex mutex;
  int64_t tokens_ingested = 0;
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;
  double last_prefill_tokens_per_second = 0.0;
  int64_t generated_tokens = 0;
  std::string backend_device;  // empty until SetBackend
  std::string backend_precision;
  int64_t retrievals = 0;
  int64_t prefix_cache_hits = 0;
  int64_t prefix_cache_misses = 0;
  int64_t prefix_cache_reused_tokens = 0;
  int64_t prefix_cache_evictions = 0;
  Histogram time_to_first_token;
  Histogram time_per_output_token;
  int64_t engine_steps = 0;
  std::map<std::string, int64_t> step_tokens_by_kind;
  Histogram engine_step_seconds;
  std::map<std::string, int64_t> requests_by_method;
  std::map<std::string, int64_t> errors_by_code;
  // SetSessionGaugeSource's function, guarded by source_mutex (held while it
  // is called, never together with `mutex`).
  std::mutex source_mutex;
  std::function<SessionGauges()> session_gauges;
  std::function<EngineGauges()> engine_gauges;  // also under source_mutex
  int64_t host_memory_budget_bytes = -1;  // -1: not set
  int64_t max_sessions = -1;
};

Metrics::Metrics() : state_(std::make_unique<State>()) {
  for (const char* code : kErrorCodes) state_->errors_by_code[code] = 0;
  for (const char* method : kMethods) state_->requests_by_method[method] = 0;
}

void Metrics::SetLimits(int64_t host_memory_budget_bytes, int64_t max_sessions) {
  std::lock_guard lock(state_->mutex);
  state_->host_memory_budget_bytes = host_memory_budget_bytes;
  state_->max_sessions = max_sessions;
}
Metrics::~Metrics() = default;

void Metrics::SetBackend(const std::string& device, const std::string& precision) {
  std::lock_guard lock(state_->mutex);
  state_->backend_device = device;
  state_->backend_precision = precision;
}

void Metrics::AddTokensIngested(int64_t tokens) {
  if (tokens <= 0) return;
  std::lock_guard lock(state_->mutex);
  state_->tokens_ingested += tokens;
}

void Metrics::ObservePrefill(int64_t tokens, double seconds) {
  if (tokens < 0 || !IsValidObservation(seconds)) return;
  std::lock_guard lock(state_->mutex);
  state_->prefill_tokens += tokens;
  state_->prefill_seconds += seconds;
  if (seconds > 0.0) state_->last_prefill_tokens_per_second = tokens / seconds;
}

void Metrics::ObserveTimeToFirstToken(double seconds) {
  if (!IsValidObservation(seconds)) return;
  std::lock_guard lock(state_->mutex);
  state_->time_to_first_token.Observe(seconds);
}

void Metrics::ObserveTimePerOutputToken(double seconds) {
  if (!IsValidObservation(seconds)) return;
  std::lock_guard lock(state_->mutex);
  state_->time_per_output_token.Observe(seconds);
}

void Metrics::AddGeneratedTokens(int64_t tokens) {
  if (tokens <= 0) return;
  std::lock_guard lock(state_->mutex);
  state_->generated_tokens += tokens;
}

void Metrics::SetSessionGaugeSource(std::function<SessionGauges()> source) {
  std::lock_guard lock(state_->source_mutex);
  state_->session_gauges = std::move(source);
}

void Metrics::SetEngineGaugeSource(std::function<EngineGauges()> source) {
  std::lock_guard lock(state_->source_mutex);
  state_->engine_gauges = std::move(source);
}

void Metrics::AddRetrievals(int64_t retrievals) {
  if (retrievals <= 0) return;
  std::lock_guard lock(state_->mutex);
  state_->retrievals += retrievals;
}

void Metrics::AddPrefixCacheHit(int64_t reused_tokens) {
  std::lock_guard lock(state_->mutex);
  ++state_->prefix_cache_hits;
  state_->prefix_cache_reused_tokens += std::max<int64_t>(0, reused_tokens);
}

void Metrics::AddPrefixCacheMiss() {
  std::lock_guard lock(state_->mutex);
  ++state_->prefix_cache_misses;
}

void Metrics::AddPrefixCacheEviction() {
  std::lock_guard lock(state_->mutex);
  ++state_->prefix_cache_evictions;
}

void Metrics::ObserveEngineStep(int64_t decode_tokens, int64_t prefill_tokens, double seconds) {
  if (decode_tokens < 0 || prefill_tokens < 0 || !IsValidObservation(seconds)) return;
  std::lock_guard lock(state_->mutex);
  ++state_->engine_steps;
  state_->step_tokens_by_kind["decode"] += decode_tokens;
  state_->step_tokens_by_kind["prefill"] += prefill_tokens;
  state_->engine_step_seconds.Observe(seconds);
}

void Metrics::CountRequest(const std::string& method) {
  std::lock_guard lock(state_->mutex);
  ++state_->requests_by_method[method];
}

void Metrics::CountError(const std::string& code) {
  std::lock_guard lock(state_->mutex);
  ++state_->errors_by_code[code];
}

std::string Metrics::RenderPrometheus() const {
  SessionGauges gauges;  // 0 and 0 without a source
  std::optional<EngineGauges> engine;
  {
    std::lock_guard source_lock(state_->source_mutex);
    if (state_->session_gauges) gauges = state_->session_gauges();
    if (state_->engine_gauges) engine = state_->engine_gauges();
  }
  std::lock_guard lock(state_->mutex);
  const State& s = *state_;
  std::string out;
  out.reserve(4096);
  AppendScalar(out, "drt_tokens_ingested_total", "counter",
               "Prompt tokens accepted into sessions.", std::to_string(s.tokens_ingested));
  AppendScalar(out, "drt_prefill_tokens_total", "counter",
               "Tokens run through prefill.", std::to_string(s.prefill_tokens));
  AppendScalar(out, "drt_prefill_seconds_total", "counter",
               "Seconds spent in prefill.", FormatDouble(s.prefill_seconds));
  AppendScalar(out, "drt_prefill_tokens_per_second", "gauge",
               "Prefill throughput of the most recent Append.",
               FormatDouble(s.last_prefill_tokens_per_second));
  AppendScalar(out, "drt_generated_tokens_total", "counter",
               "Tokens generated.", std::to_string(s.generated_tokens));
  AppendHistogram(out, "drt_time_to_first_token_seconds",
                  "Seconds from a generation request to its first token.",
                  s.time_to_first_token);
  AppendHistogram(out, "drt_time_per_output_token_seconds",
                  "Seconds per generated token after the first.", s.time_per_output_token);
  if (!s.backend_device.empty()) {
    AppendHeader(out, "drt_backend_info", "gauge",
                 "The compute backend in use (device) and its storage precision; always 1.");
    out.append("drt_backend_info{device=\"").append(EscapeLabelValue(s.backend_device));
    out.append("\",precision=\"").append(EscapeLabelValue(s.backend_precision)).append("\"} 1\n");
  }
  AppendScalar(out, "drt_active_sessions", "gauge", "Sessions currently open.",
               std::to_string(gauges.active_sessions));
  AppendScalar(out, "drt_chunk_store_bytes", "gauge",
               "Host bytes held by the sessions' chunk stores.",
               std::to_string(gauges.chunk_store_bytes));
  AppendScalar(out, "drt_prefix_cache_hits_total", "counter",
               "Completes whose prompt began with a prefix-cache snapshot's tokens (they "
               "prefilled only the rest).", std::to_string(s.prefix_cache_hits));
  AppendScalar(out, "drt_prefix_cache_misses_total", "counter",
               "Completes that found no prefix-cache snapshot to start from (cache on).",
               std::to_string(s.prefix_cache_misses));
  AppendScalar(out, "drt_prefix_cache_reused_tokens_total", "counter",
               "Prompt tokens not prefilled because a prefix-cache snapshot held them.",
               std::to_string(s.prefix_cache_reused_tokens));
  AppendScalar(out, "drt_prefix_cache_evictions_total", "counter",
               "Prefix-cache snapshots evicted (least recently used, past "
               "--prefix_cache_bytes / --prefix_cache_entries or for a request's host memory).",
               std::to_string(s.prefix_cache_evictions));
  AppendScalar(out, "drt_prefix_cache_entries", "gauge", "Prefix-cache snapshots kept.",
               std::to_string(gauges.prefix_cache_entries));
  AppendScalar(out, "drt_prefix_cache_bytes", "gauge",
               "Host bytes the prefix-cache snapshots hold (their own copies, their share of "
               "chunks shared with other sessions, stored prompt scores).",
               std::to_string(gauges.prefix_cache_bytes));
  AppendScalar(out, "drt_retrievals_total", "counter",
               "Chunk retrievals made (one per landmark and group through the upper layers; "
               "lower-only prefill forwards make none).", std::to_string(s.retrievals));
  AppendScalar(out, "drt_engine_steps_total", "counter",
               "Engine steps the scheduler ran (each over one or more sessions).",
               std::to_string(s.engine_steps));
  AppendLabeledCounter(out, "drt_engine_step_tokens_total",
                       "Tokens run in engine steps, by kind (decode: generated tokens; "
                       "prefill: prompt and padding).",
                       "kind", s.step_tokens_by_kind);
  AppendHistogram(out, "drt_engine_step_seconds", "Seconds per engine step.",
                  s.engine_step_seconds);
  AppendLabeledCounter(out, "drt_requests_total", "RPCs received, by method.", "method",
                       s.requests_by_method);
  AppendLabeledCounter(out, "drt_errors_total", "RPCs that failed, by gRPC status code.", "code",
                       s.errors_by_code);
  if (s.host_memory_budget_bytes >= 0) {
    AppendScalar(out, "drt_host_memory_budget_bytes", "gauge",
                 "Host memory all sessions may hold together (--host_memory_budget_gb or its "
                 "default); a session beyond it is refused with RESOURCE_EXHAUSTED.",
                 std::to_string(s.host_memory_budget_bytes));
    AppendScalar(out, "drt_max_sessions", "gauge",
                 "Sessions that may be open at once (--max_sessions).",
                 std::to_string(s.max_sessions));
  }
  if (engine) {
    AppendScalar(out, "drt_engine_queued_items", "gauge",
                 "Engine work items (prompt pieces, generated tokens) waiting or partly done.",
                 std::to_string(engine->queued_items));
    AppendScalar(out, "drt_engine_last_step_age_seconds", "gauge",
                 "Seconds since the engine last finished a step (or work arrived at an idle "
                 "engine) while work is queued; 0 while none is. Liveness fails above "
                 "--engine_stall_seconds.",
                 FormatDouble(engine->last_step_age_seconds));
  }
  return out;
}

}  // namespace drt::server

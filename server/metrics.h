// Server metrics in Prometheus text format (served on /metrics). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace drt::server {

class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // drt_tokens_ingested_total
  void AddTokensIngested(int64_t tokens);
  // drt_prefill_tokens_per_second (gauge, last Append) and
  // drt_prefill_seconds_total / drt_prefill_tokens_total.
  void ObservePrefill(int64_t tokens, double seconds);
  // drt_time_to_first_token_seconds (histogram)
  void ObserveTimeToFirstToken(double seconds);
  // drt_time_per_output_token_seconds (histogram)
  void ObserveTimePerOutputToken(double seconds);
  // drt_generated_tokens_total
  void AddGeneratedTokens(int64_t tokens);
  // drt_backend_info{device,precision} 1 (gauge): the backend drt-server
  // chose (--device auto resolves to one) and its storage precision.
  void SetBackend(const std::string& device, const std::string& precision);
  // drt_active_sessions and drt_chunk_store_bytes (gauges): read from the
  // sessions at each scrape, so that idle expiry, sessions restored at
  // start-up and anything else that changes the sessions without a gRPC call
  // show at once. RenderPrometheus calls `source` (outside the metrics' own
  // lock); without one (or once cleared with an empty function) both read
  // 0. Setting waits for a render that is calling the old one, so its owner
  // may go once it has cleared it.
  // Also drt_prefix_cache_entries and drt_prefix_cache_bytes: the prefix
  // cache's snapshots (server/prefix_cache.h) and the host bytes they hold.
  struct SessionGauges {
    int64_t active_sessions = 0;
    int64_t chunk_store_bytes = 0;
    int64_t prefix_cache_entries = 0;
    int64_t prefix_cache_bytes = 0;
  };
  void SetSessionGaugeSource(std::function<SessionGauges()> source);
  // The prefix cache (server/prefix_cache.h), per Complete that looked in
  // it: drt_prefix_cache_hits_total and drt_prefix_cache_reused_tokens_total
  // (prompt tokens not prefilled because a snapshot held them), or
  // drt_prefix_cache_misses_total; drt_prefix_cache_evictions_total per
  // snapshot evicted (LRU past its limits, or for a request's memory).
  void AddPrefixCacheHit(int64_t reused_tokens);
  void AddPrefixCacheMiss();
  void AddPrefixCacheEviction();
  // drt_retrievals_total (one per landmark and group that went through the
  // upper layers: Session::retrievals())
  void AddRetrievals(int64_t retrievals);
  // One engine step formed by the scheduler (server/scheduler.h):
  // drt_engine_steps_total, drt_engine_step_tokens_total{kind} (decode,
  // prefill) and drt_engine_step_seconds (histogram).
  void ObserveEngineStep(int64_t decode_tokens, int64_t prefill_tokens, double seconds);
  // drt_requests_total{method} and drt_errors_total{code} (code as gRPC's
  // upper-case name, e.g. "INVALID_ARGUMENT")
  void CountRequest(const std::string& method);
  void CountError(const std::string& code);

  // drt_engine_queued_items and drt_engine_last_step_age_seconds (gauges):
  // read from `source` at each scrape (outside the metrics' own lock), as
  // SetSessionGaugeSource; absent from /metrics until a source is set. The
  // age is the seconds since the engine last made progress (a step finished,
  // or work arrived at an idle engine) while work is queued, 0 while none is
  // (server/engine_watchdog.h).
  // drt_host_memory_budget_bytes and drt_max_sessions (gauges): the limits
  // this server refuses sessions at (RESOURCE_EXHAUSTED), so that alerts can
  // be ratios (drt_chunk_store_bytes / drt_host_memory_budget_bytes) instead
  // of per-overlay numbers. Absent until set.
  void SetLimits(int64_t host_memory_budget_bytes, int64_t max_sessions);
  struct EngineGauges {
    int64_t queued_items = 0;
    double last_step_age_seconds = 0.0;
  };
  void SetEngineGaugeSource(std::function<EngineGauges()> source);

  std::string RenderPrometheus() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace drt::server

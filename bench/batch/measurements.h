// The two measurements of drt-batch-bench (issue 11, item 5), each made
// through the server's public API with simulated users:
//   MeasureDecode: N sessions with the same prompt length generate at once;
//     aggregate tokens/s and the per-token gaps of every session.
//   MeasureTpotUnderLoad: one session generates, idle, then while K other
//     sessions stream big Appends; the gaps between its tokens.
// Every session a measurement creates is deleted before it returns, also on
// errors.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/batch/drt_load_client.h"
#include "bench/batch/random_tokens.h"

namespace drt::bench {

struct BenchSettings {
  ClientOptions client;
  double connect_timeout_seconds = 30;
  TokenRange tokens;
  int64_t prompt_tokens = 4000;
  int32_t generate = 256;
  int32_t repeats = 3;
  int64_t piece_tokens = 16384;  // ids per Append message
  int32_t load_sessions = 8;
  int32_t load_generate = 256;  // tokens the measured session generates, idle and under load
  int64_t append_tokens = 1'000'000;  // most a load session streams
  uint64_t seed = 1;
};

// Time per output token of a set of streams (TokenGapsMs, pooled).
struct GapStats {
  int64_t count = 0;
  double p50_ms = 0, p99_ms = 0, mean_ms = 0, max_ms = 0;
};

GapStats SummarizeGaps(const std::vector<double>& gaps_ms);

struct DecodeRepeat {
  int64_t generated_tokens = 0;  // received by all sessions together
  double wall_seconds = 0;       // from the Generate calls' start to the last one's end
  double aggregate_tokens_per_second = 0;
  double ttft_p50_ms = 0;  // median over sessions of the time to first token
  GapStats gaps;           // over all sessions' tokens after their first
};

struct DecodeResult {
  int32_t sessions = 0;
  int64_t context_tokens = 0;  // each session's prompt
  std::vector<DecodeRepeat> repeats;
  DecodeRepeat median;  // each field the median over repeats
};

absl::StatusOr<DecodeResult> MeasureDecode(int32_t sessions, const BenchSettings& settings);

struct LoadRepeat {
  GapStats idle, loaded;
  double idle_ttft_ms = 0, loaded_ttft_ms = 0;
  double load_seconds = 0;                 // the loaded Generate's duration
  int64_t load_tokens_ingested = 0;        // by all load sessions during it
  double load_tokens_per_second = 0;       // the same per second
  bool load_covered_generate = true;       // no load Append ended before the Generate
};

struct LoadResult {
  std::vector<LoadRepeat> repeats;
  LoadRepeat median;  // each field the median over repeats (covered: all repeats)
};

absl::StatusOr<LoadResult> MeasureTpotUnderLoad(const BenchSettings& settings);

}  // namespace drt::bench

// drt-batch-bench: a gRPC load generator that measures how drt-server
// serves many sessions at once (issue 11, item 5), through the public API
// only, so that it measures any server version:
//   decode: N sessions (--sessions, a list) each get a --prompt_tokens
//     prompt, then all generate --generate tokens at once (greedy,
//     ignore_eos): aggregate tokens/s and the per-token gaps of the streams;
//   load: one session generates --load_generate tokens alone, then while
//     --load_sessions others stream Appends of up to --append_tokens tokens:
//     p50/p99 of its per-token gaps, idle and under load.
// Medians over --repeats; a table on stdout, the same and every repeat in
// --json. Start drt-server first (scripts/batch_bench.sh does both).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/batch/drt_load_client.h"
#include "bench/batch/measurements.h"
#include "bench/batch/random_tokens.h"
#include "bench/load_average.h"
#include "cli/command_line.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "host:port of a running drt-server");
ABSL_FLAG(std::string, token, "",
          "bearer token, sent as 'authorization: Bearer <token>' (default: $DRT_BEARER_TOKEN)");
ABSL_FLAG(double, connect_timeout, 30, "seconds to wait for the server");
ABSL_FLAG(double, call_timeout, 3600, "deadline of every call, in seconds");
ABSL_FLAG(std::vector<std::string>, sessions, std::vector<std::string>({"1", "4", "16", "64"}),
          "decode: numbers of sessions generating at once, comma-separated (empty: skip)");
ABSL_FLAG(int64_t, prompt_tokens, 4000, "prompt of every session, in random token ids");
ABSL_FLAG(int32_t, generate, 256, "tokens every Generate produces (greedy, ignore_eos)");
ABSL_FLAG(int32_t, repeats, 3, "runs of each measurement; the table shows medians");
ABSL_FLAG(int32_t, load_sessions, 8,
          "load: sessions streaming Appends while one generates (0: skip the load measurement)");
ABSL_FLAG(int32_t, load_generate, 0,
          "load: tokens the measured session generates, idle and under load (0: --generate); "
          "on a CPU each one waits behind prefill steps, so fewer keep the run short");
ABSL_FLAG(int64_t, append_tokens, 1'000'000,
          "load: the most tokens one load session streams; the Append is cancelled when the "
          "measured Generate ends, so this needs only to outlast it. What a load session "
          "ingests stays in server memory until the repeat ends");
ABSL_FLAG(int64_t, piece_tokens, 16384, "token ids per Append message");
ABSL_FLAG(uint64_t, seed, 1, "seed of the random prompts");
ABSL_FLAG(std::string, json, "", "also write the results, every repeat included, to this file");

namespace {

using drt::bench::BenchSettings;
using drt::bench::DecodeResult;
using drt::bench::GapStats;
using drt::bench::LoadAverage;  // of this machine, the server's too when it runs here
using drt::bench::LoadResult;
using json = nlohmann::json;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "drt-batch-bench: %s\n", message.c_str());
  std::exit(1);
}

std::vector<int32_t> ParseSessionCounts(const std::vector<std::string>& words) {
  std::vector<int32_t> counts;
  for (const std::string& word : words) {
    int32_t n = 0;
    if (!absl::SimpleAtoi(word, &n) || n < 1) {
      Die(absl::StrCat("--sessions: '", word, "' is not a positive integer"));
    }
    counts.push_back(n);
  }
  return counts;
}

json GapsJson(const GapStats& g) {
  return {{"count", g.count}, {"p50_ms", g.p50_ms}, {"p99_ms", g.p99_ms},
          {"mean_ms", g.mean_ms}, {"max_ms", g.max_ms}};
}

json DecodeRepeatJson(const drt::bench::DecodeRepeat& r) {
  return {{"generated_tokens", r.generated_tokens},
          {"wall_seconds", r.wall_seconds},
          {"aggregate_tokens_per_second", r.aggregate_tokens_per_second},
          {"ttft_p50_ms", r.ttft_p50_ms},
          {"gaps", GapsJson(r.gaps)}};
}

json LoadRepeatJson(const drt::bench::LoadRepeat& r) {
  return {{"idle", GapsJson(r.idle)},
          {"loaded", GapsJson(r.loaded)},
          {"idle_ttft_ms", r.idle_ttft_ms},
          {"loaded_ttft_ms", r.loaded_ttft_ms},
          {"load_seconds", r.load_seconds},
          {"load_tokens_ingested", r.load_tokens_ingested},
          {"load_tokens_per_second", r.load_tokens_per_second},
          {"load_covered_generate", r.load_covered_generate}};
}

double Ratio(double a, double b) { return b > 0 ? a / b : NAN; }

int Run() {
  BenchSettings settings;
  settings.client.server = absl::GetFlag(FLAGS_server);
  settings.client.bearer_token = absl::GetFlag(FLAGS_token);
  if (const char* env = std::getenv("DRT_BEARER_TOKEN");
      settings.client.bearer_token.empty() && env != nullptr) {
    settings.client.bearer_token = env;
  }
  settings.client.call_timeout_seconds = absl::GetFlag(FLAGS_call_timeout);
  settings.connect_timeout_seconds = absl::GetFlag(FLAGS_connect_timeout);
  settings.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  settings.generate = absl::GetFlag(FLAGS_generate);
  settings.repeats = absl::GetFlag(FLAGS_repeats);
  settings.piece_tokens = absl::GetFlag(FLAGS_piece_tokens);
  settings.load_sessions = absl::GetFlag(FLAGS_load_sessions);
  settings.append_tokens = absl::GetFlag(FLAGS_append_tokens);
  settings.load_generate = absl::GetFlag(FLAGS_load_generate);
  if (settings.load_generate == 0) settings.load_generate = settings.generate;
  settings.seed = absl::GetFlag(FLAGS_seed);
  const std::vector<int32_t> counts = ParseSessionCounts(absl::GetFlag(FLAGS_sessions));
  if (settings.prompt_tokens < 1) Die("--prompt_tokens must be at least 1");
  // Two tokens make the first gap; one token would measure no time per token.
  if (settings.generate < 2) Die("--generate must be at least 2 (gaps are between tokens)");
  if (settings.load_generate < 2) Die("--load_generate must be 0 or at least 2");
  if (settings.repeats < 1) Die("--repeats must be at least 1");
  if (settings.piece_tokens < 1) Die("--piece_tokens must be at least 1");
  if (settings.load_sessions < 0) Die("--load_sessions must be 0 (skip) or more");
  if (settings.load_sessions > 0 && settings.append_tokens < 1) {
    Die("--append_tokens must be at least 1");
  }
  if (settings.connect_timeout_seconds <= 0 || settings.client.call_timeout_seconds <= 0) {
    Die("--connect_timeout and --call_timeout must be positive");
  }
  if (counts.empty() && settings.load_sessions == 0) {
    Die("nothing to measure: --sessions is empty and --load_sessions is 0");
  }

  auto probe = drt::bench::DrtLoadClient::Connect(settings.client, settings.connect_timeout_seconds);
  if (!probe.ok()) Die(std::string(probe.status().message()));
  auto info = (*probe)->GetModelInfo();
  if (!info.ok()) Die(std::string(info.status().message()));
  auto tokens = drt::bench::UsableTokens(*info);
  if (!tokens.ok()) Die(std::string(tokens.status().message()));
  settings.tokens = *tokens;

  const std::array<double, 3> load_start = LoadAverage();
  std::printf("drt-batch-bench: server %s, model %s on %s (%s, vocab %lld, chunks of %lld, "
              "window %lld)\n",
              settings.client.server.c_str(), info->name().c_str(), info->device().c_str(),
              info->precision().c_str(), static_cast<long long>(info->vocab_size()),
              static_cast<long long>(info->enc_chunk_size()),
              static_cast<long long>(info->slide_window()));
  std::printf("prompts of %lld random token ids, %d generated tokens per Generate (greedy, "
              "ignore_eos, no padding), medians of %d repeats\n",
              static_cast<long long>(settings.prompt_tokens), settings.generate, settings.repeats);
  std::printf("load average at start: %.2f %.2f %.2f\n", load_start[0], load_start[1],
              load_start[2]);
  std::fflush(stdout);

  json out = {{"server", settings.client.server},
              {"model", {{"name", info->name()}, {"device", info->device()},
                         {"precision", info->precision()}, {"vocab_size", info->vocab_size()},
                         {"hidden_size", info->hidden_size()}}},
              {"settings", {{"prompt_tokens", settings.prompt_tokens},
                            {"generate", settings.generate},
                            {"repeats", settings.repeats},
                            {"sessions", counts},
                            {"load_sessions", settings.load_sessions},
                            {"append_tokens", settings.append_tokens},
                            {"load_generate", settings.load_generate},
                            {"piece_tokens", settings.piece_tokens},
                            {"seed", settings.seed}}},
              {"load_average_start", load_start}};

  std::vector<DecodeResult> decode;
  if (!counts.empty()) {
    std::printf("\ndecode: N sessions generate at once\n");
    std::printf("%8s %16s %16s %10s %12s %12s %12s %12s %10s %10s\n", "sessions",
                "aggregate_tok/s", "min-max", absl::StrCat("x_vs_", counts.front()).c_str(),
                "N/p50_tok/s", "ms/token_p50", "ms/token_p99", "ttft_ms_p50", "generated",
                "wall_s");
    json rows = json::array();
    for (int32_t n : counts) {
      auto result = drt::bench::MeasureDecode(n, settings);
      if (!result.ok()) Die(absl::StrCat("decode with ", n, " sessions: ", result.status().message()));
      decode.push_back(*result);
      const auto& m = result->median;
      const double ratio =
          Ratio(m.aggregate_tokens_per_second, decode.front().median.aggregate_tokens_per_second);
      // The spread over repeats: on a shared machine one repeat can differ a lot.
      double lowest = m.aggregate_tokens_per_second, highest = lowest;
      for (const auto& r : result->repeats) {
        lowest = std::min(lowest, r.aggregate_tokens_per_second);
        highest = std::max(highest, r.aggregate_tokens_per_second);
      }
      // The rate at the median gap: N streams each advancing one token per
      // p50. Stalls (a busy machine's, mostly) move the aggregate far more
      // than the median, so this is the steadier of the two on a shared host.
      const double at_median_gap = m.gaps.p50_ms > 0 ? 1000.0 * n / m.gaps.p50_ms : NAN;
      std::printf("%8d %16.1f %16s %10.2f %12.1f %12.2f %12.2f %12.1f %10lld %10.2f\n", n,
                  m.aggregate_tokens_per_second,
                  absl::StrFormat("%.0f-%.0f", lowest, highest).c_str(), ratio, at_median_gap,
                  m.gaps.p50_ms, m.gaps.p99_ms, m.ttft_p50_ms,
                  static_cast<long long>(m.generated_tokens), m.wall_seconds);
      std::fflush(stdout);
      json repeats = json::array();
      for (const auto& r : result->repeats) repeats.push_back(DecodeRepeatJson(r));
      rows.push_back({{"sessions", n},
                      {"median", DecodeRepeatJson(m)},
                      {"aggregate_ratio_vs_first", ratio},
                      {"aggregate_min", lowest},
                      {"tokens_per_second_at_median_gap", at_median_gap},
                      {"aggregate_max", highest},
                      {"repeats", repeats}});
    }
    out["decode"] = rows;
  }

  if (settings.load_sessions > 0) {
    std::printf("\nload: one session generates %d tokens, idle, then while %d sessions stream "
                "Appends (up to %lld tokens each)\n",
                settings.load_generate, settings.load_sessions,
                static_cast<long long>(settings.append_tokens));
    auto result = drt::bench::MeasureTpotUnderLoad(settings);
    if (!result.ok()) Die(absl::StrCat("load: ", result.status().message()));
    const auto& m = result->median;
    std::printf("%12s %12s %12s %12s %12s\n", "", "ms/token_p50", "ms/token_p99", "mean",
                "ttft_ms");
    std::printf("%12s %12.2f %12.2f %12.2f %12.1f\n", "idle", m.idle.p50_ms, m.idle.p99_ms,
                m.idle.mean_ms, m.idle_ttft_ms);
    std::printf("%12s %12.2f %12.2f %12.2f %12.1f\n", "under load", m.loaded.p50_ms,
                m.loaded.p99_ms, m.loaded.mean_ms, m.loaded_ttft_ms);
    const double p50_ratio = Ratio(m.loaded.p50_ms, m.idle.p50_ms);
    const double p99_ratio = Ratio(m.loaded.p99_ms, m.idle.p99_ms);
    std::printf("%12s %12.2f %12.2f\n", "load/idle", p50_ratio, p99_ratio);
    std::printf("load sessions ingested %.0f tokens/s together (%.0f each) during the measured "
                "Generate\n",
                m.load_tokens_per_second, m.load_tokens_per_second / settings.load_sessions);
    if (!m.load_covered_generate) {
      std::printf("warning: a load Append ended before the measured Generate did; raise "
                  "--append_tokens\n");
    }
    json repeats = json::array();
    for (const auto& r : result->repeats) repeats.push_back(LoadRepeatJson(r));
    out["load"] = {{"median", LoadRepeatJson(m)},
                   {"p50_ratio_load_vs_idle", p50_ratio},
                   {"p99_ratio_load_vs_idle", p99_ratio},
                   {"repeats", repeats}};
  }

  const std::array<double, 3> load_end = LoadAverage();
  out["load_average_end"] = load_end;
  std::printf("\nload average at end: %.2f %.2f %.2f\n", load_end[0], load_end[1], load_end[2]);
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream file(path);
    file << out.dump(2) << "\n";
    if (!file) Die(absl::StrCat("cannot write --json ", path));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<char*> rest = drt::cli::ParseCommandLine(
      {"drt-batch-bench",
       "measures a running drt-server with many sessions at once: aggregate decode tokens/s "
       "with N sessions generating, and the time per output token of one session while "
       "others stream big Appends.\n"
       "  drt-batch-bench --server 127.0.0.1:50051 --sessions 1,4,16,64 --prompt_tokens 4000 "
       "--generate 256 --load_sessions 8 --json out.json",
       {"bench/batch/batch_bench.cc"}},
      argc, argv);
  if (rest.size() > 1) Die(absl::StrCat("unexpected argument '", rest[1], "'"));
  return Run();
}

#include "bench/batch/measurements.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <latch>
#include <memory>
#include <numeric>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "bench/batch/background_append.h"
#include "bench/batch/latency_stats.h"

namespace drt::bench {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Runs body(0) .. body(n - 1) on n threads at once; the first error, if any.
absl::Status ParallelFor(int32_t n, const std::function<absl::Status(int32_t)>& body) {
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int32_t i = 0; i < n; ++i) threads.emplace_back([&, i] { results[i] = body(i); });
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<DrtLoadClient>>> ConnectClients(
    int32_t n, const BenchSettings& settings) {
  std::vector<std::unique_ptr<DrtLoadClient>> clients;
  for (int32_t i = 0; i < n; ++i) {
    auto client = DrtLoadClient::Connect(settings.client, settings.connect_timeout_seconds);
    if (!client.ok()) return client.status();
    clients.push_back(*std::move(client));
  }
  return clients;
}

// Sessions this measurement created, one per client (empty: none yet);
// deleted when it goes out of scope, however the measurement ends.
class OwnedSessions {
 public:
  explicit OwnedSessions(const std::vector<std::unique_ptr<DrtLoadClient>>& clients)
      : clients_(clients), ids_(clients.size()) {}
  ~OwnedSessions() {
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (ids_[i].empty()) continue;
      if (absl::Status s = clients_[i]->DeleteSession(ids_[i]); !s.ok()) {
        std::fprintf(stderr, "drt-batch-bench: %s\n", std::string(s.message()).c_str());
      }
    }
  }
  OwnedSessions(const OwnedSessions&) = delete;
  OwnedSessions& operator=(const OwnedSessions&) = delete;

  absl::Status Create(size_t i) {
    auto id = clients_[i]->CreateSession();
    if (!id.ok()) return id.status();
    ids_[i] = *id;
    return absl::OkStatus();
  }
  const std::string& id(size_t i) const { return ids_[i]; }

 private:
  const std::vector<std::unique_ptr<DrtLoadClient>>& clients_;
  std::vector<std::string> ids_;
};

double FirstTokenMs(const GenerateRecord& r) {
  for (const PieceArrival& a : r.arrivals) {
    if (a.tokens > 0) return 1000.0 * a.seconds;
  }
  return 0;
}

template <typename T, typename F>
double MedianOf(const std::vector<T>& items, F field) {
  std::vector<double> values;
  for (const T& item : items) values.push_back(static_cast<double>(field(item)));
  return Median(std::move(values));
}

GapStats MedianGaps(const std::vector<GapStats>& all) {
  GapStats m;
  m.count = static_cast<int64_t>(MedianOf(all, [](const GapStats& g) { return g.count; }));
  m.p50_ms = MedianOf(all, [](const GapStats& g) { return g.p50_ms; });
  m.p99_ms = MedianOf(all, [](const GapStats& g) { return g.p99_ms; });
  m.mean_ms = MedianOf(all, [](const GapStats& g) { return g.mean_ms; });
  m.max_ms = MedianOf(all, [](const GapStats& g) { return g.max_ms; });
  return m;
}

// Polls `condition` every 20 ms; DEADLINE_EXCEEDED naming `what` after
// `seconds`, or the condition's own error.
absl::Status WaitUntil(const std::function<absl::StatusOr<bool>()>& condition, double seconds,
                       const std::string& what) {
  const auto start = Clock::now();
  while (true) {
    absl::StatusOr<bool> done = condition();
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    if (Seconds(Clock::now() - start) > seconds) {
      return absl::DeadlineExceededError(
          absl::StrFormat("waited %g s for %s", seconds, what));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

GapStats SummarizeGaps(const std::vector<double>& gaps_ms) {
  GapStats g;
  g.count = static_cast<int64_t>(gaps_ms.size());
  if (gaps_ms.empty()) return g;
  g.p50_ms = Percentile(gaps_ms, 0.5);
  g.p99_ms = Percentile(gaps_ms, 0.99);
  g.mean_ms = std::accumulate(gaps_ms.begin(), gaps_ms.end(), 0.0) / gaps_ms.size();
  g.max_ms = *std::max_element(gaps_ms.begin(), gaps_ms.end());
  return g;
}

absl::StatusOr<DecodeResult> MeasureDecode(int32_t sessions, const BenchSettings& settings) {
  auto clients = ConnectClients(sessions, settings);
  if (!clients.ok()) return clients.status();
  OwnedSessions owned(*clients);
  // The prompts go in at once, as N users would send them.
  if (absl::Status s = ParallelFor(sessions, [&](int32_t i) -> absl::Status {
        if (absl::Status c = owned.Create(i); !c.ok()) return c;
        const std::vector<int32_t> prompt =
            RandomTokens(settings.prompt_tokens, settings.tokens, settings.seed + i);
        return (*clients)[i]->Append(owned.id(i), prompt, settings.piece_tokens).status();
      });
      !s.ok()) {
    return s;
  }

  DecodeResult result;
  result.sessions = sessions;
  result.context_tokens = settings.prompt_tokens;
  for (int32_t r = 0; r < settings.repeats; ++r) {
    std::vector<absl::StatusOr<GenerateRecord>> records(
        sessions, absl::UnknownError("Generate did not run"));
    std::latch go(1);
    std::vector<std::thread> threads;
    for (int32_t i = 0; i < sessions; ++i) {
      threads.emplace_back([&, i] {
        go.wait();
        records[i] = (*clients)[i]->Generate(owned.id(i), settings.generate);
      });
    }
    const auto start = Clock::now();
    go.count_down();
    for (std::thread& t : threads) t.join();

    DecodeRepeat rep;
    std::vector<double> gaps, ttfts;
    Clock::time_point last_end = start;
    for (const auto& record : records) {
      if (!record.ok()) return record.status();
      rep.generated_tokens += record->tokens;
      last_end = std::max(last_end, record->end);
      const std::vector<double> g = TokenGapsMs(record->arrivals);
      gaps.insert(gaps.end(), g.begin(), g.end());
      ttfts.push_back(FirstTokenMs(*record));
    }
    rep.wall_seconds = Seconds(last_end - start);
    rep.aggregate_tokens_per_second = rep.generated_tokens / rep.wall_seconds;
    rep.ttft_p50_ms = Median(ttfts);
    rep.gaps = SummarizeGaps(gaps);
    std::fprintf(stderr, "  %d sessions, repeat %d/%d: %.1f tokens/s together\n", sessions, r + 1,
                 settings.repeats, rep.aggregate_tokens_per_second);
    result.repeats.push_back(rep);
  }

  const auto& reps = result.repeats;
  DecodeRepeat& m = result.median;
  m.generated_tokens =
      static_cast<int64_t>(MedianOf(reps, [](const DecodeRepeat& x) { return x.generated_tokens; }));
  m.wall_seconds = MedianOf(reps, [](const DecodeRepeat& x) { return x.wall_seconds; });
  m.aggregate_tokens_per_second =
      MedianOf(reps, [](const DecodeRepeat& x) { return x.aggregate_tokens_per_second; });
  m.ttft_p50_ms = MedianOf(reps, [](const DecodeRepeat& x) { return x.ttft_p50_ms; });
  std::vector<GapStats> gap_stats;
  for (const DecodeRepeat& x : reps) gap_stats.push_back(x.gaps);
  m.gaps = MedianGaps(gap_stats);
  return result;
}

absl::StatusOr<LoadResult> MeasureTpotUnderLoad(const BenchSettings& settings) {
  // Client 0 generates; clients 1..K stream the load.
  auto clients = ConnectClients(settings.load_sessions + 1, settings);
  if (!clients.ok()) return clients.status();
  DrtLoadClient& generator = *(*clients)[0];
  OwnedSessions owned(*clients);
  if (absl::Status s = owned.Create(0); !s.ok()) return s;
  const std::vector<int32_t> prompt =
      RandomTokens(settings.prompt_tokens, settings.tokens, settings.seed);
  if (auto s = generator.Append(owned.id(0), prompt, settings.piece_tokens); !s.ok()) {
    return s.status();
  }

  LoadResult result;
  for (int32_t r = 0; r < settings.repeats; ++r) {
    LoadRepeat rep;
    auto idle = generator.Generate(owned.id(0), settings.load_generate);
    if (!idle.ok()) return idle.status();
    rep.idle = SummarizeGaps(TokenGapsMs(idle->arrivals));
    rep.idle_ttft_ms = FirstTokenMs(*idle);

    // Fresh load sessions each repeat, deleted at its end.
    OwnedSessions load_sessions(*clients);
    std::vector<std::unique_ptr<BackgroundAppend>> loads;
    for (int32_t k = 1; k <= settings.load_sessions; ++k) {
      if (absl::Status s = load_sessions.Create(k); !s.ok()) return s;
      loads.push_back(std::make_unique<BackgroundAppend>(
          *(*clients)[k], load_sessions.id(k), settings.append_tokens, settings.piece_tokens,
          settings.tokens, settings.seed + 1000 * (r + 1) + k));
    }
    auto load_tokens = [&]() -> absl::StatusOr<int64_t> {
      int64_t sum = 0;
      for (int32_t k = 1; k <= settings.load_sessions; ++k) {
        auto info = (*clients)[k]->GetSession(load_sessions.id(k));
        if (!info.ok()) return info.status();
        sum += info->tokens();
      }
      return sum;
    };
    // The load is on once every load session has had a step through.
    absl::Status started = WaitUntil(
        [&]() -> absl::StatusOr<bool> {
          for (int32_t k = 1; k <= settings.load_sessions; ++k) {
            if (loads[k - 1]->ended()) {
              if (absl::Status s = loads[k - 1]->Stop(); !s.ok()) return s;
              return absl::FailedPreconditionError(absl::StrFormat(
                  "the load Append of %d tokens to session %s ended before the measurement "
                  "started; raise --append_tokens",
                  settings.append_tokens, load_sessions.id(k)));
            }
            auto info = (*clients)[k]->GetSession(load_sessions.id(k));
            if (!info.ok()) return info.status();
            if (info->tokens() == 0) return false;
          }
          return true;
        },
        settings.client.call_timeout_seconds, "every load session to ingest its first tokens");
    if (!started.ok()) return started;

    auto before = load_tokens();
    if (!before.ok()) return before.status();
    auto loaded = generator.Generate(owned.id(0), settings.load_generate);
    if (!loaded.ok()) return loaded.status();
    for (const auto& load : loads) rep.load_covered_generate &= !load->ended();
    auto after = load_tokens();
    if (!after.ok()) return after.status();
    rep.loaded = SummarizeGaps(TokenGapsMs(loaded->arrivals));
    rep.loaded_ttft_ms = FirstTokenMs(*loaded);
    rep.load_seconds = Seconds(loaded->end - loaded->start);
    rep.load_tokens_ingested = *after - *before;
    rep.load_tokens_per_second = rep.load_tokens_ingested / rep.load_seconds;

    for (const auto& load : loads) {
      if (absl::Status s = load->Stop(); !s.ok()) return s;
    }
    // A cancelled Append ends at the server after its running step; the next
    // idle measurement must not share the machine with it.
    absl::Status quiet = WaitUntil(
        [&]() -> absl::StatusOr<bool> {
          for (int32_t k = 1; k <= settings.load_sessions; ++k) {
            auto info = (*clients)[k]->GetSession(load_sessions.id(k));
            if (!info.ok()) return info.status();
            if (info->busy()) return false;
          }
          return true;
        },
        settings.client.call_timeout_seconds, "the cancelled load Appends to end");
    if (!quiet.ok()) return quiet;
    std::fprintf(stderr,
                 "  load repeat %d/%d: ms/token p50 %.2f idle, %.2f loaded; p99 %.2f idle, %.2f "
                 "loaded; load ingested %lld tokens\n",
                 r + 1, settings.repeats, rep.idle.p50_ms, rep.loaded.p50_ms, rep.idle.p99_ms,
                 rep.loaded.p99_ms, static_cast<long long>(rep.load_tokens_ingested));
    result.repeats.push_back(rep);
  }

  const auto& reps = result.repeats;
  LoadRepeat& m = result.median;
  std::vector<GapStats> idle, loaded;
  for (const LoadRepeat& x : reps) {
    idle.push_back(x.idle);
    loaded.push_back(x.loaded);
    m.load_covered_generate &= x.load_covered_generate;
  }
  m.idle = MedianGaps(idle);
  m.loaded = MedianGaps(loaded);
  m.idle_ttft_ms = MedianOf(reps, [](const LoadRepeat& x) { return x.idle_ttft_ms; });
  m.loaded_ttft_ms = MedianOf(reps, [](const LoadRepeat& x) { return x.loaded_ttft_ms; });
  m.load_seconds = MedianOf(reps, [](const LoadRepeat& x) { return x.load_seconds; });
  m.load_tokens_ingested = static_cast<int64_t>(
      MedianOf(reps, [](const LoadRepeat& x) { return x.load_tokens_ingested; }));
  m.load_tokens_per_second =
      MedianOf(reps, [](const LoadRepeat& x) { return x.load_tokens_per_second; });
  return result;
}

}  // namespace drt::bench

// CUDA decode graphs (CudaBackendOptions::decode_graphs, engine/cuda/
// cuda_decode_graph.h): a session whose decode steps replay a captured graph
// gives the logits and retrievals of the same session run kernel by kernel,
// bit for bit (the graph holds the same kernels with the same arguments; only
// the position is read from device memory, and the open chunk's row is
// copied by a kernel instead of a memcpy: both exact), across landmarks, the
// window boundary and a fork, on the device chunk tier past two store
// growths (each clears the graphs), with the encoder-row store,
// window_decode_splits 1, and while other threads make, fork and free
// sessions; its counters show one capture per shape (and growth) and a
// replay for every decode step that does not close a chunk but the first,
// which runs eagerly as the warm-up before the capture (counted here
// independently of engine/cuda/host/decode_graph_plan.h: a token closes a
// chunk when it is the 63rd of its chunk). Written without a GPU: NOT YET
// RUN ON ONE.
#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "engine/backend_factory.h"
#include "engine/batch_step.h"
#include "engine/session.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

using testing::Chunk64Config;

// Appends `tokens` one at a time; the logits of each, in order.
std::vector<float> DecodeOneByOne(Session& s, absl::Span<const int32_t> tokens) {
  AppendOptions options;
  options.all_logits = true;
  std::vector<float> logits;
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto result = s.Append(tokens.subspan(i, 1), options);
    REQUIRE(result.ok());
    logits.insert(logits.end(), result->logits.begin(), result->logits.end());
  }
  return logits;
}

// Decode steps of `count` tokens appended one by one to a session holding
// `held` real tokens that do not close a chunk, but for the first of them
// (the warm-up, run eagerly before the capture): those replay a graph.
int64_t ExpectedReplays(const ModelConfig& config, int64_t held, int64_t count) {
  const int64_t k = config.enc_chunk_size;
  int64_t eligible = 0;
  for (int64_t t = held; t < held + count; ++t) eligible += (t + 1) % k != 0;
  return eligible - 1;
}

void CheckSameRetrievals(const testing::RetrievalLog& off, const testing::RetrievalLog& on) {
  REQUIRE(on.size() == off.size());
  for (const auto& [key, r] : off) {
    INFO("chunk " << key.first << " group " << key.second);
    auto it = on.find(key);
    REQUIRE(it != on.end());
    CHECK(it->second.chunks == r.chunks);
    CHECK(it->second.weights == r.weights);  // bit-identical
  }
}

// A session of `backend` given `prompt` at once, then `decode` one token
// at a time: its logits (all rows), retrievals and counters.
struct DecodeRun {
  std::vector<float> logits;
  testing::RetrievalLog log;
  BackendSessionStats stats;
};
DecodeRun PrefillAndDecode(Backend& backend, absl::Span<const int32_t> prompt,
                           absl::Span<const int32_t> decode) {
  DecodeRun run;
  auto session = Session::Create(backend);
  REQUIRE(session.ok());
  testing::Record((*session)->backend_session(), run.log);
  AppendOptions all;
  all.all_logits = true;
  auto prefill = (*session)->Append(prompt, all);
  REQUIRE(prefill.ok());
  run.logits = prefill->logits;
  const std::vector<float> decoded = DecodeOneByOne(**session, decode);
  run.logits.insert(run.logits.end(), decoded.begin(), decoded.end());
  run.stats = (*session)->backend_session().stats();
  return run;
}

// `options` with decode_graphs off and on: the same logits and retrievals
// bit for bit, the same transfers; the graphs' counters are returned.
BackendSessionStats CheckGraphsMatchEager(const ModelConfig& config, const ModelWeights& weights,
                                          CudaBackendOptions options,
                                          absl::Span<const int32_t> prompt,
                                          absl::Span<const int32_t> decode) {
  options.decode_graphs = false;
  auto off_backend = MakeCudaBackend(config, weights, options);
  options.decode_graphs = true;
  auto on_backend = MakeCudaBackend(config, weights, options);
  REQUIRE(off_backend.ok());
  REQUIRE(on_backend.ok());
  const DecodeRun off = PrefillAndDecode(**off_backend, prompt, decode);
  const DecodeRun on = PrefillAndDecode(**on_backend, prompt, decode);
  REQUIRE(on.logits.size() == (prompt.size() + decode.size()) * config.vocab_size);
  REQUIRE(on.logits.size() == off.logits.size());
  CHECK(on.logits == off.logits);
  CheckSameRetrievals(off.log, on.log);
  CHECK(off.stats.graph_captures == 0);
  CHECK(off.stats.graph_replays == 0);
  CHECK(on.stats.graph_capture_failures == 0);
  CHECK(on.stats.h2d_chunks == off.stats.h2d_chunks);
  CHECK(on.stats.resident_hits == off.stats.resident_hits);
  return on.stats;
}

struct GraphCase {
  CudaPrecision precision;
  int window_decode_splits;
};

std::vector<GraphCase> Cases() {
  int major = 0;
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  std::vector<GraphCase> cases;
  for (CudaPrecision p : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    cases.push_back({p, 0});
    if (major >= 9) cases.push_back({p, 8});
  }
  if (major < 9) WARN("compute capability " << major << ".x: window_decode_splits 8 not tested");
  return cases;
}

TEST_CASE("cuda: decode graphs give the eager decode's logits bit for bit, across landmarks, "
          "the window boundary and a fork",
          "[cuda][decode_graphs]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();  // window 100, 63 tokens per chunk
  const ModelWeights weights = testing::RandomWeights(config, 81);
  // A 40-token prompt leaves the first decode steps inside the window;
  // 300 decode tokens cross position 100 and close 5 chunks; the fork at 150
  // decodes 120 tokens of its own, tokens 190..309, which close one chunk
  // (token 251, the 63rd of chunk 3).
  const auto prompt = testing::RandomTokens(config, 40, 82);
  const auto decode = testing::RandomTokens(config, 300, 83);
  const auto fork_tokens = testing::RandomTokens(config, 120, 84);
  const int64_t fork_at = 150;
  const int64_t V = config.vocab_size;
  for (const GraphCase& c : Cases()) {
    INFO("precision " << CudaPrecisionName(c.precision) << " window_decode_splits "
                      << c.window_decode_splits);
    CudaBackendOptions options = testing::PrecisionOptions(c.precision);
    options.window_decode_splits = c.window_decode_splits;
    auto off_backend = MakeCudaBackend(config, weights, options);
    options.decode_graphs = true;
    auto on_backend = MakeCudaBackend(config, weights, options);
    REQUIRE(off_backend.ok());
    REQUIRE(on_backend.ok());

    struct Run {
      std::unique_ptr<Session> session, fork;
      testing::RetrievalLog log, fork_log;
      std::vector<float> logits, fork_logits;
    };
    auto run = [&](Backend& backend) {
      auto r = std::make_unique<Run>();
      auto session = Session::Create(backend);
      REQUIRE(session.ok());
      r->session = *std::move(session);
      testing::Record(r->session->backend_session(), r->log);
      AppendOptions all;
      all.all_logits = true;
      auto prefill = r->session->Append(prompt, all);
      REQUIRE(prefill.ok());
      r->logits = prefill->logits;
      const auto first = DecodeOneByOne(*r->session, absl::MakeConstSpan(decode).first(fork_at));
      r->logits.insert(r->logits.end(), first.begin(), first.end());
      auto fork = r->session->Fork();
      REQUIRE(fork.ok());
      r->fork = *std::move(fork);
      testing::Record(r->fork->backend_session(), r->fork_log);
      // Interleaved: each session's graph must hold its own buffers.
      for (size_t i = 0; i < fork_tokens.size(); ++i) {
        const auto a = DecodeOneByOne(*r->fork, absl::MakeConstSpan(fork_tokens).subspan(i, 1));
        r->fork_logits.insert(r->fork_logits.end(), a.begin(), a.end());
        const auto b = DecodeOneByOne(*r->session,
                                      absl::MakeConstSpan(decode).subspan(fork_at + i, 1));
        r->logits.insert(r->logits.end(), b.begin(), b.end());
      }
      const auto rest = DecodeOneByOne(
          *r->session, absl::MakeConstSpan(decode).subspan(fork_at + fork_tokens.size()));
      r->logits.insert(r->logits.end(), rest.begin(), rest.end());
      return r;
    };
    const auto off = run(**off_backend);
    const auto on = run(**on_backend);

    REQUIRE(on->logits.size() == (prompt.size() + decode.size()) * V);
    REQUIRE(on->logits.size() == off->logits.size());
    CHECK(on->logits == off->logits);
    CHECK(on->fork_logits == off->fork_logits);
    double worst = testing::WorstRowRelativeDifference(on->logits, off->logits, V);
    INFO("worst relative difference " << worst);
    CheckSameRetrievals(off->log, on->log);
    CheckSameRetrievals(off->fork_log, on->fork_log);
    REQUIRE(on->log.size() >= 5 * static_cast<size_t>(config.num_groups()));

    const BackendSessionStats off_stats = off->session->backend_session().stats();
    CHECK(off_stats.graph_captures == 0);
    CHECK(off_stats.graph_replays == 0);
    const BackendSessionStats stats = on->session->backend_session().stats();
    CHECK(stats.graph_captures == 1);  // one shape: one-row decode steps
    CHECK(stats.graph_replays ==
          ExpectedReplays(config, static_cast<int64_t>(prompt.size()),
                          static_cast<int64_t>(decode.size())));
    // A fork starts without graphs and captures its own.
    const BackendSessionStats fork_stats = on->fork->backend_session().stats();
    CHECK(fork_stats.graph_captures == 1);
    CHECK(fork_stats.graph_replays ==
          ExpectedReplays(config, static_cast<int64_t>(prompt.size()) + fork_at,
                          static_cast<int64_t>(fork_tokens.size())));
    // The same transfers as the eager run: the staging and fetches are the
    // eager ones, done before the launch.
    const BackendSessionStats off_fork = off->fork->backend_session().stats();
    CHECK(stats.h2d_chunks == off_stats.h2d_chunks);
    CHECK(stats.resident_hits == off_stats.resident_hits);
    CHECK(fork_stats.resident_hits == off_fork.resident_hits);
  }
}

TEST_CASE("cuda: decode graphs in steps of several sessions, replayed and eager slices mixed",
          "[cuda][decode_graphs]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 85);
  const int64_t k = config.enc_chunk_size;
  for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    INFO("precision " << CudaPrecisionName(precision));
    CudaBackendOptions options = testing::PrecisionOptions(precision);
    auto off_backend = MakeCudaBackend(config, weights, options);
    options.decode_graphs = true;
    auto on_backend = MakeCudaBackend(config, weights, options);
    REQUIRE(off_backend.ok());
    REQUIRE(on_backend.ok());
    // Histories: mid-chunk, a first token that closes a chunk, a chunk boundary,
    // and a session that takes a 100-token prefill piece every 20 steps.
    const std::vector<int64_t> histories = {3 * k + 10, 5 * k + 62, 2 * k, 4 * k + 7};
    struct Side {
      std::vector<std::unique_ptr<Session>> sessions;
      std::vector<testing::RetrievalLog> logs;
      std::vector<std::vector<float>> logits;
    };
    auto make_side = [&](Backend& backend) {
      auto side = std::make_unique<Side>();
      side->logs.resize(histories.size());
      side->logits.resize(histories.size());
      for (size_t i = 0; i < histories.size(); ++i) {
        auto s = Session::Create(backend);
        REQUIRE(s.ok());
        REQUIRE((*s)->Append(testing::RandomTokens(config, histories[i], 90 + i)).ok());
        testing::Record((*s)->backend_session(), side->logs[i]);
        side->sessions.push_back(*std::move(s));
      }
      return side;
    };
    auto off = make_side(**off_backend);
    auto on = make_side(**on_backend);
    for (int step = 0; step < 70; ++step) {
      INFO("step " << step);
      std::vector<std::vector<int32_t>> tokens(histories.size());
      for (size_t i = 0; i < histories.size(); ++i) {
        const bool piece = i == 3 && step % 20 == 0;
        tokens[i] = testing::RandomTokens(config, piece ? 100 : 1, 1000 * step + i);
      }
      for (Side* side : {off.get(), on.get()}) {
        std::vector<StepEntry> entries(histories.size());
        for (size_t i = 0; i < histories.size(); ++i) {
          entries[i].session = side->sessions[i].get();
          entries[i].tokens = tokens[i];
          entries[i].all_logits = &side->logits[i];
        }
        for (const absl::Status& s : RunStep(side == on.get() ? **on_backend : **off_backend,
                                             entries)) {
          REQUIRE(s.ok());
        }
      }
    }
    for (size_t i = 0; i < histories.size(); ++i) {
      INFO("session " << i);
      CHECK(on->logits[i] == off->logits[i]);
      CheckSameRetrievals(off->logs[i], on->logs[i]);
      const BackendSessionStats stats = on->sessions[i]->backend_session().stats();
      CHECK(stats.graph_captures == 1);
      CHECK(stats.graph_replays > 0);
    }
    // Session 0 decodes one token per step: 70 steps from 3k + 10 held
    // close one chunk (its 63rd token), and the first is the warm-up: 68.
    CHECK(on->sessions[0]->backend_session().stats().graph_replays == 68);
  }
}

TEST_CASE("cuda: decode graphs of the base LM (disable_gca) give its eager logits",
          "[cuda][decode_graphs]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 87);
  const auto prompt = testing::RandomTokens(config, 30, 88);
  const auto decode = testing::RandomTokens(config, 150, 89);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kBf16);
  options.disable_gca = true;
  auto off_backend = MakeCudaBackend(config, weights, options);
  options.decode_graphs = true;
  auto on_backend = MakeCudaBackend(config, weights, options);
  REQUIRE(off_backend.ok());
  REQUIRE(on_backend.ok());
  std::vector<std::vector<float>> logits;
  std::vector<BackendSessionStats> stats;
  for (Backend* backend : {off_backend->get(), on_backend->get()}) {
    auto session = Session::Create(*backend);
    REQUIRE(session.ok());
    REQUIRE((*session)->Append(prompt).ok());
    logits.push_back(DecodeOneByOne(**session, decode));
    stats.push_back((*session)->backend_session().stats());
  }
  CHECK(logits[1] == logits[0]);
  CHECK(stats[0].graph_replays == 0);
  CHECK(stats[1].graph_captures == 1);
  CHECK(stats[1].graph_replays ==
        ExpectedReplays(config, static_cast<int64_t>(prompt.size()),
                        static_cast<int64_t>(decode.size())));
}

TEST_CASE("cuda: decode graphs on the device chunk tier are captured again when the store grows",
          "[cuda][decode_graphs]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 91);
  const int64_t k = config.enc_chunk_size;  // real tokens per chunk
  // 14 chunks closed by the prompt; the decode closes chunks 15..34: the
  // store (docs/cuda.md, "Device tier": 16 chunks at first, doubling) grows
  // when chunk 17 and chunk 33 close, both during the decode.
  const auto prompt = testing::RandomTokens(config, 14 * k + 20, 92);
  const auto decode = testing::RandomTokens(config, 20 * k + 10, 93);
  const int64_t closed_before = static_cast<int64_t>(prompt.size()) / k;
  const int64_t closed_after = static_cast<int64_t>(prompt.size() + decode.size()) / k;
  int64_t growths = 0;
  for (int64_t capacity = 16; capacity < closed_after; capacity *= 2) {
    if (capacity >= closed_before) ++growths;  // chunk capacity + 1 closes while decoding
  }
  REQUIRE(growths == 2);
  for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    INFO("precision " << CudaPrecisionName(precision));
    CudaBackendOptions options = testing::PrecisionOptions(precision);
    options.chunk_tier = CudaChunkTier::kDevice;
    const BackendSessionStats stats =
        CheckGraphsMatchEager(config, weights, options, prompt, decode);
    // Each growth clears the graphs: the next eligible step warms up again
    // and the one after captures.
    CHECK(stats.graph_captures == 1 + growths);
    CHECK(stats.graph_replays == ExpectedReplays(config, static_cast<int64_t>(prompt.size()),
                                                 static_cast<int64_t>(decode.size())) -
                                     growths);
  }
}

TEST_CASE("cuda: decode graphs with the encoder-row chunk store and window_decode_splits 1 give "
          "the eager logits",
          "[cuda][decode_graphs]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 94);
  // Past the window and 4 landmarks.
  const auto prompt = testing::RandomTokens(config, 70, 95);
  const auto decode = testing::RandomTokens(config, 200, 96);
  const int64_t replays = ExpectedReplays(config, static_cast<int64_t>(prompt.size()),
                                          static_cast<int64_t>(decode.size()));
  SECTION("chunk_store encoder_rows") {
    for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
      INFO("precision " << CudaPrecisionName(precision));
      CudaBackendOptions options = testing::PrecisionOptions(precision);
      options.chunk_store = CudaChunkStore::kEncoderRows;
      const BackendSessionStats stats =
          CheckGraphsMatchEager(config, weights, options, prompt, decode);
      CHECK(stats.graph_captures == 1);
      CHECK(stats.graph_replays == replays);
    }
  }
  SECTION("window_decode_splits 1") {
    for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
      INFO("precision " << CudaPrecisionName(precision));
      CudaBackendOptions options = testing::PrecisionOptions(precision);
      options.window_decode_splits = 1;
      const BackendSessionStats stats =
          CheckGraphsMatchEager(config, weights, options, prompt, decode);
      CHECK(stats.graph_captures == 1);
      CHECK(stats.graph_replays == replays);
    }
  }
}

// Stream capture is thread-local (cudaStreamCaptureModeThreadLocal): other
// threads' sessions being made (allocations, a cuBLAS handle for the
// encoder-row store), forked, stepped and freed while one session captures
// and replays must neither break its capture nor change its logits.
TEST_CASE("cuda: decode graphs while other threads make, fork and free sessions",
          "[cuda][decode_graphs]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 97);
  const auto prompt = testing::RandomTokens(config, 40, 98);
  const auto decode = testing::RandomTokens(config, 200, 99);
  const auto churn_prompt = testing::RandomTokens(config, 70, 100);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kBf16);
  options.chunk_store = CudaChunkStore::kEncoderRows;
  auto off_backend = MakeCudaBackend(config, weights, options);
  options.decode_graphs = true;
  auto on_backend = MakeCudaBackend(config, weights, options);
  REQUIRE(off_backend.ok());
  REQUIRE(on_backend.ok());
  const DecodeRun off = PrefillAndDecode(**off_backend, prompt, decode);

  std::atomic<bool> done{false};
  std::atomic<int64_t> churned{0};
  std::atomic<bool> churn_failed{false};
  std::vector<std::thread> churners;
  for (int t = 0; t < 2; ++t) {
    churners.emplace_back([&, t] {
      // No Catch assertions off the main thread: failures are flagged.
      while (!done.load()) {
        auto session = Session::Create(**on_backend);
        if (!session.ok() || !(*session)->Append(churn_prompt).ok()) {
          churn_failed = true;
          return;
        }
        auto fork = (*session)->Fork();
        if (!fork.ok()) {
          churn_failed = true;
          return;
        }
        // Three decode steps: a warm-up, a capture and a replay of the
        // fork's own graph, on this thread.
        for (int i = 0; i < 3; ++i) {
          if (!(*fork)->Append(absl::MakeConstSpan(churn_prompt).subspan(t + i, 1)).ok()) {
            churn_failed = true;
            return;
          }
        }
        ++churned;  // both freed here
      }
    });
  }
  // The decode (and its capture) starts once the others are under way.
  while (churned.load() == 0 && !churn_failed.load()) std::this_thread::yield();
  const DecodeRun on = PrefillAndDecode(**on_backend, prompt, decode);
  const int64_t churned_during = churned.load();
  done = true;
  for (std::thread& t : churners) t.join();
  CHECK_FALSE(churn_failed.load());
  // The other threads ran until the decode ended (none failed).
  INFO("sessions made and freed by the other threads while decoding: " << churned_during);
  CHECK(on.logits == off.logits);
  CheckSameRetrievals(off.log, on.log);
  CHECK(on.stats.graph_capture_failures == 0);
  CHECK(on.stats.graph_captures == 1);
  CHECK(on.stats.graph_replays == ExpectedReplays(config, static_cast<int64_t>(prompt.size()),
                                                  static_cast<int64_t>(decode.size())));
}

TEST_CASE("cuda: decode_graphs with batched_step_rows is refused", "[cuda][decode_graphs]") {
  // Refused before any device is touched: runs without a GPU too.
  const ModelConfig config = Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 86);
  CudaBackendOptions options;
  options.decode_graphs = true;
  options.batched_step_rows = true;
  const absl::Status status = MakeCudaBackend(config, weights, options).status();
  INFO(status.message());
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(status.message(), "decode_graphs and batched_step_rows"));
}

}  // namespace
}  // namespace drt

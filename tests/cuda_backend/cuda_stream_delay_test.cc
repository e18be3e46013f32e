// The test-only stream delay (CudaBackendOptions::debug_stream_delay,
// review-cuda F1): off by default, its "STREAM:NS" form, and
// MakeCudaBackend's refusals. MakeCudaBackend checks the options before it
// looks for a GPU, so these run (and must pass) without one. What the delay
// is for (the bit-identity cases with each stream delayed) runs on a GPU:
// scripts/gpu_bench.sh STREAM_DELAY_RUNS. Each delay queued is counted
// (BackendSessionStats::stream_delays, CudaStreamDelay::tally; review-cudaprep
// C3 b): the counting rule is checked here without a GPU, and on a GPU that
// every stream's delays are queued and counted on each of the backend's
// paths, with the CPU backend's logits and selections under the delay.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "engine/batch_step.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/debug_stream_delay.h"
#include "engine/cuda/host/stream_delay.h"
#include "engine/session.h"
#include "kernels/device_query.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("cuda stream delay: off by default", "[cuda][stream_delay]") {
  const CudaBackendOptions options;
  CHECK(options.debug_stream_delay.stream == CudaDelayedStream::kNone);
  CHECK(options.debug_stream_delay.ns == 0);
  CHECK(CheckCudaStreamDelay(options.debug_stream_delay).ok());
  auto none = ParseCudaStreamDelay("");
  REQUIRE(none.ok());
  CHECK(none->stream == CudaDelayedStream::kNone);
  CHECK(none->ns == 0);
}

TEST_CASE("cuda stream delay: STREAM:NS names each stream", "[cuda][stream_delay]") {
  struct Case {
    const char* spec;
    CudaDelayedStream stream;
    int64_t ns;
  };
  for (const Case& c : {Case{"store:1000000", CudaDelayedStream::kStore, 1000000},
                        Case{"fetch:5", CudaDelayedStream::kFetch, 5},
                        Case{"step:2000000", CudaDelayedStream::kStep, 2000000},
                        Case{"compute:100000000", CudaDelayedStream::kCompute, 100000000}}) {
    INFO(c.spec);
    auto parsed = ParseCudaStreamDelay(c.spec);
    REQUIRE(parsed.ok());
    CHECK(parsed->stream == c.stream);
    CHECK(parsed->ns == c.ns);
    CHECK(CheckCudaStreamDelay(*parsed).ok());
    CHECK(std::string(c.spec).rfind(CudaDelayedStreamName(c.stream), 0) == 0);
  }
}

TEST_CASE("cuda stream delay: a bad form is refused by name", "[cuda][stream_delay]") {
  struct Case {
    const char* spec;
    const char* message;  // a part of the error's
  };
  for (const Case& c : {Case{"graph:1000", "unknown stream 'graph'"},
                        Case{"fetch", "expected STREAM:NS"},
                        Case{"fetch:", "not a whole number"},
                        Case{"fetch:1ms", "not a whole number"},
                        Case{":1000", "unknown stream ''"}}) {
    INFO(c.spec);
    auto parsed = ParseCudaStreamDelay(c.spec);
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(parsed.status().message()), Contains(c.message));
  }
}

TEST_CASE("cuda stream delay: MakeCudaBackend refuses a bad delay before any GPU work",
          "[cuda][stream_delay]") {
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 95);
  struct Case {
    const char* name;
    CudaStreamDelay delay;
    const char* message;
  };
  for (const Case& c :
       {Case{"a delay without a stream", {CudaDelayedStream::kNone, 1000}, "without a stream"},
        Case{"a stream without a delay", {CudaDelayedStream::kFetch, 0}, "expected 1 to"},
        Case{"a negative delay", {CudaDelayedStream::kStore, -5}, "expected 1 to"},
        Case{"more than 0.1 s", {CudaDelayedStream::kCompute, kMaxCudaStreamDelayNs + 1},
             "expected 1 to"},
        Case{"an unknown stream", {static_cast<CudaDelayedStream>(42), 1000},
             "unknown stream 42"}}) {
    INFO(c.name);
    CudaBackendOptions options;
    options.debug_stream_delay = c.delay;
    auto made = MakeCudaBackend(config, weights, options);
    REQUIRE_FALSE(made.ok());
    CHECK(made.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(made.status().message()), Contains("debug_stream_delay"));
    CHECK_THAT(std::string(made.status().message()), Contains(c.message));
  }
}

// DelayStreamForTest's rule: a delay counts (in the session's counter and in
// the tally) when its kernel was queued, and only then: not when the delay
// is off, not at another stream's site, not when the launch fails. Without
// a GPU the launch fails, so that branch is what runs here; on a GPU the
// delay is queued and counted once. (No testing::HaveGpu here: its "no CUDA
// device" WARN would make ctest report this case as skipped.)
TEST_CASE("cuda stream delay: a delay counts where it was queued, and only there",
          "[cuda][stream_delay]") {
  std::atomic<int64_t> tally{0};
  int64_t queued = 0;
  CudaStreamDelay off;
  off.tally = &tally;
  for (CudaDelayedStream site : {CudaDelayedStream::kStore, CudaDelayedStream::kFetch,
                                 CudaDelayedStream::kStep, CudaDelayedStream::kCompute}) {
    CHECK(cuda::DelayStreamForTest(off, site, nullptr, queued).ok());
  }
  CHECK(queued == 0);
  CHECK(tally.load() == 0);

  const CudaStreamDelay fetch{CudaDelayedStream::kFetch, 1000, &tally};
  for (CudaDelayedStream site :
       {CudaDelayedStream::kStore, CudaDelayedStream::kStep, CudaDelayedStream::kCompute}) {
    INFO("site " << CudaDelayedStreamName(site));
    CHECK(cuda::DelayStreamForTest(fetch, site, nullptr, queued).ok());
  }
  CHECK(queued == 0);
  CHECK(tally.load() == 0);

  // At its own site, on the default stream.
  const absl::Status status =
      cuda::DelayStreamForTest(fetch, CudaDelayedStream::kFetch, nullptr, queued);
  if (cuda::CudaDeviceCount().ok()) {
    REQUIRE(status.ok());
    CHECK(queued == 1);
    CHECK(tally.load() == 1);
    // Without a tally the session's counter still counts.
    const CudaStreamDelay untallied{CudaDelayedStream::kFetch, 1000, nullptr};
    CHECK(cuda::DelayStreamForTest(untallied, CudaDelayedStream::kFetch, nullptr, queued).ok());
    CHECK(queued == 2);
    CHECK(tally.load() == 1);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
  } else {
    CHECK(status.code() == absl::StatusCode::kInternal);
    CHECK_THAT(std::string(status.message()), Contains("launching the test-only stream delay"));
    CHECK(queued == 0);
    CHECK(tally.load() == 0);
  }
}

// --- On a GPU: every stream's delays queued, counted, and harmless ---

// What the steps below leave: each session's logits of every token, its
// selections, its counters at the end (stream_delays, graph_replays,
// graph_capture_failures), how many of the steps closed at least one of
// its chunks, and how many closed a chunk of any session.
struct Driven {
  int64_t steps = 0;
  std::vector<std::vector<float>> logits;
  std::vector<testing::RetrievalLog> retrievals;
  std::vector<int64_t> stream_delays;
  std::vector<int64_t> graph_replays;
  std::vector<int64_t> graph_capture_failures;
  std::vector<int64_t> closing_steps;
  int64_t any_closing_steps = 0;
};

// Two sessions stepped together through RunStep, in uneven pieces: prefill
// pieces that close chunks, single decode tokens, pieces that close chunks
// once retrieval has more chunks than top-k to choose from. 556 and 411
// tokens (8 and 6 chunks of 63); the largest step, step 5 (session 0's 250
// tokens and 4 landmarks, session 1's 1 token: 255 positions), fits one
// forward of the default step size (1024).
Driven Drive(Backend& backend) {
  const ModelConfig& config = backend.config();
  const std::vector<std::vector<int64_t>> pieces = {{130, 1, 1, 70, 1, 250, 1, 1, 37, 1, 62, 1},
                                                    {1, 40, 1, 1, 200, 1, 63, 1, 1, 1, 100, 1}};
  const size_t n = pieces.size();
  Driven driven;
  driven.logits.resize(n);
  driven.retrievals.resize(n);  // before Record takes references into it
  driven.closing_steps.assign(n, 0);
  std::vector<std::unique_ptr<Session>> sessions;
  for (size_t i = 0; i < n; ++i) {
    auto session = Session::Create(backend);
    REQUIRE(session.ok());
    testing::Record((*session)->backend_session(), driven.retrievals[i]);
    sessions.push_back(*std::move(session));
  }
  for (size_t step = 0; step < pieces[0].size(); ++step) {
    std::vector<std::vector<int32_t>> tokens(n);
    std::vector<StepEntry> entries(n);
    for (size_t i = 0; i < n; ++i) {
      tokens[i] = testing::RandomTokens(config, pieces[i][step], 1000 * (i + 1) + step);
      entries[i].session = sessions[i].get();
      entries[i].tokens = tokens[i];
      entries[i].all_logits = &driven.logits[i];
    }
    std::vector<int64_t> chunks_before;
    for (const auto& session : sessions) chunks_before.push_back(session->num_chunks());
    for (const absl::Status& s : RunStep(backend, entries)) REQUIRE(s.ok());
    bool any_closed = false;
    for (size_t i = 0; i < n; ++i) {
      if (sessions[i]->num_chunks() > chunks_before[i]) {
        ++driven.closing_steps[i];
        any_closed = true;
      }
    }
    if (any_closed) ++driven.any_closing_steps;
    ++driven.steps;
  }
  REQUIRE(sessions[0]->num_chunks() > config.chunk_topk);
  for (const auto& session : sessions) {
    const BackendSessionStats stats = session->backend_session().stats();
    driven.stream_delays.push_back(stats.stream_delays);
    driven.graph_replays.push_back(stats.graph_replays);
    driven.graph_capture_failures.push_back(stats.graph_capture_failures);
  }
  return driven;
}

// The compute-stream delays session i queues slice by slice, with either
// chunk store or tier, worked out from the code rather than from a run (not
// yet seen on a GPU): one before each group's GCA in every step (PrepareGca;
// every step runs the upper layers: the CUDA backend runs no lower-only
// forward, and all_logits would keep a slice from being one; each step is
// one forward: its largest, 255 positions of both sessions (Drive), fits
// the step size of 1024) and one before the encoder in each step that closes a
// chunk (CloseChunks calls EncodeChunks once however many it closes). The
// other paths add their own compute sites to these (review-cudacheck F1).
int64_t EagerComputeDelays(const ModelConfig& config, const Driven& driven, size_t i) {
  return config.num_groups() * driven.steps + driven.closing_steps[i];
}

// review-cudaprep C3 b and C6. Each of the backend's stream paths (slice by
// slice with either chunk store, batched steps, decode graphs, the device
// tier), with each stream it uses delayed by 0.1 ms (its own CudaStreamDelay,
// whatever DRT_TEST_CUDA_STREAM_DELAY says):
// - the delays were queued: each session's stream_delays > 0, and the tally
//   equals their sum (each delay counted in one session); for the step
//   stream each session's count is at most the tally (a batched step's
//   delay counts once in the tally and in every session of the step);
//   undelayed, 0; on the compute stream, which every path delays at the
//   encoder and the GCA, each path's own sites add theirs: slice by slice
//   and on the device tier exactly EagerComputeDelays, with batched steps
//   exactly its hand-offs added (see there), with
//   decode graphs exactly one per replay in place of one per group's GCA,
//   and at least one replay (review-cudacheck F1). These counts are worked
//   out from the code, not yet seen on a GPU;
// - the logits and selections are still the CPU backend's (fp32: issue 9's
//   1e-4 worst-row bound; selections as in cuda_session_test.cc, where
//   only near-tied chunks may trade places). A reference of another
//   CUDA run would share a path's missing wait and its stale data; the CPU
//   backend shares nothing (review-cudaprep C6);
// - slice by slice (either chunk store), each delayed run gives the same
//   path's undelayed run's logits and selections bit for bit
//   (review-cudacheck F2).
// Not yet run on a GPU. Which streams a path uses is read from the code:
// the device tier copies nothing, so only its compute stream is delayed.
TEST_CASE("cuda stream delay: on every path each delayed stream queues and counts its delays "
          "and keeps the cpu backend's logits",
          "[cuda][stream_delay]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 97);
  auto cpu_backend = MakeCpuBackend(config, weights);
  const Driven cpu = Drive(*cpu_backend);
  const int64_t V = config.vocab_size;
  using S = CudaDelayedStream;
  struct Path {
    const char* name;
    void (*set)(CudaBackendOptions&);
    std::vector<S> streams;
  };
  const Path paths[] = {
      {"slice by slice, K/V store", [](CudaBackendOptions&) {},
       {S::kNone, S::kStore, S::kFetch, S::kCompute}},
      {"slice by slice, encoder-row store",
       [](CudaBackendOptions& o) { o.chunk_store = CudaChunkStore::kEncoderRows; },
       {S::kNone, S::kStore, S::kFetch}},
      {"batched_step_rows", [](CudaBackendOptions& o) { o.batched_step_rows = true; },
       {S::kStep, S::kCompute}},
      {"decode graphs", [](CudaBackendOptions& o) { o.decode_graphs = true; }, {S::kCompute}},
      {"device tier", [](CudaBackendOptions& o) { o.chunk_tier = CudaChunkTier::kDevice; },
       {S::kCompute}},
  };
  for (const Path& path : paths) {
    std::optional<Driven> undelayed;  // the path's run without a delay, where it has one
    for (S stream : path.streams) {
      INFO(path.name << ", " << CudaDelayedStreamName(stream) << " stream delayed");
      std::atomic<int64_t> tally{0};
      CudaBackendOptions options;
      options.precision = CudaPrecision::kFp32;
      path.set(options);
      options.debug_stream_delay = {stream, stream == S::kNone ? 0 : 100'000, &tally};
      auto backend = MakeCudaBackend(config, weights, options);
      REQUIRE(backend.ok());
      const Driven gpu = Drive(**backend);
      int64_t sum = 0;
      for (size_t i = 0; i < gpu.logits.size(); ++i) {
        INFO("session " << i << ": " << gpu.stream_delays[i] << " delays");
        sum += gpu.stream_delays[i];
        if (stream == S::kNone) {
          CHECK(gpu.stream_delays[i] == 0);
        } else {
          CHECK(gpu.stream_delays[i] > 0);
        }
        if (stream == S::kStep) CHECK(gpu.stream_delays[i] <= tally.load());
        if (stream == S::kCompute) {
          // > 0 alone would hold on the sites every path shares: each path's
          // own sites must add their part (review-cudacheck F1).
          const int64_t eager = EagerComputeDelays(config, gpu, i);
          INFO("slice by slice " << eager << " (" << gpu.steps << " steps, "
                                 << gpu.closing_steps[i] << " closing a chunk); graph replays "
                                 << gpu.graph_replays[i] << ", failed captures "
                                 << gpu.graph_capture_failures[i]);
          if (options.batched_step_rows) {
            // Its own site: SessionsAfterStep, where each session's compute
            // stream takes the step's rows back, once per slice, so once per
            // session and step. In every step: before each decoder layer's
            // window attention, once in CloseChunks, and before each upper
            // layer's GCA; also before each group's top-k but the first in
            // every step where any slice closes a chunk (Retrieve; a slice
            // holds a landmark exactly when its session's num_chunks grows),
            // the session's own slice counted whether it closes one or not
            // (review-cudacheck2 F3: this term was left out of a bound, so
            // losing Retrieve's delay, or the encoder's, passed). Worked
            // out from the code; not yet seen on a GPU (expected 106 and 105).
            INFO("batched hand-offs: " << gpu.any_closing_steps
                                       << " steps closing a chunk of any session");
            CHECK(gpu.stream_delays[i] ==
                  eager +
                      gpu.steps *
                          (config.num_lower_layers() + 2 * config.num_upper_layers() + 1) +
                      (config.num_groups() - 1) * gpu.any_closing_steps);
          } else if (options.decode_graphs) {
            // A replayed step delays once, before its launch
            // (LaunchDecodeGraph), instead of before each group's GCA (a
            // graph holds no delay: PrepareGca queues none while capturing);
            // a failed capture delays there and the eager walk again.
            CHECK(gpu.stream_delays[i] == eager -
                                              (config.num_groups() - 1) * gpu.graph_replays[i] +
                                              gpu.graph_capture_failures[i]);
          } else {
            CHECK(gpu.stream_delays[i] == eager);
          }
        }
        const double worst = testing::WorstRowRelativeDifference(gpu.logits[i], cpu.logits[i], V);
        INFO("worst relative logit difference " << worst);
        CHECK(worst <= testing::kFp32VsCpuLimit);
        // Random weights, and the GPU sums in another order (batched_step_rows
        // in yet another): only chunks within 1e-3 of the k-th score may trade
        // places, as in cuda_session_test.cc. A strict check would fail the
        // case at a near-tie and leave the later paths unchecked
        // (review-cudacheck F2).
        testing::CompareRetrievals(cpu.retrievals[i], gpu.retrievals[i], 1e-3,
                                   testing::kFp32VsCpuLimit);
      }
      if (stream != S::kStep) CHECK(tally.load() == sum);
      // The same tokens close the same chunks on every backend.
      CHECK(gpu.closing_steps == cpu.closing_steps);
      CHECK(gpu.any_closing_steps == cpu.any_closing_steps);
      // Without a replay the decode-graph path would be the eager one.
      if (options.decode_graphs) CHECK(gpu.graph_replays[0] + gpu.graph_replays[1] > 0);
      // Slice by slice, a delay changes only when work runs, not what it
      // computes: the same path undelayed gives the same bits. Sharper than
      // the CPU bound, which a stale read of near-equal data could meet.
      if (stream == S::kNone) {
        undelayed = gpu;
      } else if (undelayed.has_value()) {
        for (size_t i = 0; i < gpu.logits.size(); ++i) {
          INFO("session " << i << " against the same path undelayed");
          CHECK(gpu.logits[i] == undelayed->logits[i]);
          testing::CheckIdenticalRetrievals(undelayed->retrievals[i], gpu.retrievals[i], 0.0);
        }
      }
      WARN(path.name << ", " << CudaDelayedStreamName(stream) << " stream delayed: "
                     << tally.load() << " delays queued");
    }
  }
}

}  // namespace
}  // namespace drt

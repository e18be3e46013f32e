// The CUDA backend's session state export and import (engine/cuda/
// cuda_session_state.cc, CudaBackendOptions::state_export) on the golden
// fixture models: a state moves CUDA -> CPU, CPU -> CUDA and CUDA -> CUDA and
// continues as the session it was taken from; with the option off, or for a
// bad state, it is refused and nothing changes. Written without a GPU: these
// tests skip visibly until run on one (scripts/gpu_bench.sh).
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "engine/batch_step.h"
#include "engine/model_dir.h"
#include "engine/session.h"
#include "engine/session_state.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/fixture_dirs.h"
#include "tests/test_util/golden.h"
#include "tests/test_util/random_model.h"
#include "tests/test_util/vector_mapped_chunks.h"

namespace drt {
namespace {

using Catch::Matchers::Contains;

CudaBackendOptions ExportOptions(CudaPrecision precision, bool state_export = true) {
  CudaBackendOptions options = testing::PrecisionOptions(precision);
  options.state_export = state_export;
  return options;
}

// A session's small state and closed chunks, as Session::ExportState and
// ReadChunk give them.
struct Exported {
  SessionState state;
  std::vector<ChunkData> chunks;
};

Exported Export(const Session& session) {
  auto state = session.ExportState();
  INFO(state.status().message());
  REQUIRE(state.ok());
  Exported e{*std::move(state), {}};
  for (int64_t c = 0; c < session.num_chunks(); ++c) {
    ChunkData chunk;
    absl::Status s = session.backend_session().ReadChunk(c, chunk);
    INFO("chunk " << c << ": " << s.message());
    REQUIRE(s.ok());
    e.chunks.push_back(std::move(chunk));
  }
  return e;
}

ChunkReader ReaderOf(const Exported& e) {
  return [&e](int64_t c, ChunkData& out) -> absl::Status {
    if (c < 0 || c >= static_cast<int64_t>(e.chunks.size())) {
      return absl::OutOfRangeError("no such chunk");
    }
    out = e.chunks[c];
    return absl::OkStatus();
  };
}

// Through the byte encoding the state files hold, as a server restores.
std::unique_ptr<Session> Restore(Backend& backend, const Exported& e) {
  auto decoded =
      DecodeSessionState(*EncodeSessionState(e.state, backend.config()), backend.config());
  REQUIRE(decoded.ok());
  auto restored = Session::Restore(backend, *decoded, ReaderOf(e));
  INFO(restored.status().message());
  REQUIRE(restored.ok());
  return *std::move(restored);
}

// Bit-for-bit equality of two exports (small state through its encoding).
void RequireSameExport(const Exported& a, const Exported& b, const ModelConfig& config) {
  REQUIRE(*EncodeSessionState(a.state, config) == *EncodeSessionState(b.state, config));
  REQUIRE(a.chunks.size() == b.chunks.size());
  for (size_t c = 0; c < a.chunks.size(); ++c) {
    INFO("chunk " << c);
    REQUIRE(a.chunks[c].landmark == b.chunks[c].landmark);
    REQUIRE(a.chunks[c].rows == b.chunks[c].rows);
  }
}

struct Continued {
  std::vector<float> logits;  // the last logits before, then every token's
  testing::RetrievalLog retrievals;
};

int32_t Argmax(absl::Span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Continues both sessions alike: 8 greedy steps on the leader's choice (the
// argmax of its logits, fed to both, so a near-tie cannot split them), then
// `tail` in one piece, which closes at least one chunk (a retrieval over the
// imported landmarks).
void ContinueBoth(Session& leader, Session& follower, absl::Span<const int32_t> tail,
                  Continued& a, Continued& b) {
  testing::Record(leader.backend_session(), a.retrievals);
  testing::Record(follower.backend_session(), b.retrievals);
  a.logits.assign(leader.last_logits().begin(), leader.last_logits().end());
  b.logits.assign(follower.last_logits().begin(), follower.last_logits().end());
  AppendOptions all;
  all.all_logits = true;
  for (int step = 0; step < 8; ++step) {
    const int32_t token = Argmax(leader.last_logits());
    auto ra = leader.Append({token}, all);
    auto rb = follower.Append({token}, all);
    REQUIRE(ra.ok());
    REQUIRE(rb.ok());
    a.logits.insert(a.logits.end(), ra->logits.begin(), ra->logits.end());
    b.logits.insert(b.logits.end(), rb->logits.begin(), rb->logits.end());
  }
  auto ra = leader.Append(tail, all);
  auto rb = follower.Append(tail, all);
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  a.logits.insert(a.logits.end(), ra->logits.begin(), ra->logits.end());
  b.logits.insert(b.logits.end(), rb->logits.begin(), rb->logits.end());
  leader.backend_session().set_retrieval_observer(nullptr);
  follower.backend_session().set_retrieval_observer(nullptr);
}

// Where each fixture's prompt is cut for the export: on a chunk boundary
// (no open rows), one token before a landmark (62 open rows: the first
// greedy token closes the chunk and retrieves), and late
// (past every fixture's window, so the rings have wrapped), each followed by
// a 64-token golden tail.
std::vector<size_t> Cuts(size_t tokens) { return {5 * 63, 7 * 63 - 1, tokens - 72}; }

std::unique_ptr<Session> Prompted(Backend& backend, const std::vector<int32_t>& tokens,
                                  size_t cut) {
  auto session = Session::Create(backend);
  REQUIRE(session.ok());
  REQUIRE((*session)->Append(absl::MakeConstSpan(tokens).first(cut)).ok());
  return *std::move(session);
}

absl::Span<const int32_t> TailAfter(const std::vector<int32_t>& tokens, size_t cut) {
  return absl::MakeConstSpan(tokens).subspan(cut, 64);
}

// Which backend a state is taken from; it continues on the other.
enum class ExportFrom { kCuda, kCpu };

// A state exported by one backend (CUDA fp32 or CPU) and restored on the
// other continues as the session it was taken from, within the fp32
// CUDA-vs-CPU limit, with the same retrievals.
void CheckCrossBackendContinuation(ExportFrom from) {
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  for (const auto& dir : dirs) {
    INFO("fixture " << dir);
    auto model = LoadModelDir(dir);
    REQUIRE(model.ok());
    const ModelConfig& config = model->config;
    const auto tokens = testing::LoadGolden(dir + "/golden.safetensors").tokens;
    auto cpu_backend = MakeCpuBackend(config, model->weights);
    auto cuda_backend = MakeCudaBackend(config, model->weights, ExportOptions(CudaPrecision::kFp32));
    REQUIRE(cuda_backend.ok());
    Backend& source_backend = from == ExportFrom::kCuda ? **cuda_backend : *cpu_backend;
    Backend& target_backend = from == ExportFrom::kCuda ? *cpu_backend : **cuda_backend;
    const char* direction = from == ExportFrom::kCuda ? "CUDA fp32 -> CPU" : "CPU -> CUDA fp32";
    for (size_t cut : Cuts(tokens.size())) {
      INFO("cut after " << cut << " tokens");
      auto source = Prompted(source_backend, tokens, cut);
      const Exported e = Export(*source);
      REQUIRE(e.state.backend.position == source->backend_session().position());
      auto target = Restore(target_backend, e);
      // fp32 passes through either backend unchanged: the restored session
      // exports exactly what it was given.
      RequireSameExport(Export(*target), e, config);
      Continued on_source, on_target;
      ContinueBoth(*source, *target, TailAfter(tokens, cut), on_source, on_target);
      const double worst = testing::WorstRowRelativeDifference(on_target.logits, on_source.logits,
                                                               config.vocab_size);
      WARN(dir << " state " << direction << " after " << cut
               << " tokens: worst relative difference " << worst << " over "
               << on_source.logits.size() / config.vocab_size << " rows");
      CHECK(worst <= testing::kFp32VsCpuLimit);
      REQUIRE(!on_source.retrievals.empty());
      testing::CheckIdenticalRetrievals(on_source.retrievals, on_target.retrievals,
                                        testing::kFp32VsCpuLimit);
    }
  }
}

TEST_CASE("cuda state: a CUDA fp32 session continues on the CPU as on the GPU", "[cuda]") {
  if (!testing::HaveGpu()) return;
  CheckCrossBackendContinuation(ExportFrom::kCuda);
}

TEST_CASE("cuda state: a CPU session continues on the GPU (fp32) as on the CPU", "[cuda]") {
  if (!testing::HaveGpu()) return;
  CheckCrossBackendContinuation(ExportFrom::kCpu);
}

// CUDA -> state -> CUDA in `precision`: the restored session exports the
// same bits and continues bit-identically (same backend, same pieces, so the
// same kernels over the same values; bf16 -> float -> bf16 is exact). The
// state export selects the chunk store of encoder rows, where the restored
// session makes K/V of every chunk it fetches and the original made some
// in other batches: the same bits only because every fetch GEMM has one
// shape (engine/cuda/host/fetch_batches.h), which this checks.
void CheckCudaRoundTrip(CudaPrecision precision) {
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  for (const auto& dir : dirs) {
    INFO("fixture " << dir << ", " << CudaPrecisionName(precision));
    auto model = LoadModelDir(dir);
    REQUIRE(model.ok());
    const ModelConfig& config = model->config;
    const auto tokens = testing::LoadGolden(dir + "/golden.safetensors").tokens;
    auto backend = MakeCudaBackend(config, model->weights, ExportOptions(precision));
    REQUIRE(backend.ok());
    for (size_t cut : Cuts(tokens.size())) {
      INFO("cut after " << cut << " tokens");
      auto original = Prompted(**backend, tokens, cut);
      const Exported e = Export(*original);
      auto restored = Restore(**backend, e);
      RequireSameExport(Export(*restored), e, config);
      Continued a, b;
      ContinueBoth(*original, *restored, TailAfter(tokens, cut), a, b);
      REQUIRE(b.logits == a.logits);
      REQUIRE(!a.retrievals.empty());
      REQUIRE(b.retrievals.size() == a.retrievals.size());
      for (const auto& [key, r] : a.retrievals) {
        INFO("chunk " << key.first << " group " << key.second);
        REQUIRE(b.retrievals.count(key) == 1);
        CHECK(b.retrievals.at(key).chunks == r.chunks);
        CHECK(b.retrievals.at(key).weights == r.weights);
      }
      // After the continuation too: the chunks closed since the import.
      RequireSameExport(Export(*restored), Export(*original), config);
    }
  }
}

TEST_CASE("cuda state: CUDA fp32 -> CUDA continues bit-identically", "[cuda]") {
  if (!testing::HaveGpu()) return;
  CheckCudaRoundTrip(CudaPrecision::kFp32);
}

TEST_CASE("cuda state: CUDA bf16 -> CUDA continues bit-identically", "[cuda]") {
  if (!testing::HaveGpu()) return;
  CheckCudaRoundTrip(CudaPrecision::kBf16);
}

TEST_CASE("cuda state: off by default, refused by name", "[cuda]") {
  if (!testing::HaveGpu()) return;
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(!dirs.empty());
  auto model = LoadModelDir(dirs.front());
  REQUIRE(model.ok());
  const ModelConfig& config = model->config;
  const auto tokens = testing::LoadGolden(dirs.front() + "/golden.safetensors").tokens;
  REQUIRE(!CudaBackendOptions{}.state_export);
  auto cuda_backend = MakeCudaBackend(config, model->weights, ExportOptions(CudaPrecision::kFp32,
                                                                            /*state_export=*/false));
  REQUIRE(cuda_backend.ok());
  auto cpu_backend = MakeCpuBackend(config, model->weights);
  auto gpu = Prompted(**cuda_backend, tokens, 3 * 63 + 5);
  REQUIRE(gpu->num_chunks() == 3);

  auto state = gpu->ExportState();
  CHECK(state.status().code() == absl::StatusCode::kUnimplemented);
  CHECK_THAT(std::string(state.status().message()), Contains("--cuda_state_export"));
  ChunkData chunk;
  absl::Status read = gpu->backend_session().ReadChunk(0, chunk);
  CHECK(read.code() == absl::StatusCode::kUnimplemented);
  CHECK_THAT(std::string(read.message()), Contains("--cuda_state_export"));

  auto cpu = Prompted(*cpu_backend, tokens, 3 * 63 + 5);
  const Exported e = Export(*cpu);
  auto fresh = Session::Create(**cuda_backend);
  REQUIRE(fresh.ok());
  absl::Status imported = (*fresh)->backend_session().ImportState(
      e.state.backend, static_cast<int64_t>(e.chunks.size()), ReaderOf(e));
  CHECK(imported.code() == absl::StatusCode::kUnimplemented);
  CHECK_THAT(std::string(imported.message()), Contains("--cuda_state_export"));
  CHECK((*fresh)->backend_session().position() == 0);
  // Session::Restore names the backend too (what LoadSession reports).
  auto restored = Session::Restore(**cuda_backend, e.state, ReaderOf(e));
  CHECK(restored.status().code() == absl::StatusCode::kUnimplemented);
  CHECK_THAT(std::string(restored.status().message()), Contains("the cuda backend"));
  CHECK_THAT(std::string(restored.status().message()), Contains("--cuda_state_export"));
}

// A fresh CUDA session must be untouched by a refused import: position 0,
// no chunks, no selection, and the same logits for a prompt as a session
// that never saw the import.
void RequireUntouched(Backend& backend, Session& session, const std::vector<int32_t>& tokens) {
  REQUIRE(session.backend_session().position() == 0);
  REQUIRE(session.num_chunks() == 0);
  for (const Retrieval& r : session.backend_session().current_retrieval()) {
    REQUIRE(r.chunks.empty());
  }
  AppendOptions all;
  all.all_logits = true;
  auto fresh = Session::Create(backend);
  REQUIRE(fresh.ok());
  const auto prompt = absl::MakeConstSpan(tokens).first(2 * 63 + 10);
  auto want = (*fresh)->Append(prompt, all);
  auto got = session.Append(prompt, all);
  REQUIRE(want.ok());
  REQUIRE(got.ok());
  REQUIRE(got->logits == want->logits);
}

TEST_CASE("cuda state: a bad state is refused by name and changes nothing", "[cuda]") {
  if (!testing::HaveGpu()) return;
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 2);
  auto model = LoadModelDir(dirs.front());
  REQUIRE(model.ok());
  const ModelConfig& config = model->config;
  const auto tokens = testing::LoadGolden(dirs.front() + "/golden.safetensors").tokens;
  auto cuda_backend = MakeCudaBackend(config, model->weights, ExportOptions(CudaPrecision::kFp32));
  REQUIRE(cuda_backend.ok());
  auto cpu_backend = MakeCpuBackend(config, model->weights);
  // Mid-chunk, with selections in force.
  auto cpu = Prompted(*cpu_backend, tokens, 5 * 63 + 20);
  const Exported good = Export(*cpu);
  const int64_t chunks = static_cast<int64_t>(good.chunks.size());
  const int64_t kv_width = config.num_key_value_heads * config.head_dim();

  struct Case {
    std::string name;
    BackendSessionState state;
    int64_t num_chunks;
    ChunkReader read;
    absl::StatusCode code;
    std::string message;  // a part of the error's
  };
  std::vector<Case> cases;
  {
    Case c{"window rows", good.state.backend, chunks, ReaderOf(good),
           absl::StatusCode::kInvalidArgument, "window of layer 0 holds"};
    WindowState& w = c.state.windows[0];
    w.rows -= 1;
    w.keys.resize(w.rows * kv_width);
    w.values.resize(w.rows * kv_width);
    cases.push_back(std::move(c));
  }
  {
    Case c{"window keys", good.state.backend, chunks, ReaderOf(good),
           absl::StatusCode::kInvalidArgument, "a window's keys"};
    c.state.windows.back().keys.pop_back();
    cases.push_back(std::move(c));
  }
  {
    Case c{"open chunk", good.state.backend, chunks, ReaderOf(good),
           absl::StatusCode::kInvalidArgument, "open_chunk"};
    c.state.open_chunk.resize(c.state.open_chunk.size() - config.hidden_size);
    cases.push_back(std::move(c));
  }
  {
    Case c{"selection", good.state.backend, chunks, ReaderOf(good),
           absl::StatusCode::kInvalidArgument, "names chunk"};
    REQUIRE(!c.state.selection[0].chunks.empty());
    c.state.selection[0].chunks[0] = chunks;
    cases.push_back(std::move(c));
  }
  cases.push_back(Case{"chunk count", good.state.backend, chunks - 1, ReaderOf(good),
                       absl::StatusCode::kInvalidArgument, "chunks given"});
  {
    // The last chunk's landmark is short: found after every other chunk was
    // read.
    Case c{"chunk size", good.state.backend, chunks, nullptr,
           absl::StatusCode::kInvalidArgument, "landmark"};
    c.read = [&good, chunks](int64_t i, ChunkData& out) -> absl::Status {
      out = good.chunks.at(i);
      if (i == chunks - 1) out.landmark.pop_back();
      return absl::OkStatus();
    };
    cases.push_back(std::move(c));
  }
  {
    Case c{"reader error", good.state.backend, chunks, nullptr, absl::StatusCode::kDataLoss,
           "torn record"};
    c.read = [&good, chunks](int64_t i, ChunkData& out) -> absl::Status {
      if (i == chunks - 1) return absl::DataLossError("torn record");
      out = good.chunks.at(i);
      return absl::OkStatus();
    };
    cases.push_back(std::move(c));
  }
  {
    // A state of another model's shape (a second fixture with other sizes).
    auto other = LoadModelDir(dirs.back());
    REQUIRE(other.ok());
    const bool other_shape = other->config.hidden_size != config.hidden_size ||
                             other->config.slide_window != config.slide_window ||
                             other->config.num_key_value_heads != config.num_key_value_heads;
    REQUIRE(other_shape);
    auto other_backend = MakeCpuBackend(other->config, other->weights);
    const auto other_tokens = testing::LoadGolden(dirs.back() + "/golden.safetensors").tokens;
    auto other_session = Prompted(*other_backend, other_tokens, 5 * 63 + 20);
    Exported foreign = Export(*other_session);
    cases.push_back(Case{"another model's shape", foreign.state.backend,
                         static_cast<int64_t>(foreign.chunks.size()), nullptr,
                         absl::StatusCode::kInvalidArgument, "window"});
    cases.back().read = [foreign](int64_t i, ChunkData& out) -> absl::Status {
      out = foreign.chunks.at(i);
      return absl::OkStatus();
    };
  }
  for (const Case& c : cases) {
    INFO("case " << c.name);
    auto session = Session::Create(**cuda_backend);
    REQUIRE(session.ok());
    absl::Status s = (*session)->backend_session().ImportState(c.state, c.num_chunks, c.read);
    INFO(s.message());
    CHECK(s.code() == c.code);
    CHECK_THAT(std::string(s.message()), Contains(c.message));
    RequireUntouched(**cuda_backend, **session, tokens);
  }

  // Into a session that has processed tokens: refused, and it continues as
  // its twin that was left alone.
  auto used = Prompted(**cuda_backend, tokens, 100);
  auto twin = Prompted(**cuda_backend, tokens, 100);
  absl::Status s = used->backend_session().ImportState(good.state.backend, chunks, ReaderOf(good));
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  AppendOptions all;
  all.all_logits = true;
  auto a = used->Append(absl::MakeConstSpan(tokens).subspan(100, 70), all);
  auto b = twin->Append(absl::MakeConstSpan(tokens).subspan(100, 70), all);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->logits == b->logits);

  // A chunk that does not exist.
  ChunkData out;
  CHECK(used->backend_session().ReadChunk(used->num_chunks(), out).code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(used->backend_session().ReadChunk(-1, out).code() == absl::StatusCode::kOutOfRange);
}

// --- The end write on a handler thread while the engine thread steps other
// sessions (review-cuda F2). drt-server writes a durable session's state at
// the end of a Generate on the call's handler thread (ExportState, ReadChunk
// of every chunk, MapChunks of the chunks written: server/state_store.cc)
// while the engine thread runs other sessions' steps; Fork also runs beside
// them here, a stricter case than the server's (it forks on the engine
// thread). Reading found no race (backend-wide objects are read-only or
// locked, a session's calls touch only its own streams); nothing had run it.

// Export without Catch assertions (they are not thread-safe in Catch2 v2):
// the first error, or the state and every chunk.
absl::StatusOr<Exported> ExportQuietly(const Session& session) {
  auto state = session.ExportState();
  if (!state.ok()) return state.status();
  Exported e{*std::move(state), {}};
  for (int64_t c = 0; c < session.num_chunks(); ++c) {
    ChunkData chunk;
    if (absl::Status s = session.backend_session().ReadChunk(c, chunk); !s.ok()) return s;
    e.chunks.push_back(std::move(chunk));
  }
  return e;
}

// An empty string when equal bit for bit, else what differs first.
std::string ExportDifference(const Exported& a, const Exported& b, const ModelConfig& config) {
  if (*EncodeSessionState(a.state, config) != *EncodeSessionState(b.state, config)) {
    return "the small state";
  }
  if (a.chunks.size() != b.chunks.size()) return "the chunk count";
  for (size_t c = 0; c < a.chunks.size(); ++c) {
    if (a.chunks[c].landmark != b.chunks[c].landmark || a.chunks[c].rows != b.chunks[c].rows) {
      return "chunk " + std::to_string(c);
    }
  }
  return "";
}

// Decodes `tokens` one at a time on `a` (and on `a2` in the same step when
// given: a step of two sessions), through RunStep as the engine thread does;
// returns a's logits of every token.
std::vector<float> Decode(Backend& backend, Session& a, Session* a2,
                          const std::vector<int32_t>& tokens) {
  std::vector<float> logits, other;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<StepEntry> entries(1);
    entries[0].session = &a;
    entries[0].tokens = absl::MakeConstSpan(tokens).subspan(i, 1);
    entries[0].all_logits = &logits;
    if (a2 != nullptr) {
      StepEntry second;
      second.session = a2;
      second.tokens = absl::MakeConstSpan(tokens).subspan(tokens.size() - 1 - i, 1);
      second.all_logits = &other;
      entries.push_back(second);
    }
    for (const absl::Status& s : RunStep(backend, entries)) {
      INFO("token " << i << ": " << s.message());
      REQUIRE(s.ok());
    }
  }
  return logits;
}

TEST_CASE("cuda state: the end write and Fork on a handler thread beside engine steps",
          "[cuda]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 91);
  const int64_t per_chunk = config.chunk_positions() - 1;
  // B: 66 closed chunks (one whole unit of 64 to map) and 20 open tokens.
  const std::vector<int32_t> b_prompt = testing::RandomTokens(config, 66 * per_chunk + 20, 92);
  const std::vector<int32_t> a_prompt = testing::RandomTokens(config, 5 * per_chunk + 7, 93);
  // About 200 decode steps: three chunks close among them (eager steps),
  // the others replay a decode graph where graphs are on.
  const std::vector<int32_t> a_tokens = testing::RandomTokens(config, 200, 94);
  constexpr int64_t kUnit = 64;  // CudaSession::kChunkMapUnit

  struct Variant {
    const char* name;
    bool decode_graphs;
    bool batched_step_rows;  // with a second session in every step
  };
  for (const Variant v : {Variant{"eager", false, false}, Variant{"decode graphs", true, false},
                          Variant{"batched steps of two sessions", false, true}}) {
    INFO(v.name);
    for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
      INFO(CudaPrecisionName(precision));
      CudaBackendOptions options = ExportOptions(precision);
      options.decode_graphs = v.decode_graphs;
      options.batched_step_rows = v.batched_step_rows;
      auto made = MakeCudaBackend(config, weights, options);
      INFO(made.status().message());
      REQUIRE(made.ok());
      Backend& backend = **made;

      // Single-threaded: what B exports (as it is, once mapped, and its
      // fork); A's logits further down, once the number of passes is known.
      auto b_alone = Prompted(backend, b_prompt, b_prompt.size());
      const Exported b_want = Export(*b_alone);
      REQUIRE(b_want.chunks.size() == 66);
      auto b_alone_fork = b_alone->Fork();
      REQUIRE(b_alone_fork.ok());
      const Exported fork_want = Export(**b_alone_fork);

      // Concurrently: this thread steps A (the engine thread), another
      // exports, maps and forks the idle B (the handler thread) until A is
      // done, at least twice. The engine starts once the handler has, and
      // decodes a_tokens again (up to kMaxPasses times) until two handler
      // rounds have ended while it was still stepping (review-cudaprep C2:
      // otherwise every round could run after A is done).
      constexpr int kMaxPasses = 8;
      auto b = Prompted(backend, b_prompt, b_prompt.size());
      auto a = Prompted(backend, a_prompt, a_prompt.size());
      std::unique_ptr<Session> a2;
      if (v.batched_step_rows) a2 = Prompted(backend, a_prompt, a_prompt.size() - 3);
      std::atomic<bool> engine_done{false};
      std::atomic<bool> handler_started{false};
      std::atomic<bool> handler_stopped{false};
      std::atomic<int> rounds_beside{0};  // rounds ended before engine_done
      std::vector<float> a_got;
      int passes = 0;
      int rounds = 0;
      std::string handler_error;  // the first, read after the join
      std::thread handler([&] {
        handler_started = true;
        struct Stopped {
          std::atomic<bool>& stopped;
          ~Stopped() { stopped = true; }
        } stopped{handler_stopped};
        auto fail = [&](const std::string& what) {
          if (handler_error.empty()) handler_error = "round " + std::to_string(rounds) + ": " + what;
        };
        while (handler_error.empty() && (rounds < 2 || !engine_done.load())) {
          absl::StatusOr<Exported> e = ExportQuietly(*b);
          if (!e.ok()) return fail("export: " + std::string(e.status().message()));
          if (std::string d = ExportDifference(*e, b_want, config); !d.empty()) {
            return fail("B's export differs from the single-threaded one in " + d);
          }
          // The first unit, as the end write maps the chunks it wrote (a
          // no-op once mapped); its host records are freed (cudaFreeHost).
          std::vector<ChunkData> unit(e->chunks.begin(), e->chunks.begin() + kUnit);
          if (absl::Status s = b->backend_session().MapChunks(
                  std::make_shared<testing::VectorMappedChunks>(0, std::move(unit)));
              !s.ok()) {
            return fail("MapChunks: " + std::string(s.message()));
          }
          auto fork = b->Fork();
          if (!fork.ok()) return fail("Fork: " + std::string(fork.status().message()));
          absl::StatusOr<Exported> f = ExportQuietly(**fork);
          if (!f.ok()) return fail("the fork's export: " + std::string(f.status().message()));
          if (std::string d = ExportDifference(*f, fork_want, config); !d.empty()) {
            return fail("the fork's export differs from the single-threaded one in " + d);
          }
          ++rounds;  // the fork is freed here (cudaFree of its buffers)
          if (!engine_done.load()) ++rounds_beside;
        }
      });
      {
        // A failed REQUIRE in Decode throws: stop and join the handler
        // first (a joinable std::thread destroyed would terminate the run).
        struct Joiner {
          std::atomic<bool>& done;
          std::thread& thread;
          ~Joiner() {
            done = true;
            if (thread.joinable()) thread.join();
          }
        } joiner{engine_done, handler};
        while (!handler_started.load()) std::this_thread::yield();
        while (passes < kMaxPasses && rounds_beside.load() < 2 && !handler_stopped.load()) {
          const std::vector<float> got = Decode(backend, *a, a2.get(), a_tokens);
          a_got.insert(a_got.end(), got.begin(), got.end());
          ++passes;
        }
      }
      INFO("handler thread: " << handler_error);
      CHECK(handler_error.empty());
      WARN(v.name << ", " << CudaPrecisionName(precision) << ": " << rounds << " handler rounds, "
                  << rounds_beside.load() << " of them ended beside the engine's "
                  << passes * a_tokens.size() << " steps (" << passes << " passes)");
      CHECK(rounds >= 2);
      REQUIRE(rounds_beside.load() >= 1);
      CHECK(b->backend_session().memory().mapped_chunk_bytes > 0);
      // A's logits single-threaded, decoded as many times.
      std::vector<float> a_want;
      {
        auto a_ref = Prompted(backend, a_prompt, a_prompt.size());
        std::unique_ptr<Session> a2_ref;
        if (v.batched_step_rows) a2_ref = Prompted(backend, a_prompt, a_prompt.size() - 3);
        for (int pass = 0; pass < passes; ++pass) {
          const std::vector<float> got = Decode(backend, *a_ref, a2_ref.get(), a_tokens);
          a_want.insert(a_want.end(), got.begin(), got.end());
        }
      }
      REQUIRE(a_got.size() == a_want.size());
      CHECK(a_got == a_want);
      // B, mapped, still exports what it did before.
      RequireSameExport(Export(*b), b_want, config);
    }
  }
}

}  // namespace
}  // namespace drt

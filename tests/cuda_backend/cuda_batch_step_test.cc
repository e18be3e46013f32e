// Steps of several sessions on the CUDA backend (engine/batch_step.h,
// engine/cuda/cuda_step.h, and with CudaBackendOptions::batched_step_rows
// engine/cuda/cuda_batched_step.h): a session's logits and retrievals do not
// depend on which sessions share its step (issue 11, "Invariants"),
// mirroring tests/batch_step_test.cc on the CPU.
//
// Slice by slice (the default, batched_step_rows off), when a session's
// tokens form one slice alone and in company, its logits and retrievals
// must be equal bit for bit: each session runs its own kernels, with the
// same shapes and in the same order as alone, on its own streams, cuBLAS
// handle and workspace, and cuBLAS gives bitwise equal results for equal
// shapes on one GPU (the decode-graph tests rely on the same determinism).
// A tolerance there would let a small cross-session leak pass (review of
// the CUDA host side, finding 7: it was 1e-4). When a step holds more than
// the step size, the entries are cut into forwards at other rows than
// alone, so a slice's shapes differ and its GEMMs may sum in another
// order: issue 11's 1e-4 worst-row relative difference holds there, and
// for the batched rows below (a target, not a measurement). Each test WARNs
// the worst difference it saw so that the first GPU run records it (these
// were written without a GPU). bf16 is held to the same: no rounding
// differs between a session batched and alone.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "engine/batch_step.h"
#include "engine/session.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

constexpr double kBatchTolerance = 1e-4;
// Slice by slice, the same slices alone and in company: bit for bit.
constexpr double kSameSlices = 0.0;

// One session twice: `alone` runs each step by itself, `batched` in a step
// with the others. Both hold the same history.
struct Pair {
  std::unique_ptr<Session> alone, batched;
  testing::RetrievalLog alone_log, batched_log;
};

std::unique_ptr<Pair> NewPair(Backend& backend, int64_t history, uint64_t seed) {
  auto pair = std::make_unique<Pair>();
  auto session = Session::Create(backend);
  REQUIRE(session.ok());
  if (history > 0) {
    REQUIRE((*session)->Append(testing::RandomTokens(backend.config(), history, seed)).ok());
  }
  auto fork = (*session)->Fork();
  REQUIRE(fork.ok());
  pair->alone = *std::move(session);
  pair->batched = *std::move(fork);
  testing::Record(pair->alone->backend_session(), pair->alone_log);
  testing::Record(pair->batched->backend_session(), pair->batched_log);
  return pair;
}

// Runs `tokens[i]` on pair i: alone one by one, and batched in one RunStep.
// Returns the worst relative difference over every token's logits; the
// retrievals' weights may differ by `retrieval_tolerance`.
double StepBothWays(Backend& backend, std::vector<std::unique_ptr<Pair>>& pairs,
                    const std::vector<std::vector<int32_t>>& tokens,
                    double retrieval_tolerance) {
  const int64_t V = backend.config().vocab_size;
  std::vector<std::vector<float>> alone(pairs.size()), batched(pairs.size());
  std::vector<StepEntry> entries(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    StepEntry single;
    single.session = pairs[i]->alone.get();
    single.tokens = tokens[i];
    single.all_logits = &alone[i];
    REQUIRE(RunStep(backend, {single})[0].ok());
    entries[i].session = pairs[i]->batched.get();
    entries[i].tokens = tokens[i];
    entries[i].all_logits = &batched[i];
  }
  for (const absl::Status& s : RunStep(backend, entries)) REQUIRE(s.ok());
  double worst = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    INFO("session " << i);
    const Pair& p = *pairs[i];
    REQUIRE(alone[i].size() == tokens[i].size() * V);
    worst = std::max(worst, testing::WorstRowRelativeDifference(batched[i], alone[i], V));
    REQUIRE(p.batched->num_tokens() == p.alone->num_tokens());
    REQUIRE(p.batched->backend_session().position() == p.alone->backend_session().position());
    REQUIRE(p.batched->num_chunks() == p.alone->num_chunks());
    REQUIRE(std::equal(p.batched->last_logits().begin(), p.batched->last_logits().end(),
                       batched[i].end() - V));
    // The same selections, chunk for chunk, at every landmark and group.
    testing::CheckIdenticalRetrievals(p.alone_log, p.batched_log, retrieval_tolerance);
  }
  return worst;
}

TEST_CASE("cuda: a session's logits do not depend on which sessions share its step",
          "[cuda][batch_step]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 61);
  const int64_t k = config.enc_chunk_size;  // 63 real tokens per chunk
  for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    INFO("precision " << CudaPrecisionName(precision));
    auto backend = MakeCudaBackend(config, weights, testing::PrecisionOptions(precision));
    REQUIRE(backend.ok());
    std::vector<std::unique_ptr<Pair>> pairs;
    pairs.push_back(NewPair(**backend, 0, 1));           // new: a prefill piece over 3 chunks
    pairs.push_back(NewPair(**backend, 5 * k + 3, 2));   // mid-chunk: one decode token
    pairs.push_back(NewPair(**backend, 6 * k, 3));       // on a boundary: one decode token
    pairs.push_back(NewPair(**backend, 30 * k + 62, 4)); // retrieves; its token closes a chunk
    pairs.push_back(NewPair(**backend, 12 * k + 2, 5));  // a prefill piece of 100 tokens
    // Retrieval really chooses among more chunks than top-k for the long one.
    REQUIRE(pairs[3]->alone->num_chunks() > config.chunk_topk);

    const std::vector<std::vector<int32_t>> first = {
        testing::RandomTokens(config, 150, 11), testing::RandomTokens(config, 1, 12),
        testing::RandomTokens(config, 1, 13), testing::RandomTokens(config, 1, 14),
        testing::RandomTokens(config, 100, 15)};
    // 253 tokens and their landmarks (fewer than 253) fit one forward:
    // every session's tokens are one slice, as alone.
    REQUIRE((*backend)->max_step_positions() >= 2 * 253);
    const double worst_first = StepBothWays(**backend, pairs, first, kSameSlices);
    // Then decode tokens of all of them together, across the long one's
    // next chunk boundary: the state the batch left is the state each would
    // have alone.
    double worst_decode = 0;
    for (int step = 0; step < 9; ++step) {
      std::vector<std::vector<int32_t>> next;
      for (size_t i = 0; i < pairs.size(); ++i) {
        next.push_back(testing::RandomTokens(config, 1, 100 + step * 10 + i));
      }
      worst_decode = std::max(worst_decode, StepBothWays(**backend, pairs, next, kSameSlices));
    }
    WARN("cuda " << CudaPrecisionName(precision)
                 << " batched vs alone, worst relative difference: mixed step " << worst_first
                 << ", decode steps " << worst_decode);
    CHECK(worst_first == kSameSlices);
    CHECK(worst_decode == kSameSlices);
  }
}

TEST_CASE("cuda: a step holding more than the step size runs as several forwards, same results",
          "[cuda][batch_step]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 62);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kFp32);
  options.max_step_positions = 128;  // two chunks
  auto backend = MakeCudaBackend(config, weights, options);
  REQUIRE(backend.ok());
  REQUIRE((*backend)->max_step_positions() == 128);
  std::vector<std::unique_ptr<Pair>> pairs;
  pairs.push_back(NewPair(**backend, 40, 1));
  pairs.push_back(NewPair(**backend, 4 * 63 + 10, 2));
  pairs.push_back(NewPair(**backend, 0, 3));
  // 300 + 1 + 90 tokens: the entries do not fit one forward of 128 positions.
  const std::vector<std::vector<int32_t>> tokens = {testing::RandomTokens(config, 300, 21),
                                                    testing::RandomTokens(config, 1, 22),
                                                    testing::RandomTokens(config, 90, 23)};
  // Cut into forwards of 128 positions at other rows than alone: slices of
  // other shapes (see the top), hence issue 11's bound.
  const double worst = StepBothWays(**backend, pairs, tokens, kBatchTolerance);
  WARN("cuda fp32 several forwards, worst relative difference " << worst);
  CHECK(worst <= kBatchTolerance);
}

TEST_CASE("cuda: a batched step agrees with the cpu backend's", "[cuda][batch_step]") {
  if (!testing::HaveGpu()) return;
  // The same mixed step on both backends, fp32: issue 9's parity bound
  // (1e-4, the CPU backend's own bound against the float64 reference), slice
  // by slice and with the step's rows in one op (batched_step_rows).
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 63);
  const bool batched_rows = GENERATE(false, true);
  INFO("batched_step_rows " << batched_rows);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kFp32);
  options.batched_step_rows = batched_rows;
  auto cuda_backend = MakeCudaBackend(config, weights, options);
  REQUIRE(cuda_backend.ok());
  auto cpu_backend = MakeCpuBackend(config, weights);
  const std::vector<int64_t> histories = {0, 7 * 63 + 62, 3 * 63 + 20};
  const std::vector<std::vector<int32_t>> tokens = {testing::RandomTokens(config, 130, 31),
                                                    testing::RandomTokens(config, 1, 32),
                                                    testing::RandomTokens(config, 50, 33)};
  std::vector<std::vector<float>> logits[2];
  for (int b = 0; b < 2; ++b) {
    Backend& backend = b == 0 ? **cuda_backend : *cpu_backend;
    std::vector<std::unique_ptr<Session>> sessions;
    std::vector<StepEntry> entries(histories.size());
    logits[b].resize(histories.size());
    for (size_t i = 0; i < histories.size(); ++i) {
      auto session = Session::Create(backend);
      REQUIRE(session.ok());
      if (histories[i] > 0) {
        REQUIRE((*session)->Append(testing::RandomTokens(config, histories[i], 40 + i)).ok());
      }
      sessions.push_back(*std::move(session));
      entries[i] = {sessions[i].get(), tokens[i], false, &logits[b][i]};
    }
    for (const absl::Status& s : RunStep(backend, entries)) REQUIRE(s.ok());
  }
  double worst = 0;
  for (size_t i = 0; i < histories.size(); ++i) {
    worst = std::max(worst, testing::WorstRowRelativeDifference(logits[0][i], logits[1][i],
                                                                config.vocab_size));
  }
  WARN("cuda fp32 (batched_step_rows " << batched_rows
                                         << ") batched vs cpu batched, worst relative difference "
                                         << worst);
  CHECK(worst <= kBatchTolerance);
}

// --- CudaBackendOptions::batched_step_rows (engine/cuda/cuda_batched_step.h) ---
//
// With the option on, the step's row-wise GEMMs run over all slices' rows at
// once, so cuBLAS may pick another algorithm (another summation order) than
// for one session's rows: results are no longer bitwise those of the
// slice-by-slice path. fp32 is held to issue 11's invariant, 1e-4 worst-row
// relative (kBatchTolerance above), and identical retrievals. bf16 rounds
// every GEMM output to 8 mantissa bits, so a changed summation order can move
// an element by one bf16 step and the change travels through the layers: it
// is held to the bf16 bound the fixture parity test measured between two
// bf16 implementations (tests/cuda_backend/fixture_parity_test.cc,
// kBf16WorstRow: 0.274 worst row on the H100), and to the tie-tolerant
// retrieval comparison the bf16 parity tests use (CompareRetrievals). Neither
// was measured on this random model; each case WARNs what it saw so the
// first GPU run records it (these were written without a GPU).
constexpr double kBatchedBf16WorstRow = 0.2745;

// One session three ways: on a backend with the option off, each step alone
// (the reference), and on a backend with it on, alone and in one step with
// the others. All three hold the same history.
struct Triple {
  std::unique_ptr<Session> off, on_alone, on_batched;
  testing::RetrievalLog off_log, on_alone_log, on_batched_log;
};

std::unique_ptr<Triple> NewTriple(Backend& off, Backend& on, int64_t history, uint64_t seed) {
  auto t = std::make_unique<Triple>();
  const std::vector<int32_t> tokens = testing::RandomTokens(off.config(), history, seed);
  auto a = Session::Create(off);
  auto b = Session::Create(on);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  if (history > 0) {
    REQUIRE((*a)->Append(tokens).ok());
    REQUIRE((*b)->Append(tokens).ok());
  }
  auto fork = (*b)->Fork();
  REQUIRE(fork.ok());
  t->off = *std::move(a);
  t->on_batched = *std::move(b);
  t->on_alone = *std::move(fork);
  testing::Record(t->off->backend_session(), t->off_log);
  testing::Record(t->on_alone->backend_session(), t->on_alone_log);
  testing::Record(t->on_batched->backend_session(), t->on_batched_log);
  return t;
}

struct Worst {
  double alone = 0, batched = 0;
};

// Runs `tokens[i]` on triple i: alone on both backends, then all together on
// the batched one. Raises `worst` to the worst relative differences against
// the option-off reference.
void StepThreeWays(Backend& off, Backend& on, std::vector<std::unique_ptr<Triple>>& triples,
                   const std::vector<std::vector<int32_t>>& tokens, Worst& worst) {
  const int64_t V = off.config().vocab_size;
  const size_t n = triples.size();
  std::vector<std::vector<float>> ref(n), alone(n), batched(n);
  std::vector<StepEntry> entries(n);
  for (size_t i = 0; i < n; ++i) {
    StepEntry single{triples[i]->off.get(), tokens[i], false, &ref[i]};
    REQUIRE(RunStep(off, {single})[0].ok());
    single = {triples[i]->on_alone.get(), tokens[i], false, &alone[i]};
    REQUIRE(RunStep(on, {single})[0].ok());
    entries[i] = {triples[i]->on_batched.get(), tokens[i], false, &batched[i]};
  }
  for (const absl::Status& s : RunStep(on, entries)) REQUIRE(s.ok());
  for (size_t i = 0; i < n; ++i) {
    INFO("session " << i);
    REQUIRE(ref[i].size() == tokens[i].size() * V);
    REQUIRE(alone[i].size() == ref[i].size());
    REQUIRE(batched[i].size() == ref[i].size());
    worst.alone = std::max(worst.alone, testing::WorstRowRelativeDifference(alone[i], ref[i], V));
    worst.batched =
        std::max(worst.batched, testing::WorstRowRelativeDifference(batched[i], ref[i], V));
    const Triple& t = *triples[i];
    REQUIRE(t.on_batched->backend_session().position() == t.off->backend_session().position());
    REQUIRE(t.on_alone->backend_session().position() == t.off->backend_session().position());
    REQUIRE(t.on_batched->num_chunks() == t.off->num_chunks());
  }
}

// Two backends alike but for batched_step_rows: off (the reference) and on.
struct OffAndOn {
  std::unique_ptr<Backend> off, on;
};

OffAndOn MakeOffAndOn(const ModelConfig& config, const ModelWeights& weights,
                      CudaBackendOptions options) {
  options.batched_step_rows = false;
  auto off = MakeCudaBackend(config, weights, options);
  options.batched_step_rows = true;
  auto on = MakeCudaBackend(config, weights, options);
  REQUIRE(off.ok());
  REQUIRE(on.ok());
  return {*std::move(off), *std::move(on)};
}

// One decode token per session; session i's drawn with seed
// first_seed + i * seed_stride.
std::vector<std::vector<int32_t>> OneTokenEach(const ModelConfig& config, size_t sessions,
                                               uint64_t first_seed, uint64_t seed_stride) {
  std::vector<std::vector<int32_t>> tokens;
  for (size_t i = 0; i < sessions; ++i) {
    tokens.push_back(testing::RandomTokens(config, 1, first_seed + i * seed_stride));
  }
  return tokens;
}

void CheckWithin(const Worst& worst, double limit) {
  CHECK(worst.alone <= limit);
  CHECK(worst.batched <= limit);
}

// Each session's selections with the option on against off: identical in
// fp32, tie-tolerant in bf16 (see kBatchedBf16WorstRow).
void CheckRetrievals(const std::vector<std::unique_ptr<Triple>>& triples, CudaPrecision precision) {
  for (size_t i = 0; i < triples.size(); ++i) {
    INFO("session " << i);
    const Triple& t = *triples[i];
    if (precision == CudaPrecision::kFp32) {
      testing::CheckIdenticalRetrievals(t.off_log, t.on_alone_log, kBatchTolerance);
      testing::CheckIdenticalRetrievals(t.off_log, t.on_batched_log, kBatchTolerance);
    } else {
      testing::CompareRetrievals(t.off_log, t.on_alone_log);
      testing::CompareRetrievals(t.off_log, t.on_batched_log);
    }
  }
}

TEST_CASE("cuda: batched_step_rows gives each session the logits and retrievals of the "
          "slice-by-slice path",
          "[cuda][batch_step]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 64);
  const int64_t k = config.enc_chunk_size;  // 63 real tokens per chunk
  // decode_fused_gemv on both sides too: the 5- and 6-row decode steps
  // then run the fused decode GEMVs over the step's rows (at most 8), the
  // slices over their 1 or 2 (engine/cuda/fused_decode_ops.h), each row's
  // arithmetic the same either way; in the mixed step (303 rows) the
  // batched side runs cuBLAS where the one-row slices run fused, a
  // difference of summation order only, held to the same bounds.
  for (const bool fused : {false, true})
  for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    INFO("precision " << CudaPrecisionName(precision) << ", decode_fused_gemv " << fused);
    CudaBackendOptions options = testing::PrecisionOptions(precision);
    options.decode_fused_gemv = fused;
    auto [off, on] = MakeOffAndOn(config, weights, options);
    // The sessions of the slice-by-slice test above: prefill pieces, decode
    // tokens mid-chunk and on a boundary, one that retrieves and closes a
    // chunk with its token.
    std::vector<std::unique_ptr<Triple>> triples;
    const std::vector<int64_t> histories = {0, 5 * k + 3, 6 * k, 30 * k + 62, 12 * k + 2};
    for (size_t i = 0; i < histories.size(); ++i) {
      triples.push_back(NewTriple(*off, *on, histories[i], 1 + i));
    }
    REQUIRE(triples[3]->off->num_chunks() > config.chunk_topk);
    Worst mixed, decode;
    // 200 + 1 + 1 + 1 + 100 = 303 logit rows in one forward: more than
    // StepBuffers::kMaxLogitRows (256), so the batched Logits runs a second
    // batch.
    StepThreeWays(*off, *on, triples,
                  {testing::RandomTokens(config, 200, 11), testing::RandomTokens(config, 1, 12),
                   testing::RandomTokens(config, 1, 13), testing::RandomTokens(config, 1, 14),
                   testing::RandomTokens(config, 100, 15)},
                  mixed);
    // Decode steps of all five (the step-wide GEMMs are 5 rows, one per
    // session, or 6 when the long one's token closes a chunk and brings its
    // landmark), across the long one's next chunk boundary.
    for (int step = 0; step < 9; ++step) {
      StepThreeWays(*off, *on, triples, OneTokenEach(config, triples.size(), 100 + step * 10, 1),
                    decode);
    }
    WARN("cuda " << CudaPrecisionName(precision) << (fused ? " decode_fused_gemv" : "")
                 << " batched_step_rows vs slice by slice, worst relative difference: alone "
                 << mixed.alone << " / " << decode.alone << ", batched " << mixed.batched
                 << " / " << decode.batched << " (mixed step / decode steps)");
    const double limit =
        precision == CudaPrecision::kFp32 ? kBatchTolerance : kBatchedBf16WorstRow;
    CheckWithin(mixed, limit);
    CheckWithin(decode, limit);
    CheckRetrievals(triples, precision);
    // The option reached both engines: every session (slice by slice, alone
    // after a fork, and batched) ran fused launches in its 9 decode steps,
    // at least 4 per decoder layer per step, and none with the option off.
    const int64_t min_launches =
        9 * 4 * (config.num_lower_layers() + config.num_upper_layers());
    for (size_t i = 0; i < triples.size(); ++i) {
      INFO("session " << i);
      const Triple& t = *triples[i];
      for (const Session* session : {t.off.get(), t.on_alone.get(), t.on_batched.get()}) {
        const int64_t launches = session->backend_session().stats().fused_gemv_launches;
        if (fused) {
          CHECK(launches >= min_launches);
        } else {
          CHECK(launches == 0);
        }
      }
    }
  }
}

TEST_CASE("cuda: batched_step_rows over several forwards and after a fork, same results",
          "[cuda][batch_step]") {
  if (!testing::HaveGpu()) return;
  // More rows than the step size (several forwards, the step buffers grown
  // past their first 64 rows): the option on, each session alone (a fork)
  // and all together, against the option off, fp32.
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 65);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kFp32);
  options.max_step_positions = 128;  // two chunks
  auto [off, on] = MakeOffAndOn(config, weights, options);
  std::vector<std::unique_ptr<Triple>> triples;
  triples.push_back(NewTriple(*off, *on, 40, 1));
  triples.push_back(NewTriple(*off, *on, 4 * 63 + 10, 2));
  triples.push_back(NewTriple(*off, *on, 0, 3));
  Worst first, decode;
  StepThreeWays(*off, *on, triples,
                {testing::RandomTokens(config, 300, 21), testing::RandomTokens(config, 1, 22),
                 testing::RandomTokens(config, 90, 23)},
                first);
  for (int step = 0; step < 4; ++step) {
    StepThreeWays(*off, *on, triples, OneTokenEach(config, triples.size(), 30 + step, 10),
                  decode);
  }
  WARN("cuda fp32 batched_step_rows several forwards vs option off, worst relative difference: "
       "alone "
       << first.alone << " / " << decode.alone << ", batched " << first.batched << " / "
       << decode.batched << " (first step / decode steps)");
  CheckWithin(first, kBatchTolerance);
  CheckWithin(decode, kBatchTolerance);
  CheckRetrievals(triples, CudaPrecision::kFp32);
}

TEST_CASE("cuda: batched_step_rows with disable_gca gives the slice-by-slice base LM's logits",
          "[cuda][batch_step]") {
  if (!testing::HaveGpu()) return;
  // The base LM (no encoder, no retrieval, upper layers as plain layers):
  // the batched step's CloseChunks, PrepareGca and GcaMlp take their
  // disable_gca branches. fp32, issue 11's 1e-4.
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 66);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kFp32);
  options.disable_gca = true;
  auto [off, on] = MakeOffAndOn(config, weights, options);
  std::vector<std::unique_ptr<Triple>> triples;
  const std::vector<int64_t> histories = {0, 70, 3 * 63 + 62};
  for (size_t i = 0; i < histories.size(); ++i) {
    triples.push_back(NewTriple(*off, *on, histories[i], 7 + i));
  }
  Worst worst;
  StepThreeWays(*off, *on, triples,
                {testing::RandomTokens(config, 80, 71), testing::RandomTokens(config, 1, 72),
                 testing::RandomTokens(config, 1, 73)},
                worst);
  for (int step = 0; step < 3; ++step) {
    StepThreeWays(*off, *on, triples, OneTokenEach(config, triples.size(), 80 + step, 10), worst);
  }
  WARN("cuda fp32 disable_gca batched_step_rows vs slice by slice, worst relative difference: "
       "alone "
       << worst.alone << ", batched " << worst.batched);
  CheckWithin(worst, kBatchTolerance);
}

}  // namespace
}  // namespace drt

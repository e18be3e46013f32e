// The CUDA backend's chunk store of encoder rows (CudaBackendOptions::
// chunk_store = kEncoderRows, engine/cuda/host/fetch_batches.h) against the
// store of K/V (the default, verified): the same sessions on two backends
// alike but for the option.
//
// Both modes make a chunk's K/V with a GEMM of the same encoder output C
// (after encoder.norm, in the storage type) by the same weights; K/V mode
// once, in the encoder, with as many rows as the slice closes chunks;
// encoder-rows mode in the fetch GEMMs, after the rows came back, always
// over the whole staging (cuBLAS may pick another summation order for
// another row count). fp32 is held to 1e-4 worst-row relative, issue 9's
// fp32 parity bound, with identical retrievals (the landmarks do not depend
// on the option at all). bf16 rounds each K/V element once in both modes,
// but a changed summation order can move one by a bf16 step: the same kind
// of difference as CUDA bf16 prefill against its own token-by-token decode
// (other GEMM shapes, same kernels), measured 0.008 on an H100 and held to
// 2e-2 in cuda_session_test.cc (kBf16Case); the same bound here, with the
// tie-tolerant retrieval comparison. (The 0.2745 of the fixture parity test
// is the bf16 reference's own error against float64, far looser than two
// runs of one GPU implementation should differ.) Written without a GPU and
// NOT YET RUN: each case WARNs what it saw for the first GPU run to record.
#include <algorithm>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "engine/batch_step.h"
#include "engine/session.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

constexpr double kFp32Limit = testing::kFp32VsCpuLimit;
constexpr double kBf16WorstRow = 2e-2;

struct KvAndRows {
  std::unique_ptr<Backend> kv, rows;
};

KvAndRows MakeKvAndRows(const ModelConfig& config, const ModelWeights& weights,
                        CudaBackendOptions options) {
  options.chunk_store = CudaChunkStore::kKeysValues;
  auto kv = MakeCudaBackend(config, weights, options);
  options.chunk_store = CudaChunkStore::kEncoderRows;
  auto rows = MakeCudaBackend(config, weights, options);
  REQUIRE(kv.ok());
  REQUIRE(rows.ok());
  return {*std::move(kv), *std::move(rows)};
}

// One session on each backend, stepped with the same tokens.
struct Twins {
  std::unique_ptr<Session> kv, rows;
  testing::RetrievalLog kv_log, rows_log;
};

std::unique_ptr<Twins> NewTwins(const KvAndRows& backends) {
  auto twins = std::make_unique<Twins>();
  auto kv = Session::Create(*backends.kv);
  auto rows = Session::Create(*backends.rows);
  REQUIRE(kv.ok());
  REQUIRE(rows.ok());
  twins->kv = *std::move(kv);
  twins->rows = *std::move(rows);
  testing::Record(twins->kv->backend_session(), twins->kv_log);
  testing::Record(twins->rows->backend_session(), twins->rows_log);
  return twins;
}

// Runs `tokens` on both as one step each; returns the worst-row relative
// difference of all their logits.
double StepBoth(const KvAndRows& backends, Twins& t, const std::vector<int32_t>& tokens) {
  const int64_t V = backends.kv->config().vocab_size;
  std::vector<float> kv_logits, rows_logits;
  StepEntry kv;
  kv.session = t.kv.get();
  kv.tokens = tokens;
  kv.all_logits = &kv_logits;
  REQUIRE(RunStep(*backends.kv, {kv})[0].ok());
  StepEntry rows = kv;
  rows.session = t.rows.get();
  rows.all_logits = &rows_logits;
  REQUIRE(RunStep(*backends.rows, {rows})[0].ok());
  REQUIRE(kv_logits.size() == tokens.size() * V);
  REQUIRE(t.rows->num_chunks() == t.kv->num_chunks());
  return testing::WorstRowRelativeDifference(rows_logits, kv_logits, V);
}

void CheckRetrievals(const Twins& t, CudaPrecision precision) {
  if (precision == CudaPrecision::kFp32) {
    testing::CheckIdenticalRetrievals(t.kv_log, t.rows_log, kFp32Limit);
  } else {
    testing::CompareRetrievals(t.kv_log, t.rows_log);
  }
}

TEST_CASE("cuda: the encoder-rows chunk store gives the K/V store's logits and retrievals",
          "[cuda][chunk_store]") {
  if (!testing::HaveGpu()) return;
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 71);
  const int64_t k = config.enc_chunk_size;
  for (CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    INFO("precision " << CudaPrecisionName(precision));
    const KvAndRows backends = MakeKvAndRows(config, weights, testing::PrecisionOptions(precision));
    auto t = NewTwins(backends);
    // A prefill of 40 chunks in steps of the backend's size (1024
    // positions): a slice's fetch brings more chunks than one batch of the
    // staging holds (16; up to 17 query chunks x top-k), and the chunks
    // come from the host store and from the step's own encoder.
    double worst_prefill = 0;
    const std::vector<int32_t> prompt = testing::RandomTokens(config, 40 * k + 17, 5);
    for (size_t at = 0; at < prompt.size(); at += 1000) {
      const size_t n = std::min<size_t>(1000, prompt.size() - at);
      worst_prefill = std::max(
          worst_prefill,
          StepBoth(backends, *t, std::vector<int32_t>(prompt.begin() + at, prompt.begin() + at + n)));
    }
    REQUIRE(t->kv->num_chunks() > 8 * config.chunk_topk);
    // Decode tokens across two chunk boundaries: each landmark's selection
    // is fetched from the host (encoder rows, then the fetch GEMMs).
    double worst_decode = 0;
    for (int step = 0; step < 2 * k; ++step) {
      worst_decode = std::max(
          worst_decode, StepBoth(backends, *t, testing::RandomTokens(config, 1, 1000 + step)));
    }
    WARN("cuda " << CudaPrecisionName(precision)
                 << " encoder-rows vs K/V chunk store, worst relative difference: prefill "
                 << worst_prefill << ", decode " << worst_decode);
    const double limit = precision == CudaPrecision::kFp32 ? kFp32Limit : kBf16WorstRow;
    CHECK(worst_prefill <= limit);
    CHECK(worst_decode <= limit);
    CheckRetrievals(*t, precision);

    // What went over the bus and what the host holds: a record of rows is
    // S' x d elements against K/V's 2 x S x d, for the same chunks.
    const BackendSessionStats kv_stats = t->kv->backend_session().stats();
    const BackendSessionStats rows_stats = t->rows->backend_session().stats();
    const int64_t element = precision == CudaPrecision::kFp32 ? 4 : 2;
    const int64_t d = config.hidden_size;
    if (precision == CudaPrecision::kFp32) {
      // The same selections, so the same copies (bf16 may break near-ties
      // differently, and then fetch other chunks).
      CHECK(rows_stats.h2d_chunks == kv_stats.h2d_chunks);
      CHECK(rows_stats.d2d_chunks == kv_stats.d2d_chunks);
    }
    CHECK(rows_stats.h2d_chunks > 0);
    CHECK(kv_stats.h2d_bytes == kv_stats.h2d_chunks * 2 * 64 * d * element);
    CHECK(rows_stats.h2d_bytes == rows_stats.h2d_chunks * 63 * d * element);
    CHECK(rows_stats.d2h_bytes == t->rows->num_chunks() * 63 * d * element);
    const SessionMemory kv_memory = t->kv->backend_session().memory();
    const SessionMemory rows_memory = t->rows->backend_session().memory();
    // Slabs of the same number of chunks each.
    CHECK(kv_memory.chunk_store_bytes * 63 == rows_memory.chunk_store_bytes * 128);
  }
}

TEST_CASE("cuda: the encoder-rows chunk store with a small step and after a fork",
          "[cuda][chunk_store]") {
  if (!testing::HaveGpu()) return;
  // Steps of two chunks (every slice's fetch is small, most chunks come
  // from the host), then a fork of each: the fork shares the parent's host
  // records and makes its K/V from them alike.
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 72);
  CudaBackendOptions options = testing::PrecisionOptions(CudaPrecision::kFp32);
  options.max_step_positions = 128;
  const KvAndRows backends = MakeKvAndRows(config, weights, options);
  auto t = NewTwins(backends);
  double worst = 0;
  const std::vector<int32_t> prompt = testing::RandomTokens(config, 20 * 63 + 5, 9);
  for (size_t at = 0; at < prompt.size(); at += 100) {
    const size_t n = std::min<size_t>(100, prompt.size() - at);
    worst = std::max(worst, StepBoth(backends, *t, std::vector<int32_t>(
                                                       prompt.begin() + at, prompt.begin() + at + n)));
  }
  Twins forks;
  auto kv_fork = t->kv->Fork();
  auto rows_fork = t->rows->Fork();
  REQUIRE(kv_fork.ok());
  REQUIRE(rows_fork.ok());
  forks.kv = *std::move(kv_fork);
  forks.rows = *std::move(rows_fork);
  testing::Record(forks.kv->backend_session(), forks.kv_log);
  testing::Record(forks.rows->backend_session(), forks.rows_log);
  for (int step = 0; step < 70; ++step) {
    worst = std::max(worst, StepBoth(backends, forks, testing::RandomTokens(config, 1, 50 + step)));
  }
  WARN("cuda fp32 encoder-rows vs K/V chunk store, small steps and a fork: worst relative "
       "difference "
       << worst);
  CHECK(worst <= kFp32Limit);
  CheckRetrievals(*t, CudaPrecision::kFp32);
  CheckRetrievals(forks, CudaPrecision::kFp32);
}

}  // namespace
}  // namespace drt

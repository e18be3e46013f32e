// GCA keys and values made from stored encoder rows (engine/cpu/chunk_kv.h,
// engine/cpu/chunk_kv_cache.h): the same bits as the same GEMM on the
// encoder's output, within the fp32 error bound of a double product,
// independent of the chunks made with them and of the thread count; the
// cache's bytes and trimming by hand; a session's store of encoder rows takes
// what its chunks' rows take, to the byte; the cache never changes logits.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/cpu/chunk_encoder.h"
#include "engine/cpu/chunk_kv.h"
#include "engine/cpu/chunk_kv_cache.h"
#include "engine/cpu/chunk_store.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/thread_pool.h"
#include "engine/model_rules.h"
#include "engine/session.h"
#include "engine/session_state.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

// TinyConfig with the real chunk size: 63 tokens and a landmark, 64 rows.
ModelConfig ChunkConfig() {
  ModelConfig c = testing::TinyConfig();
  c.enc_chunk_size = 63;
  return c;
}

// The encoder output C of `count` chunks of random lower-layer rows.
std::vector<float> EncoderOutput(const ModelConfig& c, const ModelWeights& w, int64_t count,
                                 cpu::ThreadPool& pool) {
  std::mt19937_64 rng(5);
  const std::vector<float> rows =
      testing::RandomVector(count * c.chunk_positions() * c.hidden_size, 1.f, rng);
  cpu::EncodedChunks encoded;
  cpu::EncodeChunks(c, w, rows.data(), count, pool, encoded);
  return encoded.output;
}

TEST_CASE("chunk K/V from stored encoder rows: the encoder output's GEMM to the bit, "
          "within the fp32 bound of a double product",
          "[chunk_kv]") {
  cpu::UseSingleThreadedBlas();
  const ModelConfig c = ChunkConfig();
  const ModelWeights w = testing::RandomWeights(c, 17);
  const int64_t S = c.chunk_positions(), S1 = c.enc_chunk_size, d = c.hidden_size;
  const int64_t landmark = LandmarkRowInChunk(c);
  REQUIRE(landmark == S1);  // the real rows come first, the landmark last
  cpu::ThreadPool pool(2);
  const int64_t count = 3;
  const std::vector<float> C = EncoderOutput(c, w, count, pool);

  // Through the chunk store and the state format, as a restored session
  // reads them.
  cpu::ChunkStore store(S1, d);
  for (int64_t k = 0; k < count; ++k) {
    store.Append(C.data() + (k * S + landmark) * d, C.data() + k * S * d);
  }
  double worst_ratio = 0;
  for (int64_t k = 0; k < count; ++k) {
    ChunkData chunk{{store.landmark(k), store.landmark(k) + d},
                    {store.encoder_rows(k), store.encoder_rows(k) + S1 * d}};
    std::string payload;
    EncodeChunk(chunk, payload);
    REQUIRE(payload.size() == ChunkPayloadBytes(c));
    ChunkData decoded;
    REQUIRE(DecodeChunk(payload, c, decoded).ok());
    std::vector<float> keys(S * d, -1.f), values(S * d, -1.f);
    cpu::MakeChunkKeysValues(c, w, decoded.rows.data(), keys.data(), values.data());

    // The same fixed-shape GEMM straight on the encoder's output buffer.
    std::vector<float> want_k(S * d, 0.f), want_v(S * d, 0.f);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S1, d, d, 1.f, C.data() + k * S * d, d,
                w.chunk_k_proj.data(), d, 0.f, want_k.data(), d);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S1, d, d, 1.f, C.data() + k * S * d, d,
                w.chunk_v_proj.data(), d, 0.f, want_v.data(), d);
    REQUIRE(std::memcmp(keys.data(), want_k.data(), keys.size() * sizeof(float)) == 0);
    REQUIRE(std::memcmp(values.data(), want_v.data(), values.size() * sizeof(float)) == 0);
    REQUIRE(decoded.landmark ==
            std::vector<float>(C.begin() + (k * S + landmark) * d,
                               C.begin() + (k * S + landmark + 1) * d));

    // Against the rule in double (drt-model.md, Forward pass 4): K = C W_k^T,
    // V = C W_v^T over C's real rows, the landmark row zero. An fp32 dot
    // product of d terms is within gamma_d * sum |c_i w_i| of the exact one,
    // gamma_d = d u / (1 - d u), u = 2^-24 (Higham, Accuracy and Stability of
    // Numerical Algorithms, 3.1); the worst measured ratio to that bound is
    // printed.
    const double u = std::ldexp(1.0, -24);
    const double gamma = d * u / (1 - d * u);
    for (int which = 0; which < 2; ++which) {
      const std::vector<float>& weight = which == 0 ? w.chunk_k_proj : w.chunk_v_proj;
      const std::vector<float>& got = which == 0 ? keys : values;
      for (int64_t i = 0; i < S; ++i) {
        for (int64_t j = 0; j < d; ++j) {
          double exact = 0, magnitude = 0;
          if (i != landmark) {
            for (int64_t t = 0; t < d; ++t) {
              const double p = static_cast<double>(C[(k * S + i) * d + t]) * weight[j * d + t];
              exact += p;
              magnitude += std::fabs(p);
            }
          }
          const double error = std::fabs(got[i * d + j] - exact);
          if (i == landmark) {
            REQUIRE(got[i * d + j] == 0.f);  // exactly zero, not small
          } else {
            REQUIRE(error <= gamma * magnitude);
            if (magnitude > 0) worst_ratio = std::max(worst_ratio, error / (gamma * magnitude));
          }
        }
      }
    }
  }
  WARN("worst |fp32 - double| / (gamma_d * sum|c w|) = " << worst_ratio);
}

TEST_CASE("a chunk's K/V do not depend on the chunks made with it or on the threads",
          "[chunk_kv]") {
  cpu::UseSingleThreadedBlas();
  const ModelConfig c = ChunkConfig();
  const ModelWeights w = testing::RandomWeights(c, 23);
  const int64_t S = c.chunk_positions(), d = c.hidden_size;
  cpu::ThreadPool one(1);
  const int64_t count = 6;
  const std::vector<float> C = EncoderOutput(c, w, count, one);
  // Alone, one chunk at a time on one thread.
  std::vector<std::vector<float>> alone(count, std::vector<float>(2 * S * d));
  for (int64_t k = 0; k < count; ++k) {
    cpu::MakeChunkKeysValues(c, w, C.data() + k * S * d, alone[k].data(),
                             alone[k].data() + S * d);
  }
  // All together across three threads, in reverse order, more than once.
  cpu::ThreadPool three(3);
  for (int repeat = 0; repeat < 3; ++repeat) {
    std::vector<std::vector<float>> together(count, std::vector<float>(2 * S * d));
    three.ParallelFor(count, [&](int64_t i) {
      const int64_t k = count - 1 - i;
      cpu::MakeChunkKeysValues(c, w, C.data() + k * S * d, together[k].data(),
                               together[k].data() + S * d);
    });
    for (int64_t k = 0; k < count; ++k) REQUIRE(together[k] == alone[k]);
  }
}

TEST_CASE("ChunkKvCache: bytes, use order and trimming, by hand", "[chunk_kv]") {
  constexpr int64_t kFloats = 10;  // per keys and per values
  constexpr size_t kEntryBytes = 2 * kFloats * sizeof(float);
  cpu::ChunkKvCache cache(/*reserve=*/2);
  CHECK(cache.bytes() == 0);
  CHECK(cache.Use(4) == nullptr);
  for (int64_t chunk : {1, 2, 3, 4, 5}) cache.Add(chunk, kFloats).keys[0] = static_cast<float>(chunk);
  CHECK(cache.size() == 5);
  CHECK(cache.bytes() == 5 * kEntryBytes);
  // Use order now: 1 2 3 4 5; using 2 then 1 makes it 3 4 5 2 1.
  REQUIRE(cache.Use(2) != nullptr);
  REQUIRE(cache.Use(1)->keys[0] == 1.f);
  // Keep 3 by name; of the others (4 5 2 1) the two most recent stay: 2, 1.
  cache.Trim({3});
  CHECK(cache.size() == 3);
  CHECK(cache.Contains(3));
  CHECK(cache.Contains(2));
  CHECK(cache.Contains(1));
  CHECK_FALSE(cache.Contains(4));
  CHECK_FALSE(cache.Contains(5));
  CHECK(cache.bytes() == 3 * kEntryBytes);
  // Naming chunks the cache lacks keeps nothing extra; with no reserve
  // left over only the named ones stay.
  cpu::ChunkKvCache none(/*reserve=*/0);
  for (int64_t chunk : {7, 8, 9}) none.Add(chunk, kFloats);
  none.Trim({8, 42});
  CHECK(none.size() == 1);
  CHECK(none.Contains(8));
  CHECK(none.bytes() == kEntryBytes);
  // A copy (a fork) shares the entries: the same K/V, not a copy of them.
  cpu::ChunkKvCache copy = cache;
  CHECK(copy.Use(3) == cache.Use(3));
}

TEST_CASE("a session's chunk store holds encoder rows: half the bytes of K/V, to the byte",
          "[chunk_kv]") {
  const ModelConfig c = ChunkConfig();
  const ModelWeights w = testing::RandomWeights(c, 29);
  const int64_t d = c.hidden_size;
  auto backend = MakeCpuBackend(c, w);
  auto session = Session::Create(*backend);
  REQUIRE(session.ok());
  const int64_t chunks = 2 * cpu::ChunkStore::kChunksPerBlock + 3;  // 3 blocks, one partly full
  REQUIRE((*session)->Append(testing::RandomTokens(c, chunks * c.enc_chunk_size + 5, 3)).ok());
  REQUIRE((*session)->num_chunks() == chunks);
  const SessionMemory m = (*session)->backend_session().memory();
  // Blocks are allocated whole: 3 blocks of 64 chunks, S' = 63 rows of d
  // floats each. K and V took 2 x 64 rows per chunk: 8,388,608 bytes here.
  const size_t rows_bytes = 3 * 64 * 63 * d * sizeof(float);
  const size_t kv_bytes = 3 * 64 * 2 * 64 * d * sizeof(float);
  CHECK(m.chunk_store_bytes == rows_bytes);
  CHECK(kv_bytes == 2 * rows_bytes + 3 * 64 * 2 * d * sizeof(float));  // 2 x 63 rows + 2 zero rows
  CHECK(m.landmark_bytes == 3 * 64 * d * sizeof(float));
  // What the server's memory budget expects one more chunk to take
  // (SessionManager::CheckBudget): the store's and the landmarks' growth per
  // chunk, as held here.
  CHECK(backend->host_bytes_per_chunk() ==
        static_cast<int64_t>((m.chunk_store_bytes + m.landmark_bytes) / (3 * 64)));
  // A record of the state format: the landmark and 63 rows, 64 x d floats,
  // against (2 x 64 + 1) x d floats of landmark + K + V.
  CHECK(ChunkPayloadBytes(c) == 64 * d * sizeof(float));
  ChunkData chunk;
  REQUIRE((*session)->backend_session().ReadChunk(chunks - 1, chunk).ok());
  CHECK(chunk.landmark.size() == static_cast<size_t>(d));
  CHECK(chunk.rows.size() == static_cast<size_t>(63 * d));
}

// Distinct chunks the selections in force name.
std::set<int64_t> InForce(const BackendSession& s) {
  std::set<int64_t> chunks;
  for (const Retrieval& r : s.current_retrieval()) chunks.insert(r.chunks.begin(), r.chunks.end());
  return chunks;
}

TEST_CASE("the K/V cache holds the selections in force plus its reserve, and never changes "
          "logits",
          "[chunk_kv]") {
  ModelConfig c = testing::TinyConfig();  // 8 positions per chunk: many selections
  const ModelWeights w = testing::RandomWeights(c, 31);
  const size_t entry = 2 * c.chunk_positions() * c.hidden_size * sizeof(float);
  CpuBackendOptions no_reserve, reserve;
  reserve.chunk_kv_reserve = 5;
  auto plain = MakeCpuBackend(c, w, no_reserve);
  auto kept = MakeCpuBackend(c, w, reserve);
  auto a = Session::Create(*plain);
  auto b = Session::Create(*kept);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const std::vector<int32_t> prompt = testing::RandomTokens(c, 40 * c.enc_chunk_size + 3, 8);
  REQUIRE((*a)->Append(prompt).ok());
  REQUIRE((*b)->Append(prompt).ok());
  const std::vector<int32_t> more = testing::RandomTokens(c, 3 * c.enc_chunk_size, 9);
  for (int32_t token : more) {
    const std::set<int64_t> before = InForce((*a)->backend_session());
    const int64_t chunks_before = (*a)->num_chunks();
    REQUIRE((*a)->Append({token}).ok());
    REQUIRE((*b)->Append({token}).ok());
    const auto la = (*a)->last_logits(), lb = (*b)->last_logits();
    REQUIRE(std::equal(la.begin(), la.end(), lb.begin(), lb.end()));  // bit for bit
    // The step's rows read the selections in force before it (a selection
    // made at a landmark serves the positions after it): their K/V were
    // made. Those the selections in force now name stay; new ones are made
    // when first read, by the next step.
    const std::set<int64_t> now = InForce((*a)->backend_session());
    REQUIRE_FALSE(now.empty());
    size_t made_and_in_force = 0;
    for (int64_t chunk : now) made_and_in_force += before.count(chunk);
    if ((*a)->num_chunks() == chunks_before) REQUIRE(now == before);  // no landmark in the step
    CHECK((*a)->backend_session().memory().chunk_kv_cache_bytes == made_and_in_force * entry);
    const size_t held = (*b)->backend_session().memory().chunk_kv_cache_bytes;
    // With a reserve, in-force chunks made earlier may be held too: at most
    // all of them, plus five others.
    CHECK(held >= made_and_in_force * entry);
    CHECK(held <= (now.size() + 5) * entry);
  }
  // The reserve makes fewer chunks' K/V again.
  CHECK((*b)->backend_session().stats().kv_made_chunks <
        (*a)->backend_session().stats().kv_made_chunks);
  CHECK((*b)->backend_session().memory().total() ==
        (*a)->backend_session().memory().total() +
            ((*b)->backend_session().memory().chunk_kv_cache_bytes -
             (*a)->backend_session().memory().chunk_kv_cache_bytes));
}

}  // namespace
}  // namespace drt

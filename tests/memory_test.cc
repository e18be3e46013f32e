// Per-session memory besides the chunk store stays flat with context length
// (drt-model.md, "What follows for the engine").
#include <unistd.h>

#include <fstream>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/session.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

size_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t total_pages = 0, resident_pages = 0;
  statm >> total_pages >> resident_pages;
  return resident_pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

TEST_CASE("200,000 tokens: memory besides the chunk store stays flat", "[engine][memory]") {
  ModelConfig config = testing::TinyConfig();
  config.enc_chunk_size = 63;
  config.slide_window = 64;
  const ModelWeights weights = testing::RandomWeights(config, 31);
  auto backend = MakeCpuBackend(config, weights);
  auto session = Session::Create(*backend);
  REQUIRE(session.ok());

  const int64_t piece = 10000;
  const auto tokens = testing::RandomTokens(config, piece, 1);
  auto append_piece = [&] { REQUIRE((*session)->Append(tokens).ok()); };

  for (int i = 0; i < 5; ++i) append_piece();  // 50,000 tokens: warm, scratch sized
  const SessionMemory at_50k = (*session)->backend_session().memory();
  const size_t rss_50k = ResidentBytes();
  for (int i = 0; i < 15; ++i) append_piece();  // 200,000 tokens
  const SessionMemory at_200k = (*session)->backend_session().memory();
  const size_t rss_200k = ResidentBytes();

  REQUIRE((*session)->num_tokens() == 200000);
  REQUIRE((*session)->num_chunks() == 200000 / 63);
  // Bounded state is exactly the same size.
  REQUIRE(at_200k.window_bytes == at_50k.window_bytes);
  REQUIRE(at_200k.open_chunk_bytes == at_50k.open_chunk_bytes);
  REQUIRE(at_200k.selection_bytes == at_50k.selection_bytes);
  // K/V made for the selections in force: at most top-k chunks per group,
  // 2 x 64 rows x d floats each (the backend's default keeps no reserve).
  const size_t kv_per_chunk = 2 * 64 * config.hidden_size * sizeof(float);
  REQUIRE(at_200k.chunk_kv_cache_bytes > 0);
  REQUIRE(at_200k.chunk_kv_cache_bytes <=
          static_cast<size_t>(config.num_groups() * config.chunk_topk) * kv_per_chunk);
  // The store grows with the chunks: their encoder rows, 63 rows x d floats
  // each (K and V are made when read; they took 2 x 64 rows before).
  const size_t per_chunk = 63 * config.hidden_size * sizeof(float);
  REQUIRE(at_200k.chunk_store_bytes >= per_chunk * (200000 / 63));
  REQUIRE(at_200k.chunk_store_bytes <= per_chunk * (200000 / 63 + 64));  // one partly filled block

  // The process grew by the store and the landmarks, and by little else.
  const double grown = static_cast<double>(rss_200k) - static_cast<double>(rss_50k);
  const double expected = static_cast<double>(at_200k.chunk_store_bytes - at_50k.chunk_store_bytes) +
                          static_cast<double>(at_200k.landmark_bytes - at_50k.landmark_bytes);
  INFO("RSS grew by " << grown / 1048576 << " MiB; store and landmarks by " << expected / 1048576
                      << " MiB");
  REQUIRE(grown <= expected + 8.0 * 1048576);
}

}  // namespace
}  // namespace drt

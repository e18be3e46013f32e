// The CUDA backend's chunk tier policy (engine/cuda/host/chunk_tier_policy.h,
// CudaChunkTier::kAuto) and the device tier's slot table
// (engine/cuda/host/gca_slot_table.h, DeviceStoreSlots), plain C++, against
// hand-computed cases.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cuda/host/chunk_tier_policy.h"
#include "engine/cuda/host/gca_slot_table.h"

namespace drt::cuda {
namespace {

// The 128M config's K/V record in bf16: 2 x 64 x 768 x 2 bytes.
constexpr int64_t kRecord128M = 196608;

TEST_CASE("chunk tier: the budget is the free memory less the reserve", "[cuda_host]") {
  CHECK(DeviceTierBudgetBytes(1000, 0.10) == 900);
  CHECK(DeviceTierBudgetBytes(1001, 0.10) == 900);  // 900.9 rounds down
  CHECK(DeviceTierBudgetBytes(1000, 0.0) == 1000);
  CHECK(DeviceTierBudgetBytes(1000, 1.0) == 0);
  // 80 GiB free: 72 GiB for chunk stores.
  CHECK(DeviceTierBudgetBytes(int64_t{80} << 30, 0.10) == int64_t{72} << 30);
  // Nonsense gives no device tier, never a negative budget.
  CHECK(DeviceTierBudgetBytes(-5, 0.10) == 0);
  CHECK(DeviceTierBudgetBytes(1000, -0.5) == 0);
  CHECK(DeviceTierBudgetBytes(1000, 1.5) == 0);
}

TEST_CASE("chunk tier: a session of T tokens holds ceil(T / 63) chunks", "[cuda_host]") {
  CHECK(MaxChunksForTokens(0, 63) == 0);
  CHECK(MaxChunksForTokens(62, 63) == 1);
  CHECK(MaxChunksForTokens(63, 63) == 1);
  CHECK(MaxChunksForTokens(64, 63) == 2);
  CHECK(MaxChunksForTokens(16384, 63) == 261);  // 16384 = 260 x 63 + 4
  CHECK(MaxChunksForTokens(49152, 63) == 781);  // 49152 = 780 x 63 + 12
  CHECK(MaxChunksForTokens(100, 0) == 0);
  CHECK(MaxChunksForTokens(-1, 63) == 0);
}

TEST_CASE("chunk tier: the device store doubles to hold what it must", "[cuda_host]") {
  CHECK(GrownDeviceStoreCapacity(0, 1, 16) == 16);
  CHECK(GrownDeviceStoreCapacity(0, 16, 16) == 16);
  CHECK(GrownDeviceStoreCapacity(0, 17, 16) == 32);
  CHECK(GrownDeviceStoreCapacity(16, 16, 16) == 16);  // enough already
  CHECK(GrownDeviceStoreCapacity(16, 100, 16) == 128);
  CHECK(GrownDeviceStoreCapacity(781, 782, 16) == 1562);  // an exact store, then doubled
  CHECK(GrownDeviceStoreCapacity(0, 0, 16) == 0);
}

TEST_CASE("chunk tier: the device store doubles while that fits, then steps by 1/8 or what "
          "fits, never below the need",
          "[cuda_host]") {
  // Doubling 1024 -> 2048 when 2048 fit beside the held arrays.
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {2048}) == 2048);
  // It does not: 1025 + 1025 / 8 = 1153 when that fits.
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {2047}) == 1153);
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {1153}) == 1153);
  // Nor does the step: as much of it as fits.
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {1152}) == 1152);
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {1025}) == 1025);
  // Not even the need: the need (its allocation then fails,
  // RESOURCE_EXHAUSTED).
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {1024}) == 1025);
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {100}) == 1025);
  // The step is at least one chunk.
  CHECK(GrownDeviceStoreCapacity(4, 5, 4, {7}) == 6);
  // The cap (the largest context's chunks) bounds doubling and the step,
  // never the need.
  CHECK(GrownDeviceStoreCapacity(16, 17, 16, {1000, 20}) == 20);
  // A need past the cap (a caller that does not stop at it) takes the
  // bounded step, not one chunk: 17 + max(1, 17 / 8) = 19; 1025 + 128.
  CHECK(GrownDeviceStoreCapacity(16, 17, 16, {1000, 10}) == 19);
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {4096, 1000}) == 1153);
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {1100, 1000}) == 1100);  // what fits
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {1000, 1000}) == 1025);  // never below the need
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {1100, 1050}) == 1050);
  CHECK(GrownDeviceStoreCapacity(1024, 1025, 16, {1200, 1150}) == 1150);  // the step, capped
  // Held already: no growth, whatever the limits.
  CHECK(GrownDeviceStoreCapacity(2048, 1025, 16, {0, 0}) == 2048);
}

// A session of the 128M config (d = 768, bf16: kRecord128M bytes of K and V
// per chunk) on the device tier, grown chunk by chunk on a GPU with
// `usable` bytes beside `other` bytes (weights, buffers), as
// DeviceChunkStore::Reserve grows it: the room measured before each growth
// (free memory / bytes per chunk), the policy's size tried, then the need
// alone; a growth holds the old and new stores at once. Returns the
// capacity at which it stops (an allocation of even the need fails), or
// `until` chunks when it gets there; counts growths and chunk copies.
struct Grown {
  int64_t ceiling = 0;
  int64_t growths = 0;
  int64_t copied_chunks = 0;
};
Grown GrowOnDevice(int64_t usable, int64_t other, int64_t until, bool limited,
                   int64_t cap_chunks = std::numeric_limits<int64_t>::max()) {
  Grown g;
  int64_t capacity = 0, held = 0;  // chunks allocated, chunks stored
  while (held < until) {
    const int64_t needed = held + 1;
    if (needed > capacity) {
      const int64_t free_bytes = usable - other - capacity * kRecord128M;
      DeviceStoreGrowthLimits limits;
      if (limited) limits = {free_bytes / kRecord128M, cap_chunks};
      int64_t grown = GrownDeviceStoreCapacity(capacity, needed, 16, limits);
      if (grown * kRecord128M > free_bytes && limited) grown = needed;  // the retry
      if (grown * kRecord128M > free_bytes) break;
      g.copied_chunks += held;
      ++g.growths;
      capacity = grown;
    }
    held = needed;
  }
  g.ceiling = capacity;
  return g;
}

TEST_CASE("chunk tier: device store growth at 16M-64M tokens (128M config, bf16)",
          "[cuda_host]") {
  constexpr int64_t kGiB = int64_t{1} << 30;
  constexpr int64_t kOther = 2 * kGiB;  // weights (~0.25 GiB) and buffers, say
  const int64_t kH200 = 139 * kGiB, kH100 = 78 * kGiB;
  const int64_t tokens_20m = MaxChunksForTokens(20'000'000, 63);  // 317,461 chunks
  const int64_t tokens_64m = MaxChunksForTokens(64'000'000, 63);
  REQUIRE(tokens_20m == 317461);

  // Doubling alone stops at 2^18 chunks (16.5M tokens, 48 GiB) on either
  // GPU: 2^19 chunks are 96 GiB, beside the 48 held.
  CHECK(GrowOnDevice(kH200, kOther, tokens_20m, /*limited=*/false).ceiling == int64_t{1} << 18);
  CHECK(GrowOnDevice(kH100, kOther, tokens_20m, false).ceiling == int64_t{1} << 18);

  // With the policy a store stops only where old + need no longer fit: at
  // c chunks, growing by one needs (2c + 1) x record <= usable - other, so
  // it stops at c* = ((usable - other) / record - 1) / 2 chunks or later.
  for (const int64_t usable : {kH200, kH100}) {
    INFO("usable GiB " << usable / kGiB);
    const Grown g = GrowOnDevice(usable, kOther, tokens_64m, true);
    const int64_t c_star = ((usable - kOther) / kRecord128M - 1) / 2;
    CHECK(g.ceiling >= c_star);
    CHECK(g.ceiling * kRecord128M <= usable - kOther);
    CHECK(g.ceiling < tokens_64m);  // 64M tokens (186 GiB) fit neither GPU
  }
  // The H200 holds 20M tokens (58 GiB of store), the H100 no more than
  // doubling gave it: 2^18 is its largest store that can still double.
  CHECK(GrowOnDevice(kH200, kOther, tokens_20m, true).ceiling >= tokens_20m);
  const Grown h100 = GrowOnDevice(kH100, kOther, tokens_64m, true);
  CHECK(h100.ceiling >= int64_t{1} << 18);
  CHECK(h100.ceiling < tokens_20m);

  // The cost on the H200 up to 20M tokens: the doublings to 2^18 copy
  // fewer than 2^18 chunks in all; each bounded step copies the store, at
  // most 8 times the room it adds.
  const Grown h200 = GrowOnDevice(kH200, kOther, tokens_20m, true);
  CHECK(h200.copied_chunks <=
        (int64_t{1} << 18) + kBoundedGrowthDivisor * (h200.ceiling - (int64_t{1} << 18)));
  // 16 -> 2^18 chunks: the first allocation and 14 doublings; then two
  // steps of 1/8 (294,913, 331,778 chunks).
  CHECK(h200.growths == 15 + 2);
  CHECK(h200.ceiling == 331778);

  // The cap: a server of 16M-token contexts never holds a store past what
  // 16M tokens need (253,969 chunks instead of 2^18).
  const int64_t tokens_16m = MaxChunksForTokens(16'000'000, 63);
  CHECK(GrowOnDevice(kH100, kOther, tokens_16m, true, tokens_16m).ceiling == tokens_16m);
}

TEST_CASE("chunk tier: the ledger grants within its budget and takes grants back",
          "[cuda_host]") {
  auto ledger = std::make_shared<DeviceTierLedger>(1000);
  CHECK(ledger->TryGrant(600));
  CHECK_FALSE(ledger->TryGrant(401));  // 1001 > 1000: refused, nothing changes
  CHECK(ledger->granted_bytes() == 600);
  CHECK(ledger->TryGrant(400));  // exactly full
  CHECK_FALSE(ledger->TryGrant(1));
  CHECK_FALSE(ledger->TryGrant(-1));
  ledger->Release(400);
  CHECK(ledger->granted_bytes() == 600);
  {
    DeviceTierGrant grant(ledger, 600);
    CHECK(grant.bytes() == 600);
    grant.Grow(50);  // past the budget: counted anyway
    CHECK(ledger->granted_bytes() == 650);
    DeviceTierGrant moved = std::move(grant);
    CHECK(grant.bytes() == 0);
    CHECK(moved.bytes() == 650);
  }
  // The moved-from grant gave back nothing, the moved-to one everything.
  CHECK(ledger->granted_bytes() == 0);
}

// Free device memory far above any store of these tests: only the ledger
// decides.
constexpr int64_t kPlentyFree = int64_t{1} << 50;

// ChooseAutoTier with an allocation that succeeds and records its size.
AutoTierChoice Choose(const std::shared_ptr<DeviceTierLedger>& ledger, int64_t max_tokens,
                      int64_t bytes_per_chunk, int64_t free_bytes = kPlentyFree,
                      std::vector<int64_t>* allocated = nullptr) {
  auto choice = ChooseAutoTier(ledger, free_bytes, max_tokens, 63, bytes_per_chunk,
                               [allocated](int64_t chunks) {
                                 if (allocated != nullptr) allocated->push_back(chunks);
                                 return absl::OkStatus();
                               });
  REQUIRE(choice.ok());
  return *std::move(choice);
}

TEST_CASE("chunk tier: auto puts sessions on the device while their whole store fits",
          "[cuda_host]") {
  // A budget for 1600 chunks of the 128M config: sessions of 48K tokens
  // (781 chunks each) fit twice, the third goes to the host; once one is
  // gone, a new one fits again.
  auto ledger = std::make_shared<DeviceTierLedger>(1600 * kRecord128M);
  std::vector<int64_t> allocated;
  AutoTierChoice a = Choose(ledger, 49152, kRecord128M, kPlentyFree, &allocated);
  CHECK(a.device);
  CHECK(a.store_chunks == 781);
  CHECK(a.grant.bytes() == 781 * kRecord128M);
  CHECK(allocated == std::vector<int64_t>{781});  // the whole store, at once
  AutoTierChoice b = Choose(ledger, 49152, kRecord128M);
  CHECK(b.device);
  AutoTierChoice c = Choose(ledger, 49152, kRecord128M, kPlentyFree, &allocated);
  CHECK_FALSE(c.device);
  CHECK(c.store_chunks == 0);
  CHECK(c.grant.bytes() == 0);
  CHECK(allocated.size() == 1);  // the host tier allocates no store
  CHECK(ledger->granted_bytes() == 2 * 781 * kRecord128M);
  // A smaller session still fits beside them: 38 chunks of room left.
  AutoTierChoice small = Choose(ledger, 38 * 63, kRecord128M);
  CHECK(small.device);
  CHECK(small.store_chunks == 38);
  CHECK_FALSE(Choose(ledger, 1, kRecord128M).device);
  a.grant.Reset();
  CHECK(Choose(ledger, 49152, kRecord128M).device);
  // The server's default context (2^32 tokens) never fits: the host tier.
  CHECK_FALSE(Choose(ledger, int64_t{1} << 32, kRecord128M).device);
  // No ledger, no context or no record size: the host tier.
  CHECK_FALSE(Choose(nullptr, 49152, kRecord128M).device);
  CHECK_FALSE(Choose(ledger, 0, kRecord128M).device);
  CHECK_FALSE(Choose(ledger, 100, 0).device);
  // A product that would overflow is the host tier, not a wrapped grant.
  CHECK_FALSE(ChooseAutoTier(ledger, kPlentyFree, int64_t{1} << 62, 1, int64_t{1} << 20,
                             [](int64_t) { return absl::OkStatus(); })
                  ->device);
}

TEST_CASE("chunk tier: auto leaves the reserve free on the device, whatever the ledger says",
          "[cuda_host]") {
  // The ledger has room for everything; the device's free memory measured
  // at the decision, less the reserve of 1000 bytes, decides. Host-tier
  // sessions' own buffers, which the ledger does not count, show up there.
  auto ledger = std::make_shared<DeviceTierLedger>(int64_t{1} << 40, 1000);
  CHECK(ledger->reserve_bytes() == 1000);
  const int64_t store = 781 * kRecord128M;
  {
    AutoTierChoice fits = Choose(ledger, 49152, kRecord128M, store + 1000);  // exactly
    CHECK(fits.device);
    CHECK(ledger->granted_bytes() == store);
  }
  CHECK(ledger->granted_bytes() == 0);
  std::vector<int64_t> allocated;
  AutoTierChoice refused = Choose(ledger, 49152, kRecord128M, store + 999, &allocated);
  CHECK_FALSE(refused.device);
  CHECK(allocated.empty());
  CHECK(ledger->granted_bytes() == 0);
  CHECK_FALSE(Choose(ledger, 49152, kRecord128M, 0).device);
}

TEST_CASE("chunk tier: auto falls back to the host when the store cannot be allocated",
          "[cuda_host]") {
  auto ledger = std::make_shared<DeviceTierLedger>(int64_t{1} << 40);
  // RESOURCE_EXHAUSTED (the memory went since the measurement): the host
  // tier, the grant given back.
  int64_t asked = 0;
  auto fallback = ChooseAutoTier(ledger, kPlentyFree, 49152, 63, kRecord128M,
                                 [&](int64_t chunks) {
                                   asked = chunks;
                                   CHECK(ledger->granted_bytes() == chunks * kRecord128M);
                                   return absl::ResourceExhaustedError("out of memory");
                                 });
  REQUIRE(fallback.ok());
  CHECK(asked == 781);
  CHECK_FALSE(fallback->device);
  CHECK(fallback->store_chunks == 0);
  CHECK(fallback->grant.bytes() == 0);
  CHECK(ledger->granted_bytes() == 0);
  // Any other error is the session's error, the grant given back too.
  auto failed = ChooseAutoTier(ledger, kPlentyFree, 49152, 63, kRecord128M,
                               [](int64_t) { return absl::InternalError("cudaErrorLaunchFailure"); });
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == absl::StatusCode::kInternal);
  CHECK(ledger->granted_bytes() == 0);
}

TEST_CASE("chunk tier: concurrent grants never pass the budget and all come back",
          "[cuda_host]") {
  // Sessions are created and destroyed on several threads. Each thread
  // grants and gives back sizes whose sum over the threads is about twice
  // the budget, so that grants are refused under contention; after every
  // grant the total is read under the ledger's lock and must be within it.
  constexpr int kThreads = 4;
  constexpr int kRounds = 20000;
  constexpr int64_t kBudget = 1000;
  auto ledger = std::make_shared<DeviceTierLedger>(kBudget);
  std::vector<int64_t> over(kThreads, 0), granted(kThreads, 0), refused(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const int64_t bytes = 100 + 37 * ((i + t) % 11);  // 100..470
        if (i % 2 == 0) {
          // No Catch2 assertion on these threads (it is not thread-safe):
          // counted, checked after the join. One chunk of `bytes`.
          auto c = ChooseAutoTier(ledger, kPlentyFree, 63, 63, bytes,
                                  [](int64_t) { return absl::OkStatus(); });
          if (!c.ok()) {
            ++over[t];
          } else if (c->device) {
            ++granted[t];
            if (ledger->granted_bytes() > kBudget) ++over[t];
          } else {
            ++refused[t];
          }
        } else if (ledger->TryGrant(bytes)) {
          ++granted[t];
          if (ledger->granted_bytes() > kBudget) ++over[t];
          ledger->Release(bytes);
        } else {
          ++refused[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  int64_t total_granted = 0, total_refused = 0;
  for (int t = 0; t < kThreads; ++t) {
    CHECK(over[t] == 0);
    total_granted += granted[t];
    total_refused += refused[t];
  }
  INFO("granted " << total_granted << ", refused " << total_refused);
  CHECK(total_granted + total_refused == kThreads * kRounds);
  CHECK(total_granted > 0);
  CHECK(ledger->granted_bytes() == 0);  // every grant came back
}

TEST_CASE("device tier slot table: chunk c is slot c, stored chunks only", "[cuda_host]") {
  auto slots = DeviceStoreSlots({5, 0, 5, 9}, 10);
  REQUIRE(slots.ok());
  CHECK(*slots == std::vector<int>{5, 0, 5, 9});
  auto missing = DeviceStoreSlots({3, 10}, 10);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kInternal);
  CHECK(std::string(missing.status().message()).find("chunk 10") != std::string::npos);
  CHECK_FALSE(DeviceStoreSlots({-1}, 10).ok());
  auto empty = DeviceStoreSlots({0}, 0);
  REQUIRE_FALSE(empty.ok());
  CHECK(std::string(empty.status().message()).find("holds 0 chunks") != std::string::npos);
  CHECK(DeviceStoreSlots({}, 0).ok());
}

}  // namespace
}  // namespace drt::cuda

// The CUDA backend's chunk tier policy (engine/cuda/host/chunk_tier_policy.h,
// CudaChunkTier::kAuto) and the device tier's slot table
// (engine/cuda/host/gca_slot_table.h, DeviceStoreSlots), plain C++, against
// hand-computed cases.
#include <memory>
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

TEST_CASE("chunk tier: auto puts sessions on the device while their whole store fits",
          "[cuda_host]") {
  // A budget for 1600 chunks of the 128M config: sessions of 48K tokens
  // (781 chunks each) fit twice, the third goes to the host; once one is
  // gone, a new one fits again.
  auto ledger = std::make_shared<DeviceTierLedger>(1600 * kRecord128M);
  AutoTierChoice a = ChooseAutoTier(ledger, 49152, 63, kRecord128M);
  CHECK(a.device);
  CHECK(a.store_chunks == 781);
  CHECK(a.grant.bytes() == 781 * kRecord128M);
  AutoTierChoice b = ChooseAutoTier(ledger, 49152, 63, kRecord128M);
  CHECK(b.device);
  AutoTierChoice c = ChooseAutoTier(ledger, 49152, 63, kRecord128M);
  CHECK_FALSE(c.device);
  CHECK(c.store_chunks == 0);
  CHECK(c.grant.bytes() == 0);
  CHECK(ledger->granted_bytes() == 2 * 781 * kRecord128M);
  // A smaller session still fits beside them: 38 chunks of room left.
  AutoTierChoice small = ChooseAutoTier(ledger, 38 * 63, 63, kRecord128M);
  CHECK(small.device);
  CHECK(small.store_chunks == 38);
  CHECK_FALSE(ChooseAutoTier(ledger, 1, 63, kRecord128M).device);
  a.grant.Reset();
  CHECK(ChooseAutoTier(ledger, 49152, 63, kRecord128M).device);
  // The server's default context (2^32 tokens) never fits: the host tier.
  CHECK_FALSE(ChooseAutoTier(ledger, int64_t{1} << 32, 63, kRecord128M).device);
  // No ledger, no context or no record size: the host tier.
  CHECK_FALSE(ChooseAutoTier(nullptr, 49152, 63, kRecord128M).device);
  CHECK_FALSE(ChooseAutoTier(ledger, 0, 63, kRecord128M).device);
  CHECK_FALSE(ChooseAutoTier(ledger, 100, 63, 0).device);
  // A product that would overflow is the host tier, not a wrapped grant.
  CHECK_FALSE(ChooseAutoTier(ledger, int64_t{1} << 62, 1, int64_t{1} << 20).device);
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
  CHECK(DeviceStoreSlots({}, 0).ok());
}

}  // namespace
}  // namespace drt::cuda

// Where a CUDA session keeps its closed chunks' K/V under
// CudaChunkTier::kAuto (docs/cuda.md, "Device tier"): plain C++, no CUDA
// header, tested without a GPU.
//
// The rule: the backend measures the device's free memory once, after the
// weights are uploaded (cudaMemGetInfo); a fixed fraction of it
// (kDeviceTierReserveFraction) is the reserve, kept for everything that is
// not a chunk store (each session's own buffers, the batched step's
// buffers, cuBLAS workspaces, the landmark matrices). The rest is the
// device tier's budget. Each new session asks, once, for the whole store of
// a session of the largest context the server allows (max_context_tokens):
// the device tier when that store fits both the budget beside the stores
// already granted and the free memory measured again at that moment less
// the reserve (so that the buffers of sessions on either tier, which the
// budget does not count, are seen as they grow), the host tier otherwise.
// The store is allocated at once; when that fails (the memory went between
// the measurement and the allocation) the grant goes back and the session
// takes the host tier. Deciding once per session from its largest context
// means a device-tier session can never run out later (the server stops a
// session at max_context_tokens), and no session mixes tiers (the GCA kernel
// reads one chunk array per group); the price is that a session holds its
// whole store from its first token, and that the server's default
// max_context_tokens (2^32) puts every session on the host.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace drt::cuda {

// Of the free device memory measured at start, the part kAuto leaves to
// everything but chunk stores. A host-tier session's own device memory at
// the 128M config and the default step is ~200 MiB: its slot buffers (6
// groups x (1024/64 + 1) x 8 slots x 192 KiB of K/V in bf16 = 153 MiB), a
// 32 MiB cuBLAS workspace, rings, landmarks and activations; a device-tier
// session has no slot buffers. 10% of an 80 GB H100 (~8 GB) holds ~40
// host-tier sessions' buffers beside full chunk stores; past that, each
// decision's check of the free memory against the reserve keeps new stores
// out, and host-tier sessions go on until their own buffers no longer fit.
// A choice, not a measurement; NOT YET RUN ON A GPU.
inline constexpr double kDeviceTierReserveFraction = 0.10;

// The bytes kAuto may grant to device chunk stores:
// free_device_bytes * (1 - reserve_fraction), rounded down; 0 for a
// negative free figure or a fraction outside [0, 1].
int64_t DeviceTierBudgetBytes(int64_t free_device_bytes, double reserve_fraction);

// Closed chunks a session of `tokens` tokens holds at most: one per
// `chunk_tokens` real tokens (the encoder's chunk, enc_chunk_size; the
// landmarks are not tokens), rounded up. 0 for tokens <= 0 or
// chunk_tokens <= 0.
int64_t MaxChunksForTokens(int64_t tokens, int64_t chunk_tokens);

// What bounds a device store's growth (GrownDeviceStoreCapacity); both
// unbounded by default.
struct DeviceStoreGrowthLimits {
  // The largest capacity the device can allocate now beside the arrays the
  // store holds (a growth holds old and new arrays at once): its free
  // memory over the bytes of one chunk (K and V).
  int64_t room_chunks = std::numeric_limits<int64_t>::max();
  // The most chunks the session may ever hold (MaxChunksForTokens of
  // CudaBackendOptions::auto_tier_max_tokens, which drt-server sets to
  // its --max_context_tokens): no growth goes past it.
  int64_t cap_chunks = std::numeric_limits<int64_t>::max();
};

// Of a grown store beyond the need, the part that is slack when doubling
// does not fit: 1/kBoundedGrowthDivisor of the need.
inline constexpr int64_t kBoundedGrowthDivisor = 8;

// The device store's capacity in chunks once it must hold `needed`
// (docs/cuda.md, "Device tier", growth), never below `needed`:
// - `capacity` when it holds them already;
// - else doubled from `capacity` (from `first` when empty) until it holds
//   them, but not past limits.cap_chunks: when that fits room_chunks;
// - else, doubling not fitting beside the held arrays, a bounded step:
//   needed + needed / kBoundedGrowthDivisor (at least one more; not past
//   the cap unless the need already is, when the step is taken whole), or
//   as much of it as fits the room, but never below `needed`
//   (whose allocation then fails when even that does not fit: the device
//   is full).
// Doubling keeps the copies a growth makes O(1) per chunk on average; the
// bounded step, near the device's end, costs a growth (a copy of the whole
// store and a drain of the session's stream) every needed / 8 chunks at
// most, and lets a store grow as long as old + new fit, where doubling
// would stop once old + 2 x old does not. Near the end a step may take all
// the device's free memory.
int64_t GrownDeviceStoreCapacity(int64_t capacity, int64_t needed, int64_t first,
                                 DeviceStoreGrowthLimits limits = {});

// The device tier's budget shared by the sessions of one backend (owned by
// the backend, shared with its sessions through their reservations; the
// sessions of one backend may be created and destroyed on several threads,
// hence the mutex).
class DeviceTierLedger {
 public:
  // budget_bytes: what all stores together may be granted; reserve_bytes:
  // the device memory a grant must leave free (ChooseAutoTier).
  explicit DeviceTierLedger(int64_t budget_bytes, int64_t reserve_bytes = 0)
      : budget_bytes_(budget_bytes), reserve_bytes_(reserve_bytes) {}

  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t reserve_bytes() const { return reserve_bytes_; }
  int64_t granted_bytes() const;

  // Grants `bytes` when granted + bytes <= budget (bytes >= 0); false, and
  // nothing changes, otherwise.
  bool TryGrant(int64_t bytes);
  // Grants `bytes` whatever the budget says (a device-tier session that
  // outgrows what it was granted still grows: CudaSession counts it here so
  // later sessions see less room).
  void ForceGrant(int64_t bytes);
  // Gives back bytes granted earlier.
  void Release(int64_t bytes);

 private:
  const int64_t budget_bytes_;
  const int64_t reserve_bytes_;
  mutable std::mutex mutex_;
  int64_t granted_bytes_ = 0;
};

// Bytes granted by a ledger, given back when this is destroyed (or Reset).
// Move-only.
class DeviceTierGrant {
 public:
  DeviceTierGrant() = default;
  // `bytes` must have been granted by `ledger` already.
  DeviceTierGrant(std::shared_ptr<DeviceTierLedger> ledger, int64_t bytes)
      : ledger_(std::move(ledger)), bytes_(bytes) {}
  DeviceTierGrant(DeviceTierGrant&& o) noexcept;
  DeviceTierGrant& operator=(DeviceTierGrant&& o) noexcept;
  DeviceTierGrant(const DeviceTierGrant&) = delete;
  DeviceTierGrant& operator=(const DeviceTierGrant&) = delete;
  ~DeviceTierGrant() { Reset(); }

  int64_t bytes() const { return bytes_; }
  // Adds `more` bytes (ForceGrant on the ledger); no-op without a ledger.
  void Grow(int64_t more);
  void Reset();

 private:
  std::shared_ptr<DeviceTierLedger> ledger_;
  int64_t bytes_ = 0;
};

// kAuto's decision for a new session: the device tier with a grant of the
// whole store of a session of `max_tokens` tokens (MaxChunksForTokens x
// bytes_per_chunk) when that fits the ledger's room and
// free_device_bytes (the device's free memory measured now) less the
// ledger's reserve, and allocate(store_chunks) then makes the store; else
// the host tier with an empty grant. An allocation failing with
// RESOURCE_EXHAUSTED gives the grant back and takes the host tier (another
// session or process took the memory since the measurement); any other
// error is returned, the grant given back. Also the host tier for
// max_tokens <= 0 or a non-positive bytes_per_chunk.
struct AutoTierChoice {
  bool device = false;
  int64_t store_chunks = 0;  // the store allocated (device only)
  DeviceTierGrant grant;
};
using AllocateDeviceStore = std::function<absl::Status(int64_t store_chunks)>;
absl::StatusOr<AutoTierChoice> ChooseAutoTier(const std::shared_ptr<DeviceTierLedger>& ledger,
                                              int64_t free_device_bytes, int64_t max_tokens,
                                              int64_t chunk_tokens, int64_t bytes_per_chunk,
                                              const AllocateDeviceStore& allocate);

}  // namespace drt::cuda

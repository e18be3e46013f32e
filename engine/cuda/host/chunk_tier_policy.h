// Where a CUDA session keeps its closed chunks' K/V under
// CudaChunkTier::kAuto (docs/cuda.md, "Device tier"): plain C++, no CUDA
// header, tested without a GPU.
//
// The rule: the backend measures the device's free memory once, after the
// weights are uploaded (cudaMemGetInfo); a fixed fraction of it
// (kDeviceTierReserveFraction) is kept for everything that is not a chunk
// store (each session's buffers, the batched step's buffers, cuBLAS
// workspaces, the landmark matrices). The rest is the device tier's budget.
// Each new session asks, once, for the whole store of a session of the
// largest context the server allows (max_context_tokens): the device tier
// when that still fits beside the stores already granted, the host tier
// otherwise. Deciding once per session from its largest context means a
// device-tier session can never run out later (the server stops a session
// at max_context_tokens), and no session mixes tiers (the GCA kernel reads
// one chunk array per group); the price is that a session holds its whole
// store from its first token, and that the server's default
// max_context_tokens (2^32) puts every session on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

namespace drt::cuda {

// Of the free device memory measured at start, the part kAuto leaves to
// everything but chunk stores: a session's own buffers are ~60 MiB at the
// 128M config and the default step (docs/cuda.md, "Memory"), so 10% of an
// 80 GB H100 (~8 GB) leaves room for ~100 sessions' buffers. A choice, not a
// measurement; NOT YET RUN ON A GPU.
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

// The device store's capacity in chunks once it must hold `needed`: from
// `capacity`, doubled (starting at `first` when empty) until it holds
// them; never below `needed`. Doubling keeps the copies a growth makes
// O(1) per chunk on average.
int64_t GrownDeviceStoreCapacity(int64_t capacity, int64_t needed, int64_t first);

// The device tier's budget shared by the sessions of one backend (owned by
// the backend, shared with its sessions through their reservations; the
// sessions of one backend may be created and destroyed on several threads,
// hence the mutex).
class DeviceTierLedger {
 public:
  explicit DeviceTierLedger(int64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  int64_t budget_bytes() const { return budget_bytes_; }
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

// kAuto's decision for a new session: a grant of the whole store of a
// session of `max_tokens` tokens (MaxChunksForTokens x bytes_per_chunk)
// when the ledger has room for it (the device tier), else an empty grant
// (the host tier). Also the host tier for max_tokens <= 0 or a
// non-positive bytes_per_chunk.
struct AutoTierChoice {
  bool device = false;
  int64_t store_chunks = 0;  // the store to allocate up front (device only)
  DeviceTierGrant grant;
};
AutoTierChoice ChooseAutoTier(const std::shared_ptr<DeviceTierLedger>& ledger,
                              int64_t max_tokens, int64_t chunk_tokens,
                              int64_t bytes_per_chunk);

}  // namespace drt::cuda

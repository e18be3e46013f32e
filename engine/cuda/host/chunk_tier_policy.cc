#include "engine/cuda/host/chunk_tier_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace drt::cuda {

int64_t DeviceTierBudgetBytes(int64_t free_device_bytes, double reserve_fraction) {
  if (free_device_bytes <= 0 || !(reserve_fraction >= 0.0 && reserve_fraction <= 1.0)) return 0;
  const double budget = std::floor(static_cast<double>(free_device_bytes) * (1.0 - reserve_fraction));
  return std::clamp<int64_t>(static_cast<int64_t>(budget), 0, free_device_bytes);
}

int64_t MaxChunksForTokens(int64_t tokens, int64_t chunk_tokens) {
  if (tokens <= 0 || chunk_tokens <= 0) return 0;
  return tokens / chunk_tokens + (tokens % chunk_tokens != 0 ? 1 : 0);
}

int64_t GrownDeviceStoreCapacity(int64_t capacity, int64_t needed, int64_t first,
                                 DeviceStoreGrowthLimits limits) {
  if (needed <= capacity) return capacity;
  const int64_t slack = std::max<int64_t>(1, needed / kBoundedGrowthDivisor);
  const int64_t need_and_slack =
      needed > std::numeric_limits<int64_t>::max() - slack ? needed : needed + slack;
  // Past the cap (a caller that does not stop sessions at it) the store
  // grows by the bounded step, not one chunk at a time: growing to exactly
  // the need would copy the whole store at every chunk (review of cudafix,
  // finding 3).
  const int64_t most = needed > limits.cap_chunks ? need_and_slack : limits.cap_chunks;
  int64_t doubled = std::max<int64_t>({capacity, first, 1});
  while (doubled < needed) {
    if (doubled > std::numeric_limits<int64_t>::max() / 2) {
      doubled = needed;
      break;
    }
    doubled *= 2;
  }
  doubled = std::min(doubled, most);
  if (doubled <= limits.room_chunks) return doubled;
  const int64_t stepped = std::min({need_and_slack, most, limits.room_chunks});
  return std::max(stepped, needed);
}

int64_t DeviceTierLedger::granted_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return granted_bytes_;
}

bool DeviceTierLedger::TryGrant(int64_t bytes) {
  if (bytes < 0) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > budget_bytes_ - granted_bytes_) return false;
  granted_bytes_ += bytes;
  return true;
}

void DeviceTierLedger::ForceGrant(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  granted_bytes_ += bytes;
}

void DeviceTierLedger::Release(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  granted_bytes_ -= bytes;
}

DeviceTierGrant::DeviceTierGrant(DeviceTierGrant&& o) noexcept
    : ledger_(std::move(o.ledger_)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceTierGrant& DeviceTierGrant::operator=(DeviceTierGrant&& o) noexcept {
  if (this != &o) {
    Reset();
    ledger_ = std::move(o.ledger_);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceTierGrant::Grow(int64_t more) {
  if (ledger_ == nullptr || more <= 0) return;
  ledger_->ForceGrant(more);
  bytes_ += more;
}

void DeviceTierGrant::Reset() {
  if (ledger_ != nullptr && bytes_ != 0) ledger_->Release(bytes_);
  ledger_.reset();
  bytes_ = 0;
}

absl::StatusOr<AutoTierChoice> ChooseAutoTier(const std::shared_ptr<DeviceTierLedger>& ledger,
                                              int64_t free_device_bytes, int64_t max_tokens,
                                              int64_t chunk_tokens, int64_t bytes_per_chunk,
                                              const AllocateDeviceStore& allocate) {
  AutoTierChoice choice;
  const int64_t chunks = MaxChunksForTokens(max_tokens, chunk_tokens);
  if (ledger == nullptr || chunks == 0 || bytes_per_chunk <= 0 ||
      chunks > std::numeric_limits<int64_t>::max() / bytes_per_chunk) {
    return choice;
  }
  const int64_t bytes = chunks * bytes_per_chunk;
  // The free memory now, not only the ledger: the sessions' own buffers
  // (host-tier sessions' slot buffers above all) are not in the ledger.
  if (bytes > free_device_bytes - ledger->reserve_bytes()) return choice;
  if (!ledger->TryGrant(bytes)) return choice;
  DeviceTierGrant grant(ledger, bytes);
  if (absl::Status s = allocate(chunks); !s.ok()) {
    if (s.code() == absl::StatusCode::kResourceExhausted) return choice;  // grant goes back
    return s;
  }
  choice.device = true;
  choice.store_chunks = chunks;
  choice.grant = std::move(grant);
  return choice;
}

}  // namespace drt::cuda

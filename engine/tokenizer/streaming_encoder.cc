#include "engine/tokenizer/streaming_encoder.h"

namespace drt {

absl::StatusOr<std::vector<int32_t>> StreamingEncoder::Push(std::string_view text) {
  pending_.append(text);
  const size_t cut = tokenizer_.StreamCut(pending_);
  if (cut == 0) {
    if (pending_.size() <= kMaxPendingBytes) return std::vector<int32_t>{};
    return Finish();
  }
  auto ids = tokenizer_.Encode(std::string_view(pending_).substr(0, cut));
  if (!ids.ok()) return ids.status();
  pending_.erase(0, cut);
  return ids;
}

absl::StatusOr<std::vector<int32_t>> StreamingEncoder::Finish() {
  if (pending_.empty()) return std::vector<int32_t>{};
  auto ids = tokenizer_.Encode(pending_);
  if (!ids.ok()) return ids.status();
  pending_.clear();
  return ids;
}

absl::StatusOr<int64_t> StreamingEncoder::PendingIdsWithin(int64_t room) const {
  const int64_t bytes = static_cast<int64_t>(pending_.size());
  if (tokenizer_.one_id_per_byte()) return bytes;
  if (2 * bytes <= room) return 2 * bytes;
  auto ids = tokenizer_.Encode(pending_);
  if (!ids.ok()) return ids.status();
  return static_cast<int64_t>(ids->size());
}

}  // namespace drt

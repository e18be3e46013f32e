#include "engine/tokenizer/streaming_encoder.h"

namespace drt {

absl::StatusOr<std::vector<int32_t>> StreamingEncoder::Push(std::string_view text) {
  DropEncoded();
  pending_.append(text);
  pushed_ = text.size();
  size_t cut = tokenizer_.StreamCut(pending_);
  if (cut == 0) {
    if (pending_.size() <= kMaxPendingBytes) return std::vector<int32_t>{};
    cut = pending_.size();  // bounds memory: all of it is encoded now
  }
  auto ids = tokenizer_.Encode(std::string_view(pending_).substr(0, cut));
  if (!ids.ok()) return ids.status();
  encoded_ = cut;
  return ids;
}

void StreamingEncoder::Withdraw() {
  pending_.resize(pending_.size() - pushed_);
  encoded_ = 0;
  pushed_ = 0;
}

void StreamingEncoder::DropEncoded() {
  pending_.erase(0, encoded_);
  encoded_ = 0;
  pushed_ = 0;
}

absl::StatusOr<std::vector<int32_t>> StreamingEncoder::Finish() {
  DropEncoded();
  if (pending_.empty()) return std::vector<int32_t>{};
  auto ids = tokenizer_.Encode(pending_);
  if (!ids.ok()) return ids.status();
  pending_.clear();
  return ids;
}

absl::StatusOr<int64_t> StreamingEncoder::PendingIdsWithin(int64_t room) const {
  const int64_t bytes = static_cast<int64_t>(pending_bytes());
  if (tokenizer_.one_id_per_byte()) return bytes;
  if (2 * bytes <= room) return 2 * bytes;
  auto ids = tokenizer_.Encode(pending());
  if (!ids.ok()) return ids.status();
  return static_cast<int64_t>(ids->size());
}

}  // namespace drt

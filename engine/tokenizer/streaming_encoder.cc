#include "engine/tokenizer/streaming_encoder.h"

namespace drt {
namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// A visible ASCII character: certainly not whitespace in the pre-tokenizer's
// Unicode sense, and never part of a multi-byte character.
bool IsAsciiVisible(char c) { return c > 0x20 && c < 0x7f; }

// Index of the last ASCII whitespace that follows a visible ASCII character,
// or npos. Text before it tokenizes the same alone as in any continuation.
size_t LastSafeCut(const std::string& text) {
  for (size_t i = text.size(); i-- > 1;) {
    if (IsAsciiSpace(text[i]) && IsAsciiVisible(text[i - 1])) return i;
  }
  return std::string::npos;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> StreamingEncoder::Push(std::string_view text) {
  pending_.append(text);
  size_t cut = LastSafeCut(pending_);
  if (cut == std::string::npos) {
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

}  // namespace drt

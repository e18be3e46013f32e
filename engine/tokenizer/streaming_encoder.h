// Tokenizes text that arrives in pieces (a prompt streamed over the network)
// so that the ids equal those of the whole text tokenized at once. The text
// before the tokenizer's StreamCut is encoded now: the added tokens are split
// out first, and a cut falls between their matches or inside plain text
// where the GPT-2 pre-tokenizer always splits (a visible character then
// whitespace). The rest (the last word, a partial UTF-8 character, an added
// token that more text could still extend or that may take whitespace still
// to come) waits for the next piece or Finish().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace drt {

class StreamingEncoder {
 public:
  // Text held back beyond this many bytes (a piece with no whitespace at all)
  // is encoded anyway, bounding memory; ids may then differ at that cut.
  static constexpr size_t kMaxPendingBytes = 1 << 20;

  explicit StreamingEncoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // Ids of the text that is final so far.
  absl::StatusOr<std::vector<int32_t>> Push(std::string_view text);
  // Takes back the last Push: the encoder holds what it held before it, as
  // if it never came (its ids must not be used). For a caller that refuses
  // a piece after seeing its ids (PromptIngest: the earlier messages' held
  // text then runs alone). Push keeps the text it encoded until the next
  // call, so this copies nothing; a no-op after Finish or Withdraw.
  void Withdraw();
  // Ids of whatever is held back; the encoder is then empty.
  absl::StatusOr<std::vector<int32_t>> Finish();
  size_t pending_bytes() const { return pending_.size() - encoded_; }
  // The text held back (not yet encoded).
  std::string_view pending() const { return std::string_view(pending_).substr(encoded_); }
  // The ids the held-back text will bring, as far as a check against `room`
  // needs to know: a bound that is at most `room` when one is known without
  // encoding, else the exact count. The bound is the byte count for a
  // one-id-per-byte tokenizer (exact), else twice it (a token covers at
  // least one byte, plus the space an add_prefix_space tokenizer puts before
  // each plain stretch). Encoding the whole held-back text on every piece
  // would be quadratic for long text without whitespace (review-apifix F2).
  absl::StatusOr<int64_t> PendingIdsWithin(int64_t room) const;

 private:
  // Drops the text the last Push encoded (kept until now for Withdraw).
  void DropEncoded();

  const Tokenizer& tokenizer_;
  // The held-back text, after the first encoded_ bytes: those the last Push
  // encoded, of which the last pushed_ bytes are its text.
  std::string pending_;
  size_t encoded_ = 0;
  size_t pushed_ = 0;
};

}  // namespace drt

// Tokenizes text that arrives in pieces (a prompt streamed over the network)
// so that the ids equal those of the whole text tokenized at once. A GPT-2
// pre-token never ends in whitespace after a non-space character, so the text
// before the last non-space-to-space transition can be encoded now; the rest
// (the last word, a partial UTF-8 character, a partial special token) waits
// for the next piece or Finish().
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
  // Ids of whatever is held back; the encoder is then empty.
  absl::StatusOr<std::vector<int32_t>> Finish();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace drt

// drt-ppl's bits per byte: how many bytes of the document each token stands
// for. A byte tokenizer's token is one byte; a BPE token counts the raw bytes
// Tokenizer::Decode gives for its id alone (which may be part of a UTF-8
// character), so the counts of a document's tokens sum to its byte length.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace drt::ppl {

struct TokenBytes {
  std::vector<int32_t> per_id;  // bytes of id i, -1 for ids not in the document
  int64_t total = 0;            // sum over the document's tokens
};

// Decodes each distinct id of `tokens` once. Ids outside [0, vocab_size) are
// skipped (the scorer refuses them before anything runs); a Decode error is
// returned.
absl::StatusOr<TokenBytes> CountTokenBytes(const Tokenizer& tokenizer,
                                           const std::vector<int32_t>& tokens, int32_t vocab_size);

}  // namespace drt::ppl

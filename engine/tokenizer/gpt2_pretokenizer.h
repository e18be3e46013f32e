// GPT-2's pre-tokenizer: splits text into the pieces that BPE then merges
// within, as the regex of Hugging Face's ByteLevel pre-tokenizer does:
//
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// matched by hand rather than by a regex library, with the character classes
// of Gpt2CharClass (Unicode 16.0, as Hugging Face `tokenizers` has them).
#pragma once

#include <string_view>

#include "absl/functional/function_ref.h"

namespace drt {

class Gpt2PreTokenizer {
 public:
  // Calls `on_piece` with consecutive pieces that together cover `text`.
  // Bytes that are not valid UTF-8 (which Hugging Face never sees, since its
  // input is a Rust String) come out as pieces of their own, one piece per
  // run of them, and end the text for the regex before them (so a
  // whitespace run right before them is "followed by no \S").
  void Split(std::string_view text, absl::FunctionRef<void(std::string_view)> on_piece) const;
};

}  // namespace drt

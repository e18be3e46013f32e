// Reads the parts of a Hugging Face tokenizer.json that a byte-level BPE
// tokenizer needs, rejecting configurations it would not reproduce exactly.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace drt {

struct AddedTokenSpec {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;  // match only where not inside a word
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool normalized = true;    // matched after normalization (a second pass)
};

struct BpeTokenizerSpec {
  std::vector<std::pair<std::string, int32_t>> vocab;          // spelling, id
  std::vector<std::pair<std::string, std::string>> merges;     // in rank order
  std::vector<AddedTokenSpec> added_tokens;
  bool add_prefix_space = false;  // ByteLevel: prepend ' ' to each segment
  bool ignore_merges = false;     // BPE: a piece in the vocab is one token
};

absl::StatusOr<BpeTokenizerSpec> ReadTokenizerJson(const std::string& path);

}  // namespace drt

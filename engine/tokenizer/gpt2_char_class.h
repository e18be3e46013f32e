// The class of a code point as the GPT-2 pre-tokenizer regex of Hugging Face
// `tokenizers` sees it: \p{L}, \p{N}, \s, or none of these. Unicode 16.0,
// from tables generated out of `tokenizers` itself (docs/tokenizer.md), so the
// result does not depend on any system library's Unicode version.
#pragma once

#include <cstdint>

namespace drt {

enum class CharClass : uint8_t {
  kOther,       // none of the below
  kLetter,      // \p{L}
  kNumber,      // \p{N}
  kWhitespace,  // \s: Unicode White_Space
};

// Code points beyond U+10FFFF and surrogates are kOther.
CharClass Gpt2CharClass(char32_t c);

}  // namespace drt

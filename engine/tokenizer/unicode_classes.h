// Character classes used when matching added tokens, with the meanings that
// Rust's regex crate gives \s and \w (Hugging Face matches added tokens'
// lstrip / rstrip / single_word options with those).
#pragma once

namespace drt {

// Unicode White_Space.
bool IsUnicodeWhitespace(char32_t c);

// Letters, marks, decimal and letter numbers, connector punctuation, ZWNJ/ZWJ.
bool IsUnicodeWordCharacter(char32_t c);

}  // namespace drt

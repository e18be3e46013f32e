// Minimal UTF-8 reading and writing used by the tokenizers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace drt {

// What sits at the start of a byte string, read as UTF-8.
struct Utf8Char {
  enum class Kind {
    kValid,      // a whole, well-formed character of `length` bytes
    kTruncated,  // a well-formed prefix that the end of the input cuts off
    kInvalid,    // `length` bytes (the maximal ill-formed subpart) to replace
  };
  Kind kind;
  size_t length;
  char32_t codepoint;  // meaningful only for kValid
};

// Reads the character at the start of `bytes` (which must be non-empty).
// Invalid input is measured as Unicode's "maximal subpart", the same unit
// that Rust's String::from_utf8_lossy replaces with one U+FFFD.
Utf8Char ReadUtf8Char(std::string_view bytes);

void AppendUtf8(char32_t codepoint, std::string* out);

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

}  // namespace drt

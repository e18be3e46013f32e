#include "engine/tokenizer/unicode_classes.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

#include "engine/tokenizer/utf8.h"

namespace drt {
namespace {

// Compiled once; only read afterwards (pcre2_match is thread-safe on shared
// code). Null if compilation fails, which makes every character a non-word.
const pcre2_code* WordCharacterClass() {
  static const pcre2_code* const code = [] {
    constexpr char kPattern[] = R"([\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\x{200C}\x{200D}])";
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    return pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &error_code, &error_offset,
                         nullptr);
  }();
  return code;
}

}  // namespace

bool IsUnicodeWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool IsUnicodeWordCharacter(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  const pcre2_code* code = WordCharacterClass();
  if (code == nullptr) return false;
  std::string utf8;
  AppendUtf8(c, &utf8);
  pcre2_match_data* match = pcre2_match_data_create(1, nullptr);
  if (match == nullptr) return false;
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(utf8.data()), utf8.size(), 0, 0,
                             match, nullptr);
  pcre2_match_data_free(match);
  return rc > 0;
}

}  // namespace drt

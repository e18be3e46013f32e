#include "engine/tokenizer/utf8.h"

#include <cstdint>

namespace drt {
namespace {

// For a lead byte: the character's length and the allowed range of the second
// byte (Unicode Table 3-7, "Well-Formed UTF-8 Byte Sequences"). Length 0
// marks a byte that cannot start a character.
struct LeadByteRule {
  size_t length;
  uint8_t second_min;
  uint8_t second_max;
};

LeadByteRule RuleFor(uint8_t lead) {
  if (lead < 0x80) return {1, 0, 0};
  if (lead < 0xC2) return {0, 0, 0};
  if (lead < 0xE0) return {2, 0x80, 0xBF};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};
  if (lead == 0xED) return {3, 0x80, 0x9F};  // excludes surrogates
  if (lead < 0xF0) return {3, 0x80, 0xBF};
  if (lead == 0xF0) return {4, 0x90, 0xBF};
  if (lead < 0xF4) return {4, 0x80, 0xBF};
  if (lead == 0xF4) return {4, 0x80, 0x8F};  // stops at U+10FFFF
  return {0, 0, 0};
}

}  // namespace

Utf8Char ReadUtf8Char(std::string_view bytes) {
  const auto byte_at = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  const uint8_t lead = byte_at(0);
  const LeadByteRule rule = RuleFor(lead);
  if (rule.length == 0) return {Utf8Char::Kind::kInvalid, 1, 0};
  if (rule.length == 1) return {Utf8Char::Kind::kValid, 1, lead};

  char32_t codepoint = lead & (0x7F >> rule.length);
  for (size_t i = 1; i < rule.length; ++i) {
    if (i >= bytes.size()) return {Utf8Char::Kind::kTruncated, i, 0};
    const uint8_t b = byte_at(i);
    const uint8_t min = i == 1 ? rule.second_min : 0x80;
    const uint8_t max = i == 1 ? rule.second_max : 0xBF;
    if (b < min || b > max) return {Utf8Char::Kind::kInvalid, i, 0};
    codepoint = (codepoint << 6) | (b & 0x3F);
  }
  return {Utf8Char::Kind::kValid, rule.length, codepoint};
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace drt

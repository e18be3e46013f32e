#include "engine/tokenizer/byte_level_alphabet.h"

#include <array>
#include <cstdint>

#include "engine/tokenizer/utf8.h"

namespace drt {
namespace {

// Printable Latin-1 bytes stand for themselves; the other 68 bytes are moved,
// in byte order, to U+0100 onwards.
std::array<char32_t, 256> BuildByteToCodepoint() {
  std::array<char32_t, 256> table{};
  char32_t next_moved = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                           (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? static_cast<char32_t>(b) : next_moved++;
  }
  return table;
}

const std::array<char32_t, 256>& ByteToCodepoint() {
  static const std::array<char32_t, 256> table = BuildByteToCodepoint();
  return table;
}

// All mapped code points are below U+0144, so a flat table inverts the map.
constexpr char32_t kCodepointLimit = 0x144;

const std::array<int16_t, kCodepointLimit>& CodepointToByte() {
  static const std::array<int16_t, kCodepointLimit> table = [] {
    std::array<int16_t, kCodepointLimit> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[ByteToCodepoint()[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return table;
}

}  // namespace

std::string ByteLevelEncode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) AppendUtf8(ByteToCodepoint()[b], &out);
  return out;
}

std::optional<std::string> ByteLevelDecode(std::string_view spelling) {
  std::string out;
  out.reserve(spelling.size());
  while (!spelling.empty()) {
    const Utf8Char c = ReadUtf8Char(spelling);
    if (c.kind != Utf8Char::Kind::kValid || c.codepoint >= kCodepointLimit) return std::nullopt;
    const int16_t byte = CodepointToByte()[c.codepoint];
    if (byte < 0) return std::nullopt;
    out.push_back(static_cast<char>(byte));
    spelling.remove_prefix(c.length);
  }
  return out;
}

}  // namespace drt

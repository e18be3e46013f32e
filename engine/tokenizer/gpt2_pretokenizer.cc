#include "engine/tokenizer/gpt2_pretokenizer.h"

#include <array>
#include <cstddef>

#include "engine/tokenizer/gpt2_char_class.h"
#include "engine/tokenizer/utf8.h"

namespace drt {
namespace {

// What the regex sees at a position: a character of some class, or kBarrier
// where the text ends or bytes are not valid UTF-8 (nothing in the pattern
// matches those, not even [^...] or \S).
enum class Seen : uint8_t { kOther, kLetter, kNumber, kWhitespace, kBarrier };

struct Char {
  Seen seen;
  size_t length;  // bytes; for kBarrier, the invalid bytes (0 at the end)
};

Seen SeenFor(CharClass cls) {
  switch (cls) {
    case CharClass::kLetter: return Seen::kLetter;
    case CharClass::kNumber: return Seen::kNumber;
    case CharClass::kWhitespace: return Seen::kWhitespace;
    case CharClass::kOther: break;
  }
  return Seen::kOther;
}

// ASCII is most text; its classes are looked up without decoding.
constexpr std::array<Seen, 128> AsciiClasses() {
  std::array<Seen, 128> table{};
  for (int c = 0; c < 128; ++c) {
    table[c] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ? Seen::kLetter
               : c >= '0' && c <= '9'                           ? Seen::kNumber
               : (c >= 0x09 && c <= 0x0D) || c == ' '           ? Seen::kWhitespace
                                                                : Seen::kOther;
  }
  return table;
}
constexpr std::array<Seen, 128> kAscii = AsciiClasses();

Char CharAt(std::string_view text, size_t pos) {
  if (pos >= text.size()) return {Seen::kBarrier, 0};
  const auto lead = static_cast<unsigned char>(text[pos]);
  if (lead < 0x80) return {kAscii[lead], 1};
  const Utf8Char c = ReadUtf8Char(text.substr(pos));
  if (c.kind != Utf8Char::Kind::kValid) return {Seen::kBarrier, c.length};
  return {SeenFor(Gpt2CharClass(c.codepoint)), c.length};
}

// End of the run of `seen` characters starting at `pos`.
size_t RunEnd(std::string_view text, size_t pos, Seen seen) {
  while (true) {
    const Char c = CharAt(text, pos);
    if (c.seen != seen) return pos;
    pos += c.length;
  }
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at `pos`, or 0.
size_t ContractionLength(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  const char a = text[pos + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  const char b = text[pos + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End of the regex match at `pos`, where a valid character `first` starts.
// Every character matches some alternative, so the match starts right here;
// the alternatives are tried in the pattern's order.
size_t MatchEnd(std::string_view text, size_t pos, Char first) {
  // 's|'t|'re|'ve|'m|'ll|'d
  if (const size_t length = ContractionLength(text, pos); length > 0) return pos + length;
  // ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+' with the optional space taken
  if (text[pos] == ' ') {
    const Char next = CharAt(text, pos + 1);
    if (next.seen != Seen::kWhitespace && next.seen != Seen::kBarrier) {
      return RunEnd(text, pos + 1, next.seen);
    }
  }
  // ... and without it
  if (first.seen != Seen::kWhitespace) return RunEnd(text, pos, first.seen);
  // \s+(?!\S)|\s+ : a whitespace run that reaches the end (or invalid bytes)
  // is taken whole; one followed by \S leaves its last character to the next
  // piece when that leaves at least one character for this one.
  size_t last_start = pos;
  size_t end = pos;
  int count = 0;
  for (Char c = first; c.seen == Seen::kWhitespace; c = CharAt(text, end)) {
    last_start = end;
    end += c.length;
    ++count;
  }
  if (CharAt(text, end).seen == Seen::kBarrier || count == 1) return end;
  return last_start;
}

}  // namespace

void Gpt2PreTokenizer::Split(std::string_view text,
                             absl::FunctionRef<void(std::string_view)> on_piece) const {
  size_t pos = 0;
  while (pos < text.size()) {
    const Char first = CharAt(text, pos);
    size_t end = pos;
    if (first.seen == Seen::kBarrier) {  // a run of invalid bytes
      for (Char c = first; c.seen == Seen::kBarrier && c.length > 0; c = CharAt(text, end)) {
        end += c.length;
      }
    } else {
      end = MatchEnd(text, pos, first);
      if (end <= pos) end = pos + first.length;  // cannot happen; guards the loop
    }
    on_piece(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace drt

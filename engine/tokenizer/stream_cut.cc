#include "engine/tokenizer/stream_cut.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/tokenizer/utf8.h"

namespace drt {
namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// A visible ASCII character: certainly not whitespace in the pre-tokenizer's
// Unicode sense, and never part of a multi-byte character.
bool IsAsciiVisible(char c) { return c > 0x20 && c < 0x7f; }

// A segment by its place in the text, comparable across splits of parts.
struct Span {
  size_t begin, end;
  int32_t added_id;
  bool operator==(const Span&) const = default;
};

std::vector<Span> Spans(std::string_view text, const std::vector<TextSegment>& segments,
                        size_t offset) {
  std::vector<Span> spans;
  spans.reserve(segments.size());
  for (const TextSegment& s : segments) {
    const size_t begin = offset + static_cast<size_t>(s.text.data() - text.data());
    spans.push_back({begin, begin + s.text.size(), s.added_id});
  }
  return spans;
}

// Whether text[0, cut) and text[cut, end) split on their own give `whole`
// (the split of all of `text`); a plain segment may run across the cut.
bool SplitsAlikeAt(std::string_view text, size_t cut, const std::vector<Span>& whole,
                   const AddedTokenSplitter& added_tokens) {
  const std::string_view left = text.substr(0, cut), right = text.substr(cut);
  std::vector<Span> parts = Spans(left, added_tokens.Split(left), 0);
  const std::vector<Span> right_spans = Spans(right, added_tokens.Split(right), cut);
  auto next = right_spans.begin();
  if (!parts.empty() && next != right_spans.end() && parts.back().added_id < 0 &&
      next->added_id < 0) {
    parts.back().end = next->end;  // one plain segment across the cut
    ++next;
  }
  parts.insert(parts.end(), next, right_spans.end());
  return parts == whole;
}

// The bytes at the end of `text` that start a UTF-8 character it cuts off.
size_t TruncatedTail(std::string_view text) {
  for (size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    const size_t start = text.size() - back;
    if ((static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) continue;  // continuation byte
    return ReadUtf8Char(text.substr(start)).kind == Utf8Char::Kind::kTruncated ? back : 0;
  }
  return 0;
}

// Where more text could change the split: the earliest incomplete match,
// and an added token that ends the text (but for a cut-off character).
size_t UnsettledFrom(std::string_view text, const std::vector<Span>& whole,
                     const AddedTokenSplitter& added_tokens) {
  size_t unsettled = added_tokens.IncompleteMatchStart(text);
  const size_t settled_end = text.size() - TruncatedTail(text);
  for (auto it = whole.rbegin(); it != whole.rend() && it->end >= settled_end; ++it) {
    if (it->added_id >= 0) unsettled = std::min(unsettled, it->begin);
  }
  return unsettled;
}

// Candidates checked before giving up until more text comes: a failed check
// needs a rare single_word arrangement, so the next candidate nearly always
// passes; the bound keeps a Push linear in the text held back.
constexpr size_t kMaxCutsChecked = 4;

// The largest kMaxCutsChecked cuts before `limit`, largest first.
std::vector<size_t> Candidates(std::string_view text, const std::vector<Span>& whole, size_t limit,
                               bool add_prefix_space) {
  std::vector<size_t> cuts;
  for (auto span = whole.rbegin(); span != whole.rend() && cuts.size() < kMaxCutsChecked; ++span) {
    if (span->begin >= limit) continue;
    if (span->added_id < 0) {
      for (size_t c = std::min(span->end, limit); c-- > span->begin + 1;) {
        const bool space = add_prefix_space ? text[c] == ' ' : IsAsciiSpace(text[c]);
        if (space && IsAsciiVisible(text[c - 1])) {
          cuts.push_back(c);
          if (cuts.size() == kMaxCutsChecked) return cuts;
        }
      }
    }
    if (span->begin > 0) cuts.push_back(span->begin);
  }
  if (cuts.size() > kMaxCutsChecked) cuts.resize(kMaxCutsChecked);
  return cuts;
}

}  // namespace

size_t FindStreamCut(std::string_view text, const AddedTokenSplitter& added_tokens,
                     bool add_prefix_space) {
  if (text.empty()) return 0;
  const std::vector<Span> whole = Spans(text, added_tokens.Split(text), 0);
  const size_t limit = UnsettledFrom(text, whole, added_tokens);
  const std::vector<size_t> cuts = Candidates(text, whole, limit, add_prefix_space);
  for (size_t cut : cuts) {
    if (SplitsAlikeAt(text, cut, whole, added_tokens)) return cut;
  }
  return 0;
}

}  // namespace drt

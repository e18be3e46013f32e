#include "engine/tokenizer/added_token_splitter.h"

#include <algorithm>

#include "engine/tokenizer/unicode_classes.h"
#include "engine/tokenizer/utf8.h"

namespace drt {
namespace {

// The last character of `text` (valid UTF-8 assumed; otherwise "none").
bool EndsWithWordCharacter(std::string_view text) {
  size_t start = text.size();
  while (start > 0 && (static_cast<uint8_t>(text[start - 1]) & 0xC0) == 0x80) --start;
  if (start == 0) return false;
  --start;
  const Utf8Char c = ReadUtf8Char(text.substr(start));
  return c.kind == Utf8Char::Kind::kValid && IsUnicodeWordCharacter(c.codepoint);
}

bool StartsWithWordCharacter(std::string_view text) {
  if (text.empty()) return false;
  const Utf8Char c = ReadUtf8Char(text);
  return c.kind == Utf8Char::Kind::kValid && IsUnicodeWordCharacter(c.codepoint);
}

// Bytes of whitespace at the start of `text`.
size_t LeadingWhitespace(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Char c = ReadUtf8Char(text.substr(pos));
    if (c.kind != Utf8Char::Kind::kValid || !IsUnicodeWhitespace(c.codepoint)) break;
    pos += c.length;
  }
  return pos;
}

// Where the whitespace at the end of `text` begins.
size_t TrailingWhitespaceStart(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    const Utf8Char c = ReadUtf8Char(text.substr(start, end - start));
    if (c.kind != Utf8Char::Kind::kValid || c.length != end - start ||
        !IsUnicodeWhitespace(c.codepoint)) {
      break;
    }
    end = start;
  }
  return end;
}

}  // namespace

void AddedTokenSplitter::MatchSet::Add(const AddedTokenSpec& token) {
  const auto first_byte = static_cast<uint8_t>(token.content[0]);
  tokens_.push_back(token);
  by_first_byte_[first_byte].push_back(static_cast<uint32_t>(tokens_.size() - 1));
  is_first_byte_[first_byte] = true;
  longest_ = std::max(longest_, token.content.size());
}

void AddedTokenSplitter::MatchSet::OrderLongestFirst() {
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

const AddedTokenSpec* AddedTokenSplitter::MatchSet::LongestAt(std::string_view text,
                                                              size_t pos) const {
  for (uint32_t index : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
    const AddedTokenSpec& token = tokens_[index];
    if (text.compare(pos, token.content.size(), token.content) == 0) return &token;
  }
  return nullptr;
}

void AddedTokenSplitter::MatchSet::Split(std::string_view text,
                                         std::vector<TextSegment>* out) const {
  size_t plain_start = 0;  // start of text not yet emitted
  size_t pos = 0;          // where the search for the next match resumes
  while (pos < text.size()) {
    if (!is_first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    const AddedTokenSpec* token = LongestAt(text, pos);
    if (token == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + token->content.size();
    pos = stop;
    if (token->single_word && (EndsWithWordCharacter(text.substr(0, start)) ||
                               StartsWithWordCharacter(text.substr(stop)))) {
      continue;
    }
    if (token->lstrip) start = std::max(TrailingWhitespaceStart(text.substr(0, start)), plain_start);
    if (token->rstrip) stop += LeadingWhitespace(text.substr(stop));
    if (start > plain_start) out->push_back({text.substr(plain_start, start - plain_start), -1});
    out->push_back({text.substr(start, stop - start), token->id});
    plain_start = stop;
    pos = std::max(pos, stop);
  }
  if (plain_start < text.size()) out->push_back({text.substr(plain_start), -1});
}

size_t AddedTokenSplitter::MatchSet::IncompleteMatchStart(std::string_view text) const {
  // Only a start within the last longest_ - 1 bytes leaves a content longer
  // than what follows it.
  const size_t first = text.size() >= longest_ ? text.size() - longest_ + 1 : 0;
  for (size_t pos = first; pos < text.size(); ++pos) {
    if (!is_first_byte_[static_cast<uint8_t>(text[pos])]) continue;
    const std::string_view rest = text.substr(pos);
    for (uint32_t index : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
      const std::string& content = tokens_[index].content;
      if (content.size() > rest.size() && content.compare(0, rest.size(), rest) == 0) return pos;
    }
  }
  return text.size();
}

AddedTokenSplitter::AddedTokenSplitter(const std::vector<AddedTokenSpec>& tokens) {
  for (const AddedTokenSpec& token : tokens) {
    if (token.content.empty()) continue;  // never matches (Hugging Face skips them too)
    (token.normalized ? normalized_tokens_ : raw_tokens_).Add(token);
  }
  raw_tokens_.OrderLongestFirst();
  normalized_tokens_.OrderLongestFirst();
}

std::vector<TextSegment> AddedTokenSplitter::Split(std::string_view text) const {
  std::vector<TextSegment> first_pass;
  if (text.empty()) return first_pass;
  raw_tokens_.Split(text, &first_pass);
  if (normalized_tokens_.empty()) return first_pass;
  std::vector<TextSegment> segments;
  for (const TextSegment& segment : first_pass) {
    if (segment.added_id >= 0) {
      segments.push_back(segment);
    } else {
      normalized_tokens_.Split(segment.text, &segments);
    }
  }
  return segments;
}

size_t AddedTokenSplitter::IncompleteMatchStart(std::string_view text) const {
  // Normalized tokens are matched only inside the raw pass's plain text, but
  // looking for them over all of it only ever answers earlier: safe.
  return std::min(raw_tokens_.IncompleteMatchStart(text),
                  normalized_tokens_.IncompleteMatchStart(text));
}

}  // namespace drt

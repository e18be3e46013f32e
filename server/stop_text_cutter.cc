#include "server/stop_text_cutter.h"

#include <algorithm>
#include <utility>

namespace drt::server {
namespace {

// Length of the longest suffix of `text` that is a proper prefix of `stop`.
size_t PartialMatch(std::string_view text, std::string_view stop) {
  for (size_t k = std::min(text.size(), stop.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == stop.substr(0, k)) return k;
  }
  return 0;
}

// Bytes at the end of `text` that start a UTF-8 character the text does
// not finish (0 when it ends on a character boundary, or the tail is not
// UTF-8 at all: then nothing is gained by waiting).
size_t UnfinishedCharacter(std::string_view text) {
  // A character is at most 4 bytes: look at the last 3 for its lead byte.
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const auto byte = static_cast<unsigned char>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte
    size_t length = 1;
    if ((byte & 0xE0) == 0xC0) length = 2;
    else if ((byte & 0xF0) == 0xE0) length = 3;
    else if ((byte & 0xF8) == 0xF0) length = 4;
    return length > back ? back : 0;
  }
  return 0;
}

}  // namespace

StopTextCutter::StopTextCutter(std::vector<std::string> stops, bool include_stop)
    : include_stop_(include_stop) {
  for (std::string& stop : stops) {
    if (!stop.empty()) stops_.push_back(std::move(stop));
  }
}

StopTextCutter::Match StopTextCutter::FirstMatch() const {
  Match first;
  for (const std::string& stop : stops_) {
    const size_t at = held_.find(stop);
    if (at == std::string::npos) continue;
    // Of stops starting at the same place, the shortest: the one a stream
    // completes first (the cut cannot wait for a longer one to complete).
    const size_t end = at + stop.size();
    if (first.start == std::string::npos || at < first.start ||
        (at == first.start && end < first.end)) {
      first.start = at;
      first.end = end;
    }
  }
  return first;
}

std::string StopTextCutter::Push(std::string_view piece) {
  if (stopped_) return "";
  held_.append(piece);
  // Every occurrence that starts in text handed out earlier was ruled out
  // then (it would have been held back as a partial match), so matches
  // start in held_. The earliest complete one decides only when no stop
  // could still complete at an earlier start: with stops " b\xc3\xa9" and
  // "b", " b" is not cut at "b" before the next byte tells whether " b\xc3\xa9"
  // comes.
  size_t partial = 0;  // the longest suffix that could still become a stop
  for (const std::string& stop : stops_) partial = std::max(partial, PartialMatch(held_, stop));
  const Match first = FirstMatch();
  if (first.start != std::string::npos && (partial == 0 || first.start <= held_.size() - partial)) {
    stopped_ = true;
    std::string out = held_.substr(0, include_stop_ ? first.end : first.start);
    held_.clear();
    return out;
  }
  // (A complete match later than the partial one stays in the held tail.)
  const size_t keep = std::max(partial, UnfinishedCharacter(held_));
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopTextCutter::Finish() {
  // No partial match can complete any more: the earliest complete one cuts.
  if (const Match first = FirstMatch(); !stopped_ && first.start != std::string::npos) {
    stopped_ = true;
    held_.resize(include_stop_ ? first.end : first.start);
  }
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace drt::server

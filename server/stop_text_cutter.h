// Cuts generated text at the first occurrence of any stop string, the way
// OpenAI's completions API does: the stop string and everything after it
// are left out (drt.v1's Generate includes them, docs/api.md "Generate").
//
// For streaming, text comes in pieces and leaves as soon as it is safe: the
// tail of what came that could still grow into a stop string (the longest
// suffix that is a proper prefix of one) and the bytes of an unfinished
// UTF-8 character are held back until the next piece tells. So no byte of a
// stop match is ever handed out, no piece handed out splits a UTF-8
// character (when the whole text is valid UTF-8), and the concatenation of
// everything handed out equals the whole text cut at its first stop match.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace drt::server {

class StopTextCutter {
 public:
  // Empty stop strings are ignored (the request parser refuses them).
  // `include_stop` (vLLM's include_stop_str_in_output): the text is cut
  // after the stop string that matched instead of before it (of stops
  // matching at the same start, the shortest: the one the text completes
  // first), the rest of its token still left out.
  explicit StopTextCutter(std::vector<std::string> stops, bool include_stop = false);

  // Adds the next piece; returns the text that can be handed out now
  // (possibly empty). After a stop matched, returns "" for every piece.
  std::string Push(std::string_view piece);
  // The end of the text: returns what was held back, cut at a stop that
  // matched in it (nothing once a stop matched before). Push after Finish
  // is not allowed.
  std::string Finish();
  // Whether a stop string matched (the text was cut there).
  bool stopped() const { return stopped_; }

 private:
  // The earliest complete match in held_ (start npos when none): where it
  // starts and ends.
  struct Match {
    size_t start = std::string::npos;
    size_t end = std::string::npos;
  };
  Match FirstMatch() const;

  std::vector<std::string> stops_;
  bool include_stop_ = false;
  std::string held_;  // came, not yet handed out
  bool stopped_ = false;
};

}  // namespace drt::server

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
  explicit StopTextCutter(std::vector<std::string> stops);

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
  // The earliest complete match in held_, or npos.
  size_t FirstMatch() const;

  std::vector<std::string> stops_;
  std::string held_;  // came, not yet handed out
  bool stopped_ = false;
};

}  // namespace drt::server

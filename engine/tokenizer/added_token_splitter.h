// Finds added (e.g. special) tokens written literally in the text, the way
// Hugging Face's AddedVocabulary does: leftmost-longest matching, first the
// tokens with normalized=false over the whole text, then the normalized ones
// over what is left (with no normalizer the two texts are the same).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer_json.h"

namespace drt {

// A stretch of input: an added token (added_id >= 0) or plain text (-1).
struct TextSegment {
  std::string_view text;
  int32_t added_id;
};

class AddedTokenSplitter {
 public:
  explicit AddedTokenSplitter(const std::vector<AddedTokenSpec>& tokens);

  // Segments that together cover `text`, in order. Empty text yields none.
  std::vector<TextSegment> Split(std::string_view text) const;

  // The first position p where text[p..] is a proper prefix of some token's
  // content, so that more text could complete a match starting there (and
  // change how everything from p on is split); text.size() when none.
  size_t IncompleteMatchStart(std::string_view text) const;

 private:
  // One set of tokens matched in one pass.
  class MatchSet {
   public:
    void Add(const AddedTokenSpec& token);
    // Call once after the last Add.
    void OrderLongestFirst();
    bool empty() const { return tokens_.empty(); }
    // Appends the segments of `text` (plain text or tokens of this set).
    void Split(std::string_view text, std::vector<TextSegment>* out) const;
    // As AddedTokenSplitter::IncompleteMatchStart, for this set's tokens.
    size_t IncompleteMatchStart(std::string_view text) const;

   private:
    // The longest token starting at text[pos], or null.
    const AddedTokenSpec* LongestAt(std::string_view text, size_t pos) const;

    std::vector<AddedTokenSpec> tokens_;
    // For each first byte, indices into tokens_, longest content first.
    std::array<std::vector<uint32_t>, 256> by_first_byte_;
    std::array<bool, 256> is_first_byte_{};  // a compact index for the scan
    size_t longest_ = 0;                     // bytes of the longest content
  };

  MatchSet raw_tokens_;
  MatchSet normalized_tokens_;
};

}  // namespace drt

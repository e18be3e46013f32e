// Passkey haystacks in the paper's format: filler sentences, a needle
// "The pass key is <digits>. Remember it. <digits> is the pass key." at a
// chosen depth, and the question "What is the pass key? The pass key is" at
// the end. Built at the token level from separately tokenized parts so that
// one filler prefix can be shared by every needle placed after it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace drt::niah {

struct HaystackFormat {
  std::string filler =
      "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
  std::string needle = "The pass key is {key}. Remember it. {key} is the pass key. ";
  std::string question = "What is the pass key? The pass key is";
  int key_digits = 5;
};

class PasskeyHaystacks {
 public:
  // Tokenizes the parts once; `max_tokens` bounds every later haystack.
  static absl::StatusOr<PasskeyHaystacks> Create(const Tokenizer& tokenizer, HaystackFormat format,
                                                 int64_t max_tokens);

  // Token offset in the filler where a needle at `depth` (0 = start, 1 = end)
  // goes, on a filler-sentence boundary, for a haystack of `length` tokens.
  int64_t NeedleOffset(int64_t length, double depth) const;
  // Filler tokens [begin, end).
  std::vector<int32_t> Filler(int64_t begin, int64_t end) const;
  // Needle tokens for `key`.
  absl::StatusOr<std::vector<int32_t>> Needle(const std::string& key) const;
  const std::vector<int32_t>& question() const { return question_; }
  // The shortest haystack that holds the question and a needle (Create
  // refuses a smaller max_tokens; a caller checks every length against it).
  int64_t min_length() const { return static_cast<int64_t>(question_.size()) + kMinFillerTokens; }
  static constexpr int64_t kMinFillerTokens = 200;
  // Filler tokens after the needle so that the whole haystack (filler, needle,
  // filler, question) has `length` tokens.
  int64_t FillerAfterNeedle(int64_t length, int64_t needle_offset, int64_t needle_tokens) const;

  const HaystackFormat& format() const { return format_; }

 private:
  PasskeyHaystacks(const Tokenizer& tokenizer, HaystackFormat format)
      : tokenizer_(&tokenizer), format_(std::move(format)) {}
  const Tokenizer* tokenizer_;
  HaystackFormat format_;
  std::vector<int32_t> filler_unit_;  // one filler sentence group
  std::vector<int32_t> question_;
};

// A key of `digits` decimal digits, no leading zero.
std::string RandomKey(uint64_t& state, int digits);

// The pass-key scoring rule, one for drt-niah, drt-niah-text and both
// clients (client_examples/, docs/passkey_accuracy.md): the answer is right
// when its first number, the first maximal run of ASCII digits anywhere in
// it, is exactly the key. FirstNumber gives that run ("" when the answer
// has no digit). (drt-niah accepted only spaces before the key, so
// "\n12345" or "is 12345" counted wrong there and right in the clients;
// review-tools 2026-11-25 #12.)
std::string FirstNumber(const std::string& generated);
inline constexpr const char* kScoringRule = "first number in the answer equals the key";
bool AnswerMatches(const std::string& generated, const std::string& key);

}  // namespace drt::niah

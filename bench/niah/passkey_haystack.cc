#include "bench/niah/passkey_haystack.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace drt::niah {

absl::StatusOr<PasskeyHaystacks> PasskeyHaystacks::Create(const Tokenizer& tokenizer,
                                                          HaystackFormat format,
                                                          int64_t max_tokens) {
  PasskeyHaystacks h(tokenizer, std::move(format));
  auto unit = tokenizer.Encode(h.format_.filler);
  if (!unit.ok()) return unit.status();
  if (unit->empty()) return absl::InvalidArgumentError("the filler text tokenizes to nothing");
  h.filler_unit_ = *std::move(unit);
  auto question = tokenizer.Encode(h.format_.question);
  if (!question.ok()) return question.status();
  h.question_ = *std::move(question);
  if (max_tokens < h.min_length()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d tokens cannot hold the question and a needle (at least %d)", max_tokens,
        h.min_length()));
  }
  return h;
}

int64_t PasskeyHaystacks::NeedleOffset(int64_t length, double depth) const {
  const int64_t unit = static_cast<int64_t>(filler_unit_.size());
  const int64_t room = std::max<int64_t>(0, length - static_cast<int64_t>(question_.size()) - 100);
  const int64_t raw = static_cast<int64_t>(std::clamp(depth, 0.0, 1.0) * room);
  return raw / unit * unit;
}

std::vector<int32_t> PasskeyHaystacks::Filler(int64_t begin, int64_t end) const {
  const int64_t unit = static_cast<int64_t>(filler_unit_.size());
  std::vector<int32_t> out;
  out.reserve(std::max<int64_t>(0, end - begin));
  for (int64_t i = begin; i < end; ++i) out.push_back(filler_unit_[i % unit]);
  return out;
}

absl::StatusOr<std::vector<int32_t>> PasskeyHaystacks::Needle(const std::string& key) const {
  return tokenizer_->Encode(absl::StrReplaceAll(format_.needle, {{"{key}", key}}));
}

int64_t PasskeyHaystacks::FillerAfterNeedle(int64_t length, int64_t needle_offset,
                                            int64_t needle_tokens) const {
  return std::max<int64_t>(
      0, length - needle_offset - needle_tokens - static_cast<int64_t>(question_.size()));
}

std::string RandomKey(uint64_t& state, int digits) {
  std::string key;
  for (int i = 0; i < digits; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;  // PCG-style LCG step
    const int digit = static_cast<int>((state >> 33) % (i == 0 ? 9 : 10)) + (i == 0 ? 1 : 0);
    key.push_back(static_cast<char>('0' + digit));
  }
  return key;
}

std::string FirstNumber(const std::string& generated) {
  constexpr const char* kDigits = "0123456789";
  const size_t begin = generated.find_first_of(kDigits);
  if (begin == std::string::npos) return "";
  const size_t end = generated.find_first_not_of(kDigits, begin);
  return generated.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

bool AnswerMatches(const std::string& generated, const std::string& key) {
  return !key.empty() && FirstNumber(generated) == key;
}

}  // namespace drt::niah

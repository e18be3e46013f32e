#include "server/prompt_logprobs.h"

#include <limits>

#include "absl/strings/str_format.h"

namespace drt::server {

std::vector<drt::v1::PromptLogprobs> PromptLogprobsEvents(const std::vector<TokenScore>& scores,
                                                          int64_t first, int32_t top,
                                                          const Tokenizer& tokenizer) {
  std::vector<drt::v1::PromptLogprobs> events;
  drt::v1::PromptLogprobs* out = nullptr;
  int64_t bytes = 0;  // of *out, an upper bound
  for (const TokenScore& score : scores) {
    if (out == nullptr || out->token_ids_size() >= kMaxPromptLogprobsEventTokens ||
        bytes >= kMaxPromptLogprobsEventBytes) {
      out = &events.emplace_back();
      out->set_first_token_index(first);
      bytes = 16;  // first_token_index and the packed fields' tags and lengths
    }
    ++first;
    out->add_token_ids(score.token);
    out->add_logprobs(score.scored ? score.logprob : std::numeric_limits<float>::quiet_NaN());
    bytes += 5 + 4;  // the id (a non-negative int32 varint) and the float
    if (top <= 0) continue;
    drt::v1::TokenTopLogprobs* alternatives = out->add_top_logprobs();
    // An id the tokenizer has no text for gets empty bytes (as generated tokens).
    alternatives->set_token_bytes(tokenizer.Decode({score.token}).value_or(""));
    for (const TokenLogProb& alternative : score.top) {
      drt::v1::TokenLogprob* entry = alternatives->add_alternatives();
      entry->set_token_id(alternative.token);
      entry->set_logprob(alternative.logprob);
      entry->set_token_bytes(tokenizer.Decode({alternative.token}).value_or(""));
    }
    bytes += 6 + static_cast<int64_t>(alternatives->ByteSizeLong());  // with tag and length
  }
  return events;
}

absl::Status CheckPromptLogprobs(bool has_prompt_logprobs, int32_t prompt_logprobs,
                                 std::string_view nothing_done) {
  if (!has_prompt_logprobs || (prompt_logprobs >= 0 && prompt_logprobs <= kMaxTopLogprobs)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("prompt_logprobs must be in [0, %d] (the top alternatives listed per "
                      "token), got %d; %s",
                      kMaxTopLogprobs, prompt_logprobs, nothing_done));
}

}  // namespace drt::server

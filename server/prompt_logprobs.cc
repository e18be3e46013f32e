#include "server/prompt_logprobs.h"

#include <limits>

namespace drt::server {

drt::v1::PromptLogprobs PromptLogprobsProto(const std::vector<TokenScore>& scores, int64_t first,
                                            int32_t top, const Tokenizer& tokenizer) {
  drt::v1::PromptLogprobs out;
  out.set_first_token_index(first);
  for (const TokenScore& score : scores) {
    out.add_token_ids(score.token);
    out.add_logprobs(score.scored ? score.logprob : std::numeric_limits<float>::quiet_NaN());
    if (top <= 0) continue;
    drt::v1::TokenTopLogprobs* alternatives = out.add_top_logprobs();
    // An id the tokenizer has no text for gets empty bytes (as generated tokens).
    alternatives->set_token_bytes(tokenizer.Decode({score.token}).value_or(""));
    for (const TokenLogProb& alternative : score.top) {
      drt::v1::TokenLogprob* entry = alternatives->add_alternatives();
      entry->set_token_id(alternative.token);
      entry->set_logprob(alternative.logprob);
      entry->set_token_bytes(tokenizer.Decode({alternative.token}).value_or(""));
    }
  }
  return out;
}

}  // namespace drt::server

// TokenScores (engine/token_scores.h) as the API's PromptLogprobs event
// (proto/drt/v1/drt.proto; docs/api.md, "Prompt logprobs").
#pragma once

#include <cstdint>
#include <vector>

#include "drt/v1/drt.pb.h"
#include "engine/token_scores.h"
#include "engine/tokenizer/tokenizer.h"

namespace drt::server {

// `first`: the index, among the call's tokens, of scores[0]. Alternatives
// are listed when `top` > 0; an unscored token's logprob is NaN.
drt::v1::PromptLogprobs PromptLogprobsProto(const std::vector<TokenScore>& scores, int64_t first,
                                            int32_t top, const Tokenizer& tokenizer);

}  // namespace drt::server

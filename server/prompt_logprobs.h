// TokenScores (engine/token_scores.h) as the API's PromptLogprobs events
// (proto/drt/v1/drt.proto; docs/api.md, "Prompt logprobs").
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "drt/v1/drt.pb.h"
#include "engine/token_scores.h"
#include "engine/tokenizer/tokenizer.h"

namespace drt::server {

// An event carries at most this many tokens and, past its first token, at
// most kMaxPromptLogprobsEventBytes serialized, so that it stays well under
// gRPC's default 4 MiB receive limit whatever the step or the backlog.
// Worst case at top 20 with tokens of L bytes each, per token: id (<= 5 B)
// and logprob (4 B, packed) + TokenTopLogprobs (tag and length 3 B, own
// bytes L + 2 B, 20 alternatives of tag/length 2 B + id 6 B + logprob 5 B +
// bytes L + 2 B) = 9 + 3 + (L + 2) + 20 * (15 + L) = 314 + 21 L bytes: 335 B
// for the byte vocabulary (L = 1), 171 KB for 512 tokens; 6 KB for L = 256,
// which the byte cap stops at about 170 tokens (1 MiB + one token's 6 KB).
inline constexpr int64_t kMaxPromptLogprobsEventTokens = 512;
inline constexpr int64_t kMaxPromptLogprobsEventBytes = int64_t{1} << 20;

// `first`: the index, among the call's tokens, of scores[0]. Alternatives
// are listed when `top` > 0; an unscored token's logprob is NaN. One event
// per at most kMaxPromptLogprobsEventTokens tokens / ~kMaxPromptLogprobsEventBytes,
// first_token_index advancing; none for no scores.
std::vector<drt::v1::PromptLogprobs> PromptLogprobsEvents(const std::vector<TokenScore>& scores,
                                                          int64_t first, int32_t top,
                                                          const Tokenizer& tokenizer);

// The range check of AppendRequest's and CompleteRequest's prompt_logprobs,
// [0, kMaxTopLogprobs] when set: INVALID_ARGUMENT naming the field and
// ending with `nothing_done` (what the refusal left undone), else OK.
absl::Status CheckPromptLogprobs(bool has_prompt_logprobs, int32_t prompt_logprobs,
                                 std::string_view nothing_done);

}  // namespace drt::server

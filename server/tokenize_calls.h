// Tokenize and Detokenize (drt.v1; docs/api.md, "Tokenize and Detokenize"):
// the server's tokenizer on its own, no session, no engine step. Pure
// functions of the request, the tokenizer and the model's ids, so tests call
// them directly; DrtService wraps them in Admit/Finish.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "drt/v1/drt.pb.h"
#include "engine/model_config.h"
#include "engine/tokenizer/tokenizer.h"

namespace drt::server {

// The most text bytes one Tokenize call tokenizes (a 40 MB book fits). The
// request must also fit the server's --max_message_bytes, which gRPC
// enforces before the service sees it; this bound holds whatever that flag
// says, so that one call's ids (4 bytes each, up to one per byte) stay
// within 256 MiB of memory.
inline constexpr int64_t kMaxTokenizeTextBytes = int64_t{64} << 20;

// Text (or text_bytes) to ids, as Append and Complete tokenize a prompt sent
// whole. INVALID_ARGUMENT naming the limit for text over
// kMaxTokenizeTextBytes; an empty request gives no ids.
absl::StatusOr<drt::v1::TokenizeResponse> TokenizeText(const Tokenizer& tokenizer,
                                                       const drt::v1::TokenizeRequest& request,
                                                       int64_t max_context_tokens);

// Ids to text, spelled as Generate's pieces are: an id without text (the
// end-of-text id, an id of the model's vocabulary the tokenizer does not
// spell) adds nothing and is counted in ids_without_text; `text` replaces
// invalid UTF-8, and a character the ids end inside of, with U+FFFD;
// `text_bytes` holds the bytes exactly. INVALID_ARGUMENT naming the index
// for an id outside [0, config.vocab_size), the landmark id, or the pad id
// when it is not the end-of-text id (the engine never generates either, and
// neither has text).
absl::StatusOr<drt::v1::DetokenizeResponse> DetokenizeIds(
    const Tokenizer& tokenizer, const ModelConfig& config,
    const drt::v1::DetokenizeRequest& request);

}  // namespace drt::server

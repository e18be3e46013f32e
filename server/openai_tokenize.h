// The JSON side of vLLM's POST /tokenize and POST /detokenize, which the
// OpenAI HTTP API serves (docs/api.md, "Tokenize and Detokenize"), kept
// pure like server/openai_api.h: a body to the drt.v1 Tokenize/Detokenize
// request, or an error naming the field; their answers' JSON; and the
// /v1/completions check that a prompt leaves room for max_tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "drt/v1/drt.pb.h"

namespace drt::server {

struct TokenizeHttpRequest {
  drt::v1::TokenizeRequest request;  // the prompt as text_bytes, all ids asked for
  std::optional<std::string> model;
};

struct DetokenizeHttpRequest {
  drt::v1::DetokenizeRequest request;
  std::optional<std::string> model;
};

// {"prompt": string, "add_special_tokens"?: bool, "model"?: string}.
// add_special_tokens is taken and changes nothing: drt-server's tokenizers
// add no BOS or EOS to a prompt (Append and Complete add none either).
// return_token_strs true, or a `messages` body (vLLM's chat form), are
// refused by name. INVALID_ARGUMENT naming the field (FieldError).
absl::StatusOr<TokenizeHttpRequest> ParseTokenizeBody(absl::string_view body);
// {"tokens": [int, ...], "model"?: string}.
absl::StatusOr<DetokenizeHttpRequest> ParseDetokenizeBody(absl::string_view body);

// vLLM's answers: {"count", "max_model_len", "tokens"} and {"prompt"}.
std::string TokenizeJson(const drt::v1::TokenizeResponse& response);
std::string DetokenizeJson(const drt::v1::DetokenizeResponse& response);

// vLLM's GET /tokenizer_info answer (its tokenizer_config.json keys, the
// ones lm-evaluation-harness's "remote" tokenizer reads): tokenizer_class
// (ModelInfo.tokenizer), model_max_length (max_context_tokens), eos_token
// (`eos_spelling`: the text that /tokenize turns into the eos id; null when
// no text does, as with the byte models, whose eos id has no spelling),
// bos_token, pad_token and unk_token null (drt-server adds no BOS, and the
// pad id cannot be written in a prompt), add_bos_token and add_eos_token
// false; and the ids: vocab_size, eos_token_id (null when the model has
// none), pad_token_id.
std::string TokenizerInfoJson(const drt::v1::ModelInfo& info,
                              const std::optional<std::string>& eos_spelling);

// The padding the service adds before generating after a prompt of
// `prompt_tokens` (drt_service.cc, RunGeneration): up to the next multiple
// of `chunk_size` when `pad` (the request's pad_to_chunk_boundary, else the
// model's default), none otherwise.
int64_t ChunkPadding(int64_t prompt_tokens, int64_t chunk_size, bool pad);

// The /v1/completions refusal of a prompt that fits the context limit
// (`prompt_tokens` < `limit`) with a max_tokens that does not beside it and
// its `padding` (ChunkPadding): param "max_tokens", advising the largest
// max_tokens that runs. A prompt that fits but leaves no room for its
// padding and one token is refused param "prompt" (the service would run
// it and then refuse; `chunk_size` names the longest prompt that leaves
// room). OK when it fits or when the prompt alone does not (the service
// refuses that one, param "prompt").
absl::Status CheckRoomForMaxTokens(int64_t prompt_tokens, int64_t max_tokens, int64_t limit,
                                   int64_t padding, int64_t chunk_size);

// A batch's prompt over the context limit `limit`, refused (400, param
// "prompt") before any of the batch's prompts runs: alone, the service would
// refuse it as it ingests, but in a batch the prompts before it would have
// run for nothing (review-lmeval F2). `generates`: max_tokens > 0, which
// needs room for one token beside the prompt (the room for max_tokens and
// padding is CheckRoomForMaxTokens's); echo with max_tokens 0 needs none.
// OK when the prompt fits.
absl::Status CheckPromptFitsContext(int64_t prompt_tokens, int64_t limit, bool generates);

// The /v1/completions refusal of an id prompt holding an id the engine
// refuses in a prompt: outside [0, vocab_size), the landmark id (chunk_id)
// or the pad id. Param "prompt", naming prompt[INDEX] as the request holds
// it (the service would name the index within its 16 Ki-id piece, after
// running the pieces before it); `name` is the prompt's ("prompt[2]" for a
// batch's third: prompt[2][INDEX]). OK when every id may stand in a prompt.
absl::Status CheckPromptIds(const std::vector<int32_t>& ids, int64_t vocab_size, int64_t chunk_id,
                            int64_t pad_id, absl::string_view name = "prompt");

}  // namespace drt::server

#include "server/openai_tokenize.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/openai_api.h"

namespace drt::server {
namespace {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;

std::string Dump(const OJson& json) {
  return json.dump(-1, ' ', /*ensure_ascii=*/false, OJson::error_handler_t::replace);
}

// The body as a JSON object (the depth bound and the errors of
// ParseCompletionRequest).
absl::StatusOr<Json> ParseObject(absl::string_view text) {
  if (NestsDeeperThan(text, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body nests deeper than ", kMaxJsonDepth, " levels"));
  }
  Json body;
  try {
    body = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number such as 1e999
    return absl::InvalidArgumentError(absl::StrCat("the request body is not valid JSON: ", e.what()));
  }
  if (!body.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body must be a JSON object, got ", body.type_name()));
  }
  return body;
}

absl::StatusOr<std::optional<std::string>> ParseModel(const Json& body) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return FieldError("model", "model must be a string");
  return std::optional<std::string>(it->get<std::string>());
}

}  // namespace

absl::StatusOr<TokenizeHttpRequest> ParseTokenizeBody(absl::string_view text) {
  absl::StatusOr<Json> body = ParseObject(text);
  if (!body.ok()) return body.status();
  // null is taken as absent for every field, as ParseCompletionRequest does.
  if (auto messages = body->find("messages"); messages != body->end() && !messages->is_null()) {
    return FieldError("messages",
                      "messages (vLLM's chat form of /tokenize) is not served: the models "
                      "drt-server serves have no chat template; send a prompt string");
  }
  auto prompt = body->find("prompt");
  if (prompt == body->end() || !prompt->is_string()) {
    return FieldError("prompt", "prompt is required and must be a string");
  }
  for (const char* flag : {"add_special_tokens", "return_token_strs"}) {
    auto it = body->find(flag);
    if (it != body->end() && !it->is_null() && !it->is_boolean()) {
      return FieldError(flag, absl::StrCat(flag, " must be true or false"));
    }
  }
  // (Not body->value(..., false): it throws on a null, which is valid here.)
  if (auto strs = body->find("return_token_strs");
      strs != body->end() && strs->is_boolean() && strs->get<bool>()) {
    return FieldError("return_token_strs",
                      "return_token_strs is not served: ask /detokenize for the text of the ids");
  }
  absl::StatusOr<std::optional<std::string>> model = ParseModel(*body);
  if (!model.ok()) return model.status();
  TokenizeHttpRequest out;
  out.request.set_text_bytes(prompt->get<std::string>());
  out.model = *std::move(model);
  return out;
}

absl::StatusOr<DetokenizeHttpRequest> ParseDetokenizeBody(absl::string_view text) {
  absl::StatusOr<Json> body = ParseObject(text);
  if (!body.ok()) return body.status();
  auto tokens = body->find("tokens");
  if (tokens == body->end() || !tokens->is_array()) {
    return FieldError("tokens", "tokens is required and must be an array of token ids");
  }
  DetokenizeHttpRequest out;
  out.request.mutable_ids()->Reserve(static_cast<int>(tokens->size()));
  for (size_t i = 0; i < tokens->size(); ++i) {
    const Json& id = (*tokens)[i];
    // Any int32: the service refuses ids outside the vocabulary by name.
    const bool fits = id.is_number_integer() &&
                      (id.is_number_unsigned()
                           ? id.get<uint64_t>() <= std::numeric_limits<int32_t>::max()
                           : id.get<int64_t>() >= std::numeric_limits<int32_t>::min() &&
                                 id.get<int64_t>() <= std::numeric_limits<int32_t>::max());
    if (!fits) {
      return FieldError("tokens", absl::StrCat("tokens[", i, "] (", id.dump(),
                                               ") is not a token id (an integer)"));
    }
    out.request.add_ids(static_cast<int32_t>(id.get<int64_t>()));
  }
  absl::StatusOr<std::optional<std::string>> model = ParseModel(*body);
  if (!model.ok()) return model.status();
  out.model = *std::move(model);
  return out;
}

std::string TokenizeJson(const drt::v1::TokenizeResponse& response) {
  // Written out, not built as a JSON value: millions of ids would take a
  // JSON node (16+ bytes) each first.
  std::string out = absl::StrCat("{\"count\":", response.count(),
                                 ",\"max_model_len\":", response.max_context_tokens(),
                                 ",\"tokens\":[");
  out.reserve(out.size() + static_cast<size_t>(response.ids_size()) * 6 + 2);
  for (int i = 0; i < response.ids_size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, response.ids(i));
  }
  out += "]}";
  return out;
}

std::string DetokenizeJson(const drt::v1::DetokenizeResponse& response) {
  return Dump(OJson{{"prompt", response.text()}});
}

std::string TokenizerInfoJson(const drt::v1::ModelInfo& info,
                              const std::optional<std::string>& eos_spelling) {
  OJson out = {{"tokenizer_class", info.tokenizer()},
               {"model_max_length", info.max_context_tokens()},
               {"eos_token", nullptr},
               {"bos_token", nullptr},
               {"pad_token", nullptr},
               {"unk_token", nullptr},
               {"add_bos_token", false},
               {"add_eos_token", false},
               {"vocab_size", info.vocab_size()},
               {"eos_token_id", nullptr},
               {"pad_token_id", info.pad_id()}};
  if (eos_spelling.has_value()) out["eos_token"] = *eos_spelling;
  if (info.eos_id() >= 0) out["eos_token_id"] = info.eos_id();
  return Dump(out);
}

int64_t ChunkPadding(int64_t prompt_tokens, int64_t chunk_size, bool pad) {
  if (!pad || chunk_size <= 0 || prompt_tokens % chunk_size == 0) return 0;
  return chunk_size - prompt_tokens % chunk_size;
}

absl::Status CheckRoomForMaxTokens(int64_t prompt_tokens, int64_t max_tokens, int64_t limit,
                                   int64_t padding, int64_t chunk_size) {
  if (prompt_tokens >= limit) return absl::OkStatus();  // the service's refusal
  if (prompt_tokens + padding + 1 > limit) {
    // The service would run the whole prompt, then refuse the padding
    // (drt_service.cc, RunGeneration). The longest prompt that leaves room
    // for its padding and a token ends a whole chunk below the limit.
    const int64_t longest = chunk_size > 0 ? (limit - 1) / chunk_size * chunk_size : limit - 1;
    return FieldError(
        "prompt",
        absl::StrCat("This model's maximum context length is ", limit, " tokens. However, "
                     "your prompt's ", prompt_tokens, " tokens with their padding to the "
                     "chunk boundary (", padding, " more, the model's pad_to_chunk_boundary) "
                     "leave no room to generate: shorten the prompt to at most ", longest,
                     " tokens"));
  }
  if (prompt_tokens + padding + max_tokens <= limit) return absl::OkStatus();
  const std::string padded =
      padding > 0 ? absl::StrCat(padding, " of padding to the chunk boundary, ") : std::string();
  return FieldError(
      "max_tokens",
      absl::StrCat("This model's maximum context length is ", limit, " tokens. However, you "
                   "requested ", prompt_tokens + padding + max_tokens, " tokens (",
                   prompt_tokens, " in the prompt, ", padded, max_tokens,
                   " in max_tokens): reduce max_tokens to at most ",
                   limit - prompt_tokens - padding, " or shorten the prompt"));
}

absl::Status CheckPromptFitsContext(int64_t prompt_tokens, int64_t limit, bool generates) {
  // The service's limits: a prompt may fill the context when nothing is
  // generated after it (drt_service.cc, CheckContextLimit), and must leave
  // room for a token when something is (RunGeneration).
  if (generates ? prompt_tokens < limit : prompt_tokens <= limit) return absl::OkStatus();
  return FieldError(
      "prompt", absl::StrCat("This model's maximum context length is ", limit,
                             " tokens. However, your prompt has ", prompt_tokens, " tokens",
                             generates && prompt_tokens == limit ? ", which leaves no room to generate"
                                                                 : "",
                             ": shorten the prompt"));
}

absl::Status CheckPromptIds(const std::vector<int32_t>& ids, int64_t vocab_size, int64_t chunk_id,
                            int64_t pad_id, absl::string_view name) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id >= 0 && id < vocab_size && id != chunk_id && id != pad_id) continue;
    // Only a refused id costs a string (review-userfix U6).
    const std::string at = absl::StrCat(name, "[", i, "]: token ", id);
    if (id < 0 || id >= vocab_size) {
      return FieldError("prompt",
                        absl::StrCat(at, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (id == chunk_id) {
      return FieldError("prompt", absl::StrCat(at, " is the landmark id, which only the engine "
                                                   "inserts"));
    }
    if (id == pad_id) {
      return FieldError("prompt",
                        absl::StrCat(at, " is the pad id, which only the engine inserts"));
    }
  }
  return absl::OkStatus();
}

}  // namespace drt::server

#include "server/tokenize_calls.h"

#include <string>
#include <vector>

#include "absl/strings/str_format.h"

namespace drt::server {

absl::StatusOr<drt::v1::TokenizeResponse> TokenizeText(const Tokenizer& tokenizer,
                                                       const drt::v1::TokenizeRequest& request,
                                                       int64_t max_context_tokens) {
  const std::string& text = request.input_case() == drt::v1::TokenizeRequest::kTextBytes
                                ? request.text_bytes()
                                : request.text();
  if (static_cast<int64_t>(text.size()) > kMaxTokenizeTextBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "text of %d bytes is over the %d bytes one Tokenize call takes; send it in parts cut "
        "at whitespace (or stream it into a session with Append and read its token count)",
        text.size(), kMaxTokenizeTextBytes));
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text);
  if (!ids.ok()) return ids.status();
  drt::v1::TokenizeResponse response;
  response.set_count(static_cast<int64_t>(ids->size()));
  response.set_max_context_tokens(max_context_tokens);
  if (!request.count_only()) response.mutable_ids()->Add(ids->begin(), ids->end());
  return response;
}

absl::StatusOr<drt::v1::DetokenizeResponse> DetokenizeIds(
    const Tokenizer& tokenizer, const ModelConfig& config,
    const drt::v1::DetokenizeRequest& request) {
  std::string bytes;
  int64_t without_text = 0;
  const int32_t eos = tokenizer.eos_id();
  for (int i = 0; i < request.ids_size(); ++i) {
    const int64_t id = request.ids(i);
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ids[%d]: token %d is outside the vocabulary [0, %d)", i, id, config.vocab_size));
    }
    if (id == config.chunk_id) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ids[%d]: token %d is the landmark id, which only the engine inserts and which has "
          "no text",
          i, id));
    }
    if (id == config.pad_id && id != eos) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ids[%d]: token %d is the pad id, which only the engine inserts and which has no text",
          i, id));
    }
    // As Generate spells a token: an id the tokenizer has no text for adds
    // nothing (server/drt_service.cc, the decode loop).
    absl::StatusOr<std::string> piece = tokenizer.Decode({static_cast<int32_t>(id)});
    if (!piece.ok() || piece->empty()) {
      ++without_text;
      continue;
    }
    bytes += *piece;
  }
  drt::v1::DetokenizeResponse response;
  Utf8Streamer utf8;
  std::string text = utf8.Push(bytes);
  text += utf8.Flush();
  response.set_text(std::move(text));
  response.set_text_bytes(std::move(bytes));
  response.set_ids_without_text(without_text);
  return response;
}

}  // namespace drt::server

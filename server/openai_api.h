// The JSON side of the OpenAI-compatible HTTP API (docs/api.md,
// "OpenAI-compatible HTTP API"), kept pure: a /v1/completions request body
// to the drt.v1 Complete messages that run it, or an error naming the
// field; and the answers' JSON (completion, stream chunk, usage chunk,
// model list, error). No I/O: server/openai_http_server.h does the HTTP.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "drt/v1/drt.pb.h"
#include "server/limits.h"

namespace drt::server {

// OpenAI's default max_tokens for /v1/completions.
constexpr int32_t kOpenAiDefaultMaxTokens = 16;
// Retry-After (seconds) on every 503 the API sends: overload (no thread, or
// no session free), draining. A thread or a session comes free when any
// running completion ends, and a draining server's load balancer takes new
// requests elsewhere once /healthz fails, so a retry soon is the right
// advice; 1 s also keeps openai-python (which honours Retry-After up to
// 60 s, else backs off from 0.5 s) from retrying sooner than that.
constexpr int kRetryAfterSeconds = 1;
// The most stop strings a request may give. OpenAI allows 4 and vLLM has no
// limit; lm-evaluation-harness adds the end-of-text string to a task's
// `until`, so a task with 4 of them sends 5. Each stop string is looked for
// in the held-back text after every generated token (here and in the
// service), a cost that grows with their number: 64 leaves room for any
// task's list and keeps that cost small.
constexpr size_t kMaxStops = 64;
// The most prompts one /v1/completions request may carry (a batch: an
// array of strings or of token id arrays). They run one after another on
// the request's thread (server/openai_http_server.cc, Completions), so the
// cap bounds how long one request holds its thread; lm-evaluation-harness's
// batch_size is usually 1 to 64.
constexpr size_t kMaxBatchPrompts = 128;
// Prompt pieces per Complete message: far below gRPC's message limit
// (--max_message_bytes, 4 MiB by default) whatever the prompt's size.
constexpr size_t kPromptPieceBytes = 64 << 10;
constexpr size_t kPromptPieceIds = 16 << 10;

// The deepest nesting of arrays and objects a request body may have (the
// body's own object is level 1; a request needs 3). Checked before the JSON
// is parsed: each level of a deep nest costs a heap-allocated container,
// 78x the body in memory measured at 64 MiB (and a recursive parse and
// destruction); at most 64 levels it is below 33x (docs/api.md).
constexpr int kMaxJsonDepth = 64;

// OpenAI's completions API allows `logprobs` up to 5; drt-server takes up to
// 20 (engine/top_logprobs.h, kMaxTopLogprobs), as vLLM does with its default
// max_logprobs.
constexpr int32_t kOpenAiMaxLogprobs = 20;

// One prompt of a batch: text, or token ids.
struct PromptInput {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};

struct CompletionRequest {
  // One of them: the prompt as text, or as token ids (a batch's first).
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  // A batch's other prompts (`prompt` an array of several strings or id
  // arrays), in order; each runs as its own completion with the same
  // options (SplitBatch). Empty for one prompt.
  std::vector<PromptInput> more_prompts;
  // max_tokens, sampling (temperature, top_k, top_p, seed), stop, ignore_eos.
  drt::v1::GenerateRequest generate;
  // `seed` was given; without it OpenAI samples afresh each time, which the
  // HTTP side arranges by drawing one (drt.v1's unset seed is 0, repeated).
  bool seed_given = false;
  std::optional<std::string> model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // `logprobs`: the top alternatives per token (0: the chosen token's only);
  // unset or null: none. `generate` then asks for return_logprobs and
  // top_logprobs max(1, N) (1 at least: the pieces carry the chosen token's
  // bytes only beside alternatives).
  std::optional<int32_t> logprobs;
  // `n`: choices from the one prompt, 1 to kMaxCompleteChoices
  // (CompleteRequest.n: the prompt is ingested once and forked).
  int32_t n = 1;
  // `echo`: each choice's text starts with the prompt's, and with
  // `logprobs` its entries start with the prompt tokens' (Complete's
  // prompt_logprobs). `max_tokens` 0 is allowed only with it: then
  // nothing is generated (prompt_only), lm-evaluation-harness's
  // loglikelihood request.
  bool echo = false;
  bool prompt_only = false;
  // vLLM's `prompt_logprobs` (0 to 20): each choice's "prompt_logprobs"
  // lists the prompt tokens' scores (PromptLogprobsJson); unset: none.
  std::optional<int32_t> prompt_logprobs;
  // vLLM's `include_stop_str_in_output`: the text keeps the stop string
  // that ended it.
  bool include_stop_str = false;
};

// Parses a /v1/completions body. INVALID_ARGUMENT for JSON that does not
// parse or nests deeper than kMaxJsonDepth, and for any field refused, with the field's name in the message and
// as OpenAiErrorParam; unknown fields are ignored.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body);

// A batch's completions, one per prompt in order, each with the request's
// options and no more_prompts; one prompt: the request itself.
std::vector<CompletionRequest> SplitBatch(CompletionRequest request);

// The Complete messages for `request`: the options first, then the prompt in
// pieces of at most kPromptPieceBytes (text_bytes) or kPromptPieceIds ids.
std::vector<drt::v1::CompleteRequest> CompleteMessages(const CompletionRequest& request);

// An error about one request field: INVALID_ARGUMENT carrying the field's
// name (OpenAI's error "param").
absl::Status FieldError(absl::string_view field, absl::string_view message);
// The field a FieldError named; "" for other errors.
std::string OpenAiErrorParam(const absl::Status& status);
// A Complete call's failure as the OpenAI API reports it: the refusals of
// a request field only the service can check carry that field
// (FieldError): a logit_bias id (INVALID_ARGUMENT "logit_bias names token
// ...") and n beyond what --max_sessions allows ("n must be ..."); anything
// else keeps its code and message, with no param.
absl::Status ServiceStatus(absl::StatusCode code, absl::string_view message);

// gRPC code -> HTTP status: INVALID_ARGUMENT 400, UNAUTHENTICATED 401,
// NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503,
// DEADLINE_EXCEEDED 504, any other 500. (The server answers two
// RESOURCE_EXHAUSTED otherwise: the session limit 503, the context limit
// 400 context_length_exceeded; server/openai_http_server.cc, SendError.)
int HttpStatusFor(absl::StatusCode code);

// {"error":{"message","type","param","code"}} for `status` (not OK): type
// from the HTTP status (invalid_request_error, authentication_error,
// rate_limit_error, server_error), code the gRPC code's name in lower case,
// param OpenAiErrorParam or null.
std::string ErrorJson(const absl::Status& status);
// The same shape with every part given (param and code "" -> null).
std::string ErrorJson(absl::string_view message, absl::string_view type, absl::string_view param,
                      absl::string_view code);

// "stop" for END_OF_TEXT and STOP_SEQUENCE, "length" for LENGTH, "abort"
// (vLLM's word) for CANCELLED and DEADLINE and anything else.
std::string FinishReasonName(drt::v1::FinishReason reason);

// One generated token in a choice's `logprobs` object.
struct TokenLogprobEntry {
  std::string token;  // OpenAiTokenText of its bytes
  float logprob = 0;
  // A prompt token with no score (the prompt's first: nothing before it):
  // its token_logprob and top_logprobs are null, as OpenAI's.
  bool unscored = false;
  // The top alternatives, best first, then the chosen token if it is not
  // among them (OpenAI: "up to logprobs+1 elements"); a text already listed
  // keeps its first (best) entry, since the JSON object is keyed by text.
  std::vector<std::pair<std::string, float>> top;
  int64_t text_offset = 0;  // code points of the completion text before it
};

// A choice's `logprobs` object (OpenAI's legacy completions shape):
// {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}],
// "text_offset"}, one element per token.
using ChoiceLogprobs = std::vector<TokenLogprobEntry>;

// A token's text for `tokens` and the keys of `top_logprobs`: its bytes when
// they are whole UTF-8 on their own, else vLLM's spelling "bytes:\xNN..."
// (each byte as \x and two lower-case hex digits). U+FFFD, what the API does
// for invalid text, would make the pieces of different characters (one byte
// each with the byte tokenizer) the same key and lose the bytes.
std::string OpenAiTokenText(absl::string_view bytes);

// Builds the entries of one choice from the Complete pieces (their
// logprobs and top_logprobs, which the request asked for), in order.
class LogprobsCollector {
 public:
  // `top` alternatives per token (CompletionRequest.logprobs).
  explicit LogprobsCollector(int32_t top) : top_(top) {}
  // INTERNAL when the piece lacks a token's logprob or alternatives (the
  // service did not send what was asked).
  absl::Status Add(const drt::v1::GeneratedPiece& piece);
  // The prompt's tokens (echo), before any piece: one entry per token, from
  // the event's top_logprobs (its token's bytes and alternatives); INTERNAL
  // when the event lacks them.
  absl::Status AddPrompt(const drt::v1::PromptLogprobs& scores);
  // The entries added since the last Take (streaming sends each with the
  // next chunk), or all of them for a non-streamed answer.
  ChoiceLogprobs Take();

 private:
  int32_t top_;
  // The token's text_offset: the characters of the completion text before
  // the one its first byte belongs to, counted as the text is decoded
  // (Utf8Streamer: each maximal ill-formed subpart one U+FFFD), so that a
  // token continuing a character gets that character's offset (vLLM's: the
  // length of the text before the token, which does not hold it yet) and
  // invalid bytes count as the U+FFFD the text shows.
  int64_t Advance(absl::string_view bytes);

  int64_t characters_ = 0;  // characters read from the bytes so far
  std::string held_;        // a truncated character's bytes, read with the next token's
  ChoiceLogprobs pending_;
};

// The text of a token-id prompt for echo: its tokens' bytes (Detokenize's
// text_bytes of its pieces, in order) as UTF-8, invalid bytes and a
// character cut at the end as U+FFFD, as Complete's pieces spell text (a
// character split between two pieces is read whole).
std::string SpellTokenBytes(const std::vector<std::string>& pieces);

// vLLM's `prompt_logprobs` for a choice from Complete's prompt score
// events, in order: one element per prompt token, null for a token with no
// score (the first: nothing before it), else an object keyed by token id
// (as a string): the token itself and the `top` best alternatives (OpenAI
// keys by text, vLLM by id), each {"logprob", "rank", "decoded_token"};
// rank is the 1-based place among the alternatives, null for the token
// itself when it is not among them (its exact rank is not computed).
// INTERNAL when an event lacks a token's scores.
absl::StatusOr<std::string> PromptLogprobsJson(const std::vector<drt::v1::PromptLogprobs>& events,
                                               int32_t top);

// What every answer object of one completion shares.
struct CompletionHeader {
  std::string id;  // "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // Of prompt_tokens, those a prefix-cache snapshot held (not prefilled):
  // usage.prompt_tokens_details.cached_tokens, as OpenAI and vLLM give it.
  int64_t cached_tokens = 0;
};

// The non-streamed answer: object "text_completion", one choice, usage.
// One choice of a non-streamed answer.
struct CompletionChoice {
  std::string text;
  std::string finish_reason;
  std::optional<ChoiceLogprobs> logprobs;  // nullopt: "logprobs" null (not asked for)
  // PromptLogprobsJson's list, written as the choice's "prompt_logprobs";
  // nullopt: no such key (not asked for).
  std::optional<std::string> prompt_logprobs_json;
};

// `logprobs` null leaves the choice's "logprobs" null (not asked for).
std::string CompletionJson(const CompletionHeader& header, absl::string_view text,
                           absl::string_view finish_reason, const Usage& usage,
                           const ChoiceLogprobs* logprobs = nullptr);
// With every choice, choice i at "index" i.
std::string CompletionJson(const CompletionHeader& header,
                           const std::vector<CompletionChoice>& choices, const Usage& usage);
// One streamed chunk: the same shape with this piece's text; finish_reason
// null unless given.
// `index`: the choice's (n > 1).
std::string CompletionChunkJson(const CompletionHeader& header, absl::string_view text,
                                std::optional<absl::string_view> finish_reason,
                                const ChoiceLogprobs* logprobs = nullptr, int32_t index = 0);
// The final usage chunk of stream_options.include_usage: choices [] and usage.
std::string UsageChunkJson(const CompletionHeader& header, const Usage& usage);
// GET /v1/models for the served model.
std::string ModelsJson(const drt::v1::ModelInfo& info, int64_t created);
// One server-sent event: "data: <payload>\n\n".
std::string SseEvent(absl::string_view payload);

// Whether `text` opens more than `limit` arrays/objects at once, counting
// brackets outside strings only (a pass over the bytes, allocating nothing;
// the parse that follows judges the rest of the syntax). Every body is
// checked against kMaxJsonDepth before it is parsed.
bool NestsDeeperThan(absl::string_view text, int limit);

}  // namespace drt::server

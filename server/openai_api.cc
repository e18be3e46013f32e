#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/sampler.h"
#include "nlohmann/json.hpp"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "server/status_util.h"

namespace drt::server {
namespace {

using Json = nlohmann::json;
// Answers keep their keys in the order written (OpenAI's order; the
// alternatives of top_logprobs best first).
using OJson = nlohmann::ordered_json;

// Where FieldError keeps the field's name (absl::Status payloads are keyed by
// a URL-like string of the caller's choosing).
constexpr char kParamPayload[] = "drt.openai/param";
// The most max_tokens drt.v1 takes (server/drt_service.cc, kMaxTokensLimit).
constexpr int64_t kMaxTokens = int64_t{1} << 20;

// Every string we write may hold bytes from the model or the client:
// invalid UTF-8 becomes U+FFFD instead of an exception.
template <typename J>
std::string Dump(const J& json) {
  return json.dump(-1, ' ', /*ensure_ascii=*/false, J::error_handler_t::replace);
}

// Whether `bytes` is valid UTF-8 (no overlong forms, surrogates or code
// points above U+10FFFF) and ends on a character's end: ReadUtf8Char's
// rule, the one the text and the offsets are decoded with.
bool IsWholeUtf8(absl::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Char c = ReadUtf8Char(std::string_view(bytes.data() + i, bytes.size() - i));
    if (c.kind != Utf8Char::Kind::kValid) return false;
    i += c.length;
  }
  return true;
}

bool IsNull(const Json& body, const char* field) {
  auto it = body.find(field);
  return it == body.end() || it->is_null();
}

absl::StatusOr<int64_t> IntField(const Json& value, const char* field, int64_t lo, int64_t hi) {
  int64_t v = 0;
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FieldError(field, absl::StrCat(field, " must be an integer in [", lo, ", ", hi,
                                            "], got ", u));
    }
    v = static_cast<int64_t>(u);
  } else if (value.is_number_integer()) {
    v = value.get<int64_t>();
  } else {
    return FieldError(field, absl::StrCat(field, " must be an integer, got ", Dump(value)));
  }
  if (v < lo || v > hi) {
    return FieldError(field,
                      absl::StrCat(field, " must be an integer in [", lo, ", ", hi, "], got ", v));
  }
  return v;
}

absl::StatusOr<double> NumberField(const Json& value, const char* field) {
  if (!value.is_number()) {
    return FieldError(field, absl::StrCat(field, " must be a number, got ", Dump(value)));
  }
  const double v = value.get<double>();
  if (!std::isfinite(v)) return FieldError(field, absl::StrCat(field, " must be finite"));
  return v;
}

absl::StatusOr<bool> BoolField(const Json& value, const char* field) {
  if (!value.is_boolean()) {
    return FieldError(field, absl::StrCat(field, " must be true or false, got ", Dump(value)));
  }
  return value.get<bool>();
}

// One token id array (a prompt, or one prompt of a batch), into `out`;
// `where` names it in errors ("prompt", "prompt[2]").
absl::Status ParseIdArray(const Json& array, const std::string& where, PromptInput& out) {
  if (array.empty()) {
    return FieldError("prompt", absl::StrCat(where, " must not be an empty token id array"));
  }
  out.is_ids = true;
  out.ids.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    const Json& id = array[i];
    if (!id.is_number_integer() ||
        (id.is_number_unsigned() &&
         id.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) ||
        (!id.is_number_unsigned() && (id.get<int64_t>() < 0 ||
                                      id.get<int64_t>() > std::numeric_limits<int32_t>::max()))) {
      return FieldError("prompt", absl::StrCat(where, ": element ", i, " of the token id array (",
                                               Dump(id), ") is not a token id (an integer >= 0)"));
    }
    out.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return absl::OkStatus();
}

// `prompt`: a string, an array of token ids, or a batch (OpenAI's and
// vLLM's shapes): an array of strings or of token id arrays, each run as
// its own completion. An array of one string or one id array is one prompt
// (lm-evaluation-harness sends every request as [[ids]]).
absl::Status ParsePrompt(const Json& body, CompletionRequest& out) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    return FieldError("prompt", "prompt is required (a string, or an array of token ids)");
  }
  const Json& prompt = *it;
  std::vector<PromptInput> prompts;
  if (prompt.is_string()) {
    prompts.push_back({prompt.get<std::string>(), {}, false});
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number()) {
    if (absl::Status s = ParseIdArray(prompt, "prompt", prompts.emplace_back()); !s.ok()) return s;
  } else if (prompt.is_array() && !prompt.empty() && (prompt[0].is_string() || prompt[0].is_array())) {
    // A batch: all strings, or all token id arrays.
    if (prompt.size() > kMaxBatchPrompts) {
      return FieldError("prompt", absl::StrCat("prompt: a batch of ", prompt.size(),
                                               " prompts; at most ", kMaxBatchPrompts,
                                               " are run per request (send the rest in another)"));
    }
    const bool strings = prompt[0].is_string();
    for (size_t i = 0; i < prompt.size(); ++i) {
      const Json& item = prompt[i];
      const std::string where = absl::StrCat("prompt[", i, "]");
      if (strings && item.is_string()) {
        prompts.push_back({item.get<std::string>(), {}, false});
      } else if (!strings && item.is_array()) {
        if (absl::Status s = ParseIdArray(item, where, prompts.emplace_back()); !s.ok()) return s;
      } else {
        return FieldError("prompt", absl::StrCat(where, " must be ",
                                                 strings ? "a string" : "an array of token ids",
                                                 " as prompt[0] is (a batch is all strings or all "
                                                 "token id arrays), got ", item.type_name()));
      }
    }
  } else {
    return FieldError("prompt", absl::StrCat("prompt must be a string, an array of token ids, or "
                                             "a batch (an array of strings or of token id arrays), "
                                             "got ",
                                             prompt.is_array() && prompt.empty() ? "[]"
                                                                                 : prompt.type_name()));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!prompts[i].is_ids && prompts[i].text.empty()) {
      return FieldError("prompt", prompts.size() == 1
                                      ? std::string("prompt must not be empty")
                                      : absl::StrCat("prompt[", i, "] must not be empty"));
    }
  }
  out.prompt_text = std::move(prompts[0].text);
  out.prompt_ids = std::move(prompts[0].ids);
  out.prompt_is_ids = prompts[0].is_ids;
  out.more_prompts.assign(std::make_move_iterator(prompts.begin() + 1),
                          std::make_move_iterator(prompts.end()));
  return absl::OkStatus();
}

// Fields that would change the answer in ways drt-server does not do:
// refused when they ask for anything but the default, so no client gets a
// result silently different from what it asked for.
absl::Status RefuseUnsupported(const Json& body) {
  auto field = [&](const char* name) -> const Json* {
    auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  // A number equal to 1 (1.0 too, as vLLM's lax parsing takes it).
  auto is_one = [](const Json& v) { return v.is_number() && v.get<double>() == 1.0; };
  if (const Json* v = field("best_of");
      v != nullptr && !is_one(*v)) {
    return FieldError("best_of", absl::StrCat("best_of is not supported (only 1), got ", Dump(*v)));
  }
  if (const Json* v = field("suffix"); v != nullptr && !(v->is_string() && v->get<std::string>().empty())) {
    return FieldError("suffix", "suffix is not supported (insertion needs a model trained for it)");
  }
  // vLLM's extensions that drt.v1's Generate cannot express: refused
  // unless neutral, so a client moving from vLLM gets no silently
  // different result.
  if (const Json* v = field("use_beam_search"); v != nullptr && !(v->is_boolean() && !v->get<bool>())) {
    return FieldError("use_beam_search", absl::StrCat("use_beam_search is not supported (only "
                                                      "false), got ", Dump(*v)));
  }
  if (const Json* v = field("stop_token_ids"); v != nullptr && !(v->is_array() && v->empty())) {
    return FieldError("stop_token_ids",
                      absl::StrCat("stop_token_ids is not supported (only [] or null), got ",
                                   Dump(*v), ": drt.v1's Generate stops at the model's end-of-"
                                   "text token and at stop strings only"));
  }
  if (const Json* v = field("min_tokens");
      v != nullptr && !(v->is_number_integer() && v->get<int64_t>() == 0)) {
    return FieldError("min_tokens", absl::StrCat("min_tokens is not supported (only 0 or null), "
                                                 "got ", Dump(*v), ": drt.v1's Generate cannot "
                                                 "hold off the end-of-text token or stop strings"));
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const Json& body, CompletionRequest& out) {
  if (IsNull(body, "stop")) return absl::OkStatus();
  const Json& stop = body["stop"];
  std::vector<std::string> stops;
  if (stop.is_string()) {
    stops.push_back(stop.get<std::string>());
  } else if (stop.is_array()) {
    if (stop.size() > kMaxStops) {
      return FieldError("stop", absl::StrCat("stop takes at most ", kMaxStops, " strings, got ",
                                             stop.size()));
    }
    for (const Json& s : stop) {
      if (!s.is_string()) {
        return FieldError("stop", absl::StrCat("stop must hold strings, got ", Dump(s)));
      }
      stops.push_back(s.get<std::string>());
    }
  } else {
    return FieldError("stop", absl::StrCat("stop must be a string or an array of strings, got ",
                                           stop.type_name()));
  }
  for (std::string& s : stops) {
    if (s.empty()) return FieldError("stop", "stop strings must not be empty");
    out.generate.add_stop(std::move(s));
  }
  return absl::OkStatus();
}

absl::Status ParseSampling(const Json& body, CompletionRequest& out) {
  drt::v1::SamplingParams& sampling = *out.generate.mutable_sampling();
  // OpenAI's defaults (and vLLM's for a model whose generation_config.json
  // sets none, as the bundled models'): temperature 1, top_p 1, no top_k.
  sampling.set_temperature(1.0f);
  sampling.set_top_p(1.0f);
  if (!IsNull(body, "temperature")) {
    auto t = NumberField(body["temperature"], "temperature");
    if (!t.ok()) return t.status();
    if (*t < 0) return FieldError("temperature", absl::StrCat("temperature must be >= 0, got ", *t));
    // drt.v1 takes a float: one beyond its range would become inf.
    if (!std::isfinite(static_cast<float>(*t))) {
      return FieldError("temperature", absl::StrCat("temperature must be at most ",
                                                    std::numeric_limits<float>::max(), ", got ", *t));
    }
    sampling.set_temperature(static_cast<float>(*t));
  }
  if (!IsNull(body, "top_p")) {
    auto p = NumberField(body["top_p"], "top_p");
    if (!p.ok()) return p.status();
    if (!(*p > 0 && *p <= 1)) return FieldError("top_p", absl::StrCat("top_p must be in (0, 1], got ", *p));
    // drt.v1 takes a float, whose 0 means "off": a top_p below the smallest
    // positive float would become 0 and turn near-greedy into full sampling.
    if (static_cast<float>(*p) == 0.0f) {
      return FieldError("top_p", absl::StrCat("top_p must be at least ",
                                              std::numeric_limits<float>::denorm_min(),
                                              " (the smallest positive float), got ", *p));
    }
    sampling.set_top_p(static_cast<float>(*p));
  }
  if (!IsNull(body, "top_k")) {
    // vLLM's extension: -1 (or 0) turns it off.
    auto k = IntField(body["top_k"], "top_k", -1, std::numeric_limits<int32_t>::max());
    if (!k.ok()) return k.status();
    sampling.set_top_k(*k < 0 ? 0 : static_cast<int32_t>(*k));
  }
  if (!IsNull(body, "seed")) {
    const Json& seed = body["seed"];
    if (seed.is_number_unsigned()) {
      sampling.set_seed(seed.get<uint64_t>());
    } else if (seed.is_number_integer()) {
      // A negative seed is a seed too: its two's complement bits.
      sampling.set_seed(static_cast<uint64_t>(seed.get<int64_t>()));
    } else {
      return FieldError("seed", absl::StrCat("seed must be an integer, got ", Dump(seed)));
    }
    out.seed_given = true;
  }
  return absl::OkStatus();
}

// A number in [lo, hi] for `field`, or FieldError naming it.
absl::StatusOr<float> RangedFloat(const Json& value, const char* field, double lo, double hi) {
  auto v = NumberField(value, field);
  if (!v.ok()) return v.status();
  if (!(*v >= lo && *v <= hi)) {
    return FieldError(field, absl::StrCat(field, " must be in [", lo, ", ", hi, "], got ", *v));
  }
  return static_cast<float>(*v);
}

// OpenAI's penalties and logit_bias, vLLM's min_p, onto drt.v1's sampling
// fields (the service checks logit_bias's ids against the vocabulary).
// repetition_penalty (vLLM's) stays refused: it counts the prompt's tokens,
// which the server does not keep as ids.
absl::Status ParseSamplingControls(const Json& body, CompletionRequest& out) {
  drt::v1::SamplingParams& sampling = *out.generate.mutable_sampling();
  if (!IsNull(body, "presence_penalty")) {
    auto p = RangedFloat(body["presence_penalty"], "presence_penalty", -kMaxPenalty, kMaxPenalty);
    if (!p.ok()) return p.status();
    sampling.set_presence_penalty(*p);
  }
  if (!IsNull(body, "frequency_penalty")) {
    auto f = RangedFloat(body["frequency_penalty"], "frequency_penalty", -kMaxPenalty, kMaxPenalty);
    if (!f.ok()) return f.status();
    sampling.set_frequency_penalty(*f);
  }
  if (!IsNull(body, "min_p")) {  // vLLM's extension
    auto m = RangedFloat(body["min_p"], "min_p", 0.0, 1.0);
    if (!m.ok()) return m.status();
    sampling.set_min_p(*m);
  }
  if (!IsNull(body, "repetition_penalty")) {
    const Json& r = body["repetition_penalty"];
    if (!(r.is_number() && r.get<double>() == 1.0)) {
      return FieldError("repetition_penalty",
                        absl::StrCat("repetition_penalty is not supported (only 1), got ", Dump(r),
                                     ": it counts the prompt's tokens, which drt-server does not "
                                     "keep; presence_penalty and frequency_penalty count the "
                                     "generated ones"));
    }
  }
  if (!IsNull(body, "logit_bias")) {
    const Json& bias = body["logit_bias"];
    if (!bias.is_object()) {
      return FieldError("logit_bias", absl::StrCat("logit_bias must be an object of token id -> "
                                                   "bias, got ", bias.type_name()));
    }
    if (bias.size() > static_cast<size_t>(kMaxLogitBiasEntries)) {
      return FieldError("logit_bias", absl::StrCat("logit_bias has ", bias.size(),
                                                   " entries; at most ", kMaxLogitBiasEntries,
                                                   " are allowed (OpenAI's limit)"));
    }
    auto& map = *sampling.mutable_logit_bias();
    for (const auto& [key, value] : bias.items()) {
      // Digits only (SimpleAtoi alone would take "+5" and " 5 " too).
      // No leading zero either: "1", "01" and "001" would all be id 1, and
      // the object (its keys kept sorted) would keep the value of whichever
      // sorts last, not the one the client wrote last. One spelling per id
      // leaves one entry per id.
      const bool digits = !key.empty() && key.size() <= 10 &&
                          std::all_of(key.begin(), key.end(),
                                      [](char c) { return absl::ascii_isdigit(c); }) &&
                          !(key.size() > 1 && key[0] == '0');
      int32_t id = 0;
      if (!digits || !absl::SimpleAtoi(key, &id)) {
        return FieldError("logit_bias", absl::StrCat("logit_bias keys must be token ids (decimal "
                                                     "integers >= 0 with no leading zero), got \"",
                                                     key, "\""));
      }
      if (!value.is_number() || !std::isfinite(value.get<double>()) ||
          std::fabs(value.get<double>()) > kMaxLogitBias) {
        return FieldError("logit_bias", absl::StrCat("logit_bias for token ", key,
                                                     " must be a number in [-100, 100], got ",
                                                     Dump(value)));
      }
      map[id] = static_cast<float>(value.get<double>());
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool NestsDeeperThan(absl::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

absl::Status FieldError(absl::string_view field, absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kParamPayload, absl::Cord(field));
  return status;
}

std::string OpenAiErrorParam(const absl::Status& status) {
  auto param = status.GetPayload(kParamPayload);
  return param.has_value() ? std::string(*param) : std::string();
}

absl::Status ServiceStatus(absl::StatusCode code, absl::string_view message) {
  // The parser checks every other field before the call; logit_bias's ids
  // only the service can check (against the model's vocabulary and its
  // landmark and pad ids), and its refusal starts with the field's name
  // (engine/sampler.cc, ValidateLogitBiasIds).
  if (code == absl::StatusCode::kInvalidArgument && absl::StartsWith(message, "logit_bias ")) {
    return FieldError("logit_bias", message);
  }
  // The parser checks n against [1, 16]; against --max_sessions only the
  // service can, and its refusal starts with the field's name
  // (drt_service.cc, CompleteStream).
  if (code == absl::StatusCode::kInvalidArgument && absl::StartsWith(message, "n must be ")) {
    return FieldError("n", message);
  }
  return absl::Status(code, message);
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body_text) {
  if (NestsDeeperThan(body_text, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(absl::StrCat("the request body nests deeper than ",
                                                   kMaxJsonDepth, " levels"));
  }
  Json body;
  try {
    body = Json::parse(body_text.begin(), body_text.end());
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number such as 1e999
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is not valid JSON: ", e.what()));
  }
  if (!body.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("the request body must be a JSON object, got ",
                                                   body.type_name()));
  }
  CompletionRequest out;
  if (absl::Status s = ParsePrompt(body, out); !s.ok()) return s;
  if (absl::Status s = RefuseUnsupported(body); !s.ok()) return s;
  if (!IsNull(body, "echo")) {
    auto b = BoolField(body["echo"], "echo");
    if (!b.ok()) return b.status();
    out.echo = *b;
  }
  out.generate.set_max_tokens(kOpenAiDefaultMaxTokens);
  if (!IsNull(body, "max_tokens")) {
    // 0 only with echo: the prompt's text and scores, nothing generated.
    auto n = IntField(body["max_tokens"], "max_tokens", out.echo ? 0 : 1, kMaxTokens);
    if (!n.ok()) {
      if (!out.echo && body["max_tokens"].is_number_integer() && body["max_tokens"] == 0) {
        return FieldError("max_tokens",
                          absl::StrCat("max_tokens must be an integer in [1, ", kMaxTokens,
                                       "], got 0 (0 only with echo: the prompt's scores, "
                                       "nothing generated)"));
      }
      return n.status();
    }
    out.generate.set_max_tokens(static_cast<int32_t>(*n));
    out.prompt_only = *n == 0;
  }
  if (absl::Status s = ParseSampling(body, out); !s.ok()) return s;
  if (absl::Status s = ParseSamplingControls(body, out); !s.ok()) return s;
  if (absl::Status s = ParseStop(body, out); !s.ok()) return s;
  if (!IsNull(body, "n")) {
    // A whole number as a float (2.0) too, as vLLM's lax parsing takes it.
    const Json& v = body["n"];
    Json whole = v;
    if (v.is_number_float() && std::isfinite(v.get<double>()) &&
        v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 1e9) {
      whole = static_cast<int64_t>(v.get<double>());
    }
    auto n = IntField(whole, "n", 1, kMaxCompleteChoices);
    if (!n.ok()) {
      return FieldError("n", absl::StrCat(n.status().message(), " (the most choices one request "
                                          "makes: each is a session of --max_sessions)"));
    }
    out.n = static_cast<int32_t>(*n);
  }
  if (!IsNull(body, "logprobs")) {
    auto n = IntField(body["logprobs"], "logprobs", 0, kOpenAiMaxLogprobs);
    if (!n.ok()) return n.status();
    out.logprobs = static_cast<int32_t>(*n);
    out.generate.set_return_logprobs(true);
    out.generate.set_top_logprobs(std::max<int32_t>(1, *out.logprobs));
  }
  if (!IsNull(body, "prompt_logprobs")) {  // vLLM's extension
    auto n = IntField(body["prompt_logprobs"], "prompt_logprobs", 0, kOpenAiMaxLogprobs);
    if (!n.ok()) return n.status();
    out.prompt_logprobs = static_cast<int32_t>(*n);
  }
  if (!IsNull(body, "include_stop_str_in_output")) {  // vLLM's extension
    auto b = BoolField(body["include_stop_str_in_output"], "include_stop_str_in_output");
    if (!b.ok()) return b.status();
    out.include_stop_str = *b;
  }
  if (!IsNull(body, "ignore_eos")) {  // vLLM's extension
    auto b = BoolField(body["ignore_eos"], "ignore_eos");
    if (!b.ok()) return b.status();
    out.generate.set_ignore_eos(*b);
  }
  if (!IsNull(body, "model")) {
    if (!body["model"].is_string()) {
      return FieldError("model", absl::StrCat("model must be a string, got ", body["model"].type_name()));
    }
    out.model = body["model"].get<std::string>();
  }
  if (!IsNull(body, "stream")) {
    auto b = BoolField(body["stream"], "stream");
    if (!b.ok()) return b.status();
    out.stream = *b;
  }
  if (out.stream && out.prompt_logprobs.has_value()) {
    return FieldError("prompt_logprobs", "prompt_logprobs is not available with \"stream\": true "
                                         "(as vLLM's); ask without stream");
  }
  if (out.stream && !out.more_prompts.empty()) {
    return FieldError("stream", absl::StrCat("stream is not supported with a batch of ",
                                             1 + out.more_prompts.size(),
                                             " prompts (send one streamed request per prompt, "
                                             "or the batch without stream)"));
  }
  if (!IsNull(body, "stream_options")) {
    const Json& options = body["stream_options"];
    if (!out.stream) {
      return FieldError("stream_options", "stream_options is only allowed with \"stream\": true");
    }
    if (!options.is_object()) {
      return FieldError("stream_options", absl::StrCat("stream_options must be an object, got ",
                                                       options.type_name()));
    }
    if (!IsNull(options, "include_usage")) {
      auto b = BoolField(options["include_usage"], "stream_options.include_usage");
      if (!b.ok()) return b.status();
      out.include_usage = *b;
    }
  }
  return out;
}

std::vector<CompletionRequest> SplitBatch(CompletionRequest request) {
  std::vector<PromptInput> more = std::move(request.more_prompts);
  request.more_prompts.clear();
  std::vector<CompletionRequest> out;
  out.reserve(1 + more.size());
  out.push_back(request);
  for (PromptInput& prompt : more) {
    CompletionRequest& item = out.emplace_back(request);
    item.prompt_text = std::move(prompt.text);
    item.prompt_ids = std::move(prompt.ids);
    item.prompt_is_ids = prompt.is_ids;
  }
  return out;
}

std::vector<drt::v1::CompleteRequest> CompleteMessages(const CompletionRequest& request) {
  std::vector<drt::v1::CompleteRequest> messages(1);
  *messages[0].mutable_generate() = request.generate;
  if (request.n > 1) messages[0].set_n(request.n);
  // The prompt's scores for echo's logprobs entries and for vLLM's
  // prompt_logprobs only: a token-id prompt's text is spelled by Detokenize
  // (SpellPromptIds), not from scores, so echo without logprobs costs no
  // scoring (about 3.3x the prefill). At least 1 alternative: the events
  // carry each token's bytes only beside alternatives.
  std::optional<int32_t> scores;
  if (request.echo && request.logprobs.has_value()) scores = std::max<int32_t>(1, *request.logprobs);
  if (request.prompt_logprobs.has_value()) {
    scores = std::max<int32_t>({1, scores.value_or(1), *request.prompt_logprobs});
  }
  if (scores.has_value()) messages[0].set_prompt_logprobs(*scores);
  if (request.echo) messages[0].set_prompt_only(request.prompt_only);
  if (request.prompt_is_ids) {
    for (size_t at = 0; at < request.prompt_ids.size(); at += kPromptPieceIds) {
      const size_t n = std::min(kPromptPieceIds, request.prompt_ids.size() - at);
      drt::v1::CompleteRequest& m = messages.emplace_back();
      m.mutable_tokens()->mutable_ids()->Add(request.prompt_ids.begin() + at,
                                             request.prompt_ids.begin() + at + n);
    }
  } else {
    // text_bytes: a piece may end inside a UTF-8 character, which the next
    // completes; the server tokenizes the pieces as if they came whole.
    for (size_t at = 0; at < request.prompt_text.size(); at += kPromptPieceBytes) {
      messages.emplace_back().set_text_bytes(request.prompt_text.substr(at, kPromptPieceBytes));
    }
  }
  return messages;
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

std::string ErrorJson(absl::string_view message, absl::string_view type, absl::string_view param,
                      absl::string_view code) {
  Json error = {{"message", std::string(message)},
                {"type", std::string(type)},
                {"param", nullptr},
                {"code", nullptr}};
  if (!param.empty()) error["param"] = std::string(param);
  if (!code.empty()) error["code"] = std::string(code);
  return Dump(Json{{"error", std::move(error)}});
}

std::string ErrorJson(const absl::Status& status) {
  const int http = HttpStatusFor(status.code());
  const char* type = http == 401   ? "authentication_error"
                     : http == 429 ? "rate_limit_error"
                     : http >= 500 ? "server_error"
                                   : "invalid_request_error";
  return ErrorJson(status.message(), type, OpenAiErrorParam(status),
                   absl::AsciiStrToLower(GrpcCodeName(static_cast<grpc::StatusCode>(status.code()))));
}

std::string FinishReasonName(drt::v1::FinishReason reason) {
  switch (reason) {
    case drt::v1::FINISH_REASON_END_OF_TEXT:
    case drt::v1::FINISH_REASON_STOP_SEQUENCE: return "stop";
    case drt::v1::FINISH_REASON_LENGTH: return "length";
    default: return "abort";
  }
}

namespace {

OJson Header(const CompletionHeader& header) {
  return {{"id", header.id},
          {"object", "text_completion"},
          {"created", header.created},
          {"model", header.model}};
}

OJson UsageJson(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

OJson LogprobsJson(const ChoiceLogprobs& entries) {
  OJson tokens = OJson::array(), token_logprobs = OJson::array(), top = OJson::array(),
        offsets = OJson::array();
  for (const TokenLogprobEntry& entry : entries) {
    tokens.push_back(entry.token);
    offsets.push_back(entry.text_offset);
    if (entry.unscored) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(entry.logprob);
    OJson alternatives = OJson::object();
    for (const auto& [text, logprob] : entry.top) {
      if (!alternatives.contains(text)) alternatives[text] = logprob;
    }
    top.push_back(std::move(alternatives));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

OJson Choice(absl::string_view text, std::optional<absl::string_view> finish_reason,
             const ChoiceLogprobs* logprobs, int32_t index = 0) {
  OJson choice = {{"text", std::string(text)},
                  {"index", index},
                  {"logprobs", nullptr},
                  {"finish_reason", nullptr}};
  if (logprobs != nullptr) choice["logprobs"] = LogprobsJson(*logprobs);
  if (finish_reason.has_value()) choice["finish_reason"] = std::string(*finish_reason);
  return choice;
}

}  // namespace

std::string CompletionJson(const CompletionHeader& header, absl::string_view text,
                           absl::string_view finish_reason, const Usage& usage,
                           const ChoiceLogprobs* logprobs) {
  OJson json = Header(header);
  json["choices"] = OJson::array({Choice(text, finish_reason, logprobs)});
  json["usage"] = UsageJson(usage);
  return Dump(json);
}

std::string CompletionJson(const CompletionHeader& header,
                           const std::vector<CompletionChoice>& choices, const Usage& usage) {
  OJson json = Header(header);
  json["choices"] = OJson::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const CompletionChoice& c = choices[i];
    OJson choice = Choice(c.text, c.finish_reason, c.logprobs.has_value() ? &*c.logprobs : nullptr,
                          static_cast<int32_t>(i));
    if (c.prompt_logprobs_json.has_value()) {
      choice["prompt_logprobs"] = OJson::parse(*c.prompt_logprobs_json);
    }
    json["choices"].push_back(std::move(choice));
  }
  json["usage"] = UsageJson(usage);
  return Dump(json);
}

std::string CompletionChunkJson(const CompletionHeader& header, absl::string_view text,
                                std::optional<absl::string_view> finish_reason,
                                const ChoiceLogprobs* logprobs, int32_t index) {
  OJson json = Header(header);
  json["choices"] = OJson::array({Choice(text, finish_reason, logprobs, index)});
  return Dump(json);
}

std::string UsageChunkJson(const CompletionHeader& header, const Usage& usage) {
  OJson json = Header(header);
  json["choices"] = OJson::array();
  json["usage"] = UsageJson(usage);
  return Dump(json);
}

std::string OpenAiTokenText(absl::string_view bytes) {
  if (IsWholeUtf8(bytes)) return std::string(bytes);
  std::string out = "bytes:";
  for (const char c : bytes) {
    absl::StrAppend(&out, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
  }
  return out;
}

absl::Status LogprobsCollector::Add(const drt::v1::GeneratedPiece& piece) {
  const int tokens = piece.token_ids_size();
  if (piece.logprobs_size() != tokens || piece.top_logprobs_size() != tokens) {
    return absl::InternalError(absl::StrCat(
        "Complete sent a piece of ", tokens, " tokens with ", piece.logprobs_size(),
        " logprobs and ", piece.top_logprobs_size(), " top_logprobs"));
  }
  for (int i = 0; i < tokens; ++i) {
    const drt::v1::TokenTopLogprobs& top = piece.top_logprobs(i);
    const std::string& bytes = top.token_bytes();
    TokenLogprobEntry entry;
    entry.token = OpenAiTokenText(bytes);
    entry.logprob = piece.logprobs(i);
    entry.text_offset = Advance(bytes);
    bool chosen_listed = false;
    for (int j = 0; j < std::min(top_, top.alternatives_size()); ++j) {
      const drt::v1::TokenLogprob& alternative = top.alternatives(j);
      entry.top.emplace_back(OpenAiTokenText(alternative.token_bytes()), alternative.logprob());
      chosen_listed |= alternative.token_id() == piece.token_ids(i);
    }
    if (!chosen_listed) entry.top.emplace_back(entry.token, entry.logprob);
    pending_.push_back(std::move(entry));
  }
  return absl::OkStatus();
}

absl::Status LogprobsCollector::AddPrompt(const drt::v1::PromptLogprobs& scores) {
  const int tokens = scores.token_ids_size();
  if (scores.logprobs_size() != tokens || scores.top_logprobs_size() != tokens) {
    return absl::InternalError(absl::StrCat(
        "Complete sent prompt scores of ", tokens, " tokens with ", scores.logprobs_size(),
        " logprobs and ", scores.top_logprobs_size(), " top_logprobs"));
  }
  for (int i = 0; i < tokens; ++i) {
    const drt::v1::TokenTopLogprobs& top = scores.top_logprobs(i);
    TokenLogprobEntry entry;
    entry.token = OpenAiTokenText(top.token_bytes());
    entry.text_offset = Advance(top.token_bytes());
    entry.logprob = scores.logprobs(i);
    if (std::isnan(entry.logprob)) {
      entry.unscored = true;
      pending_.push_back(std::move(entry));
      continue;
    }
    bool chosen_listed = false;
    for (int j = 0; j < std::min(top_, top.alternatives_size()); ++j) {
      const drt::v1::TokenLogprob& alternative = top.alternatives(j);
      entry.top.emplace_back(OpenAiTokenText(alternative.token_bytes()), alternative.logprob());
      chosen_listed |= alternative.token_id() == scores.token_ids(i);
    }
    if (!chosen_listed) entry.top.emplace_back(entry.token, entry.logprob);
    pending_.push_back(std::move(entry));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PromptLogprobsJson(const std::vector<drt::v1::PromptLogprobs>& events,
                                               int32_t top) {
  OJson list = OJson::array();
  for (const drt::v1::PromptLogprobs& scores : events) {
    const int tokens = scores.token_ids_size();
    if (scores.logprobs_size() != tokens || scores.top_logprobs_size() != tokens) {
      return absl::InternalError(absl::StrCat(
          "Complete sent prompt scores of ", tokens, " tokens with ", scores.logprobs_size(),
          " logprobs and ", scores.top_logprobs_size(), " top_logprobs"));
    }
    for (int i = 0; i < tokens; ++i) {
      const float logprob = scores.logprobs(i);
      if (std::isnan(logprob)) {
        list.push_back(nullptr);
        continue;
      }
      const drt::v1::TokenTopLogprobs& alternatives = scores.top_logprobs(i);
      const int32_t id = scores.token_ids(i);
      OJson token = OJson::object();
      // The token itself first, its rank filled in if it is among the
      // alternatives below.
      token[std::to_string(id)] = {{"logprob", logprob},
                                   {"rank", nullptr},
                                   {"decoded_token", OpenAiTokenText(alternatives.token_bytes())}};
      for (int j = 0; j < std::min(top, alternatives.alternatives_size()); ++j) {
        const drt::v1::TokenLogprob& alternative = alternatives.alternatives(j);
        const std::string key = std::to_string(alternative.token_id());
        if (alternative.token_id() == id) {
          token[key]["rank"] = j + 1;
          continue;
        }
        token[key] = {{"logprob", alternative.logprob()},
                      {"rank", j + 1},
                      {"decoded_token", OpenAiTokenText(alternative.token_bytes())}};
      }
      list.push_back(std::move(token));
    }
  }
  return Dump(list);
}

std::string SpellTokenBytes(const std::vector<std::string>& pieces) {
  Utf8Streamer utf8;
  std::string text;
  for (const std::string& bytes : pieces) text += utf8.Push(bytes);
  return text + utf8.Flush();
}

int64_t LogprobsCollector::Advance(absl::string_view bytes) {
  // The text's own walk (Utf8Streamer::Push): characters read from the held
  // bytes plus this token's, each invalid maximal subpart one U+FFFD, a
  // truncated tail held for the next token.
  const size_t start = held_.size();
  held_.append(bytes.data(), bytes.size());
  std::optional<int64_t> offset;
  size_t pos = 0;
  while (pos < held_.size()) {
    const Utf8Char c = ReadUtf8Char(std::string_view(held_).substr(pos));
    // The character (or U+FFFD) that holds the token's first byte.
    if (!offset.has_value() && pos + c.length > start) offset = characters_;
    if (c.kind == Utf8Char::Kind::kTruncated) break;
    ++characters_;
    pos += c.length;
  }
  held_.erase(0, pos);
  // (No bytes: the token sits after every character read so far.)
  return offset.value_or(characters_);
}

ChoiceLogprobs LogprobsCollector::Take() { return std::exchange(pending_, {}); }

std::string ModelsJson(const drt::v1::ModelInfo& info, int64_t created) {
  Json model = {{"id", info.name()},
                {"object", "model"},
                {"created", created},
                {"owned_by", "drt-server"},
                {"max_model_len", info.max_context_tokens()}};
  return Dump(Json{{"object", "list"}, {"data", Json::array({std::move(model)})}});
}

std::string SseEvent(absl::string_view payload) { return absl::StrCat("data: ", payload, "\n\n"); }

}  // namespace drt::server

// The OpenAI API's pure translation (server/openai_api.h) and the stop-string
// cutter (server/stop_text_cutter.h): every refusal names its field, the
// defaults are OpenAI's, the prompt becomes Complete messages, the JSON
// answers have OpenAI's shape; the streamed cut equals a naive cut of the
// whole text however the text is split, and no piece splits a character.
#include <catch2/catch.hpp>

#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

#include "server/openai_api.h"
#include "server/stop_text_cutter.h"

namespace drt::server {
namespace {

using Json = nlohmann::json;

// The field a refused body is refused for ("" when it is accepted).
std::string RefusedField(const std::string& body) {
  auto parsed = ParseCompletionRequest(body);
  if (parsed.ok()) return "";
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  return OpenAiErrorParam(parsed.status());
}

TEST_CASE("openai request: defaults are OpenAI's", "[openai]") {
  auto r = ParseCompletionRequest(R"({"prompt":"hello"})");
  REQUIRE(r.ok());
  CHECK(r->prompt_text == "hello");
  CHECK_FALSE(r->prompt_is_ids);
  CHECK(r->generate.max_tokens() == 16);
  CHECK(r->generate.sampling().temperature() == 1.0f);
  CHECK(r->generate.sampling().top_p() == 1.0f);
  CHECK(r->generate.sampling().top_k() == 0);
  CHECK_FALSE(r->seed_given);
  CHECK_FALSE(r->stream);
  CHECK_FALSE(r->include_usage);
  CHECK_FALSE(r->model.has_value());
  CHECK(r->generate.stop_size() == 0);
}

TEST_CASE("openai request: nesting deeper than 64 levels is refused before parsing", "[openai]") {
  // A nest of n levels in an ignored field: the body's object is level 1.
  auto nest = [](int levels) {
    return "{\"prompt\":\"a\",\"x\":" + std::string(levels - 1, '[') +
           std::string(levels - 1, ']') + "}";
  };
  CHECK(ParseCompletionRequest(nest(kMaxJsonDepth)).ok());
  CHECK(ParseCompletionRequest(R"({"prompt":"a","x":[{"y":[{}]},[[]]]})").ok());
  for (const std::string& body : {nest(kMaxJsonDepth + 1),
                                  // objects count too
                                  "{\"prompt\":\"a\",\"x\":" + std::string(70, '{'),
                                  // not closed: refused for its depth, not its syntax
                                  "{\"x\":" + std::string(100'000, '[')}) {
    auto r = ParseCompletionRequest(body);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(r.status().message() == "the request body nests deeper than 64 levels");
  }
  // Brackets inside strings (escaped quotes too) are text, not nesting.
  auto in_string =
      ParseCompletionRequest("{\"prompt\":\"\\\"" + std::string(100, '[') + "\\\\\",\"x\":[[1]]}");
  REQUIRE(in_string.ok());
  CHECK(in_string->prompt_text == "\"" + std::string(100, '[') + "\\");
}

TEST_CASE("openai request: fields map onto drt.v1", "[openai]") {
  auto r = ParseCompletionRequest(R"({"prompt":["one"],"max_tokens":7,"temperature":0,
      "top_p":0.5,"top_k":40,"seed":-1,"stop":["a","bc"],"stream":true,
      "stream_options":{"include_usage":true},"model":"m","n":1,"best_of":1,"echo":false,
      "logprobs":null,"suffix":null,"logit_bias":{},"presence_penalty":0,
      "frequency_penalty":0.0,"user":"u","ignore_eos":true,"some_extra_field":[1,2]})");
  REQUIRE(r.ok());
  CHECK(r->prompt_text == "one");
  CHECK(r->generate.max_tokens() == 7);
  CHECK(r->generate.sampling().temperature() == 0.0f);
  CHECK(r->generate.sampling().top_p() == 0.5f);
  CHECK(r->generate.sampling().top_k() == 40);
  CHECK(r->seed_given);
  CHECK(r->generate.sampling().seed() == ~uint64_t{0});  // -1's bits
  REQUIRE(r->generate.stop_size() == 2);
  CHECK(r->generate.stop(1) == "bc");
  CHECK(r->stream);
  CHECK(r->include_usage);
  CHECK(r->model == "m");
  CHECK(r->generate.ignore_eos());
  // vLLM's top_k -1 is "off".
  auto off = ParseCompletionRequest(R"({"prompt":"x","top_k":-1,"stop":"z"})");
  REQUIRE(off.ok());
  CHECK(off->generate.sampling().top_k() == 0);
  CHECK(off->generate.stop_size() == 1);
}

TEST_CASE("openai request: penalties, min_p and logit_bias map onto drt.v1", "[openai]") {
  auto r = ParseCompletionRequest(R"({"prompt":"x","presence_penalty":-2,"frequency_penalty":1.5,
      "min_p":0.05,"logit_bias":{"10":-100,"0":2.5,"259":100},"repetition_penalty":1})");
  REQUIRE(r.ok());
  const drt::v1::SamplingParams& s = r->generate.sampling();
  CHECK(s.presence_penalty() == -2.f);
  CHECK(s.frequency_penalty() == 1.5f);
  CHECK(s.min_p() == 0.05f);
  REQUIRE(s.logit_bias().size() == 3);
  CHECK(s.logit_bias().at(10) == -100.f);
  CHECK(s.logit_bias().at(0) == 2.5f);
  CHECK(s.logit_bias().at(259) == 100.f);
  // Unset or null: off (0, and no bias).
  auto plain = ParseCompletionRequest(R"({"prompt":"x","logit_bias":null,"min_p":null})");
  REQUIRE(plain.ok());
  CHECK(plain->generate.sampling().presence_penalty() == 0.f);
  CHECK(plain->generate.sampling().min_p() == 0.f);
  CHECK(plain->generate.sampling().logit_bias().empty());
  // OpenAI's limit of 300 entries.
  std::string bias = R"({"prompt":"x","logit_bias":{)";
  for (int i = 0; i < 300; ++i) bias += (i ? "," : "") + ("\"" + std::to_string(i) + "\":1");
  auto at_limit = ParseCompletionRequest(bias + "}}");
  REQUIRE(at_limit.ok());
  CHECK(at_limit->generate.sampling().logit_bias().size() == 300);
  auto over = ParseCompletionRequest(bias + R"(,"300":1}})");
  REQUIRE_FALSE(over.ok());
  CHECK(OpenAiErrorParam(over.status()) == "logit_bias");
  CHECK(std::string(over.status().message()).find("at most 300") != std::string::npos);
  // repetition_penalty's refusal says why.
  auto rep = ParseCompletionRequest(R"({"prompt":"x","repetition_penalty":1.2})");
  REQUIRE_FALSE(rep.ok());
  CHECK(std::string(rep.status().message()).find("counts the prompt") != std::string::npos);
}

TEST_CASE("openai request: token id prompts", "[openai]") {
  auto r = ParseCompletionRequest(R"({"prompt":[1,2,255,0]})");
  REQUIRE(r.ok());
  CHECK(r->prompt_is_ids);
  CHECK(r->prompt_ids == std::vector<int32_t>{1, 2, 255, 0});
}

TEST_CASE("openai request: an array of one id array is one prompt, as lm-eval sends it",
          "[openai]") {
  auto r = ParseCompletionRequest(R"({"prompt":[[84,104,101,32]],"max_tokens":1,"echo":true,
      "logprobs":1,"temperature":0,"seed":1234})");
  REQUIRE(r.ok());
  CHECK(r->prompt_is_ids);
  CHECK(r->prompt_ids == std::vector<int32_t>{84, 104, 101, 32});
  CHECK(r->more_prompts.empty());
  CHECK(SplitBatch(*r).size() == 1);
}

TEST_CASE("openai request: a batch splits into one request per prompt in order", "[openai]") {
  auto ids = ParseCompletionRequest(R"({"prompt":[[1,2],[3],[4,5,6]],"max_tokens":3,"n":2,
      "echo":true,"logprobs":2,"stop":["x"],"seed":9})");
  REQUIRE(ids.ok());
  const std::vector<CompletionRequest> items = SplitBatch(*ids);
  REQUIRE(items.size() == 3);
  const std::vector<std::vector<int32_t>> want = {{1, 2}, {3}, {4, 5, 6}};
  for (size_t i = 0; i < items.size(); ++i) {
    INFO("prompt " << i);
    CHECK(items[i].prompt_is_ids);
    CHECK(items[i].prompt_ids == want[i]);
    CHECK(items[i].more_prompts.empty());
    // The request's options, each.
    CHECK(items[i].n == 2);
    CHECK(items[i].echo);
    CHECK(items[i].logprobs == 2);
    CHECK(items[i].generate.max_tokens() == 3);
    CHECK(items[i].generate.stop_size() == 1);
    CHECK(items[i].generate.sampling().seed() == 9);
  }
  auto texts = ParseCompletionRequest(R"({"prompt":["a","bc"]})");
  REQUIRE(texts.ok());
  const std::vector<CompletionRequest> text_items = SplitBatch(*texts);
  REQUIRE(text_items.size() == 2);
  CHECK(text_items[0].prompt_text == "a");
  CHECK(text_items[1].prompt_text == "bc");
  CHECK_FALSE(text_items[1].prompt_is_ids);
}

TEST_CASE("openai request: a batch over 128 prompts is refused naming prompt", "[openai]") {
  Json body = {{"prompt", Json::array()}};
  for (size_t i = 0; i < kMaxBatchPrompts; ++i) body["prompt"].push_back(Json::array({1, 2}));
  CHECK(ParseCompletionRequest(body.dump()).ok());
  body["prompt"].push_back(Json::array({1, 2}));
  auto refused = ParseCompletionRequest(body.dump());
  REQUIRE_FALSE(refused.ok());
  CHECK(OpenAiErrorParam(refused.status()) == "prompt");
  CHECK(std::string(refused.status().message()) ==
        "prompt: a batch of 129 prompts; at most 128 are run per request (send the rest in "
        "another)");
}

TEST_CASE("openai request: vLLM's extensions at their neutral values are taken", "[openai]") {
  auto r = ParseCompletionRequest(R"({"prompt":"x","use_beam_search":false,"stop_token_ids":[],
      "min_tokens":0,"include_stop_str_in_output":false,"prompt_logprobs":null})");
  REQUIRE(r.ok());
  CHECK_FALSE(r->prompt_logprobs.has_value());
  CHECK_FALSE(r->include_stop_str);
  CHECK_FALSE(CompleteMessages(*r)[0].has_prompt_logprobs());
  auto scored = ParseCompletionRequest(R"({"prompt":"x","prompt_logprobs":0,
      "include_stop_str_in_output":true})");
  REQUIRE(scored.ok());
  CHECK(scored->prompt_logprobs == 0);
  CHECK(scored->include_stop_str);
  // Complete scores the prompt, with 1 alternative at least (the events
  // carry each token's bytes beside them), without echo.
  const drt::v1::CompleteRequest first = CompleteMessages(*scored)[0];
  REQUIRE(first.has_prompt_logprobs());
  CHECK(first.prompt_logprobs() == 1);
  CHECK_FALSE(first.prompt_only());
  // With echo's logprobs the larger of the two.
  auto both = ParseCompletionRequest(R"({"prompt":"x","prompt_logprobs":3,"echo":true,
      "logprobs":5})");
  REQUIRE(both.ok());
  CHECK(CompleteMessages(*both)[0].prompt_logprobs() == 5);
}

TEST_CASE("openai request: up to 64 stop strings, more refused naming stop", "[openai]") {
  // lm-eval's generate_until: a task's 4 `until` strings and the eos string.
  auto five = ParseCompletionRequest(R"({"prompt":"x","stop":["a","b","c","d","<|endoftext|>"]})");
  REQUIRE(five.ok());
  CHECK(five->generate.stop_size() == 5);
  Json body = {{"prompt", "x"}, {"stop", Json::array()}};
  for (size_t i = 0; i < kMaxStops; ++i) body["stop"].push_back(absl::StrCat("s", i));
  auto most = ParseCompletionRequest(body.dump());
  REQUIRE(most.ok());
  CHECK(most->generate.stop_size() == 64);
  body["stop"].push_back("one more");
  auto refused = ParseCompletionRequest(body.dump());
  REQUIRE_FALSE(refused.ok());
  CHECK(OpenAiErrorParam(refused.status()) == "stop");
  CHECK(std::string(refused.status().message()) == "stop takes at most 64 strings, got 65");
}

TEST_CASE("openai request: every refusal names its field", "[openai]") {
  // Each body differs from an accepted one in one field.
  REQUIRE(RefusedField(R"({"prompt":"x"})").empty());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({})", "prompt"},
      {R"({"prompt":null})", "prompt"},
      {R"({"prompt":""})", "prompt"},
      {R"({"prompt":[]})", "prompt"},
      // Batches: all strings or all id arrays, none empty, at most 128.
      {R"({"prompt":["a",[1]]})", "prompt"},
      {R"({"prompt":[[1],"a"]})", "prompt"},
      {R"({"prompt":[[1],[]]})", "prompt"},
      {R"({"prompt":["a",""]})", "prompt"},
      {R"({"prompt":[[1],[2,-1]]})", "prompt"},
      {R"({"prompt":[[[1]]]})", "prompt"},
      {R"({"prompt":["a","b"],"stream":true})", "stream"},
      {R"({"prompt":[1,-2]})", "prompt"},
      {R"({"prompt":[1,2.5]})", "prompt"},
      {R"({"prompt":[1,"a"]})", "prompt"},
      {R"({"prompt":[1,4294967296]})", "prompt"},
      {R"({"prompt":7})", "prompt"},
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":-3})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":1048577})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":2.5})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":"16"})", "max_tokens"},
      {R"({"prompt":"x","temperature":-0.1})", "temperature"},
      {R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"prompt":"x","top_p":0})", "top_p"},
      {R"({"prompt":"x","top_p":1.5})", "top_p"},
      // Positive, but 0 as a float (drt.v1's "off"): near-greedy would
      // become full sampling.
      {R"({"prompt":"x","top_p":1e-50})", "top_p"},
      // inf as a float: the service's refusal would not name the field.
      {R"({"prompt":"x","temperature":1e39})", "temperature"},
      {R"({"prompt":"x","n":1.5})", "n"},
      {R"({"prompt":"x","n":"1"})", "n"},
      {R"({"prompt":"x","best_of":2.0})", "best_of"},
      {R"({"prompt":"x","top_k":-2})", "top_k"},
      {R"({"prompt":"x","top_k":1.5})", "top_k"},
      {R"({"prompt":"x","seed":1.5})", "seed"},
      {R"({"prompt":"x","stop":""})", "stop"},
      {R"({"prompt":"x","stop":[1]})", "stop"},
      {R"({"prompt":"x","stop":5})", "stop"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
      {R"({"prompt":"x","stream_options":{"include_usage":true}})", "stream_options"},
      {R"({"prompt":"x","stream":true,"stream_options":[]})", "stream_options"},
      {R"({"prompt":"x","stream":true,"stream_options":{"include_usage":1}})",
       "stream_options.include_usage"},
      {R"({"prompt":"x","n":0})", "n"},
      {R"({"prompt":"x","n":17})", "n"},
      {R"({"prompt":"x","n":-3})", "n"},
      {R"({"prompt":"x","best_of":3})", "best_of"},
      {R"({"prompt":"x","logprobs":-1})", "logprobs"},
      {R"({"prompt":"x","logprobs":21})", "logprobs"},
      {R"({"prompt":"x","logprobs":true})", "logprobs"},
      {R"({"prompt":"x","logprobs":2.5})", "logprobs"},
      {R"({"prompt":"x","echo":"yes"})", "echo"},
      // max_tokens 0 only with echo (the prompt's scores, nothing generated).
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","echo":false,"max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","echo":true,"max_tokens":-1})", "max_tokens"},
      {R"({"prompt":"x","suffix":"end"})", "suffix"},
      {R"({"prompt":"x","logit_bias":{"5":100.5}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"5":"10"}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"a":1}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"-5":1}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"+5":1}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"99999999999":1}})", "logit_bias"},
      // One spelling per id: "01" would be id 1 too, and which of the two
      // values survived would depend on how the keys sort.
      {R"({"prompt":"x","logit_bias":{"01":1,"1":2}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"00":1}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":[5]})", "logit_bias"},
      {R"({"prompt":"x","presence_penalty":2.5})", "presence_penalty"},
      {R"({"prompt":"x","presence_penalty":"1"})", "presence_penalty"},
      {R"({"prompt":"x","frequency_penalty":-2.01})", "frequency_penalty"},
      {R"({"prompt":"x","min_p":1.5})", "min_p"},
      {R"({"prompt":"x","min_p":-0.1})", "min_p"},
      {R"({"prompt":"x","repetition_penalty":1.1})", "repetition_penalty"},
      // vLLM's extensions: refused unless neutral, or out of range.
      {R"({"prompt":"x","use_beam_search":true})", "use_beam_search"},
      {R"({"prompt":"x","use_beam_search":0})", "use_beam_search"},
      {R"({"prompt":"x","stop_token_ids":[5]})", "stop_token_ids"},
      {R"({"prompt":"x","stop_token_ids":5})", "stop_token_ids"},
      {R"({"prompt":"x","min_tokens":3})", "min_tokens"},
      {R"({"prompt":"x","min_tokens":"0"})", "min_tokens"},
      {R"({"prompt":"x","prompt_logprobs":21})", "prompt_logprobs"},
      {R"({"prompt":"x","prompt_logprobs":-1})", "prompt_logprobs"},
      {R"({"prompt":"x","prompt_logprobs":true})", "prompt_logprobs"},
      {R"({"prompt":"x","prompt_logprobs":1,"stream":true})", "prompt_logprobs"},
      {R"({"prompt":"x","include_stop_str_in_output":"yes"})", "include_stop_str_in_output"},
      {R"({"prompt":"x","model":3})", "model"},
      {R"({"prompt":"x","ignore_eos":"no"})", "ignore_eos"},
  };
  for (const auto& [body, field] : cases) {
    INFO(body);
    auto parsed = ParseCompletionRequest(body);
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(OpenAiErrorParam(parsed.status()) == field);
    // The message names the field too (param is for programs, the message for people).
    const std::string top = field.substr(0, field.find('.'));
    CHECK(std::string(parsed.status().message()).find(top) != std::string::npos);
  }
}

TEST_CASE("openai request: max_tokens 0 without echo says that 0 needs echo", "[openai]") {
  for (const char* body : {R"({"prompt":"x","max_tokens":0})",
                           R"({"prompt":"x","echo":false,"max_tokens":0})"}) {
    INFO(body);
    auto parsed = ParseCompletionRequest(body);
    REQUIRE_FALSE(parsed.ok());
    CHECK(std::string(parsed.status().message()) ==
          "max_tokens must be an integer in [1, 1048576], got 0 (0 only with echo: the "
          "prompt's scores, nothing generated)");
    CHECK(OpenAiErrorParam(parsed.status()) == "max_tokens");
  }
  // Another value out of range keeps the plain message.
  auto negative = ParseCompletionRequest(R"({"prompt":"x","max_tokens":-3})");
  REQUIRE_FALSE(negative.ok());
  CHECK(std::string(negative.status().message()) ==
        "max_tokens must be an integer in [1, 1048576], got -3");
}

TEST_CASE("openai request: the service's logit_bias refusal names the field", "[openai]") {
  // Only the service can check ids against the model; its refusal keeps its
  // message and gains param "logit_bias". Other statuses get no param.
  const std::string message = "logit_bias names token 300, outside the vocabulary [0, 300)";
  const absl::Status bias = ServiceStatus(absl::StatusCode::kInvalidArgument, message);
  CHECK(bias.code() == absl::StatusCode::kInvalidArgument);
  CHECK(bias.message() == message);
  CHECK(OpenAiErrorParam(bias) == "logit_bias");
  const absl::Status prompt =
      ServiceStatus(absl::StatusCode::kInvalidArgument, "token 299 is the landmark id");
  CHECK(prompt.message() == "token 299 is the landmark id");
  CHECK(OpenAiErrorParam(prompt).empty());
  const absl::Status internal = ServiceStatus(absl::StatusCode::kInternal, "logit_bias x");
  CHECK(internal.code() == absl::StatusCode::kInternal);
  CHECK(OpenAiErrorParam(internal).empty());
}

TEST_CASE("openai request: edge values that keep their meaning are accepted", "[openai]") {
  // n and best_of as 1.0 (vLLM takes them); the smallest positive float as
  // top_p; the largest float as temperature.
  auto r = ParseCompletionRequest(
      R"({"prompt":"x","n":1.0,"best_of":1.0,"top_p":1.5e-45,"temperature":3.4e38})");
  REQUIRE(r.ok());
  CHECK(r->generate.sampling().top_p() == std::numeric_limits<float>::denorm_min());
  CHECK(r->generate.sampling().temperature() == 3.4e38f);
}

TEST_CASE("openai request: bodies that are not a JSON object", "[openai]") {
  for (const std::string body : {"", "{", "{\"prompt\":\"x\",}", "[1,2]", "\"prompt\"", "null"}) {
    INFO(body);
    auto parsed = ParseCompletionRequest(body);
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(OpenAiErrorParam(parsed.status()).empty());
  }
}

TEST_CASE("openai request: prompts become bounded Complete messages", "[openai]") {
  CompletionRequest text;
  text.prompt_text = std::string(2 * kPromptPieceBytes + 5, 'a');
  text.prompt_text[kPromptPieceBytes - 1] = '\xc3';  // a character across two pieces
  text.prompt_text[kPromptPieceBytes] = '\xa9';
  text.generate.set_max_tokens(9);
  auto messages = CompleteMessages(text);
  REQUIRE(messages.size() == 4);
  CHECK(messages[0].generate().max_tokens() == 9);
  CHECK(messages[0].piece_case() == drt::v1::CompleteRequest::PIECE_NOT_SET);
  std::string joined;
  for (size_t i = 1; i < messages.size(); ++i) {
    REQUIRE(messages[i].piece_case() == drt::v1::CompleteRequest::kTextBytes);
    CHECK(messages[i].text_bytes().size() <= kPromptPieceBytes);
    joined += messages[i].text_bytes();
  }
  CHECK(joined == text.prompt_text);

  CompletionRequest ids;
  ids.prompt_is_ids = true;
  for (int i = 0; i < static_cast<int>(kPromptPieceIds) + 3; ++i) ids.prompt_ids.push_back(i % 256);
  messages = CompleteMessages(ids);
  REQUIRE(messages.size() == 3);
  std::vector<int32_t> all;
  for (size_t i = 1; i < messages.size(); ++i) {
    all.insert(all.end(), messages[i].tokens().ids().begin(), messages[i].tokens().ids().end());
  }
  CHECK(all == ids.prompt_ids);
}

// Echo asks Complete for the prompt's scores only when logprobs asks for
// their entries: a token-id prompt's text is spelled by Detokenize
// (SpellTokenBytes), so echo without logprobs does not pay for scoring.
TEST_CASE("openai request: echo scores the prompt only for logprobs", "[openai]") {
  for (const bool ids : {false, true}) {
    CompletionRequest request;
    request.echo = true;
    request.prompt_is_ids = ids;
    if (ids) request.prompt_ids = {72, 105};
    else request.prompt_text = "Hi";
    CHECK_FALSE(CompleteMessages(request)[0].has_prompt_logprobs());
    request.logprobs = 0;
    CHECK(CompleteMessages(request)[0].prompt_logprobs() == 1);
    request.logprobs = 3;
    CHECK(CompleteMessages(request)[0].prompt_logprobs() == 3);
  }
}

TEST_CASE("openai echo text: token bytes joined across pieces, then read as UTF-8", "[openai]") {
  // Hand-spelled: a euro sign split over two pieces is whole; a lone 0xff
  // and a character cut at the end are one U+FFFD each.
  CHECK(SpellTokenBytes({"Hi\xe2", "\x82\xac!", "\xff", "A\xe2\x82"}) ==
        "Hi\xe2\x82\xac!\xef\xbf\xbd" "A\xef\xbf\xbd");
  CHECK(SpellTokenBytes({}).empty());
}

TEST_CASE("openai answers: OpenAI's shapes", "[openai]") {
  const CompletionHeader header{"cmpl-abc", 1700000000, "model-x"};
  Json full = Json::parse(CompletionJson(header, "hi \xe2\x82\xac", "length", {5, 3}));
  CHECK(full["id"] == "cmpl-abc");
  CHECK(full["object"] == "text_completion");
  CHECK(full["created"] == 1700000000);
  CHECK(full["model"] == "model-x");
  REQUIRE(full["choices"].size() == 1);
  CHECK(full["choices"][0]["text"] == "hi \xe2\x82\xac");
  CHECK(full["choices"][0]["index"] == 0);
  CHECK(full["choices"][0]["logprobs"].is_null());
  CHECK(full["choices"][0]["finish_reason"] == "length");
  CHECK(full["usage"]["prompt_tokens"] == 5);
  CHECK(full["usage"]["completion_tokens"] == 3);
  CHECK(full["usage"]["total_tokens"] == 8);

  Json chunk = Json::parse(CompletionChunkJson(header, "x", std::nullopt));
  CHECK(chunk["object"] == "text_completion");
  CHECK(chunk["choices"][0]["finish_reason"].is_null());
  CHECK_FALSE(chunk.contains("usage"));
  Json last = Json::parse(CompletionChunkJson(header, "", "stop"));
  CHECK(last["choices"][0]["finish_reason"] == "stop");
  Json usage = Json::parse(UsageChunkJson(header, {2, 4}));
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"]["total_tokens"] == 6);

  drt::v1::ModelInfo info;
  info.set_name("m");
  info.set_max_context_tokens(1234);
  Json models = Json::parse(ModelsJson(info, 42));
  CHECK(models["object"] == "list");
  REQUIRE(models["data"].size() == 1);
  CHECK(models["data"][0]["id"] == "m");
  CHECK(models["data"][0]["object"] == "model");
  CHECK(models["data"][0]["created"] == 42);
  CHECK(models["data"][0]["owned_by"] == "drt-server");
  CHECK(models["data"][0]["max_model_len"] == 1234);

  CHECK(SseEvent("[DONE]") == "data: [DONE]\n\n");
  // Invalid UTF-8 from anywhere becomes U+FFFD, never an exception.
  CHECK(Json::parse(CompletionChunkJson(header, "a\xff", std::nullopt))["choices"][0]["text"] ==
        "a\xef\xbf\xbd");
}

TEST_CASE("openai logprobs: the request asks Complete for logprobs and alternatives", "[openai]") {
  auto none = ParseCompletionRequest(R"({"prompt":"x"})");
  REQUIRE(none.ok());
  CHECK_FALSE(none->logprobs.has_value());
  CHECK_FALSE(none->generate.return_logprobs());
  CHECK(none->generate.top_logprobs() == 0);
  CHECK(ParseCompletionRequest(R"({"prompt":"x","logprobs":null})")->generate.top_logprobs() == 0);
  // 0: the chosen token only, but one alternative is asked (the pieces carry
  // the token's bytes beside alternatives); 5 (OpenAI's most) and 20 (vLLM's).
  for (const auto& [n, asked] : std::vector<std::pair<int, int>>{{0, 1}, {1, 1}, {5, 5}, {20, 20}}) {
    auto parsed = ParseCompletionRequest(absl::StrCat(R"({"prompt":"x","logprobs":)", n, "}"));
    REQUIRE(parsed.ok());
    CHECK(parsed->logprobs == n);
    CHECK(parsed->generate.return_logprobs());
    CHECK(parsed->generate.top_logprobs() == asked);
    CHECK(CompleteMessages(*parsed)[0].generate().top_logprobs() == asked);
  }
}

TEST_CASE("openai logprobs: token texts, bytes: spelling, offsets, the chosen token added",
          "[openai]") {
  CHECK(OpenAiTokenText("abc") == "abc");
  CHECK(OpenAiTokenText("\xe2\x82\xac") == "\xe2\x82\xac");
  CHECK(OpenAiTokenText("") == "");
  CHECK(OpenAiTokenText("\xe2") == "bytes:\\xe2");
  CHECK(OpenAiTokenText("\x82\xac") == "bytes:\\x82\\xac");
  CHECK(OpenAiTokenText("a\xff") == "bytes:\\x61\\xff");
  CHECK(OpenAiTokenText("\xed\xa0\x80") == "bytes:\\xed\\xa0\\x80");  // a surrogate
  CHECK(OpenAiTokenText("\xc0\x80") == "bytes:\\xc0\\x80");              // overlong

  // Byte tokens "a", then the euro sign in three pieces, then "b": hand-made
  // pieces as Complete sends them, one token each.
  struct Token {
    int32_t id;
    std::string bytes;
    float logprob;
    std::vector<std::pair<int32_t, float>> top;  // (id, logprob); id's bytes: one byte
  };
  const std::vector<Token> tokens = {
      {'a', "a", -0.5f, {{'a', -0.5f}, {'b', -1.5f}}},
      {0xe2, "\xe2", -2.f, {{'x', -1.f}, {0xe2, -2.f}}},
      {0x82, "\x82", -0.25f, {{0x82, -0.25f}, {0x83, -3.f}}},
      {0xac, "\xac", -4.f, {{0xad, -0.1f}, {0xae, -3.f}}},  // sampled outside the top 2
      {'b', "b", -0.75f, {{'b', -0.75f}, {'c', -1.f}}},
  };
  LogprobsCollector collector(2);
  for (const Token& t : tokens) {
    drt::v1::GeneratedPiece piece;
    piece.add_token_ids(t.id);
    piece.add_logprobs(t.logprob);
    auto* top = piece.add_top_logprobs();
    top->set_token_bytes(t.bytes);
    for (const auto& [id, lp] : t.top) {
      auto* alternative = top->add_alternatives();
      alternative->set_token_id(id);
      alternative->set_logprob(lp);
      alternative->set_token_bytes(std::string(1, static_cast<char>(id)));
    }
    REQUIRE(collector.Add(piece).ok());
  }
  const ChoiceLogprobs entries = collector.Take();
  CHECK(collector.Take().empty());  // taken
  const CompletionHeader header{"cmpl-abc", 1700000000, "model-x"};
  const std::string json = CompletionJson(header, "a\xe2\x82\xac" "b", "length", {1, 5}, &entries);
  const Json logprobs = Json::parse(json)["choices"][0]["logprobs"];
  CHECK(logprobs["tokens"] == Json::array({"a", "bytes:\\xe2", "bytes:\\x82", "bytes:\\xac", "b"}));
  CHECK(logprobs["token_logprobs"] == Json::array({-0.5, -2.0, -0.25, -4.0, -0.75}));
  // Offsets in code points of "a€b": the euro's pieces all sit at 1 (the
  // text holds the character only once it is whole), "b" at 2.
  CHECK(logprobs["text_offset"] == Json::array({0, 1, 1, 1, 2}));
  REQUIRE(logprobs["top_logprobs"].size() == 5);
  CHECK(logprobs["top_logprobs"][0] == Json({{"a", -0.5}, {"b", -1.5}}));
  CHECK(logprobs["top_logprobs"][1] == Json({{"x", -1.0}, {"bytes:\\xe2", -2.0}}));
  // The sampled token outside the top 2 is added as a third entry.
  CHECK(logprobs["top_logprobs"][3] ==
        Json({{"bytes:\\xad", -0.1f}, {"bytes:\\xae", -3.0}, {"bytes:\\xac", -4.0}}));
  // Best first in the JSON text (an object's order is the writer's).
  const size_t c = json.find(R"("c":)"), b = json.find(R"("b":-0.75)");
  CHECK(b < c);
  CHECK(json.find(R"("logprobs":{"tokens")") != std::string::npos);

  // A piece without the logprobs asked for is refused, not misread.
  drt::v1::GeneratedPiece short_piece;
  short_piece.add_token_ids(5);
  CHECK(collector.Add(short_piece).code() == absl::StatusCode::kInternal);
  // Without logprobs the choice's logprobs stays null.
  CHECK(Json::parse(CompletionChunkJson(header, "x", std::nullopt))["choices"][0]["logprobs"].is_null());
}

// text_offset of each token, one piece per token (bytes as given).
std::vector<int64_t> Offsets(const std::vector<std::string>& tokens) {
  LogprobsCollector collector(0);
  for (const std::string& bytes : tokens) {
    drt::v1::GeneratedPiece piece;
    piece.add_token_ids(1);
    piece.add_logprobs(-1.f);
    piece.add_top_logprobs()->set_token_bytes(bytes);
    REQUIRE(collector.Add(piece).ok());
  }
  std::vector<int64_t> offsets;
  for (const TokenLogprobEntry& entry : collector.Take()) offsets.push_back(entry.text_offset);
  return offsets;
}

TEST_CASE("openai logprobs: text_offset counts invalid UTF-8 as the text's U+FFFD",
          "[openai]") {
  // Hand-checked against the text the answer shows (each maximal ill-formed
  // subpart one U+FFFD, Unicode 3.9 / Utf8Streamer), written beside each.
  using V = std::vector<int64_t>;
  // A lone continuation byte: text "\uFFFDa".
  CHECK(Offsets({"\x80", "a"}) == V{0, 1});
  CHECK(Offsets({"\x80", "\x80", "\x80"}) == V{0, 1, 2});  // 3 x U+FFFD
  // A lead byte the next byte does not continue (E0 needs A0..BF): E0 is
  // one U+FFFD, 80 another: "\uFFFD\uFFFDa".
  CHECK(Offsets({"\xe0", "\x80", "a"}) == V{0, 1, 2});
  CHECK(Offsets({"\xed", "\xa0", "a"}) == V{0, 1, 2});  // a surrogate's start
  CHECK(Offsets({"\xf4", "\x90", "a"}) == V{0, 1, 2});  // beyond U+10FFFF
  CHECK(Offsets({"\xc0", "\x80", "a"}) == V{0, 1, 2});  // C0 never starts one
  // Both in one token, then "a": "\uFFFD\uFFFDa".
  CHECK(Offsets({"\xff\x80", "a"}) == V{0, 2});
  // A valid two-byte character in two tokens: "\u00e9b"; the second piece
  // sits at its character's offset.
  CHECK(Offsets({"\xc3", "\xa9", "b"}) == V{0, 0, 1});
  // E2 82 then "x": one U+FFFD for the two (a maximal subpart), "\uFFFDx".
  CHECK(Offsets({"\xe2", "\x82", "x"}) == V{0, 0, 1});
  // A whole character then a piece of one in the same token: "\u20ac" + "\u00e9".
  CHECK(Offsets({"\xe2\x82\xac\xc3", "\xa9", "z"}) == V{0, 1, 2});
  // A token without bytes sits after the characters whole before it (a
  // truncated one waits for the next bytes to decide it).
  CHECK(Offsets({"ab", "", "c"}) == V{0, 2, 2});
  CHECK(Offsets({"\xe2", "", "x"}) == V{0, 0, 1});
}

TEST_CASE("openai n: choices asked of Complete, answers with every choice at its index",
          "[openai]") {
  for (const auto& [body, n] : std::vector<std::pair<std::string, int>>{
           {R"({"prompt":"x"})", 1}, {R"({"prompt":"x","n":1})", 1}, {R"({"prompt":"x","n":2})", 2},
           {R"({"prompt":"x","n":3.0})", 3}, {R"({"prompt":"x","n":16})", 16}}) {
    INFO(body);
    auto parsed = ParseCompletionRequest(body);
    REQUIRE(parsed.ok());
    CHECK(parsed->n == n);
    // One choice leaves Complete's n unset (0), as before.
    CHECK(CompleteMessages(*parsed)[0].n() == (n > 1 ? n : 0));
  }
  auto refused = ParseCompletionRequest(R"({"prompt":"x","n":17})");
  CHECK(std::string(refused.status().message()).find("n must be an integer in [1, 16], got 17") !=
        std::string::npos);

  const CompletionHeader header{"cmpl-abc", 1700000000, "model-x"};
  std::vector<CompletionChoice> choices = {{"first", "length", std::nullopt},
                                           {"second", "stop", ChoiceLogprobs{}}};
  const Json full = Json::parse(CompletionJson(header, choices, {7, 9}));
  REQUIRE(full["choices"].size() == 2);
  CHECK(full["choices"][0]["index"] == 0);
  CHECK(full["choices"][0]["text"] == "first");
  CHECK(full["choices"][0]["finish_reason"] == "length");
  CHECK(full["choices"][0]["logprobs"].is_null());
  CHECK(full["choices"][1]["index"] == 1);
  CHECK(full["choices"][1]["text"] == "second");
  CHECK(full["choices"][1]["finish_reason"] == "stop");
  CHECK(full["choices"][1]["logprobs"]["tokens"].empty());
  CHECK(full["usage"]["total_tokens"] == 16);
  const Json chunk = Json::parse(CompletionChunkJson(header, "x", std::nullopt, nullptr, 5));
  CHECK(chunk["choices"][0]["index"] == 5);
}

TEST_CASE("openai errors: status codes and shape", "[openai]") {
  using C = absl::StatusCode;
  CHECK(HttpStatusFor(C::kInvalidArgument) == 400);
  CHECK(HttpStatusFor(C::kUnauthenticated) == 401);
  CHECK(HttpStatusFor(C::kNotFound) == 404);
  CHECK(HttpStatusFor(C::kResourceExhausted) == 429);
  CHECK(HttpStatusFor(C::kUnavailable) == 503);
  CHECK(HttpStatusFor(C::kDeadlineExceeded) == 504);
  CHECK(HttpStatusFor(C::kFailedPrecondition) == 500);
  CHECK(HttpStatusFor(C::kInternal) == 500);

  Json e = Json::parse(ErrorJson(FieldError("top_p", "top_p must be in (0, 1], got 2")));
  CHECK(e["error"]["message"] == "top_p must be in (0, 1], got 2");
  CHECK(e["error"]["type"] == "invalid_request_error");
  CHECK(e["error"]["param"] == "top_p");
  CHECK(e["error"]["code"] == "invalid_argument");
  Json auth = Json::parse(ErrorJson(absl::UnauthenticatedError("missing token")));
  CHECK(auth["error"]["type"] == "authentication_error");
  CHECK(auth["error"]["param"].is_null());
  CHECK(auth["error"]["code"] == "unauthenticated");
  CHECK(Json::parse(ErrorJson(absl::ResourceExhaustedError("full")))["error"]["type"] ==
        "rate_limit_error");
  CHECK(Json::parse(ErrorJson(absl::UnavailableError("drain")))["error"]["type"] == "server_error");

  CHECK(FinishReasonName(drt::v1::FINISH_REASON_LENGTH) == "length");
  CHECK(FinishReasonName(drt::v1::FINISH_REASON_STOP_SEQUENCE) == "stop");
  CHECK(FinishReasonName(drt::v1::FINISH_REASON_END_OF_TEXT) == "stop");
  CHECK(FinishReasonName(drt::v1::FINISH_REASON_CANCELLED) == "abort");
  CHECK(FinishReasonName(drt::v1::FINISH_REASON_DEADLINE) == "abort");
}

// ---------------------------------------------------------------------------
// Stop cutting.

// Whether `s` is whole UTF-8 characters (no cut one at either end).
bool WholeCharacters(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// Feeds `pieces` to a cutter; returns what it handed out, piece by piece
// (the last entry is Finish's).
std::vector<std::string> Feed(const std::vector<std::string>& stops,
                              const std::vector<std::string>& pieces, bool include_stop = false) {
  StopTextCutter cutter(stops, include_stop);
  std::vector<std::string> out;
  for (const std::string& piece : pieces) out.push_back(cutter.Push(piece));
  out.push_back(cutter.Finish());
  return out;
}

// The reference: the whole text cut at the earliest occurrence of any stop
// (with `include_stop`, after it: of stops starting there, the shortest).
std::string NaiveCut(const std::string& text, const std::vector<std::string>& stops,
                     bool include_stop = false) {
  size_t start = text.size(), cut = text.size();
  for (const std::string& stop : stops) {
    for (size_t at = 0; at + stop.size() <= text.size(); ++at) {
      if (text.compare(at, stop.size(), stop) == 0) {
        const size_t end = include_stop ? at + stop.size() : at;
        if (at < start || (at == start && end < cut)) {
          start = at;
          cut = end;
        }
        break;
      }
    }
  }
  return text.substr(0, cut);
}

std::string Join(const std::vector<std::string>& parts) {
  std::string all;
  for (const std::string& p : parts) all += p;
  return all;
}

TEST_CASE("stop cutter: a stop split across pieces is never handed out", "[openai]") {
  // "STOP" arrives as "ST" + "OP": nothing of it may leave before the cut.
  const auto out = Feed({"STOP"}, {"hello ST", "OP world"});
  REQUIRE(out.size() == 3);
  CHECK(out[0] == "hello ");  // "ST" held back
  CHECK(out[1] == "");
  CHECK(out[2] == "");
  // A held-back prefix that turns out not to be a stop is handed out.
  const auto no = Feed({"STOP"}, {"hello ST", "ART"});
  CHECK(no[0] == "hello ");
  CHECK(no[1] == "START");
  CHECK(Join(no) == "hello START");
  // A stop that could still complete at an earlier start holds a later
  // complete one back: " b\xc3\xa9" may follow " b", so "b" cannot cut yet.
  CHECK(Join(Feed({" b\xc3\xa9", "b"}, {"x ", "b", "\xc3\xa9 y"})) == "x");
  CHECK(Join(Feed({" b\xc3\xa9", "b"}, {"x ", "b", "c"})) == "x ");
  CHECK(Join(Feed({" b\xc3\xa9", "b"}, {"x ", "b"})) == "x ");  // the text ends there
  // The earliest of several stops wins, wherever each one is.
  CHECK(Join(Feed({"world", "lo w"}, {"hel", "lo world"})) == "hel");
}

TEST_CASE("stop cutter: include_stop keeps the stop that matched and nothing after it",
          "[openai]") {
  CHECK(Join(Feed({"STOP"}, {"hello ST", "OP world"}, true)) == "hello STOP");
  // The earliest start wins; of two starting there, the shortest, whatever
  // the order or the pieces.
  CHECK(Join(Feed({"world", "lo w"}, {"hel", "lo world"}, true)) == "hello w");
  CHECK(Join(Feed({"ab", "abc"}, {"xabc"}, true)) == "xab");
  CHECK(Join(Feed({"abc", "ab"}, {"xabc"}, true)) == "xab");
  CHECK(Join(Feed({"abc", "ab"}, {"xa", "bc"}, true)) == "xab");
  // Matched only at the end (Finish).
  CHECK(Join(Feed({" b\xc3\xa9", "b"}, {"x ", "b"}, true)) == "x b");
}

TEST_CASE("stop cutter: a multi-byte character at the boundary is never split", "[openai]") {
  // "é" (c3 a9) arrives cut in two; the stop is "é!".
  const auto out = Feed({"\xc3\xa9!"}, {"caf\xc3", "\xa9", "! rest"});
  CHECK(out[0] == "caf");
  CHECK(Join(out) == "caf");
  // Without a stop, a cut character is held until whole.
  const auto plain = Feed({"zzz"}, {"x\xe2\x82", "\xac y"});
  CHECK(plain[0] == "x");
  CHECK(plain[1] == "\xe2\x82\xac y");
}

TEST_CASE("stop cutter: equals a naive cut of the whole text, however split", "[openai]") {
  // Random texts over a small alphabet of 1- to 4-byte characters, so stops
  // (also drawn from it) occur, partially and overlapping; random pieces,
  // cut at any byte.
  const std::vector<std::string> alphabet = {"a", "b", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", " "};
  std::mt19937 rng(1234);
  auto random_text = [&](int chars) {
    std::string s;
    for (int i = 0; i < chars; ++i) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  int cut_cases = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string text = random_text(1 + rng() % 40);
    std::vector<std::string> stops;
    const int n_stops = rng() % 5;  // 0..4
    for (int i = 0; i < n_stops; ++i) stops.push_back(random_text(1 + rng() % 3));
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t n = std::min<size_t>(1 + rng() % 6, text.size() - at);
      pieces.push_back(text.substr(at, n));
      at += n;
    }
    const std::string expected = NaiveCut(text, stops);
    if (expected.size() < text.size()) ++cut_cases;
    std::string all_stops;
    for (const std::string& stop : stops) all_stops += "[" + stop + "]";
    INFO("text " << text << " stops " << all_stops << " pieces " << pieces.size());
    for (const bool include : {false, true}) {
      INFO("include_stop " << include);
      const auto out = Feed(stops, pieces, include);
      REQUIRE(Join(out) == NaiveCut(text, stops, include));
      for (const std::string& part : out) REQUIRE(WholeCharacters(part));
    }
  }
  // The draw exercised cuts often, and texts without any too.
  CHECK(cut_cases > 1000);
  CHECK(cut_cases < 2900);
}

}  // namespace
}  // namespace drt::server

// lm-evaluation-harness's local-completions requests, as it sends them
// (lm_eval/models/openai_completions.py, _create_payload), through the real
// OpenAI HTTP server over the in-process drt-server with the fixture model:
// loglikelihood ([[ids]], echo, logprobs 1, max_tokens 1, its [ctxlen:-1]
// parse) against the gRPC Append's prompt_logprobs; generate_until ([[ids]]
// with `until` stops) against the same request's text cut by hand; batches
// of several prompts, their choices indexed prompt i, choice j -> i*n+j,
// usage summed, each equal to the prompt sent alone; /tokenizer_info and the
// calls lm-eval's remote tokenizer makes.
#include <catch2/catch.hpp>

#include <httplib.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"
#include "server/openai_http_server.h"
#include "tests/server/test_util/append_scores.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/openai_server.h"

namespace drt::server {
namespace {

using testing::InProcessServer;
using testing::SmallOptions;
using Json = nlohmann::json;

struct LmEvalServer : testing::OpenAiServer {
  using OpenAiServer::OpenAiServer;
  // POST /v1/completions; the answer's JSON, or a failed check.
  Json Complete(const Json& body, int want_status = 200) {
    auto res = Post(body);
    REQUIRE(res);
    INFO(res->body.substr(0, 600));
    REQUIRE(res->status == want_status);
    return Json::parse(res->body);
  }
};

// lm-eval's loglikelihood payload for `requests` (each context +
// continuation ids): its batch is the list of them, one or more.
Json LoglikelihoodPayload(const std::vector<std::vector<int32_t>>& requests) {
  return {{"model", "two_groups"}, {"prompt", requests}, {"temperature", 0},
          {"max_tokens", 1},       {"logprobs", 1},      {"seed", 1234},
          {"echo", true}};
}

// lm-eval's parse_logprobs for one choice: the sum of token_logprobs over
// [ctxlen:-1] (the last entry is the one generated token).
double HarnessSum(const Json& choice, size_t context_tokens) {
  const Json& tokens = choice["logprobs"]["token_logprobs"];
  double sum = 0;
  for (size_t i = context_tokens; i + 1 < tokens.size(); ++i) sum += tokens[i].get<double>();
  return sum;
}

double AppendSum(drt::v1::Drt::Stub& stub, const std::vector<int32_t>& ids, size_t from) {
  drt::v1::PromptLogprobs all;
  for (const drt::v1::PromptLogprobs& event : testing::AppendScoreEvents(stub, ids, 1)) {
    all.MergeFrom(event);
  }
  REQUIRE(all.logprobs_size() == static_cast<int>(ids.size()));
  double sum = 0;
  for (size_t i = from; i < ids.size(); ++i) sum += all.logprobs(i);
  return sum;
}

TEST_CASE("openai lmeval: the loglikelihood payload scores as the gRPC Append does",
          "[openai][server][score]") {
  LmEvalServer server;
  auto& stub = server.grpc.stub();
  const std::vector<int32_t> context = testing::RandomTokens(200, 81);
  std::vector<std::vector<int32_t>> requests;
  for (const uint64_t seed : {82, 83, 84}) {
    std::vector<int32_t> ids = context;
    const std::vector<int32_t> continuation = testing::RandomTokens(7, seed);
    ids.insert(ids.end(), continuation.begin(), continuation.end());
    requests.push_back(std::move(ids));
  }
  // Same tokens through Complete as through Append: one message each, the
  // sums measured equal (openai_echo_test); the margin allows other step
  // cuts under load: 1e-4 per token times 7.
  std::vector<double> alone;
  for (const std::vector<int32_t>& ids : requests) {
    // batch_size 1: [[ids]].
    const Json answer = server.Complete(LoglikelihoodPayload({ids}));
    REQUIRE(answer["choices"].size() == 1);
    const Json& choice = answer["choices"][0];
    CHECK(choice["index"] == 0);
    CHECK(choice["logprobs"]["token_logprobs"].size() == ids.size() + 1);
    CHECK(answer["usage"]["prompt_tokens"] == ids.size());
    const double got = HarnessSum(choice, context.size());
    CHECK(got == Approx(AppendSum(stub, ids, context.size())).margin(7e-4));
    alone.push_back(got);
  }
  // batch_size 3: [[ids], [ids], [ids]], choices in the prompts' order,
  // each scored as when sent alone (one after another: the same steps).
  const Json batch = server.Complete(LoglikelihoodPayload(requests));
  REQUIRE(batch["choices"].size() == 3);
  size_t prompt_tokens = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    INFO("prompt " << i);
    const Json& choice = batch["choices"][i];
    CHECK(choice["index"] == i);
    CHECK(choice["logprobs"]["token_logprobs"].size() == requests[i].size() + 1);
    CHECK(HarnessSum(choice, context.size()) == Approx(alone[i]).margin(7e-4));
    prompt_tokens += requests[i].size();
  }
  CHECK(batch["usage"]["prompt_tokens"] == prompt_tokens);
  CHECK(batch["usage"]["completion_tokens"] == 3);
  CHECK(batch["usage"]["total_tokens"] == prompt_tokens + 3);
}

TEST_CASE("openai lmeval: the generate_until payload stops at its until strings",
          "[openai][server]") {
  LmEvalServer server;
  // Prompts of letters (ids the fixture's tokenizer spells), so that the
  // greedy text has bytes to cut at.
  std::vector<int32_t> prompt(120);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 'a' + static_cast<int32_t>(i * 7 % 26);
  const Json free = server.Complete({{"prompt", Json::array({prompt})}, {"model", "two_groups"},
                                     {"max_tokens", 24}, {"temperature", 0}, {"seed", 1234}});
  const std::string text = free["choices"][0]["text"];
  INFO("greedy text: " << text);
  REQUIRE(text.size() >= 8);
  // A stop the text holds (its bytes 4-5), among strings it does not.
  const std::string stop = text.substr(4, 2);
  const std::string want = text.substr(0, text.find(stop));
  // A task's 4 `until` strings and the end-of-text string lm-eval adds: 5
  // (OpenAI's limit of 4 refused this before).
  const Json until = {"\n\n", "Question:", "\x01\x02", "</s>", stop};
  const Json cut = server.Complete({{"prompt", Json::array({prompt})}, {"model", "two_groups"},
                                    {"max_tokens", 24}, {"temperature", 0}, {"stop", until},
                                    {"seed", 1234}});
  CHECK(cut["choices"][0]["text"] == want);
  CHECK(cut["choices"][0]["finish_reason"] == "stop");
  // vLLM's include_stop_str_in_output: the stop string stays.
  const Json kept = server.Complete({{"prompt", Json::array({prompt})}, {"max_tokens", 24},
                                     {"temperature", 0}, {"stop", until},
                                     {"include_stop_str_in_output", true}});
  CHECK(kept["choices"][0]["text"] == want + stop);
  CHECK(kept["choices"][0]["finish_reason"] == "stop");
}

// vLLM's prompt_logprobs: the prompt's scores without its text, one entry
// per prompt token (null first), keyed by token id, against the gRPC
// Append's scores and alternatives.
TEST_CASE("openai lmeval: prompt_logprobs scores the prompt as the gRPC Append does",
          "[openai][server][score]") {
  LmEvalServer server;
  const std::vector<int32_t> ids = testing::RandomTokens(90, 91);
  const Json plain = server.Complete({{"prompt", ids}, {"max_tokens", 3}, {"temperature", 0}});
  const Json answer = server.Complete(
      {{"prompt", ids}, {"max_tokens", 3}, {"temperature", 0}, {"prompt_logprobs", 2}, {"n", 2}});
  drt::v1::PromptLogprobs want;
  for (const drt::v1::PromptLogprobs& event :
       testing::AppendScoreEvents(server.grpc.stub(), ids, 2)) {
    want.MergeFrom(event);
  }
  REQUIRE(want.logprobs_size() == static_cast<int>(ids.size()));
  REQUIRE(answer["choices"].size() == 2);
  for (const Json& choice : answer["choices"]) {
    // Not echoed: the text is the generated text alone.
    CHECK(choice["text"] == plain["choices"][0]["text"]);
    CHECK(choice["logprobs"].is_null());
    const Json& scores = choice["prompt_logprobs"];
    REQUIRE(scores.size() == ids.size());
    CHECK(scores[0].is_null());
    for (size_t i = 1; i < ids.size(); ++i) {
      INFO("prompt token " << i);
      const Json& token = scores[i];
      const std::string key = std::to_string(ids[i]);
      REQUIRE(token.contains(key));
      // Same tokens through Complete as through Append: 1e-4 (as
      // prompt_logprobs_service_test.cc) for other step cuts.
      CHECK(token[key]["logprob"].get<double>() == Approx(want.logprobs(i)).margin(1e-4));
      const auto& alternatives = want.top_logprobs(i).alternatives();
      REQUIRE(alternatives.size() == 2);
      bool listed = false;
      for (int j = 0; j < 2; ++j) {
        const std::string alt = std::to_string(alternatives[j].token_id());
        REQUIRE(token.contains(alt));
        CHECK(token[alt]["rank"] == j + 1);
        CHECK(token[alt]["logprob"].get<double>() ==
              Approx(alternatives[j].logprob()).margin(1e-4));
        listed |= alternatives[j].token_id() == ids[i];
      }
      // The token and the 2 alternatives, the token once.
      CHECK(token.size() == (listed ? 2u : 3u));
      if (!listed) CHECK(token[key]["rank"].is_null());
    }
  }
}

// The vLLM fields drt.v1 cannot express are refused by name, before anything
// runs (they were accepted and ignored: review-tools F5).
TEST_CASE("openai lmeval: vLLM fields that would change the result are refused by name",
          "[openai][server]") {
  LmEvalServer server;
  for (const auto& [field, value] : std::vector<std::pair<std::string, Json>>{
           {"use_beam_search", true}, {"stop_token_ids", {10}}, {"min_tokens", 4}}) {
    INFO(field);
    const Json refused = server.Complete({{"prompt", "Hello"}, {"max_tokens", 1}, {field, value}}, 400);
    CHECK(refused["error"]["param"] == field);
  }
}

TEST_CASE("openai lmeval: a batch's choices are indexed prompt i choice j as i*n+j",
          "[openai][server]") {
  LmEvalServer server;
  const std::vector<std::string> prompts = {"The cat sat on", "Once upon a", "x"};
  const Json options = {{"max_tokens", 5}, {"temperature", 0}, {"n", 2}};
  std::vector<std::string> alone;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (const std::string& prompt : prompts) {
    Json body = options;
    body["prompt"] = prompt;
    const Json answer = server.Complete(body);
    REQUIRE(answer["choices"].size() == 2);
    // Greedy: both choices the same text.
    CHECK(answer["choices"][0]["text"] == answer["choices"][1]["text"]);
    alone.push_back(answer["choices"][0]["text"]);
    prompt_tokens += answer["usage"]["prompt_tokens"].get<int64_t>();
    completion_tokens += answer["usage"]["completion_tokens"].get<int64_t>();
  }
  // The three texts differ, so a choice in the wrong place shows.
  REQUIRE(alone[0] != alone[1]);
  REQUIRE(alone[1] != alone[2]);
  Json body = options;
  body["prompt"] = prompts;
  const Json batch = server.Complete(body);
  REQUIRE(batch["choices"].size() == 6);
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (size_t j = 0; j < 2; ++j) {
      INFO("prompt " << i << " choice " << j);
      const Json& choice = batch["choices"][i * 2 + j];
      CHECK(choice["index"] == i * 2 + j);
      CHECK(choice["text"] == alone[i]);
    }
  }
  CHECK(batch["usage"]["prompt_tokens"] == prompt_tokens);
  CHECK(batch["usage"]["completion_tokens"] == completion_tokens);
}

TEST_CASE("openai lmeval: a batch with a bad prompt is refused naming it before any runs",
          "[openai][server]") {
  LmEvalServer server;
  // The fixture's vocabulary is 300 ids: 5000 is outside it.
  const Json refused = server.Complete({{"prompt", {{72, 105}, {72, 5000}}}, {"max_tokens", 1}}, 400);
  CHECK(refused["error"]["param"] == "prompt");
  CHECK(refused["error"]["message"].get<std::string>().rfind("prompt[1][1]: token 5000 is outside",
                                                             0) == 0);
  const Json streamed =
      server.Complete({{"prompt", {"a", "b"}}, {"max_tokens", 1}, {"stream", true}}, 400);
  CHECK(streamed["error"]["param"] == "stream");
}

// The Complete calls the service has received (its drt_requests_total).
int64_t CompleteCalls(LmEvalServer& server) {
  const std::string text = server.grpc.metrics().RenderPrometheus();
  const std::string counter = "drt_requests_total{method=\"Complete\"} ";
  const size_t at = text.find(counter);
  return at == std::string::npos ? 0 : std::stoll(text.substr(at + counter.size()));
}

// review-lmeval F2. Before: echo with max_tokens 0 was not counted up front
// (prompt 0 ran, then prompt 1 failed naming a session id), nor was a prompt
// at or over the limit with max_tokens > 0, and no batch error named its
// prompt.
TEST_CASE("openai lmeval: a batch's prompt over the context limit is refused naming it before "
          "any runs",
          "[openai][server]") {
  ServiceOptions service = SmallOptions();
  service.max_context_tokens = 100;
  LmEvalServer server(service);
  const std::vector<int32_t> short_prompt = {72, 105};
  struct Case {
    const char* what;
    std::vector<int32_t> second;
    Json fields;
    std::string param;
    std::string message;
  };
  const Json echo_only = {{"max_tokens", 0}, {"echo", true}, {"logprobs", 1}};
  const std::vector<Case> cases = {
      {"echo, max_tokens 0, 101 ids", std::vector<int32_t>(101, 72), echo_only, "prompt",
       "prompt[1]: This model's maximum context length is 100 tokens. However, your prompt has 101 "
       "tokens: shorten the prompt"},
      {"max_tokens 1, 100 ids", std::vector<int32_t>(100, 72), {{"max_tokens", 1}}, "prompt",
       "prompt[1]: This model's maximum context length is 100 tokens. However, your prompt has 100 "
       "tokens, which leaves no room to generate: shorten the prompt"},
      {"max_tokens 10, 98 ids", std::vector<int32_t>(98, 72), {{"max_tokens", 10}}, "max_tokens",
       "prompt[1]: This model's maximum context length is 100 tokens. However, you requested "},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    Json body = c.fields;
    body["prompt"] = {short_prompt, c.second};
    const int64_t before = CompleteCalls(server);
    const Json refused = server.Complete(body, 400);
    CHECK(refused["error"]["code"] == "context_length_exceeded");
    CHECK(refused["error"]["param"] == c.param);
    CHECK(refused["error"]["message"].get<std::string>().rfind(c.message, 0) == 0);
    CHECK(CompleteCalls(server) == before);  // prompt 0 did not run
  }
  // Echo with max_tokens 0 may fill the context (the service's limit):
  // 100 ids run.
  Json full = echo_only;
  full["prompt"] = {short_prompt, std::vector<int32_t>(100, 72)};
  const Json answered = server.Complete(full);
  CHECK(answered["choices"].size() == 2);
  CHECK(answered["choices"][1]["logprobs"]["token_logprobs"].size() == 100);
}

TEST_CASE("openai lmeval: an error mid-batch names its prompt and keeps its status",
          "[openai][server]") {
  ServiceOptions service = SmallOptions();
  service.max_sessions = 1;
  LmEvalServer server(service);
  // The one session is held: prompt 0's temporary session is refused, 503
  // with Retry-After as alone, its message labelled.
  testing::NewSession(server.grpc.stub());
  auto res = server.client->Post("/v1/completions",
                                 Json{{"prompt", {"ab", "cd"}}, {"max_tokens", 1}}.dump(),
                                 "application/json");
  REQUIRE(res);
  CHECK(res->status == 503);
  CHECK(res->get_header_value("Retry-After") == "1");
  const Json error = Json::parse(res->body)["error"];
  CHECK(error["code"] == "unavailable");
  CHECK(error["message"].get<std::string>().rfind("prompt[0]: the server holds its maximum of 1 "
                                                  "sessions",
                                                  0) == 0);
}

// lm-evaluation-harness's "remote" tokenizer (lm_eval/utils.py,
// RemoteTokenizer and check_remote_tokenizer_support): GET /tokenizer_info
// must answer an object with an eos_token key, then POST /tokenize
// {"prompt", "add_special_tokens": false} a "tokens" list and /detokenize
// {"tokens"} a "prompt" string. The fields against GetModelInfo.
TEST_CASE("openai lmeval: /tokenizer_info answers vLLM's fields from GetModelInfo",
          "[openai][server]") {
  LmEvalServer server;
  drt::v1::ModelInfo info;
  {
    grpc::ClientContext context;
    REQUIRE(server.grpc.stub().GetModelInfo(&context, drt::v1::GetModelInfoRequest(), &info).ok());
  }
  for (const char* path : {"/tokenizer_info", "/v1/tokenizer_info"}) {
    INFO(path);
    auto res = server.client->Get(path);
    REQUIRE(res);
    INFO(res->body);
    REQUIRE(res->status == 200);
    CHECK(res->get_header_value("Content-Type") == "application/json");
    const Json answer = Json::parse(res->body);
    REQUIRE(answer.is_object());
    CHECK(answer["tokenizer_class"] == info.tokenizer());
    CHECK(answer["model_max_length"] == info.max_context_tokens());
    CHECK(answer["vocab_size"] == info.vocab_size());
    // The fixture's tokenizer has no end-of-text id (-1): null.
    REQUIRE(info.eos_id() == -1);
    CHECK(answer["eos_token_id"].is_null());
    CHECK(answer["pad_token_id"] == info.pad_id());
    // No eos id, so no spelling: eos_token null, present (lm-eval checks
    // the key; unit case in openai_tokenize_test.cc for a spelled one).
    REQUIRE(answer.contains("eos_token"));
    CHECK(answer["eos_token"].is_null());
    CHECK(answer["bos_token"].is_null());
    CHECK(answer["pad_token"].is_null());
    CHECK(answer["add_bos_token"] == false);
  }
  // What the remote tokenizer calls next.
  auto tokenized = server.client->Post(
      "/tokenize", Json{{"prompt", "test"}, {"add_special_tokens", false}}.dump(),
      "application/json");
  REQUIRE(tokenized);
  REQUIRE(tokenized->status == 200);
  CHECK(Json::parse(tokenized->body)["tokens"] == std::vector<int32_t>{'t', 'e', 's', 't'});
  auto detokenized = server.client->Post(
      "/detokenize", Json{{"tokens", {'t', 'e', 's', 't'}}}.dump(), "application/json");
  REQUIRE(detokenized);
  REQUIRE(detokenized->status == 200);
  CHECK(Json::parse(detokenized->body)["prompt"] == "test");
  // A body or another method is refused, naming the served paths.
  auto posted = server.client->Post("/tokenizer_info", "{}", "application/json");
  REQUIRE(posted);
  CHECK(posted->status == 405);
  CHECK(posted->get_header_value("Allow") == "GET");
}

}  // namespace
}  // namespace drt::server

// vLLM's POST /tokenize and POST /detokenize on the OpenAI HTTP API, and
// /v1/completions refusing a max_tokens that does not fit beside its prompt
// (server/openai_tokenize.h; docs/api.md, "Tokenize and Detokenize"),
// against the fixture model's tokenizer called directly.
#include <catch2/catch.hpp>

#include <httplib.h>

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/model.h"
#include "server/openai_http_server.h"
#include "server/openai_tokenize.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using testing::FixtureModel;
using testing::InProcessServer;
using testing::SmallOptions;
using Json = nlohmann::json;
using Catch::Matchers::Contains;

// An in-process drt-server with the OpenAI API in front of it, as main
// wires them.
struct Api {
  explicit Api(ServiceOptions service = SmallOptions())
      : Api(*FixtureModel::Get().model, *FixtureModel::Get().backend, service) {}
  Api(const Model& model, Backend& backend, ServiceOptions service) : grpc(model, backend, service) {
    OpenAiHttpOptions options;
    options.model_name = "two_groups";
    options.bearer_token = service.bearer_token;
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    api = std::make_unique<OpenAiHttpServer>(grpc.server().InProcessChannel(args), options);
    const absl::Status started = api->Start("127.0.0.1", 0);
    if (!started.ok()) throw std::runtime_error(std::string(started.message()));
    client = std::make_unique<httplib::Client>("127.0.0.1", api->port());
    client->set_read_timeout(120, 0);
  }
  ~Api() { api->Stop(); }
  httplib::Result Post(const std::string& path, const Json& body,
                       const httplib::Headers& headers = {}) {
    return client->Post(path, headers, body.dump(), "application/json");
  }
  InProcessServer grpc;
  std::unique_ptr<OpenAiHttpServer> api;
  std::unique_ptr<httplib::Client> client;
};

Json Error(const httplib::Result& r) { return Json::parse(r->body)["error"]; }

// The fixture with pad_to_chunk_boundary on by default, as the bundled
// model's generation_config.json has it (loaded once).
FixtureModel& PaddingFixture() {
  static FixtureModel* padded = [] {
    auto* f = new FixtureModel(FixtureModel::Load(testing::FixtureDir()));
    f->model->generation.pad_to_chunk_boundary = true;
    return f;
  }();
  return *padded;
}

TEST_CASE("openai http: /tokenize and /detokenize in vLLM's shape", "[openai][server]") {
  Api api;
  const Model& model = *FixtureModel::Get().model;
  const std::string text = "caf\xC3\xA9 <|endoftext|> au lait";
  const std::vector<int32_t> expected = *model.tokenizer->Encode(text);
  for (const bool special : {true, false}) {
    auto r = api.Post("/tokenize", {{"prompt", text}, {"add_special_tokens", special},
                                    {"model", "two_groups"}});
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const Json body = Json::parse(r->body);
    CHECK(body["tokens"].get<std::vector<int32_t>>() == expected);
    CHECK(body["count"] == expected.size());
    CHECK(body["max_model_len"] == SmallOptions().max_context_tokens);
    CHECK(r->body.rfind("{\"count\":", 0) == 0);  // vLLM's key order
  }
  for (const char* path : {"/detokenize", "/v1/detokenize"}) {
    auto back = api.Post(path, {{"tokens", expected}});
    REQUIRE(back);
    REQUIRE(back->status == 200);
    CHECK(Json::parse(back->body) == Json{{"prompt", text}});
  }
  // /v1/tokenize, the path the gateway routes with the rest of /v1/.
  auto v1 = api.Post("/v1/tokenize", {{"prompt", text}});
  REQUIRE(v1);
  REQUIRE(v1->status == 200);
  CHECK(Json::parse(v1->body)["tokens"].get<std::vector<int32_t>>() == expected);
  // A character the ids end inside of: U+FFFD, as the completions' text.
  auto cut = api.Post("/detokenize", {{"tokens", {'a', 0xC3}}});
  REQUIRE(cut);
  CHECK(Json::parse(cut->body)["prompt"] == "a\xEF\xBF\xBD");
  auto empty = api.Post("/tokenize", {{"prompt", ""}});
  REQUIRE(empty);
  CHECK(Json::parse(empty->body) ==
        Json{{"count", 0}, {"max_model_len", SmallOptions().max_context_tokens},
             {"tokens", Json::array()}});
}

TEST_CASE("openai http: /tokenize and /detokenize errors in OpenAI's shape", "[openai][server]") {
  Api api;
  struct Case {
    std::string path;
    Json body;
    int status;
    std::string param;
    std::string words;
  };
  const std::vector<Case> cases = {
      {"/tokenize", {{"text", "x"}}, 400, "prompt", "prompt is required"},
      {"/tokenize", {{"prompt", {1, 2}}}, 400, "prompt", "must be a string"},
      {"/tokenize", {{"prompt", "x"}, {"return_token_strs", true}}, 400, "return_token_strs",
       "not served"},
      {"/tokenize", {{"messages", Json::array()}}, 400, "messages", "not served"},
      {"/tokenize", {{"prompt", "x"}, {"add_special_tokens", 1}}, 400, "add_special_tokens",
       "true or false"},
      {"/tokenize", {{"prompt", "x"}, {"model", "other"}}, 404, "model", "does not exist"},
      {"/detokenize", {{"tokens", "abc"}}, 400, "tokens", "array of token ids"},
      {"/detokenize", {{"tokens", {1, 2.5}}}, 400, "tokens", "tokens[1] (2.5)"},
      // The service's refusals, named (the fixture: landmark 299, vocab 300).
      {"/detokenize", {{"tokens", {97, 299}}}, 400, "tokens", "ids[1]: token 299 is the landmark id"},
      {"/detokenize", {{"tokens", {300}}}, 400, "tokens", "outside the vocabulary [0, 300)"},
      {"/detokenize", {{"tokens", {-1}}}, 400, "tokens", "outside the vocabulary"},
  };
  for (const Case& c : cases) {
    INFO(c.path << " " << c.body.dump());
    auto r = api.Post(c.path, c.body);
    REQUIRE(r);
    CHECK(r->status == c.status);
    const Json error = Error(r);
    CHECK(error["type"] == "invalid_request_error");
    CHECK(error["param"] == c.param);
    CHECK_THAT(std::string(error["message"]), Contains(c.words));
  }
  auto bad_json = api.client->Post("/detokenize", "{", "application/json");
  REQUIRE(bad_json);
  CHECK(bad_json->status == 400);
  CHECK_THAT(std::string(Error(bad_json)["message"]), Contains("not valid JSON"));
}

TEST_CASE("openai http: a /tokenize request over --max_message_bytes is 413, not 400",
          "[openai][server]") {
  // The service refuses a request over --max_message_bytes by name
  // (INVALID_ARGUMENT), below gRPC's own limit (RESOURCE_EXHAUSTED): both
  // are the message limit, 413, which a retry cannot pass.
  ServiceOptions service = SmallOptions();
  service.max_message_bytes = 1024;
  Api api(service);
  for (const size_t bytes : {1500, 5000}) {  // under and over gRPC's limit (2048)
    INFO(bytes << " bytes");
    auto r = api.Post("/tokenize", {{"prompt", std::string(bytes, 'a')}});
    REQUIRE(r);
    CHECK(r->status == 413);
    CHECK_THAT(std::string(Error(r)["message"]), Contains("--max_message_bytes"));
  }
  auto fits = api.Post("/tokenize", {{"prompt", std::string(900, 'a')}});
  REQUIRE(fits);
  CHECK(fits->status == 200);
}

TEST_CASE("openai http: a null field of /tokenize or /detokenize is taken as absent",
          "[openai][server]") {
  Api api;
  // (return_token_strs: null was a 500: json::value() threw on the null.)
  for (const Json& body :
       {Json{{"prompt", "ab"}, {"return_token_strs", nullptr}},
        Json{{"prompt", "ab"}, {"return_token_strs", false}},
        Json{{"prompt", "ab"}, {"add_special_tokens", nullptr}},
        Json{{"prompt", "ab"}, {"messages", nullptr}}, Json{{"prompt", "ab"}, {"model", nullptr}}}) {
    INFO(body.dump());
    auto r = api.Post("/tokenize", body);
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(Json::parse(r->body)["tokens"] == Json{97, 98});
  }
  auto detok = api.Post("/detokenize", {{"tokens", {97, 98}}, {"model", nullptr}});
  REQUIRE(detok);
  CHECK(detok->status == 200);
  CHECK(Json::parse(detok->body)["prompt"] == "ab");
}

TEST_CASE("openai http: /tokenize takes the bearer token and the drain as completions do",
          "[openai][server]") {
  ServiceOptions service = SmallOptions();
  service.bearer_token = "secret";
  Api api(service);
  auto none = api.Post("/tokenize", {{"prompt", "x"}});
  REQUIRE(none);
  CHECK(none->status == 401);
  const httplib::Headers auth = {{"Authorization", "Bearer secret"}};
  auto ok = api.Post("/detokenize", {{"tokens", {104, 105}}}, auth);
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(Json::parse(ok->body)["prompt"] == "hi");
  // A body to another method of these paths: 405, unread, as for
  // /v1/completions.
  for (const char* path : {"/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize"}) {
    httplib::Request get;
    get.method = "GET";
    get.path = path;
    get.headers = auth;
    get.body = "{}";
    get.set_header("Content-Type", "application/json");
    auto r = api.client->send(get);
    REQUIRE(r);
    CHECK(r->status == 405);
    CHECK(r->get_header_value("Allow") == "POST");
  }
  api.grpc.service().StartDraining();
  auto draining = api.Post("/tokenize", {{"prompt", "x"}}, auth);
  REQUIRE(draining);
  CHECK(draining->status == 503);
  CHECK(draining->get_header_value("Retry-After") == "1");
}

TEST_CASE("openai http: a prompt that fits with a max_tokens that does not is 400 max_tokens",
          "[openai][server]") {
  ServiceOptions service = SmallOptions();
  service.max_context_tokens = 100;
  Api api(service);
  // The fixture is a byte model: 90 bytes of text are 90 tokens, as 90 ids.
  for (const Json& prompt : {Json(std::string(90, 'a')), Json(std::vector<int>(90, 97))}) {
    INFO(prompt.dump().substr(0, 20));
    auto over = api.Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 11}});
    REQUIRE(over);
    CHECK(over->status == 400);
    const Json error = Error(over);
    CHECK(error["param"] == "max_tokens");
    CHECK(error["code"] == "context_length_exceeded");
    CHECK_THAT(std::string(error["message"]),
               Contains("maximum context length is 100 tokens. However, you requested 101 "
                        "tokens (90 in the prompt, 11 in max_tokens)"));
    // Exactly at the limit it runs, to its max_tokens.
    auto fits = api.Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 10},
                                             {"temperature", 0}, {"ignore_eos", true}});
    REQUIRE(fits);
    CHECK(fits->status == 200);
    CHECK(Json::parse(fits->body)["usage"]["completion_tokens"] == 10);
  }
  // The default max_tokens (16) counts too.
  auto by_default = api.Post("/v1/completions", {{"prompt", std::string(90, 'a')}});
  REQUIRE(by_default);
  CHECK(by_default->status == 400);
  CHECK(Error(by_default)["param"] == "max_tokens");
  // A prompt over the limit alone stays the service's refusal, param prompt.
  auto too_long = api.Post("/v1/completions", {{"prompt", std::string(100, 'a')}, {"max_tokens", 1}});
  REQUIRE(too_long);
  CHECK(too_long->status == 400);
  CHECK(Error(too_long)["param"] == "prompt");
}

TEST_CASE("openai http: the max_tokens check counts the padding to the chunk boundary",
          "[openai][server]") {
  FixtureModel& padded = PaddingFixture();
  REQUIRE(padded.chunk_size() == 63);
  ServiceOptions service = SmallOptions();
  service.max_context_tokens = 100;
  Api api(*padded.model, *padded.backend, service);
  // 30 tokens pad to 63 before generating: 37 tokens of room, not 70.
  for (const Json& prompt : {Json(std::string(30, 'a')), Json(std::vector<int>(30, 97))}) {
    INFO(prompt.dump().substr(0, 20));
    auto over = api.Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 38}});
    REQUIRE(over);
    CHECK(over->status == 400);
    CHECK(Error(over)["param"] == "max_tokens");
    CHECK(Error(over)["code"] == "context_length_exceeded");
    CHECK_THAT(std::string(Error(over)["message"]),
               Contains("you requested 101 tokens (30 in the prompt, 33 of padding to the chunk "
                        "boundary, 38 in max_tokens): reduce max_tokens to at most 37"));
    // The advised max_tokens runs, to its end.
    auto advised = api.Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 37},
                                                {"temperature", 0}, {"ignore_eos", true}});
    REQUIRE(advised);
    CHECK(advised->status == 200);
    CHECK(Json::parse(advised->body)["usage"]["completion_tokens"] == 37);
  }
  // 70 tokens fit but pad to 126: refused up front by the prompt, naming the
  // longest prompt that leaves room (63, a whole chunk), which runs.
  auto no_room = api.Post("/v1/completions", {{"prompt", std::string(70, 'a')}, {"max_tokens", 1}});
  REQUIRE(no_room);
  CHECK(no_room->status == 400);
  CHECK(Error(no_room)["param"] == "prompt");
  CHECK(Error(no_room)["code"] == "context_length_exceeded");
  CHECK_THAT(std::string(Error(no_room)["message"]),
             Contains("70 tokens with their padding to the chunk boundary (56 more") &&
                 Contains("shorten the prompt to at most 63 tokens"));
  auto longest = api.Post("/v1/completions", {{"prompt", std::string(63, 'a')}, {"max_tokens", 37},
                                              {"temperature", 0}, {"ignore_eos", true}});
  REQUIRE(longest);
  CHECK(longest->status == 200);
  CHECK(Json::parse(longest->body)["usage"]["completion_tokens"] == 37);
  // Echo with max_tokens 0 generates and pads nothing (Complete's
  // prompt_only): the same 70 tokens run (review-echo E2: refused as above).
  auto echoed = api.Post("/v1/completions", {{"prompt", std::string(70, 'a')}, {"max_tokens", 0},
                                             {"echo", true}});
  REQUIRE(echoed);
  CHECK(echoed->status == 200);
  CHECK(Json::parse(echoed->body)["choices"][0]["text"] == std::string(70, 'a'));
}

TEST_CASE("openai http: an id prompt's own refusal comes before the max_tokens check",
          "[openai][server]") {
  ServiceOptions service = SmallOptions();
  service.max_context_tokens = 100;
  Api api(service);
  // The fixture: pad 298, landmark 299, vocab 300. A max_tokens far over the
  // limit would be refused first, hiding the id's problem. (The adapter's
  // own refusal, naming the index in the prompt as sent: review-newuser N2.)
  const std::vector<std::pair<int, std::string>> bad = {
      {299, "prompt[1]: token 299 is the landmark id"},
      {298, "prompt[1]: token 298 is the pad id"},
      {300, "prompt[1]: token 300 is outside the vocabulary"}};
  for (const auto& [id, words] : bad) {
    INFO(id);
    auto r = api.Post("/v1/completions",
                      {{"prompt", std::vector<int>{97, id}}, {"max_tokens", 5000}});
    REQUIRE(r);
    CHECK(r->status == 400);
    CHECK_THAT(std::string(Error(r)["message"]), Contains(words));
    CHECK(Error(r)["param"] == "prompt");
  }
}

}  // namespace
}  // namespace drt::server

namespace drt::server {
namespace {

TEST_CASE("openai tokenizer_info: the eos spelling and ids, null where the model has none",
          "[openai]") {
  drt::v1::ModelInfo info;
  info.set_tokenizer("gpt2-bpe");
  info.set_max_context_tokens(1 << 20);
  info.set_vocab_size(50258);
  info.set_eos_id(50256);
  info.set_pad_id(50257);
  const nlohmann::json bpe =
      nlohmann::json::parse(TokenizerInfoJson(info, std::string("<|endoftext|>")));
  CHECK(bpe["eos_token"] == "<|endoftext|>");
  CHECK(bpe["eos_token_id"] == 50256);
  CHECK(bpe["pad_token_id"] == 50257);
  CHECK(bpe["model_max_length"] == 1 << 20);
  CHECK(bpe["tokenizer_class"] == "gpt2-bpe");
  info.set_eos_id(-1);
  const nlohmann::json none = nlohmann::json::parse(TokenizerInfoJson(info, std::nullopt));
  REQUIRE(none.contains("eos_token"));
  CHECK(none["eos_token"].is_null());
  CHECK(none["eos_token_id"].is_null());
}

}  // namespace
}  // namespace drt::server

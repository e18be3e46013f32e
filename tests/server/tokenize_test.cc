// Tokenize and Detokenize (server/tokenize_calls.h; docs/api.md, "Tokenize
// and Detokenize"): the functions against the tokenizer called directly,
// Hugging Face's GPT-2 ids and hand-computed byte cases, and the rpcs
// through the service (Admit's credentials and drain, the metrics).
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "engine/model.h"
#include "server/tokenize_calls.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

std::unique_ptr<Tokenizer> Gpt2() {
  auto tokenizer = LoadBpeTokenizer(std::string(drt::testing::SourceDir()) +
                                    "/tests/fixtures/gpt2-tokenizer/tokenizer.json");
  if (!tokenizer.ok()) throw std::runtime_error(std::string(tokenizer.status().message()));
  return *std::move(tokenizer);
}

drt::v1::TokenizeRequest TextRequest(const std::string& text, bool count_only = false) {
  drt::v1::TokenizeRequest request;
  request.set_text(text);
  request.set_count_only(count_only);
  return request;
}

drt::v1::DetokenizeRequest IdsRequest(const std::vector<int32_t>& ids) {
  drt::v1::DetokenizeRequest request;
  request.mutable_ids()->Add(ids.begin(), ids.end());
  return request;
}

std::vector<int32_t> Ids(const drt::v1::TokenizeResponse& response) {
  return {response.ids().begin(), response.ids().end()};
}

TEST_CASE("Tokenize gives Hugging Face's GPT-2 ids", "[tokenize]") {
  const std::unique_ptr<Tokenizer> gpt2 = Gpt2();
  std::ifstream in(std::string(drt::testing::SourceDir()) +
                   "/tests/fixtures/gpt2-tokenizer/hf_encodings.jsonl");
  REQUIRE(in);
  std::string line;
  int checked = 0;
  while (std::getline(in, line) && checked < 100) {
    const auto entry = nlohmann::json::parse(line);
    const std::string text = entry["text"].get<std::string>();
    const std::vector<int32_t> expected = entry["ids"].get<std::vector<int32_t>>();
    INFO("text: " << entry["text"].dump());
    auto response = TokenizeText(*gpt2, TextRequest(text), 1234);
    REQUIRE(response.ok());
    CHECK(Ids(*response) == expected);
    CHECK(response->count() == static_cast<int64_t>(expected.size()));
    CHECK(response->max_context_tokens() == 1234);
    // text_bytes: the same ids.
    drt::v1::TokenizeRequest bytes_request;
    bytes_request.set_text_bytes(text);
    auto from_bytes = TokenizeText(*gpt2, bytes_request, 1234);
    REQUIRE(from_bytes.ok());
    CHECK(Ids(*from_bytes) == expected);
    // count_only: the count, no ids.
    auto counted = TokenizeText(*gpt2, TextRequest(text, true), 1234);
    REQUIRE(counted.ok());
    CHECK(counted->ids_size() == 0);
    CHECK(counted->count() == static_cast<int64_t>(expected.size()));
    ++checked;
  }
  CHECK(checked == 100);
}

TEST_CASE("Detokenize spells GPT-2 ids back, a split character as U+FFFD", "[tokenize]") {
  const std::unique_ptr<Tokenizer> gpt2 = Gpt2();
  const ModelConfig config{.vocab_size = 50257, .chunk_id = 50258, .pad_id = 50259};
  // "Hello" = 15496 (HF); "日" is bytes E6 97 A5, which GPT-2 spells as
  // 33768 (E6 97) + 98 (A5) in hf_encodings.jsonl's fourth line.
  auto hello = DetokenizeIds(*gpt2, config, IdsRequest({15496, 33768, 98}));
  REQUIRE(hello.ok());
  CHECK(hello->text() == "Hello\xE6\x97\xA5");
  CHECK(hello->text_bytes() == "Hello\xE6\x97\xA5");
  auto cut = DetokenizeIds(*gpt2, config, IdsRequest({15496, 33768}));
  REQUIRE(cut.ok());
  CHECK(cut->text() == "Hello" + kReplacement);
  CHECK(cut->text_bytes() == "Hello\xE6\x97");
  CHECK(cut->ids_without_text() == 0);
}

TEST_CASE("Tokenize refuses text over its per-call limit by name", "[tokenize]") {
  const std::unique_ptr<Tokenizer> bytes = MakeByteTokenizer();
  const std::string at_limit(static_cast<size_t>(kMaxTokenizeTextBytes), 'a');
  auto fits = TokenizeText(*bytes, TextRequest(at_limit, true), 0);
  REQUIRE(fits.ok());
  CHECK(fits->count() == kMaxTokenizeTextBytes);
  auto over = TokenizeText(*bytes, TextRequest(at_limit + "a", true), 0);
  REQUIRE(over.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(over.status().message()),
             Contains("67108865 bytes is over the 67108864 bytes one Tokenize call takes"));
}

TEST_CASE("Detokenize of byte ids: hand-computed cases", "[tokenize]") {
  // The two_groups layout: bytes 0..255, no text for 256..297, eos = pad =
  // 298, landmark 299, vocab 300.
  const std::unique_ptr<Tokenizer> bytes = MakeByteTokenizer(/*eos_id=*/298);
  ModelConfig config{.vocab_size = 300, .chunk_id = 299, .pad_id = 298};
  auto run = [&](const std::vector<int32_t>& ids) {
    return DetokenizeIds(*bytes, config, IdsRequest(ids));
  };
  SECTION("whole characters") {
    auto r = run({'a', 0xC3, 0xA9, 'b'});  // "aéb"
    REQUIRE(r.ok());
    CHECK(r->text() == "a\xC3\xA9" "b");
    CHECK(r->text_bytes() == "a\xC3\xA9" "b");
  }
  SECTION("ids ending inside a character: U+FFFD in text, the byte in text_bytes") {
    auto r = run({'a', 0xE6, 0x97});
    REQUIRE(r.ok());
    CHECK(r->text() == "a" + kReplacement);
    CHECK(r->text_bytes() == "a\xE6\x97");
  }
  SECTION("invalid bytes: one U+FFFD each maximal ill-formed part") {
    auto r = run({0xFF, 'x', 0x80, 0x80});
    REQUIRE(r.ok());
    CHECK(r->text() == kReplacement + "x" + kReplacement + kReplacement);
    CHECK(r->text_bytes() == "\xFFx\x80\x80");
  }
  SECTION("ids without text (256..297, eos) add nothing and are counted") {
    auto r = run({'h', 256, 'i', 297, 298});
    REQUIRE(r.ok());
    CHECK(r->text() == "hi");
    CHECK(r->text_bytes() == "hi");
    CHECK(r->ids_without_text() == 3);
  }
  SECTION("the landmark id is refused by name") {
    auto r = run({'a', 299});
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(r.status().message()), Contains("ids[1]: token 299 is the landmark id"));
  }
  SECTION("a pad id that is not the eos id is refused by name") {
    config.pad_id = 290;
    auto r = run({290});
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(r.status().message()), Contains("ids[0]: token 290 is the pad id"));
  }
  SECTION("ids outside the vocabulary are refused by name") {
    for (int32_t id : {300, -1}) {
      auto r = run({'a', 'b', id});
      REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(r.status().message()),
                 Contains("ids[2]: token " + std::to_string(id) +
                          " is outside the vocabulary [0, 300)"));
    }
  }
}

TEST_CASE("Tokenize and Detokenize rpcs answer as the functions do", "[tokenize]") {
  ServiceOptions options = SmallOptions();
  options.max_context_tokens = 5000;
  InProcessServer server(options);
  const Model& model = *FixtureModel::Get().model;
  const std::string text = "caf\xC3\xA9 au lait";
  grpc::ClientContext c1;
  drt::v1::TokenizeResponse tokenized;
  grpc::Status s = server.stub().Tokenize(&c1, TextRequest(text), &tokenized);
  REQUIRE(s.ok());
  CHECK(Ids(tokenized) == *model.tokenizer->Encode(text));
  CHECK(tokenized.count() == static_cast<int64_t>(text.size()));  // a byte model
  CHECK(tokenized.max_context_tokens() == 5000);

  grpc::ClientContext c2;
  drt::v1::DetokenizeResponse detokenized;
  s = server.stub().Detokenize(&c2, IdsRequest(Ids(tokenized)), &detokenized);
  REQUIRE(s.ok());
  CHECK(detokenized.text() == text);

  grpc::ClientContext c3;
  s = server.stub().Detokenize(&c3, IdsRequest({'a', 299}), &detokenized);
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(s.error_message(), Contains("landmark id"));

  const std::string metrics = server.metrics().RenderPrometheus();
  CHECK_THAT(metrics, Contains("drt_requests_total{method=\"Tokenize\"} 1\n"));
  CHECK_THAT(metrics, Contains("drt_requests_total{method=\"Detokenize\"} 2\n"));
}

TEST_CASE("Tokenize and Detokenize go through the credentials and the drain", "[tokenize]") {
  ServiceOptions options = SmallOptions();
  options.bearer_token = "secret";
  InProcessServer server(options);
  {
    grpc::ClientContext context;
    drt::v1::TokenizeResponse response;
    const grpc::Status s = server.stub().Tokenize(&context, TextRequest("x"), &response);
    CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer secret");
    drt::v1::DetokenizeResponse response;
    const grpc::Status s = server.stub().Detokenize(&context, IdsRequest({'x'}), &response);
    REQUIRE(s.ok());
    CHECK(response.text() == "x");
  }
  server.service().StartDraining();
  for (bool tokenize : {true, false}) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer secret");
    drt::v1::TokenizeResponse t;
    drt::v1::DetokenizeResponse d;
    const grpc::Status s = tokenize ? server.stub().Tokenize(&context, TextRequest("x"), &t)
                                    : server.stub().Detokenize(&context, IdsRequest({'x'}), &d);
    CHECK(s.error_code() == grpc::StatusCode::UNAVAILABLE);
  }
}

}  // namespace
}  // namespace drt::server

// End to end with the bundled trained model (models/drt-passkey-byte): a pass
// key hidden in a haystack of 60,000+ tokens goes into a session over gRPC as
// text, and the greedy answer must name it. The haystack is written here
// from the task's strings, independently of bench/niah's builder and of the
// training data code, the way a client would write it.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/build_paths.h"

namespace drt::server::testing {
namespace {

const std::string kModelDir = std::string(drt::testing::SourceDir()) + "/models/drt-passkey-byte";
constexpr char kFiller[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
constexpr char kQuestion[] = "What is the pass key? The pass key is";

// Loaded once for the whole test binary.
FixtureModel& BundledModel() {
  static FixtureModel* bundled = new FixtureModel(FixtureModel::Load(kModelDir));
  return *bundled;
}

// About `bytes` bytes (= tokens for this byte-level model): whole filler
// sentences, the needle after `depth` of them, the question last.
std::string Haystack(size_t bytes, double depth, const std::string& key) {
  const std::string needle = "The pass key is " + key + ". Remember it. " + key + " is the pass key. ";
  const std::string filler = kFiller;
  const size_t units = (bytes - needle.size() - sizeof(kQuestion)) / filler.size();
  const size_t before = static_cast<size_t>(depth * units);
  std::string text;
  for (size_t i = 0; i < before; ++i) text += filler;
  text += needle;
  for (size_t i = before; i < units; ++i) text += filler;
  return text + kQuestion;
}

std::vector<std::string> Pieces(const std::string& text, size_t piece) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size(); i += piece) out.push_back(text.substr(i, piece));
  return out;
}

TEST_CASE("Bundled model: a pass key in a 60,000-token haystack comes back over gRPC",
          "[server][passkey]") {
  FixtureModel& bundled = BundledModel();
  ServiceOptions options = SmallOptions();
  options.model_name = "drt-passkey-byte";
  InProcessServer server(*bundled.model, *bundled.backend, options);

  drt::v1::ModelInfo info;
  {
    grpc::ClientContext context;
    REQUIRE(server.stub().GetModelInfo(&context, {}, &info).ok());
  }
  CHECK(info.tokenizer() == "bytes");
  // The model was trained (and measured, docs/passkey_accuracy.md) for
  // answers after the question is padded to the chunk boundary.
  CHECK(info.pad_to_chunk_boundary());

  std::mt19937 rng(20261122);
  std::uniform_int_distribution<int> digit(0, 9);
  for (double depth : {0.1, 0.5, 0.9}) {
    std::string key;
    for (int i = 0; i < 5; ++i) key += static_cast<char>('0' + (i == 0 ? 1 + digit(rng) % 9 : digit(rng)));
    const std::string haystack = Haystack(60'000, depth, key);
    REQUIRE(haystack.size() >= 59'900);
    INFO("depth " << depth << ", key " << key);
    const std::string id = NewSession(server.stub());
    const AppendResult appended = AppendTexts(server.stub(), id, Pieces(haystack, 16 << 10));
    REQUIRE(appended.status.ok());
    REQUIRE(appended.summary.has_value());
    CHECK(appended.summary->tokens_ingested() == static_cast<int64_t>(haystack.size()));
    // pad_to_chunk_boundary unset: the model's default applies.
    const GenerateResult answer = GenerateGreedy(server.stub(), id, 8);
    REQUIRE(answer.status.ok());
    INFO("answer '" << answer.text << "'");
    CHECK(answer.text.rfind(" " + key + ".", 0) == 0);
  }
}

// The padding default comes from the model directory, and a request that
// sets the field overrides it: padding shows in the session's length.
TEST_CASE("Bundled model: Generate pads by the model's default unless the request says",
          "[server][passkey]") {
  FixtureModel& bundled = BundledModel();
  InProcessServer server(*bundled.model, *bundled.backend, SmallOptions());
  const std::string prompt(100, 'a');  // 100 tokens: the open chunk holds 37 of 63
  for (int mode = 0; mode < 3; ++mode) {  // 0: unset, 1: true, 2: false
    INFO("mode " << mode);
    const std::string id = NewSession(server.stub());
    REQUIRE(AppendTexts(server.stub(), id, {prompt}).status.ok());
    drt::v1::GenerateRequest request = GreedyRequest(id, 2);
    request.mutable_sampling()->set_temperature(0);
    if (mode > 0) request.set_pad_to_chunk_boundary(mode == 1);
    const GenerateResult answer = Generate(server.stub(), request);
    REQUIRE(answer.status.ok());
    REQUIRE(answer.tokens.size() == 2);
    const InfoResult info = GetSession(server.stub(), id);
    REQUIRE(info.status.ok());
    const int64_t padded = mode == 2 ? 100 : 126;
    CHECK(info.info.tokens() == padded + 2);
  }
}

}  // namespace
}  // namespace drt::server::testing

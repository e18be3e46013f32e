// End to end with the bundled any-text model (models/drt-text-byte): pass
// keys and keyed needles hidden in prose the model never saw in training (the
// Debian Administrator's Handbook excerpt, a held-out family of
// docs/training.md) go into sessions over gRPC as text, and the greedy answer
// must name the asked key. The haystacks are written here from the tasks'
// strings, independently of bench/niah's builder and of the training code.
#include <catch2/catch.hpp>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/build_paths.h"

namespace drt::server::testing {
namespace {

const std::string kModelDir = std::string(drt::testing::SourceDir()) + "/models/drt-text-byte";
const std::string kProse =
    std::string(drt::testing::SourceDir()) + "/tests/fixtures/heldout-text/debian_handbook_excerpt.txt";

FixtureModel& TextModel() {
  static FixtureModel* model = new FixtureModel(FixtureModel::Load(kModelDir));
  return *model;
}

std::string ReadProse() {
  std::ifstream in(kProse, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string RandomKey(std::mt19937& rng) {
  std::uniform_int_distribution<int> digit(0, 9);
  std::string key(1, static_cast<char>('1' + digit(rng) % 9));
  for (int i = 0; i < 4; ++i) key += static_cast<char>('0' + digit(rng));
  return key;
}

// Cuts `prose` right after the last space or newline at or before `at`, so
// that an insert never splits a word.
size_t WordBoundary(const std::string& prose, size_t at) {
  for (size_t p = at; p > 0 && at - p < 64; --p) {
    if (prose[p - 1] == ' ' || prose[p - 1] == '\n') return p;
  }
  return at;
}

// `bytes` bytes of prose from `start`, with each insert placed at its
// fraction of the prose, then the question.
std::string Haystack(const std::string& prose, size_t start, size_t bytes,
                     const std::vector<std::pair<double, std::string>>& inserts,
                     const std::string& question) {
  size_t body = bytes - question.size();
  for (const auto& insert : inserts) body -= insert.second.size();
  const std::string text = prose.substr(start, body);
  std::string out;
  size_t cursor = 0;
  for (const auto& [fraction, insert] : inserts) {
    const size_t at = WordBoundary(text, static_cast<size_t>(fraction * body));
    out += text.substr(cursor, at - cursor) + insert;
    cursor = at;
  }
  return out + text.substr(cursor) + question;
}

std::string Answer(InProcessServer& server, const std::string& haystack) {
  const std::string id = NewSession(server.stub());
  const AppendResult appended = AppendTexts(server.stub(), id, {haystack});
  REQUIRE(appended.status.ok());
  const GenerateResult answer = GenerateGreedy(server.stub(), id, 8);
  REQUIRE(answer.status.ok());
  return answer.text;
}

TEST_CASE("Any-text model: pass keys in held-out prose come back over gRPC", "[server][passkey]") {
  FixtureModel& model = TextModel();
  ServiceOptions options = SmallOptions();
  options.model_name = "drt-text-byte";
  InProcessServer server(*model.model, *model.backend, options);
  const std::string prose = ReadProse();
  REQUIRE(prose.size() > 100'000);
  std::mt19937 rng(20261123);
  // Measured at 16K on the whole handbook (docs/passkey_accuracy.md, "The
  // bundled any-text model"): 60/60 on the CPU and 60/60 with CUDA bf16. So
  // every one of these must be right.
  for (double depth : {0.1, 0.5, 0.9}) {
    const std::string key = RandomKey(rng);
    const size_t start = std::uniform_int_distribution<size_t>(0, prose.size() - 20'000)(rng);
    const std::string haystack =
        Haystack(prose, start, 16'384, {{depth, "The pass key is " + key + ". Remember it. " + key + " is the pass key. "}},
                 "What is the pass key? The pass key is");
    INFO("depth " << depth << ", key " << key << ", prose from byte " << start);
    const std::string answer = Answer(server, haystack);
    INFO("answer '" << answer << "'");
    CHECK(answer.rfind(" " + key + ".", 0) == 0);
  }
}

TEST_CASE("Any-text model: the question picks one of several keyed needles in held-out prose",
          "[server][passkey]") {
  FixtureModel& model = TextModel();
  InProcessServer server(*model.model, *model.backend, SmallOptions());
  const std::string prose = ReadProse();
  const std::vector<std::string> names = {"blue door", "red box", "green gate"};
  std::mt19937 rng(7);
  int right = 0;
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<std::pair<double, std::string>> needles;
    std::vector<std::string> keys;
    for (int i = 0; i < 3; ++i) {
      keys.push_back(RandomKey(rng));
      needles.push_back({0.15 + 0.3 * i, "The pass key of the " + names[i] + " is " + keys[i] + ". "});
    }
    const int ask = trial % 3;
    const size_t start = std::uniform_int_distribution<size_t>(0, prose.size() - 20'000)(rng);
    const std::string haystack =
        Haystack(prose, start, 16'384, needles,
                 "What is the pass key of the " + names[ask] + "? The pass key of the " + names[ask] + " is");
    const std::string answer = Answer(server, haystack);
    const bool ok = answer.rfind(" " + keys[ask] + ".", 0) == 0;
    if (!ok) WARN("trial " << trial << ": asked " << names[ask] << " = " << keys[ask] << ", answer '" << answer << "'");
    right += ok ? 1 : 0;
  }
  // Measured, keyed at 16K on the whole handbook (docs/passkey_accuracy.md):
  // 51/60 (85%) on the CPU, 55/60 with CUDA bf16; these six haystacks: 6/6
  // on the CPU. At most one miss in six allows for that rate; a model that
  // ignores the question (right a third of the time at best, when it
  // returns some needle's key) fails.
  CHECK(right >= 5);
}

}  // namespace
}  // namespace drt::server::testing

// drt-niah-text's task generators (bench/niah/text_tasks.h), checked on the
// assembled prompt by searching it, independently of how it was built: exact
// length, the text intact around the needles, each needle once at its depth,
// the answer the key the question asks for, 2-hop chains that resolve.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "bench/niah/passkey_haystack.h"
#include "bench/niah/text_tasks.h"

namespace drt::niah {
namespace {

// Words of varying length separated by spaces and newlines.
std::string SampleText(int bytes) {
  std::string out;
  for (int i = 0; static_cast<int>(out.size()) < bytes; ++i) {
    out += "word" + std::to_string(i * 7919 % 1000);
    out += (i % 11 == 10) ? "\n" : " ";
  }
  out.resize(bytes);
  return out;
}

int Count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

// The prompt with the inserts and the question cut out must be the text read
// from `start`, wrapping around.
void RequireFillerIntact(const std::string& text, int64_t start, const TextTrial& trial, const std::string& prompt,
                         int64_t length) {
  std::string rest = prompt;
  REQUIRE(rest.size() >= trial.question.size());
  REQUIRE(rest.substr(rest.size() - trial.question.size()) == trial.question);
  rest.resize(rest.size() - trial.question.size());
  std::string filler;
  size_t cursor = 0;
  int64_t removed = 0;
  for (const Insert& insert : trial.inserts) {
    const size_t at = static_cast<size_t>(insert.at + removed);
    REQUIRE(rest.compare(at, insert.text.size(), insert.text) == 0);
    filler += rest.substr(cursor, at - cursor);
    cursor = at + insert.text.size();
    removed += static_cast<int64_t>(insert.text.size());
    // Never inside a word: after a space or newline (the text has one every <= 12 bytes).
    if (insert.at > 0) REQUIRE((rest[at - 1] == ' ' || rest[at - 1] == '\n'));
  }
  filler += rest.substr(cursor);
  REQUIRE(static_cast<int64_t>(filler.size()) == FillerBytes(trial, length));
  for (size_t i = 0; i < filler.size(); ++i) {
    if (filler[i] != text[(static_cast<size_t>(start) + i) % text.size()]) FAIL("filler differs at byte " << i);
  }
}

TEST_CASE("text-task haystacks: exact length, intact text, the needle once at its depth", "[niah]") {
  const std::string text = SampleText(20000);
  uint64_t state = 7;
  for (TextTask task : {TextTask::kPasskey, TextTask::kPasskeyVaried, TextTask::kKeyed, TextTask::kTwoHop}) {
    for (int64_t length : {1500, 8192, 50000}) {  // 50000 wraps the 20000-byte text
      for (double depth : {0.0, 0.1, 0.5, 0.9, 1.0}) {
        const int64_t start = static_cast<int64_t>(RandomBelow(state, text.size()));
        const TextFiller filler(text, start);
        auto trial = MakeTextTrial(task, filler, length, depth, state);
        REQUIRE(trial.ok());
        const std::string prompt = AssemblePrompt(filler, *trial, length);
        REQUIRE(static_cast<int64_t>(prompt.size()) == length);
        RequireFillerIntact(text, start, *trial, prompt, length);
        // The answer's needle sits at the depth of the filler, up to the word-boundary snap.
        const double want = depth * static_cast<double>(FillerBytes(*trial, length));
        REQUIRE(trial->target_at <= static_cast<int64_t>(want));
        REQUIRE(trial->target_at >= static_cast<int64_t>(want) - 64);
        REQUIRE(trial->answer.size() == 5);
        REQUIRE(trial->answer[0] != '0');
        if (task == TextTask::kPasskey) {
          const HaystackFormat exact;
          REQUIRE(trial->question == "\n" + exact.question);
          const std::string needle = "The pass key is " + trial->answer + ". Remember it. " + trial->answer +
                                     " is the pass key. ";
          REQUIRE(exact.needle.find("{key}") != std::string::npos);  // the format these strings spell out
          REQUIRE(Count(prompt, needle) == 1);
          REQUIRE(Count(prompt, trial->answer) == 2);
        }
        if (task == TextTask::kPasskeyVaried) {
          REQUIRE(Count(prompt, trial->answer) == 1);
          REQUIRE(Count(prompt, "pass key") == 0);  // not the training wording
          REQUIRE(trial->inserts.size() == 1);
        }
      }
    }
  }
}

TEST_CASE("keyed needles: three distinct names, the question picks one, the answer is its key", "[niah]") {
  const std::string text = SampleText(30000);
  uint64_t state = 11;
  const std::regex needle_re("The pass key of the ([a-z]+ [a-z]+) is ([0-9]{5})\\. ");
  const std::regex question_re("\nWhat is the pass key of the ([a-z]+ [a-z]+)\\? The pass key of the \\1 is$");
  int target_first = 0, target_last = 0;
  for (int t = 0; t < 60; ++t) {
    const TextFiller filler(text, static_cast<int64_t>(RandomBelow(state, text.size())));
    auto trial = MakeTextTrial(TextTask::kKeyed, filler, 16384, 0.5, state);
    REQUIRE(trial.ok());
    const std::string prompt = AssemblePrompt(filler, *trial, 16384);
    std::map<std::string, std::string> key_of;
    std::vector<std::string> order;
    for (auto it = std::sregex_iterator(prompt.begin(), prompt.end(), needle_re); it != std::sregex_iterator(); ++it) {
      REQUIRE(key_of.count((*it)[1]) == 0);
      key_of[(*it)[1]] = (*it)[2];
      order.push_back((*it)[1]);
    }
    REQUIRE(key_of.size() == 3);
    std::set<std::string> keys;
    for (const auto& [name, key] : key_of) keys.insert(key);
    REQUIRE(keys.size() == 3);
    std::smatch q;
    REQUIRE(std::regex_search(prompt, q, question_re));
    REQUIRE(key_of.at(q[1]) == trial->answer);
    if (order.front() == q[1].str()) ++target_first;
    if (order.back() == q[1].str()) ++target_last;
  }
  // The asked needle is neither always first nor always last (distractors on both sides).
  REQUIRE(target_first < 60);
  REQUIRE(target_last < 60);
}

TEST_CASE("2-hop variable tracking: the asked variable resolves through its chain to the answer", "[niah]") {
  const std::string text = SampleText(30000);
  uint64_t state = 3;
  const std::regex value_re("VAR ([A-Z]{5}) = ([0-9]{5})\\. ");
  const std::regex alias_re("VAR ([A-Z]{5}) = VAR ([A-Z]{5})\\. ");
  const std::regex question_re("\nWhat is the value of VAR ([A-Z]{5})\\? The value of VAR \\1 is$");
  for (double depth : {0.1, 0.5, 0.9}) {
    for (int t = 0; t < 20; ++t) {
      const TextFiller filler(text, static_cast<int64_t>(RandomBelow(state, text.size())));
      auto trial = MakeTextTrial(TextTask::kTwoHop, filler, 8192, depth, state);
      REQUIRE(trial.ok());
      const std::string prompt = AssemblePrompt(filler, *trial, 8192);
      std::map<std::string, std::pair<std::string, size_t>> value, alias;  // name -> (rhs, position)
      for (auto it = std::sregex_iterator(prompt.begin(), prompt.end(), value_re); it != std::sregex_iterator(); ++it) {
        value[(*it)[1]] = {(*it)[2], static_cast<size_t>(it->position())};
      }
      for (auto it = std::sregex_iterator(prompt.begin(), prompt.end(), alias_re); it != std::sregex_iterator(); ++it) {
        alias[(*it)[1]] = {(*it)[2], static_cast<size_t>(it->position())};
      }
      REQUIRE(value.size() == 2);
      REQUIRE(alias.size() == 2);
      std::smatch q;
      REQUIRE(std::regex_search(prompt, q, question_re));
      const auto& [middle, alias_at] = alias.at(q[1]);
      const auto& [key, value_at] = value.at(middle);
      REQUIRE(key == trial->answer);
      REQUIRE(value_at < alias_at);  // the chain reads forward
      // The distractor chain resolves to the other key.
      for (const auto& [name, rhs] : alias) {
        if (name != q[1].str()) REQUIRE(value.at(rhs.first).first != trial->answer);
      }
    }
  }
}

TEST_CASE("a haystack longer than the text repeats it, and TextRepeats says how often", "[niah]") {
  const std::string text = SampleText(5000);
  const TextFiller filler(text, 1234);
  // 12,500 bytes of filler read the 5,000-byte text 2.5 times: byte i and
  // byte i + 5000 are the same (the wrap the repeat count describes).
  const std::string bytes = filler.Bytes(0, 12500);
  REQUIRE(bytes.size() == 12500);
  REQUIRE(bytes.substr(0, 5000) == bytes.substr(5000, 5000));
  REQUIRE(bytes.substr(0, 2500) == bytes.substr(10000, 2500));
  REQUIRE(TextRepeats(12500, 5000) == Approx(2.5));
  // Up to the text's own size nothing repeats.
  REQUIRE(TextRepeats(5000, 5000) == Approx(1.0));
  REQUIRE(TextRepeats(4096, 5000) < 1.0);
  REQUIRE(Count(filler.Bytes(0, 5000), text.substr(0, 40)) == 1);
  // From offset 1234, 12,500 bytes hold the text's first 40 bytes twice (at 3,766
  // and 8,766), 5,000 bytes once.
  REQUIRE(Count(filler.Bytes(0, 12500), text.substr(0, 40)) == 2);
}

TEST_CASE("text tasks reject what they cannot build", "[niah]") {
  const std::string text = SampleText(5000);
  uint64_t state = 1;
  const TextFiller filler(text, 0);
  REQUIRE(MakeTextTrial(TextTask::kKeyed, filler, 100, 0.5, state).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(MakeTextTrial(TextTask::kPasskey, filler, 4096, 1.5, state).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(ParseTextTask("needle").status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(ParseTextTask("two_hop").value() == TextTask::kTwoHop);

  const auto dir = std::filesystem::temp_directory_path() / "drt_text_tasks_test";
  std::filesystem::create_directories(dir);
  REQUIRE(LoadFillerText((dir / "missing.txt").string()).status().code() == absl::StatusCode::kNotFound);
  { std::ofstream(dir / "small.txt") << "too short"; }
  REQUIRE(LoadFillerText((dir / "small.txt").string()).status().code() == absl::StatusCode::kInvalidArgument);
  { std::ofstream(dir / "b.txt") << text; }
  auto joined = LoadFillerText(dir.string());  // a directory: files sorted by name, joined by "\n"
  REQUIRE(joined.ok());
  REQUIRE(*joined == text + "\ntoo short");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace drt::niah

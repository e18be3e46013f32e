// Tests of the GPT-2 byte-level BPE tokenizer, the byte tokenizer and
// Utf8Streamer. Expected ids come from the GPT-2 vocabulary and from the
// Hugging Face `tokenizers` library (fixtures/gpt2-tokenizer/README.md).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"
#include "tests/test_util/build_paths.h"

namespace {

using Ids = std::vector<int32_t>;

const std::string kFixtureDir = std::string(drt::testing::SourceDir()) + "/tests/fixtures/gpt2-tokenizer";
const std::string kGpt2Path = kFixtureDir + "/tokenizer.json";

// Loaded once: parsing the 1.3 MB file takes a noticeable fraction of a second.
const drt::Tokenizer& Gpt2() {
  static const std::unique_ptr<drt::Tokenizer> tokenizer = [] {
    auto loaded = drt::LoadBpeTokenizer(kGpt2Path);
    if (!loaded.ok()) FAIL("cannot load " << kGpt2Path << ": " << loaded.status());
    return *std::move(loaded);
  }();
  return *tokenizer;
}

Ids Encode(const drt::Tokenizer& tokenizer, std::string_view text) {
  auto ids = tokenizer.Encode(text);
  REQUIRE(ids.ok());
  return *ids;
}

std::string Decode(const drt::Tokenizer& tokenizer, const Ids& ids) {
  auto text = tokenizer.Decode(ids);
  REQUIRE(text.ok());
  return *text;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 0;
    if (length == 0 || i + length > s.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

// A file in a fresh temporary directory, removed with the object.
class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    static std::atomic<int> counter{0};
    dir_ = std::filesystem::temp_directory_path() /
           ("drt_tokenizer_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(dir_);
    std::ofstream(path(), std::ios::binary) << contents;
  }
  ~TempFile() { std::filesystem::remove_all(dir_); }
  std::string path() const { return (dir_ / "tokenizer.json").string(); }

 private:
  std::filesystem::path dir_;
};

nlohmann::json Gpt2Json() {
  std::ifstream in(kGpt2Path);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("GPT-2 tokenizer reports its vocabulary and end-of-text id", "[tokenizer]") {
  // model.vocab holds ids 0..50264 (GPT-2's 50257 plus 8 extra entries).
  CHECK(Gpt2().vocab_size() == 50265);
  CHECK(Gpt2().eos_id() == 50256);
}

TEST_CASE("GPT-2 encodes known strings to known ids", "[tokenizer]") {
  const auto& t = Gpt2();
  CHECK(Encode(t, "Hello world") == Ids{15496, 995});
  CHECK(Encode(t, " the") == Ids{262});
  CHECK(Encode(t, "<|endoftext|>") == Ids{50256});
  CHECK(Encode(t, "Hello world<|endoftext|> The") == Ids{15496, 995, 50256, 383});
  CHECK(Encode(t, "x<|endoftext|>y") == Ids{87, 50256, 88});
  CHECK(Encode(t, "").empty());
}

TEST_CASE("GPT-2 single characters map to their one-byte tokens", "[tokenizer]") {
  // The vocabulary lists the 94 printable ASCII characters first, from '!' = 0;
  // space, newline and tab are the moved bytes 'Ġ' = 220, 'Ċ' = 198, 'ĉ' = 197.
  const auto& t = Gpt2();
  CHECK(Encode(t, "!") == Ids{0});
  CHECK(Encode(t, "0") == Ids{15});
  CHECK(Encode(t, "9") == Ids{24});
  CHECK(Encode(t, "A") == Ids{32});
  CHECK(Encode(t, "a") == Ids{64});
  CHECK(Encode(t, "~") == Ids{93});
  CHECK(Encode(t, " ") == Ids{220});
  CHECK(Encode(t, "\n") == Ids{198});
  CHECK(Encode(t, "\t") == Ids{197});
}

TEST_CASE("GPT-2 pre-tokenizer splits contractions, digits and whitespace runs", "[tokenizer]") {
  const auto& t = Gpt2();
  CHECK(Encode(t, "don't") == Ids{9099, 470});  // "don" + "'t"
  CHECK(Encode(t, "I'll we've they're he'd") == Ids{40, 1183, 356, 1053, 484, 821, 339, 1549});
  CHECK(Encode(t, "12345") == Ids{10163, 2231});  // "123" + "45"
  // A run of spaces leaves its last space to the next word: "a", " ", " b".
  CHECK(Encode(t, "a  b") == Ids{64, 220, 275});
  CHECK(Encode(t, "  hello   ") == Ids{220, 23748, 220, 220, 220});
  CHECK(Encode(t, "\n\n") == Ids{628});
  CHECK(Encode(t, "a\n\n b") == Ids{64, 628, 275});
  CHECK(Encode(t, "ab \t\ncd") == Ids{397, 220, 197, 198, 10210});
}

TEST_CASE("GPT-2 whitespace is Unicode White_Space, as in Oniguruma", "[tokenizer]") {
  // U+180E is not White_Space (PCRE2's own \s would include it), so it groups
  // with the following punctuation and "'s" is no contraction here.
  CHECK(Encode(Gpt2(), "\xE1\xA0\x8E's") == Ids{157, 254, 236, 6, 82});
  // U+00A0 (no-break space) is White_Space.
  CHECK(Encode(Gpt2(), "a\xC2\xA0" "b") == Ids{64, 1849, 65});
}

TEST_CASE("GPT-2 letters new in Unicode 15 keep the contraction after them whole", "[tokenizer]") {
  // Hugging Face tokenizers 0.23.2 (Unicode 16) gives these ids; with Unicode
  // 14 classes (PCRE2 10.42) "'t" and "'s" split into "'" + letter.
  CHECK(Encode(Gpt2(), "\U00011F0B't") == Ids{172, 239, 120, 233, 470});  // Kawi letter
  CHECK(Encode(Gpt2(), "\U00031350's") == Ids{172, 109, 235, 238, 338});  // CJK Extension H
}

TEST_CASE("GPT-2 encodings over code points new since Unicode 14 match Hugging Face",
          "[tokenizer]") {
  // 1,000 random strings over the letters and digits that Unicode 15 and 16
  // added, followed by contractions (weights_tools/gpt2_unicode_fixtures.js).
  std::ifstream in(kFixtureDir + "/hf_unicode16_encodings.jsonl");
  REQUIRE(in);
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    const auto entry = nlohmann::json::parse(line);
    INFO("text: " << entry["text"].dump());
    CHECK(Encode(Gpt2(), entry["text"].get<std::string>()) == entry["ids"].get<Ids>());
    ++checked;
  }
  CHECK(checked == 1000);
}

TEST_CASE("GPT-2 falls back to byte tokens for characters without a token", "[tokenizer]") {
  const auto& t = Gpt2();
  CHECK(Encode(t, "\xF0\x9F\x98\x80") == Ids{47249, 222});                 // 😀
  CHECK(Encode(t, "\xE4\xBD\xA0\xE5\xA5\xBD") == Ids{19526, 254, 25001, 121});  // 你好
  CHECK(Encode(t, "caf\xC3\xA9") == Ids{66, 1878, 2634});                  // café
  // Each of the four tokens of 你好 holds only part of a character.
  for (int32_t id : Encode(t, "\xE4\xBD\xA0\xE5\xA5\xBD")) {
    CHECK_FALSE(IsValidUtf8(Decode(t, {id})));
  }
}

TEST_CASE("GPT-2 vocabulary entries that are not added tokens are not split out", "[tokenizer]") {
  // "<mask>" is in model.vocab (id 50263) but not in added_tokens, so BPE
  // spells it from smaller pieces, as Hugging Face does.
  CHECK(Encode(Gpt2(), "<mask>") == Ids{27, 27932, 29});
  CHECK(Decode(Gpt2(), {50263}) == "<mask>");
}

TEST_CASE("GPT-2 encodings match the Hugging Face tokenizers library", "[tokenizer]") {
  std::ifstream in(kFixtureDir + "/hf_encodings.jsonl");
  REQUIRE(in);
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    const auto entry = nlohmann::json::parse(line);
    const std::string text = entry["text"].get<std::string>();
    INFO("text: " << entry["text"].dump());
    CHECK(Encode(Gpt2(), text) == entry["ids"].get<Ids>());
    ++checked;
  }
  CHECK(checked > 400);
}

TEST_CASE("GPT-2 decode inverts encode on multilingual text", "[tokenizer]") {
  const std::vector<std::string> texts = {
      "Hello, world! The quick brown fox jumps over the lazy dog.",
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C",  // 你好，世界
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9"
      "\xE3\x83\x88",  // 日本語のテキスト
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7\xD9\x84"
      "\xD9\x85",  // مرحبا بالعالم
      "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91"
      "\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7",  // emoji, ZWJ, flag
      "Cr\xC3\xA8me br\xC3\xBBl\xC3\xA9""e, na\xC3\xAFve fa\xC3\xA7""ade, \xC3\x85ngstr\xC3\xB6m",
      "e\xCC\x81 (combining accent)",
      "tabs\tand\r\nCRLF\n\n\n  mixed \xC2\xA0\xE3\x80\x80 spaces\x0B\x0C end ",
      "code: for (int i = 0; i < n; ++i) { x += y[i] * 2.5e-3; }",
      "<|endoftext|>between<|endoftext|><|endoftext|>",
      std::string("nul\0byte", 8),
  };
  for (const std::string& text : texts) {
    INFO("text: " << text);
    CHECK(Decode(Gpt2(), Encode(Gpt2(), text)) == text);
  }
}

TEST_CASE("GPT-2 encodes bytes that are not UTF-8 as byte tokens and round-trips them", "[tokenizer]") {
  const std::string text = "ok\xFF\xFE then \xC3 broken \xE4\xBD end";
  const Ids ids = Encode(Gpt2(), text);
  CHECK(Decode(Gpt2(), ids) == text);
}

TEST_CASE("GPT-2 encoding is fast and consistent on a few megabytes", "[tokenizer]") {
  std::string paragraph =
      "The tokenizer splits text into words, numbers like 1234 and 3.14159, and punctuation; "
      "it's applied to caf\xC3\xA9 menus, \xE4\xBD\xA0\xE5\xA5\xBD greetings and "
      "\xF0\x9F\x98\x80 emoji alike.\n";
  std::string text;
  for (int i = 0; text.size() < (2 << 20); ++i) text += std::to_string(i) + " " + paragraph;
  const auto start = std::chrono::steady_clock::now();
  const Ids ids = Encode(Gpt2(), text);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("encoded " << text.size() / 1e6 << " MB into " << ids.size() << " tokens at "
                  << text.size() / 1e6 / seconds << " MB/s");
  CHECK(Decode(Gpt2(), ids) == text);
  CHECK(seconds < 5.0);  // about 0.2 s on a 2-core developer machine
}

TEST_CASE("GPT-2 encodes a very long word without quadratic blow-up", "[tokenizer]") {
  const std::string word(200000, 'a');
  const Ids ids = Encode(Gpt2(), word);
  CHECK(ids.size() < word.size() / 2);
  CHECK(Decode(Gpt2(), ids) == word);
}

TEST_CASE("GPT-2 encoding is safe from several threads at once", "[tokenizer]") {
  const std::string text = "Threads share the word cache: alpha beta gamma delta 12345 \xE4\xBD\xA0\xE5\xA5\xBD!";
  const Ids expected = Encode(Gpt2(), text);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const std::string varied = text + " " + std::to_string(t * 1000 + i);
        auto ids = Gpt2().Encode(varied);
        if (!ids.ok() || !std::equal(expected.begin(), expected.end(), ids->begin())) ++mismatches;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(mismatches == 0);
}

TEST_CASE("Utf8Streamer never emits part of a character", "[tokenizer]") {
  const std::string text =
      "A\xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD caf\xC3\xA9 "
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7";
  const Ids ids = Encode(Gpt2(), text);
  drt::Utf8Streamer streamer;
  std::string streamed;
  bool some_piece_was_held_back = false;
  for (int32_t id : ids) {
    const std::string bytes = Decode(Gpt2(), {id});
    const std::string piece = streamer.Push(bytes);
    INFO("id " << id);
    CHECK(IsValidUtf8(piece));
    if (piece.size() != bytes.size()) some_piece_was_held_back = true;
    streamed += piece;
  }
  streamed += streamer.Flush();
  CHECK(some_piece_was_held_back);
  CHECK(streamed == Decode(Gpt2(), ids));
  CHECK(streamed == text);
}

TEST_CASE("Utf8Streamer replaces invalid and unfinished sequences with U+FFFD", "[tokenizer]") {
  const std::string fffd = "\xEF\xBF\xBD";
  drt::Utf8Streamer streamer;
  CHECK(streamer.Push("a\xFF" "b") == "a" + fffd + "b");   // impossible byte
  CHECK(streamer.Push("\x80") == fffd);                   // stray continuation byte
  CHECK(streamer.Push("\xE4\xBD") == "");                 // held back
  CHECK(streamer.Push("x") == fffd + "x");                // never completed
  CHECK(streamer.Push("\xED\xA0\x80") == fffd + fffd + fffd);  // surrogate: 3 bad bytes
  CHECK(streamer.Push("\xF0\x9F") == "");
  CHECK(streamer.Push("\x98") == "");
  CHECK(streamer.Push("\x80!") == "\xF0\x9F\x98\x80!");
  CHECK(streamer.Push("\xE4") == "");
  CHECK(streamer.Flush() == fffd);
  CHECK(streamer.Flush() == "");
  CHECK(streamer.Push("ok") == "ok");
}

TEST_CASE("GPT-2 Decode rejects unknown ids and names the file", "[tokenizer]") {
  for (int32_t id : {-1, 50265, 1 << 30}) {
    auto text = Gpt2().Decode({15496, id});
    REQUIRE_FALSE(text.ok());
    CHECK(text.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(text.status().message()), Catch::Contains(std::to_string(id)));
    CHECK_THAT(std::string(text.status().message()), Catch::Contains("tokenizer.json"));
  }
}

TEST_CASE("Loading reports a missing file", "[tokenizer]") {
  const std::string path = kFixtureDir + "/no-such-tokenizer.json";
  auto loaded = drt::LoadBpeTokenizer(path);
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(loaded.status().message()), Catch::Contains(path));
}

TEST_CASE("Loading reports malformed JSON", "[tokenizer]") {
  TempFile file("{\"model\": {\"vocab\": {\"a\": 0}, ");
  auto loaded = drt::LoadBpeTokenizer(file.path());
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(loaded.status().message()), Catch::Contains(file.path()));
  CHECK_THAT(std::string(loaded.status().message()), Catch::Contains("malformed JSON"));
}

TEST_CASE("Loading reports missing or broken model parts", "[tokenizer]") {
  struct Case {
    const char* name;
    void (*mutate)(nlohmann::json&);
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no vocab", [](nlohmann::json& j) { j["model"].erase("vocab"); }, "model.vocab is missing"},
      {"no merges", [](nlohmann::json& j) { j["model"].erase("merges"); }, "model.merges is missing"},
      {"no model", [](nlohmann::json& j) { j.erase("model"); }, "model is missing"},
      {"vocab id not a number", [](nlohmann::json& j) { j["model"]["vocab"]["hello"] = "x"; },
       "model.vocab entry \"hello\""},
      {"merge of an unknown token", [](nlohmann::json& j) { j["model"]["merges"][5] = "zzqx qqzx"; },
       "model.merges[5]"},
      {"merge without a space", [](nlohmann::json& j) { j["model"]["merges"][7] = "abc"; },
       "model.merges[7]"},
      {"wrong field type", [](nlohmann::json& j) { j["pre_tokenizer"]["add_prefix_space"] = "yes"; },
       "unexpected JSON content"},
      {"unsupported normalizer", [](nlohmann::json& j) { j["normalizer"] = {{"type", "NFC"}}; },
       "normalizer"},
      {"byte missing from the vocab", [](nlohmann::json& j) { j["model"]["vocab"].erase("\xC4\x80"); },
       "byte 0x00"},
  };
  const nlohmann::json gpt2 = Gpt2Json();
  for (const Case& c : cases) {
    INFO(c.name);
    nlohmann::json broken = gpt2;
    c.mutate(broken);
    TempFile file(broken.dump());
    auto loaded = drt::LoadBpeTokenizer(file.path());
    REQUIRE_FALSE(loaded.ok());
    CHECK_THAT(std::string(loaded.status().message()), Catch::Contains(c.message));
    CHECK_THAT(std::string(loaded.status().message()), Catch::Contains(file.path()));
  }
}

TEST_CASE("Merges may be written as two-element arrays", "[tokenizer]") {
  nlohmann::json j = Gpt2Json();
  for (auto& merge : j["model"]["merges"]) {
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    merge = nlohmann::json::array({text.substr(0, space), text.substr(space + 1)});
  }
  TempFile file(j.dump());
  auto loaded = drt::LoadBpeTokenizer(file.path());
  REQUIRE(loaded.ok());
  CHECK(Encode(**loaded, "Hello world") == Ids{15496, 995});
  CHECK(Encode(**loaded, "don't stop") == Ids{9099, 470, 2245});
}

TEST_CASE("ByteLevel add_prefix_space prefixes each text segment", "[tokenizer]") {
  nlohmann::json j = Gpt2Json();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  TempFile file(j.dump());
  auto loaded = drt::LoadBpeTokenizer(file.path());
  REQUIRE(loaded.ok());
  CHECK(Encode(**loaded, "Hello world") == Ids{18435, 995});
  CHECK(Encode(**loaded, " Hello") == Ids{18435});
  CHECK(Encode(**loaded, "Hello<|endoftext|>world") == Ids{18435, 50256, 995});
  CHECK(Encode(**loaded, "<|endoftext|> x") == Ids{50256, 2124});
}

TEST_CASE("Added token options lstrip, rstrip and single_word", "[tokenizer]") {
  // Expected ids are what Hugging Face produces with the same added token.
  const auto with_mask = [](const char* option) {
    nlohmann::json j = Gpt2Json();
    nlohmann::json mask = {{"id", 50263},        {"content", "<mask>"}, {"single_word", false},
                           {"lstrip", false},    {"rstrip", false},     {"normalized", false},
                           {"special", true}};
    if (option != nullptr) mask[option] = true;
    j["added_tokens"].push_back(mask);
    return j;
  };
  const std::string cat = " \xF0\x9F\x98\xBA";  // " 😺"

  TempFile plain(with_mask(nullptr).dump());
  auto t = drt::LoadBpeTokenizer(plain.path());
  REQUIRE(t.ok());
  CHECK(Encode(**t, "I saw a <mask>" + cat) == Ids{40, 2497, 257, 220, 50263, 30325, 118});
  CHECK(Encode(**t, "x<mask>y") == Ids{87, 50263, 88});

  TempFile lstrip(with_mask("lstrip").dump());
  t = drt::LoadBpeTokenizer(lstrip.path());
  REQUIRE(t.ok());
  CHECK(Encode(**t, "I saw a <mask>" + cat) == Ids{40, 2497, 257, 50263, 30325, 118});
  CHECK(Encode(**t, " <mask> ") == Ids{50263, 220});

  TempFile rstrip(with_mask("rstrip").dump());
  t = drt::LoadBpeTokenizer(rstrip.path());
  REQUIRE(t.ok());
  CHECK(Encode(**t, "I saw a <mask>" + cat) == Ids{40, 2497, 257, 220, 50263, 47249, 118});
  CHECK(Encode(**t, "a <mask>  b") == Ids{64, 220, 50263, 65});

  TempFile single_word(with_mask("single_word").dump());
  t = drt::LoadBpeTokenizer(single_word.path());
  REQUIRE(t.ok());
  CHECK(Encode(**t, "x <mask> y") == Ids{87, 220, 50263, 331});
  CHECK(Encode(**t, "x<mask>y") == Ids{87, 27, 27932, 29, 88});
  CHECK(Encode(**t, "\xC3\xA9<mask>") == Ids{2634, 27, 27932, 29});  // é is a word character
  CHECK(Encode(**t, "-<mask>-") == Ids{12, 50263, 12});
}

TEST_CASE("Byte tokenizer maps bytes to ids and back", "[tokenizer]") {
  const auto tokenizer = drt::MakeByteTokenizer();
  CHECK(tokenizer->vocab_size() == 256);
  CHECK(tokenizer->eos_id() == -1);
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  const Ids ids = Encode(*tokenizer, all_bytes);
  REQUIRE(ids.size() == 256);
  for (int b = 0; b < 256; ++b) CHECK(ids[b] == b);
  CHECK(Decode(*tokenizer, ids) == all_bytes);
  CHECK(Encode(*tokenizer, "Hi") == Ids{72, 105});

  auto bad = tokenizer->Decode({65, 256});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("256"));
}

TEST_CASE("Byte tokenizer with an end-of-text id beyond the bytes", "[tokenizer]") {
  const auto tokenizer = drt::MakeByteTokenizer(256);
  CHECK(tokenizer->vocab_size() == 257);
  CHECK(tokenizer->eos_id() == 256);
  CHECK(Decode(*tokenizer, {72, 105, 256}) == "Hi");
}

// The bundled byte-level model ships a Hugging Face tokenizer.json (written by
// weights_tools/byte_tokenizer.py); it must tokenize exactly like the built-in
// byte tokenizer the model was trained with: id = byte value.
TEST_CASE("The bundled byte-level tokenizer.json equals the byte tokenizer", "[tokenizer]") {
  const std::string path = std::string(drt::testing::SourceDir()) + "/models/drt-passkey-byte/tokenizer.json";
  auto loaded = drt::LoadBpeTokenizer(path);
  REQUIRE(loaded.ok());
  auto bytes = drt::MakeByteTokenizer();
  CHECK((*loaded)->vocab_size() == 258);
  std::mt19937 rng(7);
  const std::vector<std::string> pieces = {"The pass key is 12345. ", " ", "  \n\t", "é", "日本語", "🙂",
                                           "'s", "don't", "x", "0", "What is the pass key?"};
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    const Ids expected = Encode(*bytes, text);
    REQUIRE(expected.size() == text.size());
    for (size_t i = 0; i < text.size(); ++i) CHECK(expected[i] == static_cast<uint8_t>(text[i]));
    CHECK(Encode(**loaded, text) == expected);
    auto decoded = (*loaded)->Decode(expected);
    REQUIRE(decoded.ok());
    CHECK(*decoded == text);
  }
}

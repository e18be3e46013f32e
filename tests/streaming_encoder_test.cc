// Text streamed in pieces tokenizes exactly like the whole text.
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "engine/tokenizer/bpe_tokenizer_for_text.h"
#include "engine/tokenizer/byte_level_alphabet.h"
#include "engine/tokenizer/streaming_encoder.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/test_util/temp_dir.h"
#include "tests/test_util/build_paths.h"

namespace drt {
namespace {

std::vector<int32_t> EncodeInPieces(const Tokenizer& tokenizer, const std::string& text,
                                    std::mt19937_64& rng, size_t max_piece) {
  StreamingEncoder encoder(tokenizer);
  std::vector<int32_t> ids;
  for (size_t done = 0; done < text.size();) {
    const size_t piece = std::min(text.size() - done, 1 + rng() % max_piece);
    auto part = encoder.Push(std::string_view(text).substr(done, piece));
    REQUIRE(part.ok());
    ids.insert(ids.end(), part->begin(), part->end());
    done += piece;
  }
  auto rest = encoder.Finish();
  REQUIRE(rest.ok());
  ids.insert(ids.end(), rest->begin(), rest->end());
  REQUIRE(encoder.pending_bytes() == 0);
  return ids;
}

TEST_CASE("streamed text gives the ids of the whole text", "[tokenizer][streaming]") {
  auto tokenizer =
      LoadBpeTokenizer(std::string(drt::testing::SourceDir()) + "/tests/fixtures/gpt2-tokenizer/tokenizer.json");
  REQUIRE(tokenizer.ok());
  const std::string text =
      "The passkey is: 71432. Remember it.\n\n  Indented  text,\twith tabs   and "
      "runs of   spaces. Café, naïve, 北京欢迎你, こんにちは世界, مرحبا بالعالم 🙂👍🏽. "
      "Don't stop; it's 3.14159 o'clock.<|endoftext|>Next document starts here... "
      "    trailing spaces   ";
  const auto whole = (*tokenizer)->Encode(text);
  REQUIRE(whole.ok());
  std::mt19937_64 rng(42);
  for (size_t max_piece : {1, 2, 3, 7, 16, 64}) {
    for (int trial = 0; trial < 20; ++trial) {
      INFO("max piece " << max_piece << " trial " << trial);
      REQUIRE(EncodeInPieces(**tokenizer, text, rng, max_piece) == *whole);
    }
  }
}

TEST_CASE("a withdrawn piece leaves the ids of the text without it", "[tokenizer][streaming]") {
  // PromptIngest withdraws a refused message's text; the earlier messages'
  // held-back text must then encode as if that message never came.
  auto tokenizer =
      LoadBpeTokenizer(std::string(drt::testing::SourceDir()) + "/tests/fixtures/gpt2-tokenizer/tokenizer.json");
  REQUIRE(tokenizer.ok());
  const std::string text =
      "The passkey is: 71432. Remember it.\n\n  Indented  text, Café, 北京欢迎你 🙂👍🏽. Don't stop";
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    // Pieces of 1..12 bytes; one of them (not the first) is withdrawn.
    std::vector<std::string> pieces;
    for (size_t done = 0; done < text.size();) {
      const size_t piece = std::min(text.size() - done, 1 + rng() % 12);
      pieces.push_back(text.substr(done, piece));
      done += piece;
    }
    const size_t withdrawn = 1 + rng() % (pieces.size() - 1);
    std::string kept_text;
    StreamingEncoder encoder(**tokenizer);
    std::vector<int32_t> ids;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const std::string held_before(encoder.pending());
      auto part = encoder.Push(pieces[i]);
      REQUIRE(part.ok());
      if (i == withdrawn) {
        encoder.Withdraw();
        REQUIRE(encoder.pending() == held_before);
        encoder.Withdraw();  // a second one changes nothing
        REQUIRE(encoder.pending() == held_before);
        continue;
      }
      kept_text += pieces[i];
      ids.insert(ids.end(), part->begin(), part->end());
    }
    auto rest = encoder.Finish();
    REQUIRE(rest.ok());
    ids.insert(ids.end(), rest->begin(), rest->end());
    auto expected = (*tokenizer)->Encode(kept_text);
    REQUIRE(expected.ok());
    INFO("trial " << trial << ", piece " << withdrawn << " withdrawn");
    REQUIRE(ids == *expected);
  }
}

TEST_CASE("a piece withdrawn after the held-back text passed the limit leaves the text before it",
          "[tokenizer][streaming]") {
  // Past kMaxPendingBytes with no cut, Push encodes all it holds (the piece
  // included) and keeps it for Withdraw (review-cleanup3 R1). PromptIngest
  // gets here when a refused message makes the held-back word pass 1 MiB.
  auto tokenizer = MakeByteTokenizer();  // cuts only after a visible character and whitespace
  StreamingEncoder encoder(*tokenizer);
  const std::string first(StreamingEncoder::kMaxPendingBytes - 10, 'a');
  auto held = encoder.Push(first);
  REQUIRE(held.ok());
  REQUIRE(held->empty());  // under the limit: all held back
  REQUIRE(encoder.pending() == first);
  auto forced = encoder.Push(std::string(100, 'b'));
  REQUIRE(forced.ok());
  // The forced encode happened: everything held came out as ids.
  REQUIRE(forced->size() == first.size() + 100);
  REQUIRE(encoder.pending_bytes() == 0);
  encoder.Withdraw();
  CHECK(encoder.pending_bytes() == first.size());
  CHECK(encoder.pending() == first);
  auto rest = encoder.Finish();
  REQUIRE(rest.ok());
  auto expected = tokenizer->Encode(first);
  REQUIRE(expected.ok());
  CHECK(*rest == *expected);
  CHECK(encoder.pending_bytes() == 0);
}

TEST_CASE("a piece ending inside a UTF-8 character is held back", "[tokenizer][streaming]") {
  auto tokenizer = MakeByteTokenizer();
  StreamingEncoder encoder(*tokenizer);
  const std::string euro = "\xE2\x82\xAC";  // U+20AC in three bytes
  auto first = encoder.Push("price " + euro.substr(0, 2));
  REQUIRE(first.ok());
  REQUIRE(first->size() == 5);  // "price" only; " " + partial euro wait
  auto second = encoder.Push(euro.substr(2) + " now");
  REQUIRE(second.ok());
  auto rest = encoder.Finish();
  REQUIRE(rest.ok());
  std::vector<int32_t> all = *first;
  all.insert(all.end(), second->begin(), second->end());
  all.insert(all.end(), rest->begin(), rest->end());
  auto decoded = tokenizer->Decode(all);
  REQUIRE(decoded.ok());
  REQUIRE(*decoded == "price " + euro + " now");
}

// Added tokens chosen for the ways a match can depend on text around it.
nlohmann::json AddedToken(int id, const std::string& content, bool lstrip, bool rstrip,
                          bool single_word, bool normalized = false) {
  return {{"id", id},           {"content", content},         {"special", !normalized},
          {"lstrip", lstrip},   {"rstrip", rstrip},           {"single_word", single_word},
          {"normalized", normalized}};
}

nlohmann::json TrickyAddedTokens(int first_id) {
  int id = first_id;
  nlohmann::json tokens = nlohmann::json::array();
  tokens.push_back(AddedToken(id++, "<sep>", false, true, false));  // takes whitespace after it
  tokens.push_back(AddedToken(id++, "a b", false, false, false));   // holds whitespace
  tokens.push_back(AddedToken(id++, "<l>", true, false, false));    // takes whitespace before it
  tokens.push_back(AddedToken(id++, "<w>", false, false, true));    // not inside a word
  tokens.push_back(AddedToken(id++, "abcd", false, false, false));  // "ab" grows into it
  tokens.push_back(AddedToken(id++, "ab", false, false, false));
  tokens.push_back(AddedToken(id++, "xyzw", false, false, false));  // overrides "yz" once complete
  tokens.push_back(AddedToken(id++, "yz", false, false, false));
  tokens.push_back(AddedToken(id++, "q z", false, false, true));    // its rejection hides "z"
  tokens.push_back(AddedToken(id++, "z", false, false, false));
  tokens.push_back(AddedToken(id++, " s", false, false, true));     // judged by the byte before a space
  tokens.push_back(AddedToken(id++, "<n>", false, true, false, /*normalized=*/true));  // second pass
  return tokens;
}

// A tokenizer.json in `dir` with the 256 bytes as ids 0..255, no merges,
// and `added`.
std::string WriteByteVocabTokenizer(const testing::TempDir& dir, const std::string& name,
                                    const nlohmann::json& added, bool add_prefix_space) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelEncode(std::string(1, static_cast<char>(b)))] = b;
  const nlohmann::json j = {
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"added_tokens", added}};
  const std::string path = dir.File(name + ".json");
  std::ofstream(path) << j.dump();
  return path;
}

// The GPT-2 fixture (real merges) with the tricky added tokens after its vocabulary.
std::string WriteGpt2WithAddedTokens(const testing::TempDir& dir) {
  std::ifstream in(std::string(drt::testing::SourceDir()) + "/tests/fixtures/gpt2-tokenizer/tokenizer.json");
  nlohmann::json j = nlohmann::json::parse(in);
  for (const auto& token : TrickyAddedTokens(50257)) j["added_tokens"].push_back(token);
  const std::string path = dir.File("gpt2.json");
  std::ofstream(path) << j.dump();
  return path;
}

std::vector<int32_t> PushWholeThenFinish(const Tokenizer& tokenizer, const std::string& text) {
  StreamingEncoder encoder(tokenizer);
  auto a = encoder.Push(text);
  REQUIRE(a.ok());
  auto b = encoder.Finish();
  REQUIRE(b.ok());
  a->insert(a->end(), b->begin(), b->end());
  return *a;
}

TEST_CASE("an added token's match is not cut by the stream", "[tokenizer][streaming]") {
  nlohmann::json added = nlohmann::json::array();
  added.push_back(AddedToken(256, "<sep>", false, true, false));
  added.push_back(AddedToken(257, "a b", false, false, false));
  testing::TempDir dir;
  auto tokenizer = LoadBpeTokenizer(WriteByteVocabTokenizer(dir, "review", added, false));
  REQUIRE(tokenizer.ok());
  // Hand-derived ids (id = byte for plain text): rstrip takes the space
  // after <sep>; "a b" is one token although it holds a space.
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"<sep> hi", {256, 104, 105}},
      {"x a b", {120, 32, 257}},
  };
  for (const auto& [text, expected] : cases) {
    INFO("text \"" << text << "\"");
    REQUIRE(*(*tokenizer)->Encode(text) == expected);
    REQUIRE(PushWholeThenFinish(**tokenizer, text) == expected);
    std::mt19937_64 rng(1);
    for (int trial = 0; trial < 20; ++trial) {
      REQUIRE(EncodeInPieces(**tokenizer, text, rng, 3) == expected);
    }
  }
}

// Random texts of fragments that make and break added-token matches,
// streamed in random pieces, against the non-streaming encoder.
TEST_CASE("streamed text with added tokens gives the ids of the whole text",
          "[tokenizer][streaming]") {
  const std::vector<std::string> fragments = {
      "<sep>", "a b", "<l>", "<w>", "abcd", "ab", "a", "b", "c", "d", "xyzw", "xyz", "yz", "q z",
      "q", "z", " s", "s", "<n>", "<", ">", "x", "hi", "word", " ", "  ", "\t", "\n", " \n",
      "\xC3\xA9" /* é */, "\xE5\x8C\x97" /* 北 */, "\xE3\x80\x80" /* ideographic space */,
      "'s", ".", "7"};
  struct Variant {
    std::string name;
    std::string path;
  };
  testing::TempDir dir;
  const std::vector<Variant> variants = {
      {"byte vocabulary", WriteByteVocabTokenizer(dir, "tricky", TrickyAddedTokens(256), false)},
      {"byte vocabulary, add_prefix_space",
       WriteByteVocabTokenizer(dir, "tricky_prefix", TrickyAddedTokens(256), true)},
      {"GPT-2 merges", WriteGpt2WithAddedTokens(dir)},
  };
  for (const Variant& variant : variants) {
    auto tokenizer = LoadBpeTokenizer(variant.path);
    REQUIRE(tokenizer.ok());
    std::mt19937_64 rng(7);
    for (int text_index = 0; text_index < 1500; ++text_index) {
      std::string text;
      const int parts = 1 + static_cast<int>(rng() % 12);
      for (int p = 0; p < parts; ++p) text += fragments[rng() % fragments.size()];
      const auto whole = (*tokenizer)->Encode(text);
      REQUIRE(whole.ok());
      INFO(variant.name << ", text \"" << text << "\"");
      REQUIRE(PushWholeThenFinish(**tokenizer, text) == *whole);
      REQUIRE(whole->size() <= 2 * text.size());  // PendingIdsWithin's bound
      for (size_t max_piece : {1, 2, 5}) {
        REQUIRE(EncodeInPieces(**tokenizer, text, rng, max_piece) == *whole);
      }
    }
  }
}

// Counts Encode calls of the tokenizer it wraps.
class CountingTokenizer final : public Tokenizer {
 public:
  explicit CountingTokenizer(const Tokenizer& inner) : inner_(inner) {}
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const override {
    ++encodes_;
    encoded_bytes_ += text.size();
    return inner_.Encode(text);
  }
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    return inner_.Decode(ids);
  }
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t eos_id() const override { return inner_.eos_id(); }
  bool one_id_per_byte() const override { return inner_.one_id_per_byte(); }
  size_t StreamCut(std::string_view text) const override { return inner_.StreamCut(text); }
  int64_t encodes() const { return encodes_; }
  int64_t encoded_bytes() const { return encoded_bytes_; }

 private:
  const Tokenizer& inner_;
  mutable int64_t encodes_ = 0;
  mutable int64_t encoded_bytes_ = 0;
};

TEST_CASE("the held-back text is encoded for a limit check only when its bound does not fit",
          "[tokenizer][streaming]") {
  auto gpt2 =
      LoadBpeTokenizer(std::string(drt::testing::SourceDir()) + "/tests/fixtures/gpt2-tokenizer/tokenizer.json");
  REQUIRE(gpt2.ok());
  REQUIRE_FALSE((*gpt2)->one_id_per_byte());
  CountingTokenizer counting(**gpt2);
  SECTION("a long text without whitespace in small pieces, far from the limit") {
    // 512 KiB of letters in 1 KiB pieces: all of it is held back (one word).
    // Encoding it for every piece's check would encode 128 MiB in all.
    StreamingEncoder encoder(counting);
    const std::string piece = [] {
      std::string p;
      while (p.size() < 1024) p += "abcdefghijklmnopqrstuvwxyz";
      return p.substr(0, 1024);
    }();
    int64_t check_encodes = 0;
    for (int i = 0; i < 512; ++i) {
      REQUIRE(encoder.Push(piece).ok());
      const int64_t before = counting.encodes();
      auto bound = encoder.PendingIdsWithin(int64_t{1} << 22);
      REQUIRE(bound.ok());
      CHECK(*bound == 2 * static_cast<int64_t>(encoder.pending_bytes()));
      check_encodes += counting.encodes() - before;
    }
    CHECK(encoder.pending_bytes() == 512 * 1024);
    CHECK(check_encodes == 0);
  }
  SECTION("near the limit the count is exact") {
    StreamingEncoder encoder(counting);
    REQUIRE(encoder.Push("hello wonderful").ok());
    REQUIRE(encoder.pending_bytes() > 0);
    auto exact = (*gpt2)->Encode(encoder.pending());
    REQUIRE(exact.ok());
    const int64_t room = 2 * static_cast<int64_t>(encoder.pending_bytes()) - 1;
    const int64_t before = counting.encodes();
    auto count = encoder.PendingIdsWithin(room);
    REQUIRE(count.ok());
    CHECK(*count == static_cast<int64_t>(exact->size()));
    CHECK(counting.encodes() == before + 1);
  }
  SECTION("a one-id-per-byte tokenizer: the byte count, never encoded") {
    auto bytes = MakeByteTokenizer();
    CountingTokenizer counting_bytes(*bytes);
    StreamingEncoder encoder(counting_bytes);
    REQUIRE(encoder.Push("hello wonderful").ok());
    const int64_t before = counting_bytes.encodes();
    auto count = encoder.PendingIdsWithin(0);
    REQUIRE(count.ok());
    CHECK(*count == static_cast<int64_t>(encoder.pending_bytes()));
    CHECK(counting_bytes.encodes() == before);
  }
}

TEST_CASE("a byte vocabulary is one id per byte only while text can spell no added token",
          "[tokenizer]") {
  // review-apifix F1: GetModelInfo.tokenizer says "bytes" from this, and a
  // client then counts text bytes as tokens; an added token that text
  // spells is one id for several bytes.
  nlohmann::json added = nlohmann::json::array();
  added.push_back(AddedToken(256, "<|pad|>", false, false, false));
  added.push_back(AddedToken(257, "<|chunk|>", false, false, false));
  testing::TempDir dir;
  const std::string plain = WriteByteVocabTokenizer(dir, "plain", nlohmann::json::array(), false);
  const std::string engine_only = WriteByteVocabTokenizer(dir, "engine_only", added, false);
  added.push_back(AddedToken(258, "<sep>", false, false, false));
  const std::string extra = WriteByteVocabTokenizer(dir, "extra", added, false);

  auto t = LoadBpeTokenizer(plain);
  REQUIRE(t.ok());
  CHECK((*t)->one_id_per_byte());
  // The bundled models' case: pad and landmark are not matched in text.
  t = LoadBpeTokenizerForText(engine_only, {256, 257});
  REQUIRE(t.ok());
  CHECK((*t)->one_id_per_byte());
  CHECK(*(*t)->Encode("<|pad|>") == std::vector<int32_t>({'<', '|', 'p', 'a', 'd', '|', '>'}));
  t = LoadBpeTokenizer(engine_only);  // all added tokens matched
  REQUIRE(t.ok());
  CHECK_FALSE((*t)->one_id_per_byte());
  // One more added token: text spells it as one id, so not "bytes".
  t = LoadBpeTokenizerForText(extra, {256, 257});
  REQUIRE(t.ok());
  CHECK(*(*t)->Encode("a<sep>") == std::vector<int32_t>({'a', 258}));
  CHECK_FALSE((*t)->one_id_per_byte());
  t = LoadBpeTokenizerForText(extra, {256, 257, 258});
  REQUIRE(t.ok());
  CHECK((*t)->one_id_per_byte());
}

}  // namespace
}  // namespace drt

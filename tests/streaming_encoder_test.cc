// Text streamed in pieces tokenizes exactly like the whole text.
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/tokenizer/streaming_encoder.h"
#include "engine/tokenizer/tokenizer.h"

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
      LoadBpeTokenizer(std::string(DRT_SOURCE_DIR) + "/tests/fixtures/gpt2-tokenizer/tokenizer.json");
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

}  // namespace
}  // namespace drt

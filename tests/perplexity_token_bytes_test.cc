// drt-ppl's bits-per-byte counting (bench/perplexity/token_bytes.h) with the
// GPT-2 fixture tokenizer: each token counts the raw bytes of its id, also
// when the id holds part of a UTF-8 character (review-ppl P5: untested). The
// ids and their bytes are from the fixture's vocabulary, decoded by hand with
// GPT-2's byte-to-character table.
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "bench/perplexity/token_bytes.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/test_util/build_paths.h"

namespace drt::ppl {
namespace {

constexpr int32_t kGpt2Vocab = 50257;

TEST_CASE("drt-ppl counts a BPE token's raw bytes, part characters included", "[ppl]") {
  auto loaded =
      LoadBpeTokenizer(std::string(testing::SourceDir()) + "/tests/fixtures/gpt2-tokenizer/tokenizer.json");
  REQUIRE(loaded.ok());
  const Tokenizer& gpt2 = **loaded;

  // "Hello world": "Hello" (15496) 5 bytes, "Ġworld" (995) 6 bytes.
  // "ひらがな" (12 bytes, Hugging Face's ids in hf_encodings.jsonl): 2515 "ãģ" =
  // e3 81 (the first two bytes of ひ), 110 "²" = b2 (its last), then ら, が,
  // な whole, 3 bytes each. A Decode that gave U+FFFD for the part character
  // would count 3 for 2515 and 3 for 110.
  const std::string text = "Hello worldひらがな";
  const std::vector<int32_t> ids = {15496, 995, 2515, 110, 36853, 35585, 26945};
  auto encoded = gpt2.Encode(text);
  REQUIRE(encoded.ok());
  REQUIRE(*encoded == ids);

  auto counted = CountTokenBytes(gpt2, ids, kGpt2Vocab);
  REQUIRE(counted.ok());
  CHECK(counted->total == 23);
  CHECK(counted->total == static_cast<int64_t>(text.size()));
  const std::vector<std::pair<int32_t, int32_t>> want = {
      {15496, 5}, {995, 6}, {2515, 2}, {110, 1}, {36853, 3}, {35585, 3}, {26945, 3}};
  for (const auto& [id, bytes] : want) {
    INFO("id " << id);
    CHECK(counted->per_id[id] == bytes);
  }
  CHECK(counted->per_id[0] == -1);  // "!" is not in the document

  // A repeated id counts each time; an id past the vocabulary is skipped.
  auto repeated = CountTokenBytes(gpt2, {15496, 2515, 15496, kGpt2Vocab}, kGpt2Vocab);
  REQUIRE(repeated.ok());
  CHECK(repeated->total == 5 + 2 + 5);
}

TEST_CASE("drt-ppl counts one byte per byte-tokenizer token", "[ppl]") {
  const std::unique_ptr<Tokenizer> bytes = MakeByteTokenizer(256);
  auto counted = CountTokenBytes(*bytes, {0, 255, 'a', 'a'}, 258);
  REQUIRE(counted.ok());
  CHECK(counted->total == 4);
  CHECK(counted->per_id[255] == 1);
  CHECK(counted->per_id['a'] == 1);
}

}  // namespace
}  // namespace drt::ppl

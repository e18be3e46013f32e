// The NIAH haystack builder: exact lengths, the needle where asked, answers
// judged digit by digit.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "bench/niah/passkey_haystack.h"
#include "engine/tokenizer/tokenizer.h"

namespace drt::niah {
namespace {

TEST_CASE("haystacks have the asked length with the needle at its depth", "[niah]") {
  auto tokenizer = MakeByteTokenizer();
  auto h = PasskeyHaystacks::Create(*tokenizer, HaystackFormat{}, 1 << 20);
  REQUIRE(h.ok());
  const std::string filler = HaystackFormat{}.filler;
  for (int64_t length : {2000, 4096, 50000}) {
    for (double depth : {0.0, 0.3, 1.0}) {
      const int64_t offset = h->NeedleOffset(length, depth);
      REQUIRE(offset % static_cast<int64_t>(filler.size()) == 0);  // on a sentence boundary
      auto needle = h->Needle("12345");
      REQUIRE(needle.ok());
      const int64_t after = h->FillerAfterNeedle(length, offset, needle->size());
      std::vector<int32_t> all = h->Filler(0, offset);
      all.insert(all.end(), needle->begin(), needle->end());
      const auto rest = h->Filler(offset, offset + after);
      all.insert(all.end(), rest.begin(), rest.end());
      all.insert(all.end(), h->question().begin(), h->question().end());
      REQUIRE(static_cast<int64_t>(all.size()) == length);
      auto text = tokenizer->Decode(all);
      REQUIRE(text.ok());
      REQUIRE(text->find("The pass key is 12345. Remember it. 12345 is the pass key. ") ==
              static_cast<size_t>(offset));
      REQUIRE(text->rfind("What is the pass key? The pass key is") ==
              text->size() - HaystackFormat{}.question.size());
      if (depth == 0.0) REQUIRE(offset == 0);
      if (depth == 1.0) REQUIRE(offset > length - 300);
    }
  }
}

TEST_CASE("answers match only the exact key", "[niah]") {
  REQUIRE(AnswerMatches(" 12345.", "12345"));
  REQUIRE(AnswerMatches("12345", "12345"));
  REQUIRE_FALSE(AnswerMatches(" 123456", "12345"));
  REQUIRE_FALSE(AnswerMatches(" 1234", "12345"));
  REQUIRE_FALSE(AnswerMatches(" the key", "12345"));
  REQUIRE_FALSE(AnswerMatches("", "12345"));
}

TEST_CASE("the pass-key rule is the clients' first number in the answer", "[niah]") {
  // The clients' rule (re.search(r"\d+") in drt_client.py): the first run of
  // digits anywhere, whatever comes before it. drt-niah accepted only spaces
  // before the key (review-tools 2026-11-25 #12).
  REQUIRE(AnswerMatches("\n12345", "12345"));
  REQUIRE(AnswerMatches(" is 12345. Remember", "12345"));
  REQUIRE(AnswerMatches("key:12345 and 67890", "12345"));
  REQUIRE_FALSE(AnswerMatches(" 67890 or 12345", "12345"));  // only the first number counts
  REQUIRE_FALSE(AnswerMatches(" 1 2345", "12345"));
  REQUIRE_FALSE(AnswerMatches("x12345678", "12345"));
  CHECK(FirstNumber(" is 12345. 6") == "12345");
  CHECK(FirstNumber("no digits") == "");
  CHECK(FirstNumber("007") == "007");
}

TEST_CASE("random keys have the asked digits, no leading zero", "[niah]") {
  uint64_t state = 7;
  const std::string a = RandomKey(state, 5), b = RandomKey(state, 5);
  REQUIRE(a.size() == 5);
  REQUIRE(a[0] != '0');
  REQUIRE(a != b);
}

}  // namespace
}  // namespace drt::niah

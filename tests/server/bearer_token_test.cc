// BearerTokenMatches (server/bearer_token.h), the --bearer_token check, against
// a plain comparison (the scheme "bearer" in any case, one space, the token
// exactly) on values that differ in every position, in length, in the case of
// the scheme or of the token, and not at all. (The constant time itself is not
// measured here: over the loopback the difference is far below the noise of a
// gRPC call.)
#include "server/bearer_token.h"

#include <cctype>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace drt::server {
namespace {

// The reference: "bearer" in any case, a space, the token byte for byte.
bool PlainMatch(const std::string& value, const std::string& token) {
  if (value.size() != 7 + token.size() || value[6] != ' ') return false;
  std::string scheme = value.substr(0, 6);
  for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return scheme == "bearer" && value.substr(7) == token;
}

TEST_CASE("bearer tokens match with the scheme in any case and the token exactly",
          "[server][auth]") {
  const std::string token = "s3cret-token";
  const std::string right = "Bearer " + token;
  std::vector<std::string> values = {right, "", "Bearer ", "bearer " + token, "BEARER " + token,
                                     "bEaReR " + token, "Bearer S3CRET-TOKEN", right + "x",
                                     right.substr(0, right.size() - 1), token, "Bearer  " + token,
                                     "Bearer\t" + token, "Basic  " + token};
  for (size_t i = 0; i < right.size(); ++i) {
    // One byte off at every position, and its case changed at every position.
    for (const char flip : {'\x01', '\x20'}) {
      std::string off = right;
      off[i] = static_cast<char>(off[i] ^ flip);
      values.push_back(off);
    }
  }
  int matched = 0;
  for (const std::string& value : values) {
    INFO("'" << value << "'");
    CHECK(BearerTokenMatches(value, token) == PlainMatch(value, token));
    matched += PlainMatch(value, token) ? 1 : 0;
  }
  // right, "bearer ", "BEARER ", "bEaReR " and right with the case of one of
  // the six scheme letters changed; the token's case counts.
  CHECK(matched == 4 + 6);
  CHECK(BearerTokenMatches("bearer " + token, token));
  CHECK(BearerTokenMatches("BEARER " + token, token));
  CHECK_FALSE(BearerTokenMatches("Bearer S3cret-token", token));
  CHECK(BearerTokenMatches(right, token));
  CHECK_FALSE(BearerTokenMatches(right, "s3cret-tokem"));
  // Lengths that differ are refused also when one value is the other plus
  // a NUL byte.
  CHECK_FALSE(BearerTokenMatches("Bearer", std::string(1, '\0')));
  CHECK_FALSE(BearerTokenMatches(std::string("Bearer \0", 8), ""));
}

}  // namespace
}  // namespace drt::server

// BearerTokenMatches (server/bearer_token.h), the --bearer_token check,
// against the plain comparison it replaces (authorization == "Bearer " +
// token) on values that differ in every position, in length, and not at
// all. (The constant time itself is not measured here: over the loopback
// the difference is far below the noise of a gRPC call.)
#include "server/bearer_token.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace drt::server {
namespace {

TEST_CASE("bearer tokens match exactly and only exactly", "[server][auth]") {
  const std::string token = "s3cret-token";
  const std::string right = "Bearer " + token;
  std::vector<std::string> values = {right, "", "Bearer ", "bearer " + token, right + "x",
                                     right.substr(0, right.size() - 1), token, "Bearer  " + token};
  for (size_t i = 0; i < right.size(); ++i) {  // one byte off at every position
    std::string off = right;
    off[i] = static_cast<char>(off[i] ^ 0x01);
    values.push_back(off);
  }
  for (const std::string& value : values) {
    INFO("'" << value << "'");
    CHECK(BearerTokenMatches(value, token) == (value == right));
  }
  CHECK(BearerTokenMatches(right, token));
  CHECK_FALSE(BearerTokenMatches(right, "s3cret-tokem"));
  // Lengths that differ are refused also when one value is the other plus
  // a NUL byte.
  CHECK_FALSE(BearerTokenMatches("Bearer", std::string(1, '\0')));
  CHECK_FALSE(BearerTokenMatches(std::string("Bearer \0", 8), ""));
}

}  // namespace
}  // namespace drt::server

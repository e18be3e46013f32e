#include "server/bearer_token.h"

#include <cstddef>
#include <string>

namespace drt::server {

namespace {

// The scheme and the space after it, lower-case.
constexpr std::string_view kScheme = "bearer ";

unsigned char AsciiLower(unsigned char c) { return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c; }

}  // namespace

bool BearerTokenMatches(std::string_view authorization, std::string_view token) {
  const std::string expected = std::string(kScheme) + std::string(token);
  unsigned char differ = authorization.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    // Past the end of a shorter value, compare with a byte that is never
    // equal to expected[i], so that the loop still runs to the end.
    unsigned char got = i < authorization.size() ? static_cast<unsigned char>(authorization[i])
                                                 : static_cast<unsigned char>(~expected[i]);
    // The scheme in any case (RFC 9110, 11.1: "Bearer", "bearer", "BEARER";
    // some proxies and clients lower-case it); the token exactly.
    if (i < kScheme.size()) got = AsciiLower(got);
    differ |= got ^ static_cast<unsigned char>(expected[i]);
  }
  return differ == 0;
}

}  // namespace drt::server

#include "server/bearer_token.h"

#include <cstddef>
#include <string>

namespace drt::server {

bool BearerTokenMatches(std::string_view authorization, std::string_view token) {
  const std::string expected = std::string("Bearer ") + std::string(token);
  unsigned char differ = authorization.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    // Past the end of a shorter value, compare with a byte that is never
    // equal to expected[i], so that the loop still runs to the end.
    const unsigned char got = i < authorization.size()
                                  ? static_cast<unsigned char>(authorization[i])
                                  : static_cast<unsigned char>(~expected[i]);
    differ |= got ^ static_cast<unsigned char>(expected[i]);
  }
  return differ == 0;
}

}  // namespace drt::server

// The bearer-token check of --bearer_token (docs/api.md, "Authentication").
#pragma once

#include <string_view>

namespace drt::server {

// Whether `authorization` (the request's metadata value or HTTP header) is
// "Bearer " + `token`, the scheme in any case ("bearer", "BEARER": RFC 9110,
// 11.1, auth schemes are case-insensitive), the token exactly. The bytes are
// compared in time that does not depend on where they first differ (every byte
// of the expected value is read and the differences are OR-ed), so the response
// time does not reveal a correct prefix. A value of another length is refused
// after the same loop; only the length itself can show in the timing.
bool BearerTokenMatches(std::string_view authorization, std::string_view token);

}  // namespace drt::server

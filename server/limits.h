// Defaults of the server's session limits, shared by ServiceOptions and
// SessionLimits.
#pragma once

#include <cstdint>

namespace drt::server {

// Tokens one session may hold by default: far past the paper's 2^24 (16M),
// so that memory (the host budget) is the real limit, and small enough that
// token counts stay far from int64 overflow.
inline constexpr int64_t kDefaultMaxContextTokens = int64_t{1} << 32;

}  // namespace drt::server

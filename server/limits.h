// Defaults of the server's session limits, shared by ServiceOptions and
// SessionLimits, the most choices one Complete makes and Generate's
// max_tokens bounds.
#pragma once

#include <cstdint>

namespace drt::server {

// Tokens one session may hold by default: far past the paper's 2^24 (16M),
// so that memory (the host budget) is the real limit, and small enough that
// token counts stay far from int64 overflow.
inline constexpr int64_t kDefaultMaxContextTokens = int64_t{1} << 32;

// CompleteRequest.n's most (the OpenAI API's `n` too): each choice is a
// session (a slot of --max_sessions, its own open chunk and window) and a
// thread of the call, so one request may not take a large share of the
// server; OpenAI's own cap (128) would.
inline constexpr int32_t kMaxCompleteChoices = 16;

// GenerateRequest.max_tokens: 0 (unset) means kDefaultMaxTokens; more than
// kMaxTokensLimit is refused (ModelInfo reports both).
inline constexpr int32_t kDefaultMaxTokens = 64;
inline constexpr int32_t kMaxTokensLimit = 1 << 20;

}  // namespace drt::server

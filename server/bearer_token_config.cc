#include "server/bearer_token_config.h"

#include <cstddef>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace drt::server {
namespace {

constexpr char kSource[] = "the bearer token (--bearer_token or DRT_BEARER_TOKEN)";

// How a refused byte is named: its escape and its code.
std::string ByteName(unsigned char byte) {
  switch (byte) {
    case '\n':
      return "a newline (\\n, 0x0a)";
    case '\r':
      return "a carriage return (\\r, 0x0d)";
    case '\t':
      return "a tab (\\t, 0x09)";
    case ' ':
      return "a space (0x20)";
    default:
      return absl::StrFormat("byte 0x%02x", byte);
  }
}

}  // namespace

absl::Status CheckBearerToken(std::string_view token, bool required) {
  if (token.empty()) {
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("--require_bearer_token: ", kSource,
                     " is empty or unset; set it (for example from a Secret whose key is not "
                     "empty), or leave --require_bearer_token off to accept every call"));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const auto byte = static_cast<unsigned char>(token[i]);
    if (byte < 0x20 || byte > 0x7e) {
      const bool at_end = i + 1 == token.size();
      return absl::InvalidArgumentError(absl::StrCat(
          kSource, " holds ", ByteName(byte), " at byte ", i, " of ", token.size(),
          at_end && byte == '\n' ? " (a file written by echo ends so)" : "",
          ": no client can send it in an authorization header, so every call would be "
          "refused; remove it (only printable ASCII is accepted; the token is not trimmed)"));
    }
  }
  if (token.front() == ' ' || token.back() == ' ') {
    const size_t at = token.front() == ' ' ? 0 : token.size() - 1;
    return absl::InvalidArgumentError(absl::StrCat(
        kSource, token.front() == ' ' ? " starts" : " ends", " with ", ByteName(' '), " at byte ",
        at, " of ", token.size(),
        ": HTTP clients and proxies drop it from header values, so those calls would be refused; "
        "remove it (the token is not trimmed)"));
  }
  return absl::OkStatus();
}

std::string BearerTokenLogLine(std::string_view token) {
  if (token.empty()) {
    return "WARNING: no bearer token: every call is accepted, on every listening address "
           "(set DRT_BEARER_TOKEN; --require_bearer_token refuses to start without one)";
  }
  return absl::StrCat("authentication: bearer token required (", token.size(), " bytes)");
}

}  // namespace drt::server

// The bearer token's start-up checks and log line (review-deploy F3):
// CheckBearerToken by hand-picked tokens, then the real drt-server refusing
// to start and saying whether authentication is on.
#include "server/bearer_token_config.h"

#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "tests/server/test_util/run_program.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using testing::ProgramRun;
using testing::RunProgram;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("CheckBearerToken accepts what a client can send and names what it cannot",
          "[server][auth]") {
  CHECK(CheckBearerToken("secret", false).ok());
  CHECK(CheckBearerToken("secret", true).ok());
  CHECK(CheckBearerToken("a b~!", true).ok());  // inner spaces: a header value holds them
  CHECK(CheckBearerToken("", false).ok());      // no token: authentication off

  const absl::Status empty = CheckBearerToken("", true);
  CHECK(empty.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(std::string(empty.message()), "--require_bearer_token"));

  const absl::Status newline = CheckBearerToken("secret\n", false);
  CHECK(newline.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(std::string(newline.message()), "a newline (\\n, 0x0a) at byte 6 of 7"));
  CHECK(Contains(std::string(newline.message()), "not trimmed"));

  const absl::Status crlf = CheckBearerToken("secret\r\n", true);
  CHECK(Contains(std::string(crlf.message()), "a carriage return (\\r, 0x0d) at byte 6 of 8"));
  CHECK(Contains(std::string(CheckBearerToken("\tsecret", true).message()), "a tab"));
  CHECK(Contains(std::string(CheckBearerToken(std::string("se\0cret", 7), true).message()),
                 "byte 0x00 at byte 2"));
  CHECK(Contains(std::string(CheckBearerToken("se\x7f", true).message()), "byte 0x7f at byte 2"));
  CHECK(Contains(std::string(CheckBearerToken("caf\xc3\xa9", true).message()),
                 "byte 0xc3 at byte 3"));
  CHECK(Contains(std::string(CheckBearerToken("secret ", true).message()),
                 "ends with a space (0x20) at byte 6 of 7"));
  CHECK(Contains(std::string(CheckBearerToken(" secret", true).message()),
                 "starts with a space (0x20) at byte 0 of 7"));
}

TEST_CASE("BearerTokenLogLine says whether authentication is on and never shows the token",
          "[server][auth]") {
  CHECK(BearerTokenLogLine("s3cr3t") == "authentication: bearer token required (6 bytes)");
  const std::string off = BearerTokenLogLine("");
  CHECK(off.rfind("WARNING: no bearer token: every call is accepted", 0) == 0);
}

// Everything here ends before the model is loaded (a bad flag) or at it (no
// such model directory), after the start-up log's first lines: no server
// starts, so each run takes well under a second.
ProgramRun RunServer(const std::string& token_flag, bool required) {
  std::vector<std::string> args = {"--model=/nonexistent/drt-model", "--device=cpu",
                                   "--http_listen=", "--listen=127.0.0.1:0", token_flag};
  if (required) args.push_back("--require_bearer_token");
  return RunProgram(drt::testing::ServerBinary(), args, 60);
}

TEST_CASE("drt-server logs whether authentication is on and refuses a token no client can send",
          "[server][auth][process]") {
  // The tests' own environment must not supply a token.
  unsetenv("DRT_BEARER_TOKEN");

  const ProgramRun on = RunServer("--bearer_token=Zq9-token-value", false);
  CHECK(on.exit_status == 1);  // the model directory does not exist
  CHECK(Contains(on.errors, "drt-server: authentication: bearer token required (15 bytes)\n"));
  CHECK_FALSE(Contains(on.errors, "Zq9-token-value"));
  CHECK(Contains(on.errors, "cannot load the model"));

  const ProgramRun off = RunServer("--bearer_token=", false);
  CHECK(off.exit_status == 1);
  CHECK(Contains(off.errors, "drt-server: WARNING: no bearer token: every call is accepted"));
  CHECK(Contains(off.errors, "cannot load the model"));

  const ProgramRun required = RunServer("--bearer_token=", true);
  CHECK(required.exit_status == 1);
  CHECK(Contains(required.errors, "drt-server: error: --require_bearer_token: the bearer token"));
  CHECK_FALSE(Contains(required.errors, "cannot load the model"));  // refused before loading

  CHECK(RunServer("--bearer_token=Zq9", true).exit_status == 1);  // starts as far as the model
  CHECK(Contains(RunServer("--bearer_token=Zq9", true).errors, "cannot load the model"));

  const ProgramRun newline = RunServer("--bearer_token=Zq9\n", false);
  CHECK(newline.exit_status == 1);
  CHECK(Contains(newline.errors, "a newline (\\n, 0x0a) at byte 3 of 4"));
  CHECK_FALSE(Contains(newline.errors, "cannot load the model"));
}

TEST_CASE("drt-server reads a refused token from DRT_BEARER_TOKEN too", "[server][auth][process]") {
  setenv("DRT_BEARER_TOKEN", "Zq9 ", 1);
  const ProgramRun run = RunServer("--bearer_token=", true);
  unsetenv("DRT_BEARER_TOKEN");
  CHECK(run.exit_status == 1);
  CHECK(Contains(run.errors, "ends with a space (0x20) at byte 3 of 4"));
}

}  // namespace
}  // namespace drt::server

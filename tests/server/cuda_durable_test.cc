// Durable sessions on the CUDA backend through the real drt-server:
// --device cuda --state_dir needs --cuda_state_export (the CUDA state export,
// written without a GPU, off by default: engine/cuda/cuda_session_state.cc),
// and with it a session restored after kill -9 continues exactly as its
// twin did before the kill. Skips visibly without a GPU; not part of
// scripts/gpu_bench.sh (drt_server_tests is not in the device bundle), so
// run it in a full build on a GPU machine: ctest -R "cuda durable".
#include <signal.h>

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/run_program.h"
#include "tests/test_util/temp_dir.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

// True when this build has the CUDA backend and GPU 0 is visible; otherwise
// WARNs the skip pattern (tests/CMakeLists.txt) and the test returns.
bool HaveCudaDevice() {
  const CudaAvailability cuda = ProbeCuda();
  if (!cuda.built) {
    WARN("no CUDA device: this build has no CUDA backend; skipping");
    return false;
  }
  if (!cuda.device_count.ok() || *cuda.device_count < 1) {
    WARN("no CUDA device: "
         << (cuda.device_count.ok() ? "none visible" : cuda.device_count.status().message())
         << "; skipping");
    return false;
  }
  return true;
}

drt::v1::GenerateRequest Continuation(const std::string& id, int tokens = 24) {
  drt::v1::GenerateRequest request = GreedyRequest(id, tokens);
  request.set_pad_to_chunk_boundary(false);
  request.set_ignore_eos(true);
  request.set_return_logprobs(true);
  return request;
}

TEST_CASE("cuda durable: --cuda_state_export --state_dir restores after kill -9 and continues",
          "[server][process][cuda]") {
  if (!HaveCudaDevice()) return;
  drt::testing::TempDir dir;
  std::vector<std::string> args = ServerProcessArgs(1, "");
  for (std::string& a : args) {
    if (a == "--device=cpu") a = "--device=cuda";
  }
  args.insert(args.end(), {"--state_dir", dir.File("state")});

  // Off by default: the server refuses to start, naming the flag.
  const ProgramRun refused = RunProgram(drt::testing::ServerBinary(), args);
  CHECK(refused.exit_status != 0);
  CHECK_THAT(refused.errors, Catch::Matchers::Contains("--cuda_state_export"));

  args.push_back("--cuda_state_export");
  // Five closed chunks and 20 open rows: selections in force, rows in the
  // open chunk and the windows.
  const auto prompt = RandomTokens(5 * 63 + 20, 41);
  GenerateResult before;
  std::string twin;
  {
    ServerProcess server(drt::testing::ServerBinary(), args);
    auto stub = drt::v1::Drt::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    // Two sessions fed alike, one call after the other (so never in one
    // step): the first continues now, the second after the restart.
    const std::string first = NewSession(*stub);
    twin = NewSession(*stub);
    REQUIRE(AppendTokens(*stub, first, prompt, EvenPieces(prompt.size(), 100)).status.ok());
    REQUIRE(AppendTokens(*stub, twin, prompt, EvenPieces(prompt.size(), 100)).status.ok());
    before = Generate(*stub, Continuation(first));
    REQUIRE(before.status.ok());
    REQUIRE(before.tokens.size() == 24);
    server.Signal(SIGKILL);
    REQUIRE(server.WaitExit(10).has_value());
  }
  ServerProcess server(drt::testing::ServerBinary(), args);
  auto stub = drt::v1::Drt::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  const InfoResult info = GetSession(*stub, twin);
  REQUIRE(info.status.ok());
  CHECK(info.info.tokens() == static_cast<int64_t>(prompt.size()));
  // Restored from its exported state (bf16 widened to float and rounded
  // back exactly), it continues bit-identically.
  const GenerateResult after = Generate(*stub, Continuation(twin));
  REQUIRE(after.status.ok());
  CHECK(after.tokens == before.tokens);
  CHECK(after.logprobs == before.logprobs);
}

// The CUDA disk tier (engine/cuda/cuda_disk_tier.cc; docs/state_format.md,
// "Disk tier"): with --cuda_state_export the server maps whole units of 64
// chunks of a CUDA session from its chunk logs. A session past one unit
// holds less host memory than with --disk_tier=false, reports the mapped
// K/V, and generates the same tokens and log-probabilities, before and
// after a restart (which maps instead of reading).
TEST_CASE("cuda durable: the disk tier maps a CUDA session's chunks, same tokens",
          "[server][process][cuda]") {
  if (!HaveCudaDevice()) return;
  drt::testing::TempDir dir;
  auto args_for = [&](const std::string& state, bool tier) {
    std::vector<std::string> args = ServerProcessArgs(1, "");
    for (std::string& a : args) {
      if (a == "--device=cpu") a = "--device=cuda";
    }
    args.insert(args.end(), {"--state_dir", dir.File(state), "--cuda_state_export",
                             tier ? "--disk_tier=true" : "--disk_tier=false"});
    return args;
  };
  // 70 closed chunks (one unit of 64 mapped, 6 held) and 20 open rows; 64
  // generated tokens close chunk 70, whose landmark retrieves over chunks
  // mostly mapped, so the later tokens read them through the staging before
  // the restart too.
  constexpr int kGenerated = 64;
  const auto prompt = RandomTokens(70 * 63 + 20, 43);

  GenerateResult want;
  int64_t held_bytes = 0;
  {
    ServerProcess server(drt::testing::ServerBinary(), args_for("held", false));
    auto stub = drt::v1::Drt::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    const std::string id = NewSession(*stub);
    REQUIRE(AppendTokens(*stub, id, prompt, EvenPieces(prompt.size(), 500)).status.ok());
    const InfoResult info = GetSession(*stub, id);
    REQUIRE(info.status.ok());
    CHECK(info.info.mapped_bytes() == 0);
    held_bytes = info.info.host_bytes();
    want = Generate(*stub, Continuation(id, kGenerated));
    REQUIRE(want.status.ok());
    REQUIRE(want.tokens.size() == kGenerated);
  }

  std::string twin;
  {
    ServerProcess server(drt::testing::ServerBinary(), args_for("tier", true));
    auto stub = drt::v1::Drt::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    const std::string first = NewSession(*stub);
    twin = NewSession(*stub);
    REQUIRE(AppendTokens(*stub, first, prompt, EvenPieces(prompt.size(), 500)).status.ok());
    REQUIRE(AppendTokens(*stub, twin, prompt, EvenPieces(prompt.size(), 500)).status.ok());
    const InfoResult info = GetSession(*stub, first);
    REQUIRE(info.status.ok());
    WARN("CUDA session of 70 chunks: host bytes " << info.info.host_bytes() << " with the tier, "
                                                  << held_bytes << " without; mapped "
                                                  << info.info.mapped_bytes());
    CHECK(info.info.mapped_bytes() > 0);
    CHECK(info.info.host_bytes() < held_bytes);
    const GenerateResult got = Generate(*stub, Continuation(first, kGenerated));
    REQUIRE(got.status.ok());
    CHECK(got.tokens == want.tokens);
    CHECK(got.logprobs == want.logprobs);
    server.Signal(SIGKILL);
    REQUIRE(server.WaitExit(10).has_value());
  }
  ServerProcess server(drt::testing::ServerBinary(), args_for("tier", true));
  auto stub = drt::v1::Drt::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  const InfoResult info = GetSession(*stub, twin);
  REQUIRE(info.status.ok());
  CHECK(info.info.mapped_bytes() > 0);
  const GenerateResult after = Generate(*stub, Continuation(twin, kGenerated));
  REQUIRE(after.status.ok());
  CHECK(after.tokens == want.tokens);
  CHECK(after.logprobs == want.logprobs);
}

}  // namespace
}  // namespace drt::server

// drt-batch-bench (bench/batch/) run for real against a real drt-server
// child process with the bundled model, at tiny sizes: the numbers it
// reports must be consistent with what it was asked to do (token counts
// from the flags, gaps that are positive and ordered, ratios that are the
// quotients of the reported medians), and it must leave no session behind.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/run_program.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;
using json = nlohmann::json;

constexpr int kGenerate = 4;
constexpr int kLoadGenerate = 5;
constexpr int kRepeats = 2;

// The checks every GapStats object of the JSON passes: `count` gaps, all
// positive, p50 <= p99 <= max.
void CheckGaps(const json& g, int64_t count) {
  INFO(g.dump());
  CHECK(g.at("count").get<int64_t>() == count);
  CHECK(g.at("p50_ms").get<double>() > 0);
  CHECK(g.at("p50_ms").get<double>() <= g.at("p99_ms").get<double>());
  CHECK(g.at("p99_ms").get<double>() <= g.at("max_ms").get<double>());
  CHECK(g.at("mean_ms").get<double>() > 0);
}

TEST_CASE("drt-batch-bench measures a real server at tiny sizes", "[server][process][bench]") {
  ServerProcess server(drt::testing::ServerBinary(),
                       {"--model", std::string(drt::testing::SourceDir()) + "/models/drt-passkey-byte",
                        "--listen", "127.0.0.1:0", "--http_listen=", "--device=cpu"});
  char json_path[] = "/tmp/drt-batch-bench-smoke.XXXXXX";
  const int fd = mkstemp(json_path);
  REQUIRE(fd >= 0);
  close(fd);
  struct Remove {
    const char* path;
    ~Remove() { std::remove(path); }
  } remove{json_path};

  // 200,000 tokens are far more than the one load session ingests while 5
  // tokens are generated; the tool cancels the Append then.
  const ProgramRun run = RunProgram(
      drt::testing::BatchBenchBinary(),
      {"--server", server.address(), "--sessions", "1,2", "--prompt_tokens", "64", "--generate",
       std::to_string(kGenerate), "--repeats", std::to_string(kRepeats), "--load_sessions", "1",
       "--load_generate", std::to_string(kLoadGenerate), "--append_tokens", "200000", "--piece_tokens", "4096", "--json", json_path},
      120);
  INFO("stdout:\n" << run.output << "\nstderr:\n" << run.errors);
  REQUIRE(run.exit_status == 0);
  CHECK_THAT(run.output, Contains("decode: N sessions generate at once"));
  CHECK_THAT(run.output, Contains("load/idle"));

  std::ifstream file(json_path);
  const json out = json::parse(file);  // throws (fails the test) on bad JSON
  CHECK(out.at("model").at("name").get<std::string>() == "drt-passkey-byte");
  CHECK(out.at("settings").at("generate").get<int>() == kGenerate);

  const json& decode = out.at("decode");
  REQUIRE(decode.size() == 2);
  for (size_t row = 0; row < decode.size(); ++row) {
    const int64_t n = decode[row].at("sessions").get<int64_t>();
    CHECK(n == static_cast<int64_t>(row + 1));
    const json& repeats = decode[row].at("repeats");
    REQUIRE(repeats.size() == static_cast<size_t>(kRepeats));
    std::vector<double> aggregates;
    for (const json& r : repeats) {
      INFO("sessions " << n << ": " << r.dump());
      CHECK(r.at("generated_tokens").get<int64_t>() == n * kGenerate);
      const double wall = r.at("wall_seconds").get<double>();
      CHECK(wall > 0);
      const double aggregate = r.at("aggregate_tokens_per_second").get<double>();
      CHECK(aggregate == Approx(n * kGenerate / wall).epsilon(1e-9));
      CHECK(r.at("ttft_p50_ms").get<double>() > 0);
      // Every token after each session's first is a gap, and the gaps of a
      // session fit in the wall time of the generation.
      CheckGaps(r.at("gaps"), n * (kGenerate - 1));
      CHECK(r.at("gaps").at("max_ms").get<double>() <= 1000 * wall);
      aggregates.push_back(aggregate);
    }
    const double median = decode[row].at("median").at("aggregate_tokens_per_second").get<double>();
    CHECK(median == Approx(0.5 * (aggregates[0] + aggregates[1])).epsilon(1e-9));
    CHECK(decode[row].at("tokens_per_second_at_median_gap").get<double>() ==
          Approx(1000.0 * n / decode[row].at("median").at("gaps").at("p50_ms").get<double>())
              .epsilon(1e-9));
    CHECK(decode[row].at("aggregate_min").get<double>() ==
          Approx(std::min(aggregates[0], aggregates[1])).epsilon(1e-9));
    CHECK(decode[row].at("aggregate_max").get<double>() ==
          Approx(std::max(aggregates[0], aggregates[1])).epsilon(1e-9));
  }
  const double first = decode[0].at("median").at("aggregate_tokens_per_second").get<double>();
  const double second = decode[1].at("median").at("aggregate_tokens_per_second").get<double>();
  CHECK(decode[0].at("aggregate_ratio_vs_first").get<double>() == Approx(1.0));
  CHECK(decode[1].at("aggregate_ratio_vs_first").get<double>() ==
        Approx(second / first).epsilon(1e-9));

  const json& load = out.at("load");
  REQUIRE(load.at("repeats").size() == static_cast<size_t>(kRepeats));
  for (const json& r : load.at("repeats")) {
    INFO(r.dump());
    CheckGaps(r.at("idle"), kLoadGenerate - 1);
    CheckGaps(r.at("loaded"), kLoadGenerate - 1);
    CHECK(r.at("load_covered_generate").get<bool>());
    CHECK(r.at("load_seconds").get<double>() > 0);
    // The load session had ingested tokens before the Generate started; it
    // may or may not finish a step while 4 tokens are generated.
    CHECK(r.at("load_tokens_ingested").get<int64_t>() >= 0);
  }
  const json& median = load.at("median");
  CHECK(load.at("p99_ratio_load_vs_idle").get<double>() ==
        Approx(median.at("loaded").at("p99_ms").get<double>() /
               median.at("idle").at("p99_ms").get<double>())
            .epsilon(1e-9));

  // Every session the tool made is gone.
  auto stub = drt::v1::Drt::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  drt::v1::ListSessionsResponse sessions;
  REQUIRE(stub->ListSessions(&context, {}, &sessions).ok());
  CHECK(sessions.sessions_size() == 0);
}

TEST_CASE("drt-batch-bench refuses bad flags with a message naming them", "[bench]") {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"--sessions", "2,x"}, "--sessions: 'x' is not a positive integer"},
      {{"--sessions", "0"}, "--sessions: '0' is not a positive integer"},
      {{"--generate", "1"}, "--generate must be at least 2"},
      {{"--repeats", "0"}, "--repeats must be at least 1"},
      {{"--load_generate", "1"}, "--load_generate must be 0 or at least 2"},
      {{"--sessions=", "--load_sessions", "0"}, "nothing to measure"},
      // Nothing listens on port 1; the tool says so instead of hanging.
      {{"--server", "127.0.0.1:1", "--connect_timeout", "0.5"}, "cannot reach drt-server"},
  };
  for (const Case& c : cases) {
    const ProgramRun run = RunProgram(drt::testing::BatchBenchBinary(), c.args, 30);
    INFO("args " << c.args[0] << " " << (c.args.size() > 1 ? c.args[1] : "") << "\nstderr: "
                 << run.errors);
    CHECK(run.exit_status == 1);
    CHECK_THAT(run.errors, Contains(c.message));
  }
}

}  // namespace
}  // namespace drt::server

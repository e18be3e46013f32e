// drt-niah-text on a haystack longer than its --text: refused by default
// (the filler would repeat, and repeated passages compete with the needle in
// retrieval), run with --allow_repeat and then recorded as text_repeats in
// the JSON (review-tools 2026-11-24 #9). Also: the JSON is valid with a quote
// in the text's path (absl::CEscape wrote \' before). Run for real on the CPU
// with the bundled passkey model at a tiny size.
#include <stdlib.h>  // mkdtemp

#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "nlohmann/json.hpp"
#include "tests/server/test_util/run_program.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

const std::string kModel = std::string(drt::testing::SourceDir()) + "/models/drt-passkey-byte";

TEST_CASE("drt-niah-text refuses a length longer than the text unless --allow_repeat, and records it",
          "[server][process][bench]") {
  std::string pattern = (std::filesystem::temp_directory_path() / "drt-niah-repeat.XXXXXX");
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  const std::filesystem::path dir = pattern;
  // 5,000 bytes of words (the tool needs at least 4,096), in a file whose
  // name has a quote.
  const std::filesystem::path text = dir / "it's.txt";
  {
    std::ofstream out(text);
    std::string words;
    for (int i = 0; words.size() < 5000; ++i) words += "word" + std::to_string(i % 997) + " ";
    out << words.substr(0, 5000);
  }
  const std::filesystem::path json = dir / "out.json";
  const std::vector<std::string> args = {
      "--model", kModel, "--text", text.string(), "--tasks", "passkey", "--lengths", "8K",
      "--depths", "0.5", "--trials", "1", "--threads", "1", "--json", json.string()};

  const ProgramRun refused = RunProgram(drt::testing::NiahTextBinary(), args, 60);
  CHECK(refused.exit_status != 0);
  CHECK_THAT(refused.errors, Contains("8192 bytes is longer than the --text (5000 bytes)"));
  CHECK_THAT(refused.errors, Contains("--allow_repeat"));
  CHECK_FALSE(std::filesystem::exists(json));

  auto allowed_args = args;
  allowed_args.push_back("--allow_repeat");
  const ProgramRun allowed = RunProgram(drt::testing::NiahTextBinary(), allowed_args, 180);
  INFO("stdout:\n" << allowed.output << "\nstderr:\n" << allowed.errors);
  REQUIRE(allowed.exit_status == 0);
  CHECK_THAT(allowed.errors, Contains("reads the 5000-byte text 1.64 times"));
  CHECK_THAT(allowed.output, Contains("the filler repeats the text 1.64 times"));
  std::ifstream in(json);
  const nlohmann::json result = nlohmann::json::parse(in);  // throws on invalid JSON
  CHECK(result["text"] == text.string());
  REQUIRE(result["cells"].size() == 1);
  // 8,192 / 5,000, computed here independently of the tool.
  CHECK(result["cells"][0]["text_repeats"].get<double>() == Approx(8192.0 / 5000.0));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace drt::server

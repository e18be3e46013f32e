// drt-ppl's --json file (bench/perplexity/output_file.h): the check before the
// run changes nothing, the write replaces the file whole, and a file named
// twice (--json = --text) is refused.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "bench/perplexity/output_file.h"
#include "tests/test_util/temp_dir.h"

namespace drt::ppl {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST_CASE("drt-ppl --json check leaves an existing file as it is", "[ppl]") {
  testing::TempDir dir;
  const std::string out = dir.File("out.json");
  Write(out, "earlier results");
  CHECK(CheckWritable("--json", out).ok());
  CHECK(Read(out) == "earlier results");
  // A missing file in a writable folder is fine and is not created.
  CHECK(CheckWritable("--json", dir.File("new.json")).ok());
  CHECK_FALSE(std::filesystem::exists(dir.File("new.json")));
}

TEST_CASE("drt-ppl --json check refuses a folder and a missing folder by flag", "[ppl]") {
  testing::TempDir dir;
  for (const std::string& bad : {dir.path(), dir.File("no_such_dir/out.json")}) {
    INFO(bad);
    const absl::Status s = CheckWritable("--json", bad);
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("--json") != std::string::npos);
    CHECK(std::string(s.message()).find(bad) != std::string::npos);
  }
}

TEST_CASE("drt-ppl --json write replaces the file whole and leaves no temporary", "[ppl]") {
  testing::TempDir dir;
  const std::string out = dir.File("out.json");
  Write(out, std::string(10000, 'x'));  // longer than what replaces it
  REQUIRE(WriteFileReplacing("--json", out, "{}\n").ok());
  CHECK(Read(out) == "{}\n");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    (void)entry;
    ++files;
  }
  CHECK(files == 1);
  const absl::Status s = WriteFileReplacing("--json", dir.File("no_such_dir/out.json"), "{}");
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(std::string(s.message()).find("--json") != std::string::npos);
}

TEST_CASE("drt-ppl refuses --json naming the --text file", "[ppl]") {
  testing::TempDir dir;
  const std::string doc = dir.File("doc.txt");
  Write(doc, "document");
  std::filesystem::create_directory(dir.File("sub"));
  std::filesystem::create_hard_link(doc, dir.File("link.txt"));
  for (const std::string& same : {doc, dir.File("sub/../doc.txt"), dir.File("./doc.txt"), dir.File("link.txt")}) {
    INFO(same);
    const absl::Status s = CheckNotSameFile("--json", same, "--text", doc);
    REQUIRE_FALSE(s.ok());
    CHECK(std::string(s.message()).find("--json") != std::string::npos);
    CHECK(std::string(s.message()).find("--text") != std::string::npos);
  }
  CHECK(CheckNotSameFile("--json", dir.File("out.json"), "--text", doc).ok());
  CHECK(CheckNotSameFile("--json", dir.File("doc.txt.json"), "--text", doc).ok());
  CHECK(Read(doc) == "document");
}

}  // namespace
}  // namespace drt::ppl

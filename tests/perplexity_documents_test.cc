// drt-ppl's several documents (bench/perplexity/document_list.h): every
// --text of the command line is read (absl keeps the last only), and a
// folder lists its regular files sorted, each a document, each once.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "bench/perplexity/document_list.h"
#include "tests/test_util/temp_dir.h"

namespace drt::ppl {
namespace {

std::vector<std::string> Values(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  return RepeatedFlagValues(static_cast<int>(argv.size()), argv.data(), "text");
}

TEST_CASE("drt-ppl reads every --text of the command line, in order", "[ppl]") {
  CHECK(Values({"drt-ppl", "--text", "a", "--piece", "5", "--text=b", "-text", "c", "-text=d"}) ==
        std::vector<std::string>{"a", "b", "c", "d"});
  // Other flags' names and values are not --text, and a value is taken whole.
  CHECK(Values({"drt-ppl", "--json", "x", "--texts", "y", "--text_other=z", "--text", "--piece"}) ==
        std::vector<std::string>{"--piece"});
  // Nothing after a lone "--" (absl's end of flags), nor a dangling --text.
  CHECK(Values({"drt-ppl", "--text", "a", "--", "--text", "b"}) == std::vector<std::string>{"a"});
  CHECK(Values({"drt-ppl", "--text"}).empty());
  CHECK(Values({"drt-ppl"}).empty());
}

TEST_CASE("drt-ppl --text folders list their regular files sorted, each document once", "[ppl]") {
  testing::TempDir dir;
  namespace fs = std::filesystem;
  const std::string books = dir.File("books");
  fs::create_directories(books + "/sub");
  for (const char* name : {"b.txt", "a.txt", "c.bin"}) std::ofstream(books + "/" + name) << "text";
  std::ofstream(books + "/sub/d.txt") << "skipped";
  const std::string single = dir.File("single.txt");
  std::ofstream(single) << "one";

  auto listed = ListDocuments("--text", {books, single});
  REQUIRE(listed.ok());
  CHECK(*listed == std::vector<std::string>{books + "/a.txt", books + "/b.txt", books + "/c.bin", single});

  // A file named twice, directly or through its folder, or by another path.
  for (const std::vector<std::string>& twice :
       {std::vector<std::string>{single, single}, {books, books + "/b.txt"},
        {single, dir.File("books/../single.txt")}}) {
    auto refused = ListDocuments("--text", twice);
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(refused.status().message()).find("named twice") != std::string::npos);
  }
  fs::create_directories(dir.File("empty/sub"));
  auto empty = ListDocuments("--text", {dir.File("empty")});
  CHECK(empty.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(empty.status().message()).find("no regular file") != std::string::npos);
  auto missing = ListDocuments("--text", {single, dir.File("missing.txt")});
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(missing.status().message()).find("--text") != std::string::npos);
  CHECK(std::string(missing.status().message()).find("missing.txt") != std::string::npos);
}

}  // namespace
}  // namespace drt::ppl

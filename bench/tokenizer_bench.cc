// drt-tokenizer-bench: throughput of the GPT-2 pre-tokenizer alone and of the
// whole BPE encoder (cold word cache: a freshly loaded tokenizer per run) on
// text files. Prints the median over --runs of each.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "engine/tokenizer/gpt2_pretokenizer.h"
#include "engine/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "tests/fixtures/gpt2-tokenizer/tokenizer.json",
          "Hugging Face GPT-2 tokenizer.json");
ABSL_FLAG(std::string, text, "", "comma-separated text files to encode");
ABSL_FLAG(int32_t, runs, 9, "timed runs per file and measurement");

namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("drt-tokenizer-bench --text a.txt,b.txt [--runs 9]");
  absl::ParseCommandLine(argc, argv);
  const int runs = std::max(1, absl::GetFlag(FLAGS_runs));
  const std::string tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  for (const std::string& path :
       std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_text), ',', absl::SkipEmpty()))) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", path.c_str());
      return 1;
    }
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string text = buffer.str();
    const double megabytes = text.size() / 1e6;

    const drt::Gpt2PreTokenizer pretokenizer{};
    std::vector<double> split_seconds;
    size_t pieces = 0;
    for (int r = 0; r < runs; ++r) {
      pieces = 0;
      const auto start = std::chrono::steady_clock::now();
      pretokenizer.Split(text, [&](std::string_view) { ++pieces; });
      split_seconds.push_back(Seconds(start));
    }

    std::vector<double> encode_seconds;
    size_t tokens = 0;
    for (int r = 0; r < runs; ++r) {
      auto tokenizer = drt::LoadBpeTokenizer(tokenizer_path);
      if (!tokenizer.ok()) {
        std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
        return 1;
      }
      const auto start = std::chrono::steady_clock::now();
      auto ids = (*tokenizer)->Encode(text);
      encode_seconds.push_back(Seconds(start));
      if (!ids.ok()) {
        std::fprintf(stderr, "%s\n", ids.status().ToString().c_str());
        return 1;
      }
      tokens = ids->size();
    }
    std::printf("%s: %.2f MB, %zu pieces, %zu tokens; median of %d: pre-tokenizer %.1f MB/s, "
                "encode (cold cache) %.1f MB/s\n",
                path.c_str(), megabytes, pieces, tokens, runs, megabytes / Median(split_seconds),
                megabytes / Median(encode_seconds));
  }
  return 0;
}

// drt-tokenizer-bench: throughput of the GPT-2 pre-tokenizer alone and of the
// whole BPE encoder (cold word cache: a freshly loaded tokenizer per run) on
// text files. Prints the median over --runs of each, by the wall clock and by
// the CPU time of this (single-threaded) process, which a busy machine
// disturbs less.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "bench/batch/latency_stats.h"
#include "cli/command_line.h"
#include "engine/tokenizer/gpt2_pretokenizer.h"
#include "engine/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "tests/fixtures/gpt2-tokenizer/tokenizer.json",
          "Hugging Face GPT-2 tokenizer.json");
ABSL_FLAG(std::string, text, "", "comma-separated text files to encode");
ABSL_FLAG(int32_t, runs, 9, "timed runs per file and measurement");

namespace {

// The mean of the two middle runs for an even --runs (this copy took the
// upper one before review-final2 L7).
using drt::bench::Median;

// Wall-clock and CPU seconds since construction.
class Timer {
 public:
  Timer() : wall_(std::chrono::steady_clock::now()), cpu_(CpuSeconds()) {}
  double wall() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_).count();
  }
  double cpu() const { return CpuSeconds() - cpu_; }

 private:
  static double CpuSeconds() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
  }
  std::chrono::steady_clock::time_point wall_;
  double cpu_;
};

}  // namespace

int main(int argc, char** argv) {
  drt::cli::ParseCommandLine(
      {"drt-tokenizer-bench",
       "Times the GPT-2 pre-tokenizer and the full encode on text files.\n"
       "Example: drt-tokenizer-bench --text a.txt,b.txt [--runs 9]",
       {"bench/tokenizer_bench.cc"}},
      argc, argv);
  if (absl::GetFlag(FLAGS_text).empty()) {
    std::fprintf(stderr, "error: --text is required (comma-separated text files)\n");
    return 1;
  }
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
    std::vector<double> split_wall, split_cpu;
    size_t pieces = 0;
    for (int r = 0; r < runs; ++r) {
      pieces = 0;
      const Timer timer;
      pretokenizer.Split(text, [&](std::string_view) { ++pieces; });
      split_wall.push_back(timer.wall());
      split_cpu.push_back(timer.cpu());
    }

    std::vector<double> encode_wall, encode_cpu;
    size_t tokens = 0;
    for (int r = 0; r < runs; ++r) {
      auto tokenizer = drt::LoadBpeTokenizer(tokenizer_path);
      if (!tokenizer.ok()) {
        std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
        return 1;
      }
      const Timer timer;
      auto ids = (*tokenizer)->Encode(text);
      encode_wall.push_back(timer.wall());
      encode_cpu.push_back(timer.cpu());
      if (!ids.ok()) {
        std::fprintf(stderr, "%s\n", ids.status().ToString().c_str());
        return 1;
      }
      tokens = ids->size();
    }
    std::printf("%s: %.2f MB, %zu pieces, %zu tokens; median MB/s of %d runs, wall / cpu: "
                "pre-tokenizer %.1f / %.1f, encode (cold cache) %.1f / %.1f\n",
                path.c_str(), megabytes, pieces, tokens, runs, megabytes / Median(split_wall),
                megabytes / Median(split_cpu), megabytes / Median(encode_wall),
                megabytes / Median(encode_cpu));
  }
  return 0;
}

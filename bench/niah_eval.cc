// drt-niah: passkey retrieval accuracy by haystack length and needle depth.
// One filler prefix per length is shared by every trial through session
// fork (exact: the fork continues the parent's state), so a table costs far
// less than lengths x depths x trials full prefills.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "bench/niah/cell_seed.h"
#include "bench/niah/eval_options.h"
#include "bench/niah/passkey_haystack.h"
#include "bench/niah/result_json.h"
#include "bench/perplexity/output_file.h"
#include "cli/command_line.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/model.h"
#include "engine/session.h"

ABSL_FLAG(std::string, model, "models/drt-passkey-byte", "model directory");
ABSL_FLAG(std::string, lengths, "4K,16K,64K", "haystack lengths in tokens (K = 1024, M = 1048576)");
ABSL_FLAG(std::string, depths, "0,0.25,0.5,0.75,1", "needle depths, 0 = start, 1 = end");
ABSL_FLAG(int32_t, trials, 20, "trials (random keys) per length and depth");
ABSL_FLAG(std::string, pad_to_chunk_boundary, "model",
          "pad the open chunk before generating: true, false, or model (the model directory's "
          "generation_config.json default)");
ABSL_FLAG(int32_t, max_new_tokens, 8, "tokens generated per answer");
ABSL_FLAG(uint64_t, seed, 1,
          "seed of the random keys; each cell's keys come from (seed, length, depth) alone");
ABSL_FLAG(int32_t, threads, 0,
          "CPU threads (0: the CPUs this process may use; engine/cpu/cpu_threads.h)");
ABSL_FLAG(std::string, device, "cpu",
          "cpu, cuda or auto (auto: cuda when this build has the CUDA backend and GPU "
          "--cuda_device is visible, else cpu)");
ABSL_FLAG(int32_t, cuda_device, 0, "GPU index for --device=cuda");
ABSL_FLAG(std::string, cuda_precision, "bf16", "CUDA number format: bf16 or fp32");
ABSL_FLAG(std::string, json, "",
          "write the results here as JSON (the run's settings and every trial), after every cell");

namespace {

using Clock = std::chrono::steady_clock;

using drt::niah::TrialRecord;

struct Cell {
  int64_t length;
  double depth;
  int trials = 0, correct = 0;
  double seconds = 0;
  std::vector<TrialRecord> records;
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  drt::cli::ParseCommandLine(
      {"drt-niah",
       "Passkey retrieval accuracy table.\n"
       "Example: drt-niah --model models/drt-passkey-byte --lengths 4K,64K,1M --trials 5",
       {"bench/niah_eval.cc"}},
      argc, argv);
  if (absl::GetFlag(FLAGS_trials) < 1) {
    return Fail(absl::InvalidArgumentError("--trials must be at least 1"));
  }
  if (absl::Status s = drt::niah::CheckMaxNewTokens(absl::GetFlag(FLAGS_max_new_tokens)); !s.ok()) {
    return Fail(s);
  }
  if (absl::Status s = drt::niah::CheckThreads(absl::GetFlag(FLAGS_threads)); !s.ok()) return Fail(s);

  auto parsed_lengths = drt::niah::ParseLengths(absl::GetFlag(FLAGS_lengths));
  if (!parsed_lengths.ok()) return Fail(parsed_lengths.status());
  const std::vector<int64_t> lengths = *std::move(parsed_lengths);
  auto parsed_depths = drt::niah::ParseDepths(absl::GetFlag(FLAGS_depths));
  if (!parsed_depths.ok()) return Fail(parsed_depths.status());
  std::vector<double> depths = *std::move(parsed_depths);
  std::sort(depths.begin(), depths.end());
  // An unwritable --json is found now, not after a run of hours; the check
  // leaves the file as it is (it is replaced, whole, once the first cell is done).
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    if (absl::Status s = drt::ppl::CheckOutputFile("--json", json_path,
                                                   {{"--model", absl::GetFlag(FLAGS_model)}});
        !s.ok()) {
      return Fail(s);
    }
  }

  auto model = drt::LoadModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return Fail(model.status());
  const int64_t max_length = *std::max_element(lengths.begin(), lengths.end());
  auto haystacks =
      drt::niah::PasskeyHaystacks::Create(*(*model)->tokenizer, drt::niah::HaystackFormat{}, max_length);
  if (!haystacks.ok()) {  // the longest length is too short: named as the others are
    return Fail(absl::InvalidArgumentError(absl::StrCat("--lengths: ", haystacks.status().message())));
  }
  // Every length, not only the largest: a shorter one would get a haystack
  // longer than its label (review-tools 2026-11-24 #21). The minimum is in
  // tokens of this model's tokenizer, so it is known only once the model is
  // loaded; no backend is made and nothing runs before this check.
  for (int64_t length : lengths) {
    if (length < haystacks->min_length()) {
      return Fail(absl::InvalidArgumentError(absl::StrFormat(
          "--lengths: %d tokens cannot hold the question and a needle (at least %d)", length,
          haystacks->min_length())));
    }
  }
  const std::string device = absl::GetFlag(FLAGS_device);
  const std::string cuda_precision = absl::GetFlag(FLAGS_cuda_precision);
  auto made = drt::niah::MakeEvalBackend(
      **model, {device, absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_cuda_device), cuda_precision});
  if (!made.ok()) return Fail(made.status());
  std::unique_ptr<drt::Backend> backend = *std::move(made);

  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  std::vector<Cell> cells;
  const int trials = absl::GetFlag(FLAGS_trials);
  drt::GenerateOptions generate;
  generate.max_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  auto pad = drt::niah::ResolvePadToChunkBoundary(absl::GetFlag(FLAGS_pad_to_chunk_boundary), **model);
  if (!pad.ok()) return Fail(pad.status());
  generate.pad_to_chunk_boundary = *pad;

  // The results with the run's settings and every trial (review-tools
  // 2026-11-25 #4, #11): enough to re-run a cell alone and to pair trials.
  const std::string precision = backend->name() == "cuda" ? cuda_precision : "fp32";
  const auto write_json = [&](bool complete) -> absl::Status {
    if (json_path.empty()) return absl::OkStatus();
    nlohmann::json out = drt::niah::RunJson(
        {absl::GetFlag(FLAGS_model), generate.pad_to_chunk_boundary, seed, backend->name(),
         precision, absl::GetFlag(FLAGS_threads), generate.max_tokens},
        complete);
    out["trials"] = trials;
    for (const Cell& c : cells) {
      out["cells"].push_back({{"length", c.length},
                              {"depth", c.depth},
                              {"trials", c.trials},
                              {"correct", c.correct},
                              {"seconds", c.seconds},
                              {"records", drt::niah::TrialRecordsJson(c.records)}});
    }
    return drt::niah::WriteRunJson(json_path, out);
  };

  for (int64_t length : lengths) {
    auto shared = drt::Session::Create(*backend);
    if (!shared.ok()) return Fail(shared.status());
    int64_t shared_tokens = 0;
    for (double depth : depths) {
      Cell cell{length, depth};
      const auto start = Clock::now();
      const int64_t offset = haystacks->NeedleOffset(length, depth);
      if (offset > shared_tokens) {
        auto added = (*shared)->Append(haystacks->Filler(shared_tokens, offset));
        if (!added.ok()) return Fail(added.status());
        shared_tokens = offset;
      }
      const uint64_t cell_seed = drt::niah::CellSeed(seed, "passkey", length, depth);
      for (int t = 0; t < trials; ++t) {
        uint64_t key_state = drt::niah::TrialSeed(cell_seed, t);
        const std::string key = drt::niah::RandomKey(key_state, haystacks->format().key_digits);
        auto trial = (*shared)->Fork();
        if (!trial.ok()) return Fail(trial.status());
        auto needle = haystacks->Needle(key);
        if (!needle.ok()) return Fail(needle.status());
        const int64_t after = haystacks->FillerAfterNeedle(length, offset, needle->size());
        for (const auto& part : {*needle, haystacks->Filler(offset, offset + after), haystacks->question()}) {
          if (auto added = (*trial)->Append(part); !added.ok()) return Fail(added.status());
        }
        auto answer = (*trial)->Generate(generate);
        if (!answer.ok()) return Fail(answer.status());
        auto text = (*model)->tokenizer->Decode(answer->tokens);
        const bool ok = text.ok() && drt::niah::AnswerMatches(*text, key);
        cell.correct += ok ? 1 : 0;
        ++cell.trials;
        cell.records.push_back({key, text.ok() ? *text : "", ok, offset});
      }
      cell.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      std::fprintf(stderr, "length %ld depth %.2f: %d/%d (%.1f s)\n", static_cast<long>(length),
                   depth, cell.correct, cell.trials, cell.seconds);
      cells.push_back(std::move(cell));
      // Written after every cell: a run stopped part-way keeps the cells
      // it finished (review-tools 2026-11-25 #11).
      if (absl::Status s = write_json(/*complete=*/false); !s.ok()) return Fail(s);
    }
  }

  // Table: one row per length, one column per depth.
  std::printf("%-10s", "length");
  for (double d : depths) std::printf(" depth %-5.2f", d);
  std::printf(" %8s %9s\n", "all", "seconds");
  for (int64_t length : lengths) {
    std::printf("%-10ld", static_cast<long>(length));
    int correct = 0, total = 0;
    double seconds = 0;
    for (const Cell& c : cells) {
      if (c.length != length) continue;
      std::printf(" %10.1f%%", 100.0 * c.correct / std::max(1, c.trials));
      correct += c.correct;
      total += c.trials;
      seconds += c.seconds;
    }
    std::printf(" %7.1f%% %9.1f\n", 100.0 * correct / std::max(1, total), seconds);
  }

  if (absl::Status s = write_json(/*complete=*/true); !s.ok()) return Fail(s);
  return 0;
}

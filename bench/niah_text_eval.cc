// drt-niah-text: retrieval accuracy on filler drawn from a text file or
// directory (bench/niah/text_tasks.h): passkey (passkey_data.py's exact
// needle and question), passkey in held-out wordings, keyed needles, 2-hop
// variable tracking; by task, haystack length and needle depth.
//
// Each (task, length, depth) cell reads the text from its own random start
// offset; its trials differ in keys, names and the other needles' places.
// Both come from (seed, task, length, depth) alone (bench/niah/cell_seed.h),
// so a cell is the same whatever else the command runs.
// The filler before the cell's earliest needle is prefilled once and shared
// by the trials through session fork (exact: the fork continues the parent's
// state). Lengths are in bytes, which are tokens for the byte-level models
// this tool accepts (it checks the tokenizer maps bytes one to one).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/niah/cell_seed.h"
#include "bench/niah/eval_options.h"
#include "bench/niah/passkey_haystack.h"
#include "bench/niah/result_json.h"
#include "bench/niah/text_tasks.h"
#include "bench/perplexity/output_file.h"
#include "cli/command_line.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/model.h"
#include "engine/session.h"

ABSL_FLAG(std::string, model, "models/drt-text-byte", "model directory (byte-level tokenizer)");
ABSL_FLAG(std::string, text, "", "filler text: a file, or a directory whose files are joined");
ABSL_FLAG(std::string, tasks, "passkey,passkey_varied,keyed,two_hop", "tasks to run");
ABSL_FLAG(std::string, lengths, "4K,16K,64K", "haystack lengths in bytes (K = 1024, M = 1048576)");
ABSL_FLAG(std::string, depths, "0.1,0.5,0.9", "depths of the answer's needle, 0 = start, 1 = end");
ABSL_FLAG(int32_t, trials, 20, "trials per task, length and depth");
ABSL_FLAG(std::string, pad_to_chunk_boundary, "model", "true, false, or model (generation_config.json)");
ABSL_FLAG(int32_t, max_new_tokens, 8, "tokens generated per answer");
ABSL_FLAG(uint64_t, seed, 1,
          "seed of start offsets, keys, names and needle places; each cell's come from (seed, "
          "task, length, depth) alone");
ABSL_FLAG(int32_t, threads, 0,
          "CPU threads (0: the CPUs this process may use; engine/cpu/cpu_threads.h)");
ABSL_FLAG(std::string, device, "cpu",
          "cpu, cuda or auto (auto: cuda when this build has the CUDA backend and GPU "
          "--cuda_device is visible, else cpu)");
ABSL_FLAG(int32_t, cuda_device, 0, "GPU index for --device=cuda");
ABSL_FLAG(std::string, cuda_precision, "bf16", "CUDA number format: bf16 or fp32");
ABSL_FLAG(std::string, json, "",
          "write the results here as JSON (the run's settings and every trial), after every cell");
ABSL_FLAG(bool, show_answers, false, "print every trial's expected key and generated text");
ABSL_FLAG(bool, allow_repeat, false,
          "run lengths longer than the --text (its filler then repeats, and repeated passages "
          "compete with the needle in retrieval; each cell records text_repeats); without it "
          "such lengths are refused");

namespace {

using Clock = std::chrono::steady_clock;

using drt::niah::TrialRecord;

struct Cell {
  std::string task;
  int64_t length;
  double depth;
  int trials = 0, correct = 0;
  double seconds = 0;
  double text_repeats = 0;  // length / text bytes: above 1 the filler repeats
  int64_t text_start = 0;   // the text's byte where the cell's filler starts
  std::vector<TrialRecord> records;
};

// One (task, length, depth) cell's haystacks: the filler's start and every
// trial's needles, drawn before anything runs.
struct CellPlan {
  drt::niah::TextTask task;
  int64_t length;
  double depth;
  int64_t text_start;
  drt::niah::TextFiller filler;
  std::vector<drt::niah::TextTrial> trials;
  int64_t shared_end = 0;  // filler bytes before the cell's earliest needle
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
  return 1;
}

// Encodes `bytes` and appends them in pieces (bounded memory for 1M+ fillers).
absl::Status AppendText(drt::Session& session, const drt::Tokenizer& tokenizer, const std::string& bytes) {
  constexpr size_t kPiece = 1 << 16;
  for (size_t at = 0; at < bytes.size(); at += kPiece) {
    auto ids = tokenizer.Encode(std::string_view(bytes).substr(at, kPiece));
    if (!ids.ok()) return ids.status();
    if (auto added = session.Append(*ids); !added.ok()) return added.status();
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  drt::cli::ParseCommandLine(
      {"drt-niah-text",
       "Retrieval accuracy on text filler.\n"
       "Example: drt-niah-text --model models/drt-text-byte --text "
       "tests/fixtures/heldout-text/debian_handbook_excerpt.txt "
       "--tasks passkey,keyed --lengths 4K,64K --trials 5",
       {"bench/niah_text_eval.cc"}},
      argc, argv);

  std::vector<drt::niah::TextTask> tasks;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_tasks), ','))) {
    auto task = drt::niah::ParseTextTask(part);
    if (!task.ok()) return Fail(task.status());
    tasks.push_back(*task);
  }
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
  const std::vector<double> depths = *std::move(parsed_depths);
  if (absl::GetFlag(FLAGS_text).empty()) return Fail(absl::InvalidArgumentError("--text is required"));
  // An unwritable --json, or one that would overwrite the corpus, is found
  // now, not after a run of hours (review-tools 2026-11-25 #3); the check
  // leaves the file as it is (it is replaced, whole, once the first cell is done).
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    if (absl::Status s = drt::ppl::CheckOutputFile(
            "--json", json_path,
            {{"--text", absl::GetFlag(FLAGS_text)}, {"--model", absl::GetFlag(FLAGS_model)}});
        !s.ok()) {
      return Fail(s);
    }
  }
  auto text = drt::niah::LoadFillerText(absl::GetFlag(FLAGS_text));
  if (!text.ok()) return Fail(text.status());
  // A haystack longer than the text repeats it (TextFiller wraps): refused
  // unless asked for, and then said and recorded (review-tools 2026-11-24 #9).
  const int64_t text_bytes = static_cast<int64_t>(text->size());
  for (int64_t length : lengths) {
    const double repeats = drt::niah::TextRepeats(length, text_bytes);
    if (repeats <= 1.0) continue;
    if (!absl::GetFlag(FLAGS_allow_repeat)) {
      return Fail(absl::InvalidArgumentError(absl::StrFormat(
          "--lengths: %d bytes is longer than the --text (%d bytes), whose filler would repeat "
          "%.2f times; repeated passages compete with the needle in retrieval, so the cell would "
          "not measure length alone. Give a longer --text, or --allow_repeat to run it anyway "
          "(each cell then records text_repeats)",
          length, text_bytes, repeats)));
    }
    std::fprintf(stderr,
                 "warning: length %ld reads the %ld-byte text %.2f times (--allow_repeat): the "
                 "filler repeats\n",
                 static_cast<long>(length), static_cast<long>(text_bytes), repeats);
  }
  // Every cell's haystacks are planned before the model loads: a length too
  // short for a task's needles and question is refused now, naming the flag
  // (it failed mid-run, after the cells before it; review-tools 2026-11-25
  // #13). The plans are small (offsets and the needles' text).
  // Each cell's start offset from its own seed, each trial's needles from
  // the trial's (bench/niah/cell_seed.h): a cell is the same whatever else
  // the command runs.
  const int trials = absl::GetFlag(FLAGS_trials);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  std::vector<CellPlan> plans;
  for (drt::niah::TextTask task : tasks) {
    for (int64_t length : lengths) {
      for (double depth : depths) {
        const uint64_t cell_seed = drt::niah::CellSeed(seed, drt::niah::TextTaskName(task), length, depth);
        uint64_t start_state = cell_seed;
        const int64_t text_start = static_cast<int64_t>(drt::niah::RandomBelow(start_state, text->size()));
        CellPlan plan{task, length, depth, text_start, drt::niah::TextFiller(*text, text_start)};
        plan.shared_end = length;
        for (int t = 0; t < trials; ++t) {
          uint64_t state = drt::niah::TrialSeed(cell_seed, t);
          auto trial = drt::niah::MakeTextTrial(task, plan.filler, length, depth, state);
          if (!trial.ok()) {
            return Fail(absl::InvalidArgumentError(absl::StrCat("--lengths: ", trial.status().message())));
          }
          plan.shared_end = std::min(plan.shared_end, trial->inserts.front().at);
          plan.trials.push_back(*std::move(trial));
        }
        plans.push_back(std::move(plan));
      }
    }
  }

  auto model = drt::LoadModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return Fail(model.status());
  const drt::Tokenizer& tokenizer = *(*model)->tokenizer;
  {  // lengths count bytes: the tokenizer must map them one to one
    auto probe = tokenizer.Encode(std::string_view(*text).substr(0, 4096));
    if (!probe.ok()) return Fail(probe.status());
    if (probe->size() != 4096) {
      return Fail(absl::InvalidArgumentError(absl::StrFormat(
          "drt-niah-text needs a byte-level tokenizer: 4096 bytes of the text became %d tokens", probe->size())));
    }
  }
  auto pad = drt::niah::ResolvePadToChunkBoundary(absl::GetFlag(FLAGS_pad_to_chunk_boundary), **model);
  if (!pad.ok()) return Fail(pad.status());
  const std::string device = absl::GetFlag(FLAGS_device);
  const std::string cuda_precision = absl::GetFlag(FLAGS_cuda_precision);
  auto made = drt::niah::MakeEvalBackend(
      **model, {device, absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_cuda_device), cuda_precision});
  if (!made.ok()) return Fail(made.status());
  std::unique_ptr<drt::Backend> backend = *std::move(made);

  drt::GenerateOptions generate;
  generate.max_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  generate.pad_to_chunk_boundary = *pad;
  std::vector<Cell> cells;

  // The results with the run's settings and every trial (review-tools
  // 2026-11-25 #4, #11): enough to re-run a cell alone and to pair trials.
  const std::string precision = backend->name() == "cuda" ? cuda_precision : "fp32";
  const auto write_json = [&](bool complete) -> absl::Status {
    if (json_path.empty()) return absl::OkStatus();
    // nlohmann::json escapes the paths (absl::CEscape wrote C escapes such as
    // \' that are not JSON).
    nlohmann::json out = drt::niah::RunJson(
        {absl::GetFlag(FLAGS_model), generate.pad_to_chunk_boundary, seed, backend->name(),
         precision, absl::GetFlag(FLAGS_threads), generate.max_tokens},
        complete);
    out["text"] = absl::GetFlag(FLAGS_text);
    out["text_bytes"] = text_bytes;
    for (const Cell& c : cells) {
      out["cells"].push_back({{"task", c.task},
                              {"length", c.length},
                              {"depth", c.depth},
                              {"trials", c.trials},
                              {"correct", c.correct},
                              {"seconds", c.seconds},
                              {"text_repeats", c.text_repeats},
                              {"text_start", c.text_start},
                              {"records", drt::niah::TrialRecordsJson(c.records)}});
    }
    return drt::niah::WriteRunJson(json_path, out);
  };

  for (const CellPlan& cell_plan : plans) {
    const drt::niah::TextTask task = cell_plan.task;
    const int64_t length = cell_plan.length;
    const double depth = cell_plan.depth;
    const drt::niah::TextFiller& filler = cell_plan.filler;
    const std::vector<drt::niah::TextTrial>& plan = cell_plan.trials;
    const int64_t shared_end = cell_plan.shared_end;
    Cell cell{std::string(drt::niah::TextTaskName(task)), length, depth};
    cell.text_repeats = drt::niah::TextRepeats(length, text_bytes);
    cell.text_start = cell_plan.text_start;
    const auto start = Clock::now();
    auto shared = drt::Session::Create(*backend);
    if (!shared.ok()) return Fail(shared.status());
    if (auto s = AppendText(**shared, tokenizer, filler.Bytes(0, shared_end)); !s.ok()) return Fail(s);
    for (const drt::niah::TextTrial& trial : plan) {
      auto fork = (*shared)->Fork();
      if (!fork.ok()) return Fail(fork.status());
      std::string rest;
      int64_t cursor = shared_end;
      for (const drt::niah::Insert& insert : trial.inserts) {
        rest += filler.Bytes(cursor, insert.at);
        rest += insert.text;
        cursor = insert.at;
      }
      rest += filler.Bytes(cursor, drt::niah::FillerBytes(trial, length));
      rest += trial.question;
      if (auto s = AppendText(**fork, tokenizer, rest); !s.ok()) return Fail(s);
      auto answer = (*fork)->Generate(generate);
      if (!answer.ok()) return Fail(answer.status());
      auto decoded = tokenizer.Decode(answer->tokens);
      const bool ok = decoded.ok() && drt::niah::AnswerMatches(*decoded, trial.answer);
      if (absl::GetFlag(FLAGS_show_answers)) {
        std::fprintf(stderr, "  %s want %s got '%s'\n", ok ? "ok " : "BAD", trial.answer.c_str(),
                     decoded.ok() ? absl::CEscape(*decoded).c_str() : "?");
      }
      cell.correct += ok ? 1 : 0;
      ++cell.trials;
      cell.records.push_back({trial.answer, decoded.ok() ? *decoded : "", ok, trial.target_at});
    }
    cell.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::fprintf(stderr, "%s length %ld depth %.2f: %d/%d (%.1f s)%s\n", cell.task.c_str(),
                 static_cast<long>(length), depth, cell.correct, cell.trials, cell.seconds,
                 cell.text_repeats > 1.0
                     ? absl::StrFormat(" (text repeated %.2fx)", cell.text_repeats).c_str()
                     : "");
    cells.push_back(std::move(cell));
    // Written after every cell: a run stopped part-way keeps the cells it
    // finished (review-tools 2026-11-25 #11).
    if (absl::Status s = write_json(/*complete=*/false); !s.ok()) return Fail(s);
  }

  std::printf("%-15s %-10s", "task", "length");
  for (double d : depths) std::printf(" depth %-5.2f", d);
  std::printf(" %8s %9s\n", "all", "seconds");
  for (drt::niah::TextTask task : tasks) {
    for (int64_t length : lengths) {
      std::printf("%-15s %-10ld", std::string(drt::niah::TextTaskName(task)).c_str(), static_cast<long>(length));
      int correct = 0, total = 0;
      double seconds = 0;
      for (const Cell& c : cells) {
        if (c.task != drt::niah::TextTaskName(task) || c.length != length) continue;
        std::printf(" %10.1f%%", 100.0 * c.correct / std::max(1, c.trials));
        correct += c.correct;
        total += c.trials;
        seconds += c.seconds;
      }
      std::printf(" %7.1f%% %9.1f\n", 100.0 * correct / std::max(1, total), seconds);
    }
  }
  for (int64_t length : lengths) {
    if (const double repeats = drt::niah::TextRepeats(length, text_bytes); repeats > 1.0) {
      std::printf("note: at length %ld the filler repeats the text %.2f times (--allow_repeat)\n",
                  static_cast<long>(length), repeats);
    }
  }

  if (absl::Status s = write_json(/*complete=*/true); !s.ok()) return Fail(s);
  return 0;
}

// drt-step-bench: aggregate decode tokens/s of N sessions stepped together in
// one engine step (engine/batch_step.h, issue 11) against the same N sessions
// stepped one at a time. Engine only, no server. Each session holds its own
// random prompt; then every step samples one token per session (greedy) and
// appends them. Prints one table row per N with the
// median over --repeats runs; the last line per N ("step_bench_result ...")
// is key=value for scripts.
//
// With --mixed_prefill_tokens it measures instead the steps a server forms
// while a session generates and others ingest prompts (docs/batching.md,
// "Decode time per token under prefill load"): one generating session's next
// token together with p prompt tokens of each of --load_sessions other
// sessions, all in one RunStep, for every p of the list (0: decode-only).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/batch/latency_stats.h"
#include "bench/load_average.h"
#include "bench/missing_model_hint.h"
#include "cli/command_line.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/batch_step.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/session.h"

ABSL_FLAG(std::string, model, "models/drt-text-byte",
          "model directory (default: the bundled any-text model; relative to the working "
          "directory)");
ABSL_FLAG(std::string, sessions, "1,4,8,16,64", "comma-separated session counts N");
ABSL_FLAG(int64_t, prompt_tokens, 1000, "prompt length of every session");
ABSL_FLAG(int32_t, generate, 32, "tokens generated per session per run");
ABSL_FLAG(int32_t, repeats, 3, "runs per N; the median is reported");
ABSL_FLAG(int32_t, threads, 0,
          "CPU threads (0: the CPUs this process may use; engine/cpu/cpu_threads.h)");
ABSL_FLAG(std::string, device, "cpu",
          "backend: cpu, cuda or auto (auto: cuda when this build has the CUDA backend and GPU 0 "
          "is visible, else cpu)");
ABSL_FLAG(std::string, cuda_precision, "bf16", "CUDA backend number format: bf16 or fp32");
ABSL_FLAG(bool, batched_step_rows, false,
          "CUDA only: one op over all sessions' rows per step (CudaBackendOptions::"
          "batched_step_rows; not yet verified on a GPU, docs/cuda.md \"Batched steps\")");
ABSL_FLAG(bool, decode_graphs, false,
          "CUDA only: each session's decode steps replay a captured CUDA graph "
          "(CudaBackendOptions::decode_graphs; not with --batched_step_rows; not yet verified "
          "on a GPU, docs/cuda.md \"Decode graphs\")");
ABSL_FLAG(bool, decode_fused_gemv, false,
          "CUDA only: slices of at most 8 rows run the fused decode GEMV kernels "
          "(CudaBackendOptions::decode_fused_gemv; not yet verified on a GPU, docs/cuda.md "
          "\"Fused decode GEMVs\")");
ABSL_FLAG(std::string, cuda_chunk_store, "kv",
          "CUDA only: what the host chunk store keeps per closed chunk: kv or encoder_rows "
          "(CudaBackendOptions::chunk_store; encoder_rows not yet verified on a GPU, "
          "docs/cuda.md \"Chunk store of C\")");
ABSL_FLAG(bool, sequential, true,
          "also measure the N sessions stepped one at a time (the engine before batching)");
ABSL_FLAG(std::string, mixed_prefill_tokens, "",
          "mixed-step mode (instead of --sessions): comma-separated prompt tokens p that each "
          "load session ingests per step beside one generating session's token, e.g. "
          "0,1,2,4,8,16,32,63; every session first holds --prompt_tokens tokens, each p runs "
          "--generate steps per repeat, the p values interleaved within each repeat in an order "
          "rotated by one place per repeat (the load sessions' contexts grow through the run); the "
          "decode-only step (p = 0) is always measured");
ABSL_FLAG(int32_t, load_sessions, 1, "mixed-step mode: sessions that ingest p tokens per step");
ABSL_FLAG(bool, mixed_lower_only_forwards, true,
          "CPU only: prefill slices whose tokens following lie beyond the upper-layer reach "
          "skip the upper layers also beside a decode row, and pieces with tokens following get "
          "no logits (CpuBackendOptions::mixed_lower_only_forwards); false: a forward skips "
          "them only when every slice may (the engine before, for A/B runs)");

namespace {

using drt::bench::LoadAverageText;
using drt::bench::Median;  // the sample vectors are never empty (--steps, --repeats >= 1)
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::exit(1);
}

// CPU seconds this process has used (all its threads).
double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Timing {
  double wall_seconds = 0;
  double cpu_seconds = 0;       // sampling and steps
  double step_cpu_seconds = 0;  // inside RunStep only
};

// Time to generate `generate` tokens in each of `sessions`, batched in one
// RunStep per token or one RunStep per session and token.
Timing Generate(drt::Backend& backend, absl::Span<std::unique_ptr<drt::Session>> sessions,
                int32_t generate, bool batched) {
  drt::SamplingParams greedy;
  greedy.temperature = 0.f;
  drt::Sampler sampler(greedy);
  std::vector<int32_t> next(sessions.size());
  std::vector<drt::StepEntry> entries(sessions.size());
  const auto start = Clock::now();
  const double cpu_start = ProcessCpuSeconds();
  double step_cpu = 0;
  for (int32_t t = 0; t < generate; ++t) {
    for (size_t i = 0; i < sessions.size(); ++i) {
      auto token = sessions[i]->SampleNext(sampler);
      if (!token.ok()) Die(std::string(token.status().message()));
      next[i] = token->token;
      entries[i].session = sessions[i].get();
      entries[i].tokens = absl::MakeConstSpan(&next[i], 1);
    }
    const double step_start = ProcessCpuSeconds();
    if (batched) {
      for (const absl::Status& s : drt::RunStep(backend, entries)) {
        if (!s.ok()) Die(std::string(s.message()));
      }
    } else {
      for (const drt::StepEntry& entry : entries) {
        if (absl::Status s = drt::RunStep(backend, {entry})[0]; !s.ok()) {
          Die(std::string(s.message()));
        }
      }
    }
    step_cpu += ProcessCpuSeconds() - step_start;
  }
  return {std::chrono::duration<double>(Clock::now() - start).count(),
          ProcessCpuSeconds() - cpu_start, step_cpu};
}


// Tokens a load session still has to send after each piece, as the server
// passes them (StepEntry::tokens_following) while it streams a long Append.
// A forward that holds a decode row runs every layer for all its slices, so
// in the mixed steps this changes nothing; it is set as the server sets it.
constexpr int64_t kAppendStillToCome = int64_t{1} << 20;

// n random token ids, neither pad nor chunk.
void RandomTokens(std::mt19937_64& rng, const drt::ModelConfig& config, std::vector<int32_t>& ids) {
  for (int32_t& id : ids) {
    do {
      id = static_cast<int32_t>(rng() % config.vocab_size);
    } while (id == config.pad_id || id == config.chunk_id);
  }
}

// One mixed step's times, milliseconds, and whether a load session closed a
// chunk in it (its encoder and landmark retrieval ran).
struct MixedStepTime {
  double wall_ms = 0;
  double cpu_ms = 0;  // CPU time of the process inside RunStep (all engine threads)
  bool closed_load_chunk = false;
};

// `steps` steps, each the generating session's next greedy token plus
// `prefill` random prompt tokens of every load session, in one RunStep
// (prefill 0: decode-only steps).
std::vector<MixedStepTime> RunMixedSteps(drt::Backend& backend, drt::Session& generating,
                                         absl::Span<std::unique_ptr<drt::Session>> load,
                                         int prefill, int32_t steps, std::mt19937_64& rng) {
  const drt::ModelConfig& config = backend.config();
  drt::SamplingParams greedy;
  greedy.temperature = 0.f;
  drt::Sampler sampler(greedy);
  std::vector<std::vector<int32_t>> pieces(load.size(), std::vector<int32_t>(prefill));
  std::vector<drt::StepEntry> entries(prefill > 0 ? 1 + load.size() : 1);
  std::vector<MixedStepTime> times;
  times.reserve(steps);
  int32_t next = 0;
  for (int32_t t = 0; t < steps; ++t) {
    auto token = generating.SampleNext(sampler);
    if (!token.ok()) Die(std::string(token.status().message()));
    next = token->token;
    entries[0].session = &generating;
    entries[0].tokens = absl::MakeConstSpan(&next, 1);
    int64_t load_chunks_before = 0;
    for (size_t i = 0; prefill > 0 && i < load.size(); ++i) {
      RandomTokens(rng, config, pieces[i]);
      entries[1 + i].session = load[i].get();
      entries[1 + i].tokens = pieces[i];
      entries[1 + i].tokens_following = kAppendStillToCome;
      load_chunks_before += load[i]->num_chunks();
    }
    const auto wall_start = Clock::now();
    const double cpu_start = ProcessCpuSeconds();
    for (const absl::Status& s : drt::RunStep(backend, entries)) {
      if (!s.ok()) Die(std::string(s.message()));
    }
    MixedStepTime time;
    time.cpu_ms = 1e3 * (ProcessCpuSeconds() - cpu_start);
    time.wall_ms = 1e3 * std::chrono::duration<double>(Clock::now() - wall_start).count();
    int64_t load_chunks_after = 0;
    for (size_t i = 0; prefill > 0 && i < load.size(); ++i) {
      load_chunks_after += load[i]->num_chunks();
    }
    time.closed_load_chunk = load_chunks_after != load_chunks_before;
    times.push_back(time);
  }
  return times;
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

// The mixed-step mode (--mixed_prefill_tokens): prints one row per p.
void MeasureMixedSteps(drt::Backend& backend, const std::vector<int>& prefill_counts,
                       int load_sessions, int64_t context_tokens, int32_t steps,
                       int32_t repeats) {
  const drt::ModelConfig& config = backend.config();
  std::mt19937_64 rng(1);
  // The generating session and the load sessions each hold a random prompt
  // of context_tokens first, so that every slice reads a full window and
  // retrieves from a chunk store of some size.
  auto prefilled_session = [&]() {
    std::vector<int32_t> prompt(context_tokens);
    RandomTokens(rng, config, prompt);
    auto session = drt::Session::Create(backend);
    if (!session.ok()) Die(std::string(session.status().message()));
    if (auto appended = (*session)->Append(prompt); !appended.ok()) {
      Die(std::string(appended.status().message()));
    }
    return *std::move(session);
  };
  std::unique_ptr<drt::Session> generating = prefilled_session();
  std::vector<std::unique_ptr<drt::Session>> load;
  for (int i = 0; i < load_sessions; ++i) load.push_back(prefilled_session());

  // Per p and repeat: the median and mean step (wall, CPU), the mean CPU of
  // the steps in which a load session closed a chunk, and the median CPU
  // over the decode-only step's of the same repeat.
  struct Cell {
    std::vector<double> wall_median, wall_mean, cpu_median, cpu_mean, closing_cpu_mean,
        cpu_median_vs_decode, closing_share;
  };
  std::vector<Cell> cells(prefill_counts.size());
  const std::string load_before = LoadAverageText();
  // The p values run in a rotated order, one place further each repeat:
  // the load sessions' contexts grow by p x steps with every run, so a fixed
  // order would always measure the larger p later, at longer contexts.
  // (Their contexts still grow through the run: --prompt_tokens much larger
  // than the tokens the runs add keeps that growth small.)
  const size_t num_counts = prefill_counts.size();
  std::vector<double> repeat_cpu_median(num_counts);
  for (int32_t r = 0; r < repeats; ++r) {
    for (size_t k = 0; k < num_counts; ++k) {
      const size_t c = (k + static_cast<size_t>(r)) % num_counts;
      const std::vector<MixedStepTime> times = RunMixedSteps(
          backend, *generating, absl::MakeSpan(load), prefill_counts[c], steps, rng);
      std::vector<double> wall, cpu, closing_cpu;
      for (const MixedStepTime& t : times) {
        wall.push_back(t.wall_ms);
        cpu.push_back(t.cpu_ms);
        if (t.closed_load_chunk) closing_cpu.push_back(t.cpu_ms);
      }
      Cell& cell = cells[c];
      cell.wall_median.push_back(Median(wall));
      cell.wall_mean.push_back(Mean(wall));
      cell.cpu_median.push_back(Median(cpu));
      cell.cpu_mean.push_back(Mean(cpu));
      if (!closing_cpu.empty()) cell.closing_cpu_mean.push_back(Mean(closing_cpu));
      cell.closing_share.push_back(static_cast<double>(closing_cpu.size()) / times.size());
      repeat_cpu_median[c] = Median(cpu);
    }
    // Against the decode-only step of the same repeat (prefill_counts[0] is 0).
    for (size_t c = 0; c < num_counts; ++c) {
      cells[c].cpu_median_vs_decode.push_back(repeat_cpu_median[c] / repeat_cpu_median[0]);
    }
  }
  auto median = [](const std::vector<double>& v) { return v.empty() ? 0.0 : Median(v); };
  std::printf("model %s, backend %s, mixed steps: 1 generating session + %d load session(s) "
              "of p prompt tokens each, all holding %lld tokens first; %d steps per p, median "
              "of %d repeats, p order rotated per repeat\n",
              absl::GetFlag(FLAGS_model).c_str(), backend.name().c_str(), load_sessions,
              static_cast<long long>(context_tokens), steps, repeats);
  std::printf("mixed lower-only forwards (per-slice upper-layer skipping): %s\n",
              backend.runs_mixed_lower_only_forwards() ? "on" : "off");
  std::printf("load average before: %s, after: %s\n", load_before.c_str(), LoadAverageText().c_str());
  std::printf("step times in ms; cpu: CPU time of the process inside RunStep; closing: steps in "
              "which a load session closed a chunk (encoder + landmark)\n");
  std::printf("%4s | %9s %9s | %9s %9s | %11s | %8s %12s | %13s\n", "p", "wall med",
              "wall mean", "cpu med", "cpu mean", "cpu med / p=0", "closing", "closing cpu",
              "prefill tok/s");
  for (size_t c = 0; c < prefill_counts.size(); ++c) {
    const Cell& m = cells[c];
    const double prefill_rate = static_cast<double>(prefill_counts[c]) * load_sessions /
                                (1e-3 * median(m.wall_mean));
    std::printf("%4d | %9.3f %9.3f | %9.3f %9.3f | %13.2f | %7.0f%% %12.3f | %13.0f\n",
                prefill_counts[c], median(m.wall_median), median(m.wall_mean),
                median(m.cpu_median), median(m.cpu_mean), median(m.cpu_median_vs_decode),
                100.0 * median(m.closing_share), median(m.closing_cpu_mean), prefill_rate);
  }
  for (size_t c = 0; c < prefill_counts.size(); ++c) {
    const Cell& m = cells[c];
    std::printf("step_bench_mixed prefill=%d load_sessions=%d wall_ms_median=%.4f "
                "wall_ms_mean=%.4f cpu_ms_median=%.4f cpu_ms_mean=%.4f "
                "cpu_median_vs_decode_only=%.3f\n",
                prefill_counts[c], load_sessions, median(m.wall_median), median(m.wall_mean),
                median(m.cpu_median), median(m.cpu_mean), median(m.cpu_median_vs_decode));
  }
}

}  // namespace

int main(int argc, char** argv) {
  drt::cli::ParseCommandLine(
      {"drt-step-bench",
       "Aggregate decode tokens/s of N sessions in one engine step vs one at a time.\n"
       "Example: drt-step-bench --model models/drt-text-byte --sessions 1,4,8 "
       "--prompt_tokens 1000 --generate 32",
       {"tools/step_bench.cc"}},
      argc, argv);
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_sessions), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      Die(absl::StrCat("--sessions: bad count '", part, "' in '", absl::GetFlag(FLAGS_sessions),
                       "': give a comma-separated list of positive session counts"));
    }
    counts.push_back(n);
  }
  // Each mode ignores the other's options: refused when given, rather than
  // silently not applied (review-tools 2026-11-24 #21).
  {
    const auto given = [](const absl::CommandLineFlag& flag) {
      return flag.CurrentValue() != flag.DefaultValue();
    };
    const bool mixed_mode = !absl::GetFlag(FLAGS_mixed_prefill_tokens).empty();
    if (mixed_mode) {
      for (const absl::CommandLineFlag* flag : {&absl::GetFlagReflectionHandle(FLAGS_sessions),
                                                &absl::GetFlagReflectionHandle(FLAGS_sequential)}) {
        if (given(*flag)) {
          Die("--" + std::string(flag->Name()) +
              " does not apply with --mixed_prefill_tokens (one generating session and "
              "--load_sessions)");
        }
      }
    } else if (given(absl::GetFlagReflectionHandle(FLAGS_load_sessions))) {
      Die("--load_sessions applies only with --mixed_prefill_tokens");
    }
  }
  const int64_t prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int32_t generate = absl::GetFlag(FLAGS_generate);
  const int32_t repeats = absl::GetFlag(FLAGS_repeats);
  if (prompt_tokens < 1 || generate < 1 || repeats < 1) {
    Die("--prompt_tokens, --generate and --repeats must be positive");
  }
  if (const int32_t threads = absl::GetFlag(FLAGS_threads); threads < 0) {
    Die(absl::StrCat("--threads must be 0 (the CPUs this process may use) or a positive count, got ",
                     threads));
  }
  auto model = drt::LoadModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) {
    Die(std::string(model.status().message()) + drt::bench::MissingModelHint(absl::GetFlag(FLAGS_model)));
  }
  const drt::ModelConfig& config = (*model)->config();
  drt::BackendOptions options;
  auto device = drt::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) Die("--device: " + std::string(device.status().message()));
  options.device = *device;
  auto precision = drt::ParseCudaPrecision(absl::GetFlag(FLAGS_cuda_precision));
  if (!precision.ok()) Die("--cuda_precision: " + std::string(precision.status().message()));
  options.cuda.precision = *precision;
  auto chunk_store = drt::ParseCudaChunkStore(absl::GetFlag(FLAGS_cuda_chunk_store));
  if (!chunk_store.ok()) {
    Die("--cuda_chunk_store: " + std::string(chunk_store.status().message()));
  }
  options.cuda.chunk_store = *chunk_store;
  options.cuda.batched_step_rows = absl::GetFlag(FLAGS_batched_step_rows);
  options.cuda.decode_graphs = absl::GetFlag(FLAGS_decode_graphs);
  options.cuda.decode_fused_gemv = absl::GetFlag(FLAGS_decode_fused_gemv);
  // The CUDA-only options are refused unless the backend in force is CUDA:
  // with --device=auto on a machine without a GPU they would be ignored on
  // the CPU while the result's header still named them (review-tools
  // 2026-11-24 #7). So the device is resolved first, as MakeBackend will.
  auto choice = drt::ResolveDevice(*device, options.cuda.device_index);
  if (!choice.ok()) Die("--device: " + std::string(choice.status().message()));
  if (!choice->note.empty()) std::fprintf(stderr, "%s\n", choice->note.c_str());
  if (choice->device != drt::Device::kCuda) {
    const std::string on_cpu = *device == drt::Device::kAuto
                                   ? " (--device=auto chose the CPU on this machine)"
                                   : "";
    if (options.cuda.chunk_store != drt::CudaChunkStore::kKeysValues) {
      Die("--cuda_chunk_store=encoder_rows needs the CUDA backend" + on_cpu);
    }
    if (options.cuda.batched_step_rows) {
      Die("--batched_step_rows needs the CUDA backend (the CPU backend always batches rows)" +
          on_cpu);
    }
    if (options.cuda.decode_graphs) Die("--decode_graphs needs the CUDA backend" + on_cpu);
    if (options.cuda.decode_fused_gemv) Die("--decode_fused_gemv needs the CUDA backend" + on_cpu);
  }
  options.cpu.num_threads = absl::GetFlag(FLAGS_threads);
  options.cpu.mixed_lower_only_forwards = absl::GetFlag(FLAGS_mixed_lower_only_forwards);
  auto made = drt::MakeBackend(config, (*model)->weights(), options);
  if (!made.ok()) Die(std::string(made.status().message()));
  std::unique_ptr<drt::Backend> backend = *std::move(made);

  if (const std::string mixed = absl::GetFlag(FLAGS_mixed_prefill_tokens); !mixed.empty()) {
    // The decode-only step first: every ratio is taken against it.
    std::vector<int> prefill_counts = {0};
    for (absl::string_view part : absl::StrSplit(mixed, ',')) {
      int p = 0;
      if (!absl::SimpleAtoi(part, &p) || p < 0) {
        Die("--mixed_prefill_tokens: a list of prompt token counts >= 0, got \"" + mixed + "\"");
      }
      if (p > 0) prefill_counts.push_back(p);
    }
    const int load_sessions = absl::GetFlag(FLAGS_load_sessions);
    if (load_sessions < 1) Die("--load_sessions must be positive");
    MeasureMixedSteps(*backend, prefill_counts, load_sessions, prompt_tokens, generate, repeats);
    return 0;
  }

  // max(N) sessions, each with its own random prompt, prefilled once; a run
  // with N sessions steps the first N. (Forks of one session would pay the
  // chunk store's copy-on-write of the shared block inside the timed loop.)
  const int max_sessions = *std::max_element(counts.begin(), counts.end());
  std::mt19937_64 rng(1);
  std::vector<std::unique_ptr<drt::Session>> pool_of_sessions;
  std::vector<int32_t> prompt(prompt_tokens);
  for (int i = 0; i < max_sessions; ++i) {
    for (int32_t& id : prompt) {
      do {
        id = static_cast<int32_t>(rng() % config.vocab_size);
      } while (id == config.pad_id || id == config.chunk_id);
    }
    auto session = drt::Session::Create(*backend);
    if (!session.ok()) Die(std::string(session.status().message()));
    if (auto appended = (*session)->Append(prompt); !appended.ok()) {
      Die(std::string(appended.status().message()));
    }
    pool_of_sessions.push_back(*std::move(session));
  }

  // Runs of every N are interleaved within each repeat, and each N's ratio
  // to one session is taken within the repeat: on a shared machine the load
  // drifts between repeats more than within one.
  // Tokens per second of N sessions: wall clock, per CPU second (sampling
  // included), per CPU second inside RunStep (the engine step alone).
  struct Rate {
    double wall = 0, cpu = 0, step_cpu = 0;
  };
  auto measure = [&](int n, bool batched) {
    const Timing t =
        Generate(*backend, absl::MakeSpan(pool_of_sessions).subspan(0, n), generate, batched);
    const double tokens = static_cast<double>(n) * generate;
    return Rate{tokens / t.wall_seconds, tokens / t.cpu_seconds, tokens / t.step_cpu_seconds};
  };
  struct Column {
    std::vector<double> wall, cpu, step_cpu;
    void Add(const Rate& r) {
      wall.push_back(r.wall);
      cpu.push_back(r.cpu);
      step_cpu.push_back(r.step_cpu);
    }
  };
  // Per N: batched, one by one, and the batched rates over one session's
  // in the same repeat.
  struct Row {
    Column batched, sequential, vs_one;
  };
  std::vector<Row> rows(counts.size());
  const bool sequential = absl::GetFlag(FLAGS_sequential);
  const std::string load_before = LoadAverageText();
  // One discarded run of every N first, batched and (if asked) one by one:
  // the first timed call of the process otherwise meets a cold backend
  // (scratch buffers, thread pool), and every ratio of repeat 0 divided by it
  // (review-tools 2026-11-24 #14: 352 against 1951 tokens/s for the same
  // work at N = 1 with --repeats 1).
  for (int n : counts) {
    measure(n, true);
    if (sequential) measure(n, false);
  }
  for (int32_t r = 0; r < repeats; ++r) {
    const Rate one = measure(1, true);
    // The N order rotates from repeat to repeat, so that no N always runs
    // with the longest contexts (every run extends the first N sessions).
    for (size_t k = 0; k < counts.size(); ++k) {
      const size_t c = (k + static_cast<size_t>(r)) % counts.size();
      const Rate batched = counts[c] == 1 ? one : measure(counts[c], true);
      rows[c].batched.Add(batched);
      rows[c].vs_one.Add(
          {batched.wall / one.wall, batched.cpu / one.cpu, batched.step_cpu / one.step_cpu});
      if (sequential) rows[c].sequential.Add(measure(counts[c], false));
    }
  }
  auto median = [](const std::vector<double>& v) { return v.empty() ? 0.0 : Median(v); };
  std::printf("model %s, backend %s%s%s%s%s, prompt %lld tokens, %d generated per session, "
              "median of %d runs\n",
              absl::GetFlag(FLAGS_model).c_str(), backend->name().c_str(),
              options.cuda.batched_step_rows ? " (batched_step_rows)" : "",
              options.cuda.decode_graphs ? " (decode_graphs)" : "",
              options.cuda.decode_fused_gemv ? " (decode_fused_gemv)" : "",
              options.cuda.chunk_store == drt::CudaChunkStore::kEncoderRows
                  ? " (chunk store: encoder rows)"
                  : "",
              static_cast<long long>(prompt_tokens), generate, repeats);
  std::printf("load average before: %s, after: %s\n", load_before.c_str(), LoadAverageText().c_str());
  std::printf("tokens/s by wall clock | per CPU second of the process, sampling included | per "
              "CPU second inside RunStep\n");
  std::printf("%8s | %29s | %29s | %24s\n", "", "batched", "one by one",
              "batched / 1 session");
  std::printf("%8s | %9s %9s %9s | %9s %9s %9s | %7s %7s %8s\n", "sessions", "wall", "cpu",
              "step cpu", "wall", "cpu", "step cpu", "wall", "cpu", "step cpu");
  for (size_t c = 0; c < counts.size(); ++c) {
    const Row& m = rows[c];
    std::printf("%8d | %9.1f %9.1f %9.1f | %9.1f %9.1f %9.1f | %7.2f %7.2f %8.2f\n", counts[c],
                median(m.batched.wall), median(m.batched.cpu), median(m.batched.step_cpu),
                median(m.sequential.wall), median(m.sequential.cpu),
                median(m.sequential.step_cpu), median(m.vs_one.wall), median(m.vs_one.cpu),
                median(m.vs_one.step_cpu));
  }
  for (size_t c = 0; c < counts.size(); ++c) {
    const Row& m = rows[c];
    std::printf("step_bench_result sessions=%d batched_tokens_per_s=%.2f "
                "batched_tokens_per_cpu_s=%.2f sequential_tokens_per_s=%.2f "
                "batched_vs_one_session_cpu=%.3f\n",
                counts[c], median(m.batched.wall), median(m.batched.cpu),
                median(m.sequential.wall), median(m.vs_one.cpu));
  }
  return 0;
}

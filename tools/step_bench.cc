// drt-step-bench: aggregate decode tokens/s of N sessions stepped together in
// one engine step (engine/batch_step.h, issue 11) against the same N sessions
// stepped one at a time. Engine only, no server. Each session holds the same
// prompt (one prefill, then forks); then every step samples one token per
// session (greedy) and appends them. Prints one table row per N with the
// median over --repeats runs; the last line per N ("step_bench_result ...")
// is key=value for scripts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cli/command_line.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/batch_step.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/session.h"

ABSL_FLAG(std::string, model, "build/models/drt-random-gpt2", "model directory");
ABSL_FLAG(std::string, sessions, "1,4,8,16,64", "comma-separated session counts N");
ABSL_FLAG(int64_t, prompt_tokens, 1000, "prompt length of every session");
ABSL_FLAG(int32_t, generate, 32, "tokens generated per session per run");
ABSL_FLAG(int32_t, repeats, 3, "runs per N; the median is reported");
ABSL_FLAG(int32_t, threads, 0, "CPU threads (0: all cores)");
ABSL_FLAG(std::string, device, "cpu", "backend: cpu, cuda or auto");
ABSL_FLAG(std::string, cuda_precision, "bf16", "CUDA backend number format: bf16 or fp32");
ABSL_FLAG(bool, sequential, true,
          "also measure the N sessions stepped one at a time (the engine before batching)");

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::exit(1);
}

// Seconds to generate `generate` tokens in each of `sessions`, batched in one
// RunStep per token or one RunStep per session and token.
double Generate(drt::Backend& backend, std::vector<std::unique_ptr<drt::Session>>& sessions,
                int32_t generate, bool batched) {
  drt::SamplingParams greedy;
  greedy.temperature = 0.f;
  drt::Sampler sampler(greedy);
  std::vector<int32_t> next(sessions.size());
  std::vector<drt::StepEntry> entries(sessions.size());
  const auto start = Clock::now();
  for (int32_t t = 0; t < generate; ++t) {
    for (size_t i = 0; i < sessions.size(); ++i) {
      auto token = sessions[i]->SampleNext(sampler);
      if (!token.ok()) Die(std::string(token.status().message()));
      next[i] = token->token;
      entries[i].session = sessions[i].get();
      entries[i].tokens = absl::MakeConstSpan(&next[i], 1);
    }
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
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  drt::cli::ParseCommandLine(
      {"drt-step-bench",
       "Aggregate decode tokens/s of N sessions in one engine step vs one at a time.\n"
       "Example: drt-step-bench --model build/models/drt-random-gpt2 --sessions 1,4,8 "
       "--prompt_tokens 1000 --generate 32",
       {"tools/step_bench.cc"}},
      argc, argv);
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_sessions), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) Die("--sessions: a list of positive counts");
    counts.push_back(n);
  }
  const int64_t prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int32_t generate = absl::GetFlag(FLAGS_generate);
  const int32_t repeats = absl::GetFlag(FLAGS_repeats);
  if (prompt_tokens < 1 || generate < 1 || repeats < 1) {
    Die("--prompt_tokens, --generate and --repeats must be positive");
  }
  auto model = drt::LoadModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) Die(std::string(model.status().message()));
  const drt::ModelConfig& config = (*model)->config();
  drt::BackendOptions options;
  auto device = drt::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) Die("--device: " + std::string(device.status().message()));
  options.device = *device;
  auto precision = drt::ParseCudaPrecision(absl::GetFlag(FLAGS_cuda_precision));
  if (!precision.ok()) Die("--cuda_precision: " + std::string(precision.status().message()));
  options.cuda.precision = *precision;
  options.cpu.num_threads = absl::GetFlag(FLAGS_threads);
  auto made = drt::MakeBackend(config, (*model)->weights(), options);
  if (!made.ok()) Die(std::string(made.status().message()));
  std::unique_ptr<drt::Backend> backend = *std::move(made);

  // One prefilled session; every run forks it (forks share the closed chunks).
  std::mt19937_64 rng(1);
  std::vector<int32_t> prompt(prompt_tokens);
  for (int32_t& id : prompt) {
    do {
      id = static_cast<int32_t>(rng() % config.vocab_size);
    } while (id == config.pad_id || id == config.chunk_id);
  }
  auto base = drt::Session::Create(*backend);
  if (!base.ok()) Die(std::string(base.status().message()));
  if (auto appended = (*base)->Append(prompt); !appended.ok()) {
    Die(std::string(appended.status().message()));
  }

  std::printf("model %s, backend %s, prompt %lld tokens, %d generated per session, median of "
              "%d runs\n",
              absl::GetFlag(FLAGS_model).c_str(), backend->name().c_str(),
              static_cast<long long>(prompt_tokens), generate, repeats);
  std::printf("%8s %18s %18s %14s\n", "sessions", "batched tok/s", "one-by-one tok/s",
              "batched/1x1");
  double single_session = 0;
  for (int n : counts) {
    std::vector<double> batched_rates, sequential_rates;
    for (int32_t r = 0; r < repeats; ++r) {
      for (bool batched : {true, false}) {
        if (!batched && !absl::GetFlag(FLAGS_sequential)) continue;
        std::vector<std::unique_ptr<drt::Session>> sessions;
        for (int i = 0; i < n; ++i) {
          auto fork = (*base)->Fork();
          if (!fork.ok()) Die(std::string(fork.status().message()));
          sessions.push_back(*std::move(fork));
        }
        const double seconds = Generate(*backend, sessions, generate, batched);
        (batched ? batched_rates : sequential_rates).push_back(n * generate / seconds);
      }
    }
    const double batched = Median(batched_rates);
    const double sequential = sequential_rates.empty() ? 0 : Median(sequential_rates);
    if (n == 1) single_session = batched;
    std::printf("%8d %18.1f %18.1f %14s\n", n, batched, sequential,
                single_session > 0 ? std::to_string(batched / single_session).substr(0, 5).c_str()
                                   : "-");
    std::printf("step_bench_result sessions=%d batched_tokens_per_s=%.2f "
                "sequential_tokens_per_s=%.2f\n",
                n, batched, sequential);
    std::fflush(stdout);
  }
  return 0;
}

// drt-bench: streams a long prompt through a model on the CPU backend,
// generates tokens, and prints prefill tokens/s and ms per generated token.
// Until the gRPC server exists this is the README's main job.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/session.h"

ABSL_FLAG(std::string, model, "build/models/drt-random-gpt2", "model directory");
ABSL_FLAG(int64_t, prompt_tokens, 100000, "prompt length in tokens");
ABSL_FLAG(int32_t, generate, 64, "tokens to generate");
ABSL_FLAG(int32_t, threads, 0, "CPU threads (0: all cores)");
ABSL_FLAG(float, temperature, 0.f, "sampling temperature (0: greedy)");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");

namespace {

using Clock = std::chrono::steady_clock;

// Filler text in the style of the passkey haystacks, varied so that the
// tokenizer does not see one repeated sentence.
std::string MakeHaystackText(size_t approx_bytes, uint64_t seed) {
  static const char* const kSentences[] = {
      "The grass is green. ", "The sky is blue. ", "The sun is yellow. ",
      "Here we go. ", "There and back again. ", "A river runs through the valley. ",
      "Clouds drift over the quiet hills. ", "Numbers are counted one by one. "};
  std::mt19937_64 rng(seed);
  std::string text;
  while (text.size() < approx_bytes) text += kSentences[rng() % std::size(kSentences)];
  return text;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Streams a long prompt through a DRT model on the CPU and generates.\n"
      "Example: drt-bench --model models/x --prompt_tokens 100000 --generate 64");
  absl::ParseCommandLine(argc, argv);

  auto model = drt::LoadModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const drt::ModelConfig& config = (*model)->config();
  drt::CpuBackendOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  auto backend = drt::MakeCpuBackend(config, (*model)->weights(), options);

  const int64_t want = absl::GetFlag(FLAGS_prompt_tokens);
  const std::string question = " What is the color of the sky? The sky is";
  auto question_ids = (*model)->tokenizer->Encode(question);
  std::vector<int32_t> prompt;
  for (size_t bytes = static_cast<size_t>(want) * 5;; bytes *= 2) {
    auto ids = (*model)->tokenizer->Encode(MakeHaystackText(bytes, 1));
    if (!ids.ok() || !question_ids.ok()) {
      std::fprintf(stderr, "error: tokenizer: %s\n", std::string(ids.status().message()).c_str());
      return 1;
    }
    if (static_cast<int64_t>(ids->size() + question_ids->size()) >= want) {
      ids->resize(want - std::min<int64_t>(want, question_ids->size()));
      prompt = *std::move(ids);
      prompt.insert(prompt.end(), question_ids->begin(), question_ids->end());
      prompt.resize(want);
      break;
    }
  }

  auto session = drt::Session::Create(*backend);
  if (!session.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(session.status().message()).c_str());
    return 1;
  }
  std::printf("model: %s (d=%ld, layers %ld lower + %ld upper in %ld groups, encoder %ld, vocab %ld)\n",
              absl::GetFlag(FLAGS_model).c_str(), static_cast<long>(config.hidden_size),
              static_cast<long>(config.num_lower_layers()), static_cast<long>(config.num_upper_layers()),
              static_cast<long>(config.num_groups()), static_cast<long>(config.encoder_layers),
              static_cast<long>(config.vocab_size));
  std::printf("prefill: %ld tokens on %s backend\n", static_cast<long>(prompt.size()),
              backend->name().c_str());

  drt::AppendOptions append_options;
  int64_t last_percent = -1;
  append_options.on_progress = [&](const drt::AppendProgress& p) {
    const int64_t percent = p.tokens_done * 100 / std::max<int64_t>(1, p.tokens_total);
    if (percent / 10 != last_percent / 10) {
      std::fprintf(stderr, "  %3ld%%  %ld tokens, %ld chunks\n", static_cast<long>(percent),
                   static_cast<long>(p.tokens_done), static_cast<long>(p.chunks));
      last_percent = percent;
    }
  };
  const auto t0 = Clock::now();
  auto appended = (*session)->Append(prompt, append_options);
  const double prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!appended.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(appended.status().message()).c_str());
    return 1;
  }

  drt::GenerateOptions gen;
  gen.max_tokens = absl::GetFlag(FLAGS_generate);
  gen.sampling.temperature = absl::GetFlag(FLAGS_temperature);
  gen.sampling.seed = absl::GetFlag(FLAGS_seed);
  std::vector<double> token_ms;
  auto last = Clock::now();
  gen.on_token = [&](int32_t, float) {
    const auto now = Clock::now();
    token_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
    return true;
  };
  auto generated = (*session)->Generate(gen);
  if (!generated.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(generated.status().message()).c_str());
    return 1;
  }
  auto text = (*model)->tokenizer->Decode(generated->tokens);
  const drt::SessionMemory mem = (*session)->backend_session().memory();
  std::printf("generated %zu tokens (%s): %s\n", generated->tokens.size(),
              drt::FinishReasonName(generated->finish_reason),
              text.ok() ? text->c_str() : "<undecodable>");
  std::printf("prefill_tokens_per_s %.1f   (%ld tokens in %.2f s)\n", prompt.size() / prefill_s,
              static_cast<long>(prompt.size()), prefill_s);
  double total_ms = 0;
  for (double ms : token_ms) total_ms += ms;
  std::printf("ms_per_generated_token median %.2f  mean %.2f  (context %ld tokens)\n",
              Median(token_ms), token_ms.empty() ? 0.0 : total_ms / token_ms.size(),
              static_cast<long>((*session)->num_tokens()));
  std::printf("session memory: chunk store %.1f MiB, landmarks %.2f MiB, window %.2f MiB, "
              "open chunk %.2f MiB (%ld chunks)\n",
              mem.chunk_store_bytes / 1048576.0, mem.landmark_bytes / 1048576.0,
              mem.window_bytes / 1048576.0, mem.open_chunk_bytes / 1048576.0,
              static_cast<long>((*session)->num_chunks()));
  return 0;
}

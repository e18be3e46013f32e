// drt-bench: streams a long prompt through a model on a backend (--device),
// generates tokens, and prints prefill tokens/s, ms per generated token,
// memory and host->device traffic; the last line ("bench_result ...") is
// key=value for scripts (scripts/gpu_bench.sh).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/batch/latency_stats.h"
#include "bench/missing_model_hint.h"
#include "bench/perplexity/output_file.h"
#include "cli/command_line.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/cpu/cpu_threads.h"
#include "engine/model.h"
#include "engine/session.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "models/drt-text-byte",
          "model directory (default: the bundled any-text model; relative to the working "
          "directory)");
ABSL_FLAG(int64_t, prompt_tokens, 100000, "prompt length in tokens");
ABSL_FLAG(int32_t, generate, 64, "tokens to generate");
ABSL_FLAG(int32_t, threads, 0,
          "CPU threads (0: the CPUs this process may use; engine/cpu/cpu_threads.h)");
ABSL_FLAG(bool, lower_only_forwards, true,
          "CPU only: prefill rows that cannot change the kept state skip the upper layers "
          "(CpuBackendOptions::lower_only_forwards); false runs every row through GCA, as a "
          "server with --state_ack_tokens=0 or a conversation of short messages does");
ABSL_FLAG(int64_t, chunk_kv_reserve, 0,
          "CPU only: chunks whose GCA K/V a session keeps made beyond its selections in force "
          "(CpuBackendOptions::chunk_kv_reserve; speed and memory only, never the logits)");
ABSL_FLAG(float, temperature, 0.f, "sampling temperature (0: greedy)");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(std::string, device, "cpu",
          "cpu, cuda or auto (auto: cuda when this build has the CUDA backend and GPU "
          "--cuda_device is visible, else cpu)");
ABSL_FLAG(int32_t, cuda_device, 0, "GPU index for --device=cuda");
ABSL_FLAG(std::string, cuda_precision, "bf16", "CUDA number format: bf16 or fp32");
ABSL_FLAG(bool, disable_gca, false,
          "CUDA only: the sliding-window base LM without retrieval (no encoder, no GCA); "
          "its output is not the model's, for timing comparisons");
ABSL_FLAG(int32_t, window_decode_splits, 0,
          "CUDA only: the window attention kernel of decode steps: 0 the default kernel, 1, 2, "
          "4 or 8 the split decode kernel (not yet verified on a GPU; docs/cuda.md)");
ABSL_FLAG(bool, prefill_tensor_cores, false,
          "CUDA bf16 only: the tensor-core window attention and GCA kernels for prefill steps "
          "(CudaBackendOptions::prefill_tensor_cores; not yet verified on a GPU)");
ABSL_FLAG(bool, batched_step_rows, false,
          "CUDA only: one op over all sessions' rows per step (CudaBackendOptions::"
          "batched_step_rows; not yet verified on a GPU, docs/cuda.md)");
ABSL_FLAG(bool, decode_graphs, false,
          "CUDA only: decode steps replay a captured CUDA graph (CudaBackendOptions::"
          "decode_graphs; not yet verified on a GPU, docs/cuda.md \"Decode graphs\")");
ABSL_FLAG(bool, decode_fused_gemv, false,
          "CUDA only: slices of at most 8 rows run the fused decode GEMV kernels "
          "(CudaBackendOptions::decode_fused_gemv; not yet verified on a GPU, docs/cuda.md "
          "\"Fused decode GEMVs\")");
ABSL_FLAG(std::string, cuda_chunk_store, "kv",
          "CUDA only: what the host chunk store keeps per closed chunk: kv or encoder_rows "
          "(CudaBackendOptions::chunk_store; encoder_rows not yet verified on a GPU, "
          "docs/cuda.md \"Chunk store of C\")");
ABSL_FLAG(std::string, chunk_tier, "host",
          "CUDA only: where closed chunks' K/V live: host (pinned host store, \"with CPU "
          "offload\"), device (a device store read in place by GCA, \"without offload\") or "
          "auto (device when a store for this run's prompt and generated tokens fits) "
          "(CudaBackendOptions::chunk_tier; device and auto not yet verified on a GPU, "
          "docs/cuda.md \"Device tier\")");
ABSL_FLAG(int64_t, warmup_tokens, 4096,
          "before the timed session, a throwaway session appends the prompt's first "
          "min(N, --prompt_tokens) tokens and generates 2, untimed, so that the backend's one-time "
          "costs (CUDA lazy kernel loading, first allocations, cuBLAS workspaces, the CPU thread "
          "pool's first wake) are not counted as prefill or first token; 0: no warm-up (the timed "
          "Append is the backend's first call, as before 2026-11-24)");
ABSL_FLAG(std::string, json, "",
          "also write the bench_result fields here as JSON (numbers as numbers), with the model");
ABSL_FLAG(bool, random_prompt, false,
          "random token ids instead of tokenized filler text (fast for multi-million-token "
          "prompts)");

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

// VmHWM of /proc/self/status (pinned host memory counts: it is resident).
size_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return static_cast<size_t>(std::stoull(line.substr(6))) * 1024;
  }
  return 0;
}

// Parameters a decode step reads once each. The output head is read whole
// for the logits: tied, it is the embedding (lm_head empty), so the
// embedding counts whole; untied, lm_head counts whole and the embedding
// gather reads one row of it (hidden size values, the final norm's size).
int64_t ParameterCount(const drt::ModelWeights& w) {
  int64_t n = 0;
  const bool untied = !w.lm_head.empty();
  n += untied ? static_cast<int64_t>(w.norm.size()) : static_cast<int64_t>(w.embed_tokens.size());
  const auto layer = [&](const drt::LayerWeights& l) {
    for (const auto* v : {&l.input_layernorm, &l.post_attention_layernorm, &l.self_attn.q_proj,
                          &l.self_attn.k_proj, &l.self_attn.v_proj, &l.self_attn.o_proj,
                          &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj}) {
      n += static_cast<int64_t>(v->size());
    }
  };
  for (const auto* v : {&w.lm_head, &w.norm, &w.enc_prenorm, &w.encoder_norm,
                        &w.chunk_k_proj, &w.chunk_v_proj}) {
    n += static_cast<int64_t>(v->size());
  }
  for (const auto& l : w.lower_layers) layer(l);
  for (const auto& l : w.encoder_layers) layer(l);
  for (const auto& group : w.upper_layers) {
    for (const auto& u : group) {
      layer(u.base);
      n += static_cast<int64_t>(u.gca.pre_norm.size() + u.gca.q_proj.size() + u.gca.o_proj.size());
    }
  }
  for (const auto& v : w.lmk_norms) n += static_cast<int64_t>(v.size());
  return n;
}

// 0 when the generation ended before a second token (no decode intervals),
// as the mean beside it: scripts read these lines as numbers.
double MedianOrZero(const std::vector<double>& v) { return v.empty() ? 0.0 : drt::bench::Median(v); }

}  // namespace

int main(int argc, char** argv) {
  drt::cli::ParseCommandLine(
      {"drt-bench",
       "Streams a long prompt through a DRT model and generates.\n"
       "Example: drt-bench --model models/x --prompt_tokens 100000 --generate 64 [--device cuda]",
       {"bench/long_prompt_bench.cc"}},
      argc, argv);
  // Before anything is loaded: a negative count became a huge size_t below
  // and grew the haystack string until memory ran out (review-tools #13).
  if (absl::GetFlag(FLAGS_prompt_tokens) < 1) {
    std::fprintf(stderr, "error: --prompt_tokens must be at least 1\n");
    return 1;
  }
  if (absl::GetFlag(FLAGS_warmup_tokens) < 0) {
    std::fprintf(stderr, "error: --warmup_tokens must be 0 (no warm-up) or more\n");
    return 1;
  }
  // The first token is timed apart (it includes padding and a chunk close),
  // so decode_ms_median needs a second token for one decode interval; with
  // one token it would print 0.000 as if measured (review-toolsfix #5).
  if (absl::GetFlag(FLAGS_generate) < 2) {
    std::fprintf(stderr,
                 "error: --generate must be at least 2 (the first token is timed apart; the "
                 "decode figures need one interval after it)\n");
    return 1;
  }

  if (const int32_t threads = absl::GetFlag(FLAGS_threads); threads < 0) {
    std::fprintf(stderr,
                 "error: --threads must be 0 (the CPUs this process may use) or a positive count, "
                 "got %d\n",
                 threads);
    return 1;
  }
  // The sampler refuses it too, but only at the Generate, after the warm-up
  // and the whole prefill (review-tools 2026-11-25 #13).
  if (const float t = absl::GetFlag(FLAGS_temperature); !(t >= 0) || !std::isfinite(t)) {
    std::fprintf(stderr, "error: --temperature must be 0 (greedy) or a positive number, got %g\n", t);
    return 1;
  }

  // An unwritable --json is found now, not after the run; the check leaves
  // the file as it is.
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    if (absl::Status s = drt::ppl::CheckOutputFile("--json", json_path,
                                                   {{"--model", absl::GetFlag(FLAGS_model)}});
        !s.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }

  auto model = drt::LoadModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) {
    std::fprintf(stderr, "error: %s%s\n", std::string(model.status().message()).c_str(),
                 drt::bench::MissingModelHint(absl::GetFlag(FLAGS_model)).c_str());
    return 1;
  }
  const drt::ModelConfig& config = (*model)->config();
  auto device = drt::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    std::fprintf(stderr, "error: --device: %s\n", std::string(device.status().message()).c_str());
    return 1;
  }
  drt::BackendOptions options;
  options.device = *device;
  options.cpu.num_threads = absl::GetFlag(FLAGS_threads);
  options.cpu.chunk_kv_reserve = absl::GetFlag(FLAGS_chunk_kv_reserve);
  options.cpu.lower_only_forwards = absl::GetFlag(FLAGS_lower_only_forwards);
  options.cuda.device_index = absl::GetFlag(FLAGS_cuda_device);
  options.cuda.disable_gca = absl::GetFlag(FLAGS_disable_gca);
  options.cuda.window_decode_splits = absl::GetFlag(FLAGS_window_decode_splits);
  options.cuda.prefill_tensor_cores = absl::GetFlag(FLAGS_prefill_tensor_cores);
  options.cuda.batched_step_rows = absl::GetFlag(FLAGS_batched_step_rows);
  options.cuda.decode_graphs = absl::GetFlag(FLAGS_decode_graphs);
  options.cuda.decode_fused_gemv = absl::GetFlag(FLAGS_decode_fused_gemv);
  auto precision = drt::ParseCudaPrecision(absl::GetFlag(FLAGS_cuda_precision));
  if (!precision.ok()) {
    std::fprintf(stderr, "error: --cuda_precision: %s\n",
                 std::string(precision.status().message()).c_str());
    return 1;
  }
  options.cuda.precision = *precision;
  auto chunk_store = drt::ParseCudaChunkStore(absl::GetFlag(FLAGS_cuda_chunk_store));
  if (!chunk_store.ok()) {
    std::fprintf(stderr, "error: --cuda_chunk_store: %s\n",
                 std::string(chunk_store.status().message()).c_str());
    return 1;
  }
  options.cuda.chunk_store = *chunk_store;
  if (options.cuda.chunk_store != drt::CudaChunkStore::kKeysValues &&
      *device != drt::Device::kCuda) {
    std::fprintf(stderr, "error: --cuda_chunk_store=encoder_rows needs --device=cuda\n");
    return 1;
  }
  auto chunk_tier = drt::ParseCudaChunkTier(absl::GetFlag(FLAGS_chunk_tier));
  if (!chunk_tier.ok()) {
    std::fprintf(stderr, "error: --chunk_tier: %s\n",
                 std::string(chunk_tier.status().message()).c_str());
    return 1;
  }
  options.cuda.chunk_tier = *chunk_tier;
  // auto sizes the session's device store for everything this run holds.
  options.cuda.auto_tier_max_tokens =
      absl::GetFlag(FLAGS_prompt_tokens) + std::max<int64_t>(0, absl::GetFlag(FLAGS_generate));
  if (options.cuda.chunk_tier != drt::CudaChunkTier::kHost && *device != drt::Device::kCuda) {
    std::fprintf(stderr, "error: --chunk_tier=%s needs --device=cuda\n",
                 drt::CudaChunkTierName(options.cuda.chunk_tier));
    return 1;
  }
  if (options.cuda.disable_gca && *device != drt::Device::kCuda) {
    std::fprintf(stderr, "error: --disable_gca needs --device=cuda\n");
    return 1;
  }
  if (options.cuda.batched_step_rows && *device != drt::Device::kCuda) {
    std::fprintf(stderr, "error: --batched_step_rows needs --device=cuda\n");
    return 1;
  }
  if (options.cuda.decode_graphs && *device != drt::Device::kCuda) {
    std::fprintf(stderr, "error: --decode_graphs needs --device=cuda\n");
    return 1;
  }
  if (options.cuda.decode_fused_gemv && *device != drt::Device::kCuda) {
    std::fprintf(stderr, "error: --decode_fused_gemv needs --device=cuda\n");
    return 1;
  }
  if (options.cuda.prefill_tensor_cores && *device != drt::Device::kCuda) {
    std::fprintf(stderr, "error: --prefill_tensor_cores needs --device=cuda\n");
    return 1;
  }
  if (options.cuda.window_decode_splits != 0 && *device != drt::Device::kCuda) {
    std::fprintf(stderr, "error: --window_decode_splits needs --device=cuda\n");
    return 1;
  }
  if (auto choice = drt::ResolveDevice(*device, options.cuda.device_index);
      choice.ok() && !choice->note.empty()) {
    std::fprintf(stderr, "%s\n", choice->note.c_str());
  }
  auto made = drt::MakeBackend(config, (*model)->weights(), options);
  if (!made.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(made.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<drt::Backend> backend = *std::move(made);
  // The decode step's floor: every weight read once from device memory, in the
  // CUDA backend's storage type (2 bytes in bf16, 4 in fp32).
  const double bytes_per_weight = options.cuda.precision == drt::CudaPrecision::kFp32 ? 4.0 : 2.0;
  const double weight_bytes = bytes_per_weight * ParameterCount((*model)->weights());
  const char* precision_name = drt::CudaPrecisionName(options.cuda.precision);
  double gpu_bandwidth = 0;
  if (*device == drt::Device::kCuda) {
    auto bandwidth = drt::MeasureGpuMemoryBandwidth(options.cuda.device_index);
    if (!bandwidth.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(bandwidth.status().message()).c_str());
      return 1;
    }
    gpu_bandwidth = *bandwidth;
    std::printf("GPU copy bandwidth %.0f GB/s; %s weights %.1f MB: weight-read floor %.3f ms per "
                "token\n",
                gpu_bandwidth / 1e9, precision_name, weight_bytes / 1e6,
                1e3 * weight_bytes / gpu_bandwidth);
  }

  const int64_t want = absl::GetFlag(FLAGS_prompt_tokens);
  const std::string question = " What is the color of the sky? The sky is";
  auto question_ids = (*model)->tokenizer->Encode(question);
  std::vector<int32_t> prompt;
  if (absl::GetFlag(FLAGS_random_prompt)) {
    std::mt19937_64 rng(1);
    while (static_cast<int64_t>(prompt.size()) < want) {
      const auto id = static_cast<int32_t>(rng() % config.vocab_size);
      if (id != config.chunk_id && id != config.pad_id) prompt.push_back(id);
    }
  }
  for (size_t bytes = static_cast<size_t>(want) * 5; prompt.empty(); bytes *= 2) {
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

  // The warm-up (--warmup_tokens): the same calls as the timed run, on a
  // session thrown away before the timed one is made, so that what a
  // backend sets up lazily on its first calls is paid here. drt-step-bench
  // discards a first run for the same reason (review-tools #6 and #14).
  const int64_t warmup_tokens =
      std::min<int64_t>(absl::GetFlag(FLAGS_warmup_tokens), static_cast<int64_t>(prompt.size()));
  if (warmup_tokens > 0) {
    const auto w0 = Clock::now();
    auto warm = drt::Session::Create(*backend);
    absl::Status warmed = warm.status();
    if (warmed.ok()) {
      warmed = (*warm)->Append(absl::MakeConstSpan(prompt.data(), warmup_tokens)).status();
    }
    if (warmed.ok()) {
      drt::GenerateOptions warm_gen;
      warm_gen.max_tokens = 2;
      warmed = (*warm)->Generate(warm_gen).status();
    }
    if (!warmed.ok()) {
      std::fprintf(stderr, "error: warm-up: %s\n", std::string(warmed.message()).c_str());
      return 1;
    }
    std::printf("warm-up: %ld tokens appended and 2 generated in a throwaway session, %.2f s "
                "(not counted; --warmup_tokens=0 skips it)\n",
                static_cast<long>(warmup_tokens),
                std::chrono::duration<double>(Clock::now() - w0).count());
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
  // token_ms: the intervals between generated tokens (decode steps). The
  // first token's time is apart (first_token_ms): it includes the padding
  // prefill and chunk close of pad_to_chunk_boundary, so it is not a decode
  // step and would bias the mean (review-tools 2026-11-24 #13).
  std::vector<double> token_ms;
  double first_token_ms = 0;
  bool first_token = true;
  const drt::BackendSessionStats before_decode = (*session)->backend_session().stats();
  const int64_t prefill_positions = (*session)->backend_session().position();
  auto last = Clock::now();
  gen.on_token = [&](int32_t, float) {
    const auto now = Clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - last).count();
    if (first_token) {
      first_token_ms = ms;
      first_token = false;
    } else {
      token_ms.push_back(ms);
    }
    last = now;
    return true;
  };
  auto generated = (*session)->Generate(gen);
  if (!generated.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(generated.status().message()).c_str());
    return 1;
  }
  const drt::BackendSessionStats after_decode = (*session)->backend_session().stats();
  auto text = (*model)->tokenizer->Decode(generated->tokens);
  const drt::SessionMemory mem = (*session)->backend_session().memory();
  std::printf("generated %zu tokens (%s): %s\n", generated->tokens.size(),
              drt::FinishReasonName(generated->finish_reason),
              text.ok() ? text->c_str() : "<undecodable>");
  std::printf("prefill_tokens_per_s %.1f   (%ld tokens in %.2f s)\n", prompt.size() / prefill_s,
              static_cast<long>(prompt.size()), prefill_s);
  // Lower-only forwards (docs/engine.md): positions whose upper layers could
  // not change the state the prefill leaves.
  std::printf("upper layers skipped on %ld of %ld prefill positions\n",
              static_cast<long>(before_decode.upper_rows_skipped),
              static_cast<long>(prefill_positions));
  double total_ms = 0;
  for (double ms : token_ms) total_ms += ms;
  std::printf("first token %.2f ms; ms_per_generated_token after it: median %.2f  mean %.2f  "
              "(%zu intervals; context %ld tokens)\n",
              first_token_ms, MedianOrZero(token_ms), token_ms.empty() ? 0.0 : total_ms / token_ms.size(),
              token_ms.size(), static_cast<long>((*session)->num_tokens()));
  std::printf("session memory: chunk store %.1f MiB, landmarks %.2f MiB, window %.2f MiB, "
              "open chunk %.2f MiB (%ld chunks)\n",
              mem.chunk_store_bytes / 1048576.0, mem.landmark_bytes / 1048576.0,
              mem.window_bytes / 1048576.0, mem.open_chunk_bytes / 1048576.0,
              static_cast<long>((*session)->num_chunks()));
  std::printf("chunk K/V made from encoder rows: %.2f MiB held (reserve %ld chunks), %ld chunks "
              "made (%ld while decoding); host bytes per context token %.1f\n",
              mem.chunk_kv_cache_bytes / 1048576.0,
              static_cast<long>(options.cpu.chunk_kv_reserve),
              static_cast<long>(after_decode.kv_made_chunks),
              static_cast<long>(after_decode.kv_made_chunks - before_decode.kv_made_chunks),
              static_cast<double>(mem.total()) / std::max<int64_t>(1, (*session)->num_tokens()));
  const double generated_count = std::max<double>(1.0, generated->tokens.size());
  const double h2d_per_token =
      static_cast<double>(after_decode.h2d_bytes - before_decode.h2d_bytes) / generated_count;
  const drt::BackendSessionStats& st = after_decode;
  std::printf("device memory (session, weights excluded) %.1f MiB; host memory (session) %.1f "
              "MiB; process peak RSS %.1f MiB\n",
              mem.device_bytes / 1048576.0, mem.total() / 1048576.0, PeakRssBytes() / 1048576.0);
  std::printf("transfers: h2d %.1f MiB in %ld chunks (%.0f bytes per generated token), d2d "
              "chunks %ld, resident hits %ld, d2h %.1f MiB\n",
              st.h2d_bytes / 1048576.0, static_cast<long>(st.h2d_chunks), h2d_per_token,
              static_cast<long>(st.d2d_chunks), static_cast<long>(st.resident_hits),
              st.d2h_bytes / 1048576.0);
  if (options.cuda.decode_graphs) {
    std::printf("decode graphs: %ld captured, %ld steps replayed (%ld while decoding), %ld "
                "capture failures\n",
                static_cast<long>(st.graph_captures), static_cast<long>(st.graph_replays),
                static_cast<long>(st.graph_replays - before_decode.graph_replays),
                static_cast<long>(st.graph_capture_failures));
    // The capture and instantiation run on the host before the second
    // eligible decode token's launch (docs/cuda.md, "Decode graphs"): on a
    // short run the slowest token is usually that one.
    if (!token_ms.empty()) {
      const auto slowest = std::max_element(token_ms.begin(), token_ms.end());
      std::printf("slowest decode token %.2f ms (generated token %ld; median %.2f ms)\n",
                  *slowest, static_cast<long>(slowest - token_ms.begin()) + 1, MedianOrZero(token_ms));
    }
  }
  // The result line for scripts (scripts/gpu_bench.sh, bench_ab.py), and the
  // same fields as --json. cuda_precision only where CUDA ran (it was printed
  // for CPU runs too, where it meant nothing); threads: the CPU threads in
  // force (review-tools 2026-11-25 #10).
  const bool on_cuda = backend->name() == "cuda";
  const int cpu_threads =
      options.cpu.num_threads > 0 ? options.cpu.num_threads : drt::cpu::DefaultCpuThreads().threads;
  std::vector<std::pair<std::string, std::string>> fields = {{"device", backend->name()}};
  if (on_cuda) fields.push_back({"cuda_precision", precision_name});
  const auto add = [&](const char* key, std::string value) { fields.push_back({key, std::move(value)}); };
  add("threads", absl::StrCat(cpu_threads));
  add("disable_gca", absl::StrCat(absl::GetFlag(FLAGS_disable_gca) ? 1 : 0));
  add("window_decode_splits", absl::StrCat(options.cuda.window_decode_splits));
  add("prefill_tensor_cores", absl::StrCat(options.cuda.prefill_tensor_cores ? 1 : 0));
  add("batched_step_rows", absl::StrCat(options.cuda.batched_step_rows ? 1 : 0));
  add("decode_graphs", absl::StrCat(options.cuda.decode_graphs ? 1 : 0));
  add("decode_fused_gemv", absl::StrCat(options.cuda.decode_fused_gemv ? 1 : 0));
  add("cuda_chunk_store", drt::CudaChunkStoreName(options.cuda.chunk_store));
  add("chunk_tier", drt::CudaChunkTierName(options.cuda.chunk_tier));
  // The tier the session got (auto may give either): what was measured.
  add("chunk_tier_used", st.chunks_on_device ? "device" : "host");
  add("context_tokens", absl::StrCat(prompt.size()));
  add("warmup", absl::StrCat(warmup_tokens > 0 ? 1 : 0));
  add("warmup_tokens", absl::StrCat(warmup_tokens));
  add("prefill_tokens_per_s", absl::StrFormat("%.1f", prompt.size() / prefill_s));
  add("first_token_ms", absl::StrFormat("%.3f", first_token_ms));
  add("decode_ms_median", absl::StrFormat("%.3f", MedianOrZero(token_ms)));
  add("decode_ms_mean", absl::StrFormat("%.3f", token_ms.empty() ? 0.0 : total_ms / token_ms.size()));
  add("generated", absl::StrCat(generated->tokens.size()));
  add("session_device_bytes", absl::StrCat(mem.device_bytes));
  add("session_host_bytes", absl::StrCat(mem.total()));
  add("peak_rss_bytes", absl::StrCat(PeakRssBytes()));
  add("h2d_bytes_per_token", absl::StrFormat("%.0f", h2d_per_token));
  add("weight_bytes", absl::StrFormat("%.0f", weight_bytes));
  add("gpu_copy_bytes_per_s", absl::StrFormat("%.0f", gpu_bandwidth));
  add("weight_read_floor_ms",
      absl::StrFormat("%.4f", gpu_bandwidth > 0 ? 1e3 * weight_bytes / gpu_bandwidth : 0.0));
  std::string line = "bench_result";
  for (const auto& [key, value] : fields) absl::StrAppend(&line, " ", key, "=", value);
  std::printf("%s\n", line.c_str());
  if (!json_path.empty()) {
    // Numbers as JSON numbers (the digits printed above), the rest as strings.
    nlohmann::json out = {{"model", absl::GetFlag(FLAGS_model)}};
    for (const auto& [key, value] : fields) {
      double number = 0;
      out[key] = absl::SimpleAtod(value, &number) ? nlohmann::json::parse(value) : nlohmann::json(value);
    }
    if (absl::Status s = drt::ppl::WriteFileReplacing("--json", json_path, out.dump(2) + "\n"); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  return 0;
}

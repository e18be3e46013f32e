// drt-window-bench: times the window attention kernel of decode steps
// (kernels/window_attention.h, n <= 8 positions) alone on the GPU: the row
// kernel (decode_splits 0) against the split decode kernel (1, 2, 4, 8).
// Each launch is timed with a pair of cudaEvents; the rings rotate over
// enough copies (--ring_sets, by default twice the L2 cache) that a launch
// reads its K/V from device memory as in the engine, where each layer has its
// own ring. Prints the median, 10th and 90th percentile per kernel and one
// key=value line per kernel ("window_bench_result ...") for scripts. Also
// prints the largest difference of each split variant's output from the row
// kernel's (a sanity check; tests/cuda/window_attention_test.cc holds the
// real ones).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cli/command_line.h"
#include "kernels/window_attention.h"

// Defaults: one layer of the paper's 128M configuration decoding one token
// (tests/fixtures/reference_configs/drt-config_63.json: 12 heads of 64,
// slide_window 512) far into its context.
ABSL_FLAG(int32_t, n, 1, "positions per step (the split kernel serves 1..8)");
ABSL_FLAG(int32_t, heads, 12, "query heads");
ABSL_FLAG(int32_t, kv_heads, 12, "key/value heads");
ABSL_FLAG(int32_t, head_dim, 64, "head dimension (a multiple of 8, at most 128)");
ABSL_FLAG(int32_t, window, 512, "W: a query sees W keys back and itself");
ABSL_FLAG(int64_t, first_pos, 100000, "position of the step's first row");
ABSL_FLAG(int32_t, runs, 200, "timed launches per kernel (the median is reported)");
ABSL_FLAG(int32_t, ring_sets, 0, "copies of the rings to rotate over; 0: twice the L2 cache");
ABSL_FLAG(std::string, splits, "0,1,2,4,8", "decode_splits values to time (0: the row kernel)");
ABSL_FLAG(std::string, precision, "bf16", "storage: bf16 or fp32");
ABSL_FLAG(int32_t, layers, 12, "layers per token, for the per-token line only");

namespace {

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::exit(1);
}

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(err));
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

float ToFloat(float x) { return x; }
float ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Random values in [-1, 1) as the storage's host type (bf16 bits: the top
// half of the float, truncated; fine for timing).
template <typename Host>
std::vector<Host> RandomData(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<Host> v(count);
  for (Host& x : v) {
    const float f = dist(rng);
    if constexpr (sizeof(Host) == 2) {
      uint32_t u;
      std::memcpy(&u, &f, sizeof(u));
      x = static_cast<Host>(u >> 16);
    } else {
      x = f;
    }
  }
  return v;
}

template <typename Host>
Host* Upload(const std::vector<Host>& host) {
  void* p = nullptr;
  Check(cudaMalloc(&p, host.size() * sizeof(Host)), "cudaMalloc");
  Check(cudaMemcpy(p, host.data(), host.size() * sizeof(Host), cudaMemcpyHostToDevice), "cudaMemcpy");
  return static_cast<Host*>(p);
}

template <typename T, typename Host>
void Run(const char* precision_name) {
  const int n = absl::GetFlag(FLAGS_n), heads = absl::GetFlag(FLAGS_heads);
  const int kv_heads = absl::GetFlag(FLAGS_kv_heads), dh = absl::GetFlag(FLAGS_head_dim);
  const int window = absl::GetFlag(FLAGS_window), runs = absl::GetFlag(FLAGS_runs);
  const int64_t first_pos = absl::GetFlag(FLAGS_first_pos);
  if (n < 1 || n > 8) Die("--n must be in 1..8 (the decode kernels)");
  if (runs < 1 || window < 0 || first_pos < 0) Die("--runs >= 1, --window >= 0, --first_pos >= 0");
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0) Die("--heads must be a multiple of --kv_heads");
  if (dh < 8 || dh > 128 || dh % 8 != 0) Die("--head_dim must be a multiple of 8 in 8..128");
  std::vector<int> splits_list;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_splits), ',')) {
    int s = 0;
    if (!absl::SimpleAtoi(part, &s)) Die("--splits: a comma-separated list of 0, 1, 2, 4, 8");
    splits_list.push_back(s);
  }
  int device = 0;
  Check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  const int ring_slots = window + 1;
  const size_t kv_width = static_cast<size_t>(kv_heads) * dh;
  const size_t ring_elems = static_cast<size_t>(ring_slots) * kv_width;
  const size_t set_bytes = 2 * (ring_elems + n * kv_width) * sizeof(Host);
  int sets = absl::GetFlag(FLAGS_ring_sets);
  if (sets <= 0) sets = static_cast<int>(std::max<size_t>(1, 2 * prop.l2CacheSize / set_bytes + 1));
  // Keys of the step (all queries together) that exist, K and V.
  const int64_t keys = std::min<int64_t>(window + n, first_pos + n);
  const double kv_bytes = 2.0 * static_cast<double>(keys) * kv_width * sizeof(Host);
  std::printf("drt-window-bench on %s: n %d, heads %d, kv_heads %d, head_dim %d, window %d, first_pos %ld, "
              "%s; %d ring sets of %.2f MB (L2 %.0f MB), %d runs per kernel; %.2f MB of K/V per launch\n",
              prop.name, n, heads, kv_heads, dh, window, static_cast<long>(first_pos), precision_name, sets,
              set_bytes / 1e6, prop.l2CacheSize / 1e6, runs, kv_bytes / 1e6);

  std::mt19937 rng(7);
  const std::vector<Host> q_host = RandomData<Host>(static_cast<size_t>(n) * heads * dh, rng);
  Host* q = Upload(q_host);
  std::vector<drt::kernels::WindowAttentionParams<T>> params(sets);
  std::vector<void*> allocations = {q};
  for (auto& p : params) {
    Host* k_ring = Upload(RandomData<Host>(ring_elems, rng));
    Host* v_ring = Upload(RandomData<Host>(ring_elems, rng));
    Host* k_new = Upload(RandomData<Host>(n * kv_width, rng));
    Host* v_new = Upload(RandomData<Host>(n * kv_width, rng));
    void* out = nullptr;
    Check(cudaMalloc(&out, q_host.size() * sizeof(Host)), "cudaMalloc");
    allocations.insert(allocations.end(), {k_ring, v_ring, k_new, v_new, out});
    p.q = reinterpret_cast<const T*>(q);
    p.k_new = reinterpret_cast<const T*>(k_new);
    p.v_new = reinterpret_cast<const T*>(v_new);
    p.k_ring = reinterpret_cast<const T*>(k_ring);
    p.v_ring = reinterpret_cast<const T*>(v_ring);
    p.ring_slots = ring_slots;
    p.window = window;
    p.first_pos = first_pos;
    p.n = n;
    p.heads = heads;
    p.kv_heads = kv_heads;
    p.head_dim = dh;
    p.out = static_cast<T*>(out);
  }
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> row_out;  // the row kernel's output on set 0, if timed
  std::printf("%-8s %8s %10s %10s %10s %12s %14s %18s\n", "kernel", "splits", "median_us", "p10_us",
              "p90_us", "GB/s", "per_token_us", "max_diff_vs_row");
  for (int splits : splits_list) {
    for (auto& p : params) p.decode_splits = splits;
    const cudaError_t first = drt::kernels::LaunchWindowAttention(params[0], nullptr);
    if (first == cudaErrorNotSupported) {
      std::printf("%-8s %8d   not supported on this device (thread block clusters need 9.0+)\n", "split",
                  splits);
      continue;
    }
    Check(first, "LaunchWindowAttention");
    Check(cudaDeviceSynchronize(), "the first launch");
    std::vector<Host> out_host(q_host.size());
    Check(cudaMemcpy(out_host.data(), params[0].out, out_host.size() * sizeof(Host), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
    std::vector<float> out(out_host.size());
    for (size_t e = 0; e < out.size(); ++e) out[e] = ToFloat(out_host[e]);
    std::string diff = "-";
    if (splits == 0) {
      row_out = out;
    } else if (!row_out.empty()) {
      double worst = 0, scale = 0;
      for (size_t e = 0; e < out.size(); ++e) {
        worst = std::max(worst, static_cast<double>(std::abs(out[e] - row_out[e])));
        scale = std::max(scale, static_cast<double>(std::abs(row_out[e])));
      }
      diff = std::to_string(worst / std::max(scale, 1e-30)) + " rel";
    }
    for (int r = 0; r < 20; ++r) {
      Check(drt::kernels::LaunchWindowAttention(params[r % sets], nullptr), "LaunchWindowAttention");
    }
    std::vector<double> us(runs);
    for (int r = 0; r < runs; ++r) {
      Check(cudaEventRecord(start, nullptr), "cudaEventRecord");
      Check(drt::kernels::LaunchWindowAttention(params[r % sets], nullptr), "LaunchWindowAttention");
      Check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
      Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      us[r] = 1e3 * ms;
    }
    const double median = Percentile(us, 0.5);
    const char* kernel = splits == 0 ? "row" : "split";
    std::printf("%-8s %8d %10.2f %10.2f %10.2f %12.1f %14.1f %18s\n", kernel, splits, median,
                Percentile(us, 0.1), Percentile(us, 0.9), kv_bytes / (median * 1e3),
                median * absl::GetFlag(FLAGS_layers), diff.c_str());
    std::printf("window_bench_result kernel=%s decode_splits=%d n=%d heads=%d kv_heads=%d head_dim=%d "
                "window=%d precision=%s median_us=%.3f p10_us=%.3f p90_us=%.3f kv_bytes=%.0f\n",
                kernel, splits, n, heads, kv_heads, dh, window, precision_name, median, Percentile(us, 0.1),
                Percentile(us, 0.9), kv_bytes);
  }
  Check(cudaEventDestroy(start), "cudaEventDestroy");
  Check(cudaEventDestroy(stop), "cudaEventDestroy");
  for (void* p : allocations) Check(cudaFree(p), "cudaFree");
}

}  // namespace

int main(int argc, char** argv) {
  drt::cli::ParseCommandLine(
      {"drt-window-bench",
       "Times the window attention kernels of decode steps (row vs split) with cudaEvents.\n"
       "Example: drt-window-bench --n 1 --heads 12 --head_dim 64 --window 512 --runs 200",
       {"tools/window_bench.cc"}},
      argc, argv);
  const std::string precision = absl::GetFlag(FLAGS_precision);
  if (precision == "bf16") {
    Run<drt::kernels::bf16, uint16_t>("bf16");
  } else if (precision == "fp32") {
    Run<float, float>("fp32");
  } else {
    Die("--precision: bf16 or fp32, got " + precision);
  }
  return 0;
}

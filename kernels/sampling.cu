#include "kernels/sampling.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cub/cub.cuh>

namespace drt::kernels {
namespace {

constexpr int kArgmaxThreads = 1024;
constexpr int kSampleThreads = 1024;
constexpr int kKeyThreads = 256;
constexpr size_t kAlign = 256;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

__device__ inline bool IsBanned(int32_t id, const int32_t* banned, int num_banned) {
  for (int b = 0; b < num_banned; ++b) {
    if (banned[b] == id) return true;
  }
  return false;
}

// (value, id) order of the argmax: higher value, then lower id; id -1 is "none".
__device__ inline bool Better(float a_v, int32_t a_i, float b_v, int32_t b_i) {
  if (a_i < 0) return false;
  if (b_i < 0) return true;
  return a_v > b_v || (a_v == b_v && a_i < b_i);
}

__global__ void __launch_bounds__(kArgmaxThreads)
    ArgmaxKernel(const float* __restrict__ logits, int vocab, const int32_t* __restrict__ banned,
                 int num_banned, int32_t* __restrict__ out) {
  __shared__ float warp_v[kArgmaxThreads / 32];
  __shared__ int32_t warp_i[kArgmaxThreads / 32];
  const float* row = logits + static_cast<size_t>(blockIdx.x) * vocab;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  float best_v = 0.f;
  int32_t best_i = -1;
  for (int i = threadIdx.x; i < vocab; i += kArgmaxThreads) {
    const float x = row[i];
    if (isnan(x) || IsBanned(i, banned, num_banned)) continue;
    if (Better(x, i, best_v, best_i)) {
      best_v = x;
      best_i = i;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best_v, offset);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, best_i, offset);
    if (Better(ov, oi, best_v, best_i)) {
      best_v = ov;
      best_i = oi;
    }
  }
  if (lane == 0) {
    warp_v[warp] = best_v;
    warp_i[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) {
      if (Better(warp_v[w], warp_i[w], best_v, best_i)) {
        best_v = warp_v[w];
        best_i = warp_i[w];
      }
    }
    out[blockIdx.x] = best_i;
  }
}

// Sort keys: the float's bits mapped so that unsigned order is float order
// (-0 taken as +0). Every real value, -inf included, maps above 0; banned ids
// and NaN get key 0 and so sort after every eligible id.
__device__ inline uint32_t OrderedKey(float x) {
  const uint32_t u = __float_as_uint(x + 0.f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ inline float KeyValue(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__global__ void BuildKeysKernel(const float* __restrict__ logits, int vocab,
                                const int32_t* __restrict__ banned, int num_banned,
                                uint32_t* __restrict__ keys, int32_t* __restrict__ ids) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < vocab; i += gridDim.x * blockDim.x) {
    const float x = logits[i];
    keys[i] = isnan(x) || IsBanned(i, banned, num_banned) ? 0u : OrderedKey(x);
    ids[i] = i;
  }
}

using SampleScan = cub::BlockScan<double, kSampleThreads>;

struct ScanShared {
  typename SampleScan::TempStorage scan;
  double carry;
  double total_at_hit;
  int hit;
};

// First i in [0, count) whose inclusive prefix sum of prob(i) satisfies
// pred(prefix), or -1; the prefix at that index goes to sh.total_at_hit.
// Also returns the sum of all count terms in sh.carry when there is no hit.
template <class Prob, class Pred>
__device__ int FindFirstPrefix(int count, Prob prob, Pred pred, ScanShared& sh) {
  __syncthreads();  // every thread has read the previous call's results
  if (threadIdx.x == 0) {
    sh.carry = 0.0;
    sh.hit = INT_MAX;
  }
  __syncthreads();
  for (int start = 0; start < count; start += kSampleThreads) {
    const int i = start + static_cast<int>(threadIdx.x);
    const double v = i < count ? prob(i) : 0.0;
    double prefix = 0.0;
    double aggregate = 0.0;
    SampleScan(sh.scan).InclusiveSum(v, prefix, aggregate);
    const double carry = sh.carry;
    if (i < count && pred(carry + prefix)) atomicMin(&sh.hit, i);
    __syncthreads();
    const int hit = sh.hit;
    if (hit != INT_MAX) {
      if (i == hit) sh.total_at_hit = carry + prefix;
      __syncthreads();
      return hit;
    }
    if (threadIdx.x == 0) sh.carry = carry + aggregate;
    __syncthreads();
  }
  return -1;
}

// drt::Sampler::Sample on the sorted candidates: keep top_k, weights
// exp((l - best) / T) in double, then the smallest prefix whose mass reaches
// top_p, then the first index whose running weight exceeds uniform * mass.
__global__ void __launch_bounds__(kSampleThreads)
    SampleKernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ ids, int vocab,
                 float temperature, int top_k, float top_p, float uniform, int32_t* __restrict__ out) {
  __shared__ ScanShared sh;
  __shared__ int eligible_shared;
  if (threadIdx.x == 0) {
    // Keys are sorted descending; eligible ids have keys > 0.
    int lo = 0;
    int hi = vocab;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (keys[mid] > 0u) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    eligible_shared = lo;
  }
  __syncthreads();
  const int eligible = eligible_shared;
  if (eligible == 0) {
    if (threadIdx.x == 0) *out = -1;
    return;
  }
  const double best = KeyValue(keys[0]);
  if (!isfinite(best)) {
    if (threadIdx.x == 0) *out = ids[0];
    return;
  }
  const int keep_k = top_k > 0 ? min(top_k, eligible) : eligible;
  const double t = temperature;
  auto prob = [&](int i) { return exp((static_cast<double>(KeyValue(keys[i])) - best) / t); };

  FindFirstPrefix(keep_k, prob, [](double) { return false; }, sh);
  const double sum = sh.carry;
  int keep = keep_k;
  double total = sum;
  if (top_p < 1.f) {
    const double threshold = static_cast<double>(top_p);
    const int hit = FindFirstPrefix(keep_k, prob, [&](double prefix) { return prefix / sum >= threshold; }, sh);
    if (hit >= 0) {
      keep = hit + 1;
      total = sh.total_at_hit;
    }
  }
  const double u = static_cast<double>(uniform) * total;
  const int hit = FindFirstPrefix(keep, prob, [&](double prefix) { return u < prefix; }, sh);
  if (threadIdx.x == 0) *out = ids[hit >= 0 ? hit : keep - 1];
}

struct SampleWorkspace {
  uint32_t* keys_in;
  uint32_t* keys_out;
  int32_t* ids_in;
  int32_t* ids_out;
  void* sort_temp;
  size_t sort_temp_bytes;
};

// Bytes CUB needs to sort `vocab` pairs, or 0 on error.
size_t SortTempBytes(int vocab) {
  size_t bytes = 0;
  const cudaError_t err = cub::DeviceRadixSort::SortPairsDescending(
      nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), vocab);
  return err == cudaSuccess ? bytes : 0;
}

SampleWorkspace CarveSampleWorkspace(void* base, int vocab, size_t sort_temp_bytes) {
  const size_t array = AlignUp(sizeof(uint32_t) * static_cast<size_t>(vocab));
  char* p = static_cast<char*>(base);
  SampleWorkspace w;
  w.keys_in = reinterpret_cast<uint32_t*>(p);
  w.keys_out = reinterpret_cast<uint32_t*>(p + array);
  w.ids_in = reinterpret_cast<int32_t*>(p + 2 * array);
  w.ids_out = reinterpret_cast<int32_t*>(p + 3 * array);
  w.sort_temp = p + 4 * array;
  w.sort_temp_bytes = sort_temp_bytes;
  return w;
}

}  // namespace

cudaError_t LaunchArgmax(const float* logits, int rows, int vocab, const int32_t* banned,
                         int num_banned, int32_t* out, cudaStream_t stream) {
  if (rows < 0 || vocab <= 0 || num_banned < 0 || (num_banned > 0 && banned == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (logits == nullptr || out == nullptr) return cudaErrorInvalidValue;
  ArgmaxKernel<<<rows, kArgmaxThreads, 0, stream>>>(logits, vocab, banned, num_banned, out);
  return cudaGetLastError();
}

size_t SampleWorkspaceBytes(int vocab) {
  if (vocab <= 0) return 0;
  const size_t sort = SortTempBytes(vocab);
  if (sort == 0) return 0;
  return 4 * AlignUp(sizeof(uint32_t) * static_cast<size_t>(vocab)) + AlignUp(sort);
}

cudaError_t LaunchSample(const float* logits, int vocab, float temperature, int top_k, float top_p,
                         float uniform, const int32_t* banned, int num_banned, void* workspace,
                         size_t workspace_bytes, int32_t* out, cudaStream_t stream) {
  if (vocab <= 0 || !(temperature >= 0.f) || !std::isfinite(temperature) || top_k < 0 ||
      !(top_p > 0.f && top_p <= 1.f) || !(uniform >= 0.f && uniform < 1.f) || num_banned < 0 ||
      (num_banned > 0 && banned == nullptr) || logits == nullptr || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (temperature == 0.f) return LaunchArgmax(logits, 1, vocab, banned, num_banned, out, stream);
  const size_t sort_bytes = SortTempBytes(vocab);
  if (sort_bytes == 0) return cudaErrorInvalidValue;
  if (workspace == nullptr || workspace_bytes < SampleWorkspaceBytes(vocab) ||
      (reinterpret_cast<uintptr_t>(workspace) % kAlign) != 0) {
    return cudaErrorInvalidValue;
  }
  const SampleWorkspace ws = CarveSampleWorkspace(workspace, vocab, sort_bytes);
  const int key_blocks = std::min((vocab + kKeyThreads - 1) / kKeyThreads, 4096);
  BuildKeysKernel<<<key_blocks, kKeyThreads, 0, stream>>>(logits, vocab, banned, num_banned,
                                                          ws.keys_in, ws.ids_in);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  size_t temp_bytes = ws.sort_temp_bytes;
  // Radix sort is stable: equal logits keep ascending id order (lower id first).
  if (cudaError_t err = cub::DeviceRadixSort::SortPairsDescending(
          ws.sort_temp, temp_bytes, ws.keys_in, ws.keys_out, ws.ids_in, ws.ids_out, vocab, 0,
          static_cast<int>(sizeof(uint32_t) * 8), stream);
      err != cudaSuccess) {
    return err;
  }
  SampleKernel<<<1, kSampleThreads, 0, stream>>>(ws.keys_out, ws.ids_out, vocab, temperature, top_k,
                                                 top_p, uniform, out);
  return cudaGetLastError();
}

}  // namespace drt::kernels

// Causal sliding-window ALiBi attention over the ring KV cache
// (drt-model.md, Forward pass 3).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace drt::kernels {

using bf16 = __nv_bfloat16;

// T: the storage type of every tensor, bf16 or float (fp32 softmax and
// accumulation either way).
template <typename T>
struct WindowAttentionParams {
  const T* q = nullptr;      // [n][heads][head_dim]: positions first_pos .. first_pos+n-1
  const T* k_new = nullptr;  // [n][kv_heads][head_dim]: keys of the same positions
  const T* v_new = nullptr;
  const T* k_ring = nullptr;  // [ring_slots][kv_heads][head_dim]: position p < first_pos is in slot p % ring_slots
  const T* v_ring = nullptr;
  int ring_slots = 0;  // window + 1
  int window = 0;      // W: query i sees keys j in [max(0, i-W), i]
  int64_t first_pos = 0;
  int n = 0, heads = 0, kv_heads = 0, head_dim = 0;  // GQA: head h reads kv head h / (heads / kv_heads)
  T* out = nullptr;                                  // [n][heads][head_dim]
  // The kernel for steps of n <= 8 rows (decode). 0: one block per (query,
  // head) (the default, run on GPUs). 1, 2, 4 or 8: the split decode kernel
  // (kernels/window_split_decode.cu), the window of each (query, head) cut
  // over that many blocks; above 1 they form a thread block cluster, which
  // needs compute capability 9.0 (cudaErrorNotSupported below it). NOT YET
  // RUN ON A GPU (docs/cuda.md, "Split decode"): keep 0 until its tests pass
  // on one. Steps of more rows ignore it.
  int decode_splits = 0;
  // Steps of more than 8 rows (prefill) in bf16 with head_dim a multiple of
  // 16: true runs the tensor-core kernel (kernels/window_mma_prefill.cu,
  // bf16 mma.sync, P rounded to bf16 for the P V product; compute capability
  // 8.0+, else cudaErrorNotSupported). NOT YET RUN ON A GPU (docs/cuda.md,
  // "Tensor-core prefill"): keep false until its tests pass on one.
  // fp32 storage, other head sizes and steps of <= 8 rows ignore it.
  bool prefill_tensor_cores = false;
  // nullptr: first_pos is the position (as always). Otherwise the position
  // of q's first row is read from this device scalar when the kernel runs,
  // and first_pos is only validated on the host: a captured CUDA graph
  // replays the launch at later positions (CudaBackendOptions::
  // decode_graphs). Only the kernels of n <= 8 rows (decode) read it;
  // more rows with it are cudaErrorInvalidValue. The device value must be
  // >= 0, and the ring must hold the window's keys before it (positions
  // < value in their slots), as for first_pos; the ring pointers are then
  // required whatever first_pos says.
  const int64_t* device_first_pos = nullptr;
};

// score = q.k/sqrt(head_dim) - m_h*(i-j), m_h = 1/(2^(8/heads))^(h+1). Keys
// j >= first_pos come from k_new/v_new, j < first_pos from the ring. head_dim
// must be a multiple of 8 and <= 128, heads a multiple of kv_heads,
// ring_slots >= window + 1, decode_splits 0, 1, 2, 4 or 8, and every tensor
// pointer 16-byte aligned (cudaMalloc gives 256); otherwise
// cudaErrorInvalidValue. The ring is read only when
// first_pos > 0 (or device_first_pos is given) and window > 0.
template <typename T>
cudaError_t LaunchWindowAttention(const WindowAttentionParams<T>& p, cudaStream_t stream);
// Writes the last min(n, ring_slots) of the n new positions into their ring
// slots. Call after LaunchWindowAttention of the same step (same stream).
// Pointers 16-byte aligned, head_dim as above. device_first_pos as in
// WindowAttentionParams: when given, the position of the first new row is
// read from it on the device (first_pos is validated only).
template <typename T>
cudaError_t LaunchWindowRingWrite(const T* k_new, const T* v_new, int n, int64_t first_pos,
                                  int ring_slots, int kv_heads, int head_dim, T* k_ring,
                                  T* v_ring, cudaStream_t stream,
                                  const int64_t* device_first_pos = nullptr);

// The split decode kernel's cudaFuncAttributes ptxVersion and binaryVersion
// on the current device (loads its module): kernels/cluster_code.h says
// whether they allow decode_splits > 1. MakeCudaBackend checks them at
// creation, so that a build without sm_90 is refused before any step.
cudaError_t WindowSplitDecodeCodeVersions(int* ptx_version, int* binary_version);

}  // namespace drt::kernels

// FlashGCA: grouped cross attention over retrieved chunks
// (drt-model.md, Forward pass 7).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace drt::kernels {

using bf16 = __nv_bfloat16;

// T: the storage type of q, chunk_k, chunk_v and out, bf16 or float (fp32
// softmax and accumulation either way).
template <typename T>
struct GcaParams {
  const T* q = nullptr;        // [n][heads][head_dim]: GCA queries of positions first_pos .. first_pos+n-1
  // [num_slots][64][heads][head_dim] (row 63 is zero): the group's slot
  // buffer (host chunk tier), or the session's device chunk store, where
  // slot = chunk id (device tier, engine/cuda/device_chunk_store.h).
  const T* chunk_k = nullptr;
  const T* chunk_v = nullptr;
  const int32_t* slots = nullptr;  // [num_query_chunks][topk]: buffer slot of the i-th retrieved chunk; -1 = none
  const float* weights = nullptr;  // [num_query_chunks][topk]: softmax weight of that chunk
  int topk = 0;
  int64_t first_pos = 0;
  int64_t first_query_chunk = 0;  // the query chunk of position p is p/64 - first_query_chunk
  int n = 0, heads = 0, head_dim = 0;
  T* out = nullptr;  // [n][heads][head_dim]
  // Steps of more than 4 rows (prefill) in bf16 with head_dim a multiple of
  // 16: true runs the tensor-core kernel (kernels/gca_mma_prefill.cu, bf16
  // mma.sync, the weighted probabilities rounded to bf16 for the P V
  // product; compute capability 8.0+, else cudaErrorNotSupported). NOT YET
  // RUN ON A GPU (docs/cuda.md, "Tensor-core prefill"): keep false until
  // its tests pass on one. fp32 storage, other head sizes and steps of <= 4
  // rows ignore it.
  bool prefill_tensor_cores = false;
  // nullptr: first_pos and first_query_chunk say where q's rows are (as
  // always). Otherwise the position of q's first row is read from this
  // device scalar when the kernel runs, and the slot table's first row is
  // that position's query chunk (first_query_chunk = *device_first_pos / 64,
  // what the CUDA session passes): a captured CUDA graph replays the launch
  // at later positions (CudaBackendOptions::decode_graphs). first_pos and
  // first_query_chunk are then validated on the host and must satisfy
  // first_query_chunk == first_pos / 64. Only the kernel of n <= 4 rows
  // (decode) reads it; more rows with it are cudaErrorInvalidValue. The
  // device value must be >= 0 and the table must have a row for every query
  // chunk its n positions touch.
  const int64_t* device_first_pos = nullptr;
};

// out = sum_i w_i softmax_j(q.K_i[j]/sqrt(dh)) V_i[j] over the 64 stored rows
// of each retrieved chunk i; zero when a query chunk has no slot. One pass: the
// per-chunk softmax and the weighted fuse stay on chip. head_dim: multiple of
// 8, <= 128; topk >= 0; 0 <= first_query_chunk <= first_pos/64; q, out,
// chunk_k, chunk_v 16-byte aligned; else cudaErrorInvalidValue. slots and
// weights must have a row for every query chunk the n positions touch.
template <typename T>
cudaError_t LaunchGcaAttention(const GcaParams<T>& p, cudaStream_t stream);

}  // namespace drt::kernels

// Chunk encoder self-attention (drt-model.md, Forward pass 4).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace drt::kernels {

using bf16 = __nv_bfloat16;

// q: [num_chunks*64][heads][head_dim], k, v: [num_chunks*64][kv_heads][head_dim],
// before RoPE. Applies RoPE to q and k (position = row within the chunk 0..63,
// base rope_theta: the model's is kEncoderRopeTheta, engine/model_rules.h; the
// convention of engine/cpu ApplyRope), then full bidirectional
// softmax attention inside each chunk with scale 1/sqrt(head_dim). out is
// [num_chunks*64][heads][head_dim]. head_dim: multiple of 8, <= 128; heads a
// multiple of kv_heads; rope_theta > 0; pointers 16-byte aligned; else
// cudaErrorInvalidValue.
// T: the storage type, bf16 or float (fp32 softmax and accumulation either way).
template <typename T>
cudaError_t LaunchEncoderAttention(const T* q, const T* k, const T* v, int num_chunks,
                                   int heads, int kv_heads, int head_dim, double rope_theta,
                                   T* out, cudaStream_t stream);

}  // namespace drt::kernels

// Embedding gather, RMSNorm, SwiGLU, dtype conversion and chunk-row zeroing.
// Every launcher returns cudaGetLastError() after the launch, or
// cudaErrorInvalidValue for bad arguments (nothing is launched then).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace drt::kernels {

using bf16 = __nv_bfloat16;

// out[i][:] = table[ids[i]][:] as fp32. out is [n][d]. Ids are not range-checked
// on the device: the caller validates them.
cudaError_t LaunchEmbeddingGather(const int32_t* ids, int n, const bf16* table, int d, float* out,
                                  cudaStream_t stream);
// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, per row of [rows][d].
cudaError_t LaunchRmsNorm(const float* x, const bf16* w, int rows, int d, float eps, bf16* out,
                          cudaStream_t stream);
cudaError_t LaunchRmsNormF32(const float* x, const bf16* w, int rows, int d, float eps, float* out,
                             cudaStream_t stream);
cudaError_t LaunchRmsNormBf16In(const bf16* x, const bf16* w, int rows, int d, float eps, bf16* out,
                                cudaStream_t stream);
// gate_up is [rows][2f]: gate = cols 0..f-1, up = cols f..2f-1. out[rows][f] = silu(gate) * up.
cudaError_t LaunchSwiGlu(const bf16* gate_up, int rows, int f, bf16* out, cudaStream_t stream);
cudaError_t LaunchConvertF32ToBf16(const float* x, size_t n, bf16* out, cudaStream_t stream);
cudaError_t LaunchConvertBf16ToF32(const bf16* x, size_t n, float* out, cudaStream_t stream);
// kv is [num_chunks][64][width]; zeroes row `row` (0..63) of every chunk.
cudaError_t LaunchZeroChunkRow(bf16* kv, int num_chunks, int row, int width, cudaStream_t stream);

}  // namespace drt::kernels

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

// Launchers templated on T are the CUDA backend's storage type (float or bf16;
// engine/cuda/cuda_options.h CudaPrecision) and instantiated for both; the
// arithmetic is fp32 either way.

// out[i][:] = table[ids[i]][:] as fp32. out is [n][d]. Ids are not range-checked
// on the device: the caller validates them.
template <typename T>
cudaError_t LaunchEmbeddingGather(const int32_t* ids, int n, const T* table, int d, float* out,
                                  cudaStream_t stream);
// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, per row of [rows][d]; fp32 sums.
template <typename T>
cudaError_t LaunchRmsNorm(const float* x, const T* w, int rows, int d, float eps, T* out,
                          cudaStream_t stream);
template <typename T>
cudaError_t LaunchRmsNormF32(const float* x, const T* w, int rows, int d, float eps, float* out,
                             cudaStream_t stream);
cudaError_t LaunchRmsNormBf16In(const bf16* x, const bf16* w, int rows, int d, float eps, bf16* out,
                                cudaStream_t stream);
// gate_up is [rows][2f]: gate = cols 0..f-1, up = cols f..2f-1. out[rows][f] = silu(gate) * up.
template <typename T>
cudaError_t LaunchSwiGlu(const T* gate_up, int rows, int f, T* out, cudaStream_t stream);
cudaError_t LaunchConvertF32ToBf16(const float* x, size_t n, bf16* out, cudaStream_t stream);
cudaError_t LaunchConvertBf16ToF32(const bf16* x, size_t n, float* out, cudaStream_t stream);
// kv is [num_chunks][64][width]; zeroes row `row` (0..63) of every chunk.
template <typename T>
cudaError_t LaunchZeroChunkRow(T* kv, int num_chunks, int row, int width, cudaStream_t stream);
// dst[(*device_pos % chunk_rows) + i][:] = src[i][:] for the n rows of [n][d]
// fp32 src, into [chunk_rows][d] dst: the rows of a step entering the open
// chunk at a position read on the device (a captured CUDA graph replays it at
// later positions; CudaBackendOptions::decode_graphs). Rows that would fall
// past chunk_rows are not written (the caller keeps n within the chunk;
// the device value must be >= 0). A plain copy: bit-exact.
cudaError_t LaunchCopyRowsAtChunkOffset(const float* src, int n, int d,
                                        const int64_t* device_pos, int chunk_rows, float* dst,
                                        cudaStream_t stream);

}  // namespace drt::kernels

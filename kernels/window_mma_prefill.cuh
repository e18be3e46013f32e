// Internal to kernels/: the tensor-core prefill kernel of the window
// attention (kernels/window_mma_prefill.cu), which LaunchWindowAttention runs
// for bf16 steps of more than kRowKernelMaxN rows when
// params.prefill_tensor_cores is set. Not part of the API.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/mma_bf16.cuh"
#include "kernels/window_attention.h"

namespace drt::kernels::detail {

// p has been validated by LaunchWindowAttention, p.n > kRowKernelMaxN and
// MmaPrefillHeadDim(p.head_dim). Needs compute capability 8.0 (bf16
// mma.sync); below it returns cudaErrorNotSupported and launches nothing.
cudaError_t LaunchWindowMmaPrefill(const WindowAttentionParams<bf16>& p, cudaStream_t stream);

}  // namespace drt::kernels::detail

// Internal to kernels/: the tensor-core prefill kernel of GCA
// (kernels/gca_mma_prefill.cu), which LaunchGcaAttention runs for bf16 steps
// of more than 4 rows when params.prefill_tensor_cores is set. Not part of
// the API.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/gca_attention.h"
#include "kernels/mma_bf16.cuh"

namespace drt::kernels::detail {

// p has been validated by LaunchGcaAttention, p.n > 4 and
// MmaPrefillHeadDim(p.head_dim). Below compute capability 8.0 returns
// cudaErrorNotSupported and launches nothing.
cudaError_t LaunchGcaMmaPrefill(const GcaParams<bf16>& p, cudaStream_t stream);

}  // namespace drt::kernels::detail

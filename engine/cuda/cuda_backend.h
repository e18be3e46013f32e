// The CUDA backend: weights and session state on one GPU in bf16 or fp32
// (CudaBackendOptions::precision), closed chunks' K/V in pinned host memory
// (or, with CudaBackendOptions::chunk_tier, in a device store; docs/cuda.md). Includes no CUDA header; built
// only when CUDA is (DRT_WITH_CUDA). Use MakeBackend (engine/backend_factory.h)
// rather than this directly.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_options.h"

namespace drt {

// INVALID_ARGUMENT for a config the kernels do not support (chunks other than
// 64 positions, head_dim not a multiple of 8 or above 128, top-k outside
// 1..32); errors of the CUDA runtime otherwise. The model must outlive the
// backend.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const ModelConfig& config,
                                                         const ModelWeights& weights,
                                                         const CudaBackendOptions& options);

}  // namespace drt

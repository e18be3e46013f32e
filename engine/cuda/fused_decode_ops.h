// The fused decode GEMV launches of a decoder layer
// (CudaBackendOptions::decode_fused_gemv; kernels/decode_gemv.h), shared by
// the slice-by-slice step (cuda_layers.cc) and the batched step
// (cuda_batched_step.cc). Each replaces a sequence of the unfused path and
// says which; the caller decides (kernels::UseDecodeGemv: at most 8 rows).
// NOT YET RUN ON A GPU.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "engine/cuda/device_weights.h"
#include "engine/cuda/session_buffers.h"

namespace drt::cuda {

// Sizes of the projections: hidden size d, K/V width, MLP width F.
struct FusedDecodeSizes {
  int d = 0;
  int kv_width = 0;
  int f = 0;
};
inline FusedDecodeSizes FusedDecodeSizesOf(const SessionSizes& s) {
  return FusedDecodeSizes{static_cast<int>(s.d), static_cast<int>(s.kv_width),
                          static_cast<int>(s.f)};
}

// q, k, v = RMSNorm1(h) . [q; k; v]^T over the layer's stacked weight:
// replaces LaunchRmsNorm + the Q, K and V GEMMs.
template <typename T>
absl::Status FusedNormQkv(const float* h, const DeviceLayer<T>& layer, int rows,
                          const FusedDecodeSizes& sizes, float eps, T* q, T* k, T* v,
                          cudaStream_t stream);

// out = RMSNorm(h; norm_w) . w^T for a [d][d] w (the GCA query): replaces
// LaunchRmsNorm + one GEMM.
template <typename T>
absl::Status FusedNormProject(const float* h, const T* norm_w, const T* w, int rows,
                              const FusedDecodeSizes& sizes, float eps, T* out,
                              cudaStream_t stream);

// act = SwiGLU of RMSNorm2(h) . gate_up^T: replaces LaunchRmsNorm + the
// gate_up GEMM + LaunchSwiGlu.
template <typename T>
absl::Status FusedNormSwiGlu(const float* h, const T* norm_w, const T* gate_up, int rows,
                             const FusedDecodeSizes& sizes, float eps, T* act,
                             cudaStream_t stream);

// y = base + x . w^T for a [n][k] w, base = residual when given, else y
// (y +=): replaces an accumulating GEMM, and with a residual the memcpy of
// the residual before it.
template <typename T>
absl::Status FusedProjectAdd(const T* x, const T* w, const float* residual, int rows, int n,
                             int k, float* y, cudaStream_t stream);

}  // namespace drt::cuda

// Fused GEMVs of the decode step (at most 8 rows): the RMSNorm in the
// prologue of the projection that reads it, the SwiGLU in the epilogue of
// the gate/up projection, the residual add in the epilogue of the O and
// down projections (CudaBackendOptions::decode_fused_gemv; docs/cuda.md,
// "Fused decode GEMVs"). kernels/decode_gemv_plan.h says which shapes they
// take and how the work is split.
//
// The arithmetic is that of the unfused path (LaunchRmsNorm, then
// CublasGemm::Matmul, then LaunchSwiGlu): the normed input is computed in
// fp32 from the fp32 residual stream and rounded to T (bit for bit
// LaunchRmsNorm's, same reduction order), dot products accumulate in fp32,
// gate and up are rounded to T before the SwiGLU, the SwiGLU output is
// rounded to T. Only the order of each dot product's sum differs from
// cuBLAS's.
//
// Overlap: no input may overlap an output (the kernels read their inputs
// through __restrict__ pointers and other blocks write the outputs while a
// block still reads): h, norm_w and w none of a norm kernel's outputs, x
// and w not y. The one exception is LaunchGemvAccumulate's residual, which
// may be y itself (each element is read once, by the lane that then writes
// it).
//
// Every launcher returns cudaErrorInvalidValue without launching when
// PlanDecodeGemv refuses the shape or a pointer is null, else
// cudaGetLastError() after the launch. No launch allocates or synchronises:
// each can be captured in a CUDA graph (decode graphs).
//
// NOT YET RUN ON A GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace drt::kernels {

using bf16 = __nv_bfloat16;

// The most output segments of one norm GEMV (Q, K and V).
inline constexpr int kNormGemvMaxSegments = 3;

// y = RMSNorm(h; norm_w, eps) . w^T for m rows. The n = sum of `cols`
// output columns go to up to three row-major outputs: column j of the first
// cols[0] to out[0] ([m][cols[0]]), the next cols[1] to out[1], and so on
// (one launch over a stacked [q; k; v] weight writes q, k_new and v_new
// where the unfused path's three GEMMs do). Unused segments have cols 0.
template <typename T>
struct NormGemvParams {
  const float* h = nullptr;  // [m][k] fp32 residual stream
  const T* norm_w = nullptr;  // [k]
  float eps = 0.f;
  const T* w = nullptr;  // [n][k]
  int m = 0;
  int k = 0;
  T* out[kNormGemvMaxSegments] = {nullptr, nullptr, nullptr};
  int cols[kNormGemvMaxSegments] = {0, 0, 0};
};
template <typename T>
cudaError_t LaunchNormGemv(const NormGemvParams<T>& p, cudaStream_t stream);

// act[m][f] = silu(g) * u, g = T(x . w[j]), u = T(x . w[f + j]),
// x = RMSNorm(h; norm_w, eps) as T: the unfused path's norm, gate_up GEMM
// and LaunchSwiGlu in one launch over the [2F][k] gate_up weight (gate rows
// first, engine/cuda/device_weights.h).
template <typename T>
cudaError_t LaunchNormGemvSwiGlu(const float* h, const T* norm_w, float eps, const T* gate_up,
                                 int m, int f, int k, T* act, cudaStream_t stream);

// y[m][n] = base[m][n] + x[m][k] . w[n][k]^T in fp32, base = residual when
// given, else y itself (y += x . w^T: the O and down projections' residual
// adds). residual may not overlap y unless it is y; x (read through a
// __restrict__ pointer) and w must not overlap y at all.
template <typename T>
cudaError_t LaunchGemvAccumulate(const T* x, const T* w, const float* residual, int m, int n,
                                 int k, float* y, cudaStream_t stream);

}  // namespace drt::kernels

#include "engine/cuda/fused_decode_ops.h"

#include "engine/cuda/storage_type.h"
#include "kernels/cuda_check.h"
#include "kernels/decode_gemv.h"

namespace drt::cuda {

template <typename T>
absl::Status FusedNormQkv(const float* h, const DeviceLayer<T>& layer, int rows,
                          const FusedDecodeSizes& sizes, float eps, T* q, T* k, T* v,
                          cudaStream_t stream) {
  kernels::NormGemvParams<T> p;
  p.h = h;
  p.norm_w = layer.input_norm;
  p.eps = eps;
  p.w = layer.qkv;  // q rows, then k rows, then v rows (device_weights.h)
  p.m = rows;
  p.k = sizes.d;
  p.out[0] = q;
  p.cols[0] = sizes.d;
  p.out[1] = k;
  p.cols[1] = sizes.kv_width;
  p.out[2] = v;
  p.cols[2] = sizes.kv_width;
  DRT_CUDA_RETURN_IF_ERROR(kernels::LaunchNormGemv(p, stream),
                           "LaunchNormGemv (input_layernorm, q/k/v)");
  return absl::OkStatus();
}

template <typename T>
absl::Status FusedNormProject(const float* h, const T* norm_w, const T* w, int rows,
                              const FusedDecodeSizes& sizes, float eps, T* out,
                              cudaStream_t stream) {
  kernels::NormGemvParams<T> p;
  p.h = h;
  p.norm_w = norm_w;
  p.eps = eps;
  p.w = w;
  p.m = rows;
  p.k = sizes.d;
  p.out[0] = out;
  p.cols[0] = sizes.d;
  DRT_CUDA_RETURN_IF_ERROR(kernels::LaunchNormGemv(p, stream), "LaunchNormGemv (gca query)");
  return absl::OkStatus();
}

template <typename T>
absl::Status FusedNormSwiGlu(const float* h, const T* norm_w, const T* gate_up, int rows,
                             const FusedDecodeSizes& sizes, float eps, T* act,
                             cudaStream_t stream) {
  DRT_CUDA_RETURN_IF_ERROR(kernels::LaunchNormGemvSwiGlu(h, norm_w, eps, gate_up, rows, sizes.f,
                                                         sizes.d, act, stream),
                           "LaunchNormGemvSwiGlu (post_attention_layernorm, gate/up)");
  return absl::OkStatus();
}

template <typename T>
absl::Status FusedProjectAdd(const T* x, const T* w, const float* residual, int rows, int n,
                             int k, float* y, cudaStream_t stream) {
  DRT_CUDA_RETURN_IF_ERROR(kernels::LaunchGemvAccumulate(x, w, residual, rows, n, k, y, stream),
                           "LaunchGemvAccumulate");
  return absl::OkStatus();
}

#define DRT_INSTANTIATE_FUSED_DECODE_OPS(T)                                                  \
  template absl::Status FusedNormQkv<T>(const float*, const DeviceLayer<T>&, int,            \
                                        const FusedDecodeSizes&, float, T*, T*, T*,          \
                                        cudaStream_t);                                       \
  template absl::Status FusedNormProject<T>(const float*, const T*, const T*, int,           \
                                            const FusedDecodeSizes&, float, T*, cudaStream_t); \
  template absl::Status FusedNormSwiGlu<T>(const float*, const T*, const T*, int,            \
                                           const FusedDecodeSizes&, float, T*, cudaStream_t); \
  template absl::Status FusedProjectAdd<T>(const T*, const T*, const float*, int, int, int,  \
                                           float*, cudaStream_t);
DRT_INSTANTIATE_FUSED_DECODE_OPS(bf16)
DRT_INSTANTIATE_FUSED_DECODE_OPS(float)
#undef DRT_INSTANTIATE_FUSED_DECODE_OPS

}  // namespace drt::cuda

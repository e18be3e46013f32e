// GEMMs through cuBLAS with fp32 accumulation: bf16 inputs (tensor cores), or
// fp32 inputs computed in fp32 with TF32 off (the CUDA backend's fp32
// precision, engine/cuda/cuda_options.h: the CPU backend's arithmetic up to
// summation order).
#pragma once

#include <cublas_api.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cublas_library.h"

namespace drt::kernels {

using bf16 = __nv_bfloat16;

// Owns a cuBLAS handle and its workspace. Movable, not copyable. Not
// thread-safe: one CublasGemm per stream/thread.
class CublasGemm {
 public:
  static absl::StatusOr<CublasGemm> Create();

  CublasGemm(CublasGemm&& other) noexcept;
  CublasGemm& operator=(CublasGemm&& other) noexcept;
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;
  ~CublasGemm();

  // y[m][n] = x[m][k] . w[n][k]^T (PyTorch Linear: w is [out][in]); bf16 in and
  // out, fp32 accumulation. All row-major and contiguous.
  absl::Status Matmul(const bf16* x, const bf16* w, bf16* y, int m, int n, int k, cudaStream_t s);
  // Same with fp32 output; accumulate=true computes y += x . w^T (residual adds).
  absl::Status Matmul(const bf16* x, const bf16* w, float* y, int m, int n, int k, bool accumulate,
                      cudaStream_t s);
  // fp32 in and out: CUBLAS_COMPUTE_32F under CUBLAS_DEFAULT_MATH (set at
  // Create), so no TF32 rounding of the inputs. The first form overwrites y,
  // the second accumulates when asked, as above.
  absl::Status Matmul(const float* x, const float* w, float* y, int m, int n, int k,
                      cudaStream_t s);
  absl::Status Matmul(const float* x, const float* w, float* y, int m, int n, int k,
                      bool accumulate, cudaStream_t s);

 private:
  CublasGemm(const CublasLibrary& lib, cublasHandle_t handle, void* workspace,
             size_t workspace_bytes);
  void Release();

  CublasLibrary lib_;  // the functions handle_ was made with
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace drt::kernels

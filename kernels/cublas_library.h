// cuBLAS, opened at run time (dlopen) by the CUDA backend's first GEMM
// handle instead of being linked.
//
// Why: linking libcublas makes every process load libcublasLt (540 MB), whose
// static initialisers cost about 0.5 s and 210 MB of resident memory at start,
// GPU or not (measured 2026-11-25 on the 2-core CPU machine: an empty `main`
// linked with -lcublas starts in 0.46-0.59 s at 216 MB RSS, with -lcudart alone
// in 0.00 s at 1 MB). Every drt-server and tool run on the CPU and every test
// process paid it. Now only a process that creates a CudaBackend's GEMM handle
// does.
//
// Only the functions kernels/gemm.cu calls are resolved. The library stays
// loaded once opened (RTLD_NODELETE): cuBLAS is not made to be unloaded while
// the CUDA context lives, and a second Open() is then only dlopen's lookup.
#pragma once

#include <cublas_api.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace drt::kernels {

// The shared library this build's headers describe: "libcublas.so.<major>".
std::string CublasLibraryName();

struct CublasLibrary {
  // cuBLAS's exported names (cublas_v2.h maps cublasCreate to cublasCreate_v2
  // and so on); the signatures are those of cublas_api.h.
  cublasStatus_t (*create)(cublasHandle_t* handle) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t handle) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t handle, cudaStream_t stream) = nullptr;
  cublasStatus_t (*set_workspace)(cublasHandle_t handle, void* workspace, size_t bytes) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t handle, cublasMath_t mode) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* a, cudaDataType a_type, int lda, const void* b,
                            cudaDataType b_type, int ldb, const void* beta, void* c,
                            cudaDataType c_type, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t algo) = nullptr;
  const char* (*status_name)(cublasStatus_t status) = nullptr;
  const char* (*status_string)(cublasStatus_t status) = nullptr;

  // Opens `file` (default CublasLibraryName(); found as the dynamic linker
  // finds libraries: this executable's RUNPATH, LD_LIBRARY_PATH, ld.so.cache)
  // and resolves every function above. FAILED_PRECONDITION naming the file
  // and dlerror()'s reason when it cannot be opened, or naming the missing
  // function.
  static absl::StatusOr<CublasLibrary> Open(const std::string& file = CublasLibraryName());

  // OK for CUBLAS_STATUS_SUCCESS, else INTERNAL
  // "what: <cublasGetStatusName>: <cublasGetStatusString>".
  absl::Status Check(cublasStatus_t status, std::string_view what) const;
};

}  // namespace drt::kernels

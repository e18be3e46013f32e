#include "kernels/gemm.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "kernels/cuda_check.h"

namespace drt::kernels {
namespace {

// cuBLAS recommends 32 MiB of workspace on Hopper (4 MiB suffices on Ampere).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

absl::Status CheckShape(const void* x, const void* w, const void* y, int m, int n, int k) {
  if (m < 0 || n < 0 || k < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CublasGemm::Matmul: negative shape m=%d n=%d k=%d", m, n, k));
  }
  if (m > 0 && n > 0 && (y == nullptr || (k > 0 && (x == nullptr || w == nullptr)))) {
    return absl::InvalidArgumentError("CublasGemm::Matmul: null operand");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CublasGemm> CublasGemm::Create() {
  absl::StatusOr<CublasLibrary> lib = CublasLibrary::Open();
  if (!lib.ok()) return lib.status();
  cublasHandle_t handle = nullptr;
  if (const cublasStatus_t st = lib->create(&handle); st != CUBLAS_STATUS_SUCCESS) {
    // A full device fails one session's Init as RESOURCE_EXHAUSTED, like
    // every other allocation of the backend (engine/cuda/allocation_status.h);
    // the runtime's last error a failed internal allocation may leave is
    // cleared so the next launch on this thread does not report it again.
    (void)cudaGetLastError();
    if (st == CUBLAS_STATUS_ALLOC_FAILED) {
      return absl::ResourceExhaustedError("cublasCreate: CUBLAS_STATUS_ALLOC_FAILED (device memory)");
    }
    return lib->Check(st, "cublasCreate");
  }
  // The default already; set explicitly because fp32 GEMMs rely on it: TF32
  // only with CUBLAS_TF32_TENSOR_OP_MATH or a *_FAST_TF32 compute type.
  if (absl::Status s =
          lib->Check(lib->set_math_mode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
      !s.ok()) {
    lib->destroy(handle);
    return s;
  }
  void* workspace = nullptr;
  const cudaError_t err = cudaMalloc(&workspace, kWorkspaceBytes);
  if (err != cudaSuccess) {
    lib->destroy(handle);
    (void)cudaGetLastError();  // As above: reported here, not by the next launch.
    if (err == cudaErrorMemoryAllocation) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cudaMalloc(cuBLAS workspace, %d bytes): out of device memory", kWorkspaceBytes));
    }
    return CudaStatus(err, "cudaMalloc(cuBLAS workspace)");
  }
  return CublasGemm(*lib, handle, workspace, kWorkspaceBytes);
}

CublasGemm::CublasGemm(const CublasLibrary& lib, cublasHandle_t handle, void* workspace,
                       size_t workspace_bytes)
    : lib_(lib), handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}

CublasGemm::CublasGemm(CublasGemm&& other) noexcept
    : lib_(other.lib_),
      handle_(std::exchange(other.handle_, nullptr)),
      workspace_(std::exchange(other.workspace_, nullptr)),
      workspace_bytes_(std::exchange(other.workspace_bytes_, 0)) {}

CublasGemm& CublasGemm::operator=(CublasGemm&& other) noexcept {
  if (this != &other) {
    Release();
    lib_ = other.lib_;
    handle_ = std::exchange(other.handle_, nullptr);
    workspace_ = std::exchange(other.workspace_, nullptr);
    workspace_bytes_ = std::exchange(other.workspace_bytes_, 0);
  }
  return *this;
}

CublasGemm::~CublasGemm() { Release(); }

void CublasGemm::Release() {
  if (handle_ != nullptr) lib_.destroy(handle_);
  // cudaFree synchronises the device, so no queued GEMM still uses the workspace.
  if (workspace_ != nullptr) cudaFree(workspace_);
  handle_ = nullptr;
  workspace_ = nullptr;
  workspace_bytes_ = 0;
}

namespace {

// Row-major y[m][n] = x[m][k] w[n][k]^T is, read column-major,
// y^T (n x m) = w (k x n)^T x^T (k x m): op(A) = T on w, op(B) = N on x.
absl::Status Gemm(const CublasLibrary& lib, cublasHandle_t handle, void* workspace,
                  size_t workspace_bytes, const void* x, const void* w, cudaDataType_t in_type,
                  void* y, cudaDataType_t y_type, int m, int n, int k, float beta,
                  cudaStream_t s) {
  if (handle == nullptr) return absl::FailedPreconditionError("CublasGemm: moved-from object");
  if (absl::Status st = CheckShape(x, w, y, m, n, k); !st.ok()) return st;
  if (m == 0 || n == 0) return absl::OkStatus();
  if (absl::Status st = lib.Check(lib.set_stream(handle, s), "cublasSetStream"); !st.ok()) {
    return st;
  }
  // cublasSetStream resets the workspace to cuBLAS's default pool; set ours again.
  if (absl::Status st = lib.Check(lib.set_workspace(handle, workspace, workspace_bytes),
                                  "cublasSetWorkspace");
      !st.ok()) {
    return st;
  }
  const float alpha = 1.f;
  // cuBLAS requires lda, ldb >= max(1, k) for these ops; with k == 0 it then
  // computes y = beta * y (zeros, or y unchanged when accumulating).
  const int ld = k > 0 ? k : 1;
  return lib.Check(
      lib.gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, in_type, ld, x, in_type,
                  ld, &beta, y, y_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      absl::StrFormat("cublasGemmEx(m=%d, n=%d, k=%d)", m, n, k));
}

}  // namespace

absl::Status CublasGemm::Matmul(const bf16* x, const bf16* w, bf16* y, int m, int n, int k,
                                cudaStream_t s) {
  return Gemm(lib_, handle_, workspace_, workspace_bytes_, x, w, CUDA_R_16BF, y, CUDA_R_16BF, m, n, k,
              0.f, s);
}

absl::Status CublasGemm::Matmul(const bf16* x, const bf16* w, float* y, int m, int n, int k,
                                bool accumulate, cudaStream_t s) {
  return Gemm(lib_, handle_, workspace_, workspace_bytes_, x, w, CUDA_R_16BF, y, CUDA_R_32F, m, n, k,
              accumulate ? 1.f : 0.f, s);
}

absl::Status CublasGemm::Matmul(const float* x, const float* w, float* y, int m, int n, int k,
                                cudaStream_t s) {
  return Matmul(x, w, y, m, n, k, /*accumulate=*/false, s);
}

absl::Status CublasGemm::Matmul(const float* x, const float* w, float* y, int m, int n, int k,
                                bool accumulate, cudaStream_t s) {
  return Gemm(lib_, handle_, workspace_, workspace_bytes_, x, w, CUDA_R_32F, y, CUDA_R_32F, m, n, k,
              accumulate ? 1.f : 0.f, s);
}

}  // namespace drt::kernels

#include "kernels/cublas_library.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace drt::kernels {
namespace {

// Resolves `name` in `handle` into `fn`, or says which function is missing.
template <typename Fn>
absl::Status Resolve(void* handle, const std::string& file, const char* name, Fn* fn) {
  dlerror();  // clear any earlier error, so the one below is dlsym's
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cuBLAS library ", file, " has no function ", name, " (", why ? why : "null symbol",
        "): the CUDA backend needs cuBLAS ", CUBLAS_VER_MAJOR, ".x"));
  }
  *fn = reinterpret_cast<Fn>(symbol);
  return absl::OkStatus();
}

}  // namespace

std::string CublasLibraryName() { return absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR); }

absl::StatusOr<CublasLibrary> CublasLibrary::Open(const std::string& file) {
  // RTLD_LOCAL: cuBLAS's symbols serve only the lookups below. RTLD_NODELETE:
  // see the header; the handle is therefore not kept or closed.
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load the cuBLAS library ", file, " (the CUDA backend's GEMMs): ",
        why ? why : "unknown dlopen error",
        "; install the CUDA ", CUBLAS_VER_MAJOR,
        " runtime libraries or add their directory to LD_LIBRARY_PATH"));
  }
  CublasLibrary lib;
  for (absl::Status st : {Resolve(handle, file, "cublasCreate_v2", &lib.create),
                          Resolve(handle, file, "cublasDestroy_v2", &lib.destroy),
                          Resolve(handle, file, "cublasSetStream_v2", &lib.set_stream),
                          Resolve(handle, file, "cublasSetWorkspace_v2", &lib.set_workspace),
                          Resolve(handle, file, "cublasSetMathMode", &lib.set_math_mode),
                          Resolve(handle, file, "cublasGemmEx", &lib.gemm_ex),
                          Resolve(handle, file, "cublasGetStatusName", &lib.status_name),
                          Resolve(handle, file, "cublasGetStatusString", &lib.status_string)}) {
    if (!st.ok()) return st;
  }
  return lib;
}

absl::Status CublasLibrary::Check(cublasStatus_t status, std::string_view what) const {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrFormat("%s: %s: %s", what, status_name(status), status_string(status)));
}

}  // namespace drt::kernels

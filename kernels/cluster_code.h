// Whether a kernel's compiled code can run thread block clusters, from its
// cudaFuncAttributes versions. Plain C++ (no CUDA header): the split decode
// launcher (kernels/window_split_decode.cu) and MakeCudaBackend call it, and
// tests/cluster_code_test.cc tests it without a GPU.
//
// Why the PTX version decides: the split decode kernel's cluster code is
// compiled only for __CUDA_ARCH__ >= 900 (below, the kernel body is a
// __trap()). A binary built without sm_90 (CMAKE_CUDA_ARCHITECTURES=80)
// carries compute_80 PTX, which the driver JIT-compiles for an H100: the
// function's binaryVersion is then the H100's 90, but its ptxVersion stays
// 80 and every launch traps (a sticky error that poisons the context).
// ptxVersion is documented as possibly 0 ("undefined") for very old
// cubins; then the binary version is all there is to go by.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace drt::kernels {

// The architecture (major * 10 + minor) the cluster kernels are compiled for.
inline constexpr int kClusterCodeVersion = 90;

inline bool HasClusterCode(int ptx_version, int binary_version) {
  if (ptx_version == 0) return binary_version >= kClusterCodeVersion;
  return ptx_version >= kClusterCodeVersion;
}

// OK when window_decode_splits `splits` can run with the split decode
// kernel's code versions; INVALID_ARGUMENT naming the option and the build
// otherwise (MakeCudaBackend refuses the backend with it, rather than the
// first decode step failing and poisoning its sessions). Splits of 0 or 1
// use no cluster.
inline absl::Status CheckSplitDecodeCode(int splits, int ptx_version, int binary_version) {
  if (splits <= 1 || HasClusterCode(ptx_version, binary_version)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "window_decode_splits %d needs the split decode kernel's thread block cluster code, but "
      "this binary was built without sm_90 (the kernel's PTX version is %d, binary version %d): "
      "rebuild with CMAKE_CUDA_ARCHITECTURES including 90, or use window_decode_splits 0 or 1",
      splits, ptx_version, binary_version));
}

}  // namespace drt::kernels

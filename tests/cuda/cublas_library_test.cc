// kernels/cublas_library.h: cuBLAS opened at run time. These need the CUDA
// toolkit's libcublas (present wherever the CUDA build is), not a GPU:
// loading and resolving do not touch the driver, so they run in CI.
#include "kernels/cublas_library.h"

#include <string>

#include <catch2/catch.hpp>

namespace drt::cuda_test {
namespace {

TEST_CASE("cuBLAS loader: opens this build's libcublas and resolves every function", "[cublas]") {
  absl::StatusOr<kernels::CublasLibrary> lib = kernels::CublasLibrary::Open();
  INFO(lib.status().ToString());
  REQUIRE(lib.ok());
  CHECK(lib->create != nullptr);
  CHECK(lib->destroy != nullptr);
  CHECK(lib->set_stream != nullptr);
  CHECK(lib->set_workspace != nullptr);
  CHECK(lib->set_math_mode != nullptr);
  CHECK(lib->gemm_ex != nullptr);
  // The resolved functions are cuBLAS's: its own names for its status codes.
  REQUIRE(lib->status_name != nullptr);
  REQUIRE(lib->status_string != nullptr);
  CHECK(std::string(lib->status_name(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(std::string(lib->status_name(CUBLAS_STATUS_ALLOC_FAILED)) == "CUBLAS_STATUS_ALLOC_FAILED");
  CHECK(lib->Check(CUBLAS_STATUS_SUCCESS, "cublasGemmEx").ok());
  const absl::Status failed = lib->Check(CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmEx(m=1)");
  CHECK(failed.code() == absl::StatusCode::kInternal);
  const std::string expected_start = "cublasGemmEx(m=1): CUBLAS_STATUS_NOT_SUPPORTED: ";
  CHECK(failed.message().substr(0, expected_start.size()) == expected_start);
  CHECK(failed.message().size() > expected_start.size());  // cuBLAS's own description follows
  // A second Open finds the loaded library again.
  CHECK(kernels::CublasLibrary::Open().ok());
}

TEST_CASE("cuBLAS loader: the library's name follows the headers' major version", "[cublas]") {
  CHECK(kernels::CublasLibraryName() == "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR));
}

TEST_CASE("cuBLAS loader: a missing library is refused naming the file", "[cublas]") {
  const absl::StatusOr<kernels::CublasLibrary> lib =
      kernels::CublasLibrary::Open("libdrt-no-such-cublas.so.13");
  REQUIRE_FALSE(lib.ok());
  CHECK(lib.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(lib.status().message().find("libdrt-no-such-cublas.so.13") != std::string::npos);
  CHECK(lib.status().message().find("LD_LIBRARY_PATH") != std::string::npos);
}

TEST_CASE("cuBLAS loader: a library without cuBLAS's functions is refused naming the function",
          "[cublas]") {
  // libm is always there and has none of them.
  const absl::StatusOr<kernels::CublasLibrary> lib = kernels::CublasLibrary::Open("libm.so.6");
  REQUIRE_FALSE(lib.ok());
  CHECK(lib.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(lib.status().message().find("libm.so.6") != std::string::npos);
  CHECK(lib.status().message().find("cublasCreate_v2") != std::string::npos);
}

}  // namespace
}  // namespace drt::cuda_test

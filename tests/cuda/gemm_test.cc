#include "kernels/gemm.h"

#include <random>
#include <utility>
#include <vector>

#include "tests/cuda/cuda_test_util.h"

namespace drt::cuda_test {
namespace {

using kernels::bf16;

// y[m][n] = x[m][k] . w[n][k]^T in double.
std::vector<double> MatmulReference(const std::vector<float>& x, const std::vector<float>& w, int m, int n,
                                    int k) {
  std::vector<double> y(static_cast<size_t>(m) * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int t = 0; t < k; ++t) s += static_cast<double>(x[static_cast<size_t>(i) * k + t]) * w[static_cast<size_t>(j) * k + t];
      y[static_cast<size_t>(i) * n + j] = s;
    }
  }
  return y;
}

TEST_CASE("cuda gemm: bf16 and fp32 outputs, accumulate, odd shapes", "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  absl::StatusOr<kernels::CublasGemm> gemm_or = kernels::CublasGemm::Create();
  INFO(gemm_or.status().ToString());
  REQUIRE(gemm_or.ok());
  // Moving keeps the handle usable.
  kernels::CublasGemm gemm = std::move(gemm_or).value();
  std::mt19937 rng(21);
  struct Shape {
    int m, n, k;
  };
  for (const Shape s : {Shape{1, 256, 768}, Shape{37, 300, 64}, Shape{130, 77, 200}, Shape{64, 1024, 256}}) {
    INFO("m " << s.m << " n " << s.n << " k " << s.k);
    const Bf16Data x = RandomBf16(static_cast<size_t>(s.m) * s.k, rng);
    const Bf16Data w = RandomBf16(static_cast<size_t>(s.n) * s.k, rng);
    const std::vector<float> y0 = RandomFloats(static_cast<size_t>(s.m) * s.n, rng, -5.f, 5.f);
    DeviceBuffer<uint16_t> d_x(x.bits);
    DeviceBuffer<uint16_t> d_w(w.bits);
    DeviceBuffer<uint16_t> d_y(static_cast<size_t>(s.m) * s.n);
    DeviceBuffer<float> d_yf(y0);
    DeviceBuffer<float> d_yacc(y0);
    const std::vector<double> ref = MatmulReference(x.values, w.values, s.m, s.n, s.k);

    absl::Status st = gemm.Matmul(d_x.as<const bf16>(), d_w.as<const bf16>(), d_y.as<bf16>(), s.m, s.n, s.k, nullptr);
    INFO(st.ToString());
    REQUIRE(st.ok());
    st = gemm.Matmul(d_x.as<const bf16>(), d_w.as<const bf16>(), d_yf.get(), s.m, s.n, s.k, false, nullptr);
    REQUIRE(st.ok());
    st = gemm.Matmul(d_x.as<const bf16>(), d_w.as<const bf16>(), d_yacc.get(), s.m, s.n, s.k, true, nullptr);
    REQUIRE(st.ok());
    CUDA_REQUIRE(cudaDeviceSynchronize());

    const ErrorReport bf = CompareToReference(Bf16ToFloats(d_y.Download()), ref);
    INFO("bf16 out: " << bf.str());
    CHECK(bf.relative() <= 1e-2);
    const ErrorReport f32 = CompareToReference(d_yf.Download(), ref);
    INFO("fp32 out: " << f32.str());
    CHECK(f32.relative() <= 1e-4);
    std::vector<double> ref_acc(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) ref_acc[i] = ref[i] + y0[i];
    const ErrorReport acc = CompareToReference(d_yacc.Download(), ref_acc);
    INFO("fp32 accumulate: " << acc.str());
    CHECK(acc.relative() <= 1e-4);
  }
  CHECK_FALSE(gemm.Matmul(nullptr, nullptr, static_cast<bf16*>(nullptr), -1, 1, 1, nullptr).ok());
}

TEST_CASE("cuda gemm: fp32 inputs are computed in fp32, not TF32", "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  absl::StatusOr<kernels::CublasGemm> gemm_or = kernels::CublasGemm::Create();
  REQUIRE(gemm_or.ok());
  kernels::CublasGemm gemm = std::move(gemm_or).value();
  std::mt19937 rng(22);
  struct Shape {
    int m, n, k;
  };
  for (const Shape s : {Shape{1, 256, 768}, Shape{37, 300, 64}, Shape{130, 77, 200}, Shape{64, 1024, 256}}) {
    INFO("m " << s.m << " n " << s.n << " k " << s.k);
    // Full fp32 mantissas: TF32 would keep 10 of their 23 bits.
    const std::vector<float> x = RandomFloats(static_cast<size_t>(s.m) * s.k, rng);
    const std::vector<float> w = RandomFloats(static_cast<size_t>(s.n) * s.k, rng);
    const std::vector<float> y0 = RandomFloats(static_cast<size_t>(s.m) * s.n, rng, -5.f, 5.f);
    DeviceBuffer<float> d_x(x), d_w(w), d_y(static_cast<size_t>(s.m) * s.n), d_yacc(y0);
    const std::vector<double> ref = MatmulReference(x, w, s.m, s.n, s.k);
    REQUIRE(gemm.Matmul(d_x.get(), d_w.get(), d_y.get(), s.m, s.n, s.k, nullptr).ok());
    REQUIRE(gemm.Matmul(d_x.get(), d_w.get(), d_yacc.get(), s.m, s.n, s.k, true, nullptr).ok());
    CUDA_REQUIRE(cudaDeviceSynchronize());
    // Derived (held on an H100): fp32 accumulation of k <= 768
    // products of numbers in [-1, 1) errs by about k * 2^-24 times a term,
    // some 1e-7..1e-6 of the tensor's largest value; TF32 inputs (2^-11
    // rounding each) would err by about sqrt(k) * 2^-11 times a term, some
    // 1e-4 of it. 1e-5 tells the two apart.
    const ErrorReport f32 = CompareToReference(d_y.Download(), ref);
    INFO("fp32: " << f32.str());
    CHECK(f32.relative() <= 1e-5);
    std::vector<double> ref_acc(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) ref_acc[i] = ref[i] + y0[i];
    const ErrorReport acc = CompareToReference(d_yacc.Download(), ref_acc);
    INFO("fp32 accumulate: " << acc.str());
    CHECK(acc.relative() <= 1e-5);
  }
}

}  // namespace
}  // namespace drt::cuda_test

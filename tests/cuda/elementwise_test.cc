#include "kernels/elementwise.h"

#include <cmath>
#include <random>
#include <vector>

#include "tests/cuda/cuda_test_util.h"

namespace drt::cuda_test {
namespace {

using kernels::bf16;

std::vector<double> RmsNormReference(const std::vector<float>& x, const std::vector<float>& w, int rows,
                                     int d, double eps) {
  std::vector<double> y(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int j = 0; j < d; ++j) ss += static_cast<double>(x[r * d + j]) * x[r * d + j];
    const double scale = 1.0 / std::sqrt(ss / d + eps);
    for (int j = 0; j < d; ++j) y[r * d + j] = x[r * d + j] * scale * w[j];
  }
  return y;
}

TEST_CASE("cuda elementwise: embedding gather copies rows exactly", "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(11);
  const int vocab = 97, d = 200, n = 37;
  const Bf16Data table = RandomBf16(static_cast<size_t>(vocab) * d, rng);
  std::vector<int32_t> ids(n);
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  for (int32_t& id : ids) id = pick(rng);
  ids[0] = vocab - 1;
  DeviceBuffer<uint16_t> d_table(table.bits);
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<float> d_out(static_cast<size_t>(n) * d);
  CUDA_REQUIRE(kernels::LaunchEmbeddingGather(d_ids.get(), n, d_table.as<const bf16>(), d, d_out.get(), nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<float> out = d_out.Download();
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < d; ++j) {
      REQUIRE(out[i * d + j] == table.values[static_cast<size_t>(ids[i]) * d + j]);
    }
  }
}

TEST_CASE("cuda elementwise: RMSNorm variants match a double reference", "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(12);
  struct Shape {
    int rows, d;
  };
  for (const Shape s : {Shape{1, 768}, Shape{5, 1000}, Shape{3, 33}, Shape{17, 256}}) {
    INFO("rows " << s.rows << " d " << s.d);
    const float eps = 1e-5f;
    const std::vector<float> x = RandomFloats(static_cast<size_t>(s.rows) * s.d, rng, -3.f, 3.f);
    const Bf16Data xb = RandomBf16(x.size(), rng, -3.f, 3.f);
    const Bf16Data w = RandomBf16(s.d, rng, 0.5f, 1.5f);
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<uint16_t> d_xb(xb.bits);
    DeviceBuffer<uint16_t> d_w(w.bits);
    DeviceBuffer<uint16_t> d_out(x.size());
    DeviceBuffer<float> d_out_f(x.size());

    CUDA_REQUIRE(kernels::LaunchRmsNorm(d_x.get(), d_w.as<const bf16>(), s.rows, s.d, eps,
                                        d_out.as<bf16>(), nullptr));
    CUDA_REQUIRE(kernels::LaunchRmsNormF32(d_x.get(), d_w.as<const bf16>(), s.rows, s.d, eps,
                                           d_out_f.get(), nullptr));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    const std::vector<double> ref = RmsNormReference(x, w.values, s.rows, s.d, eps);
    const ErrorReport bf = CompareToReference(Bf16ToFloats(d_out.Download()), ref);
    INFO("bf16 out: " << bf.str());
    CHECK(bf.relative() <= 1e-2);
    const ErrorReport f32 = CompareToReference(d_out_f.Download(), ref);
    INFO("fp32 out: " << f32.str());
    CHECK(f32.relative() <= 1e-5);

    CUDA_REQUIRE(kernels::LaunchRmsNormBf16In(d_xb.as<const bf16>(), d_w.as<const bf16>(), s.rows, s.d,
                                              eps, d_out.as<bf16>(), nullptr));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    const ErrorReport bin =
        CompareToReference(Bf16ToFloats(d_out.Download()), RmsNormReference(xb.values, w.values, s.rows, s.d, eps));
    INFO("bf16 in: " << bin.str());
    CHECK(bin.relative() <= 1e-2);
  }
  CHECK(kernels::LaunchRmsNorm<bf16>(nullptr, nullptr, 1, 0, 1e-5f, nullptr, nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("cuda elementwise: SwiGLU", "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(13);
  const int rows = 7, f = 300;
  const Bf16Data gu = RandomBf16(static_cast<size_t>(rows) * 2 * f, rng, -4.f, 4.f);
  DeviceBuffer<uint16_t> d_gu(gu.bits);
  DeviceBuffer<uint16_t> d_out(static_cast<size_t>(rows) * f);
  CUDA_REQUIRE(kernels::LaunchSwiGlu(d_gu.as<const bf16>(), rows, f, d_out.as<bf16>(), nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  std::vector<double> ref(static_cast<size_t>(rows) * f);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < f; ++c) {
      const double g = gu.values[static_cast<size_t>(r) * 2 * f + c];
      const double u = gu.values[static_cast<size_t>(r) * 2 * f + f + c];
      ref[static_cast<size_t>(r) * f + c] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  const ErrorReport e = CompareToReference(Bf16ToFloats(d_out.Download()), ref);
  INFO(e.str());
  CHECK(e.relative() <= 1e-2);
}

TEST_CASE("cuda elementwise: conversions and chunk-row zeroing", "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(14);
  const size_t n = 100003;
  const std::vector<float> x = RandomFloats(n, rng, -100.f, 100.f);
  DeviceBuffer<float> d_x(x);
  DeviceBuffer<uint16_t> d_b(n);
  DeviceBuffer<float> d_back(n);
  CUDA_REQUIRE(kernels::LaunchConvertF32ToBf16(d_x.get(), n, d_b.as<bf16>(), nullptr));
  CUDA_REQUIRE(kernels::LaunchConvertBf16ToF32(d_b.as<const bf16>(), n, d_back.get(), nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<uint16_t> b = d_b.Download();
  const std::vector<float> back = d_back.Download();
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(b[i] == ToBf16(x[i]));
    REQUIRE(back[i] == FromBf16(b[i]));
  }

  const int chunks = 3, width = 72, row = 63;
  const Bf16Data kv = RandomBf16(static_cast<size_t>(chunks) * 64 * width, rng);
  DeviceBuffer<uint16_t> d_kv(kv.bits);
  CUDA_REQUIRE(kernels::LaunchZeroChunkRow(d_kv.as<bf16>(), chunks, row, width, nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = d_kv.Download();
  for (int c = 0; c < chunks; ++c) {
    for (int r = 0; r < 64; ++r) {
      for (int j = 0; j < width; ++j) {
        const size_t i = (static_cast<size_t>(c) * 64 + r) * width + j;
        REQUIRE(got[i] == (r == row ? uint16_t{0} : kv.bits[i]));
      }
    }
  }
  CHECK(kernels::LaunchZeroChunkRow(d_kv.as<bf16>(), chunks, 64, width, nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("cuda elementwise: fp32 storage (gather, RMSNorm, SwiGLU, chunk-row zeroing)", "[cuda]") {
  // The instantiations the CUDA backend's fp32 precision runs, on full fp32
  // values (bf16 rounding anywhere would miss 1e-5 by far: 2^-9).
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(15);
  const int vocab = 97, d = 200, n = 37;
  const std::vector<float> table = RandomFloats(static_cast<size_t>(vocab) * d, rng);
  std::vector<int32_t> ids(n);
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  for (int32_t& id : ids) id = pick(rng);
  DeviceBuffer<float> d_table(table), d_rows(static_cast<size_t>(n) * d);
  DeviceBuffer<int32_t> d_ids(ids);
  CUDA_REQUIRE(kernels::LaunchEmbeddingGather(d_ids.get(), n, d_table.get(), d, d_rows.get(), nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<float> rows = d_rows.Download();
  int64_t gather_mismatches = 0;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < d; ++j) {
      gather_mismatches += rows[i * d + j] != table[static_cast<size_t>(ids[i]) * d + j];
    }
  }
  CHECK(gather_mismatches == 0);

  // RMSNorm with fp32 weights, fp32 out: the bound of the fp32-out case above.
  const std::vector<float> w = RandomFloats(d, rng, 0.5f, 1.5f);
  DeviceBuffer<float> d_w(w), d_normed(rows.size());
  CUDA_REQUIRE(kernels::LaunchRmsNorm(d_rows.get(), d_w.get(), n, d, 1e-5f, d_normed.get(), nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const ErrorReport norm = CompareToReference(d_normed.Download(), RmsNormReference(rows, w, n, d, 1e-5));
  INFO("RMSNorm: " << norm.str());
  CHECK(norm.relative() <= 1e-5);

  const int f = 300;
  const std::vector<float> gu = RandomFloats(static_cast<size_t>(n) * 2 * f, rng, -4.f, 4.f);
  DeviceBuffer<float> d_gu(gu), d_act(static_cast<size_t>(n) * f);
  CUDA_REQUIRE(kernels::LaunchSwiGlu(d_gu.get(), n, f, d_act.get(), nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  std::vector<double> ref(static_cast<size_t>(n) * f);
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < f; ++c) {
      const double g = gu[static_cast<size_t>(r) * 2 * f + c];
      const double u = gu[static_cast<size_t>(r) * 2 * f + f + c];
      ref[static_cast<size_t>(r) * f + c] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  const ErrorReport act = CompareToReference(d_act.Download(), ref);
  INFO("SwiGLU: " << act.str());
  CHECK(act.relative() <= 1e-5);

  const int chunks = 3, width = 72, row = 63;
  const std::vector<float> kv = RandomFloats(static_cast<size_t>(chunks) * 64 * width, rng);
  DeviceBuffer<float> d_kv(kv);
  CUDA_REQUIRE(kernels::LaunchZeroChunkRow(d_kv.get(), chunks, row, width, nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<float> got = d_kv.Download();
  int64_t zero_mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool in_row = (i / width) % 64 == static_cast<size_t>(row);
    zero_mismatches += got[i] != (in_row ? 0.f : kv[i]);
  }
  CHECK(zero_mismatches == 0);
}

}  // namespace
}  // namespace drt::cuda_test

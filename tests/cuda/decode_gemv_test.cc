// The fused decode GEMVs (kernels/decode_gemv.h) against naive double
// references, in fp32 and bf16 storage, m = 1, 3 and 8 rows, k = 192, 768
// and 776 (bf16: 24 16-byte vectors, under one pass of the 32 lanes; 96,
// exactly 3 passes; 97, 3 passes and one lane more), n not a multiple of a
// block's rows; each output element is held to a bound derived below from
// the roundings the kernel performs. Also: the normed inputs are bit for
// bit LaunchRmsNorm's, writes stay inside their outputs, the residual given
// as y itself, the largest k the plan takes at 8 rows launches (its shared
// memory, scratch included, fits), bad shapes launch nothing, and a
// captured CUDA graph replays the eager launches' bits. Written without a
// GPU: NOT YET RUN ON ONE.
#include "kernels/decode_gemv.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/decode_gemv_plan.h"
#include "kernels/elementwise.h"
#include "tests/cuda/cuda_test_util.h"

namespace drt::cuda_test {
namespace {

using kernels::bf16;

// fp32's unit roundoff (round to nearest, 24 significant bits).
constexpr double kU32 = 0x1p-24;

// Host storage of the kernel's T: its bits, and the unit roundoff of
// rounding to it (bf16: 8 significant bits, 2^-8).
template <typename T>
struct Storage;
template <>
struct Storage<float> {
  using Host = float;
  static Host From(float v) { return v; }
  static float Value(Host h) { return h; }
  static constexpr double kUnit = 0x1p-24;
  static constexpr const char* kName = "fp32";
};
template <>
struct Storage<bf16> {
  using Host = uint16_t;
  static Host From(float v) { return ToBf16(v); }
  static float Value(Host h) { return FromBf16(h); }
  static constexpr double kUnit = 0x1p-8;
  static constexpr const char* kName = "bf16";
};

// Values rounded to T, as host bits and as the floats they are.
template <typename T>
struct HostTensor {
  std::vector<typename Storage<T>::Host> raw;
  std::vector<float> values;
};
template <typename T>
HostTensor<T> RandomTensor(size_t n, std::mt19937& rng, float lo, float hi) {
  HostTensor<T> t;
  for (float v : RandomFloats(n, rng, lo, hi)) {
    t.raw.push_back(Storage<T>::From(v));
    t.values.push_back(Storage<T>::Value(t.raw.back()));
  }
  return t;
}
// A device output of `n` elements followed by kCanary elements of a NaN
// pattern: a write past the output shows there.
constexpr size_t kCanary = 16;
template <typename H>
std::unique_ptr<DeviceBuffer<H>> CanaryOutput(size_t n) {
  std::vector<H> init(n + kCanary);
  std::memset(init.data(), 0xff, init.size() * sizeof(H));  // NaN in fp32 and bf16
  return std::make_unique<DeviceBuffer<H>>(init);
}
template <typename H>
void CheckCanary(const std::vector<H>& got, size_t n) {
  for (size_t i = n; i < got.size(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &got[i], sizeof(H));
    INFO("element " << i << " past the output's " << n);
    REQUIRE(bits == (sizeof(H) == 4 ? 0xffffffffu : 0xffffu));
  }
}

// Each element within its own bound (reference and bound in double).
void CheckWithinBounds(const std::vector<double>& got, const std::vector<double>& want,
                       const std::vector<double>& bound) {
  REQUIRE(got.size() == want.size());
  size_t worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::isfinite(got[i]) ? std::abs(got[i] - want[i]) : INFINITY;
    const double ratio = err / bound[i];
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  INFO("worst element " << worst << ": got " << got[worst] << ", want " << want[worst]
                        << ", bound " << bound[worst] << " (error / bound " << worst_ratio
                        << ")");
  CHECK(worst_ratio <= 1.0);
}

// The normed rows in double, unrounded: x = h / sqrt(mean(h^2) + eps) * w
// (drt-model.md's RMSNorm), and the relative error of the kernel's fp32
// value of each x: the sum of k squares (k - 1 additions of nonnegative
// terms, any order: <= (k - 1) u), / k and + eps (2 u), rsqrtf (2 ulp <=
// 4 u, CUDA Programming Guide, "Mathematical Functions"), the square root
// halving the relative error of its argument: (k + 1) / 2 u + 4 u for the
// scale; then h * scale * w, 2 u: (k / 2 + 7) u in all.
struct NormedRows {
  std::vector<double> x;  // [m][k]
  double relative_error = 0;
};
NormedRows NormReference(const std::vector<float>& h, const std::vector<float>& w, int m, int k,
                         double eps) {
  NormedRows out;
  out.x.resize(static_cast<size_t>(m) * k);
  for (int r = 0; r < m; ++r) {
    double ss = 0;
    for (int j = 0; j < k; ++j) ss += static_cast<double>(h[r * k + j]) * h[r * k + j];
    const double scale = 1.0 / std::sqrt(ss / k + eps);
    for (int j = 0; j < k; ++j) out.x[r * k + j] = h[r * k + j] * scale * w[j];
  }
  out.relative_error = (k / 2.0 + 7.0) * kU32;
  return out;
}

// y[r][c] = sum_j x[r][j] w[c][j] in double, and the bound on the kernel's
// value when each x carries relative error `x_error` and the sum is fp32
// with fmaf (k terms in any order: <= k u of sum |terms|): (1 + x_error)(1 +
// k u) - 1 of sum |x w| over the exact x; then the output's rounding to T
// (relative `out_unit`, 0 for fp32 output: the fp32 sum is the output).
struct Products {
  std::vector<double> y, bound;
  std::vector<double> magnitude;  // sum |x w|
};
Products ProductReference(const std::vector<double>& x, const std::vector<float>& w, int m, int n,
                          int k, double x_error, double out_unit) {
  Products p;
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < n; ++c) {
      double y = 0, magnitude = 0;
      for (int j = 0; j < k; ++j) {
        const double t = x[r * k + j] * w[static_cast<size_t>(c) * k + j];
        y += t;
        magnitude += std::abs(t);
      }
      const double sum_error = ((1 + x_error) * (1 + k * kU32) - 1) * magnitude;
      p.y.push_back(y);
      p.magnitude.push_back(magnitude);
      p.bound.push_back(sum_error + out_unit * (std::abs(y) + sum_error));
    }
  }
  return p;
}

template <typename T>
void CheckNormGemv(int m, int k, std::vector<int> cols, std::mt19937& rng) {
  using S = Storage<T>;
  using H = typename S::Host;
  int n = 0;
  for (int c : cols) n += c;
  INFO(S::kName << " m " << m << " k " << k << " n " << n << " (" << cols.size() << " segments)");
  const float eps = 1e-5f;
  const std::vector<float> h = RandomFloats(static_cast<size_t>(m) * k, rng, -3.f, 3.f);
  const HostTensor<T> norm_w = RandomTensor<T>(k, rng, 0.5f, 1.5f);
  const HostTensor<T> w = RandomTensor<T>(static_cast<size_t>(n) * k, rng, -0.1f, 0.1f);
  DeviceBuffer<float> d_h(h);
  DeviceBuffer<H> d_norm(norm_w.raw);
  DeviceBuffer<H> d_w(w.raw);
  std::vector<std::unique_ptr<DeviceBuffer<H>>> outs;
  for (int c : cols) outs.push_back(CanaryOutput<H>(static_cast<size_t>(m) * c));
  kernels::NormGemvParams<T> p;
  p.h = d_h.get();
  p.norm_w = d_norm.template as<const T>();
  p.eps = eps;
  p.w = d_w.template as<const T>();
  p.m = m;
  p.k = k;
  for (size_t s = 0; s < cols.size(); ++s) {
    p.out[s] = outs[s]->template as<T>();
    p.cols[s] = cols[s];
  }
  CUDA_REQUIRE(kernels::LaunchNormGemv(p, nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());

  const NormedRows x = NormReference(h, norm_w.values, m, k, eps);
  // bf16 inputs: the fp32 x rounded to bf16 adds 2^-8 relative.
  const double x_error = (1 + x.relative_error) * (1 + S::kUnit) - 1;
  const Products ref = ProductReference(x.x, w.values, m, n, k,
                                        std::is_same_v<T, float> ? x.relative_error : x_error,
                                        std::is_same_v<T, float> ? 0.0 : S::kUnit);
  int first_col = 0;
  for (size_t s = 0; s < cols.size(); ++s) {
    INFO("segment " << s);
    const std::vector<H> got_raw = outs[s]->Download();
    CheckCanary(got_raw, static_cast<size_t>(m) * cols[s]);
    std::vector<double> got, want, bound;
    for (int r = 0; r < m; ++r) {
      for (int c = 0; c < cols[s]; ++c) {
        got.push_back(S::Value(got_raw[static_cast<size_t>(r) * cols[s] + c]));
        want.push_back(ref.y[static_cast<size_t>(r) * n + first_col + c]);
        bound.push_back(ref.bound[static_cast<size_t>(r) * n + first_col + c]);
      }
    }
    CheckWithinBounds(got, want, bound);
    first_col += cols[s];
  }
}

TEMPLATE_TEST_CASE("cuda decode gemv: norm GEMV matches a double reference", "[cuda]", float,
                   bf16) {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(2024);
  for (int m : {1, 3, 8}) {
    for (int k : {192, 768, 776}) {
      // Three segments (Q, K, V): n = k + 106, not a multiple of the 8 rows
      // of a block; one segment (the GCA query) of 8 * 13 + 5 rows.
      CheckNormGemv<TestType>(m, k, {k, 53, 53}, rng);
      CheckNormGemv<TestType>(m, k, {109}, rng);
    }
  }
  // 2303 rows: 2 rows per warp (kernels/decode_gemv_plan.h), the last warp
  // with one real row.
  REQUIRE(kernels::PlanDecodeGemv({kernels::DecodeGemvKind::kNorm, 1, 2303, 768,
                                   static_cast<int64_t>(sizeof(TestType))})
              ->rows_per_warp == 2);
  for (int m : {1, 8}) CheckNormGemv<TestType>(m, 768, {768, 768, 767}, rng);
}

TEMPLATE_TEST_CASE("cuda decode gemv: the normed inputs are LaunchRmsNorm's bit for bit",
                   "[cuda]", float, bf16) {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  // With W the identity, output column c is the normed x[c] (x * 1 plus
  // zeros, exact in fp32), rounded to T: T(x) again. The kernel reproduces
  // RmsNormKernel's sums in its order, so the bits must agree.
  using S = Storage<TestType>;
  using H = typename S::Host;
  std::mt19937 rng(77);
  for (int m : {1, 3, 8}) {
    // 776: RmsNormKernel's 256 threads take 3 elements each and 8 a fourth.
    for (int k : {192, 768, 776}) {
      INFO(S::kName << " m " << m << " k " << k);
      const float eps = 1e-5f;
      const std::vector<float> h = RandomFloats(static_cast<size_t>(m) * k, rng, -3.f, 3.f);
      const HostTensor<TestType> norm_w = RandomTensor<TestType>(k, rng, 0.5f, 1.5f);
      std::vector<H> identity(static_cast<size_t>(k) * k, S::From(0.f));
      for (int i = 0; i < k; ++i) identity[static_cast<size_t>(i) * k + i] = S::From(1.f);
      DeviceBuffer<float> d_h(h);
      DeviceBuffer<H> d_norm(norm_w.raw);
      DeviceBuffer<H> d_w(identity);
      DeviceBuffer<H> fused(static_cast<size_t>(m) * k);
      DeviceBuffer<H> unfused(static_cast<size_t>(m) * k);
      kernels::NormGemvParams<TestType> p;
      p.h = d_h.get();
      p.norm_w = d_norm.template as<const TestType>();
      p.eps = eps;
      p.w = d_w.template as<const TestType>();
      p.m = m;
      p.k = k;
      p.out[0] = fused.template as<TestType>();
      p.cols[0] = k;
      CUDA_REQUIRE(kernels::LaunchNormGemv(p, nullptr));
      CUDA_REQUIRE(kernels::LaunchRmsNorm(d_h.get(), d_norm.template as<const TestType>(), m, k,
                                          eps, unfused.template as<TestType>(), nullptr));
      CUDA_REQUIRE(cudaDeviceSynchronize());
      const std::vector<H> a = fused.Download();
      const std::vector<H> b = unfused.Download();
      for (size_t i = 0; i < a.size(); ++i) {
        INFO("element " << i);
        REQUIRE(std::memcmp(&a[i], &b[i], sizeof(H)) == 0);
      }
    }
  }
}

template <typename T>
void CheckNormGemvSwiGlu(int m, int k, int f, std::mt19937& rng) {
  using S = Storage<T>;
  using H = typename S::Host;
  INFO(S::kName << " m " << m << " k " << k << " f " << f);
  const float eps = 1e-5f;
  const std::vector<float> h = RandomFloats(static_cast<size_t>(m) * k, rng, -3.f, 3.f);
  const HostTensor<T> norm_w = RandomTensor<T>(k, rng, 0.5f, 1.5f);
  // gate/up entries of 0.1: |g| up to a few units, the SiLU's curved part.
  const HostTensor<T> w = RandomTensor<T>(static_cast<size_t>(2) * f * k, rng, -0.1f, 0.1f);
  DeviceBuffer<float> d_h(h);
  DeviceBuffer<H> d_norm(norm_w.raw);
  DeviceBuffer<H> d_w(w.raw);
  const auto d_act = CanaryOutput<H>(static_cast<size_t>(m) * f);
  CUDA_REQUIRE(kernels::LaunchNormGemvSwiGlu(d_h.get(), d_norm.template as<const T>(), eps,
                                             d_w.template as<const T>(), m, f, k,
                                             d_act->template as<T>(), nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<H> got_raw = d_act->Download();
  CheckCanary(got_raw, static_cast<size_t>(m) * f);

  const NormedRows x = NormReference(h, norm_w.values, m, k, eps);
  const bool fp32 = std::is_same_v<T, float>;
  const double x_error = fp32 ? x.relative_error : (1 + x.relative_error) * (1 + S::kUnit) - 1;
  // gate and up rounded to T as the unfused GEMM's output.
  const Products gu = ProductReference(x.x, w.values, m, 2 * f, k, x_error, fp32 ? 0 : S::kUnit);
  std::vector<double> got, want, bound;
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < f; ++j) {
      const size_t gi = static_cast<size_t>(r) * 2 * f + j, ui = gi + f;
      const double g = gu.y[gi], u = gu.y[ui];
      const double silu = g / (1 + std::exp(-g));
      const double act = silu * u;
      // The SiLU's slope is within [-0.1, 1.1] (its derivative's extremes
      // are about -0.0998 and 1.0998), so |silu(g') - silu(g)| <= 1.1 |g' -
      // g|; then |silu(g') u' - silu(g) u| <= 1.1 Bg (|u| + Bu) + |silu(g)|
      // Bu. The fp32 SiLU: expf (2 ulp = 4 u), 1 + e, the division and the
      // product (1 u each): 7 u, say 8 u; then the output's rounding to T.
      const double bg = gu.bound[gi], bu = gu.bound[ui];
      const double delta = 1.1 * bg * (std::abs(u) + bu) + std::abs(silu) * bu;
      const double rounding = (1 + 8 * kU32) * (1 + (fp32 ? 0.0 : S::kUnit)) - 1;
      got.push_back(S::Value(got_raw[static_cast<size_t>(r) * f + j]));
      want.push_back(act);
      bound.push_back(delta + rounding * (std::abs(act) + delta));
    }
  }
  CheckWithinBounds(got, want, bound);
}

TEMPLATE_TEST_CASE("cuda decode gemv: norm GEMV SwiGLU matches a double reference", "[cuda]",
                   float, bf16) {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(2025);
  for (int m : {1, 3, 8}) {
    for (int k : {192, 768, 776}) {
      // f = 8 * 25 + 3 and 8 * 128 + 5: the last block partly empty.
      CheckNormGemvSwiGlu<TestType>(m, k, 203, rng);
      CheckNormGemvSwiGlu<TestType>(m, k, 1029, rng);
    }
  }
}

// Where the accumulating GEMV's base comes from.
enum class Base {
  kY,                 // residual == nullptr: y += x . w^T
  kSeparateResidual,  // y = residual + x . w^T, residual another buffer
  kResidualIsY,       // the residual pointer is y itself (allowed: same as kY)
};
const char* BaseName(Base b) {
  switch (b) {
    case Base::kY: return " y +=";
    case Base::kSeparateResidual: return " residual given";
    case Base::kResidualIsY: return " residual == y";
  }
  return "";
}

template <typename T>
void CheckGemvAccumulate(int m, int n, int k, Base base_from, std::mt19937& rng) {
  using S = Storage<T>;
  using H = typename S::Host;
  const bool separate_residual = base_from == Base::kSeparateResidual;
  INFO(S::kName << " m " << m << " n " << n << " k " << k << BaseName(base_from));
  const HostTensor<T> x = RandomTensor<T>(static_cast<size_t>(m) * k, rng, -1.f, 1.f);
  const HostTensor<T> w = RandomTensor<T>(static_cast<size_t>(n) * k, rng, -0.1f, 0.1f);
  const std::vector<float> base = RandomFloats(static_cast<size_t>(m) * n, rng, -4.f, 4.f);
  DeviceBuffer<H> d_x(x.raw);
  DeviceBuffer<H> d_w(w.raw);
  DeviceBuffer<float> d_residual(base);
  const auto d_y = CanaryOutput<float>(static_cast<size_t>(m) * n);
  if (!separate_residual) {
    CUDA_REQUIRE(cudaMemcpy(d_y->get(), base.data(), base.size() * sizeof(float),
                            cudaMemcpyHostToDevice));
  }
  const float* residual = base_from == Base::kSeparateResidual ? d_residual.get()
                          : base_from == Base::kResidualIsY    ? d_y->get()
                                                               : nullptr;
  CUDA_REQUIRE(kernels::LaunchGemvAccumulate(d_x.template as<const T>(),
                                             d_w.template as<const T>(), residual, m, n, k,
                                             d_y->get(), nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<float> got_raw = d_y->Download();
  CheckCanary(got_raw, static_cast<size_t>(m) * n);
  if (separate_residual) REQUIRE(d_residual.Download() == base);  // read, not written
  // x and w are exact T values; the fp32 dot (k terms with fmaf: <= k u of
  // sum |x w|), then base + dot (1 u of |base| + |dot|): (k + 2) u of
  // (sum |x w| + |base|) bounds both.
  std::vector<double> xd(x.values.begin(), x.values.end());
  const Products dot = ProductReference(xd, w.values, m, n, k, 0.0, 0.0);
  std::vector<double> got, want, bound;
  for (size_t i = 0; i < base.size(); ++i) {
    got.push_back(got_raw[i]);
    want.push_back(base[i] + dot.y[i]);
    bound.push_back((k + 2) * kU32 * (dot.magnitude[i] + std::abs(base[i])));
  }
  CheckWithinBounds(got, want, bound);
}

TEMPLATE_TEST_CASE("cuda decode gemv: accumulating GEMV matches a double reference", "[cuda]",
                   float, bf16) {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(2026);
  for (int m : {1, 3, 8}) {
    for (int k : {192, 768, 776}) {
      // n = 4 * 50 + 3 and 4 * 192 + 3: the last block partly empty.
      for (int n : {203, 771}) {
        for (Base b : {Base::kY, Base::kSeparateResidual, Base::kResidualIsY}) {
          CheckGemvAccumulate<TestType>(m, n, k, b, rng);
        }
      }
    }
  }
  // The down projection's k (F = 2048 in the 128M model).
  CheckGemvAccumulate<TestType>(8, 771, 2048, Base::kY, rng);
}

// The largest k (a multiple of 8) PlanDecodeGemv takes for 8 rows of T.
template <typename T>
int LargestPlannedK(kernels::DecodeGemvKind kind) {
  for (int k = 8192; k > 0; k -= kernels::kDecodeGemvKAlign) {
    if (kernels::PlanDecodeGemv({kind, 8, 256, k, static_cast<int64_t>(sizeof(T))}).ok()) {
      return k;
    }
  }
  return 0;
}

TEMPLATE_TEST_CASE("cuda decode gemv: the largest k the plan takes at 8 rows launches, the "
                   "next is refused",
                   "[cuda]", float, bf16) {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  // A shape the plan takes must launch: its shared memory (normed rows and
  // reduction scratch, all dynamic) fits the 48 KiB a launch gets without
  // opting in. Before the scratch was counted the plan took bf16 k = 3072
  // (fp32 1536), whose launch the static scratch pushed past the limit.
  // 8 k e + 288 <= 49152 (kernels/decode_gemv_plan.h): bf16 3048, fp32 1520.
  using S = Storage<TestType>;
  using H = typename S::Host;
  const int want = std::is_same_v<TestType, float> ? 1520 : 3048;
  for (auto kind : {kernels::DecodeGemvKind::kNorm, kernels::DecodeGemvKind::kNormSwiGlu}) {
    INFO(kernels::DecodeGemvKindName(kind));
    REQUIRE(LargestPlannedK<TestType>(kind) == want);
  }
  std::mt19937 rng(3048);
  CheckNormGemv<TestType>(8, want, {109}, rng);
  CheckNormGemvSwiGlu<TestType>(8, want, 203, rng);
  // k + 8 launches nothing: the output keeps its sentinel.
  const int k = want + kernels::kDecodeGemvKAlign, n = 64;
  const std::vector<float> h = RandomFloats(static_cast<size_t>(8) * k, rng, -3.f, 3.f);
  const HostTensor<TestType> norm_w = RandomTensor<TestType>(k, rng, 0.5f, 1.5f);
  const HostTensor<TestType> w =
      RandomTensor<TestType>(static_cast<size_t>(2) * n * k, rng, -0.1f, 0.1f);
  DeviceBuffer<float> d_h(h);
  DeviceBuffer<H> d_norm(norm_w.raw), d_w(w.raw);
  const std::vector<H> sentinel(static_cast<size_t>(8) * n, S::From(42.f));
  DeviceBuffer<H> d_out(sentinel);
  kernels::NormGemvParams<TestType> p;
  p.h = d_h.get();
  p.norm_w = d_norm.template as<const TestType>();
  p.eps = 1e-5f;
  p.w = d_w.template as<const TestType>();
  p.m = 8;
  p.k = k;
  p.out[0] = d_out.template as<TestType>();
  p.cols[0] = n;
  CHECK(kernels::LaunchNormGemv(p, nullptr) == cudaErrorInvalidValue);
  CHECK(kernels::LaunchNormGemvSwiGlu(d_h.get(), d_norm.template as<const TestType>(), 1e-5f,
                                      d_w.template as<const TestType>(), 8, n, k,
                                      d_out.template as<TestType>(),
                                      nullptr) == cudaErrorInvalidValue);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(d_out.Download() == sentinel);
}

TEST_CASE("cuda decode gemv: bad shapes and pointers launch nothing", "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(5);
  const int k = 192, n = 64;
  const std::vector<float> h = RandomFloats(9 * 768, rng);
  const std::vector<float> w = RandomFloats(static_cast<size_t>(2) * n * 768, rng);
  const std::vector<float> sentinel(9 * 2 * n, 42.f);
  DeviceBuffer<float> d_h(h);
  DeviceBuffer<float> d_w(w);
  DeviceBuffer<float> d_norm(h);
  DeviceBuffer<float> d_y(sentinel);
  auto launch_norm = [&](int m, int kk, const float* weights) {
    kernels::NormGemvParams<float> p;
    p.h = d_h.get();
    p.norm_w = d_norm.get();
    p.eps = 1e-5f;
    p.w = weights;
    p.m = m;
    p.k = kk;
    p.out[0] = d_y.get();
    p.cols[0] = n;
    return kernels::LaunchNormGemv(p, nullptr);
  };
  CHECK(launch_norm(9, k, d_w.get()) == cudaErrorInvalidValue);      // m > 8
  CHECK(launch_norm(0, k, d_w.get()) == cudaErrorInvalidValue);      // no rows
  CHECK(launch_norm(1, 196, d_w.get()) == cudaErrorInvalidValue);    // k % 8 != 0
  CHECK(launch_norm(1, k, d_w.get() + 1) == cudaErrorInvalidValue);  // W not 16-byte aligned
  CHECK(launch_norm(1, k, nullptr) == cudaErrorInvalidValue);
  CHECK(kernels::LaunchNormGemvSwiGlu(d_h.get(), d_norm.get(), 1e-5f, d_w.get(), 9, n, k,
                                      d_y.get(), nullptr) == cudaErrorInvalidValue);
  CHECK(kernels::LaunchNormGemvSwiGlu(d_h.get(), d_norm.get(), 1e-5f, d_w.get(), 1, n, 100,
                                      d_y.get(), nullptr) == cudaErrorInvalidValue);
  CHECK(kernels::LaunchGemvAccumulate(d_h.get(), d_w.get(), nullptr, 9, n, k, d_y.get(),
                                      nullptr) == cudaErrorInvalidValue);
  CHECK(kernels::LaunchGemvAccumulate(d_h.get() + 2, d_w.get(), nullptr, 1, n, k, d_y.get(),
                                      nullptr) == cudaErrorInvalidValue);  // x misaligned
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(d_y.Download() == sentinel);
}

TEST_CASE("cuda decode gemv: a captured graph replays the eager launches' bits", "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  // Norm GEMV -> accumulate, norm SwiGLU -> accumulate: a decoder layer's
  // fused launches, captured on a stream, against the same run eagerly.
  std::mt19937 rng(9);
  const int m = 1, d = 768, f = 2048;
  const std::vector<float> h = RandomFloats(static_cast<size_t>(m) * d, rng, -3.f, 3.f);
  const HostTensor<bf16> norm = RandomTensor<bf16>(d, rng, 0.5f, 1.5f);
  const HostTensor<bf16> wq = RandomTensor<bf16>(static_cast<size_t>(d) * d, rng, -0.05f, 0.05f);
  const HostTensor<bf16> wo = RandomTensor<bf16>(static_cast<size_t>(d) * d, rng, -0.05f, 0.05f);
  const HostTensor<bf16> wgu =
      RandomTensor<bf16>(static_cast<size_t>(2) * f * d, rng, -0.05f, 0.05f);
  const HostTensor<bf16> wd = RandomTensor<bf16>(static_cast<size_t>(d) * f, rng, -0.05f, 0.05f);
  DeviceBuffer<uint16_t> d_norm(norm.raw), d_wq(wq.raw), d_wo(wo.raw), d_wgu(wgu.raw),
      d_wd(wd.raw);
  DeviceBuffer<uint16_t> d_q(static_cast<size_t>(m) * d), d_act(static_cast<size_t>(m) * f);
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto layer = [&](float* y) -> cudaError_t {
    kernels::NormGemvParams<bf16> p;
    p.h = y;
    p.norm_w = d_norm.as<const bf16>();
    p.eps = 1e-5f;
    p.w = d_wq.as<const bf16>();
    p.m = m;
    p.k = d;
    p.out[0] = d_q.as<bf16>();
    p.cols[0] = d;
    cudaError_t e = kernels::LaunchNormGemv(p, stream);
    if (e == cudaSuccess) {
      e = kernels::LaunchGemvAccumulate(d_q.as<const bf16>(), d_wo.as<const bf16>(), nullptr, m,
                                        d, d, y, stream);
    }
    if (e == cudaSuccess) {
      e = kernels::LaunchNormGemvSwiGlu(y, d_norm.as<const bf16>(), 1e-5f,
                                        d_wgu.as<const bf16>(), m, f, d, d_act.as<bf16>(),
                                        stream);
    }
    if (e == cudaSuccess) {
      e = kernels::LaunchGemvAccumulate(d_act.as<const bf16>(), d_wd.as<const bf16>(), nullptr,
                                        m, d, f, y, stream);
    }
    return e;
  };
  DeviceBuffer<float> eager(h), replayed(h);
  CUDA_REQUIRE(layer(eager.get()));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const cudaError_t captured = layer(replayed.get());
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  CUDA_REQUIRE(captured);
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  // Nothing ran during the capture: replayed still holds h.
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(replayed.Download() == h);
  CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  const std::vector<float> a = eager.Download(), b = replayed.Download();
  CHECK(a != h);
  CHECK(a == b);
  CUDA_REQUIRE(cudaGraphExecDestroy(exec));
  CUDA_REQUIRE(cudaGraphDestroy(graph));
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace drt::cuda_test

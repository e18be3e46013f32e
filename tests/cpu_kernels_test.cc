// Every fp32 CPU kernel (engine/cpu/kernels.h) against a naive double-precision
// twin written straight from the math in docs/drt-model.md. Inputs are random
// N(0,1) with fixed seeds; tolerances are those of fp32 arithmetic.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/cpu/kernels.h"
#include "engine/cpu/window_cache.h"

namespace {

using drt::cpu::GcaBlock;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> Randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Checks |got - want| <= rel*|want| + abs elementwise, with one assertion per
// call and the worst offender in the message.
void CheckClose(const std::vector<float>& got, const std::vector<double>& want, double rel,
                double abs, const std::string& what) {
  REQUIRE(got.size() == want.size());
  if (got.empty()) return;
  size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = rel * std::fabs(want[i]) + abs;
    const double excess = std::isnan(got[i]) ? std::numeric_limits<double>::infinity() : err - tol;
    if (!(err <= tol)) ++bad;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  std::ostringstream msg;
  msg.precision(9);
  msg << what << ": " << bad << " of " << got.size() << " out of tolerance (rel " << rel
      << ", abs " << abs << "); worst at " << worst << ": got " << got[worst] << ", want "
      << want[worst];
  INFO(msg.str());
  CHECK(bad == 0);
}

double NaiveSlope(int64_t h, int64_t num_heads) {
  return 1.0 / std::pow(std::pow(2.0, 8.0 / static_cast<double>(num_heads)),
                        static_cast<double>(h + 1));
}

// ---------------------------------------------------------------------------
// Naive twins.

std::vector<double> NaiveLinear(const std::vector<float>& x, int64_t n, int64_t in,
                                const std::vector<float>& w, int64_t out) {
  std::vector<double> y(n * out);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double s = 0.0;
      for (int64_t k = 0; k < in; ++k) s += double(x[i * in + k]) * double(w[o * in + k]);
      y[i * out + o] = s;
    }
  }
  return y;
}

std::vector<double> NaiveRmsNorm(const std::vector<float>& x, int64_t n, int64_t d,
                                 const std::vector<float>& w, double eps) {
  std::vector<double> y(n * d);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0.0;
    for (int64_t j = 0; j < d; ++j) ss += double(x[i * d + j]) * double(x[i * d + j]);
    const double inv = 1.0 / std::sqrt(ss / double(d) + eps);
    for (int64_t j = 0; j < d; ++j) y[i * d + j] = double(x[i * d + j]) * inv * double(w[j]);
  }
  return y;
}

// Causal sliding-window ALiBi attention; query i is at key index
// num_keys - n + i and sees keys [pos - window, pos].
std::vector<double> NaiveWindowAttention(const std::vector<float>& q, int64_t n,
                                         const std::vector<float>& k,
                                         const std::vector<float>& v, int64_t num_keys,
                                         int64_t num_heads, int64_t kv_heads, int64_t dh,
                                         int64_t window) {
  const int64_t qs = num_heads * dh, ks = kv_heads * dh;
  const int64_t group = num_heads / kv_heads;
  std::vector<double> out(n * qs, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = num_keys - n + i;
    const int64_t lo = std::max<int64_t>(0, pos - window);
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t kvh = h / group;
      const double slope = NaiveSlope(h, num_heads);
      std::vector<double> s;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = lo; j <= pos; ++j) {
        double dot = 0.0;
        for (int64_t e = 0; e < dh; ++e)
          dot += double(q[i * qs + h * dh + e]) * double(k[j * ks + kvh * dh + e]);
        const double score = dot / std::sqrt(double(dh)) - slope * double(pos - j);
        s.push_back(score);
        mx = std::max(mx, score);
      }
      double den = 0.0;
      for (double& x : s) den += (x = std::exp(x - mx));
      for (int64_t j = lo; j <= pos; ++j) {
        const double p = s[j - lo] / den;
        for (int64_t e = 0; e < dh; ++e)
          out[i * qs + h * dh + e] += p * double(v[j * ks + kvh * dh + e]);
      }
    }
  }
  return out;
}

std::vector<double> NaiveRope(const std::vector<float>& x, int64_t num_blocks, int64_t rows,
                              int64_t heads, int64_t dh, double theta) {
  const int64_t half = dh / 2, stride = heads * dh;
  std::vector<double> y(x.begin(), x.end());
  for (int64_t b = 0; b < num_blocks; ++b) {
    for (int64_t p = 0; p < rows; ++p) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = (b * rows + p) * stride + h * dh;
        for (int64_t f = 0; f < half; ++f) {
          const double inv_freq = std::pow(theta, -2.0 * double(f) / double(dh));
          const double angle = double(p) * inv_freq;
          const double x1 = x[base + f], x2 = x[base + f + half];
          y[base + f] = x1 * std::cos(angle) - x2 * std::sin(angle);
          y[base + f + half] = x2 * std::cos(angle) + x1 * std::sin(angle);
        }
      }
    }
  }
  return y;
}

std::vector<double> NaiveBlockAttention(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int64_t num_blocks,
                                        int64_t rows, int64_t heads, int64_t dh) {
  const int64_t stride = heads * dh;
  std::vector<double> out(num_blocks * rows * stride, 0.0);
  for (int64_t b = 0; b < num_blocks; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < rows; ++i) {
        std::vector<double> s(rows);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < rows; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < dh; ++e)
            dot += double(q[(b * rows + i) * stride + h * dh + e]) *
                   double(k[(b * rows + j) * stride + h * dh + e]);
          s[j] = dot / std::sqrt(double(dh));
          mx = std::max(mx, s[j]);
        }
        double den = 0.0;
        for (double& x : s) den += (x = std::exp(x - mx));
        for (int64_t j = 0; j < rows; ++j)
          for (int64_t e = 0; e < dh; ++e)
            out[(b * rows + i) * stride + h * dh + e] +=
                s[j] / den * double(v[(b * rows + j) * stride + h * dh + e]);
      }
    }
  }
  return out;
}

// GCA of one block, written with the off-by-one explicitly: the chunk's last
// row (the landmark, stored as zeros) is NOT read; it enters as exp(0 - max)
// in the denominator only, with max taken over the real scores and 0.
std::vector<double> NaiveGca(const std::vector<float>& q, int64_t n,
                             const std::vector<const float*>& chunk_k,
                             const std::vector<const float*>& chunk_v,
                             const std::vector<float>& weights, int64_t rows_per_chunk,
                             int64_t heads, int64_t dh) {
  const int64_t stride = heads * dh;
  const int64_t real = rows_per_chunk - 1;
  std::vector<double> out(n * stride, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      for (size_t c = 0; c < chunk_k.size(); ++c) {
        std::vector<double> s(real);
        double mx = 0.0;  // the zero row's score
        for (int64_t j = 0; j < real; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < dh; ++e)
            dot += double(q[r * stride + h * dh + e]) * double(chunk_k[c][j * stride + h * dh + e]);
          s[j] = dot / std::sqrt(double(dh));
          mx = std::max(mx, s[j]);
        }
        double den = std::exp(0.0 - mx);
        for (double& x : s) den += (x = std::exp(x - mx));
        for (int64_t j = 0; j < real; ++j)
          for (int64_t e = 0; e < dh; ++e)
            out[r * stride + h * dh + e] +=
                double(weights[c]) * s[j] / den * double(chunk_v[c][j * stride + h * dh + e]);
      }
    }
  }
  return out;
}

std::vector<float> RunWindowAttention(const std::vector<float>& q, int64_t n,
                                      const std::vector<float>& k, const std::vector<float>& v,
                                      int64_t num_keys, int64_t heads, int64_t kv_heads,
                                      int64_t dh, int64_t window, int threads) {
  drt::cpu::ThreadPool pool(threads);
  std::vector<float> out(n * heads * dh, kNaN);
  drt::cpu::WindowAttention(q.data(), n, k.data(), v.data(), num_keys, heads, kv_heads, dh,
                            window, out.data(), pool);
  return out;
}

bool RowEqual(const std::vector<float>& a, const std::vector<float>& b, int64_t row,
              int64_t width) {
  return std::equal(a.begin() + row * width, a.begin() + (row + 1) * width, b.begin() + row * width);
}

}  // namespace

// ---------------------------------------------------------------------------

TEST_CASE("Linear matches a naive matmul on both split paths", "[kernels]") {
  drt::cpu::UseSingleThreadedBlas();
  struct Shape {
    int64_t n, in, out;
  };
  // n < 8*threads: the decode path (splits output features; 2-4 rows go
  // through the weights in blocks, of 64 and 32 output features at in = 512
  // and 1024); otherwise rows.
  const std::vector<Shape> shapes = {{1, 64, 33},   {1, 17, 1},    {3, 37, 129},  {7, 128, 256},
                                     {8, 20, 9},    {15, 31, 65},  {16, 64, 50},  {100, 48, 70},
                                     {257, 33, 17}, {33, 256, 3},  {2, 512, 300}, {4, 1024, 101}};
  uint32_t seed = 100;
  for (const Shape& s : shapes) {
    for (int threads : {1, 2}) {
      drt::cpu::ThreadPool pool(threads);
      const auto x = Randn(s.n * s.in, ++seed);
      const auto w = Randn(s.out * s.in, ++seed);
      std::vector<float> y(s.n * s.out, kNaN);
      drt::cpu::Linear(x.data(), s.n, s.in, w.data(), s.out, y.data(), pool);
      const auto want = NaiveLinear(x, s.n, s.in, w, s.out);
      CheckClose(y, want, 1e-5, 1e-5 * std::sqrt(double(s.in)),
                 "Linear n=" + std::to_string(s.n) + " in=" + std::to_string(s.in) +
                     " out=" + std::to_string(s.out) + " threads=" + std::to_string(threads));
    }
  }
}

TEST_CASE("RmsNorm matches the formula, out of place and in place", "[kernels]") {
  drt::cpu::ThreadPool single_pool(1), dual_pool(2);
  drt::cpu::UseSingleThreadedBlas();
  struct Shape {
    int64_t n, d;
  };
  uint32_t seed = 200;
  for (const Shape s : std::vector<Shape>{{1, 1}, {1, 768}, {5, 7}, {17, 64}, {40, 96}}) {
    for (float eps : {1e-5f, 1e-6f}) {
      for (int threads : {1, 2}) {
      drt::cpu::ThreadPool pool(threads);
        const std::string tag = "RmsNorm n=" + std::to_string(s.n) + " d=" + std::to_string(s.d) +
                                " threads=" + std::to_string(threads);
        const auto x = Randn(s.n * s.d, ++seed);
        const auto w = Randn(s.d, ++seed);
        const auto want = NaiveRmsNorm(x, s.n, s.d, w, eps);
        std::vector<float> y(x.size(), kNaN);
        drt::cpu::RmsNorm(x.data(), s.n, s.d, w.data(), eps, y.data(), pool);
        CheckClose(y, want, 1e-5, 1e-6, tag);
        std::vector<float> inplace = x;
        drt::cpu::RmsNorm(inplace.data(), s.n, s.d, w.data(), eps, inplace.data(), pool);
        CheckClose(inplace, want, 1e-5, 1e-6, tag + " in place");
      }
    }
  }
  SECTION("eps matters for small rows") {
    const std::vector<float> x = {1e-3f, -2e-3f};
    const std::vector<float> w = {1.f, 1.f};
    std::vector<float> y(2);
    drt::cpu::RmsNorm(x.data(), 1, 2, w.data(), 1e-5f, y.data(), single_pool);
    CheckClose(y, NaiveRmsNorm(x, 1, 2, w, 1e-5), 1e-5, 1e-7, "RmsNorm tiny row");
  }
}

TEST_CASE("SwiGlu is silu(gate) * up, also aliased", "[kernels]") {
  uint32_t seed = 300;
  for (int64_t n : {int64_t{1}, int64_t{100}, int64_t{70000}}) {  // 70000 > the OpenMP threshold
    for (int threads : {1, 2}) {
      drt::cpu::ThreadPool pool(threads);
      auto gate = Randn(n, ++seed, 3.f);
      const auto up = Randn(n, ++seed);
      if (n >= 4) {  // saturated ends of silu
        gate[0] = 30.f;
        gate[1] = -30.f;
        gate[2] = 100.f;
        gate[3] = -100.f;
      }
      std::vector<double> want(n);
      for (int64_t i = 0; i < n; ++i) {
        const double g = gate[i];
        want[i] = g / (1.0 + std::exp(-g)) * double(up[i]);
      }
      const std::string tag = "SwiGlu n=" + std::to_string(n) + " threads=" + std::to_string(threads);
      std::vector<float> out(n, kNaN);
      drt::cpu::SwiGlu(gate.data(), up.data(), n, out.data(), pool);
      CheckClose(out, want, 1e-5, 1e-6, tag);
      std::vector<float> aliased = gate;
      drt::cpu::SwiGlu(aliased.data(), up.data(), n, aliased.data(), pool);
      CheckClose(aliased, want, 1e-5, 1e-6, tag + " aliased");
    }
  }
}

TEST_CASE("AddInPlace adds elementwise", "[kernels]") {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}}) {
    const auto x = Randn(n, 401);
    const auto y0 = Randn(n, 402);
    std::vector<float> y = y0;
    drt::cpu::AddInPlace(y.data(), x.data(), n);
    bool exact = true;
    for (int64_t i = 0; i < n; ++i) exact = exact && y[i] == y0[i] + x[i];
    INFO("n=" << n);
    CHECK(exact);
  }
}

TEST_CASE("AlibiSlope follows 1/(2^(8/H))^(h+1)", "[kernels]") {
  const std::vector<double> h4 = {1.0 / 4, 1.0 / 16, 1.0 / 64, 1.0 / 256};
  for (int h = 0; h < 4; ++h) CHECK(drt::cpu::AlibiSlope(h, 4) == Approx(h4[h]).epsilon(1e-7));
  for (int h = 0; h < 8; ++h)
    CHECK(drt::cpu::AlibiSlope(h, 8) == Approx(1.0 / std::pow(2.0, h + 1)).epsilon(1e-7));
  // H = 12 (the paper's 128M model): the formula, not the interpolated
  // non-power-of-two slopes of the original ALiBi paper.
  for (int h = 0; h < 12; ++h) {
    const double want = 1.0 / std::pow(std::pow(2.0, 8.0 / 12.0), h + 1);
    CHECK(drt::cpu::AlibiSlope(h, 12) == Approx(want).epsilon(1e-6));
  }
  CHECK(drt::cpu::AlibiSlope(0, 12) == Approx(0.6299605249).epsilon(1e-6));
  CHECK(drt::cpu::AlibiSlope(11, 12) == Approx(1.0 / 256).epsilon(1e-6));
}

TEST_CASE("WindowAttention matches naive causal sliding-window ALiBi attention", "[kernels]") {
  drt::cpu::UseSingleThreadedBlas();
  struct Case {
    int64_t heads, kv_heads, dh, num_keys, n, window;
  };
  const std::vector<Case> cases = {
      {4, 4, 16, 50, 50, 7},      // prefill from position 0, window < num_keys
      {4, 4, 16, 50, 50, 100},    // window larger than num_keys
      {4, 2, 8, 200, 1, 30},      // decode, GQA 2
      {4, 1, 8, 10, 1, 64},       // decode, window > num_keys, one KV head
      {4, 1, 8, 40, 1, 39},       // decode, window == num_keys - 1 (sees everything)
      {4, 2, 16, 300, 150, 40},   // n > 64: crosses the 64-row blocking, past prefix
      {4, 4, 16, 130, 130, 100},  // n > 64 from position 0
      {4, 2, 8, 129, 65, 200},    // 65 rows: one full block + one row
      {6, 3, 8, 90, 70, 16},      // non-power-of-two heads
      {2, 2, 32, 80, 65, 0},      // window 0: each query sees only itself
      {12, 12, 8, 600, 3, 512},   // paper's window and head count
      // Blocks of at most kRowByRowQueryRows (8) rows go row by row, each row
      // over exactly the keys it sees; 9 rows and more through the GEMM.
      {4, 2, 8, 200, 5, 30},      // a small prefill piece after a long past, window clips
      {4, 4, 16, 70, 8, 64},      // 8 rows: the largest row-by-row block
      {4, 2, 8, 12, 9, 100},      // 9 rows: the smallest GEMM block
      {4, 2, 8, 131, 67, 40},     // a full 64-row block, then a 3-row one row by row
  };
  uint32_t seed = 500;
  for (const Case& c : cases) {
    const auto q = Randn(c.n * c.heads * c.dh, ++seed);
    const auto k = Randn(c.num_keys * c.kv_heads * c.dh, ++seed);
    const auto v = Randn(c.num_keys * c.kv_heads * c.dh, ++seed);
    const auto want =
        NaiveWindowAttention(q, c.n, k, v, c.num_keys, c.heads, c.kv_heads, c.dh, c.window);
    for (int threads : {1, 2}) {
      drt::cpu::ThreadPool pool(threads);
      const auto got =
          RunWindowAttention(q, c.n, k, v, c.num_keys, c.heads, c.kv_heads, c.dh, c.window, threads);
      std::ostringstream tag;
      tag << "WindowAttention H=" << c.heads << " KV=" << c.kv_heads << " dh=" << c.dh
          << " keys=" << c.num_keys << " n=" << c.n << " W=" << c.window << " threads=" << threads;
      CheckClose(got, want, 1e-5, 2e-5, tag.str());
    }
  }
}

TEST_CASE("WindowAttention over several slices computes each slice as alone, to the bit",
          "[kernels]") {
  drt::cpu::UseSingleThreadedBlas();
  const int64_t heads = 4, kv_heads = 2, dh = 8, window = 30;
  struct SliceCase {
    int64_t num_keys, n;
  };
  // A decode row, a prefill crossing the 64-row blocking, a slice with no
  // past, a short one with past.
  const std::vector<SliceCase> cases = {{200, 1}, {150, 100}, {20, 20}, {45, 3}};
  std::vector<std::vector<float>> q, k, v, alone, batched;
  uint32_t seed = 900;
  for (const SliceCase& c : cases) {
    q.push_back(Randn(c.n * heads * dh, ++seed));
    k.push_back(Randn(c.num_keys * kv_heads * dh, ++seed));
    v.push_back(Randn(c.num_keys * kv_heads * dh, ++seed));
    alone.push_back(RunWindowAttention(q.back(), c.n, k.back(), v.back(), c.num_keys, heads,
                                       kv_heads, dh, window, 2));
    batched.emplace_back(c.n * heads * dh, kNaN);
  }
  std::vector<drt::cpu::WindowAttentionSlice> slices;
  for (size_t i = 0; i < cases.size(); ++i) {
    drt::cpu::WindowAttentionSlice slice;
    slice.q = q[i].data();
    slice.n = cases[i].n;
    slice.keys = k[i].data();
    slice.values = v[i].data();
    slice.num_keys = cases[i].num_keys;
    slice.out = batched[i].data();
    slices.push_back(slice);
  }
  drt::cpu::ThreadPool pool(2);
  drt::cpu::WindowAttention(slices, heads, kv_heads, dh, window, pool);
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("slice " << i);
    REQUIRE(batched[i] == alone[i]);
  }
}

TEST_CASE("WindowCache keeps the window in one stretch, and a small push right after it",
          "[kernels]") {
  // Against a plain list of every row pushed: after each push (of sizes
  // that fill the buffer's slack, move the rows to its start several times,
  // and exceed the window), CopyOut gives the last `capacity` rows, and
  // after a push of at most the slack, RecentKeys gives the window as it
  // was before the push followed by the pushed rows, in one stretch. Skip
  // moves on as a push would (its rows are whatever the slots held).
  // Capacities 1, 4 and 8 are windows no larger than the slack (8 rows at
  // least), where a push of at most the slack can exceed the window and
  // must still keep the window before it adjacent (the in-place reads of
  // CpuStep::Attention rely on it).
  CHECK(drt::cpu::WindowCache::SlackRows(1) == drt::cpu::kInPlaceWindowRows);
  CHECK(drt::cpu::WindowCache::SlackRows(12) == 8);  // kInPlaceWindowRows: more than a quarter
  CHECK(drt::cpu::WindowCache::SlackRows(128) == 32);     // a quarter
  CHECK(drt::cpu::WindowCache::SlackRows(8192) == 256);   // capped
  const int64_t width = 3;
  for (int64_t capacity : {int64_t{1}, int64_t{4}, int64_t{8}, int64_t{12}}) {
    INFO("capacity " << capacity);
    const int64_t slack = drt::cpu::WindowCache::SlackRows(capacity);
    drt::cpu::WindowCache cache(capacity, width);
    std::vector<float> all_keys, all_values;  // every row pushed, in order
    float next = 1.f;
    const std::vector<int64_t> pushes = {1, 3, 8, 2, 1, 1, 5, 7, 8, 12, 1, 20,
                                         4, 8, 8, 8, 1, 13, 1, 1, 9, 5, 8, 1};
    for (size_t step = 0; step < pushes.size(); ++step) {
      const int64_t n = pushes[step];
      INFO("push " << step << " of " << n << " rows");
      std::vector<float> keys(n * width), values(n * width);
      for (int64_t i = 0; i < n * width; ++i) {
        keys[i] = next;
        values[i] = -next;
        next += 1.f;
      }
      const int64_t before = cache.size();
      const int64_t rows_before = static_cast<int64_t>(all_keys.size()) / width;
      REQUIRE(cache.CanReadInPlace(n) == (n <= slack));
      cache.Push(keys.data(), values.data(), n);
      all_keys.insert(all_keys.end(), keys.begin(), keys.end());
      all_values.insert(all_values.end(), values.begin(), values.end());
      const int64_t total = rows_before + n;
      REQUIRE(cache.size() == std::min(capacity, total));
      std::vector<float> got_k(cache.size() * width), got_v(cache.size() * width);
      cache.CopyOut(got_k.data(), got_v.data());
      CHECK(std::equal(got_k.begin(), got_k.end(), all_keys.end() - cache.size() * width));
      CHECK(std::equal(got_v.begin(), got_v.end(), all_values.end() - cache.size() * width));
      if (n <= slack) {
        const int64_t recent = before + n;
        REQUIRE(cache.recent_rows() >= recent);
        CHECK(std::equal(cache.RecentKeys(recent), cache.RecentKeys(recent) + recent * width,
                         all_keys.end() - recent * width));
        CHECK(std::equal(cache.RecentValues(recent), cache.RecentValues(recent) + recent * width,
                         all_values.end() - recent * width));
      }
    }
  }
  const int64_t capacity = 12;
  drt::cpu::WindowCache cache(capacity, width);
  std::vector<float> all_keys;
  for (int64_t i = 0; i < 20 * width; ++i) all_keys.push_back(static_cast<float>(i + 1));
  std::vector<float> all_values(all_keys.size(), 0.f);
  cache.Push(all_keys.data(), all_values.data(), 20);
  // Skip: the window keeps its size and the rows pushed after it are the
  // newest.
  cache.Skip(5);
  CHECK(cache.size() == capacity);
  std::vector<float> last = {1000.f, 1001.f, 1002.f}, last_v = {-1.f, -2.f, -3.f};
  cache.Push(last.data(), last_v.data(), 1);
  std::vector<float> got_k(capacity * width), got_v(capacity * width);
  cache.CopyOut(got_k.data(), got_v.data());
  CHECK(std::equal(last.begin(), last.end(), got_k.end() - width));
  // The rows before the skip that are still in the window: 12 - 5 - 1 = 6.
  CHECK(std::equal(got_k.begin(), got_k.begin() + 6 * width, all_keys.end() - 6 * width));
}

TEST_CASE("WindowAttention ignores keys outside the window and in the future", "[kernels]") {
  drt::cpu::UseSingleThreadedBlas();
  const int64_t heads = 4, kv_heads = 2, dh = 8, width = heads * dh;
  const int64_t num_keys = 100, window = 10;
  const int64_t kv_width = kv_heads * dh;
  // n = 1 and 5 go row by row (at most kRowByRowQueryRows), 64 is one GEMM
  // block, 67 a block and a remainder of 3 rows, 80 a block and 16.
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{64}, int64_t{67}, int64_t{80}}) {
    const auto q = Randn(n * width, 601 + n);
    const auto k = Randn(num_keys * kv_width, 602 + n);
    const auto v = Randn(num_keys * kv_width, 603 + n);
    const auto base = RunWindowAttention(q, n, k, v, num_keys, heads, kv_heads, dh, window, 2);
    const int64_t last = n - 1, last_pos = num_keys - 1;

    // The key just outside the last query's window: that row is unchanged.
    const int64_t outside = last_pos - window - 1;
    auto k2 = k, v2 = v;
    for (int64_t e = 0; e < kv_width; ++e) {
      k2[outside * kv_width + e] += 50.f;
      v2[outside * kv_width + e] -= 50.f;
    }
    const auto perturbed =
        RunWindowAttention(q, n, k2, v2, num_keys, heads, kv_heads, dh, window, 2);
    INFO("n=" << n);
    CHECK(RowEqual(base, perturbed, last, width));
    if (n > 1) CHECK_FALSE(RowEqual(base, perturbed, last - 1, width));  // inside its window

    // The oldest key inside the window (distance == window) does count.
    const int64_t edge = last_pos - window;
    auto k3 = k;
    for (int64_t e = 0; e < kv_width; ++e) k3[edge * kv_width + e] += 5.f;
    const auto edge_out = RunWindowAttention(q, n, k3, v, num_keys, heads, kv_heads, dh, window, 2);
    CHECK_FALSE(RowEqual(base, edge_out, last, width));

    // Causality: the newest key only reaches the last query.
    auto v4 = v;
    for (int64_t e = 0; e < kv_width; ++e) v4[last_pos * kv_width + e] += 50.f;
    const auto future = RunWindowAttention(q, n, k, v4, num_keys, heads, kv_heads, dh, window, 2);
    for (int64_t r = 0; r + 1 < n; ++r) CHECK(RowEqual(base, future, r, width));
    CHECK_FALSE(RowEqual(base, future, last, width));
  }
}

TEST_CASE("ApplyRope rotates halves, every block from position 0", "[kernels]") {
  drt::cpu::ThreadPool single_pool(1), dual_pool(2);
  struct Case {
    int64_t blocks, rows, heads, dh;
    double theta;
  };
  const std::vector<Case> cases = {{1, 5, 2, 8, 10000.0},
                                   {3, 64, 3, 16, 10000.0},
                                   {2, 64, 2, 64, 10000.0},
                                   {4, 7, 1, 32, 500000.0}};
  uint32_t seed = 700;
  for (const Case& c : cases) {
    for (int threads : {1, 2}) {
      drt::cpu::ThreadPool pool(threads);
      const int64_t width = c.heads * c.dh;
      auto x = Randn(c.blocks * c.rows * width, ++seed);
      // Block 1 (when present) repeats block 0's input: same positions, same output.
      if (c.blocks > 1) std::copy_n(x.begin(), c.rows * width, x.begin() + c.rows * width);
      const auto want = NaiveRope(x, c.blocks, c.rows, c.heads, c.dh, c.theta);
      auto got = x;
      drt::cpu::ApplyRope(got.data(), c.blocks, c.rows, c.heads, c.dh, c.theta, pool);
      std::ostringstream tag;
      tag << "ApplyRope blocks=" << c.blocks << " rows=" << c.rows << " heads=" << c.heads
          << " dh=" << c.dh << " theta=" << c.theta << " threads=" << threads;
      // Angles reach ~rows radians, so fp32 angle rounding costs ~rows*6e-8.
      CheckClose(got, want, 3e-5, 3e-5, tag.str());
      INFO(tag.str());
      // Position 0 of every block is the identity.
      for (int64_t b = 0; b < c.blocks; ++b)
        CHECK(std::equal(got.begin() + b * c.rows * width, got.begin() + b * c.rows * width + width,
                         x.begin() + b * c.rows * width));
      if (c.blocks > 1)
        CHECK(std::equal(got.begin(), got.begin() + c.rows * width, got.begin() + c.rows * width));
    }
  }
  SECTION("a hand-computed rotation") {
    // dh = 4: pairs (x0, x2) at inv_freq 1 and (x1, x3) at inv_freq theta^(-1/2) = 0.01.
    std::vector<float> x = {0, 0, 0, 0, 1, 2, 3, 4};  // rows 0 and 1 of one head
    drt::cpu::ApplyRope(x.data(), 1, 2, 1, 4, 10000.0, single_pool);
    const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
    CHECK(x[4] == Approx(1 * c1 - 3 * s1).margin(1e-6));
    CHECK(x[5] == Approx(2 * c2 - 4 * s2).margin(1e-6));
    CHECK(x[6] == Approx(3 * c1 + 1 * s1).margin(1e-6));
    CHECK(x[7] == Approx(4 * c2 + 2 * s2).margin(1e-6));
  }
}

TEST_CASE("BlockAttention is bidirectional attention within each block", "[kernels]") {
  drt::cpu::ThreadPool single_pool(1), dual_pool(2);
  drt::cpu::UseSingleThreadedBlas();
  struct Case {
    int64_t blocks, rows, heads, dh;
  };
  uint32_t seed = 800;
  for (const Case c : std::vector<Case>{{1, 64, 2, 16}, {3, 5, 3, 8}, {2, 64, 4, 32}, {4, 1, 2, 8}}) {
    const int64_t width = c.heads * c.dh, total = c.blocks * c.rows * width;
    const auto q = Randn(total, ++seed), k = Randn(total, ++seed), v = Randn(total, ++seed);
    const auto want = NaiveBlockAttention(q, k, v, c.blocks, c.rows, c.heads, c.dh);
    for (int threads : {1, 2}) {
      drt::cpu::ThreadPool pool(threads);
      std::vector<float> out(total, kNaN);
      drt::cpu::BlockAttention(q.data(), k.data(), v.data(), c.blocks, c.rows, c.heads, c.dh,
                               out.data(), pool);
      std::ostringstream tag;
      tag << "BlockAttention blocks=" << c.blocks << " rows=" << c.rows << " heads=" << c.heads
          << " dh=" << c.dh << " threads=" << threads;
      CheckClose(out, want, 1e-5, 2e-5, tag.str());
    }
  }
  SECTION("blocks are independent") {
    const int64_t blocks = 2, rows = 64, heads = 2, dh = 16, width = heads * dh;
    const int64_t total = blocks * rows * width, per_block = rows * width;
    const auto q = Randn(total, 851), k = Randn(total, 852), v = Randn(total, 853);
    std::vector<float> base(total), changed(total);
    drt::cpu::BlockAttention(q.data(), k.data(), v.data(), blocks, rows, heads, dh, base.data(), dual_pool);
    auto q2 = q, k2 = k, v2 = v;
    for (int64_t i = per_block; i < total; ++i) {
      q2[i] *= -2.f;
      k2[i] += 1.f;
      v2[i] += 3.f;
    }
    drt::cpu::BlockAttention(q2.data(), k2.data(), v2.data(), blocks, rows, heads, dh,
                             changed.data(), dual_pool);
    CHECK(std::equal(base.begin(), base.begin() + per_block, changed.begin()));
    CHECK_FALSE(std::equal(base.begin() + per_block, base.end(), changed.begin() + per_block));
  }
  SECTION("the last row of a block sees the first (not causal)") {
    const int64_t rows = 8, heads = 1, dh = 8;
    const auto q = Randn(rows * dh, 861), k = Randn(rows * dh, 862), v = Randn(rows * dh, 863);
    std::vector<float> base(rows * dh), changed(rows * dh);
    drt::cpu::BlockAttention(q.data(), k.data(), v.data(), 1, rows, heads, dh, base.data(), single_pool);
    auto v2 = v;
    for (int64_t e = 0; e < dh; ++e) v2[(rows - 1) * dh + e] += 10.f;  // the last key's value
    drt::cpu::BlockAttention(q.data(), k.data(), v2.data(), 1, rows, heads, dh, changed.data(), single_pool);
    CHECK_FALSE(std::equal(base.begin(), base.begin() + dh, changed.begin()));  // row 0 sees it
  }
}

TEST_CASE("GroupedCrossAttention matches the off-by-one formula", "[kernels]") {
  drt::cpu::ThreadPool single_pool(1), dual_pool(2);
  drt::cpu::UseSingleThreadedBlas();
  for (const auto& [rows_per_chunk, heads, dh, q_scale] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, float>>{
           {64, 3, 16, 1.f}, {64, 2, 64, 1.f}, {4, 2, 8, 1.f}, {64, 2, 16, 6.f}}) {
    const int64_t width = heads * dh;
    uint32_t seed = 900 + static_cast<uint32_t>(rows_per_chunk + heads + dh + q_scale);
    // A pool of chunks; each has its last (landmark) row stored as zeros.
    const int num_pool = 7;
    std::vector<std::vector<float>> pool_k, pool_v;
    for (int c = 0; c < num_pool; ++c) {
      auto kc = Randn(rows_per_chunk * width, ++seed);
      auto vc = Randn(rows_per_chunk * width, ++seed);
      std::fill(kc.end() - width, kc.end(), 0.f);
      std::fill(vc.end() - width, vc.end(), 0.f);
      pool_k.push_back(std::move(kc));
      pool_v.push_back(std::move(vc));
    }
    // Blocks: (n, chunk indices into the pool). Chunks are shared between blocks.
    const std::vector<std::pair<int64_t, std::vector<int>>> spec = {
        {3, {2, 0}}, {1, {}}, {70, {1, 3, 4, 6, 0}}, {5, {5}}, {2, {}}, {1, {6, 2, 1}},
        {0, {4}},  // an empty run of rows must be harmless
        // The row-by-row bound (kRowByRowQueryRows = 8) and the first GEMM run.
        {8, {3, 5, 1}}, {9, {0, 6}}};
    std::vector<std::vector<float>> qs, outs, ws;
    std::vector<std::vector<const float*>> ks, vs;
    for (const auto& [n, idx] : spec) {
      qs.push_back(Randn(n * width, ++seed, q_scale));
      outs.emplace_back(n * width, kNaN);
      auto raw = Randn(idx.size(), ++seed);
      double den = 0.0;
      for (float r : raw) den += std::exp(double(r));
      std::vector<float> w;
      for (float r : raw) w.push_back(static_cast<float>(std::exp(double(r)) / den));
      ws.push_back(w);
      std::vector<const float*> kp, vp;
      for (int i : idx) {
        kp.push_back(pool_k[i].data());
        vp.push_back(pool_v[i].data());
      }
      ks.push_back(kp);
      vs.push_back(vp);
    }
    for (int threads : {1, 2}) {
      drt::cpu::ThreadPool pool(threads);
      std::vector<GcaBlock> blocks;
      for (size_t b = 0; b < spec.size(); ++b) {
        std::fill(outs[b].begin(), outs[b].end(), kNaN);
        GcaBlock g;
        g.q = qs[b].data();
        g.n = spec[b].first;
        g.chunk_k = ks[b].data();
        g.chunk_v = vs[b].data();
        g.weights = ws[b].data();
        g.num_chunks = static_cast<int64_t>(spec[b].second.size());
        g.out = outs[b].data();
        blocks.push_back(g);
      }
      drt::cpu::GroupedCrossAttention(blocks, rows_per_chunk, heads, dh, pool);
      for (size_t b = 0; b < spec.size(); ++b) {
        std::ostringstream tag;
        tag << "GCA rows_per_chunk=" << rows_per_chunk << " heads=" << heads << " dh=" << dh
            << " q_scale=" << q_scale << " threads=" << threads << " block " << b
            << " chunks=" << spec[b].second.size();
        const auto want =
            NaiveGca(qs[b], spec[b].first, ks[b], vs[b], ws[b], rows_per_chunk, heads, dh);
        CheckClose(outs[b], want, 1e-5, 2e-5, tag.str());
        if (spec[b].second.empty()) {
          INFO(tag.str());
          CHECK(std::all_of(outs[b].begin(), outs[b].end(), [](float x) { return x == 0.f; }));
        }
      }
    }
  }
  SECTION("the zero row keeps a softmax-off-by-one: all scores very negative -> output ~ 0") {
    // One chunk of 4 rows, one head, dh 4: real keys point against the query.
    const int64_t rows = 4, dh = 4;
    const std::vector<float> q = {1, 1, 1, 1};
    std::vector<float> k(rows * dh, -20.f), v(rows * dh, 1.f);
    std::fill(k.end() - dh, k.end(), 0.f);
    std::fill(v.end() - dh, v.end(), 0.f);
    const float* kp = k.data();
    const float* vp = v.data();
    const float w = 1.f;
    std::vector<float> out(dh, kNaN);
    GcaBlock g{q.data(), 1, &kp, &vp, &w, 1, out.data()};
    drt::cpu::GroupedCrossAttention(absl::MakeConstSpan(&g, 1), rows, 1, dh, single_pool);
    // scores: -40 for the 3 real rows, 0 for the landmark row.
    const double e = std::exp(-40.0);
    for (float o : out) CHECK(o == Approx(3 * e / (3 * e + 1)).margin(1e-20));
  }
}

// Small ops run their tasks on the calling thread (kDefaultMinParallelMacs):
// a default pool of two wakes its worker only for ops at or above the
// threshold. The same op on pools of two that always split and never split
// gives the same bits at sizes on both sides (the tasks do not depend on the
// choice), and is close to the naive twin.
TEST_CASE("Ops below kDefaultMinParallelMacs run on the caller, to the same bits", "[kernels]") {
  drt::cpu::UseSingleThreadedBlas();
  constexpr int64_t kThreshold = drt::cpu::kDefaultMinParallelMacs;
  drt::cpu::ThreadPool by_default(2), always(2, 0),
      never(2, std::numeric_limits<int64_t>::max());
  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  // Runs op on the three pools; checks their dispatches and bits; returns the
  // default pool's output.
  const auto run_three = [&](int64_t macs, size_t size, const auto& op) {
    std::vector<float> d(size, kNaN), a(size, kNaN), n(size, kNaN);
    const int64_t d0 = by_default.dispatches(), a0 = always.dispatches(), n0 = never.dispatches();
    op(by_default, d.data());
    op(always, a.data());
    op(never, n.data());
    CHECK(by_default.dispatches() - d0 == (macs >= kThreshold ? 1 : 0));
    CHECK(always.dispatches() - a0 == 1);
    CHECK(never.dispatches() - n0 == 0);
    CHECK(same_bits(d, a));
    CHECK(same_bits(d, n));
    return d;
  };
  uint32_t seed = 1200;
  SECTION("Linear") {
    struct Shape {
      int64_t n, in, out;
    };
    // Each path of Linear (one row, a few rows, row bands) below and above.
    for (const Shape s : std::vector<Shape>{{1, 192, 384},
                                            {1, 192, 768},
                                            {3, 128, 192},
                                            {3, 192, 384},
                                            {16, 64, 64},
                                            {16, 128, 128}}) {
      const int64_t macs = s.n * s.in * s.out;
      const std::string tag = "Linear n=" + std::to_string(s.n) + " in=" + std::to_string(s.in) +
                              " out=" + std::to_string(s.out) + " macs=" + std::to_string(macs);
      INFO(tag);
      const auto x = Randn(s.n * s.in, ++seed);
      const auto w = Randn(s.out * s.in, ++seed);
      const auto y = run_three(macs, s.n * s.out, [&](drt::cpu::ThreadPool& pool, float* out) {
        drt::cpu::Linear(x.data(), s.n, s.in, w.data(), s.out, out, pool);
      });
      CheckClose(y, NaiveLinear(x, s.n, s.in, w, s.out), 1e-5, 1e-5 * std::sqrt(double(s.in)),
                 tag);
    }
  }
  SECTION("WindowAttention") {
    struct Case {
      int64_t n, num_keys;  // 4 heads of 48, window 128
    };
    // macs = n * min(keys, window + 64) * 48 * 2 * 4: 73,728 and 294,912.
    for (const Case c : std::vector<Case>{{1, 200}, {4, 300}}) {
      const int64_t heads = 4, dh = 48, window = 128;
      const int64_t macs = c.n * std::min<int64_t>(c.num_keys, window + 64) * dh * 2 * heads;
      INFO("WindowAttention n=" << c.n << " keys=" << c.num_keys << " macs=" << macs);
      const auto q = Randn(c.n * heads * dh, ++seed);
      const auto k = Randn(c.num_keys * heads * dh, ++seed);
      const auto v = Randn(c.num_keys * heads * dh, ++seed);
      const auto o = run_three(macs, c.n * heads * dh, [&](drt::cpu::ThreadPool& pool, float* out) {
        drt::cpu::WindowAttention(q.data(), c.n, k.data(), v.data(), c.num_keys, heads, heads, dh,
                                  window, out, pool);
      });
      CheckClose(o, NaiveWindowAttention(q, c.n, k, v, c.num_keys, heads, heads, dh, window),
                 1e-5, 2e-5, "WindowAttention");
    }
  }
  SECTION("GroupedCrossAttention") {
    const int64_t rows = 65, heads = 4, dh = 48, width = heads * dh;
    // One decode row over 3 chunks (74,880 macs) and over 8 (199,680).
    for (const int64_t num_chunks : {3, 8}) {
      const int64_t macs = num_chunks * rows * dh * 2 * heads;
      INFO("GCA chunks=" << num_chunks << " macs=" << macs);
      std::vector<std::vector<float>> ks, vs;
      std::vector<const float*> kp, vp;
      for (int64_t c = 0; c < num_chunks; ++c) {
        ks.push_back(Randn(rows * width, ++seed));
        vs.push_back(Randn(rows * width, ++seed));
        // The landmark row is stored as zeros (as in the engine's chunk K/V).
        std::fill(ks.back().end() - width, ks.back().end(), 0.f);
        std::fill(vs.back().end() - width, vs.back().end(), 0.f);
      }
      for (int64_t c = 0; c < num_chunks; ++c) {
        kp.push_back(ks[c].data());
        vp.push_back(vs[c].data());
      }
      const std::vector<float> weights(num_chunks, 1.f / static_cast<float>(num_chunks));
      const auto q = Randn(width, ++seed);
      const auto o = run_three(macs, width, [&](drt::cpu::ThreadPool& pool, float* out) {
        GcaBlock g{q.data(), 1, kp.data(), vp.data(), weights.data(), num_chunks, out};
        drt::cpu::GroupedCrossAttention(absl::MakeConstSpan(&g, 1), rows, heads, dh, pool);
      });
      CheckClose(o, NaiveGca(q, 1, kp, vp, weights, rows, heads, dh), 1e-5, 2e-5, "GCA");
    }
  }
}

TEST_CASE("ThreadPool runs every task once, and a call whose tasks the caller took alone returns",
          "[kernels]") {
  // Many short calls in a row: workers woken late for a call the caller
  // already finished must skip it and must not run a later call's tasks twice.
  for (int threads : {2, 3}) {
    drt::cpu::ThreadPool pool(threads);
    for (int64_t n : {2, 3, 7, 64}) {
      for (int call = 0; call < 300; ++call) {
        std::vector<int> hits(n, 0);
        pool.ParallelFor(n, [&](int64_t i) { ++hits[i]; });
        INFO("threads=" << threads << " n=" << n << " call " << call);
        REQUIRE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
      }
    }
  }
}

TEST_CASE("RowDots matches double-precision dots, and a row's score does not depend on its slot",
          "[kernels]") {
  uint32_t seed = 1000;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{37}, int64_t{192}, int64_t{768}}) {
    const int64_t count = 70;
    const auto q = Randn(n, ++seed);
    auto rows = Randn(count * n, ++seed);
    // Row 69 repeats row 3: the same score, bit for bit, in another slot.
    std::copy(rows.begin() + 3 * n, rows.begin() + 4 * n, rows.begin() + 69 * n);
    const float scale = 0.125f;
    std::vector<float> out(count, -1.f);
    drt::cpu::RowDots(q.data(), rows.data(), count, n, scale, out.data());
    for (int64_t j = 0; j < count; ++j) {
      double want = 0.0, mag = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        want += double(q[i]) * double(rows[j * n + i]);
        mag += std::fabs(double(q[i]) * double(rows[j * n + i]));
      }
      // A float sum of n products errs by at most about n * 2^-24 of their
      // magnitude (Higham's gamma_n); 16 lanes make it ~(n/16 + 4) * 2^-24.
      // n * 6e-8 * mag covers both, plus 1 ulp for the scale.
      INFO("n=" << n << " row " << j);
      CHECK(std::fabs(double(out[j]) - scale * want) <= scale * (n * 6e-8 * mag) + 1e-7 * std::fabs(scale * want));
    }
    CHECK(out[69] == out[3]);
    // The same rows scanned in a shorter call (another slot range) score the same.
    std::vector<float> part(count - 5);
    drt::cpu::RowDots(q.data(), rows.data() + 5 * n, count - 5, n, scale, part.data());
    for (int64_t j = 5; j < count; ++j) REQUIRE(part[j - 5] == out[j]);
  }
}

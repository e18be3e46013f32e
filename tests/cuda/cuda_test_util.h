// Helpers of the CUDA kernel tests: the visible skip without a GPU, device
// buffers, bf16 on the host (independent of cuda_bf16.h's conversions), random
// data and error measures.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/device_query.h"

// First statement of every CUDA test: without a usable device, say why and
// return without asserting anything (ctest marks the test skipped).
#define DRT_SKIP_WITHOUT_CUDA_DEVICE()                                                  \
  do {                                                                                  \
    const auto drt_device_count_ = ::drt::cuda::CudaDeviceCount();                      \
    if (!drt_device_count_.ok()) {                                                      \
      WARN("no CUDA device: " << drt_device_count_.status().message() << "; skipping"); \
      return;                                                                           \
    }                                                                                   \
  } while (0)

#define CUDA_REQUIRE(expr)                                                       \
  do {                                                                           \
    const cudaError_t drt_err_ = (expr);                                         \
    INFO(#expr << " -> " << cudaGetErrorName(drt_err_) << ": "                   \
               << cudaGetErrorString(drt_err_));                                 \
    REQUIRE(drt_err_ == cudaSuccess);                                            \
  } while (0)

namespace drt::cuda_test {

// Round to nearest even, as the device's __float2bfloat16_rn.
inline uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float FromBf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// bf16 data with its exact float values (what the reference computes on).
struct Bf16Data {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};

// Uniform in [lo, hi), bf16-rounded; zero is replaced by a small nonzero value
// so that no input is accidentally all zeros.
inline Bf16Data RandomBf16(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Bf16Data d;
  d.bits.resize(n);
  d.values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    float x = dist(rng);
    if (x == 0.f) x = 1e-3f;
    d.bits[i] = ToBf16(x);
    d.values[i] = FromBf16(d.bits[i]);
  }
  return d;
}

inline std::vector<float> RandomFloats(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) {
    x = dist(rng);
    if (x == 0.f) x = 1e-3f;
  }
  return v;
}

// Owning device allocation of n elements of T.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0) {
      void* p = nullptr;
      status_ = cudaMalloc(&p, n * sizeof(T));
      ptr_ = static_cast<T*>(p);
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    if (status_ == cudaSuccess && n_ > 0) {
      status_ = cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  cudaError_t status() const { return status_; }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  template <typename U>
  U* as() const {
    return reinterpret_cast<U*>(ptr_);
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      const cudaError_t err = cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
      INFO("cudaMemcpy DtoH: " << cudaGetErrorString(err));
      REQUIRE(err == cudaSuccess);
    }
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
  cudaError_t status_ = cudaSuccess;
};

inline std::vector<float> Bf16ToFloats(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = FromBf16(bits[i]);
  return out;
}

// max |got - want| / max |want| over the tensor (the error relative to the
// tensor's scale), plus where the worst element is.
struct ErrorReport {
  double max_abs_err = 0;
  double max_abs_ref = 0;
  size_t worst = 0;
  size_t non_finite = 0;
  double relative() const { return max_abs_err / std::max(max_abs_ref, 1e-30); }
  std::string str() const {
    std::ostringstream s;
    s << "max abs err " << max_abs_err << " at " << worst << ", max |ref| " << max_abs_ref
      << ", relative " << relative() << ", non-finite " << non_finite;
    return s.str();
  }
};

template <typename Got>
ErrorReport CompareToReference(const std::vector<Got>& got, const std::vector<double>& want) {
  ErrorReport r;
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    // A non-finite output counts as an infinite error and stays the worst: a
    // NaN must not be overwritten by a later finite error (which `!(err <=
    // max)` alone would do), so relative() fails every tolerance.
    const bool finite = std::isfinite(g);
    if (!finite) ++r.non_finite;
    const double err = finite ? std::abs(g - want[i]) : INFINITY;
    if (err > r.max_abs_err) {
      r.max_abs_err = err;
      r.worst = i;
    }
    r.max_abs_ref = std::max(r.max_abs_ref, std::abs(want[i]));
  }
  return r;
}

// bf16 storage with fp32 accumulation: rounding an output to bf16 (8
// significant bits) moves it by at most 2^-8 = 0.0039 of its magnitude, so
// 1e-2 of the tensor's largest reference value leaves a 2.5x margin while
// still catching errors of about 1% (e.g. a dropped softmax term).
constexpr double kBf16Tolerance = 1e-2;

}  // namespace drt::cuda_test

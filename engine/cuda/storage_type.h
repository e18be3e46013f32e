// The CUDA backend's storage types (CudaPrecision, engine/cuda/cuda_options.h):
// the device type T (float or __nv_bfloat16) that weights, activations, window
// rings and retrieved chunks are kept in, and the host type of the same bits
// (the pinned chunk store, the weight upload).
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "engine/cuda/host/bf16.h"

namespace drt::cuda {

using bf16 = __nv_bfloat16;

template <typename T>
struct StorageTraits;

template <>
struct StorageTraits<bf16> {
  using HostElement = Bf16Bits;
  static HostElement FromFloat(float x) { return FloatToBf16(x); }
  static constexpr const char* kName = "bf16";
};

template <>
struct StorageTraits<float> {
  using HostElement = float;
  static HostElement FromFloat(float x) { return x; }
  static constexpr const char* kName = "fp32";
};

template <typename T>
using HostElement = typename StorageTraits<T>::HostElement;

static_assert(sizeof(HostElement<bf16>) == sizeof(bf16));
static_assert(sizeof(HostElement<float>) == sizeof(float));

}  // namespace drt::cuda

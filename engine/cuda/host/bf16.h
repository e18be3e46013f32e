// bfloat16 as raw bits on the host (no CUDA header): the CUDA backend's
// storage type for weights, window rings and chunk K/V (drt-model.md,
// "Numerics").
#pragma once

#include <cstdint>
#include <cstring>

namespace drt::cuda {

using Bf16Bits = uint16_t;

// Round to nearest even, as __float2bfloat16 does; NaN stays a (quiet) NaN.
inline Bf16Bits FloatToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<Bf16Bits>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<Bf16Bits>((bits + rounding) >> 16);
}

inline float Bf16ToFloat(Bf16Bits b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

}  // namespace drt::cuda

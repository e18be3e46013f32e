#include "engine/finite_scan.h"

#include <cstring>

namespace drt {
namespace {

// Elements per block: each block is tested with a branch-free loop the
// compiler vectorises; only a block that has a hit is searched for its first
// one.
constexpr size_t kBlock = 1024;

template <typename Bits, Bits kExponent>
bool AnyNonFinite(const std::byte* data, size_t count) {
  Bits hits = 0;
  for (size_t i = 0; i < count; ++i) {
    Bits bits;
    std::memcpy(&bits, data + i * sizeof(Bits), sizeof(Bits));  // unaligned load
    hits |= static_cast<Bits>((bits & kExponent) == kExponent);
  }
  return hits != 0;
}

template <typename Bits, Bits kExponent>
int64_t FirstNonFiniteOf(const std::byte* data, size_t count) {
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = count - begin < kBlock ? count - begin : kBlock;
    const std::byte* block = data + begin * sizeof(Bits);
    if (!AnyNonFinite<Bits, kExponent>(block, n)) continue;
    for (size_t i = 0; i < n; ++i) {
      Bits bits;
      std::memcpy(&bits, block + i * sizeof(Bits), sizeof(Bits));
      if ((bits & kExponent) == kExponent) return static_cast<int64_t>(begin + i);
    }
  }
  return -1;
}

}  // namespace

int64_t FirstNonFinite(const std::byte* data, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return FirstNonFiniteOf<uint32_t, 0x7F800000u>(data, count);
    case DType::kF16:
      return FirstNonFiniteOf<uint16_t, 0x7C00u>(data, count);
    case DType::kBF16:
      return FirstNonFiniteOf<uint16_t, 0x7F80u>(data, count);
    case DType::kI32:
    case DType::kI64:
      return -1;
  }
  return -1;
}

}  // namespace drt

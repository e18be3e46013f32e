// Finds NaN and infinity in stored float tensors by their bits, without
// converting: an IEEE value is not finite exactly when its exponent field is
// all ones (F32: bits 23..30, F16: bits 10..14, BF16: bits 7..14). The
// loader runs it once over every weight (engine/model_weights.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/safetensors.h"

namespace drt {

// The index of the first element of `count` little-endian `dtype` values at
// `data` (any alignment) that is NaN or +-infinity, or -1 when all are
// finite. Integer dtypes have no such values: -1.
int64_t FirstNonFinite(const std::byte* data, size_t count, DType dtype);

}  // namespace drt

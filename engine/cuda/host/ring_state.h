// The CUDA backend's session state in the floats of the state format
// (engine/session_state.h): element conversions, and a window ring laid out
// as the kernels keep it turned into a WindowState (oldest row first) and
// back. Plain C++ (no CUDA header), so the index arithmetic is tested without
// a GPU (tests/ring_state_test.cc).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/cuda/host/bf16.h"
#include "engine/session_state.h"

namespace drt::cuda {

// The storage element (Bf16Bits, or float in fp32 precision) as a float and
// back. bf16 -> float -> bf16 is exact (every bf16 is a float, and rounding
// a float that is one changes nothing); float -> bf16 rounds to nearest even.
inline float ElementToFloat(float x) { return x; }
inline float ElementToFloat(Bf16Bits b) { return Bf16ToFloat(b); }
template <typename Element>
Element ElementFromFloat(float x);
template <>
inline float ElementFromFloat<float>(float x) { return x; }
template <>
inline Bf16Bits ElementFromFloat<Bf16Bits>(float x) { return FloatToBf16(x); }

template <typename Element>
void ElementsToFloats(const Element* in, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = ElementToFloat(in[i]);
}
template <typename Element>
void FloatsToElements(const float* in, int64_t count, Element* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = ElementFromFloat<Element>(in[i]);
}

// A decoder layer's window ring (engine/cuda/session_buffers.h WindowRing):
// [slots][width] keys and values; position p is in slot p % slots
// (kernels/window_attention.h). A ring at `position` holds positions
// position - slots + 1 .. position - 1 (those written so far).
struct RingShape {
  int64_t slots = 0;
  int64_t width = 0;  // kv_width
};

// The last `rows` positions before `position` (rows = WindowStateRows, at
// most min(slots - 1, position)), oldest first, into `out` as floats.
template <typename Element>
void RingToWindow(const Element* ring_keys, const Element* ring_values, RingShape shape,
                  int64_t position, int64_t rows, WindowState& out);

// The inverse: writes each of w's rows (positions position - w.rows ..
// position - 1) into its slot of [slots][width] ring_keys/ring_values, which
// the caller zeroed; the other slots are not read before they are written.
// INVALID_ARGUMENT (nothing written) when w's rows do not fit the ring or
// the position, or its sizes are not rows x width.
template <typename Element>
absl::Status WindowToRing(const WindowState& w, RingShape shape, int64_t position,
                          Element* ring_keys, Element* ring_values);

}  // namespace drt::cuda

#include "engine/cuda/host/ring_state.h"

#include "absl/strings/str_format.h"

namespace drt::cuda {

template <typename Element>
void RingToWindow(const Element* ring_keys, const Element* ring_values, RingShape shape,
                  int64_t position, int64_t rows, WindowState& out) {
  const int64_t width = shape.width;
  out.rows = rows;
  out.keys.resize(rows * width);
  out.values.resize(rows * width);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t slot = (position - rows + i) % shape.slots;
    ElementsToFloats(ring_keys + slot * width, width, out.keys.data() + i * width);
    ElementsToFloats(ring_values + slot * width, width, out.values.data() + i * width);
  }
}

template <typename Element>
absl::Status WindowToRing(const WindowState& w, RingShape shape, int64_t position,
                          Element* ring_keys, Element* ring_values) {
  const int64_t width = shape.width;
  // Rows of one ring are distinct slots only up to slots - 1 of them (the
  // kernels keep one slot more than the window: kernels/window_attention.h).
  if (w.rows < 0 || w.rows > position || w.rows >= shape.slots) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a window of %d rows does not fit a ring of %d slots at position %d", w.rows,
        shape.slots, position));
  }
  if (static_cast<int64_t>(w.keys.size()) != w.rows * width ||
      static_cast<int64_t>(w.values.size()) != w.rows * width) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a window of %d rows holds %d keys and %d values; %d each expected", w.rows,
        w.keys.size(), w.values.size(), w.rows * width));
  }
  for (int64_t i = 0; i < w.rows; ++i) {
    const int64_t slot = (position - w.rows + i) % shape.slots;
    FloatsToElements(w.keys.data() + i * width, width, ring_keys + slot * width);
    FloatsToElements(w.values.data() + i * width, width, ring_values + slot * width);
  }
  return absl::OkStatus();
}

template void RingToWindow<float>(const float*, const float*, RingShape, int64_t, int64_t,
                                  WindowState&);
template void RingToWindow<Bf16Bits>(const Bf16Bits*, const Bf16Bits*, RingShape, int64_t,
                                     int64_t, WindowState&);
template absl::Status WindowToRing<float>(const WindowState&, RingShape, int64_t, float*, float*);
template absl::Status WindowToRing<Bf16Bits>(const WindowState&, RingShape, int64_t, Bf16Bits*,
                                             Bf16Bits*);

}  // namespace drt::cuda

// The index arithmetic and number conversions of the CUDA backend's state
// export (engine/cuda/host/ring_state.h), without a GPU: a window ring filled
// as the ring-write kernel fills it (kernels/window_attention.h) must export
// the rows the CPU backend's WindowCache exports for the same pushes, and
// import back into the slots the kernel reads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cpu/window_cache.h"
#include "engine/cuda/host/ring_state.h"
#include "engine/model_config.h"
#include "engine/session_state.h"

namespace drt::cuda {
namespace {

// The ring-write kernel's rule, written out naively: of n new rows starting
// at position first, the last min(n, slots) go to slot position % slots.
template <typename Element>
void KernelRingWrite(const std::vector<Element>& keys, const std::vector<Element>& values,
                     int64_t n, int64_t first, RingShape shape, std::vector<Element>& ring_keys,
                     std::vector<Element>& ring_values) {
  const int64_t count = std::min(n, shape.slots);
  for (int64_t i = n - count; i < n; ++i) {
    const int64_t slot = (first + i) % shape.slots;
    for (int64_t j = 0; j < shape.width; ++j) {
      ring_keys[slot * shape.width + j] = keys[i * shape.width + j];
      ring_values[slot * shape.width + j] = values[i * shape.width + j];
    }
  }
}

// Row `position`'s value at column j: distinct for every (position, column)
// of a test, and exact in float.
float KeyAt(int64_t position, int64_t j) { return static_cast<float>(position * 16 + j) + 0.25f; }
float ValueAt(int64_t position, int64_t j) { return -KeyAt(position, j); }

TEST_CASE("ring export equals the CPU window cache's for the same pushes", "[cuda_state]") {
  for (int64_t window : {0, 1, 5, 37}) {
    CAPTURE(window);
    ModelConfig config;
    config.slide_window = window;
    const int64_t capacity = std::max<int64_t>(1, window);  // the CPU backend's
    const RingShape shape{capacity + 1, 4};                 // SessionSizes: W + 1 slots
    std::vector<float> ring_keys(shape.slots * shape.width, std::nanf("")),
        ring_values(shape.slots * shape.width, std::nanf(""));
    cpu::WindowCache cache(capacity, shape.width);
    int64_t position = 0;
    // Pieces shorter and longer than the ring, wrapping it many times.
    const std::vector<int64_t> pieces = {1, 3,      2 * window + 5, 1, 1, window + 1,
                                         7, window, 1,              3 * window + 2, 2};
    for (int64_t n : pieces) {
      if (n == 0) continue;
      std::vector<float> keys(n * shape.width), values(n * shape.width);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < shape.width; ++j) {
          keys[i * shape.width + j] = KeyAt(position + i, j);
          values[i * shape.width + j] = ValueAt(position + i, j);
        }
      }
      KernelRingWrite(keys, values, n, position, shape, ring_keys, ring_values);
      cache.Push(keys.data(), values.data(), n);
      position += n;
      CAPTURE(position);

      const int64_t rows = WindowStateRows(config, position);
      REQUIRE(rows == cache.size());
      WindowState exported;
      RingToWindow(ring_keys.data(), ring_values.data(), shape, position, rows, exported);
      WindowState cpu;
      cpu.rows = cache.size();
      cpu.keys.resize(cpu.rows * shape.width);
      cpu.values.resize(cpu.rows * shape.width);
      cache.CopyOut(cpu.keys.data(), cpu.values.data());
      REQUIRE(exported.rows == cpu.rows);
      REQUIRE(exported.keys == cpu.keys);  // no NaN: only written slots are read
      REQUIRE(exported.values == cpu.values);
      // Oldest first: the last row is position - 1's.
      REQUIRE(exported.keys.back() == KeyAt(position - 1, shape.width - 1));

      // Imported into a zeroed ring, the CPU's window fills exactly the
      // slots the attention kernel reads for the next position (keys
      // position - W .. position - 1), with the kernel's values.
      std::vector<float> back_keys(ring_keys.size(), 0.f), back_values(ring_values.size(), 0.f);
      REQUIRE(WindowToRing(cpu, shape, position, back_keys.data(), back_values.data()).ok());
      for (int64_t p = std::max<int64_t>(0, position - window); p < position; ++p) {
        const int64_t slot = p % shape.slots;
        for (int64_t j = 0; j < shape.width; ++j) {
          REQUIRE(back_keys[slot * shape.width + j] == KeyAt(p, j));
          REQUIRE(back_values[slot * shape.width + j] == ValueAt(p, j));
        }
      }
      WindowState again;
      RingToWindow(back_keys.data(), back_values.data(), shape, position, rows, again);
      REQUIRE(again.keys == cpu.keys);
      REQUIRE(again.values == cpu.values);
    }
  }
}

TEST_CASE("bf16 -> float -> bf16 is exact for every non-NaN value", "[cuda_state]") {
  int64_t checked = 0;
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const Bf16Bits b = static_cast<Bf16Bits>(bits);
    const float f = ElementToFloat(b);
    if (std::isnan(f)) continue;
    REQUIRE(ElementFromFloat<Bf16Bits>(f) == b);
    ++checked;
  }
  // 2^16 patterns less the NaNs (exponent all ones, mantissa not zero: 2 x 127).
  CHECK(checked == 65536 - 254);
  // A float that is no bf16 rounds to nearest even: 1 + 2^-8 lies halfway
  // between 1 and 1 + 2^-7 and goes to 1 (even mantissa).
  CHECK(ElementFromFloat<Bf16Bits>(1.0f + 1.0f / 256) == ElementFromFloat<Bf16Bits>(1.0f));
  CHECK(ElementToFloat(ElementFromFloat<Bf16Bits>(1.0f + 3.0f / 256)) == 1.0f + 1.0f / 64);
}

TEST_CASE("a bf16 ring round-trips a window of bf16 values exactly", "[cuda_state]") {
  const RingShape shape{9, 8};
  const int64_t position = 23, rows = 8;
  WindowState w;
  w.rows = rows;
  for (int64_t i = 0; i < rows * shape.width; ++i) {
    // Values with at most 8 significant bits are bf16 exactly.
    w.keys.push_back(static_cast<float>((i * 37) % 255) / 64.f - 2.f);
    w.values.push_back(static_cast<float>((i * 91) % 253) * 1024.f);
  }
  std::vector<Bf16Bits> keys(shape.slots * shape.width), values(shape.slots * shape.width);
  REQUIRE(WindowToRing(w, shape, position, keys.data(), values.data()).ok());
  WindowState back;
  RingToWindow(keys.data(), values.data(), shape, position, rows, back);
  CHECK(back.keys == w.keys);
  CHECK(back.values == w.values);
}

TEST_CASE("a window that does not fit the ring is refused and writes nothing", "[cuda_state]") {
  const RingShape shape{5, 2};
  auto window = [&](int64_t rows) {
    WindowState w;
    w.rows = rows;
    w.keys.assign(rows * shape.width, 1.f);
    w.values.assign(rows * shape.width, 1.f);
    return w;
  };
  WindowState short_keys = window(3);
  short_keys.keys.pop_back();
  struct Case {
    const char* name;
    WindowState w;
    int64_t position;
  };
  const Case cases[] = {{"as many rows as slots", window(5), 10},
                        {"more rows than positions", window(3), 2},
                        {"negative rows", window(0), 4},
                        {"keys short of rows x width", short_keys, 10}};
  for (Case c : cases) {
    INFO(c.name);
    if (std::string(c.name) == "negative rows") c.w.rows = -1;
    std::vector<float> keys(shape.slots * shape.width, 7.f), values(keys);
    absl::Status s = WindowToRing(c.w, shape, c.position, keys.data(), values.data());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(keys == std::vector<float>(shape.slots * shape.width, 7.f));
    CHECK(values == keys);
  }
}

}  // namespace
}  // namespace drt::cuda

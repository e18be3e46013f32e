// The kernels' device_first_pos (kernels/window_attention.h, gca_attention.h,
// elementwise.h LaunchCopyRowsAtChunkOffset): the launches a CUDA decode
// graph replays read the step's position from device memory. Each case runs
// a kernel twice on the same inputs, once with the position given on the
// host and once with the host field at 0 and the position in a device
// scalar: the outputs must be bit-identical (the same arithmetic on the
// same values), and would differ if the device value were ignored (position
// 0 sees other keys, slots and rows). Bad combinations are refused.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/elementwise.h"
#include "kernels/gca_attention.h"
#include "kernels/window_attention.h"
#include "tests/cuda/cuda_test_util.h"

namespace drt::cuda_test {
namespace {

using kernels::bf16;

// decode_splits values this device runs: 0 (row kernel), 1, and 8 with
// thread block clusters (compute capability 9.0+).
std::vector<int> DecodeKernelVariants() {
  int device = 0;
  int major = 0;
  CUDA_REQUIRE(cudaGetDevice(&device));
  CUDA_REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major >= 9) return {0, 1, 8};
  WARN("compute capability " << major << ".x: decode_splits 8 not tested");
  return {0, 1};
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Window attention `p` (its first_pos the step's position) into out_host;
// then with first_pos 0 and the position read from `device_pos` into
// out_device: bit-identical. Then with no device position (position 0):
// another answer, so that the check could fail.
template <typename T, typename Host>
void CheckWindowReadsDevicePosition(kernels::WindowAttentionParams<T> p, const int64_t* device_pos,
                                    DeviceBuffer<Host>& out_host, DeviceBuffer<Host>& out_device) {
  p.out = out_host.template as<T>();
  CUDA_REQUIRE(kernels::LaunchWindowAttention(p, nullptr));
  p.first_pos = 0;
  p.device_first_pos = device_pos;
  p.out = out_device.template as<T>();
  CUDA_REQUIRE(kernels::LaunchWindowAttention(p, nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(SameBits(out_host.Download(), out_device.Download()));
  p.device_first_pos = nullptr;
  CUDA_REQUIRE(kernels::LaunchWindowAttention(p, nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK_FALSE(SameBits(out_host.Download(), out_device.Download()));
}

TEST_CASE("cuda device position: window attention and ring write read it bit-identically",
          "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(91);
  const int heads = 4, kv_heads = 2, head_dim = 64, window = 100, ring_slots = window + 1;
  const int kv_width = kv_heads * head_dim;
  for (int splits : DecodeKernelVariants()) {
    for (int64_t first_pos : {int64_t{5}, int64_t{99}, int64_t{100}, int64_t{357}}) {
      for (int n : {1, 3}) {
        INFO("decode_splits " << splits << " first_pos " << first_pos << " n " << n);
        const Bf16Data q = RandomBf16(static_cast<size_t>(n) * heads * head_dim, rng, -2.f, 2.f);
        const Bf16Data k_new = RandomBf16(static_cast<size_t>(n) * kv_width, rng);
        const Bf16Data v_new = RandomBf16(static_cast<size_t>(n) * kv_width, rng);
        // Every slot of the ring holds some key: what position 0 would see
        // differs from what first_pos sees.
        const Bf16Data k_ring = RandomBf16(static_cast<size_t>(ring_slots) * kv_width, rng);
        const Bf16Data v_ring = RandomBf16(static_cast<size_t>(ring_slots) * kv_width, rng);
        DeviceBuffer<uint16_t> d_q(q.bits), d_k(k_new.bits), d_v(v_new.bits), d_kr(k_ring.bits),
            d_vr(v_ring.bits), out_host(q.bits.size()), out_device(q.bits.size());
        DeviceBuffer<int64_t> d_pos(std::vector<int64_t>{first_pos});
        kernels::WindowAttentionParams<bf16> p;
        p.q = d_q.as<const bf16>();
        p.k_new = d_k.as<const bf16>();
        p.v_new = d_v.as<const bf16>();
        p.k_ring = d_kr.as<const bf16>();
        p.v_ring = d_vr.as<const bf16>();
        p.ring_slots = ring_slots;
        p.window = window;
        p.n = n;
        p.heads = heads;
        p.kv_heads = kv_heads;
        p.head_dim = head_dim;
        p.decode_splits = splits;
        p.first_pos = first_pos;
        CheckWindowReadsDevicePosition(p, d_pos.get(), out_host, out_device);

        // The ring write: the same slots written either way.
        DeviceBuffer<uint16_t> ring_k_host(k_ring.bits), ring_v_host(v_ring.bits),
            ring_k_device(k_ring.bits), ring_v_device(v_ring.bits);
        CUDA_REQUIRE(kernels::LaunchWindowRingWrite(
            d_k.as<const bf16>(), d_v.as<const bf16>(), n, first_pos, ring_slots, kv_heads,
            head_dim, ring_k_host.as<bf16>(), ring_v_host.as<bf16>(), nullptr));
        CUDA_REQUIRE(kernels::LaunchWindowRingWrite(
            d_k.as<const bf16>(), d_v.as<const bf16>(), n, 0, ring_slots, kv_heads, head_dim,
            ring_k_device.as<bf16>(), ring_v_device.as<bf16>(), nullptr, d_pos.get()));
        CUDA_REQUIRE(cudaDeviceSynchronize());
        const std::vector<uint16_t> written = ring_k_host.Download();
        CHECK(SameBits(written, ring_k_device.Download()));
        CHECK(SameBits(ring_v_host.Download(), ring_v_device.Download()));
        // Slot (first_pos + n - 1) % ring_slots holds the last new key.
        const size_t slot = static_cast<size_t>((first_pos + n - 1) % ring_slots);
        CHECK(std::memcmp(written.data() + slot * kv_width,
                          k_new.bits.data() + static_cast<size_t>(n - 1) * kv_width,
                          kv_width * sizeof(uint16_t)) == 0);
      }
    }
  }
}

TEST_CASE("cuda device position: refused outside the decode window kernels", "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  DeviceBuffer<uint16_t> in(std::vector<uint16_t>(1 << 14, 0x3f80));
  DeviceBuffer<uint16_t> out(1 << 14);
  DeviceBuffer<int64_t> d_pos(std::vector<int64_t>{40});
  kernels::WindowAttentionParams<bf16> p;
  p.q = p.k_new = p.v_new = in.as<const bf16>();
  p.out = out.as<bf16>();
  p.ring_slots = 17;
  p.window = 16;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 64;
  p.device_first_pos = d_pos.get();
  p.k_ring = p.v_ring = in.as<const bf16>();
  // The ring is given: 9 rows are refused only because the prefill kernels
  // take their grid from the host position.
  p.n = 9;
  CHECK(kernels::LaunchWindowAttention(p, nullptr) == cudaErrorInvalidValue);
  p.n = 1;
  CUDA_REQUIRE(kernels::LaunchWindowAttention(p, nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  // The ring is read at any device position: it must be given.
  p.k_ring = p.v_ring = nullptr;
  CHECK(kernels::LaunchWindowAttention(p, nullptr) == cudaErrorInvalidValue);
}

// The fp32 instantiations (CudaPrecision::kFp32 sessions capture them too):
// window attention, ring write and GCA, host position against device
// position, bit-identical; position 0 is another answer.
TEST_CASE("cuda device position: fp32 window attention, ring write and GCA", "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(93);
  const int heads = 4, kv_heads = 2, head_dim = 64, window = 100, ring_slots = window + 1;
  const int kv_width = kv_heads * head_dim;
  const int64_t first_pos = 357;
  const int n = 1;
  const std::vector<float> q = RandomFloats(static_cast<size_t>(n) * heads * head_dim, rng, -2.f, 2.f);
  const std::vector<float> k_new = RandomFloats(static_cast<size_t>(n) * kv_width, rng);
  const std::vector<float> v_new = RandomFloats(static_cast<size_t>(n) * kv_width, rng);
  const std::vector<float> k_ring = RandomFloats(static_cast<size_t>(ring_slots) * kv_width, rng);
  const std::vector<float> v_ring = RandomFloats(static_cast<size_t>(ring_slots) * kv_width, rng);
  DeviceBuffer<float> d_q(q), d_k(k_new), d_v(v_new), d_kr(k_ring), d_vr(v_ring),
      out_host(q.size()), out_device(q.size());
  DeviceBuffer<int64_t> d_pos(std::vector<int64_t>{first_pos});
  for (int splits : DecodeKernelVariants()) {
    INFO("decode_splits " << splits);
    kernels::WindowAttentionParams<float> p;
    p.q = d_q.get();
    p.k_new = d_k.get();
    p.v_new = d_v.get();
    p.k_ring = d_kr.get();
    p.v_ring = d_vr.get();
    p.ring_slots = ring_slots;
    p.window = window;
    p.n = n;
    p.heads = heads;
    p.kv_heads = kv_heads;
    p.head_dim = head_dim;
    p.decode_splits = splits;
    p.first_pos = first_pos;
    CheckWindowReadsDevicePosition(p, d_pos.get(), out_host, out_device);
  }
  {
    DeviceBuffer<float> ring_k_host(k_ring), ring_v_host(v_ring), ring_k_device(k_ring),
        ring_v_device(v_ring);
    CUDA_REQUIRE(kernels::LaunchWindowRingWrite(d_k.get(), d_v.get(), n, first_pos, ring_slots,
                                                kv_heads, head_dim, ring_k_host.get(),
                                                ring_v_host.get(), nullptr));
    CUDA_REQUIRE(kernels::LaunchWindowRingWrite(d_k.get(), d_v.get(), n, 0, ring_slots, kv_heads,
                                                head_dim, ring_k_device.get(),
                                                ring_v_device.get(), nullptr, d_pos.get()));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    const std::vector<float> written = ring_k_host.Download();
    CHECK(SameBits(written, ring_k_device.Download()));
    CHECK(SameBits(ring_v_host.Download(), ring_v_device.Download()));
    const size_t slot = static_cast<size_t>(first_pos % ring_slots);
    CHECK(std::memcmp(written.data() + slot * kv_width, k_new.data(),
                      kv_width * sizeof(float)) == 0);
  }
  {
    // Two rows across query chunks 1 and 2 (positions 127, 128): table rows
    // 0 and 1 differ; at position 0 both rows would read row 0.
    const int topk = 3, num_slots = 6, rows = 2;
    const int64_t gca_pos = 127;
    const size_t stride = static_cast<size_t>(heads) * head_dim;
    DeviceBuffer<float> d_ck(RandomFloats(num_slots * 64 * stride, rng)),
        d_cv(RandomFloats(num_slots * 64 * stride, rng));
    DeviceBuffer<int32_t> d_slots(std::vector<int32_t>{0, 1, -1, 2, 4, 5});
    DeviceBuffer<float> d_weights(std::vector<float>{0.6f, 0.4f, 0.f, 0.5f, 0.3f, 0.2f});
    DeviceBuffer<float> gca_q(RandomFloats(rows * stride, rng, -2.f, 2.f)),
        gca_host(rows * stride), gca_device(rows * stride);
    DeviceBuffer<int64_t> d_gca_pos(std::vector<int64_t>{gca_pos});
    kernels::GcaParams<float> p;
    p.q = gca_q.get();
    p.chunk_k = d_ck.get();
    p.chunk_v = d_cv.get();
    p.slots = d_slots.get();
    p.weights = d_weights.get();
    p.topk = topk;
    p.n = rows;
    p.heads = heads;
    p.head_dim = head_dim;
    p.first_pos = gca_pos;
    p.first_query_chunk = gca_pos / 64;
    p.out = gca_host.get();
    CUDA_REQUIRE(kernels::LaunchGcaAttention(p, nullptr));
    p.first_pos = 0;
    p.first_query_chunk = 0;
    p.device_first_pos = d_gca_pos.get();
    p.out = gca_device.get();
    CUDA_REQUIRE(kernels::LaunchGcaAttention(p, nullptr));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(SameBits(gca_host.Download(), gca_device.Download()));
    p.device_first_pos = nullptr;  // positions 0, 1: both rows in table row 0
    CUDA_REQUIRE(kernels::LaunchGcaAttention(p, nullptr));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK_FALSE(SameBits(gca_host.Download(), gca_device.Download()));
  }
}

TEST_CASE("cuda device position: GCA reads it and its query chunk bit-identically", "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937 rng(92);
  const int heads = 4, head_dim = 64, topk = 3, num_slots = 6;
  const size_t stride = static_cast<size_t>(heads) * head_dim;
  const Bf16Data chunk_k = RandomBf16(num_slots * 64 * stride, rng);
  const Bf16Data chunk_v = RandomBf16(num_slots * 64 * stride, rng);
  DeviceBuffer<uint16_t> d_ck(chunk_k.bits), d_cv(chunk_v.bits);
  // Two query chunks' rows: different slots and weights.
  DeviceBuffer<int32_t> d_slots(std::vector<int32_t>{0, 2, 4, 5, 3, -1});
  DeviceBuffer<float> d_weights(std::vector<float>{0.5f, 0.3f, 0.2f, 0.7f, 0.3f, 0.f});
  // One row inside a chunk, two rows across chunks 1 and 2 (positions 127, 128).
  for (const auto& [first_pos, n] : {std::pair<int64_t, int>{70, 1}, {127, 2}, {130, 4}}) {
    INFO("first_pos " << first_pos << " n " << n);
    const Bf16Data q = RandomBf16(static_cast<size_t>(n) * stride, rng, -2.f, 2.f);
    DeviceBuffer<uint16_t> d_q(q.bits), out_host(q.bits.size()), out_device(q.bits.size());
    DeviceBuffer<int64_t> d_pos(std::vector<int64_t>{first_pos});
    kernels::GcaParams<bf16> p;
    p.q = d_q.as<const bf16>();
    p.chunk_k = d_ck.as<const bf16>();
    p.chunk_v = d_cv.as<const bf16>();
    p.slots = d_slots.get();
    p.weights = d_weights.get();
    p.topk = topk;
    p.n = n;
    p.heads = heads;
    p.head_dim = head_dim;
    p.first_pos = first_pos;
    p.first_query_chunk = first_pos / 64;
    p.out = out_host.as<bf16>();
    CUDA_REQUIRE(kernels::LaunchGcaAttention(p, nullptr));
    p.first_pos = 0;
    p.first_query_chunk = 0;
    p.device_first_pos = d_pos.get();
    p.out = out_device.as<bf16>();
    CUDA_REQUIRE(kernels::LaunchGcaAttention(p, nullptr));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(SameBits(out_host.Download(), out_device.Download()));
  }
  // The case across chunks would read the wrong table rows if the device
  // position's chunk were not the first row: check it is not the host's.
  {
    const Bf16Data q = RandomBf16(2 * stride, rng, -2.f, 2.f);
    DeviceBuffer<uint16_t> d_q(q.bits), out_a(q.bits.size()), out_b(q.bits.size());
    DeviceBuffer<int64_t> d_pos(std::vector<int64_t>{127});
    kernels::GcaParams<bf16> p;
    p.q = d_q.as<const bf16>();
    p.chunk_k = d_ck.as<const bf16>();
    p.chunk_v = d_cv.as<const bf16>();
    p.slots = d_slots.get();
    p.weights = d_weights.get();
    p.topk = topk;
    p.n = 2;
    p.heads = heads;
    p.head_dim = head_dim;
    p.out = out_a.as<bf16>();
    p.device_first_pos = d_pos.get();
    CUDA_REQUIRE(kernels::LaunchGcaAttention(p, nullptr));
    p.device_first_pos = nullptr;  // position 0, 1: both rows in table row 0
    p.out = out_b.as<bf16>();
    CUDA_REQUIRE(kernels::LaunchGcaAttention(p, nullptr));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK_FALSE(SameBits(out_a.Download(), out_b.Download()));
  }
  SECTION("refused: prefill rows, or a query chunk other than the position's") {
    DeviceBuffer<uint16_t> d_q(std::vector<uint16_t>(8 * stride, 0x3f80)), out(8 * stride);
    DeviceBuffer<int64_t> d_pos(std::vector<int64_t>{200});
    kernels::GcaParams<bf16> p;
    p.q = d_q.as<const bf16>();
    p.chunk_k = d_ck.as<const bf16>();
    p.chunk_v = d_cv.as<const bf16>();
    p.slots = d_slots.get();
    p.weights = d_weights.get();
    p.topk = topk;
    p.heads = heads;
    p.head_dim = head_dim;
    p.out = out.as<bf16>();
    p.device_first_pos = d_pos.get();
    p.n = 5;
    CHECK(kernels::LaunchGcaAttention(p, nullptr) == cudaErrorInvalidValue);
    p.n = 1;
    p.first_pos = 200;
    p.first_query_chunk = 2;  // 200 / 64 = 3
    CHECK(kernels::LaunchGcaAttention(p, nullptr) == cudaErrorInvalidValue);
    p.first_query_chunk = 3;
    CUDA_REQUIRE(kernels::LaunchGcaAttention(p, nullptr));
    CUDA_REQUIRE(cudaDeviceSynchronize());
  }
}

TEST_CASE("cuda device position: rows enter the open chunk at the device position's row",
          "[cuda]") {
  DRT_SKIP_WITHOUT_CUDA_DEVICE();
  const int d = 8, chunk_rows = 64;
  std::vector<float> src(2 * d);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 1.5f + static_cast<float>(i);
  DeviceBuffer<float> d_src(src);
  for (const auto& [pos, written_rows] :
       {std::pair<int64_t, std::vector<int>>{130, {2, 3}}, {63, {63}}, {64, {0, 1}}}) {
    INFO("position " << pos);
    DeviceBuffer<float> dst(std::vector<float>(chunk_rows * d, -7.f));
    DeviceBuffer<int64_t> d_pos(std::vector<int64_t>{pos});
    CUDA_REQUIRE(kernels::LaunchCopyRowsAtChunkOffset(d_src.get(), 2, d, d_pos.get(), chunk_rows,
                                                      dst.get(), nullptr));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    // Hand-computed: row pos % 64 + i gets source row i while inside the
    // chunk; every other row keeps -7.
    std::vector<float> want(chunk_rows * d, -7.f);
    for (size_t i = 0; i < written_rows.size(); ++i) {
      std::copy_n(src.begin() + i * d, d, want.begin() + written_rows[i] * d);
    }
    CHECK(dst.Download() == want);
  }
  DeviceBuffer<float> dst(chunk_rows * d);
  DeviceBuffer<int64_t> d_pos(std::vector<int64_t>{0});
  CHECK(kernels::LaunchCopyRowsAtChunkOffset(d_src.get(), 65, d, d_pos.get(), chunk_rows,
                                             dst.get(), nullptr) == cudaErrorInvalidValue);
  CHECK(kernels::LaunchCopyRowsAtChunkOffset(d_src.get(), 2, d, nullptr, chunk_rows, dst.get(),
                                             nullptr) == cudaErrorInvalidValue);
}

}  // namespace
}  // namespace drt::cuda_test

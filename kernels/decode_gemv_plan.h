// Which shapes the fused decode GEMV kernels (kernels/decode_gemv.h) take,
// and how a launch splits its work. Plain C++ (no CUDA header): the
// launchers call it, the engine calls it to decide the path and to refuse a
// model at backend creation, and tests/decode_gemv_plan_test.cc tests it
// without a GPU (CudaBackendOptions::decode_fused_gemv; docs/cuda.md, "Fused
// decode GEMVs").
//
// The work split, and why:
// - One warp computes whole dot products: each W row (k elements) is read
//   once, in 16-byte loads strided over the 32 lanes, against all m <= 8
//   input rows at once (m accumulators per W row in registers), then
//   reduced across the warp with shuffles. At m <= 8 a GEMV is a stream of
//   the weights; the inputs are m x k values every warp rereads (shared
//   memory or L1), so one pass over W is the whole cost.
// - The norm kernels (kNorm, kNormSwiGlu) run 256 threads (8 warps) per
//   block: every block first recomputes the RMSNorm of its m input rows
//   (k <= a few thousand: a few KiB of fp32 from L2) into shared memory as
//   T, with the thread-to-element map and the reduction of
//   kernels/elementwise.cu's RmsNormKernel (256 threads), so the normed
//   inputs are bit for bit those LaunchRmsNorm writes.
// - kNorm gives each warp 2 W rows when that still leaves at least
//   kTargetBlocks blocks (one per SM of an H100: 132), else 1: two rows
//   double the loads in flight per lane (a latency-bound stream wants many),
//   but fewer blocks than SMs would leave SMs without work.
// - kNormSwiGlu gives each warp the pair gate row j, up row F + j (two rows
//   already), F / 8 blocks.
// - The norm kernels' shared memory is all dynamic: the normed rows, then
//   the reduction scratch, counted together against the 48 KiB a launch
//   gets by default. Bounded there rather than raised with
//   cudaFuncSetAttribute(MaxDynamicSharedMemorySize): an opt-in must be
//   made for every kernel instantiation on every device before its first
//   launch and outside any graph capture, by every caller (the engine and
//   the kernel tests alike), and no model this server targets needs it
//   (the 128M config's 8 rows of d = 768 bf16 take 12,576 bytes); the
//   limit is bf16 d <= 3048 and fp32 d <= 1520 at 8 rows.
// - kAccumulate (no prologue) runs 128 threads (4 warps), 1 W row per warp:
//   its n is d (768 in the 128M model), and 4 warps per block make
//   d / 4 = 192 blocks, more than the 132 SMs (8 warps would give 96).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace drt::kernels {

// The most rows a fused decode GEMV takes: decode slices have 1, the
// batched step a few; larger slices (prefill) keep cuBLAS.
inline constexpr int kMaxDecodeGemvRows = 8;
// The element alignment of k (16-byte weight loads: 8 bf16 or 4 fp32 per
// load; a multiple of 8 serves both types and every row starts 16-byte
// aligned).
inline constexpr int kDecodeGemvKAlign = 8;
// Shared memory a norm kernel's block may use without opting in to more
// (cudaFuncAttributeMaxDynamicSharedMemorySize): the default limit, which
// holds static and dynamic shared memory together. The norm kernels declare
// no static shared memory: all of theirs is the dynamic allocation the plan
// sizes (shared_bytes below), so this one number bounds it.
inline constexpr int64_t kDecodeGemvMaxSharedBytes = 48 * 1024;
// One block per SM of an H100 SXM (132 SMs): the block count below which a
// launch leaves SMs idle.
inline constexpr int64_t kDecodeGemvTargetBlocks = 132;
inline constexpr int kDecodeGemvNormThreads = 256;  // RmsNormKernel's block
inline constexpr int kDecodeGemvAccumulateThreads = 128;
// The norm kernels' reduction scratch per input row, after the normed rows
// in the same dynamic allocation: one fp32 partial sum of squares per warp
// and the row's fp32 scale (kernels/decode_gemv.cu, NormRowsToShared).
inline constexpr int64_t kDecodeGemvNormScratchBytesPerRow =
    (kDecodeGemvNormThreads / 32 + 1) * 4;

enum class DecodeGemvKind {
  kNorm,        // y = RMSNorm(h) . W^T, output T
  kNormSwiGlu,  // act = silu(RMSNorm(h) . Wg^T) * (RMSNorm(h) . Wu^T), output T
  kAccumulate,  // y (fp32) += x . W^T, or y = residual + x . W^T
};

struct DecodeGemvShape {
  DecodeGemvKind kind = DecodeGemvKind::kNorm;
  int64_t m = 0;  // input rows
  int64_t n = 0;  // output columns (kNormSwiGlu: F; W then has 2F rows)
  int64_t k = 0;  // the reduced dimension
  int64_t element_bytes = 0;  // sizeof(T): 2 (bf16) or 4 (fp32)
};

struct DecodeGemvLaunch {
  int threads = 0;        // per block
  int rows_per_warp = 0;  // W rows (kNormSwiGlu: gate/up pairs) per warp
  int64_t blocks = 0;
  // Dynamic shared memory (the norm kernels' only shared memory): the
  // normed rows, m x k x sizeof(T), then m x kDecodeGemvNormScratchBytesPerRow
  // of reduction scratch. 0 for kAccumulate.
  int64_t shared_bytes = 0;

  // Written out: kernels/ compiles as C++17 under nvcc (no defaulted ==).
  bool operator==(const DecodeGemvLaunch& o) const {
    return threads == o.threads && rows_per_warp == o.rows_per_warp && blocks == o.blocks &&
           shared_bytes == o.shared_bytes;
  }
};

inline const char* DecodeGemvKindName(DecodeGemvKind kind) {
  switch (kind) {
    case DecodeGemvKind::kNorm: return "norm GEMV";
    case DecodeGemvKind::kNormSwiGlu: return "norm GEMV SwiGLU";
    case DecodeGemvKind::kAccumulate: return "accumulating GEMV";
  }
  return "unknown GEMV";
}

// The launch of `shape`, or why the fused kernels cannot take it.
inline absl::StatusOr<DecodeGemvLaunch> PlanDecodeGemv(const DecodeGemvShape& shape) {
  const char* name = DecodeGemvKindName(shape.kind);
  if (shape.m < 1 || shape.m > kMaxDecodeGemvRows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d input rows; the fused decode GEMVs take 1..%d (larger slices use cuBLAS)", name,
        shape.m, kMaxDecodeGemvRows));
  }
  if (shape.n < 1 || shape.k < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: empty shape n=%d k=%d", name, shape.n, shape.k));
  }
  if (shape.k % kDecodeGemvKAlign != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: k=%d is not a multiple of %d: weight rows are read in 16-byte loads, so every "
        "row must start 16-byte aligned",
        name, shape.k, kDecodeGemvKAlign));
  }
  if (shape.element_bytes != 2 && shape.element_bytes != 4) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: element size %d bytes; bf16 (2) or fp32 (4) only", name, shape.element_bytes));
  }
  // Output and weight row indices are int in the kernels.
  const int64_t w_rows = shape.kind == DecodeGemvKind::kNormSwiGlu ? 2 * shape.n : shape.n;
  if (w_rows * shape.k > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: a %d x %d weight is past 2^31 elements", name, w_rows, shape.k));
  }
  DecodeGemvLaunch launch;
  if (shape.kind == DecodeGemvKind::kAccumulate) {
    launch.threads = kDecodeGemvAccumulateThreads;
    launch.rows_per_warp = 1;
  } else {
    launch.threads = kDecodeGemvNormThreads;
    // m x k <= 8 x (2^31 - 1): no overflow in int64.
    launch.shared_bytes =
        shape.m * shape.k * shape.element_bytes + shape.m * kDecodeGemvNormScratchBytesPerRow;
    if (launch.shared_bytes > kDecodeGemvMaxSharedBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %d normed rows of %d x %d bytes and their %d bytes of reduction scratch need "
          "%d bytes of shared memory, past %d",
          name, shape.m, shape.k, shape.element_bytes,
          shape.m * kDecodeGemvNormScratchBytesPerRow, launch.shared_bytes,
          kDecodeGemvMaxSharedBytes));
    }
    const int64_t warps = launch.threads / 32;
    launch.rows_per_warp =
        shape.kind == DecodeGemvKind::kNorm &&
                (shape.n + 2 * warps - 1) / (2 * warps) >= kDecodeGemvTargetBlocks
            ? 2
            : 1;
  }
  const int64_t per_block = launch.threads / 32 * launch.rows_per_warp;
  launch.blocks = (shape.n + per_block - 1) / per_block;
  return launch;
}

// Whether a slice of `rows` rows runs the fused decode GEMVs: the option is
// on and the slice is a decode-sized one (at least 1, at most
// kMaxDecodeGemvRows rows).
inline bool UseDecodeGemv(bool option_on, int64_t rows) {
  return option_on && rows >= 1 && rows <= kMaxDecodeGemvRows;
}

// Every fused launch a model of these sizes makes, at the most rows (the
// most shared memory): OK, or the first refusal, named. Backend creation
// calls it when the option is on, so a model the kernels cannot take is
// refused there instead of at its first decode step.
inline absl::Status CheckDecodeGemvModel(int64_t d, int64_t kv_width, int64_t f,
                                         int64_t element_bytes) {
  const int64_t m = kMaxDecodeGemvRows;
  const DecodeGemvShape shapes[] = {
      {DecodeGemvKind::kNorm, m, d + 2 * kv_width, d, element_bytes},  // Q, K, V
      {DecodeGemvKind::kNorm, m, d, d, element_bytes},                 // the GCA query
      {DecodeGemvKind::kNormSwiGlu, m, f, d, element_bytes},           // gate, up
      {DecodeGemvKind::kAccumulate, m, d, d, element_bytes},           // O, the GCA output
      {DecodeGemvKind::kAccumulate, m, d, f, element_bytes},           // down
  };
  for (const DecodeGemvShape& shape : shapes) {
    absl::StatusOr<DecodeGemvLaunch> launch = PlanDecodeGemv(shape);
    if (!launch.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "decode_fused_gemv cannot run this model (hidden_size %d, kv width %d, "
          "intermediate_size %d): %s",
          d, kv_width, f, launch.status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace drt::kernels

// Options of the CUDA backend. Plain C++ (no CUDA header): the factory and the
// tools that fill it in are built without CUDA too.
#pragma once

#include <cstdint>

namespace drt {

struct CudaBackendOptions {
  int device_index = 0;
  // Upper bound on decoder positions per internal forward batch, as for the
  // CPU backend; device scratch and the retrieved-chunk buffers are sized by it.
  // At most 65536 (MakeCudaBackend refuses more).
  int64_t max_segment_positions = 1024;
  // The sliding-window base LM without retrieval (benchmarks only): no chunk
  // encoder, no landmark scoring, no GCA; the upper layers become plain
  // layers (h = h + MLP(RMSNorm2(h))). Its logits are NOT the model's.
  bool disable_gca = false;
  // Slabs of the pinned host chunk store double up to this many chunks.
  int64_t max_slab_chunks = 1024;
};

}  // namespace drt

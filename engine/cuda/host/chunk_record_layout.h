// What one closed chunk's record in the CUDA backend's host chunk store
// holds (CudaBackendOptions::chunk_store, docs/cuda.md "Chunk store of C"):
// `blocks` blocks of [rows x width] elements of the storage type, one after
// the other. Plain C++, tested without a GPU (tests/host_chunk_store_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/cuda/cuda_options.h"
#include "engine/model_config.h"

namespace drt::cuda {

struct ChunkRecordLayout {
  int64_t rows = 0;    // per block
  int64_t width = 0;   // hidden_size
  int64_t blocks = 0;  // 2: keys, then values; 1: encoder rows

  int64_t block_elements() const { return rows * width; }
  int64_t elements() const { return blocks * rows * width; }
  bool operator==(const ChunkRecordLayout&) const = default;
};

// drt-model.md, Forward pass 4. K/V (CudaChunkStore::kKeysValues): the
// chunk's keys then values, [chunk_positions x d] each, the landmark row
// zero, as GCA reads them. Encoder rows (kEncoderRows): the encoder output C
// after encoder.norm at the chunk's real rows 0..enc_chunk_size-1 (the
// landmark row is not stored: its K/V are zero), half the bytes; K/V are
// made from them on the device after each fetch (K = C W_k^T, V = C W_v^T).
inline ChunkRecordLayout ChunkRecordLayoutFor(const ModelConfig& config, CudaChunkStore store) {
  if (store == CudaChunkStore::kEncoderRows) {
    return ChunkRecordLayout{config.enc_chunk_size, config.hidden_size, 1};
  }
  return ChunkRecordLayout{config.chunk_positions(), config.hidden_size, 2};
}

}  // namespace drt::cuda

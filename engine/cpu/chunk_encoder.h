// The chunk encoder on the CPU (drt-model.md, Forward pass 4), over any
// number of closed chunks at once: they may belong to different sessions,
// since each chunk is encoded on its own.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/cpu/thread_pool.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"

namespace drt::cpu {

struct EncodedChunks {
  // count x chunk_positions x d: the encoder output C (after encoder.norm;
  // the last row of each chunk is the landmark vector). The chunk store
  // keeps it; GCA keys and values are made from it when read
  // (engine/cpu/chunk_kv.h).
  std::vector<float> output;
  // Scratch of the encoder layers' own attention, kept to reuse its memory.
  std::vector<float> layer_keys, layer_values;
};

// `rows`: the count x chunk_positions lower-layer rows of the chunks.
void EncodeChunks(const ModelConfig& config, const ModelWeights& weights, const float* rows,
                  int64_t count, ThreadPool& pool, EncodedChunks& encoded);

}  // namespace drt::cpu

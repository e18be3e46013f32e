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
  // count x chunk_positions x d each: the encoder output C (its last row of
  // each chunk is the landmark vector) and the chunk keys and values, whose
  // landmark rows are zero.
  std::vector<float> output, keys, values;
};

// `rows`: the count x chunk_positions lower-layer rows of the chunks.
void EncodeChunks(const ModelConfig& config, const ModelWeights& weights, const float* rows,
                  int64_t count, ThreadPool& pool, EncodedChunks& encoded);

}  // namespace drt::cpu

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
  // Scratch of the encoder layers, kept to reuse its memory: grown when a
  // call needs more and never shrunk, so a step of the same size or smaller
  // neither zero-fills nor page-faults them again (fresh vectors per call
  // were 12% of a 32K-token prefill's time, 2026-11-25 perf profile).
  std::vector<float> layer_keys, layer_values;
  std::vector<float> normed, queries, attention, gate, up;
};

// `rows`: the count x chunk_positions lower-layer rows of the chunks.
void EncodeChunks(const ModelConfig& config, const ModelWeights& weights, const float* rows,
                  int64_t count, ThreadPool& pool, EncodedChunks& encoded);

}  // namespace drt::cpu

// Retrieval on the CPU (drt-model.md, Forward pass 5): a landmark's hidden
// row, normalised by its group's lmk_norm, scores every strictly earlier
// chunk's landmark; the top k become the selection, with softmax weights
// over their scores. The CUDA twin is engine/cuda/cuda_retrieval.cc.
#pragma once

#include <cstdint>

#include "engine/backend.h"
#include "engine/cpu/chunk_store.h"
#include "engine/cpu/thread_pool.h"

namespace drt::cpu {

// Chunk `chunk`'s landmark (hidden row `row`, hidden_size floats) scores
// chunks [0, chunk) of `store`; `lmk_norm` is the group's norm weight. At
// most top_k chunks, best score first (ties: the earlier chunk); empty for
// chunk 0.
Retrieval RetrieveAtLandmark(const ChunkStore& store, const float* lmk_norm, const float* row,
                             int64_t chunk, int64_t hidden_size, int64_t top_k, ThreadPool& pool);

}  // namespace drt::cpu

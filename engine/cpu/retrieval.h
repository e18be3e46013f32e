// Retrieval on the CPU (drt-model.md, Forward pass 5): a landmark's hidden
// row, normalised by its group's lmk_norm, scores every strictly earlier
// chunk's landmark; the top k become the selection, with softmax weights
// over their scores. The CUDA twin is engine/cuda/cuda_retrieval.cc.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/cpu/chunk_store.h"
#include "engine/cpu/thread_pool.h"

namespace drt::cpu {

// The landmarks of one session in one step, for one group: landmark i's
// hidden row rows[i] (hidden_size floats) closes chunk chunks[i] and scores
// chunks [0, chunks[i]) of `store`; `lmk_norm` is the group's norm weight.
// All of them are scored in one pass over the landmark memory (a GEMM with
// one row per landmark): at long contexts reading the landmarks is the cost,
// and a prefill step has many. Per landmark at most top_k chunks, best score
// first (ties: the earlier chunk); empty for chunk 0.
std::vector<Retrieval> RetrieveAtLandmarks(const ChunkStore& store, const float* lmk_norm,
                                           absl::Span<const float* const> rows,
                                           absl::Span<const int64_t> chunks, int64_t hidden_size,
                                           int64_t top_k, ThreadPool& pool);

}  // namespace drt::cpu

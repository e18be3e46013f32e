// The GCA keys and values of a closed chunk, made from its stored encoder
// rows (drt-model.md, Forward pass 4): K = C W_k^T and V = C W_v^T
// (chunk_k_proj, chunk_v_proj) with the landmark's row of both zero. This is
// the one place on the CPU that states that rule; the chunk store keeps C
// only (engine/session_state.h, ChunkData).
#pragma once

#include "engine/model_config.h"
#include "engine/model_weights.h"

namespace drt::cpu {

// `encoder_rows`: the chunk's enc_chunk_size rows of C [S' x d] (its
// landmark row is not needed: its K/V row is zero). Writes keys and values
// [chunk_positions x d]: rows 0..S'-1 projected, the landmark row
// (LandmarkRowInChunk) zero.
//
// Always one single-threaded GEMM of exactly S' rows per projection, so the
// result of a chunk is bit-identical whichever other chunks are made with it,
// whenever it is made and on however many threads: prefill, piecewise and
// token-by-token decoding, a fork and a restored session must give the same
// logits (tests/session_test.cc and others assert it). Linear's row banding
// depends on how many rows one call holds, and BLAS may round a row
// differently in another band shape, so it is not used here. Callers
// parallelise across chunks. The BLAS library must be single-threaded
// (UseSingleThreadedBlas, done by the CPU backend).
void MakeChunkKeysValues(const ModelConfig& config, const ModelWeights& weights,
                         const float* encoder_rows, float* keys, float* values);

}  // namespace drt::cpu

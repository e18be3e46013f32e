// Constants and small rules of the DRT model that every backend applies
// (drt-model.md, "Forward pass"). They live here once; backends and kernels
// take them from here instead of restating them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "engine/model_config.h"

namespace drt {

// The chunk encoder is a LlamaModel built without the decoder's eps and
// rope_theta, so it uses LlamaConfig's defaults (Forward pass 4).
inline constexpr float kEncoderRmsEps = 1e-6f;
inline constexpr double kEncoderRopeTheta = 10000.0;
// lmk_norms are built with RMSNorm's default eps (Forward pass 5).
inline constexpr float kLandmarkNormEps = 1e-5f;

// Row of a chunk's decoder positions (and of its encoder output) that holds
// its landmark: the last one (Forward pass 1 and 4).
inline int64_t LandmarkRowInChunk(const ModelConfig& config) {
  return config.chunk_positions() - 1;
}

// Rows of a stored chunk that GCA attends over (Forward pass 7). The
// reference zeroes the landmark's K/V row when a chunk spans a multiple of 64
// positions (the off-by-one) but drops the row when it spans one more
// (model/DRT.py, chunk_k handling); the stored row is zero either way.
inline int64_t GcaRowsPerChunk(const ModelConfig& config) {
  const int64_t S = config.chunk_positions();
  return S % 64 == 1 ? S - 1 : S;
}

// Whether decoder position `position` is a landmark slot (Forward pass 1).
inline bool IsLandmarkPosition(const ModelConfig& config, int64_t position) {
  return position % config.chunk_positions() == config.chunk_positions() - 1;
}

// The step size in both units (drt-server's --step_tokens sets the
// backend's Backend::max_step_positions): the decoder positions of whole
// chunks that hold `tokens` real tokens with their landmarks, and the real
// tokens of `positions` positions' whole chunks (at least 1).
inline int64_t StepPositionsForTokens(const ModelConfig& config, int64_t tokens) {
  return (tokens + config.enc_chunk_size - 1) / config.enc_chunk_size * config.chunk_positions();
}
inline int64_t StepTokensForPositions(const ModelConfig& config, int64_t positions) {
  return std::max<int64_t>(1, positions / config.chunk_positions() * config.enc_chunk_size);
}

// Decoder positions (landmarks included) a session holding `real_tokens`
// real tokens has processed: one landmark after every enc_chunk_size tokens.
inline int64_t DecoderPositionsFor(const ModelConfig& config, int64_t real_tokens) {
  return real_tokens + real_tokens / config.enc_chunk_size;
}

}  // namespace drt

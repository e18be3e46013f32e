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

// Rows of its open chunk a session at decoder position `position` holds
// (the chunk's positions before `position`): the first chunk a step of its
// closes starts with them (SlicePlan::open_rows_before).
inline int64_t OpenChunkRows(const ModelConfig& config, int64_t position) {
  return position % config.chunk_positions();
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

// Its inverse: the real tokens among decoder positions [0, position), which
// hold a landmark at every chunk's last position.
inline int64_t RealTokensFor(const ModelConfig& config, int64_t position) {
  return position - position / config.chunk_positions();
}

// The upper-layer reach C: after a step that ends at decoder position E (its
// last row is E - 1), everything a session keeps that the upper layers write
// (each upper layer's window K/V of the last W positions, the selection in
// force per group, the last logits) is the same whether or not the upper
// layers ran on the rows before E - C. So RunStep may run those rows through
// the lower layers and the chunk encoder only (StepPlan::lower_only).
//
// Why (drt-model.md, Forward pass 3-7; W = slide_window, S =
// chunk_positions): the lower layers, the open chunk and the chunk memory
// (Forward pass 3-4) never read an upper layer, so they are exact
// everywhere. Let the upper rows start at T = E - C, with upper windows and
// selections left stale from before the skipped rows. Number the upper
// layers u = 1..U in order; R_u is the first position from which layer u's
// output is exact (R_0 = T, the lower output being exact). Layer u's output
// at p reads
//   - its input at p (exact for p >= R_{u-1}),
//   - its window K/V at [p - W, p], computed from its input there and
//     pushed only by rows that ran (exact for p - W >= R_{u-1} >= T),
//   - the selection serving p in its group g (Forward pass 5): made at the
//     landmark L(p) = the last position of the chunk before p's, L(p) >= p - S,
//     by a row that ran (L(p) >= T), with the query taken at the input of
//     group g, exact for L(p) >= Q_g = R_{(g's first layer) - 1} (>= T).
// So R_u <= max(R_{u-1} + W, Q_g + S) <= R_{u-1} + max(W, S), as Q_g <= R_{u-1}
// inside group g, and R_U <= T + U * max(W, S). The state after the step
// needs: window K/V of every upper layer at [E - W, E), exact when
// R_{U-1} + W <= E; the last logits at E - 1, exact when R_U <= E - 1; the
// selection in force per group, made at the step's last landmark (>= E - S),
// exact when Q_g <= R_{U-1} <= E - S. C = U * max(W, S) + S meets all three.
// We take a margin over it, C = U * (max(W, S) + 1) + 2 * S (386 positions for
// the bundled model: U = 2, W = 128, S = 64); a wrong C is caught by
// tests/upper_cut_test.cc, which shows a smaller reach changes the state.
inline int64_t UpperLayerReach(const ModelConfig& config) {
  const int64_t S = config.chunk_positions();
  return config.num_upper_layers() * (std::max(config.slide_window, S) + 1) + 2 * S;
}

}  // namespace drt

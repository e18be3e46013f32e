// One session's complete state, outside the backend that holds it: what
// durable sessions (--state_dir) and SaveSession/LoadSession write and read
// back. A session restored from it continues bit-identically (same logits)
// to the one it was taken from (docs/state_format.md).
//
// The state is split in two: the small state (bounded independently of the
// context length: windows, open chunk, selections, position, token count,
// last logits) and the closed chunks (landmark + encoder rows each), which
// grow with the context and are written once, as they close.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model_config.h"

namespace drt {

// One closed chunk: the encoder output C of its chunk_positions rows
// (drt-model.md, Forward pass 4), split as landmark [d] = C's landmark row
// and rows [enc_chunk_size x d] = C's real-token rows 0..S'-1, in order.
// Its GCA keys and values are not stored: K = C W_k^T and V = C W_v^T with
// the landmark row zero are made from these when the chunk is read for GCA,
// which halves the bytes a chunk takes (issue 10).
struct ChunkData {
  std::vector<float> landmark, rows;
};

// One decoder layer's sliding-window K/V, oldest row first.
struct WindowState {
  int64_t rows = 0;
  std::vector<float> keys, values;  // rows x kv_width each
};

struct BackendSessionState {
  int64_t position = 0;               // decoder positions processed (landmarks included)
  std::vector<WindowState> windows;   // one per decoder layer, lower then upper
  std::vector<float> open_chunk;      // lower-layer rows of the open chunk: (position % S) x d
  std::vector<Retrieval> selection;   // in force now, per group
};

struct SessionState {
  int64_t num_tokens = 0;
  std::vector<float> last_logits;  // vocab_size floats, empty before any token
  BackendSessionState backend;
};

// Checks a state against the model it is to be loaded into: every size,
// position = num_tokens + one landmark per enc_chunk_size tokens, finite
// last logits, selections naming only closed chunks. INVALID_ARGUMENT naming
// the first mismatch.
absl::Status ValidateSessionState(const SessionState& state, const ModelConfig& config);
absl::Status ValidateChunkData(const ChunkData& chunk, const ModelConfig& config);
// What a backend's ImportState checks of `state` and the `num_chunks` closed
// chunks offered with it: ValidateSessionState for the token count its
// position implies (last logits are not a backend's), and num_chunks equal
// to the state's closed chunks. INVALID_ARGUMENT naming the first mismatch.
absl::Status ValidateBackendSessionState(const BackendSessionState& state, int64_t num_chunks,
                                         const ModelConfig& config);

// Rows a decoder layer's window holds at `position`: the last
// min(max(1, slide_window), position) positions' K/V. Attention at position i
// reads keys i - W .. i (drt-model.md, "What follows for the engine"), so W
// past rows are all a continuation needs (one when W is 0).
int64_t WindowStateRows(const ModelConfig& config, int64_t position);

// Closed chunks of a state: one per chunk_positions() decoder positions.
inline int64_t ClosedChunks(const SessionState& state, const ModelConfig& config) {
  return state.backend.position / config.chunk_positions();
}

// Binary encodings (little-endian; docs/state_format.md, "Small state" and
// "Chunk record"). The small state starts with a magic, its engine state
// version (2), the model's shape and the model's fingerprint
// (ModelConfig::model_fingerprint(), computed on the first encode or
// decode), so a state written for another model is
// refused (FAILED_PRECONDITION) naming the field or both fingerprints when
// decoded, and so is a version-1 state (no fingerprint to check). Both
// return the fingerprint's error (the weights file changed since load).
absl::StatusOr<std::string> EncodeSessionState(const SessionState& state,
                                               const ModelConfig& config);
absl::StatusOr<SessionState> DecodeSessionState(std::string_view bytes, const ModelConfig& config);
// The engine state version this server writes and reads (docs/state_format.md,
// "Versions"); a state of any other version is refused by DecodeSessionState.
inline constexpr uint32_t kEngineStateVersion = 2;
// The engine state version of a small state without decoding the rest: 1 for
// the layout before versions (no magic; it began with the shape field count,
// an i64 8), the version after the magic otherwise; nullopt when `bytes` is
// neither (not an engine state, or too short: damage). Tells a state of
// another engine state version (an upgrade or a rollback: every session of a
// directory at once) from a damaged one (server/state_store.cc, RestoreAll).
std::optional<uint32_t> EngineStateVersionOf(std::string_view bytes);
// What makes a small state another model's: the first shape field that
// differs from this model's, or (the same shape) the fingerprint.
struct StateModelMismatch {
  std::string field;  // a shape field ("hidden_size", ...) or "fingerprint"
  int64_t state_value = 0;  // what the state names
  int64_t model_value = 0;  // what this model has
  uint32_t state_fingerprint = 0;  // the fingerprint the state names
};
// The model a small state was written for, compared with `config`'s without
// decoding the rest: the mismatch when the state's header (magic, version 2,
// shape, fingerprint) is whole and names another model; nullopt when it names
// this model or cannot be read (DecodeSessionState then says what is wrong).
// Tells a state of another model (the server's configuration) from a damaged
// one (server/state_store.cc, RestoreAll).
std::optional<StateModelMismatch> FindStateModelMismatch(std::string_view bytes,
                                                         const ModelConfig& config);
// "hidden_size 192 (fingerprint 1a2b3c4d); this model has hidden_size 128",
// or "fingerprint 1a2b3c4d; this model's is 5e6f7a8b (the same shape, ...)".
std::string DescribeStateModelMismatch(const StateModelMismatch& mismatch);
// A chunk's payload: landmark, then encoder rows, as raw floats:
// chunk_positions() * hidden_size floats.
size_t ChunkPayloadBytes(const ModelConfig& config);
void EncodeChunk(const ChunkData& chunk, std::string& out);
absl::Status DecodeChunk(std::string_view bytes, const ModelConfig& config, ChunkData& out);

}  // namespace drt

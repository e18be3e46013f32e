// CpuSession's export and import of its complete state (engine/session_state.h).
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/cpu/cpu_session.h"
#include "engine/session_state.h"

namespace drt::cpu {

absl::Status CpuSession::ExportState(BackendSessionState& out) const {
  const int64_t d = config_.hidden_size;
  const int64_t kv_width = config_.num_key_value_heads * config_.head_dim();
  out.position = position_;
  out.windows.resize(windows_.size());
  for (size_t l = 0; l < windows_.size(); ++l) {
    WindowState& w = out.windows[l];
    w.rows = windows_[l].size();
    w.keys.resize(w.rows * kv_width);
    w.values.resize(w.rows * kv_width);
    windows_[l].CopyOut(w.keys.data(), w.values.data());
  }
  // Only the rows of the open chunk written so far are state; the rest of
  // open_chunk_ is overwritten before it is read (RunSegment).
  const int64_t open_rows = position_ % config_.chunk_positions();
  out.open_chunk.assign(open_chunk_.begin(), open_chunk_.begin() + open_rows * d);
  out.selection = selection_;
  return absl::OkStatus();
}

absl::Status CpuSession::ReadChunk(int64_t chunk, ChunkData& out) const {
  if (chunk < 0 || chunk >= store_.size()) {
    return absl::OutOfRangeError(
        absl::StrFormat("chunk %d does not exist; the session has %d", chunk, store_.size()));
  }
  const int64_t d = config_.hidden_size;
  const int64_t rows = store_.rows_per_chunk() * d;
  out.landmark.assign(store_.landmark(chunk), store_.landmark(chunk) + d);
  out.rows.assign(store_.encoder_rows(chunk), store_.encoder_rows(chunk) + rows);
  return absl::OkStatus();
}

absl::Status CpuSession::ImportState(const BackendSessionState& state, int64_t num_chunks,
                                     const ChunkReader& read, const ChunkMapper& map) {
  if (position_ != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "state can only be imported into a new session; this one is at position %d", position_));
  }
  if (absl::Status s = ValidateBackendSessionState(state, num_chunks, config_); !s.ok()) {
    return s;
  }
  // Built aside and moved in, so that an error leaves this session as it was.
  ChunkStore store(config_.enc_chunk_size, config_.hidden_size);
  // Whole blocks through the mapping when there is one (the disk tier):
  // their encoder rows are not read into memory. The chunks from the first
  // block it cannot map on are read, like the last, partial block.
  absl::StatusOr<int64_t> mapped = MapLeadingUnits(
      map, ChunkStore::kChunksPerBlock, num_chunks,
      [&store](std::shared_ptr<const MappedChunks> block) {
        return store.AppendMappedBlock(std::move(block));
      });
  if (!mapped.ok()) return mapped.status();
  int64_t c = *mapped;
  ChunkData chunk;
  for (; c < num_chunks; ++c) {
    if (absl::Status s = read(c, chunk); !s.ok()) return s;
    if (absl::Status s = ValidateChunkData(chunk, config_); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("chunk %d: %s", c, s.message()));
    }
    store.Append(chunk.landmark.data(), chunk.rows.data());
  }
  store_ = std::move(store);
  for (size_t l = 0; l < windows_.size(); ++l) {
    const WindowState& w = state.windows[l];
    windows_[l].Push(w.keys.data(), w.values.data(), w.rows);
  }
  std::fill(open_chunk_.begin(), open_chunk_.end(), 0.f);
  std::copy(state.open_chunk.begin(), state.open_chunk.end(), open_chunk_.begin());
  selection_ = state.selection;
  position_ = state.position;
  // Nothing made for another state may serve this one (an import needs a
  // new session today, so this only hardens that rule).
  kv_cache_ = ChunkKvCache(kv_cache_.reserve());
  return absl::OkStatus();
}

}  // namespace drt::cpu

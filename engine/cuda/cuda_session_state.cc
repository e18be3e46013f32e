// CudaSession's export and import of its complete state (engine/session_state.h,
// docs/state_format.md): the twin of engine/cpu/cpu_session_state.cc for
// state that lives on the GPU. Written without a GPU and not yet run on one,
// hence behind CudaBackendOptions::state_export (off by default); the tests
// that check it are tests/cuda_backend/cuda_state_test.cc.
//
// Where each part lives (engine/cuda/cuda_session.h):
// - window rings: device, storage type T, [W + 1 slots][kv_width], position p
//   in slot p % (W + 1); the state holds the last WindowStateRows of them,
//   oldest first (engine/cuda/host/ring_state.h does the index arithmetic);
// - open chunk's lower-layer rows: device, fp32;
// - landmarks: device, fp32, one row per closed chunk;
// - closed chunks' encoder rows C (the state format's ChunkData::rows):
//   the host chunk store of encoder rows, which state_export selects
//   (CudaBackendOptions, EffectiveChunkStore), storage type, written by the
//   store stream's device -> host copies; or, for chunks the disk tier
//   mapped (cuda_disk_tier.cc), the mapping's floats. Their K/V are made on
//   the device when fetched (cuda_retrieval.cc, FetchEncoderRows);
// - selections: host (selection_).
// The state format is fp32: bf16 values are widened exactly on export and
// rounded back exactly on import, so bf16 -> state -> bf16 is the identity,
// and fp32 passes through unchanged.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/cuda/cuda_session.h"
#include "engine/cuda/host/map_host_chunks.h"
#include "engine/cuda/host/ring_state.h"
#include "engine/cuda/status_macros.h"
#include "engine/session_state.h"
#include "kernels/cuda_check.h"

namespace drt::cuda {

template <typename T>
absl::Status CudaSession<T>::CheckStateAccess() const {
  if (!options_.state_export) {
    return absl::UnimplementedError(
        "CUDA session state export and import are off: they are written but have not yet run "
        "on a GPU; drt-server --cuda_state_export (CudaBackendOptions::state_export) turns "
        "them on");
  }
  if (options_.disable_gca) {
    return absl::FailedPreconditionError(
        "a CUDA session without GCA (disable_gca, the benchmark base LM) holds no model state "
        "to export or import");
  }
  if (!failed_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this CUDA session failed earlier and its state is lost: ", failed_.message()));
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device_index), "cudaSetDevice");
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::ExportState(BackendSessionState& out) const {
  DRT_RETURN_IF_ERROR(CheckStateAccess());
  using E = HostElement<T>;
  const int64_t d = sizes_.d;
  const RingShape shape{sizes_.ring_slots, sizes_.kv_width};
  const int64_t rows = WindowStateRows(config_, position_);
  // Every kernel that writes the rings and the open chunk runs on the
  // compute stream: copies queued there come after them, and the host reads
  // the staging only after the stream is synchronised.
  cudaStream_t stream = compute_stream_.get();
  BackendSessionState state;
  state.position = position_;
  state.windows.resize(buffers_.rings.size());
  std::vector<E> ring_keys(shape.slots * shape.width), ring_values(shape.slots * shape.width);
  for (size_t l = 0; l < buffers_.rings.size(); ++l) {
    if (rows > 0) {
      const WindowRing<T>& ring = buffers_.rings[l];
      DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ring_keys.data(), ring.k.get(), ring.k.bytes(),
                                               cudaMemcpyDeviceToHost, stream),
                               "copying window keys to the host");
      DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ring_values.data(), ring.v.get(), ring.v.bytes(),
                                               cudaMemcpyDeviceToHost, stream),
                               "copying window values to the host");
      DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "waiting for the window copies");
    }
    RingToWindow(ring_keys.data(), ring_values.data(), shape, position_, rows, state.windows[l]);
  }
  // Only the rows of the open chunk written so far are state (CloseChunks
  // writes the rest before it reads them).
  const int64_t open_rows = position_ % sizes_.chunk;
  state.open_chunk.resize(open_rows * d);
  if (open_rows > 0) {
    DRT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(state.open_chunk.data(), buffers_.open_chunk.get(),
                        open_rows * d * sizeof(float), cudaMemcpyDeviceToHost, stream),
        "copying the open chunk to the host");
    DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "waiting for the open chunk copy");
  }
  state.selection = selection_;
  out = std::move(state);
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::ReadChunk(int64_t chunk, ChunkData& out) const {
  DRT_RETURN_IF_ERROR(CheckStateAccess());
  if (chunk < 0 || chunk >= chunk_store_.size()) {
    return absl::OutOfRangeError(absl::StrFormat("chunk %d does not exist; the session has %d",
                                                 chunk, chunk_store_.size()));
  }
  const int64_t d = sizes_.d;
  const int64_t elements = chunk_store_.layout().elements();
  // The chunk's rows reach the host store through the store stream's
  // device -> host copies (EncodeChunks), queued after the step's encoder.
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(store_stream_.get()),
                           "waiting for the chunk store copies");
  // Its landmark is written by the encoder on the compute stream.
  out.landmark.resize(d);
  DRT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.landmark.data(), landmarks_.get() + chunk * d, d * sizeof(float),
                      cudaMemcpyDeviceToHost, compute_stream_.get()),
      "copying a landmark to the host");
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_.get()),
                           "waiting for the landmark copy");
  out.rows.resize(elements);
  // A mapped chunk (the disk tier, cuda_disk_tier.cc) is read from its
  // mapping, which holds the floats this function gave when it was written.
  if (const MappedChunks* mapped = mapped_chunks_.Find(chunk); mapped != nullptr) {
    // Through the storage type, so that the values are the ones the device
    // reads (a log written by an fp32 session and restored into bf16 holds
    // floats that bf16 rounds; bf16 values come back unchanged).
    std::vector<HostElement<T>> rounded(elements);
    MappedRowsToElements(*mapped, chunk, elements, rounded.data());
    ElementsToFloats(rounded.data(), elements, out.rows.data());
    return absl::OkStatus();
  }
  if (chunk_store_.released(chunk)) {
    return absl::InternalError(
        absl::StrFormat("chunk %d left the host store but is in no mapping", chunk));
  }
  // The record is the rows in the storage type: widened exactly.
  ElementsToFloats(chunk_store_.record(chunk), elements, out.rows.data());
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::ImportState(const BackendSessionState& state, int64_t num_chunks,
                                         const ChunkReader& read, const ChunkMapper& map) {
  DRT_RETURN_IF_ERROR(CheckStateAccess());
  if (position_ != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "state can only be imported into a new session; this one is at position %d", position_));
  }
  DRT_RETURN_IF_ERROR(ValidateBackendSessionState(state, num_chunks, config_));
  using E = HostElement<T>;
  const int64_t d = sizes_.d;
  const int64_t open_rows = state.position % sizes_.chunk;
  const RingShape shape{sizes_.ring_slots, sizes_.kv_width};
  const int64_t ring_elements = shape.slots * shape.width;

  // Everything that can be refused is refused before the device is written:
  // the landmark matrix's room (growing it changes no state), the rings in
  // their device layout, every chunk read and checked into a store built
  // aside. With `map`, whole units of chunks are mapped (the disk tier:
  // only their landmarks are read) and the rest read into host memory.
  DRT_RETURN_IF_ERROR(EnsureLandmarkCapacity(num_chunks));
  std::vector<E> rings(state.windows.size() * 2 * ring_elements, E{});
  for (size_t l = 0; l < state.windows.size(); ++l) {
    E* keys = rings.data() + 2 * l * ring_elements;
    if (absl::Status s = WindowToRing(state.windows[l], shape, state.position, keys,
                                      keys + ring_elements);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("window of layer %d: %s", l, s.message()));
    }
  }
  HostChunkStore<E> store = NewChunkStore(config_, options_, host_allocator_);
  std::vector<float> landmarks(num_chunks * d);
  const int64_t elements = store.layout().elements();
  std::vector<E> record(elements);
  MappedChunkTable mapped_chunks;
  // The units from the first one the mapper cannot map on are read, like
  // the last, partial unit (MapLeadingUnits).
  const int64_t unit = chunk_map_unit();
  absl::StatusOr<int64_t> mapped_count = MapLeadingUnits(
      map, unit, num_chunks, [&](std::shared_ptr<const MappedChunks> mapped) -> absl::Status {
        const MappedChunks& m = *mapped;
        DRT_RETURN_IF_ERROR(mapped_chunks.CheckNew(m, unit, num_chunks));
        for (int64_t i = m.first(); i < m.first() + unit; ++i) {
          std::copy(m.landmark(i), m.landmark(i) + d, landmarks.begin() + i * d);
        }
        store.AppendReleased(unit);
        mapped_chunks.Add(std::move(mapped));
        return absl::OkStatus();
      });
  if (!mapped_count.ok()) return mapped_count.status();
  int64_t c = *mapped_count;
  // The rest into host records: a chunk's encoder rows in the storage type
  // (its K/V are made on the device when it is fetched).
  ChunkData chunk;
  for (; c < num_chunks; ++c) {
    DRT_RETURN_IF_ERROR(read(c, chunk));
    if (absl::Status s = ValidateChunkData(chunk, config_); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("chunk %d: %s", c, s.message()));
    }
    FloatsToElements(chunk.rows.data(), elements, record.data());
    DRT_RETURN_IF_ERROR(store.AppendRecord(record.data()));
    std::copy(chunk.landmark.begin(), chunk.landmark.end(), landmarks.begin() + c * d);
  }

  // Mapped chunks are fetched through the pinned staging: made now, so that
  // a session short of pinned memory is refused here, unchanged (a staging
  // that is never used changes nothing the session computes).
  if (!mapped_chunks.empty()) DRT_RETURN_IF_ERROR(EnsureStaging());

  // The uploads, on the compute stream, from host vectors that live until
  // the stream is synchronised (also when one fails, so that no copy reads
  // them after they are freed). Should one fail, position_ is still 0 and
  // nothing at position 0 reads what they wrote (no ring row, open row or
  // landmark lies before position 0), so the session is as it was.
  cudaStream_t stream = compute_stream_.get();
  auto upload = [&]() -> absl::Status {
    if (num_chunks > 0) {
      DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(landmarks_.get(), landmarks.data(),
                                               num_chunks * d * sizeof(float),
                                               cudaMemcpyHostToDevice, stream),
                               "uploading landmarks");
    }
    for (size_t l = 0; l < buffers_.rings.size(); ++l) {
      const E* keys_l = rings.data() + 2 * l * ring_elements;
      WindowRing<T>& ring = buffers_.rings[l];
      DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ring.k.get(), keys_l, ring.k.bytes(),
                                               cudaMemcpyHostToDevice, stream),
                               "uploading window keys");
      DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ring.v.get(), keys_l + ring_elements,
                                               ring.v.bytes(), cudaMemcpyHostToDevice, stream),
                               "uploading window values");
    }
    if (open_rows > 0) {
      DRT_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(buffers_.open_chunk.get(), state.open_chunk.data(),
                          open_rows * d * sizeof(float), cudaMemcpyHostToDevice, stream),
          "uploading the open chunk");
    }
    return absl::OkStatus();
  };
  const absl::Status uploaded = upload();
  const cudaError_t synced = cudaStreamSynchronize(stream);
  DRT_RETURN_IF_ERROR(uploaded);
  DRT_CUDA_RETURN_IF_ERROR(synced, "waiting for the state uploads");

  chunk_store_ = std::move(store);
  mapped_chunks_ = std::move(mapped_chunks);
  selection_ = state.selection;
  // No retrieved chunk is on the device: the first step's PrepareGca
  // requests the selections in force, and they are copied in from the
  // store as after any eviction (cuda_retrieval.cc, FetchChunks).
  for (ChunkResidency& r : residency_) r.Clear();
  position_ = state.position;
  // Nothing a decode graph captured has moved (the buffers stay), but the
  // state they hold is another session's: capture afresh rather than rely
  // on that.
  graphs_.Clear();
  return absl::OkStatus();
}

#define DRT_INSTANTIATE_STATE(T)                                                           \
  template absl::Status CudaSession<T>::CheckStateAccess() const;                            \
  template absl::Status CudaSession<T>::ExportState(BackendSessionState&) const;             \
  template absl::Status CudaSession<T>::ReadChunk(int64_t, ChunkData&) const;                \
  template absl::Status CudaSession<T>::ImportState(const BackendSessionState&, int64_t,     \
                                                    const ChunkReader&, const ChunkMapper&);
DRT_INSTANTIATE_STATE(bf16)
DRT_INSTANTIATE_STATE(float)
#undef DRT_INSTANTIATE_STATE

}  // namespace drt::cuda

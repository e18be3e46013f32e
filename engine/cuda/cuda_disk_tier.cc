// CudaSession's disk tier (docs/state_format.md, "Disk tier"): closed chunks
// handed over to mappings of the session's chunk files leave the pinned host
// chunk store, and fetches of them go through a pinned staging buffer. The
// host-side logic (which records are released, the checks, the conversion,
// the staging slots) is engine/cuda/host/map_host_chunks.h and
// chunk_staging.h, tested without a GPU; this file orders it with the
// streams. A mapping holds encoder rows (engine/mapped_chunks.h), so the
// disk tier needs the chunk store of encoder rows, which state_export
// selects (CudaBackendOptions): a fetched mapped chunk's rows go to the
// device staging of FetchEncoderRows, whose GEMMs make its K/V. Written
// without a GPU and not yet run on one, hence behind state_export (off by
// default); tests/cuda_backend/cuda_disk_tier_test.cc checks it on a GPU.
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "engine/cuda/cuda_session.h"
#include "engine/cuda/host/map_host_chunks.h"
#include "engine/cuda/status_macros.h"
#include "kernels/cuda_check.h"

namespace drt::cuda {
namespace {

// Chunks a fetch can have converted ahead of their copies before it waits
// for the oldest copy to finish (a group fetches up to top-k chunks).
constexpr int64_t kStagingSlots = 8;

}  // namespace

template <typename T>
absl::Status CudaSession<T>::MapChunks(std::shared_ptr<const MappedChunks> chunks) {
  // UNIMPLEMENTED naming the flag without state_export (chunk_map_unit() is
  // 0 then), FAILED_PRECONDITION without GCA or after a failure. The disk
  // tier replaces host records; a device-tier session has none
  // (MakeCudaBackend refuses the device tier with state_export, so this is
  // a second line).
  DRT_RETURN_IF_ERROR(CheckStateAccess());
  // After CheckStateAccess, so that a session without state_export gets the
  // documented UNIMPLEMENTED first.
  if (device_tier_) {
    return absl::FailedPreconditionError(
        "MapChunks: this session keeps its chunks in the device tier (--cuda_chunk_tier), "
        "which the disk tier (--cuda_state_export) cannot map");
  }
  if (chunks == nullptr) return absl::InvalidArgumentError("no mapped chunks given");
  if (mapped_chunks_.Covers(chunks->first(), chunks->size())) return absl::OkStatus();
  // Refused before any wait, so that a bad range changes nothing.
  DRT_RETURN_IF_ERROR(
      mapped_chunks_.CheckNew(*chunks, chunk_map_unit(), chunk_store_.size()));
  // The store stream writes the records (EncodeChunks) and the fetch stream
  // reads them (FetchChunks): both are done with them before they are freed.
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(store_stream_.get()),
                           "waiting for the chunk store copies");
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(fetch_stream_.get()),
                           "waiting for the chunk copies");
  // The staging its fetches will go through, before the records are
  // released: a session short of pinned memory is refused the mapping
  // (nothing changes) rather than failing a later step.
  DRT_RETURN_IF_ERROR(EnsureStaging());
  return MapHostChunks(std::move(chunks), chunk_map_unit(), chunk_store_, mapped_chunks_);
}

template <typename T>
absl::Status CudaSession<T>::EnsureStaging() {
  using E = HostElement<T>;
  if (staging_ != nullptr) return absl::OkStatus();
  std::vector<Event> copied;
  for (int64_t i = 0; i < kStagingSlots; ++i) {
    absl::StatusOr<Event> e = Event::Create();
    if (!e.ok()) return e.status();
    copied.push_back(*std::move(e));
  }
  auto staging = std::make_unique<ChunkStaging<E>>(
      kStagingSlots, chunk_store_.layout().elements(), host_allocator_);
  DRT_RETURN_IF_ERROR(staging->Allocate());
  staging_ = std::move(staging);
  staging_copied_ = std::move(copied);
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::CopyMappedRows(const MappedChunks& mapped, int64_t chunk, T* rows) {
  using E = HostElement<T>;
  // Made by MapChunks or ImportState before any chunk was released; this
  // only covers a path that forgot to.
  DRT_RETURN_IF_ERROR(EnsureStaging());
  absl::StatusOr<typename ChunkStaging<E>::Slot> slot = staging_->Next();
  if (!slot.ok()) return slot.status();
  // The slot's previous copy (queued on the fetch stream) must have read it
  // before the host rewrites it.
  if (slot->must_wait) {
    DRT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staging_copied_[slot->index].get()),
                             "waiting for a staging slot's previous copy");
  }
  // The mapping's fp32 rows in the storage type: a record, as the host
  // store would hold it.
  MappedRowsToElements<E>(mapped, chunk, chunk_store_.layout().elements(), slot->data);
  cudaStream_t fetch = fetch_stream_.get();
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rows, slot->data, chunk_store_.record_bytes(),
                                           cudaMemcpyHostToDevice, fetch),
                           "copying mapped chunk encoder rows host -> device");
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_copied_[slot->index].get(), fetch),
                           "recording a staging slot's copy");
  staging_->Queued(slot->index);
  return absl::OkStatus();
}

#define DRT_INSTANTIATE_DISK_TIER(T)                                                        \
  template absl::Status CudaSession<T>::MapChunks(std::shared_ptr<const MappedChunks>);      \
  template absl::Status CudaSession<T>::EnsureStaging();                                      \
  template absl::Status CudaSession<T>::CopyMappedRows(const MappedChunks&, int64_t, T*);
DRT_INSTANTIATE_DISK_TIER(bf16)
DRT_INSTANTIATE_DISK_TIER(float)
#undef DRT_INSTANTIATE_DISK_TIER

}  // namespace drt::cuda

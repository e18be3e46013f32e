// Retrieval on the device (drt-model.md, Forward pass 5) and the copies that
// bring the chosen chunks into a group's slot buffer.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/cuda/cuda_session.h"
#include "engine/cuda/host/gca_slot_table.h"
#include "engine/cuda/debug_stream_delay.h"
#include "engine/cuda/status_macros.h"
#include "engine/model_rules.h"
#include "kernels/cuda_check.h"
#include "kernels/elementwise.h"
#include "kernels/landmark_topk.h"

namespace drt::cuda {

template <typename T>
absl::Status CudaSession<T>::LaunchRetrieval(const SlicePlan& slice, int64_t group) {
  Made& made = made_[group];
  made = Made{};
  if (options_.disable_gca || slice.landmarks.empty()) return absl::OkStatus();
  const int64_t S = sizes_.chunk;
  const int64_t d = sizes_.d;
  const int64_t k = sizes_.topk;
  const int64_t count = static_cast<int64_t>(slice.landmarks.size());
  const int64_t first_row = slice.landmarks.front().row - slice.first_row;
  cudaStream_t stream = compute_stream_.get();
  SessionBuffers<T>& b = buffers_;
  // Landmark rows are one chunk apart (the plan puts one after every
  // enc_chunk_size real tokens): one strided copy gathers them.
  DRT_CUDA_RETURN_IF_ERROR(
      cudaMemcpy2DAsync(b.lmk_rows.get(), d * sizeof(float), b.h.get() + first_row * d,
                        S * d * sizeof(float), d * sizeof(float), count,
                        cudaMemcpyDeviceToDevice, stream),
      "gathering landmark query rows");
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchRmsNormF32(b.lmk_rows.get(), weights_.lmk_norms[group],
                                static_cast<int>(count), static_cast<int>(d), kLandmarkNormEps,
                                b.lmk_queries.get(), stream),
      "LaunchRmsNormF32 (lmk_norms)");
  // Chunk t's landmark scores the chunks strictly before t. The group's
  // staging region is rewritten only once its previous upload is done.
  DRT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(uploads_done_[group].get()),
                           "waiting for the group's previous uploads");
  int64_t* limits = b.lmk_limits_host.get() + group * sizes_.max_query_chunks;
  for (int64_t j = 0; j < count; ++j) limits[j] = slice.landmarks[j].chunk;
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.lmk_limits.get(), limits, count * sizeof(int64_t),
                                           cudaMemcpyHostToDevice, stream),
                           "uploading landmark limits");
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchLandmarkTopK(landmarks_.get(), static_cast<int>(d), b.lmk_queries.get(),
                                  b.lmk_limits.get(), static_cast<int>(count),
                                  static_cast<int>(k), 1.f / std::sqrt(static_cast<float>(d)),
                                  topk_workspace_.get(), topk_workspace_.bytes(),
                                  b.topk_chunks.get(), b.topk_weights.get(), stream),
      "LaunchLandmarkTopK");
  const size_t offset = group * sizes_.max_query_chunks * k;
  DRT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(b.topk_chunks_host.get() + offset, b.topk_chunks.get(),
                      count * k * sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
      "copying retrieved chunk ids to the host");
  DRT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(b.topk_weights_host.get() + offset, b.topk_weights.get(),
                      count * k * sizeof(float), cudaMemcpyDeviceToHost, stream),
      "copying retrieval weights to the host");
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(topk_ready_[group].get(), stream),
                           "recording the retrieval");
  made.launched = true;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::CollectRetrieval(const SlicePlan& slice, int64_t group) {
  Made& made = made_[group];
  if (!made.launched || made.collected) return absl::OkStatus();
  const int64_t k = sizes_.topk;
  DRT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(topk_ready_[group].get()),
                           "waiting for the retrieval");
  const size_t offset = group * sizes_.max_query_chunks * k;
  const int64_t* chunks = buffers_.topk_chunks_host.get() + offset;
  const float* weights = buffers_.topk_weights_host.get() + offset;
  for (size_t j = 0; j < slice.landmarks.size(); ++j) {
    const int64_t chunk = slice.landmarks[j].chunk;
    // Exactly min(k, chunk) distinct earlier chunks with finite weights (the
    // kernel answers -1 / NaN when its workspace does not cover the limit).
    const int64_t expected = std::min(k, chunk);
    Retrieval r;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t c = chunks[j * k + i];
      if (c < 0) break;
      const float w = weights[j * k + i];
      if (c >= chunk || !std::isfinite(w) ||
          std::find(r.chunks.begin(), r.chunks.end(), c) != r.chunks.end()) {
        return absl::InternalError(absl::StrCat("landmark top-k returned chunk ", c, " (weight ",
                                                w, ") for the landmark of chunk ", chunk));
      }
      r.chunks.push_back(c);
      r.weights.push_back(w);
    }
    if (static_cast<int64_t>(r.chunks.size()) != expected) {
      return absl::InternalError(absl::StrCat("landmark top-k returned ", r.chunks.size(),
                                              " chunks for the landmark of chunk ", chunk, ", ",
                                              expected, " expected"));
    }
    if (observer_) observer_(chunk, group, r);
    made.at_landmark.push_back(std::move(r));
  }
  made.collected = true;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::PrepareGca(const SlicePlan& slice, int64_t group) {
  if (options_.disable_gca) return absl::OkStatus();
  if (capturing_) {
    // In a decode graph: LaunchDecodeGraph staged the table (one run) and
    // ordered the launch after the chunk copies before it launches.
    return UploadSlotTable(group, static_cast<int64_t>(slice.runs.size()) * sizes_.topk);
  }
  absl::StatusOr<int64_t> entries = StageSlotTable(slice, group);
  if (!entries.ok()) return entries.status();
  DRT_RETURN_IF_ERROR(UploadSlotTable(group, *entries));
  cudaStream_t stream = compute_stream_.get();
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploads_done_[group].get(), stream),
                           "recording the group's uploads");
  // The first GCA of the group waits here for the copies (issued now or by
  // the prefetch at the end of the previous step) and no earlier. The
  // device tier copies nothing.
  if (!device_tier_) {
    DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, fetched_[group].get(), 0),
                             "ordering the GCA after the chunk copies");
  }
  DRT_RETURN_IF_ERROR(
      DelayStreamForTest(options_.debug_stream_delay, CudaDelayedStream::kCompute, stream,
                         stats_.stream_delays));
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<int64_t> CudaSession<T>::StageSlotTable(const SlicePlan& slice, int64_t group) {
  const int64_t k = sizes_.topk;
  const Made& made = made_[group];
  // The selection serving each run (one run per query chunk, in order): the
  // plan says which (engine/step_plan.h, GcaRun::made_at).
  absl::StatusOr<std::vector<const Retrieval*>> serving =
      ServingSelections(slice.runs, selection_[group], made.at_landmark, made.collected);
  if (!serving.ok()) {
    return absl::InternalError(absl::StrCat("group ", group, ": ", serving.status().message()));
  }
  std::vector<int> slots;
  if (device_tier_) {
    // Every closed chunk is in the device store, which the kernel reads in
    // place: the slot of chunk c is c (no copy, nothing to wait for; the
    // encoder wrote this step's chunks earlier on the compute stream).
    const std::vector<int64_t> request = ChunksToRequest(*serving);
    absl::StatusOr<std::vector<int>> in_store = DeviceStoreSlots(request, device_store_.size());
    if (!in_store.ok()) {
      return absl::InternalError(absl::StrCat("group ", group, ": ", in_store.status().message()));
    }
    slots = *std::move(in_store);
    std::vector<int64_t> distinct = request;
    std::sort(distinct.begin(), distinct.end());
    stats_.resident_hits +=
        std::unique(distinct.begin(), distinct.end()) - distinct.begin();
  } else {
    DRT_RETURN_IF_ERROR(FetchChunks(group, ChunksToRequest(*serving), &slots));
  }

  // The group's pinned staging region; its previous upload must be done.
  DRT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(uploads_done_[group].get()),
                           "waiting for the group's previous uploads");
  const int64_t entries = static_cast<int64_t>(serving->size()) * k;
  int32_t* table = buffers_.slot_table_host.get() + group * sizes_.max_query_chunks * k;
  float* table_weights = buffers_.slot_weights_host.get() + group * sizes_.max_query_chunks * k;
  FillSlotTable(*serving, slots, k, table, table_weights);
  return entries;
}

template <typename T>
absl::Status CudaSession<T>::UploadSlotTable(int64_t group, int64_t entries) {
  const int64_t offset = group * sizes_.max_query_chunks * sizes_.topk;
  cudaStream_t stream = compute_stream_.get();
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffers_.slot_table.get(),
                                           buffers_.slot_table_host.get() + offset,
                                           entries * sizeof(int32_t), cudaMemcpyHostToDevice,
                                           stream),
                           "uploading the GCA slot table");
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffers_.slot_weights.get(),
                                           buffers_.slot_weights_host.get() + offset,
                                           entries * sizeof(float), cudaMemcpyHostToDevice,
                                           stream),
                           "uploading the GCA weights");
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::FetchChunks(int64_t group, const std::vector<int64_t>& chunks,
                                         std::vector<int>* slots) {
  absl::StatusOr<ChunkResidency::Plan> plan = residency_[group].Request(chunks);
  if (!plan.ok()) {
    return absl::InternalError(
        absl::StrCat("chunk buffer of group ", group, ": ", plan.status().message()));
  }
  stats_.resident_hits += plan->hits;
  *slots = plan->slots;
  if (plan->copies.empty()) return absl::OkStatus();

  const int64_t S = sizes_.chunk;
  const int64_t d = sizes_.d;
  cudaStream_t fetch = fetch_stream_.get();
  // Evicted slots may still be read by the group's last GCA; sources are the
  // encoder's output (this step's chunks) or host records written by the
  // store stream.
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(fetch, gca_done_[group].get(), 0),
                           "ordering chunk copies after the group's GCA");
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(fetch, encoded_.get(), 0),
                           "ordering chunk copies after the encoder");
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(fetch, stored_.get(), 0),
                           "ordering chunk copies after the store copies");
  DRT_RETURN_IF_ERROR(
      DelayStreamForTest(options_.debug_stream_delay, CudaDelayedStream::kFetch, fetch,
                         stats_.stream_delays));
  if (stores_encoder_rows()) {
    DRT_RETURN_IF_ERROR(FetchEncoderRows(group, plan->copies));
    DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(fetched_[group].get(), fetch),
                             "recording the chunk copies");
    DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(fetch_tail_.get(), fetch),
                             "recording the chunk copies");
    return absl::OkStatus();
  }
  const size_t block = chunk_store_.block_bytes();
  GroupChunkBuffer<T>& buffer = buffers_.group_chunks[group];
  for (const ChunkResidency::Copy& copy : plan->copies) {
    T* dst_k = buffer.k.get() + copy.slot * S * d;
    T* dst_v = buffer.v.get() + copy.slot * S * d;
    const int64_t fresh = copy.chunk - step_first_new_chunk_;
    if (fresh >= 0 && fresh < step_new_chunks_) {
      DRT_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst_k, buffers_.enc_k.get() + fresh * S * d, block,
                          cudaMemcpyDeviceToDevice, fetch),
          "copying fresh chunk keys into a slot");
      DRT_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst_v, buffers_.enc_v.get() + fresh * S * d, block,
                          cudaMemcpyDeviceToDevice, fetch),
          "copying fresh chunk values into a slot");
      ++stats_.d2d_chunks;
    } else {
      // A store of K/V maps nothing: mappings hold encoder rows, and the
      // disk tier comes with state_export, which selects them
      // (FetchEncoderRows reads mapped chunks).
      if (chunk_store_.released(copy.chunk)) {
        return absl::InternalError(absl::StrFormat(
            "chunk %d left the host store of K/V", copy.chunk));
      }
      DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst_k, chunk_store_.keys(copy.chunk), block,
                                               cudaMemcpyHostToDevice, fetch),
                               "copying chunk keys host -> device");
      DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst_v, chunk_store_.values(copy.chunk), block,
                                               cudaMemcpyHostToDevice, fetch),
                               "copying chunk values host -> device");
      ++stats_.h2d_chunks;
      stats_.h2d_bytes += static_cast<int64_t>(2 * block);
    }
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(fetched_[group].get(), fetch),
                           "recording the chunk copies");
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(fetch_tail_.get(), fetch),
                           "recording the chunk copies");
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::FetchEncoderRows(int64_t group,
                                              const std::vector<ChunkResidency::Copy>& copies) {
  const FetchBatchShape shape{sizes_.chunk, chunk_store_.rows_per_chunk(), sizes_.d};
  const int64_t capacity =
      static_cast<int64_t>(buffers_.fetch_rows.size()) / shape.entry_elements();
  absl::StatusOr<FetchBatches> batches = PlanFetchBatches(
      copies, step_first_new_chunk_, step_new_chunks_, capacity,
      [this](int64_t chunk) { return mapped_chunks_.Find(chunk) != nullptr; });
  if (!batches.ok()) {
    return absl::InternalError(
        absl::StrCat("fetch for group ", group, ": ", batches.status().message()));
  }
  const int d = static_cast<int>(sizes_.d);
  const size_t slot_bytes = shape.entry_elements() * sizeof(T);
  const size_t record_bytes = chunk_store_.record_bytes();
  const int gemm_rows = static_cast<int>(shape.gemm_rows(capacity));
  cudaStream_t fetch = fetch_stream_.get();
  GroupChunkBuffer<T>& buffer = buffers_.group_chunks[group];
  SessionBuffers<T>& b = buffers_;
  // A batch at a time: each chunk's rows into its staging entry, K and V of
  // the whole staging by one GEMM each (always all `capacity` entries: one
  // GEMM shape for every chunk, engine/cuda/host/fetch_batches.h; entries
  // past the batch hold stale rows whose K/V nobody reads), the landmark rows
  // zeroed, then each entry's K/V into its slot. The staging is written only
  // by this stream, so stream order keeps a batch from overwriting rows an
  // earlier batch's GEMMs still read.
  for (const std::vector<StagedChunk>& batch : *batches) {
    for (const StagedChunk& staged : batch) {
      T* rows = b.fetch_rows.get() + shape.entry_offset(staged.entry);
      switch (staged.source) {
        case RowSource::kEncoder:
          // Written by this step's encoder (the fetch stream waits for it).
          DRT_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(rows, b.enc_rows.get() + shape.entry_offset(staged.encoder_index),
                              record_bytes, cudaMemcpyDeviceToDevice, fetch),
              "staging a fresh chunk's encoder rows");
          ++stats_.d2d_chunks;
          break;
        case RowSource::kMapped:
          DRT_RETURN_IF_ERROR(
              CopyMappedRows(*mapped_chunks_.Find(staged.chunk), staged.chunk, rows));
          ++stats_.h2d_chunks;
          ++stats_.mapped_h2d_chunks;
          stats_.h2d_bytes += static_cast<int64_t>(record_bytes);
          break;
        case RowSource::kHostStore:
          if (chunk_store_.released(staged.chunk)) {
            return absl::InternalError(absl::StrFormat(
                "chunk %d left the host store but is in no mapping", staged.chunk));
          }
          DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rows, chunk_store_.record(staged.chunk),
                                                   record_bytes, cudaMemcpyHostToDevice, fetch),
                                   "copying chunk encoder rows host -> device");
          ++stats_.h2d_chunks;
          stats_.h2d_bytes += static_cast<int64_t>(record_bytes);
          break;
      }
    }
    // Row S - 1 of each entry (the landmark's) is not staged: a GEMM row
    // depends on its input row only, and that row of K and V is zeroed
    // after (Forward pass 7: the landmark's K/V are zero).
    DRT_RETURN_IF_ERROR(fetch_gemm_->Matmul(b.fetch_rows.get(), weights_.chunk_k_proj,
                                            b.fetch_k.get(), gemm_rows, d, d, fetch));
    DRT_RETURN_IF_ERROR(fetch_gemm_->Matmul(b.fetch_rows.get(), weights_.chunk_v_proj,
                                            b.fetch_v.get(), gemm_rows, d, d, fetch));
    const int entries = static_cast<int>(batch.size());
    const int landmark_row = static_cast<int>(shape.landmark_row());
    DRT_CUDA_RETURN_IF_ERROR(
        kernels::LaunchZeroChunkRow(b.fetch_k.get(), entries, landmark_row, d, fetch),
        "LaunchZeroChunkRow (fetched keys)");
    DRT_CUDA_RETURN_IF_ERROR(
        kernels::LaunchZeroChunkRow(b.fetch_v.get(), entries, landmark_row, d, fetch),
        "LaunchZeroChunkRow (fetched values)");
    for (const StagedChunk& staged : batch) {
      const int64_t from = shape.entry_offset(staged.entry);
      const int64_t to = shape.entry_offset(staged.slot);
      DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffer.k.get() + to, b.fetch_k.get() + from,
                                               slot_bytes, cudaMemcpyDeviceToDevice, fetch),
                               "copying made chunk keys into a slot");
      DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffer.v.get() + to, b.fetch_v.get() + from,
                                               slot_bytes, cudaMemcpyDeviceToDevice, fetch),
                               "copying made chunk values into a slot");
    }
  }
  return absl::OkStatus();
}

#define DRT_INSTANTIATE_RETRIEVAL(T)                                                       \
  template absl::Status CudaSession<T>::LaunchRetrieval(const SlicePlan&, int64_t);          \
  template absl::Status CudaSession<T>::CollectRetrieval(const SlicePlan&, int64_t);         \
  template absl::Status CudaSession<T>::PrepareGca(const SlicePlan&, int64_t);               \
  template absl::StatusOr<int64_t> CudaSession<T>::StageSlotTable(const SlicePlan&, int64_t);  \
  template absl::Status CudaSession<T>::UploadSlotTable(int64_t, int64_t);                    \
  template absl::Status CudaSession<T>::FetchChunks(int64_t, const std::vector<int64_t>&,    \
                                                    std::vector<int>*);                        \
  template absl::Status CudaSession<T>::FetchEncoderRows(                                    \
      int64_t, const std::vector<ChunkResidency::Copy>&);
DRT_INSTANTIATE_RETRIEVAL(bf16)
DRT_INSTANTIATE_RETRIEVAL(float)
#undef DRT_INSTANTIATE_RETRIEVAL

}  // namespace drt::cuda

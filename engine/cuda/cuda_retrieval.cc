// Retrieval on the device (drt-model.md, Forward pass 5) and the copies that
// bring the chosen chunks into a group's slot buffer.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_session.h"
#include "engine/cuda/status_macros.h"
#include "engine/model_rules.h"
#include "kernels/cuda_check.h"
#include "kernels/elementwise.h"
#include "kernels/landmark_topk.h"

namespace drt::cuda {
namespace {

struct LandmarkRows {
  int64_t first = 0;  // row of the first landmark in the segment
  int64_t count = 0;
};

LandmarkRows FindLandmarkRows(int64_t first_pos, int64_t n, int64_t S) {
  LandmarkRows r;
  r.first = (S - 1 - first_pos % S) % S;
  r.count = r.first < n ? (n - 1 - r.first) / S + 1 : 0;
  return r;
}

}  // namespace

template <typename T>
absl::Status CudaSession<T>::LaunchRetrieval(int64_t group, int64_t first_pos, int64_t n) {
  const int64_t S = sizes_.chunk;
  const int64_t d = sizes_.d;
  const int64_t k = sizes_.topk;
  const LandmarkRows lm = FindLandmarkRows(first_pos, n, S);
  if (lm.count == 0) return absl::OkStatus();
  cudaStream_t stream = compute_stream_.get();
  SessionBuffers<T>& b = buffers_;
  // Landmark rows are S apart: one strided copy gathers them.
  DRT_CUDA_RETURN_IF_ERROR(
      cudaMemcpy2DAsync(b.lmk_rows.get(), d * sizeof(float), b.h.get() + lm.first * d,
                        S * d * sizeof(float), d * sizeof(float), lm.count,
                        cudaMemcpyDeviceToDevice, stream),
      "gathering landmark query rows");
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchRmsNormF32(b.lmk_rows.get(), weights_.lmk_norms[group],
                                static_cast<int>(lm.count), static_cast<int>(d),
                                kLandmarkNormEps, b.lmk_queries.get(), stream),
      "LaunchRmsNormF32 (lmk_norms)");
  // Chunk t's landmark scores the chunks strictly before t. The group's
  // staging region is rewritten only once its previous upload is done.
  DRT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(uploads_done_[group].get()),
                           "waiting for the group's previous uploads");
  int64_t* limits = b.lmk_limits_host.get() + group * sizes_.max_query_chunks;
  for (int64_t j = 0; j < lm.count; ++j) limits[j] = (first_pos + lm.first + j * S) / S;
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.lmk_limits.get(), limits,
                                           lm.count * sizeof(int64_t), cudaMemcpyHostToDevice,
                                           stream),
                           "uploading landmark limits");
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchLandmarkTopK(landmarks_.get(), static_cast<int>(d), b.lmk_queries.get(),
                                  b.lmk_limits.get(), static_cast<int>(lm.count),
                                  static_cast<int>(k), 1.f / std::sqrt(static_cast<float>(d)),
                                  topk_workspace_.get(), topk_workspace_.bytes(),
                                  b.topk_chunks.get(), b.topk_weights.get(), stream),
      "LaunchLandmarkTopK");
  const size_t offset = group * sizes_.max_query_chunks * k;
  DRT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(b.topk_chunks_host.get() + offset, b.topk_chunks.get(),
                      lm.count * k * sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
      "copying retrieved chunk ids to the host");
  DRT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(b.topk_weights_host.get() + offset, b.topk_weights.get(),
                      lm.count * k * sizeof(float), cudaMemcpyDeviceToHost, stream),
      "copying retrieval weights to the host");
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(topk_ready_[group].get(), stream),
                           "recording the retrieval");
  made_[group].launched = true;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::CollectRetrieval(int64_t group, int64_t first_pos, int64_t n) {
  Made& made = made_[group];
  if (!made.launched || made.collected) return absl::OkStatus();
  const int64_t S = sizes_.chunk;
  const int64_t k = sizes_.topk;
  DRT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(topk_ready_[group].get()),
                           "waiting for the retrieval");
  const LandmarkRows lm = FindLandmarkRows(first_pos, n, S);
  const size_t offset = group * sizes_.max_query_chunks * k;
  const int64_t* chunks = buffers_.topk_chunks_host.get() + offset;
  const float* weights = buffers_.topk_weights_host.get() + offset;
  for (int64_t j = 0; j < lm.count; ++j) {
    const int64_t chunk = (first_pos + lm.first + j * S) / S;
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
    made.served.emplace_back(chunk + 1, std::move(r));
  }
  made.collected = true;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::PrepareGroupChunks(int64_t group, int64_t first_pos, int64_t n) {
  const int64_t S = sizes_.chunk;
  const int64_t k = sizes_.topk;
  const int64_t first_chunk = first_pos / S;
  const int64_t num_query_chunks = (first_pos + n - 1) / S - first_chunk + 1;
  const Made& made = made_[group];
  // The selection serving each query chunk: made at this segment's landmark
  // of the chunk before, else the one in force.
  std::vector<const Retrieval*> serving(num_query_chunks, &selection_[group]);
  for (const auto& [served, r] : made.served) {
    if (served >= first_chunk && served < first_chunk + num_query_chunks) {
      serving[served - first_chunk] = &r;
    }
  }
  if (num_query_chunks > 1 && !made.collected) {
    return absl::InternalError("retrieval not collected before its chunks are needed");
  }
  std::vector<int64_t> request;
  for (const Retrieval* r : serving) request.insert(request.end(), r->chunks.begin(), r->chunks.end());
  std::vector<int> slots;
  DRT_RETURN_IF_ERROR(FetchChunks(group, request, &slots));

  // The group's pinned staging region; its previous upload must be done.
  DRT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(uploads_done_[group].get()),
                           "waiting for the group's previous uploads");
  const int64_t entries = num_query_chunks * k;
  int32_t* table = buffers_.slot_table_host.get() + group * sizes_.max_query_chunks * k;
  float* table_weights = buffers_.slot_weights_host.get() + group * sizes_.max_query_chunks * k;
  std::fill_n(table, entries, -1);
  std::fill_n(table_weights, entries, 0.f);
  size_t next = 0;
  for (int64_t q = 0; q < num_query_chunks; ++q) {
    for (size_t i = 0; i < serving[q]->chunks.size(); ++i) {
      table[q * k + i] = slots[next++];
      table_weights[q * k + i] = serving[q]->weights[i];
    }
  }
  cudaStream_t stream = compute_stream_.get();
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffers_.slot_table.get(), table,
                                           entries * sizeof(int32_t), cudaMemcpyHostToDevice,
                                           stream),
                           "uploading the GCA slot table");
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffers_.slot_weights.get(), table_weights,
                                           entries * sizeof(float), cudaMemcpyHostToDevice,
                                           stream),
                           "uploading the GCA weights");
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploads_done_[group].get(), stream),
                           "recording the group's uploads");
  // The first GCA of the group waits here for the copies (issued now or by
  // the prefetch at the end of the previous segment) and no earlier.
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, fetched_[group].get(), 0),
                           "ordering the GCA after the chunk copies");
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
  // encoder's output (this segment's chunks) or host records written by the
  // store stream.
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(fetch, gca_done_[group].get(), 0),
                           "ordering chunk copies after the group's GCA");
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(fetch, encoded_.get(), 0),
                           "ordering chunk copies after the encoder");
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(fetch, stored_.get(), 0),
                           "ordering chunk copies after the store copies");
  const size_t block = chunk_store_.kv_block_bytes();
  GroupChunkBuffer<T>& buffer = buffers_.group_chunks[group];
  for (const ChunkResidency::Copy& copy : plan->copies) {
    T* dst_k = buffer.k.get() + copy.slot * S * d;
    T* dst_v = buffer.v.get() + copy.slot * S * d;
    const int64_t fresh = copy.chunk - segment_first_new_chunk_;
    if (fresh >= 0 && fresh < segment_new_chunks_) {
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

#define DRT_INSTANTIATE_RETRIEVAL(T)                                                       \
  template absl::Status CudaSession<T>::LaunchRetrieval(int64_t, int64_t, int64_t);          \
  template absl::Status CudaSession<T>::CollectRetrieval(int64_t, int64_t, int64_t);         \
  template absl::Status CudaSession<T>::PrepareGroupChunks(int64_t, int64_t, int64_t);       \
  template absl::Status CudaSession<T>::FetchChunks(int64_t, const std::vector<int64_t>&,    \
                                                    std::vector<int>*);
DRT_INSTANTIATE_RETRIEVAL(bf16)
DRT_INSTANTIATE_RETRIEVAL(float)
#undef DRT_INSTANTIATE_RETRIEVAL

}  // namespace drt::cuda

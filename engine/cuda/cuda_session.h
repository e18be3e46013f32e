// Per-session state and forward pass of the CUDA backend. Mirrors
// engine/cpu/cpu_session.cc step by step (drt-model.md, "Forward pass"):
// the same segments, landmarks, encoder batches and retrieval points; only
// where the state lives and the number format (storage type T: bf16, or float
// in fp32 precision; fp32 accumulation and residual stream either way)
// differ. docs/cuda.md describes the streams and events.
//
// Three streams per session: `compute` runs every kernel; `store` copies the
// K/V of closed chunks device -> pinned host store after the encoder; `fetch`
// copies retrieved chunks into a group's slot buffer (host -> device, or
// device -> device from the same segment's encoder output). Events order
// them; the host waits only for the top-k indices (it plans the copies) and
// for the logits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_options.h"
#include "engine/cuda/cuda_resources.h"
#include "engine/cuda/device_weights.h"
#include "engine/cuda/host/chunk_residency.h"
#include "engine/cuda/host/host_chunk_store.h"
#include "engine/cuda/session_buffers.h"
#include "engine/cuda/storage_type.h"
#include "kernels/gemm.h"

namespace drt::cuda {

// Instantiated for bf16 and float: cuda_session.cc instantiates the class,
// cuda_layers.cc and cuda_retrieval.cc the members they define.
template <typename T>
class CudaSession final : public BackendSession {
 public:
  static absl::StatusOr<std::unique_ptr<CudaSession>> Create(
      const ModelConfig& config, const DeviceWeights<T>& weights,
      const CudaBackendOptions& options, std::shared_ptr<HostAllocator> host_allocator);
  ~CudaSession() override;

  absl::Status Forward(absl::Span<const int32_t> ids, absl::Span<const int64_t> logit_rows,
                       absl::Span<float> logits) override;
  int64_t position() const override { return position_; }
  int64_t num_chunks() const override { return position_ / sizes_.chunk; }
  SessionMemory memory() const override;
  std::vector<Retrieval> current_retrieval() const override { return selection_; }
  void set_retrieval_observer(RetrievalObserver observer) override {
    observer_ = std::move(observer);
  }
  absl::StatusOr<std::unique_ptr<BackendSession>> Fork() const override;
  BackendSessionStats stats() const override { return stats_; }

 private:
  CudaSession(const ModelConfig& config, const DeviceWeights<T>& weights,
              const CudaBackendOptions& options, std::shared_ptr<HostAllocator> host_allocator);
  absl::Status Init();
  absl::Status CheckIds(absl::Span<const int32_t> ids, absl::Span<const int64_t> logit_rows,
                        absl::Span<float> logits) const;

  // cuda_session.cc: one segment of at most max_rows positions starting at
  // position_; then the logits of the rows asked for.
  absl::Status RunSegment(absl::Span<const int32_t> ids);
  absl::Status WriteLogits(int64_t segment_first, int64_t segment_rows,
                           absl::Span<const int64_t> logit_rows, absl::Span<float> logits);

  // cuda_layers.cc: the blocks of drt-model.md, Forward pass 3, 4, 6, 7.
  absl::Status AttentionBlock(int64_t layer_index, const DeviceLayer<T>& layer, int64_t n,
                              int64_t first_pos);
  // out += MLP(RMSNorm2(norm_input)) (norm_input is h or mixed).
  absl::Status MlpBlock(const DeviceLayer<T>& layer, const float* norm_input, float* out,
                        int64_t n, float eps);
  absl::Status GcaBlock(int64_t group, const DeviceUpperLayer<T>& layer, int64_t n,
                        int64_t first_pos, int64_t first_query_chunk);
  // Encodes `count` closed chunks whose lower-layer rows are in
  // buffers_.mixed; appends landmarks (device) and K/V (host store, async).
  absl::Status EncodeChunks(int64_t count);
  absl::Status EnsureLandmarkCapacity(int64_t chunks);

  // cuda_retrieval.cc: drt-model.md, Forward pass 5, and the chunk copies.
  // Launches top-k for the landmark rows of this segment (group g's input in
  // buffers_.h) and the copy of the results to pinned memory.
  absl::Status LaunchRetrieval(int64_t group, int64_t first_pos, int64_t n);
  // Waits for that copy and turns it into Retrievals (calls the observer).
  absl::Status CollectRetrieval(int64_t group, int64_t first_pos, int64_t n);
  // Makes every chunk that rows [first_pos, first_pos+n) of the group need
  // resident and uploads the slot table the GCA kernel reads.
  absl::Status PrepareGroupChunks(int64_t group, int64_t first_pos, int64_t n);
  // Requests `chunks` in the group's buffer and issues the copies.
  absl::Status FetchChunks(int64_t group, const std::vector<int64_t>& chunks,
                           std::vector<int>* slots);

  const ModelConfig& config_;
  const DeviceWeights<T>& weights_;
  CudaBackendOptions options_;
  SessionSizes sizes_;
  std::shared_ptr<HostAllocator> host_allocator_;

  Stream compute_stream_, fetch_stream_, store_stream_;
  // Declared after the streams so that it is destroyed before them.
  std::unique_ptr<kernels::CublasGemm> gemm_;
  Event encoded_;                  // compute: enc_k/enc_v written
  Event stored_;                   // store: D2H of the latest closed chunks done
  Event fetch_tail_;               // fetch: the latest chunk copies done
  std::vector<Event> topk_ready_;  // per group: top-k results in pinned memory
  std::vector<Event> gca_done_;    // per group: last GCA reading its slots done
  std::vector<Event> fetched_;     // per group: its latest chunk copies done
  // Compute-stream uploads from the pinned staging buffers done; the host
  // waits for them before it rewrites a staging region.
  Event ids_uploaded_;               // token ids
  std::vector<Event> uploads_done_;  // per group: landmark limits and slot table
  SessionBuffers<T> buffers_;
  DeviceArray<float> landmarks_;   // [capacity][d] fp32, grown by doubling
  DeviceArray<char> topk_workspace_;

  int64_t position_ = 0;
  HostChunkStore<HostElement<T>> chunk_store_;
  // Chunks encoded in the segment being run are read from enc_k/enc_v (not
  // yet, or not surely, in the host store): [first, first + count).
  int64_t segment_first_new_chunk_ = 0;
  int64_t segment_new_chunks_ = 0;
  std::vector<ChunkResidency> residency_;  // per group
  std::vector<Retrieval> selection_;       // in force now, per group
  // Per group: selections made at this segment's landmarks, keyed by the
  // chunk they serve; `collected` once read back.
  struct Made {
    std::vector<std::pair<int64_t, Retrieval>> served;
    bool launched = false;
    bool collected = false;
  };
  std::vector<Made> made_;
  RetrievalObserver observer_;
  BackendSessionStats stats_;
  // Set after a CUDA error mid-step: the device state may be half updated.
  absl::Status failed_;
};

}  // namespace drt::cuda

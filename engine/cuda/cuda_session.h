// Per-session state of the CUDA backend and the device work of one slice of
// a step (engine/step_plan.h). engine/cuda/cuda_step.h walks the forward pass
// (engine/forward_pass.h) over a plan and calls these slice ops, op by op,
// for each slice; what the plan says (landmark rows, which selection serves
// which run, where a slice ends) is read from it, never recomputed here.
// Only where the state lives and the number format (storage type T: bf16,
// or float in fp32 precision; fp32 accumulation and residual stream either
// way) differ from the CPU backend. docs/cuda.md describes the streams and
// events.
//
// Three streams per session: `compute` runs every kernel; `store` copies the
// K/V of closed chunks (or their encoder rows, CudaChunkStore::kEncoderRows)
// device -> pinned host store after the encoder; `fetch` copies retrieved
// chunks into a group's slot buffer (host -> device, or device -> device
// from the same step's encoder output) and, with encoder rows, runs the two
// GEMMs that make K/V of the rows it brought in (its own cuBLAS handle and
// workspace). Events order them; the host waits only for the top-k indices
// (it plans the copies) and for the logits. In the device tier
// (CudaChunkTier::kDevice, docs/cuda.md "Device tier") the store and fetch
// streams stay idle: the encoder writes K/V into the session's device chunk
// store on the compute stream and GCA reads them there.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_decode_graph.h"
#include "engine/cuda/cuda_options.h"
#include "engine/cuda/cuda_resources.h"
#include "engine/cuda/device_chunk_store.h"
#include "engine/cuda/device_weights.h"
#include "engine/cuda/host/chunk_tier_policy.h"
#include "engine/cuda/host/chunk_residency.h"
#include "engine/cuda/host/chunk_staging.h"
#include "engine/cuda/host/fetch_batches.h"
#include "engine/cuda/host/host_chunk_store.h"
#include "engine/cuda/host/mapped_chunk_table.h"
#include "engine/cuda/session_buffers.h"
#include "engine/cuda/storage_type.h"
#include "engine/step_plan.h"
#include "kernels/decode_gemv_plan.h"
#include "kernels/gemm.h"

namespace drt::cuda {

// The rows of one slice in step-wide activation buffers (a batched step,
// engine/cuda/cuda_batched_step.h): queries, the new positions' keys and
// values, and where the attention output goes.
template <typename T>
struct AttentionRows {
  const T* q = nullptr;      // [n][d]
  const T* k_new = nullptr;  // [n][kv_width]
  const T* v_new = nullptr;
  T* out = nullptr;          // [n][d]
};

// Instantiated for bf16 and float: cuda_session.cc instantiates the class,
// cuda_layers.cc and cuda_retrieval.cc the members they define.
template <typename T>
class CudaSession final : public BackendSession {
 public:
  // tier_ledger: CudaChunkTier::kAuto's budget (the backend's; null for
  // the other tiers).
  static absl::StatusOr<std::unique_ptr<CudaSession>> Create(
      const ModelConfig& config, const DeviceWeights<T>& weights,
      const CudaBackendOptions& options, std::shared_ptr<HostAllocator> host_allocator,
      std::shared_ptr<DeviceTierLedger> tier_ledger = nullptr);
  ~CudaSession() override;

  int64_t position() const override { return position_; }
  int64_t num_chunks() const override { return position_ / sizes_.chunk; }
  // Closed chunks held by the tier in use (its store's own count, not
  // derived from the position: what the tests compare).
  int64_t stored_chunks() const { return closed_chunks(); }
  SessionMemory memory() const override;
  std::vector<Retrieval> current_retrieval() const override { return selection_; }
  void set_retrieval_observer(RetrievalObserver observer) override {
    observer_ = std::move(observer);
  }
  bool has_retrieval_observer() const override { return observer_ != nullptr; }
  absl::StatusOr<std::unique_ptr<BackendSession>> Fork() const override;
  // A kAuto device-tier session: its chunks' pinned records, should the
  // fork find no room on the device (ForkDeviceChunks).
  int64_t fork_host_bytes_at_most() const override {
    if (!device_tier_ || options_.chunk_tier != CudaChunkTier::kAuto) return 0;
    return closed_chunks() * static_cast<int64_t>(chunk_store_.record_bytes());
  }
  BackendSessionStats stats() const override { return stats_; }

  // Durable state (cuda_session_state.cc), only with
  // CudaBackendOptions::state_export (which selects the chunk store of
  // encoder rows: the state format holds a chunk's rows C, and K/V cannot
  // give them back); UNIMPLEMENTED naming the flag otherwise. Device ->
  // host copies on the compute stream (and a wait for the store stream's
  // chunk copies), converted to the state format's floats. ImportState maps
  // whole units of chunks through `map` (when given) up to the first unit
  // it cannot map, and reads the rest into the host chunk store.
  absl::Status ExportState(BackendSessionState& out) const override;
  absl::Status ReadChunk(int64_t chunk, ChunkData& out) const override;
  absl::Status ImportState(const BackendSessionState& state, int64_t num_chunks,
                           const ChunkReader& read, const ChunkMapper& map = nullptr) override;

  // The disk tier (cuda_disk_tier.cc, docs/state_format.md "Disk tier"),
  // only with state_export like the state above (chunk_map_unit() is 0
  // otherwise, and MapChunks UNIMPLEMENTED): mapped chunks' records leave
  // the host chunk store; a fetch of one converts its fp32 encoder rows from
  // the mapping into pinned staging and copies them to the device from
  // there, where the fetch GEMMs make its K/V (FetchEncoderRows).
  static constexpr int64_t kChunkMapUnit = 64;
  int64_t chunk_map_unit() const override {
    return options_.state_export && !options_.disable_gca ? kChunkMapUnit : 0;
  }
  absl::Status MapChunks(std::shared_ptr<const MappedChunks> chunks) override;

  // Backend::PrepareSessionForStep: before a step takes the session to
  // `end_position` decoder positions, the room it needs that may be
  // missing (the landmark matrix; the device tier's chunk store, or the
  // host tier's pinned slabs), so that a growth that finds no room fails
  // this session alone (engine/batch_step.cc keeps it out of the forward)
  // and nothing allocates mid-step. FAILED_PRECONDITION after a failure,
  // RESOURCE_EXHAUSTED naming the landmark matrix or the tier when the
  // memory is full (the runtime's error cleared: the other sessions' steps
  // launch clean).
  absl::Status ReserveForStep(int64_t end_position);

  // --- The ops of one slice (engine/cuda/cuda_step.h) ---
  // Before the step changes anything: the session is usable, the slice fits
  // the session's buffers and the chunk limit, and the landmark matrix has
  // room for the chunks it closes (so no op reallocates mid-step).
  absl::Status PrepareSlice(const SlicePlan& slice);
  // Forward pass 2: the slice's ids (plan.ids) to the device, embedded into h.
  absl::Status Embed(const StepPlan& plan, const SlicePlan& slice);
  // Forward pass 3 (and the first line of 6) on decoder layer `layer_index`.
  absl::Status Attention(const SlicePlan& slice, int64_t layer_index, const DeviceLayer<T>& layer);
  // Forward pass 3, second line (lower layers).
  absl::Status Mlp(const SlicePlan& slice, const DeviceLayer<T>& layer);
  // Forward pass 4: keeps the open chunk's rows; encodes the chunks the
  // slice closes (slice.landmarks) and appends them to the chunk memory.
  absl::Status CloseChunks(const SlicePlan& slice);
  // Forward pass 5 at the slice's landmark rows for `group`: launches top-k
  // and the copy of its answer to pinned memory; reads nothing back.
  absl::Status LaunchRetrieval(const SlicePlan& slice, int64_t group);
  // Waits for that answer and turns it into Retrievals, one per landmark of
  // the slice (calls the observer). No-op when collected already.
  absl::Status CollectRetrieval(const SlicePlan& slice, int64_t group);
  // Makes the chunks of every run's selection (slice.runs) resident in the
  // group's slot buffer and uploads the slot table the GCA kernel reads.
  absl::Status PrepareGca(const SlicePlan& slice, int64_t group);
  // Forward pass 6 after the attention, with GCA (7) unless disable_gca.
  absl::Status GcaMlp(const SlicePlan& slice, int64_t group, const DeviceUpperLayer<T>& layer);
  // The selection made at the slice's last landmark comes into force; when
  // the slice ends on a landmark its chunks start coming in now (they first
  // serve the session's next step).
  absl::Status CommitSelections(const SlicePlan& slice);
  // Forward pass 8 for `rows` (rows of the step, inside the slice, no
  // landmark) into `logits` (rows.size() x vocab). Every batch but the last
  // is waited for here; the last is queued, and FinishLogits waits for it
  // and copies it out, so that several sessions' logits overlap.
  absl::Status QueueLogits(const SlicePlan& slice, absl::Span<const int64_t> rows,
                           absl::Span<float> logits);
  absl::Status FinishLogits();
  // The slice's rows are processed.
  void Finish(const SlicePlan& slice);
  // An op failed after work started: the device state may be half updated,
  // so the session refuses further steps with this error.
  void MarkFailed(const absl::Status& status);

  // --- The per-session parts of a batched step (engine/cuda/cuda_batched_step.h) ---
  // There the row-wise work runs on the step's own stream over step-wide
  // buffers; these run a slice's per-session work on compute_stream(),
  // reading and writing the slice's rows of those buffers. The caller orders
  // compute_stream() after the step stream's work producing those rows, and
  // the step stream's next use of them after these, with events.
  cudaStream_t compute_stream() const { return compute_stream_.get(); }
  // What Embed does to the session's bookkeeping when a step starts.
  void BeginStep();
  // The batched step ran `launches` fused decode GEMV kernels over rows of
  // this session (BackendSessionStats::fused_gemv_launches).
  void CountFusedGemvLaunches(int64_t launches) { stats_.fused_gemv_launches += launches; }
  // The batched step queued `delays` test-only stream delays that hold back
  // this session's work (BackendSessionStats::stream_delays).
  void CountStreamDelays(int64_t delays) { stats_.stream_delays += delays; }
  // Forward pass 3: window attention of the slice's n rows (the first at
  // decoder position first_pos) on decoder layer `layer_index`; their keys
  // and values then enter the ring.
  absl::Status WindowAttentionRows(int64_t layer_index, const AttentionRows<T>& rows, int64_t n,
                                   int64_t first_pos);
  // Forward pass 7: GCA of n rows against group `group`'s slot buffer and
  // the slot table PrepareGca uploaded.
  absl::Status GcaAttentionRows(int64_t group, const T* q, T* out, int64_t n, int64_t first_pos,
                                int64_t first_query_chunk);
  // Copies n rows of the residual stream into the session's own h, on
  // compute_stream(), so that CloseChunks and LaunchRetrieval read them.
  absl::Status LoadRows(const float* h, int64_t n);

  // --- Decode graphs (cuda_session_graph.cc; CudaBackendOptions::decode_graphs) ---
  // Whether a slice that DecideDecodeGraph lets replay the graph of `key`
  // does so now: false the first time for the key (the step then runs
  // eagerly, as a warm-up before the capture; DecodeGraphs::WarmedUp).
  // False for a while after a capture failed, and for good after several
  // in a row (DecodeGraphs::MayCapture, GraphCaptureRetry).
  bool UseDecodeGraph(const DecodeGraphKey& key) {
    return options_.decode_graphs && graphs_.MayCapture() && graphs_.WarmedUp(key);
  }
  // Runs the device work of `slice` (DecideDecodeGraph says it replays the
  // graph of `key`; PrepareSlice passed) as one graph launch on the compute
  // stream, capturing the graph first when the session has none for `key`:
  // the host work of the step happens before the launch, and the logits
  // stay in flight (ExpectGraphLogits). Requires decode_graphs. Answers
  // whether the graph ran: false when its capture or instantiation failed,
  // which pauses the session's graphs, or turns them off after several
  // failures in a row (GraphCaptureRetry; counted in
  // BackendSessionStats::graph_capture_failures, each logged) and leaves the
  // slice for the eager walk to run (the host work done here is safe to
  // repeat). An error is a failed step (a launch that failed, say).
  absl::StatusOr<bool> LaunchDecodeGraph(const StepPlan& plan, const SlicePlan& slice,
                                         const DecodeGraphKey& key);
  // The launched graph's logits of `rows` (the slice's one row) go to
  // `logits` when FinishLogits has waited for them.
  absl::Status ExpectGraphLogits(const SlicePlan& slice, absl::Span<const int64_t> rows,
                                 absl::Span<float> logits);

 private:
  CudaSession(const ModelConfig& config, const DeviceWeights<T>& weights,
              const CudaBackendOptions& options, std::shared_ptr<HostAllocator> host_allocator,
              std::shared_ptr<DeviceTierLedger> tier_ledger);
  // allow_device_tier false keeps the session on the host tier whatever the
  // options say (the fork of a host-tier session under kAuto).
  static absl::StatusOr<std::unique_ptr<CudaSession>> CreateOnTier(
      const ModelConfig& config, const DeviceWeights<T>& weights,
      const CudaBackendOptions& options, std::shared_ptr<HostAllocator> host_allocator,
      std::shared_ptr<DeviceTierLedger> tier_ledger, bool allow_device_tier);
  absl::Status Init(bool allow_device_tier);
  // Init's choice of the tier, and the device store allocated when it is
  // the device (kAuto: ChooseAutoTier, falling back to the host tier when
  // the store cannot be allocated).
  absl::Status ChooseTier(bool allow_device_tier);
  // A RESOURCE_EXHAUSTED of the device store naming the tier in use and its
  // options; other statuses unchanged.
  absl::Status TierStatus(absl::Status status) const;
  // Closed chunks, in whichever tier holds them.
  int64_t closed_chunks() const {
    return device_tier_ ? device_store_.size() : chunk_store_.size();
  }
  // Bytes one chunk takes in the device store (K and V).
  int64_t device_chunk_bytes() const {
    return 2 * sizes_.chunk * sizes_.d * static_cast<int64_t>(sizeof(T));
  }
  // Device tier: room in the device store for `chunks` chunks (grown by
  // doubling; kAuto's grant follows the bytes).
  absl::Status ReserveDeviceStore(int64_t chunks);
  // The fork's closed chunks from this (device-tier) session: copied into
  // the fork's device store, or device -> host into its host store when
  // kAuto put the fork on the host tier. Queued on the fork's compute stream.
  absl::Status ForkDeviceChunks(CudaSession& fork) const;
  // An empty chunk store with the session's slab sizes.
  static HostChunkStore<HostElement<T>> NewChunkStore(const ModelConfig& config,
                                                      const CudaBackendOptions& options,
                                                      std::shared_ptr<HostAllocator> allocator);
  // cuda_session_state.cc: OK when this session may export or import state
  // (state_export on, GCA on, not failed), and the device is set.
  absl::Status CheckStateAccess() const;

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

  // cuda_retrieval.cc: requests `chunks` in the group's buffer and issues
  // the copies.
  absl::Status FetchChunks(int64_t group, const std::vector<int64_t>& chunks,
                           std::vector<int>* slots);
  // FetchChunks' copies with a store of encoder rows (engine/cuda/host/
  // fetch_batches.h), on the fetch stream after its waits.
  absl::Status FetchEncoderRows(int64_t group, const std::vector<ChunkResidency::Copy>& copies);
  bool stores_encoder_rows() const {
    return EffectiveChunkStore(options_) == CudaChunkStore::kEncoderRows;
  }
  // cuda_disk_tier.cc: queues on the fetch stream the copy of mapped chunk
  // `chunk`'s encoder rows (read from `mapped`, through the pinned staging)
  // into `rows` (a device staging entry of FetchEncoderRows).
  absl::Status CopyMappedRows(const MappedChunks& mapped, int64_t chunk, T* rows);
  // Makes the pinned staging and its events if there are none yet.
  absl::Status EnsureStaging();
  // Final norm, lm_head and the copy to pinned memory of `count` rows of h
  // (rows relative to the slice), on the compute stream.
  absl::Status LaunchLogitBatch(const int64_t* rows, int64_t count);
  // PrepareGca's two halves. The host's: the selections serving the slice's
  // runs in `group`, their chunks made resident (copies queued on the fetch
  // stream), the slot table written to the group's pinned staging once its
  // previous upload is done; returns the table's entries. The device's: the
  // table's upload from that staging on the compute stream.
  absl::StatusOr<int64_t> StageSlotTable(const SlicePlan& slice, int64_t group);
  absl::Status UploadSlotTable(int64_t group, int64_t entries);
  // While a decode graph is captured: the device scalar its kernels read the
  // position from (kernels' device_first_pos); nullptr otherwise.
  const int64_t* captured_position() const {
    return capturing_ ? graphs_.device_position() : nullptr;
  }
  // CudaBackendOptions::decode_fused_gemv: whether a slice of n rows runs
  // the fused decode GEMVs (engine/cuda/fused_decode_ops.h) instead of the
  // norm and cuBLAS launches (at most 8 rows: kernels/decode_gemv_plan.h).
  bool FusedGemvRows(int64_t n) const {
    return kernels::UseDecodeGemv(options_.decode_fused_gemv, n);
  }

  const ModelConfig& config_;
  const DeviceWeights<T>& weights_;
  CudaBackendOptions options_;
  SessionSizes sizes_;
  std::shared_ptr<HostAllocator> host_allocator_;

  Stream compute_stream_, fetch_stream_, store_stream_;
  // Declared after the streams so that they are destroyed before them.
  std::unique_ptr<kernels::CublasGemm> gemm_;
  // The fetch stream's GEMMs (encoder rows only): a CublasGemm's workspace
  // must not serve two streams at once.
  std::unique_ptr<kernels::CublasGemm> fetch_gemm_;
  Event encoded_;                  // compute: enc_k/enc_v (or enc_rows) written
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
  // The device tier (CudaChunkTier::kDevice, or kAuto's choice for this
  // session, fixed at creation): closed chunks' K/V live in device_store_
  // and chunk_store_ stays empty; kAuto's grant of device bytes is given
  // back when the session goes.
  // (Declared before the store, so that the grant goes back after the
  // store's memory is freed.)
  bool device_tier_ = false;
  std::shared_ptr<DeviceTierLedger> tier_ledger_;
  DeviceTierGrant tier_grant_;
  DeviceChunkStore<T> device_store_;
  // The disk tier: chunks read from mapped files (their records are
  // released from chunk_store_), and the pinned staging their fetches go
  // through, made on first use; staging_copied_[i]: the fetch stream's
  // latest copy from staging slot i done.
  MappedChunkTable mapped_chunks_;
  std::unique_ptr<ChunkStaging<HostElement<T>>> staging_;
  std::vector<Event> staging_copied_;
  // Chunks encoded in the step being run are read from enc_k/enc_v, or
  // enc_rows in the encoder-rows store (not yet, or not surely, in the host
  // store): [first, first + count).
  int64_t step_first_new_chunk_ = 0;
  int64_t step_new_chunks_ = 0;
  std::vector<ChunkResidency> residency_;  // per group
  std::vector<Retrieval> selection_;       // in force now, per group
  // Per group: the selections made at the slice's landmarks, in the order
  // of SlicePlan::landmarks (GcaRun::made_at indexes them); `collected`
  // once read back.
  struct Made {
    std::vector<Retrieval> at_landmark;
    bool launched = false;
    bool collected = false;
  };
  std::vector<Made> made_;
  // The last logit batch QueueLogits left in flight: where its rows go.
  float* pending_logits_ = nullptr;
  int64_t pending_logit_rows_ = 0;
  RetrievalObserver observer_;
  BackendSessionStats stats_;
  // Set after a CUDA error mid-step: the device state may be half updated.
  absl::Status failed_;
  // CudaBackendOptions::decode_graphs: the session's graphs (made at Init
  // with the option, else empty), and whether the slice ops are being
  // captured into one now: they then read the position from the device,
  // and leave the host waits, the host staging and the event records to
  // LaunchDecodeGraph, around the launch.
  DecodeGraphs graphs_;
  bool capturing_ = false;
};

}  // namespace drt::cuda

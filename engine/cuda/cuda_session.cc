#include "engine/cuda/cuda_session.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend_factory.h"
#include "engine/cuda/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/elementwise.h"
#include "kernels/landmark_topk.h"

namespace drt::cuda {
namespace {

// The landmark top-k kernel scores at most this many chunks
// (kernels/landmark_topk.h).
constexpr int64_t kMaxLandmarks = int64_t{1} << 20;
constexpr int64_t kFirstLandmarkCapacity = 1024;

// The most chunks a device store grows to unless a session needs more: those
// of the largest context (auto_tier_max_tokens, drt-server's
// --max_context_tokens), when known (DeviceStoreGrowthLimits::cap_chunks).
int64_t DeviceStoreCap(const ModelConfig& config, const CudaBackendOptions& options) {
  const int64_t chunks = MaxChunksForTokens(options.auto_tier_max_tokens, config.enc_chunk_size);
  return chunks > 0 ? chunks : std::numeric_limits<int64_t>::max();
}

}  // namespace

template <typename T>
CudaSession<T>::CudaSession(const ModelConfig& config, const DeviceWeights<T>& weights,
                            const CudaBackendOptions& options,
                            std::shared_ptr<HostAllocator> host_allocator,
                            std::shared_ptr<DeviceTierLedger> tier_ledger)
    : config_(config),
      weights_(weights),
      options_(options),
      sizes_(ComputeSessionSizes(config, options.max_step_positions)),
      host_allocator_(std::move(host_allocator)),
      chunk_store_(NewChunkStore(config, options, host_allocator_)),
      tier_ledger_(std::move(tier_ledger)),
      device_store_(sizes_.chunk * sizes_.d, DeviceStoreCap(config, options)) {}

template <typename T>
HostChunkStore<HostElement<T>> CudaSession<T>::NewChunkStore(
    const ModelConfig& config, const CudaBackendOptions& options,
    std::shared_ptr<HostAllocator> allocator) {
  return HostChunkStore<HostElement<T>>(
      ChunkRecordLayoutFor(config, EffectiveChunkStore(options)), std::move(allocator),
      // MakeCudaBackend refused a max_slab_chunks below 1.
      CudaSlabOptions(options.max_slab_chunks).value_or(HostChunkStoreOptions{}));
}

template <typename T>
absl::StatusOr<std::unique_ptr<CudaSession<T>>> CudaSession<T>::Create(
    const ModelConfig& config, const DeviceWeights<T>& weights, const CudaBackendOptions& options,
    std::shared_ptr<HostAllocator> host_allocator, std::shared_ptr<DeviceTierLedger> tier_ledger) {
  return CreateOnTier(config, weights, options, std::move(host_allocator), std::move(tier_ledger),
                      /*allow_device_tier=*/true);
}

template <typename T>
absl::StatusOr<std::unique_ptr<CudaSession<T>>> CudaSession<T>::CreateOnTier(
    const ModelConfig& config, const DeviceWeights<T>& weights, const CudaBackendOptions& options,
    std::shared_ptr<HostAllocator> host_allocator, std::shared_ptr<DeviceTierLedger> tier_ledger,
    bool allow_device_tier) {
  auto session = std::unique_ptr<CudaSession>(new CudaSession(
      config, weights, options, std::move(host_allocator), std::move(tier_ledger)));
  if (absl::Status s = session->Init(allow_device_tier); !s.ok()) return s;
  return session;
}

template <typename T>
absl::Status CudaSession<T>::Init(bool allow_device_tier) {
  DRT_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device_index), "cudaSetDevice");
  // Init launches a kernel with decode_graphs: a runtime error an earlier
  // failed call on this thread left set (reported then) must not fail it
  // (as in CudaBackend::Step).
  (void)cudaGetLastError();
  auto gemm = kernels::CublasGemm::Create();
  if (!gemm.ok()) return gemm.status();
  gemm_ = std::make_unique<kernels::CublasGemm>(*std::move(gemm));
  for (Stream* s : {&compute_stream_, &fetch_stream_, &store_stream_}) {
    auto made = Stream::Create();
    if (!made.ok()) return made.status();
    *s = *std::move(made);
  }
  for (Event* e : {&encoded_, &stored_, &fetch_tail_, &ids_uploaded_}) {
    auto made = Event::Create();
    if (!made.ok()) return made.status();
    *e = *std::move(made);
  }
  for (auto* list : {&topk_ready_, &gca_done_, &fetched_, &uploads_done_}) {
    for (int64_t g = 0; g < sizes_.groups; ++g) {
      auto made = Event::Create();
      if (!made.ok()) return made.status();
      list->push_back(*std::move(made));
    }
  }
  DRT_RETURN_IF_ERROR(ChooseTier(allow_device_tier));
  int64_t fetch_batch_chunks = 0;
  if (stores_encoder_rows() && !options_.disable_gca) {
    fetch_batch_chunks = FetchBatchCapacity(sizes_.topk, sizes_.slots_per_group);
    auto fetch_gemm = kernels::CublasGemm::Create();
    if (!fetch_gemm.ok()) return fetch_gemm.status();
    fetch_gemm_ = std::make_unique<kernels::CublasGemm>(*std::move(fetch_gemm));
  }
  auto buffers =
      SessionBuffers<T>::Create(sizes_, !options_.disable_gca, fetch_batch_chunks, device_tier_);
  if (!buffers.ok()) return buffers.status();
  buffers_ = *std::move(buffers);
  if (buffers_.fetch_rows.size() > 0) {
    // Every fetch GEMM reads all staging entries (cuda_retrieval.cc,
    // FetchEncoderRows): rows never staged are zeros, not whatever the
    // allocation held. The host waits, so the fetch stream's first use
    // comes after.
    DRT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffers_.fetch_rows.get(), 0,
                                             buffers_.fetch_rows.bytes(), compute_stream_.get()),
                             "zeroing the fetch staging");
    DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_.get()),
                             "waiting for the fetch staging");
  }
  if (!options_.disable_gca) DRT_RETURN_IF_ERROR(EnsureLandmarkCapacity(kFirstLandmarkCapacity));
  if (options_.decode_graphs) {
    auto graphs = DecodeGraphs::Create();
    if (!graphs.ok()) return graphs.status();
    graphs_ = *std::move(graphs);
    if (!options_.disable_gca) {
      // The one kernel only a capture runs (CloseChunks copies the row with
      // a memcpy in an eager step): launched once here, so that its module
      // is loaded outside any capture. One row of the open chunk into the
      // step's rows (written by every step before they are read), at a
      // zeroed device position. The row it reads is zeroed first: harmless
      // either way, but compute-sanitizer's initcheck reports a read of
      // memory never written (review-cuda F5), and would drown what it is
      // run for in this.
      cudaStream_t stream = compute_stream_.get();
      DRT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(graphs_.mutable_device_position(), 0,
                                               sizeof(int64_t), stream),
                               "zeroing the decode graphs' position");
      DRT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffers_.open_chunk.get(), 0,
                                               sizes_.d * sizeof(float), stream),
                               "zeroing the open chunk's first row");
      DRT_CUDA_RETURN_IF_ERROR(
          kernels::LaunchCopyRowsAtChunkOffset(buffers_.open_chunk.get(), 1,
                                               static_cast<int>(sizes_.d),
                                               graphs_.device_position(), 1, buffers_.h.get(),
                                               stream),
          "LaunchCopyRowsAtChunkOffset (loading its module before any capture)");
    }
  }
  residency_.assign(sizes_.groups, ChunkResidency(static_cast<int>(sizes_.slots_per_group)));
  selection_.assign(sizes_.groups, Retrieval{});
  made_.assign(sizes_.groups, Made{});
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::ChooseTier(bool allow_device_tier) {
  // The tier, once for the session's life (docs/cuda.md, "Device tier").
  // MakeCudaBackend refuses kDevice and kAuto with a store of encoder rows.
  if (!allow_device_tier || options_.disable_gca || stores_encoder_rows()) return absl::OkStatus();
  // The device store exists from the start: GCA runs before the first
  // chunk closes (every slot -1), and the kernel refuses null chunk arrays.
  // kAuto's is made whole now, before the session's other buffers (its
  // grant covers exactly this), so it never grows while the session stays
  // within auto_tier_max_tokens; kDevice's starts at the first doubling
  // capacity.
  auto allocate = [this](int64_t chunks) {
    return TierStatus(device_store_.Reserve(chunks, /*exact=*/true, compute_stream_.get()));
  };
  switch (options_.chunk_tier) {
    case CudaChunkTier::kHost:
      return absl::OkStatus();
    case CudaChunkTier::kDevice:
      device_tier_ = true;
      stats_.chunks_on_device = true;
      return allocate(DeviceChunkStore<T>::kFirstCapacity);
    case CudaChunkTier::kAuto: {
      size_t free_bytes = 0, total_bytes = 0;
      DRT_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
      absl::StatusOr<AutoTierChoice> choice =
          ChooseAutoTier(tier_ledger_, static_cast<int64_t>(free_bytes),
                         options_.auto_tier_max_tokens, config_.enc_chunk_size,
                         device_chunk_bytes(), allocate);
      if (!choice.ok()) return choice.status();
      device_tier_ = choice->device;
      tier_grant_ = std::move(choice->grant);
      stats_.chunks_on_device = device_tier_;
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::TierStatus(absl::Status status) const {
  if (status.code() != absl::StatusCode::kResourceExhausted) return status;
  const bool automatic = options_.chunk_tier == CudaChunkTier::kAuto;
  return absl::ResourceExhaustedError(absl::StrCat(
      "chunk tier ", CudaChunkTierName(options_.chunk_tier),
      automatic ? " (which chose the device for this session)" : "",
      " (drt-server --cuda_chunk_tier, drt-bench --chunk_tier): ", status.message()));
}

template <typename T>
CudaSession<T>::~CudaSession() {
  // Copies into the host store and kernels reading our buffers may still run:
  // finish them before any of it is freed. Errors cannot be reported here.
  if (cudaSetDevice(options_.device_index) != cudaSuccess) return;
  for (const Stream* s : {&compute_stream_, &fetch_stream_, &store_stream_}) {
    if (s->get() != nullptr) cudaStreamSynchronize(s->get());
  }
}

template <typename T>
absl::Status CudaSession<T>::EnsureLandmarkCapacity(int64_t chunks) {
  const int64_t capacity = static_cast<int64_t>(landmarks_.size()) / sizes_.d;
  if (chunks <= capacity && topk_workspace_.size() > 0) return absl::OkStatus();
  if (chunks > kMaxLandmarks) {
    return absl::OutOfRangeError(absl::StrFormat(
        "%d chunks: the CUDA backend scores at most %d landmarks", chunks, kMaxLandmarks));
  }
  int64_t grown = std::max(capacity, kFirstLandmarkCapacity);
  while (grown < chunks) grown *= 2;
  grown = std::min(grown, kMaxLandmarks);
  // A full device fails this session alone, as RESOURCE_EXHAUSTED
  // (ReserveForStep's contract), before anything changed; the runtime's
  // error is cleared (DeviceArray::Create), so the step's other sessions
  // launch clean.
  auto growth_failure = [&](const absl::Status& s) {
    if (s.code() != absl::StatusCode::kResourceExhausted) return s;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the landmark matrix cannot grow from %d to %d chunks (%d positions) on the device: %s",
        capacity, grown, grown * sizes_.chunk, s.message()));
  };
  auto landmarks = DeviceArray<float>::Create(grown * sizes_.d, "landmarks");
  if (!landmarks.ok()) return growth_failure(landmarks.status());
  const size_t ws_bytes = kernels::LandmarkTopKWorkspaceBytes(
      grown, static_cast<int>(sizes_.max_query_chunks), static_cast<int>(sizes_.topk));
  auto workspace = DeviceArray<char>::Create(std::max<size_t>(ws_bytes, 1), "landmark top-k");
  if (!workspace.ok()) return growth_failure(workspace.status());
  const int64_t held = closed_chunks();
  if (held > 0) {
    DRT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(landmarks->get(), landmarks_.get(), held * sizes_.d * sizeof(float),
                        cudaMemcpyDeviceToDevice, compute_stream_.get()),
        "copying landmarks into the grown matrix");
  }
  // Kernels queued earlier may read the old matrix and workspace.
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_.get()),
                           "waiting before the landmark matrix grows");
  landmarks_ = *std::move(landmarks);
  topk_workspace_ = *std::move(workspace);
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::PrepareSlice(const SlicePlan& slice) {
  if (!failed_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this CUDA session failed earlier and its state is lost: ", failed_.message()));
  }
  const int64_t S = sizes_.chunk;
  const int64_t closed = static_cast<int64_t>(slice.landmarks.size());
  // The device buffers hold max_rows rows and max_query_chunks chunks; the
  // plan's landmarks and runs must be the ones its positions imply (the
  // strided landmark gather and the slot table rely on it).
  if (slice.num_rows < 1 || slice.num_rows > sizes_.max_rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a slice of %d rows: the CUDA session holds 1..%d", slice.num_rows, sizes_.max_rows));
  }
  if (slice.first_position != position_ || slice.open_rows_before != position_ % S ||
      closed != (slice.open_rows_before + slice.num_rows) / S ||
      static_cast<int64_t>(slice.runs.size()) !=
          (position_ + slice.num_rows - 1) / S - position_ / S + 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a slice of %d rows at position %d with %d landmarks and %d runs is not the plan of "
        "this session at position %d",
        slice.num_rows, slice.first_position, closed, slice.runs.size(), position_));
  }
  for (int64_t j = 0; j < closed; ++j) {
    const PlannedLandmark& landmark = slice.landmarks[j];
    const int64_t row = S - 1 - slice.open_rows_before + j * S;  // in the slice
    if (landmark.row != slice.first_row + row || landmark.chunk != (position_ + row) / S) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the slice's landmark %d at row %d (chunk %d) is not at its chunk end", j, landmark.row,
          landmark.chunk));
    }
  }
  // Made by ReserveForStep already when the step came through RunStep.
  return ReserveForStep(position_ + slice.num_rows);
}

template <typename T>
absl::Status CudaSession<T>::ReserveForStep(int64_t end_position) {
  if (!failed_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this CUDA session failed earlier and its state is lost: ", failed_.message()));
  }
  if (end_position < position_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a step to decoder position %d: the session is at %d already", end_position, position_));
  }
  if (options_.disable_gca) return absl::OkStatus();
  const int64_t chunks = end_position / sizes_.chunk;
  if (chunks > kMaxLandmarks) {
    return absl::OutOfRangeError(absl::StrFormat(
        "%d decoder positions: the CUDA backend holds at most %d chunks", end_position,
        kMaxLandmarks));
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device_index), "cudaSetDevice");
  DRT_RETURN_IF_ERROR(EnsureLandmarkCapacity(chunks));
  // The encoder writes the step's chunks into the device store in place:
  // room for them now, before anything is queued (a growth waits for the
  // compute stream, so no queued kernel reads the old arrays after).
  if (device_tier_) return ReserveDeviceStore(chunks);
  // The host tier's pinned slabs likewise: EncodeChunks, mid-step, then
  // allocates nothing, so a host short of pinned memory fails this session
  // here, alone, and no slab is pinned while the step's other sessions
  // wait.
  const int64_t more = chunks - chunk_store_.size();
  if (more <= 0) return absl::OkStatus();
  if (absl::Status s = chunk_store_.Reserve(more); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the pinned host chunk store (chunk tier host) "
                                               "cannot hold the step's chunks: ",
                                               s.message()));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::ReserveDeviceStore(int64_t chunks) {
  const T* keys_before = device_store_.keys();
  const T* values_before = device_store_.values();
  DRT_RETURN_IF_ERROR(
      TierStatus(device_store_.Reserve(chunks, /*exact=*/false, compute_stream_.get())));
  // A decode graph captured the store's arrays as GCA arguments: a growth
  // moved them (and waited for the compute stream, so no replay is in
  // flight), so the graphs are captured again.
  if (device_store_.keys() != keys_before || device_store_.values() != values_before) {
    graphs_.Clear();
  }
  // kAuto: a session past auto_tier_max_tokens (the server stops it there;
  // a direct caller may not) still grows, and the ledger counts the bytes.
  if (tier_grant_.bytes() > 0 && device_store_.bytes() > tier_grant_.bytes()) {
    tier_grant_.Grow(device_store_.bytes() - tier_grant_.bytes());
  }
  return absl::OkStatus();
}

template <typename T>
void CudaSession<T>::MarkFailed(const absl::Status& status) {
  if (failed_.ok()) failed_ = status;
  // Never launched again. A launch may still be in flight: let it end before
  // its executable graph is destroyed (its error, if any, is failed_'s).
  if (graphs_.size() > 0) {
    (void)cudaStreamSynchronize(compute_stream_.get());
    graphs_.Clear();
  }
}

template <typename T>
absl::Status CudaSession<T>::Embed(const StepPlan& plan, const SlicePlan& slice) {
  const int64_t n = slice.num_rows;
  cudaStream_t stream = compute_stream_.get();
  if (!capturing_) {
    // Through pinned staging (a pageable source may synchronise the
    // stream); the previous step's upload must have read it first. A
    // decode graph's head reads the staging LaunchDecodeGraph wrote before
    // the launch instead.
    DRT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ids_uploaded_.get()),
                             "waiting for the previous id upload");
    std::memcpy(buffers_.ids_host.get(), plan.ids.data() + slice.first_row, n * sizeof(int32_t));
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffers_.ids.get(), buffers_.ids_host.get(),
                                           n * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
                           "uploading token ids");
  if (capturing_) {
    // The graph's other head node: the position, from its pinned staging.
    // The events and the step's bookkeeping are LaunchDecodeGraph's, around
    // the launch (events recorded in a capture are internal to the graph).
    DRT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(graphs_.mutable_device_position(), graphs_.host_position(),
                        sizeof(int64_t), cudaMemcpyHostToDevice, stream),
        "uploading the position (captured)");
  } else {
    DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(ids_uploaded_.get(), stream),
                             "recording the id upload");
    BeginStep();
  }
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchEmbeddingGather(buffers_.ids.get(), static_cast<int>(n),
                                     weights_.embed_tokens, static_cast<int>(sizes_.d),
                                     buffers_.h.get(), stream),
      "LaunchEmbeddingGather");
  return absl::OkStatus();
}

template <typename T>
void CudaSession<T>::BeginStep() {
  step_first_new_chunk_ = closed_chunks();
  step_new_chunks_ = 0;
  for (Made& made : made_) made = Made{};
}

template <typename T>
absl::Status CudaSession<T>::LoadRows(const float* h, int64_t n) {
  if (n < 1 || n > sizes_.max_rows) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d rows: the CUDA session holds 1..%d", n, sizes_.max_rows));
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffers_.h.get(), h, n * sizes_.d * sizeof(float),
                                           cudaMemcpyDeviceToDevice, compute_stream_.get()),
                           "copying the slice's rows from the step's buffer");
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::CloseChunks(const SlicePlan& slice) {
  if (options_.disable_gca) return absl::OkStatus();
  const int64_t S = sizes_.chunk;
  const int64_t d = sizes_.d;
  const int64_t n = slice.num_rows;
  const int64_t open = slice.open_rows_before;
  const int64_t closed = static_cast<int64_t>(slice.landmarks.size());
  const size_t row_bytes = d * sizeof(float);
  cudaStream_t stream = compute_stream_.get();
  float* h = buffers_.h.get();
  float* open_rows = buffers_.open_chunk.get();
  if (capturing_) {
    // A decode graph's row enters the open chunk at the row its position
    // (read on the device) says; a graph never closes a chunk
    // (DecideDecodeGraph).
    if (closed != 0) return absl::InternalError("a decode graph cannot close a chunk");
    DRT_CUDA_RETURN_IF_ERROR(
        kernels::LaunchCopyRowsAtChunkOffset(h, static_cast<int>(n), static_cast<int>(d),
                                             captured_position(), static_cast<int>(S), open_rows,
                                             stream),
        "LaunchCopyRowsAtChunkOffset (the open chunk's rows)");
    return absl::OkStatus();
  }
  if (closed == 0) {
    DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(open_rows + open * d, h, n * row_bytes,
                                             cudaMemcpyDeviceToDevice, stream),
                             "keeping the open chunk's rows");
    return absl::OkStatus();
  }
  // The lower-layer rows of every chunk the slice closes, in buffers_.mixed:
  // the open chunk's earlier rows, then the slice's.
  float* rows = buffers_.mixed.get();
  const int64_t from_slice = closed * S - open;
  if (open > 0) {
    DRT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(rows, open_rows, open * row_bytes, cudaMemcpyDeviceToDevice, stream),
        "gathering the open chunk's rows");
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rows + open * d, h, from_slice * row_bytes,
                                           cudaMemcpyDeviceToDevice, stream),
                           "gathering closed chunks' rows");
  DRT_RETURN_IF_ERROR(EncodeChunks(closed));
  if (n > from_slice) {
    DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(open_rows, h + from_slice * d,
                                             (n - from_slice) * row_bytes,
                                             cudaMemcpyDeviceToDevice, stream),
                             "keeping the open chunk's rows");
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::CommitSelections(const SlicePlan& slice) {
  if (options_.disable_gca) return absl::OkStatus();
  for (int64_t g = 0; g < sizes_.groups; ++g) {
    DRT_RETURN_IF_ERROR(CollectRetrieval(slice, g));
    if (!made_[g].at_landmark.empty()) selection_[g] = std::move(made_[g].at_landmark.back());
    // Its selection serves only the next chunk: start copying it now
    // (drt-model.md, "What follows for the engine": first needed by the
    // next position), overlapping the logits, sampling and the next step's
    // lower layers. The device tier has nothing to copy.
    if (slice.ends_on_landmark && !device_tier_) {
      std::vector<int> slots;
      DRT_RETURN_IF_ERROR(FetchChunks(g, selection_[g].chunks, &slots));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::LaunchLogitBatch(const int64_t* rows, int64_t count) {
  const int64_t d = sizes_.d;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  cudaStream_t stream = compute_stream_.get();
  // Runs of consecutive rows are normalised by one launch each.
  for (int64_t w = 0; w < count;) {
    int64_t run = 1;
    while (w + run < count && rows[w + run] == rows[w] + run) ++run;
    DRT_CUDA_RETURN_IF_ERROR(
        kernels::LaunchRmsNorm(buffers_.h.get() + rows[w] * d, weights_.norm,
                               static_cast<int>(run), static_cast<int>(d), eps,
                               buffers_.final_normed.get() + w * d, stream),
        "LaunchRmsNorm (final norm)");
    w += run;
  }
  DRT_RETURN_IF_ERROR(gemm_->Matmul(buffers_.final_normed.get(), weights_.lm_head,
                                    buffers_.logits.get(), static_cast<int>(count),
                                    static_cast<int>(sizes_.vocab), static_cast<int>(d),
                                    /*accumulate=*/false, stream));
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffers_.logits_host.get(), buffers_.logits.get(),
                                           count * sizes_.vocab * sizeof(float),
                                           cudaMemcpyDeviceToHost, stream),
                           "copying logits to the host");
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::QueueLogits(const SlicePlan& slice, absl::Span<const int64_t> rows,
                                         absl::Span<float> logits) {
  const int64_t V = sizes_.vocab;
  const int64_t total = static_cast<int64_t>(rows.size());
  std::vector<int64_t> local(total);  // rows of the session's h
  for (int64_t i = 0; i < total; ++i) {
    local[i] = rows[i] - slice.first_row;
    if (local[i] < 0 || local[i] >= slice.num_rows) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit row %d lies outside its slice (rows %d..%d)", rows[i], slice.first_row,
          slice.first_row + slice.num_rows - 1));
    }
  }
  for (int64_t b0 = 0; b0 < total; b0 += sizes_.logit_rows) {
    const int64_t m = std::min(sizes_.logit_rows, total - b0);
    DRT_RETURN_IF_ERROR(LaunchLogitBatch(local.data() + b0, m));
    pending_logits_ = logits.data() + b0 * V;
    pending_logit_rows_ = m;
    if (b0 + m < total) DRT_RETURN_IF_ERROR(FinishLogits());
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::FinishLogits() {
  if (pending_logit_rows_ == 0) return absl::OkStatus();
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_.get()),
                           "waiting for the logits");
  std::memcpy(pending_logits_, buffers_.logits_host.get(),
              pending_logit_rows_ * sizes_.vocab * sizeof(float));
  pending_logits_ = nullptr;
  pending_logit_rows_ = 0;
  return absl::OkStatus();
}

template <typename T>
void CudaSession<T>::Finish(const SlicePlan& slice) {
  position_ += slice.num_rows;
}

template <typename T>
SessionMemory CudaSession<T>::memory() const {
  SessionMemory m;
  // Host memory: the pinned chunk store and the selections; window rings,
  // open chunk and landmarks live on the GPU (device_bytes).
  m.chunk_store_bytes = chunk_store_.bytes();
  m.shared_bytes = chunk_store_.shared_bytes();
  m.shared_elsewhere_bytes = chunk_store_.shared_elsewhere_bytes();
  for (const Retrieval& r : selection_) {
    m.selection_bytes +=
        r.chunks.capacity() * sizeof(int64_t) + r.weights.capacity() * sizeof(float);
  }
  // The session's page-locked staging (top-k results, uploads, 64 rows of
  // logits: 13 MB at a 50K vocabulary) is host memory too. SessionMemory has
  // no kind for it; it is bounded like the selections, so it is counted there
  // rather than left out of total(), which the server budgets.
  m.selection_bytes += buffers_.pinned_bytes();
  // The disk tier's staging likewise (a few chunks, only once it maps).
  if (staging_ != nullptr) m.selection_bytes += staging_->bytes();
  m.mapped_chunk_bytes = mapped_chunks_.encoder_row_bytes();
  m.device_bytes = buffers_.device_bytes() + landmarks_.bytes() + topk_workspace_.bytes() +
                   device_store_.bytes();
  return m;
}

template <typename T>
absl::StatusOr<std::unique_ptr<BackendSession>> CudaSession<T>::Fork() const {
  if (!failed_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot fork a CUDA session that failed: ", failed_.message()));
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device_index), "cudaSetDevice");
  // Everything queued must land first: the store's last records, the rings.
  for (const Stream* s : {&compute_stream_, &fetch_stream_, &store_stream_}) {
    DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s->get()), "waiting for the session to fork");
  }
  // A host-tier session's fork stays on the host (it shares the records); a
  // device-tier session's fork takes the device tier again when it may
  // (kDevice always, kAuto when the ledger grants it).
  auto fork = CreateOnTier(config_, weights_, options_, host_allocator_, tier_ledger_,
                           /*allow_device_tier=*/device_tier_);
  if (!fork.ok()) return fork.status();
  CudaSession& f = **fork;
  cudaStream_t stream = f.compute_stream_.get();
  auto copy = [&](void* dst, const void* src, size_t bytes, const char* what) -> absl::Status {
    if (bytes == 0) return absl::OkStatus();
    DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream),
                             what);
    return absl::OkStatus();
  };
  for (size_t l = 0; l < buffers_.rings.size(); ++l) {
    DRT_RETURN_IF_ERROR(copy(f.buffers_.rings[l].k.get(), buffers_.rings[l].k.get(),
                             buffers_.rings[l].k.bytes(), "forking window keys"));
    DRT_RETURN_IF_ERROR(copy(f.buffers_.rings[l].v.get(), buffers_.rings[l].v.get(),
                             buffers_.rings[l].v.bytes(), "forking window values"));
  }
  DRT_RETURN_IF_ERROR(copy(f.buffers_.open_chunk.get(), buffers_.open_chunk.get(),
                           buffers_.open_chunk.bytes(), "forking the open chunk"));
  if (!options_.disable_gca) {
    DRT_RETURN_IF_ERROR(f.EnsureLandmarkCapacity(closed_chunks()));
    DRT_RETURN_IF_ERROR(copy(f.landmarks_.get(), landmarks_.get(),
                             closed_chunks() * sizes_.d * sizeof(float), "forking landmarks"));
    if (device_tier_) DRT_RETURN_IF_ERROR(ForkDeviceChunks(f));
    // The retrieved chunks too, so the fork's first steps need no refetch.
    for (size_t g = 0; g < buffers_.group_chunks.size(); ++g) {
      DRT_RETURN_IF_ERROR(copy(f.buffers_.group_chunks[g].k.get(),
                               buffers_.group_chunks[g].k.get(),
                               buffers_.group_chunks[g].k.bytes(), "forking retrieved keys"));
      DRT_RETURN_IF_ERROR(copy(f.buffers_.group_chunks[g].v.get(),
                               buffers_.group_chunks[g].v.get(),
                               buffers_.group_chunks[g].v.bytes(), "forking retrieved values"));
    }
    f.residency_ = residency_;
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "waiting for the fork's copies");
  f.position_ = position_;
  if (!device_tier_) f.chunk_store_ = chunk_store_;  // shares every slab
  f.mapped_chunks_ = mapped_chunks_;  // and every mapping (its staging is its own)
  // The staging its fetches of mapped chunks go through, made now as
  // MapChunks and ImportState make theirs: a host short of pinned memory
  // fails this Fork, not a later step of every session in the fork's
  // forward.
  if (!f.mapped_chunks_.empty()) DRT_RETURN_IF_ERROR(f.EnsureStaging());
  f.selection_ = selection_;
  return std::unique_ptr<BackendSession>(std::move(*fork));
}

template <typename T>
absl::Status CudaSession<T>::ForkDeviceChunks(CudaSession& f) const {
  const int64_t n = device_store_.size();
  cudaStream_t stream = f.compute_stream_.get();
  if (f.device_tier_) {
    // Copied, not shared: both append their own chunks from n on. (A shared
    // read-only prefix would need a second array per store for the GCA
    // kernel's one base pointer.)
    DRT_RETURN_IF_ERROR(f.device_store_.CopyFrom(device_store_, n, /*exact=*/false, stream));
    if (f.tier_grant_.bytes() > 0 && f.device_store_.bytes() > f.tier_grant_.bytes()) {
      f.tier_grant_.Grow(f.device_store_.bytes() - f.tier_grant_.bytes());
    }
    return absl::OkStatus();
  }
  // kAuto had no room for the fork on the device: its chunks go to its
  // pinned host store, record by record (K block, V block).
  absl::StatusOr<int64_t> first = f.chunk_store_.AppendUninitialized(n);
  if (!first.ok()) return first.status();
  const size_t block = static_cast<size_t>(device_store_.block_bytes());
  for (int64_t c = 0; c < n; ++c) {
    DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(f.chunk_store_.mutable_keys(*first + c),
                                             device_store_.keys(c), block,
                                             cudaMemcpyDeviceToHost, stream),
                             "forking chunk keys to the host tier");
    DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(f.chunk_store_.mutable_values(*first + c),
                                             device_store_.values(c), block,
                                             cudaMemcpyDeviceToHost, stream),
                             "forking chunk values to the host tier");
  }
  return absl::OkStatus();
}

template class CudaSession<bf16>;
template class CudaSession<float>;

}  // namespace drt::cuda

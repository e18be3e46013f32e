// The blocks of the forward pass on the device (drt-model.md, Forward pass 3,
// 4, 6, 7) and the slice ops that run them, each the twin of a CpuStep op
// (engine/cpu/cpu_step.cc).
#include <cuda_runtime_api.h>

#include <cmath>

#include "absl/status/status.h"
#include "engine/cuda/cuda_session.h"
#include "engine/cuda/debug_stream_delay.h"
#include "engine/cuda/fused_decode_ops.h"
#include "engine/cuda/status_macros.h"
#include "engine/model_rules.h"
#include "kernels/cuda_check.h"
#include "kernels/decode_gemv_plan.h"
#include "kernels/elementwise.h"
#include "kernels/encoder_attention.h"
#include "kernels/gca_attention.h"
#include "kernels/window_attention.h"

namespace drt::cuda {

template <typename T>
absl::Status CudaSession<T>::Attention(const SlicePlan& slice, int64_t layer_index,
                                       const DeviceLayer<T>& layer) {
  return AttentionBlock(layer_index, layer, slice.num_rows, slice.first_position);
}

template <typename T>
absl::Status CudaSession<T>::Mlp(const SlicePlan& slice, const DeviceLayer<T>& layer) {
  return MlpBlock(layer, buffers_.h.get(), buffers_.h.get(), slice.num_rows,
                  static_cast<float>(config_.rms_norm_eps));
}

template <typename T>
absl::Status CudaSession<T>::GcaMlp(const SlicePlan& slice, int64_t group,
                                    const DeviceUpperLayer<T>& layer) {
  if (options_.disable_gca) {
    // The base LM: the upper layer without its GCA (h = h + MLP(RMSNorm2(h))).
    return Mlp(slice, layer.base);
  }
  // The query chunk of position p is p / S - first_position / S: the
  // index of its run in slice.runs, the row of the slot table PrepareGca
  // uploaded.
  return GcaBlock(group, layer, slice.num_rows, slice.first_position,
                  slice.first_position / sizes_.chunk);
}

template <typename T>
absl::Status CudaSession<T>::WindowAttentionRows(int64_t layer_index, const AttentionRows<T>& rows,
                                                 int64_t n, int64_t first_pos) {
  // Attention of the n new positions over the window (ring + themselves),
  // then their keys and values enter the ring.
  cudaStream_t stream = compute_stream_.get();
  WindowRing<T>& ring = buffers_.rings[layer_index];
  kernels::WindowAttentionParams<T> p;
  p.q = rows.q;
  p.k_new = rows.k_new;
  p.v_new = rows.v_new;
  p.k_ring = ring.k.get();
  p.v_ring = ring.v.get();
  p.ring_slots = static_cast<int>(sizes_.ring_slots);
  p.window = static_cast<int>(sizes_.window);
  p.first_pos = first_pos;
  p.n = static_cast<int>(n);
  p.heads = static_cast<int>(sizes_.heads);
  p.kv_heads = static_cast<int>(sizes_.kv_heads);
  p.head_dim = static_cast<int>(sizes_.head_dim);
  p.out = rows.out;
  p.decode_splits = options_.window_decode_splits;
  p.prefill_tensor_cores = options_.prefill_tensor_cores;
  p.device_first_pos = captured_position();  // nullptr outside a decode graph's capture
  DRT_CUDA_RETURN_IF_ERROR(kernels::LaunchWindowAttention(p, stream), "LaunchWindowAttention");
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchWindowRingWrite(rows.k_new, rows.v_new, p.n, first_pos, p.ring_slots,
                                     p.kv_heads, p.head_dim, ring.k.get(), ring.v.get(), stream,
                                     p.device_first_pos),
      "LaunchWindowRingWrite");
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::GcaAttentionRows(int64_t group, const T* q, T* out, int64_t n,
                                              int64_t first_pos, int64_t first_query_chunk) {
  cudaStream_t stream = compute_stream_.get();
  SessionBuffers<T>& b = buffers_;
  kernels::GcaParams<T> p;
  p.q = q;
  // The device tier's slot table holds chunk ids: the kernel reads the
  // session's device store in place (cuda_retrieval.cc, PrepareGca).
  p.chunk_k = device_tier_ ? device_store_.keys() : b.group_chunks[group].k.get();
  p.chunk_v = device_tier_ ? device_store_.values() : b.group_chunks[group].v.get();
  p.slots = b.slot_table.get();
  p.weights = b.slot_weights.get();
  p.topk = static_cast<int>(sizes_.topk);
  p.first_pos = first_pos;
  p.first_query_chunk = first_query_chunk;
  p.n = static_cast<int>(n);
  p.heads = static_cast<int>(sizes_.heads);
  p.head_dim = static_cast<int>(sizes_.head_dim);
  p.out = out;
  p.prefill_tensor_cores = options_.prefill_tensor_cores;
  p.device_first_pos = captured_position();  // nullptr outside a decode graph's capture
  DRT_CUDA_RETURN_IF_ERROR(kernels::LaunchGcaAttention(p, stream), "LaunchGcaAttention");
  // The latest GCA reading the group's slots: chunk copies into them wait
  // for it (FetchChunks). An event recorded inside a capture is a node of
  // the graph that nothing outside it can wait for: LaunchDecodeGraph
  // records it after the launch instead.
  if (capturing_) return absl::OkStatus();
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(gca_done_[group].get(), stream),
                           "recording the group's GCA");
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaSession<T>::AttentionBlock(int64_t layer_index, const DeviceLayer<T>& layer,
                                            int64_t n, int64_t first_pos) {
  // h = h + Attn(RMSNorm1(h)); K/V of the new positions enter the ring.
  const int d = static_cast<int>(sizes_.d);
  const int kvw = static_cast<int>(sizes_.kv_width);
  const int rows = static_cast<int>(n);
  cudaStream_t stream = compute_stream_.get();
  SessionBuffers<T>& b = buffers_;
  const bool fused = FusedGemvRows(n);
  if (fused) {
    DRT_RETURN_IF_ERROR(FusedNormQkv(b.h.get(), layer, rows, FusedDecodeSizesOf(sizes_),
                                     static_cast<float>(config_.rms_norm_eps), b.q.get(),
                                     b.k_new.get(), b.v_new.get(), stream));
    ++stats_.fused_gemv_launches;
  } else {
    DRT_CUDA_RETURN_IF_ERROR(
        kernels::LaunchRmsNorm(b.h.get(), layer.input_norm, rows, d,
                               static_cast<float>(config_.rms_norm_eps), b.x.get(), stream),
        "LaunchRmsNorm (input_layernorm)");
    DRT_RETURN_IF_ERROR(gemm_->Matmul(b.x.get(), layer.q, b.q.get(), rows, d, d, stream));
    DRT_RETURN_IF_ERROR(gemm_->Matmul(b.x.get(), layer.k, b.k_new.get(), rows, kvw, d, stream));
    DRT_RETURN_IF_ERROR(gemm_->Matmul(b.x.get(), layer.v, b.v_new.get(), rows, kvw, d, stream));
  }
  DRT_RETURN_IF_ERROR(WindowAttentionRows(
      layer_index, AttentionRows<T>{b.q.get(), b.k_new.get(), b.v_new.get(), b.attn.get()}, n,
      first_pos));
  if (fused) {
    ++stats_.fused_gemv_launches;
    return FusedProjectAdd(b.attn.get(), layer.o, nullptr, rows, d, d, b.h.get(), stream);
  }
  return gemm_->Matmul(b.attn.get(), layer.o, b.h.get(), rows, d, d, /*accumulate=*/true, stream);
}

template <typename T>
absl::Status CudaSession<T>::MlpBlock(const DeviceLayer<T>& layer, const float* norm_input,
                                      float* out, int64_t n, float eps) {
  // out += down(silu(gate(x)) * up(x)), x = RMSNorm2(norm_input).
  const int d = static_cast<int>(sizes_.d);
  const int f = static_cast<int>(sizes_.f);
  const int rows = static_cast<int>(n);
  cudaStream_t stream = compute_stream_.get();
  SessionBuffers<T>& b = buffers_;
  if (FusedGemvRows(n)) {
    DRT_RETURN_IF_ERROR(FusedNormSwiGlu(norm_input, layer.post_norm, layer.gate_up, rows,
                                        FusedDecodeSizesOf(sizes_), eps, b.act.get(), stream));
    stats_.fused_gemv_launches += 2;  // with the down projection's, next
    return FusedProjectAdd(b.act.get(), layer.down, nullptr, rows, d, f, out, stream);
  }
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchRmsNorm(norm_input, layer.post_norm, rows, d, eps, b.x.get(), stream),
      "LaunchRmsNorm (post_attention_layernorm)");
  DRT_RETURN_IF_ERROR(gemm_->Matmul(b.x.get(), layer.gate_up, b.gate_up.get(), rows, 2 * f, d,
                                    stream));
  DRT_CUDA_RETURN_IF_ERROR(kernels::LaunchSwiGlu(b.gate_up.get(), rows, f, b.act.get(), stream),
                           "LaunchSwiGlu");
  return gemm_->Matmul(b.act.get(), layer.down, out, rows, d, f, /*accumulate=*/true, stream);
}

template <typename T>
absl::Status CudaSession<T>::GcaBlock(int64_t group, const DeviceUpperLayer<T>& layer, int64_t n,
                                      int64_t first_pos, int64_t first_query_chunk) {
  // Forward pass 6 after the attention: r = h; h = r + MLP(RMSNorm2(r + GCA(h))).
  // h is not written before the MLP's residual add, so h itself is r.
  const int d = static_cast<int>(sizes_.d);
  const int rows = static_cast<int>(n);
  const float eps = static_cast<float>(config_.rms_norm_eps);
  cudaStream_t stream = compute_stream_.get();
  SessionBuffers<T>& b = buffers_;
  if (FusedGemvRows(n)) {
    // mixed = h + gca_o(GCA(q)) in one launch: no copy of the residual.
    DRT_RETURN_IF_ERROR(FusedNormProject(b.h.get(), layer.gca_pre_norm, layer.gca_q, rows,
                                         FusedDecodeSizesOf(sizes_), eps, b.q.get(), stream));
    DRT_RETURN_IF_ERROR(
        GcaAttentionRows(group, b.q.get(), b.attn.get(), n, first_pos, first_query_chunk));
    DRT_RETURN_IF_ERROR(FusedProjectAdd(b.attn.get(), layer.gca_o, b.h.get(), rows, d, d,
                                        b.mixed.get(), stream));
    stats_.fused_gemv_launches += 2;  // the query's and the output's
    return MlpBlock(layer.base, b.mixed.get(), b.h.get(), n, eps);
  }
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchRmsNorm(b.h.get(), layer.gca_pre_norm, rows, d, eps, b.x.get(), stream),
      "LaunchRmsNorm (gca.pre_norm)");
  DRT_RETURN_IF_ERROR(gemm_->Matmul(b.x.get(), layer.gca_q, b.q.get(), rows, d, d, stream));
  DRT_RETURN_IF_ERROR(
      GcaAttentionRows(group, b.q.get(), b.attn.get(), n, first_pos, first_query_chunk));
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.mixed.get(), b.h.get(), n * d * sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream),
                           "copying the residual");
  DRT_RETURN_IF_ERROR(
      gemm_->Matmul(b.attn.get(), layer.gca_o, b.mixed.get(), rows, d, d, true, stream));
  return MlpBlock(layer.base, b.mixed.get(), b.h.get(), n, eps);
}

template <typename T>
absl::Status CudaSession<T>::EncodeChunks(int64_t count) {
  // Forward pass 4 on `count` chunks whose lower-layer rows are in
  // buffers_.mixed. Output: landmarks (device matrix); K/V with the landmark
  // row zero (enc_k/enc_v, then the host store), or with a store of encoder
  // rows C (enc_rows, then the host store).
  const int64_t S = sizes_.chunk;
  const int d = static_cast<int>(sizes_.d);
  const int rows = static_cast<int>(count * S);
  const int heads = static_cast<int>(sizes_.heads);
  cudaStream_t stream = compute_stream_.get();
  SessionBuffers<T>& b = buffers_;
  const int64_t first = closed_chunks();
  DRT_RETURN_IF_ERROR(EnsureLandmarkCapacity(first + count));
  // The device tier's room was made by PrepareSlice: growing here would
  // wait for the compute stream mid-step, and it must not be needed.
  if (device_tier_ && first + count > device_store_.capacity()) {
    return absl::InternalError(absl::StrFormat(
        "%d chunks to encode after %d: the device chunk store holds %d", count, first,
        device_store_.capacity()));
  }
  // enc_k/enc_v (or enc_rows) are rewritten below: the previous step's
  // store and fetch copies read them.
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, stored_.get(), 0),
                           "ordering the encoder after the store copies");
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, fetch_tail_.get(), 0),
                           "ordering the encoder after the fetch copies");
  DRT_RETURN_IF_ERROR(
      DelayStreamForTest(options_.debug_stream_delay, CudaDelayedStream::kCompute, stream,
                         stats_.stream_delays));

  float* x = b.enc_x.get();
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchRmsNormF32(b.mixed.get(), weights_.enc_prenorm, rows, d,
                                static_cast<float>(config_.rms_norm_eps), x, stream),
      "LaunchRmsNormF32 (enc_prenorm)");
  for (const DeviceLayer<T>& layer : weights_.encoder) {
    DRT_CUDA_RETURN_IF_ERROR(
        kernels::LaunchRmsNorm(x, layer.input_norm, rows, d, kEncoderRmsEps, b.x.get(), stream),
        "LaunchRmsNorm (encoder input_layernorm)");
    DRT_RETURN_IF_ERROR(gemm_->Matmul(b.x.get(), layer.q, b.q.get(), rows, d, d, stream));
    DRT_RETURN_IF_ERROR(gemm_->Matmul(b.x.get(), layer.k, b.k_new.get(), rows, d, d, stream));
    DRT_RETURN_IF_ERROR(gemm_->Matmul(b.x.get(), layer.v, b.v_new.get(), rows, d, d, stream));
    DRT_CUDA_RETURN_IF_ERROR(
        kernels::LaunchEncoderAttention(b.q.get(), b.k_new.get(), b.v_new.get(),
                                        static_cast<int>(count), heads, heads,
                                        static_cast<int>(sizes_.head_dim), kEncoderRopeTheta,
                                        b.attn.get(), stream),
        "LaunchEncoderAttention");
    DRT_RETURN_IF_ERROR(gemm_->Matmul(b.attn.get(), layer.o, x, rows, d, d, true, stream));
    DRT_RETURN_IF_ERROR(MlpBlock(layer, x, x, rows, kEncoderRmsEps));
  }
  if (stores_encoder_rows()) {
    // C = encoder.norm(x) into enc_rows, which only the encoder writes (the
    // store stream and the fetches read it while later kernels rewrite
    // b.x). Its K/V are made by the fetch GEMMs when the chunk is fetched,
    // also in this step (cuda_retrieval.cc, FetchEncoderRows).
    DRT_CUDA_RETURN_IF_ERROR(kernels::LaunchRmsNorm(x, weights_.encoder_norm, rows, d,
                                                    kEncoderRmsEps, b.enc_rows.get(), stream),
                             "LaunchRmsNorm (encoder norm)");
  } else {
    DRT_CUDA_RETURN_IF_ERROR(kernels::LaunchRmsNorm(x, weights_.encoder_norm, rows, d,
                                                    kEncoderRmsEps, b.x.get(), stream),
                             "LaunchRmsNorm (encoder norm)");
    // The device tier: K/V go straight into the store at the new chunks'
    // records (room made by PrepareSlice). The same GEMMs of the same shape
    // as into enc_k/enc_v, and the destination is as aligned (a chunk is
    // 64 x d x sizeof(T) bytes, a multiple of 1024 as d is of 8), so the
    // values are bit for bit those the host tier stores.
    T* keys = device_tier_ ? device_store_.keys(first) : b.enc_k.get();
    T* values = device_tier_ ? device_store_.values(first) : b.enc_v.get();
    DRT_RETURN_IF_ERROR(
        gemm_->Matmul(b.x.get(), weights_.chunk_k_proj, keys, rows, d, d, stream));
    DRT_RETURN_IF_ERROR(
        gemm_->Matmul(b.x.get(), weights_.chunk_v_proj, values, rows, d, d, stream));
    // The landmark's key and value are zero: GCA's softmax off-by-one
    // (Forward pass 7).
    DRT_CUDA_RETURN_IF_ERROR(
        kernels::LaunchZeroChunkRow(keys, static_cast<int>(count),
                                    static_cast<int>(LandmarkRowInChunk(config_)), d, stream),
        "LaunchZeroChunkRow (keys)");
    DRT_CUDA_RETURN_IF_ERROR(
        kernels::LaunchZeroChunkRow(values, static_cast<int>(count),
                                    static_cast<int>(LandmarkRowInChunk(config_)), d, stream),
        "LaunchZeroChunkRow (values)");
  }
  // Landmark = the last row of the encoder output, in fp32: gather the rows, then
  // the final norm straight into the landmark matrix.
  DRT_CUDA_RETURN_IF_ERROR(
      cudaMemcpy2DAsync(b.enc_landmark_rows.get(), d * sizeof(float), x + LandmarkRowInChunk(config_) * d,
                        S * d * sizeof(float), d * sizeof(float), count,
                        cudaMemcpyDeviceToDevice, stream),
      "gathering landmark rows");
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchRmsNormF32(b.enc_landmark_rows.get(), weights_.encoder_norm,
                                static_cast<int>(count), d, kEncoderRmsEps,
                                landmarks_.get() + first * d, stream),
      "LaunchRmsNormF32 (landmarks)");
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(encoded_.get(), stream), "recording the encoder");
  if (device_tier_) {
    // Nothing to copy: the chunks are in the store, and everything that
    // reads them (GCA) runs after this on the compute stream.
    DRT_RETURN_IF_ERROR(device_store_.Append(count));
    step_first_new_chunk_ = first;
    step_new_chunks_ = count;
    return absl::OkStatus();
  }

  // K/V (or C's real rows) to the pinned host store on the store stream
  // (Forward pass 4: "the chunk memory that may live in host memory").
  absl::StatusOr<int64_t> appended = chunk_store_.AppendUninitialized(count);
  if (!appended.ok()) return appended.status();
  cudaStream_t store = store_stream_.get();
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(store, encoded_.get(), 0),
                           "ordering the store copies after the encoder");
  DRT_RETURN_IF_ERROR(
      DelayStreamForTest(options_.debug_stream_delay, CudaDelayedStream::kStore, store,
                         stats_.stream_delays));
  if (stores_encoder_rows()) {
    // Rows 0..S'-1 of each chunk; the landmark row's K/V are zero, so it is
    // not kept (engine/cuda/host/chunk_record_layout.h).
    const size_t record = chunk_store_.record_bytes();
    for (int64_t c = 0; c < count; ++c) {
      DRT_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(chunk_store_.mutable_record(*appended + c), b.enc_rows.get() + c * S * d,
                          record, cudaMemcpyDeviceToHost, store),
          "copying chunk encoder rows to the host store");
    }
    DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(stored_.get(), store), "recording the store copies");
    stats_.d2h_bytes += static_cast<int64_t>(record * count);
    step_first_new_chunk_ = first;
    step_new_chunks_ = count;
    return absl::OkStatus();
  }
  const size_t block = chunk_store_.block_bytes();
  for (int64_t c = 0; c < count; ++c) {
    DRT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(chunk_store_.mutable_keys(*appended + c), b.enc_k.get() + c * S * d, block,
                        cudaMemcpyDeviceToHost, store),
        "copying chunk keys to the host store");
    DRT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(chunk_store_.mutable_values(*appended + c), b.enc_v.get() + c * S * d,
                        block, cudaMemcpyDeviceToHost, store),
        "copying chunk values to the host store");
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(stored_.get(), store), "recording the store copies");
  stats_.d2h_bytes += static_cast<int64_t>(2 * block * count);
  step_first_new_chunk_ = first;
  step_new_chunks_ = count;
  return absl::OkStatus();
}

#define DRT_INSTANTIATE_LAYERS(T)                                                             \
  template absl::Status CudaSession<T>::Attention(const SlicePlan&, int64_t,                    \
                                                  const DeviceLayer<T>&);                       \
  template absl::Status CudaSession<T>::Mlp(const SlicePlan&, const DeviceLayer<T>&);          \
  template absl::Status CudaSession<T>::GcaMlp(const SlicePlan&, int64_t,                       \
                                               const DeviceUpperLayer<T>&);                     \
  template absl::Status CudaSession<T>::AttentionBlock(int64_t, const DeviceLayer<T>&, int64_t, \
                                                       int64_t);                              \
  template absl::Status CudaSession<T>::MlpBlock(const DeviceLayer<T>&, const float*, float*,   \
                                                 int64_t, float);                               \
  template absl::Status CudaSession<T>::GcaBlock(int64_t, const DeviceUpperLayer<T>&, int64_t,  \
                                                 int64_t, int64_t);                             \
  template absl::Status CudaSession<T>::EncodeChunks(int64_t);                                  \
  template absl::Status CudaSession<T>::WindowAttentionRows(int64_t, const AttentionRows<T>&,    \
                                                            int64_t, int64_t);                  \
  template absl::Status CudaSession<T>::GcaAttentionRows(int64_t, const T*, T*, int64_t, int64_t, \
                                                         int64_t);
DRT_INSTANTIATE_LAYERS(bf16)
DRT_INSTANTIATE_LAYERS(float)
#undef DRT_INSTANTIATE_LAYERS

}  // namespace drt::cuda

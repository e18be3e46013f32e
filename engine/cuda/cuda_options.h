// Options of the CUDA backend. Plain C++ (no CUDA header): the factory and the
// tools that fill it in are built without CUDA too.
#pragma once

#include <atomic>
#include <cstdint>

namespace drt {

// The number format of everything the CUDA backend stores on the device
// (weights, activations between kernels, window rings, retrieved chunks) and
// of the pinned chunk store; accumulation, softmaxes and the residual stream
// are fp32 in both (docs/cuda.md, "Numbers").
enum class CudaPrecision {
  kBf16,  // fast; logits differ from the CPU backend by bf16 rounding
  // fp32 storage and fp32 GEMMs without TF32: the CPU backend's arithmetic up
  // to summation order (the parity tests hold it to 1e-4 relative).
  kFp32,
};

// What the pinned host chunk store keeps per closed chunk
// (engine/cuda/host/chunk_record_layout.h; docs/cuda.md, "Chunk store of C").
enum class CudaChunkStore {
  // Keys and values, [64 x d] each: fetches copy them host -> device as they
  // are. The default, verified on a GPU.
  kKeysValues,
  // The encoder output C, [63 x d]: half the host bytes and the host ->
  // device bytes; a fetch copies the rows in and two GEMMs per fetch batch
  // make K and V on the device (drt-model.md, Forward pass 4). Written but
  // NOT YET RUN ON A GPU, hence off by default.
  kEncoderRows,
};

// Where closed chunks' K/V live (docs/cuda.md, "Device tier").
enum class CudaChunkTier {
  // The pinned host chunk store ("with CPU offload"): each landmark's
  // selection is copied host -> device into the group's slot buffer. The
  // default, verified on a GPU.
  kHost,
  // A device chunk store per session ("without offload"): the encoder
  // writes K/V into it and GCA reads the selected chunks there in place (no
  // fetch, no slot buffer). K/V store only: MakeCudaBackend refuses it with
  // chunk_store kEncoderRows or state_export. NOT YET RUN ON A GPU, hence
  // off by default.
  kDevice,
  // Per session, at creation: the device tier when the session's whole
  // store for auto_tier_max_tokens tokens fits in the device memory left
  // for chunk stores, else the host tier (engine/cuda/host/
  // chunk_tier_policy.h). NOT YET RUN ON A GPU, hence off by default.
  kAuto,
};

// Test-only (review-cuda F1): which stream CudaStreamDelay holds back.
enum class CudaDelayedStream {
  kNone,
  kStore,    // a session's store stream (device -> host copies of new chunks)
  kFetch,    // a session's fetch stream (chunk copies into the GCA slots)
  kStep,     // the batched step's stream (batched_step_rows)
  kCompute,  // a session's compute stream (its kernels)
};

// Test-only, off by default (ns 0): before each piece of work the backend
// queues on `stream` after an event wait (and at the head of a batched
// step), a kernel spins `ns` nanoseconds on that stream
// (engine/cuda/debug_stream_delay.h). The work then runs late on the GPU,
// so a consumer on another stream that lacks its cudaStreamWaitEvent
// reads data not yet written (or a producer that lacks one overwrites
// data not yet read) every time, not only under some load: the
// bit-identity tests then fail. Set by the CUDA backend tests alone
// (tests/cuda_backend/cuda_test_support.h reads DRT_TEST_CUDA_STREAM_DELAY;
// scripts/gpu_bench.sh STREAM_DELAY_RUNS). Off, it costs one comparison
// per site. MakeCudaBackend refuses a delay without a stream, a stream
// without a delay, an unknown stream and more than kMaxCudaStreamDelayNs.
// Each delay queued counts in the session's BackendSessionStats::
// stream_delays (review-cudaprep C3 b: a delay run whose delays never fired
// would pass undelayed) and, when `tally` is set, in *tally too: the CUDA
// backend tests point it at a counter of their own and print it after each
// case (tests/cuda_backend/stream_delay_report.cc), which
// scripts/gpu_bench.sh requires to be > 0. `tally` must outlive the backend.
struct CudaStreamDelay {
  CudaDelayedStream stream = CudaDelayedStream::kNone;
  int64_t ns = 0;
  std::atomic<int64_t>* tally = nullptr;
};
inline constexpr int64_t kMaxCudaStreamDelayNs = 100'000'000;  // 0.1 s

struct CudaBackendOptions {
  int device_index = 0;
  // The step size (Backend::max_step_positions), as CpuBackendOptions':
  // decoder positions one forward holds, all sessions together; rounded down
  // to whole chunks, at least one chunk. Each session's device scratch and
  // retrieved-chunk buffers are sized by it. At most 65536 (MakeCudaBackend
  // refuses more).
  int64_t max_step_positions = 1024;
  // The sliding-window base LM without retrieval (benchmarks only): no chunk
  // encoder, no landmark scoring, no GCA; the upper layers become plain
  // layers (h = h + MLP(RMSNorm2(h))). Its logits are NOT the model's.
  bool disable_gca = false;
  // Slabs of the pinned host chunk store double from 16 chunks (or from
  // this, when smaller) up to this many chunks. At least 1: MakeCudaBackend
  // refuses less (engine/cuda/host/host_chunk_store.h, CudaSlabOptions).
  int64_t max_slab_chunks = 1024;
  CudaPrecision precision = CudaPrecision::kBf16;
  // The window attention kernel of steps of at most 8 positions (decode):
  // 0, the default, the one-block-per-(query, head) kernel; 1, 2, 4 or 8 the
  // split decode kernel with that many blocks per (query, head) (above 1 a
  // thread block cluster: compute capability 9.0+, else MakeCudaBackend
  // refuses). kernels/window_attention.h decode_splits; NOT YET RUN ON A GPU
  // (docs/cuda.md, "Split decode"), hence off by default.
  int window_decode_splits = 0;
  // The window attention and GCA kernels of bf16 prefill steps (more than 8
  // and 4 positions) when head_dim is a multiple of 16: true runs the
  // tensor-core kernels (kernels/window_mma_prefill.cu, gca_mma_prefill.cu;
  // `prefill_tensor_cores` of kernels/window_attention.h and
  // gca_attention.h). NOT YET RUN ON A GPU (docs/cuda.md, "Tensor-core
  // prefill"), hence off by default. fp32 precision ignores it (its kernels
  // stay fp32 throughout, for the exact parity tests).
  bool prefill_tensor_cores = false;
  // Session state export and import (BackendSession::ExportState, ReadChunk,
  // ImportState: durable sessions, SaveSession/LoadSession). Written but not
  // yet run on a GPU (engine/cuda/cuda_session_state.cc), so off by default:
  // while false the three answer UNIMPLEMENTED naming drt-server's
  // --cuda_state_export, which sets it.
  bool state_export = false;
  // Batched steps (engine/cuda/cuda_batched_step.h): the row-wise work of
  // all slices of a step (embedding, RMSNorms, the Q/K/V/O projections, the
  // MLPs, GCA's projections, lm_head) runs as one op over step-wide buffers,
  // so decode rows of N sessions share one GEMM; window attention, GCA, the
  // chunk encoder and retrieval stay per session. Written but NOT YET RUN ON
  // A GPU (docs/cuda.md, "Batched steps"), hence off by default: while false
  // a step runs slice by slice (engine/cuda/cuda_step.h).
  bool batched_step_rows = false;
  // drt-server --cuda_chunk_store=kv|encoder_rows. state_export selects
  // kEncoderRows whatever this says (EffectiveChunkStore).
  CudaChunkStore chunk_store = CudaChunkStore::kKeysValues;
  // drt-server --cuda_chunk_tier=host|device|auto.
  CudaChunkTier chunk_tier = CudaChunkTier::kHost;
  // kAuto: the most tokens a session will hold (drt-server passes its
  // --max_context_tokens); a session goes to the device tier only when a
  // store of that many tokens fits. kDevice: a store's growth does not pass
  // that many tokens' chunks unless a session needs more
  // (DeviceStoreGrowthLimits::cap_chunks); 0: no cap. Ignored by kHost.
  int64_t auto_tier_max_tokens = 0;
  // kAuto: the device bytes all sessions' chunk stores may take together;
  // 0, the default, is 90% of the device memory free once the weights are
  // uploaded (kDeviceTierReserveFraction).
  int64_t auto_tier_budget_bytes = 0;
  // CUDA graphs for decode steps (engine/cuda/cuda_decode_graph.h): a
  // session's one-row steps that close no chunk replay one captured graph
  // instead of launching their ~160 kernels one by one
  // (engine/cuda/host/decode_graph_plan.h says which steps). Written but NOT
  // YET RUN ON A GPU (docs/cuda.md, "Decode graphs"), hence off by default.
  // Not with batched_step_rows (MakeCudaBackend refuses the pair).
  bool decode_graphs = false;
  // Fused GEMVs for slices of at most 8 rows (decode), both precisions
  // (kernels/decode_gemv.h): the RMSNorm and Q, K, V in one launch over the
  // stacked [q; k; v] weight, the norm, gate/up and SwiGLU in one, the O and
  // down projections with their residual adds in one each, and the GCA
  // query and output likewise; larger slices keep cuBLAS. Works with and
  // without decode_graphs and batched_step_rows (a batched step of at most 8
  // rows takes it). MakeCudaBackend refuses a model whose shapes the kernels
  // cannot take (kernels/decode_gemv_plan.h). Written but NOT YET RUN ON A
  // GPU (docs/cuda.md, "Fused decode GEMVs"), hence off by default.
  bool decode_fused_gemv = false;
  // Test-only: see CudaStreamDelay. Off by default.
  CudaStreamDelay debug_stream_delay;
};

// The chunk store a CUDA backend with `options` uses: encoder rows when
// asked, and always with state_export, because the state format holds a
// closed chunk's encoder rows (engine/session_state.h, ChunkData) and K/V
// cannot give them back (K = C W_k^T loses C).
inline CudaChunkStore EffectiveChunkStore(const CudaBackendOptions& options) {
  return options.state_export ? CudaChunkStore::kEncoderRows : options.chunk_store;
}

}  // namespace drt

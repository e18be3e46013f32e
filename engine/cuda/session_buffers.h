// Device and pinned buffers of one CUDA session, sized once from the config
// and the step size (CudaBackendOptions::max_step_positions), so that
// nothing but the landmark matrix and the host chunk store grows with the
// context.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_resources.h"
#include "engine/cuda/storage_type.h"
#include "engine/model_config.h"

namespace drt::cuda {

struct SessionSizes {
  int64_t d = 0, kv_width = 0, f = 0, vocab = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t chunk = 64;          // decoder positions per chunk
  int64_t max_rows = 0;        // rows of one slice of a step (a multiple of chunk)
  int64_t max_query_chunks = 0;  // chunks one slice touches (more than the landmarks it holds)
  int64_t topk = 0;
  int64_t ring_slots = 0;      // W + 1
  int64_t window = 0;          // W
  int64_t layers = 0;          // decoder layers, lower then upper
  int64_t groups = 0;
  int64_t slots_per_group = 0; // max_query_chunks * topk
  int64_t logit_rows = 0;      // rows of logits computed per batch
};

SessionSizes ComputeSessionSizes(const ModelConfig& config, int64_t max_step_positions);

// Per-layer window ring of one decoder layer (drt-model.md, "What follows
// for the engine"): [ring_slots][kv_heads][head_dim], position p in slot
// p % ring_slots.
template <typename T>
struct WindowRing {
  DeviceArray<T> k, v;
};

// Retrieved chunks of one group: [slots][64][d] keys and values.
template <typename T>
struct GroupChunkBuffer {
  DeviceArray<T> k, v;
};

// T: the storage type (bf16 or float); the residual stream, landmarks and
// logits are fp32 either way. Instantiated for both (session_buffers.cc).
template <typename T>
struct SessionBuffers {
  // fetch_batch_chunks > 0: the host chunk store holds encoder rows
  // (CudaChunkStore::kEncoderRows), and enc_rows and the fetch staging are
  // made, with that many staging entries, instead of enc_k/enc_v; 0 (K/V)
  // makes enc_k/enc_v. device_chunk_tier (CudaChunkTier::kDevice, K/V
  // only): the encoder writes K/V into the session's device chunk store and
  // GCA reads them there, so neither enc_k/enc_v nor the groups' slot
  // buffers are made.
  static absl::StatusOr<SessionBuffers> Create(const SessionSizes& s, bool with_gca,
                                               int64_t fetch_batch_chunks = 0,
                                               bool device_chunk_tier = false);

  // Activations of the session's slice of a step (rows <= max_rows).
  DeviceArray<int32_t> ids;
  DeviceArray<float> h;       // residual stream [rows][d]
  DeviceArray<float> mixed;   // r + GCA(h) [rows][d]; the encoder's input rows
  DeviceArray<T> x;        // norm outputs (GEMM inputs) [rows][d]
  DeviceArray<T> q;        // [rows][d]
  DeviceArray<T> k_new, v_new;  // [rows][d] (kv_width <= d)
  DeviceArray<T> attn;     // [rows][d]
  DeviceArray<T> gate_up;  // [rows][2F]
  DeviceArray<T> act;      // [rows][F]
  // Chunk encoder.
  DeviceArray<float> enc_x;   // encoder residual stream [rows][d]
  DeviceArray<T> enc_k, enc_v;  // chunk K/V of the slice's closed chunks [rows][d] (K/V store)
  DeviceArray<float> enc_landmark_rows;  // landmark rows gathered [max_query_chunks][d]
  // Encoder rows only (engine/cuda/host/fetch_batches.h): the encoder
  // output C after encoder.norm [rows][d], which the store stream copies to
  // the host store and fetches of the step's own chunks stage; the staging
  // of fetched chunks' rows and the K/V the fetch GEMMs make of them,
  // [fetch_batch_chunks][chunk][d] each.
  DeviceArray<T> enc_rows;
  DeviceArray<T> fetch_rows, fetch_k, fetch_v;
  // Retrieval.
  DeviceArray<float> lmk_rows;     // group-input rows of the landmarks [max_query_chunks][d]
  DeviceArray<float> lmk_queries;  // normalised [max_query_chunks][d]
  DeviceArray<int64_t> lmk_limits;
  DeviceArray<int64_t> topk_chunks;  // [max_query_chunks][topk]
  DeviceArray<float> topk_weights;
  PinnedArray<int64_t> topk_chunks_host;  // [groups][max_query_chunks][topk]
  PinnedArray<float> topk_weights_host;
  DeviceArray<int32_t> slot_table;    // [max_query_chunks][topk]
  DeviceArray<float> slot_weights;
  // Pinned staging of the host -> device uploads (a pageable source may make
  // cudaMemcpyAsync synchronise with the stream). Each region is rewritten
  // only after the event guarding its previous upload has completed
  // (CudaSession::ids_uploaded_, uploads_done_).
  PinnedArray<int32_t> ids_host;            // [max_rows]
  PinnedArray<int64_t> lmk_limits_host;     // [groups][max_query_chunks]
  PinnedArray<int32_t> slot_table_host;     // [groups][max_query_chunks][topk]
  PinnedArray<float> slot_weights_host;     // [groups][max_query_chunks][topk]
  // Logits of one batch of rows.
  DeviceArray<T> final_normed;  // [logit_rows][d]
  DeviceArray<float> logits;       // [logit_rows][V]
  PinnedArray<float> logits_host;

  // Session state on the device.
  std::vector<WindowRing<T>> rings;    // per decoder layer
  DeviceArray<float> open_chunk;       // [64][d] lower-layer rows of the open chunk
  std::vector<GroupChunkBuffer<T>> group_chunks;

  size_t device_bytes() const;
  // Page-locked host staging (top-k results, uploads, logits).
  size_t pinned_bytes() const;
};

}  // namespace drt::cuda

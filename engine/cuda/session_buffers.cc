#include "engine/cuda/session_buffers.h"

#include <algorithm>

namespace drt::cuda {

SessionSizes ComputeSessionSizes(const ModelConfig& config, int64_t max_step_positions) {
  SessionSizes s;
  s.d = config.hidden_size;
  s.heads = config.num_attention_heads;
  s.kv_heads = config.num_key_value_heads;
  s.head_dim = config.head_dim();
  s.kv_width = s.kv_heads * s.head_dim;
  s.f = config.intermediate_size;
  s.vocab = config.vocab_size;
  s.chunk = config.chunk_positions();
  // The same rule as the CPU backend: a step size of whole chunks
  // (Backend::max_step_positions); one slice holds at most that many rows.
  s.max_rows = std::max(s.chunk, max_step_positions / s.chunk * s.chunk);
  // A slice of at most max_rows rows starting anywhere in a chunk touches
  // at most max_rows / chunk + 1 chunks and closes at most max_rows / chunk
  // (with the open chunk's earlier rows, (open + rows) / chunk).
  s.max_query_chunks = s.max_rows / s.chunk + 1;
  s.topk = config.chunk_topk;
  s.window = config.slide_window;
  s.ring_slots = std::max<int64_t>(1, config.slide_window) + 1;
  s.layers = config.num_lower_layers() + config.num_upper_layers();
  s.groups = config.num_groups();
  s.slots_per_group = s.max_query_chunks * s.topk;
  s.logit_rows = std::min<int64_t>(64, s.max_rows);
  return s;
}

template <typename T>
absl::StatusOr<SessionBuffers<T>> SessionBuffers<T>::Create(const SessionSizes& s, bool with_gca,
                                                            int64_t fetch_batch_chunks,
                                                            bool device_chunk_tier) {
  SessionBuffers<T> b;
  const size_t rows = s.max_rows;
  const size_t d = s.d;
  const size_t qc = s.max_query_chunks;
  const size_t k = s.topk;
#define DRT_ALLOC(field, type, count)                                   \
  do {                                                                  \
    auto made = DeviceArray<type>::Create((count), #field);             \
    if (!made.ok()) return made.status();                               \
    b.field = *std::move(made);                                         \
  } while (0)
#define DRT_ALLOC_PINNED(field, type, count)                            \
  do {                                                                  \
    auto made = PinnedArray<type>::Create((count), #field);             \
    if (!made.ok()) return made.status();                               \
    b.field = *std::move(made);                                         \
  } while (0)
  DRT_ALLOC(ids, int32_t, rows);
  DRT_ALLOC(h, float, rows * d);
  DRT_ALLOC(mixed, float, rows * d);
  DRT_ALLOC(x, T, rows * d);
  DRT_ALLOC(q, T, rows * d);
  DRT_ALLOC(k_new, T, rows * d);
  DRT_ALLOC(v_new, T, rows * d);
  DRT_ALLOC(attn, T, rows * d);
  DRT_ALLOC(gate_up, T, rows * 2 * s.f);
  DRT_ALLOC(act, T, rows * s.f);
  DRT_ALLOC(final_normed, T, s.logit_rows * d);
  DRT_ALLOC(logits, float, s.logit_rows * s.vocab);
  DRT_ALLOC_PINNED(logits_host, float, s.logit_rows * s.vocab);
  DRT_ALLOC_PINNED(ids_host, int32_t, rows);
  if (with_gca) {
    DRT_ALLOC(enc_x, float, rows * d);
    if (fetch_batch_chunks == 0 && !device_chunk_tier) {
      DRT_ALLOC(enc_k, T, rows * d);
      DRT_ALLOC(enc_v, T, rows * d);
    }
    DRT_ALLOC(enc_landmark_rows, float, qc * d);
    DRT_ALLOC(lmk_rows, float, qc * d);
    DRT_ALLOC(lmk_queries, float, qc * d);
    DRT_ALLOC(lmk_limits, int64_t, qc);
    DRT_ALLOC(topk_chunks, int64_t, qc * k);
    DRT_ALLOC(topk_weights, float, qc * k);
    DRT_ALLOC_PINNED(topk_chunks_host, int64_t, s.groups * qc * k);
    DRT_ALLOC_PINNED(topk_weights_host, float, s.groups * qc * k);
    DRT_ALLOC(slot_table, int32_t, qc * k);
    DRT_ALLOC(slot_weights, float, qc * k);
    DRT_ALLOC_PINNED(lmk_limits_host, int64_t, s.groups * qc);
    DRT_ALLOC_PINNED(slot_table_host, int32_t, s.groups * qc * k);
    DRT_ALLOC_PINNED(slot_weights_host, float, s.groups * qc * k);
    if (fetch_batch_chunks > 0) {
      const size_t staged = static_cast<size_t>(fetch_batch_chunks) * s.chunk * d;
      DRT_ALLOC(enc_rows, T, rows * d);
      DRT_ALLOC(fetch_rows, T, staged);
      DRT_ALLOC(fetch_k, T, staged);
      DRT_ALLOC(fetch_v, T, staged);
    }
  }
  DRT_ALLOC(open_chunk, float, s.chunk * d);
#undef DRT_ALLOC
#undef DRT_ALLOC_PINNED
  for (int64_t l = 0; l < s.layers; ++l) {
    WindowRing<T> ring;
    auto rk = DeviceArray<T>::Create(s.ring_slots * s.kv_width, "window ring keys");
    if (!rk.ok()) return rk.status();
    auto rv = DeviceArray<T>::Create(s.ring_slots * s.kv_width, "window ring values");
    if (!rv.ok()) return rv.status();
    ring.k = *std::move(rk);
    ring.v = *std::move(rv);
    b.rings.push_back(std::move(ring));
  }
  if (with_gca && !device_chunk_tier) {
    for (int64_t g = 0; g < s.groups; ++g) {
      GroupChunkBuffer<T> buf;
      const size_t n = static_cast<size_t>(s.slots_per_group) * s.chunk * d;
      auto ck = DeviceArray<T>::Create(n, "retrieved chunk keys");
      if (!ck.ok()) return ck.status();
      auto cv = DeviceArray<T>::Create(n, "retrieved chunk values");
      if (!cv.ok()) return cv.status();
      buf.k = *std::move(ck);
      buf.v = *std::move(cv);
      b.group_chunks.push_back(std::move(buf));
    }
  }
  return b;
}

template <typename T>
size_t SessionBuffers<T>::device_bytes() const {
  size_t n = ids.bytes() + h.bytes() + mixed.bytes() + x.bytes() + q.bytes() + k_new.bytes() +
             v_new.bytes() + attn.bytes() + gate_up.bytes() + act.bytes() + enc_x.bytes() +
             enc_k.bytes() + enc_v.bytes() + enc_landmark_rows.bytes() + lmk_rows.bytes() +
             lmk_queries.bytes() + lmk_limits.bytes() + topk_chunks.bytes() +
             topk_weights.bytes() + slot_table.bytes() + slot_weights.bytes() +
             final_normed.bytes() + logits.bytes() + open_chunk.bytes() + enc_rows.bytes() +
             fetch_rows.bytes() + fetch_k.bytes() + fetch_v.bytes();
  for (const WindowRing<T>& r : rings) n += r.k.bytes() + r.v.bytes();
  for (const GroupChunkBuffer<T>& g : group_chunks) n += g.k.bytes() + g.v.bytes();
  return n;
}

template <typename T>
size_t SessionBuffers<T>::pinned_bytes() const {
  return topk_chunks_host.bytes() + topk_weights_host.bytes() + logits_host.bytes() +
         ids_host.bytes() + lmk_limits_host.bytes() + slot_table_host.bytes() +
         slot_weights_host.bytes();
}

template struct SessionBuffers<bf16>;
template struct SessionBuffers<float>;

}  // namespace drt::cuda

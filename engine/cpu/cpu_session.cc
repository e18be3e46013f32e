#include "engine/cpu/cpu_session.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/cpu/kernels.h"
#include "engine/forward_input.h"

namespace drt::cpu {
namespace {

// The chunk encoder is a LlamaModel built without the decoder's eps and
// rope_theta, so it uses LlamaConfig's defaults (drt-model.md, Forward pass 4).
constexpr float kEncoderRmsEps = 1e-6f;
constexpr double kEncoderRopeTheta = 10000.0;
// lmk_norms are built with RMSNorm's default eps (drt-model.md, Forward pass 5).
constexpr float kLandmarkNormEps = 1e-5f;

}  // namespace

CpuSession::CpuSession(const ModelConfig& config, const ModelWeights& weights,
                       const CpuBackendOptions& options, ThreadPool& pool)
    : config_(config),
      weights_(weights),
      options_(options),
      pool_(pool),
      open_chunk_(config.chunk_positions() * config.hidden_size, 0.f),
      store_(config.chunk_positions(), config.hidden_size),
      selection_(config.num_groups()) {
  const int64_t kv_width = config.num_key_value_heads * config.head_dim();
  const int64_t layers = config.num_lower_layers() + config.num_upper_layers();
  windows_.reserve(layers);
  for (int64_t l = 0; l < layers; ++l) {
    windows_.emplace_back(std::max<int64_t>(1, config.slide_window), kv_width);
  }
}

absl::Status CpuSession::Forward(absl::Span<const int32_t> ids,
                                 absl::Span<const int64_t> logit_rows, absl::Span<float> logits) {
  const int64_t S = config_.chunk_positions();
  const int64_t V = config_.vocab_size;
  const int64_t d = config_.hidden_size;
  const int64_t n = static_cast<int64_t>(ids.size());
  if (absl::Status input = CheckForwardInput(config_, position_, ids, logit_rows, logits.size());
      !input.ok()) {
    return input;
  }

  const int64_t max_segment = std::max(S, options_.max_segment_positions / S * S);
  std::vector<float> hidden;
  std::vector<float> normed, gathered_logits;
  for (int64_t s0 = 0; s0 < n;) {
    // Segments end on chunk boundaries so that each closes whole chunks.
    const int64_t boundary = (position_ + max_segment) / S * S;
    const int64_t s1 = std::min(n, s0 + (boundary - position_));
    RunSegment(ids.subspan(s0, s1 - s0), hidden);

    std::vector<int64_t> wanted;  // indices into logit_rows inside this segment
    for (size_t r = 0; r < logit_rows.size(); ++r) {
      if (logit_rows[r] >= s0 && logit_rows[r] < s1) wanted.push_back(static_cast<int64_t>(r));
    }
    if (!wanted.empty()) {
      const int64_t m = static_cast<int64_t>(wanted.size());
      normed.resize(m * d);
      for (int64_t w = 0; w < m; ++w) {
        RmsNorm(hidden.data() + (logit_rows[wanted[w]] - s0) * d, 1, d, weights_.norm.data(),
                static_cast<float>(config_.rms_norm_eps), normed.data() + w * d, pool_);
      }
      gathered_logits.resize(m * V);
      Linear(normed.data(), m, d, weights_.output_embedding().data(), V, gathered_logits.data(), pool_);
      for (int64_t w = 0; w < m; ++w) {
        std::memcpy(logits.data() + wanted[w] * V, gathered_logits.data() + w * V,
                    V * sizeof(float));
      }
    }
    s0 = s1;
  }
  return absl::OkStatus();
}

void CpuSession::SelfAttentionBlock(int64_t layer_index, const LayerWeights& layer, float* h,
                                    int64_t n, float* q, float* keys, float* values, float* attn) {
  const int64_t d = config_.hidden_size;
  const int64_t kv_width = config_.num_key_value_heads * config_.head_dim();
  const float eps = static_cast<float>(config_.rms_norm_eps);
  std::vector<float> x(n * d);
  RmsNorm(h, n, d, layer.input_layernorm.data(), eps, x.data(), pool_);
  WindowCache& window = windows_[layer_index];
  const int64_t past = window.size();
  window.CopyOut(keys, values);
  Linear(x.data(), n, d, layer.self_attn.q_proj.data(), d, q, pool_);
  Linear(x.data(), n, d, layer.self_attn.k_proj.data(), kv_width, keys + past * kv_width, pool_);
  Linear(x.data(), n, d, layer.self_attn.v_proj.data(), kv_width, values + past * kv_width,
         pool_);
  WindowAttention(q, n, keys, values, past + n, config_.num_attention_heads,
                  config_.num_key_value_heads, config_.head_dim(), config_.slide_window, attn,
                  pool_);
  window.Push(keys + past * kv_width, values + past * kv_width, n);
  Linear(attn, n, d, layer.self_attn.o_proj.data(), d, x.data(), pool_);
  AddInPlace(h, x.data(), n * d);
}

void CpuSession::MlpBlock(const LayerWeights& layer, const float* residual,
                          const float* normed_input, float* h, int64_t n) {
  // h = residual + MLP(RMSNorm2(normed_input)); residual may alias h.
  const int64_t d = config_.hidden_size;
  const int64_t f = config_.intermediate_size;
  std::vector<float> x(n * d), gate(n * f), up(n * f);
  RmsNorm(normed_input, n, d, layer.post_attention_layernorm.data(),
          static_cast<float>(config_.rms_norm_eps), x.data(), pool_);
  Linear(x.data(), n, d, layer.mlp.gate_proj.data(), f, gate.data(), pool_);
  Linear(x.data(), n, d, layer.mlp.up_proj.data(), f, up.data(), pool_);
  SwiGlu(gate.data(), up.data(), n * f, gate.data(), pool_);
  Linear(gate.data(), n, f, layer.mlp.down_proj.data(), d, x.data(), pool_);
  if (residual != h) std::memcpy(h, residual, n * d * sizeof(float));
  AddInPlace(h, x.data(), n * d);
}

void CpuSession::EncodeChunks(const float* rows, int64_t count) {
  const int64_t S = config_.chunk_positions();
  const int64_t d = config_.hidden_size;
  const int64_t H = config_.num_attention_heads;
  const int64_t dh = config_.head_dim();
  const int64_t n = count * S;
  std::vector<float> x(n * d), xn(n * d), q(n * d), k(n * d), v(n * d), attn(n * d);
  RmsNorm(rows, n, d, weights_.enc_prenorm.data(), static_cast<float>(config_.rms_norm_eps),
          x.data(), pool_);
  for (const LayerWeights& layer : weights_.encoder_layers) {
    RmsNorm(x.data(), n, d, layer.input_layernorm.data(), kEncoderRmsEps, xn.data(), pool_);
    Linear(xn.data(), n, d, layer.self_attn.q_proj.data(), d, q.data(), pool_);
    Linear(xn.data(), n, d, layer.self_attn.k_proj.data(), d, k.data(), pool_);
    Linear(xn.data(), n, d, layer.self_attn.v_proj.data(), d, v.data(), pool_);
    ApplyRope(q.data(), count, S, H, dh, kEncoderRopeTheta, pool_);
    ApplyRope(k.data(), count, S, H, dh, kEncoderRopeTheta, pool_);
    BlockAttention(q.data(), k.data(), v.data(), count, S, H, dh, attn.data(), pool_);
    Linear(attn.data(), n, d, layer.self_attn.o_proj.data(), d, xn.data(), pool_);
    AddInPlace(x.data(), xn.data(), n * d);
    // Same MLP block with the encoder's eps.
    const int64_t f = config_.intermediate_size;
    std::vector<float> gate(n * f), up(n * f);
    RmsNorm(x.data(), n, d, layer.post_attention_layernorm.data(), kEncoderRmsEps, xn.data(),
            pool_);
    Linear(xn.data(), n, d, layer.mlp.gate_proj.data(), f, gate.data(), pool_);
    Linear(xn.data(), n, d, layer.mlp.up_proj.data(), f, up.data(), pool_);
    SwiGlu(gate.data(), up.data(), n * f, gate.data(), pool_);
    Linear(gate.data(), n, f, layer.mlp.down_proj.data(), d, xn.data(), pool_);
    AddInPlace(x.data(), xn.data(), n * d);
  }
  RmsNorm(x.data(), n, d, weights_.encoder_norm.data(), kEncoderRmsEps, x.data(), pool_);
  Linear(x.data(), n, d, weights_.chunk_k_proj.data(), d, k.data(), pool_);
  Linear(x.data(), n, d, weights_.chunk_v_proj.data(), d, v.data(), pool_);
  for (int64_t c = 0; c < count; ++c) {
    const int64_t landmark_row = c * S + S - 1;
    // The landmark's key and value are zero: the off-by-one of GCA's softmax.
    std::fill_n(k.data() + landmark_row * d, d, 0.f);
    std::fill_n(v.data() + landmark_row * d, d, 0.f);
    store_.Append(x.data() + landmark_row * d, k.data() + c * S * d, v.data() + c * S * d);
  }
}

Retrieval CpuSession::Retrieve(int64_t group, const float* hidden_row, int64_t chunk) const {
  // drt-model.md, Forward pass 5: chunk `chunk`'s landmark scores every
  // strictly earlier chunk.
  const int64_t d = config_.hidden_size;
  const int64_t k = std::min(config_.chunk_topk, chunk);
  Retrieval retrieval;
  if (k <= 0) return retrieval;
  std::vector<float> query(d);
  RmsNorm(hidden_row, 1, d, weights_.lmk_norms[group].data(), kLandmarkNormEps, query.data(), pool_);
  std::vector<float> scores(chunk);
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  for (const auto& span : store_.LandmarkSpans(chunk)) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, span.count, d, scale, span.landmarks, d,
                query.data(), 1, 0.f, scores.data() + span.first_chunk, 1);
  }
  std::vector<int64_t> order(chunk);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  retrieval.chunks.assign(order.begin(), order.begin() + k);
  retrieval.weights.resize(k);
  const float best = scores[retrieval.chunks[0]];
  float sum = 0.f;
  for (int64_t i = 0; i < k; ++i) {
    retrieval.weights[i] = std::exp(scores[retrieval.chunks[i]] - best);
    sum += retrieval.weights[i];
  }
  for (float& w : retrieval.weights) w /= sum;
  return retrieval;
}

void CpuSession::RunSegment(absl::Span<const int32_t> ids, std::vector<float>& hidden) {
  const int64_t S = config_.chunk_positions();
  const int64_t d = config_.hidden_size;
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t kv_width = config_.num_key_value_heads * config_.head_dim();
  const int64_t window = std::max<int64_t>(1, config_.slide_window);
  const int64_t pos0 = position_;
  const float eps = static_cast<float>(config_.rms_norm_eps);

  hidden.resize(n * d);
  float* h = hidden.data();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(h + i * d, weights_.embed_tokens.data() + static_cast<int64_t>(ids[i]) * d,
                d * sizeof(float));
  }
  std::vector<float> q(n * d), keys((window + n) * kv_width), values((window + n) * kv_width),
      attn(n * d);

  int64_t layer_index = 0;
  for (const LayerWeights& layer : weights_.lower_layers) {
    SelfAttentionBlock(layer_index++, layer, h, n, q.data(), keys.data(), values.data(),
                       attn.data());
    MlpBlock(layer, h, h, h, n);
  }

  // Collect the lower-layer rows of every chunk this segment closes.
  std::vector<float> closed_rows;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = (pos0 + i) % S;
    std::memcpy(open_chunk_.data() + slot * d, h + i * d, d * sizeof(float));
    if (slot == S - 1) closed_rows.insert(closed_rows.end(), open_chunk_.begin(), open_chunk_.end());
  }
  if (!closed_rows.empty()) EncodeChunks(closed_rows.data(), closed_rows.size() / (S * d));

  // The reference zeroes the landmark's K/V row when a chunk spans a multiple
  // of 64 positions (the off-by-one) but drops the row when it spans one more
  // (model/DRT.py, chunk_k handling); the stored row is zero either way.
  const int64_t gca_rows = S % 64 == 1 ? S - 1 : S;
  std::vector<float> residual(n * d), gca_q(n * d), gca_out(n * d), mixed(n * d);
  for (int64_t g = 0; g < config_.num_groups(); ++g) {
    // Selections made at this segment's landmarks, keyed by the chunk they serve.
    std::vector<std::pair<int64_t, Retrieval>> made;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = pos0 + i;
      if (pos % S != S - 1) continue;
      Retrieval r = Retrieve(g, h + i * d, pos / S);
      if (observer_) observer_(pos / S, g, r);
      made.emplace_back(pos / S + 1, std::move(r));
    }
    auto selection_for = [&](int64_t chunk) -> const Retrieval& {
      for (const auto& [served, r] : made) {
        if (served == chunk) return r;
      }
      return selection_[g];
    };

    // One GCA block per run of rows in the same chunk.
    struct BlockInputs {
      std::vector<const float*> k, v;
    };
    std::vector<BlockInputs> inputs;
    std::vector<GcaBlock> blocks;
    std::vector<int64_t> block_first_row, block_chunk;
    for (int64_t i = 0; i < n;) {
      const int64_t chunk = (pos0 + i) / S;
      const int64_t end = std::min(n, (chunk + 1) * S - pos0);
      block_first_row.push_back(i);
      block_chunk.push_back(chunk);
      const Retrieval& r = selection_for(chunk);
      BlockInputs in;
      for (int64_t c : r.chunks) {
        in.k.push_back(store_.keys(c));
        in.v.push_back(store_.values(c));
      }
      inputs.push_back(std::move(in));
      GcaBlock block;
      block.n = end - i;
      block.weights = r.weights.data();
      block.num_chunks = static_cast<int64_t>(r.chunks.size());
      blocks.push_back(block);
      i = end;
    }

    for (const UpperLayerWeights& layer : weights_.upper_layers[g]) {
      SelfAttentionBlock(layer_index++, layer.base, h, n, q.data(), keys.data(), values.data(),
                         attn.data());
      std::memcpy(residual.data(), h, n * d * sizeof(float));
      // GCA (drt-model.md, Forward pass 7) on the post-attention stream.
      RmsNorm(h, n, d, layer.gca.pre_norm.data(), eps, mixed.data(), pool_);
      Linear(mixed.data(), n, d, layer.gca.q_proj.data(), d, gca_q.data(), pool_);
      for (size_t b = 0; b < blocks.size(); ++b) {
        blocks[b].q = gca_q.data() + block_first_row[b] * d;
        blocks[b].out = attn.data() + block_first_row[b] * d;
        blocks[b].chunk_k = inputs[b].k.data();
        blocks[b].chunk_v = inputs[b].v.data();
      }
      GroupedCrossAttention(blocks, gca_rows, config_.num_attention_heads, config_.head_dim(),
                            pool_);
      Linear(attn.data(), n, d, layer.gca.o_proj.data(), d, gca_out.data(), pool_);
      // Forward pass 6: h = r + MLP(RMSNorm2(r + GCA(h))).
      std::memcpy(mixed.data(), residual.data(), n * d * sizeof(float));
      AddInPlace(mixed.data(), gca_out.data(), n * d);
      MlpBlock(layer.base, residual.data(), mixed.data(), h, n);
    }
    if (!made.empty()) selection_[g] = std::move(made.back().second);
  }
  position_ += n;
}

SessionMemory CpuSession::memory() const {
  SessionMemory m;
  for (const WindowCache& w : windows_) m.window_bytes += w.bytes();
  m.open_chunk_bytes = open_chunk_.capacity() * sizeof(float);
  m.landmark_bytes = store_.landmark_bytes();
  m.chunk_store_bytes = store_.kv_bytes();
  m.shared_bytes = store_.shared_bytes();
  for (const Retrieval& r : selection_) {
    m.selection_bytes += r.chunks.capacity() * sizeof(int64_t) + r.weights.capacity() * sizeof(float);
  }
  return m;
}

absl::StatusOr<std::unique_ptr<BackendSession>> CpuSession::Fork() const {
  auto fork = std::make_unique<CpuSession>(*this);
  fork->observer_ = nullptr;
  return fork;
}

}  // namespace drt::cpu

#include "engine/cpu/chunk_encoder.h"

#include "engine/cpu/kernels.h"
#include "engine/model_rules.h"

namespace drt::cpu {

namespace {

// v's storage with room for n floats, grown (not shrunk) as needed; what it
// held is left as it was (every use below writes before it reads).
float* Grown(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

}  // namespace

void EncodeChunks(const ModelConfig& config, const ModelWeights& weights, const float* rows,
                  int64_t count, ThreadPool& pool, EncodedChunks& encoded) {
  const int64_t S = config.chunk_positions();
  const int64_t d = config.hidden_size;
  const int64_t H = config.num_attention_heads;
  const int64_t dh = config.head_dim();
  const int64_t f = config.intermediate_size;
  const int64_t n = count * S;
  std::vector<float>& x = encoded.output;
  x.resize(n * d);  // exactly n x d: the result
  float* const k = Grown(encoded.layer_keys, n * d);
  float* const v = Grown(encoded.layer_values, n * d);
  float* const xn = Grown(encoded.normed, n * d);
  float* const q = Grown(encoded.queries, n * d);
  float* const attn = Grown(encoded.attention, n * d);
  float* const gate = Grown(encoded.gate, n * f);
  float* const up = Grown(encoded.up, n * f);
  RmsNorm(rows, n, d, weights.enc_prenorm.data(), static_cast<float>(config.rms_norm_eps),
          x.data(), pool);
  for (const LayerWeights& layer : weights.encoder_layers) {
    RmsNorm(x.data(), n, d, layer.input_layernorm.data(), kEncoderRmsEps, xn, pool);
    Linear(xn, n, d, layer.self_attn.q_proj.data(), d, q, pool);
    Linear(xn, n, d, layer.self_attn.k_proj.data(), d, k, pool);
    Linear(xn, n, d, layer.self_attn.v_proj.data(), d, v, pool);
    ApplyRope(q, count, S, H, dh, kEncoderRopeTheta, pool);
    ApplyRope(k, count, S, H, dh, kEncoderRopeTheta, pool);
    BlockAttention(q, k, v, count, S, H, dh, attn, pool);
    Linear(attn, n, d, layer.self_attn.o_proj.data(), d, xn, pool);
    AddInPlace(x.data(), xn, n * d);
    // The decoder's MLP block with the encoder's eps.
    RmsNorm(x.data(), n, d, layer.post_attention_layernorm.data(), kEncoderRmsEps, xn,
            pool);
    Linear(xn, n, d, layer.mlp.gate_proj.data(), f, gate, pool);
    Linear(xn, n, d, layer.mlp.up_proj.data(), f, up, pool);
    SwiGlu(gate, up, n * f, gate, pool);
    Linear(gate, n, f, layer.mlp.down_proj.data(), d, xn, pool);
    AddInPlace(x.data(), xn, n * d);
  }
  RmsNorm(x.data(), n, d, weights.encoder_norm.data(), kEncoderRmsEps, x.data(), pool);
  // C is the result. Its GCA keys and values are not made here but when a
  // selection reads the chunk (engine/cpu/chunk_kv.h).
}

}  // namespace drt::cpu

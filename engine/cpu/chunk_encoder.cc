#include "engine/cpu/chunk_encoder.h"

#include "engine/cpu/kernels.h"
#include "engine/model_rules.h"

namespace drt::cpu {

void EncodeChunks(const ModelConfig& config, const ModelWeights& weights, const float* rows,
                  int64_t count, ThreadPool& pool, EncodedChunks& encoded) {
  const int64_t S = config.chunk_positions();
  const int64_t d = config.hidden_size;
  const int64_t H = config.num_attention_heads;
  const int64_t dh = config.head_dim();
  const int64_t f = config.intermediate_size;
  const int64_t n = count * S;
  std::vector<float>& x = encoded.output;
  std::vector<float>& k = encoded.layer_keys;
  std::vector<float>& v = encoded.layer_values;
  x.resize(n * d);
  k.resize(n * d);
  v.resize(n * d);
  std::vector<float> xn(n * d), q(n * d), attn(n * d), gate(n * f), up(n * f);
  RmsNorm(rows, n, d, weights.enc_prenorm.data(), static_cast<float>(config.rms_norm_eps),
          x.data(), pool);
  for (const LayerWeights& layer : weights.encoder_layers) {
    RmsNorm(x.data(), n, d, layer.input_layernorm.data(), kEncoderRmsEps, xn.data(), pool);
    Linear(xn.data(), n, d, layer.self_attn.q_proj.data(), d, q.data(), pool);
    Linear(xn.data(), n, d, layer.self_attn.k_proj.data(), d, k.data(), pool);
    Linear(xn.data(), n, d, layer.self_attn.v_proj.data(), d, v.data(), pool);
    ApplyRope(q.data(), count, S, H, dh, kEncoderRopeTheta, pool);
    ApplyRope(k.data(), count, S, H, dh, kEncoderRopeTheta, pool);
    BlockAttention(q.data(), k.data(), v.data(), count, S, H, dh, attn.data(), pool);
    Linear(attn.data(), n, d, layer.self_attn.o_proj.data(), d, xn.data(), pool);
    AddInPlace(x.data(), xn.data(), n * d);
    // The decoder's MLP block with the encoder's eps.
    RmsNorm(x.data(), n, d, layer.post_attention_layernorm.data(), kEncoderRmsEps, xn.data(),
            pool);
    Linear(xn.data(), n, d, layer.mlp.gate_proj.data(), f, gate.data(), pool);
    Linear(xn.data(), n, d, layer.mlp.up_proj.data(), f, up.data(), pool);
    SwiGlu(gate.data(), up.data(), n * f, gate.data(), pool);
    Linear(gate.data(), n, f, layer.mlp.down_proj.data(), d, xn.data(), pool);
    AddInPlace(x.data(), xn.data(), n * d);
  }
  RmsNorm(x.data(), n, d, weights.encoder_norm.data(), kEncoderRmsEps, x.data(), pool);
  // C is the result. Its GCA keys and values are not made here but when a
  // selection reads the chunk (engine/cpu/chunk_kv.h).
}

}  // namespace drt::cpu

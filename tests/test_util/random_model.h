// In-memory random models for tests that need a model but not a file.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/model_config.h"
#include "engine/model_weights.h"

namespace drt::testing {

// A small config with every feature on: GQA, two groups, a window shorter
// than the test sequences, more chunks than top-k.
inline ModelConfig TinyConfig() {
  ModelConfig c;
  c.vocab_size = 260;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 64;
  c.decoder_layers = {1, 1, 1};
  c.encoder_layers = 1;
  c.enc_chunk_size = 7;  // 8 decoder positions per chunk: many chunks quickly
  c.chunk_topk = 3;
  c.slide_window = 20;
  c.rms_norm_eps = 1e-5;
  c.pad_id = 258;
  c.chunk_id = 259;
  return c;
}

inline std::vector<float> RandomVector(size_t n, float scale, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> NormWeight(size_t n, std::mt19937_64& rng) {
  std::vector<float> v = RandomVector(n, 0.1f, rng);
  for (float& x : v) x += 1.f;
  return v;
}

inline LayerWeights RandomLayer(int64_t d, int64_t kv, int64_t f, std::mt19937_64& rng) {
  const float s = 1.f / std::sqrt(static_cast<float>(d));
  LayerWeights l;
  l.input_layernorm = NormWeight(d, rng);
  l.post_attention_layernorm = NormWeight(d, rng);
  l.self_attn.q_proj = RandomVector(d * d, s, rng);
  l.self_attn.k_proj = RandomVector(kv * d, s, rng);
  l.self_attn.v_proj = RandomVector(kv * d, s, rng);
  l.self_attn.o_proj = RandomVector(d * d, s, rng);
  l.mlp.gate_proj = RandomVector(f * d, s, rng);
  l.mlp.up_proj = RandomVector(f * d, s, rng);
  l.mlp.down_proj = RandomVector(d * f, 1.f / std::sqrt(static_cast<float>(f)), rng);
  return l;
}

inline ModelWeights RandomWeights(const ModelConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t d = c.hidden_size;
  const int64_t kv = c.num_key_value_heads * c.head_dim();
  const int64_t f = c.intermediate_size;
  const float s = 1.f / std::sqrt(static_cast<float>(d));
  ModelWeights w;
  w.embed_tokens = RandomVector(c.vocab_size * d, 1.f, rng);
  w.norm = NormWeight(d, rng);
  for (int64_t i = 0; i < c.num_lower_layers(); ++i) w.lower_layers.push_back(RandomLayer(d, kv, f, rng));
  for (int64_t g = 0; g < c.num_groups(); ++g) {
    w.upper_layers.emplace_back();
    for (int64_t j = 0; j < c.decoder_layers[g + 1]; ++j) {
      UpperLayerWeights u;
      u.base = RandomLayer(d, kv, f, rng);
      u.gca.pre_norm = NormWeight(d, rng);
      u.gca.q_proj = RandomVector(d * d, s, rng);
      u.gca.o_proj = RandomVector(d * d, s, rng);
      w.upper_layers.back().push_back(std::move(u));
    }
    w.lmk_norms.push_back(NormWeight(d, rng));
  }
  w.enc_prenorm = NormWeight(d, rng);
  for (int64_t e = 0; e < c.encoder_layers; ++e) w.encoder_layers.push_back(RandomLayer(d, d, f, rng));
  w.encoder_norm = NormWeight(d, rng);
  w.chunk_k_proj = RandomVector(d * d, s, rng);
  w.chunk_v_proj = RandomVector(d * d, s, rng);
  return w;
}

// Tokens that are neither pad nor landmark.
inline std::vector<int32_t> RandomTokens(const ModelConfig& c, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) {
    do {
      x = static_cast<int32_t>(rng() % c.vocab_size);
    } while (x == c.pad_id || x == c.chunk_id);
  }
  return t;
}

// max |a - b| / max |b| over a row of logits.
inline double RelativeDifference(const float* a, const float* b, int64_t n) {
  double max_diff = 0, max_ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(b[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

// The worst RelativeDifference over the rows of two row-major logit
// matrices of `vocab` columns (the same shape, or the test fails here).
inline double WorstRowRelativeDifference(const std::vector<float>& a, const std::vector<float>& b,
                                         int64_t vocab) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t row = 0; row * vocab < a.size(); ++row) {
    worst = std::max(worst, RelativeDifference(a.data() + row * vocab, b.data() + row * vocab,
                                               vocab));
  }
  return worst;
}

}  // namespace drt::testing

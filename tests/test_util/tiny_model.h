// A tiny DRT model for loader tests: a config and a weights file holding every
// tensor the config implies, with values exact in F32, F16 and BF16.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "nlohmann/json.hpp"
#include "tests/test_util/safetensors_writer.h"

namespace drt::testing {

// d=8, H=2 (dh=4), GQA with 1 K/V head, F=12, one lower layer, groups of 2
// and 1 upper layers, one encoder layer.
inline nlohmann::json TinyConfigJson() {
  return {
      {"vocab_size", 11},         {"hidden_size", 8},        {"num_attention_heads", 2},
      {"num_key_value_heads", 1}, {"intermediate_size", 12}, {"decoder_layers", {1, 2, 1}},
      {"encoder_layers", 1},      {"enc_chunk_size", 3},     {"chunk_topk", 2},
      {"slide_window", 4},        {"chunk_id", 10},          {"pad_id", 9},
      {"rms_norm_eps", 1e-5},     {"rope_theta", 10000.0},   {"tie_word_embeddings", true},
      {"hidden_act", "silu"},     {"attention_bias", false},
  };
}

// Multiples of 1/8 in [-1.75, 1.75]; they differ between tensors so that a
// tensor loaded into the wrong field shows.
inline float TinyValue(size_t tensor_index, size_t element) {
  return static_cast<float>(static_cast<int>((tensor_index * 31 + element * 7) % 29) - 14) / 8.0f;
}

inline std::vector<float> TinyValues(size_t tensor_index, const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  std::vector<float> values(count);
  for (int64_t i = 0; i < count; ++i) values[i] = TinyValue(tensor_index, i);
  return values;
}

struct TinyModel {
  nlohmann::json config;
  SafetensorsWriter weights;
  std::map<std::string, std::vector<float>> values;  // what each tensor holds, in fp32
};

// Every tensor ExpectedTensors(config) names, stored as `dtype`.
inline TinyModel MakeTinyModel(const std::string& dtype = "F32",
                               nlohmann::json config = TinyConfigJson()) {
  absl::StatusOr<ModelConfig> parsed = ParseModelConfig(config.dump(), "tiny config");
  if (!parsed.ok()) throw std::runtime_error(std::string(parsed.status().message()));
  TinyModel model;
  model.config = std::move(config);
  size_t index = 0;
  for (const ExpectedTensor& tensor : ExpectedTensors(*parsed)) {
    std::vector<float> values = TinyValues(index++, tensor.shape);
    model.weights.SetFloats(tensor.name, dtype, tensor.shape, values);
    model.values[tensor.name] = std::move(values);
  }
  return model;
}

inline void WriteModelDir(const std::string& dir, const nlohmann::json& config,
                          const SafetensorsWriter& weights) {
  WriteFile(dir + "/config.json", config.dump(2));
  weights.WriteTo(dir + "/model.safetensors");
}

}  // namespace drt::testing

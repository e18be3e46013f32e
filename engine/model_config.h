// Model hyper-parameters read from a model directory's config.json.
// Keys follow the reference training code (see ../shared/docs/drt-model.md,
// "Shapes and names").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace drt {

class ModelFingerprint;

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;          // d
  int64_t num_attention_heads = 0;  // H
  int64_t num_key_value_heads = 0;  // decoder self-attention K/V heads (GQA)
  int64_t intermediate_size = 0;    // F
  std::vector<int64_t> decoder_layers;  // [N_lower, n_1, ..., n_G]
  int64_t encoder_layers = 0;       // E
  int64_t enc_chunk_size = 0;       // S' (real tokens per chunk)
  int64_t chunk_topk = 0;           // k
  int64_t slide_window = 0;         // W
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  int64_t chunk_id = 0;             // landmark token id
  int64_t pad_id = 0;
  bool tie_word_embeddings = true;
  // Not a config.json key: the model's fingerprint, CRC-32C of config.json
  // and model.safetensors, set by LoadModelDir and computed on first use
  // (engine/model_fingerprint.h); shared by the config's copies; null for a
  // config made otherwise. Session states carry it, so a state is refused by
  // another model of the same shape (docs/state_format.md, "Model
  // fingerprint").
  std::shared_ptr<const ModelFingerprint> fingerprint;
  // fingerprint's value (computing it on the first call), 0 without one;
  // FAILED_PRECONDITION naming the weights file when it was written to
  // since load (engine/model_fingerprint.h).
  absl::StatusOr<uint32_t> model_fingerprint() const;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t num_lower_layers() const { return decoder_layers.empty() ? 0 : decoder_layers[0]; }
  int64_t num_groups() const {
    return decoder_layers.empty() ? 0 : static_cast<int64_t>(decoder_layers.size()) - 1;
  }
  int64_t num_upper_layers() const;
  // Decoder positions per chunk: S' real tokens plus one landmark.
  int64_t chunk_positions() const { return enc_chunk_size + 1; }
};

// Parses config JSON text; `source` names the file in error messages.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);
// Reads and parses `path`.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

}  // namespace drt

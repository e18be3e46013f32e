// A loaded model: its description (config + weights) and its tokenizer.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/generation_defaults.h"
#include "engine/model_dir.h"
#include "engine/tokenizer/tokenizer.h"

namespace drt {

struct Model {
  LoadedModel loaded;
  std::unique_ptr<Tokenizer> tokenizer;
  GenerationDefaults generation;  // from generation_config.json

  const ModelConfig& config() const { return loaded.config; }
  const ModelWeights& weights() const { return loaded.weights; }
};

// Loads <dir>/config.json, model.safetensors and tokenizer.json; without a
// tokenizer.json the model must have a byte-level vocabulary (ids 0..255 are
// bytes), and the byte tokenizer is used. generation_config.json, when
// present, sets the generation defaults.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir);

}  // namespace drt

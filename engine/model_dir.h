// A model directory as the server receives it: config.json and
// model.safetensors (required), tokenizer.json (optional).
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"

namespace drt {

struct ModelFiles {
  std::string dir;
  std::string config_path;                    // <dir>/config.json
  std::string weights_path;                   // <dir>/model.safetensors
  std::optional<std::string> tokenizer_path;  // <dir>/tokenizer.json when present
};

// Checks that the required files exist and can be read: NOT_FOUND naming a
// missing one, PERMISSION_DENIED for a directory that cannot be entered or a
// file that cannot be read, INVALID_ARGUMENT for a directory (or other
// non-file) where a file belongs.
absl::StatusOr<ModelFiles> FindModelFiles(const std::string& dir);

struct LoadedModel {
  ModelFiles files;
  ModelConfig config;
  ModelWeights weights;
};

// FindModelFiles, then the config, then the weights checked against it;
// the model's fingerprint (config.fingerprint) is computed when first used.
absl::StatusOr<LoadedModel> LoadModelDir(const std::string& dir);

}  // namespace drt

#include "engine/model_dir.h"

#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace drt {
namespace {

namespace fs = std::filesystem;

bool IsRegularFile(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

// Names what is there instead of model.safetensors, when something is.
std::string MissingWeightsHint(const fs::path& dir) {
  if (IsRegularFile(dir / "model.safetensors.index.json")) {
    return " (sharded checkpoints are not supported; merge the shards into one file)";
  }
  if (IsRegularFile(dir / "pytorch_model.bin")) {
    return " (found pytorch_model.bin; convert it to safetensors)";
  }
  return "";
}

}  // namespace

absl::StatusOr<ModelFiles> FindModelFiles(const std::string& dir) {
  const fs::path root(dir);
  std::error_code error;
  if (!fs::exists(root, error)) {
    return absl::NotFoundError(absl::StrCat("model directory '", dir, "' does not exist"));
  }
  if (!fs::is_directory(root, error)) {
    return absl::InvalidArgumentError(absl::StrCat("model path '", dir, "' is not a directory"));
  }
  ModelFiles files;
  files.dir = dir;
  files.config_path = (root / "config.json").string();
  files.weights_path = (root / "model.safetensors").string();
  if (!IsRegularFile(files.config_path)) {
    return absl::NotFoundError(absl::StrCat(files.config_path, ": config file not found"));
  }
  if (!IsRegularFile(files.weights_path)) {
    return absl::NotFoundError(
        absl::StrCat(files.weights_path, ": weights file not found", MissingWeightsHint(root)));
  }
  const fs::path tokenizer = root / "tokenizer.json";
  if (IsRegularFile(tokenizer)) files.tokenizer_path = tokenizer.string();
  return files;
}

absl::StatusOr<LoadedModel> LoadModelDir(const std::string& dir) {
  absl::StatusOr<ModelFiles> files = FindModelFiles(dir);
  if (!files.ok()) return files.status();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(files->config_path);
  if (!config.ok()) return config.status();
  absl::StatusOr<ModelWeights> weights = LoadModelWeights(files->weights_path, *config);
  if (!weights.ok()) return weights.status();
  return LoadedModel{*std::move(files), *std::move(config), *std::move(weights)};
}

}  // namespace drt

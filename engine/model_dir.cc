#include "engine/model_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/file_as_loaded.h"
#include "engine/model_fingerprint.h"

namespace drt {
namespace {

namespace fs = std::filesystem;

bool IsRegularFile(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

// Why `path` cannot be used as the `what` of the model ("config file"):
// OK when it is a regular file; PERMISSION_DENIED, NOT_FOUND or
// INVALID_ARGUMENT (a directory or another kind of file) naming the path.
// stat() needs search permission on the directory only, so a directory
// that cannot be entered shows here, not as a missing file.
absl::Status CheckModelFile(const fs::path& path, const char* what) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (error == std::errc::permission_denied) {
    return absl::PermissionDeniedError(absl::StrCat(
        path.string(), ": permission denied (the model directory cannot be entered)"));
  }
  if (status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(path.string(), ": ", what, " not found"));
  }
  if (error) {
    return absl::InternalError(absl::StrCat(path.string(), ": cannot access: ", error.message()));
  }
  if (status.type() == fs::file_type::directory) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), " is a directory, not the ", what));
  }
  if (status.type() != fs::file_type::regular) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), " is not a regular file, so not the ", what));
  }
  // Readable? The loaders open the files later; saying so here names the
  // real problem before anything else is read.
  if (faccessat(AT_FDCWD, path.c_str(), R_OK, AT_EACCESS) != 0 && errno == EACCES) {
    return absl::PermissionDeniedError(absl::StrCat(path.string(), ": permission denied"));
  }
  return absl::OkStatus();
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
  const fs::file_status root_status = fs::status(root, error);
  if (error == std::errc::permission_denied) {
    return absl::PermissionDeniedError(
        absl::StrCat("model directory '", dir, "': permission denied on a directory above it"));
  }
  if (root_status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat("model directory '", dir, "' does not exist"));
  }
  if (root_status.type() != fs::file_type::directory) {
    return absl::InvalidArgumentError(absl::StrCat("model path '", dir, "' is not a directory"));
  }
  // Entering the directory needs search (x) permission; listing it (r) is
  // not needed.
  if (faccessat(AT_FDCWD, root.c_str(), X_OK, AT_EACCESS) != 0 && errno == EACCES) {
    return absl::PermissionDeniedError(absl::StrCat(
        "model directory '", dir, "': permission denied (it cannot be entered)"));
  }
  ModelFiles files;
  files.dir = dir;
  files.config_path = (root / "config.json").string();
  files.weights_path = (root / "model.safetensors").string();
  if (absl::Status s = CheckModelFile(files.config_path, "config file"); !s.ok()) return s;
  if (absl::Status s = CheckModelFile(files.weights_path, "weights file"); !s.ok()) {
    if (s.code() != absl::StatusCode::kNotFound) return s;
    return absl::NotFoundError(absl::StrCat(s.message(), MissingWeightsHint(root)));
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
  // The fingerprint (engine/model_fingerprint.h): the config file's CRC now
  // (a few KB), continued over the weights file through the descriptor the
  // tensors were read through when session states first need it, so a
  // model used without states never reads its weights a second time; a
  // file written to since load is refused then.
  absl::StatusOr<uint32_t> config_crc = ConfigFileCrc32c(files->config_path);
  if (!config_crc.ok()) return config_crc.status();
  std::unique_ptr<FileAsLoaded> weights_file;
  absl::StatusOr<ModelWeights> weights =
      LoadModelWeights(files->weights_path, *config, &weights_file);
  if (!weights.ok()) return weights.status();
  config->fingerprint =
      std::make_shared<const ModelFingerprint>(*config_crc, std::move(weights_file));
  return LoadedModel{*std::move(files), *std::move(config), *std::move(weights)};
}

}  // namespace drt

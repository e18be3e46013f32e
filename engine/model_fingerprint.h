// A model's identity for session states: a state exported from one model is
// refused by another (docs/state_format.md, "Model fingerprint"), also when
// the two have the same shape (a fine-tune, a retrained checkpoint).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace drt {

// CRC-32C of the bytes of `config_path` followed by every byte of
// `weights_path` (the safetensors header and all tensor data: two
// checkpoints of one shape differ in their data only). Errors name the file.
absl::StatusOr<uint32_t> ComputeModelFingerprint(const std::string& config_path,
                                                 const std::string& weights_path);

// The first part of the fingerprint: CRC-32C of the bytes of `config_path`.
// LoadModelDir continues it over the weights file as LoadModelWeights maps
// it, which gives ComputeModelFingerprint's value without a second read.
absl::StatusOr<uint32_t> ConfigFileCrc32c(const std::string& config_path);

}  // namespace drt

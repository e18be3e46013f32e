// A model's identity for session states: a state exported from one model is
// refused by another (docs/state_format.md, "Model fingerprint"), also when
// the two have the same shape (a fine-tune, a retrained checkpoint).
//
// Computing it reads every byte of the weights file (~5 ms for the bundled
// model, seconds for a 14 GB checkpoint), and only session states need it,
// so a loaded model computes it on first use (ModelFingerprint).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

namespace drt {

class SafetensorsFile;

// One model's fingerprint, computed when first asked for: CRC-32C of the
// config file's bytes (read when the model loads, `config_crc`) continued
// over every byte of the weights file, read from the mapping the weights
// were loaded from, which it keeps until then (so it fingerprints the bytes
// loaded, also when the file on disk is replaced meanwhile). Every copy of
// the model's ModelConfig shares one (ModelConfig::fingerprint). Thread-safe:
// the first value() computes it under a once-flag (concurrent callers wait
// for it), the mapping is then released, and later calls only read it.
class ModelFingerprint {
 public:
  // A fingerprint known already (a config made in code, a test).
  explicit ModelFingerprint(uint32_t value);
  // `config_crc` continued over `weights` on first value().
  ModelFingerprint(uint32_t config_crc, std::shared_ptr<const SafetensorsFile> weights);
  ModelFingerprint(const ModelFingerprint&) = delete;
  ModelFingerprint& operator=(const ModelFingerprint&) = delete;

  uint32_t value() const;
  // Whether value() has been computed (or was given): false for a model
  // whose session states were never used, which never read its weights
  // file for it.
  bool computed() const { return computed_.load(std::memory_order_acquire); }

 private:
  mutable std::once_flag once_;
  mutable uint32_t value_;
  // Read (and released) only inside once_.
  mutable std::shared_ptr<const SafetensorsFile> weights_;
  mutable std::atomic<bool> computed_{false};
};

// CRC-32C of the bytes of `config_path` followed by every byte of
// `weights_path` (the safetensors header and all tensor data: two
// checkpoints of one shape differ in their data only). Errors name the file.
absl::StatusOr<uint32_t> ComputeModelFingerprint(const std::string& config_path,
                                                 const std::string& weights_path);

// The first part of the fingerprint: CRC-32C of the bytes of `config_path`.
// LoadModelDir takes it at load; ModelFingerprint continues it over the
// weights file's mapping when first asked, which gives
// ComputeModelFingerprint's value without a second open or read.
absl::StatusOr<uint32_t> ConfigFileCrc32c(const std::string& config_path);

}  // namespace drt

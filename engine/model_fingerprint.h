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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/file_as_loaded.h"

namespace drt {

// One model's fingerprint, computed when first asked for: CRC-32C of the
// config file's bytes (read when the model loads, `config_crc`) continued
// over every byte of the weights file, read with pread through the
// descriptor the weights were loaded through, which it keeps until then.
// A file replaced by rename meanwhile does not matter (the descriptor still
// names the loaded inode); a file written to in place or truncated since
// load (its size or modification time differ) is refused with
// FAILED_PRECONDITION naming the path, as its bytes are no longer the ones
// loaded: the fingerprint would name another model than the one running.
// The kept descriptor pins the loaded inode's disk space until first use.
// Every copy of the model's ModelConfig shares one
// (ModelConfig::fingerprint). Thread-safe: the first value() computes it
// under a mutex (concurrent callers wait for it), the descriptor is then
// closed, and later calls return the same value or the same error. A
// computation stopped by its cancel flag (ValueUnlessCancelled) leaves it
// not computed: the next caller reads the file again.
class ModelFingerprint {
 public:
  // A fingerprint known already (a config made in code, a test).
  explicit ModelFingerprint(uint32_t value);
  // `config_crc` continued over `weights_file` on first value().
  ModelFingerprint(uint32_t config_crc, std::unique_ptr<FileAsLoaded> weights_file);
  ModelFingerprint(const ModelFingerprint&) = delete;
  ModelFingerprint& operator=(const ModelFingerprint&) = delete;

  absl::StatusOr<uint32_t> value() const;
  // value(), but a computation it starts stops once `cancel` is set
  // (checked between pieces of the read) and returns CANCELLED, recording
  // nothing. A shutdown sets it so as not to wait for a read of many GB.
  absl::StatusOr<uint32_t> ValueUnlessCancelled(const std::atomic<bool>& cancel) const;
  // Whether value() has been computed (or was given): false for a model
  // whose session states were never used, which never read its weights
  // file for it.
  bool computed() const { return computed_.load(std::memory_order_acquire); }

 private:
  absl::StatusOr<uint32_t> Compute(const std::atomic<bool>* cancel) const;

  mutable std::mutex mutex_;  // held while it is computed
  mutable uint32_t value_;
  mutable absl::Status error_;  // set under mutex_ when the file changed
  // Read (and closed) only under mutex_.
  mutable std::unique_ptr<FileAsLoaded> weights_file_;
  mutable std::atomic<bool> computed_{false};
};

// CRC-32C of the bytes of `config_path` followed by every byte of
// `weights_path` (the safetensors header and all tensor data: two
// checkpoints of one shape differ in their data only). Errors name the file.
absl::StatusOr<uint32_t> ComputeModelFingerprint(const std::string& config_path,
                                                 const std::string& weights_path);

// The first part of the fingerprint: CRC-32C of the bytes of `config_path`.
// LoadModelDir takes it at load; ModelFingerprint continues it over the
// weights file when first asked, which gives
// ComputeModelFingerprint's value without a second open or read.
absl::StatusOr<uint32_t> ConfigFileCrc32c(const std::string& config_path);

}  // namespace drt

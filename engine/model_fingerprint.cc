#include "engine/model_fingerprint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/crc32c.h"
#include "engine/file_as_loaded.h"

namespace drt {
namespace {

// Continues `crc` over the whole file at `path`, read in pieces
// (Crc32cOfDescriptor, engine/file_as_loaded.h).
absl::Status CrcOfFile(const std::string& path, uint32_t& crc) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot open to fingerprint the model: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(
        absl::StrCat(path, ": cannot stat to fingerprint the model: ", std::strerror(err)));
  }
  absl::StatusOr<uint32_t> read = Crc32cOfDescriptor(fd, static_cast<uint64_t>(st.st_size), crc, path);
  ::close(fd);
  if (!read.ok()) return read.status();
  crc = *read;
  return absl::OkStatus();
}

}  // namespace

ModelFingerprint::ModelFingerprint(uint32_t value) : value_(value) {
  // Nothing left to compute: value()'s once-callback has no file to read.
  computed_.store(true, std::memory_order_release);
}

ModelFingerprint::ModelFingerprint(uint32_t config_crc, std::unique_ptr<FileAsLoaded> weights_file)
    : value_(config_crc), weights_file_(std::move(weights_file)) {}

absl::StatusOr<uint32_t> ModelFingerprint::value() const { return Compute(nullptr); }

absl::StatusOr<uint32_t> ModelFingerprint::ValueUnlessCancelled(
    const std::atomic<bool>& cancel) const {
  return Compute(&cancel);
}

absl::StatusOr<uint32_t> ModelFingerprint::Compute(const std::atomic<bool>* cancel) const {
  // Known once computed_ is set: value_ and error_ no longer change.
  if (!computed_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!computed_.load(std::memory_order_relaxed)) {
      if (weights_file_ != nullptr) {
        absl::StatusOr<uint32_t> crc = weights_file_->Crc32cIfUnchanged(value_, cancel);
        // Stopped: nothing is recorded, and the descriptor stays for the
        // next caller (a read error or a changed file is recorded below).
        if (!crc.ok() && cancel != nullptr && cancel->load()) return crc.status();
        if (crc.ok()) {
          value_ = *crc;
        } else {
          error_ = crc.status();
        }
      }
      weights_file_.reset();  // closes the descriptor
      computed_.store(true, std::memory_order_release);
    }
  }
  if (!error_.ok()) return error_;
  return value_;
}

absl::StatusOr<uint32_t> ComputeModelFingerprint(const std::string& config_path,
                                                 const std::string& weights_path) {
  uint32_t crc = 0;
  if (absl::Status s = CrcOfFile(config_path, crc); !s.ok()) return s;
  if (absl::Status s = CrcOfFile(weights_path, crc); !s.ok()) return s;
  return crc;
}

absl::StatusOr<uint32_t> ConfigFileCrc32c(const std::string& config_path) {
  uint32_t crc = 0;
  if (absl::Status s = CrcOfFile(config_path, crc); !s.ok()) return s;
  return crc;
}

}  // namespace drt

// An open file together with what fstat said of it when it was loaded, so
// that a later reader can tell whether the file still holds the bytes that
// were loaded (engine/model_fingerprint.h reads the weights file again when
// session states first need its fingerprint).
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace drt {

// CRC-32C of the first `size` bytes of the open file `fd`, continuing `crc`,
// read with pread in pieces of at most 1 MiB, no more than the file (weights
// may be larger than memory, and the buffer is resident memory of the call
// that first needs the fingerprint: a SaveSession's peak is tested,
// session_file_writes_test.cc). A file that ends before `size` is
// FAILED_PRECONDITION ("changed since load"), a read error INTERNAL; both
// name `path`. With `cancel`, it is checked between pieces: once it is set,
// the read stops with CANCELLED (so a shutdown need not wait for a read of
// many GB).
absl::StatusOr<uint32_t> Crc32cOfDescriptor(int fd, uint64_t size, uint32_t crc,
                                            const std::string& path,
                                            const std::atomic<bool>* cancel = nullptr);

class FileAsLoaded {
 public:
  // Takes ownership of `fd` (closed by the destructor); `at_load` is its
  // fstat taken when the file's contents were read.
  FileAsLoaded(std::string path, int fd, const struct stat& at_load);
  ~FileAsLoaded();
  FileAsLoaded(const FileAsLoaded&) = delete;
  FileAsLoaded& operator=(const FileAsLoaded&) = delete;

  const std::string& path() const { return path_; }

  // CRC-32C of every byte of the file, continuing `crc`, read with pread
  // from the descriptor kept since load (so a file replaced by rename is
  // still the loaded one, and a shorter file is a read error, not a fault of
  // a mapping). FAILED_PRECONDITION naming the path when the file was
  // written to since load (its size or modification time differ, before or
  // after the read): its bytes are then no longer the ones loaded.
  // `cancel` as for Crc32cOfDescriptor.
  absl::StatusOr<uint32_t> Crc32cIfUnchanged(uint32_t crc,
                                             const std::atomic<bool>* cancel = nullptr) const;

 private:
  absl::Status CheckUnchanged() const;

  std::string path_;
  int fd_;
  struct stat at_load_;
};

}  // namespace drt

#include "engine/file_as_loaded.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/crc32c.h"

namespace drt {

FileAsLoaded::FileAsLoaded(std::string path, int fd, const struct stat& at_load)
    : path_(std::move(path)), fd_(fd), at_load_(at_load) {}

FileAsLoaded::~FileAsLoaded() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status FileAsLoaded::CheckUnchanged() const {
  struct stat now {};
  if (::fstat(fd_, &now) != 0) {
    return absl::InternalError(absl::StrCat(path_, ": cannot stat: ", std::strerror(errno)));
  }
  // The descriptor pins the inode that was loaded, so only writes to that
  // inode matter: they change the modification time (and a truncation the
  // size). A writer that restores the modification time is not detected.
  if (now.st_size != at_load_.st_size || now.st_mtim.tv_sec != at_load_.st_mtim.tv_sec ||
      now.st_mtim.tv_nsec != at_load_.st_mtim.tv_nsec) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": weights file changed since load (", at_load_.st_size, " bytes then, ",
        now.st_size,
        " now, or a newer modification time): its bytes are no longer the ones this server "
        "loaded, so it cannot fingerprint the model; restart the server to load the file as it "
        "is now"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Crc32cOfDescriptor(int fd, uint64_t size, uint32_t crc,
                                            const std::string& path,
                                            const std::atomic<bool>* cancel) {
  std::vector<char> buffer(static_cast<size_t>(std::min<uint64_t>(size, 1 << 20)) + 1);
  uint64_t offset = 0;
  while (offset < size) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      return absl::CancelledError(absl::StrCat(path, ": fingerprint read stopped at byte ",
                                               offset, " of ", size));
    }
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), size - offset));
    const ssize_t got = ::pread(fd, buffer.data(), want, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat(path, ": read error at byte ", offset,
                                              " while fingerprinting the model: ",
                                              std::strerror(errno)));
    }
    if (got == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": weights file changed since load: it ends at byte ", offset,
                       ", not ", size, "; restart the server to load the file as it is now"));
    }
    crc = Crc32c(buffer.data(), static_cast<size_t>(got), crc);
    offset += static_cast<uint64_t>(got);
  }
  return crc;
}

absl::StatusOr<uint32_t> FileAsLoaded::Crc32cIfUnchanged(uint32_t crc,
                                                          const std::atomic<bool>* cancel) const {
  if (absl::Status s = CheckUnchanged(); !s.ok()) return s;
  absl::StatusOr<uint32_t> read =
      Crc32cOfDescriptor(fd_, static_cast<uint64_t>(at_load_.st_size), crc, path_, cancel);
  if (!read.ok()) return read.status();
  // A write during the read would leave a CRC of neither version.
  if (absl::Status s = CheckUnchanged(); !s.ok()) return s;
  return *read;
}

}  // namespace drt

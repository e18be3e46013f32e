#include "server/chunk_log_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "engine/session_state.h"

namespace drt::server {
namespace {

// One mmap of consecutive records of one log.
struct Piece {
  void* base = nullptr;
  size_t length = 0;
  const char* first_payload = nullptr;  // payload of the piece's first record
  int64_t first_chunk = 0;              // the session's index of that record
  int64_t count = 0;
};

class ChunkLogMapping final : public MappedChunks {
 public:
  ChunkLogMapping(int64_t first, int64_t count, const ModelConfig& config)
      : first_(first),
        count_(count),
        width_(config.hidden_size),
        rows_(config.enc_chunk_size),
        record_bytes_(kChunkRecordHeaderBytes + ChunkPayloadBytes(config)) {}
  ~ChunkLogMapping() override {
    for (const Piece& p : pieces_) ::munmap(p.base, p.length);
  }
  ChunkLogMapping(const ChunkLogMapping&) = delete;
  ChunkLogMapping& operator=(const ChunkLogMapping&) = delete;

  int64_t first() const override { return first_; }
  int64_t size() const override { return count_; }
  // Payload layout (docs/state_format.md, version 2): landmark [d], encoder
  // rows [enc_chunk_size x d].
  const float* landmark(int64_t chunk) const override { return Payload(chunk); }
  const float* encoder_rows(int64_t chunk) const override { return Payload(chunk) + width_; }
  size_t encoder_row_bytes() const override {
    return static_cast<size_t>(count_) * rows_ * width_ * sizeof(float);
  }

  std::vector<Piece>& pieces() { return pieces_; }

 private:
  const float* Payload(int64_t chunk) const {
    for (const Piece& p : pieces_) {
      if (chunk >= p.first_chunk && chunk < p.first_chunk + p.count) {
        return reinterpret_cast<const float*>(p.first_payload +
                                              (chunk - p.first_chunk) * record_bytes_);
      }
    }
    return nullptr;  // outside [first, first + size): the caller's contract
  }

  int64_t first_, count_, width_, rows_;
  size_t record_bytes_;
  std::vector<Piece> pieces_;  // in chunk order; one per log the range crosses
};

std::string ErrnoText() { return std::strerror(errno); }

}  // namespace

absl::StatusOr<std::shared_ptr<const MappedChunks>> MapChunkLogs(
    const std::vector<ChunkSegment>& segments, const std::vector<std::string>& log_paths,
    int64_t first, int64_t count, const ModelConfig& config) {
  const size_t payload = ChunkPayloadBytes(config);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto mapping = std::make_shared<ChunkLogMapping>(first, count, config);
  int64_t segment_first = 0;  // the session's index of the segment's first chunk
  for (size_t i = 0; i < segments.size() && segment_first < first + count; ++i) {
    const int64_t segment_end = segment_first + segments[i].chunks;
    const int64_t lo = std::max(first, segment_first);
    const int64_t hi = std::min(first + count, segment_end);
    if (lo < hi) {
      // Records lo..hi-1 of the session are records (lo - segment_first)..
      // of this log; the mapping starts at the page holding the first.
      const uint64_t begin = ChunkRecordOffset(lo - segment_first, payload);
      const uint64_t end = ChunkRecordOffset(hi - segment_first, payload);
      const uint64_t map_begin = begin / page * page;
      const std::string& path = log_paths[i];
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        return absl::FailedPreconditionError(
            absl::StrFormat("cannot open %s to map its chunks: %s", path, ErrnoText()));
      }
      void* base = ::mmap(nullptr, end - map_begin, PROT_READ, MAP_SHARED, fd,
                          static_cast<off_t>(map_begin));
      const std::string mmap_error = base == MAP_FAILED ? ErrnoText() : "";
      ::close(fd);  // the mapping keeps the file
      if (base == MAP_FAILED) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "cannot map chunks %d..%d of %s: %s", lo - segment_first, hi - segment_first - 1,
            path, mmap_error));
      }
      Piece piece;
      piece.base = base;
      piece.length = end - map_begin;
      piece.first_payload =
          static_cast<const char*>(base) + (begin - map_begin) + kChunkRecordHeaderBytes;
      piece.first_chunk = lo;
      piece.count = hi - lo;
      mapping->pieces().push_back(piece);
    }
    segment_first = segment_end;
  }
  int64_t mapped = 0;
  for (const Piece& p : mapping->pieces()) mapped += p.count;
  if (mapped != count) {
    return absl::OutOfRangeError(absl::StrFormat(
        "chunks [%d, %d) are not all in the session's chunk logs (%d chunks there)", first,
        first + count, segment_first));
  }
  return std::shared_ptr<const MappedChunks>(std::move(mapping));
}

}  // namespace drt::server

#include "engine/cuda/host/host_chunk_store.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace drt::cuda {

template <typename Element>
HostChunkStore<Element>::HostChunkStore(ChunkRecordLayout layout,
                                        std::shared_ptr<HostAllocator> allocator,
                                        HostChunkStoreOptions options)
    : layout_(layout),
      allocator_(std::move(allocator)),
      options_(options) {
  options_.first_slab_chunks = std::max<int64_t>(1, options_.first_slab_chunks);
  options_.max_slab_chunks = std::max(options_.first_slab_chunks, options_.max_slab_chunks);
}

template <typename Element>
int64_t HostChunkStore<Element>::SlabChunks(size_t index) const {
  int64_t chunks = options_.first_slab_chunks;
  for (size_t i = 0; i < index && chunks < options_.max_slab_chunks; ++i) chunks *= 2;
  return std::min(chunks, options_.max_slab_chunks);
}

template <typename Element>
absl::StatusOr<std::shared_ptr<typename HostChunkStore<Element>::Slab>>
HostChunkStore<Element>::AllocateSlab(int64_t chunks) const {
  const size_t bytes = static_cast<size_t>(chunks) * record_bytes();
  absl::StatusOr<void*> data = allocator_->Allocate(bytes);
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrFormat("chunk store slab of %d chunks (%d bytes): %s", chunks,
                                        bytes, data.status().message()));
  }
  return std::make_shared<Slab>(allocator_, *data, bytes, chunks);
}

template <typename Element>
absl::Status HostChunkStore<Element>::OpenSlab() {
  std::shared_ptr<Slab> slab;
  if (!spare_.slabs.empty()) {
    slab = std::move(spare_.slabs.front());
    spare_.slabs.pop_front();
  } else {
    absl::StatusOr<std::shared_ptr<Slab>> made = AllocateSlab(SlabChunks(slabs_.size()));
    if (!made.ok()) return made.status();
    slab = *std::move(made);
  }
  slabs_.push_back(std::move(slab));
  held_in_slab_.push_back(0);
  used_in_last_slab_ = 0;
  return absl::OkStatus();
}

template <typename Element>
int64_t HostChunkStore<Element>::RoomInLastSlab() const {
  // A slab another store also holds is read-only for both (see the header);
  // a freed one is gone.
  if (slabs_.empty() || slabs_.back() == nullptr || slabs_.back().use_count() > 1) return 0;
  return slabs_.back()->capacity - used_in_last_slab_;
}

template <typename Element>
absl::Status HostChunkStore<Element>::Reserve(int64_t count) {
  int64_t room = RoomInLastSlab();
  for (const auto& slab : spare_.slabs) room += slab->capacity;
  std::vector<std::shared_ptr<Slab>> opened;  // freed on failure
  while (room < count) {
    const int64_t chunks = SlabChunks(slabs_.size() + spare_.slabs.size() + opened.size());
    absl::StatusOr<std::shared_ptr<Slab>> made = AllocateSlab(chunks);
    if (!made.ok()) {
      return absl::Status(made.status().code(),
                          absl::StrFormat("making room for %d more chunks: %s", count,
                                          made.status().message()));
    }
    opened.push_back(*std::move(made));
    room += chunks;
  }
  for (auto& slab : opened) spare_.slabs.push_back(std::move(slab));
  return absl::OkStatus();
}

template <typename Element>
absl::StatusOr<int64_t> HostChunkStore<Element>::AppendUninitialized(int64_t count) {
  const int64_t first = size();
  records_.reserve(records_.size() + count);
  record_slab_.reserve(record_slab_.size() + count);
  for (int64_t i = 0; i < count; ++i) {
    if (RoomInLastSlab() == 0) {
      if (absl::Status s = OpenSlab(); !s.ok()) {
        // All or nothing; a fresh empty slab may stay.
        for (int64_t c = first; c < size(); ++c) --held_in_slab_[record_slab_[c]];
        records_.resize(first);
        record_slab_.resize(first);
        return s;
      }
    }
    auto* base = static_cast<Element*>(slabs_.back()->data);
    records_.push_back(base + used_in_last_slab_ * layout_.elements());
    record_slab_.push_back(static_cast<int32_t>(slabs_.size() - 1));
    ++held_in_slab_.back();
    ++used_in_last_slab_;
  }
  return first;
}

template <typename Element>
absl::Status HostChunkStore<Element>::AppendRecord(const Element* record) {
  absl::StatusOr<int64_t> chunk = AppendUninitialized(1);
  if (!chunk.ok()) return chunk.status();
  std::memcpy(mutable_record(*chunk), record, record_bytes());
  return absl::OkStatus();
}

template <typename Element>
absl::Status HostChunkStore<Element>::Append(const Element* keys, const Element* values) {
  if (layout_.blocks != 2) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Append(keys, values) on a chunk store of %d-block records (encoder rows)",
        layout_.blocks));
  }
  absl::StatusOr<int64_t> chunk = AppendUninitialized(1);
  if (!chunk.ok()) return chunk.status();
  std::memcpy(mutable_keys(*chunk), keys, block_bytes());
  std::memcpy(mutable_values(*chunk), values, block_bytes());
  return absl::OkStatus();
}

template <typename Element>
void HostChunkStore<Element>::AppendReleased(int64_t count) {
  records_.insert(records_.end(), count, nullptr);
  record_slab_.insert(record_slab_.end(), count, -1);
  released_count_ += count;
}

template <typename Element>
absl::Status HostChunkStore<Element>::Release(int64_t first, int64_t count) {
  if (first < 0 || count < 0 || first > size() || count > size() - first) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot release chunks [%d, %d): the store holds chunks [0, %d)", first,
        first + count, size()));
  }
  for (int64_t c = first; c < first + count; ++c) {
    if (records_[c] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot release chunks [%d, %d): chunk %d is released already", first,
                          first + count, c));
    }
  }
  for (int64_t c = first; c < first + count; ++c) {
    const int32_t slab = record_slab_[c];
    records_[c] = nullptr;
    record_slab_[c] = -1;
    // This store's last record in the slab: drop our reference (a fork may
    // keep the slab alive). The last slab, once freed, is never written
    // again: the next append opens a new one.
    if (--held_in_slab_[slab] == 0) slabs_[slab].reset();
  }
  released_count_ += count;
  return absl::OkStatus();
}

template <typename Element>
size_t HostChunkStore<Element>::num_slabs() const {
  size_t n = spare_.slabs.size();
  for (const auto& slab : slabs_) n += slab != nullptr;
  return n;
}

template <typename Element>
size_t HostChunkStore<Element>::bytes() const {
  size_t total = 0;
  for (const auto& slab : slabs_) {
    if (slab != nullptr) total += slab->bytes;
  }
  for (const auto& slab : spare_.slabs) total += slab->bytes;
  return total;
}

template <typename Element>
size_t HostChunkStore<Element>::shared_bytes() const {
  size_t total = 0;
  for (const auto& slab : slabs_) {
    if (slab != nullptr && slab.use_count() > 1) total += slab->bytes;
  }
  return total;
}

template <typename Element>
size_t HostChunkStore<Element>::shared_elsewhere_bytes() const {
  size_t total = 0;
  for (const auto& slab : slabs_) {
    const long holders = slab.use_count();
    if (slab != nullptr && holders > 1) {
      total += slab->bytes - slab->bytes / static_cast<size_t>(holders);
    }
  }
  return total;
}

absl::StatusOr<HostChunkStoreOptions> CudaSlabOptions(int64_t max_slab_chunks) {
  if (max_slab_chunks < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_slab_chunks (the largest pinned chunk store slab, in chunks) must be at least 1, "
        "got %d",
        max_slab_chunks));
  }
  constexpr int64_t kFirstSlabChunks = 16;
  return HostChunkStoreOptions{std::min(kFirstSlabChunks, max_slab_chunks), max_slab_chunks};
}

template class HostChunkStore<Bf16Bits>;
template class HostChunkStore<float>;

}  // namespace drt::cuda

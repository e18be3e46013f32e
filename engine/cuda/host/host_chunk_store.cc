#include "engine/cuda/host/host_chunk_store.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace drt::cuda {

template <typename Element>
HostChunkStore<Element>::HostChunkStore(int64_t rows_per_chunk, int64_t width,
                                        std::shared_ptr<HostAllocator> allocator,
                                        HostChunkStoreOptions options)
    : rows_(rows_per_chunk),
      width_(width),
      allocator_(std::move(allocator)),
      options_(options) {
  options_.first_slab_chunks = std::max<int64_t>(1, options_.first_slab_chunks);
  options_.max_slab_chunks = std::max(options_.first_slab_chunks, options_.max_slab_chunks);
}

template <typename Element>
absl::Status HostChunkStore<Element>::OpenSlab() {
  int64_t chunks = options_.first_slab_chunks;
  for (size_t i = 0; i < slabs_.size() && chunks < options_.max_slab_chunks; ++i) chunks *= 2;
  chunks = std::min(chunks, options_.max_slab_chunks);
  const size_t bytes = static_cast<size_t>(chunks) * 2 * kv_block_bytes();
  absl::StatusOr<void*> data = allocator_->Allocate(bytes);
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrFormat("chunk store slab of %d chunks (%d bytes): %s", chunks,
                                        bytes, data.status().message()));
  }
  slabs_.push_back(std::make_shared<Slab>(allocator_, *data, bytes, chunks));
  used_in_last_slab_ = 0;
  return absl::OkStatus();
}

template <typename Element>
absl::StatusOr<int64_t> HostChunkStore<Element>::AppendUninitialized(int64_t count) {
  const int64_t first = size();
  records_.reserve(records_.size() + count);
  for (int64_t i = 0; i < count; ++i) {
    // A slab another store also holds is read-only for both (see the header).
    if (slabs_.empty() || used_in_last_slab_ == slabs_.back()->capacity ||
        slabs_.back().use_count() > 1) {
      if (absl::Status s = OpenSlab(); !s.ok()) {
        records_.resize(first);  // all or nothing; a fresh empty slab may stay
        return s;
      }
    }
    auto* base = static_cast<Element*>(slabs_.back()->data);
    records_.push_back(base + used_in_last_slab_ * 2 * rows_ * width_);
    ++used_in_last_slab_;
  }
  return first;
}

template <typename Element>
absl::Status HostChunkStore<Element>::Append(const Element* keys, const Element* values) {
  absl::StatusOr<int64_t> chunk = AppendUninitialized(1);
  if (!chunk.ok()) return chunk.status();
  std::memcpy(mutable_keys(*chunk), keys, kv_block_bytes());
  std::memcpy(mutable_values(*chunk), values, kv_block_bytes());
  return absl::OkStatus();
}

template <typename Element>
size_t HostChunkStore<Element>::bytes() const {
  size_t total = 0;
  for (const auto& slab : slabs_) total += slab->bytes;
  return total;
}

template <typename Element>
size_t HostChunkStore<Element>::shared_bytes() const {
  size_t total = 0;
  for (const auto& slab : slabs_) {
    if (slab.use_count() > 1) total += slab->bytes;
  }
  return total;
}

template class HostChunkStore<Bf16Bits>;
template class HostChunkStore<float>;

}  // namespace drt::cuda

#include "engine/cuda/host/chunk_staging.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/cuda/host/bf16.h"

namespace drt::cuda {

template <typename Element>
ChunkStaging<Element>::ChunkStaging(int64_t slots, int64_t elements,
                                    std::shared_ptr<HostAllocator> allocator)
    : elements_(elements),
      allocator_(std::move(allocator)),
      queued_(std::max<int64_t>(1, slots), false),
      bytes_(queued_.size() * static_cast<size_t>(elements) * sizeof(Element)) {}

template <typename Element>
ChunkStaging<Element>::~ChunkStaging() {
  if (data_ != nullptr) allocator_->Free(data_, bytes_);
}

template <typename Element>
absl::Status ChunkStaging<Element>::Allocate() {
  if (data_ != nullptr) return absl::OkStatus();
  absl::StatusOr<void*> data = allocator_->Allocate(bytes_);
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrFormat("staging for mapped chunks (%d bytes): %s", bytes_,
                                        data.status().message()));
  }
  data_ = *data;
  return absl::OkStatus();
}

template <typename Element>
absl::StatusOr<typename ChunkStaging<Element>::Slot> ChunkStaging<Element>::Next() {
  if (absl::Status s = Allocate(); !s.ok()) return s;
  const int64_t index = next_;
  next_ = (next_ + 1) % slots();
  return Slot{index, queued_[index], static_cast<Element*>(data_) + index * elements_};
}

template class ChunkStaging<Bf16Bits>;
template class ChunkStaging<float>;

}  // namespace drt::cuda

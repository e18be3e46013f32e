// Which closed chunks sit in which slot of one group's device chunk buffer.
// At each landmark (or, in prefill, once per slice of a step for all the selections
// its query chunks use) the caller asks for a set of chunks; chunks already
// resident cost nothing, the others are assigned a slot that is empty or holds
// a chunk outside the request, least recently requested first. A chunk in the
// request is never evicted, so every chunk of one request has its own slot.
// Pure bookkeeping: the caller issues the copies the plan lists.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace drt::cuda {

class ChunkResidency {
 public:
  explicit ChunkResidency(int num_slots);

  struct Copy {
    int64_t chunk;
    int slot;
  };
  struct Plan {
    std::vector<int> slots;       // per requested chunk, in request order
    std::vector<Copy> copies;     // missing chunks: copy each into its slot
    std::vector<int64_t> evicted; // chunks whose slot was reused
    int hits = 0;                 // distinct requested chunks already resident
  };
  // Chunks may repeat (they get the same slot). INVALID_ARGUMENT when more
  // distinct chunks are requested than there are slots, or a chunk is < 0;
  // nothing changes then.
  absl::StatusOr<Plan> Request(absl::Span<const int64_t> chunks);

  int num_slots() const { return static_cast<int>(slot_chunk_.size()); }
  // The chunk in `slot`, -1 when empty.
  int64_t chunk_in_slot(int slot) const { return slot_chunk_[slot]; }
  // The slot holding `chunk`, -1 when not resident.
  int slot_of(int64_t chunk) const;
  // Forgets every slot's content (after the buffer was lost or overwritten).
  void Clear();

 private:
  std::vector<int64_t> slot_chunk_;   // -1: empty
  std::vector<uint64_t> last_used_;   // request counter at the slot's last use
  uint64_t clock_ = 0;
};

}  // namespace drt::cuda

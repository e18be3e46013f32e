// Append-only host memory of closed chunks in the backend's storage type
// (Element: Bf16Bits, or float in fp32 precision), the part of a CUDA
// session that grows with the context. A chunk's record is laid out by a
// ChunkRecordLayout (engine/cuda/host/chunk_record_layout.h): its GCA keys
// and values (drt-model.md, Forward pass 4: K, V = 64 x d each), or its
// encoder rows C (63 x d, half the bytes). Records live in large slabs
// (page-locked in production, so device<->host copies are asynchronous); a
// record is written once, by one device->host copy, and then only read.
//
// Copying the store is the fork: the copy shares every slab. A slab that is
// shared is never written again by either side (each opens a new slab for its
// next chunk), so a fork costs no record copies; at most the unused tail of
// one slab per side is wasted. The landmark vectors are not here: they stay
// on the device.
//
// The disk tier (engine/cuda/host/map_host_chunks.h) releases records whose
// chunks are then read from mapped files: a released record has no memory
// here, and a slab is freed once none of this store's records in it is
// held. A fork holds its own reference to every slab, so it keeps the
// records its parent released until it releases them too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/host/bf16.h"
#include "engine/cuda/host/chunk_record_layout.h"
#include "engine/cuda/host/host_allocator.h"

namespace drt::cuda {

struct HostChunkStoreOptions {
  // Slab sizes in chunks double from the first to the largest.
  int64_t first_slab_chunks = 16;
  int64_t max_slab_chunks = 1024;
};

// A CUDA session's slab sizes for CudaBackendOptions::max_slab_chunks:
// doubling from 16 chunks, or from max_slab_chunks when that is smaller (a
// small host's cap is honoured as given), up to max_slab_chunks.
// INVALID_ARGUMENT naming the option for max_slab_chunks < 1
// (MakeCudaBackend refuses the backend then).
absl::StatusOr<HostChunkStoreOptions> CudaSlabOptions(int64_t max_slab_chunks);

// Instantiated for Bf16Bits and float (host_chunk_store.cc).
template <typename Element>
class HostChunkStore {
 public:
  HostChunkStore(ChunkRecordLayout layout, std::shared_ptr<HostAllocator> allocator,
                 HostChunkStoreOptions options = {});
  // Records of keys and values, [rows_per_chunk x width] each.
  HostChunkStore(int64_t rows_per_chunk, int64_t width, std::shared_ptr<HostAllocator> allocator,
                 HostChunkStoreOptions options = {})
      : HostChunkStore(ChunkRecordLayout{rows_per_chunk, width, 2}, std::move(allocator),
                       options) {}

  int64_t size() const { return static_cast<int64_t>(records_.size()); }
  const ChunkRecordLayout& layout() const { return layout_; }
  int64_t rows_per_chunk() const { return layout_.rows; }
  int64_t width() const { return layout_.width; }
  // Bytes of one block of a record (the keys; the values are as many), and
  // of the whole record.
  size_t block_bytes() const {
    return static_cast<size_t>(layout_.block_elements()) * sizeof(Element);
  }
  size_t record_bytes() const { return static_cast<size_t>(layout_.elements()) * sizeof(Element); }
  bool pinned() const { return allocator_->pinned(); }

  // Appends `count` chunks whose records the caller writes next (through
  // mutable_record, or mutable_keys/mutable_values, e.g. by an asynchronous
  // copy). Returns the index of the first.
  absl::StatusOr<int64_t> AppendUninitialized(int64_t count);
  // Room for `count` more chunks made ahead: opens now every slab that the
  // next `count` appends (in any pieces) would open, so that they allocate
  // nothing (a CUDA session calls it before a step, so that a host short of
  // pinned memory fails that session alone, before any kernel of the step).
  // All or nothing: when an allocation fails, the slabs this call opened
  // are freed and nothing changes. Slabs held ahead count in bytes() and
  // num_slabs(); a copy of the store (a fork) does not get them.
  absl::Status Reserve(int64_t count);
  // Appends one chunk, copying its record (layout().elements()) in.
  absl::Status AppendRecord(const Element* record);
  // Appends one chunk of a two-block layout, copying keys and values
  // ([rows x width] each) in.
  absl::Status Append(const Element* keys, const Element* values);
  // Appends `count` chunks released already (read from elsewhere: a session
  // imported with mapped chunks).
  void AppendReleased(int64_t count);
  // Drops the records of chunks [first, first + count), all held now, and
  // frees every slab left with none of this store's records held.
  // INVALID_ARGUMENT naming the problem (a range outside the store, a
  // chunk released already) changes nothing.
  absl::Status Release(int64_t first, int64_t count);
  bool released(int64_t chunk) const { return records_[chunk] == nullptr; }
  int64_t released_count() const { return released_count_; }

  // Null for a released chunk. keys/values: the two blocks of a K/V record.
  const Element* record(int64_t chunk) const { return records_[chunk]; }
  const Element* keys(int64_t chunk) const { return records_[chunk]; }
  const Element* values(int64_t chunk) const {
    return records_[chunk] == nullptr ? nullptr : records_[chunk] + layout_.block_elements();
  }
  // Only for chunks this store appended since it was last copied.
  Element* mutable_record(int64_t chunk) { return records_[chunk]; }
  Element* mutable_keys(int64_t chunk) { return records_[chunk]; }
  Element* mutable_values(int64_t chunk) { return records_[chunk] + layout_.block_elements(); }

  // Slabs held (freed ones not counted; those held ahead by Reserve
  // counted).
  size_t num_slabs() const;
  // Bytes of all slabs held, and of those another store also holds.
  size_t bytes() const;
  size_t shared_bytes() const;
  // Of shared_bytes(), what the other holders of the shared slabs count: a
  // slab held by n stores counts (n - 1) / n of its bytes here
  // (SessionMemory::shared_elsewhere_bytes).
  size_t shared_elsewhere_bytes() const;

 private:
  struct Slab {
    Slab(std::shared_ptr<HostAllocator> a, void* d, size_t b, int64_t c)
        : allocator(std::move(a)), data(d), bytes(b), capacity(c) {}
    ~Slab() { allocator->Free(data, bytes); }
    Slab(const Slab&) = delete;
    Slab& operator=(const Slab&) = delete;
    std::shared_ptr<HostAllocator> allocator;
    void* data;
    size_t bytes;
    int64_t capacity;  // chunks
  };
  // Slabs opened by Reserve, not yet written, next first. Copying the store
  // copies none of them: a slab two stores held would be written by both.
  class SpareSlabs {
   public:
    SpareSlabs() = default;
    SpareSlabs(const SpareSlabs&) {}
    SpareSlabs& operator=(const SpareSlabs&) {
      slabs.clear();
      return *this;
    }
    SpareSlabs(SpareSlabs&&) noexcept = default;
    SpareSlabs& operator=(SpareSlabs&&) noexcept = default;
    std::deque<std::shared_ptr<Slab>> slabs;
  };
  // The size in chunks of the slab opened as the index-th (freed ones
  // counted).
  int64_t SlabChunks(size_t index) const;
  absl::StatusOr<std::shared_ptr<Slab>> AllocateSlab(int64_t chunks) const;
  // Makes a new last slab: the next spare, else a new allocation.
  absl::Status OpenSlab();
  // Records the last slab still takes (0 when it is full, freed or shared).
  int64_t RoomInLastSlab() const;

  ChunkRecordLayout layout_;
  std::shared_ptr<HostAllocator> allocator_;
  HostChunkStoreOptions options_;
  // Null once freed (Release). slabs_.back() is where records go next.
  std::vector<std::shared_ptr<Slab>> slabs_;
  std::vector<int64_t> held_in_slab_;  // per slab: this store's records in it, not released
  int64_t used_in_last_slab_ = 0;      // records this store placed in slabs_.back()
  std::vector<Element*> records_;      // chunk -> its record; null: released
  std::vector<int32_t> record_slab_;   // chunk -> index in slabs_; -1: released
  int64_t released_count_ = 0;
  SpareSlabs spare_;
};

}  // namespace drt::cuda

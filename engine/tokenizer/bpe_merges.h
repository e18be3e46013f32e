// The merge table of a BPE model and the merge loop that applies it to a word.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace drt {

class BpeMerges {
 public:
  // Registers that the pair (left, right) merges into `merged`. Merges added
  // earlier have priority. A repeated pair takes its latest rank and result,
  // as in Hugging Face (which collects the list into a map).
  void Add(int32_t left, int32_t right, int32_t merged);

  // Merges the symbols of one word in place, exactly as Hugging Face's
  // Word::merge_all does without dropout: always the lowest-rank adjacent pair
  // first, the leftmost one among equals.
  void MergeWord(std::vector<int32_t>* symbols) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  const Merge* Find(int32_t left, int32_t right) const;
  void MergeShortWord(std::vector<int32_t>* symbols) const;
  void MergeLongWord(std::vector<int32_t>* symbols) const;

  std::unordered_map<uint64_t, Merge> merges_;
  int32_t next_rank_ = 0;
};

}  // namespace drt

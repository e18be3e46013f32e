#include "engine/tokenizer/gpt2_char_class.h"

#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace drt {
namespace {

struct ClassRange {
  char32_t first;
  char32_t last;
  CharClass cls;
};

// Sorted, disjoint; every code point not listed is kOther.
constexpr ClassRange kRanges[] = {
#include "engine/tokenizer/gpt2_char_class_ranges.inc"
};

constexpr char32_t kCodePoints = 0x110000;
constexpr int kBlockBits = 8;
constexpr char32_t kBlockSize = 1 << kBlockBits;

// A two-stage lookup (as in Unicode's own implementations): the code point's
// block of 256 selects one of the distinct blocks, which holds one class per
// code point. Unicode 16 has 133 distinct blocks: 43 KB in all. A lookup is
// two loads instead of a binary search over the 831 ranges.
class ClassTable {
 public:
  ClassTable() : block_index_(kCodePoints / kBlockSize) {
    std::map<std::string, uint16_t> seen;  // block contents -> index
    std::array<CharClass, kBlockSize> block;
    const ClassRange* range = std::begin(kRanges);
    for (size_t b = 0; b < block_index_.size(); ++b) {
      const char32_t base = static_cast<char32_t>(b) << kBlockBits;
      for (char32_t i = 0; i < kBlockSize; ++i) {
        const char32_t c = base + i;
        while (range != std::end(kRanges) && range->last < c) ++range;
        block[i] = range != std::end(kRanges) && range->first <= c ? range->cls : CharClass::kOther;
      }
      std::string key(reinterpret_cast<const char*>(block.data()), kBlockSize);
      const auto [it, inserted] = seen.emplace(std::move(key), static_cast<uint16_t>(seen.size()));
      if (inserted) blocks_.insert(blocks_.end(), block.begin(), block.end());
      block_index_[b] = it->second;
    }
  }

  CharClass Get(char32_t c) const {
    if (c >= kCodePoints) return CharClass::kOther;
    return blocks_[(size_t{block_index_[c >> kBlockBits]} << kBlockBits) | (c & (kBlockSize - 1))];
  }

 private:
  std::vector<uint16_t> block_index_;
  std::vector<CharClass> blocks_;
};

}  // namespace

CharClass Gpt2CharClass(char32_t c) {
  // Built once on first use and only read afterwards.
  static const ClassTable* const table = new ClassTable();
  return table->Get(c);
}

}  // namespace drt

#include "engine/tokenizer/bpe_merges.h"

#include <cstddef>
#include <queue>

namespace drt {
namespace {

// Below this many symbols a rescan per merge beats a heap.
constexpr size_t kShortWordLimit = 48;

}  // namespace

void BpeMerges::Add(int32_t left, int32_t right, int32_t merged) {
  merges_.insert_or_assign(PairKey(left, right), Merge{next_rank_++, merged});
}

const BpeMerges::Merge* BpeMerges::Find(int32_t left, int32_t right) const {
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeMerges::MergeWord(std::vector<int32_t>* symbols) const {
  if (symbols->size() < 2) return;
  if (symbols->size() <= kShortWordLimit) {
    MergeShortWord(symbols);
  } else {
    MergeLongWord(symbols);
  }
}

void BpeMerges::MergeShortWord(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& s = *symbols;
  while (s.size() > 1) {
    const Merge* best = nullptr;
    size_t best_pos = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const Merge* m = Find(s[i], s[i + 1]);
      if (m != nullptr && (best == nullptr || m->rank < best->rank)) {
        best = m;
        best_pos = i;
      }
    }
    if (best == nullptr) return;
    s[best_pos] = best->merged;
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(best_pos) + 1);
  }
}

// The same order of merges as the rescan, in O(n log n): a heap of candidate
// pairs keyed by (rank, position) over a linked list of live symbols.
// Candidates made stale by an earlier merge are recognised and dropped.
void BpeMerges::MergeLongWord(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& ids = *symbols;
  const int n = static_cast<int>(ids.size());
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }

  struct Candidate {
    int32_t rank;
    int pos;
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto push_pair_at = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const Merge* m = Find(ids[pos], ids[next[pos]])) queue.push({m->rank, pos, m->merged});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair_at(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const int right = next[top.pos];
    const Merge* current = Find(ids[top.pos], ids[right]);
    if (current == nullptr || current->merged != top.merged) continue;  // stale

    ids[top.pos] = top.merged;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    push_pair_at(prev[top.pos]);
    push_pair_at(top.pos);
  }

  size_t out = 0;
  for (int i = 0; i >= 0 && i < n; i = next[i]) ids[out++] = ids[i];
  ids.resize(out);
}

}  // namespace drt

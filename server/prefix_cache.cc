#include "server/prefix_cache.h"

#include <algorithm>
#include <utility>

namespace drt::server {

namespace {

// The host bytes a snapshot would hold as the last holder of its chunks
// (all the memory it reads, SessionEntry::host_bytes, and its scores):
// PrefixEntry::bytes never exceeds it. One above --prefix_cache_bytes is
// not kept.
int64_t FullBytes(const PrefixEntry& entry) {
  return entry.session->host_bytes() + entry.score_bytes;
}

}  // namespace

int64_t ScoreBytes(const std::vector<TokenScore>& scores) {
  int64_t bytes = static_cast<int64_t>(scores.capacity() * sizeof(TokenScore));
  for (const TokenScore& score : scores) {
    bytes += static_cast<int64_t>(score.top.capacity() * sizeof(TokenLogProb));
  }
  return bytes;
}

PrefixMatcher::PrefixMatcher(std::vector<std::shared_ptr<const PrefixEntry>> candidates)
    : alive_(std::move(candidates)) {
  // (An empty snapshot is never kept; one would be a hit of 0 tokens.)
  std::erase_if(alive_, [](const auto& c) { return c->tokens.empty(); });
}

void PrefixMatcher::SettleEnded() {
  const size_t n = held_.size();
  std::erase_if(alive_, [&](const std::shared_ptr<const PrefixEntry>& c) {
    if (c->tokens.size() != n) return false;
    // All its tokens matched: a hit, longer than any found before (the
    // tokens pushed only grow).
    hit_ = c;
    return true;
  });
}

void PrefixMatcher::Push(absl::Span<const int32_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (alive_.empty()) {
      // Nothing can match any more: only the tokens are kept.
      held_.insert(held_.end(), ids.begin() + i, ids.end());
      return;
    }
    const int32_t id = ids[i];
    const size_t at = held_.size();
    std::erase_if(alive_, [&](const std::shared_ptr<const PrefixEntry>& c) {
      if (c->tokens[at] == id) return false;
      common_ = std::max<int64_t>(common_, static_cast<int64_t>(at));
      return true;
    });
    held_.push_back(id);
    SettleEnded();
  }
}

int64_t PrefixMatcher::common_tokens() const {
  // A snapshot still alive shares every token pushed.
  const int64_t alive = alive_.empty() ? 0 : held();
  return std::max({common_, hit_tokens(), alive});
}

PrefixCache::PrefixCache(SessionManager& sessions, PrefixCacheLimits limits, Metrics& metrics)
    : sessions_(sessions), limits_(limits), metrics_(metrics) {
  if (enabled()) sessions_.SetHostMemoryReclaimer([this] { return EvictOne(); });
}

PrefixCache::~PrefixCache() {
  if (enabled()) sessions_.SetHostMemoryReclaimer(nullptr);
  std::list<std::shared_ptr<PrefixEntry>> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    all.swap(lru_);
  }
  for (const auto& entry : all) {
    sessions_.Delete(entry->session->id(), /*hidden_too=*/true).IgnoreError();
  }
}

std::vector<std::shared_ptr<const PrefixEntry>> PrefixCache::Candidates(
    std::optional<int32_t> score_top) const {
  std::vector<std::shared_ptr<const PrefixEntry>> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& entry : lru_) {
    if (score_top.has_value() &&
        (!entry->score_top.has_value() || *entry->score_top < *score_top)) {
      continue;
    }
    out.push_back(entry);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<SessionEntry>> PrefixCache::Fork(const PrefixEntry& entry) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find_if(lru_.begin(), lru_.end(),
                           [&](const auto& kept) { return kept.get() == &entry; });
    if (it != lru_.end()) lru_.splice(lru_.begin(), lru_, it);
  }
  // (Evicted meanwhile: its session is deleted, and the fork's reader claim
  // answers NOT_FOUND, or ABORTED when the delete came during the copy.)
  return sessions_.ForkEphemeral(entry.session);
}

void PrefixCache::Add(const std::shared_ptr<SessionEntry>& session, std::vector<int32_t> tokens,
                      std::optional<int32_t> score_top, std::vector<TokenScore> scores) {
  if (!enabled() || tokens.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      const PrefixEntry& kept = **it;
      const bool scores_as_good =
          !score_top.has_value() ||
          (kept.score_top.has_value() && *kept.score_top >= *score_top);
      if (kept.tokens == tokens && scores_as_good) {
        lru_.splice(lru_.begin(), lru_, it);
        return;
      }
    }
  }
  // Forked without mutex_: the fork's reservation may call EvictOne.
  auto fork = sessions_.ForkCacheEntry(session);
  if (!fork.ok()) return;
  auto entry = std::make_shared<PrefixEntry>();
  entry->session = *std::move(fork);
  entry->tokens = std::move(tokens);
  entry->score_top = score_top;
  if (score_top.has_value()) {
    entry->scores = std::move(scores);
    entry->score_bytes = ScoreBytes(entry->scores);
  }
  std::vector<std::shared_ptr<PrefixEntry>> dropped;
  if (FullBytes(*entry) > limits_.max_bytes) {
    // Alone past the bound once its Complete's session, which shares its
    // chunks now, is gone: kept, it would evict the others and then itself
    // (at the call's end, Trim). Not counted as an eviction.
    dropped.push_back(std::move(entry));
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    // One with the same tokens and fewer scores gives way to this one (not
    // counted as an eviction).
    std::erase_if(lru_, [&](const std::shared_ptr<PrefixEntry>& kept) {
      if (kept->tokens != entry->tokens) return false;
      dropped.push_back(kept);
      return true;
    });
    lru_.push_front(entry);
    TakePastLimitsLocked(dropped);
  }
  Drop(std::move(dropped));
}

// First takes out every snapshot that alone exceeds --prefix_cache_bytes
// (FullBytes; Add keeps none, so this is a guard: evicting the others for
// one would empty the cache and then drop it anyway, review-prefix finding
// 2), then the least recently used ones while past either limit, counted
// as evictions. Every snapshot left fits alone, so the most recently used
// one (a new one) is never evicted to make room for itself.
void PrefixCache::TakePastLimitsLocked(std::vector<std::shared_ptr<PrefixEntry>>& evicted) {
  std::erase_if(lru_, [&](const std::shared_ptr<PrefixEntry>& kept) {
    if (FullBytes(*kept) <= limits_.max_bytes) return false;
    evicted.push_back(kept);
    return true;
  });
  int64_t total = 0;
  for (const auto& kept : lru_) total += kept->bytes();
  while (!lru_.empty() &&
         (static_cast<int64_t>(lru_.size()) > limits_.max_entries || total > limits_.max_bytes)) {
    total -= lru_.back()->bytes();
    evicted.push_back(std::move(lru_.back()));
    lru_.pop_back();
    metrics_.AddPrefixCacheEviction();
  }
}

void PrefixCache::Trim() {
  if (!enabled()) return;
  std::vector<std::shared_ptr<PrefixEntry>> evicted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TakePastLimitsLocked(evicted);
  }
  Drop(std::move(evicted));
}

bool PrefixCache::EvictOne() {
  std::vector<std::shared_ptr<PrefixEntry>> evicted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (lru_.empty()) return false;
    evicted.push_back(std::move(lru_.back()));
    lru_.pop_back();
  }
  metrics_.AddPrefixCacheEviction();
  Drop(std::move(evicted));
  return true;
}

// (The evictions are counted where they are taken out of lru_, which knows
// why: a replaced or too big snapshot is no eviction.)
void PrefixCache::Drop(std::vector<std::shared_ptr<PrefixEntry>> evicted) {
  for (const auto& entry : evicted) {
    sessions_.Delete(entry->session->id(), /*hidden_too=*/true).IgnoreError();
  }
}

int64_t PrefixCache::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(lru_.size());
}

int64_t PrefixCache::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& entry : lru_) total += entry->bytes();
  return total;
}

}  // namespace drt::server

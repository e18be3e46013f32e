// Automatic prefix reuse for Complete (and so for the OpenAI API, which
// sends Complete): read-only snapshots of Complete sessions at chosen
// positions, each with its tokens, and the matching of a new prompt against
// them (docs/api.md, "Prefix reuse").
//
// DRT cannot roll a session back (its window and open chunk at position p
// exist only while the session is at p), so a snapshot is a fork
// (ForkSession semantics: closed chunks shared, window and open chunk
// copied) taken when the Complete's session is at p. A later Complete whose
// prompt begins with a snapshot's tokens starts from a fork of it and
// ingests only the rest.
//
// Snapshots are hidden sessions of the SessionManager (never durable, never
// listed, never expiring, outside --max_sessions: SessionManager::
// ForkCacheEntry); the manager's host-memory refusals evict them first
// (SessionManager::SetHostMemoryReclaimer), least recently used first.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/token_scores.h"
#include "server/metrics.h"
#include "server/session_manager.h"

namespace drt::server {

// --prefix_cache_bytes and --prefix_cache_entries; either 0: no cache.
struct PrefixCacheLimits {
  int64_t max_bytes = 0;
  int64_t max_entries = 0;
};

// Tokens of a snapshot past the best exact hit that make a Complete stop
// at the longest prefix it shares with a snapshot, snapshot there, and then
// ingest the rest (docs/api.md, "Prefix reuse"): about one chunk of the
// bundled models (enc_chunk_size 63 + landmark). Below it a snapshot saves
// less prefill than keeping its window copy costs; much above it, prompts
// that differ in a short tail (lm-eval's choices) would share less.
inline constexpr int64_t kMinCommonPrefixTokens = 64;

// One snapshot: a hidden read-only session holding exactly `tokens`, and,
// when the Complete that made it scored its prompt, each token's score
// with `score_top` alternatives (the first token's is unscored).
struct PrefixEntry {
  std::shared_ptr<SessionEntry> session;
  std::vector<int32_t> tokens;
  std::optional<int32_t> score_top;  // set: `scores` holds one per token
  std::vector<TokenScore> scores;
  int64_t score_bytes = 0;  // of `scores`, counted in the cache's bytes
  // Host bytes the cache holds for it: the session's share
  // (SessionEntry::budget_bytes: its own window and open-chunk copies, and
  // chunks it shares with other sessions at its share) plus its scores.
  int64_t bytes() const { return session->budget_bytes() + score_bytes; }
};

// The host bytes TokenScores take (vectors included), for the cache's count.
int64_t ScoreBytes(const std::vector<TokenScore>& scores);

// Matches a prompt, as its tokens arrive, against snapshots' tokens: says
// while holding more tokens could still find a longer exact hit, then which
// snapshot is the longest whose tokens begin the prompt (the hit) and the
// longest prefix the prompt shares with any snapshot.
class PrefixMatcher {
 public:
  explicit PrefixMatcher(std::vector<std::shared_ptr<const PrefixEntry>> candidates);

  // The next tokens of the prompt (held here until TakeHeld).
  void Push(absl::Span<const int32_t> ids);
  // Whether some snapshot longer than the tokens pushed so far still begins
  // with all of them: only then is it worth holding more.
  bool open() const { return !alive_.empty(); }
  // The longest snapshot whose tokens all begin the prompt; null: none.
  const std::shared_ptr<const PrefixEntry>& hit() const { return hit_; }
  int64_t hit_tokens() const { return hit_ ? static_cast<int64_t>(hit_->tokens.size()) : 0; }
  // The longest prefix of the tokens pushed that some snapshot's tokens
  // begin with (at least hit_tokens()).
  int64_t common_tokens() const;
  int64_t held() const { return static_cast<int64_t>(held_.size()); }
  std::vector<int32_t> TakeHeld() { return std::move(held_); }

 private:
  // Moves the alive snapshots whose tokens are exactly those pushed to hit_.
  void SettleEnded();

  std::vector<int32_t> held_;
  // Snapshots longer than held_ whose tokens begin with held_.
  std::vector<std::shared_ptr<const PrefixEntry>> alive_;
  std::shared_ptr<const PrefixEntry> hit_;
  int64_t common_ = 0;  // of the snapshots that fell out of alive_
};

class PrefixCache {
 public:
  // Installs itself as the sessions' host-memory reclaimer (cleared by the
  // destructor), so a request is never refused for memory the cache holds.
  PrefixCache(SessionManager& sessions, PrefixCacheLimits limits, Metrics& metrics);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  bool enabled() const { return limits_.max_bytes > 0 && limits_.max_entries > 0; }

  // The snapshots a prompt may start from: all of them for an unscored
  // prompt; for one scored with `score_top` alternatives, those whose
  // stored scores have at least as many.
  std::vector<std::shared_ptr<const PrefixEntry>> Candidates(
      std::optional<int32_t> score_top) const;
  // A fork of `entry` for a Complete's session (hidden, as CreateEphemeral's);
  // marks it used. Its error when it cannot be made (the entry was evicted
  // meanwhile: NOT_FOUND / ABORTED; the budget), and the caller starts cold.
  absl::StatusOr<std::shared_ptr<SessionEntry>> Fork(const PrefixEntry& entry);
  // Keeps a snapshot of `session` (a Complete's, idle, holding exactly
  // `tokens`), with the prompt's scores when it was scored (`scores`: one
  // per token, `score_top` alternatives each), unless one with the same
  // tokens (and scores at least as good) is kept already; then evicts least
  // recently used snapshots past the limits, never the new one; one that
  // alone passes --prefix_cache_bytes is not kept and evicts nothing. One
  // that cannot be made (the budget) is not kept; the call goes on.
  void Add(const std::shared_ptr<SessionEntry>& session, std::vector<int32_t> tokens,
           std::optional<int32_t> score_top, std::vector<TokenScore> scores);
  // Evicts the least recently used snapshot; false when there is none.
  bool EvictOne();
  // Evicts least recently used snapshots past the limits. A snapshot's
  // share of the chunks it shares with its Complete's session grows to all
  // of them when that session goes: a Complete calls this once its
  // sessions are deleted, so the bytes are checked at their full figure.
  void Trim();

  int64_t entries() const;
  int64_t bytes() const;

 private:
  // Deletes the snapshots' sessions (outside mutex_: a delete refreshes the
  // other sessions' shares); evictions are counted where they are taken.
  void Drop(std::vector<std::shared_ptr<PrefixEntry>> evicted);
  // Under mutex_: moves snapshots that alone pass --prefix_cache_bytes,
  // then the least recently used past the limits, from lru_ to `evicted`.
  void TakePastLimitsLocked(std::vector<std::shared_ptr<PrefixEntry>>& evicted);

  SessionManager& sessions_;
  const PrefixCacheLimits limits_;
  Metrics& metrics_;
  mutable std::mutex mutex_;
  std::list<std::shared_ptr<PrefixEntry>> lru_;  // most recently used first
};

}  // namespace drt::server

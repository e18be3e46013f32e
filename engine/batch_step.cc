#include "engine/batch_step.h"

#include <algorithm>
#include <cstddef>
#include <set>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/model_rules.h"
#include "engine/step_plan.h"

namespace drt {

// Runs the valid entries of a step through as few forwards as the backend's
// step size allows, and applies each forward's results to the sessions.
class StepRunner {
 public:
  StepRunner(Backend& backend, absl::Span<const StepEntry> entries,
             std::vector<absl::Status>& results)
      : backend_(backend), entries_(entries), results_(results) {}

  void Run() {
    for (size_t e = 0; e < entries_.size(); ++e) {
      if (results_[e].ok()) pending_.push_back({e, 0, LowerOnlyTokens(entries_[e])});
    }
    while (!pending_.empty()) RunOneForward();
  }

 private:
  struct Pending {
    size_t entry;
    int64_t done;             // tokens of the entry already run
    int64_t lower_only;       // its leading tokens that need only the lower layers
  };

  // The leading tokens of `entry` whose rows (their landmarks included) all
  // lie more than the backend's upper-layer reach before the end of the
  // entry, its tokens_following counted: they need only the lower layers
  // (engine/model_rules.h, UpperLayerReach).
  int64_t LowerOnlyTokens(const StepEntry& entry) const {
    if (!backend_.runs_lower_only_forwards() || entry.all_logits != nullptr ||
        entry.session->backend_session().has_retrieval_observer()) {
      return 0;
    }
    const ModelConfig& config = backend_.config();
    const int64_t num_tokens = entry.session->num_tokens_;
    const int64_t size = static_cast<int64_t>(entry.tokens.size());
    const int64_t position = entry.session->backend_session().position();
    const int64_t end = DecoderPositionsFor(config, num_tokens + size + entry.tokens_following);
    const int64_t lower_only_end = end - backend_.upper_layer_reach();
    if (lower_only_end <= position) return 0;
    return TokensFitting(config, num_tokens, size, lower_only_end - position);
  }

  void RunOneForward() {
    const ModelConfig& config = backend_.config();
    // Entries in order, each with as many of its remaining tokens as the
    // step size still holds.
    int64_t budget = backend_.max_step_positions();
    std::vector<SliceRequest> requests;
    std::vector<BackendSession*> sessions;
    std::vector<size_t> members;  // indices into pending_
    // A slice is lower-only when it lies in its entry's lower-only tokens.
    // The forwards are cut as they would be without it, so every row meets
    // the same rows in the lower layers' GEMMs. Without
    // runs_mixed_lower_only_forwards the forward is lower-only only when
    // every slice is; then every row also meets the same rows in the upper
    // layers' and the state stays bit-identical, not merely close. With it,
    // the rows that run the upper layers share their GEMMs with fewer rows
    // (docs/batching.md, "Lower-only slices in mixed steps").
    const bool per_slice = backend_.runs_mixed_lower_only_forwards();
    bool lower_only = true;
    // Lower-only slices go last, so that the upper layers run over a prefix
    // of the rows (StepPlan::upper_rows()): held aside here and appended
    // after the loop, each kind in its entries' order (a stable partition).
    // pending_ indices in members are then no longer ascending: the failure
    // path below matches them as a set.
    struct HeldSlice {
      SliceRequest request;
      BackendSession* session;
      size_t member;
    };
    std::vector<HeldSlice> lower_only_slices;
    for (size_t p = 0; p < pending_.size(); ++p) {
      const StepEntry& entry = entries_[pending_[p].entry];
      const int64_t remaining = static_cast<int64_t>(entry.tokens.size()) - pending_[p].done;
      const int64_t take =
          TokensFitting(config, entry.session->num_tokens_, remaining, budget);
      if (take == 0) break;
      // What the backend cannot make for this session fails its entry
      // alone, before the forward is formed: the others run as without it.
      if (absl::Status s = backend_.PrepareSessionForStep(
              entry.session->backend_session(),
              DecoderPositionsFor(config, entry.session->num_tokens_ + take));
          !s.ok()) {
        results_[pending_[p].entry] = std::move(s);
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(p));
        --p;
        continue;
      }
      const bool slice_lower_only = pending_[p].done + take <= pending_[p].lower_only;
      lower_only &= slice_lower_only;
      SliceRequest request;
      request.position = entry.session->backend_session().position();
      request.num_tokens = entry.session->num_tokens_;
      request.tokens = entry.tokens.subspan(pending_[p].done, take);
      request.all_logits = entry.all_logits != nullptr;
      request.lower_only = per_slice && slice_lower_only;
      request.last_logits = !RunStepSkipsLastLogits(backend_, entry);
      budget -= DecoderPositionsFor(config, request.num_tokens + take) - request.position;
      if (request.lower_only) {
        lower_only_slices.push_back({request, &entry.session->backend_session(), p});
        continue;
      }
      requests.push_back(request);
      sessions.push_back(&entry.session->backend_session());
      members.push_back(p);
    }
    for (const HeldSlice& held : lower_only_slices) {
      requests.push_back(held.request);
      sessions.push_back(held.session);
      members.push_back(held.member);
    }
    if (requests.empty()) return;  // every candidate was refused (pending_ shrank)
    absl::Status status;
    StepPlan plan;
    if (auto planned = PlanStep(config, requests, lower_only); planned.ok()) {
      plan = *std::move(planned);
    } else {
      status = planned.status();
    }
    if (status.ok()) {
      logits_.resize(plan.logit_rows.size() * config.vocab_size);
      status = backend_.Step(plan, sessions, absl::MakeSpan(logits_));
    }
    if (!status.ok()) {
      // Every entry of the failed forward fails; the others go on.
      std::vector<Pending> left;
      const std::set<size_t> failed(members.begin(), members.end());
      for (size_t p = 0; p < pending_.size(); ++p) {
        if (failed.count(p) > 0) {
          results_[pending_[p].entry] = status;
        } else {
          left.push_back(pending_[p]);
        }
      }
      pending_ = std::move(left);
      return;
    }
    Apply(plan, requests, members);
  }

  void Apply(const StepPlan& plan, const std::vector<SliceRequest>& requests,
             const std::vector<size_t>& members) {
    const int64_t V = backend_.config().vocab_size;
    for (size_t i = 0; i < plan.logit_rows.size(); ++i) {
      const LogitRow& row = plan.logit_rows[i];
      const SliceRequest& request = requests[plan.slices[row.slice].request];
      const StepEntry& entry = entries_[pending_[members[plan.slices[row.slice].request]].entry];
      const float* logits = logits_.data() + i * V;
      if (entry.all_logits != nullptr) {
        entry.all_logits->insert(entry.all_logits->end(), logits, logits + V);
      }
      if (row.token == static_cast<int64_t>(request.tokens.size()) - 1) {
        entry.session->last_logits_.assign(logits, logits + V);
        // (num_tokens_ is advanced below: these are of its token after the slice.)
        entry.session->logits_tokens_ = request.num_tokens + static_cast<int64_t>(request.tokens.size());
      }
    }
    for (const SlicePlan& slice : plan.slices) {
      if (slice.lower_only) {
        // It retrieved nothing; its rows owe the upper layers until they
        // lie beyond the reach of the session's end (Session::CheckStateWhole).
        Session& session = *entries_[pending_[members[slice.request]].entry].session;
        session.skipped_upper_end_ = std::max(session.skipped_upper_end_,
                                              slice.first_position + slice.num_rows);
        continue;
      }
      entries_[pending_[members[slice.request]].entry].session->retrievals_ +=
          static_cast<int64_t>(slice.landmarks.size()) * backend_.config().num_groups();
    }
    for (size_t r = 0; r < requests.size(); ++r) {
      Pending& pending = pending_[members[r]];
      entries_[pending.entry].session->num_tokens_ += static_cast<int64_t>(requests[r].tokens.size());
      pending.done += static_cast<int64_t>(requests[r].tokens.size());
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [&](const Pending& p) {
                                    return p.done ==
                                           static_cast<int64_t>(entries_[p.entry].tokens.size());
                                  }),
                   pending_.end());
  }

  Backend& backend_;
  absl::Span<const StepEntry> entries_;
  std::vector<absl::Status>& results_;
  std::vector<Pending> pending_;
  std::vector<float> logits_;
};

bool RunStepSkipsLastLogits(const Backend& backend, const StepEntry& entry) {
  return backend.runs_mixed_lower_only_forwards() && entry.tokens_following > 0 &&
         entry.all_logits == nullptr;
}

std::vector<absl::Status> RunStep(Backend& backend, absl::Span<const StepEntry> entries) {
  std::vector<absl::Status> results(entries.size());
  std::set<const Session*> seen;
  for (size_t e = 0; e < entries.size(); ++e) {
    const StepEntry& entry = entries[e];
    if (entry.session == nullptr) {
      results[e] = absl::InvalidArgumentError(absl::StrFormat("step entry %d has no session", e));
      continue;
    }
    if (&entry.session->backend() != &backend) {
      results[e] = absl::InvalidArgumentError(absl::StrFormat(
          "step entry %d names a session of another backend than the step's", e));
      continue;
    }
    if (!seen.insert(entry.session).second) {
      results[e] = absl::InvalidArgumentError(absl::StrFormat(
          "step entry %d names a session that an earlier entry of the step already holds", e));
      continue;
    }
    if (entry.tokens.empty()) {
      results[e] = absl::InvalidArgumentError(absl::StrFormat("step entry %d has no tokens", e));
      continue;
    }
    if (entry.tokens_following < 0) {
      results[e] = absl::InvalidArgumentError(absl::StrFormat(
          "step entry %d: tokens_following is %d, not >= 0", e, entry.tokens_following));
      continue;
    }
    if (absl::Status s = entry.session->ValidateTokens(entry.tokens, entry.allow_pad); !s.ok()) {
      results[e] = absl::InvalidArgumentError(
          absl::StrFormat("step entry %d: %s", e, s.message()));
    }
  }
  StepRunner(backend, entries, results).Run();
  return results;
}

}  // namespace drt

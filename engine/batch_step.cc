#include "engine/batch_step.h"

#include <set>

#include "absl/strings/str_format.h"

namespace drt {

// Sequential version: each entry runs alone through Session::Append. The
// batched forward replaces this (issue 11); the contract above is the same.
std::vector<absl::Status> RunStep(Backend& backend, absl::Span<const StepEntry> entries) {
  std::vector<absl::Status> results(entries.size());
  std::set<const Session*> seen;
  for (size_t e = 0; e < entries.size(); ++e) {
    const StepEntry& entry = entries[e];
    if (entry.session == nullptr) {
      results[e] = absl::InvalidArgumentError(absl::StrFormat("step entry %d has no session", e));
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
    AppendOptions options;
    options.allow_pad = entry.allow_pad;
    options.all_logits = entry.all_logits != nullptr;
    auto appended = entry.session->Append(entry.tokens, options);
    if (!appended.ok()) {
      results[e] = appended.status();
      continue;
    }
    if (entry.all_logits != nullptr) {
      entry.all_logits->insert(entry.all_logits->end(), appended->logits.begin(),
                               appended->logits.end());
    }
  }
  return results;
}

}  // namespace drt

// The checks Backend::CheckStep makes on each slice of a step before any
// state changes (engine/backend.h: all or nothing), so that all backends
// refuse the same inputs with the same words.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/model_config.h"

namespace drt {

// `position`: decoder positions the session has processed. Ids must be in
// the vocabulary, landmarks exactly at chunk ends, and logit rows (counted
// from the first id) inside `ids` and never on a landmark. (The logits
// buffer's size is CheckStep's own check, for the whole step.)
absl::Status CheckForwardInput(const ModelConfig& config, int64_t position,
                               absl::Span<const int32_t> ids,
                               absl::Span<const int64_t> logit_rows);

}  // namespace drt

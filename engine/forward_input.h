// The checks every backend makes on a Forward call before touching any
// state (engine/backend.h: all or nothing), so that all backends refuse the
// same inputs with the same words.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/model_config.h"

namespace drt {

// `position`: decoder positions the session has processed. Ids must be in
// the vocabulary, landmarks exactly at chunk ends, logit rows inside `ids`
// and never on a landmark, and `logits_size` = rows x vocab.
absl::Status CheckForwardInput(const ModelConfig& config, int64_t position,
                               absl::Span<const int32_t> ids,
                               absl::Span<const int64_t> logit_rows, size_t logits_size);

}  // namespace drt

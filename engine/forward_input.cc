#include "engine/forward_input.h"

#include "absl/strings/str_format.h"
#include "engine/model_rules.h"

namespace drt {

absl::Status CheckForwardInput(const ModelConfig& config, int64_t position,
                               absl::Span<const int32_t> ids,
                               absl::Span<const int64_t> logit_rows) {
  const int64_t V = config.vocab_size;
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    const int64_t pos = position + i;
    if (id < 0 || id >= V) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token id %d at decoder position %d is outside the vocabulary [0, %d)", id, pos, V));
    }
    const bool landmark_slot = IsLandmarkPosition(config, pos);
    if (landmark_slot && id != config.chunk_id) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "decoder position %d must hold the landmark id %d, got %d", pos, config.chunk_id, id));
    }
    if (!landmark_slot && id == config.chunk_id && config.chunk_id != config.pad_id) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "landmark id %d at decoder position %d, which is not a chunk end", id, pos));
    }
  }
  for (int64_t row : logit_rows) {
    if (row < 0 || row >= n) {
      return absl::InvalidArgumentError(
          absl::StrFormat("logit row %d outside the %d positions given", row, n));
    }
    if (IsLandmarkPosition(config, position + row)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("logit row %d is a landmark position; its logits are never computed", row));
    }
  }
  return absl::OkStatus();
}

}  // namespace drt

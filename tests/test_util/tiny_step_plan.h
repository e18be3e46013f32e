// Step plans small enough to write out by hand (engine/step_plan.h): a
// chunk of 3 real tokens + 1 landmark (decoder positions 3, 7, 11, ... are
// landmarks), for tests of the planner and of what consumes its plans.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model_config.h"
#include "engine/step_plan.h"

namespace drt::testing {

constexpr int32_t kTinyPlanLandmark = 99;
constexpr int32_t kTinyPlanPad = 98;

inline ModelConfig TinyPlanConfig() {
  ModelConfig c;
  c.vocab_size = 100;
  c.enc_chunk_size = 3;  // decoder positions 3, 7, 11, ... are landmarks
  c.chunk_id = kTinyPlanLandmark;
  c.pad_id = kTinyPlanPad;
  return c;
}

// The request of a session that holds `num_tokens` real tokens (and so
// num_tokens / 3 landmarks before them) for `tokens`.
inline SliceRequest TinyPlanRequest(int64_t num_tokens, const std::vector<int32_t>& tokens,
                                    bool all_logits = false) {
  SliceRequest r;
  r.num_tokens = num_tokens;
  r.position = num_tokens + num_tokens / 3;
  r.tokens = tokens;
  r.all_logits = all_logits;
  return r;
}

}  // namespace drt::testing

#include "engine/forward_pass.h"

#include "absl/strings/str_format.h"

namespace drt {

#define DRT_FORWARD_STEP(expr)               \
  do {                                       \
    if (absl::Status s = (expr); !s.ok()) {  \
      return s;                              \
    }                                        \
  } while (false)

absl::Status RunForward(const ModelConfig& config, const StepPlan& plan, ForwardOps& ops,
                        absl::Span<float> logits) {
  if (static_cast<int64_t>(logits.size()) !=
      static_cast<int64_t>(plan.logit_rows.size()) * config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "logits buffer holds %d floats, %d rows x vocab %d needed", logits.size(),
        plan.logit_rows.size(), config.vocab_size));
  }
  DRT_FORWARD_STEP(ops.Embed(plan));
  DecoderLayerId layer;
  for (layer.within = 0; layer.within < config.num_lower_layers(); ++layer.within) {
    DRT_FORWARD_STEP(ops.Attention(plan, layer));
    DRT_FORWARD_STEP(ops.Mlp(plan, layer));
    ++layer.index;
  }
  DRT_FORWARD_STEP(ops.CloseChunks(plan));
  // Forward pass 2-4 only: the chunk memory is complete; the upper layers'
  // results at these rows cannot reach what the session keeps
  // (UpperLayerReach, engine/model_rules.h).
  if (plan.lower_only) return ops.Finish(plan);
  for (layer.group = 0; layer.group < config.num_groups(); ++layer.group) {
    DRT_FORWARD_STEP(ops.Retrieve(plan, layer.group));
    if (plan.selection_serves_in_step) DRT_FORWARD_STEP(ops.AwaitSelections(plan, layer.group));
    DRT_FORWARD_STEP(ops.PrepareGca(plan, layer.group));
    const int64_t layers_in_group = config.decoder_layers[layer.group + 1];
    for (layer.within = 0; layer.within < layers_in_group; ++layer.within) {
      DRT_FORWARD_STEP(ops.Attention(plan, layer));
      DRT_FORWARD_STEP(ops.GcaMlp(plan, layer));
      ++layer.index;
    }
  }
  DRT_FORWARD_STEP(ops.CommitSelections(plan));
  DRT_FORWARD_STEP(ops.Logits(plan, logits));
  return ops.Finish(plan);
}

#undef DRT_FORWARD_STEP

}  // namespace drt

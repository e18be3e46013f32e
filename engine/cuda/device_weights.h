// The model's parameters on the GPU in bf16, converted and uploaded once per
// backend and read by all its sessions. gate_proj and up_proj of every layer
// are fused into one [2F][d] matrix (gate rows first), the layout
// kernels::LaunchSwiGlu reads.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_resources.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "kernels/gemm.h"

namespace drt::cuda {

using kernels::bf16;

struct DeviceLayer {
  const bf16* input_norm = nullptr;  // [d]
  const bf16* post_norm = nullptr;   // [d]
  const bf16* q = nullptr;           // [H*dh][d]
  const bf16* k = nullptr;           // [kv_heads*dh][d]
  const bf16* v = nullptr;
  const bf16* o = nullptr;           // [d][d]
  const bf16* gate_up = nullptr;     // [2F][d]
  const bf16* down = nullptr;        // [d][F]
};

struct DeviceUpperLayer {
  DeviceLayer base;
  const bf16* gca_pre_norm = nullptr;  // [d]
  const bf16* gca_q = nullptr;         // [d][d]
  const bf16* gca_o = nullptr;         // [d][d]
};

class DeviceWeights {
 public:
  // The current device receives the weights.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Upload(const ModelConfig& config,
                                                               const ModelWeights& weights);

  const bf16* embed_tokens = nullptr;  // [V][d]
  const bf16* lm_head = nullptr;       // [V][d]; the embedding when tied
  const bf16* norm = nullptr;
  std::vector<DeviceLayer> lower;
  std::vector<std::vector<DeviceUpperLayer>> upper;  // [group][layer]
  std::vector<const bf16*> lmk_norms;                // [group] -> [d]
  const bf16* enc_prenorm = nullptr;
  std::vector<DeviceLayer> encoder;
  const bf16* encoder_norm = nullptr;
  const bf16* chunk_k_proj = nullptr;  // [d][d]
  const bf16* chunk_v_proj = nullptr;

  size_t bytes() const { return arena_.bytes(); }

 private:
  DeviceArray<bf16> arena_;
};

}  // namespace drt::cuda

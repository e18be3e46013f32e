// The model's parameters in fp32, loaded from model.safetensors and checked
// against the config: every expected tensor present with the expected shape
// and a float dtype, no unexpected tensor, no NaN or infinity in any value. Parameter names are those of the
// reference DRTForCausalLM state_dict (drt-model.md, "Parameter names").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"

namespace drt {

// Row-major [out, in] matrices, as in the checkpoint.
struct AttentionWeights {
  std::vector<float> q_proj, k_proj, v_proj, o_proj;
};
struct MlpWeights {
  std::vector<float> gate_proj, up_proj, down_proj;
};
struct LayerWeights {
  std::vector<float> input_layernorm, post_attention_layernorm;
  AttentionWeights self_attn;
  MlpWeights mlp;
};
struct GcaWeights {
  std::vector<float> pre_norm, q_proj, o_proj;
};
struct UpperLayerWeights {
  LayerWeights base;
  GcaWeights gca;
};

struct ModelWeights {
  std::vector<float> embed_tokens;  // [vocab, d]
  std::vector<float> lm_head;       // [vocab, d]; empty when tied and not in the file
  std::vector<float> norm;          // [d]
  std::vector<LayerWeights> lower_layers;
  std::vector<std::vector<UpperLayerWeights>> upper_layers;  // [group][layer]
  std::vector<std::vector<float>> lmk_norms;                 // [group][d]
  std::vector<float> enc_prenorm;                             // [d]
  std::vector<LayerWeights> encoder_layers;                   // MHA, d x d K/V
  std::vector<float> encoder_norm;                            // [d]
  std::vector<float> chunk_k_proj, chunk_v_proj;              // [d, d]

  // The lm_head matrix: lm_head, or embed_tokens when tied and absent.
  const std::vector<float>& output_embedding() const {
    return lm_head.empty() ? embed_tokens : lm_head;
  }
};

// The names and shapes a config implies, in a stable order.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);
// Tensors accepted but not required: lm_head.weight when tied (used when
// present), and the ALiBi slope buffers `self_attn.m` [H] that the reference
// saves for every decoder layer (ignored: the engine computes the slopes).
std::vector<ExpectedTensor> OptionalTensors(const ModelConfig& config);

class SafetensorsFile;
class FileAsLoaded;

// Loads `path` (a .safetensors file) for `config`. When `file_as_loaded` is
// given, the descriptor the tensors were read through is handed back in it
// with its fstat at load: the model fingerprint reads the file through it
// later, when first needed, and refuses if it was written to meanwhile
// (engine/model_fingerprint.h).
absl::StatusOr<ModelWeights> LoadModelWeights(
    const std::string& path, const ModelConfig& config,
    std::unique_ptr<FileAsLoaded>* file_as_loaded = nullptr);

}  // namespace drt

#include "engine/model_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/finite_scan.h"
#include "engine/safetensors.h"

namespace drt {
namespace {

// Names listed in an error before "and N more".
constexpr size_t kMaxNamesInError = 5;

// One tensor of the checkpoint and where its fp32 copy goes.
struct TensorSlot {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float>* target;
};

class SlotList {
 public:
  explicit SlotList(const ModelConfig& config) : config_(config) {}

  void Add(std::string name, std::vector<int64_t> shape, std::vector<float>& target) {
    slots_.push_back({std::move(name), std::move(shape), &target});
  }

  // A Llama block; `kv_rows` is the K/V projection height (GQA in the decoder,
  // d in the MHA encoder).
  void AddLayer(const std::string& prefix, int64_t kv_rows, LayerWeights& layer) {
    const int64_t d = config_.hidden_size;
    const int64_t f = config_.intermediate_size;
    Add(prefix + ".input_layernorm.weight", {d}, layer.input_layernorm);
    Add(prefix + ".post_attention_layernorm.weight", {d}, layer.post_attention_layernorm);
    Add(prefix + ".self_attn.q_proj.weight", {d, d}, layer.self_attn.q_proj);
    Add(prefix + ".self_attn.k_proj.weight", {kv_rows, d}, layer.self_attn.k_proj);
    Add(prefix + ".self_attn.v_proj.weight", {kv_rows, d}, layer.self_attn.v_proj);
    Add(prefix + ".self_attn.o_proj.weight", {d, d}, layer.self_attn.o_proj);
    Add(prefix + ".mlp.gate_proj.weight", {f, d}, layer.mlp.gate_proj);
    Add(prefix + ".mlp.up_proj.weight", {f, d}, layer.mlp.up_proj);
    Add(prefix + ".mlp.down_proj.weight", {d, f}, layer.mlp.down_proj);
  }

  std::vector<TensorSlot> Take() { return std::move(slots_); }

 private:
  const ModelConfig& config_;
  std::vector<TensorSlot> slots_;
};

// The single source of the parameter names: sizes `weights` for `config` and
// returns every required tensor with its destination inside `weights`.
std::vector<TensorSlot> RequiredSlots(const ModelConfig& config, ModelWeights& weights) {
  const int64_t d = config.hidden_size;
  const int64_t decoder_kv_rows = config.num_key_value_heads * config.head_dim();
  SlotList slots(config);

  slots.Add("model.embed_tokens.weight", {config.vocab_size, d}, weights.embed_tokens);

  weights.lower_layers.resize(config.num_lower_layers());
  for (int64_t i = 0; i < config.num_lower_layers(); ++i) {
    slots.AddLayer(absl::StrCat("model.lower_layers.", i), decoder_kv_rows,
                   weights.lower_layers[i]);
  }

  const int64_t groups = config.num_groups();
  weights.upper_layers.resize(groups);
  weights.lmk_norms.resize(groups);
  for (int64_t g = 0; g < groups; ++g) {
    weights.upper_layers[g].resize(config.decoder_layers[g + 1]);
    for (int64_t j = 0; j < config.decoder_layers[g + 1]; ++j) {
      UpperLayerWeights& layer = weights.upper_layers[g][j];
      const std::string prefix = absl::StrCat("model.upper_layers.", g, ".", j);
      slots.AddLayer(prefix, decoder_kv_rows, layer.base);
      slots.Add(prefix + ".gca.pre_norm.weight", {d}, layer.gca.pre_norm);
      slots.Add(prefix + ".gca.q_proj.weight", {d, d}, layer.gca.q_proj);
      slots.Add(prefix + ".gca.o_proj.weight", {d, d}, layer.gca.o_proj);
    }
    slots.Add(absl::StrCat("model.lmk_norms.", g, ".weight"), {d}, weights.lmk_norms[g]);
  }

  slots.Add("model.enc_prenorm.weight", {d}, weights.enc_prenorm);
  weights.encoder_layers.resize(config.encoder_layers);
  for (int64_t e = 0; e < config.encoder_layers; ++e) {
    slots.AddLayer(absl::StrCat("model.encoder.layers.", e), d, weights.encoder_layers[e]);
  }
  slots.Add("model.encoder.norm.weight", {d}, weights.encoder_norm);
  slots.Add("model.chunk_k_proj.weight", {d, d}, weights.chunk_k_proj);
  slots.Add("model.chunk_v_proj.weight", {d, d}, weights.chunk_v_proj);
  slots.Add("model.norm.weight", {d}, weights.norm);
  if (!config.tie_word_embeddings) {
    slots.Add("lm_head.weight", {config.vocab_size, d}, weights.lm_head);
  }
  return slots.Take();
}

std::vector<ExpectedTensor> AlibiSlopeBuffers(const ModelConfig& config) {
  std::vector<ExpectedTensor> out;
  const std::vector<int64_t> shape = {config.num_attention_heads};
  for (int64_t i = 0; i < config.num_lower_layers(); ++i) {
    out.push_back({absl::StrCat("model.lower_layers.", i, ".self_attn.m"), shape});
  }
  for (int64_t g = 0; g < config.num_groups(); ++g) {
    for (int64_t j = 0; j < config.decoder_layers[g + 1]; ++j) {
      out.push_back({absl::StrCat("model.upper_layers.", g, ".", j, ".self_attn.m"), shape});
    }
  }
  return out;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string NameList(const std::vector<std::string>& names) {
  const size_t shown = std::min(names.size(), kMaxNamesInError);
  std::string list = absl::StrJoin(names.begin(), names.begin() + shown, ", ");
  if (names.size() > shown) absl::StrAppend(&list, " and ", names.size() - shown, " more");
  return list;
}

// Shape and dtype of a tensor that is present.
absl::Status CheckTensor(const SafetensorsFile& file, const TensorView& tensor,
                         const std::vector<int64_t>& expected_shape) {
  if (tensor.shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", tensor.name,
                                                   "' has shape ", ShapeString(tensor.shape),
                                                   ", expected ", ShapeString(expected_shape)));
  }
  if (tensor.dtype != DType::kF32 && tensor.dtype != DType::kF16 && tensor.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", tensor.name,
                                                   "' has dtype ", DTypeName(tensor.dtype),
                                                   ", expected a float dtype (F32, F16, BF16)"));
  }
  return absl::OkStatus();
}

// Every value finite: a NaN or infinity in a weight (a diverged or corrupt
// checkpoint) would make every answer NaN or garbage without an error.
absl::Status CheckFinite(const SafetensorsFile& file, const TensorView& tensor) {
  const int64_t count = tensor.num_elements();
  const int64_t bad = FirstNonFinite(tensor.data, static_cast<size_t>(count), tensor.dtype);
  if (bad < 0) return absl::OkStatus();
  // Widen the one bad element to tell NaN from infinity.
  float value = 0.0f;
  if (tensor.dtype == DType::kF32) {
    std::memcpy(&value, tensor.data + 4 * bad, sizeof(value));
  } else {
    uint16_t bits;
    std::memcpy(&bits, tensor.data + 2 * bad, sizeof(bits));
    value = tensor.dtype == DType::kF16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      file.path(), ": tensor '", tensor.name, "' holds ", std::isnan(value) ? "NaN" : "infinity",
      " at element ", bad, " of ", count,
      "; the checkpoint is corrupt or was saved after training diverged"));
}

// Every required tensor present, nothing the model does not know of.
absl::Status CheckNames(const SafetensorsFile& file, const std::vector<TensorSlot>& required,
                        const std::vector<ExpectedTensor>& optional) {
  std::set<std::string> known;
  std::vector<std::string> missing;
  for (const TensorSlot& slot : required) {
    known.insert(slot.name);
    if (!file.tensors().contains(slot.name)) missing.push_back(slot.name);
  }
  for (const ExpectedTensor& tensor : optional) known.insert(tensor.name);
  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : file.tensors()) {
    if (!known.contains(name)) unexpected.push_back(name);
  }
  if (missing.empty() && unexpected.empty()) return absl::OkStatus();

  std::vector<std::string> problems;
  if (!missing.empty()) {
    problems.push_back(absl::StrCat(missing.size(), " missing tensor(s): ", NameList(missing)));
  }
  if (!unexpected.empty()) {
    problems.push_back(
        absl::StrCat(unexpected.size(), " unexpected tensor(s): ", NameList(unexpected)));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      file.path(), ": checkpoint does not match the config: ", absl::StrJoin(problems, "; ")));
}

absl::StatusOr<ModelWeights> LoadFromFile(const SafetensorsFile& file, const ModelConfig& config) {
  ModelWeights weights;
  const std::vector<TensorSlot> required = RequiredSlots(config, weights);
  const std::vector<ExpectedTensor> optional = OptionalTensors(config);
  if (absl::Status status = CheckNames(file, required, optional); !status.ok()) return status;

  // Validate everything before copying anything.
  for (const TensorSlot& slot : required) {
    if (absl::Status status = CheckTensor(file, file.tensors().at(slot.name), slot.shape);
        !status.ok()) {
      return status;
    }
  }
  for (const ExpectedTensor& expected : optional) {
    auto it = file.tensors().find(expected.name);
    if (it == file.tensors().end()) continue;
    if (absl::Status status = CheckTensor(file, it->second, expected.shape); !status.ok()) {
      return status;
    }
  }
  // The values, once, on their stored bits (the ALiBi slope buffers are not
  // used, so not checked).
  for (const TensorSlot& slot : required) {
    if (absl::Status status = CheckFinite(file, file.tensors().at(slot.name)); !status.ok()) {
      return status;
    }
  }
  if (config.tie_word_embeddings && file.tensors().contains("lm_head.weight")) {
    if (absl::Status status = CheckFinite(file, file.tensors().at("lm_head.weight"));
        !status.ok()) {
      return status;
    }
  }

  for (const TensorSlot& slot : required) {
    absl::StatusOr<std::vector<float>> values = file.ReadF32(slot.name);
    if (!values.ok()) return values.status();
    *slot.target = *std::move(values);
  }
  if (config.tie_word_embeddings) {
    if (file.tensors().contains("lm_head.weight")) {
      absl::StatusOr<std::vector<float>> values = file.ReadF32("lm_head.weight");
      if (!values.ok()) return values.status();
      weights.lm_head = *std::move(values);
    }  // else lm_head stays empty: output_embedding() is embed_tokens, no copy
  }
  return weights;
}

}  // namespace

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config) {
  ModelWeights unused;
  std::vector<ExpectedTensor> out;
  for (TensorSlot& slot : RequiredSlots(config, unused)) {
    out.push_back({std::move(slot.name), std::move(slot.shape)});
  }
  return out;
}

std::vector<ExpectedTensor> OptionalTensors(const ModelConfig& config) {
  std::vector<ExpectedTensor> out;
  if (config.tie_word_embeddings) {
    out.push_back({"lm_head.weight", {config.vocab_size, config.hidden_size}});
  }
  for (ExpectedTensor& buffer : AlibiSlopeBuffers(config)) out.push_back(std::move(buffer));
  return out;
}

absl::StatusOr<ModelWeights> LoadModelWeights(const std::string& path, const ModelConfig& config,
                                              std::unique_ptr<FileAsLoaded>* file_as_loaded) {
  try {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    if (!file.ok()) return file.status();
    absl::StatusOr<ModelWeights> weights = LoadFromFile(**file, config);
    // The weights are copied out: the mapping goes with `file`, only its
    // descriptor is kept.
    if (weights.ok() && file_as_loaded != nullptr) *file_as_loaded = (*file)->ReleaseFile();
    return weights;
  } catch (const std::exception& e) {
    // std::bad_alloc from a checkpoint larger than memory, for one.
    return absl::ResourceExhaustedError(absl::StrCat(path, ": error loading weights: ", e.what()));
  }
}

}  // namespace drt

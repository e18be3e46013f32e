#include "engine/model_config.h"

#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model_fingerprint.h"
#include "nlohmann/json.hpp"

namespace drt {

absl::StatusOr<uint32_t> ModelConfig::model_fingerprint() const {
  if (fingerprint == nullptr) return 0u;
  return fingerprint->value();
}

namespace {

using nlohmann::json;

// Sizes above this would overflow the int32 index arithmetic of kernels.
constexpr int64_t kMaxDimension = std::numeric_limits<int32_t>::max();

// Reads typed keys from the top-level config object; every error names the
// file and the key. A JSON null counts as absent, as in Hugging Face configs.
class ConfigReader {
 public:
  ConfigReader(const json& root, const std::string& source) : root_(root), source_(source) {}

  const json* Find(const std::string& key) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::Status Error(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": key '", key, "' ", what));
  }
  absl::Status Unsupported(const std::string& key, const std::string& what) const {
    return absl::FailedPreconditionError(
        absl::StrCat(source_, ": key '", key, "' ", what, " (not supported by the engine)"));
  }

  absl::StatusOr<int64_t> Integer(const json& value, const std::string& key) const {
    if (value.is_number_unsigned()) {
      if (value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Error(key, "is too large");
      }
      return static_cast<int64_t>(value.get<uint64_t>());
    }
    if (value.is_number_integer()) return value.get<int64_t>();
    return Error(key,
                 absl::StrCat("must be an integer, got ", value.type_name(), " ", value.dump()));
  }

  absl::StatusOr<int64_t> RequiredInt(const std::string& key) const {
    const json* value = Find(key);
    if (value == nullptr) return Error(key, "is missing");
    return Integer(*value, key);
  }

  absl::StatusOr<int64_t> OptionalInt(const std::string& key, int64_t fallback) const {
    const json* value = Find(key);
    if (value == nullptr) return fallback;
    return Integer(*value, key);
  }

  absl::StatusOr<double> OptionalNumber(const std::string& key, double fallback) const {
    const json* value = Find(key);
    if (value == nullptr) return fallback;
    if (!value->is_number()) {
      return Error(key, absl::StrCat("must be a number, got ", value->type_name()));
    }
    return value->get<double>();
  }

  absl::StatusOr<bool> OptionalBool(const std::string& key, bool fallback) const {
    const json* value = Find(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) {
      return Error(key, absl::StrCat("must be true or false, got ", value->type_name()));
    }
    return value->get<bool>();
  }

  absl::StatusOr<std::vector<int64_t>> RequiredIntArray(const std::string& key) const {
    const json* value = Find(key);
    if (value == nullptr) return Error(key, "is missing");
    if (!value->is_array()) {
      return Error(key, absl::StrCat("must be an array of integers, got ", value->type_name()));
    }
    std::vector<int64_t> out;
    for (size_t i = 0; i < value->size(); ++i) {
      absl::StatusOr<int64_t> item = Integer((*value)[i], absl::StrCat(key, "[", i, "]"));
      if (!item.ok()) return item.status();
      out.push_back(*item);
    }
    return out;
  }

  // Checks 1 <= value <= kMaxDimension.
  absl::Status Positive(const std::string& key, int64_t value) const {
    if (value < 1) return Error(key, absl::StrCat("must be positive, got ", value));
    if (value > kMaxDimension) {
      return Error(key, absl::StrCat("is too large (", value, " > ", kMaxDimension, ")"));
    }
    return absl::OkStatus();
  }

 private:
  const json& root_;
  const std::string& source_;
};

#define CONFIG_ASSIGN_OR_RETURN_IMPL(var, expr, tmp) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  var = std::move(*tmp)
#define CONFIG_CONCAT_INNER(a, b) a##b
#define CONFIG_CONCAT(a, b) CONFIG_CONCAT_INNER(a, b)
#define CONFIG_ASSIGN_OR_RETURN(var, expr) \
  CONFIG_ASSIGN_OR_RETURN_IMPL(var, expr, CONFIG_CONCAT(status_or_, __LINE__))
#define CONFIG_RETURN_IF_ERROR(expr)   \
  do {                                 \
    absl::Status status_ = (expr);     \
    if (!status_.ok()) return status_; \
  } while (0)

absl::Status ReadSizes(const ConfigReader& reader, ModelConfig& config) {
  CONFIG_ASSIGN_OR_RETURN(config.vocab_size, reader.RequiredInt("vocab_size"));
  CONFIG_ASSIGN_OR_RETURN(config.hidden_size, reader.RequiredInt("hidden_size"));
  CONFIG_ASSIGN_OR_RETURN(config.num_attention_heads, reader.RequiredInt("num_attention_heads"));
  CONFIG_ASSIGN_OR_RETURN(config.num_key_value_heads,
                          reader.OptionalInt("num_key_value_heads", config.num_attention_heads));
  CONFIG_ASSIGN_OR_RETURN(config.intermediate_size, reader.RequiredInt("intermediate_size"));
  CONFIG_ASSIGN_OR_RETURN(config.decoder_layers, reader.RequiredIntArray("decoder_layers"));
  CONFIG_ASSIGN_OR_RETURN(config.encoder_layers, reader.RequiredInt("encoder_layers"));
  CONFIG_ASSIGN_OR_RETURN(config.enc_chunk_size, reader.RequiredInt("enc_chunk_size"));
  CONFIG_ASSIGN_OR_RETURN(config.chunk_topk, reader.RequiredInt("chunk_topk"));
  CONFIG_ASSIGN_OR_RETURN(config.slide_window, reader.RequiredInt("slide_window"));
  CONFIG_ASSIGN_OR_RETURN(config.chunk_id, reader.RequiredInt("chunk_id"));
  CONFIG_ASSIGN_OR_RETURN(config.pad_id, reader.RequiredInt("pad_id"));
  CONFIG_ASSIGN_OR_RETURN(config.rms_norm_eps, reader.OptionalNumber("rms_norm_eps", 1e-5));
  CONFIG_ASSIGN_OR_RETURN(config.rope_theta, reader.OptionalNumber("rope_theta", 10000.0));
  CONFIG_ASSIGN_OR_RETURN(config.tie_word_embeddings,
                          reader.OptionalBool("tie_word_embeddings", true));
  return absl::OkStatus();
}

absl::Status ValidateSizes(const ConfigReader& reader, const ModelConfig& config) {
  CONFIG_RETURN_IF_ERROR(reader.Positive("vocab_size", config.vocab_size));
  CONFIG_RETURN_IF_ERROR(reader.Positive("hidden_size", config.hidden_size));
  CONFIG_RETURN_IF_ERROR(reader.Positive("num_attention_heads", config.num_attention_heads));
  CONFIG_RETURN_IF_ERROR(reader.Positive("num_key_value_heads", config.num_key_value_heads));
  CONFIG_RETURN_IF_ERROR(reader.Positive("intermediate_size", config.intermediate_size));
  CONFIG_RETURN_IF_ERROR(reader.Positive("enc_chunk_size", config.enc_chunk_size));
  CONFIG_RETURN_IF_ERROR(reader.Positive("chunk_topk", config.chunk_topk));
  CONFIG_RETURN_IF_ERROR(reader.Positive("slide_window", config.slide_window));

  if (config.hidden_size % config.num_attention_heads != 0) {
    return reader.Error("hidden_size", absl::StrCat("(", config.hidden_size,
                                                    ") is not divisible by num_attention_heads (",
                                                    config.num_attention_heads, ")"));
  }
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return reader.Error(
        "num_attention_heads",
        absl::StrCat("(", config.num_attention_heads, ") is not divisible by num_key_value_heads (",
                     config.num_key_value_heads, ")"));
  }

  if (config.encoder_layers < 0 || config.encoder_layers > kMaxDimension) {
    return reader.Error("encoder_layers", absl::StrCat("must be between 0 and ", kMaxDimension,
                                                       ", got ", config.encoder_layers));
  }
  if (config.decoder_layers.size() < 2) {
    return reader.Error("decoder_layers",
                        absl::StrCat("must list the lower layer count and at least one group "
                                     "([N_lower, n_1, ...]), got [",
                                     absl::StrJoin(config.decoder_layers, ", "), "]"));
  }
  for (size_t i = 0; i < config.decoder_layers.size(); ++i) {
    if (config.decoder_layers[i] < 0 || config.decoder_layers[i] > kMaxDimension) {
      return reader.Error("decoder_layers",
                          absl::StrCat("entry ", i, " must be between 0 and ", kMaxDimension,
                                       ", got ", config.decoder_layers[i]));
    }
  }

  if (config.chunk_id < 0 || config.chunk_id >= config.vocab_size) {
    return reader.Error("chunk_id", absl::StrCat("(", config.chunk_id, ") is outside [0, ",
                                                 config.vocab_size, ")"));
  }
  if (config.pad_id < 0 || config.pad_id >= config.vocab_size) {
    return reader.Error(
        "pad_id", absl::StrCat("(", config.pad_id, ") is outside [0, ", config.vocab_size, ")"));
  }
  if (!(std::isfinite(config.rms_norm_eps) && config.rms_norm_eps > 0)) {
    return reader.Error("rms_norm_eps", absl::StrCat("must be a positive finite number, got ",
                                                     config.rms_norm_eps));
  }
  if (!(std::isfinite(config.rope_theta) && config.rope_theta > 0)) {
    return reader.Error("rope_theta",
                        absl::StrCat("must be a positive finite number, got ", config.rope_theta));
  }
  return absl::OkStatus();
}

// Options of the reference code that change the architecture; the engine
// implements only the variant described in drt-model.md.
absl::Status ValidateArchitecture(const ConfigReader& reader) {
  if (const json* act = reader.Find("hidden_act")) {
    if (!act->is_string()) {
      return reader.Error("hidden_act", absl::StrCat("must be a string, got ", act->type_name()));
    }
    const std::string name = act->get<std::string>();
    if (name != "silu" && name != "swish") {
      return reader.Unsupported("hidden_act", absl::StrCat("is '", name, "'; only silu is served"));
    }
  }
  absl::StatusOr<bool> attention_bias = reader.OptionalBool("attention_bias", false);
  if (!attention_bias.ok()) return attention_bias.status();
  if (*attention_bias) {
    return reader.Unsupported("attention_bias", "is true; weights have no biases");
  }

  absl::StatusOr<bool> gpt2_mlp = reader.OptionalBool("gpt2_mlp", false);
  if (!gpt2_mlp.ok()) return gpt2_mlp.status();
  if (*gpt2_mlp) return reader.Unsupported("gpt2_mlp", "is true; only the SwiGLU MLP is served");

  absl::StatusOr<bool> enable_alibi = reader.OptionalBool("enable_alibi", true);
  if (!enable_alibi.ok()) return enable_alibi.status();
  if (!*enable_alibi) {
    return reader.Unsupported("enable_alibi", "is false; the decoder attention uses ALiBi");
  }
  // The reference applies ALiBi and the sliding window only on its
  // flash-attention path; with this flag false its decoder attention is plain
  // causal attention over the whole sequence (model/llama.py, LlamaAttention).
  absl::StatusOr<bool> flash = reader.OptionalBool("_flash_attn_2_enabled", true);
  if (!flash.ok()) return flash.status();
  if (!*flash) {
    return reader.Unsupported("_flash_attn_2_enabled",
                              "is false; such a checkpoint was trained with full causal attention "
                              "without ALiBi or window, and only the ALiBi sliding-window "
                              "attention is served");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfigOrThrow(const std::string& json_text,
                                                    const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": malformed JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": top level must be a JSON object, got ", root.type_name()));
  }
  ConfigReader reader(root, source);
  ModelConfig config;
  CONFIG_RETURN_IF_ERROR(ReadSizes(reader, config));
  CONFIG_RETURN_IF_ERROR(ValidateSizes(reader, config));
  CONFIG_RETURN_IF_ERROR(ValidateArchitecture(reader));
  return config;
}

#undef CONFIG_ASSIGN_OR_RETURN_IMPL
#undef CONFIG_CONCAT_INNER
#undef CONFIG_CONCAT
#undef CONFIG_ASSIGN_OR_RETURN
#undef CONFIG_RETURN_IF_ERROR

}  // namespace

int64_t ModelConfig::num_upper_layers() const {
  if (decoder_layers.size() < 2) return 0;
  return std::accumulate(decoder_layers.begin() + 1, decoder_layers.end(), int64_t{0});
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  try {
    return ParseModelConfigOrThrow(json_text, source);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(source, ": error reading config: ", e.what()));
  }
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    return absl::NotFoundError(absl::StrCat(path, ": config file not found"));
  }
  if (!std::filesystem::is_regular_file(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": config path is not a regular file"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": cannot open config file"));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat(path, ": error reading config file"));
  return ParseModelConfig(text.str(), path);
}

}  // namespace drt

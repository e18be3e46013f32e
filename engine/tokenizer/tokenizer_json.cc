#include "engine/tokenizer/tokenizer_json.h"

#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace drt {
namespace {

using nlohmann::json;

absl::Status Malformed(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer file ", path, ": ", what));
}

absl::Status Unsupported(const std::string& path, absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat("tokenizer file ", path, ": ", what));
}

absl::StatusOr<json> ParseFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat("tokenizer file not found: ", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("cannot read tokenizer file ", path));
  json root = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Malformed(path, "malformed JSON");
  if (!root.is_object()) return Malformed(path, "top level is not a JSON object");
  return root;
}

bool IsNullOrEmptyString(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() || (it->is_string() && it->get_ref<const std::string&>().empty());
}

absl::StatusOr<int32_t> ReadId(const json& value, const std::string& path, const std::string& where) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
      value.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    return Malformed(path, absl::StrCat(where, " has an id that is not a non-negative 32-bit integer"));
  }
  return static_cast<int32_t>(value.get<int64_t>());
}

// The pipeline stages around the model: only what GPT-2 uses is reproduced.
absl::Status ReadPipeline(const json& root, const std::string& path, BpeTokenizerSpec* spec) {
  if (const auto it = root.find("normalizer"); it != root.end() && !it->is_null()) {
    return Unsupported(path, "normalizers are not supported (normalizer must be null)");
  }
  const auto pre = root.find("pre_tokenizer");
  if (pre == root.end() || !pre->is_object() || pre->value("type", "") != "ByteLevel") {
    return Unsupported(path, "only a ByteLevel pre_tokenizer is supported");
  }
  if (!pre->value("use_regex", true)) {
    return Unsupported(path, "ByteLevel pre_tokenizer with use_regex=false is not supported");
  }
  spec->add_prefix_space = pre->value("add_prefix_space", false);
  return absl::OkStatus();
}

absl::Status ReadVocab(const json& model, const std::string& path, BpeTokenizerSpec* spec) {
  const auto vocab = model.find("vocab");
  if (vocab == model.end()) return Malformed(path, "model.vocab is missing");
  if (!vocab->is_object()) return Malformed(path, "model.vocab is not an object");
  spec->vocab.reserve(vocab->size());
  for (const auto& [spelling, id_value] : vocab->items()) {
    auto id = ReadId(id_value, path, absl::StrCat("model.vocab entry \"", spelling, "\""));
    if (!id.ok()) return id.status();
    spec->vocab.emplace_back(spelling, *id);
  }
  return absl::OkStatus();
}

// Merges are written either as "left right" strings or as [left, right] pairs.
absl::Status ReadMerges(const json& model, const std::string& path, BpeTokenizerSpec* spec) {
  const auto merges = model.find("merges");
  if (merges == model.end()) return Malformed(path, "model.merges is missing");
  if (!merges->is_array()) return Malformed(path, "model.merges is not an array");
  spec->merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& merge = (*merges)[i];
    if (merge.is_string()) {
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos) {
        return Malformed(path, absl::StrCat("model.merges[", i, "] \"", text, "\" is not \"left right\""));
      }
      spec->merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      spec->merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return Malformed(path, absl::StrCat("model.merges[", i, "] is neither \"left right\" nor [left, right]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadModel(const json& root, const std::string& path, BpeTokenizerSpec* spec) {
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object()) return Malformed(path, "model is missing");
  // GPT-2's own file predates the "type" field; a model with merges is BPE.
  if (const auto type = model->find("type"); type != model->end() && *type != "BPE") {
    return Unsupported(path, absl::StrCat("model type ", type->dump(), " is not BPE"));
  }
  if (!IsNullOrEmptyString(*model, "continuing_subword_prefix") ||
      !IsNullOrEmptyString(*model, "end_of_word_suffix")) {
    return Unsupported(path, "continuing_subword_prefix / end_of_word_suffix are not supported");
  }
  spec->ignore_merges = model->value("ignore_merges", false);
  if (absl::Status s = ReadVocab(*model, path, spec); !s.ok()) return s;
  return ReadMerges(*model, path, spec);
}

absl::Status ReadAddedTokens(const json& root, const std::string& path, BpeTokenizerSpec* spec) {
  const auto added = root.find("added_tokens");
  if (added == root.end() || added->is_null()) return absl::OkStatus();
  if (!added->is_array()) return Malformed(path, "added_tokens is not an array");
  for (size_t i = 0; i < added->size(); ++i) {
    const json& entry = (*added)[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (!entry.is_object() || !entry.contains("id") || !entry.contains("content") ||
        !entry["content"].is_string()) {
      return Malformed(path, absl::StrCat(where, " lacks an id or a content string"));
    }
    AddedTokenSpec token;
    auto id = ReadId(entry["id"], path, where);
    if (!id.ok()) return id.status();
    token.id = *id;
    token.content = entry["content"].get<std::string>();
    token.special = entry.value("special", false);
    token.single_word = entry.value("single_word", false);
    token.lstrip = entry.value("lstrip", false);
    token.rstrip = entry.value("rstrip", false);
    token.normalized = entry.value("normalized", !token.special);
    spec->added_tokens.push_back(std::move(token));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BpeTokenizerSpec> ReadTokenizerJson(const std::string& path) {
  absl::StatusOr<json> root = ParseFile(path);
  if (!root.ok()) return root.status();
  BpeTokenizerSpec spec;
  // value() and get() throw on fields of the wrong JSON type.
  try {
    if (absl::Status s = ReadPipeline(*root, path, &spec); !s.ok()) return s;
    if (absl::Status s = ReadModel(*root, path, &spec); !s.ok()) return s;
    if (absl::Status s = ReadAddedTokens(*root, path, &spec); !s.ok()) return s;
  } catch (const nlohmann::json::exception& e) {
    return Malformed(path, absl::StrCat("unexpected JSON content: ", e.what()));
  }
  return spec;
}

}  // namespace drt

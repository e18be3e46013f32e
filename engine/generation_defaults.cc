#include "engine/generation_defaults.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace drt {

absl::StatusOr<GenerationDefaults> LoadGenerationDefaults(const std::string& dir) {
  GenerationDefaults defaults;
  const std::string path = (std::filesystem::path(dir) / "generation_config.json").string();
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return defaults;
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return absl::UnavailableError(absl::StrCat(path, ": cannot read"));
  const nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON (expected an object)"));
  }
  if (const auto it = json.find("pad_to_chunk_boundary"); it != json.end()) {
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": pad_to_chunk_boundary must be true or false, got ", it->dump()));
    }
    defaults.pad_to_chunk_boundary = it->get<bool>();
  }
  return defaults;
}

}  // namespace drt

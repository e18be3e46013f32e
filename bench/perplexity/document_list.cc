#include "bench/perplexity/document_list.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace drt::ppl {

std::vector<std::string> RepeatedFlagValues(int argc, char** argv, std::string_view name) {
  std::vector<std::string> values;
  const std::string single = "-" + std::string(name);
  const std::string dashes = "--" + std::string(name);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == single || arg == dashes) {
      if (i + 1 < argc) values.emplace_back(argv[++i]);
      continue;
    }
    for (const std::string& prefix : {single + "=", dashes + "="}) {
      if (arg.substr(0, prefix.size()) == prefix) {
        values.emplace_back(arg.substr(prefix.size()));
        break;
      }
    }
  }
  return values;
}

absl::StatusOr<std::vector<std::string>> ListDocuments(std::string_view flag,
                                                       const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  std::vector<std::string> documents;
  std::set<fs::path> seen;  // canonical paths: one file named twice is one document
  auto add = [&](const fs::path& file) -> absl::Status {
    std::error_code ec;
    fs::path canonical = fs::weakly_canonical(file, ec);
    if (ec) canonical = file;
    if (!seen.insert(canonical).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: '%s' is named twice (each document is scored once)", flag, file.string()));
    }
    documents.push_back(file.string());
    return absl::OkStatus();
  };
  for (const std::string& path : paths) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(path, ec)) {
        if (entry.is_regular_file(ec)) files.push_back(entry.path());
      }
      if (ec) {
        return absl::NotFoundError(
            absl::StrFormat("%s: cannot list the folder '%s': %s", flag, path, ec.message()));
      }
      if (files.empty()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: the folder '%s' has no regular file", flag, path));
      }
      std::sort(files.begin(), files.end());
      for (const fs::path& file : files) {
        if (absl::Status s = add(file); !s.ok()) return s;
      }
    } else if (fs::is_regular_file(path, ec)) {
      if (absl::Status s = add(path); !s.ok()) return s;
    } else {
      return absl::NotFoundError(
          absl::StrFormat("%s: '%s' is neither a file nor a folder", flag, path));
    }
  }
  return documents;
}

}  // namespace drt::ppl

// The golden fixtures under tests/fixtures (each a model directory with a
// golden.safetensors from the Python reference forward).
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>
#include "tests/test_util/build_paths.h"

namespace drt::testing {

// Sorted paths of every fixture directory that holds golden data.
inline std::vector<std::string> GoldenFixtureDirs() {
  std::vector<std::string> dirs;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(drt::testing::SourceDir()) + "/tests/fixtures")) {
    if (std::filesystem::exists(entry.path() / "golden.safetensors")) dirs.push_back(entry.path());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

}  // namespace drt::testing

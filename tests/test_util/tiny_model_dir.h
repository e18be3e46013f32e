// The tiny model (tiny_model.h) written to a directory and loaded back with
// the real loader, for tests of what the loader accepts and refuses.
#pragma once

#include "absl/status/status.h"
#include "engine/model_dir.h"
#include "tests/test_util/temp_dir.h"
#include "tests/test_util/tiny_model.h"

namespace drt::testing {

// Writes `model` into `dir` (config.json and model.safetensors) and loads
// the directory; the load's status.
inline absl::Status LoadTinyDirStatus(const TempDir& dir, const TinyModel& model) {
  WriteModelDir(dir.path(), model.config, model.weights);
  return LoadModelDir(dir.path()).status();
}

}  // namespace drt::testing

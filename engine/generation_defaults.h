// Generation defaults a model directory declares in generation_config.json
// (the Hugging Face file name; keys we do not know are left to other tools).
// A model trained to answer after its question was padded to the chunk
// boundary says so here, and the engine and server default to it.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace drt {

struct GenerationDefaults {
  // drt-model.md, "Why the reference pads".
  bool pad_to_chunk_boundary = false;
};

// Reads <dir>/generation_config.json; a directory without one gets the
// defaults above. A malformed file or a key of the wrong type is an error
// naming the file and the key.
absl::StatusOr<GenerationDefaults> LoadGenerationDefaults(const std::string& dir);

}  // namespace drt

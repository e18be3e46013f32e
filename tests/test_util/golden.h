// The golden data of a fixture (tests/fixtures/README.md, golden.safetensors):
// the Python reference's float64 forward, stored as F32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/safetensors.h"

namespace drt::testing {

struct Golden {
  std::vector<int32_t> tokens;
  std::vector<int64_t> logit_positions;
  std::vector<float> logits;             // [P, V]
  std::vector<int64_t> retrieval_shape;  // [G, C, k]
  std::vector<int64_t> retrieval_indices;
  std::vector<float> retrieval_weights;
};

inline Golden LoadGolden(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  Golden g;
  auto tokens = (*file)->ReadI64("tokens");
  auto positions = (*file)->ReadI64("logit_positions");
  auto logits = (*file)->ReadF32("logits");
  auto indices = (*file)->ReadI64("retrieval_indices");
  auto weights = (*file)->ReadF32("retrieval_weights");
  REQUIRE(tokens.ok());
  REQUIRE(positions.ok());
  REQUIRE(logits.ok());
  REQUIRE(indices.ok());
  REQUIRE(weights.ok());
  g.tokens.assign(tokens->begin(), tokens->end());
  g.logit_positions = *positions;
  g.logits = *logits;
  g.retrieval_shape = (*(*file)->Get("retrieval_indices"))->shape;
  g.retrieval_indices = *indices;
  g.retrieval_weights = *weights;
  return g;
}

}  // namespace drt::testing

// Command-line values shared by the retrieval evaluators (drt-niah,
// drt-niah-text): length and depth lists, the padding choice, the backend.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/backend.h"
#include "engine/model.h"

namespace drt::niah {

// "4K,64K,1M,1000": whole lengths in [1, kMaxLength], K = 1024,
// M = 1024 * 1024 (fractions allowed when the product is whole: "1.5K" =
// 1536, not "1.3K"). INVALID_ARGUMENT naming the flag and the bad entry
// (nan, inf and 1e30 too), or a length given twice ("1K,1024").
inline constexpr int64_t kMaxLength = int64_t{1} << 32;  // 256 x the longest run (16M)
absl::StatusOr<std::vector<int64_t>> ParseLengths(absl::string_view list);

// "0.1,0.5,0.9": depths in [0, 1], each once. INVALID_ARGUMENT naming the
// flag, the bad entry and the range.
absl::StatusOr<std::vector<double>> ParseDepths(absl::string_view list);

// --max_new_tokens at least 1 (0 generated nothing: every cell 0%), and
// --threads 0 (the CPUs this process may use) or more; INVALID_ARGUMENT
// naming the flag, the value and the range. Checked before the model loads.
absl::Status CheckMaxNewTokens(int64_t max_new_tokens);
absl::Status CheckThreads(int64_t threads);

// "true", "false", or "model" (the model's generation_config.json default).
absl::StatusOr<bool> ResolvePadToChunkBoundary(absl::string_view choice, const Model& model);

struct EvalBackendFlags {
  absl::string_view device;          // cpu, cuda or auto
  int threads = 0;                   // CPU threads, 0: the CPUs this process may use
  int cuda_device = 0;               // GPU index
  absl::string_view cuda_precision;  // bf16 or fp32
};
absl::StatusOr<std::unique_ptr<Backend>> MakeEvalBackend(const Model& model,
                                                         const EvalBackendFlags& flags);

}  // namespace drt::niah

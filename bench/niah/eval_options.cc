#include "bench/niah/eval_options.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/backend_factory.h"

namespace drt::niah {

absl::StatusOr<std::vector<int64_t>> ParseLengths(absl::string_view list) {
  std::vector<int64_t> lengths;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    std::string text(part);
    int64_t scale = 1;
    if (!text.empty() && (text.back() == 'K' || text.back() == 'k')) scale = 1024;
    if (!text.empty() && (text.back() == 'M' || text.back() == 'm')) scale = 1024 * 1024;
    if (scale != 1) text.pop_back();
    // SimpleAtod takes "nan" and "inf", and a cast of a double beyond
    // int64_t is undefined: each is refused here, not left to end in
    // bad_alloc when the haystack is built (review-tools #5).
    double value = 0;
    const char* problem = nullptr;
    if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
      problem = "not a finite number";
    } else if (value * scale < 1) {
      problem = "less than 1";
    } else if (value * scale > static_cast<double>(kMaxLength)) {
      problem = "more than 4G";
    } else if (value * scale != std::floor(value * scale)) {
      problem = "not a whole number";
    }
    if (problem != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--lengths: bad length '%s': %s (a whole number of tokens or bytes, "
                          "K = 1024, M = 1048576, at most 4G = 4294967296)",
                          part, problem));
    }
    const int64_t length = static_cast<int64_t>(value * scale);
    // A length twice would run its cells twice and print its table row with
    // twice the columns (review-tools 2026-11-25 #13).
    if (std::find(lengths.begin(), lengths.end(), length) != lengths.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--lengths: '%s' is %d, which is already in the list; give each length once", part, length));
    }
    lengths.push_back(length);
  }
  return lengths;
}

absl::StatusOr<std::vector<double>> ParseDepths(absl::string_view list) {
  std::vector<double> depths;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    double depth = 0;
    if (!absl::SimpleAtod(part, &depth) || !(depth >= 0 && depth <= 1)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--depths: bad depth '%s': not a number in [0, 1] (0 = start, 1 = end)", part));
    }
    if (std::find(depths.begin(), depths.end(), depth) != depths.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--depths: '%s' is %g, which is already in the list; give each depth once", part, depth));
    }
    depths.push_back(depth);
  }
  return depths;
}

absl::Status CheckMaxNewTokens(int64_t max_new_tokens) {
  if (max_new_tokens >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "--max_new_tokens must be at least 1 (an answer needs a token), got %d", max_new_tokens));
}

absl::Status CheckThreads(int64_t threads) {
  if (threads >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "--threads must be 0 (the CPUs this process may use) or a positive count, got %d", threads));
}

absl::StatusOr<bool> ResolvePadToChunkBoundary(absl::string_view choice, const Model& model) {
  if (choice == "model") return model.generation.pad_to_chunk_boundary;
  if (choice == "true") return true;
  if (choice == "false") return false;
  return absl::InvalidArgumentError(
      absl::StrFormat("--pad_to_chunk_boundary must be true, false or model, got '%s'", choice));
}

absl::StatusOr<std::unique_ptr<Backend>> MakeEvalBackend(const Model& model,
                                                         const EvalBackendFlags& flags) {
  absl::StatusOr<Device> device = ParseDevice(flags.device);
  if (!device.ok()) return device.status();
  absl::StatusOr<CudaPrecision> precision = ParseCudaPrecision(flags.cuda_precision);
  if (!precision.ok()) return precision.status();
  BackendOptions options;
  options.device = *device;
  options.cpu.num_threads = flags.threads;
  options.cuda.device_index = flags.cuda_device;
  options.cuda.precision = *precision;
  return MakeBackend(model.config(), model.weights(), options);
}

}  // namespace drt::niah

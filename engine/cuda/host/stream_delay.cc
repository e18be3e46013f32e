#include "engine/cuda/host/stream_delay.h"

#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace drt {
namespace {

constexpr CudaDelayedStream kStreams[] = {CudaDelayedStream::kStore, CudaDelayedStream::kFetch,
                                          CudaDelayedStream::kStep, CudaDelayedStream::kCompute};

}  // namespace

const char* CudaDelayedStreamName(CudaDelayedStream stream) {
  switch (stream) {
    case CudaDelayedStream::kNone: return "none";
    case CudaDelayedStream::kStore: return "store";
    case CudaDelayedStream::kFetch: return "fetch";
    case CudaDelayedStream::kStep: return "step";
    case CudaDelayedStream::kCompute: return "compute";
  }
  return "unknown";
}

absl::StatusOr<CudaStreamDelay> ParseCudaStreamDelay(std::string_view spec) {
  if (spec.empty()) return CudaStreamDelay{};
  const size_t colon = spec.find(':');
  if (colon == std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stream delay '%s': expected STREAM:NS (say fetch:2000000)", std::string(spec)));
  }
  const std::string_view name = spec.substr(0, colon);
  CudaStreamDelay delay;
  bool known = false;
  for (CudaDelayedStream s : kStreams) {
    if (name == CudaDelayedStreamName(s)) {
      delay.stream = s;
      known = true;
    }
  }
  if (!known) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stream delay '%s': unknown stream '%s' (expected store, fetch, step or compute)",
        std::string(spec), std::string(name)));
  }
  if (!absl::SimpleAtoi(std::string(spec.substr(colon + 1)), &delay.ns)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stream delay '%s': '%s' is not a whole number of nanoseconds", std::string(spec),
        std::string(spec.substr(colon + 1))));
  }
  return delay;
}

absl::Status CheckCudaStreamDelay(const CudaStreamDelay& delay) {
  bool known = false;
  for (CudaDelayedStream s : kStreams) known = known || delay.stream == s;
  if (delay.stream == CudaDelayedStream::kNone && delay.ns == 0) return absl::OkStatus();
  if (delay.stream != CudaDelayedStream::kNone && !known) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "debug_stream_delay: unknown stream %d (expected store, fetch, step or compute)",
        static_cast<int>(delay.stream)));
  }
  if (delay.stream == CudaDelayedStream::kNone) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "debug_stream_delay: %d ns given without a stream to delay", delay.ns));
  }
  if (delay.ns <= 0 || delay.ns > kMaxCudaStreamDelayNs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "debug_stream_delay of the %s stream: %d ns, expected 1 to %d",
        CudaDelayedStreamName(delay.stream), delay.ns, kMaxCudaStreamDelayNs));
  }
  return absl::OkStatus();
}

}  // namespace drt

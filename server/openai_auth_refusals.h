// drt_openai_unauthenticated_total: OpenAI API requests answered 401 (no or
// a wrong bearer token, or an Authorization value gRPC metadata cannot
// carry; review-deploy F9). They are refused before any gRPC call, so
// drt_errors_total{code="UNAUTHENTICATED"} (the gRPC service's) does not see
// them; a counter of the API's own, next to its connection counters, keeps
// drt_errors_total meaning "RPCs that failed".
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace drt::server {

class OpenAiAuthRefusals {
 public:
  void Count() { count_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  std::string RenderPrometheus() const {
    return absl::StrCat(
        "# HELP drt_openai_unauthenticated_total OpenAI API requests answered 401: no or a wrong "
        "bearer token\n"
        "# TYPE drt_openai_unauthenticated_total counter\n"
        "drt_openai_unauthenticated_total ", count(), "\n");
  }

 private:
  std::atomic<uint64_t> count_{0};
};

}  // namespace drt::server

// Early return for absl::Status expressions (the CUDA backend's host code
// chains many fallible calls).
#pragma once

#include "absl/status/status.h"

#define DRT_RETURN_IF_ERROR(expr)                          \
  do {                                                     \
    ::absl::Status drt_status_ = (expr);                   \
    if (!drt_status_.ok()) return drt_status_;             \
  } while (0)

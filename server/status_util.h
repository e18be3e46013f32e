// absl::Status <-> grpc::Status. The two share their numeric codes.
#pragma once

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace drt::server {

inline grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// Upper-case code name as in the gRPC spec ("INVALID_ARGUMENT").
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace drt::server

// gRPC server credentials from --tls_cert/--tls_key: TLS when both paths are
// given, plaintext when both are empty.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"

namespace drt::server {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_path, const std::string& key_path);

}  // namespace drt::server

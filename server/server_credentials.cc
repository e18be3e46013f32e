#include "server/server_credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace drt::server {
namespace {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, "=", path, ": cannot open file"));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::DataLossError(absl::StrCat("--", flag, "=", path, ": read error"));
  }
  // gRPC's own error for a non-PEM file is a log line at handshake time, far
  // from the cause; catch the common mistake here.
  if (!absl::StrContains(contents.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": not a PEM file (no -----BEGIN line)"));
  }
  return contents.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_path, const std::string& key_path) {
  if (cert_path.empty() && key_path.empty()) return grpc::InsecureServerCredentials();
  if (cert_path.empty() || key_path.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together: give both or neither");
  }
  auto cert = ReadPemFile(cert_path, "tls_cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPemFile(key_path, "tls_key");
  if (!key.ok()) return key.status();

  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(options);
}

}  // namespace drt::server

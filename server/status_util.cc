#include "server/status_util.h"

#include "absl/strings/ascii.h"

namespace drt::server {

std::string GrpcCodeName(grpc::StatusCode code) {
  // absl spells the same codes in CamelCase-free upper case too.
  return absl::AsciiStrToUpper(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
}

}  // namespace drt::server

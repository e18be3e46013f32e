#include "server/grpc_keepalive.h"

#include <grpc/grpc.h>

namespace drt::server {

void AddKeepaliveArguments(grpc::ServerBuilder& builder, int64_t min_client_ping_interval_ms) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(kKeepaliveTimeMs));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(kKeepaliveTimeoutMs));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Client pings on connections without calls: the allowance holds there
  // because GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS is set above (gRPC's
  // doc/keepalive.md; tests/server/keepalive_ping_test.cc runs it).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(min_client_ping_interval_ms));
}

}  // namespace drt::server

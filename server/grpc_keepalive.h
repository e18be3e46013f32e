// Keepalive pings on the server's gRPC connections, so that a peer that is
// gone (host down, network cut, no FIN ever seen) is detected and its calls
// end: without them a call blocked writing to it (a Generate whose client
// stopped reading, docs/api.md "Connections") would hold its session busy
// until the kernel's TCP retransmissions give up, many minutes later, or
// for as long as the connection lives when nothing is in flight.
//
// A live client that merely stops reading still answers pings (its HTTP/2
// transport reads frames whether or not the application reads messages),
// so keepalive does not end its call; the scheduler treats such a handler
// as stalled and the other sessions do not wait for it (server/scheduler.h).
#pragma once

#include <cstdint>

#include <grpcpp/server_builder.h>

namespace drt::server {

// A ping after this long without reading anything from the peer.
constexpr int64_t kKeepaliveTimeMs = 60'000;
// The connection is closed when the ping's answer takes longer than this.
constexpr int64_t kKeepaliveTimeoutMs = 20'000;

// Server-initiated keepalive: kKeepaliveTimeMs / kKeepaliveTimeoutMs, also
// on connections without calls, and without gRPC's default limit of two
// pings while no data frame is sent (a call blocked on a full flow-control
// window sends none).
void AddKeepaliveArguments(grpc::ServerBuilder& builder);

}  // namespace drt::server

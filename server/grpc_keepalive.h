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

// Pings from clients (and proxies: the gateway's Envoy pings each upstream
// connection every 30 s, deploy/k8s/gateway/envoy.yaml) are accepted this
// often on connections without calls. gRPC's own default is one per 5
// minutes: a peer pinging more often is answered with GOAWAY
// "too_many_pings" at its third ping, so Envoy's or a client's keepalive
// (every 10 s in the review's run) cut idle connections after 30 s
// (review-deploy #3). 5 s: below every interval we configure, and still a
// bound on a misbehaving peer's ping rate.
constexpr int64_t kMinClientPingIntervalMs = 5'000;

// Server-initiated keepalive: kKeepaliveTimeMs / kKeepaliveTimeoutMs, also
// on connections without calls, and without gRPC's default limit of two
// pings while no data frame is sent (a call blocked on a full flow-control
// window sends none). Client pings are accepted from
// `min_client_ping_interval_ms` apart (tests pass a shorter one to keep
// their wall time short).
void AddKeepaliveArguments(grpc::ServerBuilder& builder,
                           int64_t min_client_ping_interval_ms = kMinClientPingIntervalMs);

}  // namespace drt::server

#!/bin/bash
# The gateway container's preStop hook: lets the streams running through this
# Envoy finish before Kubernetes sends SIGTERM, on which Envoy exits at once
# and resets every connection it holds (review-tools 2026-11-24 #2).
#
#   1. sleep GATEWAY_DRAIN_DELAY_SECONDS while the Service drt-gateway drops
#      this pod (new connections still work meanwhile);
#   2. POST /healthcheck/fail and POST /drain_listeners?graceful on Envoy's
#      loopback admin port: Envoy tells every downstream HTTP/2 connection to
#      go away (GOAWAY; with --drain-strategy immediate all of them at once),
#      running streams go on, and gRPC clients make their next call on a new
#      connection, through the other gateway replica;
#   3. wait until no client connection is left on the gRPC listener
#      (http.drt_grpc.downstream_cx_active, the stat_prefix in envoy.yaml),
#      at most until GATEWAY_DRAIN_DELAY_SECONDS + GATEWAY_DRAIN_SECONDS
#      after the hook began.
#
# It returns within GATEWAY_DRAIN_DELAY_SECONDS + GATEWAY_DRAIN_SECONDS + 5 s
# whatever Envoy does: each admin call gives up after ADMIN_TIMEOUT_SECONDS
# (2) of silence, the last poll may start just before the deadline (2 s read
# + 1 s sleep) and bash's SECONDS counts whole seconds (1 s). The Deployment's
# terminationGracePeriodSeconds must exceed that (k8s_render_test.py checks
# it; gateway_drain_test.py runs this script against a stand-in admin port).
#
# Needs only bash (its /dev/tcp), which the envoyproxy/envoy image has; no
# curl. ENVOY_ADMIN_PORT is 9900, the admin address in envoy.yaml.
set -u

delay=${GATEWAY_DRAIN_DELAY_SECONDS:-5}
drain=${GATEWAY_DRAIN_SECONDS:-30}
port=${ENVOY_ADMIN_PORT:-9900}
readonly ADMIN_TIMEOUT_SECONDS=2
end=$((SECONDS + delay + drain))

# admin METHOD PATH: one HTTP/1.1 request to the admin port; prints the
# response (headers and body). Envoy refuses HTTP/1.0 by default.
admin() {
  # (The braces keep 2>/dev/null to this connect: on a bare exec it would
  # silence the whole script.)
  { exec 3<>"/dev/tcp/127.0.0.1/${port}"; } 2>/dev/null || return 1
  printf '%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n' \
    "$1" "$2" >&3
  local line
  while IFS= read -r -t "${ADMIN_TIMEOUT_SECONDS}" line <&3; do
    printf '%s\n' "${line%$'\r'}"
  done
  exec 3>&-
  return 0
}

log() { echo "drt-gateway preStop: $*" >&2; }

sleep "${delay}"
admin POST /healthcheck/fail >/dev/null || log "admin port ${port}: no answer to /healthcheck/fail"
admin POST '/drain_listeners?graceful' >/dev/null || log "admin port ${port}: no answer to /drain_listeners"
while ((SECONDS < end)); do
  active=$(admin GET '/stats?filter=http.drt_grpc.downstream_cx_active' |
           sed -n 's/^http\.drt_grpc\.downstream_cx_active: \([0-9][0-9]*\)$/\1/p')
  if [[ "${active}" == 0 ]]; then
    log "no client connections left"
    exit 0
  fi
  sleep 1
done
log "drain time over with ${active:-unknown} client connections left"
exit 0

#!/bin/bash
# The image's HEALTHCHECK: GET /healthz on drt-server's HTTP port (from
# DRT_HTTP_LISTEN, default 9090, on its host unless that is a wildcard), over
# bash's /dev/tcp so that the image
# needs no HTTP client. Healthy when the answer is 200; drt-server answers
# 503 while it drains.
set -euo pipefail
listen=${DRT_HTTP_LISTEN-0.0.0.0:9090}
if [[ -z "$listen" ]]; then
  echo "drt-healthcheck: the HTTP endpoint is disabled (DRT_HTTP_LISTEN is empty)" >&2
  exit 1
fi
port=${listen##*:}
# The configured host, unless it is a wildcard: a server bound to one
# address (a pod IP, a host IP under --network host) does not answer on
# 127.0.0.1.
host=${listen%:*}
host=${host#[}
host=${host%]}
case "$host" in
  "" | 0.0.0.0 | :: | "*") host=127.0.0.1 ;;
esac
exec 3<>"/dev/tcp/$host/$port"
printf 'GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
read -r -t 4 status_line <&3
if [[ "$status_line" =~ ^HTTP/1\.[01]\ 200 ]]; then
  exit 0
fi
echo "drt-healthcheck: /healthz answered: ${status_line%$'\r'}" >&2
exit 1

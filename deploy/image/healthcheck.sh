#!/bin/bash
# The image's HEALTHCHECK: GET /healthz on drt-server's HTTP port (from
# DRT_HTTP_LISTEN, default 9090), over bash's /dev/tcp so that the image
# needs no HTTP client. Healthy when the answer is 200; drt-server answers
# 503 while it drains.
set -euo pipefail
listen=${DRT_HTTP_LISTEN-0.0.0.0:9090}
if [[ -z "$listen" ]]; then
  echo "drt-healthcheck: the HTTP endpoint is disabled (DRT_HTTP_LISTEN is empty)" >&2
  exit 1
fi
port=${listen##*:}
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
read -r -t 4 status_line <&3
if [[ "$status_line" =~ ^HTTP/1\.[01]\ 200 ]]; then
  exit 0
fi
echo "drt-healthcheck: /healthz answered: ${status_line%$'\r'}" >&2
exit 1

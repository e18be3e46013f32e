#!/bin/bash
# The image's HEALTHCHECK: GET /healthz on drt-server's HTTP port, over
# bash's /dev/tcp so that the image needs no HTTP client. Healthy when the
# answer is 200; drt-server answers 503 while it drains.
#
# The address is the server's own: an --http_listen argument of the
# container's main process (/proc/1/cmdline: drt-server, which the entrypoint
# execs, or an init such as `docker run --init` that passes the arguments
# on), else DRT_HTTP_LISTEN, else the default 0.0.0.0:9090. The argument wins
# over the environment, as in the entrypoint, which puts the environment's
# flags first and the container's arguments after them (review-deploy #11:
# `docker run IMAGE --http_listen=...` was reported unhealthy). It is checked
# on its host unless that is a wildcard.
#   DRT_HEALTHCHECK_CMDLINE  the command line to read (default /proc/1/cmdline;
#                            for deploy/test/healthcheck_test.py)
set -euo pipefail
cmdline=${DRT_HEALTHCHECK_CMDLINE:-/proc/1/cmdline}

# The last --http_listen in the NUL-separated arguments, as =X or as the next
# argument; absl also takes one leading dash. (An init's "--" before the
# program it runs is read past.)
listen_arg=""
found=0
if [[ -r "$cmdline" ]]; then
  take_next=0
  while IFS= read -r -d '' arg || [[ -n "$arg" ]]; do
    if ((take_next)); then
      listen_arg=$arg found=1 take_next=0
      continue
    fi
    case "$arg" in
      --http_listen=* | -http_listen=*) listen_arg=${arg#*=} found=1 ;;
      --http_listen | -http_listen) take_next=1 ;;
    esac
  done <"$cmdline"
fi

if ((found)); then
  listen=$listen_arg
  source="--http_listen"
else
  listen=${DRT_HTTP_LISTEN-0.0.0.0:9090}
  source="DRT_HTTP_LISTEN"
fi
if [[ -z "$listen" ]]; then
  echo "drt-healthcheck: the HTTP endpoint is disabled ($source is empty)" >&2
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

#!/usr/bin/env bash
# Builds the drt-server image (deploy/Dockerfile, VARIANT=cpu) with podman on
# a Debian 12 base made here with mmdebstrap, runs it (non-root, read-only
# root filesystem, flags from DRT_* variables) and drives a passkey query
# through the containerised server with the Python client over loopback.
# Prints the image size. Exits 77 (ctest: skipped) when podman, runc or
# mmdebstrap is missing.
#
#   bash deploy/test/container_test.sh [BUILD_DIR]   (default build/, for the Python stubs)
#
# Environment:
#   DRT_BASE_IMAGE       use this Debian 12 image instead of making one
#   DRT_IMAGE            tag to build (default localhost/drt-server:test)
#   DRT_SKIP_BUILD=1     reuse DRT_IMAGE as it is
#   HAYSTACK_TOKENS      haystack length for the query (default 20000)
#   BUILD_JOBS           parallel compile jobs inside the build (default: all cores)
#
# The settings below the "machine" comment are this machine's, not the
# image's: podman's default crun fails here ("cgroups in hybrid mode not
# supported"), so the harness runs runc with cgroupfs and no default ulimits,
# and host networking.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=$(cd "${1:-$repo/build}" && pwd)
image=${DRT_IMAGE:-localhost/drt-server:test}
base_image=${DRT_BASE_IMAGE:-localhost/drt-debian12-minbase:local}
haystack_tokens=${HAYSTACK_TOKENS:-20000}

for tool in podman runc mmdebstrap; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIPPED: $tool is not installed (apt-get install podman runc mmdebstrap)" >&2
    exit 77
  fi
done
stubs=$build_dir/python
if [[ ! -f "$stubs/drt/v1/drt_pb2.py" ]]; then
  echo "container_test: no Python stubs in $stubs: build first (bash scripts/build.sh)" >&2
  exit 1
fi

work=$(mktemp -d -t drt-container-test.XXXXXX)
container=drt-container-test-$$
# --- machine: podman settings for this build machine (see the header) ---
cat >"$work/containers.conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
CONF
export CONTAINERS_CONF=$work/containers.conf
podman=(podman --runtime runc)
# --- end machine ---

cleanup() {
  "${podman[@]}" rm -f -t 0 "$container" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }
fail() { echo "container_test: FAILED: $*" >&2; exit 1; }

if ! "${podman[@]}" image exists "$base_image"; then
  if [[ -n "${DRT_BASE_IMAGE:-}" ]]; then fail "DRT_BASE_IMAGE=$base_image is not a local image"; fi
  step "making the Debian 12 base image $base_image (mmdebstrap --variant=minbase, like debian:12)"
  mmdebstrap --quiet --variant=minbase bookworm "$work/rootfs.tar"
  "${podman[@]}" import --quiet "$work/rootfs.tar" "$base_image" >/dev/null
  rm "$work/rootfs.tar"
fi

if [[ "${DRT_SKIP_BUILD:-0}" != 1 ]]; then
  step "building $image from deploy/Dockerfile"
  start=$SECONDS
  "${podman[@]}" build --network host --format docker --layers \
    --ignorefile "$repo/deploy/Dockerfile.dockerignore" \
    --build-arg BUILD_IMAGE="$base_image" --build-arg RUNTIME_IMAGE="$base_image" \
    --build-arg BUILD_JOBS="${BUILD_JOBS:-0}" \
    -f "$repo/deploy/Dockerfile" -t "$image" "$repo"
  echo "built in $((SECONDS - start)) s"
fi
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$image")
base_size=$("${podman[@]}" image inspect --format '{{.Size}}' "$base_image")
echo "image size: $size bytes ($((size / 1000000)) MB; base image $((base_size / 1000000)) MB)"

# Free loopback ports for gRPC, HTTP and the OpenAI API (host networking: the
# image's default DRT_OPENAI_LISTEN=0.0.0.0:8000 would take the host's 8000).
read -r grpc_port http_port openai_port < <(/usr/bin/python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')

step "running $image (non-root, read-only root filesystem, flags from DRT_* variables)"
# DRT_MAX_CONTEXT_TOKENS reaches the client through GetModelInfo: proof that
# the entrypoint turned it into --max_context_tokens.
context_limit=123456
# --health-interval=disable: no systemd timer here (podman would log errors);
# the test runs the image's HEALTHCHECK itself with podman healthcheck run.
"${podman[@]}" run -d --name "$container" --network host --read-only --health-interval=disable \
  -e DRT_LISTEN="127.0.0.1:$grpc_port" -e DRT_HTTP_LISTEN="127.0.0.1:$http_port" \
  -e DRT_OPENAI_LISTEN="127.0.0.1:$openai_port" -e DRT_MAX_CONTEXT_TOKENS=$context_limit -e DRT_SHUTDOWN_GRACE_SECONDS=5 \
  "$image" >/dev/null
listening=
for ((i = 0; i < 600; i++)); do
  if listening=$("${podman[@]}" logs "$container" 2>&1 | grep -m1 '^drt-server listening on '); then break; fi
  [[ "$("${podman[@]}" inspect --format '{{.State.Running}}' "$container")" == true ]] || break
  sleep 0.2
done
if [[ -z "$listening" ]]; then
  "${podman[@]}" logs "$container" >&2 || true
  fail "the containerised drt-server did not start listening"
fi
echo "$listening"
[[ "$listening" == "drt-server listening on 127.0.0.1:$grpc_port (grpc), 127.0.0.1:$http_port (http)"* ]] ||
  fail "not listening where DRT_LISTEN / DRT_HTTP_LISTEN said"

uid=$("${podman[@]}" exec "$container" id -u)
[[ "$uid" == 10001 ]] || fail "the server runs as uid $uid, expected the image's non-root user 10001"
echo "runs as uid $uid"

step "HEALTHCHECK, the HTTP endpoint and the OpenAI API"
"${podman[@]}" healthcheck run "$container" || fail "podman healthcheck run: unhealthy"
echo "healthcheck: healthy"
/usr/bin/python3 - "$http_port" "$openai_port" <<'PY'
import json, sys, urllib.request
port, openai_port = sys.argv[1], sys.argv[2]
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read().decode()
print("GET /healthz:", body.strip())
metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
assert "drt_active_sessions" in metrics, "no drt_active_sessions in /metrics"
print("GET /metrics: drt_active_sessions present")
models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{openai_port}/v1/models", timeout=5).read())
assert models["object"] == "list" and models["data"][0]["id"] == "drt-text-byte", models
print("GET /v1/models:", models["data"][0]["id"])
PY

step "passkey query through the container ($haystack_tokens-token haystack)"
client_log=$work/client.log
/usr/bin/python3 "$repo/client_examples/python/drt_client.py" --stubs "$stubs" \
  --server "127.0.0.1:$grpc_port" --haystack-tokens "$haystack_tokens" --max-tokens 16 \
  --require-passkey --stop . 2>/dev/null | tee "$client_log" || fail "the client failed"
grep -q "context limit 123,456 tokens" "$client_log" ||
  fail "GetModelInfo does not show DRT_MAX_CONTEXT_TOKENS=$context_limit (123,456)"
grep -q '^answer correct: yes' "$client_log" || fail "wrong answer"

step "docker stop (SIGTERM): drains and exits 0"
# More than drt-server's own bound: grace 10 + stop slack 5 + forced-exit slack 15 = 30 s.
"${podman[@]}" stop -t 35 "$container" >/dev/null
code=$("${podman[@]}" inspect --format '{{.State.ExitCode}}' "$container")
"${podman[@]}" logs "$container" 2>&1 | tail -3
[[ "$code" == 0 ]] || fail "drt-server exited with $code after SIGTERM"
echo
echo "container_test: passed (image $image, $((size / 1000000)) MB)"

#!/usr/bin/env bash
# Starts drt-server on 127.0.0.1 (free ports), runs drt-batch-bench against
# it (bench/batch/batch_bench.cc: aggregate decode with N sessions at once,
# time per output token under prefill load), and stops the server with
# SIGTERM. Needs a build (scripts/build.sh); extra arguments go to
# drt-batch-bench.
#   bash scripts/batch_bench.sh                          the passkey model (models/drt-passkey-byte,
#                                                        the bundled model until 2026-11-23), default sizes
#   MODEL=random bash scripts/batch_bench.sh --sessions 1,8 --generate 64
#                                                        the random GPT-2-vocabulary model
#   MODEL=dir DEVICE=cuda SERVER_ARGS="--cuda_precision fp32" bash scripts/batch_bench.sh
#   BUILD_DIR=build-gpu ...                              another build tree
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
model=${MODEL:-models/drt-passkey-byte}
device=${DEVICE:-cpu}
for binary in "$build/server/drt-server" "$build/bench/drt-batch-bench"; do
  if [[ ! -x "$binary" ]]; then
    echo "batch_bench: $binary is missing; build first (bash scripts/build.sh)" >&2
    exit 2
  fi
done
if [[ "$model" == random ]]; then
  model=$build/models/drt-random-gpt2
  if [[ ! -f "$model/model.safetensors" ]]; then
    /usr/bin/python3 weights_tools/make_random_model.py --out "$model" \
      --tokenizer tests/fixtures/gpt2-tokenizer/tokenizer.json
  fi
fi

log=$(mktemp -t drt-server.XXXXXX)
server_pid=
cleanup() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -f "$log"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck disable=SC2086  # SERVER_ARGS is a list of words
"$build/server/drt-server" --model "$model" --device "$device" --listen 127.0.0.1:0 \
  --http_listen= ${SERVER_ARGS:-} >"$log" 2>&1 &
server_pid=$!
listening=
for ((i = 0; i < 1200; i++)); do
  listening=$(grep -m1 '^drt-server listening on ' "$log" || true)
  [[ -n "$listening" ]] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z "$listening" ]]; then
  echo "batch_bench: drt-server did not start listening; its log:" >&2
  cat "$log" >&2
  exit 1
fi
address=$(sed -E 's/^drt-server listening on ([^ ]+) \(grpc\).*/\1/' <<<"$listening")
echo "batch_bench: drt-server --model $model --device $device ${SERVER_ARGS:-} on $address"

bench_status=0
"$build/bench/drt-batch-bench" --server "$address" "$@" || bench_status=$?
kill -TERM "$server_pid"
server_status=0
wait "$server_pid" || server_status=$?
server_pid=
if ((bench_status != 0 || server_status != 0)); then
  echo "batch_bench: drt-batch-bench exited with $bench_status, drt-server with" \
       "$server_status; server log:" >&2
  cat "$log" >&2
  exit 1
fi

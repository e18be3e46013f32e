#!/usr/bin/env bash
# Append throughput through drt-server with and without durability
# (docs/state_format.md, "Measurements"): the same pass key haystack of
# TOKENS tokens, streamed by client_examples/python/drt_client.py in 256 KiB
# messages, into a server in memory only, one with --state_dir (default
# --state_ack_tokens: prefill skips the upper layers between whole states)
# and one with --state_dir --state_ack_tokens=0 (every step written, nothing
# skipped); ROUNDS rounds, the three modes interleaved in each.
#   TOKENS=262144 ROUNDS=3 bash scripts/durable_ingest_compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${SERVER_BIN:-build/server/drt-server}
tokens=${TOKENS:-262144}
rounds=${ROUNDS:-3}
model=${MODEL:-models/drt-passkey-byte}
scratch=$(mktemp -d -t durable-ingest.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

run() {  # $1: label; the rest: extra server flags
  local label=$1
  shift
  local log="$scratch/$label.log"
  "$bin" --model "$model" --listen 127.0.0.1:0 --http_listen 127.0.0.1:0 --step_tokens 4032 \
    --threads 2 "$@" >"$log" 2>&1 &
  local pid=$!
  local listening=
  while ! listening=$(grep -m1 '^drt-server listening on ' "$log"); do
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.2
  done
  local address
  address=$(sed -E 's/^drt-server listening on ([^ ]+) \(grpc\).*/\1/' <<<"$listening")
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/python3 client_examples/python/drt_client.py --server "$address" \
    --haystack-tokens "$tokens" --passkey 42424 --max-tokens 8 --stop . \
    --piece-bytes 262144 >"$scratch/$label.client" 2>&1
  t1=$(date +%s.%N)
  kill -TERM "$pid"
  wait "$pid" || true
  awk -v a="$t0" -v b="$t1" -v n="$tokens" -v l="$label" \
    'BEGIN {printf "%s: %.1f s, %.0f tokens/s\n", l, b - a, n / (b - a)}'
}

for round in $(seq "$rounds"); do
  echo "round $round"
  run memory
  rm -rf "$scratch/state" && mkdir "$scratch/state"
  run durable --state_dir "$scratch/state"
  rm -rf "$scratch/state" && mkdir "$scratch/state"
  run durable_every_step --state_dir "$scratch/state" --state_ack_tokens 0
done

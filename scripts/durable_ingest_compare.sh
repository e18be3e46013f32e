#!/usr/bin/env bash
# Append throughput through drt-server with and without durability
# (docs/state_format.md, "Measurements"): the same pass key haystack of
# TOKENS tokens, streamed by client_examples/python/drt_client.py in 256 KiB
# messages, into a server in memory only, one with --state_dir (default
# --state_ack_tokens: prefill skips the upper layers between whole states)
# and one with --state_dir --state_ack_tokens=0 (every step written, nothing
# skipped); ROUNDS rounds, the three modes interleaved in each.
#
# The throughput is the Append stream's alone: the client's time around the
# stream (first request to summary) and the server's own figure
# (AppendSummary.tokens_per_second), both parsed from the client's "append:"
# line. Until 2026-11-24 the script timed the whole client process (Python
# start-up, connect, CreateSession, the haystack, Generate, DeleteSession),
# whose fixed cost pulls every mode's ratio toward 1 (review-tools #4); that
# figure is still printed, labelled "whole client", to show the difference.
# The last lines are the medians and the per-round durable/memory ratios of
# the server's figure.
#   TOKENS=262144 ROUNDS=3 bash scripts/durable_ingest_compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${SERVER_BIN:-build/server/drt-server}
tokens=${TOKENS:-262144}
rounds=${ROUNDS:-3}
model=${MODEL:-models/drt-passkey-byte}
scratch=$(mktemp -d -t durable-ingest.XXXXXX)
server_pid=
# A client that fails ends the script (set -e): stop its server too.
cleanup() {
  if [[ -n "$server_pid" ]]; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$scratch"
}
trap cleanup EXIT
results="$scratch/results"

run() {  # $1: label; the rest: extra server flags
  local label=$1
  shift
  local log="$scratch/$label.log"
  "$bin" --model "$model" --listen 127.0.0.1:0 --http_listen 127.0.0.1:0 --step_tokens 4032 \
    --threads 2 "$@" >"$log" 2>&1 &
  server_pid=$!
  local listening=
  while ! listening=$(grep -m1 '^drt-server listening on ' "$log"); do
    kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.2
  done
  local address
  address=$(sed -E 's/^drt-server listening on ([^ ]+) \(grpc\).*/\1/' <<<"$listening")
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/python3 client_examples/python/drt_client.py --server "$address" \
    --haystack-tokens "$tokens" --passkey 42424 --max-tokens 8 --stop . \
    --piece-bytes 262144 >"$scratch/$label.client" 2>&1 || { cat "$scratch/$label.client" >&2; exit 1; }
  t1=$(date +%s.%N)
  kill -TERM "$server_pid"
  wait "$server_pid" || true
  server_pid=
  # append: N tokens, C chunks in S s: R tokens/s (server: R' tokens/s)
  local line
  line=$(grep -m1 '^append: ' "$scratch/$label.client") || { cat "$scratch/$label.client" >&2; exit 1; }
  local ingested seconds server_rate
  ingested=$(sed -E 's/^append: ([0-9,]+) tokens.*/\1/; s/,//g' <<<"$line")
  seconds=$(sed -E 's/.* chunks in ([0-9.]+) s: .*/\1/' <<<"$line")
  server_rate=$(sed -E 's/.*\(server: ([0-9,]+) tokens\/s\).*/\1/; s/,//g' <<<"$line")
  # The haystack the client builds is about TOKENS tokens (its sentences do
  # not end exactly there): the rates use what the server counted.
  if ((ingested <= 0)); then
    echo "$label: the server ingested no tokens" >&2
    exit 1
  fi
  awk -v a="$t0" -v b="$t1" -v n="$ingested" -v s="$seconds" -v r="$server_rate" -v l="$label" \
    'BEGIN {printf "%-20s Append stream %.2f s: %.0f tokens/s (server: %.0f tokens/s); whole client %.1f s: %.0f tokens/s\n", l, s, n / s, r, b - a, n / (b - a)}'
  echo "$round $label $server_rate $(awk -v n="$ingested" -v s="$seconds" 'BEGIN {printf "%.1f", n / s}') $(awk -v a="$t0" -v b="$t1" -v n="$ingested" 'BEGIN {printf "%.1f", n / (b - a)}')" >>"$results"
}

for round in $(seq "$rounds"); do
  echo "round $round"
  run memory
  rm -rf "$scratch/state" && mkdir "$scratch/state"
  run durable --state_dir "$scratch/state"
  rm -rf "$scratch/state" && mkdir "$scratch/state"
  run durable_every_step --state_dir "$scratch/state" --state_ack_tokens 0
done

# Medians per mode, and the median over rounds of each round's mode/memory
# ratio (ratios taken within a round, where the modes ran back to back).
# Columns of $results: round label server_rate client_stream_rate whole_client_rate.
/usr/bin/python3 - "$results" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
by = {}
for rnd, label, *rates in rows:
    by.setdefault(label, {})[rnd] = [float(r) for r in rates]
names = ["server", "client stream", "whole client"]
for label, rounds in by.items():
    medians = [statistics.median(v[i] for v in rounds.values()) for i in range(3)]
    print(f"median {label:20s} " + ", ".join(f"{n} {m:,.0f}" for n, m in zip(names, medians)) + " tokens/s")
for label, rounds in by.items():
    if label == "memory":
        continue
    for i, name in enumerate(names):
        ratios = [rounds[r][i] / by["memory"][r][i] for r in rounds if r in by["memory"]]
        print(f"{label}/memory ({name}): rounds " + " ".join(f"{x:.2f}" for x in ratios)
              + f", median {statistics.median(ratios):.2f}")
PY

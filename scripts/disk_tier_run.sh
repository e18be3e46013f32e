#!/usr/bin/env bash
# The disk tier at scale (docs/state_format.md, "Disk tier"): streams a pass
# key haystack of TOKENS tokens through drt-server with --state_dir, so that
# closed chunks are read from the memory-mapped chunk logs instead of RAM,
# and checks the answer. Reports the wall time, the server's peak RSS
# (VmHWM) and peak anonymous RSS (sampled every 2 s; file pages of the
# mapped logs are the page cache's to drop), and the state directory's size.
# Then it kills the server with SIGKILL, restarts it on the same directory,
# reports how long the restore took, and asks the restored session the
# question again.
#   STATE_DIR=/path/to/empty/dir TOKENS=33554432 bash scripts/disk_tier_run.sh
# Needs a build (scripts/build.sh); SERVER_BIN picks another drt-server binary. The state directory needs about
# 1,050 bytes of disk per token with the bundled model; the script refuses
# to start when the disk has less free than that plus 5 GiB.
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${TOKENS:-1048576}
state_dir=${STATE_DIR:?set STATE_DIR to an empty or missing directory}
model=${MODEL:-models/drt-passkey-byte}
passkey=${PASSKEY:-$((10000 + RANDOM % 90000))}
out=${OUT_DIR:-$(mktemp -d -t disk-tier-run.XXXXXX)}
step_tokens=${STEP_TOKENS:-4032}
server_bin=${SERVER_BIN:-build/server/drt-server}

mkdir -p "$state_dir" "$out"
if [[ -n "$(ls -A "$state_dir")" ]]; then
  echo "disk_tier_run: $state_dir is not empty" >&2
  exit 1
fi
need_kb=$(( tokens * 1050 / 1024 + 5 * 1024 * 1024 ))
free_kb=$(df -Pk "$state_dir" | awk 'NR == 2 {print $4}')
if (( free_kb < need_kb )); then
  echo "disk_tier_run: $state_dir has $((free_kb / 1024 / 1024)) GiB free; $((need_kb / 1024 / 1024)) GiB needed" >&2
  exit 1
fi

server_pid=
sampler_pid=
cleanup() {
  [[ -n "$sampler_pid" ]] && kill "$sampler_pid" 2>/dev/null || true
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

start_server() {  # $1: log file; sets server_pid and grpc_address
  "$server_bin" --model "$model" --listen 127.0.0.1:0 --http_listen 127.0.0.1:0 \
    --state_dir "$state_dir" --step_tokens "$step_tokens" --idle_ttl_seconds 86400 >"$1" 2>&1 &
  server_pid=$!
  local listening=
  while ! listening=$(grep -m1 '^drt-server listening on ' "$1"); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "disk_tier_run: drt-server exited; its log:" >&2
      cat "$1" >&2
      exit 1
    fi
    sleep 0.2
  done
  grpc_address=$(sed -E 's/^drt-server listening on ([^ ]+) \(grpc\).*/\1/' <<<"$listening")
}

seconds_between() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }

sample_memory() {  # every 2 s: seconds, VmHWM, RssAnon, RssFile (kB) of pid $1
  local t0=$SECONDS
  while kill -0 "$1" 2>/dev/null; do
    awk -v t=$((SECONDS - t0)) '/^VmHWM|^RssAnon|^RssFile/ {v[$1] = $2}
      END {print t, v["VmHWM:"], v["RssAnon:"], v["RssFile:"]}' "/proc/$1/status" 2>/dev/null || true
    sleep 2
  done
}

echo "disk_tier_run: $tokens tokens, pass key $passkey, state in $state_dir, logs in $out"
start_server "$out/server1.log"
sample_memory "$server_pid" >"$out/memory1.txt" &
sampler_pid=$!
t0=$(date +%s.%N)
# No total deadline on the Append (the 32M and 64M runs took 1.1-1.5 hours);
# the client's idle timeout still ends it if the server stops sending
# progress. IDLE_TIMEOUT allows for slow disk-tier steps (default 1800 s).
/usr/bin/python3 client_examples/python/drt_client.py --server "$grpc_address" \
  --haystack-tokens "$tokens" --passkey "$passkey" --max-tokens 16 --require-passkey --stop . \
  --keep-session --piece-bytes 262144 --idle-timeout "${IDLE_TIMEOUT:-1800}" \
  >"$out/client1.txt" 2>"$out/client1.err"
t1=$(date +%s.%N)
kill "$sampler_pid" 2>/dev/null || true
sampler_pid=
cat "$out/client1.txt"
state_bytes=$(du -sb "$state_dir" | cut -f1)
awk -v s="$(seconds_between "$t0" "$t1")" -v bytes="$state_bytes" '
  {if ($2 > hwm) hwm = $2; if ($3 > anon) anon = $3}
  END {printf "disk_tier_run: first run %.0f s; peak RSS (VmHWM) %.2f GiB; peak RssAnon %.2f GiB; state directory %.2f GiB\n",
       s, hwm / 1048576, anon / 1048576, bytes / 2^30}' "$out/memory1.txt"

# Crash and restore.
kill -KILL "$server_pid"
wait "$server_pid" 2>/dev/null || true
t2=$(date +%s.%N)
start_server "$out/server2.log"
t3=$(date +%s.%N)
echo "disk_tier_run: restart to listening (restore included): $(seconds_between "$t2" "$t3") s"
grep -i "restor" "$out/server2.log" || true
/usr/bin/python3 - "$grpc_address" "$passkey" <<'PY'
import sys, time
sys.path.insert(0, "build/python")
import grpc
from drt.v1 import drt_pb2 as pb, drt_pb2_grpc as rpc
address, passkey = sys.argv[1], sys.argv[2]
stub = rpc.DrtStub(grpc.insecure_channel(address))
sessions = stub.ListSessions(pb.ListSessionsRequest()).sessions
assert len(sessions) == 1, f"{len(sessions)} sessions restored"
s = sessions[0]
print(f"disk_tier_run: restored session {s.session_id}: {s.tokens:,} tokens, {s.chunks:,} chunks, "
      f"host_bytes {s.host_bytes / 2**30:.2f} GiB, mapped_bytes {s.mapped_bytes / 2**30:.2f} GiB")
question = "\nWhat is the pass key? The pass key is"
t = time.time()
for _ in stub.Append(iter([pb.AppendRequest(session_id=s.session_id, text=question)])):
    pass
answer = "".join(r.piece.text for r in stub.Generate(pb.GenerateRequest(
    session_id=s.session_id, max_tokens=16, stop=["."])))
ok = passkey in answer
print(f"disk_tier_run: asked again after the restart: {answer!r} ({'right' if ok else 'WRONG'}, "
      f"{time.time() - t:.1f} s)")
sys.exit(0 if ok else 1)
PY

#!/usr/bin/env bash
# ctest run_main_args (label scripts): scripts/run_main.sh passes the client
# the generated haystack's flags only when the arguments bring no prompt of
# their own. It always passed --haystack-tokens and --require-passkey, so
# `run_main.sh --prompt-file book.txt` was refused with "--haystack-tokens
# needs the generated haystack", a flag the user never passed (review-tools
# #12). run_main.sh is copied into a scratch tree with stand-ins for
# install_deps.sh, build.sh and drt-server (prints its listening line, exits
# 0 on SIGTERM); the client stand-in runs the real client's parse_args on its
# arguments, so its refusals are the real ones, and records the arguments.
# Also: a SIGTERM to run_main.sh stops the client before the server
# (review-toolsfix #4), waiting at most 12 s for it.
# Usage: tests/run_main_args_test.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/scripts" "$tmp/build/server" "$tmp/client_examples/python"
cp "$repo/scripts/run_main.sh" "$tmp/scripts/"
printf '#!/bin/sh\nexit 0\n' >"$tmp/scripts/install_deps.sh"
printf '#!/bin/sh\nexit 0\n' >"$tmp/scripts/build.sh"
cat >"$tmp/build/server/drt-server" <<'EOF'
#!/usr/bin/env bash
# With STANDIN_HOLD (a directory): records whether the client had finished
# when the server was told to stop.
if [[ -n "${STANDIN_HOLD:-}" ]]; then
  trap 'if [[ -f "$STANDIN_HOLD/client_done" ]]; then echo after; else echo before; fi \
          >"$STANDIN_HOLD/server_stop"; exit 0' TERM
else
  trap 'exit 0' TERM
fi
echo "drt-server listening on 127.0.0.1:50051 (grpc), 127.0.0.1:9090 (http)"
while true; do sleep 0.1; done
EOF
chmod +x "$tmp/build/server/drt-server"
cat >"$tmp/client_examples/python/drt_client.py" <<EOF
import sys
sys.path.insert(0, "$repo/client_examples/python")
import drt_client
with open("$tmp/client_args", "w") as f:
    f.write(" ".join(sys.argv[1:]))
drt_client.parse_args(sys.argv[1:])  # exits 2 with the real client's message
print("client stand-in: arguments accepted")
# STANDIN_HOLD_MODE: stay up until signalled. "delete": SIGTERM takes 1 s (a
# DeleteSession), then exits 130; "ignore": SIGTERM is ignored.
import os, signal, time
hold = os.environ.get("STANDIN_HOLD_MODE")
if hold:
    def term(signum, frame):
        time.sleep(1)
        open(os.path.join("$tmp", "client_done"), "w").close()
        sys.exit(130)
    signal.signal(signal.SIGTERM, term if hold == "delete" else signal.SIG_IGN)
    with open(os.path.join("$tmp", "client_ready"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
EOF
echo "Some text of my own." >"$tmp/book.txt"
echo "1 2 3" >"$tmp/ids.txt"

failed=0
# check DESCRIPTION EXPECTED_EXIT OUTPUT_PATTERN ARGS_PATTERN NOT_ARGS_PATTERN: runs the
# command in ${run[@]} in the scratch tree; the client's arguments must match
# ARGS_PATTERN and not NOT_ARGS_PATTERN (when given).
check() {
  local what=$1 want=$2 out_pattern=$3 args_pattern=$4 not_args=$5
  rm -f "$tmp/client_args"
  local rc=0
  (cd "$tmp" && "${run[@]}") >"$tmp/out" 2>&1 || rc=$?
  local args=
  [[ -f "$tmp/client_args" ]] && args=$(cat "$tmp/client_args")
  if ((rc == want)) && grep -qE -- "$out_pattern" "$tmp/out" && [[ "$args" =~ $args_pattern ]] \
     && { [[ -z "$not_args" ]] || ! [[ "$args" =~ $not_args ]]; }; then
    echo "ok: $what"
  else
    echo "FAILED: $what (exit $rc, expected $want)"
    echo "  client arguments: $args"
    sed 's/^/  /' "$tmp/out" | tail -5
    failed=1
  fi
}
run=(bash scripts/run_main.sh)
check "no arguments: the 100,000-token haystack with the pass-key check" 0 "arguments accepted" \
  "--haystack-tokens 100000 --max-tokens 16 --require-passkey --stop \." ""
run=(env PROMPT_TOKENS=5000 bash scripts/run_main.sh --depth 0.1)
check "PROMPT_TOKENS and a client flag: a 5,000-token haystack at depth 0.1" 0 "arguments accepted" \
  "--haystack-tokens 5000 .*--require-passkey .*--depth 0\.1" ""
run=(bash scripts/run_main.sh --prompt-file "$tmp/book.txt" --question "Who?")
check "--prompt-file: no haystack flags, accepted by the client" 0 "arguments accepted" \
  "--prompt-file $tmp/book.txt" "haystack|require-passkey"
run=(bash scripts/run_main.sh "--prompt-file=$tmp/book.txt")
check "--prompt-file=FILE: the same" 0 "arguments accepted" "--prompt-file=" "haystack|require-passkey"
run=(bash scripts/run_main.sh --token-ids "$tmp/ids.txt")
check "--token-ids: the same" 0 "arguments accepted" "--token-ids" "haystack|require-passkey"
run=(bash scripts/run_main.sh --prompt-logprobs 0)
check "--prompt-logprobs (not a prompt): the haystack and its check stay" 0 "arguments accepted" \
  "--haystack-tokens 100000 .*--require-passkey .*--prompt-logprobs 0" ""
run=(bash scripts/run_main.sh --prompt "$tmp/book.txt")
check "--prompt (the client's alias of --prompt-file): the same" 0 "arguments accepted" "--prompt " \
  "haystack|require-passkey"
run=(env PROMPT_TOKENS=5000 bash scripts/run_main.sh --prompt-file "$tmp/book.txt")
check "PROMPT_TOKENS with --prompt-file: refused, naming PROMPT_TOKENS, before the client runs" 2 \
  "PROMPT_TOKENS sets the generated haystack's length; with --prompt-file" "^$" ""
# A signal to run_main.sh while the client runs: its cleanup TERMs the client
# and waits for it (its session delete) before stopping the server, at most
# 12 s (review-toolsfix #4: both were TERMed at once).
term_case() {  # term_case MODE: sets rc, took (s), stop (server_stop's content)
  rm -f "$tmp/client_ready" "$tmp/client_done" "$tmp/server_stop"
  (cd "$tmp" && exec env STANDIN_HOLD="$tmp" STANDIN_HOLD_MODE="$1" bash scripts/run_main.sh) \
    >"$tmp/out" 2>&1 &
  local pid=$! i
  for ((i = 0; i < 200; i++)); do [[ -s "$tmp/client_ready" ]] && break; sleep 0.1; done
  local start=$SECONDS
  rc=0
  kill -TERM "$pid"
  wait "$pid" || rc=$?
  took=$((SECONDS - start))
  stop=$(cat "$tmp/server_stop" 2>/dev/null || echo "not stopped")
  # The stand-in client, if run_main.sh left it running (the old cleanup did
  # with "ignore"): our own child's child, by its PID.
  [[ -s "$tmp/client_ready" ]] && kill -KILL "$(cat "$tmp/client_ready")" 2>/dev/null || true
}
term_case delete
if ((rc == 143)) && [[ "$stop" == after && -f "$tmp/client_done" ]]; then
  echo "ok: SIGTERM to run_main.sh: the client's session delete (1 s) ends before the server is stopped"
else
  echo "FAILED: SIGTERM to run_main.sh: the client ends before the server stops (exit $rc, expected 143;" \
       "server stopped $stop the client finished)"
  sed 's/^/  /' "$tmp/out" | tail -5
  failed=1
fi
term_case ignore
if ((rc == 143 && took >= 11 && took <= 16)) && [[ "$stop" == before ]]; then
  echo "ok: SIGTERM to run_main.sh, a client that ignores it: the server is stopped after the 12 s bound" \
       "(${took} s)"
else
  echo "FAILED: SIGTERM to run_main.sh, a client that ignores it: exit $rc (expected 143), ${took} s" \
       "(expected 12 s, 11-16 with the 1 s clock), server stop: $stop"
  sed 's/^/  /' "$tmp/out" | tail -5
  failed=1
fi

((failed)) && exit 1
echo "run_main_args: every check passed"

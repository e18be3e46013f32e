#!/usr/bin/env bash
# The main job: builds everything, starts drt-server with the bundled trained
# model (models/drt-text-byte) on 127.0.0.1, streams a 100,000-token
# haystack with a hidden pass key through the Python client
# (client_examples/python/drt_client.py), prints the streamed answer, whether
# it is right, and the timings, and stops the server with SIGTERM. Exits 1
# when the answer is wrong.
#   PROMPT_TOKENS=1000000 bash scripts/run_main.sh  a longer haystack
#   bash scripts/run_main.sh --depth 0.1            extra arguments go to the client
#   MODEL=random bash scripts/run_main.sh           a random GPT-2-vocabulary model instead
#                                                   (speed only: it cannot answer)
#   bash scripts/run_main.sh --prompt-file book.txt --question "Who wrote it?"
#                                                   your own prompt (or --token-ids FILE):
#                                                   no haystack, no pass-key check
set -euo pipefail
cd "$(dirname "$0")/.."

# The generated haystack and its pass-key check, unless the arguments bring
# a prompt of their own (the client refuses --haystack-tokens and
# --require-passkey beside one, naming flags the user never passed). The
# patterns take --prompt (the client's alias), --prompt-file's unambiguous
# prefixes (--prompt-f) and --token-ids' (--token-i), but not
# --prompt-logprobs or --print-logprobs, which score the haystack.
own_prompt=
for arg in "$@"; do
  case "$arg" in --prompt|--prompt=*|--prompt-f*|--token-*) own_prompt=$arg ;; esac
done
haystack=(--haystack-tokens "${PROMPT_TOKENS:-100000}")
require=(--require-passkey --stop .)  # the answer is " 12345."
if [[ -n "$own_prompt" ]]; then
  if [[ -n "${PROMPT_TOKENS:-}" ]]; then
    echo "run_main: PROMPT_TOKENS sets the generated haystack's length; with ${own_prompt%%=*} the" \
         "prompt is yours: leave PROMPT_TOKENS out" >&2
    exit 2
  fi
  haystack=()
  require=()
fi

bash scripts/install_deps.sh
bash scripts/build.sh

model=${MODEL:-models/drt-text-byte}
if [[ "$model" == random ]]; then
  model=build/models/drt-random-gpt2
  require=()
  if [[ ! -f "$model/model.safetensors" ]]; then
    /usr/bin/python3 weights_tools/make_random_model.py --out "$model" \
      --tokenizer tests/fixtures/gpt2-tokenizer/tokenizer.json
  fi
fi

log=$(mktemp -t drt-server.XXXXXX)
server_pid=
client_pid=
cleanup() {
  # The client first: on SIGTERM it deletes its session (one DeleteSession,
  # 10 s deadline), so it gets up to 12 s before the server stops; stopping
  # both at once left it printing after the script returned
  # (review-toolsfix #4). A client still running then is killed.
  if [[ -n "$client_pid" ]]; then
    kill -TERM "$client_pid" 2>/dev/null || true
    local end=$((SECONDS + 12))  # by the clock: 120 polls of 0.1 s took 17 s under load
    while ((SECONDS < end)) && kill -0 "$client_pid" 2>/dev/null; do
      sleep 0.1
    done
    kill -KILL "$client_pid" 2>/dev/null || true
    wait "$client_pid" 2>/dev/null || true
  fi
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -f "$log"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Port 0: the server picks free ports and prints them in its "listening" line.
build/server/drt-server --model "$model" --listen 127.0.0.1:0 --http_listen 127.0.0.1:0 \
  >"$log" 2>&1 &
server_pid=$!

listening=
for ((i = 0; i < 1200; i++)); do
  if listening=$(grep -m1 '^drt-server listening on ' "$log"); then
    break
  fi
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z "$listening" ]]; then
  if kill -0 "$server_pid" 2>/dev/null; then
    echo "run_main: drt-server did not start listening within 120 s; its log:" >&2
  else
    status=0
    wait "$server_pid" || status=$?
    server_pid=
    echo "run_main: drt-server exited with status $status before listening; its log:" >&2
  fi
  cat "$log" >&2
  exit 1
fi
echo "$listening"
grpc_address=$(sed -E 's/^drt-server listening on ([^ ]+) \(grpc\).*/\1/' <<<"$listening")

# In the background so that a signal to this script is handled at once (bash
# runs traps only between foreground commands, but during wait).
/usr/bin/python3 client_examples/python/drt_client.py --server "$grpc_address" \
  "${haystack[@]}" --max-tokens 16 "${require[@]}" "$@" &
client_pid=$!
client_status=0
wait "$client_pid" || client_status=$?
client_pid=

kill -TERM "$server_pid"
server_status=0
wait "$server_pid" || server_status=$?
server_pid=
if ((client_status != 0 || server_status != 0)); then
  echo "run_main: client exited with $client_status, drt-server with $server_status; server log:" >&2
  cat "$log" >&2
  exit 1
fi
echo "drt-server stopped cleanly"

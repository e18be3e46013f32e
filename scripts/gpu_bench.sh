#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds, runs the CUDA tests (ctest -L cuda)
# and compute-sanitizer (memcheck, racecheck) on the CUDA test executables,
# makes a random model with the paper's 128M configuration in bf16, and
# prints one table: prefill tokens/s, decode ms/token (median), GPU and host
# memory and host->device bytes per generated token at 16K, 128K, 1M and 4M
# tokens of context, with the same decode timing for --disable_gca (the
# sliding-window base LM without retrieval) beside it; then drt-step-bench's
# aggregate decode tokens/s of N sessions stepped together (issue 11); then
# drt-batch-bench
# through drt-server --device cuda on the same model (scripts/batch_bench.sh):
# aggregate decode with 1, 4, 16, 32 and 64 sessions generating at once, and
# the time per output token of one session while 8 others stream 1M-token
# Appends (issue 11's targets: >= 10x one session at 32; p99 <= 2x idle).
#   bash scripts/gpu_bench.sh                      everything
#   SKIP_STEP_BENCH=1 bash scripts/gpu_bench.sh    without drt-step-bench
#   CONTEXTS="16384 131072" bash scripts/gpu_bench.sh   fewer contexts
#   SKIP_TESTS=1 bash scripts/gpu_bench.sh         the table only
#   SKIP_TABLE=1 bash scripts/gpu_bench.sh         the tests and sanitizers only
#   SKIP_BATCH=1 bash scripts/gpu_bench.sh         without the drt-batch-bench step
#   BATCH_SESSIONS=1,32 bash scripts/gpu_bench.sh  other session counts for it
#   PREBUILT=1 bash scripts/gpu_bench.sh           use build-gpu and .devlibs made by
#                                                  scripts/device_bundle.sh (no apt, no build)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu_bench: no NVIDIA GPU found (nvidia-smi missing or lists no GPU); this script" \
       "needs one. Nothing was run." >&2
  exit 2
fi
nvcc=/usr/local/cuda/bin/nvcc
if [[ ! -x "$nvcc" ]] && ! command -v nvcc >/dev/null 2>&1; then
  echo "gpu_bench: no CUDA toolkit (nvcc) at /usr/local/cuda/bin or on PATH" >&2
  exit 2
fi
sanitizer=/usr/local/cuda/bin/compute-sanitizer
command -v compute-sanitizer >/dev/null 2>&1 && sanitizer=$(command -v compute-sanitizer)

build=${BUILD_DIR:-build-gpu}
contexts=${CONTEXTS:-"16384 131072 1048576 4194304"}
generate=${GENERATE:-32}

if [[ -n "${PREBUILT:-}" ]]; then
  # A lent GPU machine that cannot install packages: scripts/device_bundle.sh
  # built $build on a Debian machine and downloaded the runtime libraries
  # into .devlibs; unpack them beside, not over, the system's.
  if [[ -d .devlibs ]]; then
    mkdir -p /tmp/drt-devlibs
    for deb in .devlibs/*.deb; do dpkg-deb -x "$deb" /tmp/drt-devlibs; done
    export LD_LIBRARY_PATH="/tmp/drt-devlibs/usr/lib/x86_64-linux-gnu:/tmp/drt-devlibs/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  # The tests find their fixtures through the source path compiled into them.
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
  if [[ -n "$src" && "$src" != "$PWD" && ! -e "$src" ]]; then
    mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"
  fi
else
  bash scripts/install_deps.sh
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  if [[ ! -d "$build/tests/cuda_backend" ]]; then
    echo "gpu_bench: CMake did not enable CUDA in $build (see 'drt: CUDA toolkit found')" >&2
    exit 2
  fi
  cmake --build "$build" -j"$(nproc)"
fi

if [[ -z "${SKIP_TESTS:-}" ]]; then
  echo "== ctest -L cuda"
  ctest_log=$(mktemp)
  ctest --test-dir "$build" -L cuda --output-on-failure 2>&1 | tee "$ctest_log"
  if grep -q '(Skipped)\|Not Run' "$ctest_log"; then
    echo "gpu_bench: CUDA tests were skipped although a GPU is present" >&2
    exit 1
  fi
  rm -f "$ctest_log"
  # The precision figures (passing tests WARN them; ctest hides that): fp32
  # CUDA vs CPU (limit 1e-4, identical retrievals) and bf16 CUDA vs the
  # float64 goldens (limits: the bf16 reference's figures, docs/cuda.md).
  # The compact reporter prints each WARN on one line (the console reporter
  # wraps them at 80 columns, which split the figures from their labels).
  # Also the multi-session step figures (issue 11: a session batched vs
  # alone, limit 1e-4; tests/cuda_backend/cuda_batch_step_test.cc).
  echo "== fp32 parity and bf16 error on the fixtures; sessions batched vs alone"
  parity_log=$(mktemp)
  if ! "$build/tests/cuda_backend/drt_cuda_backend_tests" "cuda fp32 *,cuda bf16 *,[batch_step]" \
       --reporter compact >"$parity_log" 2>&1; then
    cat "$parity_log"
    echo "gpu_bench: the fp32 parity, bf16 error or batched step tests failed" >&2
    exit 1
  fi
  grep -E ' fp32: worst| bf16 vs float64 golden|worst relative difference' "$parity_log" |
    sed -E "s/^.*warning: '//; s/'$//"
  rm -f "$parity_log"
  if [[ ! -x "$sanitizer" ]]; then
    echo "gpu_bench: compute-sanitizer not found at $sanitizer" >&2
    exit 1
  fi
  for exe in "$build/tests/cuda/drt_cuda_kernel_tests" \
             "$build/tests/cuda_backend/drt_cuda_backend_tests"; do
    [[ -x "$exe" ]] || { echo "gpu_bench: $exe was not built" >&2; exit 1; }
    echo "== compute-sanitizer memcheck $(basename "$exe")"
    "$sanitizer" --tool memcheck --error-exitcode 1 --leak-check full "$exe"
    echo "== compute-sanitizer racecheck $(basename "$exe")"
    # racecheck is slow: the backend tests run on the fixtures only.
    filter=()
    [[ "$exe" == *backend* ]] && filter=("cuda fp32 matches the cpu backend on the fixtures: whole prompt")
    "$sanitizer" --tool racecheck --error-exitcode 1 "$exe" "${filter[@]}"
  done
fi

if [[ -n "${SKIP_TABLE:-}" ]]; then
  echo "gpu_bench: SKIP_TABLE set; tests and sanitizers done"
  exit 0
fi

# The paper's 128M configuration (tests/fixtures/reference_configs holds a
# copy of ../shared/reference/drt-config_63.json), random weights in bf16.
model="$build/models/drt-128m-random-bf16"
if [[ ! -f "$model/model.safetensors" ]]; then
  config=tests/fixtures/reference_configs/drt-config_63.json
  [[ -f ../shared/reference/drt-config_63.json ]] && config=../shared/reference/drt-config_63.json
  mapfile -t args < <(/usr/bin/python3 - "$config" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
pairs = [("--vocab-size", c["vocab_size"]), ("--pad-id", c["pad_id"]),
         ("--chunk-id", c["chunk_id"]), ("--bos-id", c["bos_id"]),
         ("--mask-id", c["mask_id"]), ("--hidden-size", c["hidden_size"]),
         ("--num-heads", c["num_attention_heads"]), ("--num-kv-heads", c["num_key_value_heads"]),
         ("--intermediate-size", c["intermediate_size"]),
         ("--decoder-layers", ",".join(str(x) for x in c["decoder_layers"])),
         ("--encoder-layers", c["encoder_layers"]), ("--enc-chunk-size", c["enc_chunk_size"]),
         ("--chunk-topk", c["chunk_topk"]), ("--slide-window", c["slide_window"]),
         ("--rms-norm-eps", c["rms_norm_eps"])]
for k, v in pairs:
    print(k)
    print(v)
PY
)
  /usr/bin/python3 weights_tools/make_random_model.py --out "$model" --dtype bf16 \
    --tokenizer tests/fixtures/gpt2-tokenizer/tokenizer.json "${args[@]}"
fi

# Runs drt-bench once; prints its bench_result line with the peak GPU memory
# of the process (sampled with nvidia-smi) appended.
run_bench() {
  local out
  out=$(mktemp)
  "$build/bench/drt-bench" --model "$model" --device cuda --random_prompt \
    --generate "$generate" "$@" >"$out" 2>/dev/null &
  local pid=$! peak=0 used
  while kill -0 "$pid" 2>/dev/null; do
    used=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits \
             2>/dev/null | awk -F', ' -v p="$pid" '$1 == p {print $2}')
    [[ -n "$used" && "$used" -gt "$peak" ]] && peak=$used
    sleep 0.5
  done
  if ! wait "$pid"; then
    echo "gpu_bench: drt-bench $* failed:" >&2
    cat "$out" >&2
    rm -f "$out"
    return 1
  fi
  echo "$(grep '^bench_result ' "$out") gpu_peak_mib=$peak"
  rm -f "$out"
}

field() {  # field NAME LINE
  tr ' ' '\n' <<<"$2" | awk -F= -v k="$1" '$1 == k {print $2}'
}

rows=()
for ctx in $contexts; do
  echo "== context $ctx tokens" >&2
  gca=$(run_bench --prompt_tokens "$ctx")
  base=$(run_bench --prompt_tokens "$ctx" --disable_gca)
  floor=$(field weight_read_floor_ms "$gca")
  rows+=("$ctx|$(field prefill_tokens_per_s "$gca")|$(field decode_ms_median "$gca")|$(field decode_ms_median "$base")|$(field gpu_peak_mib "$gca")|$(field session_host_bytes "$gca")|$(field peak_rss_bytes "$gca")|$(field h2d_bytes_per_token "$gca")")
done

echo
echo "drt-bench, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), model: 128M config" \
     "(random bf16 weights), $generate generated tokens per context, greedy"
echo "weight-read floor (bf16 weights / measured device copy bandwidth): $floor ms per token"
printf '%-10s %14s %10s %10s %10s %16s %10s %14s %14s %12s\n' context prefill_tok/s decode_ms \
  x_floor x_no_gca decode_ms_no_gca gpu_MiB session_host_MiB peak_rss_MiB h2d_B/token
for row in "${rows[@]}"; do
  IFS='|' read -r ctx prefill decode base gpu host rss h2d <<<"$row"
  printf '%-10s %14.0f %10.3f %10.2f %10.2f %16.3f %10s %14.0f %14.0f %12.0f\n' "$ctx" "$prefill" \
    "$decode" "$(awk -v a="$decode" -v b="$floor" 'BEGIN{print (b > 0) ? a/b : 0}')" \
    "$(awk -v a="$decode" -v b="$base" 'BEGIN{print (b > 0) ? a/b : 0}')" "$base" "$gpu" \
    "$(awk -v b="$host" 'BEGIN{print b/1048576}')" "$(awk -v b="$rss" 'BEGIN{print b/1048576}')" "$h2d"
done

# Issue 11: aggregate decode tokens/s of N sessions stepped together
# (engine/batch_step.h; on CUDA slice by slice, docs/cuda.md "Steps of
# several sessions") against the same N stepped one at a time, same model.
if [[ -z "${SKIP_STEP_BENCH:-}" ]]; then
  echo
  echo "== drt-step-bench (aggregate decode, N sessions in one engine step)"
  "$build/tools/drt-step-bench" --model "$model" --device cuda \
    --sessions "${STEP_SESSIONS:-1,4,16,32,64}" --prompt_tokens "${STEP_PROMPT:-4096}" \
    --generate "$generate" --repeats 3
fi

if [[ -z "${SKIP_BATCH:-}" ]]; then
  echo
  echo "== drt-batch-bench: drt-server --device cuda, model: 128M config (random bf16 weights)"
  BUILD_DIR="$build" MODEL="$model" DEVICE=cuda bash scripts/batch_bench.sh \
    --sessions "${BATCH_SESSIONS:-1,4,16,32,64}" --prompt_tokens 4000 --generate 256 \
    --load_sessions 8 --append_tokens 1000000 --repeats 3 --json "$build/batch_bench_cuda.json"
  echo "gpu_bench: drt-batch-bench results also in $build/batch_bench_cuda.json"
fi

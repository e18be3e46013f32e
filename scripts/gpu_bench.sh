#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds, runs the CUDA tests (ctest -L cuda)
# and compute-sanitizer (memcheck, racecheck) on the CUDA test executables
# (without their slowest cases, each run under a time limit; see below),
# makes a random model with the paper's 128M configuration in bf16, and
# prints one table: prefill tokens/s, decode ms/token (median), GPU and host
# memory and host->device bytes per generated token at 16K, 128K, 1M and 4M
# tokens of context, with the same decode timing for --disable_gca (the
# sliding-window base LM without retrieval) beside it; then drt-step-bench's
# aggregate decode tokens/s of N sessions stepped together (issue 11); then
# the same with --batched_step_rows (one GEMM for all sessions' rows); then
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
#   SKIP_CTEST=1 bash scripts/gpu_bench.sh         without ctest -L cuda and the parity figures
#   SANITIZER_RUNS="memcheck-backend racecheck-kernel" bash scripts/gpu_bench.sh
#                                                  only these sanitizer runs (of memcheck-kernel,
#                                                  memcheck-backend, racecheck-kernel,
#                                                  racecheck-backend; all by default,
#                                                  none when set but empty)
#   SANITIZER_TIMEOUT=900 bash scripts/gpu_bench.sh  each sanitizer run's time limit
#                                                  (seconds; 480 by default)
#   SKIP_BATCH=1 bash scripts/gpu_bench.sh         without the drt-batch-bench step
#   SKIP_ENCODER_ROWS=1 bash scripts/gpu_bench.sh  without the table's rerun with
#                                                  --cuda_chunk_store=encoder_rows
#   SKIP_TABLE3=1 bash scripts/gpu_bench.sh        without the Table 3 layout (ratios to the base
#                                                  LM at TABLE3_CONTEXTS, 16384 49152 by default,
#                                                  with and without offload: --chunk_tier host,
#                                                  device; TABLE3_NO_OFFLOAD=auto sizes the
#                                                  device store exactly instead of by doubling)
#   SKIP_PEER=1 bash scripts/gpu_bench.sh          without the full-attention peer
#                                                  (bench/full_attention_peer.py, PyTorch)
#   BATCH_SESSIONS=1,32 bash scripts/gpu_bench.sh  other session counts for it
#   PREBUILT=1 bash scripts/gpu_bench.sh           use build-gpu and .devlibs made by
#                                                  scripts/device_bundle.sh (no apt, no build)
#   SKIP_WINDOW_BENCH=1 bash scripts/gpu_bench.sh  without drt-window-bench (the decode window
#                                                  attention kernels alone: row vs split, issue 10)
#   WINDOW_DECODE_SPLITS=8 bash scripts/gpu_bench.sh   drt-bench with --window_decode_splits 8
#                                                  (the split decode kernel, off by default)
#   PREFILL_TENSOR_CORES=true bash scripts/gpu_bench.sh   drt-bench with the tensor-core
#                                                  window and GCA prefill kernels (off by default)
#   DECODE_GRAPHS=true bash scripts/gpu_bench.sh   drt-bench and the slice-by-slice drt-step-bench
#                                                  with --decode_graphs (decode steps replay a
#                                                  CUDA graph; off by default)
#   DECODE_FUSED_GEMV=true bash scripts/gpu_bench.sh   drt-bench and both drt-step-bench runs
#                                                  with --decode_fused_gemv (fused norm/GEMV/
#                                                  SwiGLU/residual kernels for slices of <= 8
#                                                  rows; off by default)
set -euo pipefail
cd "$(dirname "$0")/.."

sanitizer_timeout=${SANITIZER_TIMEOUT:-480}
# Set but empty: no sanitizer run.
sanitizer_runs=${SANITIZER_RUNS-"memcheck-kernel memcheck-backend racecheck-kernel racecheck-backend"}
if [[ ! "$sanitizer_timeout" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_bench: SANITIZER_TIMEOUT=$sanitizer_timeout: expected a whole number of seconds" >&2
  exit 2
fi
for run in $sanitizer_runs; do
  case "$run" in
    memcheck-kernel | memcheck-backend | racecheck-kernel | racecheck-backend) ;;
    *)
      echo "gpu_bench: SANITIZER_RUNS: unknown run '$run' (expected memcheck-kernel," \
           "memcheck-backend, racecheck-kernel, racecheck-backend)" >&2
      exit 2
      ;;
  esac
done

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

# A python3 with numpy, for making the random model: the one on PATH when it
# has numpy (on the lent GPU machines /usr/bin/python3 has none; the python3
# on PATH, the image's, has it), else /usr/bin/python3 (Debian's, with the
# numpy scripts/install_deps.sh installs).
python=/usr/bin/python3
if command -v python3 >/dev/null 2>&1 && python3 -c 'import numpy' >/dev/null 2>&1; then
  python=$(command -v python3)
fi

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

if [[ -z "${SKIP_TESTS:-}" && -z "${SKIP_CTEST:-}" ]]; then
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
  # alone, limit 1e-4; tests/cuda_backend/cuda_batch_step_test.cc), and a
  # session's state moved CUDA fp32 <-> CPU (limit 1e-4;
  # tests/cuda_backend/cuda_state_test.cc, CudaBackendOptions::state_export).
  echo "== fp32 parity and bf16 error on the fixtures; sessions batched vs alone; state moved"
  parity_log=$(mktemp)
  if ! "$build/tests/cuda_backend/drt_cuda_backend_tests" \
       "cuda fp32 *,cuda bf16 *,[batch_step],cuda state: *" \
       --reporter compact >"$parity_log" 2>&1; then
    cat "$parity_log"
    echo "gpu_bench: the fp32 parity, bf16 error, batched step or state tests failed" >&2
    exit 1
  fi
  grep -E ' fp32: worst| bf16 vs float64 golden|worst relative difference' "$parity_log" |
    sed -E "s/^.*warning: '//; s/'$//"
  rm -f "$parity_log"
fi

if [[ -z "${SKIP_TESTS:-}" ]]; then
  if [[ ! -x "$sanitizer" ]]; then
    echo "gpu_bench: compute-sanitizer not found at $sanitizer" >&2
    exit 1
  fi
  kernel_tests="$build/tests/cuda/drt_cuda_kernel_tests"
  backend_tests="$build/tests/cuda_backend/drt_cuda_backend_tests"
  for exe in "$kernel_tests" "$backend_tests"; do
    [[ -x "$exe" ]] || { echo "gpu_bench: $exe was not built" >&2; exit 1; }
  done
  # The sanitizers slow the tests down (in the run below: memcheck up to about
  # 20x, racecheck up to about 90x), so the slowest cases are left out where they would
  # not finish within a device lease; each is in ctest -L cuda above,
  # unsanitized. Measured on an H100 on 2026-11-23 (six sanitizer jobs at
  # once on 16 cores beside other work, so slower than alone):
  # - memcheck of the backend tests: the two token-by-token decode cases take
  #   ~90 s each unsanitized; memcheck was stopped at 450 s inside the first
  #   of them. One-token decode steps also run in the batched-step cases here.
  # - racecheck of the kernel tests: "2^20 landmarks at d = 768" took 141 s
  #   and "2^20 landmarks" 41 s, and the sampling case (then one case for
  #   both vocabularies, since split) had run about 220 s without finishing
  #   when racecheck was stopped at 450 s. All three ran clean under memcheck
  #   (0 errors, the sampling case 33 s). Racecheck still runs the same
  #   kernels on the smaller cases: "2^14 landmarks at d = 768" (the same
  #   shared-memory layout) and the vocabulary-1000 sampling case.
  # - racecheck of the backend tests: the fixture case only (310 s there).
  # Each run has a time limit (SANITIZER_TIMEOUT, seconds; 480 fits one run
  # into a 10-minute device command): a run that does not finish in it is
  # stopped and reported instead of using up the lease. SANITIZER_RUNS picks
  # runs (checked at the top), so that they can be spread over commands.
  memcheck_backend_skip=("cuda: prefill, pieces and token-by-token decode agree"
                         "cuda fp32 matches the cpu backend on the fixtures: token-by-token decode")
  racecheck_kernel_skip=("cuda landmark top-k: 2^20 landmarks"
                         "cuda landmark top-k: 2^20 landmarks at d = 768"
                         "cuda sampling: the CPU sampler's rule at GPT-2's vocabulary (50257)")
  sanitizer_failures=()
  # run_sanitizer TOOL EXE [CATCH TEST SPEC...]: compute-sanitizer TOOL on EXE
  # with Catch's per-case durations; records a failure or a timeout.
  run_sanitizer() {
    local tool=$1 exe=$2
    shift 2
    local name
    name=$(basename "$exe")
    local options=(--tool "$tool" --error-exitcode 1)
    [[ "$tool" == memcheck ]] && options+=(--leak-check full)
    echo "== compute-sanitizer $tool $name (time limit $sanitizer_timeout s)"
    local rc=0
    timeout --kill-after=30 "$sanitizer_timeout" \
      "$sanitizer" "${options[@]}" "$exe" "$@" --durations yes || rc=$?
    if ((rc == 124 || rc == 137)); then
      echo "gpu_bench: compute-sanitizer $tool $name did not finish in $sanitizer_timeout s;" \
           "the cases with a duration above finished" >&2
      sanitizer_failures+=("$tool $name: stopped after $sanitizer_timeout s")
    elif ((rc != 0)); then
      sanitizer_failures+=("$tool $name: exit status $rc")
    fi
  }
  # Catch test specs that leave the named cases out: "~name", one argument
  # each (Catch ANDs its arguments), a comma escaped (unescaped it would
  # split the name into two specs).
  exclusions() {
    local name
    for name in "$@"; do printf '~%s\n' "${name//,/\\,}"; done
  }
  mapfile -t memcheck_backend_filter < <(exclusions "${memcheck_backend_skip[@]}")
  mapfile -t racecheck_kernel_filter < <(exclusions "${racecheck_kernel_skip[@]}")
  echo "== sanitizers: left out (ctest -L cuda runs them, unsanitized):"
  for name in "${memcheck_backend_skip[@]}"; do
    echo "   memcheck $(basename "$backend_tests"): $name"
  done
  for name in "${racecheck_kernel_skip[@]}"; do
    echo "   racecheck $(basename "$kernel_tests"): $name"
  done
  echo "   racecheck $(basename "$backend_tests"): all but" \
       "\"cuda fp32 matches the cpu backend on the fixtures: whole prompt\""
  for run in $sanitizer_runs; do
    case "$run" in
      memcheck-kernel) run_sanitizer memcheck "$kernel_tests" ;;
      memcheck-backend) run_sanitizer memcheck "$backend_tests" "${memcheck_backend_filter[@]}" ;;
      racecheck-kernel) run_sanitizer racecheck "$kernel_tests" "${racecheck_kernel_filter[@]}" ;;
      racecheck-backend)
        run_sanitizer racecheck "$backend_tests" \
          "cuda fp32 matches the cpu backend on the fixtures: whole prompt" ;;
    esac
  done
  if ((${#sanitizer_failures[@]} > 0)); then
    printf 'gpu_bench: sanitizer run failed: %s\n' "${sanitizer_failures[@]}" >&2
    exit 1
  fi
fi

# Issue 10: the window attention kernel of one decode token of the 128M
# config alone (12 heads of 64, window 512, bf16; cudaEvent medians of 200
# launches, rings rotated past the L2): the row kernel (the default) against
# the split decode kernel (kernels/window_split_decode.cu, not yet verified
# on a GPU before this run; docs/cuda.md "Split decode"), then 8 rows.
if [[ -z "${SKIP_WINDOW_BENCH:-}" ]]; then
  echo "== drt-window-bench (window attention of decode steps: row vs split kernel)"
  # First run of unverified code: a failure or a hang must not cost the table.
  for rows in 1 8; do
    timeout 120 "$build/tools/drt-window-bench" --n "$rows" --heads 12 --kv_heads 12 \
      --head_dim 64 --window 512 --runs 200 || echo "gpu_bench: drt-window-bench --n $rows failed (exit $?)" >&2
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
  mapfile -t args < <("$python" - "$config" <<'PY'
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
  "$python" weights_tools/make_random_model.py --out "$model" --dtype bf16 \
    --tokenizer tests/fixtures/gpt2-tokenizer/tokenizer.json "${args[@]}"
fi

# Runs drt-bench once; prints its bench_result line with the peak GPU memory
# of the process (sampled with nvidia-smi) appended.
run_bench() {
  local out
  out=$(mktemp)
  "$build/bench/drt-bench" --model "$model" --device cuda --random_prompt \
    --generate "$generate" --window_decode_splits "${WINDOW_DECODE_SPLITS:-0}" \
    --prefill_tensor_cores="${PREFILL_TENSOR_CORES:-false}" \
    --decode_graphs="${DECODE_GRAPHS:-false}" \
    --decode_fused_gemv="${DECODE_FUSED_GEMV:-false}" "$@" >"$out" 2>/dev/null &
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

# Issue 10, item 4: the same GCA runs with the host chunk store of encoder
# rows (--cuda_chunk_store=encoder_rows, off by default; docs/cuda.md "Chunk
# store of C"): host bytes and H2D bytes should halve; the prefill and decode
# columns show what the fetch GEMMs cost.
if [[ -z "${SKIP_ENCODER_ROWS:-}" ]]; then
  echo
  echo "== drt-bench --cuda_chunk_store=encoder_rows (the same contexts; kv figures above)"
  printf '%-10s %14s %10s %14s %12s %14s\n' context prefill_tok/s decode_ms session_host_MiB \
    h2d_B/token host_vs_kv
  i=0
  for ctx in $contexts; do
    rows_run=$(run_bench --prompt_tokens "$ctx" --cuda_chunk_store encoder_rows)
    IFS='|' read -r _ _ _ _ _ kv_host _ _ <<<"${rows[$i]}"
    host=$(field session_host_bytes "$rows_run")
    printf '%-10s %14.0f %10.3f %14.0f %12.0f %14.3f\n' "$ctx" \
      "$(field prefill_tokens_per_s "$rows_run")" "$(field decode_ms_median "$rows_run")" \
      "$(awk -v b="$host" 'BEGIN{print b/1048576}')" "$(field h2d_bytes_per_token "$rows_run")" \
      "$(awk -v a="$host" -v b="$kv_host" 'BEGIN{print (b > 0) ? a/b : 0}')"
    i=$((i + 1))
  done
fi

# Issue 10, deliver 5: the paper's Table 3 layout. Time per token and GPU
# memory of DRT as ratios to the base LM (--disable_gca, the sliding-window
# model without retrieval) at 16K and 48K tokens. "With CPU offload" is the
# chunk store in pinned host memory (--chunk_tier host, the default);
# "without offload" keeps it on the device (--chunk_tier device, docs/cuda.md
# "Device tier": NOT YET RUN ON A GPU, hence off by default; these rows are
# its first measurement, and decide the default).
if [[ -z "${SKIP_TABLE3:-}" ]]; then
  echo
  echo "== Table 3 layout: DRT / base LM, with CPU offload (--chunk_tier host) and without" \
       "(--chunk_tier device)"
  printf '%-10s %-16s %16s %16s %16s %16s %14s\n' context offload time_ratio memory_ratio \
    decode_ms gpu_MiB prefill_tok_s
  for ctx in ${TABLE3_CONTEXTS:-16384 49152}; do
    base=$(run_bench --prompt_tokens "$ctx" --disable_gca)
    d_base=$(field decode_ms_median "$base"); m_base=$(field gpu_peak_mib "$base")
    for tier in host "${TABLE3_NO_OFFLOAD:-device}"; do
      gca=$(run_bench --prompt_tokens "$ctx" --chunk_tier "$tier")
      d_gca=$(field decode_ms_median "$gca"); m_gca=$(field gpu_peak_mib "$gca")
      # The tier the session got (auto may fall back to the host): a
      # "without" row measured on the host tier is labelled so.
      used=$(field chunk_tier_used "$gca")
      label=with; [[ "$tier" != host ]] && label="without($tier:$used)"
      if [[ "$tier" != host && "$used" != device ]]; then
        echo "warning: --chunk_tier $tier at $ctx tokens ran on the $used tier" >&2
      fi
      printf '%-10s %-16s %16.3f %16.3f %16s %16s %14s\n' "$ctx" "$label" \
        "$(awk -v a="$d_gca" -v b="$d_base" 'BEGIN{print (b > 0) ? a/b : 0}')" \
        "$(awk -v a="$m_gca" -v b="$m_base" 'BEGIN{print (b > 0) ? a/b : 0}')" \
        "$d_gca / $d_base" "$m_gca / $m_base" "$(field prefill_tokens_per_s "$gca")"
    done
  done
fi

# Issue 10, deliver 5: beside the table, the peer a user would otherwise
# pick, a full-attention Transformer of the same size (12 layers, d 768, the
# 128M config without encoder and GCA) decoding from a KV cache with PyTorch's
# scaled-dot-product attention on the written rows, no mask, FlashAttention
# asked for (bench/full_attention_peer.py; PEER_ATTENTION=masked_graph for the
# earlier masked step in a CUDA graph; it prints "does not fit" where its KV
# cache outgrows the GPU, and its bandwidth floor). Needs a python3 with torch
# and CUDA: on the lent GPU machines, the image's.
if [[ -z "${SKIP_PEER:-}" ]]; then
  echo
  echo "== full-attention peer (bench/full_attention_peer.py)"
  if command -v python3 >/dev/null 2>&1 && python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    python3 bench/full_attention_peer.py --dtype fp32 --layers 2 --hidden 256 --heads 4 \
      --intermediate 512 --vocab 1000 --contexts 1024 --tokens 4 --self_check 64 | grep '^# self check'
    python3 bench/full_attention_peer.py --contexts "${PEER_CONTEXTS:-16384,131072,1048576,2097152,4194304}" \
      --attention "${PEER_ATTENTION:-sliced}" \
      | grep -v '^json '
  else
    echo "gpu_bench: no python3 with CUDA torch on PATH; the peer was not measured" >&2
  fi
fi

# Issue 11: aggregate decode tokens/s of N sessions stepped together
# (engine/batch_step.h; on CUDA slice by slice, docs/cuda.md "Steps of
# several sessions") against the same N stepped one at a time, same model.
if [[ -z "${SKIP_STEP_BENCH:-}" ]]; then
  echo
  echo "== drt-step-bench (aggregate decode, N sessions in one engine step)"
  "$build/tools/drt-step-bench" --model "$model" --device cuda \
    --sessions "${STEP_SESSIONS:-1,4,16,32,64}" --prompt_tokens "${STEP_PROMPT:-4096}" \
    --generate "$generate" --repeats 3 --decode_graphs="${DECODE_GRAPHS:-false}" \
    --decode_fused_gemv="${DECODE_FUSED_GEMV:-false}"
  # The same with the step's rows in one op (CudaBackendOptions::
  # batched_step_rows, off by default until this and its tests have run on a
  # GPU; docs/cuda.md "Batched steps"): one GEMM for the decode rows of all N.
  echo
  echo "== drt-step-bench --batched_step_rows"
  "$build/tools/drt-step-bench" --model "$model" --device cuda --batched_step_rows \
    --sessions "${STEP_SESSIONS:-1,4,16,32,64}" --prompt_tokens "${STEP_PROMPT:-4096}" \
    --generate "$generate" --repeats 3 --sequential=false \
    --decode_fused_gemv="${DECODE_FUSED_GEMV:-false}"
fi

if [[ -z "${SKIP_BATCH:-}" ]]; then
  echo
  echo "== drt-batch-bench: drt-server --device cuda, model: 128M config (random bf16 weights)"
  BUILD_DIR="$build" MODEL="$model" DEVICE=cuda bash scripts/batch_bench.sh \
    --sessions "${BATCH_SESSIONS:-1,4,16,32,64}" --prompt_tokens 4000 --generate 256 \
    --load_sessions 8 --append_tokens 1000000 --repeats 3 --json "$build/batch_bench_cuda.json"
  echo "gpu_bench: drt-batch-bench results also in $build/batch_bench_cuda.json"
fi

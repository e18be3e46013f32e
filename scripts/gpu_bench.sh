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
#
# A step that fails is reported and the script goes on to the next one; it
# exits 1 at the end if any failed (the list is printed last, and written to
# GPU_BENCH_SUMMARY). scripts/gpu_stage.sh runs it in <= 10-minute stages.
#   bash scripts/gpu_bench.sh                      everything
#   DRY_RUN=1 bash scripts/gpu_bench.sh            no GPU needed, nothing measured: prints
#                                                  every command it would run and checks
#                                                  it: the executables exist, every flag
#                                                  is one of the tool's (--help), the
#                                                  tools accept the values (run with them
#                                                  where no GPU is visible, they must stop
#                                                  only for want of a device), each ctest
#                                                  selection and Catch test spec matches
#                                                  tests and each left-out case names one.
#                                                  Uses the existing build ($BUILD_DIR);
#                                                  MODEL=dir for the tool checks instead of
#                                                  making the 128M model (tests/
#                                                  gpu_bench_dry_run_test.sh runs this)
#   SKIP_STEP_BENCH=1 bash scripts/gpu_bench.sh    without drt-step-bench
#   CONTEXTS="16384 131072" bash scripts/gpu_bench.sh   fewer contexts
#   SKIP_TESTS=1 bash scripts/gpu_bench.sh         the table only
#   SKIP_TABLE=1 bash scripts/gpu_bench.sh         the tests and sanitizers only
#   SKIP_MAIN_TABLE=1 bash scripts/gpu_bench.sh    without the drt-bench table over CONTEXTS
#                                                  (the sections after it still run)
#   SKIP_CTEST=1 bash scripts/gpu_bench.sh         without ctest -L cuda and its figures
#   CTEST_JOBS=4 bash scripts/gpu_bench.sh         ctest -L cuda runs 4 tests at once (1 by
#                                                  default); CTEST_TIMEOUT=480 stops it after
#                                                  480 s (0: no limit, the default) and lists
#                                                  the tests that did not run;
#                                                  CTEST_REGEX=... only those tests (ctest -R);
#                                                  the cases labelled cuda_alone (they fill
#                                                  the device) run afterwards one at a time,
#                                                  CTEST_ALONE_TIMEOUT=120 their limit
#   SKIP_DURABLE=1 bash scripts/gpu_bench.sh       without ctest -R "^cuda durable" (drt-server
#                                                  --device cuda --state_dir; needs
#                                                  drt_server_tests in the build)
#   SANITIZER_RUNS="memcheck-backend racecheck-kernel" bash scripts/gpu_bench.sh
#                                                  only these sanitizer runs (of memcheck-kernel,
#                                                  memcheck-backend, memcheck-backend-new,
#                                                  memcheck-backend-state (the state and
#                                                  disk-tier cases), racecheck-kernel,
#                                                  racecheck-kernel-new, racecheck-backend,
#                                                  initcheck-backend-new (reads of device
#                                                  memory never written, in the decode-graph
#                                                  and device-tier cases); all by default,
#                                                  none when set but empty; "-new": the
#                                                  decode-graph, device-tier, batched-step,
#                                                  chunk-store, tensor-core, split-decode and
#                                                  fused-GEMV cases, which the plain runs
#                                                  leave out; no run takes an [allocation]
#                                                  case)
#   STREAM_DELAY_RUNS="fetch compute" bash scripts/gpu_bench.sh
#                                                  only these stream-delay runs (of store,
#                                                  fetch, step, compute; all by default, none
#                                                  when set but empty): the bit-identity cases
#                                                  of the backend tests (device tier, chunk
#                                                  store, batched steps, decode graphs, state,
#                                                  disk tier; the step run only the batched
#                                                  steps) with that stream held back
#                                                  STREAM_DELAY_NS (1000000) before each piece
#                                                  of its work (DRT_TEST_CUDA_STREAM_DELAY,
#                                                  CudaStreamDelay): a missing cross-stream
#                                                  wait then fails them every time. The runs at
#                                                  once, each into LOG_DIR/stream-delay-RUN.log,
#                                                  each stopped at STREAM_DELAY_TIMEOUT (300 s)
#   SANITIZER_TIMEOUT=900 bash scripts/gpu_bench.sh  each sanitizer run's time limit
#                                                  (seconds; 480 by default)
#   SANITIZER_PARALLEL=1 bash scripts/gpu_bench.sh   the sanitizer runs at once, each into
#                                                  its own log in LOG_DIR (one limit for all)
#   LOG_DIR=dir                                    where the ctest log, the tests' warnings
#                                                  and the sanitizer logs are kept (a
#                                                  temporary folder by default)
#   GPU_BENCH_SUMMARY=file                         also append one line per step to file:
#                                                  PASS, FAIL, STOPPED (a time limit) or SKIP
#   BENCH_RESULTS=file                             also append every drt-bench bench_result
#                                                  line to file, labelled with its arguments
#   SKIP_BATCH=1 bash scripts/gpu_bench.sh         without the drt-batch-bench step
#                                                  (BATCH_REPEATS: its --repeats, 3)
#   SKIP_ENCODER_ROWS=1 bash scripts/gpu_bench.sh  without the table's rerun with
#                                                  --cuda_chunk_store=encoder_rows
#   CHUNK_STORE=encoder_rows bash scripts/gpu_bench.sh   the main table (its GCA runs) with
#                                                  --cuda_chunk_store encoder_rows (kv by
#                                                  default); Table 3 keeps kv, which its
#                                                  device tier needs
#   SKIP_TABLE3=1 bash scripts/gpu_bench.sh        without the Table 3 layout (ratios to the base
#                                                  LM at TABLE3_CONTEXTS, 16384 49152 by default,
#                                                  with and without offload: --chunk_tier host,
#                                                  device; TABLE3_NO_OFFLOAD=auto sizes the
#                                                  device store exactly instead of by doubling)
#   SKIP_PEER=1 bash scripts/gpu_bench.sh          without the full-attention peer
#                                                  (bench/full_attention_peer.py, PyTorch)
#   BATCH_SESSIONS=1,32 bash scripts/gpu_bench.sh  other session counts for it
#   PREBUILT=1 bash scripts/gpu_bench.sh           use build-gpu and .devlibs made by
#                                                  scripts/device_bundle.sh (no apt, no build);
#                                                  DEVLIBS=dir: the .deb files elsewhere
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
#   STEP_SESSIONS, STEP_PROMPT, STEP_REPEATS       drt-step-bench's --sessions (1,4,16,32,64),
#                                                  --prompt_tokens (4096), --repeats (3)
set -euo pipefail
cd "$(dirname "$0")/.."

dry=${DRY_RUN:-}
summary=${GPU_BENCH_SUMMARY:-}
sanitizer_timeout=${SANITIZER_TIMEOUT:-480}
all_sanitizer_runs="memcheck-kernel memcheck-backend memcheck-backend-new memcheck-backend-state
                    racecheck-kernel racecheck-kernel-new racecheck-backend initcheck-backend-new"
# Set but empty: no sanitizer run.
sanitizer_runs=${SANITIZER_RUNS-$all_sanitizer_runs}
all_stream_delay_runs="store fetch step compute"
# Set but empty: no stream-delay run.
stream_delay_runs=${STREAM_DELAY_RUNS-$all_stream_delay_runs}
stream_delay_ns=${STREAM_DELAY_NS:-1000000}
stream_delay_timeout=${STREAM_DELAY_TIMEOUT:-300}
ctest_jobs=${CTEST_JOBS:-1}
ctest_timeout=${CTEST_TIMEOUT:-0}
ctest_alone_timeout=${CTEST_ALONE_TIMEOUT:-0}
chunk_store=${CHUNK_STORE:-kv}
for setting in "SANITIZER_TIMEOUT=$sanitizer_timeout" "CTEST_JOBS=$ctest_jobs" \
               "STREAM_DELAY_NS=$stream_delay_ns" "STREAM_DELAY_TIMEOUT=$stream_delay_timeout"; do
  if [[ ! "${setting#*=}" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_bench: $setting: expected a positive whole number" >&2
    exit 2
  fi
done
for setting in "CTEST_TIMEOUT=$ctest_timeout" "CTEST_ALONE_TIMEOUT=$ctest_alone_timeout"; do
  if [[ ! "${setting#*=}" =~ ^[0-9]+$ ]]; then
    echo "gpu_bench: $setting: expected a whole number of seconds (0: none)" >&2
    exit 2
  fi
done
if [[ "$chunk_store" != kv && "$chunk_store" != encoder_rows ]]; then
  echo "gpu_bench: CHUNK_STORE=$chunk_store: expected kv or encoder_rows" >&2
  exit 2
fi
for run in $sanitizer_runs; do
  case " $(echo $all_sanitizer_runs) " in
    *" $run "*) ;;
    *)
      echo "gpu_bench: SANITIZER_RUNS: unknown run '$run' (expected one of:" \
           "$(echo $all_sanitizer_runs))" >&2
      exit 2
      ;;
  esac
done

for run in $stream_delay_runs; do
  case " $all_stream_delay_runs " in
    *" $run "*) ;;
    *)
      echo "gpu_bench: STREAM_DELAY_RUNS: unknown run '$run' (expected one of:" \
           "$all_stream_delay_runs)" >&2
      exit 2
      ;;
  esac
done
# The backend's own limit (kMaxCudaStreamDelayNs, engine/cuda/cuda_options.h).
if ((stream_delay_ns > 100000000)); then
  echo "gpu_bench: STREAM_DELAY_NS=$stream_delay_ns: at most 100000000 (0.1 s)" >&2
  exit 2
fi

log_dir=${LOG_DIR:-$(mktemp -d -t gpu_bench.XXXXXX)}
mkdir -p "$log_dir"
# DRY_RUN keeps what it learnt of each executable (its --help, the argument
# sets it ran) here; scripts/gpu_stage.sh shares one over its stages.
dry_cache=${DRY_RUN_CACHE:-$log_dir}
mkdir -p "$dry_cache"

# --- Reporting: every step ends in one line (echoed, and appended to
# GPU_BENCH_SUMMARY); failures are collected in a file (steps run in
# command substitutions report too), and the script goes on.
# (not in LOG_DIR, which scripts/gpu_stage.sh points at the device's $OUT
# where only 8 files come back)
failures_file=$(mktemp -t gpu_bench_failures.XXXXXX)
trap 'rm -f "$failures_file"' EXIT
report() {  # report STATUS STEP [DETAIL]: STATUS is PASS, FAIL, STOPPED or SKIP
  local line="$1 $2${3:+: $3}"
  echo "gpu_bench: $line"
  [[ -n "$summary" ]] && echo "$line" >>"$summary"
  [[ "$1" == FAIL || "$1" == STOPPED ]] && echo "$line" >>"$failures_file"
  return 0
}
finish() {
  if [[ -s "$failures_file" ]]; then
    echo "gpu_bench: $(grep -c . "$failures_file") step(s) failed or stopped:" >&2
    sed 's/^/  /' "$failures_file" >&2
    exit 1
  fi
  echo "gpu_bench: every step passed"
  exit 0
}

gpu_visible=
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu_visible=1
fi
if [[ -n "$dry" ]]; then
  echo "gpu_bench: DRY_RUN: printing and checking every command; nothing is measured"
elif [[ -z "$gpu_visible" ]]; then
  echo "gpu_bench: no NVIDIA GPU found (nvidia-smi missing or lists no GPU); this script" \
       "needs one (DRY_RUN=1 checks it without one). Nothing was run." >&2
  exit 2
fi
nvcc=/usr/local/cuda/bin/nvcc
if [[ -z "$dry" && ! -x "$nvcc" ]] && ! command -v nvcc >/dev/null 2>&1; then
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
# drt-bench times the first token apart; its decode figures need a second.
if ! [[ "$generate" =~ ^[0-9]+$ ]] || (( generate < 2 )); then
  echo "gpu_bench: GENERATE must be a whole number of at least 2, got '$generate'" >&2
  exit 2
fi

if [[ -n "$dry" ]]; then
  # The existing build is checked, never rebuilt.
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    echo "gpu_bench: DRY_RUN: no build in $build (BUILD_DIR); build it first" >&2
    exit 2
  fi
  if [[ -n "${PREBUILT:-}" ]]; then
    devlibs=${DEVLIBS:-.devlibs}
    if compgen -G "$devlibs/*.deb" >/dev/null; then
      echo "gpu_bench: DRY_RUN: would unpack $(ls "$devlibs"/*.deb | wc -l) packages of $devlibs"
    else
      report FAIL "devlibs" "no .deb files in $devlibs (scripts/device_bundle.sh downloads them)"
    fi
  fi
elif [[ -n "${PREBUILT:-}" ]]; then
  # A lent GPU machine that cannot install packages: scripts/device_bundle.sh
  # built $build on a Debian machine and downloaded the runtime libraries
  # into .devlibs; unpack them beside, not over, the system's.
  devlibs=${DEVLIBS:-.devlibs}
  if [[ -d "$devlibs" ]]; then
    mkdir -p /tmp/drt-devlibs
    for deb in "$devlibs"/*.deb; do dpkg-deb -x "$deb" /tmp/drt-devlibs; done
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

# --- DRY_RUN checks.
# check_tool STEP EXE ARGS...: prints the command; fails STEP when EXE is
# missing, an --option is not one of EXE's flags (its --help), or, where no
# GPU is visible, EXE run with ARGS stops for anything but the missing device
# (absl rejects bad values before the tools look for a GPU; `accept=REGEX
# check_tool ...` names another expected stop).
no_device='no usable CUDA device|this build has no CUDA backend|CUDA device [0-9]+ requested|no CUDA-capable device|CUDA driver version is insufficient|cudaGetDevice'
check_tool() {
  local step=$1 exe=$2
  shift 2
  echo "dry run: $exe $*"
  if [[ ! -x "$exe" ]]; then
    report FAIL "$step" "$exe was not built"
    return 0
  fi
  local help arg name unknown=()
  # Each executable's --help once (a start of these binaries with their
  # CUDA code takes seconds on a loaded machine).
  local help_file="$dry_cache/help-$(basename "$exe").txt"
  [[ -s "$help_file" ]] || "$exe" --help >"$help_file" 2>&1 || true
  help=$(<"$help_file")
  for arg in "$@"; do
    [[ "$arg" == --* ]] || continue
    name=${arg#--}
    name=${name%%=*}
    grep -qF -- "--$name (" <<<"$help" || unknown+=("--$name")
  done
  if ((${#unknown[@]} > 0)); then
    report FAIL "$step" "$(basename "$exe") has no flag ${unknown[*]}"
    return 0
  fi
  # Run once per set of arguments apart from --prompt_tokens (an integer,
  # which absl checks like the rest).
  local key
  key=$(printf '%s\n' "$exe" "$@" | sed '/^--prompt_tokens$/,+1d' | md5sum | cut -c1-16)
  if [[ -z "$gpu_visible" && ! -e "$dry_cache/ran-$key" ]]; then
    touch "$dry_cache/ran-$key"
    local out rc=0
    out=$(timeout 120 "$exe" "$@" 2>&1) || rc=$?
    if ((rc != 0)) && ! grep -qE "${accept:-$no_device}" <<<"$out"; then
      report FAIL "$step" "$(basename "$exe") refused the arguments (exit $rc): $(tail -3 <<<"$out" | tr '\n' ' ')"
      return 0
    fi
  fi
  report PASS "$step" "dry run: $(basename "$exe") takes these arguments"
}
# check_catch_spec STEP EXE SPEC...: the Catch test specs select at least
# one case, and every "~name" leaves out a case that exists (a stale name
# would let a slow case back in).
check_catch_spec() {
  local step=$1 exe=$2
  shift 2
  echo "dry run: $exe $* --durations yes"
  # The executable and the specs, one a line, for tests/gpu_bench_dry_run_test.sh
  # to list what each run selects (the log line above cannot tell the
  # arguments apart).
  printf '%s\n' "$exe" "$@" >"$log_dir/catch-spec-${step// /_}.txt"
  if [[ ! -x "$exe" ]]; then
    report FAIL "$step" "$exe was not built"
    return 0
  fi
  local count spec missing=()
  count=$("$exe" "$@" --list-test-names-only 2>/dev/null | grep -c . || true)
  for spec in "$@"; do
    if [[ "$spec" == "~"* ]]; then
      local name=${spec#\~} key
      key=$(printf '%s\n' "$exe" "$name" | md5sum | cut -c1-16)
      if [[ ! -e "$dry_cache/spec-$key" ]]; then
        "$exe" "$name" --list-test-names-only 2>/dev/null | grep -c . >"$dry_cache/spec-$key" || true
      fi
      [[ "$(<"$dry_cache/spec-$key")" -ge 1 ]] || missing+=("$name")
    fi
  done
  if ((${#missing[@]} > 0)); then
    report FAIL "$step" "left-out case(s) not found: $(printf '"%s" ' "${missing[@]}")"
  elif ((count == 0)); then
    report FAIL "$step" "the spec selects no test case"
  else
    report PASS "$step" "dry run: selects $count test cases"
  fi
}
# either SPEC...: one Catch spec selecting any of the given specs (a name's
# commas escaped) but no case tagged [allocation] (they fill the device or
# fail allocations on purpose, and run alone in ctest -L cuda_alone; under
# memcheck each failed allocation is an API error). Catch v2 ANDs a
# "~[allocation]" argument into the last comma group only (review-cudaprep
# C1), so the exclusion goes into every group, before its tag or name
# ("name~[allocation]" would read the "~" as part of the name).
either() {
  local IFS=,
  local groups=()
  local spec
  for spec in "$@"; do
    if [[ "$spec" == "["* ]]; then groups+=("~[allocation]$spec")
    else groups+=("~[allocation]${spec//,/\\,}"); fi
  done
  echo "${groups[*]}"
}
# check_ctest STEP ARGS...: ctest ARGS selects tests; prints them.
check_ctest() {
  local step=$1
  shift
  echo "dry run: ctest --test-dir $build $*"
  local list count
  list=$(ctest --test-dir "$build" -N "$@" 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: //p')
  count=$(grep -c . <<<"$list" || true)
  sed 's/^/   /' <<<"$list"
  if ((count == 0)); then
    report FAIL "$step" "ctest $* selects no test in $build"
  else
    report PASS "$step" "dry run: ctest $* selects $count tests"
  fi
}

# Catch's console reporter wraps a WARN at 80 columns: "warning:" then the
# message indented by two spaces over several lines, then a blank line.
# Prints each warning of a ctest log on one line.
unwrap_warnings() {
  awk '/^warning:$/ {w = 1; msg = ""; next}
       w && /^  / {sub(/^  /, ""); msg = (msg == "" ? $0 : msg " " $0); next}
       w {print msg; w = 0}' "$1"
}

# The cases labelled cuda_alone (Catch tag [allocation]: they fill the
# device's memory or fail allocations on purpose; tests/cuda_backend/
# CMakeLists.txt) run after the others, one at a time: beside other GPU work
# they would fail it, or fail themselves.
if [[ -z "${SKIP_TESTS:-}" && -z "${SKIP_CTEST:-}" ]]; then
  echo "== ctest -L cuda -LE cuda_alone${CTEST_REGEX:+ -R $CTEST_REGEX} (-j $ctest_jobs), then -L cuda_alone (-j 1)"
  ctest_args=(-L cuda -LE cuda_alone)
  alone_args=(-L cuda_alone)
  [[ -n "${CTEST_REGEX:-}" ]] && ctest_args+=(-R "$CTEST_REGEX") && alone_args+=(-R "$CTEST_REGEX")
  if [[ -n "$dry" ]]; then
    check_ctest "ctest -L cuda" "${ctest_args[@]}"
    check_ctest "ctest -L cuda_alone" "${alone_args[@]}"
  else
    ctest_log="$log_dir/ctest_cuda.log"
    : >"$ctest_log"
    : >"$log_dir/LastTest_cuda.log"
    rm -f "$log_dir/ctest_not_finished.txt"
    # run_ctest_part NAME JOBS LIMIT ARGS...: one ctest run, its output
    # appended to ctest_cuda.log and its LastTest.log to LastTest_cuda.log.
    run_ctest_part() {
      local name=$1 jobs=$2 limit_s=$3
      shift 3
      local started=$SECONDS rc=0 limit=() part_log="$log_dir/ctest_part.log"
      ((limit_s > 0)) && limit=(timeout --kill-after=30 "$limit_s")
      "${limit[@]}" ctest --test-dir "$build" "$@" -j "$jobs" \
        --output-on-failure 2>&1 | tee "$part_log" || rc=$?
      local elapsed=$((SECONDS - started))
      cat "$part_log" >>"$ctest_log"
      cat "$build/Testing/Temporary/LastTest.log" >>"$log_dir/LastTest_cuda.log" 2>/dev/null || true
      if ((rc == 124 || rc == 137)); then
        # Which selected tests never finished: those with no result line.
        local ran not_run
        ran=$(sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \(.*[^ ]\) \.\.\..*/\1/p' "$part_log")
        not_run=$(ctest --test-dir "$build" -N "$@" | sed -n 's/^ *Test *#[0-9]*: //p' |
                  grep -vxF -f <(printf '%s\n' "$ran") || true)
        printf 'gpu_bench: %s: not finished before the %s s limit:\n%s\n' "$name" "$limit_s" "$not_run" |
          tee -a "$log_dir/ctest_not_finished.txt" >&2
        report STOPPED "$name" "stopped after ${limit_s} s; $(grep -c . <<<"$not_run") tests did not finish (ctest_not_finished.txt); $(grep -o '[0-9]*% tests passed.*' "$part_log" || true)"
      elif grep -q '(Skipped)\|Not Run' "$part_log"; then
        report FAIL "$name" "CUDA tests were skipped although a GPU is present"
      elif ((rc != 0)); then
        report FAIL "$name" "$(grep -o '[0-9]*% tests passed.*' "$part_log" || echo "exit $rc"), ${elapsed} s"
      else
        report PASS "$name" "$(grep -o '[0-9]*% tests passed.*' "$part_log"), ${elapsed} s"
      fi
      rm -f "$part_log"
    }
    run_ctest_part "ctest -L cuda" "$ctest_jobs" "$ctest_timeout" "${ctest_args[@]}"
    run_ctest_part "ctest -L cuda_alone" 1 "$ctest_alone_timeout" "${alone_args[@]}"
    # The precision figures (passing tests WARN them; ctest shows only the
    # output of failures, its LastTest.log all of it): fp32 CUDA vs CPU
    # (limit 1e-4, identical retrievals), bf16 CUDA vs the float64 goldens
    # (limits: the bf16 reference's figures, docs/cuda.md), sessions batched
    # vs alone (issue 11, limit 1e-4), a state moved CUDA fp32 <-> CPU
    # (limit 1e-4), and whatever else the CUDA tests WARN.
    unwrap_warnings "$log_dir/LastTest_cuda.log" | grep -v 'no CUDA device' |
      sort | uniq -c | sort -k2 >"$log_dir/cuda_test_warnings.txt" || true
    echo "== what the CUDA tests warned (count, message; also in" \
         "$log_dir/cuda_test_warnings.txt)"
    cat "$log_dir/cuda_test_warnings.txt"
  fi
fi

# drt-server --device cuda with --state_dir (tests/server/cuda_durable_test.cc):
# in drt_server_tests, which scripts/device_bundle.sh builds for this.
if [[ -z "${SKIP_TESTS:-}" && -z "${SKIP_DURABLE:-}" ]]; then
  echo "== ctest -R \"^cuda durable\""
  if [[ ! -x "$build/tests/drt_server_tests" ]]; then
    report SKIP "cuda durable" "$build/tests/drt_server_tests was not built"
  elif [[ -n "$dry" ]]; then
    check_ctest "cuda durable" -R "^cuda durable"
  else
    started=$SECONDS
    rc=0
    ctest --test-dir "$build" -R "^cuda durable" --output-on-failure 2>&1 |
      tee "$log_dir/ctest_durable.log" || rc=$?
    if grep -q '(Skipped)\|Not Run' "$log_dir/ctest_durable.log"; then
      report FAIL "cuda durable" "skipped although a GPU is present"
    elif ((rc != 0)); then
      report FAIL "cuda durable" "$(grep -o '[0-9]*% tests passed.*' "$log_dir/ctest_durable.log" || echo "exit $rc")"
    else
      report PASS "cuda durable" "$(grep -o '[0-9]*% tests passed.*' "$log_dir/ctest_durable.log"), $((SECONDS - started)) s"
    fi
  fi
fi

if [[ -z "${SKIP_TESTS:-}" && -n "$sanitizer_runs" ]]; then
  kernel_tests="$build/tests/cuda/drt_cuda_kernel_tests"
  backend_tests="$build/tests/cuda_backend/drt_cuda_backend_tests"
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
  # The cases written since that run and never sanitized (decode graphs, the
  # device tier, batched steps, the chunk store of encoder rows, tensor-core
  # prefill, split decode, fused GEMVs, state export and import, the disk
  # tier) are runs of their own ("-new"), so
  # that a limit reached in the older cases does not leave them out; the
  # plain runs leave them out.
  # Each run has a time limit (SANITIZER_TIMEOUT, seconds; 480 fits one run
  # into a 10-minute device command): a run that does not finish in it is
  # stopped and reported instead of using up the lease. SANITIZER_RUNS picks
  # runs (checked at the top), so that they can be spread over commands;
  # SANITIZER_PARALLEL=1 runs them at once.
  # (The stream-delay case of every path: ten backends with their own
  # delays; it checks queued delays and the CPU's logits, which a sanitizer
  # adds nothing to, and its paths are sanitized in the other cases.)
  memcheck_backend_skip=("cuda: prefill, pieces and token-by-token decode agree"
                         "cuda fp32 matches the cpu backend on the fixtures: token-by-token decode"
                         "cuda stream delay: on every path each delayed stream queues and counts its delays and keeps the cpu backend's logits")
  racecheck_kernel_skip=("cuda landmark top-k: 2^20 landmarks"
                         "cuda landmark top-k: 2^20 landmarks at d = 768"
                         "cuda sampling: the CPU sampler's rule at GPT-2's vocabulary (50257)")
  # The "-new" cases: Catch specs, each one argument ("," inside one is "or").
  # The fixture case of the encoder-row store has never run on a GPU either;
  # in memcheck-backend it came after the fixture cases, where the limit was
  # reached on 2026-11-23 (review-cuda F4), so it is here too.
  backend_new=("[decode_graphs]" "[device_tier]" "[batch_step]" "[chunk_store]" "[decode_fused_gemv]"
               "cuda: the tensor-core prefill kernels agree with decode"
               "cuda: the split window decode kernel decodes like the cpu backend"
               "cuda fp32 with the chunk store of encoder rows matches the cpu backend on the fixtures: uneven pieces")
  # The state and disk-tier cases (never sanitized) in a run of their own:
  # Catch runs cases in the order they are registered, not in the spec's,
  # and in memcheck-backend-new they came last, behind 26 cases, where a
  # limit reached would leave them out again (review-cudaprep C4).
  backend_state=("cuda state: *" "cuda disk tier: *")
  kernel_new=("cuda decode gemv: *" "cuda window attention: tensor-core prefill tiles"
              "cuda GCA: tensor-core prefill tiles" "cuda window attention: split decode*"
              "cuda window attention: decode_splits values" "cuda device position: *")
  racecheck_backend_case="cuda fp32 matches the cpu backend on the fixtures: whole prompt"
  # initcheck (review-cuda F5): a slot, staging or ring row read before any
  # write; the decode graphs and the device tier have the most such
  # buffers. (Init's module-loading launch read an unwritten row before the
  # fix that zeroes it.)
  initcheck_backend=("[decode_graphs]" "[device_tier]")
  # Catch test specs that leave the named cases out: "~name", one argument
  # each (Catch ANDs its arguments), a comma escaped (unescaped it would
  # split the name into two specs).
  exclusions() {
    local name
    for name in "$@"; do printf '~%s\n' "${name//,/\\,}"; done
  }
  mapfile -t memcheck_backend_filter < <(exclusions "${memcheck_backend_skip[@]}")
  for spec in "${backend_new[@]}" "${backend_state[@]}"; do memcheck_backend_filter+=("~$spec"); done
  # The [allocation] cases fail CUDA allocations on purpose (and fill the
  # device): memcheck reports each failed API call as an error (its default
  # --report-api-errors explicit), which would fail the run with no memory
  # error; ctest -L cuda_alone checks them unsanitized. Left out of every
  # run: here one more "~" of this one-group spec, in the others by either()
  # (the "-new" spec [device_tier] would take two).
  memcheck_backend_filter+=("~[allocation]")
  mapfile -t racecheck_kernel_filter < <(exclusions "${racecheck_kernel_skip[@]}")
  for spec in "${kernel_new[@]}"; do racecheck_kernel_filter+=("~$spec"); done
  backend_new_spec=$(either "${backend_new[@]}")
  backend_state_spec=$(either "${backend_state[@]}")
  initcheck_backend_spec=$(either "${initcheck_backend[@]}")
  kernel_new_spec=$(either "${kernel_new[@]}")
  # run_args RUN: prints the tool, the executable and its Catch specs, one a line.
  run_args() {
    case "$1" in
      memcheck-kernel) printf '%s\n' memcheck "$kernel_tests" ;;
      memcheck-backend) printf '%s\n' memcheck "$backend_tests" "${memcheck_backend_filter[@]}" ;;
      memcheck-backend-new) printf '%s\n' memcheck "$backend_tests" "$backend_new_spec" ;;
      memcheck-backend-state) printf '%s\n' memcheck "$backend_tests" "$backend_state_spec" ;;
      racecheck-kernel) printf '%s\n' racecheck "$kernel_tests" "${racecheck_kernel_filter[@]}" ;;
      racecheck-kernel-new) printf '%s\n' racecheck "$kernel_tests" "$kernel_new_spec" ;;
      racecheck-backend) printf '%s\n' racecheck "$backend_tests" "$racecheck_backend_case" ;;
      initcheck-backend-new) printf '%s\n' initcheck "$backend_tests" "$initcheck_backend_spec" ;;
    esac
  }
  echo "== sanitizers: left out (ctest -L cuda runs them, unsanitized):"
  for name in "${memcheck_backend_skip[@]}"; do
    echo "   memcheck $(basename "$backend_tests"): $name"
  done
  for name in "${racecheck_kernel_skip[@]}"; do
    echo "   racecheck $(basename "$kernel_tests"): $name"
  done
  echo "   racecheck $(basename "$backend_tests"): all but \"$racecheck_backend_case\""
  echo "   memcheck $(basename "$backend_tests"): the [allocation] cases (they fail allocations on purpose)"
  if [[ -z "$dry" && ! -x "$sanitizer" ]]; then
    report FAIL "sanitizers" "compute-sanitizer not found at $sanitizer"
  else
    # sanitizer_command RUN: the command line of one run.
    sanitizer_command() {
      local args
      mapfile -t args < <(run_args "$1")
      local options=(--tool "${args[0]}" --error-exitcode 1)
      [[ "${args[0]}" == memcheck ]] && options+=(--leak-check full)
      printf '%s\n' timeout --kill-after=30 "$sanitizer_timeout" "$sanitizer" "${options[@]}" \
        "${args[@]:1}" --durations yes
    }
    # sanitizer_result RUN RC LOG: one report line; the cases that finished
    # are those with a Catch duration line ("<seconds> s: <name>").
    sanitizer_result() {
      local run=$1 rc=$2 log=$3 done_cases
      done_cases=$(grep -cE '^[0-9]+\.[0-9]+ s: ' "$log" || true)
      if ((rc == 124 || rc == 137)); then
        report STOPPED "sanitizer $run" "did not finish in $sanitizer_timeout s; $done_cases cases finished first ($(basename "$log"))"
      elif ((rc != 0)); then
        report FAIL "sanitizer $run" "exit status $rc, $done_cases cases finished; $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" || true) ($(basename "$log"))"
      else
        report PASS "sanitizer $run" "$done_cases cases; $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" || true)"
      fi
    }
    pids=()
    runs=()
    for run in $sanitizer_runs; do
      mapfile -t command < <(sanitizer_command "$run")
      if [[ -n "$dry" ]]; then
        mapfile -t args < <(run_args "$run")
        check_catch_spec "sanitizer $run" "${args[1]}" "${args[@]:2}"
        echo "   (under: ${command[*]:0:8})"
        continue
      fi
      log="$log_dir/sanitizer-$run.log"
      echo "== compute-sanitizer $run (time limit $sanitizer_timeout s; log $log)"
      if [[ -n "${SANITIZER_PARALLEL:-}" ]]; then
        "${command[@]}" >"$log" 2>&1 &
        pids+=($!)
        runs+=("$run")
      else
        rc=0
        "${command[@]}" 2>&1 | tee "$log" || rc=$?
        sanitizer_result "$run" "$rc" "$log"
      fi
    done
    for i in "${!pids[@]}"; do
      rc=0
      wait "${pids[$i]}" || rc=$?
      log="$log_dir/sanitizer-${runs[$i]}.log"
      echo "== compute-sanitizer ${runs[$i]}: the end of its log"
      tail -n 25 "$log"
      sanitizer_result "${runs[$i]}" "$rc" "$log"
    done
  fi
fi

# review-cuda F1: a missing cudaStreamWaitEvent between a session's compute,
# store and fetch streams or the batched step's stream is a race on global
# memory, which neither memcheck nor racecheck reports, and the bit-identity
# tests compare two runs with the same timing. Each run holds one stream
# back (a spin kernel of STREAM_DELAY_NS before each piece of its work, the
# test-only CudaStreamDelay set through DRT_TEST_CUDA_STREAM_DELAY): a
# consumer on another stream without its wait then reads stale data, and a
# producer without its wait overwrites data not yet read, every time.
if [[ -z "${SKIP_TESTS:-}" && -n "$stream_delay_runs" ]]; then
  backend_tests="$build/tests/cuda_backend/drt_cuda_backend_tests"
  # stream_delay_args RUN: the Catch spec of the run (either(): without the
  # [allocation] cases, which fill the device and run alone in ctest -L
  # cuda_alone).
  stream_delay_args() {
    if [[ "$1" == step ]]; then
      # Only a batched step has a step stream.
      either "[batch_step]" "cuda state: the end write and Fork on a handler thread beside engine steps"
    else
      # With two cases checked against the CPU backend (review-cudaprep C6:
      # the others compare two CUDA runs, which a missing wait on a path
      # both take gives the same stale data): the slice-by-slice path with
      # either chunk store, in uneven pieces.
      either "[device_tier]" "[chunk_store]" "[batch_step]" "[decode_graphs]" "cuda state: *" \
        "cuda disk tier: *" "cuda fp32 matches the cpu backend on the fixtures: uneven pieces" \
        "cuda fp32 with the chunk store of encoder rows matches the cpu backend on the fixtures: uneven pieces"
    fi
  }
  # stream_delay_result RUN RC LOG: one report line. review-cudaprep C3 b: a
  # run in which no delay was queued (the variable not reaching the
  # backends, no site reached) would pass undelayed; the test executable
  # prints "stream_delays=N (STREAM:NS) case: NAME" after each case
  # (tests/cuda_backend/stream_delay_report.cc), and a run whose N add up to
  # 0 fails. The cases with N = 0 are named: a refusal case queues none, a
  # case that runs sessions and queues none was not delayed. A run stopped
  # at its time limit (STOPPED is likely for the store, fetch and compute
  # runs) is judged by the cases it finished: a check that failed before
  # the stop fails it (review-cudacheck2 F1); if cases finished and they
  # report no line or no delay, it FAILs as a finished run would
  # (review-cudacheck F3); with none finished it stays STOPPED.
  #
  # review-cudacheck2 F2: the cases finished are the stream_delays lines
  # (one per case, printed at its end), not the "N.N s: " duration lines:
  # Catch prints one of those at the end of every section and of every
  # GENERATE run of a case, the case's own name included. An executable
  # built without the report prints no stream_delays line; a stopped run
  # shows that when its duration lines name two of its listed cases, as
  # Catch ends one case before it starts the next.
  stream_delay_result() {
    local run=$1 rc=$2 log=$3 reported finished delays undelayed note specs listed seen
    finished=$(sed -n 's/^stream_delays=[0-9]* ([^)]*) case: //p' "$log")
    reported=$(grep -c . <<<"$finished" || true)
    delays=$(sed -n 's/^stream_delays=\([0-9]*\) .*/\1/p' "$log" | awk '{s += $1} END {print s + 0}')
    undelayed=$(sed -n 's/^stream_delays=0 ([^)]*) case: //p' "$log")
    note="$delays delays queued over $reported cases"
    if [[ -n "$undelayed" ]]; then
      note+="; none in $(grep -c . <<<"$undelayed"): $(paste -sd';' <<<"$undelayed" | sed 's/;/; /g')"
    fi
    # In a stopped run's messages: which cases finished.
    local stop_note="$reported cases finished${finished:+: $(paste -sd';' <<<"$finished" | sed 's/;/; /g')}; $note"
    if ((rc == 124 || rc == 137)) && grep -q ': FAILED:$' "$log"; then
      # review-cudacheck2 F1: a check that failed before the stop is what
      # these runs look for; the log's tail rarely shows it.
      report FAIL "stream delay $run" "stopped after $stream_delay_timeout s; a check failed before the stop: $(grep -m1 ': FAILED:$' "$log"); $stop_note ($(basename "$log"))"
      return 0
    fi
    seen=0
    if ((rc == 124 || rc == 137)) && ((reported == 0)); then
      mapfile -t specs < <(stream_delay_args "$run")
      listed=$("$backend_tests" "${specs[@]}" --list-test-names-only 2>/dev/null || true)
      seen=$(sed -n 's/^[0-9][0-9]*\.[0-9][0-9]* s: //p' "$log" | grep -xF -- "$listed" | sort -u | grep -c . || true)
    fi
    if ((rc == 124 || rc == 137)) && ((seen >= 2)); then
      report FAIL "stream delay $run" "stopped after $stream_delay_timeout s; its log shows $seen of its cases run, all but the last finished, and no stream_delays line: the test executable does not report the delays it queued (built before tests/cuda_backend/stream_delay_report.cc?) ($(basename "$log"))"
    elif ((rc == 124 || rc == 137)) && ((reported > 0 && delays == 0)); then
      report FAIL "stream delay $run" "stopped after $stream_delay_timeout s; no delay was queued in any of the $reported cases it finished: the run ran undelayed and checked nothing; $stop_note ($(basename "$log"))"
    elif ((rc == 124 || rc == 137)); then
      report STOPPED "stream delay $run" "did not finish in $stream_delay_timeout s; $stop_note ($(basename "$log"))"
    elif grep -q 'no CUDA device' "$log"; then
      report FAIL "stream delay $run" "the cases skipped although a GPU is present ($(basename "$log"))"
    elif ((rc != 0)); then
      report FAIL "stream delay $run" "exit $rc, $reported cases finished; $(grep -m1 -E '^test cases:' "$log" || true); $note ($(basename "$log"))"
    elif ((reported == 0)); then
      report FAIL "stream delay $run" "no stream_delays line: the test executable does not report the delays it queued (built before tests/cuda_backend/stream_delay_report.cc?) ($(basename "$log"))"
    elif ((delays == 0)); then
      report FAIL "stream delay $run" "no delay was queued in any of its $reported cases: the run ran undelayed and checked nothing ($(basename "$log"))"
    else
      report PASS "stream delay $run" "$reported cases; $(grep -m1 -E '^test cases:' "$log" || true); $note"
    fi
  }
  echo "== stream-delay runs: $stream_delay_runs (each stream held back $stream_delay_ns ns per piece of work)"
  delay_pids=()
  delay_runs=()
  for run in $stream_delay_runs; do
    mapfile -t specs < <(stream_delay_args "$run")
    if [[ -n "$dry" ]]; then
      check_catch_spec "stream delay $run" "$backend_tests" "${specs[@]}"
      continue
    fi
    log="$log_dir/stream-delay-$run.log"
    echo "== stream delay $run (time limit $stream_delay_timeout s; log $log)"
    DRT_TEST_CUDA_STREAM_DELAY="$run:$stream_delay_ns" \
      timeout --kill-after=30 "$stream_delay_timeout" "$backend_tests" "${specs[@]}" \
      --durations yes >"$log" 2>&1 &
    delay_pids+=($!)
    delay_runs+=("$run")
  done
  for i in "${!delay_pids[@]}"; do
    rc=0
    wait "${delay_pids[$i]}" || rc=$?
    run=${delay_runs[$i]}
    log="$log_dir/stream-delay-$run.log"
    echo "== stream delay $run: the end of its log"
    tail -n 15 "$log"
    stream_delay_result "$run" "$rc" "$log"
  done
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
    window_args=(--n "$rows" --heads 12 --kv_heads 12 --head_dim 64 --window 512 --runs 200)
    if [[ -n "$dry" ]]; then
      check_tool "drt-window-bench --n $rows" "$build/tools/drt-window-bench" "${window_args[@]}"
    else
      rc=0
      timeout 120 "$build/tools/drt-window-bench" "${window_args[@]}" || rc=$?
      if ((rc == 0)); then report PASS "drt-window-bench --n $rows"
      else report FAIL "drt-window-bench --n $rows" "exit $rc"; fi
    fi
  done
fi

if [[ -n "${SKIP_TABLE:-}" ]]; then
  echo "gpu_bench: SKIP_TABLE set; tests and sanitizers done"
  finish
fi

# The paper's 128M configuration (tests/fixtures/reference_configs holds a
# copy of ../shared/reference/drt-config_63.json), random weights in bf16.
model=${MODEL:-"$build/models/drt-128m-random-bf16"}
if [[ -n "$dry" || ! -f "$model/model.safetensors" ]]; then
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
  made="$build/models/drt-128m-random-bf16"
  [[ -z "$dry" && -n "${MODEL:-}" ]] && made=$MODEL
  make_model=("$python" weights_tools/make_random_model.py --out "$made" --dtype bf16
              --tokenizer tests/fixtures/gpt2-tokenizer/tokenizer.json "${args[@]}")
  if [[ -n "$dry" ]]; then
    echo "dry run: ${make_model[*]}"
    if ((${#args[@]} != 30)); then
      report FAIL "model" "the config gave ${#args[@]} arguments, expected 15 pairs"
    elif ! "$python" -c 'import numpy' 2>/dev/null; then
      report FAIL "model" "$python has no numpy"
    else
      report PASS "model" "dry run: would make $made"
    fi
    # The tools below need some model to load: MODEL, else the bundled one.
    model=${MODEL:-models/drt-text-byte}
    [[ -f "$model/model.safetensors" ]] || model=models/drt-text-byte
  elif ! "${make_model[@]}"; then
    report FAIL "model" "weights_tools/make_random_model.py failed; nothing below can run"
    finish
  fi
fi

bench_results=${BENCH_RESULTS:-}
# Runs drt-bench once; prints its bench_result line with the peak GPU memory
# of the process (sampled with nvidia-smi) appended. A failure is reported
# (FAIL "drt-bench ARGS") and prints nothing.
run_bench() {
  local bench_args=(--model "$model" --device cuda --random_prompt
    --generate "$generate" --window_decode_splits "${WINDOW_DECODE_SPLITS:-0}"
    --prefill_tensor_cores="${PREFILL_TENSOR_CORES:-false}"
    --decode_graphs="${DECODE_GRAPHS:-false}"
    --decode_fused_gemv="${DECODE_FUSED_GEMV:-false}" "$@")
  if [[ -n "$dry" ]]; then
    check_tool "drt-bench $*" "$build/bench/drt-bench" "${bench_args[@]}" >&2
    return 0
  fi
  # A time limit of its own (first runs of unverified kernels: a hang must
  # not use up the stage): BENCH_TIMEOUT seconds, else 60 s plus 1 s per 16K
  # tokens of prompt (prefill runs at >= 70K tokens/s on the H100 in
  # docs/cuda.md, so 4M tokens take about 60 s of the 316 s).
  local ctx=0 i
  for ((i = 1; i <= $#; i++)); do
    [[ "${!i}" == --prompt_tokens ]] && { local j=$((i + 1)); ctx=${!j}; }
  done
  local limit_s=${BENCH_TIMEOUT:-$((60 + ctx / 16384))}
  local out
  out=$(mktemp)
  "$build/bench/drt-bench" "${bench_args[@]}" >"$out" 2>&1 &
  # peak stays empty until nvidia-smi lists the process: in a container (PID
  # namespace) or a run shorter than the poll it never does, and the tables
  # then show n/a rather than a measured-looking 0 (review-toolsfix #1).
  local pid=$! peak= used stopped= end=$((SECONDS + limit_s))
  while kill -0 "$pid" 2>/dev/null; do
    used=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits \
             2>/dev/null | awk -F', ' -v p="$pid" '$1 == p {print $2}')
    [[ -n "$used" && "$used" -gt "${peak:-0}" ]] && peak=$used
    if ((SECONDS >= end)); then
      stopped=1
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.5
  done
  local rc=0
  wait "$pid" || rc=$?
  if [[ -n "$stopped" ]]; then
    echo "gpu_bench: drt-bench $* stopped at its ${limit_s} s limit:" >&2
    tail -n 20 "$out" >&2
    report STOPPED "drt-bench $*" "stopped at its ${limit_s} s limit (BENCH_TIMEOUT)" >&2
    rm -f "$out"
    return 0
  fi
  if ((rc != 0)) || ! grep -q '^bench_result ' "$out"; then
    echo "gpu_bench: drt-bench $* failed (exit $rc):" >&2
    tail -n 20 "$out" >&2
    report FAIL "drt-bench $*" "exit $rc" >&2
    rm -f "$out"
    return 0
  fi
  local line
  line=$(grep '^bench_result ' "$out")
  [[ -n "$peak" ]] && line+=" gpu_peak_mib=$peak"
  [[ -n "$bench_results" ]] && echo "drt-bench $*: $line" >>"$bench_results"
  echo "$line"
  rm -f "$out"
}

field() {  # field NAME LINE
  tr ' ' '\n' <<<"$2" | awk -F= -v k="$1" '$1 == k {print $2}'
}
# Table cells: a figure printed with a printf FORMAT, or n/a where a run gave
# none (its FAIL or STOPPED line above says why); a missing figure printed as
# 0 read like a measurement (review-tools #11).
isnum() { [[ "$1" =~ ^-?[0-9.e+-]+$ ]]; }
cell() { if isnum "$2"; then printf "$1" "$2"; else echo n/a; fi; }  # cell FORMAT FIGURE
ratio_cell() {  # ratio_cell FORMAT A B: A / B, n/a unless both are figures and B > 0
  if isnum "$2" && isnum "$3"; then
    awk -v a="$2" -v b="$3" -v f="$1" 'BEGIN{ if (b > 0) printf f, a / b; else print "n/a" }'
  else
    echo n/a
  fi
}
mib_cell() { if isnum "$1"; then awk -v b="$1" 'BEGIN{printf "%.0f", b / 1048576}'; else echo n/a; fi; }

if [[ -z "${SKIP_MAIN_TABLE:-}" ]]; then
  rows=()
  floor=
  for ctx in $contexts; do
    echo "== context $ctx tokens" >&2
    gca=$(run_bench --prompt_tokens "$ctx" --cuda_chunk_store "$chunk_store")
    base=$(run_bench --prompt_tokens "$ctx" --disable_gca)
    [[ -n "$gca" ]] && floor=$(field weight_read_floor_ms "$gca")
    rows+=("$ctx|$(field prefill_tokens_per_s "$gca")|$(field decode_ms_median "$gca")|$(field decode_ms_median "$base")|$(field gpu_peak_mib "$gca")|$(field session_host_bytes "$gca")|$(field peak_rss_bytes "$gca")|$(field h2d_bytes_per_token "$gca")")
  done

  if [[ -z "$dry" ]]; then
    echo
    echo "drt-bench, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), model: 128M config" \
         "(random bf16 weights), $generate generated tokens per context, greedy;" \
         "window_decode_splits=${WINDOW_DECODE_SPLITS:-0} prefill_tensor_cores=${PREFILL_TENSOR_CORES:-false}" \
         "decode_graphs=${DECODE_GRAPHS:-false} decode_fused_gemv=${DECODE_FUSED_GEMV:-false}" \
         "cuda_chunk_store=$chunk_store"
    echo "weight-read floor (bf16 weights / measured device copy bandwidth): ${floor:-?} ms per token"
    printf '%-10s %14s %10s %10s %10s %16s %10s %14s %14s %12s\n' context prefill_tok/s decode_ms \
      x_floor x_no_gca decode_ms_no_gca gpu_MiB session_host_MiB peak_rss_MiB h2d_B/token
    for row in "${rows[@]}"; do
      IFS='|' read -r ctx prefill decode base gpu host rss h2d <<<"$row"
      printf '%-10s %14s %10s %10s %10s %16s %10s %14s %14s %12s\n' "$ctx" \
        "$(cell %.0f "$prefill")" "$(cell %.3f "$decode")" "$(ratio_cell %.2f "$decode" "$floor")" \
        "$(ratio_cell %.2f "$decode" "$base")" "$(cell %.3f "$base")" "$(cell %s "$gpu")" \
        "$(mib_cell "$host")" "$(mib_cell "$rss")" "$(cell %.0f "$h2d")"
    done
  fi
fi

# Issue 10, item 4: the same GCA runs with the host chunk store of encoder
# rows (--cuda_chunk_store=encoder_rows, off by default; docs/cuda.md "Chunk
# store of C"): host bytes and H2D bytes should halve; the prefill and decode
# columns show what the fetch GEMMs cost.
if [[ -z "${SKIP_ENCODER_ROWS:-}" ]]; then
  echo
  echo "== drt-bench --cuda_chunk_store=encoder_rows (the same contexts; kv figures above)"
  [[ -z "$dry" ]] && printf '%-10s %14s %10s %14s %12s %14s\n' context prefill_tok/s decode_ms \
    session_host_MiB h2d_B/token host_vs_kv
  i=0
  for ctx in $contexts; do
    rows_run=$(run_bench --prompt_tokens "$ctx" --cuda_chunk_store encoder_rows)
    kv_host=
    if [[ -z "${SKIP_MAIN_TABLE:-}" && "$chunk_store" == kv ]]; then
      IFS='|' read -r _ _ _ _ _ kv_host _ _ <<<"${rows[$i]}"
    fi
    host=$(field session_host_bytes "$rows_run")
    [[ -z "$dry" ]] && printf '%-10s %14s %10s %14s %12s %14s\n' "$ctx" \
      "$(cell %.0f "$(field prefill_tokens_per_s "$rows_run")")" \
      "$(cell %.3f "$(field decode_ms_median "$rows_run")")" "$(mib_cell "$host")" \
      "$(cell %.0f "$(field h2d_bytes_per_token "$rows_run")")" "$(ratio_cell %.3f "$host" "$kv_host")"
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
  [[ -z "$dry" ]] && printf '%-10s %-16s %16s %16s %16s %16s %14s\n' context offload time_ratio \
    memory_ratio decode_ms gpu_MiB prefill_tok_s
  for ctx in ${TABLE3_CONTEXTS:-16384 49152}; do
    base=$(run_bench --prompt_tokens "$ctx" --disable_gca)
    d_base=$(cell %s "$(field decode_ms_median "$base")"); m_base=$(cell %s "$(field gpu_peak_mib "$base")")
    for tier in host "${TABLE3_NO_OFFLOAD:-device}"; do
      gca=$(run_bench --prompt_tokens "$ctx" --chunk_tier "$tier")
      [[ -n "$dry" ]] && continue
      d_gca=$(cell %s "$(field decode_ms_median "$gca")"); m_gca=$(cell %s "$(field gpu_peak_mib "$gca")")
      # The tier the session got (auto may fall back to the host): a
      # "without" row measured on the host tier is labelled so.
      used=$(field chunk_tier_used "$gca")
      label=with; [[ "$tier" != host ]] && label="without($tier:$used)"
      if [[ "$tier" != host && "$used" != device ]]; then
        echo "warning: --chunk_tier $tier at $ctx tokens ran on the $used tier" >&2
      fi
      printf '%-10s %-16s %16s %16s %16s %16s %14s\n' "$ctx" "$label" \
        "$(ratio_cell %.3f "$d_gca" "$d_base")" "$(ratio_cell %.3f "$m_gca" "$m_base")" \
        "$d_gca / $d_base" "$m_gca / $m_base" "$(cell %s "$(field prefill_tokens_per_s "$gca")")"
    done
  done
fi

# Issue 10, deliver 5: beside the table, the peer a user would otherwise
# pick, a full-attention Transformer of the same size (12 layers, d 768, the
# 128M config without encoder and GCA) decoding from a KV cache with PyTorch's
# scaled-dot-product attention (bench/full_attention_peer.py). By default
# (PEER_ATTENTION=both) each context is timed two ways, the written rows with
# no mask and FlashAttention asked for (eager), and the masked static cache in
# a CUDA graph, and the faster is marked as the peer; PEER_ATTENTION=sliced or
# masked_graph times one. It prints "does not fit" where its KV cache
# outgrows the GPU, and its bandwidth floor. The self check covers the same
# attention (PEER_ATTENTION). Needs a python3 with torch and CUDA: on the lent
# GPU machines, the image's.
if [[ -z "${SKIP_PEER:-}" ]]; then
  echo
  echo "== full-attention peer (bench/full_attention_peer.py)"
  self_check=(--dtype fp32 --layers 2 --hidden 256 --heads 4 --intermediate 512 --vocab 1000
              --contexts 1024 --tokens 4 --self_check 64 --attention "${PEER_ATTENTION:-both}")
  peer=(--contexts "${PEER_CONTEXTS:-16384,131072,1048576,2097152,4194304}"
        --attention "${PEER_ATTENTION:-both}")
  if [[ -n "$dry" ]]; then
    echo "dry run: python3 bench/full_attention_peer.py ${self_check[*]}"
    echo "dry run: python3 bench/full_attention_peer.py ${peer[*]}"
    # Its own CPU check where a torch is at hand (Debian's here): the same
    # self check, eager on the CPU.
    torch_python=
    for candidate in python3 /usr/bin/python3; do
      if "$candidate" -c 'import torch' >/dev/null 2>&1; then torch_python=$candidate; break; fi
    done
    if [[ -z "$torch_python" ]]; then
      report SKIP "peer" "dry run: no python3 with torch here to run its CPU self check"
    elif out=$("$torch_python" bench/full_attention_peer.py "${self_check[@]}" --device cpu \
                 --no_graph 2>&1) && grep -q '^# self check' <<<"$out"; then
      report PASS "peer" "dry run: the self check passes on the CPU ($(grep '^# self check' <<<"$out" | cut -c1-80))"
    else
      report FAIL "peer" "the CPU self check failed: $(tail -2 <<<"$out" | tr '\n' ' ')"
    fi
  elif command -v python3 >/dev/null 2>&1 && python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    rc=0
    python3 bench/full_attention_peer.py "${self_check[@]}" | grep '^# self check' || rc=$?
    python3 bench/full_attention_peer.py "${peer[@]}" | grep -v '^json ' || rc=$?
    if ((rc == 0)); then report PASS "peer"; else report FAIL "peer" "exit $rc"; fi
  else
    report FAIL "peer" "no python3 with CUDA torch on PATH; the peer was not measured"
  fi
fi

# Issue 11: aggregate decode tokens/s of N sessions stepped together
# (engine/batch_step.h; on CUDA slice by slice, docs/cuda.md "Steps of
# several sessions") against the same N stepped one at a time, same model.
if [[ -z "${SKIP_STEP_BENCH:-}" ]]; then
  step_common=(--model "$model" --device cuda --sessions "${STEP_SESSIONS:-1,4,16,32,64}"
               --prompt_tokens "${STEP_PROMPT:-4096}" --generate "$generate"
               --repeats "${STEP_REPEATS:-3}" --decode_fused_gemv="${DECODE_FUSED_GEMV:-false}")
  # Slice by slice, then the step's rows in one op (CudaBackendOptions::
  # batched_step_rows, off by default until this and its tests have run on a
  # GPU; docs/cuda.md "Batched steps"): one GEMM for the decode rows of all N.
  for variant in slices batched; do
    if [[ "$variant" == slices ]]; then
      step_args=("${step_common[@]}" --decode_graphs="${DECODE_GRAPHS:-false}")
      echo
      echo "== drt-step-bench (aggregate decode, N sessions in one engine step)"
    else
      step_args=("${step_common[@]}" --batched_step_rows --sequential=false)
      echo
      echo "== drt-step-bench --batched_step_rows"
    fi
    if [[ -n "$dry" ]]; then
      check_tool "drt-step-bench $variant" "$build/tools/drt-step-bench" "${step_args[@]}"
    else
      rc=0
      "$build/tools/drt-step-bench" "${step_args[@]}" || rc=$?
      if ((rc == 0)); then report PASS "drt-step-bench $variant"
      else report FAIL "drt-step-bench $variant" "exit $rc"; fi
    fi
  done
fi

if [[ -z "${SKIP_BATCH:-}" ]]; then
  echo
  echo "== drt-batch-bench: drt-server --device cuda, model: 128M config (random bf16 weights)"
  batch_args=(--sessions "${BATCH_SESSIONS:-1,4,16,32,64}" --prompt_tokens 4000 --generate 256
              --load_sessions 8 --append_tokens 1000000 --repeats "${BATCH_REPEATS:-3}"
              --json "$log_dir/batch_bench_cuda.json")
  if [[ -n "$dry" ]]; then
    # scripts/batch_bench.sh starts the server with these, then the bench.
    check_tool "drt-server (batch bench)" "$build/server/drt-server" --model "$model" \
      --device cuda --listen 127.0.0.1:0 --http_listen=
    # No server listens on port 1: the bench must get as far as connecting.
    accept='127\.0\.0\.1:1|connect|UNAVAILABLE|[Dd]eadline' check_tool "drt-batch-bench" \
      "$build/bench/drt-batch-bench" "${batch_args[@]}" --server 127.0.0.1:1 --connect_timeout 1
  else
    rc=0
    BUILD_DIR="$build" MODEL="$model" DEVICE=cuda bash scripts/batch_bench.sh "${batch_args[@]}" || rc=$?
    if ((rc == 0)); then
      report PASS "drt-batch-bench" "results also in $log_dir/batch_bench_cuda.json"
    else
      report FAIL "drt-batch-bench" "exit $rc"
    fi
  fi
fi

finish

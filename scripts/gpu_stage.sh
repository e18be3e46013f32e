#!/usr/bin/env bash
# The GPU checklist of scripts/gpu_bench.sh in stages that each fit one
# device command (at most 10 minutes; a fresh machine each time is fine:
# every stage unpacks what it needs). Run on the lent machine, carrying
# .gpucarry (scripts/device_bundle.sh, then scripts/device_carry.sh, here):
#   bash scripts/gpu_stage.sh N        stage N (1..6, below), on a GPU
#   DRY_RUN=1 bash scripts/gpu_stage.sh all   every stage's commands checked, no GPU
#                                              (BUILD_DIR=build: a normal build here)
# Each stage writes into $OUT (the device tool's folder; ./gpu-out without
# it) at most 8 files: stageN.log (everything printed), stageN-summary.txt
# (one line per step: PASS, FAIL, STOPPED at a time limit, SKIP; then the
# stage's result, device and time; written also when a step fails or the
# stage's own time guard stops it) and the step logs named below. A step
# that fails is reported and the stage goes on to the next; the exit status
# is 1 when any failed or was stopped.
# Stages (estimates on an H100 from docs/cuda.md's figures; docs/cuda.md
# "Next GPU session" has the device commands):
#   1  ctest -L cuda -LE cuda_alone (4 at once), then -L cuda_alone (the
#      cases that fill the device, one at a time), the tests' warned
#      figures, ctest -R "^cuda durable", drt-window-bench          ~6-8 min
#   2  compute-sanitizer: the seven runs at once, <= 450 s each     ~8.5 min
#   3  drt-bench decode/prefill A/B: a warm-up run (dropped), then A B B A
#      at 16K, 128K, 1M: A the defaults, B all the new options (decode
#      graphs, fused GEMVs, 8 window splits, tensor-core prefill, chunk
#      store of encoder rows); A and B once at 4M; then, while time is
#      left, each option alone at 16K                               ~6-9 min
#   4  drt-step-bench slice by slice and --batched_step_rows (issue 11),
#      Table 3 with the device tier (no offload), the full-attention peer
#                                                                   ~5-6 min
#   5  drt-batch-bench through drt-server --device cuda (1 and 32
#      sessions, one repeat)                                        ~3-5 min
#   6  the bit-identity backend cases with each of the store, fetch,
#      step and compute streams held back (test-only stream delay,
#      review-cuda F1), the four runs at once, <= 300 s each (a run
#      whose cases queued no delay FAILs: gpu_bench.sh counts the
#      "stream_delays=N" lines the test executable prints); then
#      compute-sanitizer initcheck of the decode-graph and device-tier
#      cases in the time left (review-cuda F5; about 150 s when the
#      delay runs use their 300 s and kill-after)      at most ~9.5 min
#      (never run: the delay runs' time is not known; a delayed step
#      costs about sessions x its delayed pieces x STREAM_DELAY_NS)
# STAGE_BUDGET (seconds, 560 by default) is the stage's own guard; pass the
# device's budget_left_s - 60 when that is less (docs/cuda.md).
set -euo pipefail
cd "$(dirname "$0")/.."

stage=${1:-}
case "$stage" in
  1 | 2 | 3 | 4 | 5 | 6) ;;
  all)
    if [[ -z "${DRY_RUN:-}" ]]; then
      echo "gpu_stage: 'all' is for DRY_RUN=1 (on a GPU each stage is its own command)" >&2
      exit 2
    fi
    status=0
    cache=$(mktemp -d -t gpu_stage_dry.XXXXXX)
    for s in 1 2 3 4 5 6; do DRY_RUN_CACHE=$cache bash "$0" "$s" || status=1; done
    rm -rf "$cache"
    exit "$status"
    ;;
  *)
    echo "usage: bash scripts/gpu_stage.sh 1|2|3|4|5|6   (DRY_RUN=1 ... all: check every stage)" >&2
    exit 2
    ;;
esac

out=${OUT:-gpu-out}
mkdir -p "$out"
summary="$out/stage$stage-summary.txt"
: >"$summary"
work=$(mktemp -d -t gpu_stage.XXXXXX)
exec > >(tee "$out/stage$stage.log") 2>&1
tee_pid=$!
started=$SECONDS
# The stage's own guard: the device kills a command at its limit (600 s at
# most, less when less device time is left: pass STAGE_BUDGET from the
# device tool's status, budget_left_s - 60) and returns only what is under
# $OUT; stop the steps early enough to write the summary. The steps' inner
# limits (ctest, sanitizers) are derived from what is left of it.
budget=${STAGE_BUDGET:-560}
if [[ ! "$budget" =~ ^[0-9]+$ ]] || ((budget < 60)); then
  echo "gpu_stage: STAGE_BUDGET=$budget: expected whole seconds, at least 60" >&2
  exit 2
fi
left_s() { echo $((budget - (SECONDS - started))); }
min() { echo $(($1 < $2 ? $1 : $2)); }
# What was unpacked into the build folder (the carry's commit and archive
# checksum), so that a warm machine with an older build-gpu unpacks again.
carry_stamp() {
  echo "$(cat .gpucarry/commit 2>/dev/null || echo '?') $(sha256sum ".gpucarry/$1.tar.xz" | cut -c1-16)"
}
# cap_log FILE: a file over 8 MB keeps its first 1 MB (the first errors) and
# its last 7 MB, so that 7 sanitizer logs and the stage log stay under the
# 64 MiB that comes back (16 MiB a file).
cap_log() {
  local f=$1 size
  [[ -f "$f" ]] || return 0
  size=$(stat -c %s "$f")
  ((size > 8000000)) || return 0
  { head -c 1000000 "$f"
    printf '\n[... gpu_stage: %d bytes cut from the middle of this log ...]\n' $((size - 8000000))
    tail -c 7000000 "$f"; } >"$f.capped"
  mv "$f.capped" "$f"
}

finish_stage() {
  local rc=$?
  {
    if grep -qE '^(FAIL|STOPPED)' "$summary"; then
      echo "stage $stage: some steps FAILED or STOPPED (the lines above)"
    elif ((rc != 0)); then
      echo "stage $stage: exit $rc"
    else
      echo "stage $stage: every step passed"
    fi
    echo "elapsed $((SECONDS - started)) s of $budget; $(date -u +%FT%TZ); ran the build" \
         "unpacked from carry $(cat "${BUILD_DIR:-build-gpu}/.carry_stamp" 2>/dev/null || echo '(none: not from a carry)')," \
         "checkout $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || echo none)"
  } >>"$summary"
  echo "== stage $stage summary ($summary)"
  cat "$summary"
  rm -rf "$work"
  # Let tee write the log's end before the command returns (the device
  # ends what is left running); not longer than 5 s, in case a stopped
  # step left a child holding the pipe.
  exec >&- 2>&-
  for _ in $(seq 50); do kill -0 "$tee_pid" 2>/dev/null || break; sleep 0.1; done
  # The command's exit status says it too.
  if ((rc != 0)) || grep -qE '^(FAIL|STOPPED)' "$summary"; then exit 1; fi
}
trap finish_stage EXIT

# step NAME [VAR=value ...] -- COMMAND...: runs COMMAND with the variables
# under what is left of the stage's budget; its own report lines go to the
# summary (GPU_BENCH_SUMMARY); a failure or the guard adds a line, and the
# stage goes on.
step() {
  local name=$1
  shift
  local vars=()
  while [[ "$1" != -- ]]; do vars+=("$1"); shift; done
  shift
  local left
  left=$(left_s)
  if ((left < 20)); then
    echo "SKIP $name: the stage's $budget s were used up" >>"$summary"
    return 0
  fi
  echo
  echo "#### stage $stage: $name (at most $left s)"
  local rc=0
  run_limited "$left" env "${vars[@]}" GPU_BENCH_SUMMARY="$summary" "$@" || rc=$?
  if ((rc == 124 || rc == 137)); then
    echo "STOPPED $name: the stage's time guard ($budget s) stopped it" >>"$summary"
  elif ((rc != 0)); then
    echo "FAIL $name: exit $rc (the lines above say which step)" >>"$summary"
  fi
  return 0
}

# descendants PID: every process under PID (children first found, then
# theirs), read before any is killed.
descendants() {
  ps -e -o pid=,ppid= | awk -v root="$1" '
    {parent[$1] = $2; order[NR] = $1}
    END {
      want[root] = 1
      do {
        grew = 0
        for (i = 1; i <= NR; i++) {
          p = order[i]
          if (!(p in want) && (parent[p] in want)) {want[p] = 1; grew = 1; print p}
        }
      } while (grew)
    }'
}
# run_limited SECONDS COMMAND...: runs COMMAND; at SECONDS stops it and every
# process under it (TERM, then KILL 20 s later), also those an inner
# timeout put in a process group of its own (ctest, the sanitizers), so
# nothing of a stopped step holds the GPU or the log. Exit 124 when stopped.
run_limited() {
  local limit_s=$1
  shift
  "$@" &
  local pid=$! end=$((SECONDS + limit_s)) tree
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= end)); then
      tree=$(descendants "$pid")
      # shellcheck disable=SC2086  # pids, one a word
      kill -TERM "$pid" $tree 2>/dev/null || true
      for _ in $(seq 40); do
        local alive=
        for p in $pid $tree; do kill -0 "$p" 2>/dev/null && alive=1; done
        [[ -n "$alive" ]] || break
        sleep 0.5
      done
      # shellcheck disable=SC2086
      kill -KILL "$pid" $tree 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      return 124
    fi
    sleep 1
  done
  local rc=0
  wait "$pid" || rc=$?
  return "$rc"
}

dry=${DRY_RUN:-}
build=${BUILD_DIR:-build-gpu}
# Stages 1, 2 and 6 write their step logs straight into $OUT (what a
# command stopped by the device leaves there still comes back); the dry
# run's cache of --help texts stays out of it.
case "$stage" in
  1 | 2 | 6) log_dir=$out ;;
  *) log_dir=$work ;;
esac
common=(BUILD_DIR="$build" LOG_DIR="$log_dir" DRY_RUN_CACHE="${DRY_RUN_CACHE:-$work}")
if [[ -z "$dry" || -n "${PREBUILT:-}" ]]; then
  # A fresh machine: unpack the carried build (xz; python's lzma where
  # there is no xz) and point gpu_bench.sh at the carried packages.
  # (DRY_RUN=1 PREBUILT=1 in a copy of the checkout with .gpucarry checks
  # the carry itself.)
  # A warm machine keeps the last call's $build: unpack again when the carry
  # differs from what was unpacked (a build not unpacked from a carry, with
  # no stamp, is used as it is).
  stamp=
  [[ -f ".gpucarry/$build.tar.xz" ]] && stamp=$(carry_stamp "$build")
  if [[ -n "$stamp" && -f "$build/.carry_stamp" && "$(<"$build/.carry_stamp")" != "$stamp" ]]; then
    echo "gpu_stage: $build was unpacked from carry $(<"$build/.carry_stamp"), the carry is $stamp: unpacking again"
    rm -rf "$build"
  fi
  if [[ -f "$build/CMakeCache.txt" && ! -f "$build/.carry_stamp" ]]; then
    echo "gpu_stage: $build is not from a carry (no $build/.carry_stamp); using it as it is"
  fi
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    if [[ -z "$stamp" ]]; then
      echo "FAIL setup: no $build and no .gpucarry/$build.tar.xz (carry .gpucarry, made by" \
           "scripts/device_carry.sh)" >>"$summary"
      exit 1
    fi
    if command -v xz >/dev/null 2>&1; then
      tar -xJf ".gpucarry/$build.tar.xz"
    else
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(".")' \
        ".gpucarry/$build.tar.xz"
    fi
    echo "$stamp" >"$build/.carry_stamp"
  fi
  common+=(PREBUILT=1)
  if [[ -d .gpucarry/devlibs ]]; then common+=(DEVLIBS=.gpucarry/devlibs); fi
fi
if [[ -z "$dry" ]]; then
  nvidia-smi -L || true
else
  common+=(DRY_RUN=1 MODEL="${MODEL:-models/drt-text-byte}")
fi
echo "gpu_stage $stage: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), build $build"

# Every section of gpu_bench.sh off; a stage turns on what it runs.
none=(SKIP_CTEST=1 SKIP_DURABLE=1 SANITIZER_RUNS= STREAM_DELAY_RUNS= SKIP_WINDOW_BENCH=1
      SKIP_MAIN_TABLE=1 SKIP_ENCODER_ROWS=1 SKIP_TABLE3=1 SKIP_PEER=1 SKIP_STEP_BENCH=1
      SKIP_BATCH=1)
# keep VAR...: the "none" list without the named variables.
keep() {
  local v out=()
  for v in "${none[@]}"; do
    [[ " $* " == *" ${v%%=*} "* ]] || out+=("$v")
  done
  printf '%s\n' "${out[@]}"
}
options_b=(DECODE_GRAPHS=true DECODE_FUSED_GEMV=true WINDOW_DECODE_SPLITS=8
           PREFILL_TENSOR_CORES=true CHUNK_STORE=encoder_rows)

case "$stage" in
  1)
    mapfile -t env1 < <(keep SKIP_CTEST SKIP_DURABLE SKIP_WINDOW_BENCH)
    # ctest's limits from the time left: the cuda_alone cases (6, run one at
    # a time) get 90 s, and ~110 s stay for the cuda durable tests and
    # drt-window-bench after them (kill-afters included); at most 420 s.
    ctest_limit=$(min "${CTEST_TIMEOUT:-420}" $(($(left_s) - 230)))
    ((ctest_limit >= 30)) || ctest_limit=30
    step "ctest -L cuda, cuda durable, drt-window-bench" "${common[@]}" "${env1[@]}" \
      SKIP_TABLE=1 CTEST_JOBS="${CTEST_JOBS:-4}" CTEST_TIMEOUT="$ctest_limit" \
      CTEST_ALONE_TIMEOUT="${CTEST_ALONE_TIMEOUT:-90}" -- bash scripts/gpu_bench.sh
    cap_log "$out/LastTest_cuda.log"
    cap_log "$out/ctest_cuda.log"
    ;;
  2)
    # Each run's limit leaves 60 s of the time left for its 30 s kill-after,
    # the report and the capping; at most 450 s. (The [allocation] cases,
    # which fill the device, are in none of these runs: gpu_bench.sh's
    # either(); tests/gpu_bench_dry_run_test.sh lists each run's cases.)
    sanitizer_limit=$(min "${SANITIZER_TIMEOUT:-450}" $(($(left_s) - 60)))
    ((sanitizer_limit >= 10)) || sanitizer_limit=10
    step "compute-sanitizer, seven runs at once" "${common[@]}" "${none[@]}" \
      SANITIZER_RUNS="memcheck-kernel memcheck-backend memcheck-backend-new memcheck-backend-state racecheck-kernel racecheck-kernel-new racecheck-backend" \
      SANITIZER_PARALLEL=1 SANITIZER_TIMEOUT="$sanitizer_limit" SKIP_TABLE=1 -- \
      bash scripts/gpu_bench.sh
    for f in "$out"/sanitizer-*.log; do cap_log "$f"; done
    # Seven logs, the stage log and the summary are 9 files; 8 come back:
    # the two kernel runs' logs go into one (each capped at 8 MB above, so
    # at most 16 MB; the summary lines still name the logs they came from).
    kernel_logs=()
    for f in "$out"/sanitizer-memcheck-kernel.log "$out"/sanitizer-racecheck-kernel.log; do
      [[ -f "$f" ]] && kernel_logs+=("$f")
    done
    if ((${#kernel_logs[@]} > 0)); then
      for f in "${kernel_logs[@]}"; do
        echo "==== gpu_stage: $(basename "$f") ===="
        cat "$f"
      done >"$out/sanitizer-kernel.log"
      rm -f "${kernel_logs[@]}"
      echo "NOTE sanitizer-memcheck-kernel.log and sanitizer-racecheck-kernel.log are in sanitizer-kernel.log" >>"$summary"
    fi
    ;;
  3)
    mapfile -t env3 < <(keep SKIP_MAIN_TABLE)
    results="$out/stage3-bench_results.txt"
    : >"$results"
    # A warm-up run whose figures are dropped (clocks, driver, file cache
    # after the machine's start and the model's making), then A B B A at
    # each context set: a drift of the machine over the stage then favours
    # neither variant, and shows as the spread of a variant's two runs.
    step "drt-bench warm-up at 16K (figures dropped)" "${common[@]}" "${env3[@]}" \
      CONTEXTS=16384 BENCH_RESULTS= -- bash scripts/gpu_bench.sh
    for variant in A B B A; do
      if [[ "$variant" == A ]]; then
        step "drt-bench A (defaults)" "${common[@]}" "${env3[@]}" \
          CONTEXTS="16384 131072 1048576" BENCH_RESULTS="$results" -- bash scripts/gpu_bench.sh
      else
        step "drt-bench B (${options_b[*]})" "${common[@]}" "${env3[@]}" "${options_b[@]}" \
          CONTEXTS="16384 131072 1048576" BENCH_RESULTS="$results" -- bash scripts/gpu_bench.sh
      fi
    done
    # 4M once each (n = 1: no spread to read the ratio against).
    step "drt-bench A at 4M (n=1)" "${common[@]}" "${env3[@]}" CONTEXTS=4194304 \
      BENCH_RESULTS="$results" -- bash scripts/gpu_bench.sh
    step "drt-bench B at 4M (n=1)" "${common[@]}" "${env3[@]}" "${options_b[@]}" CONTEXTS=4194304 \
      BENCH_RESULTS="$results" -- bash scripts/gpu_bench.sh
    # Each option of B alone at 16K, where time is left (a run at 16K, with
    # its base-LM run and the model's load, took about 30 s: OPTION_RUN_S):
    # set beside A's two 16K runs above, they let the defaults be chosen
    # option by option, and name the option that fails where B fails.
    for option in "${options_b[@]}"; do
      if (($(left_s) < ${OPTION_RUN_S:-45})); then
        echo "SKIP drt-bench with $option alone at 16K: $(left_s) s left of the stage" >>"$summary"
        continue
      fi
      step "drt-bench with $option alone at 16K" "${common[@]}" "${env3[@]}" "$option" \
        CONTEXTS=16384 BENCH_RESULTS="$results" -- bash scripts/gpu_bench.sh
    done
    if [[ -z "$dry" ]]; then
      python3 scripts/bench_ab.py "$results" | tee "$out/stage3-bench_ab.txt" ||
        echo "FAIL bench_ab: scripts/bench_ab.py could not compare $results" >>"$summary"
    fi
    ;;
  4)
    mapfile -t env4 < <(keep SKIP_STEP_BENCH SKIP_TABLE3 SKIP_PEER)
    step "drt-step-bench off/on, Table 3, peer" "${common[@]}" "${env4[@]}" \
      BENCH_RESULTS="$out/stage4-bench_results.txt" -- bash scripts/gpu_bench.sh
    ;;
  5)
    mapfile -t env5 < <(keep SKIP_BATCH)
    step "drt-batch-bench" "${common[@]}" "${env5[@]}" BATCH_SESSIONS="${BATCH_SESSIONS:-1,32}" \
      BATCH_REPEATS="${BATCH_REPEATS:-1}" -- bash scripts/gpu_bench.sh
    if [[ -f "$work/batch_bench_cuda.json" ]]; then cp "$work/batch_bench_cuda.json" "$out/"; fi
    ;;
  6)
    mapfile -t env6 < <(keep STREAM_DELAY_RUNS)
    # The four runs at once (more load than one: a race the delay leaves
    # open is likelier still to lose); each stopped at 300 s or the
    # stage's time left less 150 s, so that initcheck gets the rest. Each
    # run's summary line gives the delays its cases queued and names the
    # cases that queued none; none at all is a FAIL (review-cudaprep C3 b).
    # Stage 1's "cuda stream delay: on every path ..." case checks the
    # counts per path and stream with its own delays.
    delay_limit=$(min "${STREAM_DELAY_TIMEOUT:-300}" $(($(left_s) - 150)))
    ((delay_limit >= 10)) || delay_limit=10
    step "stream delays: store, fetch, step, compute" "${common[@]}" "${env6[@]}" \
      STREAM_DELAY_RUNS="store fetch step compute" STREAM_DELAY_TIMEOUT="$delay_limit" \
      SKIP_TABLE=1 -- bash scripts/gpu_bench.sh
    for f in "$out"/stream-delay-*.log; do cap_log "$f"; done
    # initcheck in what is left (60 s kept for its kill-after and the
    # summary); a stopped run lists the cases that finished.
    initcheck_limit=$(($(left_s) - 60))
    if ((initcheck_limit >= 60)); then
      step "compute-sanitizer initcheck-backend-new" "${common[@]}" "${none[@]}" \
        SANITIZER_RUNS="initcheck-backend-new" SANITIZER_TIMEOUT="$initcheck_limit" SKIP_TABLE=1 -- \
        bash scripts/gpu_bench.sh
      cap_log "$out/sanitizer-initcheck-backend-new.log"
    else
      echo "SKIP compute-sanitizer initcheck-backend-new: $(left_s) s left of the stage" >>"$summary"
    fi
    ;;
esac

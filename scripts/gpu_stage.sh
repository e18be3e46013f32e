#!/usr/bin/env bash
# The GPU checklist of scripts/gpu_bench.sh in stages that each fit one
# device command (at most 10 minutes; a fresh machine each time is fine:
# every stage unpacks what it needs). Run on the lent machine, carrying
# .gpucarry (scripts/device_bundle.sh, then scripts/device_carry.sh, here):
#   bash scripts/gpu_stage.sh N        stage N (1..5, below), on a GPU
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
#   1  ctest -L cuda (4 at once), the tests' warned figures, ctest -R "^cuda
#      durable", drt-window-bench                                   ~6-8 min
#   2  compute-sanitizer: the six runs at once, 450 s each          ~8.5 min
#   3  drt-bench decode/prefill A/B, interleaved A B A B at 16K, 128K, 1M:
#      A the defaults, B all the new options (decode graphs, fused GEMVs,
#      8 window splits, tensor-core prefill, chunk store of encoder rows);
#      then A and B once at 4M                                      ~5-6 min
#   4  drt-step-bench slice by slice and --batched_step_rows (issue 11),
#      Table 3 with the device tier (no offload), the full-attention peer
#                                                                   ~5-6 min
#   5  drt-batch-bench through drt-server --device cuda (1 and 32
#      sessions, one repeat)                                        ~3-5 min
set -euo pipefail
cd "$(dirname "$0")/.."

stage=${1:-}
case "$stage" in
  1 | 2 | 3 | 4 | 5) ;;
  all)
    if [[ -z "${DRY_RUN:-}" ]]; then
      echo "gpu_stage: 'all' is for DRY_RUN=1 (on a GPU each stage is its own command)" >&2
      exit 2
    fi
    status=0
    cache=$(mktemp -d -t gpu_stage_dry.XXXXXX)
    for s in 1 2 3 4 5; do DRY_RUN_CACHE=$cache bash "$0" "$s" || status=1; done
    rm -rf "$cache"
    exit "$status"
    ;;
  *)
    echo "usage: bash scripts/gpu_stage.sh 1|2|3|4|5   (DRY_RUN=1 ... all: check every stage)" >&2
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
# most) and returns only what is under $OUT; stop the steps early enough to
# write the summary.
budget=${STAGE_BUDGET:-560}

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
    echo "elapsed $((SECONDS - started)) s; $(date -u +%FT%TZ); carry built at commit" \
         "$(cat .gpucarry/commit 2>/dev/null || echo '?'), checkout $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
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
  local left=$((budget - (SECONDS - started)))
  if ((left < 20)); then
    echo "SKIP $name: the stage's $budget s were used up" >>"$summary"
    return 0
  fi
  echo
  echo "#### stage $stage: $name (at most $left s)"
  local rc=0
  env "${vars[@]}" GPU_BENCH_SUMMARY="$summary" timeout --kill-after=20 "$left" "$@" || rc=$?
  if ((rc == 124 || rc == 137)); then
    echo "STOPPED $name: the stage's time guard ($budget s) stopped it" >>"$summary"
  elif ((rc != 0)); then
    echo "FAIL $name: exit $rc (the lines above say which step)" >>"$summary"
  fi
  return 0
}

dry=${DRY_RUN:-}
build=${BUILD_DIR:-build-gpu}
common=(BUILD_DIR="$build" LOG_DIR="$work")
if [[ -z "$dry" || -n "${PREBUILT:-}" ]]; then
  # A fresh machine: unpack the carried build (xz; python's lzma where
  # there is no xz) and point gpu_bench.sh at the carried packages.
  # (DRY_RUN=1 PREBUILT=1 in a copy of the checkout with .gpucarry checks
  # the carry itself.)
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    if [[ ! -f ".gpucarry/$build.tar.xz" ]]; then
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
none=(SKIP_CTEST=1 SKIP_DURABLE=1 SANITIZER_RUNS= SKIP_WINDOW_BENCH=1 SKIP_MAIN_TABLE=1
      SKIP_ENCODER_ROWS=1 SKIP_TABLE3=1 SKIP_PEER=1 SKIP_STEP_BENCH=1 SKIP_BATCH=1)
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
    step "ctest -L cuda, cuda durable, drt-window-bench" "${common[@]}" "${env1[@]}" \
      SKIP_TABLE=1 CTEST_JOBS="${CTEST_JOBS:-4}" CTEST_TIMEOUT="${CTEST_TIMEOUT:-420}" -- \
      bash scripts/gpu_bench.sh
    for f in LastTest_cuda.log cuda_test_warnings.txt ctest_not_finished.txt ctest_durable.log; do
      if [[ -f "$work/$f" ]]; then cp "$work/$f" "$out/"; fi
    done
    ;;
  2)
    step "compute-sanitizer, six runs at once" "${common[@]}" "${none[@]}" \
      SANITIZER_RUNS="memcheck-kernel memcheck-backend memcheck-backend-new racecheck-kernel racecheck-kernel-new racecheck-backend" \
      SANITIZER_PARALLEL=1 SANITIZER_TIMEOUT="${SANITIZER_TIMEOUT:-450}" SKIP_TABLE=1 -- \
      bash scripts/gpu_bench.sh
    for f in "$work"/sanitizer-*.log; do
      # At most 16 MiB a file comes back: keep the end of a longer log.
      if [[ -f "$f" ]]; then tail -c 15000000 "$f" >"$out/$(basename "$f")"; fi
    done
    ;;
  3)
    mapfile -t env3 < <(keep SKIP_MAIN_TABLE)
    results="$out/bench_results.txt"
    : >"$results"
    # A B A B at each context set, so that drift of the machine shows as the
    # spread between the two runs of one variant.
    for round in 1 2; do
      step "drt-bench A (defaults), round $round" "${common[@]}" "${env3[@]}" \
        CONTEXTS="16384 131072 1048576" BENCH_RESULTS="$results" -- bash scripts/gpu_bench.sh
      step "drt-bench B (${options_b[*]}), round $round" "${common[@]}" "${env3[@]}" \
        "${options_b[@]}" CONTEXTS="16384 131072 1048576" BENCH_RESULTS="$results" -- \
        bash scripts/gpu_bench.sh
    done
    step "drt-bench A at 4M" "${common[@]}" "${env3[@]}" CONTEXTS=4194304 \
      BENCH_RESULTS="$results" -- bash scripts/gpu_bench.sh
    step "drt-bench B at 4M" "${common[@]}" "${env3[@]}" "${options_b[@]}" CONTEXTS=4194304 \
      BENCH_RESULTS="$results" -- bash scripts/gpu_bench.sh
    # Where B failed: each option alone at 16K, to name the one that fails.
    if grep -q '^FAIL drt-bench' "$summary"; then
      for option in "${options_b[@]}"; do
        step "drt-bench with $option alone at 16K" "${common[@]}" "${env3[@]}" "$option" \
          CONTEXTS=16384 BENCH_RESULTS="$results" -- bash scripts/gpu_bench.sh
      done
    fi
    if [[ -z "$dry" ]]; then
      python3 scripts/bench_ab.py "$results" | tee "$out/bench_ab.txt" ||
        echo "FAIL bench_ab: scripts/bench_ab.py could not compare $results" >>"$summary"
    fi
    ;;
  4)
    mapfile -t env4 < <(keep SKIP_STEP_BENCH SKIP_TABLE3 SKIP_PEER)
    step "drt-step-bench off/on, Table 3, peer" "${common[@]}" "${env4[@]}" \
      BENCH_RESULTS="$out/bench_results.txt" -- bash scripts/gpu_bench.sh
    ;;
  5)
    mapfile -t env5 < <(keep SKIP_BATCH)
    step "drt-batch-bench" "${common[@]}" "${env5[@]}" BATCH_SESSIONS="${BATCH_SESSIONS:-1,32}" \
      BATCH_REPEATS="${BATCH_REPEATS:-1}" -- bash scripts/gpu_bench.sh
    if [[ -f "$work/batch_bench_cuda.json" ]]; then cp "$work/batch_bench_cuda.json" "$out/"; fi
    ;;
esac

#!/usr/bin/env bash
# ctest gpu_bench_stream_delay (label scripts): scripts/gpu_bench.sh fails a
# stream-delay run in which no delay was queued (review-cudaprep C3 b: such a
# run passed, undelayed). No GPU needed: the script runs its four
# stream-delay runs (everything else skipped) against stand-ins, on PATH,
# for nvidia-smi (one GPU) and nvcc, and a stand-in
# drt_cuda_backend_tests that prints what the real one prints after each
# case while DRT_TEST_CUDA_STREAM_DELAY is set
# (tests/cuda_backend/stream_delay_report.cc), run by run:
#   store:   two cases pass; 5 delays in the first, none in the second
#            -> PASS, 5 delays, the second case named as undelayed;
#   fetch:   two cases pass, neither queued a delay -> FAIL (ran undelayed);
#   step:    two cases pass, no stream_delays line (an executable built
#            before the report) -> FAIL;
#   compute: one case fails after 3 delays -> FAIL, exit 1, the delays kept.
# Then again with STANDIN_STOPPED=1, every run exiting 124 as `timeout`
# does at the time limit (review-cudacheck F3: a stopped run was STOPPED
# whatever its finished cases showed):
#   store:   two cases finished, neither queued a delay -> FAIL;
#   fetch:   one case finished with 2 delays -> STOPPED, the delays kept;
#   step:    the duration lines of two listed cases, no stream_delays
#            line -> FAIL;
#   compute: stopped before any case finished -> STOPPED.
# And with STANDIN_STOPPED=failed (review-cudacheck2 F1: a stop read
# STOPPED although a check had failed before it):
#   store:   one case finished with 4 delays, the next failed a check,
#            then the stop -> FAIL, naming the failed check;
#   fetch:   (review-cudacheck2 F2: finished cases were counted by
#            Catch's duration lines, one per section and GENERATE run)
#            one case of four duration lines, 3 delays -> STOPPED,
#            1 case finished, named;
#   step:    stopped in a case's second GENERATE run, a section's and the
#            case's duration lines, no stream_delays line -> STOPPED, 0
#            cases finished (it FAILed as an executable without the
#            report).
# Usage: tests/gpu_bench_stream_delay_test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/build/tests/cuda_backend"
touch "$tmp/build/CMakeCache.txt"
cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
[[ "$*" == -L ]] && echo "GPU 0: Stand-in GPU (UUID: GPU-0)"
exit 0
EOF
printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/nvcc"
cat >"$tmp/build/tests/cuda_backend/drt_cuda_backend_tests" <<'EOF'
#!/usr/bin/env bash
if [[ " $* " == *" --list-test-names-only "* ]]; then
  printf '%s\n' "cuda: case one" "cuda: case two" "cuda: a refusal"
  exit 0
fi
delay=${DRT_TEST_CUDA_STREAM_DELAY:?the stand-in expects DRT_TEST_CUDA_STREAM_DELAY}
if [[ "${STANDIN_STOPPED:-}" == failed ]]; then
  case "${delay%%:*}" in
    store)
      # Catch v2's console report of a failed check, then the stop.
      printf '%s\n' "stream_delays=4 ($delay) case: cuda: case one" "0.500 s: cuda: case one" \
        "-------------------------------------------------------------------------------" \
        "cuda: case two" "/src/tests/cuda_backend/standin_test.cc:10" \
        "..............................................................................." \
        "" "/src/tests/cuda_backend/standin_test.cc:12: FAILED:" "  CHECK( a == b )" \
        "with expansion:" "  1 == 2"
      ;;
    fetch)
      # A case of two GENERATE runs with a section each: four duration
      # lines, one case.
      printf '%s\n' "0.100 s: a section" "0.200 s: cuda: case one" "0.100 s: a section" \
        "0.200 s: cuda: case one" "stream_delays=3 ($delay) case: cuda: case one"
      ;;
    step)
      # Stopped in the second GENERATE run of the first case.
      printf '%s\n' "0.300 s: a section" "0.500 s: cuda: case one"
      ;;
  esac
  exit 124
elif [[ -n "${STANDIN_STOPPED:-}" ]]; then
  case "${delay%%:*}" in
    store)
      printf '%s\n' "stream_delays=0 ($delay) case: cuda: case one" "0.500 s: cuda: case one" \
        "stream_delays=0 ($delay) case: cuda: case two" "0.400 s: cuda: case two"
      ;;
    fetch)
      printf '%s\n' "stream_delays=2 ($delay) case: cuda: case one" "0.500 s: cuda: case one"
      ;;
    step)
      printf '%s\n' "0.500 s: cuda: case one" "0.400 s: cuda: case two"
      ;;
  esac
  exit 124
fi
case "${delay%%:*}" in
  store)
    printf '%s\n' "stream_delays=5 ($delay) case: cuda: case one" "0.500 s: cuda: case one" \
      "stream_delays=0 ($delay) case: cuda: a refusal" "0.010 s: cuda: a refusal" \
      "All tests passed (10 assertions in 2 test cases)"
    ;;
  fetch)
    printf '%s\n' "stream_delays=0 ($delay) case: cuda: case one" "0.500 s: cuda: case one" \
      "stream_delays=0 ($delay) case: cuda: case two" "0.400 s: cuda: case two" \
      "All tests passed (10 assertions in 2 test cases)"
    ;;
  step)
    printf '%s\n' "0.500 s: cuda: case one" "0.400 s: cuda: case two" \
      "All tests passed (10 assertions in 2 test cases)"
    ;;
  compute)
    printf '%s\n' "stream_delays=3 ($delay) case: cuda: case one" "0.500 s: cuda: case one" \
      "test cases: 1 | 1 failed"
    exit 1
    ;;
esac
EOF
chmod +x "$tmp/bin/nvidia-smi" "$tmp/bin/nvcc" "$tmp/build/tests/cuda_backend/drt_cuda_backend_tests"

# bench NAME [VAR=VALUE...]: scripts/gpu_bench.sh's four stream-delay runs
# against the stand-ins, the variables added to its environment; its exit
# status in $tmp/NAME.rc, its summary in $tmp/NAME.txt, its output in
# $tmp/NAME.log.
bench() {
  local name=$1 rc=0
  shift
  env "$@" PATH="$tmp/bin:$PATH" PREBUILT=1 DEVLIBS="$tmp/none" BUILD_DIR="$tmp/build" \
    LOG_DIR="$tmp/log-$name" GPU_BENCH_SUMMARY="$tmp/$name.txt" SKIP_CTEST=1 SKIP_DURABLE=1 \
    SANITIZER_RUNS= SKIP_WINDOW_BENCH=1 SKIP_TABLE=1 STREAM_DELAY_RUNS="store fetch step compute" \
    STREAM_DELAY_TIMEOUT=60 bash scripts/gpu_bench.sh >"$tmp/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$tmp/$name.rc"
}
bench finished
bench stopped STANDIN_STOPPED=1
bench stopped_failed STANDIN_STOPPED=failed

failed=0
summary=$tmp/finished.txt
expect() {  # expect DESCRIPTION PATTERN: grep -E PATTERN in $summary
  if grep -qE -- "$2" "$summary"; then
    echo "ok: $1"
  else
    echo "FAILED: $1 (no /$2/ in $(basename "$summary"))"
    failed=1
  fi
}
expect "store: passes with its 5 delays, the undelayed case named" \
  '^PASS stream delay store: 2 cases; .*5 delays queued over 2 cases; none in 1: cuda: a refusal$'
expect "fetch: no delay queued fails" \
  '^FAIL stream delay fetch: no delay was queued in any of its 2 cases: the run ran undelayed'
expect "step: no stream_delays line fails" \
  '^FAIL stream delay step: no stream_delays line: '
expect "compute: a failed case fails, its delays reported" \
  '^FAIL stream delay compute: exit 1, 1 cases finished; test cases: 1 \| 1 failed; 3 delays queued over 1 cases '
if [[ -f "$tmp/log-finished/stream-delay-store.log" ]] &&
   grep -q '(store:1000000) case: ' "$tmp/log-finished/stream-delay-store.log"; then
  echo "ok: the run's delay (STREAM:NS, 1 ms by default) reached the test executable"
else
  echo "FAILED: DRT_TEST_CUDA_STREAM_DELAY=store:1000000 did not reach the test executable"
  failed=1
fi

summary=$tmp/stopped.txt
expect "stopped, store: finished cases without a delay fail" \
  '^FAIL stream delay store: stopped after 60 s; no delay was queued in any of the 2 cases it finished: the run ran undelayed and checked nothing; 2 cases finished: cuda: case one; cuda: case two; 0 delays queued over 2 cases; none in 2: '
expect "stopped, fetch: a stop after delays stays STOPPED, its delays reported" \
  '^STOPPED stream delay fetch: did not finish in 60 s; 1 cases finished: cuda: case one; 2 delays queued over 1 cases '
expect "stopped, step: finished cases without a stream_delays line fail" \
  '^FAIL stream delay step: stopped after 60 s; its log shows 2 of its cases run, all but the last finished, and no stream_delays line: '
expect "stopped, compute: stopped before any case finished stays STOPPED" \
  '^STOPPED stream delay compute: did not finish in 60 s; 0 cases finished; 0 delays queued over 0 cases '

summary=$tmp/stopped_failed.txt
expect "stopped, store: a check that failed before the stop fails, with the failure and the delays" \
  '^FAIL stream delay store: stopped after 60 s; a check failed before the stop: /src/tests/cuda_backend/standin_test.cc:12: FAILED:; 1 cases finished: cuda: case one; 4 delays queued over 1 cases '
expect "stopped, fetch: cases finished are counted by their stream_delays lines, not by duration lines" \
  '^STOPPED stream delay fetch: did not finish in 60 s; 1 cases finished: cuda: case one; 3 delays queued over 1 cases '
expect "stopped, step: a section's and a GENERATE run's duration lines without a report stay STOPPED" \
  '^STOPPED stream delay step: did not finish in 60 s; 0 cases finished; 0 delays queued over 0 cases '

for name in finished stopped stopped_failed; do
  rc=$(cat "$tmp/$name.rc")
  if ((rc != 1)); then
    echo "FAILED: gpu_bench.sh ($name) exited $rc, expected 1 (runs failed or stopped)"
    failed=1
  else
    echo "ok: gpu_bench.sh ($name) exits 1"
  fi
done
if ((failed)); then
  for name in finished stopped stopped_failed; do
    echo "--- gpu_bench.sh ($name) output:"
    cat "$tmp/$name.log"
    echo "--- summary ($name):"
    cat "$tmp/$name.txt" 2>/dev/null || true
  done
  exit 1
fi
echo "gpu_bench_stream_delay: every check passed"

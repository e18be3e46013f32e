#!/usr/bin/env bash
# ctest gpu_bench_dry_run (label scripts): the GPU checklist cannot rot
# between GPU sessions. Runs every stage of scripts/gpu_stage.sh with
# DRY_RUN=1 against a normal build (no GPU needed) and checks
#   - every stage passes: the executables exist, every flag is one of the
#     tool's, the tools accept the values, each ctest selection and Catch spec
#     selects tests and each left-out case exists;
#   - the variables reach the commands (stage 3's B variant, stage 4's tiers
#     and batched rows, stage 5's sessions and repeats);
#   - the checker itself fails: a value drt-bench refuses
#     (WINDOW_DECODE_SPLITS=abc), an unknown sanitizer run and an unknown
#     stream-delay run;
#   - the cases that fill the device run alone: ctest -L cuda_alone selects
#     exactly them (counted from the sources), and no sanitizer or
#     stream-delay run selects one (each run's cases listed by the built
#     test executable; the check is shown to see the old one-argument form);
#   - the state and disk-tier cases are a memcheck run of their own;
#   - the store, fetch and compute stream-delay runs take the two fixture
#     cases checked against the CPU backend, by name;
#   - stage 3's order (warm-up, A B B A, 4M, each option alone);
#   - scripts/bench_ab.py (stage 3's A/B table) on hand-made results.
# Usage: tests/gpu_bench_dry_run_test.sh BUILD_DIR. Exit 77 (skipped) when
# the build has no CUDA test executables (configured without nvcc).
set -euo pipefail
build=$(cd "${1:?usage: gpu_bench_dry_run_test.sh BUILD_DIR}" && pwd)
cd "$(dirname "$0")/.."
if [[ ! -x "$build/tests/cuda/drt_cuda_kernel_tests" ]]; then
  echo "gpu_bench_dry_run: $build has no CUDA tests (built without nvcc); skipping"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
expect() {  # expect DESCRIPTION FILE PATTERN: grep -E PATTERN in FILE
  if grep -qE -- "$3" "$2"; then
    echo "ok: $1"
  else
    echo "FAILED: $1 (no /$3/ in $(basename "$2"))"
    failed=1
  fi
}

rc=0
DRY_RUN=1 BUILD_DIR="$build" OUT="$tmp/out" bash scripts/gpu_stage.sh all >"$tmp/all.log" 2>&1 || rc=$?
if ((rc != 0)); then
  echo "FAILED: DRY_RUN=1 gpu_stage.sh all exited $rc; its FAIL lines:"
  grep -E '^(FAIL|STOPPED)' "$tmp"/out/stage*-summary.txt || tail -40 "$tmp/all.log"
  failed=1
fi
for s in 1 2 3 4 5 6; do
  expect "stage $s summary written and passed" "$tmp/out/stage$s-summary.txt" \
    "^stage $s: every step passed"
done
log=$tmp/all.log
expect "stage 1: ctest -L cuda -LE cuda_alone selects tests" "$tmp/out/stage1-summary.txt" \
  '^PASS ctest -L cuda: dry run: ctest -L cuda -LE cuda_alone selects [1-9][0-9]* tests'
# The cases that fill the device or fail allocations on purpose run alone
# (label cuda_alone, Catch tag [allocation]). Expected, from the sources:
# every case of cuda_allocation_failure_test.cc (the file's whole job) and
# the device tier's "cannot grow" case; each in the alone run and in no
# other, and the two runs together are all of ctest -L cuda.
alloc_cases=$(grep -c '^TEST_CASE(' tests/cuda_backend/cuda_allocation_failure_test.cc)
expected_alone=$((alloc_cases + 1))
expect "stage 1: ctest -L cuda_alone selects the $expected_alone cases that fill the device" \
  "$tmp/out/stage1-summary.txt" \
  "^PASS ctest -L cuda_alone: dry run: ctest -L cuda_alone selects $expected_alone tests"
names() { ctest --test-dir "$build" -N "$@" | sed -n 's/^ *Test *#[0-9]*: //p' | sort; }
names -L cuda_alone >"$tmp/alone.txt"
names -L cuda -LE cuda_alone >"$tmp/shared.txt"
names -L cuda >"$tmp/all_cuda.txt"
expect "the device tier's 'cannot grow' case runs alone" "$tmp/alone.txt" \
  '^cuda: a device store that cannot grow says so and changes nothing$'
expect "the DeviceFiller cases run alone" "$tmp/alone.txt" \
  '^cuda: a device store grows by a bounded step where doubling does not fit$'
if [[ -n "$(comm -12 "$tmp/alone.txt" "$tmp/shared.txt")" ]] ||
   ! cmp -s <(sort "$tmp/alone.txt" "$tmp/shared.txt") "$tmp/all_cuda.txt"; then
  echo "FAILED: the cuda_alone and shared selections overlap or miss a case of ctest -L cuda"
  failed=1
else
  echo "ok: the alone and shared selections split ctest -L cuda"
fi
expect "stage 1: the two cuda durable tests" "$tmp/out/stage1-summary.txt" \
  '^PASS cuda durable: dry run: ctest -R \^cuda durable selects 2 tests'
for run in memcheck-kernel memcheck-backend memcheck-backend-new memcheck-backend-state \
           racecheck-kernel racecheck-kernel-new racecheck-backend; do
  expect "stage 2: sanitizer $run" "$tmp/out/stage2-summary.txt" "^PASS sanitizer $run: "
done
expect "stage 2: the seven runs at once under 450 s" "$log" \
  'under: timeout --kill-after=30 450 .*compute-sanitizer --tool racecheck'
expect "stage 2: memcheck-backend leaves out the [allocation] cases" "$log" \
  'dry run: .*drt_cuda_backend_tests ~cuda: prefill.* ~\[allocation\] --durations yes'
expect "stage 2: memcheck-backend-new leaves out the [allocation] cases in each group" "$log" \
  'dry run: .*drt_cuda_backend_tests ~\[allocation\]\[decode_graphs\],~\[allocation\]\[device_tier\],.* --durations yes'
expect "stage 3: A B B A after a warm-up" "$log" \
  '#### stage 3: drt-bench warm-up.*'
grep -E '^#### stage 3: drt-bench (A|B) ' "$log" | sed 's/^#### stage 3: drt-bench \(.\).*/\1/' |
  tr -d '\n' >"$tmp/order.txt"
expect "stage 3: the order A B B A, then A B at 4M" "$tmp/order.txt" '^ABBAAB$'
expect "stage 3: decode graphs alone" "$log" '#### stage 3: drt-bench with DECODE_GRAPHS=true alone at 16K'
expect "stage 3: the encoder-row store alone" "$log" '#### stage 3: drt-bench with CHUNK_STORE=encoder_rows alone at 16K'
expect "stage 3: B has every new option" "$log" \
  'drt-bench .*--window_decode_splits 8 --prefill_tensor_cores=true --decode_graphs=true --decode_fused_gemv=true --prompt_tokens 1048576 --cuda_chunk_store encoder_rows'
expect "stage 3: A has the defaults" "$log" \
  'drt-bench .*--window_decode_splits 0 --prefill_tensor_cores=false --decode_graphs=false --decode_fused_gemv=false --prompt_tokens 1048576 --cuda_chunk_store kv'
expect "stage 3: 4M" "$log" 'drt-bench .*--prompt_tokens 4194304'
expect "stage 3: the 128M model's arguments" "$log" \
  'make_random_model.py --out .*drt-128m-random-bf16 --dtype bf16 .*--hidden-size 768 .*--decoder-layers 6,6'
expect "stage 4: Table 3 without offload" "$log" 'drt-bench .*--prompt_tokens 49152 --chunk_tier device'
expect "stage 4: drt-step-bench --batched_step_rows" "$log" \
  'drt-step-bench .*--sessions 1,4,16,32,64 .*--batched_step_rows --sequential=false'
expect "stage 5: 1 and 32 sessions, one repeat" "$log" \
  'drt-batch-bench --sessions 1,32 .*--repeats 1 '

for run in store fetch step compute; do
  expect "stage 6: stream delay $run" "$tmp/out/stage6-summary.txt" "^PASS stream delay $run: "
done
expect "stage 6: initcheck of the decode-graph and device-tier cases" "$tmp/out/stage6-summary.txt" \
  "^PASS sanitizer initcheck-backend-new: "
expect "stage 6: the step run selects the batched steps only" "$log" \
  'dry run: .*drt_cuda_backend_tests ~\[allocation\]\[batch_step\],~\[allocation\]cuda state: the end write[^,]* --durations yes'

# What each Catch run selects, listed by the built test executable from the
# arguments gpu_bench.sh passes (catch-spec-STEP.txt: the executable, then
# one spec a line): no run may take a case tagged [allocation] (they fill
# the device or fail allocations on purpose; ctest -L cuda_alone runs them
# alone). review-cudaprep C1: Catch ANDs a "~[allocation]" argument into the
# last comma group only, and four runs took two such cases.
# selected_tags FILE: --list-tests of the run in FILE.
selected_tags() {
  local args
  mapfile -t args <"$1"
  "${args[0]}" "${args[@]:1}" --list-tests
}
spec_files=("$tmp"/out/catch-spec-*.txt)
# 7 sanitizer runs in stage 2; 4 stream-delay runs and initcheck in stage 6.
if ((${#spec_files[@]} != 12)) || [[ ! -e "${spec_files[0]}" ]]; then
  echo "FAILED: expected the Catch specs of 12 runs, found ${#spec_files[@]}: ${spec_files[*]}"
  failed=1
fi
for f in "${spec_files[@]}"; do
  [[ -e "$f" ]] || continue
  run=$(basename "$f" .txt)
  run=${run#catch-spec-}
  selected_tags "$f" >"$tmp/list-$run.txt" 2>&1 || true
  if grep -q '\[allocation\]' "$tmp/list-$run.txt"; then
    echo "FAILED: $run selects [allocation] case(s):"
    grep -B1 '\[allocation\]' "$tmp/list-$run.txt"
    failed=1
  elif ! grep -qE '^[0-9]+ (matching )?test cases?$' "$tmp/list-$run.txt"; then
    echo "FAILED: $run: --list-tests did not list its cases"
    failed=1
  else
    echo "ok: $run selects no [allocation] case ($(grep -E '^[0-9]+ (matching )?test cases?$' "$tmp/list-$run.txt"))"
  fi
done
# review-cudacheck F4: the store, fetch and compute delay runs take the two
# fixture cases checked against the CPU backend (review-cudaprep C6), each
# by name: check_catch_spec sees only that the spec selects something, so a
# renamed case would drop out of the runs with the dry run still passing.
# The names are written here, not read from the script, so that a rename of
# either fails this check. The step run (batched steps only) takes neither.
fixture_cases=("cuda fp32 matches the cpu backend on the fixtures: uneven pieces"
  "cuda fp32 with the chunk store of encoder rows matches the cpu backend on the fixtures: uneven pieces")
# selected_names FILE: the names of the cases the run in FILE selects.
selected_names() {
  local args
  mapfile -t args <"$1"
  "${args[0]}" "${args[@]:1}" --list-test-names-only
}
for run in store fetch step compute; do
  spec=$tmp/out/catch-spec-stream_delay_$run.txt
  selected_names "$spec" >"$tmp/names-$run.txt" 2>&1 || true
  for name in "${fixture_cases[@]}"; do
    if grep -qxF -- "$name" "$tmp/names-$run.txt"; then
      taken=yes
    else
      taken=no
    fi
    if [[ "$run" == step && "$taken" == no ]] || [[ "$run" != step && "$taken" == yes ]]; then
      echo "ok: stream delay $run $([[ $taken == yes ]] && echo takes || echo leaves out) \"$name\""
    else
      echo "FAILED: stream delay $run $([[ $taken == yes ]] && echo takes || echo does not take) \"$name\""
      failed=1
    fi
  done
done
# The check can fail: the old form (one "~[allocation]" after a spec of
# several groups) selects [allocation] cases.
printf '%s\n' "$build/tests/cuda_backend/drt_cuda_backend_tests" "[device_tier],[chunk_store]" \
  "~[allocation]" >"$tmp/old-form.txt"
selected_tags "$tmp/old-form.txt" >"$tmp/list-old-form.txt" 2>&1 || true
if grep -q '\[allocation\]' "$tmp/list-old-form.txt"; then
  echo "ok: the old form's [allocation] cases are seen"
else
  echo "FAILED: the [allocation] check did not see the old form's cases"
  failed=1
fi
# review-cudaprep C4: the state and disk-tier cases run in memcheck-backend-state,
# not behind the other cases of memcheck-backend-new.
state_list=$tmp/list-sanitizer_memcheck-backend-state.txt
new_list=$tmp/list-sanitizer_memcheck-backend-new.txt
expect "memcheck-backend-state runs the two-thread state case" "$state_list" \
  '^  cuda state: the end write and Fork on a handler thread beside engine steps'
expect "memcheck-backend-state runs the disk-tier cases" "$state_list" '^  cuda disk tier: '
if grep -qE '^  cuda (state|disk tier): ' "$new_list" 2>/dev/null ||
   grep -vE '^  cuda (state|disk tier): |^    |^      \[|^Matching|^[0-9]+ matching|^$' "$state_list"; then
  echo "FAILED: the state and disk-tier cases are not a run of their own"
  failed=1
else
  echo "ok: the state and disk-tier cases are a run of their own"
fi

# The checker must be able to fail: a value drt-bench refuses...
rc=0
DRY_RUN=1 BUILD_DIR="$build" MODEL=models/drt-text-byte SKIP_TESTS=1 SKIP_ENCODER_ROWS=1 \
  SKIP_TABLE3=1 SKIP_PEER=1 SKIP_STEP_BENCH=1 SKIP_BATCH=1 CONTEXTS=16384 \
  LOG_DIR="$tmp/bad" WINDOW_DECODE_SPLITS=abc bash scripts/gpu_bench.sh >"$tmp/bad.log" 2>&1 || rc=$?
if ((rc == 1)) && grep -q '^gpu_bench: FAIL drt-bench .*refused the arguments' "$tmp/bad.log"; then
  echo "ok: a refused value fails the dry run"
else
  echo "FAILED: WINDOW_DECODE_SPLITS=abc passed the dry run (exit $rc)"
  tail -20 "$tmp/bad.log"
  failed=1
fi
# ...and a sanitizer run that does not exist.
rc=0
DRY_RUN=1 BUILD_DIR="$build" LOG_DIR="$tmp/bad2" SANITIZER_RUNS=memcheck-everything bash scripts/gpu_bench.sh \
  >"$tmp/bad2.log" 2>&1 || rc=$?
if ((rc == 2)) && grep -q "unknown run 'memcheck-everything'" "$tmp/bad2.log"; then
  echo "ok: an unknown sanitizer run is refused"
else
  echo "FAILED: SANITIZER_RUNS=memcheck-everything was not refused (exit $rc)"
  failed=1
fi
# ...and a stream-delay run of a stream that does not exist.
rc=0
DRY_RUN=1 BUILD_DIR="$build" LOG_DIR="$tmp/bad3" STREAM_DELAY_RUNS=graph bash scripts/gpu_bench.sh \
  >"$tmp/bad3.log" 2>&1 || rc=$?
if ((rc == 2)) && grep -q "unknown run 'graph'" "$tmp/bad3.log"; then
  echo "ok: an unknown stream-delay run is refused"
else
  echo "FAILED: STREAM_DELAY_RUNS=graph was not refused (exit $rc)"
  failed=1
fi
# scripts/bench_ab.py (stage 3's A/B table) on hand-made lines: A's decode
# runs 2.0 and 2.2 ms (median 2.1), B's 1.05 and 1.1 (median 1.075), so B is
# 1.075 / 2.1 = 0.512 of A; the base LM line is a group of its own. The
# lines carry drt-bench's warm-up keys as it prints them by default (a line
# without them predates the warm-up and is grouped apart as warmup=0).
a='bench_result device=cuda disable_gca=0 window_decode_splits=0 decode_graphs=0 cuda_chunk_store=kv warmup=1 warmup_tokens=4096 context_tokens=16384 prefill_tokens_per_s=70000 session_host_bytes=1048576 h2d_bytes_per_token=0'
b=${a/decode_graphs=0/decode_graphs=1}
{
  echo "drt-bench x: $a decode_ms_median=2.0"
  echo "drt-bench x: ${b/cuda_chunk_store=kv/cuda_chunk_store=encoder_rows} decode_ms_median=1.05"
  echo "drt-bench x: $a decode_ms_median=2.2"
  echo "drt-bench x: ${b/cuda_chunk_store=kv/cuda_chunk_store=encoder_rows} decode_ms_median=1.1"
  echo "drt-bench x: ${a/disable_gca=0/disable_gca=1} decode_ms_median=1.5"
} >"$tmp/results.txt"
python3 scripts/bench_ab.py "$tmp/results.txt" >"$tmp/ab.txt"
expect "bench_ab: A's median and ratio" "$tmp/ab.txt" \
  '^\| 16384 \| GCA \| A \(defaults\) \| 2\.000, 2\.200 \| 2\.100 \| 1\.000 \|'
expect "bench_ab: B against A" "$tmp/ab.txt" \
  '^\| 16384 \| GCA \| decode_graphs=1 cuda_chunk_store=encoder_rows \| 1\.050, 1\.100 \| 1\.075 \| 0\.512 \|'
expect "bench_ab: the base LM apart" "$tmp/ab.txt" '^\| 16384 \| base LM \| A \(defaults\) \| 1\.500 \|'
exit "$failed"

#!/usr/bin/env bash
# ctest gpu_bench_table (label scripts): scripts/gpu_bench.sh's drt-bench
# tables print "n/a" where a run gave no figure, not 0, which read like a
# measurement (review-tools #11). No GPU needed: the script runs its table
# steps (everything else skipped) against stand-ins, on PATH, for nvidia-smi
# (one GPU) and nvcc, and a stand-in drt-bench that prints a bench_result line
# of fixed figures, except that it fails
#   - at 131072 tokens with --disable_gca (the base LM row is missing),
#   - at 262144 tokens without --disable_gca (the DRT runs are missing).
# nvidia-smi lists one process only: the DRT run at 16384 tokens (--chunk_tier
# unset), which writes its PID to $GPU_PID_FILE and stays up 1.2 s, two polls
# of 0.5 s, at 512 MiB. Every other run is never listed, as in a container,
# and its gpu_MiB is n/a, not 0 (review-toolsfix #1).
# Expected cells are worked out by hand from those figures.
# Usage: tests/gpu_bench_table_test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/build/bench" "$tmp/model"
touch "$tmp/build/CMakeCache.txt" "$tmp/model/model.safetensors"
cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in
  -L) echo "GPU 0: Stand-in GPU (UUID: GPU-0)" ;;
  *--query-gpu=name*) echo "Stand-in GPU" ;;
  *--query-compute-apps=pid,used_memory*)
    [[ -s "$GPU_PID_FILE" ]] && echo "$(cat "$GPU_PID_FILE"), 512" ;;
esac
exit 0
EOF
printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/nvcc"
cat >"$tmp/build/bench/drt-bench" <<'EOF'
#!/usr/bin/env bash
ctx=0 base= tier=
while (($#)); do
  case "$1" in
    --prompt_tokens) ctx=$2; shift ;;
    --disable_gca) base=1 ;;
    --chunk_tier) tier=$2; shift ;;
  esac
  shift
done
if [[ "$ctx" == 16384 && -z "$base" && -z "$tier" ]]; then
  echo $$ >"$GPU_PID_FILE"
  sleep 1.2
fi
if [[ "$ctx" == 131072 && -n "$base" ]] || [[ "$ctx" == 262144 && -z "$base" ]]; then
  echo "stand-in drt-bench: failing on purpose" >&2
  exit 1
fi
decode=1.5; [[ -n "$base" ]] && decode=1.2
echo "bench_result prefill_tokens_per_s=70000.4 decode_ms_median=$decode weight_read_floor_ms=0.5" \
     "session_host_bytes=2097152 peak_rss_bytes=104857600 h2d_bytes_per_token=4096 chunk_tier_used=host"
EOF
chmod +x "$tmp/bin/nvidia-smi" "$tmp/bin/nvcc" "$tmp/build/bench/drt-bench"

rc=0
GPU_PID_FILE="$tmp/gpu_pid" PATH="$tmp/bin:$PATH" PREBUILT=1 DEVLIBS="$tmp/none" BUILD_DIR="$tmp/build" MODEL="$tmp/model" \
  LOG_DIR="$tmp/log" CONTEXTS="16384 131072 262144" TABLE3_CONTEXTS="131072" TABLE3_NO_OFFLOAD=device \
  SKIP_TESTS=1 SKIP_WINDOW_BENCH=1 SKIP_PEER=1 SKIP_STEP_BENCH=1 SKIP_BATCH=1 \
  bash scripts/gpu_bench.sh >"$tmp/out.log" 2>&1 || rc=$?

failed=0
expect_row() {  # expect_row DESCRIPTION SECTION CONTEXT EXPECTED: the row's cells after the context
  local row
  row=$(awk -v s="$2" -v c="$3" '/^== |^drt-bench, /{in_s = index($0, s) > 0} in_s && $1 == c' "$tmp/out.log" \
        | head -1 | cut -d' ' -f2- | tr -s ' ' | sed 's/^ //')
  if [[ "$row" == "$4" ]]; then
    echo "ok: $1: $row"
  else
    echo "FAILED: $1"
    echo "  expected: $4"
    echo "  got:      $row"
    failed=1
  fi
}
# Main table columns: prefill_tok/s decode_ms x_floor x_no_gca decode_ms_no_gca
# gpu_MiB session_host_MiB peak_rss_MiB h2d_B/token. decode 1.5 / floor 0.5
# = 3.00; 1.5 / base 1.2 = 1.25; 2 MiB host, 100 MiB RSS; 512 MiB GPU where
# nvidia-smi listed the run, else n/a.
expect_row "main table, all runs done, GPU memory sampled" "drt-bench, " 16384 \
  "70000 1.500 3.00 1.25 1.200 512 2 100 4096"
expect_row "main table, base LM run failed: its columns n/a; GPU memory not sampled: n/a" \
  "drt-bench, " 131072 "70000 1.500 3.00 n/a n/a n/a 2 100 4096"
expect_row "main table, DRT run failed: its columns n/a" "drt-bench, " 262144 \
  "n/a n/a n/a n/a 1.200 n/a n/a n/a n/a"
# Encoder-rows table: prefill decode host_MiB h2d host_vs_kv (2 MiB / 2 MiB).
expect_row "encoder rows, all runs done" "encoder_rows" 16384 "70000 1.500 2 4096 1.000"
expect_row "encoder rows, run failed: n/a" "encoder_rows" 262144 "n/a n/a n/a n/a n/a"
# Table 3 at 131072: the base LM run failed, so every ratio is n/a; no run
# there was listed by nvidia-smi, so its GPU memory is n/a too.
expect_row "Table 3, base LM run failed: ratios n/a" "Table 3" 131072 \
  "with n/a n/a 1.5 / n/a n/a / n/a 70000.4"
if ! grep -q '^gpu_bench: FAIL drt-bench --prompt_tokens 131072 --disable_gca' "$tmp/out.log" || ((rc != 1)); then
  echo "FAILED: the failed runs are reported (FAIL lines, exit 1; got exit $rc)"
  failed=1
else
  echo "ok: the failed runs are reported (FAIL lines, exit 1)"
fi
if ((failed)); then
  echo "--- gpu_bench.sh output:"
  cat "$tmp/out.log"
  exit 1
fi
echo "gpu_bench_table: every check passed"

#!/usr/bin/env bash
# No program of the build links cuBLAS (kernels/cublas_library.h opens it at
# run time): linking it makes every process load libcublasLt, whose static
# initialisers cost about 0.5 s and 210 MB at start, GPU or not. ldd lists
# what each program loads at start, direct and indirect.
#   no_cublas_link_test.sh PROGRAM...
set -euo pipefail
[[ $# -gt 0 ]] || { echo "usage: $0 PROGRAM..." >&2; exit 2; }
failed=0
for program in "$@"; do
  [[ -x "$program" ]] || { echo "FAIL: $program is not an executable" >&2; failed=1; continue; }
  libs=$(ldd "$program")
  if grep -q 'libcublas' <<<"$libs"; then
    echo "FAIL: $program loads cuBLAS at start:" >&2
    grep 'libcublas' <<<"$libs" >&2
    failed=1
  else
    echo "ok: $program ($(wc -l <<<"$libs") libraries, no libcublas)"
  fi
done
exit "$failed"

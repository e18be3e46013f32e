#!/usr/bin/env bash
# Every Catch2 case name can be one ctest entry: catch_discover_tests splits
# a name at ';' into entries that select no case (they fail with --warn
# NoTests, and the case itself never runs under ctest), and Catch reads a
# name that starts with '-' as a command-line option. Both have reached main
# (note17, review-userfix U1); this lists every case of each test program.
#   test_names_test.sh TEST_PROGRAM...
set -euo pipefail
[[ $# -gt 0 ]] || { echo "usage: $0 TEST_PROGRAM..." >&2; exit 2; }
failed=0
for program in "$@"; do
  # (Catch2 2.x exits with the number of cases listed, so the status says
  # nothing; an empty list is the failure to run.)
  names=$("$program" --list-test-names-only || true)
  count=$(grep -c . <<<"$names" || true)
  if ((count == 0)); then
    echo "FAIL: $program listed no case names" >&2
    failed=1
    continue
  fi
  bad=$(grep -E '(;|^-)' <<<"$names" || true)
  if [[ -n "$bad" ]]; then
    echo "FAIL: $program has case names with ';' or a leading '-':" >&2
    echo "$bad" >&2
    failed=1
  else
    echo "ok: $program ($count case names)"
  fi
done
exit "$failed"

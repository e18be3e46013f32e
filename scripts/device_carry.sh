#!/usr/bin/env bash
# Packs what a lent GPU machine needs from scripts/device_bundle.sh's output
# into .gpucarry/ (git-ignored), small enough to travel with the checkout:
#   .gpucarry/build-gpu.tar.xz  build-gpu without object files, static
#                               libraries, CMakeFiles/ and generated sources:
#                               the stripped executables, CMakeCache.txt (the
#                               source path compiled into the tests) and the
#                               ctest files (CTestTestfile.cmake and Catch's
#                               discovered test lists)
#   .gpucarry/devlibs/*.deb     the runtime libraries' Debian packages
# A device run carries [".gpucarry"] and starts with
# `bash scripts/gpu_stage.sh N`, which unpacks both (docs/cuda.md, "Next GPU
# session").
#
# Why xz: the executables each hold the same CUDA fat binary (every kernel,
# both precisions, sm_90), so stripped they are ~42 MiB, and gzip leaves
# ~16 MiB, while xz finds the repeats across files (~5 MiB). A device run
# carries at most 64 MiB, the tracked tree (~27 MiB) included; this script
# measures the total and fails when it is over.
#   bash scripts/device_bundle.sh && bash scripts/device_carry.sh
#   BUILD_DIR=build-gpu LIMIT_MIB=64 bash scripts/device_carry.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-gpu}
limit_mib=${LIMIT_MIB:-64}
carry=.gpucarry

# The executables gpu_bench.sh runs (drt_server_tests only for the
# "cuda durable" tests; scripts/device_bundle.sh builds it).
executables=(tests/cuda/drt_cuda_kernel_tests tests/cuda_backend/drt_cuda_backend_tests
             bench/drt-bench bench/drt-niah bench/drt-niah-text bench/drt-batch-bench
             tools/drt-step-bench tools/drt-window-bench server/drt-server
             tests/drt_server_tests)
required=(tests/cuda/drt_cuda_kernel_tests tests/cuda_backend/drt_cuda_backend_tests
          bench/drt-bench tools/drt-step-bench server/drt-server)
for exe in "${required[@]}"; do
  if [[ ! -x "$build/$exe" ]]; then
    echo "device_carry: $build/$exe is missing; run scripts/device_bundle.sh first" >&2
    exit 2
  fi
done
if [[ ! -d .devlibs ]] || ! compgen -G '.devlibs/*.deb' >/dev/null; then
  echo "device_carry: .devlibs has no .deb files; run scripts/device_bundle.sh first" >&2
  exit 2
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$build"
cp "$build/CMakeCache.txt" "$stage/$build/"
# ctest's files: each directory's CTestTestfile.cmake and the test lists
# catch_discover_tests wrote beside the executables (*_tests-<hash>.cmake,
# *_include-<hash>.cmake).
(cd "$build" && find . -name CTestTestfile.cmake -o -name '*_tests-*.cmake' -o -name '*_include-*.cmake') |
  while read -r f; do
    mkdir -p "$stage/$build/$(dirname "$f")"
    cp "$build/$f" "$stage/$build/$f"
  done
carried=()
for exe in "${executables[@]}"; do
  [[ -x "$build/$exe" ]] || continue
  mkdir -p "$stage/$build/$(dirname "$exe")"
  cp "$build/$exe" "$stage/$build/$exe"
  strip "$stage/$build/$exe"
  carried+=("$exe")
done

rm -rf "$carry"
mkdir -p "$carry/devlibs"
# -9e with a dictionary larger than one executable: the fat binaries repeat.
tar -C "$stage" -cf - "$build" | xz -9e -T1 >"$carry/$build.tar.xz"
cp .devlibs/*.deb "$carry/devlibs/"
echo "$build" >"$carry/build_dir"
git rev-parse HEAD >"$carry/commit"

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpucarry/' "$exclude" 2>/dev/null || echo '/.gpucarry/' >>"$exclude"

# What travels: tracked files, untracked files git does not ignore, and the
# carried folder (the device tool's rule, /work/.library/device/README.md).
tree_bytes=$({ git ls-files -z; git ls-files -z --others --exclude-standard; } |
  xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
carry_bytes=$(find "$carry" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
unpacked=$(du -sb "$stage/$build" | cut -f1)
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "device_carry: ${carried[*]}"
echo "device_carry: $build stripped $(mib "$unpacked") MiB, packed $(mib "$(stat -c %s "$carry/$build.tar.xz")") MiB;" \
     "devlibs $(mib "$(du -sb "$carry/devlibs" | cut -f1)") MiB"
total=$((tree_bytes + carry_bytes))
echo "device_carry: travels $(mib "$tree_bytes") MiB of checkout + $(mib "$carry_bytes") MiB of $carry" \
     "= $(mib "$total") MiB (limit $limit_mib MiB)"
if ((total > limit_mib * 1048576)); then
  echo "device_carry: over the $limit_mib MiB a device run carries" >&2
  exit 1
fi

#!/usr/bin/env bash
# Prepares, on a Debian 12 build machine without a GPU, what
# `PREBUILT=1 bash scripts/gpu_bench.sh` needs on a lent GPU machine that can
# neither install packages nor build with our Debian libraries: the CUDA test
# executables, drt-bench, drt-niah, drt-niah-text, drt-step-bench,
# drt-server, drt-batch-bench, drt-window-bench and drt_server_tests (for
# its "cuda durable" cases) built into build-gpu (sm_90 only: H100/H200),
# and the .deb files of the libraries they load beyond glibc, libstdc++ and
# CUDA, downloaded into .devlibs (unpacked there by gpu_bench.sh). Both
# together are over the 64 MiB a device run carries; scripts/device_carry.sh
# packs them into .gpucarry (~20 MiB), and scripts/gpu_stage.sh unpacks that
# on the device:
#   bash scripts/device_bundle.sh && bash scripts/device_carry.sh
#   device run: carry [".gpucarry"], command "bash scripts/gpu_stage.sh 1"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
build=${BUILD_DIR:-build-gpu}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
if [[ ! -d "$build/tests/cuda_backend" ]]; then
  echo "device_bundle: CMake did not enable CUDA in $build (is nvcc at /usr/local/cuda/bin?)" >&2
  exit 2
fi
targets=(drt_cuda_kernel_tests drt_cuda_backend_tests drt-bench drt-niah drt-niah-text drt-step-bench drt-server
         drt-batch-bench drt-window-bench drt_server_tests)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

# The packages of every shared library the executables load, except the C
# runtime and CUDA's own (the GPU machine has those).
exes=("$build/tests/cuda/drt_cuda_kernel_tests" "$build/tests/cuda_backend/drt_cuda_backend_tests"
      "$build/bench/drt-bench" "$build/bench/drt-niah" "$build/tools/drt-step-bench"
      "$build/server/drt-server" "$build/bench/drt-batch-bench" "$build/bench/drt-niah-text"
      "$build/tools/drt-window-bench" "$build/tests/drt_server_tests")
mapfile -t packages < <(
  for exe in "${exes[@]}"; do ldd "$exe" | awk '$3 ~ /^\// {print $3}'; done | sort -u |
    while read -r lib; do dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true; done |
    cut -d: -f1 | sort -u | grep -v -x -e libc6 -e libgcc-s1 -e libstdc++6)
mkdir -p .devlibs
rm -f .devlibs/*.deb
# As root, apt warns that it downloads unsandboxed; harmless here.
(cd .devlibs && apt-get download "${packages[@]}" >/dev/null 2>&1)
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.devlibs/' "$exclude" 2>/dev/null || echo '/.devlibs/' >> "$exclude"
echo "device_bundle: ${packages[*]}"
du -sh "$build" .devlibs

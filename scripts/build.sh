#!/usr/bin/env bash
# Configures and builds everything into build/ (Release). CUDA sources join
# the build when nvcc is found (/usr/local/cuda/bin/nvcc or on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" "$@"

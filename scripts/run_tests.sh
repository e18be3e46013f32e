#!/usr/bin/env bash
# Every test: installs dependencies, builds, runs ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)"

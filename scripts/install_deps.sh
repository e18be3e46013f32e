#!/usr/bin/env bash
# Installs the Debian 12 packages drt-server builds and runs with. Idempotent:
# installs only what is missing. Needs root (or sudo).
#   scripts/install_deps.sh            build + test + main job
#   scripts/install_deps.sh --torch    also PyTorch, for weights_tools (fixtures, export)
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libabsl-dev nlohmann-json3-dev catch2 libopenblas-dev libpcre2-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libcpp-httplib-dev
  python3 python3-numpy python3-grpcio python3-grpc-tools
)
if [[ "${1:-}" == "--torch" ]]; then
  packages+=(python3-torch)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  sudo_cmd=(sudo)
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

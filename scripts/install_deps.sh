#!/usr/bin/env bash
# Installs the Debian 12 packages drt-server builds and runs with. Idempotent:
# installs only what is missing. Needs root (or sudo).
#   scripts/install_deps.sh            build + test + main job
#   scripts/install_deps.sh --torch    also PyTorch, for weights_tools (fixtures, export)
#   scripts/install_deps.sh --container  also podman, runc and mmdebstrap, for
#                                        deploy/test/container_test.sh
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libabsl-dev nlohmann-json3-dev catch2 libopenblas-dev libpcre2-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libcpp-httplib-dev
  python3 python3-numpy python3-grpcio python3-grpc-tools
  python3-yaml
)
for option in "$@"; do
  case "$option" in
    --torch) packages+=(python3-torch) ;;
    --container) packages+=(podman runc mmdebstrap uidmap) ;;
    *) echo "install_deps.sh: unknown option $option (--torch, --container)" >&2; exit 1 ;;
  esac
done
# kubectl renders deploy/k8s in the tests (kubectl kustomize). Debian 12's
# only kubectl is kubernetes-client 1.20 (Kustomize 2.0.3), which renders the
# manifests as written; a newer kubectl already on PATH is used as it is.
if ! command -v kubectl >/dev/null; then
  packages+=(kubernetes-client)
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

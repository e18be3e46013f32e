#!/usr/bin/env bash
# Adds NVIDIA's CUDA apt repository for Debian 12 and installs what the CUDA
# backend builds with (nvcc, the CUDA runtime, cuBLAS, CCCL for cub). Used by
# the build stage of deploy/Dockerfile with VARIANT=cuda; the runtime stage
# reuses the keyring and source list it leaves in /out/apt.
#   cuda_apt.sh CUDA_VERSION     e.g. 13-0 (NVIDIA's package suffix)
set -euo pipefail
version=${1:?usage: cuda_apt.sh CUDA_VERSION (e.g. 13-0)}
if [[ ! "$version" =~ ^[0-9]+-[0-9]+$ ]]; then
  echo "cuda_apt.sh: CUDA_VERSION=$version: expected MAJOR-MINOR, e.g. 13-0" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
repo=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
apt-get update -qq
apt-get install -y -qq --no-install-recommends ca-certificates curl >/dev/null
curl -fsSL -o /tmp/cuda-keyring.deb "$repo/cuda-keyring_1.1-1_all.deb"
dpkg -i /tmp/cuda-keyring.deb >/dev/null
rm /tmp/cuda-keyring.deb
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  "cuda-nvcc-$version" "cuda-cudart-dev-$version" "cuda-cccl-$version" \
  "libcublas-dev-$version" >/dev/null
rm -rf /var/lib/apt/lists/*
# The keyring package's files, for the runtime stage.
mkdir -p /out/apt
dpkg -L cuda-keyring | while read -r f; do
  if [[ -f "$f" && ( "$f" == /usr/share/keyrings/* || "$f" == /etc/apt/sources.list.d/* ) ]]; then
    install -D -m 0644 "$f" "/out/apt$f"
  fi
done

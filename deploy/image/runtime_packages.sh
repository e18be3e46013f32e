#!/usr/bin/env bash
# Prints, one per line, the Debian packages that own the shared libraries a
# binary loads (ldd) and those it opens at run time (dlopen: ldd cannot see
# them, so they are named as SONAMEs, found as the dynamic linker finds them,
# in ld.so.cache), so that a runtime image installs exactly those.
# Fails naming a library that no package owns or a SONAME not found.
#   runtime_packages.sh BINARY [SONAME ...]
# The CUDA image names libcublas.so.<major> (kernels/cublas_library.h: cuBLAS
# is opened at run time since 2026-11-25; review-deploy F1: the image had
# lost it).
set -euo pipefail
binary=${1:?usage: runtime_packages.sh BINARY [SONAME ...]}
shift

# Debian 12 is usr-merged, but dpkg records some libraries under /lib and
# others under /usr/lib: ask for each spelling of the path.
owner() {
  local path=$1 real candidates
  real=$(readlink -f "$path")
  candidates=("$path" "$real")
  for p in "$path" "$real"; do
    case "$p" in
      /usr/lib/*) candidates+=("${p#/usr}") ;;
      /lib/* | /lib64/*) candidates+=("/usr$p") ;;
    esac
  done
  for p in "${candidates[@]}"; do
    if out=$(dpkg-query -S "$p" 2>/dev/null); then
      # "pkg:arch: /path" or "pkg1, pkg2: /path" (diversions are not expected here).
      echo "${out%%: *}" | tr ',' '\n' | sed -E 's/^ +//; s/:.*$//'
      return 0
    fi
  done
  echo "runtime_packages.sh: no Debian package owns $path (needed by $binary)" >&2
  return 1
}

libraries=$(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
if grep -q "not found" <(ldd "$binary"); then
  echo "runtime_packages.sh: $binary has unresolved libraries:" >&2
  ldd "$binary" | grep "not found" >&2
  exit 1
fi
for soname in "$@"; do
  # ldconfig -p: "\tlibcublas.so.13 (libc6,x86-64) => /path"; this machine's
  # own ABI only (x86-64 here; no i386 copies). awk reads to the end: an
  # early exit would end ldconfig with SIGPIPE, which pipefail turns into a
  # failure.
  path=$(ldconfig -p | awk -v name="$soname" \
    '!found && $1 == name && $2 ~ /x86-64|aarch64/ {print $NF; found = 1}')
  if [[ -z "$path" ]]; then
    # Or beside a library ldd found (the binary's RUNPATH: the CUDA
    # toolkit's lib folder holds libcudart and libcublas alike).
    for lib in $libraries; do
      if [[ -e "$(dirname "$lib")/$soname" ]]; then path="$(dirname "$lib")/$soname"; break; fi
    done
  fi
  if [[ -z "$path" ]]; then
    echo "runtime_packages.sh: $soname (opened at run time by $binary) is neither in" \
      "ld.so.cache nor beside the libraries it links" >&2
    exit 1
  fi
  libraries+=$'\n'"$path"
done
packages=$(for lib in $libraries; do owner "$lib" || exit 1; done) || exit 1
sort -u <<<"$packages"

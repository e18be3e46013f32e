#!/usr/bin/env bash
# Prints, one per line, the Debian packages that own the shared libraries a
# binary loads (ldd), so that a runtime image installs exactly those.
# Fails naming a library that no package owns.
#   runtime_packages.sh BINARY
set -euo pipefail
binary=${1:?usage: runtime_packages.sh BINARY}

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
for lib in $libraries; do
  owner "$lib"
done | sort -u

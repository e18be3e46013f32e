#!/usr/bin/env bash
# Downloads the Debian documentation packages that weights_tools/text_corpus.py
# turns into training and held-out text (docs/training.md, "Diverse text"), and
# unpacks them into the cache (no root needed: apt-get download + dpkg-deb -x).
#   bash weights_tools/fetch_text.sh [cache dir, default ~/.cache/drt-text]
set -euo pipefail
cache="${1:-$HOME/.cache/drt-text}"
packages=(python3.11-doc perl-doc manpages manpages-dev dict-gcide   # training families
          debian-handbook fortunes fortunes-min)                      # held-out families
mkdir -p "$cache/debs" "$cache/pkg"
cd "$cache/debs"
apt-get download "${packages[@]}"
for pkg in "${packages[@]}"; do
  deb=$(ls -t "${pkg}"_*.deb | head -n 1)
  rm -rf "$cache/pkg/$pkg"
  mkdir -p "$cache/pkg/$pkg"
  dpkg-deb -x "$deb" "$cache/pkg/$pkg"
  echo "unpacked $deb"
done

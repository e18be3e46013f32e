#!/bin/sh
# The container's entrypoint: runs drt-server with every flag it knows also
# taken from the environment, DRT_<FLAG> for --<flag> (DRT_MAX_SESSIONS=4 is
# --max_sessions=4). The flag names come from drt-server --helpshort, so a
# flag added to server/server_flags.cc is settable this way with no change
# here, and other DRT_* variables (such as the service links Kubernetes
# injects) are left alone. Arguments given to the container come after the
# environment's and win. DRT_BEARER_TOKEN is not turned into a flag:
# drt-server reads it itself, which keeps the token out of the process list.
#   DRT_SERVER_BINARY   the binary (default /usr/local/bin/drt-server)
set -eu
binary=${DRT_SERVER_BINARY:-/usr/local/bin/drt-server}

# --helpshort lists this program's flags as lines "    --name (help...".
flags=$("$binary" --helpshort | sed -n 's/^    --\([a-z0-9_]*\) .*/\1/p')
if [ -z "$flags" ]; then
  echo "drt-entrypoint: could not read the flag list from $binary --helpshort" >&2
  exit 1
fi

for flag in $flags; do
  variable=DRT_$(printf '%s' "$flag" | tr 'a-z' 'A-Z')
  [ "$variable" = DRT_BEARER_TOKEN ] && continue
  # Set (even to the empty string, which is how --http_listen= disables HTTP).
  if eval "[ -n \"\${$variable+set}\" ]"; then
    eval "value=\$$variable"
    set -- "--$flag=$value" "$@"
  fi
done
exec "$binary" "$@"

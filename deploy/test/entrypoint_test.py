#!/usr/bin/env python3
"""deploy/image/entrypoint.sh turns DRT_<FLAG> variables into drt-server flags.

The flag list the test expects comes from server/server_flags.cc (the
ABSL_FLAG names), not from the binary the entrypoint asks, so a flag the
entrypoint misses fails here. The argument vector is observed through a
wrapper that hands --helpshort to the real drt-server and prints everything
else; then the real drt-server is started through the entrypoint, from the
environment only, and stopped with SIGTERM.

    entrypoint_test.py --server-binary build/server/drt-server
"""
import argparse
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request

from checks import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ENTRYPOINT = os.path.join(REPO, "deploy", "image", "entrypoint.sh")


def source_flags():
    with open(os.path.join(REPO, "server", "server_flags.cc")) as f:
        return re.findall(r"ABSL_FLAG\(\s*[\w:<>]+\s*,\s*(\w+)\s*,", f.read())


def base_env():
    # Nothing DRT_* from the caller's environment.
    return {k: v for k, v in os.environ.items() if not k.startswith("DRT_")}


def argv_via_entrypoint(wrapper, env, args=()):
    env = dict(base_env(), DRT_SERVER_BINARY=wrapper, **env)
    out = subprocess.run(["/bin/sh", ENTRYPOINT, *args], env=env, capture_output=True, timeout=60)
    if out.returncode != 0:
        raise AssertionError(f"entrypoint exited {out.returncode}: {out.stderr.decode()}")
    return out.stdout.decode().split("\0")[:-1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-binary", required=True)
    args = p.parse_args()
    checks = Checks()
    flags = source_flags()
    checks.expect(len(flags) >= 10 and "model" in flags and "listen" in flags,
                  f"server_flags.cc defines the flags ({len(flags)})", str(flags))

    with tempfile.TemporaryDirectory() as tmp:
        wrapper = os.path.join(tmp, "drt-server")
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\nif [ "$1" = --helpshort ]; then exec "$REAL_SERVER" --helpshort; fi\n'
                    'for a in "$@"; do printf "%s\\0" "$a"; done\n')
        os.chmod(wrapper, stat.S_IRWXU)
        os.environ["REAL_SERVER"] = args.server_binary

        # Every flag at once (each entrypoint run starts drt-server --helpshort,
        # which takes seconds with the CUDA libraries loaded), each with its own
        # value that a shell would mangle if it expanded it; with them the
        # token and variables that are no flag (Kubernetes service links).
        env = {"DRT_" + flag.upper(): f"{flag} $HOME 'q' \"d\" *" for flag in flags}
        env.update(DRT_SERVER_SERVICE_HOST="10.0.0.1", DRT_SERVER_PORT="tcp://10.0.0.1:50051",
                   DRT_NOT_A_FLAG="1")
        argv = argv_via_entrypoint(wrapper, env)
        for flag in flags:
            if flag == "bearer_token":
                checks.expect(not any(a.startswith("--bearer_token") for a in argv),
                              "DRT_BEARER_TOKEN stays out of the argument list (drt-server reads it itself)",
                              str(argv))
            else:
                expected = f"--{flag}={env['DRT_' + flag.upper()]}"
                checks.expect(argv.count(expected) == 1, f"DRT_{flag.upper()} -> --{flag}", str(argv))
        checks.expect(len(argv) == len(flags) - 1,
                      "nothing else: DRT_* variables that are no flag are left alone", str(argv))

        argv = argv_via_entrypoint(wrapper, {"DRT_HTTP_LISTEN": ""})
        checks.expect(argv == ["--http_listen="], "an empty DRT_HTTP_LISTEN passes --http_listen= "
                      "(disables HTTP)", str(argv))
        argv = argv_via_entrypoint(wrapper, {"DRT_MAX_SESSIONS": "5", "DRT_DEVICE": "cpu"},
                                   ["--max_sessions=2"])
        checks.expect(len(argv) == 3 and argv[-1] == "--max_sessions=2" and "--max_sessions=5" in argv
                      and "--device=cpu" in argv,
                      "container arguments come after the environment's, so they win", str(argv))

    # The real drt-server, configured from the environment only.
    env = dict(base_env(), DRT_MAX_SESSIONS="0", DRT_MODEL="/nonexistent")
    out = subprocess.run(["/bin/sh", ENTRYPOINT], env=dict(env, DRT_SERVER_BINARY=args.server_binary),
                         capture_output=True, text=True, timeout=60)
    checks.expect(out.returncode != 0 and "--max_sessions=0: must be at least 1" in out.stderr,
                  "drt-server rejects DRT_MAX_SESSIONS=0 naming --max_sessions", out.stderr[-500:])
    out = subprocess.run(["/bin/sh", ENTRYPOINT, "--max_sessions=3"],
                         env=dict(env, DRT_SERVER_BINARY=args.server_binary),
                         capture_output=True, text=True, timeout=60)
    checks.expect(out.returncode != 0 and "max_sessions" not in out.stderr,
                  "--max_sessions=3 after the image overrides DRT_MAX_SESSIONS=0", out.stderr[-500:])

    # The manifests' DRT_REQUIRE_BEARER_TOKEN=true with the Secret's value: an
    # empty one, and one with the newline a token file written by echo ends
    # with, stop the start with the reason (before the model is loaded: the
    # model directory here does not exist).
    env = dict(base_env(), DRT_SERVER_BINARY=args.server_binary, DRT_MODEL="/nonexistent",
               DRT_HTTP_LISTEN="", DRT_REQUIRE_BEARER_TOKEN="true")
    for token, expected in [("", "--require_bearer_token: the bearer token"),
                            ("secret\n", "a newline (\\n, 0x0a) at byte 6 of 7")]:
        out = subprocess.run(["/bin/sh", ENTRYPOINT], env=dict(env, DRT_BEARER_TOKEN=token),
                             capture_output=True, text=True, timeout=60)
        checks.expect(out.returncode == 1 and expected in out.stderr and "cannot load the model" not in out.stderr,
                      f"DRT_REQUIRE_BEARER_TOKEN=true refuses DRT_BEARER_TOKEN={token!r} at start", out.stderr[-500:])
    out = subprocess.run(["/bin/sh", ENTRYPOINT], env=dict(env, DRT_BEARER_TOKEN="secret"),
                         capture_output=True, text=True, timeout=60)
    checks.expect("authentication: bearer token required (6 bytes)" in out.stderr
                  and "cannot load the model" in out.stderr,
                  "DRT_REQUIRE_BEARER_TOKEN=true with a token: started as far as the model, saying auth is on",
                  out.stderr[-500:])

    env = dict(base_env(), DRT_SERVER_BINARY=args.server_binary,
               DRT_MODEL=os.path.join(REPO, "models", "drt-passkey-byte"),
               DRT_LISTEN="127.0.0.1:0", DRT_HTTP_LISTEN="127.0.0.1:0",
               DRT_SHUTDOWN_GRACE_SECONDS="1", DRT_MAX_CONTEXT_TOKENS="4096")
    server = subprocess.Popen(["/bin/sh", ENTRYPOINT], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    line = ""
    try:
        for line in server.stdout:
            if line.startswith("drt-server listening on "):
                break
        checks.expect(re.match(r"drt-server listening on 127\.0\.0\.1:\d+ \(grpc\), 127\.0\.0\.1:\d+ "
                               r"\(http\)", line) is not None,
                      "drt-server started from DRT_* variables alone listens where they say", line)
        # It serves: GET /healthz on the port it printed.
        http_port = re.search(r":(\d+) \(http\)", line).group(1) if line else "0"
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=10).read().decode()
        except OSError as e:
            body = str(e)
        checks.expect(body.strip() == "ok", "GET /healthz answers ok", body)
        # exec: the entrypoint's process is drt-server itself, so SIGTERM reaches it.
        with open(f"/proc/{server.pid}/comm") as f:
            comm = f.read().strip()
        checks.expect(comm == "drt-server", "the entrypoint execs drt-server (signals reach it)", comm)
        time.sleep(0.2)
    finally:
        server.send_signal(signal.SIGTERM)
        rest, _ = server.communicate(timeout=60)
    checks.expect(server.returncode == 0 and "drt-server: stopped" in rest,
                  "SIGTERM drains and stops it with status 0", f"status {server.returncode}: {rest[-500:]}")
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())

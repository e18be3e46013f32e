#!/usr/bin/env python3
"""Runs the image's HEALTHCHECK script (deploy/image/healthcheck.sh) with bash
against a stand-in HTTP endpoint, since no container runs here.

It must connect where DRT_HTTP_LISTEN says: to the configured host when the
server is bound to one address (review-tools 2026-11-24 #23: it always used
127.0.0.1, so a server bound to a pod or host IP looked unhealthy), and to
127.0.0.1 for a wildcard. 200 is healthy, 503 (draining) is not.

The address comes from the server's command line first (review-deploy #11:
`docker run IMAGE --http_listen=...` was reported unhealthy): an
--http_listen argument of the container's PID 1 (/proc/1/cmdline, NUL-separated;
here a stand-in file named by DRT_HEALTHCHECK_CMDLINE) wins over
DRT_HTTP_LISTEN, as in the entrypoint and the server.

    healthcheck_test.py
"""
import http.server
import os
import subprocess
import sys
import tempfile
import threading

from checks import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "deploy", "image", "healthcheck.sh")


def serve(host, status):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def check(listen, args=None):
    """Runs the script with DRT_HTTP_LISTEN=listen (unset when None) and a
    stand-in /proc/1/cmdline holding `args` (none when None)."""
    env = dict(os.environ)
    env.pop("DRT_HTTP_LISTEN", None)
    if listen is not None:
        env["DRT_HTTP_LISTEN"] = listen
    with tempfile.NamedTemporaryFile(prefix="cmdline") as cmdline:
        # As the kernel writes it: each argument followed by a NUL.
        cmdline.write(b"".join(a.encode() + b"\0" for a in (args or [])))
        cmdline.flush()
        env["DRT_HEALTHCHECK_CMDLINE"] = cmdline.name
        out = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True,
                             timeout=30)
    return out.returncode, out.stderr


def main():
    c = Checks()
    # Linux answers on all of 127.0.0.0/8: 127.0.0.2 stands for an address
    # the server is bound to alone (127.0.0.1 does not reach it).
    bound = serve("127.0.0.2", 200)
    port = bound.server_address[1]
    code, err = check(f"127.0.0.2:{port}")
    c.expect(code == 0, f"bound to one address (127.0.0.2:{port}): healthy, checked there", err)
    bound.shutdown()

    wildcard = serve("0.0.0.0", 200)
    port = wildcard.server_address[1]
    for listen in (f"0.0.0.0:{port}", f"[::]:{port}", f":{port}"):
        code, err = check(listen)
        c.expect(code == 0, f"wildcard {listen}: healthy, checked on 127.0.0.1", err)
    wildcard.shutdown()

    draining = serve("127.0.0.1", 503)
    code, err = check(f"127.0.0.1:{draining.server_address[1]}")
    c.expect(code == 1 and "503" in err, "503 (draining): unhealthy, the status named", err)
    draining.shutdown()

    code, err = check("")
    c.expect(code == 1 and "disabled" in err, "empty DRT_HTTP_LISTEN: unhealthy, says the endpoint is off", err)

    # The server's arguments. `up` answers 200 and `down` is a port nothing
    # listens on (bound and closed), so a check that reads the wrong one fails.
    up = serve("127.0.0.2", 200)
    up_listen = f"127.0.0.2:{up.server_address[1]}"
    closed = serve("127.0.0.3", 200)
    down_listen = f"127.0.0.3:{closed.server_address[1]}"
    closed.shutdown()
    closed.server_close()
    server = "/usr/local/bin/drt-server"
    cases = [
        ("--http_listen=X wins over DRT_HTTP_LISTEN",
         down_listen, [server, "--model=/m", f"--http_listen={up_listen}"]),
        ("--http_listen X (two arguments) wins over DRT_HTTP_LISTEN",
         down_listen, [server, "--http_listen", up_listen, "--threads=4"]),
        ("-http_listen=X (one dash, as absl takes it)",
         down_listen, [server, f"-http_listen={up_listen}"]),
        ("the last --http_listen wins (the entrypoint puts the environment's first)",
         None, [server, f"--http_listen={down_listen}", f"--http_listen={up_listen}"]),
        ("an init as PID 1 (docker run --init) passing the arguments on",
         down_listen, ["/sbin/docker-init", "--", "/usr/local/bin/drt-entrypoint",
                       f"--http_listen={up_listen}"]),
        ("no --http_listen argument: DRT_HTTP_LISTEN",
         up_listen, [server, "--model=/m", "--http_listen_typo=1"]),
    ]
    for what, listen, args in cases:
        code, err = check(listen, args)
        c.expect(code == 0, f"{what}: healthy", f"args {args}, env {listen}: {err}")
    code, err = check(up_listen, [server, f"--http_listen={down_listen}"])
    c.expect(code != 0, "--http_listen naming a closed port: unhealthy even when DRT_HTTP_LISTEN "
             "names a live one", err)
    code, err = check(up_listen, [server, "--http_listen="])
    c.expect(code == 1 and "disabled" in err and "--http_listen" in err,
             "empty --http_listen= argument: unhealthy, says the endpoint is off", err)
    up.shutdown()
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Runs the image's HEALTHCHECK script (deploy/image/healthcheck.sh) with bash
against a stand-in HTTP endpoint, since no container runs here.

It must connect where DRT_HTTP_LISTEN says: to the configured host when the
server is bound to one address (review-tools 2026-11-24 #23: it always used
127.0.0.1, so a server bound to a pod or host IP looked unhealthy), and to
127.0.0.1 for a wildcard. 200 is healthy, 503 (draining) is not.

    healthcheck_test.py
"""
import http.server
import os
import subprocess
import sys
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


def check(listen):
    env = dict(os.environ, DRT_HTTP_LISTEN=listen)
    out = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=30)
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
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Runs the gateway's preStop hook (deploy/k8s/gateway/drain.sh) with bash
against a stand-in for Envoy's admin port, since no Envoy is installed here.

Checks what the script promises in its header:
  - it asks Envoy to fail health checks and then to drain gracefully (POST,
    HTTP/1.1 with a Host header: Envoy's admin refuses HTTP/1.0), and polls
    the gRPC listener's active connection gauge;
  - it returns as soon as that gauge reads 0;
  - it waits out the drain time while connections remain, and returns within
    GATEWAY_DRAIN_DELAY_SECONDS + GATEWAY_DRAIN_SECONDS + 5 s whether the
    admin port answers, hangs, or refuses connections.
The stat name must be the one envoy.yaml's gRPC listener produces
(http.<stat_prefix>.downstream_cx_active), read from envoy.yaml here.

    gateway_drain_test.py
"""
import os
import re
import socket
import subprocess
import sys
import threading
import time

import yaml

from checks import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "deploy", "k8s", "gateway", "drain.sh")
# The script's stated bound beyond delay + drain (its header).
BOUND_SLACK_SECONDS = 5


def grpc_stat_prefix():
    with open(os.path.join(REPO, "deploy", "k8s", "gateway", "envoy.yaml")) as f:
        envoy = yaml.safe_load(f)
    listener = next(l for l in envoy["static_resources"]["listeners"] if l["name"] == "grpc")
    return listener["filter_chains"][0]["filters"][0]["typed_config"]["stat_prefix"]


class FakeAdmin:
    """A loopback TCP server that reads one HTTP request per connection and
    answers it with a content-length (mode "answer") or chunked, as Envoy's
    streaming admin handlers answer /stats ("chunked"), or holds the
    connection without a word ("hang"). Records (method, target, version,
    headers) per request."""

    def __init__(self, mode, gauge_values, stat_name):
        self.mode = mode
        self.gauge_values = list(gauge_values)
        self.stat_name = stat_name
        self.requests = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held = []
        self.stopped = False
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            data = b""
            conn.settimeout(5)
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
            head = data.split(b"\r\n\r\n")[0].decode(errors="replace").split("\r\n")
            method, target, version = (head[0].split(" ") + ["", "", ""])[:3]
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
            self.requests.append((method, target, version, headers))
            if self.mode == "hang":
                self.held.append(conn)
                continue
            if target.startswith("/stats"):
                value = self.gauge_values.pop(0) if len(self.gauge_values) > 1 else self.gauge_values[0]
                body = f"{self.stat_name}: {value}\n"
            else:
                body = "OK\n"
            if self.mode == "chunked":
                # One chunk with its size line ("%x\r\n") before it, then
                # the last chunk of size 0.
                chunks = f"{len(body):x}\r\n{body}\r\n"
                conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                             f"transfer-encoding: chunked\r\n\r\n{chunks}0\r\n\r\n".encode())
            else:
                conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {len(body)}\r\n"
                             f"connection: close\r\n\r\n{body}".encode())
            conn.close()

    def close(self):
        self.stopped = True
        self.sock.close()
        for conn in self.held:
            conn.close()


def run_script(port, delay, drain):
    env = dict(os.environ, GATEWAY_DRAIN_DELAY_SECONDS=str(delay), GATEWAY_DRAIN_SECONDS=str(drain),
               ENVOY_ADMIN_PORT=str(port))
    start = time.monotonic()
    out = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True,
                         timeout=delay + drain + 60)
    return out, time.monotonic() - start


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    c = Checks()
    stat = f"http.{grpc_stat_prefix()}.downstream_cx_active"
    c.expect(stat in open(SCRIPT).read(), f"drain.sh polls {stat}, the gRPC listener's gauge in envoy.yaml")

    # Connections go 2 -> 1 -> 0: the script drains, polls, and returns at 0,
    # long before its 20 s drain time.
    admin = FakeAdmin("answer", [2, 1, 0], stat)
    out, seconds = run_script(admin.port, delay=0, drain=20)
    admin.close()
    calls = [(m, t) for m, t, _, _ in admin.requests]
    c.expect(out.returncode == 0, "drain.sh exits 0", out.stderr)
    c.expect(calls[:2] == [("POST", "/healthcheck/fail"), ("POST", "/drain_listeners?graceful")],
             "drain.sh fails health checks, then drains listeners gracefully (POST)", str(calls))
    polls = calls[2:]
    c.expect(len(polls) == 3 and all(m == "GET" and t.startswith("/stats?filter=") for m, t in polls),
             "drain.sh polls /stats until the gauge reads 0 (three polls for 2, 1, 0)", str(polls))
    c.expect(all(v == "HTTP/1.1" and h.get("host") for _, _, v, h in admin.requests),
             "every admin request is HTTP/1.1 with a Host header", str(admin.requests))
    c.expect(seconds < 10, f"drain.sh returns once no connection is left ({seconds:.1f} s, drain time 20 s)")
    c.expect("no client connections left" in out.stderr, "drain.sh says why it stopped", out.stderr)

    # The same with a chunked /stats body, as Envoy's streaming admin
    # handlers answer: the chunk size lines sit around the gauge line, which
    # is still a line of its own for the sed (review-toolsfix #4).
    admin = FakeAdmin("chunked", [1, 0], stat)
    out, seconds = run_script(admin.port, delay=0, drain=20)
    admin.close()
    c.expect(out.returncode == 0 and seconds < 10 and "no client connections left" in out.stderr,
             f"with a chunked /stats answer, drain.sh reads the gauge and returns at 0 ({seconds:.1f} s)",
             out.stderr)

    delay, drain = 1, 4
    bound = delay + drain + BOUND_SLACK_SECONDS
    # Connections never reach 0: it waits out the drain time, then returns.
    admin = FakeAdmin("answer", [3], stat)
    out, seconds = run_script(admin.port, delay, drain)
    admin.close()
    c.expect(out.returncode == 0 and delay + drain - 1 <= seconds <= bound,
             f"with connections left, drain.sh waits the drain time and returns: {seconds:.1f} s "
             f"in [{delay + drain - 1}, {bound}]", out.stderr)
    c.expect("3 client connections left" in out.stderr, "drain.sh reports the connections it left", out.stderr)

    # An admin port that accepts and never answers. The drain time is 8 s so
    # that the polling loop is reached: the two POSTs wait 2 s each, so with
    # delay 1 the first /stats poll starts at about 5 s (with drain 4 the
    # loop's end came first and a hanging poll went untested).
    hang_drain = 8
    hang_bound = delay + hang_drain + BOUND_SLACK_SECONDS
    admin = FakeAdmin("hang", [0], stat)
    out, seconds = run_script(admin.port, delay, hang_drain)
    admin.close()
    hung_polls = [t for m, t, _, _ in admin.requests if m == "GET" and t.startswith("/stats")]
    c.expect(len(hung_polls) >= 1, f"with a hanging admin port, drain.sh reaches its polling loop "
             f"({len(hung_polls)} polls)", str(admin.requests))
    c.expect(out.returncode == 0 and seconds <= hang_bound,
             f"with an admin port that never answers, drain.sh returns within {hang_bound} s ({seconds:.1f} s)",
             out.stderr)

    # Nothing listening on the admin port.
    out, seconds = run_script(free_port(), delay, drain)
    c.expect(out.returncode == 0 and seconds <= bound,
             f"with nothing on the admin port, drain.sh returns within {bound} s ({seconds:.1f} s)", out.stderr)
    c.expect(re.search(r"no answer to /healthcheck/fail", out.stderr) is not None,
             "drain.sh says that the admin port did not answer", out.stderr)
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())

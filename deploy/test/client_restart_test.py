#!/usr/bin/env python3
"""Both example clients ride over a drt-server restart on the same --state_dir.

A real drt-server (the passkey model) with --state_dir is stopped in the
middle of a client's Append, once the session holds RESUME_AFTER tokens of
it, and started again on the same port and state directory. The client must
retry (a log line per retry), resume the Append from the tokens the session
holds, and finish with exactly what an uninterrupted run gives: every prompt
token ingested once (its "append: N tokens" is the uninterrupted run's N: an
Append sent again whole would hold about N + the resume point, one resumed
from the wrong place fewer or more), and the same answer (a durable server
continues a session exactly, docs/api.md). The stop is a crash (SIGKILL) for
one run and a drain (SIGTERM, running calls end with UNAVAILABLE) for the
others, for each client: one with --shutdown_grace_seconds 0 (the Append is
cut at once, however fast this machine ingests) and one with a grace of
GRACE_SECONDS, as a deployment has one (deploy/k8s: 30 s): the Append then
either outlasts the grace and is cut (and resumed), or finishes within it,
and the client's Generate is refused by the draining or stopped server and
sent again after the restart. Which of the two happened is printed; both
must end as the uninterrupted run.

Then a server that stays down: the client must give up after --retry-seconds
with an error that names the bound and the acknowledged tokens, and not much
later.

The suite's time budget (ctest -LE slow) keeps this small: a 10K-token
haystack, and the five lineages (the uninterrupted run; per client, kill -9
then the give-up run on the restarted server, and SIGTERM) run at the same
time, each on its own server, since most of their time is spent waiting for
a restart and the clients' retry delays.

    client_restart_test.py --server-binary build/server/drt-server \
        --cpp-client build/client_examples/drt-client --stubs build/python
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from checks import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(REPO, "models", "drt-passkey-byte")
PASSKEY = "52817"
# The prompt: a haystack of HAYSTACK_TOKENS byte tokens. The server
# acknowledges (and writes) every ACK_TOKENS tokens, so that a stop after
# RESUME_AFTER tokens finds several acknowledged steps to resume from. The
# stop is polled every 20 ms; the Append's remaining 7,500 tokens take
# seconds at the ~1,000-3,000 tokens/s seen here at load 12-15, so the stop
# lands in the middle (checked: "the stop came in the middle").
HAYSTACK_TOKENS = 10_000
ACK_TOKENS = 512
RESUME_AFTER = 2_500
# How long the server stays down before the restart: long enough for the
# client to fail and retry at least once (its first delays are 0.1-0.2 s,
# 0.2-0.4 s); the restart itself (model load, session restore) adds more.
DOWN_SECONDS = 0.5
RETRY_SECONDS = 120
# The server that stays down: the client must give up after GIVE_UP_SECONDS
# of retries, and within GIVE_UP_SLACK more (its last attempt, GetSession's
# connection failure, process exit; a loaded 2-core machine).
GIVE_UP_SECONDS = 2
GIVE_UP_SLACK = 10
# The drain with a grace: running calls get this long before they are
# cancelled (drt-server's default is 10 s, deploy/k8s's 30 s; shorter here
# to keep the suite's time).
GRACE_SECONDS = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortTaken(Exception):
    """The restart could not bind the port: another process took it while
    the server was down (drt-server binds without SO_REUSEPORT)."""


class Server:
    """A drt-server process on a fixed port and state directory; its output is
    kept (drained by a thread, so that it never blocks on a full pipe)."""

    def __init__(self, binary, port, state_dir, grace_seconds=0):
        self.binary, self.port, self.state_dir = binary, port, state_dir
        self.grace_seconds = grace_seconds
        self.process = None
        self.log = []

    def start(self):
        self.log = []
        self.process = subprocess.Popen(
            [self.binary, "--model", MODEL, "--listen", f"127.0.0.1:{self.port}", "--http_listen", "",
             "--device", "cpu", "--state_dir", self.state_dir, "--state_ack_tokens", str(ACK_TOKENS),
             # 0: a drain that ends running calls at once, so that the SIGTERM
             # run cuts the Append however fast this machine ingests.
             "--shutdown_grace_seconds", str(self.grace_seconds)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready = threading.Event()

        def drain(process, log):
            for line in process.stdout:
                log.append(line)
                if "listening on" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=drain, args=(self.process, self.log), daemon=True).start()
        if not ready.wait(120) or self.process.poll() is not None:
            self.process.wait(timeout=10)
            self.process = None
            log = "".join(self.log[-30:])
            if f"cannot listen for gRPC on 127.0.0.1:{self.port}" in log:
                raise PortTaken(f"port {self.port} was taken by another process while drt-server was down:\n{log}")
            raise SystemExit(f"drt-server did not start:\n{log}")

    def stop(self, sig):
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=60)
        self.process = None


def session_tokens(stub, pb):
    """The tokens of the server's only session, or 0 (none yet, or no answer)."""
    try:
        sessions = stub.ListSessions(pb.ListSessionsRequest(), timeout=5).sessions
    except Exception:  # the server is starting or gone: nothing to read yet
        return 0
    return sessions[0].tokens if sessions else 0


def run_cut(grpc, pb, pb_grpc, server, command, sig, restart):
    """Runs `command` against the running `server` and stops it (signal
    `sig`) once the session holds RESUME_AFTER tokens; restarts it on the
    same port and state directory after DOWN_SECONDS when `restart`.
    Returns (exit code, output, tokens at the stop, seconds from the stop to
    the client's exit)."""
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.DrtStub(channel)
    command = [arg.replace("PORT", str(server.port)) for arg in command]
    # stdout and stderr apart: a retry's log lines (stderr) can land inside
    # the answer line ("answer: " is printed before the first token, and a
    # Generate the drain refused is sent again after the restart), and the
    # answer checked is the one on stdout. Returned as stdout, then stderr.
    client = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    output, errors = [], []
    reader = threading.Thread(target=lambda: output.extend(client.stdout), daemon=True)
    error_reader = threading.Thread(target=lambda: errors.extend(client.stderr), daemon=True)
    reader.start()
    error_reader.start()
    try:
        deadline = time.monotonic() + 120
        held = 0
        while time.monotonic() < deadline and client.poll() is None:
            held = session_tokens(stub, pb)
            if held >= RESUME_AFTER:
                break
            time.sleep(0.02)
        stopped_at = time.monotonic()
        server.stop(sig)
        if restart:
            time.sleep(DOWN_SECONDS)
            server.start()
        client.wait(timeout=300)
        seconds = time.monotonic() - stopped_at
        reader.join(timeout=10)
        error_reader.join(timeout=10)
    finally:
        if client.poll() is None:
            client.kill()
        channel.close()
    return client.returncode, "".join(output) + "".join(errors), held, seconds


def field(pattern, output):
    m = re.search(pattern, output, re.M)
    return m.group(1) if m else None


def client_runs(grpc, pb, pb_grpc, binary, command, retry, sig, grace):
    """One client's runs on one server lineage (one port, one state
    directory): stopped with `sig` and restarted; then, for SIGKILL, killed
    again in the next run and left down. Returns run_cut's result for the
    first and, for SIGKILL, for the second (else None). Raises PortTaken
    when the restart finds its port taken."""
    with tempfile.TemporaryDirectory(prefix="drt-client-restart-") as tmp:
        server = Server(binary, free_port(), os.path.join(tmp, "state"), grace)
        server.start()
        try:
            restarted = run_cut(grpc, pb, pb_grpc, server, command + [retry, str(RETRY_SECONDS)], sig, restart=True)
            give_up = None
            if sig == signal.SIGKILL:
                give_up = run_cut(grpc, pb, pb_grpc, server, command + [retry, str(GIVE_UP_SECONDS)],
                                  signal.SIGKILL, restart=False)
        finally:
            server.stop(signal.SIGKILL)
    return restarted, give_up


def client_runs_retried(grpc, pb, pb_grpc, binary, name, command, retry, sig, grace):
    """client_runs(), made again once on a new port when the restart found
    its port taken (another process bound it in the gap: small odds, but not
    zero on a busy machine, and not the client's fault). Returns
    client_runs()'s result, or the PortTaken of the second attempt."""
    for attempt in (1, 2):
        try:
            return client_runs(grpc, pb, pb_grpc, binary, command, retry, sig, grace)
        except PortTaken as e:
            print(f"note: {name}: {e}\n  (attempt {attempt} of 2)", flush=True)
            if attempt == 2:
                return e


def check_client(name, retry, runs, expected, checks):
    """The checks of one client's runs against `expected`, the uninterrupted
    run's (tokens, answer, prompt). `runs`: {how: client_runs()'s result}."""
    tokens, answer, prompt = expected
    total = int(tokens.replace(",", ""))
    give_up = None
    for how, result in runs.items():
        if isinstance(result, PortTaken):
            checks.expect(False, f"{name}, {how}: the restart found its port free (twice)", str(result))
            continue
        (code, output, held, _), give_up = result[0], result[1] or give_up
        what = f"{name}, {how} at {held:,} tokens and a restart"
        for line in output.splitlines():
            if line.startswith(("drt_client: ", "drt-client: ")):
                print(f"  {name}: {line}")
        checks.expect(RESUME_AFTER <= held < total, f"{what}: the stop came in the middle of the Append",
                      f"session held {held:,} of {total:,}")
        retries = re.findall(r"UNAVAILABLE.*; retry (\d+) in [\d.]+ s \(", output)
        checks.expect(len(retries) >= 1, f"{what}: a log line per retry ({len(retries)} retries)",
                      output[-2500:])
        resumed = field(r"resuming the Append at prompt token ([\d,]+)", output)
        resumed = int(resumed.replace(",", "")) if resumed else None
        if "grace" in how:
            print(f"  {name}: {how}: the Append "
                  f"{'outlasted the grace and was cut' if resumed is not None else 'finished within the grace'}")
        if "grace" in how and resumed is None:
            # The Append finished within the grace: the Generate, refused by
            # the draining or stopped server, must have been sent again.
            checks.expect("sending the Generate again" in output and "Traceback" not in output,
                          f"{what}: the Append finished within the grace, and the Generate the drain "
                          "refused was sent again after the restart", output[-2500:])
        else:
            checks.expect(resumed is not None and 0 < resumed < total,
                          f"{what}: the Append resumed at prompt token {resumed} (0 < it < {total:,}), "
                          "not from the start", output[-2500:])
        checks.expect(code == 0 and field(r"^append: ([\d,]+) tokens", output) == tokens,
                      f"{what}: the client finished with every prompt token ingested once ({tokens})",
                      output[-2500:])
        checks.expect(field(r"^answer: (.*)$", output) == answer
                      and field(r"^prompt: (.*)$", output) == prompt,
                      f"{what}: the same prompt and answer as the uninterrupted run ({answer!r})",
                      output[-1500:])

    # The server that stayed down.
    if give_up is None:
        return
    code, output, held, seconds = give_up
    acknowledged = field(r"after the server acknowledged ([\d,]+) tokens of this prompt", output)
    checks.expect(code != 0 and f"did not come back within {retry} {GIVE_UP_SECONDS}" in output
                  and acknowledged is not None and "Traceback" not in output,
                  f"{name}, a server that stays down: a clear error naming the bound and the "
                  f"{acknowledged} acknowledged tokens", output[-2000:])
    # Acknowledged before the kill: some (the stop came after RESUME_AFTER
    # tokens, several acknowledgements), and no more than the prompt.
    checks.expect(acknowledged is not None and 0 < int(acknowledged.replace(",", "")) <= total,
                  f"{name}, a server that stays down: it reports the acknowledged tokens "
                  f"({acknowledged}; the session held {held:,} when the stop was sent)")
    checks.expect(GIVE_UP_SECONDS <= seconds < GIVE_UP_SECONDS + GIVE_UP_SLACK,
                  f"{name}, a server that stays down: gave up {seconds:.1f} s after the stop "
                  f"(retried for the bound, {GIVE_UP_SECONDS} s, and within {GIVE_UP_SLACK} s more)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-binary", required=True)
    p.add_argument("--cpp-client", required=True)
    p.add_argument("--stubs", required=True)
    args = p.parse_args()
    sys.path.insert(0, args.stubs)
    import grpc
    from drt.v1 import drt_pb2 as pb, drt_pb2_grpc as pb_grpc

    target = "127.0.0.1:PORT"
    clients = {
        "python": [sys.executable, os.path.join(REPO, "client_examples", "python", "drt_client.py"),
                   "--stubs", args.stubs, "--server", target, "--haystack-tokens", str(HAYSTACK_TOKENS),
                   "--passkey", PASSKEY, "--max-tokens", "8", "--stop", ".",
                   "--piece-bytes", "4096"],
        "c++": [args.cpp_client, "--server", target, "--haystack_tokens", str(HAYSTACK_TOKENS),
                "--passkey", PASSKEY, "--max_tokens", "8", "--stop", ".", "--piece_bytes", "4096"],
    }
    retry = {"python": "--retry-seconds", "c++": "--retry_seconds"}
    checks = Checks()

    # The uninterrupted run (what every cut run must end with) and each
    # client's runs for each stop, at the same time: each on its own server,
    # and most of their time is spent waiting (restarts, retry delays), not
    # computing.
    plain = {}
    runs = {name: {} for name in clients}
    # how: (signal, the server's --shutdown_grace_seconds)
    stops = {"kill -9": (signal.SIGKILL, 0), "SIGTERM (drain)": (signal.SIGTERM, 0),
             f"SIGTERM (drain, grace {GRACE_SECONDS} s)": (signal.SIGTERM, GRACE_SECONDS)}

    def reported(run):
        """run() in a thread, its failure printed (a thread's SystemExit is
        otherwise silent); the missing result then fails a check below."""
        def target(*a):
            try:
                run(*a)
            except BaseException as e:  # noqa: B036 - printed, then reported as a failed check
                print(f"error: {type(e).__name__}: {e}", flush=True)
        return target

    @reported
    def run_plain():
        with tempfile.TemporaryDirectory(prefix="drt-client-restart-") as tmp:
            server = Server(args.server_binary, free_port(), os.path.join(tmp, "state"))
            server.start()
            try:
                plain["result"] = subprocess.run(
                    [arg.replace("PORT", str(server.port)) for arg in clients["python"]],
                    capture_output=True, text=True, timeout=300)
            finally:
                server.stop(signal.SIGKILL)

    @reported
    def run_client(name, how):
        sig, grace = stops[how]
        runs[name][how] = client_runs_retried(grpc, pb, pb_grpc, args.server_binary, name,
                                              clients[name], retry[name], sig, grace)

    threads = [threading.Thread(target=run_plain)]
    threads += [threading.Thread(target=run_client, args=(name, how)) for name in clients for how in stops]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if "result" not in plain or any(len(runs[name]) != len(stops) for name in clients):
        checks.expect(False, "every run finished (see the error above)")
        return checks.summary()
    result = plain["result"]
    code, output = result.returncode, result.stdout + result.stderr
    tokens = field(r"^append: ([\d,]+) tokens", output)
    answer = field(r"^answer: (.*)$", output)
    prompt = field(r"^prompt: (.*)$", output)
    checks.expect(code == 0 and tokens and answer is not None,
                  f"uninterrupted run: {tokens} tokens, answer {answer!r}", output[-1500:])
    if code != 0 or not tokens:
        return checks.summary()

    for name in clients:
        runs[name] = {how: runs[name][how] for how in stops}  # a fixed order for the report
        check_client(name, retry[name], runs[name], (tokens, answer, prompt), checks)
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Both example clients send the x-drt-session routing header on every call.

A gateway keeps a session on one replica by hashing this header
(deploy/k8s/gateway/envoy.yaml), so each call of a session, CreateSession
included, must carry the same key. The test puts a recording gRPC proxy
between the clients and a real drt-server (the bundled model), runs the
Python and the C++ client through it on a short passkey haystack, and checks
the metadata every call carried, and that a bad --session-key is refused.
It also checks the clients' refusals of bad input, before anything is sent:
the haystack's options with a prompt of one's own (--require-passkey there
used to pass whatever the answer), and for the Python client a missing file,
a prompt file that is not UTF-8 (named by byte offset) and a negative --seed
(each used to end in a traceback or an opaque gRPC error).

    session_header_test.py --server-binary build/server/drt-server \
        --cpp-client build/client_examples/drt-client --stubs build/python
"""
import argparse
import os
import re
import subprocess
import sys
import threading
from concurrent import futures

from checks import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HEADER = "x-drt-session"
# Every method the clients call in a run; each must carry the header.
SESSION_METHODS = {"GetModelInfo", "CreateSession", "Append", "Generate", "DeleteSession"}
FORWARDED = (HEADER, "authorization")


class RecordingProxy:
    """Forwards every call, as raw bytes, to drt-server and records its metadata."""

    def __init__(self, grpc, upstream):
        self.grpc = grpc
        self.channel = grpc.insecure_channel(upstream)
        self.lock = threading.Lock()
        self.calls = []  # (method name, {metadata key: value})

    def take(self):
        with self.lock:
            calls, self.calls = self.calls, []
        return calls

    def handler(self):
        grpc, proxy = self.grpc, self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):
                metadata = dict(details.invocation_metadata)
                with proxy.lock:
                    proxy.calls.append((details.method.rsplit("/", 1)[-1], metadata))
                # The wire format does not tell unary from streaming calls, so
                # one stream-stream passthrough serves every method.
                upstream = proxy.channel.stream_stream(details.method)
                forward = [(k, v) for k, v in metadata.items() if k in FORWARDED]

                def relay(requests, context):
                    call = upstream(requests, metadata=forward)
                    context.add_callback(call.cancel)
                    try:
                        yield from call
                    except grpc.RpcError as e:
                        context.abort(e.code(), e.details())

                return grpc.stream_stream_rpc_method_handler(relay)

        return Handler()


def start_server(binary):
    process = subprocess.Popen(
        [binary, "--model", os.path.join(REPO, "models", "drt-passkey-byte"),
         "--listen", "127.0.0.1:0", "--http_listen", "", "--shutdown_grace_seconds", "1",
         "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        m = re.match(r"drt-server listening on (\S+) \(grpc\)", line)
        if m:
            return process, m.group(1)
    process.wait()
    raise SystemExit(f"drt-server exited with {process.returncode} before listening")


def run_client(command):
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    return result.returncode, result.stdout + result.stderr


def check_run(checks, name, calls, expected_key=None):
    """All calls of one client run carry one non-empty key; returns that key."""
    methods = {method for method, _ in calls}
    checks.expect(SESSION_METHODS <= methods, f"{name}: made every session call",
                  f"calls seen: {sorted(methods)}")
    missing = [method for method, metadata in calls if not metadata.get(HEADER)]
    checks.expect(not missing, f"{name}: {HEADER} on every call ({len(calls)} calls)",
                  f"calls without it: {missing}")
    keys = {metadata.get(HEADER) for _, metadata in calls}
    checks.expect(len(keys) == 1, f"{name}: one key for the whole session", f"keys: {keys}")
    key = next(iter(keys)) if len(keys) == 1 else None
    if expected_key is not None:
        checks.expect(key == expected_key, f"{name}: the key is --session-key",
                      f"sent {key!r}, expected {expected_key!r}")
    return key


def check_refusals(checks, proxy, python_client, cpp_client):
    """Bad input is refused naming the problem, with nothing sent."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="drt-client-refusals-") as tmp:
        text = os.path.join(tmp, "prompt.txt")
        with open(text, "w") as f:
            f.write("Some prompt text.\n")
        latin1 = os.path.join(tmp, "latin1.txt")
        with open(latin1, "wb") as f:
            f.write(b"caf\xe9 au lait")  # 0xE9 at byte 3 is not UTF-8
        # The shared commands without the haystack's options (--haystack-tokens,
        # --require-passkey, --passkey and their values): these cases use a
        # prompt file instead.
        def without_haystack(command, flags):
            out, skip = [], False
            for arg in command:
                if skip:
                    skip = False
                elif arg in flags:
                    skip = flags[arg]
                else:
                    out.append(arg)
            return out

        py = without_haystack(python_client, {"--haystack-tokens": True, "--passkey": True,
                                              "--require-passkey": False})
        cpp = without_haystack(cpp_client, {"--haystack_tokens": True, "--passkey": True,
                                            "--require_passkey": False})
        cases = [
            ("python --require-passkey with --prompt-file", py + ["--prompt-file", text, "--require-passkey"],
             r"--require-passkey needs the generated haystack"),
            ("python --depth with --token-ids", py + ["--token-ids", text, "--depth", "0.2"],
             r"--depth needs the generated haystack"),
            ("python --passkey with --prompt-file", py + ["--prompt-file", text, "--passkey", "12345"],
             r"--passkey needs the generated haystack"),
            ("c++ --require_passkey with --prompt_file", cpp + ["--prompt_file", text, "--require_passkey"],
             r"--require_passkey needs the generated haystack"),
            ("c++ --haystack_tokens with --token_ids", cpp + ["--token_ids", text, "--haystack_tokens", "99"],
             r"--haystack_tokens needs the generated haystack"),
            ("python missing --prompt-file", py + ["--prompt-file", os.path.join(tmp, "missing.txt")],
             r"--prompt-file .*missing\.txt: No such file"),
            ("python non-UTF-8 --prompt-file", py + ["--prompt-file", latin1],
             r"not UTF-8 at byte 3 "),
            ("python --seed -1", py + ["--seed=-1"], r"--seed: .*0 to 2\^64"),
            ("python --deadline -1", py + ["--deadline=-1"], r"--deadline must be positive"),
        ]
        for name, command, pattern in cases:
            code, output = run_client(command)
            checks.expect(code != 0 and re.search(pattern, output) and "Traceback" not in output,
                          f"{name}: refused, naming the problem", output[-800:])
            checks.expect(not proxy.take(), f"{name}: nothing is sent")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-binary", required=True)
    p.add_argument("--cpp-client", required=True)
    p.add_argument("--stubs", required=True)
    args = p.parse_args()
    sys.path.insert(0, args.stubs)
    import grpc

    server, address = start_server(args.server_binary)
    proxy = RecordingProxy(grpc, address)
    front = grpc.server(futures.ThreadPoolExecutor(max_workers=8), handlers=[proxy.handler()])
    port = front.add_insecure_port("127.0.0.1:0")
    front.start()
    target = f"127.0.0.1:{port}"
    haystack = ["--passkey", "31415"]
    python_client = [sys.executable, os.path.join(REPO, "client_examples", "python", "drt_client.py"),
                     "--stubs", args.stubs, "--server", target, "--haystack-tokens", "1500",
                     "--max-tokens", "8", "--require-passkey", "--stop", "."] + haystack
    cpp_client = [args.cpp_client, "--server", target, "--haystack_tokens", "1500",
                  "--max_tokens", "8", "--require_passkey", "--stop", ".", "--passkey", "31415"]
    checks = Checks()
    try:
        runs = {}
        for name, command in [("python", python_client), ("python again", python_client),
                              ("c++", cpp_client)]:
            code, output = run_client(command)
            checks.expect(code == 0 and "answer correct: yes" in output,
                          f"{name}: passkey answered through the proxy", output[-2000:])
            runs[name] = check_run(checks, name, proxy.take())
            checks.expect(f"({HEADER}: {runs[name]})" in output,
                          f"{name}: prints the key it sent", output[-500:])
        checks.expect(len(set(runs.values())) == len(runs),
                      "default keys differ from run to run", f"keys: {runs}")

        code, output = run_client(python_client + ["--session-key", "tenant-7/conversation 42"])
        checks.expect(code == 0, "python --session-key: passkey answered", output[-2000:])
        check_run(checks, "python --session-key", proxy.take(), "tenant-7/conversation 42")
        code, output = run_client(cpp_client + ["--session_key", "tenant-7/conversation 42"])
        checks.expect(code == 0, "c++ --session_key: passkey answered", output[-2000:])
        check_run(checks, "c++ --session_key", proxy.take(), "tenant-7/conversation 42")

        for name, command in [("python", python_client + ["--session-key", "caf\u00e9"]),
                              ("c++", cpp_client + ["--session_key", "line\nbreak"])]:
            code, output = run_client(command)
            checks.expect(code != 0 and re.search(r"--session[-_]key", output) and "printable ASCII" in output,
                          f"{name}: a non-ASCII key is refused naming the flag", output[-500:])
            checks.expect(not proxy.take(), f"{name}: nothing is sent with a refused key")
        check_refusals(checks, proxy, python_client, cpp_client)
    finally:
        front.stop(0)
        server.terminate()
        server.wait(timeout=30)
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())

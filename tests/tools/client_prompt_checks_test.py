#!/usr/bin/env python3
"""Both clients (client_examples/cpp drt-client, client_examples/python
drt_client.py) refuse a prompt the server would refuse, before they make a
session (review-tools 2026-11-25 #8):

- before connecting (the --server here has nothing listening): an empty
  --prompt-file / --token-ids file without --question, and a token-id file
  that does not parse (the word and its index named);
- after GetModelInfo and before CreateSession, against a real drt-server on
  the bundled passkey model: ids outside the vocabulary, the landmark id and
  the pad id, naming the file and the index. The server's
  drt_requests_total{method="CreateSession"} shows that no session was made
  (one good run at the end shows the count moves);
- sampling values the server refuses (--temperature -1, --top-p 2) are
  refused by CreateSession (which both clients send them to) and
  --max-tokens over GetModelInfo's max_tokens_limit before it: no Append
  (drt_requests_total{method="Append"}).

The Python client's server half needs grpc in this interpreter and the
stubs in build/python; without them it is skipped, and said.

    client_prompt_checks_test.py --client build/client_examples/drt-client \
        --server_binary build/server/drt-server --stubs build/python
"""
import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(REPO, "models", "drt-passkey-byte")  # vocab 258: pad 256, landmark 257
PY_CLIENT = os.path.join(REPO, "client_examples", "python", "drt_client.py")
FAILED = []


def expect(ok, what, detail=""):
    print(("ok: " if ok else "FAILED: ") + what + ("" if ok or not detail else f"\n  {detail}"))
    if not ok:
        FAILED.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clients(args):
    """(name, argv prefix, flag spelling) per client."""
    return (("drt-client", [args.client], "_"),
            ("drt_client.py", [sys.executable, PY_CLIENT, "--stubs", args.stubs], "-"))


def run(argv, timeout=60):
    return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout)


def before_connecting(args, tmp):
    empty = os.path.join(tmp, "empty.txt")
    open(empty, "w").close()
    blank_ids = os.path.join(tmp, "blank_ids.txt")
    with open(blank_ids, "w") as f:
        f.write(" \n\t\n")
    bad_ids = os.path.join(tmp, "bad_ids.txt")
    with open(bad_ids, "w") as f:
        f.write("72 105\nx 33\n")
    huge_ids = os.path.join(tmp, "huge_ids.txt")
    with open(huge_ids, "w") as f:
        f.write("72 4294967296\n")
    nobody = f"127.0.0.1:{free_port()}"  # nothing listens: a refusal must come first
    for name, prefix, sep in clients(args):
        flag = lambda n: "--" + n.replace("_", sep)
        common = [flag("server"), nobody, flag("connect_timeout"), "1", flag("retry_seconds"), "0"]
        for extra, wants in (
                ([flag("prompt_file"), empty], [f"{flag('prompt_file')} {empty} is empty (and no {flag('question')})"]),
                ([flag("token_ids"), blank_ids], [f"{flag('token_ids')} {blank_ids} holds no token ids"]),
                ([flag("token_ids"), bad_ids], [f"{flag('token_ids')} {bad_ids}: 'x' (index 2) is not a 32-bit integer"]),
                ([flag("token_ids"), huge_ids], [f"'4294967296' (index 1) is not a 32-bit integer"])):
            done = run(prefix + common + extra)
            expect(done.returncode != 0 and all(w in done.stderr for w in wants) and "cannot reach" not in done.stderr,
                   f"{name} {' '.join(extra[:1])} {os.path.basename(extra[1])}: refused before connecting",
                   f"rc {done.returncode}: {done.stderr.strip()[-300:]}")
        # With --question the prompt is not empty: the client goes on (and
        # then finds no server).
        done = run(prefix + common + [flag("prompt_file"), empty, flag("question"), "What?"])
        went_on = "cannot reach" in done.stderr or "No module named 'grpc'" in done.stderr  # past parse_args
        expect(done.returncode != 0 and "is empty" not in done.stderr and went_on,
               f"{name}: an empty --prompt-file with --question is a prompt (it goes on to connect)",
               done.stderr.strip()[-300:])


def metric(http, name, label):
    text = urllib.request.urlopen(f"http://{http}/metrics", timeout=10).read().decode()
    m = re.search(rf'^{name}\{{[^}}]*{label}[^}}]*\}} (\d+)', text, re.M)
    return int(m.group(1)) if m else 0


def against_server(args, tmp):
    grpc_port, http_port = free_port(), free_port()
    server = subprocess.Popen([args.server_binary, "--model", MODEL, "--listen", f"127.0.0.1:{grpc_port}",
                               "--http_listen", f"127.0.0.1:{http_port}", "--threads", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    http = f"127.0.0.1:{http_port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                metric(http, "drt_requests_total", "CreateSession")
                break
            except OSError:
                time.sleep(0.2)
        python_ok = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {args.stubs!r}); "
                                    "import grpc; from drt.v1 import drt_pb2"], capture_output=True).returncode == 0
        if not python_ok:
            print(f"SKIPPED: drt_client.py against the server ({sys.executable} has no grpc or no stubs in "
                  f"{args.stubs}); its checks before connecting ran above")
        cases = []
        for ids, index, why in (("72 105 300 33", 2, "is outside the model's vocabulary [0, 258)"),
                                ("72 -1", 1, "is outside the model's vocabulary [0, 258)"),
                                ("72 105 257", 2, "is the landmark id, which only the engine inserts"),
                                ("256 72", 0, "is the pad id, which only the engine inserts")):
            path = os.path.join(tmp, f"ids_{len(cases)}.txt")
            with open(path, "w") as f:
                f.write(ids + "\n")
            cases.append((path, ids.split()[index], index, why))
        for name, prefix, sep in clients(args):
            if name == "drt_client.py" and not python_ok:
                continue
            flag = lambda n: "--" + n.replace("_", sep)
            for path, token, index, why in cases:
                done = run(prefix + [flag("server"), f"127.0.0.1:{grpc_port}", flag("token_ids"), path,
                                     flag("max_tokens"), "1"])
                want = f"{flag('token_ids')} {path}: token {token} (index {index}) {why}"
                expect(done.returncode == 1 and want in done.stderr and "session:" not in done.stdout,
                       f"{name}: token {token} at index {index} refused before CreateSession",
                       f"rc {done.returncode}: {done.stderr.strip()[-300:]}")
        expect(metric(http, "drt_requests_total", "CreateSession") == 0,
               "the server made no session for any refused prompt")
        good = os.path.join(tmp, "good.txt")
        with open(good, "w") as f:
            f.write("72 105\n")
        done = run([args.client, "--server", f"127.0.0.1:{grpc_port}", "--token_ids", good, "--max_tokens", "1"])
        expect(done.returncode == 0 and metric(http, "drt_requests_total", "CreateSession") == 1,
               "a good id file makes one session (the count the check above reads moves)",
               f"rc {done.returncode}: {done.stderr.strip()[-300:]}")
        appends = metric(http, "drt_requests_total", "Append")
        expect(appends == 1, "the good run made one Append", f"{appends}")
        # Sampling values the server refuses are refused by CreateSession,
        # before any of the prompt is sent; --max-tokens over the server's
        # limit before the session (review-grpc finding 13).
        for name, prefix, sep in clients(args):
            if name == "drt_client.py" and not python_ok:
                continue
            flag = lambda n: "--" + n.replace("_", sep)
            common = prefix + [flag("server"), f"127.0.0.1:{grpc_port}", flag("token_ids"), good]
            for extra, want in (([flag("temperature"), "-1", flag("max_tokens"), "1"], "temperature must be"),
                                ([flag("top_p"), "2", flag("max_tokens"), "1"], "top_p must be"),
                                ([flag("max_tokens"), "2000000"],
                                 f"{flag('max_tokens')} 2000000 is over this server's limit of 1048576")):
                done = run(common + extra)
                expect(done.returncode == 1 and want in done.stderr and "append:" not in done.stdout,
                       f"{name} {' '.join(extra[:2])}: refused before the prompt is sent",
                       f"rc {done.returncode}: {done.stderr.strip()[-300:]}")
        expect(metric(http, "drt_requests_total", "Append") == appends,
               "no Append for a refused sampling value or --max-tokens")
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--client", required=True)
    p.add_argument("--server_binary", required=True)
    p.add_argument("--stubs", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before_connecting(args, tmp)
        against_server(args, tmp)
    if FAILED:
        print(f"{len(FAILED)} FAILED")
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Both example clients' --tokenize and --detokenize against a real
drt-server with the bundled byte model (models/drt-text-byte), whose
tokenizer spells UTF-8 text as its bytes (the expectation here):

- --tokenize --prompt-file prints '<count> tokens (context limit <n>)' and
  the ids on one line: the file's bytes, the server's --max_context_tokens;
  --count-only prints the first line only;
- --detokenize --token-ids writes the ids' bytes to stdout exactly (a UTF-8
  character cut by the last id too); the landmark id (257) is refused,
  exit 1, naming it;
- flag misuse (--count-only without --tokenize, --tokenize without a file,
  --detokenize without ids) is refused by name before anything is sent;
- neither makes a session (ListSessions stays empty).

    client_tokenize_test.py --server-binary build/server/drt-server \\
        --cpp-client build/client_examples/drt-client --stubs build/python
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading

from checks import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(REPO, "models", "drt-text-byte")
PYTHON_CLIENT = os.path.join(REPO, "client_examples", "python", "drt_client.py")
LIMIT = 123456


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(binary, port):
    process = subprocess.Popen(
        [binary, "--model", MODEL, "--listen", f"127.0.0.1:{port}", "--http_listen", "",
         "--device", "cpu", "--max_context_tokens", str(LIMIT)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready = threading.Event()
    log = []

    def drain():
        for line in process.stdout:
            log.append(line)
            if "listening on" in line:
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(120) or process.poll() is not None:
        raise SystemExit("drt-server did not start:\n" + "".join(log[-30:]))
    return process


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server-binary", required=True)
    p.add_argument("--cpp-client", required=True)
    p.add_argument("--stubs", required=True)
    args = p.parse_args()
    sys.path.insert(0, args.stubs)
    import grpc
    from drt.v1 import drt_pb2 as pb, drt_pb2_grpc as pb_grpc

    port = free_port()
    server = start_server(args.server_binary, port)
    checks = Checks()
    try:
        address = f"127.0.0.1:{port}"
        clients = {
            "python": lambda *flags: [sys.executable, PYTHON_CLIENT, "--server", address,
                                      "--stubs", args.stubs, *flags],
            # The C++ client spells its flags with '_' (--prompt_file).
            "c++": lambda *flags: [args.cpp_client, "--server", address,
                                   *["--" + f[2:].replace("-", "_") if f.startswith("--") else f
                                     for f in flags]],
        }
        text = "Caf\u00e9 au lait, \u65e5\u672c <|pad|> 42.\n"
        data = text.encode("utf-8")
        with tempfile.TemporaryDirectory() as tmp:
            prompt = os.path.join(tmp, "prompt.txt")
            with open(prompt, "wb") as f:
                f.write(data)
            ids_file = os.path.join(tmp, "ids.txt")
            cut = list(b"hi \xc3\xa9") + [0xE6, 0x97]  # ends inside a character
            with open(ids_file, "w") as f:
                f.write(" ".join(map(str, cut)))
            landmark_file = os.path.join(tmp, "landmark.txt")
            with open(landmark_file, "w") as f:
                f.write("104 257")
            for name, command in clients.items():
                r = subprocess.run(command("--tokenize", "--prompt-file", prompt),
                                   capture_output=True, timeout=120)
                lines = r.stdout.decode().splitlines()
                checks.expect(r.returncode == 0 and len(lines) == 2 and
                              lines[0] == f"{len(data)} tokens (context limit {LIMIT})" and
                              lines[1].split() == [str(b) for b in data],
                              f"{name}: --tokenize prints the count, the limit and the file's bytes as ids",
                              f"rc {r.returncode}\n{r.stdout!r}\n{r.stderr!r}")
                r = subprocess.run(command("--tokenize", "--count-only", "--prompt-file", prompt),
                                   capture_output=True, timeout=120)
                checks.expect(r.returncode == 0 and
                              r.stdout.decode() == f"{len(data)} tokens (context limit {LIMIT})\n",
                              f"{name}: --count-only prints the count only",
                              f"rc {r.returncode}\n{r.stdout!r}\n{r.stderr!r}")
                r = subprocess.run(command("--detokenize", "--token-ids", ids_file),
                                   capture_output=True, timeout=120)
                checks.expect(r.returncode == 0 and r.stdout == bytes(cut),
                              f"{name}: --detokenize writes the ids' bytes exactly",
                              f"rc {r.returncode}\n{r.stdout!r}\n{r.stderr!r}")
                r = subprocess.run(command("--detokenize", "--token-ids", landmark_file),
                                   capture_output=True, timeout=120)
                checks.expect(r.returncode == 1 and b"landmark id" in r.stderr,
                              f"{name}: --detokenize of the landmark id fails naming it",
                              f"rc {r.returncode}\n{r.stdout!r}\n{r.stderr!r}")
                # Flag misuse is refused before anything is read or sent (no
                # session is made: the ListSessions check below).
                for flags, words in [
                        (("--count-only", "--prompt-file", prompt), "--count-only goes with --tokenize"),
                        (("--tokenize",), "--tokenize needs --prompt-file"),
                        (("--detokenize", "--count-only", "--token-ids", ids_file),
                         "--count-only goes with --tokenize"),
                        (("--detokenize",), "--detokenize needs --token-ids")]:
                    r = subprocess.run(command(*flags), capture_output=True, timeout=120)
                    checks.expect(r.returncode != 0 and r.stdout == b"" and
                                  words in r.stderr.decode().replace("_", "-"),
                                  f"{name}: {' '.join(flags[:2])} is refused: {words}",
                                  f"rc {r.returncode}\n{r.stdout!r}\n{r.stderr!r}")
        channel = grpc.insecure_channel(address)
        sessions = pb_grpc.DrtStub(channel).ListSessions(pb.ListSessionsRequest(), timeout=10).sessions
        checks.expect(len(sessions) == 0, "no session was made", f"{len(sessions)} sessions")
    finally:
        server.terminate()
        server.wait(timeout=60)
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Both example clients against a stand-in server (no model): their input
checks and a stuck CreateSession.

- a --prompt-file that is not UTF-8 is refused before anything is sent,
  naming the file, the byte offset and the reason, as Python's own UTF-8
  decoder gives them (the expectation here): a bad start byte, a
  surrogate, a character cut by the end of the file (review-tools #7: the
  C++ client sent the valid pieces first and the server then refused a
  "message N");
- --stop is repeatable and taken verbatim, commas included, in both
  spellings (--stop X, --stop=X): the Generate carries exactly the stop
  sequences given, in order (review-tools #12: the C++ flag split on commas
  and kept only its last use);
- a bare --stop takes the next argument unless it starts with '-': then
  it reads as an option (--stop --seed 3, a forgotten value) and is refused
  before anything is sent, naming the --stop=VALUE form, which takes any
  value; a stop sequence is text, so -5, -1e5, '-' and '-a b' are no
  exception in either client (the Python client followed argparse, whose
  idea of a negative number depends on the Python version: -1e5 refused
  before 3.14, accepted after, '-a b' accepted; the C++ client accepted -5);
- an empty --stop is refused before anything is sent (the server refuses it
  only at the Generate, after the whole Append); --sto (argparse's
  abbreviation, which would go around the rule above) is refused; these
  refusals exit 1 in both clients (the Python client's argparse errors
  exited 2), and with two bad stops both name the first;
- a --question or --stop whose bytes are not UTF-8 is refused before
  anything is sent, exit status 1 in both, naming the flag, the byte offset
  and the reason as Python's decoder gives them (the Python client failed
  with a traceback building the request, after the whole Append); a UTF-8
  one arrives intact;
- Ctrl-C or SIGTERM while CreateSession hangs on the server ends the client
  at once with exit 130 (review-tools #9: the C++ client waited out the
  call's 30 s deadline);
- the sampling flags (--min-p, --presence-penalty, --frequency-penalty,
  --logit-bias ID:BIAS,...; min_p ... logit_bias in the C++ client) reach
  the Generate's SamplingParams; a --logit-bias that is not ID:BIAS pairs
  is refused before any call, naming the flag;
- with no server at --server (port 1), the client exits after
  --connect-timeout naming the reason gRPC gives (connection refused).

    client_input_test.py --cpp-client build/client_examples/drt-client --stubs build/python
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures

from checks import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class StandIn:
    def __init__(self, pb, pb_grpc):
        self.lock = threading.Lock()
        self.release = threading.Event()  # lets a hanging CreateSession go
        self.reset(False)
        outer = self

        class Servicer(pb_grpc.DrtServicer):
            def GetModelInfo(self, request, context):
                with outer.lock:
                    outer.calls += 1
                return pb.ModelInfo(name="stand-in", device="none", vocab_size=258, tokenizer="bytes",
                                    pad_id=256, chunk_id=257, enc_chunk_size=64, max_context_tokens=1 << 20)

            def CreateSession(self, request, context):
                with outer.lock:
                    outer.calls += 1
                    outer.creates += 1
                outer.create_called.set()
                if outer.hang_create:
                    outer.release.wait(60)
                return pb.CreateSessionResponse(session_id="s1")

            def DeleteSession(self, request, context):
                return pb.DeleteSessionResponse()

            def Append(self, requests, context):
                requests = list(requests)
                with outer.lock:
                    outer.texts.append("".join(r.text for r in requests))
                n = sum(len(r.text.encode()) + len(r.tokens.ids) for r in requests)
                yield pb.AppendResponse(summary=pb.AppendSummary(
                    tokens_ingested=n, session_tokens=n, session_chunks=n // 63, tokens_per_second=1))

            def Generate(self, request, context):
                with outer.lock:
                    outer.stops.append(list(request.stop))
                    outer.samplings.append(request.sampling)
                    outer.logprob_asks.append((request.return_logprobs, request.top_logprobs))
                if request.top_logprobs > 0:
                    # Made-up values, easy to find in the output.
                    tops = [pb.TokenTopLogprobs(token_bytes=b"2", alternatives=[
                                pb.TokenLogprob(token_id=50, logprob=-0.25, token_bytes=b"2"),
                                pb.TokenLogprob(token_id=51, logprob=-1.5, token_bytes=b"3")]),
                            pb.TokenTopLogprobs(token_bytes=b".", alternatives=[
                                pb.TokenLogprob(token_id=44, logprob=-0.125, token_bytes=b","),
                                pb.TokenLogprob(token_id=195, logprob=-2.0, token_bytes=b"\xc3")])]
                    yield pb.GenerateResponse(piece=pb.GeneratedPiece(
                        text="2.", token_ids=[50, 46], logprobs=[-0.25, -3.0], top_logprobs=tops))
                else:
                    yield pb.GenerateResponse(piece=pb.GeneratedPiece(text="2.", token_ids=[50, 46]))
                yield pb.GenerateResponse(done=pb.GenerateDone(finish_reason=pb.FINISH_REASON_STOP_SEQUENCE))

        self.servicer = Servicer()

    def reset(self, hang_create):
        with self.lock:
            self.hang_create = hang_create
            self.calls, self.creates, self.stops, self.texts = 0, 0, [], []
            self.samplings = []
            self.logprob_asks = []
            self.create_called = threading.Event()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpp-client", required=True)
    p.add_argument("--stubs", required=True)
    args = p.parse_args()
    sys.path.insert(0, args.stubs)
    import grpc
    from drt.v1 import drt_pb2 as pb, drt_pb2_grpc as pb_grpc

    stand_in = StandIn(pb, pb_grpc)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_DrtServicer_to_server(stand_in.servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    target = f"127.0.0.1:{port}"
    checks = Checks()
    clients = {
        "python": ([sys.executable, os.path.join(REPO, "client_examples", "python", "drt_client.py"),
                    "--stubs", args.stubs, "--server", target, "--max-tokens", "2"], "--prompt-file"),
        "c++": ([args.cpp_client, "--server", target, "--max_tokens", "2"], "--prompt_file"),
    }
    # Not UTF-8: a byte that starts no character, a surrogate (well formed
    # in shape, refused by UTF-8), and a 3-byte character cut by the end.
    bad_files = {"bad-start": b"hello \xc3\xa9 \xff world", "surrogate": "\u65e5".encode() + b"a\xed\xa0\x80b",
                 "cut": b"abc \xe2\x82"}
    with tempfile.TemporaryDirectory(prefix="drt-client-input-") as tmp:
        good = os.path.join(tmp, "good.txt")
        with open(good, "w", encoding="utf-8") as f:
            f.write("h\u00e9llo, w\u00f6rld " * 20)
        try:
            for name, (base, prompt_flag) in clients.items():
                def run(extra):
                    stand_in.reset(False)
                    r = subprocess.run(base + extra, capture_output=True, text=True, errors="replace", timeout=60)
                    return r.returncode, r.stdout + r.stderr

                for case, data in bad_files.items():
                    path = os.path.join(tmp, case + ".txt")
                    with open(path, "wb") as f:
                        f.write(data)
                    try:
                        data.decode("utf-8")
                        expected = None
                    except UnicodeDecodeError as e:
                        expected = f"{prompt_flag} {path}: not UTF-8 at byte {e.start:,} ({e.reason})"
                    code, out = run([prompt_flag, path])
                    checks.expect(expected is not None and code not in (0, None) and expected in out
                                  and stand_in.calls == 0 and "Traceback" not in out,
                                  f"{name}, {case}: a prompt file that is not UTF-8 is refused before any call, "
                                  f"naming the file and byte ({expected!r}; {stand_in.calls} calls made)",
                                  out[-1500:])

                # No server on port 1: after --connect-timeout the client
                # says why it has no connection (it said only "cannot reach",
                # review-newuser L4).
                timeout_flag = "--connect-timeout" if name == "python" else "--connect_timeout"
                unreachable = [a if a != target else "127.0.0.1:1" for a in base]
                r = subprocess.run(unreachable + [prompt_flag, good, f"{timeout_flag}=0.5"],
                                   capture_output=True, text=True, errors="replace", timeout=60)
                out = r.stdout + r.stderr
                checks.expect(r.returncode not in (0, None)
                              and "cannot reach drt-server at 127.0.0.1:1 within 0.5 s: " in out
                              and "Connection refused" in out and "Traceback" not in out,
                              f"{name}: an unreachable server is named with the reason (exit {r.returncode})",
                              out[-1500:])

                given = ["a, b", "x,y", "."]
                code, out = run([prompt_flag, good, "--stop", "a, b", "--stop=x,y", "--stop", "."])
                checks.expect(code == 0 and stand_in.stops == [given],
                              f"{name}: --stop 'a, b' --stop=x,y --stop . sends exactly those three stop "
                              f"sequences, commas kept (sent: {stand_in.stops})", out[-1500:])

                code, out = run([prompt_flag, good, "--stop", "."])
                checks.expect(code == 0 and stand_in.stops == [["."]],
                              f"{name}: one --stop sends one stop sequence (sent: {stand_in.stops})", out[-1500:])

                # A bare --stop followed by an argument that starts with '-':
                # refused before any call, naming the --stop=VALUE form (the
                # C++ client took "--seed" as the stop sequence), whatever
                # the rest looks like; --stop=VALUE takes each.
                dashed = ["--seed", "-5", "-1e5", "-", "-a b"]
                for value in dashed:
                    code, out = run([prompt_flag, good, "--stop", value])
                    checks.expect(code == 1 and f"write --stop={value}" in out
                                  and stand_in.calls == 0 and "Traceback" not in out,
                                  f"{name}: --stop {value!r} is refused before any call, naming --stop={value} "
                                  f"(exit {code}, {stand_in.calls} calls made)", out[-1500:])
                code, out = run([prompt_flag, good] + [f"--stop={value}" for value in dashed])
                checks.expect(code == 0 and stand_in.stops == [dashed],
                              f"{name}: --stop=VALUE sends each of {dashed} (sent: {stand_in.stops})", out[-1500:])
                code, out = run([prompt_flag, good, "--stop"])
                checks.expect(code == 1 and "--stop needs a value" in out and stand_in.calls == 0
                              and "Traceback" not in out,
                              f"{name}: a --stop without a value is refused before any call, exit 1 "
                              f"(exit {code})", out[-1500:])
                # An abbreviation would go around the rule (argparse takes
                # --sto for --stop; absl knows no --sto).
                for sto in (["--sto", "x"], ["--sto=x"]):
                    code, out = run([prompt_flag, good] + sto)
                    checks.expect(code == 1 and "sto" in out and stand_in.calls == 0 and "Traceback" not in out,
                                  f"{name}: {' '.join(sto)} is refused before any call, exit 1 "
                                  f"(exit {code}, {stand_in.calls} calls made)", out[-1500:])

                # Not UTF-8 on the command line: a byte that starts no
                # character, a character cut by the end, a surrogate.
                for flag, data in (("--question", b"what \xff?"), ("--question", b"\xe2\x82"),
                                   ("--stop", b"a\xed\xa0\x80")):
                    try:
                        data.decode("utf-8")
                        expected = None
                    except UnicodeDecodeError as e:
                        expected = f"{flag}: not UTF-8 at byte {e.start} ({e.reason})"
                    code, out = run([prompt_flag, good, flag, data])
                    checks.expect(expected is not None and code == 1 and expected in out and stand_in.calls == 0
                                  and "Traceback" not in out,
                                  f"{name}: {flag} {data!r} is refused before any call, exit 1, naming the flag "
                                  f"and byte ({expected!r}; exit {code}, {stand_in.calls} calls made)", out[-1500:])
                question = " \u00bfQu\u00e9 n\u00famero? \u65e5"
                code, out = run([prompt_flag, good, "--question", question])
                checks.expect(code == 0 and len(stand_in.texts) == 1 and stand_in.texts[0].endswith(question),
                              f"{name}: a UTF-8 --question arrives intact after the prompt "
                              f"(sent ends: {[t[-20:] for t in stand_in.texts]})", out[-1500:])

                # --top-logprobs / --top_logprobs N asks for the chosen
                # token's logprob and N alternatives and prints one line per
                # token after the answer; out of [0, 20] it is refused first.
                top_flag = "--top-logprobs" if name == "python" else "--top_logprobs"
                code, out = run([prompt_flag, good, top_flag, "2"])
                quote = (lambda b: repr(b)) if name == "python" else (lambda b: '"' + b.decode("latin-1")
                                                                       .encode("unicode_escape").decode() + '"')
                lines = [l for l in out.splitlines() if "top:" in l]
                checks.expect(code == 0 and stand_in.logprob_asks == [(True, 2)] and len(lines) == 2
                              and "-0.2500" in lines[0] and f"{quote(b'3')}=-1.5000" in lines[0]
                              and "-3.0000" in lines[1] and f"{quote(b',')}=-0.1250" in lines[1]
                              and "=-2.0000" in lines[1],
                              f"{name}: {top_flag} 2 asks for logprobs and 2 alternatives (asked: "
                              f"{stand_in.logprob_asks}) and prints a line per token with them ({lines})",
                              out[-1500:])
                code, out = run([prompt_flag, good])
                checks.expect(code == 0 and stand_in.logprob_asks == [(False, 0)] and "top:" not in out,
                              f"{name}: without {top_flag} no logprobs are asked or printed", out[-1500:])
                for bad in ("21", "-1"):
                    code, out = run([prompt_flag, good, f"{top_flag}={bad}"])
                    checks.expect(code not in (0, None) and "top" in out and "[0, 20]" in out
                                  and stand_in.calls == 0 and "Traceback" not in out,
                                  f"{name}: {top_flag}={bad} is refused before any call (exit {code})",
                                  out[-1500:])

                code, out = run([prompt_flag, good, "--stop", ""])
                checks.expect(code == 1 and "--stop" in out and "empty" in out and stand_in.calls == 0
                              and "Traceback" not in out,
                              f"{name}: an empty --stop is refused before any call, exit 1 (exit {code}, "
                              f"{stand_in.calls} calls made)", out[-1500:])
                # Stop by stop: the first bad one is named, whichever its fault.
                code, out = run([prompt_flag, good, "--stop", b"a\xff", "--stop", ""])
                checks.expect(code == 1 and "--stop: not UTF-8 at byte 1" in out and "empty" not in out
                              and stand_in.calls == 0,
                              f"{name}: --stop b'a\\xff' --stop '' names the first, the UTF-8 fault (exit {code})",
                              out[-1500:])

                # The sampling controls reach the Generate (the server checks
                # their ranges); a --logit-bias it cannot read is refused first.
                dash = "-" if name == "python" else "_"
                code, out = run([prompt_flag, good, f"--min{dash}p", "0.125", f"--presence{dash}penalty", "-1.5",
                                 f"--frequency{dash}penalty", "0.75", f"--logit{dash}bias", "65:-100,10:2.5"])
                sent = [(s.min_p, s.presence_penalty, s.frequency_penalty, dict(s.logit_bias))
                        for s in stand_in.samplings]
                checks.expect(code == 0 and sent == [(0.125, -1.5, 0.75, {65: -100.0, 10: 2.5})],
                              f"{name}: the min_p, penalty and logit_bias flags reach the Generate (sent: {sent})",
                              out[-1500:])
                code, out = run([prompt_flag, good])
                sent = [(s.min_p, s.presence_penalty, s.frequency_penalty, dict(s.logit_bias))
                        for s in stand_in.samplings]
                checks.expect(code == 0 and sent == [(0.0, 0.0, 0.0, {})],
                              f"{name}: without them the Generate asks for none (sent: {sent})", out[-1500:])
                for bad in ("65", "a:1", "65:x", "65:1,", "-5:1", "4294967296:1", "2147483648:1"):
                    code, out = run([prompt_flag, good, f"--logit{dash}bias={bad}"])
                    checks.expect(code not in (0, None) and f"logit{dash}bias" in out and stand_in.calls == 0
                                  and "Traceback" not in out,
                                  f"{name}: --logit{dash}bias={bad} is refused before any call, naming the flag "
                                  f"(exit {code}, {stand_in.calls} calls made)", out[-1500:])

                # A CreateSession that hangs on the server (its 30 s deadline
                # far away): a signal ends the client at once.
                for sig in (signal.SIGINT, signal.SIGTERM):
                    stand_in.reset(True)
                    stand_in.release.clear()
                    client = subprocess.Popen(base + [prompt_flag, good], stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True, errors="replace")
                    called = stand_in.create_called.wait(30)
                    time.sleep(0.3)  # into the call's wait
                    sent = time.monotonic()
                    client.send_signal(sig)
                    try:
                        out, _ = client.communicate(timeout=40)
                        code = client.returncode
                    except subprocess.TimeoutExpired:
                        client.kill()
                        out, _ = client.communicate()
                        code = None
                    seconds = time.monotonic() - sent
                    stand_in.release.set()
                    checks.expect(called and code == 130 and seconds < 3 and "Traceback" not in out,
                                  f"{name}: {signal.Signals(sig).name} while CreateSession hangs exits 130 at once "
                                  f"(exit {code} after {seconds:.1f} s; < 3 s, the call's deadline is 30 s)",
                                  out[-1500:])
        finally:
            stand_in.release.set()
            server.stop(0)
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Both example clients' rules for calls cut by UNAVAILABLE, case by case.

A stand-in server (no model) keeps a session's tokens as a list and cuts
calls on cue, so that each rule of client_examples/README.md ("Server
restarts") is played where a real server cannot be steered as precisely
(client_restart_test.py does the real thing):

- bytes: a UTF-8 prompt (2- and 3-byte characters) whose Append is cut
  twice, each time with the session holding more than was acknowledged and
  the cut inside a character: the session must end holding exactly the
  prompt's bytes, once each;
- bpe-text: the same with a BPE tokenizer: the client cannot map tokens to
  text, so it must stop with an error giving the acknowledged and held
  counts, and send nothing more;
- literal: a byte-tokenizer text prompt holding "<|pad|>" before the cut:
  the client cannot tell whether that is one token or seven, so it refuses
  to resume (review-deployfix L1);
- bpe-ids: a token-id prompt with a BPE tokenizer, cut: ids resume exactly;
- generate-again: a Generate cut before any piece with the session
  unchanged is sent again (once);
- generate-pieces: a Generate cut after a piece, the session grown by what
  it generated (the server wrote it as the call ended: a drain), is not sent
  again;
- generate-crash: a Generate cut after a piece, the session as it was before
  it (a durable server writes a Generate only when it ends, so a crash
  during it leaves nothing of it), is sent again, and the piece already
  printed is not printed twice;
- generate-diverge: as generate-crash, but the try sent again answers "3"
  where the first printed "2" (a backend that is not batch-invariant, a
  restored session that is not bit-identical): an error saying it
  "answered differently", and the client cancels that call before it
  deletes the session (review-durablegen F3: the Python client left the
  call running, so with --keep-session the server generated on into it);
- generate-grew: a Generate cut before any piece, but the session grew
  (padding the client never saw), is not sent again;
- generate-lost: the same, but the session lost acknowledged prompt tokens
  (a crash with --state_sync interval): an error saying so, not "holds -N
  tokens more";
- lost: after the cut the session holds fewer tokens than were
  acknowledged (a crash with --state_sync interval): a warning, and the
  prompt resumed from what it holds, exactly;
- foreign: after the cut the session holds more tokens than the prompt has
  (someone else wrote to it): an error, nothing more sent;
- gone: GetSession answers NOT_FOUND after the cut (no --state_dir): an
  error saying so;
- no-retry: --retry-seconds 0 reports the Append's UNAVAILABLE as before;
- reset streams: through an HTTP/2 proxy (Envoy) a stream whose server died
  is reset, which gRPC reports as INTERNAL "Received RST_STREAM ..." or as
  CANCELLED: a cut Append with either code resumes exactly (the first
  GetSession after it also reports the session busy, so the clients' wait
  for the cut call to end is played), a Generate cut with either is sent
  again; an INTERNAL without RST_STREAM is an error, not a cut;
- interrupt: Ctrl-C (SIGINT) or SIGTERM while the client waits to retry
  (the session stays busy after a cut) ends it at once, and it still
  deletes the session (review-deployfix L4: the C++ client ignored it and
  retried on); with DeleteSession answering UNAVAILABLE too, the cleanup
  gets one attempt and the client still exits at once (review-tools #2: the
  Python client retried it for --retry-seconds, and SIGTERM killed it with
  the session left behind);
- created (Python client): SIGTERM right after CreateSession answered, while
  the session line is printed, still deletes the session (review-toolsfix #2);
- the retry bound (--retry-seconds 6) counts from the first cut after the
  session last took more of the prompt: flap-progress cuts an Append at
  once with nothing taken, is away FLAP_DOWN, then takes and acknowledges
  part of the resumed Append and stays up FLAP_STAY before cutting it and
  going away again. Each outage is well inside the bound, but the first
  cut and the second are more than 6 s apart: the client must finish (it
  gave up at the second cut, counting the time the server was up taking
  the prompt against the bound). flap-stuck is the same with nothing taken
  or acknowledged in the resumed call: no progress, so the bound counts
  from the first cut and the client gives up at the second.

    client_resume_test.py --cpp-client build/client_examples/drt-client --stubs build/python
"""
import argparse
import array
import fcntl
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import termios
import threading
import time
from concurrent import futures

from checks import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The stand-in acknowledges ACKED tokens of an Append, holds HELD, then cuts
# it, once per cut it is told to make.
ACKED = 2000
HELD = 2501
# The "foreign" case: tokens someone else appends to the session during the
# cut, more than the rest of the 9,000-id prompt.
FOREIGN = 10_000
# The "lost" case: the session holds this many fewer than acknowledged.
LOST = 300
# The flap cases: seconds GetSession answers UNAVAILABLE after each cut, and
# seconds the second Append call stays up before its cut. FLAP_DOWN is
# found back by the client's retries within about 2.3 s (delays 0.1-0.2,
# 0.2-0.4, 0.4-0.8, 0.8-1.6 s); FLAP_DOWN + FLAP_STAY is 6.5 s, past the
# bound of 6 s between the first cut and the second.
FLAP_BOUND = 6
FLAP_DOWN = 1.0
FLAP_STAY = 5.5
# fcntl's F_GETPIPE_SZ (Linux; in the fcntl module from Python 3.10 only).
F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)


class StandIn:
    def __init__(self, pb, pb_grpc, grpc):
        self.pb, self.grpc = pb, grpc
        self.lock = threading.Lock()
        self.reset("bytes")
        outer = self

        class Servicer(pb_grpc.DrtServicer):
            def GetModelInfo(self, request, context):
                return pb.ModelInfo(name="stand-in", device="none", vocab_size=258, tokenizer=outer.tokenizer,
                                    pad_id=256, chunk_id=257, enc_chunk_size=64, max_context_tokens=1 << 20)

            def CreateSession(self, request, context):
                outer.created.set()
                return pb.CreateSessionResponse(session_id=outer.session_id)

            def DeleteSession(self, request, context):
                with outer.lock:
                    outer.deletes += request.session_id == outer.session_id
                if outer.mode == "generate-diverge":
                    # Whether the diverging call was cancelled before this
                    # delete (waiting a little: the cancel and this call
                    # travel apart).
                    outer.cancelled_before_delete = outer.diverge_ended.wait(3)
                if outer.mode == "interrupt-down":  # the server is still away
                    context.abort(grpc.StatusCode.UNAVAILABLE, "the stand-in is down")
                return pb.DeleteSessionResponse()

            def GetSession(self, request, context):
                if time.monotonic() < outer.down_until:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "the stand-in is away after a cut")
                if outer.mode == "gone":
                    context.abort(grpc.StatusCode.NOT_FOUND, "session s1 does not exist (server started anew)")
                with outer.lock:
                    busy = outer.busy_reports > 0
                    outer.busy_reports -= 1
                    return pb.SessionInfo(session_id="s1", tokens=len(outer.held), busy=busy)

            def Append(self, requests, context):
                with outer.lock:
                    start = len(outer.held)
                    outer.appends += 1
                if outer.mode.startswith("flap") and outer.appends <= 2:
                    yield from outer.flap(requests, context, start)
                    return
                for r in requests:
                    with outer.lock:
                        if r.WhichOneof("piece") == "tokens":
                            outer.held.extend(r.tokens.ids)
                        else:  # text; each text byte is one token of the stand-in's "session"
                            outer.held.extend(r.text.encode())
                        cut = outer.cuts > 0 and len(outer.held) - start > HELD
                        if cut:
                            outer.cuts -= 1
                            del outer.held[start + HELD:]
                            if outer.mode == "lost":  # a crash lost acknowledged tokens
                                del outer.held[start + ACKED - LOST:]
                            if outer.mode == "foreign":  # someone else wrote to the session meanwhile
                                outer.held.extend([0] * FOREIGN)
                    if cut:
                        yield pb.AppendResponse(progress=pb.AppendProgress(
                            tokens_ingested=ACKED, session_tokens=start + ACKED))
                        context.abort(*outer.cut_status)
                with outer.lock:
                    n = len(outer.held)
                yield pb.AppendResponse(summary=pb.AppendSummary(
                    tokens_ingested=n - start, session_tokens=n, session_chunks=n // 63, tokens_per_second=1))

            def Generate(self, request, context):
                with outer.lock:
                    outer.generates += 1
                    cut = outer.generate_cuts > 0
                    outer.generate_cuts -= 1
                if cut and outer.mode == "generate-pieces":
                    with outer.lock:
                        outer.held.append(49)
                    yield pb.GenerateResponse(piece=pb.GeneratedPiece(text="1", token_ids=[49]))
                if cut and outer.mode in ("generate-crash", "generate-diverge"):  # a piece, then a crash
                    yield pb.GenerateResponse(piece=pb.GeneratedPiece(text="2", token_ids=[50]))
                if not cut and outer.mode == "generate-diverge":
                    # A different answer, then the call stays open (as a
                    # server generating on) until the client cancels it.
                    context.add_callback(outer.diverge_ended.set)
                    yield pb.GenerateResponse(piece=pb.GeneratedPiece(text="3", token_ids=[51]))
                    outer.diverge_ended.wait(10)
                    return
                if cut:
                    if outer.mode == "generate-grew":
                        with outer.lock:
                            outer.held.extend([256] * 5)
                    if outer.mode == "generate-lost":  # a crash lost acknowledged prompt tokens
                        with outer.lock:
                            del outer.held[-7:]
                    context.abort(outer.cut_status[0], "generate " + outer.cut_status[1])
                with outer.lock:
                    outer.held.extend([50, 46])
                yield pb.GenerateResponse(piece=pb.GeneratedPiece(text="2.", token_ids=[50, 46]))
                yield pb.GenerateResponse(done=pb.GenerateDone(finish_reason=pb.FINISH_REASON_STOP_SEQUENCE))

        self.servicer = Servicer()

    def flap(self, requests, context, start):
        """The first two Append calls of the flap cases: the first is cut at
        once with nothing taken; the second takes HELD tokens (flap-progress,
        acknowledging ACKED of them) or none (flap-stuck), stays up
        FLAP_STAY s and is cut. After each cut GetSession answers
        UNAVAILABLE for FLAP_DOWN s."""
        pb = self.pb
        if self.appends == 2:
            for r in requests:
                with self.lock:
                    self.held.extend(r.tokens.ids)
                    if len(self.held) - start > HELD:
                        break
            with self.lock:
                del self.held[start + (HELD if self.mode == "flap-progress" else 0):]
            if self.mode == "flap-progress":
                yield pb.AppendResponse(progress=pb.AppendProgress(
                    tokens_ingested=ACKED, session_tokens=start + ACKED))
            time.sleep(FLAP_STAY)
        else:
            next(iter(requests), None)
        with self.lock:
            self.down_until = time.monotonic() + FLAP_DOWN
        context.abort(self.grpc.StatusCode.UNAVAILABLE, f"cut by the stand-in (Append call {self.appends})")

    def reset(self, mode, tokenizer="bytes", cuts=0, generate_cuts=0, code=None,
              details="cut by the stand-in", busy_reports=0, session_id="s1"):
        with self.lock:
            self.session_id, self.created = session_id, threading.Event()
            self.mode, self.tokenizer = mode, tokenizer
            self.cuts, self.generate_cuts = cuts, generate_cuts
            self.cut_status = (code or self.grpc.StatusCode.UNAVAILABLE, details)
            self.busy_reports = busy_reports
            self.held, self.appends, self.generates, self.deletes = [], 0, 0, 0
            self.diverge_ended = threading.Event()  # the diverging call ended (cancelled)
            self.down_until = 0.0  # GetSession answers UNAVAILABLE until then (flap cases)
            self.cancelled_before_delete = None


def signal_after_create(checks, stand_in, command):
    """SIGTERM right after CreateSession answered, while the client prints the
    session line (review-toolsfix #2: that print was outside the try, so the
    session was left behind). To hold the client there, the session id is
    longer than the stdout pipe holds and nothing reads stdout until the pipe
    is full; the client then waits in that print's write."""
    long_id = "s" * (1 << 20)  # 1 MiB: more than a pipe holds (64 KiB by default, 1 MiB at most)
    stand_in.reset("created", session_id=long_id)
    client = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    capacity = fcntl.fcntl(client.stdout.fileno(), F_GETPIPE_SZ)
    # Full: within a page of the capacity (the short lines before it leave
    # part of a page unused: 61,645 of 65,536 bytes here) and not growing.
    page = os.sysconf("SC_PAGE_SIZE")
    held, last, still_since = array.array("i", [0]), -1, time.monotonic()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and client.poll() is None:
        fcntl.ioctl(client.stdout.fileno(), termios.FIONREAD, held, True)
        if held[0] != last:
            last, still_since = held[0], time.monotonic()
        if stand_in.created.is_set() and held[0] > capacity - page and time.monotonic() - still_since > 0.5:
            break
        time.sleep(0.05)
    full = held[0] > capacity - page
    client.send_signal(signal.SIGTERM)
    try:
        out, err = client.communicate(timeout=30)
        code = client.returncode
    except subprocess.TimeoutExpired:
        client.kill()
        out, err = client.communicate()
        code = None
    out = re.sub("s{100,}", "<the session id>", out + err)
    checks.expect(full and code == 130 and stand_in.deletes == 1 and "Traceback" not in out,
                  f"python, SIGTERM while printing the session line (right after CreateSession, stdout pipe "
                  f"full: {held[0]:,} of {capacity:,} bytes) exits 130 (exit {code}) and deletes the session "
                  f"({stand_in.deletes} DeleteSession of its id)", out[-2500:])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpp-client", required=True)
    p.add_argument("--stubs", required=True)
    args = p.parse_args()
    sys.path.insert(0, args.stubs)
    import grpc
    from drt.v1 import drt_pb2 as pb, drt_pb2_grpc as pb_grpc

    stand_in = StandIn(pb, pb_grpc, grpc)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_DrtServicer_to_server(stand_in.servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="drt-client-resume-") as tmp:
        # 2- and 3-byte characters everywhere: the cuts (at 2,501 bytes past
        # each call's start) fall inside characters.
        rng = random.Random(31)  # a seed whose two cuts both fall inside characters (checked below)
        text = " ".join(rng.choice(["h\u00e9llo", "w\u00f6rld", "\u65e5\u672c\u8a9e", "abc"]) for _ in range(2000))
        prompt = os.path.join(tmp, "prompt.txt")
        with open(prompt, "w", encoding="utf-8") as f:
            f.write(text)
        data = text.encode("utf-8")
        inside = [0x80 <= data[i] < 0xC0 for i in (HELD, 2 * HELD)]
        checks.expect(all(inside), f"bytes: the prompt's cuts at bytes {HELD:,} and {2 * HELD:,} fall inside "
                      "UTF-8 characters (continuation bytes), as the case needs", str(inside))
        # The same text with a literal special token early on (before the cut).
        literal = os.path.join(tmp, "literal.txt")
        with open(literal, "w", encoding="utf-8") as f:
            f.write("abc<|pad|>def " + text)
        ids = [rng.randrange(0, 256) for _ in range(9000)]
        ids_file = os.path.join(tmp, "ids.txt")
        with open(ids_file, "w") as f:
            f.write(" ".join(map(str, ids)))
        target = f"127.0.0.1:{port}"
        clients = {
            "python": ([sys.executable, os.path.join(REPO, "client_examples", "python", "drt_client.py"),
                        "--stubs", args.stubs, "--server", target, "--max-tokens", "2", "--retry-seconds", "20",
                        "--piece-bytes", "1000", "--piece-tokens", "1000"],
                       {"prompt": "--prompt-file", "ids": "--token-ids", "retry": "--retry-seconds"}),
            "c++": ([args.cpp_client, "--server", target, "--max_tokens", "2", "--retry_seconds", "20",
                     "--piece_bytes", "1000", "--piece_tokens", "1000"],
                    {"prompt": "--prompt_file", "ids": "--token_ids", "retry": "--retry_seconds"}),
        }
        try:
            for name, (base, flag) in clients.items():
                def run(mode, extra, **kw):
                    stand_in.reset(mode, **kw)
                    r = subprocess.run(base + extra, capture_output=True, text=True, timeout=120)
                    return r.returncode, r.stdout + r.stderr

                code, out = run("bytes", [flag["prompt"], prompt], cuts=2)
                checks.expect(code == 0 and bytes(stand_in.held[:len(data)]) == data
                              and len(stand_in.held) == len(data) + 2 and stand_in.appends == 3
                              and out.count("resuming the Append at prompt token") == 2,
                              f"{name}, bytes: an Append cut twice inside characters ends with the prompt's "
                              f"{len(data):,} bytes in the session exactly once (3 calls)", out[-2500:])

                code, out = run("bpe-text", [flag["prompt"], prompt], tokenizer="gpt2-bpe", cuts=1)
                checks.expect(code != 0 and "acknowledged 2,000 tokens" in out and "holds 2,501" in out
                              and "cannot be resumed" in out and "BPE tokenizer" in out
                              and stand_in.appends == 1 and "Traceback" not in out,
                              f"{name}, bpe-text: a cut text Append with a BPE tokenizer stops with the "
                              "acknowledged and held counts, and sends nothing more", out[-2500:])

                code, out = run("literal", [flag["prompt"], literal], cuts=1)
                checks.expect(code != 0 and "holds '<|'" in out and "cannot be resumed" in out
                              and stand_in.appends == 1 and "Traceback" not in out,
                              f"{name}, literal: a byte-tokenizer text resume past a literal '<|...|>' is "
                              "refused (it may be one token, not one per byte)", out[-2500:])

                code, out = run("bpe-ids", [flag["ids"], ids_file], tokenizer="gpt2-bpe", cuts=1)
                checks.expect(code == 0 and stand_in.held[:len(ids)] == ids and len(stand_in.held) == len(ids) + 2,
                              f"{name}, bpe-ids: a cut token-id Append resumes exactly with any tokenizer",
                              out[-2500:])

                code, out = run("generate-again", [flag["ids"], ids_file], generate_cuts=1)
                checks.expect(code == 0 and stand_in.generates == 2 and "sending the Generate again" in out
                              and len(stand_in.held) == len(ids) + 2,
                              f"{name}, generate-again: a Generate cut before any piece, the session "
                              "unchanged, is sent again once", out[-2500:])

                code, out = run("generate-pieces", [flag["ids"], ids_file], generate_cuts=1)
                checks.expect(code != 0 and stand_in.generates == 1 and "not retried" in out
                              and "after 1 answer piece reached the client" in out,
                              f"{name}, generate-pieces: a Generate cut after a piece is not sent again",
                              out[-2500:])

                code, out = run("generate-crash", [flag["ids"], ids_file], generate_cuts=1)
                checks.expect(code == 0 and stand_in.generates == 2 and "sending the Generate again" in out
                              and "after 1 answer piece reached the client" in out
                              and "answer: 2.\n" in out and "answer: 22." not in out
                              and len(stand_in.held) == len(ids) + 2,
                              f"{name}, generate-crash: a Generate cut after a piece, the session unchanged, "
                              "is sent again once, and the answer is printed once",
                              f"exit {code}, {stand_in.generates} Generate calls, session holds "
                              f"{len(stand_in.held) - len(ids)} tokens past the prompt\n" + out[-2500:])

                code, out = run("generate-diverge", [flag["ids"], ids_file], generate_cuts=1)
                checks.expect(code != 0 and stand_in.generates == 2 and "answered differently" in out
                              and stand_in.deletes == 1 and stand_in.cancelled_before_delete is True
                              and "Traceback" not in out,
                              f"{name}, generate-diverge: a Generate sent again that answers differently "
                              "is an error, and the client cancels that call before deleting the session",
                              f"cancelled before the delete: {stand_in.cancelled_before_delete}\n" + out[-2500:])

                code, out = run("generate-grew", [flag["ids"], ids_file], generate_cuts=1)
                checks.expect(code != 0 and stand_in.generates == 1 and "holds 5 tokens more" in out
                              and "not retried" in out,
                              f"{name}, generate-grew: a Generate cut while the session grew is not sent again",
                              out[-2500:])

                code, out = run("generate-lost", [flag["ids"], ids_file], generate_cuts=1)
                checks.expect(code != 0 and stand_in.generates == 1 and "lost acknowledged tokens" in out
                              and "the last 7 of the prompt are gone" in out and "not retried" in out
                              # No count printed as a negative (a path such as
                              # /tmp/drt-client-resume-7xyz may hold "-7").
                              and re.search(r"(?<![\w/-])-7\b", out) is None,
                              f"{name}, generate-lost: a Generate cut while the session lost 7 acknowledged "
                              "prompt tokens says so, and is not sent again", out[-2500:])

                code, out = run("lost", [flag["ids"], ids_file], cuts=1)
                checks.expect(code == 0 and stand_in.held[:len(ids)] == ids and len(stand_in.held) == len(ids) + 2
                              and f"holds {ACKED - LOST:,} tokens of this prompt, fewer than the {ACKED:,} "
                              "acknowledged" in out,
                              f"{name}, lost: a session holding {LOST} fewer tokens than acknowledged after a "
                              "cut is warned about and resumed from what it holds, exactly", out[-2500:])

                code, out = run("foreign", [flag["ids"], ids_file], cuts=1)
                more = HELD + FOREIGN - len(ids)
                checks.expect(code != 0 and f"holds {more:,} tokens more than this prompt has" in out
                              and "cannot be resumed" in out and stand_in.appends == 1 and "Traceback" not in out,
                              f"{name}, foreign: a session that holds more tokens than the prompt after a cut "
                              f"({more:,} more) is not resumed", out[-2500:])

                code, out = run("gone", [flag["ids"], ids_file], cuts=1)
                checks.expect(code != 0 and "is gone" in out and "--state_dir" in out and stand_in.appends == 1,
                              f"{name}, gone: NOT_FOUND after a cut says the session is gone", out[-2500:])

                code, out = run("no-retry", [flag["ids"], ids_file, flag["retry"], "0"], cuts=1)
                checks.expect(code != 0 and "UNAVAILABLE: cut by the stand-in" in out and "retry 1" not in out
                              and stand_in.appends == 1,
                              f"{name}, {flag['retry']} 0: the Append's UNAVAILABLE is reported, not retried",
                              out[-2500:])
                # Reset streams (review-deployfix M1): the codes a proxy's reset
                # gives, each a cut; the session is reported busy once.
                rst = "Received RST_STREAM with error code 0"
                for code_name, details in (("INTERNAL", rst), ("CANCELLED", "Received RST_STREAM with error code 8")):
                    status = getattr(grpc.StatusCode, code_name)
                    code, out = run("reset", [flag["ids"], ids_file], cuts=1, code=status, details=details,
                                    busy_reports=1)
                    checks.expect(code == 0 and stand_in.held[:len(ids)] == ids
                                  and len(stand_in.held) == len(ids) + 2 and stand_in.appends == 2
                                  and f"{code_name}: {details}" in out and "still busy" in out,
                                  f"{name}, an Append reset ({code_name}: {details}) is a cut: it waits while "
                                  "the session is busy, then resumes exactly", out[-2500:])
                    code, out = run("generate-again", [flag["ids"], ids_file], generate_cuts=1, code=status,
                                    details=details)
                    checks.expect(code == 0 and stand_in.generates == 2 and "sending the Generate again" in out,
                                  f"{name}, a Generate reset ({code_name}) before any piece, the session "
                                  "unchanged, is sent again once", out[-2500:])
                code, out = run("internal", [flag["ids"], ids_file], cuts=1, code=grpc.StatusCode.INTERNAL,
                                details="the stand-in failed")
                checks.expect(code != 0 and "INTERNAL: the stand-in failed" in out and stand_in.appends == 1
                              and "retry 1" not in out and "Traceback" not in out,
                              f"{name}, an INTERNAL that is no stream reset is reported, not retried", out[-2500:])

                # Ctrl-C or SIGTERM during the retries: the session never stops
                # being busy. "interrupt-down": DeleteSession answers
                # UNAVAILABLE too (the server still away), so the cleanup must
                # get one attempt, not --retry-seconds of them (review-tools #2).
                for mode, sig in (("interrupt", signal.SIGINT), ("interrupt-down", signal.SIGINT),
                                  ("interrupt", signal.SIGTERM)):
                    stand_in.reset(mode, cuts=1, busy_reports=10**6)
                    client = subprocess.Popen(base + [flag["ids"], ids_file], stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True)
                    lines = []
                    for line in client.stdout:  # until the second retry's line: well inside the retries
                        lines.append(line)
                        if "still busy" in line and "retry 2 " in line:
                            break
                    sent = time.monotonic()
                    client.send_signal(sig)
                    try:
                        lines += client.stdout.readlines()
                        code = client.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        client.kill()
                        code = None
                    seconds = time.monotonic() - sent
                    out = "".join(lines)
                    down = mode == "interrupt-down"
                    checks.expect(code == 130 and seconds < 3 and stand_in.deletes == 1 and "Traceback" not in out
                                  and (not down or "could not delete session s1" in out),
                                  f"{name}, {mode}: {signal.Signals(sig).name} while waiting to retry ends the "
                                  f"client at once (exit {code}, {seconds:.1f} s; < 3 s: its longest delay here "
                                  f"is about 0.8 s) and deletes the session with "
                                  f"{'one attempt, the server still down' if down else 'it up'} "
                                  f"({stand_in.deletes} DeleteSession)", out[-2500:])

                if name == "python":
                    signal_after_create(checks, stand_in, base + [flag["ids"], ids_file])

                # The retry bound after progress (the later flag wins over the base's 20).
                bound = [flag["ids"], ids_file, flag["retry"], str(FLAP_BOUND)]
                started = time.monotonic()
                code, out = run("flap-progress", bound)
                seconds = time.monotonic() - started
                checks.expect(code == 0 and stand_in.appends == 3 and stand_in.held[:len(ids)] == ids
                              and len(stand_in.held) == len(ids) + 2 and "did not come back" not in out,
                              f"{name}, flap-progress: cut at once, then {FLAP_STAY} s up taking part of the "
                              f"prompt, then cut again: each outage (~{FLAP_DOWN} s) is inside {flag['retry']} "
                              f"{FLAP_BOUND}, so the Append finishes exactly ({stand_in.appends} calls, "
                              f"{seconds:.1f} s)", out[-2500:])
                code, out = run("flap-stuck", bound)
                checks.expect(code != 0 and stand_in.appends == 2 and "did not come back within" in out
                              and "Traceback" not in out,
                              f"{name}, flap-stuck: the same with nothing taken in the resumed call: no "
                              f"progress, so the bound counts from the first cut and the client gives up at "
                              f"the second ({stand_in.appends} calls)", out[-2500:])

                code, out = run("no-retry", [flag["ids"], ids_file, flag["retry"], "-1"])
                checks.expect(code != 0 and "must be positive" in out and "Traceback" not in out,
                              f"{name}, {flag['retry']} -1: refused", out[-800:])
        finally:
            server.stop(0)
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())

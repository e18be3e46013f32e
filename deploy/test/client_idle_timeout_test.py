#!/usr/bin/env python3
"""Both example clients cancel a stream that goes silent, not one that is long.

The clients used to give Append and Generate a total deadline (3600 s by
default), which cut documented 32M/64M-token disk-tier ingests that were
progressing (review-toolsfix #1). Now a stream is cancelled when the server
sends nothing for --idle-timeout seconds, and a total deadline applies only
when --deadline asks for one. A stand-in server (no model) plays each case:

- slow: Append runs SLOW_SECONDS, sending progress every PROGRESS_INTERVAL;
  with an idle timeout of IDLE_SECONDS < SLOW_SECONDS it must succeed (a
  total deadline of IDLE_SECONDS, the old semantics, would cut it);
- the same stream with --deadline IDLE_SECONDS must fail DEADLINE_EXCEEDED
  (the total deadline still works when asked for);
- silent Append, silent Generate: the server sends nothing for
  SILENT_SECONDS; the client must fail naming the idle timeout, well before.

    client_idle_timeout_test.py --cpp-client build/client_examples/drt-client --stubs build/python
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent import futures

from checks import Checks

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# Timings: the idle timeout is 2 s and the progress interval 0.25 s, a margin
# of 8x for a loaded 2-core machine (load averages of 6-9 seen here); the slow
# stream lasts 5 s, 2.5x the timeout, so a total deadline of 2 s is certain to
# fire on it. A silent stream must end within SILENT_BOUND (timeout + 8 s of
# slack for process start and scheduling), far below SILENT_SECONDS.
IDLE_SECONDS = 2
PROGRESS_INTERVAL = 0.25
SLOW_SECONDS = 5
SILENT_SECONDS = 60
SILENT_BOUND = IDLE_SECONDS + 8


def make_servicer(pb, pb_grpc, mode):
    class StandIn(pb_grpc.DrtServicer):
        def GetModelInfo(self, request, context):
            return pb.ModelInfo(name="stand-in", device="none", vocab_size=256, tokenizer="byte",
                                enc_chunk_size=64, chunk_topk=8, slide_window=128,
                                max_context_tokens=1 << 20)

        def CreateSession(self, request, context):
            return pb.CreateSessionResponse(session_id="s1")

        def DeleteSession(self, request, context):
            return pb.DeleteSessionResponse()

        def wait(self, context, seconds):
            end = time.monotonic() + seconds
            while context.is_active() and time.monotonic() < end:
                time.sleep(0.05)

        def Append(self, requests, context):
            tokens = sum(len(r.tokens.ids) for r in requests)
            start = time.monotonic()
            if mode[0] == "silent-append":
                self.wait(context, SILENT_SECONDS)
            elif mode[0] == "slow":
                while context.is_active() and time.monotonic() - start < SLOW_SECONDS:
                    time.sleep(PROGRESS_INTERVAL)
                    yield pb.AppendResponse(progress=pb.AppendProgress(
                        tokens_ingested=tokens, session_tokens=tokens,
                        elapsed_seconds=time.monotonic() - start))
            elapsed = time.monotonic() - start
            yield pb.AppendResponse(summary=pb.AppendSummary(
                tokens_ingested=tokens, session_tokens=tokens, session_chunks=tokens // 64,
                elapsed_seconds=elapsed, tokens_per_second=tokens / max(elapsed, 1e-9)))

        def Generate(self, request, context):
            if mode[0] == "silent-generate":
                self.wait(context, SILENT_SECONDS)
            yield pb.GenerateResponse(piece=pb.GeneratedPiece(text="ok", token_ids=[1]))
            yield pb.GenerateResponse(done=pb.GenerateDone(finish_reason=pb.FINISH_REASON_LENGTH))

    return StandIn()


def run_client(command):
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=SILENT_SECONDS + 60)
    return result.returncode, result.stdout + result.stderr, time.monotonic() - start


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpp-client", required=True)
    p.add_argument("--stubs", required=True)
    args = p.parse_args()
    sys.path.insert(0, args.stubs)
    import grpc
    from drt.v1 import drt_pb2 as pb, drt_pb2_grpc as pb_grpc

    mode = ["slow"]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_DrtServicer_to_server(make_servicer(pb, pb_grpc, mode), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="drt-client-idle-") as tmp:
        ids = os.path.join(tmp, "ids.txt")
        with open(ids, "w") as f:
            f.write(" ".join(str(i % 200 + 1) for i in range(300)))
        target = f"127.0.0.1:{port}"
        clients = {
            "python": [sys.executable, os.path.join(REPO, "client_examples", "python", "drt_client.py"),
                       "--stubs", args.stubs, "--server", target, "--token-ids", ids, "--max-tokens", "1",
                       "--idle-timeout", str(IDLE_SECONDS)],
            "c++": [args.cpp_client, "--server", target, "--token_ids", ids, "--max_tokens", "1",
                    "--idle_timeout", str(IDLE_SECONDS)],
        }
        try:
            for name, command in clients.items():
                mode[0] = "slow"
                code, output, seconds = run_client(command)
                checks.expect(code == 0 and "append: 300 tokens" in output and seconds >= SLOW_SECONDS,
                              f"{name}: a {SLOW_SECONDS} s Append that sends progress outlives an idle "
                              f"timeout of {IDLE_SECONDS} s ({seconds:.1f} s)", output[-1500:])
                flag = "--deadline"
                code, output, seconds = run_client(command + [flag, str(IDLE_SECONDS)])
                checks.expect(code != 0 and "DEADLINE_EXCEEDED" in output and seconds < SLOW_SECONDS + 5,
                              f"{name}: {flag} {IDLE_SECONDS} still caps the whole stream ({seconds:.1f} s)",
                              output[-1500:])
                for silent in ("silent-append", "silent-generate"):
                    mode[0] = silent
                    code, output, seconds = run_client(command)
                    checks.expect(code != 0 and "no message from the server" in output
                                  and "idle" in output and seconds < SILENT_BOUND,
                                  f"{name}: {silent} is cancelled after the idle timeout "
                                  f"({seconds:.1f} s < {SILENT_BOUND} s)", output[-1500:])
            for name, command in [("python", clients["python"] + ["--deadline=-1"]),
                                  ("python", clients["python"] + ["--idle-timeout", "0"]),
                                  ("c++", clients["c++"] + ["--deadline=-1"]),
                                  ("c++", clients["c++"] + ["--idle_timeout", "0"])]:
                code, output, _ = run_client(command)
                checks.expect(code != 0 and "must be positive" in output and "Traceback" not in output,
                              f"{name} {command[-1]}: refused", output[-800:])
        finally:
            server.stop(0)
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())

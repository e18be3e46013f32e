#!/usr/bin/env python3
"""Streams a long prompt into a drt-server session, then streams an answer back.

    /usr/bin/python3 client_examples/python/drt_client.py --server 127.0.0.1:50051

The prompt is a generated haystack (filler text with a random pass key hidden
at --depth, then the question "What is the pass key?"), or a text file
(--prompt-file), or a file of whitespace-separated token ids (--token-ids).
It goes to the server in pieces well under gRPC's 4 MB message limit, with a
progress bar on stderr drawn from the server's AppendProgress messages. The
answer is printed as it arrives, then the timings.

Needs Debian's python3-grpcio (use /usr/bin/python3) and the stubs the build
generates into build/python (found there by default; see --stubs).
"""
import argparse
import codecs
import os
import random
import re
import sys
import threading
import time
import uuid

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = "What is the pass key? The pass key is"
# GPT-2 BPE tokens of " " + FILLER: the separating space joins the next "The".
GPT2_TOKENS_PER_FILLER = 24
# The metadata key a session-affine gateway hashes on (docs/deploy.md).
SESSION_HEADER = "x-drt-session"
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# No call may hang forever: a gateway that accepts the connection while its
# upstream hangs, or a wedged server, must not hold the client (and the
# scripts that run it). Unary calls get a fixed deadline. The Append and
# Generate streams get an idle timeout instead (--idle-timeout: no message
# from the server for that long), because a total deadline would also cut a
# long ingest that is progressing (a 32M-token Append takes hours on a CPU);
# the server sends AppendProgress every 0.1 s of work and a piece per token.
# --deadline adds a total deadline to the streams only when asked for.
UNARY_DEADLINE_SECONDS = 30
IDLE_TIMEOUT_DEFAULT_SECONDS = 600


def session_key(text):
    # gRPC metadata values must be printable ASCII.
    if not text or not all(0x20 <= ord(c) <= 0x7E for c in text):
        raise argparse.ArgumentTypeError("must be non-empty printable ASCII (it is sent as gRPC metadata)")
    return text


def non_negative_seed(text):
    value = int(text)
    if not 0 <= value < 1 << 64:
        raise argparse.ArgumentTypeError("must be an integer from 0 to 2^64 - 1 (a uint64)")
    return value


def readable_file(flag, path, p):
    """Refuses, naming the flag, a file that cannot be opened for reading."""
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        p.error(f"{flag} {path}: {e.strerror}")


def first_invalid_utf8(path):
    """(byte offset, reason) of the first bytes of `path` that are not UTF-8,
    or None; reads it in blocks (bounded memory)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # bytes read before this block
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            # The error's start counts from the bytes the decoder carried over
            # (an unfinished character) followed by this block.
            carried = len(decoder.getstate()[0])
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                return offset - carried + e.start, e.reason
            if not block:
                return None
            offset += len(block)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    conn = p.add_argument_group("connection")
    conn.add_argument("--server", default="127.0.0.1:50051", help="host:port of drt-server (default %(default)s)")
    conn.add_argument("--token", default=os.environ.get("DRT_BEARER_TOKEN"),
                      help="bearer token, sent as 'authorization: Bearer <token>' "
                           "(default: $DRT_BEARER_TOKEN)")
    conn.add_argument("--tls-ca", metavar="PEM", help="CA certificate file: connect with TLS (default plaintext)")
    conn.add_argument("--connect-timeout", type=float, default=30, help="seconds to wait for the server (default %(default)s)")
    conn.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT_DEFAULT_SECONDS,
                      help="seconds an Append or a Generate stream may go without a message from the "
                           "server before the client cancels it (default %(default)s)")
    conn.add_argument("--deadline", type=float, default=0,
                      help="seconds the whole Append or Generate stream may take, each, before it fails "
                           "with DEADLINE_EXCEEDED; 0: no total deadline, only --idle-timeout "
                           "(default %(default)s). GetModelInfo and CreateSession get 30 s, "
                           "DeleteSession 10 s")
    conn.add_argument("--stubs", default=os.path.join(REPO_ROOT, "build", "python"),
                      help="folder holding drt/v1/drt_pb2.py (default %(default)s)")

    prompt = p.add_argument_group("prompt (default: a generated haystack)")
    source = prompt.add_mutually_exclusive_group()
    source.add_argument("--prompt-file", metavar="FILE", help="UTF-8 text file to send as the prompt")
    source.add_argument("--token-ids", metavar="FILE", help="file of whitespace-separated token ids to send as the prompt")
    prompt.add_argument("--question", default="", help="text appended after --prompt-file or --token-ids")
    # The haystack's options default to None, so that one given with a
    # prompt of one's own is seen and refused (set to their defaults below).
    prompt.add_argument("--haystack-tokens", type=int, default=None,
                        help="haystack length in tokens, approximately (default 100000)")
    prompt.add_argument("--depth", type=float, default=None,
                        help="where the pass key sits in the haystack, 0 (start) to 1 (end) (default 0.5)")
    prompt.add_argument("--passkey", help="the pass key (default: 5 random digits)")
    prompt.add_argument("--piece-bytes", type=int, default=64 << 10,
                        help="bytes of text per Append message (default %(default)s)")
    prompt.add_argument("--piece-tokens", type=int, default=16 << 10,
                        help="token ids per Append message (default %(default)s)")

    gen = p.add_argument_group("generation")
    gen.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default %(default)s)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default %(default)s)")
    gen.add_argument("--top-k", type=int, default=0, help="0: off (default %(default)s)")
    gen.add_argument("--top-p", type=float, default=0.0, help="0 or 1: off (default %(default)s)")
    gen.add_argument("--seed", type=non_negative_seed, default=0, help="sampling seed, 0 to 2^64 - 1 (default %(default)s)")
    gen.add_argument("--stop", action="append", default=[], help="stop sequence (repeatable)")
    pad = gen.add_mutually_exclusive_group()
    pad.add_argument("--pad-to-chunk-boundary", dest="pad", action="store_const", const=True, default=None,
                     help="pad the open chunk before generating, so the first token sees chunks "
                          "retrieved with the whole prompt in view (default: what the model was "
                          "trained for, from the server's model info)")
    pad.add_argument("--no-pad-to-chunk-boundary", dest="pad", action="store_const", const=False,
                     help="do not pad, whatever the model's default")

    p.add_argument("--keep-session", action="store_true", help="do not delete the session at the end")
    p.add_argument("--session-key", type=session_key, default=None,
                   help=f"routing key sent as metadata '{SESSION_HEADER}' on every call, so that a gateway "
                        "hashing on it (deploy/k8s/gateway) sends all calls of the session to the replica "
                        "that holds it; printable ASCII (default: 32 random hex digits)")
    p.add_argument("--require-passkey", action="store_true",
                   help="exit 1 when the first number in the answer is not the haystack's pass key "
                        "(the generated haystack only)")
    args = p.parse_args(argv)
    own_prompt = args.prompt_file or args.token_ids
    if own_prompt:
        # Meaningless without the generated haystack: a script passing
        # --require-passkey here would pass whatever the answer.
        for flag, value in (("--require-passkey", args.require_passkey or None), ("--passkey", args.passkey),
                            ("--depth", args.depth), ("--haystack-tokens", args.haystack_tokens)):
            if value is not None:
                p.error(f"{flag} needs the generated haystack (no --prompt-file or --token-ids)")
    args.haystack_tokens = 100_000 if args.haystack_tokens is None else args.haystack_tokens
    args.depth = 0.5 if args.depth is None else args.depth
    for flag, path in (("--prompt-file", args.prompt_file), ("--token-ids", args.token_ids),
                       ("--tls-ca", args.tls_ca)):
        if path:
            readable_file(flag, path, p)
    if args.prompt_file:
        bad = first_invalid_utf8(args.prompt_file)
        if bad:
            p.error(f"--prompt-file {args.prompt_file}: not UTF-8 at byte {bad[0]:,} ({bad[1]}); "
                    "the server takes text as UTF-8")
    if not args.idle_timeout > 0 or not args.connect_timeout > 0:
        p.error("--idle-timeout and --connect-timeout must be positive")
    if not args.deadline >= 0:
        p.error("--deadline must be positive, or 0 for none")
    if not 0.0 <= args.depth <= 1.0:
        p.error("--depth must be within [0, 1]")
    if args.haystack_tokens < 1 or args.piece_bytes < 4 or args.piece_tokens < 1 or args.max_tokens < 1:
        p.error("--haystack-tokens, --piece-bytes (>= 4), --piece-tokens and --max-tokens must be positive")
    if args.passkey is not None and not args.passkey.isdigit():
        p.error("--passkey must be digits")
    return args


# --- prompts: each is (pieces, expected token count or None, pass key or None);
# pieces yields str (text) or list[int] (token ids).

def split_utf8(text, piece_bytes):
    """Pieces of at most piece_bytes UTF-8 bytes, never cutting a character."""
    data = text.encode("utf-8")
    start = 0
    while start < len(data):
        end = min(start + piece_bytes, len(data))
        while end < len(data) and (data[end] & 0xC0) == 0x80:
            end -= 1
        yield data[start:end].decode("utf-8")
        start = end


def haystack_text(tokens, depth, passkey, tokenizer):
    """The haystack and its approximate length in tokens for this tokenizer."""
    needle = f"The pass key is {passkey}. Remember it. {passkey} is the pass key."
    if tokenizer == "bytes":
        per_filler = len(FILLER) + 1
        overhead = len(needle) + len(QUESTION) + 1
    else:
        per_filler = GPT2_TOKENS_PER_FILLER
        overhead = len(passkey) + 22  # the needle and the question; digits split unpredictably
    fillers = max(1, (tokens - overhead) // per_filler)
    before = round(depth * fillers)
    parts = [FILLER] * before + [needle] + [FILLER] * (fillers - before) + [QUESTION]
    return " ".join(parts), fillers * per_filler + overhead


def read_text_pieces(path, piece_bytes):
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        while block := f.read(piece_bytes):
            text = decoder.decode(block)
            if text:
                yield text
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def read_token_ids(path):
    with open(path) as f:
        try:
            return [int(x) for x in f.read().split()]
        except ValueError as e:
            sys.exit(f"drt_client: {path}: not whitespace-separated integers ({e})")


def make_prompt(args, info):
    if args.prompt_file:
        pieces = read_text_pieces(args.prompt_file, args.piece_bytes)
        if args.question:
            pieces = chain(pieces, split_utf8(args.question, args.piece_bytes))
        size = os.path.getsize(args.prompt_file)
        expected = size if info.tokenizer == "bytes" and not args.question else None
        return pieces, expected, None, f"{args.prompt_file} ({size:,} bytes)"
    if args.token_ids:
        ids = read_token_ids(args.token_ids)
        pieces = (ids[i:i + args.piece_tokens] for i in range(0, len(ids), args.piece_tokens))
        if args.question:
            pieces = chain(pieces, split_utf8(args.question, args.piece_bytes))
        return pieces, None if args.question else len(ids), None, f"{args.token_ids} ({len(ids):,} token ids)"
    passkey = args.passkey or str(random.SystemRandom().randrange(10_000, 100_000))
    text, expected = haystack_text(args.haystack_tokens, args.depth, passkey, info.tokenizer)
    return (split_utf8(text, args.piece_bytes), expected, passkey,
            f"haystack of ~{expected:,} tokens ({len(text):,} bytes), pass key {passkey} at depth {args.depth:g}")


def chain(*iterables):
    for it in iterables:
        yield from it


# --- progress

class ProgressBar:
    """One redrawn line on a terminal; a line every few seconds otherwise."""

    def __init__(self, total, stream=sys.stderr):
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()
        self.last_line = -1e9
        self.drawn = False

    def update(self, p, final=False):
        rate = p.tokens_ingested / p.elapsed_seconds if p.elapsed_seconds > 0 else 0.0
        stats = (f"{p.tokens_ingested:,} tokens  {p.chunks_ingested:,} chunks  "
                 f"{rate:,.0f} tokens/s  {p.elapsed_seconds:.1f} s")
        if self.total:
            frac = 1.0 if final else min(p.tokens_ingested / self.total, 0.999)
            filled = int(30 * frac)
            line = f"append [{'#' * filled}{'.' * (30 - filled)}] {100 * frac:5.1f}%  {stats}"
        else:
            line = f"append  {stats}"
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K" + ("\n" if final else ""))
            self.stream.flush()
            self.drawn = not final
        elif final or p.elapsed_seconds - self.last_line >= 2.0:
            self.last_line = p.elapsed_seconds
            print(line, file=self.stream, flush=True)

    def abort(self):
        """Ends a half-drawn line, so that an error message starts on its own."""
        if self.drawn:
            self.stream.write("\n")
            self.drawn = False


# --- the calls

class StreamIdle(Exception):
    """A stream was cancelled for going --idle-timeout seconds without a message."""


def stream_deadline(args):
    """The timeout= of an Append or Generate call: None (no total deadline) unless --deadline."""
    return args.deadline if args.deadline > 0 else None


def watched(call, idle_seconds):
    """Yields the messages of a streaming call; cancels it when none arrives for
    idle_seconds (then raises StreamIdle instead of the call's CANCELLED)."""
    last = [time.monotonic()]
    fired = threading.Event()
    finished = threading.Event()

    def watch():
        while True:
            left = last[0] + idle_seconds - time.monotonic()
            if left <= 0:
                fired.set()
                call.cancel()
                return
            if finished.wait(left):
                return

    watcher = threading.Thread(target=watch, name="idle-watchdog", daemon=True)
    watcher.start()
    try:
        for message in call:
            last[0] = time.monotonic()
            yield message
    except Exception:
        if fired.is_set():
            raise StreamIdle(f"no message from the server for {idle_seconds:g} s (--idle-timeout); "
                             "the call was cancelled") from None
        raise
    finally:
        finished.set()
        watcher.join()


def append(pb, stub, session_id, pieces, expected_tokens, metadata, args):
    def requests():
        for i, piece in enumerate(pieces):
            request = pb.AppendRequest(session_id=session_id if i == 0 else "")
            if isinstance(piece, str):
                request.text = piece
            else:
                request.tokens.ids.extend(piece)
            yield request

    bar = ProgressBar(expected_tokens)
    last = None
    summary = None
    start = time.perf_counter()
    try:
        call = stub.Append(requests(), metadata=metadata, timeout=stream_deadline(args))
        for response in watched(call, args.idle_timeout):
            if response.WhichOneof("event") == "progress":
                last = response.progress
                bar.update(last)
            else:
                summary = response.summary
    except BaseException:
        bar.abort()
        raise
    if last is not None:
        bar.update(last, final=True)
    if summary is None:
        raise RuntimeError("the Append stream ended without a summary")
    return summary, time.perf_counter() - start


def generate(pb, stub, session_id, args, metadata, out=sys.stdout):
    request = pb.GenerateRequest(
        session_id=session_id,
        max_tokens=args.max_tokens,
        sampling=pb.SamplingParams(temperature=args.temperature, top_k=args.top_k,
                                   top_p=args.top_p, seed=args.seed),
        stop=args.stop)
    if args.pad is not None:
        request.pad_to_chunk_boundary = args.pad
    text = []
    tokens = 0
    first = last = None
    done = None
    start = time.perf_counter()
    call = stub.Generate(request, metadata=metadata, timeout=stream_deadline(args))
    for response in watched(call, args.idle_timeout):
        if response.WhichOneof("event") == "piece":
            now = time.perf_counter()
            if response.piece.token_ids:
                first = first if first is not None else now
                last = now
                tokens += len(response.piece.token_ids)
            text.append(response.piece.text)
            out.write(response.piece.text)
            out.flush()
        else:
            done = response.done
    out.write("\n")
    ttft = first - start if first is not None else float("nan")
    tpot = (last - first) / (tokens - 1) if tokens > 1 else float("nan")
    return "".join(text), done, tokens, ttft, tpot


def ms(seconds):
    return f"{1000 * seconds:.1f} ms"


def run(args, pb, pb_grpc, grpc):
    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            channel = grpc.secure_channel(args.server, grpc.ssl_channel_credentials(root_certificates=f.read()))
    else:
        channel = grpc.insecure_channel(args.server)
    try:
        grpc.channel_ready_future(channel).result(timeout=args.connect_timeout)
    except grpc.FutureTimeoutError:
        sys.exit(f"drt_client: cannot reach drt-server at {args.server} within {args.connect_timeout:g} s")
    stub = pb_grpc.DrtStub(channel)
    key = args.session_key or uuid.uuid4().hex
    metadata = [(SESSION_HEADER, key)]
    if args.token:
        metadata.append(("authorization", f"Bearer {args.token}"))

    info = stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=metadata, timeout=UNARY_DEADLINE_SECONDS)
    print(f"model: {info.name} on {info.device}, vocab {info.vocab_size:,} ({info.tokenizer}), "
          f"chunks of {info.enc_chunk_size}, top-k {info.chunk_topk}, window {info.slide_window}, "
          f"context limit {info.max_context_tokens:,} tokens", flush=True)
    pieces, expected, passkey, description = make_prompt(args, info)
    print(f"prompt: {description}", flush=True)

    session_id = stub.CreateSession(pb.CreateSessionRequest(), metadata=metadata,
                                    timeout=UNARY_DEADLINE_SECONDS).session_id
    print(f"session: {session_id} ({SESSION_HEADER}: {key})", flush=True)
    try:
        summary, append_seconds = append(pb, stub, session_id, pieces, expected, metadata, args)
        print(f"append: {summary.tokens_ingested:,} tokens, {summary.session_chunks:,} chunks in "
              f"{append_seconds:.2f} s: {summary.tokens_ingested / append_seconds:,.0f} tokens/s "
              f"(server: {summary.tokens_per_second:,.0f} tokens/s)", flush=True)
        print("answer: ", end="", flush=True)
        answer, done, tokens, ttft, tpot = generate(pb, stub, session_id, args, metadata)
    finally:
        if not args.keep_session:
            try:
                stub.DeleteSession(pb.DeleteSessionRequest(session_id=session_id), metadata=metadata, timeout=10)
            except grpc.RpcError as e:
                print(f"drt_client: could not delete session {session_id}: {e.details()}", file=sys.stderr)

    reason = pb.FinishReason.Name(done.finish_reason).removeprefix("FINISH_REASON_").lower() if done else "none"
    t = done.timings if done else pb.GenerateTimings()
    print(f"generate: {tokens} tokens, finish reason {reason}")
    print(f"  time to first token:   {ms(ttft)} (server: {ms(t.time_to_first_token_seconds)})")
    print(f"  time per output token: {ms(tpot)} (server: {ms(t.time_per_output_token_seconds)})")
    if passkey is None:
        return 0
    # Right means: the first number in the answer is the pass key.
    number = re.search(r"\d+", answer)
    answered = number.group(0) if number else "no number"
    found = answered == passkey
    print(f"answer correct: {'yes' if found else 'no'} (pass key {passkey}, answered {answered})", flush=True)
    return 1 if args.require_passkey and not found else 0


def main(argv=None):
    args = parse_args(argv)
    sys.path.insert(0, args.stubs)
    try:
        import grpc
        from drt.v1 import drt_pb2 as pb, drt_pb2_grpc as pb_grpc
    except ImportError as e:
        sys.exit(f"drt_client: {e}. Use Debian's /usr/bin/python3 with python3-grpcio, and build the "
                 f"stubs (bash scripts/build.sh) or point --stubs at them")
    try:
        return run(args, pb, pb_grpc, grpc)
    except grpc.RpcError as e:
        print(f"drt_client: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    except StreamIdle as e:
        print(f"drt_client: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a file that went away after the checks, say
        print(f"drt_client: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("drt_client: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

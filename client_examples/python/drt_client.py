#!/usr/bin/env python3
"""Streams a long prompt into a drt-server session, then streams an answer back.

    /usr/bin/python3 client_examples/python/drt_client.py --server 127.0.0.1:50051

The prompt is a generated haystack (filler text with a random pass key hidden
at --depth, then the question "What is the pass key?"), or a text file
(--prompt-file), or a file of whitespace-separated token ids (--token-ids).
--tokenize (with --prompt-file) and --detokenize (with --token-ids) only ask
the server's tokenizer, without a session.
It goes to the server in pieces well under gRPC's 4 MB message limit, with a
progress bar on stderr drawn from the server's AppendProgress messages. The
answer is printed as it arrives, then the timings.

Needs Debian's python3-grpcio (use /usr/bin/python3) and the stubs the build
generates into build/python (found there by default; see --stubs).
"""
import argparse
import codecs
import math
import os
import random
import re
import signal
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
# When --connect-timeout passes with no connection, one call that does not
# wait for one, to learn why (connection refused, unknown host, TLS...).
CONNECT_PROBE_SECONDS = 2
IDLE_TIMEOUT_DEFAULT_SECONDS = 600
# Retrying UNAVAILABLE (--retry-seconds). A server restarted on the same
# --state_dir, or its pod moved, keeps every session, so the client rides the
# outage out instead of failing. The default bound covers a Kubernetes pod
# move: the old pod's stop (60 s at most, terminationGracePeriodSeconds in
# deploy/k8s), rescheduling and attaching its volume, loading the model and
# restoring the sessions (docs/deploy.md, "Durable sessions on Kubernetes").
RETRY_SECONDS_DEFAULT = 300
# Backoff between attempts: 0.2 s, doubling up to 10 s, each delay drawn
# uniformly from its upper half (jitter: clients cut by one restart do not all
# come back in the same instant; the half floor keeps the growth).
RETRY_FIRST_DELAY = 0.2
RETRY_MAX_DELAY = 10.0


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


def logit_bias(text):
    """--logit-bias ID:BIAS[,ID:BIAS...] -> {id: bias}; the server checks the
    ranges (ids in the vocabulary, biases in [-100, 100], at most 300). An id
    that is no int32 (drt.v1's map key) is refused here, as the C++ client
    does: protobuf would raise only inside generate(), after the prompt went."""
    out = {}
    for item in text.split(","):
        token, sep, bias = item.partition(":")
        token = token.strip()
        try:
            if not sep or not token or not all("0" <= c <= "9" for c in token):
                raise ValueError
            out[int(token)] = float(bias)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be ID:BIAS pairs separated by commas (65:-100,10:2.5), got {item!r}") from None
        if int(token) >= 1 << 31:
            raise argparse.ArgumentTypeError(
                f"token id {token} in {item!r} is beyond 2^31 - 1 (ids are int32)")
    return out


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


def utf8_argument(flag, value):
    """`value`, text from the command line, as the UTF-8 text of its bytes; a
    value whose bytes are not UTF-8 ends the client with exit status 1 before
    anything is sent, naming the flag, the byte offset and the reason, as the
    C++ client does. Python decodes argv with the locale's encoding,
    smuggling bytes it cannot decode through as lone surrogates, which
    would fail only when the request is built (after the whole Append);
    os.fsencode gives the bytes back."""
    try:
        data = os.fsencode(value)
    except UnicodeEncodeError as e:  # a lone surrogate given to main() as text
        sys.exit(f"drt_client: {flag}: not UTF-8 at character {e.start} ({e.reason})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        sys.exit(f"drt_client: {flag}: not UTF-8 at byte {e.start} ({e.reason})")


def refuse(message):
    """Ends the client with exit status 1 and 'drt_client: MESSAGE' on
    stderr, as the C++ client's Die does (argparse's p.error exits 2)."""
    sys.exit(f"drt_client: {message}")


def take_stops(argv):
    """(stop sequences, the other arguments): every --stop VALUE and
    --stop=VALUE taken out of argv in order, as the C++ client does, so that
    what a bare --stop takes is this client's rule, not argparse's idea of a
    negative number (which changed in Python 3.14: -1e5 was an option before,
    a value after). A bare --stop takes the next argument unless it starts
    with '-': that reads as an option (a forgotten value, as in --stop
    --max-tokens 5), and a stop sequence starting with '-' is written
    --stop=-x. A stop sequence is text: -5 and -1e5 are no exception.
    Arguments after '--' are left. A refusal exits 1, as in the C++ client."""
    stops, rest = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i:]
            break
        if arg == "--stop":
            if i + 1 >= len(argv):
                refuse("--stop needs a value (a stop sequence)")
            value = argv[i + 1]
            if value.startswith("-"):
                refuse(f"--stop needs a value, got '{value}', which starts with '-' and reads as an "
                       f"option; to stop on it write --stop={value}")
            stops.append(value)
            i += 2
            continue
        if arg.startswith("--stop="):
            stops.append(arg[len("--stop="):])
        elif arg.split("=", 1)[0] == "--sto":
            # argparse's abbreviation of --stop would go around the rule above.
            refuse("--sto: write --stop in full")
        else:
            rest.append(arg)
        i += 1
    return stops, rest


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
    conn.add_argument("--retry-seconds", type=float, default=RETRY_SECONDS_DEFAULT,
                      help="how long the client keeps retrying a call that got UNAVAILABLE (a server "
                           "restarting, draining or moving), counted from the call's first failure; for "
                           "an Append, from its first cut after the session last took more of the prompt, "
                           "so each outage between progress gets the whole bound; plus one attempt, with "
                           "exponential backoff and jitter; "
                           "0: never retry (default %(default)s). "
                           "An Append cut part-way resumes from the tokens the session holds; see "
                           "client_examples/README.md for which calls are retried")
    conn.add_argument("--stubs", default=os.path.join(REPO_ROOT, "build", "python"),
                      help="folder holding drt/v1/drt_pb2.py (default %(default)s)")

    prompt = p.add_argument_group("prompt (default: a generated haystack)")
    source = prompt.add_mutually_exclusive_group()
    # --prompt: an explicit alias, since --prompt-logprobs made the prefix
    # ambiguous and scripts/run_main.sh documents it.
    source.add_argument("--prompt-file", "--prompt", dest="prompt_file", metavar="FILE",
                        help="UTF-8 text file to send as the prompt (also --prompt)")
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

    prompt.add_argument("--prompt-logprobs", type=int, default=None, metavar="N",
                        help="score the prompt's tokens (AppendRequest.prompt_logprobs, N top "
                             "alternatives each, 0..20) and print its perplexity")
    prompt.add_argument("--print-logprobs", action="store_true",
                        help="with --prompt-logprobs: print each token's logprob too")
    gen = p.add_argument_group("generation")
    gen.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default %(default)s)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default %(default)s)")
    gen.add_argument("--top-k", type=int, default=0, help="0: off (default %(default)s)")
    gen.add_argument("--top-p", type=float, default=0.0, help="0 or 1: off (default %(default)s)")
    gen.add_argument("--seed", type=non_negative_seed, default=0, help="sampling seed, 0 to 2^64 - 1 (default %(default)s)")
    gen.add_argument("--min-p", type=float, default=0.0,
                     help="drop tokens below this times the best one's probability, 0 to 1; 0: off "
                          "(default %(default)s)")
    gen.add_argument("--presence-penalty", type=float, default=0.0,
                     help="lower a token's logit once it was generated, -2 to 2; 0: off (default %(default)s)")
    gen.add_argument("--frequency-penalty", type=float, default=0.0,
                     help="lower a token's logit per time it was generated, -2 to 2; 0: off "
                          "(default %(default)s)")
    gen.add_argument("--logit-bias", type=logit_bias, default={}, metavar="ID:BIAS,...",
                     help="add BIAS (-100 to 100) to token ID's logit, e.g. 10:-100,65:2.5 (default: none)")
    # (Listed for --help; take_stops reads the command line's --stop.)
    gen.add_argument("--top-logprobs", type=int, default=0, metavar="N",
                     help="after the answer, print each generated token's log-probability and its N most "
                          "likely alternatives (temperature 1), 0 to 20 (default %(default)s: none)")
    gen.add_argument("--stop", action="append", default=[],
                     help="stop sequence, verbatim (commas included); repeatable; one that starts "
                          "with '-' is written --stop=VALUE")
    pad = gen.add_mutually_exclusive_group()
    pad.add_argument("--pad-to-chunk-boundary", dest="pad", action="store_const", const=True, default=None,
                     help="pad the open chunk before generating, so the first token sees chunks "
                          "retrieved with the whole prompt in view (default: what the model was "
                          "trained for, from the server's model info)")
    pad.add_argument("--no-pad-to-chunk-boundary", dest="pad", action="store_const", const=False,
                     help="do not pad, whatever the model's default")

    only = p.add_argument_group("tokenizer only (no session)").add_mutually_exclusive_group()
    only.add_argument("--tokenize", action="store_true",
                      help="only tokenize --prompt-file: print '<count> tokens (context limit <n>)', then "
                           "the ids on one line (what --token-ids reads)")
    only.add_argument("--detokenize", action="store_true",
                      help="only detokenize --token-ids: write the ids' bytes to stdout as they are")
    p.add_argument("--count-only", action="store_true", help="with --tokenize: print the count only")
    p.add_argument("--keep-session", action="store_true", help="do not delete the session at the end")
    p.add_argument("--session-key", type=session_key, default=None,
                   help=f"routing key sent as metadata '{SESSION_HEADER}' on every call, so that a gateway "
                        "hashing on it (deploy/k8s/gateway) sends all calls of the session to the replica "
                        "that holds it; printable ASCII (default: 32 random hex digits)")
    p.add_argument("--require-passkey", action="store_true",
                   help="exit 1 when the first number in the answer is not the haystack's pass key "
                        "(the generated haystack only)")
    stops, rest = take_stops(sys.argv[1:] if argv is None else list(argv))
    args = p.parse_args(rest)
    args.stop = stops
    own_prompt = args.prompt_file or args.token_ids
    if own_prompt:
        # Meaningless without the generated haystack: a script passing
        # --require-passkey here would pass whatever the answer.
        for flag, value in (("--require-passkey", args.require_passkey or None), ("--passkey", args.passkey),
                            ("--depth", args.depth), ("--haystack-tokens", args.haystack_tokens)):
            if value is not None:
                p.error(f"{flag} needs the generated haystack (no --prompt-file or --token-ids)")
    if args.tokenize and not args.prompt_file:
        p.error("--tokenize needs --prompt-file (the text to tokenize)")
    if args.detokenize and not args.token_ids:
        p.error("--detokenize needs --token-ids (the ids to spell)")
    if args.count_only and not args.tokenize:
        p.error("--count-only goes with --tokenize")
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
    args.token_id_list = read_token_ids(args.token_ids) if args.token_ids else None
    # A session prompt with nothing in it: the server refused the first
    # Append ("Append needs at least one message naming the session") after
    # the client had made the session (review-tools 2026-11-25 #8).
    if not args.tokenize and not args.detokenize and not args.question:
        if args.prompt_file and os.path.isfile(args.prompt_file) and os.path.getsize(args.prompt_file) == 0:
            p.error(f"--prompt-file {args.prompt_file} is empty (and no --question): there is no prompt to send")
        if args.token_ids and not args.token_id_list:
            p.error(f"--token-ids {args.token_ids} holds no token ids (and no --question): there is no "
                    "prompt to send")
    if not args.idle_timeout > 0 or not args.connect_timeout > 0:
        p.error("--idle-timeout and --connect-timeout must be positive")
    if not args.deadline >= 0:
        p.error("--deadline must be positive, or 0 for none")
    if not args.retry_seconds >= 0:
        p.error("--retry-seconds must be positive, or 0 for no retries")
    if not 0.0 <= args.depth <= 1.0:
        p.error("--depth must be within [0, 1]")
    if not 0 <= args.top_logprobs <= 20:
        p.error("--top-logprobs must be in [0, 20]")
    if args.haystack_tokens < 1 or args.piece_bytes < 4 or args.piece_tokens < 1 or args.max_tokens < 1:
        p.error("--haystack-tokens, --piece-bytes (>= 4), --piece-tokens and --max-tokens must be positive")
    # Stop by stop, as the C++ client, so both name the first bad one.
    for i, stop in enumerate(args.stop):
        if stop == "":
            # The server refuses it too, but only at the Generate, after the whole Append.
            refuse("--stop: a stop sequence must not be empty")
        args.stop[i] = utf8_argument("--stop", stop)
    args.question = utf8_argument("--question", args.question)
    if args.passkey is not None and not args.passkey.isdigit():
        p.error("--passkey must be digits")
    if args.prompt_logprobs is not None and not 0 <= args.prompt_logprobs <= 20:
        p.error(f"--prompt-logprobs must be in [0, 20], got {args.prompt_logprobs}")
    args.score_totals = [0, 0.0]  # scored tokens, their summed logprob (note_prompt_logprobs)
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
    """The ids of a --token-ids file (whitespace-separated 32-bit integers),
    or exit 1 naming the file, the word and its index; read in parse_args,
    before connecting (review-tools 2026-11-25 #8), as the C++ client does."""
    with open(path, "rb") as f:
        words = f.read().split()
    ids = []
    for i, word in enumerate(words):
        # The words strtoll reads whole in the C++ client: an optional sign, then digits.
        value = int(word) if re.fullmatch(rb"[+-]?[0-9]+", word) else None
        if value is None or not -(1 << 31) <= value < 1 << 31:
            sys.exit(f"drt_client: --token-ids {path}: {word.decode('utf-8', 'replace')!r} (index {i}) "
                     "is not a 32-bit integer")
        ids.append(value)
    return ids


def check_token_ids(path, ids, info):
    """Exit 1 naming the file, the index and the rule for the first id the
    server would refuse in the Append (outside the vocabulary, the landmark
    id, the pad id: Session::ValidateTokens's rule), checked against
    GetModelInfo before CreateSession: the server refused it only after the
    client had made a session (review-tools 2026-11-25 #8)."""
    for i, token in enumerate(ids):
        at = f"drt_client: --token-ids {path}: token {token} (index {i})"
        if not 0 <= token < info.vocab_size:
            sys.exit(f"{at} is outside the model's vocabulary [0, {info.vocab_size})")
        if token == info.chunk_id:
            sys.exit(f"{at} is the landmark id, which only the engine inserts")
        if token == info.pad_id:
            sys.exit(f"{at} is the pad id, which only the engine inserts")


def make_prompt(args, info):
    """(pieces, expected tokens or None, pass key or None, description); pieces
    is a function that yields the prompt's pieces from the start each time it
    is called, so that an Append cut by a restart can be resumed."""
    question = lambda: split_utf8(args.question, args.piece_bytes)
    if args.prompt_file:
        pieces = lambda: chain(read_text_pieces(args.prompt_file, args.piece_bytes), question())
        size = os.path.getsize(args.prompt_file)
        expected = size if info.tokenizer == "bytes" and not args.question else None
        return pieces, expected, None, f"{args.prompt_file} ({size:,} bytes)"
    if args.token_ids:
        ids = args.token_id_list
        pieces = lambda: chain((ids[i:i + args.piece_tokens] for i in range(0, len(ids), args.piece_tokens)),
                               question())
        return pieces, None if args.question else len(ids), None, f"{args.token_ids} ({len(ids):,} token ids)"
    passkey = args.passkey or str(random.SystemRandom().randrange(10_000, 100_000))
    text, expected = haystack_text(args.haystack_tokens, args.depth, passkey, info.tokenizer)
    return (lambda: split_utf8(text, args.piece_bytes), expected, passkey,
            f"haystack of ~{expected:,} tokens ({len(text):,} bytes), pass key {passkey} at depth {args.depth:g}")


def resume_point(pieces, skip, bytes_tokenizer):
    """None when the prompt's first `skip` tokens can be cut off client-side,
    else why not. Token ids count one each; text counts one token per UTF-8
    byte with the byte tokenizer (ModelInfo.tokenizer "bytes": id = byte
    value), and cannot be counted with a BPE tokenizer (its token boundaries
    are the server's). Nor with the byte tokenizer when that text holds "<|":
    a tokenizer.json with added tokens and no merges is "bytes" too, and a
    special token written literally ("<|...|>") is one token, not one per
    byte (engine/tokenizer/tokenizer.h); the bundled models refuse theirs as
    input, a third-party one may not."""
    before = b""  # the text byte before this piece, for a "<|" across pieces
    for piece in pieces:
        if skip == 0:
            return None
        if isinstance(piece, str):
            if not bytes_tokenizer:
                return ("the session holds part of the prompt's text, and with a BPE tokenizer this "
                        "client cannot tell which text those tokens cover")
            data = piece.encode("utf-8")
            if b"<|" in before + data[:skip + 1]:
                return ("the prompt's text before the resume point holds '<|', which may be a special "
                        "token written literally that the tokenizer counts as one token, not one per byte")
            before = data[skip - 1:skip] if skip < len(data) else data[-1:]
            skip -= min(skip, len(data))
        else:
            skip -= min(skip, len(piece))
    return None if skip == 0 else f"the session holds {skip:,} tokens more than this prompt has"


def pieces_after(pieces, skip):
    """The prompt's pieces without their first `skip` tokens (resume_point said
    they can be cut off). The text piece the cut falls in goes on as token ids
    (its bytes), since the cut may fall inside a UTF-8 character; later pieces
    are sent as they are."""
    for piece in pieces:
        if skip == 0:
            yield piece
            continue
        data = piece.encode("utf-8") if isinstance(piece, str) else piece
        if skip >= len(data):
            skip -= len(data)
            continue
        yield list(data[skip:])
        skip = 0


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

    def update(self, p, final=False, offset=0):
        """offset: prompt tokens the session held before this Append call (a
        resumed Append counts from there)."""
        rate = p.tokens_ingested / p.elapsed_seconds if p.elapsed_seconds > 0 else 0.0
        tokens = offset + p.tokens_ingested
        stats = (f"{tokens:,} tokens  {p.chunks_ingested:,} chunks  "
                 f"{rate:,.0f} tokens/s  {p.elapsed_seconds:.1f} s")
        if self.total:
            frac = 1.0 if final else min(tokens / self.total, 0.999)
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


class GaveUp(Exception):
    """A call failed in a way the client does not retry past: UNAVAILABLE
    outlasted --retry-seconds, or a cut call cannot be re-sent safely."""


class Retrier:
    """Retries calls that got UNAVAILABLE (--retry-seconds), with exponential
    backoff and jitter and a log line per retry on stderr.

    Which calls, and why they are safe to send again (docs/api.md, "Durable
    sessions"; client_examples/README.md):
    - GetModelInfo, GetSession: they only read.
    - CreateSession: a retry may leave an empty session behind when the first
      attempt was carried out and only its answer lost; it holds almost
      nothing and expires after its idle TTL.
    - DeleteSession: NOT_FOUND on a retry means the first attempt deleted it.
    - Append: not re-sent blindly (its tokens would be in the context twice):
      the client asks GetSession how many tokens the session holds and
      resumes the prompt from there (see append()).
    - Generate: sent again only when the session holds what it held before
      the call: a durable server writes a Generate all or nothing, when it
      ends, so that means nothing of it joined the session (see
      generate_retried()).
    """

    def __init__(self, grpc, seconds, server, log=sys.stderr):
        self.grpc = grpc
        self.seconds = seconds
        self.server = server
        self.log = log
        self.rng = random.Random()
        self.gave_up = False  # once the bound ran out, later calls get one attempt
        # Ctrl-C or SIGTERM came: no more retries, so the DeleteSession on the
        # way out gets one attempt (its 10 s deadline), not --retry-seconds
        # against a server that is down (review-tools #2).
        self.interrupted = False

    def unavailable(self, error):
        return isinstance(error, self.grpc.RpcError) and error.code() == self.grpc.StatusCode.UNAVAILABLE

    def stream_cut(self, error):
        """Whether an Append or Generate stream that failed with `error` may
        have been cut by a server or gateway going away. Directly from
        drt-server a cut arrives as UNAVAILABLE; through an HTTP/2 proxy
        (Envoy) a stream whose server died after sending headers is reset,
        which gRPC reports as INTERNAL ("RST_STREAM") or CANCELLED. The
        client's own cancellations never get here as RpcError: Ctrl-C raises
        KeyboardInterrupt, --idle-timeout StreamIdle, --deadline
        DEADLINE_EXCEEDED (not a cut). Safe to widen: what is sent next is
        decided by GetSession's count, never by the status (append(),
        generate_retried())."""
        if not isinstance(error, self.grpc.RpcError):
            return False
        code = error.code()
        codes = self.grpc.StatusCode
        return (code in (codes.UNAVAILABLE, codes.CANCELLED)
                or (code == codes.INTERNAL and "RST_STREAM" in (error.details() or "")))

    def outage(self):
        return Outage(self)

    def unary(self, what, call):
        """call() until it does not fail with UNAVAILABLE, within the bound."""
        outage = self.outage()
        while True:
            try:
                return call()
            except self.grpc.RpcError as e:
                if not self.unavailable(e):
                    raise
                outage.wait(what, e)


class Outage:
    """The retries of one call (or of one Append with its resumes): the bound
    counts from its first UNAVAILABLE, and starts again after progress (an
    Append: the session took more of the prompt since the call cut last
    began, seen in that call's acknowledgements or, when they were lost, in
    GetSession's count). Each stretch without progress, the time the server
    was up included, gets --retry-seconds; the number of stretches is bounded
    by the prompt's length, since each takes more of it."""

    def __init__(self, retrier):
        self.retrier = retrier
        self.start = None
        self.retries = 0

    def reset(self):
        self.start = None
        self.retries = 0

    def wait(self, what, error):
        """Sleeps before the next attempt and logs it; re-raises `error` when
        retries are off, and raises GaveUp once the bound has run out."""
        r = self.retrier
        reason = f"{error.code().name}: {error.details()}" if isinstance(error, r.grpc.RpcError) else str(error)
        if r.seconds <= 0 or r.gave_up or r.interrupted:
            if isinstance(error, r.grpc.RpcError):
                raise error
            raise GaveUp(f"{what}: {reason}")
        now = time.monotonic()
        if self.start is None:
            self.start = now
        used = now - self.start
        left = r.seconds - used
        if left <= 0:
            r.gave_up = True
            raise GaveUp(f"drt-server at {r.server} did not come back within --retry-seconds {r.seconds:g}: "
                         f"{what} still failed ({reason}) after {self.retries} retries in {used:.1f} s")
        delay = min(RETRY_MAX_DELAY, RETRY_FIRST_DELAY * 2 ** min(self.retries, 30))
        delay = min(left, delay * r.rng.uniform(0.5, 1.0))
        self.retries += 1
        print(f"drt_client: {what}: {reason}; retry {self.retries} in {delay:.2f} s "
              f"({used:.1f} s of --retry-seconds {r.seconds:g} used)", file=r.log, flush=True)
        time.sleep(delay)


def session_when_idle(pb, stub, session_id, metadata, retrier, outage, cut):
    """The session's info once the server answers and the session is not busy
    (a call cut by a dropped connection, not by a restart, may still be ending
    on the server). `cut` describes the cut call for error messages."""
    grpc = retrier.grpc
    while True:
        try:
            info = stub.GetSession(pb.GetSessionRequest(session_id=session_id), metadata=metadata,
                                   timeout=UNARY_DEADLINE_SECONDS)
        except grpc.RpcError as e:
            # A server shutting down cancels the calls it holds (CANCELLED);
            # GetSession is read-only, so that is waited out like UNAVAILABLE
            # (Ctrl-C raises KeyboardInterrupt, never CANCELLED, here).
            if retrier.unavailable(e) or e.code() == grpc.StatusCode.CANCELLED:
                outage.wait("GetSession", e)
                continue
            if e.code() == grpc.StatusCode.NOT_FOUND:
                raise GaveUp(f"{cut}, and session {session_id} is gone ({e.details()}): the server keeps "
                             "sessions across a restart only with --state_dir, or a gateway routed this call to "
                             "another replica. Create a new session and send the prompt again") from None
            raise
        if not info.busy:
            return info
        outage.wait("GetSession", RuntimeError("the session is still busy with the cut call"))


def note_prompt_logprobs(scores, args):
    """Adds a PromptLogprobs event to args.score_totals (count, sum) and, with
    --print-logprobs, prints one line per token: its index in the call, id,
    logprob (nan: no logits before it, the first token of an empty session)
    and its alternatives."""
    for k, (token, logprob) in enumerate(zip(scores.token_ids, scores.logprobs)):
        if not math.isnan(logprob):
            args.score_totals[0] += 1
            args.score_totals[1] += logprob
        if args.print_logprobs:
            top = ""
            if k < len(scores.top_logprobs):
                top = " " + " ".join(f"{a.token_id}:{a.logprob:.4f}"
                                     for a in scores.top_logprobs[k].alternatives)
            print(f"logprob {scores.first_token_index + k} {token} {logprob:.6f}{top}", flush=True)


def append_once(pb, stub, session_id, pieces, metadata, args, bar, offset, acked):
    """One Append call of `pieces`; acked[0] follows the session's tokens as
    the server acknowledges them. Returns the summary."""
    def requests():
        for i, piece in enumerate(pieces):
            request = pb.AppendRequest(session_id=session_id if i == 0 else "")
            if i == 0 and args.prompt_logprobs is not None:
                request.prompt_logprobs = args.prompt_logprobs
            if isinstance(piece, str):
                request.text = piece
            else:
                request.tokens.ids.extend(piece)
            yield request

    last = None
    summary = None
    call = stub.Append(requests(), metadata=metadata, timeout=stream_deadline(args))
    for response in watched(call, args.idle_timeout):
        event = response.WhichOneof("event")
        if event == "prompt_logprobs":
            note_prompt_logprobs(response.prompt_logprobs, args)
        elif event == "progress":
            last = response.progress
            acked[0] = last.session_tokens
            bar.update(last, offset=offset)
        else:
            summary = response.summary
            acked[0] = summary.session_tokens
    if last is not None:
        bar.update(last, final=True, offset=offset)
    if summary is None:
        raise RuntimeError("the Append stream ended without a summary")
    return summary


def append(pb, stub, session_id, pieces, expected_tokens, metadata, args, retrier, bytes_tokenizer,
           base_tokens):
    """Streams the prompt (pieces() yields it from the start) into a session
    that held base_tokens. An Append cut (Retrier.stream_cut) is not sent again
    whole: what the server acknowledged is on disk with --state_dir (and may
    be a little more: a step written whose acknowledgement was lost), so the
    client waits for the server, asks GetSession how many tokens the session
    holds and sends the prompt from there. Returns (summary of the whole
    prompt, seconds, resumes)."""
    grpc = retrier.grpc
    bar = ProgressBar(expected_tokens)
    start = time.perf_counter()
    held = 0          # prompt tokens in the session when the current call began
    acked = [base_tokens]  # the session's tokens at the last acknowledgement
    resumes = 0
    outage = retrier.outage()
    remaining = pieces()
    while True:
        # Acknowledgements above what the session held when this call began
        # are this call's progress.
        acked[0] = base_tokens + held
        try:
            summary = append_once(pb, stub, session_id, remaining, metadata, args, bar, held, acked)
            total = summary.session_tokens - base_tokens
            whole = pb.AppendSummary(tokens_ingested=total, session_tokens=summary.session_tokens,
                                     session_chunks=summary.session_chunks,
                                     elapsed_seconds=summary.elapsed_seconds,
                                     tokens_per_second=summary.tokens_per_second)
            return whole, time.perf_counter() - start, resumes
        except grpc.RpcError as e:
            bar.abort()
            if not retrier.stream_cut(e):
                raise
            error = e
        except BaseException:
            bar.abort()
            raise
        acknowledged = acked[0] - base_tokens
        cut = (f"the Append was cut ({error.code().name}: {error.details()}) after the server "
               f"acknowledged {acknowledged:,} tokens of this prompt")
        if acknowledged > held:
            # Progress in the cut call: this outage's bound counts from this
            # cut, not from an earlier one (it counted the time the server
            # was up and taking the prompt too, so a long call between two
            # short outages could end the retries at once).
            outage.reset()
        try:
            outage.wait("Append", error)
            info = session_when_idle(pb, stub, session_id, metadata, retrier, outage, cut)
        except GaveUp as e:
            raise GaveUp(f"{e}; {cut} (they are in session {session_id})") from None
        now_held = info.tokens - base_tokens
        if now_held < acknowledged:
            print(f"drt_client: warning: session {session_id} holds {now_held:,} tokens of this prompt, "
                  f"fewer than the {acknowledged:,} acknowledged (the server lost acknowledged tokens); "
                  "resuming from what it holds", file=sys.stderr, flush=True)
        if now_held > held:
            # Progress whose acknowledgement was lost: the next cut's bound
            # counts from that cut.
            outage.reset()
        why = resume_point(pieces(), now_held, bytes_tokenizer)
        if why:
            raise GaveUp(f"{cut}; session {session_id} holds {now_held:,} of them now and cannot be "
                         f"resumed: {why}. Append the rest yourself from there (--keep-session keeps "
                         "the session), or start again")
        held = now_held
        resumes += 1
        print(f"drt_client: resuming the Append at prompt token {held:,} (session {session_id} holds "
              f"{info.tokens:,} tokens; {acknowledged:,} of the prompt were acknowledged before the cut)",
              file=sys.stderr, flush=True)
        remaining = pieces_after(pieces(), held)
        first = next(remaining, None)
        if first is None:  # all of it was in before the cut: only the summary was lost
            whole = pb.AppendSummary(tokens_ingested=held, session_tokens=info.tokens,
                                     session_chunks=info.chunks)
            return whole, time.perf_counter() - start, resumes
        remaining = chain([first], remaining)


def sampling_params(pb, args):
    """The sampling the command line asks for: sent with Generate, and with
    CreateSession as the session's defaults, so that the server refuses a bad
    value (with Generate's message) before any of the prompt is sent."""
    return pb.SamplingParams(temperature=args.temperature, top_k=args.top_k,
                             top_p=args.top_p, seed=args.seed, min_p=args.min_p,
                             presence_penalty=args.presence_penalty,
                             frequency_penalty=args.frequency_penalty,
                             logit_bias=args.logit_bias)


def check_generation_limits(args, info):
    """--max-tokens and --top-logprobs against the limits GetModelInfo
    reports (0 from a server of before: not checked here, the server does).
    Exits with the message before anything is sent."""
    # (getattr: stubs generated before these fields have none.)
    max_tokens = getattr(info, "max_tokens_limit", 0)
    max_top = getattr(info, "max_top_logprobs", 0)
    if max_tokens and args.max_tokens > max_tokens:
        sys.exit(f"drt_client: --max-tokens {args.max_tokens} is over this server's limit of "
                 f"{max_tokens} (GetModelInfo.max_tokens_limit); nothing was sent")
    if max_top and args.top_logprobs > max_top:
        sys.exit(f"drt_client: --top-logprobs {args.top_logprobs} is over this server's limit of "
                 f"{max_top} (GetModelInfo.max_top_logprobs); nothing was sent")


def generate(pb, stub, session_id, args, metadata, out=sys.stdout, received=None, pieces=None, printed=""):
    """received[0] counts the piece messages that reached the client;
    `pieces` (a list) gets their text, also when the call is cut.
    `printed`: the answer's text already written to `out` by an earlier try
    of the same Generate; this one's text repeats it (same request, seed and
    session state) and only what follows it is written. A different start is
    an error (GaveUp)."""
    request = pb.GenerateRequest(
        session_id=session_id,
        max_tokens=args.max_tokens,
        sampling=sampling_params(pb, args),
        stop=args.stop)
    if args.pad is not None:
        request.pad_to_chunk_boundary = args.pad
    if args.top_logprobs > 0:
        request.return_logprobs = True
        request.top_logprobs = args.top_logprobs
    # One line per generated token (--top-logprobs), printed after the answer.
    args.logprob_lines = []
    received = received if received is not None else [0]
    text = pieces if pieces is not None else []
    tokens = 0
    at = 0  # characters of this try's text so far (a running count: not a sum over the pieces)
    first = last = None
    done = None
    start = time.perf_counter()
    call = stub.Generate(request, metadata=metadata, timeout=stream_deadline(args))
    for response in watched(call, args.idle_timeout):
        if response.WhichOneof("event") == "piece":
            received[0] += 1
            now = time.perf_counter()
            if response.piece.token_ids:
                first = first if first is not None else now
                last = now
                tokens += len(response.piece.token_ids)
            for i, top in enumerate(response.piece.top_logprobs):
                alternatives = " ".join(f"{a.token_bytes!r}={a.logprob:.4f}" for a in top.alternatives)
                args.logprob_lines.append(f"  {response.piece.token_ids[i]:>6} {top.token_bytes!r:>10} "
                                          f"{response.piece.logprobs[i]:9.4f}  top: {alternatives}")
            piece = response.piece.text
            text.append(piece)
            # What an earlier try printed already is not printed again.
            repeated = printed[at:at + len(piece)]
            at += len(piece)
            if piece[:len(repeated)] != repeated:
                # Cancelled first: the server would otherwise generate on (up to
                # max_tokens) into a session kept with --keep-session.
                call.cancel()
                raise GaveUp("the Generate sent again answered differently from its first try "
                             f"({printed!r} so far, now {''.join(text)!r}): the session did not hold "
                             "what it held before the first try")
            out.write(piece[len(repeated):])
            out.flush()
        else:
            done = response.done
    out.write("\n")
    ttft = first - start if first is not None else float("nan")
    tpot = (last - first) / (tokens - 1) if tokens > 1 else float("nan")
    return "".join(text), done, tokens, ttft, tpot


def generate_retried(pb, stub, session_id, args, metadata, retrier, base_tokens):
    """generate(), sent again after a cut (Retrier.stream_cut) only when that is the same as
    the first try: the session holds exactly its base_tokens (a durable server
    continues a session exactly, so the same request and seed give the same
    answer). A durable server writes a Generate all or nothing when it ends
    (docs/api.md, "Durable sessions"): a crash during it leaves the session as
    it was, even after pieces reached the client, and those are then not
    printed twice. A Generate that ended (a drain, the server seeing the cut)
    leaves its tokens in the session, and generating again would continue
    after them: not repeated."""
    grpc = retrier.grpc
    outage = retrier.outage()
    printed = ""  # the answer's text an earlier try printed
    while True:
        received, pieces = [0], []
        try:
            return generate(pb, stub, session_id, args, metadata, received=received, pieces=pieces,
                            printed=printed)
        except grpc.RpcError as e:
            if not retrier.stream_cut(e):
                raise
            error = e
        text = "".join(pieces)
        printed = text if len(text) > len(printed) else printed
        cut = f"the Generate was cut ({error.code().name}: {error.details()})"
        if received[0]:
            cut += f" after {received[0]} answer piece{'s' if received[0] != 1 else ''} reached the client"
        outage.wait("Generate", error)
        info = session_when_idle(pb, stub, session_id, metadata, retrier, outage, cut)
        if info.tokens < base_tokens:
            raise GaveUp(f"{cut}; session {session_id} holds {info.tokens:,} tokens, fewer than the "
                         f"{base_tokens:,} acknowledged before it (the server lost acknowledged tokens: "
                         f"the last {base_tokens - info.tokens:,} of the prompt are gone), so generating "
                         "again would answer a shorter prompt: not retried")
        if info.tokens != base_tokens:
            raise GaveUp(f"{cut}; session {session_id} now holds {info.tokens - base_tokens:,} tokens more "
                         "than before it (the Generate's padding and generated tokens, written as it "
                         "ended), "
                         "so generating again would not repeat it: not retried")
        print(f"drt_client: {cut}; session {session_id} holds what it held before the Generate "
              f"({info.tokens:,} tokens); sending the Generate again", file=sys.stderr, flush=True)


def delete_session(pb, stub, session_id, metadata, retrier):
    """DeleteSession, retried on UNAVAILABLE; NOT_FOUND after a retry means an
    earlier attempt deleted it (its answer was lost). Reports, never raises."""
    grpc = retrier.grpc
    outage = retrier.outage()
    attempts = 0
    while True:
        attempts += 1
        try:
            stub.DeleteSession(pb.DeleteSessionRequest(session_id=session_id), metadata=metadata, timeout=10)
            return
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND and attempts > 1:
                return
            problem = f"{e.code().name}: {e.details()}"
            if retrier.unavailable(e):
                try:
                    outage.wait("DeleteSession", e)
                    continue
                except (GaveUp, grpc.RpcError) as gave_up:
                    problem = str(gave_up) if isinstance(gave_up, GaveUp) else problem
        print(f"drt_client: could not delete session {session_id}: {problem}", file=sys.stderr)
        return


def ms(seconds):
    # (No time between tokens with one generated token: not "nan ms".)
    return "n/a" if math.isnan(seconds) else f"{1000 * seconds:.1f} ms"


def run(args, pb, pb_grpc, grpc):
    # gRPC reconnects a lost connection by itself, waiting longer after each
    # failed attempt (up to 120 s by default); calls made meanwhile fail at
    # once with UNAVAILABLE. Capped at the client's own longest retry delay,
    # so that a server back after a long outage is found within about that.
    options = [("grpc.max_reconnect_backoff_ms", int(RETRY_MAX_DELAY * 1000))]
    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            channel = grpc.secure_channel(args.server, grpc.ssl_channel_credentials(root_certificates=f.read()),
                                          options=options)
    else:
        channel = grpc.insecure_channel(args.server, options=options)
    stub = pb_grpc.DrtStub(channel)
    try:
        grpc.channel_ready_future(channel).result(timeout=args.connect_timeout)
    except grpc.FutureTimeoutError:
        # One call that does not wait for the connection says why there is
        # none (connection refused, no such host, TLS, ...); should it
        # succeed, the server came up just now.
        try:
            stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=CONNECT_PROBE_SECONDS)
        except grpc.RpcError as e:
            sys.exit(f"drt_client: cannot reach drt-server at {args.server} within "
                     f"{args.connect_timeout:g} s: {e.details()}")
    key = args.session_key or uuid.uuid4().hex
    metadata = [(SESSION_HEADER, key)]
    if args.token:
        metadata.append(("authorization", f"Bearer {args.token}"))

    retrier = Retrier(grpc, args.retry_seconds, args.server)

    if args.tokenize:
        with open(args.prompt_file, "rb") as f:
            request = pb.TokenizeRequest(text_bytes=f.read(), count_only=args.count_only)
        answer = retrier.unary("Tokenize", lambda: stub.Tokenize(
            request, metadata=metadata, timeout=UNARY_DEADLINE_SECONDS))
        print(f"{answer.count} tokens (context limit {answer.max_context_tokens})")
        if not args.count_only:
            print(" ".join(str(i) for i in answer.ids))
        return 0
    if args.detokenize:
        request = pb.DetokenizeRequest(ids=args.token_id_list)
        answer = retrier.unary("Detokenize", lambda: stub.Detokenize(
            request, metadata=metadata, timeout=UNARY_DEADLINE_SECONDS))
        sys.stdout.buffer.write(answer.text_bytes)
        sys.stdout.buffer.flush()
        if answer.ids_without_text:
            print(f"drt_client: {answer.ids_without_text} ids have no text (end-of-text, or not spelled "
                  "by the tokenizer)", file=sys.stderr)
        return 0

    info = retrier.unary("GetModelInfo", lambda: stub.GetModelInfo(
        pb.GetModelInfoRequest(), metadata=metadata, timeout=UNARY_DEADLINE_SECONDS))
    print(f"model: {info.name} on {info.device}, vocab {info.vocab_size:,} ({info.tokenizer}), "
          f"chunks of {info.enc_chunk_size}, top-k {info.chunk_topk}, window {info.slide_window}, "
          f"context limit {info.max_context_tokens:,} tokens", flush=True)
    if args.token_ids:
        check_token_ids(args.token_ids, args.token_id_list, info)
    check_generation_limits(args, info)
    pieces, expected, passkey, description = make_prompt(args, info)
    print(f"prompt: {description}", flush=True)

    # The try covers CreateSession and the print after it: a signal landing
    # once the session exists still deletes it (review-toolsfix #2). One
    # during the CreateSession call itself leaves no id to delete.
    session_id = None
    try:
        # The sampling goes with CreateSession too: a bad value is refused
        # now, not after the whole prompt (review-grpc finding 13).
        session_id = retrier.unary("CreateSession", lambda: stub.CreateSession(
            pb.CreateSessionRequest(sampling=sampling_params(pb, args)), metadata=metadata,
            timeout=UNARY_DEADLINE_SECONDS)).session_id
        print(f"session: {session_id} ({SESSION_HEADER}: {key})", flush=True)
        # A new session holds no tokens.
        summary, append_seconds, resumes = append(pb, stub, session_id, pieces, expected, metadata, args,
                                                  retrier, info.tokenizer == "bytes", base_tokens=0)
        resumed = f", resumed {resumes} time{'s' if resumes != 1 else ''} after a cut" if resumes else ""
        print(f"append: {summary.tokens_ingested:,} tokens, {summary.session_chunks:,} chunks in "
              f"{append_seconds:.2f} s: {summary.tokens_ingested / append_seconds:,.0f} tokens/s "
              f"(server: {summary.tokens_per_second:,.0f} tokens/s{' in its last call' if resumes else ''})"
              f"{resumed}", flush=True)
        if args.prompt_logprobs is not None:
            count, total = args.score_totals
            ppl = math.exp(-total / count) if count else float("nan")
            print(f"prompt logprobs: {count:,} tokens scored, sum {total:.4f}, "
                  f"perplexity {ppl:.4f}", flush=True)
        print("answer: ", end="", flush=True)
        answer, done, tokens, ttft, tpot = generate_retried(pb, stub, session_id, args, metadata, retrier,
                                                            summary.session_tokens)
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM (terminate() below), maybe while waiting to retry:
        # the retries end here; the session is deleted with one attempt, and
        # a second signal during it exits without waiting (main()).
        retrier.interrupted = True
        if session_id is not None and not args.keep_session:
            print(f"\ndrt_client: interrupted; deleting session {session_id} (again to exit at once)",
                  file=sys.stderr, flush=True)
        raise
    finally:
        if session_id is not None and not args.keep_session:
            delete_session(pb, stub, session_id, metadata, retrier)

    reason = pb.FinishReason.Name(done.finish_reason).removeprefix("FINISH_REASON_").lower() if done else "none"
    t = done.timings if done else pb.GenerateTimings()
    print(f"generate: {tokens} tokens, finish reason {reason}")
    print(f"  time to first token:   {ms(ttft)} (server: {ms(t.time_to_first_token_seconds)})")
    print(f"  time per output token: {ms(tpot)} (server: {ms(t.time_per_output_token_seconds)})")
    if args.top_logprobs > 0:
        print(f"logprobs (temperature 1; token id, its bytes, its logprob, the {args.top_logprobs} most likely):")
        for line in args.logprob_lines:
            print(line)
    if passkey is None:
        return 0
    # Right means: the first number in the answer is the pass key.
    number = re.search(r"\d+", answer)
    answered = number.group(0) if number else "no number"
    found = answered == passkey
    print(f"answer correct: {'yes' if found else 'no'} (pass key {passkey}, answered {answered})", flush=True)
    return 1 if args.require_passkey and not found else 0


def terminate(signum, frame):
    """SIGTERM ends the run as Ctrl-C does (the session is deleted), as in
    the C++ client, instead of killing the process with the session left on
    the server until its idle TTL."""
    raise KeyboardInterrupt


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
        # Installed inside the try: a SIGTERM handled right after the install
        # raises KeyboardInterrupt here, where it is caught (review-toolsfix #3).
        signal.signal(signal.SIGTERM, terminate)
        return run(args, pb, pb_grpc, grpc)
    except grpc.RpcError as e:
        print(f"drt_client: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    except (StreamIdle, GaveUp) as e:
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

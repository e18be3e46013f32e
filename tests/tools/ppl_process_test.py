#!/usr/bin/env python3
"""drt-ppl as a process, on the gqa_one_group fixture (a byte model whose
golden tokens are bytes 0..255, so they can be written as a --text file):

- --json holds the document's figures: tokens, bytes, scored tokens per
  bucket (--buckets 1K,2K: [0,1024), [1024,2048), [2048,2520)), each bucket's
  mean NLL against the Python reference's per-token NLLs
  (nll_golden.safetensors, weights_tools/make_nll_golden.py) within the
  tolerance of tests/perplexity_golden_test.cc's mean, perplexity = exp(mean
  NLL), bits per byte = NLL sum / ln 2 / bytes, and one retrieval per
  landmark and GCA group (40 chunks, 1 group);
- the default buckets are powers of two ([0,1K), [1K,2K), [2K,2520));
- --max_document_tokens truncates (--max_tokens, its deprecated old name, too,
  with a warning), --filler scores the passkey filler;
- --context N scores in windows of N tokens: each window's figures equal a
  run of that window's bytes alone (the same engine: tests/
  perplexity_windows_test.cc measured no difference), window 0's the
  reference's, and --context at or past the length is the plain run;
- several documents (--text repeated, or a folder): each document's figures
  equal its run alone, and the pooled ones are the token-weighted sums;
- bad flags exit non-zero naming the flag, before any work.

Reads safetensors with the standard library only (no numpy).

    ppl_process_test.py --ppl build/bench/drt-ppl
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "gqa_one_group")
# Measured against the reference: the mean NLL differs by at most 8.6e-8
# nats (tests/perplexity_golden_test.cc); the JSON's doubles print exactly.
MEAN_TOLERANCE = 1e-6
FAILED = []


def expect(ok, what, detail=""):
    print(("ok: " if ok else "FAILED: ") + what + ("" if ok or not detail else f"\n  {detail}"))
    if not ok:
        FAILED.append(what)


def read_tensor(path, name):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        entry = header[name]
        begin, end = entry["data_offsets"]
        f.seek(8 + size + begin)
        data = f.read(end - begin)
    fmt = {"I32": "i", "I64": "q", "F32": "f"}[entry["dtype"]]
    return list(struct.unpack(f"<{len(data) // struct.calcsize(fmt)}{fmt}", data))


def ppl(binary, *args):
    return subprocess.run([binary, "--model", FIXTURE, "--device", "cpu", "--threads", "1", *args],
                          capture_output=True, text=True, errors="replace", timeout=300)


def run_json(binary, tmp, *args):
    out = os.path.join(tmp, "out.json")
    if os.path.exists(out):
        os.remove(out)
    done = ppl(binary, *args, "--json", out)
    if done.returncode != 0:
        return done, None
    with open(out) as f:
        return done, json.load(f)


def close(a, b, tol=1e-9):
    return a is not None and abs(a - b) <= tol * max(1.0, abs(b))


def figures(b):
    return (b["begin"], b["end"], b["tokens"], b["bytes"])


def same_scores(x, y):
    """Same bucket, same tokens and bytes, the same mean NLL within the
    suite's tolerance (the piece may differ: perplexity_golden_test.cc)."""
    return (figures(x) == figures(y) and x["mean_nll"] is not None
            and abs(x["mean_nll"] - y["mean_nll"]) <= MEAN_TOLERANCE)


def several_documents(binary, tmp, tokens):
    """Two documents (the fixture's bytes 0..1500 and 1000..2520) against the
    two single-document runs."""
    folder = os.path.join(tmp, "books")
    os.makedirs(os.path.join(folder, "sub"))
    # Written b first: the folder's order is by name, not by creation.
    paths = [os.path.join(folder, "b.bin"), os.path.join(folder, "a.bin")]
    for path, part in zip(paths, (tokens[1000:], tokens[:1500])):
        with open(path, "wb") as f:
            f.write(bytes(part))
    with open(os.path.join(folder, "sub", "skipped.bin"), "wb") as f:
        f.write(bytes(tokens[:100]))
    a, b = paths[1], paths[0]
    alone = []
    for path in (a, b):
        done, out = run_json(binary, tmp, "--text", path, "--buckets", "1K")
        expect(out is not None and len(out.get("documents", [])) == 1 and out["input"] == path
               and out["documents"][0]["overall"] == out["overall"],
               f"one document: 'documents' holds it, the top level is its figures ({os.path.basename(path)})",
               done.stderr if out is None else str(out.get("documents")))
        alone.append(out)
    if None in alone:
        return
    for args, what in ((["--text", a, "--text", b], "--text a.bin --text b.bin"),
                       ([f"--text={a}", "--piece", "300", "-text", b], "--text=a.bin -text b.bin"),
                       (["--text", folder], "--text FOLDER (sorted, the subfolder skipped)")):
        done, out = run_json(binary, tmp, *args, "--buckets", "1K")
        expect(out is not None, f"{what} runs", done.stderr)
        if out is None:
            continue
        docs = out.get("documents", [])
        expect([d["input"] for d in docs] == [a, b] and out["input"] is None,
               f"{what}: documents a.bin, b.bin, no single input", str([d["input"] for d in docs]))
        if len(docs) != 2:
            continue
        for d, one in zip(docs, alone):
            expect(d["tokens"] == one["tokens"] and d["bytes"] == one["bytes"]
                   and d["retrievals"] == one["retrievals"]
                   and len(d["buckets"]) == len(one["buckets"])
                   and all(same_scores(p, q) for p, q in zip(d["buckets"], one["buckets"]))
                   and same_scores(d["overall"], one["overall"]),
                   f"{what}: {os.path.basename(d['input'])} as when run alone", f"{d} vs {one}")
        # Pooled: every figure summed; the mean NLL token-weighted.
        o, (x, y) = out["overall"], (alone[0]["overall"], alone[1]["overall"])
        weighted = (x["tokens"] * x["mean_nll"] + y["tokens"] * y["mean_nll"]) / (x["tokens"] + y["tokens"])
        expect(o["tokens"] == x["tokens"] + y["tokens"] == 1499 + 1519
               and out["tokens"] == 1500 + 1520 and out["bytes"] == 1500 + 1520
               and out["retrievals"] == alone[0]["retrievals"] + alone[1]["retrievals"]
               and abs(o["mean_nll"] - weighted) <= MEAN_TOLERANCE
               and close(o["bits_per_byte"], o["nll_sum"] / math.log(2) / o["bytes"]),
               f"{what}: pooled = token-weighted mean of the two runs ({weighted:.6f})", str(o))
        # Pooled buckets by position: [0,1K) from both, [1K,1520) from both
        # (a's ends at 1500), up to the longer document.
        pooled = out["buckets"]
        expect([(p["begin"], p["end"]) for p in pooled] == [(0, 1024), (1024, 1520)]
               and all(p["tokens"] == sum(one["buckets"][i]["tokens"] for one in alone)
                       and abs(p["nll_sum"] - sum(one["buckets"][i]["nll_sum"] for one in alone))
                       <= MEAN_TOLERANCE * p["tokens"]
                       for i, p in enumerate(pooled)),
               f"{what}: pooled buckets sum both documents' buckets", str(pooled))
        expect("pooled over 2 documents" in done.stdout and "document 2 of 2" in done.stdout,
               f"{what}: the table shows each document and the pool", done.stdout)
    # --context applies to each document.
    done, out = run_json(binary, tmp, "--text", folder, "--context", "1000")
    expect(out is not None and [d["windows"] for d in out.get("documents", [])] == [2, 2] and out["windows"] == 4
           and out["overall"]["tokens"] == 1500 + 1520 - 4,
           "--text FOLDER --context 1000: 2 windows in each document",
           done.stderr if out is None else str(out.get("documents")))

    # Refusals before any scoring, --json left as it was.
    out_json = os.path.join(tmp, "out.json")
    empty = os.path.join(tmp, "empty")
    os.makedirs(os.path.join(empty, "sub"))
    for args, name in (([a, a], "named twice"), ([folder, b], "named twice"),
                       ([empty], "no regular file"), ([a, os.path.join(tmp, "missing")], "missing")):
        with open(out_json, "wb") as f:
            f.write(b"earlier")
        command = [x for path in args for x in ("--text", path)]
        done = ppl(binary, *command, "--json", out_json)
        with open(out_json, "rb") as f:
            kept = f.read()
        expect(done.returncode == 1 and name in done.stderr and "--text" in done.stderr and kept == b"earlier"
               and "tokens/s" not in done.stdout,
               f"refused: --text {' --text '.join(os.path.relpath(x, tmp) for x in args)} names {name}",
               f"rc {done.returncode}: {done.stderr.strip()}")
    done = ppl(binary, "--text", folder, "--json", os.path.join(folder, "out.json"))
    expect(done.returncode == 1 and "--json" in done.stderr and not os.path.exists(os.path.join(folder, "out.json")),
           "refused: --json inside a --text folder", done.stderr.strip())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ppl", required=True)
    args = p.parse_args()

    tokens = read_tensor(os.path.join(FIXTURE, "golden.safetensors"), "tokens")
    nll = read_tensor(os.path.join(FIXTURE, "nll_golden.safetensors"), "token_nll")
    assert len(nll) == len(tokens) - 1 and max(tokens) < 256
    L = len(tokens)

    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "doc.bin")
        with open(text, "wb") as f:
            f.write(bytes(tokens))

        done, out = run_json(args.ppl, tmp, "--text", text, "--buckets", "1K,2K", "--piece", "100")
        expect(out is not None, "drt-ppl --text --buckets 1K,2K writes --json", done.stderr)
        if out is not None:
            expect(out["tokens"] == L and out["bytes"] == L, f"tokens and bytes are {L}",
                   f"{out['tokens']} {out['bytes']}")
            expect(out["input"] == text and out["piece"] == 100 and out["device"] == "cpu",
                   "input, piece and device recorded", str(out))
            bounds = [(b["begin"], b["end"]) for b in out["buckets"]]
            expect(bounds == [(0, 1024), (1024, 2048), (2048, L)], "buckets [0,1K) [1K,2K) [2K,L)",
                   str(bounds))
            for b in out["buckets"]:
                # Token i's NLL is nll[i - 1]; position 0 is not scored.
                scored = [nll[i - 1] for i in range(max(b["begin"], 1), b["end"])]
                want = sum(scored) / len(scored)
                expect(b["tokens"] == len(scored) and b["bytes"] == len(scored),
                       f"bucket {b['begin']}: {len(scored)} tokens scored, one byte each",
                       f"{b['tokens']} {b['bytes']}")
                expect(b["mean_nll"] is not None and abs(b["mean_nll"] - want) <= MEAN_TOLERANCE,
                       f"bucket {b['begin']}: mean NLL {want:.6f} (reference)", str(b["mean_nll"]))
                expect(close(b["perplexity"], math.exp(b["mean_nll"])), f"bucket {b['begin']}: perplexity = exp(mean NLL)")
                expect(close(b["bits_per_byte"], b["nll_sum"] / math.log(2) / b["bytes"]),
                       f"bucket {b['begin']}: bits per byte = NLL sum / ln 2 / bytes")
            o = out["overall"]
            expect(o["tokens"] == L - 1 and abs(o["mean_nll"] - sum(nll) / len(nll)) <= MEAN_TOLERANCE,
                   "overall: L - 1 tokens, the reference's mean NLL", str(o))
            expect(out["retrievals"] == L // 63, f"{L // 63} retrievals (one per landmark, one group)",
                   str(out["retrievals"]))
            expect(out["tokens_per_second"] > 0 and out["seconds"] > 0, "timing recorded")
            expect("mean NLL" in done.stdout and "retrievals" in done.stdout, "table printed",
                   done.stdout)

        done, out = run_json(args.ppl, tmp, "--text", text)
        if out is not None:
            bounds = [(b["begin"], b["end"]) for b in out["buckets"]]
            expect(bounds == [(0, 1024), (1024, 2048), (2048, L)], "default buckets: powers of two",
                   str(bounds))
            # The piece size changes nothing but the steps (4096 here: one piece).
            expect(abs(out["overall"]["mean_nll"] - sum(nll) / len(nll)) <= MEAN_TOLERANCE,
                   "default piece: the reference's mean NLL", str(out["overall"]))
        else:
            expect(False, "drt-ppl with default buckets runs", done.stderr)

        done, out = run_json(args.ppl, tmp, "--text", text, "--max_document_tokens", "1000")
        expect(out is not None and out["tokens"] == 1000 and out["overall"]["tokens"] == 999
               and [(b["begin"], b["end"]) for b in out["buckets"]] == [(0, 1000)]
               and abs(out["overall"]["mean_nll"] - sum(nll[:999]) / 999) <= MEAN_TOLERANCE,
               "--max_document_tokens 1000 scores the first 1000 tokens", done.stderr if out is None else str(out["overall"]))

        # The old name (the clients' --max_tokens is tokens to generate):
        # still taken, with a warning; both names at once are refused.
        done, out = run_json(args.ppl, tmp, "--text", text, "--max_tokens", "1000")
        expect(out is not None and out["tokens"] == 1000
               and "--max_tokens is deprecated" in done.stderr and "--max_document_tokens" in done.stderr,
               "--max_tokens 1000 (deprecated alias) scores 1000 tokens and warns",
               done.stderr if out is None else done.stderr + str(out["tokens"]))
        done, out = run_json(args.ppl, tmp, "--text", text, "--max_tokens", "1000",
                             "--max_document_tokens", "900")
        expect(out is None and done.returncode == 1 and "give one of them" in done.stderr,
               "--max_tokens with --max_document_tokens is refused", done.stderr)
        # Given is given, whatever the value (the default 0 included): the
        # old check compared values with the defaults (review-toolsbranch 5).
        done, out = run_json(args.ppl, tmp, "--text", text, "--max_tokens", "1000",
                             "--max_document_tokens", "0")
        expect(out is None and done.returncode == 1 and "give one of them" in done.stderr,
               "--max_tokens with --max_document_tokens 0 is refused", done.stderr)
        done, out = run_json(args.ppl, tmp, "--text", text, "--max_tokens=0")
        expect("--max_tokens is deprecated" in done.stderr,
               "--max_tokens=0 (its default value) still warns", done.stderr)

        # --context 1000: windows [0,1000) [1000,2000) [2000,L), one bucket
        # each; a window's first token is not scored.
        done, out = run_json(args.ppl, tmp, "--text", text, "--context", "1000", "--buckets", "1000,2000")
        expect(out is not None, "drt-ppl --context 1000 writes --json", done.stderr)
        if out is not None:
            expect(out["context"] == 1000 and out["windows"] == 3 and out["tokens"] == L
                   and out["overall"]["tokens"] == L - 3, "--context 1000: 3 windows, L - 3 tokens scored",
                   str({k: out[k] for k in ("context", "windows", "tokens")}) + str(out["overall"]))
            expect("context 1000 tokens: 3 windows" in done.stdout, "the table says the context", done.stdout)
            window_retrievals = 0
            for b in out["buckets"]:
                window = os.path.join(tmp, f"window{b['begin']}.bin")
                with open(window, "wb") as f:
                    f.write(bytes(tokens[b["begin"]:b["end"]]))
                alone_done, alone = run_json(args.ppl, tmp, "--text", window)
                if alone is None:
                    expect(False, f"window {b['begin']} alone runs", alone_done.stderr)
                    continue
                window_retrievals += alone["retrievals"]
                a = alone["overall"]
                expect(b["tokens"] == a["tokens"] == b["end"] - b["begin"] - 1
                       and abs(b["mean_nll"] - a["mean_nll"]) <= MEAN_TOLERANCE,
                       f"--context window {b['begin']}: the window's bytes scored alone "
                       f"({a['tokens']} tokens, mean NLL {a['mean_nll']:.6f})", str(b))
            expect(out["retrievals"] == window_retrievals, "--context: the windows' retrievals summed",
                   f"{out['retrievals']} vs {window_retrievals}")
            want = sum(nll[:999]) / 999
            expect(abs(out["buckets"][0]["mean_nll"] - want) <= MEAN_TOLERANCE,
                   "--context window 0: the reference's mean NLL of tokens 1..999", str(out["buckets"][0]))
        _, plain = run_json(args.ppl, tmp, "--text", text)
        for context in (str(L), "5000", "0"):
            done, out = run_json(args.ppl, tmp, "--text", text, "--context", context)
            same = (out is not None and plain is not None and out["windows"] == 1
                    and out["context"] == int(context)
                    and [(b["tokens"], b["nll_sum"]) for b in out["buckets"]]
                    == [(b["tokens"], b["nll_sum"]) for b in plain["buckets"]])
            expect(same, f"--context {context} (at or past the length, or 0) is the plain run",
                   done.stderr if out is None else str(out["overall"]))

        several_documents(args.ppl, tmp, tokens)

        done, out = run_json(args.ppl, tmp, "--filler", "--max_document_tokens", "1500")
        expect(out is not None and out["input"] == "filler" and out["tokens"] == 1500
               and out["overall"]["tokens"] == 1499, "--filler --max_document_tokens 1500 scores 1500 tokens",
               done.stderr if out is None else str(out))
        # Shorter than a passkey haystack's minimum (question + 200 filler
        # tokens): the filler alone has no such rule (it was refused).
        done, out = run_json(args.ppl, tmp, "--filler", "--max_document_tokens", "2")
        expect(out is not None and out["tokens"] == 2 and out["overall"]["tokens"] == 1,
               "--filler --max_document_tokens 2 scores 2 tokens", done.stderr if out is None else str(out))

        # Refusals: non-zero exit, the flag named, and --json untouched: a file
        # already there keeps its bytes (the check used to truncate it).
        out_json = os.path.join(tmp, "out.json")
        earlier = b'{"earlier": "results"}\n'
        one_byte = os.path.join(tmp, "one.bin")
        with open(one_byte, "wb") as f:
            f.write(b"a")
        for extra, name in ((["--text", text, "--piece", "0"], "--piece"),
                            (["--text", text, "--buckets", "4K,1K"], "--buckets"),
                            (["--text", text, "--buckets", "abc"], "--buckets"),
                            (["--text", text, "--max_document_tokens", "-1"], "--max_document_tokens"),
                            (["--filler"], "--max_document_tokens"),
                            ([], "--text"),
                            (["--text", text, "--filler", "--max_document_tokens", "5"], "--filler"),
                            (["--text", os.path.join(tmp, "missing.txt")], "--text"),
                            (["--text", text, "--no_such_flag", "1"], "no_such_flag"),
                            (["--text", text, "--device", "tpu"], "tpu"),
                            (["--text", one_byte], "at least 2"),
                            (["--filler", "--max_document_tokens", "1"], "--max_document_tokens"),
                            # Past the 4G cap: refused by name (it ended in bad_alloc, rc 134).
                            (["--filler", "--max_document_tokens", "100000000000"], "--max_document_tokens"),
                            (["--text", text, "--max_document_tokens", str((1 << 32) + 1)], "--max_document_tokens"),
                            (["--text", text, "--model", os.path.join(tmp, "no_model")], "no_model")):
            with open(out_json, "wb") as f:
                f.write(earlier)
            done = ppl(args.ppl, *extra, "--json", out_json)
            with open(out_json, "rb") as f:
                kept = f.read()
            expect(done.returncode == 1 and name in done.stderr and kept == earlier,
                   f"refused: {' '.join(extra[-2:]) if extra else '(no document)'} names {name}, "
                   "--json unchanged", f"rc {done.returncode}: {done.stderr.strip()}; --json holds {kept[:40]!r}")
        # --json naming the --text file: refused, the document unchanged.
        with open(text, "rb") as f:
            document = f.read()
        for same in (text, os.path.join(tmp, ".", "doc.bin")):
            done = ppl(args.ppl, "--text", text, "--json", same)
            with open(text, "rb") as f:
                kept = f.read()
            expect(done.returncode == 1 and "--json" in done.stderr and "--text" in done.stderr
                   and kept == document, f"refused: --json {same} is the --text file, which is unchanged",
                   f"rc {done.returncode}: {done.stderr.strip()}; {len(kept)} of {len(document)} bytes")
        # A run that succeeds replaces an earlier --json whole, leaving no temporary file.
        with open(out_json, "wb") as f:
            f.write(earlier * 1000)
        before = sorted(os.listdir(tmp))
        done = ppl(args.ppl, "--text", text, "--max_document_tokens", "100", "--json", out_json)
        try:
            with open(out_json) as f:
                replaced = json.load(f)
        except ValueError:
            replaced = None
        expect(done.returncode == 0 and replaced is not None and replaced["tokens"] == 100
               and sorted(os.listdir(tmp)) == before,
               "a run replaces an earlier --json, no temporary file left", f"{done.stderr.strip()} {os.listdir(tmp)}")
        bad_json = os.path.join(tmp, "no_such_dir", "out.json")
        done = ppl(args.ppl, "--text", text, "--json", bad_json)
        expect(done.returncode != 0 and "--json" in done.stderr and "tokens/s" not in done.stdout,
               "refused before scoring: --json in a missing directory names --json",
               f"rc {done.returncode}: {done.stderr.strip()}")

    if FAILED:
        print(f"{len(FAILED)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

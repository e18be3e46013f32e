#!/usr/bin/env python3
"""drt-bench's weight-read floor counts what a decode step reads, for tied and
untied models alike, and bad counts are refused (review-tools 2026-11-24 #13).

Two random models of the same shape are written with
weights_tools/make_random_model.py (numpy only): one with a tied output head,
one untied. A decode step reads every parameter once, except that with an
untied head the embedding gather reads one row (hidden_size values) of the
embedding, not all of it. The expectation is computed here from the
safetensors headers and config.json, independently of drt-bench:

  tied:   weight_bytes = bytes per weight x (every parameter in the file)
  untied: weight_bytes = bytes per weight x (every parameter in the file
                          - vocab x hidden + hidden)

(The code before the fix counted the untied embedding whole: vocab x hidden
too many.) Also: --prompt_tokens 0 and -5 and --generate 0 and 1 are refused
before any work (-5 used to grow a string until memory ran out).

    bench_weight_floor_test.py --bench build/bench/drt-bench
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BYTE_MODEL = os.path.join(REPO, "models", "drt-passkey-byte")
FAILED = []


def expect(ok, what, detail=""):
    print(("ok: " if ok else "FAILED: ") + what + ("" if ok or not detail else f"\n  {detail}"))
    if not ok:
        FAILED.append(what)


def parameters_in(path):
    """{tensor name: element count} from a safetensors file's header."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    counts = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        n = 1
        for dim in info["shape"]:
            n *= dim
        counts[name] = n
    return counts


def make_model(out, untied):
    with open(os.path.join(BYTE_MODEL, "config.json")) as f:
        byte = json.load(f)
    args = [sys.executable, os.path.join(REPO, "weights_tools", "make_random_model.py"), "--out", out,
            "--tokenizer", os.path.join(BYTE_MODEL, "tokenizer.json"), "--dtype", "f32",
            "--vocab-size", str(byte["vocab_size"]), "--pad-id", str(byte["pad_id"]),
            "--bos-id", str(byte["bos_id"]), "--eos-id", str(byte["eos_id"]),
            "--chunk-id", str(byte["chunk_id"]), "--mask-id", str(byte["mask_id"]),
            "--hidden-size", "64", "--num-heads", "2", "--num-kv-heads", "2", "--intermediate-size", "128"]
    if untied:
        args.append("--untied")
    subprocess.run(args, check=True, capture_output=True, text=True)


def bench(binary, model, *extra):
    return subprocess.run([binary, "--model", model, "--device", "cpu", "--threads", "1",
                           "--prompt_tokens", "200", "--generate", "2", *extra],
                          capture_output=True, text=True, errors="replace", timeout=300)


def result_fields(stdout):
    line = next((l for l in stdout.splitlines() if l.startswith("bench_result ")), "")
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", required=True, help="the drt-bench binary")
    args = p.parse_args()
    try:
        import numpy  # noqa: F401  (make_random_model.py needs it)
    except ImportError:
        print("SKIPPED: no numpy for weights_tools/make_random_model.py")
        return 77

    with tempfile.TemporaryDirectory(prefix="drt-bench-floor-") as tmp:
        rows = {}
        for name, untied in (("tied", False), ("untied", True)):
            model = os.path.join(tmp, name)
            make_model(model, untied)
            with open(os.path.join(model, "config.json")) as f:
                config = json.load(f)
            counts = parameters_in(os.path.join(model, "model.safetensors"))
            expect(("lm_head.weight" in counts) == untied, f"{name}: lm_head.weight is in the file iff untied")
            run = bench(args.bench, model)
            expect(run.returncode == 0, f"{name}: drt-bench runs", run.stderr[-2000:])
            fields = result_fields(run.stdout)
            bytes_per_weight = {"bf16": 2, "fp32": 4}[fields.get("cuda_precision", "bf16")]
            d, vocab = config["hidden_size"], config["vocab_size"]
            read = sum(counts.values()) - (vocab * d - d if untied else 0)
            got = float(fields.get("weight_bytes", "nan"))
            expect(got == bytes_per_weight * read,
                   f"{name}: weight_bytes {got:.0f} = {bytes_per_weight} x {read} parameters a decode step reads",
                   f"every parameter in the file: {sum(counts.values())}, vocab {vocab} x hidden {d}")
            rows[name] = got
            # --generate 2: the first token's time apart, one decode interval
            # after it (the first token includes padding and a chunk close).
            expect("first_token_ms" in fields and "(1 intervals;" in run.stdout,
                   f"{name}: first_token_ms reported apart, decode figures over the 1 interval after it",
                   run.stdout[-600:])
        # Same shapes but the untied head: the difference is one embedding row.
        expect(rows["untied"] - rows["tied"] == bytes_per_weight * d,
               f"untied minus tied is one embedding row ({d} values), not the whole embedding", str(rows))

        model = os.path.join(tmp, "tied")
        for flags, message in ((["--prompt_tokens=0"], "--prompt_tokens must be at least 1"),
                               (["--prompt_tokens=-5"], "--prompt_tokens must be at least 1"),
                               (["--generate=0"], "--generate must be at least 2"),
                               (["--generate=1"], "--generate must be at least 2")):
            run = bench(args.bench, model, *flags)
            expect(run.returncode != 0 and message in run.stderr,
                   f"drt-bench {' '.join(flags)} is refused: '{message}'", run.stderr[-500:])
    print(f"{'FAILED' if FAILED else 'passed'}: {len(FAILED)} failures")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

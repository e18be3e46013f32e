#!/usr/bin/env python3
"""drt-bench's warm-up (--warmup_tokens, review-tools #6): before the timed
session, a throwaway session appends the prompt's first min(N, prompt) tokens
and generates 2, so that the backend's one-time costs are not counted as
prefill. Checked here, on the CPU with a byte model:

- by default the warm-up runs, says so, and bench_result reports warmup=1
  and warmup_tokens=min(4096, --prompt_tokens);
- --warmup_tokens 0 skips it (warmup=0, no warm-up line), and a smaller N is
  taken as given;
- the warm-up leaves the timed run's results alone: the generated text and
  the session's token count are the same with and without it (the
  throwaway session shares nothing with the timed one);
- a negative --warmup_tokens is refused before any work, naming the flag.

Whether the warm-up removes a cold cost is a timing, measured by hand, not
here (docs/engine.md, "drt-bench").

    bench_warmup_test.py --bench build/bench/drt-bench
"""
import argparse
import os
import re
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(REPO, "models", "drt-passkey-byte")
FAILED = []


def expect(ok, what, detail=""):
    print(("ok: " if ok else "FAILED: ") + what + ("" if ok or not detail else f"\n  {detail}"))
    if not ok:
        FAILED.append(what)


def bench(binary, prompt_tokens, *extra):
    return subprocess.run([binary, "--model", MODEL, "--device", "cpu", "--threads", "1",
                           "--prompt_tokens", str(prompt_tokens), "--generate", "4", *extra],
                          capture_output=True, text=True, errors="replace", timeout=300)


def result_fields(stdout):
    line = next((l for l in stdout.splitlines() if l.startswith("bench_result ")), "")
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


def generated_line(stdout):
    """The "generated N tokens (reason): text" line: what the timed session produced."""
    return next((l for l in stdout.splitlines() if l.startswith("generated ")), None)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True)
    args = p.parse_args()

    runs = {}
    for name, prompt_tokens, extra, want_warm, want_tokens in (
            ("default, prompt 200", 200, [], "1", "200"),          # min(4096, 200)
            ("--warmup_tokens 0", 200, ["--warmup_tokens", "0"], "0", "0"),
            ("--warmup_tokens 70", 200, ["--warmup_tokens", "70"], "1", "70"),
            ("default, prompt 5000", 5000, [], "1", "4096")):
        r = bench(args.bench, prompt_tokens, *extra)
        runs[name] = r
        fields = result_fields(r.stdout)
        said = re.search(r"^warm-up: (\d+) tokens appended", r.stdout, re.M)
        expect(r.returncode == 0 and fields.get("warmup") == want_warm
               and fields.get("warmup_tokens") == want_tokens
               and (said.group(1) == want_tokens if said else want_warm == "0")
               and fields.get("context_tokens") == str(prompt_tokens),
               f"{name}: warmup={want_warm} warmup_tokens={want_tokens}, and the warm-up line "
               f"{'says so' if want_warm == '1' else 'is absent'}",
               f"exit {r.returncode}, fields {fields}\n{r.stdout[-1500:]}{r.stderr[-800:]}")

    cold, warm = runs["--warmup_tokens 0"].stdout, runs["default, prompt 200"].stdout
    expect(generated_line(cold) is not None and generated_line(cold) == generated_line(warm)
           and result_fields(cold).get("generated") == result_fields(warm).get("generated"),
           "the warm-up leaves the timed session's generated text unchanged",
           f"cold: {generated_line(cold)!r}\nwarm: {generated_line(warm)!r}")
    context = lambda out: re.search(r"context (\d+) tokens\)", out)
    expect(context(cold) is not None and context(warm) is not None
           and context(cold).group(1) == context(warm).group(1),
           "the timed session holds the same context with and without the warm-up",
           f"cold {context(cold) and context(cold).group(0)}, warm {context(warm) and context(warm).group(0)}")

    r = bench(args.bench, 200, "--warmup_tokens", "-1")
    expect(r.returncode == 1 and "--warmup_tokens must be 0" in r.stderr and "bench_result" not in r.stdout,
           "--warmup_tokens -1 is refused, naming the flag", r.stderr[-600:])

    print(f"{'FAILED' if FAILED else 'passed'}: {len(FAILED)} of the checks failed" if FAILED else "all passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

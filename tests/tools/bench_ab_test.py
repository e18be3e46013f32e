#!/usr/bin/env python3
"""scripts/bench_ab.py groups drt-bench lines by warm-up length as well as
by warmup on/off (review-toolsfix3 #8: runs with --warmup_tokens 70 and with
the default 4096 fell into one "A (defaults)" group). Hand-made lines:

- A: warmup_tokens=4096 at 16384 context, decode 2.0 and 2.2 ms (median 2.1);
- a 70-token warm-up at the same context, decode 3.0 ms: its own group, 3.0 / 2.1 = 1.429 of A;
- a 1000-token prompt warmed up on all of it (drt-bench prints min(4096, prompt)): A there;
- a line without warmup_tokens or warmup (predates both): the warmup=0 group.

    bench_ab_test.py
"""
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FAILED = []


def expect(ok, what, detail=""):
    print(("ok: " if ok else "FAILED: ") + what + ("" if ok or not detail else f"\n  {detail}"))
    if not ok:
        FAILED.append(what)


def main():
    base = ("bench_result device=cuda disable_gca=0 context_tokens=16384 prefill_tokens_per_s=70000 "
            "session_host_bytes=1048576 h2d_bytes_per_token=0")
    lines = [
        f"drt-bench x: {base} warmup=1 warmup_tokens=4096 decode_ms_median=2.0",
        f"drt-bench x: {base} warmup=1 warmup_tokens=70 decode_ms_median=3.0",
        f"drt-bench x: {base} warmup=1 warmup_tokens=4096 decode_ms_median=2.2",
        f"drt-bench x: {base.replace('16384', '1000')} warmup=1 warmup_tokens=1000 decode_ms_median=1.0",
        f"drt-bench x: {base.replace('16384', '1000')} decode_ms_median=1.5",
    ]
    with tempfile.TemporaryDirectory(prefix="drt-bench-ab-") as tmp:
        path = os.path.join(tmp, "results.txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        run = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench_ab.py"), path],
                             capture_output=True, text=True, timeout=60)
    out = run.stdout
    expect(run.returncode == 0, "bench_ab.py ran", run.stderr[-600:])
    for what, pattern in (
            ("A at 16384 holds only the default warm-up's runs",
             r"^\| 16384 \| GCA \| A \(defaults\) \| 2\.000, 2\.200 \| 2\.100 \| 1\.000 \|"),
            ("the 70-token warm-up is a variant of its own, against A",
             r"^\| 16384 \| GCA \| warmup_tokens=70 \| 3\.000 \| 3\.000 \| 1\.429 \|"),
            ("a prompt shorter than 4096 warmed up on all of it is A",
             r"^\| 1000 \| GCA \| A \(defaults\) \| 1\.000 \|"),
            ("a line from before the warm-up is warmup=0",
             r"^\| 1000 \| GCA \| warmup=0 \| 1\.500 \|")):
        expect(re.search(pattern, out, re.M) is not None, what, out)
    print(f"{'FAILED' if FAILED else 'passed'}: {len(FAILED)} failures")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

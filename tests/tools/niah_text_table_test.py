#!/usr/bin/env python3
"""bench/niah_text_table.py merges result files of one run setting only
(review-tools #11: it merged cells of different models or seeds into one
table without a word).

- two files of one setting, different lengths: one table with both files'
  rows, and the files it merged named on stderr;
- a file of another model, seed, text or padding (or one lacking a field
  the others record): refused, exit 1, naming both files and the field,
  nothing on stdout;
- a drt-niah (not -text) result file: refused, naming it, no traceback;
- the docs' own command (docs/passkey_accuracy.md, the first model on the
  handbook) still gives the table printed there, row for row.

    niah_text_table_test.py
"""
import json
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(REPO, "bench", "niah_text_table.py")
FAILED = []


def expect(ok, what, detail=""):
    print(("ok: " if ok else "FAILED: ") + what + ("" if ok or not detail else f"\n  {detail}"))
    if not ok:
        FAILED.append(what)


def table(*paths):
    return subprocess.run([sys.executable, TOOL, *paths], capture_output=True, text=True, timeout=60)


def write(directory, name, setting, lengths):
    path = os.path.join(directory, name)
    cells = [{"task": "passkey", "length": n, "depth": d, "trials": 4, "correct": 3, "seconds": 1.0}
             for n in lengths for d in (0.1, 0.9)]
    with open(path, "w") as f:
        json.dump({**setting, "cells": cells}, f)
    return path


def main():
    setting = {"model": "models/drt-text-byte", "text": "/t/handbook.txt", "pad_to_chunk_boundary": True,
               "seed": 1}
    with tempfile.TemporaryDirectory(prefix="niah-table-") as tmp:
        a = write(tmp, "a.json", setting, [4096])
        b = write(tmp, "b.json", setting, [65536])
        r = table(a, b)
        rows = [l for l in r.stdout.splitlines() if l.startswith("| passkey |")]
        expect(r.returncode == 0 and [l.split("|")[2].strip() for l in rows] == ["4,096", "65,536"]
               and a in r.stderr and b in r.stderr and "seed=1" in r.stderr,
               "two files of one setting: one table with both files' rows; stderr names the files and the setting",
               r.stdout + r.stderr)

        for field, value in (("model", "models/drt-passkey-byte"), ("seed", 2), ("text", "/t/fortunes.txt"),
                             ("pad_to_chunk_boundary", False), ("text_bytes", 1165863)):
            other = write(tmp, f"other-{field}.json", {**setting, field: value}, [16384])
            r = table(a, other)
            expect(r.returncode == 1 and r.stdout == "" and a in r.stderr and other in r.stderr
                   and f"{field} is" in r.stderr,
                   f"a file with another {field} is refused, naming both files and the field",
                   f"exit {r.returncode}\n{r.stdout}{r.stderr}")

    # A drt-niah (passkey) result file, whose cells have no "task": refused
    # with its name, no traceback (it stopped with a KeyError).
    passkey = os.path.join(REPO, "docs", "niah", "16m_pad_model.json")
    r = table(passkey)
    expect(r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
           and f"{passkey} is not a drt-niah-text result file: cell 0 has no 'task'" in r.stderr,
           "a drt-niah result file is refused, naming the file and the missing field",
           f"exit {r.returncode}\n{r.stdout}{r.stderr}")

    # The docs' command and table (docs/passkey_accuracy.md, "The first model").
    with open(os.path.join(REPO, "docs", "passkey_accuracy.md")) as f:
        doc = f.read()
    command = re.search(r"python3 bench/niah_text_table.py (docs/niah/text_old_\S+ [^\n]*\\\n\s+[^\n]+)", doc)
    files = command.group(1).replace("\\\n", " ").split() if command else []
    expanded = []
    for pattern in files:
        folder, name = os.path.split(os.path.join(REPO, pattern))
        rx = re.compile("^" + re.escape(name).replace(r"\*", ".*") + "$")
        expanded += sorted(os.path.join(folder, n) for n in os.listdir(folder) if rx.match(n))
    r = table(*expanded) if expanded else None
    printed = r.stdout.strip().splitlines() if r else []
    in_doc = all(line in doc for line in printed) and len(printed) > 2
    expect(r is not None and r.returncode == 0 and in_doc,
           f"the docs' command ({len(expanded)} files of the first model) still gives the table printed there",
           (r.stdout + r.stderr) if r else "command not found in docs/passkey_accuracy.md")

    print("all passed" if not FAILED else f"{len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

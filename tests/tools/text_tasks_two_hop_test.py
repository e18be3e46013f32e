#!/usr/bin/env python3
"""weights_tools/text_tasks.py's 2-hop sequences, checked by reading them
back as text (numpy only; the filler is the committed handbook excerpt,
which here only needs to be text):

- two_hop_once (training): exact length; 2 to 4 chains, each value line
  before its "VAR Y = VAR X" line; every question names the second variable
  of a chain, no chain twice; each question is padded so that its answer
  starts a chunk; the answer is the value the chain resolves to, and the
  answer loss covers exactly " <key>.";
- eval_prompt(..., "two_hop") (the Python twin of drt-niah-text's two_hop):
  exact length; the filler intact once the four lines are taken out; the
  value line at the requested depth; the asked chain resolves to the key and
  the distractor chain to another value.

    text_tasks_two_hop_test.py
"""
import os
import re
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXCERPT = os.path.join(REPO, "tests", "fixtures", "heldout-text", "debian_handbook_excerpt.txt")
FAILED = []


def expect(ok, what, detail=""):
    if not ok:
        print("FAILED: " + what + (f"\n  {detail}" if detail else ""))
        FAILED.append(what)
    return ok


LINE = re.compile(r"VAR ([A-Z]{5}) = (VAR ([A-Z]{5})|(\d{5}))\. ")
QUESTION = re.compile(r"\nWhat is the value of VAR ([A-Z]{5})\? The value of VAR \1 is")


def resolve(chains, var):
    """Follows VAR lines to a number (None when the chain breaks)."""
    seen = set()
    while var in chains and var not in seen:
        seen.add(var)
        value = chains[var]
        if value.isdigit():
            return value
        var = value
    return None


def check_training(T, P, src, seed, n_chunks):
    import numpy as np
    rng = np.random.RandomState(seed)
    tokens, targets, kinds = T.example(rng, src, "two_hop_once", n_chunks, 0.0)
    where = f"seed {seed}, {n_chunks} chunks"
    if not expect(len(tokens) == n_chunks * P.CHUNK, f"length ({where})", f"{len(tokens)}"):
        return
    text = "".join(chr(t) if t < 256 else "\0" for t in tokens)  # PAD -> \0
    chains, first_at, second_at = {}, {}, {}
    for m in LINE.finditer(text):
        if m.group(4):
            chains[m.group(1)] = m.group(4)
            first_at[m.group(1)] = m.start()
        else:
            chains[m.group(1)] = m.group(3)
            second_at[m.group(1)] = (m.start(), m.group(3))
    expect(2 <= len(second_at) <= 4, f"2 to 4 chains ({where})", f"{len(second_at)}")
    for y, (at, x) in second_at.items():
        expect(x in first_at and first_at[x] < at, f"value line before its VAR line ({where})", y)
    asked = []
    for m in QUESTION.finditer(text):
        y = m.group(1)
        asked.append(y)
        expect(y in second_at, f"question names a chain's second variable ({where})", y)
        end = m.end()
        pads = len(text[end:]) - len(text[end:].lstrip("\0"))
        answer_at = end + pads
        expect(pads > 0 or end % P.CHUNK == 0, f"question padded ({where})")
        expect(answer_at % P.CHUNK == 0, f"answer starts a chunk ({where})", f"at {answer_at}")
        key = resolve(chains, y)
        answer = f" {key}."
        expect(text[answer_at:answer_at + len(answer)] == answer, f"answer is the chain's value ({where})",
               repr(text[answer_at:answer_at + 8]))
        # targets[i] is token i+1: the answer's loss sits one position earlier
        lo, hi = answer_at - 1, answer_at - 1 + len(answer)
        expect((kinds[lo:hi] == P.LOSS_ANSWER).all(), f"answer loss on the answer ({where})")
    expect(len(asked) >= 1, f"at least one question ({where})")
    expect(len(asked) == len(set(asked)), f"no chain asked twice ({where})", str(asked))
    n_answer = int((kinds == P.LOSS_ANSWER).sum())
    expect(n_answer == 7 * len(asked), f"answer loss only on answers ({where})",
           f"{n_answer} tokens for {len(asked)} answers")
    expect(((targets == -100) | (targets < 256)).all(), f"pads never a target ({where})")


def check_eval(T, raw, seed, length, depth):
    import numpy as np
    rng = np.random.RandomState(seed)
    text = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    prompt, key = T.eval_prompt(rng, text, "two_hop", length, depth)
    where = f"seed {seed}, length {length}, depth {depth}"
    s = "".join(chr(t) for t in prompt)
    expect(len(prompt) == length, f"eval length ({where})", f"{len(prompt)}")
    q = QUESTION.search(s)
    if not expect(q is not None and q.end() == len(s), f"question ends the prompt ({where})"):
        return
    lines = list(LINE.finditer(s))
    expect(len(lines) == 4, f"four VAR lines ({where})", f"{len(lines)}")
    chains = {m.group(1): m.group(4) or m.group(3) for m in lines}
    expect(resolve(chains, q.group(1)) == key, f"asked chain resolves to the key ({where})")
    others = [v for v in chains if v != q.group(1) and not chains[v].isdigit()]
    expect(len(others) == 1 and resolve(chains, others[0]) not in (None, key),
           f"distractor chain resolves to another value ({where})")
    filler = LINE.sub("", s[:q.start()])
    budget = len(filler)
    found = raw.find(filler.encode("latin1"))
    expect(found >= 0, f"filler intact around the lines ({where})")
    value_line = next(m for m in lines if m.group(4) == key)
    before = sum(len(m.group(0)) for m in lines if m.start() < value_line.start())
    target = int(depth * budget)
    offset = value_line.start() - before  # where it sits in the filler
    expect(target - 64 <= offset <= target, f"value line at depth ({where})", f"{offset} vs {target}")


def main():
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("SKIPPED: no numpy for weights_tools")
        return 77
    sys.path.insert(0, os.path.join(REPO, "weights_tools"))
    import passkey_data as P
    import text_tasks as T
    with tempfile.TemporaryDirectory(prefix="drt-two-hop-") as tmp:
        with open(EXCERPT, "rb") as f:
            raw = f.read()
        with open(os.path.join(tmp, "excerpt.txt"), "wb") as f:
            f.write(raw)
        src = T.TextSource(tmp, ["excerpt"])
        for seed in range(40):
            for n_chunks in (16, 32):
                check_training(T, P, src, seed, n_chunks)
    for seed in range(10):
        for length in (4096, 16384):
            for depth in (0.1, 0.5, 0.9):
                check_eval(T, raw, seed, length, depth)
    if FAILED:
        print(f"{len(FAILED)} checks failed")
        return 1
    print("ok: two_hop_once sequences and two_hop eval prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())

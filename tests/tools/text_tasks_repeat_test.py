#!/usr/bin/env python3
"""weights_tools/text_tasks.py's `repeat` training sequences (numpy only; the
training text is the committed handbook excerpt, which here only needs to be
text, as two families: the excerpt and the excerpt in capitals):

- exact length n_chunks * 63 for every length from the shortest allowed (7
  chunks) to 64 (5 seeds each, and 40 more at 7, 16 and 32 chunks, 200 more
  at 64); a shorter one is refused with a ValueError naming the minimum;
- the passage and the other text come from one family (a span with small
  letters is in the excerpt only, one without them in the capitals): a
  family switch at the copies would be a cue that held-out text, one
  document, lacks;
- repeat_batch gives batch()'s sequences for the same seed, and its mask
  marks exactly the targets that are bytes of a later copy (the test
  finds the copies by searching the sequence for the passage);
- the passage is a span of the source text starting at a word boundary, 2 to
  16 chunks long; it occurs in the sequence where repeat_sequence says, 2
  or 3 times, each copy byte for byte the first (elsewhere only where the
  other text happens to hold it);
- each copy starts after at least 128 bytes (the window) of other text
  following the one before it, and no two copies start at the same offset
  in their chunks;
- targets are the tokens shifted by one, loss kind LM on every byte, -100
  only at the last position (no pads, nothing masked inside the text);
- the same seed gives the same sequence; example(..., "repeat", ...) is
  repeat_sequence's sequence;
- over 200 seeds at 64 chunks: both 2 and 3 copies occur, some copies are
  more than 1,000 bytes after the previous one, passage lengths reach both
  ends of their range.

    text_tasks_repeat_test.py
"""
import os
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXCERPT = os.path.join(REPO, "tests", "fixtures", "heldout-text", "debian_handbook_excerpt.txt")
WINDOW = 128  # slide_window of both bundled models (models/*/config.json)
FAILED = []


def expect(ok, what, detail=""):
    if not ok:
        print("FAILED: " + what + (f"\n  {detail}" if detail else ""))
        FAILED.append(what)
    return ok


def occurrences(hay, needle):
    out, at = [], hay.find(needle)
    while at >= 0:
        out.append(at)
        at = hay.find(needle, at + 1)
    return out


def check_sequence(T, P, src, families, seed, n_chunks, seen):
    import numpy as np
    where = f"seed {seed}, {n_chunks} chunks"
    tokens, targets, kinds, starts, n = T.repeat_sequence(np.random.RandomState(seed), src, n_chunks)
    again = T.example(np.random.RandomState(seed), src, "repeat", n_chunks, 0.5)
    expect(all(np.array_equal(a, b) for a, b in zip((tokens, targets, kinds), again)),
           f"example() gives repeat_sequence's sequence, deterministic for a seed ({where})")
    total = n_chunks * P.CHUNK
    if not expect(len(tokens) == total and len(targets) == total and len(kinds) == total,
                  f"length ({where})", f"{len(tokens)}, {len(targets)}, {len(kinds)} for {total}"):
        return
    expect((tokens < 256).all(), f"bytes only, no pads ({where})")
    expect(np.array_equal(targets[:-1], tokens[1:]) and targets[-1] == -100,
           f"targets are the next tokens, -100 only at the end ({where})")
    expect((kinds[:-1] == P.LOSS_LM).all() and kinds[-1] == P.LOSS_NONE, f"LM loss on every byte ({where})")

    expect(2 * P.CHUNK <= n <= 16 * P.CHUNK, f"passage of 2 to 16 chunks ({where})", f"{n} bytes")
    expect(len(starts) in (2, 3), f"2 or 3 copies ({where})", str(starts))
    seq = bytes(tokens.tolist())
    passage = seq[starts[0]:starts[0] + n]
    for k, s in enumerate(starts[1:], 1):
        expect(seq[s:s + n] == passage, f"copy {k + 1} equals the first byte for byte ({where})")
        gap = s - (starts[k - 1] + n)
        expect(gap >= WINDOW, f"copy {k + 1} starts {WINDOW}+ bytes after copy {k} ends ({where})", f"gap {gap}")
        for j in range(k):
            expect((s - starts[j]) % P.CHUNK != 0, f"copies {j + 1} and {k + 1} not chunk-aligned ({where})",
                   f"starts {starts}")
    # one family: the other text (the sequence without its copies, a
    # contiguous span of the family's text) is in a family that holds the passage
    other = seq[:starts[0]] + b"".join(seq[s + n:(starts[k + 1] if k + 1 < len(starts) else len(seq))]
                                       for k, s in enumerate(starts))
    fams = [name for name, text in families.items() if passage in text]
    expect(any(other in families[name] for name in fams),
           f"the passage and the other text from one family ({where})",
           f"passage in {fams}, other text in {[nm for nm, t in families.items() if other in t]}")
    # the other text is drawn from the same source, so it can hold the passage
    # itself (2 of 280 sequences on the 130 KB excerpt; the training text is
    # 70 MB): every copy must be found, and any other occurrence is counted
    found = occurrences(seq, passage)
    expect(set(starts) <= set(found), f"the passage occurs at every copy ({where})", f"{found} vs {starts}")
    seen.setdefault("extra", []).append(len(found) > len(starts))
    raw = families[fams[0]] if fams else b""
    in_source = occurrences(raw, passage)
    expect(len(in_source) >= 1, f"the passage is a span of the training text ({where})")
    # after a space or newline, unless the 64 bytes before it hold none (word_boundary's limit)
    expect(any(at == 0 or raw[at - 1] in b" \n" or not set(raw[max(0, at - 64):at]) & {32, 10}
               for at in in_source), f"the passage starts at a word boundary ({where})", repr(passage[:40]))
    seen.setdefault(n_chunks, []).append((len(starts), n, max(starts[k] - starts[k - 1] - n
                                                               for k in range(1, len(starts)))))


def main():
    try:
        import numpy as np
    except ImportError:
        print("SKIPPED: no numpy for weights_tools")
        return 77
    sys.path.insert(0, os.path.join(REPO, "weights_tools"))
    import passkey_data as P
    import text_tasks as T
    with open(EXCERPT, "rb") as f:
        raw = f.read()
    families = {"excerpt": raw, "capitals": raw.upper()}
    expect(any(97 <= c <= 122 for c in raw) and not any(97 <= c <= 122 for c in families["capitals"]),
           "control: small letters only in the excerpt family")
    with tempfile.TemporaryDirectory(prefix="drt-repeat-") as tmp:
        for name, text in families.items():
            with open(os.path.join(tmp, name + ".txt"), "wb") as f:
                f.write(text)
        src = T.TextSource(tmp, list(families))
        seen = {}
        for n_chunks in range(7, 65):
            for seed in range(1000, 1005):
                check_sequence(T, P, src, families, seed, n_chunks, seen)
        for seed in range(40):
            for n_chunks in (7, 16, 32):
                check_sequence(T, P, src, families, seed, n_chunks, seen)
        for seed in range(200):
            check_sequence(T, P, src, families, seed, 64, seen)
        # repeat_batch: batch()'s sequences and a mask of the later copies' targets
        n_marked = 0
        for seed, n_chunks in ((0, 7), (1, 16), (2, 64)):
            got = T.repeat_batch(np.random.RandomState(seed), src, 3, n_chunks)
            want = T.batch(np.random.RandomState(seed), src, "repeat", 3, n_chunks, 0.5)
            expect(all(np.array_equal(a, b) for a, b in zip(got[:3], want)) and got[3].shape == want[0].shape,
                   f"repeat_batch gives batch()'s sequences (seed {seed}, {n_chunks} chunks)")
            rows = [T.repeat_sequence(np.random.RandomState(seed), src, n_chunks)]  # the first row's passage
            seq = bytes(got[0][0].tolist())
            first, n = rows[0][3][0], rows[0][4]
            copies = [at for at in occurrences(seq, seq[first:first + n]) if at != first]
            expect(len(copies) >= 1, f"later copies found in row 0 (seed {seed})")
            marked = set(np.flatnonzero(got[3][0]).tolist())
            expect(marked == {at + j - 1 for at in copies for j in range(n)},
                   f"the mask marks the targets of the later copies' bytes, nothing else (seed {seed}, "
                   f"{n_chunks} chunks)", f"{len(marked)} marked, copies at {copies} of {n} bytes")
            expect(all(got[1][0][i] == got[0][0][i + 1] for i in marked), "masked targets are the next bytes")
            n_marked += len(marked)
        expect(n_marked > 0, "control: the mask marks something")
        long = seen[64]
        expect({c for c, _, _ in long} == {2, 3}, "both 2 and 3 copies occur (64 chunks)",
               str(sorted({c for c, _, _ in long})))
        expect(any(g > 1000 for _, _, g in long), "some copies lie more than 1,000 bytes back (64 chunks)",
               f"largest gap {max(g for _, _, g in long)}")
        extra = seen.pop("extra")
        expect(sum(extra) <= 0.05 * len(extra), "the passage elsewhere in the other text in at most 5% of them",
               f"{sum(extra)} of {len(extra)}")
        lengths = [n for _, n, _ in long]
        expect(min(lengths) < 3 * P.CHUNK and max(lengths) > 15 * P.CHUNK,
               "passage lengths reach both ends of 2-16 chunks (64 chunks)", f"{min(lengths)}-{max(lengths)}")
        try:
            T.example(np.random.RandomState(0), src, "repeat", 6, 0.5)
            expect(False, "6 chunks refused")
        except ValueError as e:
            expect("at least 7 chunks" in str(e), "6 chunks refused, naming the minimum", str(e))
    if FAILED:
        print(f"{len(FAILED)} checks failed")
        return 1
    print("ok: repeat sequences")
    return 0


if __name__ == "__main__":
    sys.exit(main())

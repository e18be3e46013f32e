#!/usr/bin/env python3
"""weights_tools/read_twice.py's measures and train_any_text.py's --mix,
on stub "models" whose scores are known (torch; no trained model):

- the passages' layout: always 2,016 bytes; passage lengths 646 to 866
  bytes with a remainder mod 63 of 16 to 47 (not nearly chunk-aligned),
  many different remainders over 200 passages, at least 256 bytes of lead;
  the same for a seed, other passages for another seed;
- a position stub gives, at position i, logit x_i (random, fixed) to the
  true next byte and 0 to the 257 other ids, so the NLL of the byte after i
  is log(257 + e^x_i) - x_i whatever the text. The read-twice sequences it
  is fed are checked against the layout read_twice.py documents (the text
  before the passage, the passage as in the text, the passage again:
  text[start - lead : start + p] + text[start : start + p], lead = 2,016 -
  2p), and first/second/gain against sums over each passage's bytes
  computed here: a span off by one position, or the wrong reading, gives
  other numbers because x is random; gain_late the same over each
  reading's bytes from 126 on. The filler measure the same way (bytes from
  position 129 on, the filler unit repeated);
- a copier stub that knows no layout (it predicts the byte that followed
  the last occurrence of the current 8 bytes, if that lies outside the
  128-position window, else nothing): the gain is strongly negative, as a
  model that retrieves should score; a stub that predicts nothing scores 0;
- parse_mix accepts repeat and refuses an unknown kind by name.

    read_twice_test.py
"""
import os
import sys
import types

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXCERPT = os.path.join(REPO, "tests", "fixtures", "heldout-text", "debian_handbook_excerpt.txt")
FAILED = []


def expect(ok, what, detail=""):
    print(("ok: " if ok else "FAILED: ") + what + ("" if ok or not detail else f"\n  {detail}"))
    if not ok:
        FAILED.append(what)
    return ok


def make_stubs(torch, np):
    class Stub(torch.nn.Module):
        """Records the sequences it is fed; logits from self.score(tokens)."""

        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))  # read_twice takes the device from a parameter
            self.fed = []

        def forward(self, tokens):
            self.fed.append(tokens.clone())
            n, length = tokens.shape
            logits = torch.zeros(n, length, 258, dtype=torch.float32)
            for b in range(n):
                for i, token, x in self.score(tokens[b].tolist()):
                    logits[b, i, token] = x
            return types.SimpleNamespace(logits=logits)

    class PositionStub(Stub):
        def __init__(self, x):
            super().__init__()
            self.x = x

        def score(self, seq):
            return [(i, seq[i + 1], self.x[i]) for i in range(len(seq) - 1)]

    class CopierStub(Stub):
        """At position i, if the 8 bytes ending at i occurred before, ending
        at e with i - e > 128 (the latest such e), logit 20 on the byte
        after e, right or wrong."""

        def score(self, seq):
            ends, out = {}, []
            for i in range(7, len(seq) - 1):
                key = tuple(seq[i - 7:i + 1])
                far = [e for e in ends.get(key, []) if i - e > 128]
                if far:
                    out.append((i, seq[far[-1] + 1], 20.0))
                ends.setdefault(key, []).append(i)
            return out

    class NothingStub(Stub):
        def score(self, seq):
            return []

    return PositionStub, CopierStub, NothingStub


def main():
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print(f"SKIPPED: {e} (read_twice.py needs numpy and torch: /usr/bin/python3 with python3-torch)")
        return 77
    sys.path.insert(0, os.path.join(REPO, "weights_tools"))
    import passkey_data as P
    import read_twice as R
    import train_any_text
    torch.set_num_threads(1)
    PositionStub, CopierStub, NothingStub = make_stubs(torch, np)
    with open(EXCERPT, "rb") as f:
        raw = f.read()
    text = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    length = 2016  # every read-twice sequence, 32 chunks

    many = R.layout(len(text), 200, 0)
    lengths = [p for _, p in many]
    expect(all(646 <= p <= 866 and 16 <= p % 63 <= 47 and length - 2 * p >= 256 for p in lengths),
           "layout: passages of 646-866 bytes, 16-47 mod 63, a lead of 256+ bytes",
           f"{sorted(set(lengths))}")
    offsets = {p % 63 for p in lengths}
    # 200 draws from 32 remainders: all 32 occur with probability 0.9999
    expect(len(offsets) >= 28, "layout: many offsets against the chunk", f"{sorted(offsets)}")
    expect(all(length - 2 * p <= s <= len(text) - p for s, p in many), "layout: every passage inside the text")
    expect(R.layout(len(text), 200, 0) == many and R.layout(len(text), 200, 1) != many,
           "layout: fixed by the seed, another seed gives other passages")

    x = np.random.RandomState(5).normal(size=length) * 2.0
    nll = np.log(257.0 + np.exp(x)) - x  # nll[i]: the byte after position i
    stub = PositionStub(x.tolist())
    got = R.read_twice(stub, text, 3, 11)
    placed = R.layout(len(text), 3, 11)
    expect(len(stub.fed) == 3, "three passages read", f"{len(stub.fed)} forward calls")
    expect(len({p for _, p in placed}) == 3, "control: the three passages differ in length", str(placed))
    for k, (fed, (start, p)) in enumerate(zip(stub.fed, placed)):
        seq = bytes(fed[0].tolist())
        lead = length - 2 * p
        expect(len(seq) == length, f"passage {k}: {length} bytes", f"{len(seq)}")
        expect(seq == raw[start - lead:start + p] + raw[start:start + p],
               f"passage {k}: the text before it, the {p}-byte passage at {start}, the passage again")
    # byte j of a reading at position q + j is predicted at position q + j - 1
    seam = 126  # each reading's first two chunks, left out of gain_late
    firsts, seconds, lates, offs = [], [], [], []
    for _, p in placed:
        lead = length - 2 * p
        firsts.append(np.mean([nll[lead + j - 1] for j in range(p)]))
        seconds.append(np.mean([nll[lead + p + j - 1] for j in range(p)]))
        lates.append(np.mean([nll[lead + p + j - 1] - nll[lead + j - 1] for j in range(seam, p)]))
        offs.append(np.mean([nll[lead + p + j] for j in range(p)]) - np.mean([nll[lead + j] for j in range(p)]))
    first, second = np.mean(firsts), np.mean(seconds)
    for key, want in (("first", first), ("second", second), ("gain", second - first), ("gain_late", np.mean(lates))):
        expect(abs(got[key] - want) < 1e-6, f"position stub: {key} {got[key]:.6f} = {want:.6f} computed here")
    # the shifted spans that a slip would give are distinguishable here
    off = np.mean(offs)
    expect(abs(off - (second - first)) > 1e-3, "control: a span off by one position gives another gain",
           f"{off:.6f} vs {second - first:.6f}")

    stub = PositionStub(x.tolist())
    got_f = R.filler_nll(stub)
    fed = bytes(stub.fed[0][0].tolist())
    expect(fed == (P.FILLER.encode() * 30)[:length], "filler: the filler unit repeated to 2,016 bytes")
    want = np.mean([nll[i - 1] for i in range(129, length)])
    expect(abs(got_f - want) < 1e-6, f"position stub: filler NLL {got_f:.6f} = {want:.6f} (bytes 129 on)")

    got = R.read_twice(CopierStub(), text, 3, 11)
    # measured: gain -5.051, past the seam -5.128, second reading 0.492, first 5.543 (fixed seed)
    expect(got["gain"] < -4.0 and got["gain_late"] < -4.0 and got["second"] < 1.5,
           f"copier stub: strongly negative gain ({got['gain']:+.3f}; second reading {got['second']:.3f}, "
           f"first {got['first']:.3f})")
    got = R.read_twice(NothingStub(), text, 2, 11)
    expect(abs(got["gain"]) < 1e-9 and abs(got["first"] - np.log(258)) < 1e-6,
           f"stub that predicts nothing: gain {got['gain']:+.2e}, NLL log 258")
    try:
        R.read_twice(NothingStub(), text[:2000], 1, 0)
        expect(False, "a held-out text shorter than 2,016 bytes refused")
    except ValueError as e:
        expect("fewer than 2016" in str(e), "a held-out text shorter than 2,016 bytes refused", str(e))

    kinds, probs = train_any_text.parse_mix("lm:0.1,repeat:0.15,passkey:0.75")
    expect(kinds == ["lm", "repeat", "passkey"] and abs(probs[1] - 0.15) < 1e-12,
           "parse_mix accepts repeat", f"{kinds} {probs}")
    try:
        train_any_text.parse_mix("lm:1,repeats:1")
        expect(False, "parse_mix refuses 'repeats'")
    except ValueError as e:
        expect("unknown kind 'repeats'" in str(e) and "repeat" in str(e),
               "parse_mix refuses 'repeats' by name and lists the known kinds", str(e))
    print(f"{len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

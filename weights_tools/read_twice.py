"""Does the model use what it has read? Two next-byte NLL measures that
train_any_text.py logs beside its needle accuracies (docs/training.md, "Copy
objective (for the next GPU run)"):

- the read-twice gain: a held-out passage read a second time right after
  the first. Each sequence is the text before the passage, the passage (of
  one of PASSAGES' lengths, as in the text), then the passage again: always
  LENGTH bytes (32 chunks), the lead taking what the two readings leave.
  The gain is the mean NLL of the passage's bytes in the second reading minus
  the same bytes in the first, in nats per byte. A model that predicts from
  local statistics only scores about 0 (docs/passkey_accuracy.md, "Perplexity
  by position": the bundled text model reads a passage twice no better the
  second time); a model that finds the first reading by retrieval, which is
  646 to 866 bytes back and outside the 128-position window, scores well
  below 0. The passage's length is the distance between the readings, so
  its remainder mod 63 is where a second-reading chunk falls against the
  first reading's chunks: the lengths are drawn per passage with remainders
  16 to 47, none nearly chunk-aligned (with a remainder of 61, one retrieved
  chunk would hold 61 of the 63 bytes a chunk needs; at 31 each chunk needs
  two), as the training copies are at every offset.
  The gain past the seam is the same over each reading's bytes from SEAM on:
  the second reading's first bytes follow the passage's end instead of their
  own context (the bundled text model pays +0.019 nats per byte for that
  over the whole reading, and -0.0005 past the seam), and a retrieving model
  cannot copy them either (a chunk's retrieval serves the chunk after it).
- the NLL of the passkey training filler (passkey_data.FILLER, a 90-byte
  unit repeated) past the window: the previous copy of every byte is in the
  window, so a model that copies scores near 0 (the passkey model: 0.0024
  nats per byte) and one that does not about 1.5 (the bundled text model,
  perplexity 4.59).

Every byte is scored as drt-ppl scores it: -log softmax over the whole
vocabulary at the position before it.

Run as a script, it measures an exported model (docs/training.md's tables):

    python3 weights_tools/read_twice.py MODEL_DIR HELDOUT.txt N SEED [--reference]
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import passkey_data as P

LENGTH = 2016  # 32 chunks, every sequence: inside the bundled model's training length
MIN_LEAD = 256  # text before the first reading, at least: both readings have a full window before them
OFFSETS = range(16, 48)  # passage length mod 63: the middle half of a chunk, far from aligned
# 10 to 13 chunks plus an offset: 646 to 866 bytes (128 lengths), leads of 284 to 724 bytes
PASSAGES = tuple(p for p in (c * P.CHUNK + r for c in range(10, 14) for r in OFFSETS)
                 if LENGTH - 2 * p >= MIN_LEAD)
FILLER_LENGTH = 2016
WINDOW = 128  # the bundled models' slide_window
SEAM = 2 * P.CHUNK  # bytes at the start of each reading left out of the gain past the seam
assert LENGTH % P.CHUNK == 0 and FILLER_LENGTH % P.CHUNK == 0
assert len(PASSAGES) == 128 and all(16 <= p % P.CHUNK <= 47 and p - SEAM > WINDOW for p in PASSAGES)


def layout(text_len, n, seed):
    """[(start, passage length)] of n passages of a text of text_len bytes,
    fixed by seed: a length from PASSAGES, then a start with room for its
    lead (LENGTH - 2 * length bytes) before it."""
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(n):
        p = PASSAGES[rng.randint(len(PASSAGES))]
        out.append((rng.randint(LENGTH - 2 * p, text_len - p + 1), p))
    return out


def read_twice_tokens(text, start, passage):
    """text[start - lead : start + passage] followed by text[start : start +
    passage], lead = LENGTH - 2 * passage: LENGTH bytes."""
    lead = LENGTH - 2 * passage
    if lead < 0 or start < lead or start + passage > len(text):
        raise ValueError(f"read-twice: a {passage}-byte passage at {start} needs bytes [{start - lead}, "
                         f"{start + passage}) of a text of {len(text)} bytes")
    return np.concatenate([text[start - lead:start + passage], text[start:start + passage]])


def next_byte_nll(logits, tokens):
    """(N, L, V) logits, (N, L) tokens -> (N, L - 1): entry i is the NLL of
    token i + 1 given the tokens up to i."""
    logp = F.log_softmax(logits[:, :-1].double(), dim=-1)
    return -logp.gather(-1, tokens[:, 1:, None].long())[..., 0]


def span_nll(nll, begin, n):
    """Mean NLL of the n tokens at [begin, begin + n) (next_byte_nll's rows)."""
    return nll[:, begin - 1:begin - 1 + n].mean(-1)


@torch.no_grad()
def read_twice(model, text, n, seed, per_passage=None):
    """{"first", "second", "gain", "gain_late"}: the mean NLL (nats per byte)
    of n held-out passages at their first and second reading, the mean of
    second - first, and that over the bytes from SEAM on; the passages'
    places and lengths from layout(len(text), n, seed). per_passage, a
    list, gets each passage's (length, first, second)."""
    if len(text) < LENGTH:
        raise ValueError(f"read-twice: the held-out text has {len(text)} bytes, fewer than {LENGTH}")
    device = next(model.parameters()).device
    first, second, late = [], [], []
    # one at a time: a batch of 8 took 13 times one sequence's time (CPU, bundled model)
    for start, p in layout(len(text), n, seed):
        tokens = torch.from_numpy(read_twice_tokens(text, start, p)[None]).to(device)
        nll = next_byte_nll(model(tokens).logits, tokens)
        lead = LENGTH - 2 * p
        first.append(span_nll(nll, lead, p).item())
        second.append(span_nll(nll, lead + p, p).item())
        late.append((span_nll(nll, lead + p + SEAM, p - SEAM) - span_nll(nll, lead + SEAM, p - SEAM)).item())
        if per_passage is not None:
            per_passage.append((p, first[-1], second[-1]))
    first, second = np.array(first), np.array(second)
    return {"first": float(first.mean()), "second": float(second.mean()), "gain": float((second - first).mean()),
            "gain_late": float(np.mean(late))}


@torch.no_grad()
def filler_nll(model):
    """Mean NLL (nats per byte) of the passkey filler's bytes at [WINDOW + 1,
    FILLER_LENGTH): each predicted with a whole window of filler before it."""
    device = next(model.parameters()).device
    tokens = torch.from_numpy(P.filler(0, FILLER_LENGTH)[None]).to(device)
    nll = next_byte_nll(model(tokens).logits, tokens)
    return span_nll(nll, WINDOW + 1, FILLER_LENGTH - WINDOW - 1).item()


def main(argv=None):
    ap = argparse.ArgumentParser(description="the read-twice gain and the filler NLL of an exported model")
    ap.add_argument("model_dir")
    ap.add_argument("heldout", help="held-out text file (text_corpus.py's <cache>/text/handbook.txt)")
    ap.add_argument("n", type=int, help="passages")
    ap.add_argument("seed", type=int)
    ap.add_argument("--reference", action="store_true", help="drt_reference's forward, not the fast path")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import drt_config
    import drt_fast
    import drt_reference
    import safetensors_io
    torch.set_num_threads(args.threads)
    model = drt_reference.from_config(drt_config.load_config(os.path.join(args.model_dir, "config.json")),
                                      torch.float32, seed=0)
    drt_reference.load_state_arrays(model, safetensors_io.load_file(os.path.join(args.model_dir,
                                                                                 "model.safetensors")))
    if not args.reference:
        drt_fast.enable(model)
    model.eval()
    text = np.fromfile(args.heldout, dtype=np.uint8).astype(np.int64)
    rows = []
    r = read_twice(model, text, args.n, args.seed, rows)
    gains = np.array([s - f for _, f, s in rows])
    sd = gains.std(ddof=1) if len(gains) > 1 else 0.0
    for p, f, s in rows:
        print(f"  passage of {p} bytes ({p % P.CHUNK} mod {P.CHUNK}): first {f:.4f} second {s:.4f} gain {s - f:+.4f}")
    filler = filler_nll(model)
    print(f"{args.model_dir}: {args.n} passages, seed {args.seed}, {'reference' if args.reference else 'fast path'}: "
          f"first {r['first']:.4f} second {r['second']:.4f} gain {r['gain']:+.4f} (sd {sd:.3f}) "
          f"past the seam {r['gain_late']:+.4f} filler {filler:.4f} (perplexity {np.exp(filler):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

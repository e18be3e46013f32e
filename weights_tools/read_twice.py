"""Does the model use what it has read? Two next-byte NLL measures that
train_any_text.py logs beside its needle accuracies (docs/training.md, "Copy
objective (for the next GPU run)"):

- the read-twice gain: a held-out passage read a second time right after
  the first. Each sequence is LEAD bytes of the text before the passage, the
  passage (PASSAGE bytes, as in the text), then the passage again: 32 chunks.
  The gain is the mean NLL of the passage's bytes in the second reading minus
  the same bytes in the first, in nats per byte. A model that predicts from
  local statistics only scores about 0 (docs/passkey_accuracy.md, "Perplexity
  by position": the bundled text model reads a passage twice no better the
  second time); a model that finds the first reading by retrieval, which is
  880 bytes back and outside the 128-position window, scores well below 0.
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
"""
import numpy as np
import torch
import torch.nn.functional as F

import passkey_data as P

LEAD = 256  # text before the first reading: both readings have a full window before them
PASSAGE = 880  # 880 % 63 = 61: the second reading is not chunk-aligned with the first
LENGTH = LEAD + 2 * PASSAGE  # 2,016 bytes, 32 chunks: inside the bundled model's training length
FILLER_LENGTH = 2016
WINDOW = 128  # the bundled models' slide_window
SEAM = 2 * P.CHUNK  # bytes at the start of each reading left out of the gain past the seam
assert LENGTH % P.CHUNK == 0 and PASSAGE % P.CHUNK != 0 and FILLER_LENGTH % P.CHUNK == 0


def read_twice_tokens(text, start):
    """text[start - LEAD : start + PASSAGE] followed by text[start : start + PASSAGE]."""
    if start < LEAD or start + PASSAGE > len(text):
        raise ValueError(f"read-twice: a passage at {start} needs bytes [{start - LEAD}, {start + PASSAGE}) "
                         f"of a text of {len(text)} bytes")
    return np.concatenate([text[start - LEAD:start + PASSAGE], text[start:start + PASSAGE]])


def next_byte_nll(logits, tokens):
    """(N, L, V) logits, (N, L) tokens -> (N, L - 1): entry i is the NLL of
    token i + 1 given the tokens up to i."""
    logp = F.log_softmax(logits[:, :-1].double(), dim=-1)
    return -logp.gather(-1, tokens[:, 1:, None].long())[..., 0]


def span_nll(nll, begin, n):
    """Mean NLL of the n tokens at [begin, begin + n) (next_byte_nll's rows)."""
    return nll[:, begin - 1:begin - 1 + n].mean(-1)


@torch.no_grad()
def read_twice(model, text, n, seed):
    """{"first", "second", "gain", "gain_late"}: the mean NLL (nats per byte)
    of n held-out passages at their first and second reading, the mean of
    second - first, and that over the bytes from SEAM on, over passages at
    seeded random places of `text`."""
    if len(text) < LENGTH:
        raise ValueError(f"read-twice: the held-out text has {len(text)} bytes, fewer than {LENGTH}")
    rng = np.random.RandomState(seed)
    starts = rng.randint(LEAD, len(text) - PASSAGE + 1, size=n)
    device = next(model.parameters()).device
    first, second, late = [], [], []
    for start in starts:  # one at a time: a batch of 8 took 13 times one sequence's time (CPU, bundled model)
        tokens = torch.from_numpy(read_twice_tokens(text, start)[None]).to(device)
        nll = next_byte_nll(model(tokens).logits, tokens)
        first.append(span_nll(nll, LEAD, PASSAGE).item())
        second.append(span_nll(nll, LEAD + PASSAGE, PASSAGE).item())
        late.append((span_nll(nll, LEAD + PASSAGE + SEAM, PASSAGE - SEAM)
                     - span_nll(nll, LEAD + SEAM, PASSAGE - SEAM)).item())
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

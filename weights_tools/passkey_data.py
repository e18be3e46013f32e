"""Synthetic passkey-retrieval data for the byte-level DRT (train_passkey.py).

Format (the paper's passkey task, the same strings as bench/niah/passkey_haystack.h):

    <filler ...> The pass key is 12345. Remember it. 12345 is the pass key. <filler ...>
    What is the pass key? The pass key is[<pad> ... up to the chunk boundary] 12345.

Tokens are bytes (ids 0..255), pad_id 256, chunk_id 257 (the landmark, inserted
by the model, never present here). A sequence is a whole number of chunks of
S' = 63 real tokens. Each example carries per-token targets and a loss kind:
    LM      next-byte prediction on the haystack and question (pads never a target)
    ANSWER  the answer " <key>." (space, digits, period)
    NONE    everything after the answer (filler that completes the last chunk)
"""
import numpy as np

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "What is the pass key? The pass key is"
ANSWER = " {key}."
KEY_DIGITS = 5

PAD_ID = 256
CHUNK_ID = 257
VOCAB = 258
CHUNK = 63  # enc_chunk_size: real tokens per chunk

LOSS_NONE, LOSS_LM, LOSS_ANSWER = 0, 1, 2

FILLER_B = np.frombuffer(FILLER.encode(), dtype=np.uint8).astype(np.int64)
QUESTION_B = np.frombuffer(QUESTION.encode(), dtype=np.uint8).astype(np.int64)
UNIT = len(FILLER_B)
# Offsets inside the filler unit where a sentence starts.
SENTENCE_STARTS = [0] + [i + 2 for i in range(UNIT - 2) if FILLER[i:i + 2] == ". "]


def encode(text):
    return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int64)


def filler(begin, end):
    """Filler bytes [begin, end) of the infinitely repeated filler unit."""
    return FILLER_B[np.arange(begin, end) % UNIT]


def random_key(rng, leading_zero=True):
    first = rng.randint(0, 10) if leading_zero else rng.randint(1, 10)
    return str(first) + "".join(str(d) for d in rng.randint(0, 10, size=KEY_DIGITS - 1))


def niah_needle_offset(length, depth):
    """bench/niah/passkey_haystack.cc NeedleOffset: filler offset of the needle."""
    room = max(0, length - len(QUESTION_B) - 100)
    raw = int(min(max(depth, 0.0), 1.0) * room)
    return raw // UNIT * UNIT


def niah_haystack(length, depth, key):
    """The engine's NIAH prompt (drt-niah): `length` tokens, phase-0 filler,
    needle on a filler-unit boundary, question at the end (no padding)."""
    offset = niah_needle_offset(length, depth)
    needle = encode(NEEDLE.format(key=key))
    after = max(0, length - offset - len(needle) - len(QUESTION_B))
    return np.concatenate([filler(0, offset), needle, filler(offset, offset + after), QUESTION_B])


def finish(prompt, key, pad):
    """prompt (+ pads to the chunk boundary when `pad`) + answer + filler up to a
    whole number of chunks. Returns (tokens, targets, kinds, answer_start) where
    targets[i] is the token after position i and kinds[i] its loss kind."""
    prompt = np.asarray(prompt, dtype=np.int64)
    parts = [prompt]
    if pad and len(prompt) % CHUNK:
        parts.append(np.full(CHUNK - len(prompt) % CHUNK, PAD_ID, dtype=np.int64))
    answer = encode(ANSWER.format(key=key))
    parts.append(answer)
    used = sum(len(p) for p in parts)
    total = -(-(used + 1) // CHUNK) * CHUNK
    parts.append(filler(0, total - used))
    tokens = np.concatenate(parts)
    answer_start = used - len(answer)
    targets = np.full(total, -100, dtype=np.int64)
    kinds = np.zeros(total, dtype=np.int64)
    targets[:-1] = tokens[1:]
    kinds[:len(prompt) - 1] = LOSS_LM
    kinds[answer_start - 1:answer_start - 1 + len(answer)] = LOSS_ANSWER
    kinds[targets == PAD_ID] = LOSS_NONE
    targets[kinds == LOSS_NONE] = -100
    return tokens, targets, kinds, answer_start


def training_example(rng, n_chunks, pad):
    """One training sequence of exactly n_chunks * 63 tokens.

    The question ends at a uniformly random position of chunk n_chunks-2, so the
    prompt meets the chunk grid at every offset; the filler starts at phase 0
    (like drt-niah) half of the time, else at a random phase; the needle sits at
    a uniform depth, on a filler-unit boundary (drt-niah), a sentence boundary,
    or anywhere."""
    total = n_chunks * CHUNK
    q_end = rng.randint((n_chunks - 2) * CHUNK + 1, (n_chunks - 1) * CHUNK + 1)
    key = random_key(rng)
    needle = encode(NEEDLE.format(key=key))
    hay = q_end - len(QUESTION_B)
    phase = 0 if rng.rand() < 0.5 else rng.randint(UNIT)
    pos = int(rng.rand() * (hay - len(needle) + 1))
    mode = rng.rand()
    if mode < 0.4:      # filler-unit boundary (what drt-niah does)
        pos = (phase + pos) // UNIT * UNIT - phase
        pos = pos if pos >= 0 else pos + UNIT
    elif mode < 0.8:    # sentence boundary
        base = (phase + pos) // UNIT * UNIT
        starts = [base + s - phase for s in SENTENCE_STARTS]
        pos = max([s for s in starts if s <= pos], default=pos)
    pos = min(max(pos, 0), hay - len(needle))
    after = hay - pos - len(needle)
    prompt = np.concatenate([filler(phase, phase + pos), needle,
                             filler(phase + pos, phase + pos + after), QUESTION_B])
    tokens, targets, kinds, _ = finish(prompt, key, pad)
    if len(tokens) > total:  # unpadded answer crossing the last chunk: cannot happen
        raise AssertionError("example longer than its chunk budget")
    if len(tokens) < total:
        extra = total - len(tokens)
        tokens = np.concatenate([tokens, filler(0, extra)])
        targets = np.concatenate([targets, np.full(extra, -100, dtype=np.int64)])
        kinds = np.concatenate([kinds, np.zeros(extra, dtype=np.int64)])
    return tokens, targets, kinds


def multi_question_example(rng, n_chunks, pad_prob, min_gap=0, max_gap=320, lead_frac=0.4):
    """One sequence of n_chunks * 63 tokens with one needle and the question
    asked (and answered) several times after it: more answer targets per
    token of compute. Filler gaps between needle and questions are uniform in
    [0, max_gap), so some answers can be read in the window and most need
    retrieval (of the needle or of an earlier answer, which carries the same
    'pass key is <key>'); [min_gap, max_gap) sets that mix. Each question is padded to the chunk boundary with
    probability pad_prob."""
    total = n_chunks * CHUNK
    key = random_key(rng)
    answer = encode(ANSWER.format(key=key))
    needle = encode(NEEDLE.format(key=key))
    tokens, kinds = [], []
    phase = 0 if rng.rand() < 0.5 else rng.randint(UNIT)
    cursor = [phase]  # filler read position

    def put(arr, kind):
        tokens.append(np.asarray(arr, dtype=np.int64))
        kinds.append(np.full(len(arr), kind, dtype=np.int64))

    def put_filler(n):
        put(filler(cursor[0], cursor[0] + n), LOSS_LM)
        cursor[0] += n

    used = 0
    lead = int(rng.rand() * lead_frac * total)
    if rng.rand() < 0.4:  # on a filler-unit boundary, like drt-niah
        lead = max(0, (phase + lead) // UNIT * UNIT - phase)
    put_filler(lead)
    put(needle, LOSS_LM)
    used = lead + len(needle)
    while True:
        gap = rng.randint(min_gap, max_gap)
        pad = rng.rand() < pad_prob
        q_end = used + gap + len(QUESTION_B)
        n_pad = (-q_end) % CHUNK if pad else 0
        if q_end + n_pad + len(answer) > total:
            break
        put_filler(gap)
        put(QUESTION_B, LOSS_LM)
        if n_pad:
            put(np.full(n_pad, PAD_ID), LOSS_NONE)
        put(answer, LOSS_ANSWER)
        used = q_end + n_pad + len(answer)
        if rng.rand() < 0.5:
            cursor[0] = rng.randint(UNIT)  # filler after an answer restarts anywhere
    put_filler(total - used)
    tokens = np.concatenate(tokens)
    kind_of_token = np.concatenate(kinds)
    assert len(tokens) == total
    # position i predicts token i+1 with the kind of token i+1; pads are never targets
    targets = np.full(total, -100, dtype=np.int64)
    out_kinds = np.zeros(total, dtype=np.int64)
    targets[:-1] = tokens[1:]
    out_kinds[:-1] = kind_of_token[1:]
    # the first byte of a question after filler is as unpredictable as filler cut anywhere: keep LM
    targets[out_kinds == LOSS_NONE] = -100
    return tokens, targets, out_kinds


def local_copy_example(rng, n_chunks, pad_prob, max_gap=60):
    """Warm-up data: needle, short filler, question, answer, repeated with a
    new key each time, all inside the attention window. Dense copy targets
    (the needle's second copy and the answers) build the copy circuits fast."""
    total = n_chunks * CHUNK
    tokens, kinds = [], []
    used = 0
    cursor = rng.randint(UNIT)
    while True:
        key = random_key(rng)
        gap1, gap2 = rng.randint(0, max_gap), rng.randint(0, max_gap)
        needle = encode(NEEDLE.format(key=key))
        answer = encode(ANSWER.format(key=key))
        q_end = used + gap1 + len(needle) + gap2 + len(QUESTION_B)
        n_pad = (-q_end) % CHUNK if rng.rand() < pad_prob else 0
        if q_end + n_pad + len(answer) > total:
            break
        for arr, kind in ((filler(cursor, cursor + gap1), LOSS_LM), (needle, LOSS_LM),
                          (filler(cursor + gap1, cursor + gap1 + gap2), LOSS_LM), (QUESTION_B, LOSS_LM),
                          (np.full(n_pad, PAD_ID), LOSS_NONE), (answer, LOSS_ANSWER)):
            tokens.append(np.asarray(arr, dtype=np.int64))
            kinds.append(np.full(len(arr), kind, dtype=np.int64))
        cursor = rng.randint(UNIT)
        used = q_end + n_pad + len(answer)
    tokens.append(filler(cursor, cursor + total - used))
    kinds.append(np.full(total - used, LOSS_LM, dtype=np.int64))
    tokens, kind_of_token = np.concatenate(tokens), np.concatenate(kinds)
    targets = np.full(total, -100, dtype=np.int64)
    out_kinds = np.zeros(total, dtype=np.int64)
    targets[:-1] = tokens[1:]
    out_kinds[:-1] = kind_of_token[1:]
    targets[out_kinds == LOSS_NONE] = -100
    return tokens, targets, out_kinds


def training_batch(rng, batch, n_chunks, pad_prob, multi=False, local=False, **multi_args):
    if local:
        rows = [local_copy_example(rng, n_chunks, pad_prob) for _ in range(batch)]
    elif multi:
        rows = [multi_question_example(rng, n_chunks, pad_prob, **multi_args) for _ in range(batch)]
    else:
        rows = [training_example(rng, n_chunks, rng.rand() < pad_prob) for _ in range(batch)]
    return tuple(np.stack(col) for col in zip(*rows))


def eval_example(length, depth, key, pad):
    """drt-niah's haystack of `length` tokens, then the answer; padded to whole
    chunks after the answer (causal: that never changes the answer's logits)."""
    tokens, targets, kinds, answer_start = finish(niah_haystack(length, depth, key), key, pad)
    return tokens, targets, answer_start


def decode(ids):
    return bytes(int(i) for i in ids if 0 <= i < 256).decode("latin-1")

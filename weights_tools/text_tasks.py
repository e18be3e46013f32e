"""Training sequences on real text (train_any_text.py): plain language
modelling and retrieval tasks whose filler is text of the training families
of text_corpus.py.

Kinds of sequence (each exactly n_chunks * 63 bytes):
    lm        text only, next-byte loss everywhere
    passkey   a needle in one of PASSKEY_WORDINGS (passkey_data.py's exact one
              among them), then its question asked and answered several times
    keyed     2 to 4 "pass key of the <colour> <thing>" needles, then questions
              that each name one of them
    two_hop   VAR X = N ... VAR Y = VAR X chains (2, one a distractor), then
              questions about the second variable of a chain
    two_hop_once  2 to 4 such chains, each asked about at most once and every
              question padded to the chunk boundary: no earlier answer in the
              sequence can be copied, so every answer needs both hops (the
              CPU fine-tune of docs/training.md, "2-hop fine-tune on the CPU")
    repeat    a passage of text, other text, the same passage again (sometimes
              a third time), next-byte loss everywhere: language modelling in
              which the second copy is predictable only by retrieving the
              first, which lies outside the attention window (docs/training.md,
              "Copy objective (for the next GPU run)")
Needles and questions use the formats of bench/niah/text_tasks.cc; the
wordings of drt-niah-text's passkey_varied task are deliberately not here
(held out). Questions start on a new line; each is padded to the chunk
boundary with probability pad_prob. Targets and loss kinds follow
passkey_data.py (LM on text and prompts, ANSWER on " <key>.", pads never a
target).
"""
import os

import numpy as np

import passkey_data as P

PASSKEY_WORDINGS = [
    (P.NEEDLE, P.QUESTION),
    ("The secret code is {key}. ", "What is the secret code? The secret code is"),
    ("Remember this: the magic number is {key}. ", "What is the magic number? The magic number is"),
    ("The access code is {key}. Write it down. ", "What is the access code? The access code is"),
    ("The password is {key}. Keep it safe. {key} is the password. ", "What is the password? The password is"),
    ("The special number is {key}. ", "What was the special number? The special number is"),
    ("My PIN is {key}. ", "What is my PIN? My PIN is"),
]
EXACT_WORDING_PROB = 0.3  # passkey_data.py's wording, the one drt-niah and the clients use
COLOURS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple"]
THINGS = ["door", "box", "car", "house", "book", "chair", "gate", "boat"]
# two_hop_once's questions, one per chain and always padded, are sparser than
# the other kinds'; shorter text gaps between them (40-200 bytes, not 40-400)
# fit more of them into a short CPU-training sequence.
ONCE_MAX_GAP = 200
# repeat: passages of 2 to 16 chunks (126 to 1,008 bytes). At least 2 so that
# a passage always spans one whole chunk, whatever its alignment, and is
# longer than the 128-position window; at most 16 so that a passage and its
# copy fit a 64-chunk sequence with room for a long gap, and so that copying
# it needs a new retrieval every chunk (a 1,008-byte passage spans 16-17
# chunks, twice the top-8). Shorter sequences cap the passage at what fits.
REPEAT_MIN_CHUNKS, REPEAT_MAX_CHUNKS = 2, 16
# Each copy follows the one before it after at least this many bytes of other
# text: the bundled models' slide_window (128 positions, landmarks included),
# so when a copy starts nothing of the previous one is in the window, and each
# byte's earlier counterpart lies at least passage + 128 bytes back.
REPEAT_MIN_GAP = 128
REPEAT_THIRD_PROB = 0.3  # a third copy, when it fits
_REPEAT_RESERVE = REPEAT_MIN_GAP + 2  # a gap's minimum plus its largest alignment shift
# the shortest sequence that holds two shortest passages and a gap: 7 chunks
REPEAT_MIN_SEQ_CHUNKS = -(-(2 * REPEAT_MIN_CHUNKS * P.CHUNK + _REPEAT_RESERVE) // P.CHUNK)
KINDS = ("lm", "passkey", "keyed", "two_hop", "two_hop_once", "repeat")


class TextSource:
    """The training families' text (text_corpus.py's <cache>/text/<family>.txt)
    as byte arrays; samples a family uniformly, then a uniform offset."""

    def __init__(self, text_dir, families):
        self.arrays = []
        for fam in families:
            path = os.path.join(text_dir, fam + ".txt")
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path} missing: run weights_tools/fetch_text.sh and text_corpus.py")
            self.arrays.append(np.fromfile(path, dtype=np.uint8).astype(np.int64))
        self.families = list(families)

    def family(self, rng):
        """A family's index, uniform."""
        return rng.randint(len(self.arrays))

    def sample(self, rng, n, family=None):
        """n bytes at a uniform offset of `family` (an index; None: one drawn
        with family())."""
        arr = self.arrays[self.family(rng) if family is None else family]
        start = rng.randint(0, len(arr) - n)
        return arr[start:start + n]


def _key(rng):
    return P.random_key(rng, leading_zero=False)


def _distinct(rng, n, draw):
    """n different values of draw(rng), in the order first drawn."""
    out = []
    while len(out) < n:
        v = draw(rng)
        if v not in out:
            out.append(v)
    return out


def _keys(rng, n):
    return _distinct(rng, n, _key)


def _var(rng):
    return "".join(chr(65 + c) for c in rng.randint(0, 26, size=5))


def _thing(rng):
    return f"{COLOURS[rng.randint(len(COLOURS))]} {THINGS[rng.randint(len(THINGS))]}"


def word_boundary(text, pos):
    """Largest p <= pos right after a space or newline within 64 bytes, else pos."""
    for back in range(0, min(64, pos)):
        if text[pos - back - 1] in (32, 10):
            return pos - back
    return pos


class Builder:
    """Accumulates (bytes, loss kind) segments into one sequence."""

    def __init__(self, total):
        self.total = total
        self.tokens, self.kinds = [], []
        self.used = 0

    def put(self, arr, kind):
        arr = np.asarray(arr, dtype=np.int64)
        self.tokens.append(arr)
        self.kinds.append(np.full(len(arr), kind, dtype=np.int64))
        self.used += len(arr)

    def room(self):
        return self.total - self.used

    def finish(self):
        tokens = np.concatenate(self.tokens)[:self.total]
        kind_of_token = np.concatenate(self.kinds)[:self.total]
        assert len(tokens) == self.total, (len(tokens), self.total)
        targets = np.full(self.total, -100, dtype=np.int64)
        out_kinds = np.zeros(self.total, dtype=np.int64)
        targets[:-1] = tokens[1:]
        out_kinds[:-1] = kind_of_token[1:]
        targets[out_kinds == P.LOSS_NONE] = -100
        return tokens, targets, out_kinds


def _questions_then_text(rng, src, b, text, cursor, pad_prob, qa, min_gap=40, max_gap=400):
    """Fills the rest of `b`: questions from qa() -> (question, answer), each
    after a gap of `text` from `cursor` (padded to the chunk boundary with
    probability pad_prob), until the next would not fit or qa() returns None
    (nothing left to ask); then text, and more text from `src` if `text` ran
    out (needles took its place)."""
    while True:
        gap = rng.randint(min_gap, max_gap)
        asked = qa()
        if asked is None:
            break
        question, answer = asked
        q, a = P.encode("\n" + question), P.encode(answer)
        q_end = b.used + gap + len(q)
        n_pad = (-q_end) % P.CHUNK if rng.rand() < pad_prob else 0
        if q_end + n_pad + len(a) > b.total:
            break
        b.put(text[cursor:cursor + gap], P.LOSS_LM)
        cursor += gap
        b.put(q, P.LOSS_LM)
        if n_pad:
            b.put(np.full(n_pad, P.PAD_ID), P.LOSS_NONE)
        b.put(a, P.LOSS_ANSWER)
    b.put(text[cursor:cursor + b.room()], P.LOSS_LM)
    if b.room() > 0:
        b.put(src.sample(rng, b.room()), P.LOSS_LM)
    return b.finish()


def _with_needles(rng, src, n_chunks, pad_prob, needles, qa, lead_frac=0.5, min_gap=40, max_gap=400):
    """Text with `needles` (byte strings) at word boundaries in the first part
    of the sequence, then questions from qa() -> (question, answer) separated
    by text gaps until the sequence is full."""
    total = n_chunks * P.CHUNK
    text = src.sample(rng, total)
    b = Builder(total)
    cursor = 0
    lead = int(rng.rand() * lead_frac * total)
    spots = sorted(word_boundary(text, int(rng.rand() * max(1, lead))) for _ in needles)
    order = rng.permutation(len(needles))
    for spot, i in zip(spots, order):
        spot = max(spot, cursor)
        b.put(text[cursor:spot], P.LOSS_LM)
        b.put(P.encode(needles[i]), P.LOSS_LM)
        cursor = spot
    return _questions_then_text(rng, src, b, text, cursor, pad_prob, qa, min_gap, max_gap)


def lm_example(rng, src, n_chunks):
    total = n_chunks * P.CHUNK
    b = Builder(total)
    b.put(src.sample(rng, total), P.LOSS_LM)
    return b.finish()


def _log_uniform(rng, n):
    """An integer in [0, n], log-uniform in 1 + value: mostly small, sometimes
    near n (a repeat's copy sometimes far back)."""
    return min(n, int(np.expm1(rng.rand() * np.log1p(n))))


def _unaligned(gap, distances):
    """The smallest g >= gap such that no (d + g) is a multiple of the chunk:
    a copy never starts at the same place in its chunk as an earlier copy
    (distances: from each earlier copy's start to where this gap begins).
    Grows gap by at most len(distances)."""
    while any((d + gap) % P.CHUNK == 0 for d in distances):
        gap += 1
    return gap


def repeat_sequence(rng, src, n_chunks):
    """One `repeat` sequence: text, passage A, at least REPEAT_MIN_GAP bytes of
    other text, A again (with probability REPEAT_THIRD_PROB, when it fits:
    more text and A a third time), text to the end. Returns (tokens, targets,
    kinds, copy starts, passage length). A and the other text come from one
    family of `src`. A starts at a word boundary of the training text and
    the gaps end at word boundaries of the other text (unless that would
    make a gap too short, or a copy chunk-aligned); gaps
    are log-uniform over the room left, so most are short and some span most
    of the sequence; no copy starts at the same offset in its chunk as an
    earlier one (text repeated in the wild is not chunk-aligned). The loss is
    next-byte LM on every byte."""
    total = n_chunks * P.CHUNK
    if n_chunks < REPEAT_MIN_SEQ_CHUNKS:
        raise ValueError(f"repeat: {n_chunks} chunks cannot hold two {REPEAT_MIN_CHUNKS}-chunk passages "
                         f"{REPEAT_MIN_GAP} bytes apart; use at least {REPEAT_MIN_SEQ_CHUNKS} chunks")
    lo = REPEAT_MIN_CHUNKS * P.CHUNK
    hi = min(REPEAT_MAX_CHUNKS * P.CHUNK, (total - _REPEAT_RESERVE) // 2)
    n_passage = rng.randint(lo, hi + 1)
    # A and the text around it from one family, as a held-out document
    # repeats itself (read_twice.py): a family switch would mark the copies
    family = src.family(rng)
    raw = src.sample(rng, n_passage + 64, family)
    begin = word_boundary(raw, 64)
    passage = raw[begin:begin + n_passage]
    copies = 3 if rng.rand() < REPEAT_THIRD_PROB and total - 3 * n_passage >= 2 * _REPEAT_RESERVE else 2
    spare = total - copies * n_passage - (copies - 1) * _REPEAT_RESERVE  # free bytes beyond the minimum gaps
    extras = []
    for _ in range(copies - 1):
        extras.append(_log_uniform(rng, spare))
        spare -= extras[-1]
    lead = rng.randint(0, spare + 1)
    text = src.sample(rng, total, family)
    b = Builder(total)
    cursor = word_boundary(text, lead)
    b.put(text[:cursor], P.LOSS_LM)
    starts = [b.used]
    b.put(passage, P.LOSS_LM)
    for extra in extras:
        want = REPEAT_MIN_GAP + extra
        gap = word_boundary(text, cursor + want) - cursor
        if gap < REPEAT_MIN_GAP:
            gap = want
        gap = _unaligned(gap, [b.used - s for s in starts])
        b.put(text[cursor:cursor + gap], P.LOSS_LM)
        cursor += gap
        starts.append(b.used)
        b.put(passage, P.LOSS_LM)
    b.put(text[cursor:cursor + b.room()], P.LOSS_LM)
    tokens, targets, kinds = b.finish()
    return tokens, targets, kinds, starts, n_passage


def repeat_example(rng, src, n_chunks):
    return repeat_sequence(rng, src, n_chunks)[:3]


def copy_targets(total, starts, n_passage):
    """Bool mask of a repeat sequence's target positions whose target is a
    byte of a later copy (targets[i] is token i + 1): the bytes retrieval can
    predict, the first bytes of each copy included."""
    mask = np.zeros(total, dtype=bool)
    for s in starts[1:]:
        mask[s - 1:s - 1 + n_passage] = True
    return mask


def repeat_batch(rng, src, batch_size, n_chunks):
    """batch(rng, src, "repeat", ...) (the same sequences for the same rng
    state) and a fourth array, copy_targets' mask of each row."""
    rows = []
    for _ in range(batch_size):
        tokens, targets, kinds, starts, n = repeat_sequence(rng, src, n_chunks)
        rows.append((tokens, targets, kinds, copy_targets(len(tokens), starts, n)))
    return tuple(np.stack(col) for col in zip(*rows))


def passkey_example(rng, src, n_chunks, pad_prob):
    key = _key(rng)
    if rng.rand() < EXACT_WORDING_PROB:
        needle, question = PASSKEY_WORDINGS[0]
    else:
        needle, question = PASSKEY_WORDINGS[rng.randint(1, len(PASSKEY_WORDINGS))]
    return _with_needles(rng, src, n_chunks, pad_prob, [needle.format(key=key)],
                         lambda: (question, f" {key}."))


def keyed_example(rng, src, n_chunks, pad_prob):
    n = rng.randint(2, 5)
    keys = _keys(rng, n)
    names = _distinct(rng, n, _thing)
    needles = [f"The pass key of the {nm} is {k}. " for nm, k in zip(names, keys)]

    def qa():
        i = rng.randint(n)
        return (f"What is the pass key of the {names[i]}? The pass key of the {names[i]} is", f" {keys[i]}.")
    return _with_needles(rng, src, n_chunks, pad_prob, needles, qa)


def two_hop_example(rng, src, n_chunks, pad_prob):
    keys = _keys(rng, 2)
    names = _distinct(rng, 4, _var)
    # chains (names[0] = keys[0], names[1] = names[0]) and (names[2] = keys[1], names[3] = names[2])
    needles = [f"VAR {names[0]} = {keys[0]}. ", f"VAR {names[2]} = {keys[1]}. "]
    seconds = [f"VAR {names[1]} = VAR {names[0]}. ", f"VAR {names[3]} = VAR {names[2]}. "]

    def qa():
        i = rng.randint(2)
        y = names[2 * i + 1]
        return (f"What is the value of VAR {y}? The value of VAR {y} is", f" {keys[i]}.")
    return _two_hop_ordered(rng, src, n_chunks, pad_prob, needles, seconds, qa)


def two_hop_once_example(rng, src, n_chunks):
    """2 to 4 chains VAR X_i = N_i ... VAR Y_i = VAR X_i (distinct values and
    names), then questions about Y_i in a random order, each chain at most
    once, each question padded to the chunk boundary. two_hop repeats its two
    questions, so from the second time on the answer can be copied from the
    first answer in the text (one hop); here it cannot. Always padding is the
    server's default (generation_config.json) and what drt-niah-text measures:
    the answer then starts a new chunk, whose second-group retrieval is chosen
    after the first group has read the question's chunk."""
    n = rng.randint(2, 5)
    keys = _keys(rng, n)
    names = _distinct(rng, 2 * n, _var)
    firsts = [f"VAR {names[2 * i]} = {keys[i]}. " for i in range(n)]
    seconds = [f"VAR {names[2 * i + 1]} = VAR {names[2 * i]}. " for i in range(n)]
    order = list(rng.permutation(n))

    def qa():
        if not order:
            return None
        i = order.pop(0)
        y = names[2 * i + 1]
        return (f"What is the value of VAR {y}? The value of VAR {y} is", f" {keys[i]}.")
    return _two_hop_ordered(rng, src, n_chunks, 1.0, firsts, seconds, qa, max_gap=ONCE_MAX_GAP)


def _two_hop_ordered(rng, src, n_chunks, pad_prob, firsts, seconds, qa, min_gap=40, max_gap=400):
    """Like _with_needles, but each chain's second line comes after its first."""
    total = n_chunks * P.CHUNK
    text = src.sample(rng, total)
    lead = int((0.2 + 0.3 * rng.rand()) * total)
    items = []
    for first, second in zip(firsts, seconds):
        a = int(rng.rand() * lead)
        c = a + int(rng.rand() * (lead - a))
        at_first = word_boundary(text, a)
        items += [(at_first, 0, first), (max(word_boundary(text, max(c, a)), at_first), 1, second)]
    items.sort(key=lambda t: (t[0], t[1]))
    b = Builder(total)
    cursor = 0
    for spot, _, s in items:
        spot = max(spot, cursor)
        b.put(text[cursor:spot], P.LOSS_LM)
        b.put(P.encode(s), P.LOSS_LM)
        cursor = spot
    return _questions_then_text(rng, src, b, text, cursor, pad_prob, qa, min_gap, max_gap)


def example(rng, src, kind, n_chunks, pad_prob):
    if kind == "lm":
        return lm_example(rng, src, n_chunks)
    if kind == "passkey":
        return passkey_example(rng, src, n_chunks, pad_prob)
    if kind == "keyed":
        return keyed_example(rng, src, n_chunks, pad_prob)
    if kind == "two_hop":
        return two_hop_example(rng, src, n_chunks, pad_prob)
    if kind == "two_hop_once":
        return two_hop_once_example(rng, src, n_chunks)
    if kind == "repeat":
        return repeat_example(rng, src, n_chunks)
    raise ValueError(f"unknown kind {kind!r}; known: {KINDS}")


def batch(rng, src, kind, batch_size, n_chunks, pad_prob):
    rows = [example(rng, src, kind, n_chunks, pad_prob) for _ in range(batch_size)]
    return tuple(np.stack(col) for col in zip(*rows))


# ---- held-out evaluation prompts (the Python twin of bench/niah/text_tasks.cc, for
# ---- validation during training; the published tables come from drt-niah-text)

HELDOUT_WORDINGS = [
    ("The hidden number is {key}. Do not forget it. ", "What is the hidden number? The hidden number is"),
    ("Here is the key you will need later: the key is {key}. ", "What is the key? The key is"),
    ("The lucky number is {key}. ", "What is the lucky number? The lucky number is"),
]


def eval_prompt(rng, text, task, length, depth):
    """(prompt bytes, key) of one held-out-text trial; needle(s) placed like text_tasks.cc."""
    if task == "passkey":
        key = _key(rng)
        inserts = [P.NEEDLE.format(key=key)]
        question = "\n" + P.QUESTION
    elif task == "passkey_varied":
        key = _key(rng)
        n, q = HELDOUT_WORDINGS[rng.randint(len(HELDOUT_WORDINGS))]
        inserts, question = [n.format(key=key)], "\n" + q
    elif task == "keyed":
        keys = _keys(rng, 3)
        names = _distinct(rng, 3, _thing)
        inserts = [f"The pass key of the {nm} is {k}. " for nm, k in zip(names, keys)]
        question = f"\nWhat is the pass key of the {names[0]}? The pass key of the {names[0]} is"
        key = keys[0]
    elif task == "two_hop":
        return _two_hop_eval_prompt(rng, text, length, depth)
    else:
        raise ValueError(task)
    budget = length - len(question) - sum(len(s) for s in inserts)
    start = rng.randint(0, len(text) - budget - 1)
    filler = text[start:start + budget]
    spots = [word_boundary(filler, int(depth * budget))] + \
            [word_boundary(filler, rng.randint(0, budget + 1)) for _ in inserts[1:]]
    order = sorted(range(len(inserts)), key=lambda i: (spots[i], i))
    parts, cursor = [], 0
    for i in order:
        parts += [filler[cursor:spots[i]], P.encode(inserts[i])]
        cursor = spots[i]
    parts += [filler[cursor:], P.encode(question)]
    return np.concatenate(parts), key


def _two_hop_eval_prompt(rng, text, length, depth):
    """drt-niah-text's two_hop trial (bench/niah/text_tasks.cc, MakeTextTrial):
    target chain V0 = K0, V1 = VAR V0 and distractor chain V2 = K1, V3 = VAR V2;
    the value line V0 = K0 at `depth` of the filler, the others uniform in
    [their chain's first line, end]; the question asks for V1. The same
    placement rules as the C++ tool, not the same random numbers."""
    keys = _keys(rng, 2)
    names = _distinct(rng, 4, _var)
    texts = [f"VAR {names[0]} = {keys[0]}. ", f"VAR {names[1]} = VAR {names[0]}. ",
             f"VAR {names[2]} = {keys[1]}. ", f"VAR {names[3]} = VAR {names[2]}. "]
    after = [-1, 0, -1, 2]
    question = f"\nWhat is the value of VAR {names[1]}? The value of VAR {names[1]} is"
    budget = length - len(question) - sum(len(t) for t in texts)
    start = rng.randint(0, len(text) - budget - 1)
    filler = text[start:start + budget]
    at = [word_boundary(filler, int(depth * budget))]
    for i in range(1, 4):
        lo = at[after[i]] if after[i] >= 0 else 0
        pos = word_boundary(filler, lo + rng.randint(0, budget - lo + 1))
        at.append(max(pos, at[after[i]]) if after[i] >= 0 else pos)
    order = sorted(range(4), key=lambda i: (at[i], i))
    parts, cursor = [], 0
    for i in order:
        parts += [filler[cursor:at[i]], P.encode(texts[i])]
        cursor = at[i]
    parts += [filler[cursor:], P.encode(question)]
    return np.concatenate(parts), keys[0]

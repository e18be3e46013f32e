"""Statistics of text_tasks.py's `repeat` sequences, as docs/training.md
("Copy objective (for the next GPU run)") reports them: for each sequence
length, over N sequences drawn with one RandomState(seed), the gaps between
a copy's end and the next copy's start (median, share over 1,000 bytes,
longest), the share of sequences with 3 copies, and the share of targets
that are bytes of a later copy (text_tasks.copy_targets).

    /usr/bin/python3 weights_tools/repeat_stats.py TEXT_DIR [--chunks 16,32,64] [--n 500] [--seed 0]

TEXT_DIR is text_corpus.py's <cache>/text; the training families are read.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import text_corpus  # noqa: E402
import text_tasks as T  # noqa: E402


def stats(rng, src, n_chunks, n):
    gaps, shares, threes = [], [], 0
    for _ in range(n):
        tokens, _, _, starts, length = T.repeat_sequence(rng, src, n_chunks)
        gaps += [starts[k] - starts[k - 1] - length for k in range(1, len(starts))]
        shares.append(T.copy_targets(len(tokens), starts, length).sum() / (len(tokens) - 1))
        threes += len(starts) == 3
    gaps = np.array(gaps)
    return {"median_gap": float(np.median(gaps)), "over_1000": float(np.mean(gaps > 1000)),
            "longest": int(gaps.max()), "three_copies": threes / n, "copy_share": float(np.mean(shares))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("text_dir")
    ap.add_argument("--chunks", default="16,32,64")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    src = T.TextSource(args.text_dir, text_corpus.TRAIN_FAMILIES)
    for n_chunks in (int(c) for c in args.chunks.split(",")):
        s = stats(np.random.RandomState(args.seed), src, n_chunks, args.n)
        print(f"{n_chunks} chunks, {args.n} sequences, seed {args.seed}: median gap {s['median_gap']:.0f} bytes, "
              f"{100 * s['over_1000']:.1f}% over 1,000, longest {s['longest']}; 3 copies in "
              f"{100 * s['three_copies']:.1f}%; later-copy targets {100 * s['copy_share']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

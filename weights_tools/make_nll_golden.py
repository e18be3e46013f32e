"""Per-token negative log-likelihood goldens for drt-ppl's scoring
(tests/perplexity_golden_test.cc), from the Python reference forward.

    /usr/bin/python3 weights_tools/make_nll_golden.py --fixtures tests/fixtures

For each fixture directory holding golden.safetensors, runs drt_reference.py
in float64 on that file's `tokens` (the same tokens as the logit goldens) and
writes <fixture>/nll_golden.safetensors:

    token_nll  F32 [L - 1]  -log_softmax(logits[i])[tokens[i + 1]], i = 0..L-2:
                            the NLL of token i + 1 given tokens 0..i (the
                            first token is not scored)

The fixtures' golden.safetensors stores logits at a subset of rows only
(every 5th, and the first two and last chunks), so it cannot check a score
for every token; this file covers all of them. Deterministic: the forward has
no randomness (no Gumbel noise), so a rerun writes the same bytes.
"""
import argparse
import os
import sys

import numpy as np
import torch

import drt_reference
import safetensors_io


def token_nll(fixture_dir):
    tokens = safetensors_io.load_file(os.path.join(fixture_dir, "golden.safetensors"))["tokens"]
    model = drt_reference.load_model_dir(fixture_dir, dtype=torch.float64)
    with torch.no_grad():
        logits = model(torch.from_numpy(tokens.astype(np.int64))).logits  # (L, V) float64
        logp = torch.log_softmax(logits[:-1], dim=-1)
        nll = -logp.gather(1, torch.from_numpy(tokens[1:].astype(np.int64))[:, None])[:, 0]
    return tokens, nll.numpy()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixtures", required=True, help="the fixtures directory (tests/fixtures)")
    args = parser.parse_args(argv)
    names = sorted(n for n in os.listdir(args.fixtures)
                   if os.path.exists(os.path.join(args.fixtures, n, "golden.safetensors")))
    if not names:
        print(f"no fixture with golden.safetensors under {args.fixtures}", file=sys.stderr)
        return 1
    for name in names:
        path = os.path.join(args.fixtures, name)
        tokens, nll = token_nll(path)
        meta = {"fixture": name, "tokens": str(len(tokens)),
                "computed": "float64 drt_reference.py on golden.safetensors' tokens, stored as F32",
                "mean_nll": f"{nll.mean():.9g}"}
        safetensors_io.save_file({"token_nll": nll.astype(np.float32)},
                                 os.path.join(path, "nll_golden.safetensors"), metadata=meta)
        print(f"{name}: {len(nll)} tokens scored, mean NLL {nll.mean():.6f} nats, "
              f"min {nll.min():.4f}, max {nll.max():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

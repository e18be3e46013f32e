"""Passkey accuracy of a model directory with the plain-PyTorch reference forward.

    /usr/bin/python3 weights_tools/eval_passkey.py --model models/drt-passkey-byte \\
        --lengths 2048,4096,16384 --depths 0,0.25,0.5,0.75,1 --trials 8

Haystacks are drt-niah's (bench/niah/passkey_haystack.cc: phase-0 filler, the
needle on a filler-unit boundary, "What is the pass key? The pass key is" at
the end), keys of 5 digits without a leading zero. Each is scored with and
without padding the question to the chunk boundary (the engine's
pad_to_chunk_boundary), and also scored by the answer's log-probability (a
margin finer than exact match). Greedy decoding is checked under teacher forcing,
which is exact for greedy (see train_passkey.py). --fast uses drt_fast's
kernels (the same math, checked against the reference at start).
"""
import argparse
import json
import sys
import time

import numpy as np
import torch

import drt_fast
import drt_reference
import passkey_data as P


@torch.no_grad()
def run(model, length, depth, keys, pad, batch):
    """(exact greedy answers, the answers' log-probabilities: the sum over the
    six answer tokens, space and five digits, of log p(target))."""
    correct = 0
    logprobs = []
    for s in range(0, len(keys), batch):
        part = [P.eval_example(length, depth, k, pad) for k in keys[s:s + batch]]
        width = max(len(t) for t, _, _ in part)
        tokens = np.stack([np.concatenate([t, P.filler(0, width - len(t))]) for t, _, _ in part])
        out = model(torch.from_numpy(tokens), compute_logits=False)
        for row, (t, y, a) in enumerate(part):
            logits = model.lm_head(out.hidden[row, torch.arange(a - 1, a + 6)]).float()
            logits[:, [P.PAD_ID, P.CHUNK_ID]] = float("-inf")
            pred = logits.argmax(-1).numpy()
            correct += bool((pred[:6] == y[a - 1:a + 5]).all() and not (48 <= pred[6] <= 57))
            target = torch.from_numpy(y[a - 1:a + 5])
            logprobs.append(float(torch.log_softmax(logits[:6], -1).gather(1, target[:, None]).sum()))
    return correct, logprobs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--lengths", default="2048,4096,16384")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--fast", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = drt_reference.load_model_dir(args.model, dtype=torch.float32)
    if args.fast:
        ids = torch.from_numpy(P.training_batch(np.random.RandomState(0), 2, 8, 0.5)[0])
        diff, same = drt_fast.check(model, ids)
        print(f"fast path vs reference: max |logit diff| {diff:.2e}, same retrieval {same}")
        drt_fast.enable(model)
    rng = np.random.RandomState(args.seed)
    results = []
    for length in (int(x) for x in args.lengths.split(",")):
        for depth in (float(x) for x in args.depths.split(",")):
            keys = [P.random_key(rng, leading_zero=False) for _ in range(args.trials)]
            row = {"length": length, "depth": depth, "trials": args.trials}
            for pad in (True, False):
                t0 = time.time()
                mode = "pad" if pad else "nopad"
                row[mode], logprobs = run(model, length, depth, keys, pad, args.batch)
                row["answer_logprob_" + mode] = round(float(np.mean(logprobs)), 4)
                row["seconds_" + ("pad" if pad else "nopad")] = round(time.time() - t0, 1)
            results.append(row)
            print(json.dumps(row), flush=True)
    for mode in ("pad", "nopad"):
        for length in sorted({r["length"] for r in results}):
            rows = [r for r in results if r["length"] == length]
            print(f"{mode:5s} length {length:8d}: {sum(r[mode] for r in rows)}/{sum(r['trials'] for r in rows)}, "
                  f"mean answer log-probability {np.mean([r['answer_logprob_' + mode] for r in rows]):.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

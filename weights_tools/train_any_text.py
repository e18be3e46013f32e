"""Trains a byte-level DRT to retrieve what it is asked for in any text
(docs/training.md, "The any-text model").

    bash weights_tools/fetch_text.sh && /usr/bin/python3 weights_tools/text_corpus.py
    nice -n 10 /usr/bin/python3 weights_tools/train_any_text.py --out runs/anytext \\
        --init models/drt-passkey-byte --steps 4000 --export models/drt-anytext-byte

Data: text_tasks.py on the training families of text_corpus.py (Python and
Perl manuals, man pages, the GCIDE dictionary): plain LM, passages repeated
past the window (repeat), passkeys in several wordings, keyed needles, 2-hop
variable tracking. Validation: held-out text (the Debian Administrator's
Handbook, text_corpus.py's "handbook" family), greedy exact match under
teacher forcing (passkey, passkey in held-out wordings, keyed), as
train_passkey.py does; and read_twice.py's measures of whether the model
uses what it read (--read_twice: a held-out passage's NLL at its second
reading minus its first, and the NLL of the passkey filler). The training
log's by_kind records give each kind's mean LM loss ("lm"), answer loss and
answer-token accuracy, and for repeat the loss on its later copies' bytes
alone ("copy": what retrieval can lower; the rest of "lm" is plain text).

Model, optimiser and training semantics are train_passkey.py's (Gumbel top-k
retrieval, drt_fast kernels checked against the reference first). --init
starts from an exported model directory (the bundled passkey model by
default on the CPU: the copy and retrieval circuits exist, the run teaches
them to work on text); --init none trains from scratch. The schedule follows
--steps (reproducible) or --minutes. --device cuda is wired as in
train_passkey.py and has not been run (no GPU where this was written).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import drt_config
import drt_fast
import drt_reference
import passkey_data as P
import read_twice
import safetensors_io
import text_corpus
import text_tasks as T
import train_passkey

NOT_SAMPLED = (P.PAD_ID, P.CHUNK_ID)


@torch.no_grad()
def heldout_accuracy(model, text, task, length, n, seed, pad=True):
    """Greedy exact match of the 5-digit answer on n held-out-text prompts of
    `length` bytes, depths spread over [0.05, 0.95]."""
    rng = np.random.RandomState(seed)
    device = next(model.parameters()).device
    ok = []
    for i in range(n):
        depth = 0.05 + 0.9 * i / max(1, n - 1)
        prompt, key = T.eval_prompt(rng, text, task, length, depth)
        tokens, targets, _, a = P.finish(prompt, key, pad)
        out = model(torch.from_numpy(tokens[None]).to(device), compute_logits=False)
        pos = torch.arange(a - 1, a + 6, device=device)
        logits = model.lm_head(out.hidden[0, pos]).float()
        logits[:, list(NOT_SAMPLED)] = float("-inf")
        pred = logits.argmax(-1).cpu().numpy()
        ok.append(bool((pred[:6] == targets[a - 1:a + 5]).all() and not (48 <= pred[6] <= 57)))
    return float(np.mean(ok))


def evaluate(model, text, specs, seed, log, tasks=("passkey", "passkey_varied", "keyed"), n_read_twice=0,
             read_twice_seed=0):
    """Held-out accuracies of `tasks` at `specs`; with n_read_twice > 0 also
    read_twice.py's read-twice gain on that many held-out passages (chosen by
    read_twice_seed: the run passes the same one to every eval, the final one
    included, so that the figures compare over training) and the filler NLL
    (keys read_twice_first/second/gain/gain_late, filler_nll; nats per byte)."""
    model.eval()
    res = {}
    for task in tasks:
        for length, n in specs:
            t0 = time.time()
            acc = heldout_accuracy(model, text, task, length, n, seed + length)
            res[f"{task}@{length}"] = acc
            log(f"  held-out {task:15s} len {length:6d} acc {acc:.3f} ({n} prompts, {time.time() - t0:.1f}s)")
    if n_read_twice:
        t0 = time.time()
        r = read_twice.read_twice(model, text, n_read_twice, read_twice_seed)
        res.update({f"read_twice_{k}": round(v, 4) for k, v in r.items()})
        log(f"  held-out read-twice gain {r['gain']:+.4f} nats/byte, past the seam {r['gain_late']:+.4f} "
            f"(second reading {r['second']:.4f}, first {r['first']:.4f}; {n_read_twice} passages of "
            f"{min(read_twice.PASSAGES)}-{max(read_twice.PASSAGES)} bytes, {time.time() - t0:.1f}s)")
        filler = read_twice.filler_nll(model)
        res["filler_nll"] = round(filler, 4)
        log(f"  passkey filler past the window: {filler:.4f} nats/byte (perplexity {np.exp(filler):.3f})")
    model.train()
    return res


def parse_mix(text):
    """'lm:0.3,passkey:0.3,...' -> (kinds, probabilities); ValueError naming
    the bad entry (weights finite, not negative, not all 0: "lm:0" gave NaN
    probabilities; their sum finite)."""
    kinds, probs = [], []
    for part in text.split(","):
        k, _, w = part.partition(":")
        if k not in T.KINDS:
            raise ValueError(f"--mix: unknown kind {k!r} in {part!r}; known: {', '.join(T.KINDS)}")
        try:
            weight = float(w)
        except ValueError:
            raise ValueError(f"--mix: {part!r} is not kind:weight") from None
        if not np.isfinite(weight) or weight < 0:
            raise ValueError(f"--mix: weight {w!r} of {k} must be a finite number >= 0")
        kinds.append(k)
        probs.append(weight)
    total = sum(probs)
    if total <= 0:
        raise ValueError(f"--mix: the weights of {text!r} add up to 0")
    if not np.isfinite(total):  # finite weights can overflow: 1e308 twice gave all-0 probabilities
        raise ValueError(f"--mix: the weights of {text!r} add up to {total} (too large); use smaller ones")
    probs = np.array(probs) / sum(probs)
    return kinds, probs


def parse_phases(text):
    """'0:16:4,0.5:32:2' -> [(start fraction, n_chunks, batch)]; ValueError
    naming the bad entry. The first phase must start at 0."""
    out = []
    for part in text.split(","):
        try:
            f, c, b = part.split(":")
            phase = (float(f), int(c), int(b))
        except ValueError:
            raise ValueError(f"--phases: {part!r} is not start:chunks:batch") from None
        if not 0 <= phase[0] < 1 or phase[1] < 1 or phase[2] < 1:
            raise ValueError(f"--phases: {part!r}: the start must be in [0, 1), chunks and batch at least 1")
        out.append(phase)
    out.sort()
    if out[0][0] != 0:
        raise ValueError(f"--phases: no phase starts at 0 in {text!r}")
    return out


def parse_eval_specs(flag, text):
    """'2048:10,4096:10' -> [(length, prompts)]; '' -> [] (no evals);
    ValueError naming the flag and the bad entry ('4096' alone raised a
    bare ValueError deep in the run)."""
    specs = []
    for part in (s for s in text.split(",") if s):
        try:
            length, n = (int(x) for x in part.split(":"))
        except ValueError:
            raise ValueError(f"{flag}: {part!r} is not length:prompts (e.g. 4096:10)") from None
        if length < 1 or n < 1:
            raise ValueError(f"{flag}: {part!r}: length and prompts must be at least 1")
        specs.append((length, n))
    return specs


def family_problem(train_families, heldout_family):
    """Why --train_families / --heldout_family cannot be used, or None. No
    held-out family may be trained on: docs/passkey_accuracy.md reports the
    handbook's and the fortunes' results as text never trained on, whichever
    of them this run validates on (review-tools #3)."""
    known = ", ".join(text_corpus.TRAIN_FAMILIES)
    if not train_families:
        return f"--train_families is empty (training families: {known})"
    for family in train_families:
        if family in text_corpus.HELDOUT_FAMILIES:
            return (f"--train_families: {family} is a held-out family (held out: "
                    f"{', '.join(text_corpus.HELDOUT_FAMILIES)}), never trained on; training families: {known}")
        if family not in text_corpus.TRAIN_FAMILIES:
            return f"--train_families: unknown family {family!r} (training families: {known})"
    if heldout_family not in text_corpus.HELDOUT_FAMILIES:
        return (f"--heldout_family: {heldout_family!r} is not a held-out family "
                f"({', '.join(text_corpus.HELDOUT_FAMILIES)})")
    return None


def load_init(model, model_dir):
    arrays = safetensors_io.load_file(os.path.join(model_dir, "model.safetensors"))
    drt_reference.load_state_arrays(model, arrays)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--text", default=os.path.expanduser("~/.cache/drt-text/text"),
                   help="text_corpus.py's output directory")
    p.add_argument("--train_families", default=",".join(text_corpus.TRAIN_FAMILIES))
    p.add_argument("--heldout_family", default="handbook")
    p.add_argument("--init", default="models/drt-passkey-byte",
                   help="exported model directory to start from, or 'none'")
    p.add_argument("--export")
    p.add_argument("--export_dtype", default="f32", choices=["f32", "bf16", "f16"])
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=1)
    # model (used with --init none; with --init the directory's config wins)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=0)
    p.add_argument("--decoder_layers", default="2,2")
    p.add_argument("--encoder_layers", type=int, default=1)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--init_std", type=float, default=0.088)
    # training
    p.add_argument("--steps", type=int, default=0, help="step budget (reproducible schedule)")
    p.add_argument("--minutes", type=float, default=40.0, help="wall-time budget when --steps is 0")
    p.add_argument("--mix", default="lm:0.2,passkey:0.35,keyed:0.3,two_hop:0.15")
    p.add_argument("--phases", default="0:16:4,0.4:32:2")
    p.add_argument("--pad_prob", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min_lr_frac", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--answer_weight", type=float, default=1.0)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--log_every", type=int, default=20)
    p.add_argument("--eval_every_min", type=float, default=8.0)
    p.add_argument("--eval", default="2048:10,4096:10")
    p.add_argument("--final_eval", default="2048:20,4096:20,16384:10")
    p.add_argument("--eval_tasks", default="passkey,passkey_varied,keyed",
                   help="held-out tasks of the teacher-forced evals (passkey, passkey_varied, keyed, two_hop)")
    p.add_argument("--read_twice", type=int, default=0,
                   help="held-out passages of the read-twice gain (read_twice.py), at every eval and the "
                        "final one, with the filler NLL; 0: not measured")
    # A GPU lease runs one command for at most 10 minutes and keeps nothing:
    # --stop_after_min ends this invocation (after a full checkpoint) when its
    # wall time is spent, --save_every_min writes that checkpoint on the way,
    # and --resume continues from one with the same schedule (--steps or
    # --minutes count the whole run, not one invocation).
    p.add_argument("--resume", help="a full checkpoint (train_state.pt) written by an earlier invocation")
    p.add_argument("--stop_after_min", type=float, default=0.0,
                   help="wall minutes after which this invocation saves and exits (0: run to the end)")
    p.add_argument("--save_every_min", type=float, default=0.0)
    args = p.parse_args(argv)
    train_families = [f for f in args.train_families.split(",") if f]
    problem = family_problem(train_families, args.heldout_family)
    if problem:
        p.error(problem)
    if args.steps < 0:
        p.error(f"--steps must be 0 (use --minutes) or more, got {args.steps}")
    if not args.steps and not (np.isfinite(args.minutes) and args.minutes > 0):
        p.error(f"--minutes must be a positive number of minutes when --steps is 0, got {args.minutes:g}")
    try:
        kinds, probs = parse_mix(args.mix)
        phases = parse_phases(args.phases)
        eval_specs = parse_eval_specs("--eval", args.eval)
        final_specs = parse_eval_specs("--final_eval", args.final_eval)
    except ValueError as e:
        p.error(str(e))
    if "repeat" in kinds and min(c for _, c, _ in phases) < T.REPEAT_MIN_SEQ_CHUNKS:
        p.error(f"--phases {args.phases}: the repeat kind of --mix needs sequences of at least "
                f"{T.REPEAT_MIN_SEQ_CHUNKS} chunks")
    heldout_path = os.path.join(args.text, args.heldout_family + ".txt")
    if args.read_twice < 0:
        p.error(f"--read_twice must be 0 (off) or a number of passages, got {args.read_twice}")
    if args.read_twice and os.path.exists(heldout_path) and os.path.getsize(heldout_path) < read_twice.LENGTH:
        p.error(f"--read_twice: {heldout_path} has {os.path.getsize(heldout_path)} bytes, "
                f"fewer than a read-twice sequence ({read_twice.LENGTH})")
    eval_tasks = [t for t in args.eval_tasks.split(",") if t]
    for t in eval_tasks:
        if t not in ("passkey", "passkey_varied", "keyed", "two_hop"):
            p.error(f"--eval_tasks: unknown task {t!r} (passkey, passkey_varied, keyed, two_hop)")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA GPU")
    if not args.ffn:
        args.ffn = 2 * args.hidden
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    log = train_passkey.open_log(args.out)

    log(f"args: {json.dumps(vars(args))}")
    src = T.TextSource(args.text, train_families)
    heldout = np.fromfile(heldout_path, dtype=np.uint8).astype(np.int64)
    log(f"training text: {', '.join(f'{f} {len(a) / 1e6:.1f} MB' for f, a in zip(src.families, src.arrays))}; "
        f"held-out: {args.heldout_family} {len(heldout) / 1e6:.1f} MB")

    if args.init != "none":
        cfg = drt_config.load_config(os.path.join(args.init, "config.json"))
    else:
        cfg = train_passkey.build_config(args)
    drt_config.save_config(cfg, os.path.join(args.out, "config.json"))
    model = drt_reference.from_config(cfg, torch.float32, seed=args.seed)
    if args.init != "none":
        load_init(model, args.init)
        log(f"initialised from {args.init}")
    rng = np.random.RandomState(args.seed)
    probe = T.batch(np.random.RandomState(0), src, "keyed", 2, 8, 0.5)[0]
    diff, same = drt_fast.check(model, torch.from_numpy(probe))
    log(f"fast path vs reference: max |logit diff| {diff:.2e}, same retrieval {same}")
    drt_fast.enable(model)
    model.to(args.device)
    nparams = sum(v.numel() for v in model.parameters())
    log(f"model: {nparams / 1e6:.3f}M parameters")
    opt = train_passkey.make_optimizer(model, args.lr, args.weight_decay)
    gen = torch.Generator(device=args.device).manual_seed(args.seed)

    log("eval before training")
    ckpt = os.path.join(args.out, "checkpoint.pt")
    state_path = os.path.join(args.out, "train_state.pt")
    budget = args.minutes * 60.0
    train_time, step = 0.0, 0
    next_eval = args.eval_every_min * 60.0
    if args.resume:
        st = torch.load(args.resume, map_location="cpu", weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, train_time, next_eval, history = st["step"], st["train_time"], st["next_eval"], st["history"]
        rng.set_state(st["np_rng"])
        gen.set_state(st["gen"])
        log(f"resumed from {args.resume}: step {step}, {train_time / 60:.2f} min of training")
    else:
        history = [{"step": 0, "eval": evaluate(model, heldout, eval_specs, args.seed, log, eval_tasks,
                                                args.read_twice, args.seed)}]

    def save_state():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "train_time": train_time, "next_eval": next_eval, "history": history,
                    "np_rng": rng.get_state(), "gen": gen.get_state()}, state_path + ".tmp")
        os.replace(state_path + ".tmp", state_path)

    stats = {}
    t_start = time.time()
    next_save = args.save_every_min * 60.0
    model.train()

    def progress():
        return step / args.steps if args.steps else train_time / budget

    while progress() < 1.0:
        wall = time.time() - t_start
        if args.save_every_min and wall >= next_save:
            next_save += args.save_every_min * 60.0
            save_state()
        if args.stop_after_min and wall >= args.stop_after_min * 60.0:
            save_state()
            log(f"stopping this invocation at step {step} ({train_time / 60:.2f} min of training); "
                f"resume with --resume {state_path}")
            return 0
        frac = progress()
        _, n_chunks, bsz = [ph for ph in phases if ph[0] <= frac][-1]
        kind = kinds[rng.choice(len(kinds), p=probs)]
        scale = train_passkey.lr_scale(step, frac, args.warmup, args.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = args.lr * scale
        t0 = time.time()
        copy_mask = None
        if kind == "repeat":  # the same sequences as T.batch, and which targets are later copies
            tokens, targets, lk, copy_mask = T.repeat_batch(rng, src, bsz, n_chunks)
        else:
            tokens, targets, lk = T.batch(rng, src, kind, bsz, n_chunks, args.pad_prob)
        tokens_t = torch.from_numpy(tokens).to(args.device)
        targets_t = torch.from_numpy(targets).to(args.device)
        kinds_t = torch.from_numpy(lk).to(args.device)
        out = model(tokens_t, gumbel=True, generator=gen)
        logits = out.logits.float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets_t.clamp(min=0).reshape(-1),
                             reduction="none").view_as(targets_t)
        lm_mask = (kinds_t == P.LOSS_LM).float()
        ans_mask = (kinds_t == P.LOSS_ANSWER).float()
        lm_loss = (ce * lm_mask).sum() / lm_mask.sum()
        loss = lm_loss
        ans_loss = None
        if ans_mask.sum() > 0:
            ans_loss = (ce * ans_mask).sum() / ans_mask.sum()
            loss = loss + args.answer_weight * ans_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        train_time += time.time() - t0
        step += 1
        s = stats.setdefault(kind, {"lm": [], "answer": [], "tok": [], "copy": []})
        s["lm"].append(lm_loss.item())
        if copy_mask is not None:  # the later copies' share of lm: what retrieval can lower
            with torch.no_grad():
                cm = torch.from_numpy(copy_mask).to(args.device)
                s["copy"].append(ce[cm].mean().item())
        if ans_loss is not None:
            s["answer"].append(ans_loss.item())
            with torch.no_grad():
                s["tok"].append((((logits.argmax(-1) == targets_t).float() * ans_mask).sum() / ans_mask.sum()).item())
        if step % args.log_every == 0:
            rec = {"step": step, "min": round(train_time / 60, 2), "n_chunks": n_chunks,
                   "lr": round(args.lr * scale, 6),
                   "by_kind": {k: {m: round(float(np.mean(v)), 3) for m, v in d.items() if v}
                               for k, d in stats.items()}}
            stats = {}
            log(json.dumps(rec))
            history.append(rec)
        if train_time >= next_eval:
            next_eval += args.eval_every_min * 60.0
            log(f"eval at step {step} ({train_time / 60:.1f} min of training)")
            history.append({"step": step, "eval": evaluate(model, heldout, eval_specs, args.seed, log,
                                                           eval_tasks, args.read_twice, args.seed)})
            save_state()

    save_state()
    log(f"training done: {step} steps, {train_time / 60:.1f} min of training, "
        f"{(time.time() - t_start) / 60:.1f} min wall with evals")
    model.to("cpu")
    torch.save(model.state_dict(), ckpt)
    model.to(args.device)
    drt_fast.disable(model)
    log("final eval (drt_reference forward)")
    history.append({"step": step, "final_eval": evaluate(model, heldout, final_specs, args.seed + 1, log,
                                                               eval_tasks, args.read_twice, args.seed)})
    with open(os.path.join(args.out, "history.json"), "w") as f:
        json.dump(history, f, indent=1)
    if args.export:
        n = train_passkey.export_byte_model(ckpt, os.path.join(args.out, "config.json"), args.export,
                                            args.export_dtype, True, log)
        log(f"exported {args.export}: {n / 1e6:.3f}M parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())

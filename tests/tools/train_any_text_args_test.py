#!/usr/bin/env python3
"""weights_tools/train_any_text.py refuses arguments it cannot honour with a
usage error (exit 2) naming the flag and the value, before it loads any text
or writes anything; valid arguments still train.

- a held-out family (text_corpus.HELDOUT_FAMILIES) among --train_families:
  docs/training.md says the script refuses it, but only --heldout_family's
  own family was refused, so `--train_families python-docs,fortunes` trained
  on the fortunes that docs/passkey_accuracy.md reports as never trained on
  (review-tools #3); an unknown family, and a --heldout_family that is no
  held-out family, are refused too;
- arguments that ended in a traceback or NaN (review-tools #10): --minutes 0
  without --steps (ZeroDivisionError), --eval 4096 without ':prompts'
  (ValueError), --mix lm:0 (NaN probabilities), and their neighbours;
  the repeat kind with a phase too short for it (a ValueError mid-run) and
  a negative --read_twice.

The text directory holds tiny generated files under the families' names; a
2-step run of a small model from scratch is the control that valid
arguments pass, and a 2-step run of the repeat kind with --read_twice 1
and an eval after every step is the control that the copy objective trains,
its later copies' loss is logged, and its eval is logged and kept in
history.json before, during and after training. main() runs in this process (torch imported once: a
subprocess per case took minutes on a loaded machine).

    train_any_text_args_test.py
"""
import contextlib
import io
import os
import random
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLS = os.path.join(REPO, "weights_tools")
FAMILIES = ("python-docs", "perl-pod", "man-pages", "gcide", "handbook", "fortunes")
FAILED = []


def expect(ok, what, detail=""):
    print(("ok: " if ok else "FAILED: ") + what + ("" if ok or not detail else f"\n  {detail}"))
    if not ok:
        FAILED.append(what)


def main():
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: {e} (train_any_text.py needs numpy and torch: /usr/bin/python3 with python3-torch)")
        return 77
    sys.path.insert(0, TOOLS)
    import train_any_text
    with tempfile.TemporaryDirectory(prefix="drt-train-args-") as tmp:
        text = os.path.join(tmp, "text")
        os.makedirs(text)
        rng = random.Random(7)
        words = "the of and to in is that for it as with was on be by this are or at from".split()
        for family in FAMILIES:
            with open(os.path.join(text, family + ".txt"), "w") as f:
                f.write(" ".join(rng.choice(words) for _ in range(20000)))
        small = ["--init", "none", "--hidden", "32", "--heads", "2", "--steps", "2", "--eval", "",
                 "--final_eval", "", "--log_every", "1"]

        def train(name, extra):
            """main()'s exit status (argparse's usage error: SystemExit 2),
            its output, and whether --out was created."""
            out = os.path.join(tmp, name)
            captured = io.StringIO()
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                try:
                    code = train_any_text.main(["--out", out, "--text", text] + small + extra)
                except SystemExit as e:
                    code = e.code
                except Exception:  # a crash is a failed case, shown with its traceback
                    import traceback
                    traceback.print_exc()
                    code = "exception"
            return code, captured.getvalue(), os.path.exists(out)

        code, log, wrote = train("ok", ["--train_families", "python-docs,gcide"])
        expect(code == 0 and "training done: 2 steps" in log and wrote,
               "control: two training families, 2 steps from scratch, trains", log[-1500:])
        # --eval_every_min 1e-4: an eval after every step, so the in-run eval path logs the read-twice figures too
        code, log, wrote = train("repeat", ["--mix", "repeat:1", "--phases", "0:7:1", "--read_twice", "1",
                                            "--eval_every_min", "1e-4"])
        history = []
        if wrote and os.path.exists(os.path.join(tmp, "repeat", "history.json")):
            import json
            with open(os.path.join(tmp, "repeat", "history.json")) as f:
                history = json.load(f)
        evals = [h.get("eval", h.get("final_eval")) for h in history if "eval" in h or "final_eval" in h]
        mid = [h for h in history[1:] if "eval" in h]  # history[0] is the eval before training
        by_kind = [h["by_kind"]["repeat"] for h in history if "by_kind" in h]
        expect(code == 0 and "training done: 2 steps" in log and log.count("eval at step") == 2
               and log.count("held-out read-twice gain") == 4 and log.count("passkey filler past the window") == 4
               and len(evals) == 4 and len(mid) == 2
               and all("read_twice_gain" in e and "read_twice_gain_late" in e and "filler_nll" in e for e in evals),
               "control: --mix repeat:1 on 7-chunk sequences trains; --read_twice logs the gain and the "
               "filler NLL before training, at the eval after each step and at the end, and history.json "
               "holds all four", log[-1500:])
        expect(len(by_kind) == 2 and all(set(r) == {"lm", "copy"} and 0 < r["copy"] < 10 for r in by_kind),
               "control: the repeat records hold the later copies' loss ('copy') beside 'lm'", str(by_kind))

        refused = [
            ("fortunes", ["--train_families", "python-docs,fortunes"], "fortunes is a held-out family"),
            ("handbook", ["--train_families", "handbook,python-docs"], "handbook is a held-out family"),
            ("fortunes-validated-on", ["--train_families", "fortunes", "--heldout_family", "fortunes"],
             "fortunes is a held-out family"),
            ("unknown", ["--train_families", "python-docs,pythn-docs"], "unknown family 'pythn-docs'"),
            ("empty", ["--train_families", ","], "--train_families is empty"),
            ("heldout-train", ["--heldout_family", "gcide"], "--heldout_family: 'gcide' is not a held-out family"),
            ("minutes-0", ["--steps", "0", "--minutes", "0"], "--minutes must be a positive number"),
            ("minutes-nan", ["--steps", "0", "--minutes", "nan"], "--minutes must be a positive number"),
            ("steps-negative", ["--steps", "-1"], "--steps must be 0"),
            ("eval-no-prompts", ["--eval", "4096"], "--eval: '4096' is not length:prompts"),
            ("final-eval-zero", ["--final_eval", "2048:0"], "--final_eval: '2048:0': length and prompts"),
            ("mix-zero", ["--mix", "lm:0"], "--mix: the weights of 'lm:0' add up to 0"),
            ("mix-sum-inf", ["--mix", "lm:1e308,keyed:1e308"],
             "--mix: the weights of 'lm:1e308,keyed:1e308' add up to inf (too large)"),
            ("mix-nan", ["--mix", "lm:nan,keyed:1"], "--mix: weight 'nan' of lm must be a finite number"),
            ("mix-no-weight", ["--mix", "lm"], "--mix: 'lm' is not kind:weight"),
            ("mix-unknown", ["--mix", "lm:1,needle:1"], "--mix: unknown kind 'needle'"),
            ("repeat-short", ["--mix", "lm:1,repeat:1", "--phases", "0:16:2,0.5:6:2"],
             "the repeat kind of --mix needs sequences of at least 7 chunks"),
            ("read-twice-negative", ["--read_twice", "-1"], "--read_twice must be 0 (off) or a number"),
            ("phases-late", ["--phases", "0.5:16:4"], "--phases: no phase starts at 0"),
            ("phases-bad", ["--phases", "0:16"], "--phases: '0:16' is not start:chunks:batch"),
        ]
        short = os.path.join(tmp, "short-text")  # a held-out file shorter than a read-twice sequence
        os.makedirs(short)
        for family in FAMILIES:
            with open(os.path.join(short, family + ".txt"), "w") as f:
                f.write("word " * (400 if family == "handbook" else 20000))
        refused.append(("read-twice-short", ["--read_twice", "2", "--text", short],
                        "handbook.txt has 2000 bytes, fewer than a read-twice sequence (2016)"))
        for name, extra, message in refused:
            code, log, wrote = train(name, extra)
            expect(code == 2 and message in log and "Traceback" not in log and not wrote,
                   f"{' '.join(extra)}: refused (exit 2, {message!r}), nothing written",
                   f"exit {code}, wrote {wrote}: {log[-1500:]}")
    print(f"{len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

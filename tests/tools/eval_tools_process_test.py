#!/usr/bin/env python3
"""The evaluation tools as processes, the way a researcher runs them
(review-tools 2026-11-25 #3, #4, #11, #13), on the bundled passkey model at
tiny sizes (seconds in all):

- drt-niah and drt-niah-text --json: an unwritable path, or (drt-niah-text)
  the --text file itself or a file inside a --text folder, is refused before
  the run, leaving the file as it was;
- bad flags are refused before the model loads (a missing --model would
  otherwise be the error), naming the flag, the value and the range:
  --max_new_tokens < 1, --threads < 0, --depths outside [0, 1], a length or
  depth given twice; --lengths too short names the minimum; drt-ppl and
  drt-bench --threads < 0, drt-bench --temperature < 0, drt-step-bench
  --sessions echoing the bad count;
- a cell's trials depend on (seed, task, length, depth) alone: the same cell
  run alone and inside a larger grid gives the same keys, needle offsets and
  text start, and the JSON records the run's settings and every trial;
- bench/niah_text_table.py reads the new files and the old ones of docs/niah;
- drt-bench and drt-step-bench run with their default --model (one a build
  has), say how to make the random model when --model is missing, and
  drt-bench's result has threads, cuda_precision only on CUDA, and --json.

    eval_tools_process_test.py --niah B --niah_text B --ppl B --bench B --step_bench B
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(REPO, "models", "drt-passkey-byte")
TEXT = os.path.join(REPO, "tests", "fixtures", "heldout-text", "debian_handbook_excerpt.txt")
TABLE = os.path.join(REPO, "bench", "niah_text_table.py")
FAILED = []


def expect(ok, what, detail=""):
    print(("ok: " if ok else "FAILED: ") + what + ("" if ok or not detail else f"\n  {detail}"))
    if not ok:
        FAILED.append(what)


def run(binary, *args, timeout=120):
    """The finished process; one that ran past `timeout` counts as exit -1
    (a refusal that did not happen starts the whole default grid)."""
    try:
        return subprocess.run([binary, *args], capture_output=True, text=True, errors="replace",
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, -1, "", f"timed out after {timeout} s")


def refused(binary, args, wants, what):
    done = run(binary, *args)
    expect(done.returncode == 1 and all(w in done.stderr for w in wants), what,
           f"rc {done.returncode}: {done.stderr.strip()[-400:]}")


def json_checks(tools, tmp):
    small = ["--lengths", "1K", "--depths", "0.5", "--trials", "1", "--threads", "1"]
    for name, binary, extra in (("drt-niah", tools.niah, small),
                                ("drt-niah-text", tools.niah_text, ["--text", TEXT, "--tasks", "passkey", *small])):
        # A missing folder: refused at once (it was found only after the run,
        # exit 0, nothing written).
        refused(binary, ["--model", MODEL, *extra, "--json", os.path.join(tmp, "no", "x.json")],
                ["--json", "cannot write", os.path.join(tmp, "no")],
                f"{name} --json in a missing folder is refused before the run")
        # A directory as --json.
        refused(binary, ["--model", MODEL, *extra, "--json", tmp], ["--json", "not a regular file"],
                f"{name} --json naming a folder is refused")
    # drt-niah-text --json naming its own --text: refused, the corpus kept.
    corpus = os.path.join(tmp, "corpus.txt")
    with open(TEXT, "rb") as f:
        text_bytes = f.read()
    with open(corpus, "wb") as f:
        f.write(text_bytes)
    for same in (corpus, os.path.join(tmp, ".", "corpus.txt")):
        done = run(tools.niah_text, "--model", MODEL, "--text", corpus, "--tasks", "passkey",
                   "--lengths", "1K", "--depths", "0.5", "--trials", "1", "--json", same)
        with open(corpus, "rb") as f:
            kept = f.read()
        expect(done.returncode == 1 and "--json" in done.stderr and "--text" in done.stderr
               and kept == text_bytes, f"drt-niah-text --json {same} (the --text file) is refused, the corpus kept",
               f"rc {done.returncode}: {done.stderr.strip()}; {len(kept)} of {len(text_bytes)} bytes")
    # --text a folder: every file in it is read as filler, so a result
    # written there would join the next run's corpus.
    folder = os.path.join(tmp, "corpus_dir")
    os.makedirs(os.path.join(folder, "sub"))
    with open(os.path.join(folder, "a.txt"), "wb") as f:
        f.write(text_bytes)
    for inside in (os.path.join(folder, "out.json"), os.path.join(folder, "sub", "out.json")):
        done = run(tools.niah_text, "--model", MODEL, "--text", folder, "--tasks", "passkey",
                   "--lengths", "1K", "--depths", "0.5", "--trials", "1", "--json", inside)
        expect(done.returncode == 1 and "inside the --text folder" in done.stderr
               and not os.path.exists(inside), f"drt-niah-text --json {os.path.relpath(inside, tmp)} "
               "inside the --text folder is refused", f"rc {done.returncode}: {done.stderr.strip()}")


def flag_checks(tools, tmp):
    missing = os.path.join(tmp, "no_model")  # a flag error must come first
    for name, binary, extra in (("drt-niah", tools.niah, []),
                                ("drt-niah-text", tools.niah_text, ["--text", TEXT])):
        base = ["--model", missing, *extra, "--lengths", "1K", "--depths", "0.5", "--trials", "1"]
        for args, wants in (
                (["--max_new_tokens", "0"], ["--max_new_tokens must be at least 1", "got 0"]),
                (["--max_new_tokens", "-3"], ["--max_new_tokens must be at least 1", "got -3"]),
                (["--threads", "-5"], ["--threads must be 0", "got -5"]),
                (["--depths", "2"], ["--depths: bad depth '2'", "in [0, 1]"]),
                (["--depths", "0.5,0.50"], ["--depths: '0.50' is 0.5, which is already in the list"]),
                (["--lengths", "1K,1K"], ["--lengths: '1K' is 1024, which is already in the list"]),
                (["--lengths", "2K,2048"], ["--lengths: '2048' is 2048, which is already in the list"])):
            done = run(binary, *base, *args)
            expect(done.returncode == 1 and all(w in done.stderr for w in wants) and "no_model" not in done.stderr,
                   f"{name} {' '.join(args)}: refused before the model loads, naming the flag",
                   f"rc {done.returncode}: {done.stderr.strip()}")
    # Too short: the minimum is named (drt-niah's is in the model's tokens, so
    # it needs the tokenizer; drt-niah-text's is in bytes, before the load).
    refused(tools.niah, ["--model", MODEL, "--lengths", "10", "--trials", "1"],
            ["--lengths: 10 tokens cannot hold the question and a needle (at least 237)"],
            "drt-niah --lengths 10 names the flag and the minimum (it said neither)")
    done = run(tools.niah_text, "--model", missing, "--text", TEXT, "--tasks", "passkey,keyed",
               "--lengths", "60", "--trials", "1")
    expect(done.returncode == 1 and "--lengths: 60 bytes is too short for the passkey task" in done.stderr
           and "needles and question take" in done.stderr and "no_model" not in done.stderr,
           "drt-niah-text --lengths 60: refused before the model loads with the bytes it needs",
           f"rc {done.returncode}: {done.stderr.strip()}")
    refused(tools.ppl, ["--model", missing, "--text", TEXT, "--threads", "-5"], ["--threads must be 0", "got -5"],
            "drt-ppl --threads -5 is refused")
    for args, wants in ((["--threads", "-5"], ["--threads must be 0", "got -5"]),
                        (["--temperature", "-1"], ["--temperature must be 0 (greedy) or a positive number, got -1"]),
                        (["--temperature", "nan"], ["--temperature must be 0"])):
        refused(tools.bench, ["--model", missing, *args], wants,
                f"drt-bench {' '.join(args)} is refused before the model loads")
    refused(tools.step_bench, ["--model", missing, "--sessions", "1,0,4"],
            ["--sessions: bad count '0' in '1,0,4'"], "drt-step-bench --sessions 1,0,4 echoes the bad count")
    refused(tools.step_bench, ["--model", missing, "--sessions", "1", "--threads", "-2"],
            ["--threads must be 0", "got -2"], "drt-step-bench --threads -2 is refused")


def load(path):
    with open(path) as f:
        return json.load(f)


def cell_of(data, length, depth, task=None):
    for c in data["cells"]:
        if c["length"] == length and abs(c["depth"] - depth) < 1e-12 and c.get("task") == task:
            return c
    return None


def seeded_cells(tools, tmp):
    # drt-niah: the (400, 0.5) cell alone and inside a grid of four.
    grid = os.path.join(tmp, "niah_grid.json")
    alone = os.path.join(tmp, "niah_alone.json")
    common = ["--model", MODEL, "--trials", "3", "--threads", "1", "--max_new_tokens", "6"]
    a = run(tools.niah, *common, "--lengths", "300,400", "--depths", "0,0.5", "--json", grid)
    b = run(tools.niah, *common, "--lengths", "400", "--depths", "0.5", "--json", alone)
    expect(a.returncode == 0 and b.returncode == 0, "drt-niah runs the grid and the cell", a.stderr + b.stderr)
    if a.returncode == 0 and b.returncode == 0:
        g, s = load(grid), load(alone)
        cg, cs = cell_of(g, 400, 0.5), cell_of(s, 400, 0.5)
        keys = lambda c: [(r["key"], r["needle_offset"]) for r in c.get("records", [])]
        expect(cg is not None and cs is not None and keys(cg) == keys(cs) and len(keys(cs)) == 3,
               "drt-niah: a cell's keys are the same alone and in a grid", f"{cg and keys(cg)} vs {cs and keys(cs)}")
        all_keys = [r["key"] for c in g["cells"] for r in c.get("records", [])]
        expect(len(set(all_keys)) == len(all_keys) == 12, "drt-niah: the grid's 12 trials have 12 keys",
               str(all_keys))
        for k, v in (("seed", 1), ("device", "cpu"), ("precision", "fp32"), ("threads", 1),
                     ("max_new_tokens", 6), ("key_stream", "per_cell"), ("complete", True)):
            expect(s.get(k) == v, f"drt-niah JSON records {k} = {v!r}", str(s.get(k)))
        r = (cs.get("records") or [{}])[0]
        expect(set(r) >= {"key", "answer", "answered", "correct", "needle_offset"}
               and r["correct"] == (r["answered"] == r["key"]) and cs["correct"] == sum(x["correct"] for x in cs.get("records", [])),
               "drt-niah JSON: per-trial records, correct = first number equals the key", str(r))
        c2 = run(tools.niah, *common, "--lengths", "400", "--depths", "0.5", "--seed", "2", "--json", alone)
        expect(c2.returncode == 0 and keys(cell_of(load(alone), 400, 0.5)) != keys(cs),
               "drt-niah: another --seed gives other keys")

    # drt-niah-text: the (passkey, 2K, 0.5) cell alone and after other tasks and lengths.
    grid = os.path.join(tmp, "text_grid.json")
    alone = os.path.join(tmp, "text_alone.json")
    common = ["--model", MODEL, "--text", TEXT, "--trials", "2", "--threads", "1", "--depths", "0.5"]
    a = run(tools.niah_text, *common, "--tasks", "keyed,passkey", "--lengths", "1K,2K", "--json", grid)
    b = run(tools.niah_text, *common, "--tasks", "passkey", "--lengths", "2K", "--json", alone)
    expect(a.returncode == 0 and b.returncode == 0, "drt-niah-text runs the grid and the cell", a.stderr + b.stderr)
    if a.returncode == 0 and b.returncode == 0:
        g, s = load(grid), load(alone)
        cg, cs = cell_of(g, 2048, 0.5, "passkey"), cell_of(s, 2048, 0.5, "passkey")
        trial = lambda c: (c.get("text_start"), [(r["key"], r["needle_offset"]) for r in c.get("records", [])])
        expect(cg is not None and cs is not None and trial(cg) == trial(cs),
               "drt-niah-text: a cell's text start, keys and needle places are the same alone and in a grid",
               f"{cg and trial(cg)} vs {cs and trial(cs)}")
        starts = {c.get("text_start") for c in g["cells"]}
        expect(len(starts) == 4, "drt-niah-text: the grid's four cells start at four places", str(starts))
        for k, v in (("seed", 1), ("device", "cpu"), ("precision", "fp32"), ("threads", 1),
                     ("max_new_tokens", 8), ("key_stream", "per_cell"), ("complete", True)):
            expect(s.get(k) == v, f"drt-niah-text JSON records {k} = {v!r}", str(s.get(k)))
        # The table reads the new files; a grid and a cell of one setting merge
        # only where their cells differ (here they overlap: refused by name).
        t = subprocess.run([sys.executable, TABLE, grid], capture_output=True, text=True)
        expect(t.returncode == 0 and "| passkey | 2,048 |" in t.stdout, "niah_text_table.py reads a new file",
               t.stderr)
        t = subprocess.run([sys.executable, TABLE, grid, alone], capture_output=True, text=True)
        expect(t.returncode != 0 and "already read" in t.stderr, "niah_text_table.py: the same cell twice is refused",
               t.stderr)
        old = os.path.join(REPO, "docs", "niah", "text_cpu_hb_256k.json")
        t = subprocess.run([sys.executable, TABLE, old], capture_output=True, text=True)
        expect(t.returncode == 0 and "| passkey |" in t.stdout, "niah_text_table.py still reads an old file", t.stderr)
        t = subprocess.run([sys.executable, TABLE, old, grid], capture_output=True, text=True)
        expect(t.returncode != 0 and "key_stream" in t.stderr,
               "niah_text_table.py refuses to merge an old-stream file with a new one, naming key_stream", t.stderr)


def bench_defaults(tools, tmp):
    """drt-bench and drt-step-bench: the default --model exists after a plain
    build (it was build/models/drt-random-gpt2, which only run_main.sh
    makes), a missing one says how to make the random model, and drt-bench's
    result has threads, cuda_precision only on CUDA, and --json."""
    small = ["--prompt_tokens", "300", "--generate", "2", "--threads", "1", "--warmup_tokens", "0"]
    out = os.path.join(tmp, "bench.json")
    done = subprocess.run([tools.bench, *small, "--json", out], capture_output=True, text=True, cwd=REPO, timeout=120)
    line = next((l for l in done.stdout.splitlines() if l.startswith("bench_result ")), "")
    fields = dict(kv.split("=", 1) for kv in line.split()[1:])
    expect(done.returncode == 0 and fields.get("device") == "cpu", "drt-bench runs with its default --model",
           done.stderr[-400:])
    expect(fields.get("threads") == "1" and "cuda_precision" not in fields,
           "drt-bench's bench_result has threads=1 and no cuda_precision on the CPU", line)
    if os.path.exists(out):
        data = load(out)
        expect(data.get("model") == "models/drt-text-byte" and data.get("context_tokens") == 300
               and data.get("threads") == 1 and data.get("device") == "cpu"
               and all(str(data[k]) == v or data[k] == float(v) for k, v in fields.items()),
               "drt-bench --json holds bench_result's fields, numbers as numbers", str(data))
    else:
        expect(False, "drt-bench --json writes its file", done.stderr[-400:])
    refused(tools.bench, ["--json", os.path.join(tmp, "no", "b.json")], ["--json", "cannot write"],
            "drt-bench --json in a missing folder is refused before the run")
    done = subprocess.run([tools.step_bench, "--sessions", "1", "--prompt_tokens", "8", "--generate", "1",
                           "--repeats", "1", "--threads", "1"], capture_output=True, text=True, cwd=REPO, timeout=120)
    expect(done.returncode == 0, "drt-step-bench runs with its default --model", done.stderr[-400:])
    for name, binary in (("drt-bench", tools.bench), ("drt-step-bench", tools.step_bench)):
        done = subprocess.run([binary, "--threads", "1"], capture_output=True, text=True, cwd=tmp, timeout=60)
        expect(done.returncode == 1 and "does not exist" in done.stderr and "make_random_model.py" in done.stderr
               and "relative to the working directory" in done.stderr,
               f"{name} without a model says how to make one", done.stderr[-400:])


def model_folder_checks(tools, tmp):
    """--json inside the --model folder (over its config.json) is refused
    before the run by every tool that writes one, the model kept
    (review-toolsbranch 1: drt-niah replaced config.json and the next run
    failed)."""
    import shutil
    copy = os.path.join(tmp, "model-copy")
    shutil.copytree(MODEL, copy)
    config = os.path.join(copy, "config.json")
    with open(config, "rb") as f:
        before = f.read()
    small = ["--lengths", "1K", "--depths", "0.5", "--trials", "1", "--threads", "1"]
    for name, binary, extra in (("drt-niah", tools.niah, small),
                                ("drt-niah-text", tools.niah_text, ["--text", TEXT, "--tasks", "passkey", *small]),
                                ("drt-ppl", tools.ppl, ["--text", TEXT, "--threads", "1"]),
                                ("drt-bench", tools.bench, ["--prompt_tokens", "8", "--generate", "2", "--threads", "1"])):
        for out in (config, os.path.join(copy, "result.json")):
            done = run(binary, "--model", copy, *extra, "--json", out)
            with open(config, "rb") as f:
                kept = f.read() == before
            expect(done.returncode == 1 and "--json" in done.stderr and "--model" in done.stderr and kept
                   and not os.path.exists(os.path.join(copy, "result.json")),
                   f"{name} --json {os.path.relpath(out, tmp)} (inside --model) is refused, the model kept",
                   f"rc {done.returncode}: {done.stderr.strip()[-300:]}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("niah", "niah_text", "ppl", "bench", "step_bench"):
        p.add_argument("--" + name, required=True)
    tools = p.parse_args()
    for name in ("niah", "niah_text", "ppl", "bench", "step_bench"):  # some runs change the cwd
        setattr(tools, name, os.path.abspath(getattr(tools, name)))
    with tempfile.TemporaryDirectory() as tmp:
        json_checks(tools, tmp)
        model_folder_checks(tools, tmp)
        flag_checks(tools, tmp)
        seeded_cells(tools, tmp)
        bench_defaults(tools, tmp)
    if FAILED:
        print(f"{len(FAILED)} FAILED")
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Markdown table of drt-niah-text JSON results (docs/passkey_accuracy.md).

    python3 bench/niah_text_table.py docs/niah/text_old_*.json

One row per (task, length), one column per depth; cells from several files
are merged (a (task, length, depth) present twice is an error).

Only files of one run setting are merged: every field a file records about
its run (model, text, text_bytes, pad_to_chunk_boundary, seed: all but
"cells") must be the same in each, else the table is refused with an error
naming both files and the field (review-tools #11: it merged cells of
different models or seeds into one table without a word). Files that
differ only in their tasks, lengths, depths or trials (separate commands of
one setting, as docs/passkey_accuracy.md runs them) are merged, and the
setting and the files are printed on stderr, so that the table on stdout
stays pasteable.

Files with "key_stream": "per_cell" (drt-niah-text since review-tools
2026-11-25 #4) draw each cell's haystacks from (seed, task, length, depth)
alone, so their cells can be merged and compared across commands. Older files
(no key_stream) drew one stream through the whole command: their cells are
comparable only within one identical command, and a table does not merge
them with per-cell files (refused, naming key_stream). A file whose run did
not finish ("complete": false, written after each cell) is merged with a
note on stderr.
"""
import json
import sys
from collections import defaultdict

ABSENT = "(absent)"


# Fields that say how far a run got, not how it ran, and the thread count,
# which changes the seconds only (the answers were byte-identical at 1 and
# 2 threads: docs/passkey_accuracy.md, "These rows are not the table above's
# cells").
NOT_SETTING = ("cells", "complete", "threads")


def run_setting(data):
    """What a result file records about its run: every field but the cells
    and whether the run finished."""
    return {k: v for k, v in data.items() if k not in NOT_SETTING}


CELL_FIELDS = ("task", "length", "depth", "trials", "correct", "seconds")


def check_result_file(path, data):
    """Exits naming the file and what is missing unless `data` is a
    drt-niah-text result: an object whose "cells" each have CELL_FIELDS.
    A drt-niah (passkey) result file, such as docs/niah/16m_pad_model.json,
    has cells without "task" and stopped the table with a KeyError."""
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        sys.exit(f"niah_text_table: {path} is not a drt-niah-text result file (no \"cells\" list)")
    for i, c in enumerate(data["cells"]):
        missing = [k for k in CELL_FIELDS if not isinstance(c, dict) or k not in c]
        if missing:
            sys.exit(f"niah_text_table: {path} is not a drt-niah-text result file: cell {i} has no "
                     + ", ".join(repr(k) for k in missing)
                     + " (drt-niah's passkey files have no 'task'; this table is for drt-niah-text's)")


def main(paths):
    if not paths:
        sys.exit("usage: python3 bench/niah_text_table.py RESULT.json ...")
    cells = {}
    first_path, first = None, None
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        check_result_file(path, data)
        setting = run_setting(data)
        if first is None:
            first_path, first = path, setting
        if data.get("complete") is False:
            print(f"niah_text_table: note: {path} is from a run that did not finish; its finished cells "
                  "are used", file=sys.stderr)
        # The random stream first: it decides whether cells compare at all.
        if first.get("key_stream", ABSENT) != setting.get("key_stream", ABSENT):
            sys.exit(f"niah_text_table: {path} and {first_path} are not of one run setting: key_stream is "
                     f"{setting.get('key_stream', ABSENT)!r} in {path} and {first.get('key_stream', ABSENT)!r} in "
                     f"{first_path}; files of the old whole-command stream (absent) and of the per-cell stream "
                     "draw different haystacks for the same cell")
        for key in sorted(set(first) | set(setting)):
            if first.get(key, ABSENT) != setting.get(key, ABSENT):
                sys.exit(f"niah_text_table: {path} and {first_path} are not of one run setting: {key} is "
                         f"{setting.get(key, ABSENT)!r} in {path} and {first.get(key, ABSENT)!r} in {first_path}; "
                         "a table merges only files of one model, text and seed")
        for c in data["cells"]:
            key = (c["task"], c["length"], round(c["depth"], 4))
            if key in cells:
                sys.exit(f"{path}: {key} already read from another file")
            cells[key] = c
    print(f"niah_text_table: {len(paths)} file{'s' if len(paths) != 1 else ''} of one setting ("
          + ", ".join(f"{k}={v}" for k, v in sorted(first.items())) + "): " + ", ".join(paths), file=sys.stderr)
    depths = sorted({k[2] for k in cells})
    rows = defaultdict(dict)
    for (task, length, depth), c in cells.items():
        rows[(task, length)][depth] = c
    order = ["passkey", "passkey_varied", "keyed", "two_hop"]
    print("| task | length | trials per cell | " + " | ".join(f"depth {d:g}" for d in depths) + " | all | seconds |")
    print("|---" * (len(depths) + 5) + "|")
    for task, length in sorted(rows, key=lambda k: (order.index(k[0]) if k[0] in order else 9, k[1])):
        r = rows[(task, length)]
        trials = sorted({c["trials"] for c in r.values()})
        right = sum(c["correct"] for c in r.values())
        total = sum(c["trials"] for c in r.values())
        cols = [f"{100 * r[d]['correct'] / r[d]['trials']:.0f}%" if d in r else "" for d in depths]
        print(f"| {task} | {length:,} | {'/'.join(map(str, trials))} | " + " | ".join(cols) +
              f" | {100 * right / total:.1f}% ({right}/{total}) | {sum(c['seconds'] for c in r.values()):.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])

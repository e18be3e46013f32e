"""Markdown table of drt-niah-text JSON results (docs/passkey_accuracy.md).

    python3 bench/niah_text_table.py docs/niah/text_old_*.json
One row per (task, length), one column per depth; cells from several files
are merged (a (task, length, depth) present twice is an error).
"""
import json
import sys
from collections import defaultdict


def main(paths):
    cells = {}
    for path in paths:
        with open(path) as f:
            for c in json.load(f)["cells"]:
                key = (c["task"], c["length"], round(c["depth"], 4))
                if key in cells:
                    sys.exit(f"{path}: {key} already read from another file")
                cells[key] = c
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

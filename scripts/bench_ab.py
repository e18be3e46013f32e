"""Compares drt-bench runs of scripts/gpu_bench.sh's BENCH_RESULTS file.

    python3 scripts/bench_ab.py bench_results.txt

Each line is "drt-bench ARGS: bench_result key=value ...". Runs are grouped
by context, GCA or base LM (disable_gca) and the variant (the CUDA options
the line reports); the variant with every option at its default is A. For
each group it prints every run's decode ms/token and prefill tokens/s, their
medians, and each other variant's median ratio to A at the same context and
model (scripts/gpu_stage.sh stage 3 runs them A B A B, so the spread between
one variant's runs shows the machine's drift).
"""
import statistics
import sys

# The options that make a variant, with their defaults (drt-bench's).
VARIANT_KEYS = {
    "cuda_precision": "bf16",
    "window_decode_splits": "0",
    "prefill_tensor_cores": "0",
    "decode_graphs": "0",
    "decode_fused_gemv": "0",
    "batched_step_rows": "0",
    "cuda_chunk_store": "kv",
    "chunk_tier": "host",
    # drt-bench's untimed warm-up session (--warmup_tokens): on by default;
    # lines from before it existed lack the key and were timed cold.
    "warmup": "1",
}
# What a key missing from a line means (it predates the key), where that is
# not the default.
MISSING = {"warmup": "0"}


def parse(path):
    runs = []
    with open(path) as f:
        for line in f:
            if "bench_result " not in line:
                continue
            fields = dict(part.split("=", 1) for part in
                          line.split("bench_result ", 1)[1].split() if "=" in part)
            runs.append(fields)
    return runs


# drt-bench's default --warmup_tokens; a line's warmup_tokens is the count
# it warmed up on, min(--warmup_tokens, context_tokens).
DEFAULT_WARMUP_TOKENS = 4096


def variant(fields):
    value = lambda k, d: fields.get(k, MISSING.get(k, d))
    changed = [f"{k}={value(k, d)}" for k, d in VARIANT_KEYS.items() if value(k, d) != d]
    # A warm-up of another length is a variant of its own (review-toolsfix3
    # #8: --warmup_tokens 70 and the default fell into one group); a line
    # without warmup_tokens predates the flag and had the default or none.
    if value("warmup", "1") != "0" and "warmup_tokens" in fields:
        default = min(DEFAULT_WARMUP_TOKENS, int(fields.get("context_tokens", DEFAULT_WARMUP_TOKENS)))
        if int(fields["warmup_tokens"]) != default:
            changed.append(f"warmup_tokens={fields['warmup_tokens']}")
    return " ".join(changed) if changed else "A (defaults)"


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python3 scripts/bench_ab.py BENCH_RESULTS", file=sys.stderr)
        return 2
    runs = parse(argv[1])
    if not runs:
        print(f"bench_ab: no bench_result lines in {argv[1]}", file=sys.stderr)
        return 1
    groups = {}
    for r in runs:
        key = (int(r.get("context_tokens", 0)), r.get("disable_gca", "0"), variant(r))
        groups.setdefault(key, []).append(r)

    def medians(rs):
        decode = [float(r["decode_ms_median"]) for r in rs if "decode_ms_median" in r]
        prefill = [float(r["prefill_tokens_per_s"]) for r in rs if "prefill_tokens_per_s" in r]
        return decode, prefill

    print("| context | model | variant | decode ms (runs) | decode median | x A | "
          "prefill tok/s (runs) | prefill median | x A | host MiB | h2d B/token |")
    print("|---:|---|---|---|---:|---:|---|---:|---:|---:|---:|")
    for (ctx, base, name), rs in sorted(groups.items()):
        decode, prefill = medians(rs)
        a_decode, a_prefill = medians(groups.get((ctx, base, "A (defaults)"), []))
        d_med = statistics.median(decode) if decode else float("nan")
        p_med = statistics.median(prefill) if prefill else float("nan")
        d_x = d_med / statistics.median(a_decode) if a_decode else float("nan")
        p_x = p_med / statistics.median(a_prefill) if a_prefill else float("nan")
        host = statistics.median(float(r.get("session_host_bytes", 0)) for r in rs) / 2**20
        h2d = statistics.median(float(r.get("h2d_bytes_per_token", 0)) for r in rs)
        print(f"| {ctx} | {'base LM' if base == '1' else 'GCA'} | {name} | "
              f"{', '.join(f'{x:.3f}' for x in decode)} | {d_med:.3f} | {d_x:.3f} | "
              f"{', '.join(f'{x:.0f}' for x in prefill)} | {p_med:.0f} | {p_x:.3f} | "
              f"{host:.1f} | {h2d:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

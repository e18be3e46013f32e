#!/usr/bin/env python3
"""Decode time per token and GPU memory of the peer a user would otherwise
pick: a full-attention Llama-style Transformer of DRT's size with a KV cache
(issue 10, deliver 5; docs/cuda.md, "Timings").

The default shape is the paper's 128M configuration without its encoder and
GCA (tests/fixtures/reference_configs/drt-config_63.json: 12 layers, d 768,
12 heads, MLP 2048, vocabulary 50265), random bf16 weights. The decode step
runs scaled-dot-product attention over a static KV cache of context + tokens
rows (the rows past the current position masked), captured once in a CUDA
graph and replayed per token, so the host issues one launch per token. The
cache is filled with random rows instead of a prefill: decode time depends
on the cache's size, not on its contents.

A context whose weights + cache + workspace do not fit in the free GPU
memory is reported as "does not fit" (checked before allocating, and any
out-of-memory error is caught and reported the same way).

Run on the GPU machine with its own torch, e.g.
  python3 bench/full_attention_peer.py --contexts 16384,131072,1048576,2097152
`--device cpu --no_graph` with a tiny shape checks the script without a GPU.
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# torch >= 1.13 names the CUDA allocator's failure; older ones raise a RuntimeError.
OUT_OF_MEMORY = getattr(torch.cuda, "OutOfMemoryError", MemoryError)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="16384,131072,1048576,2097152,4194304",
                   help="comma-separated context lengths (tokens already in the cache)")
    p.add_argument("--tokens", type=int, default=64, help="decode steps timed per context")
    p.add_argument("--warmup", type=int, default=8, help="untimed decode steps first")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=50265)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--no_graph", action="store_true", help="run the step eagerly (CPU checks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--self_check", type=int, default=0, metavar="N",
                   help="first decode N tokens from an empty cache and compare the last logits "
                        "with a full causal forward over the same tokens (--dtype fp32 only)")
    args = p.parse_args(argv)
    args.contexts = [int(c) for c in args.contexts.split(",") if c]
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    if args.self_check and args.dtype != "fp32":
        p.error("--self_check compares at fp32 rounding: use it with --dtype fp32")
    if args.self_check < 0:
        p.error("--self_check must not be negative")
    if any(c < 1 for c in args.contexts) or args.tokens < 1 or args.warmup < 0:
        p.error("contexts and --tokens must be positive, --warmup not negative")
    return args


class Weights:
    """Random weights of a pre-norm Llama decoder (no biases, tied lm_head)."""

    def __init__(self, a, dtype, device):
        g = torch.Generator(device="cpu").manual_seed(a.seed)
        d, f = a.hidden, a.intermediate

        def rand(*shape):
            w = torch.randn(*shape, generator=g) / math.sqrt(shape[-1])
            return w.to(device=device, dtype=dtype)

        self.embed = rand(a.vocab, d)
        self.layers = []
        for _ in range(a.layers):
            self.layers.append({
                "qkv": rand(3 * d, d), "o": rand(d, d),
                "gate_up": rand(2 * f, d), "down": rand(d, f),
                "norm1": torch.ones(d, device=device, dtype=dtype),
                "norm2": torch.ones(d, device=device, dtype=dtype),
            })
        self.norm = torch.ones(d, device=device, dtype=dtype)

    def bytes(self):
        tensors = [self.embed, self.norm] + [t for layer in self.layers for t in layer.values()]
        return sum(t.numel() * t.element_size() for t in tensors)


def rms_norm(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def attention(q, k, v, mask):
    """q [1, H, 1, dh]; k, v [1, H, T, dh]; mask [T] bool (True = attend)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.view(1, 1, 1, -1))
    # torch < 2.0 (the CPU check only): the same product written out.
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask.view(1, 1, 1, -1), float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


class DecodeStep:
    """One token through the model, reading and extending a static KV cache.

    All inputs live in fixed tensors (token, position), so that the step can
    be captured once and replayed: the position selects the cache row to
    write and masks the rows not yet written."""

    def __init__(self, weights, a, max_len, dtype, device):
        self.w, self.a = weights, a
        H, dh = a.heads, a.hidden // a.heads
        shape = (a.layers, 2, 1, H, max_len, dh)
        self.cache = torch.randn(shape, device=device, dtype=dtype)
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.rows = torch.arange(max_len, device=device)
        self.logits = None

    def __call__(self):
        a, w = self.a, self.w
        H, dh = a.heads, a.hidden // a.heads
        mask = self.rows <= self.position
        x = w.embed[self.token].view(1, a.hidden)
        for i, layer in enumerate(w.layers):
            q, k, v = (rms_norm(x, layer["norm1"]) @ layer["qkv"].t()).split(a.hidden, -1)
            self.cache[i, 0].index_copy_(2, self.position, k.view(1, H, 1, dh))
            self.cache[i, 1].index_copy_(2, self.position, v.view(1, H, 1, dh))
            o = attention(q.view(1, H, 1, dh), self.cache[i, 0], self.cache[i, 1], mask)
            x = x + o.reshape(1, a.hidden) @ layer["o"].t()
            gate, up = (rms_norm(x, layer["norm2"]) @ layer["gate_up"].t()).split(a.intermediate, -1)
            x = x + (F.silu(gate) * up) @ layer["down"].t()
        self.logits = rms_norm(x, w.norm) @ w.embed.t()
        self.token.copy_(self.logits.argmax(-1))
        self.position.add_(1)
        return self.logits


def full_forward_logits(w, a, tokens):
    """Logits of the last token of `tokens` by a causal forward over all of
    them at once, with no cache: the independent expectation of --self_check."""
    H, dh, n = a.heads, a.hidden // a.heads, tokens.numel()
    x = w.embed[tokens]
    causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
    for layer in w.layers:
        q, k, v = (rms_norm(x, layer["norm1"]) @ layer["qkv"].t()).split(a.hidden, -1)
        q, k, v = (t.view(n, H, dh).transpose(0, 1).float() for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(dh)
        o = torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ v
        x = x + o.transpose(0, 1).reshape(n, a.hidden).to(x.dtype) @ layer["o"].t()
        gate, up = (rms_norm(x, layer["norm2"]) @ layer["gate_up"].t()).split(a.intermediate, -1)
        x = x + (F.silu(gate) * up) @ layer["down"].t()
    return (rms_norm(x, w.norm) @ w.embed.t())[-1]


def self_check(a, weights, dtype, device):
    """Greedy-decodes a.self_check tokens through DecodeStep (eagerly) from an
    empty cache, then compares its last logits with full_forward_logits over
    the tokens it fed itself. Returns the worst relative difference."""
    n = a.self_check
    step = DecodeStep(weights, a, n, dtype, device)
    fed = []
    for _ in range(n):
        fed.append(int(step.token.item()))
        step()
    expected = full_forward_logits(weights, a, torch.tensor(fed, device=device))
    got = step.logits.view(-1).float()
    return float((got - expected.float()).abs().max() / expected.float().abs().max())


def cache_bytes(a, max_len, dtype):
    return 2 * a.layers * max_len * a.hidden * torch.tensor([], dtype=dtype).element_size()


def measure(a, weights, context, dtype, device):
    """Median ms per decode token at `context` tokens of cache, and memory."""
    max_len = context + a.warmup + a.tokens
    need = cache_bytes(a, max_len, dtype)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # The step's workspace (scores over the cache, logits) is small beside
        # the cache; 5% of it plus 512 MiB is kept aside for it.
        if need * 1.05 + (512 << 20) > free:
            return {"context": context, "fits": False, "kv_cache_gib": need / 2**30,
                    "free_gib": free / 2**30}
        torch.cuda.reset_peak_memory_stats(device)
    try:
        step = DecodeStep(weights, a, max_len, dtype, device)
        step.position.fill_(context)
        run = step
        if not a.no_graph:
            s = torch.cuda.Stream(device)
            s.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(s):
                for _ in range(2):  # warm cuBLAS / SDPA before capture
                    step()
            torch.cuda.current_stream(device).wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            run = graph.replay
        step.position.fill_(context)
        for _ in range(a.warmup):
            run()
        times = []
        for _ in range(a.tokens):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                run()
                times.append((time.perf_counter() - t0) * 1e3)
        final_position = int(step.position.item())
        if final_position != context + a.warmup + a.tokens:
            raise RuntimeError(f"position {final_position} after the run: the step did not advance")
        out = {"context": context, "fits": True, "ms_per_token": statistics.median(times),
               "ms_min": min(times), "ms_max": max(times), "kv_cache_gib": need / 2**30,
               "finite_logits": bool(torch.isfinite(step.logits.float()).all())}
        if device.type == "cuda":
            out["peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        del step
        return out
    except OUT_OF_MEMORY:
        return {"context": context, "fits": False, "kv_cache_gib": need / 2**30, "oom": True}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main(argv):
    a = parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("full_attention_peer: no CUDA device (use --device cpu --no_graph to check the script)",
              file=sys.stderr)
        return 2
    if device.type != "cuda":
        a.no_graph = True
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.manual_seed(a.seed)
    with torch.no_grad():
        weights = Weights(a, dtype, device)
        print(f"# full-attention peer: {a.layers} layers, d {a.hidden}, {a.heads} heads, "
              f"MLP {a.intermediate}, vocab {a.vocab}, {a.dtype}, "
              f"weights {weights.bytes() / 2**20:.1f} MiB, "
              f"{'CUDA graph' if not a.no_graph else 'eager'}, {a.tokens} tokens timed"
              + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""))
        if a.self_check:
            diff = self_check(a, weights, dtype, device)
            print(f"# self check: {a.self_check} cached decode steps vs a full causal forward, "
                  f"worst |difference| / max |logit| = {diff:.2e}")
            # The two orders of summation differ by fp32 rounding only: measured
            # 3.5e-7 on the CPU check (2 layers, d 64, 20 steps).
            if diff > 1e-4:
                print("full_attention_peer: the cached decode step does not match the full forward",
                      file=sys.stderr)
                return 1
        print("| context | ms/token (median) | KV cache GiB | peak GPU GiB |")
        print("|---|---|---|---|")
        for context in a.contexts:
            r = measure(a, weights, context, dtype, device)
            if not r["fits"]:
                print(f"| {context} | does not fit | {r['kv_cache_gib']:.2f} | |")
            else:
                if not r["finite_logits"]:
                    print(f"full_attention_peer: non-finite logits at context {context}", file=sys.stderr)
                    return 1
                peak = f"{r['peak_gpu_gib']:.2f}" if "peak_gpu_gib" in r else ""
                print(f"| {context} | {r['ms_per_token']:.3f} | {r['kv_cache_gib']:.2f} | {peak} |")
            print("json " + json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

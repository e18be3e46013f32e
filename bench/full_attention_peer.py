#!/usr/bin/env python3
"""Decode time per token and GPU memory of the peer a user would otherwise
pick: a full-attention Llama-style Transformer of DRT's size with a KV cache
(issue 10, deliver 5; docs/cuda.md, "Timings").

The default shape is the paper's 128M configuration without its encoder and
GCA (tests/fixtures/reference_configs/drt-config_63.json: 12 layers, d 768,
12 heads, MLP 2048, vocabulary 50265), random bf16 weights. The cache is
filled with random rows instead of a prefill: decode time depends on the
cache's size, not on its contents. Two ways to run the attention, and by
default (--attention both) each context is timed both ways and the faster is
marked as the peer (review-toolsfix #2: the eager sliced step pays about 170
kernel launches and a sync per token, which dominates at short contexts;
the masked graph is one launch but without FlashAttention, which loses at
long ones; a user's peer has both):

  sliced (the default): each step calls scaled-dot-product attention on the
    cache rows written so far (a view of the first position + 1 rows) with
    no mask. For one query row, attending to every written row is exactly
    causal attention, and without a mask SDPA may use its FlashAttention
    kernel (bf16/fp16); the script asks for FlashAttention alone first and
    says which backend ran (--sdpa_backend). The KV length changes every
    token, so this runs eagerly, without a CUDA graph.
  masked_graph: SDPA over the whole static cache with a boolean mask for the
    unwritten rows, captured once in a CUDA graph and replayed per token (one
    launch per token). A boolean mask rules out FlashAttention: SDPA falls
    back to its memory-efficient or math kernel, which do not split the KV
    length the way flash-decoding does, so at long contexts this is a weaker
    peer (review-tools 2026-11-24 #10). Kept for comparison.

Beside each ms/token it prints the floor of a decode step on this GPU: the
weights and the KV rows read once at the device-to-device copy bandwidth it
measures, and the ratio to it; a peer far above its floor (more than 3x) is
flagged, since it may not be the peer a user would pick.

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
    p.add_argument("--attention", choices=["both", "sliced", "masked_graph"], default="both",
                   help="sliced: SDPA on the written rows, no mask (FlashAttention allowed), eager; "
                        "masked_graph: SDPA over the static cache with a mask, in a CUDA graph; "
                        "both: each context both ways, the faster marked as the peer")
    p.add_argument("--sdpa_backend", choices=["auto", "flash", "any"], default="auto",
                   help="sliced on CUDA: auto tries FlashAttention alone and falls back to any "
                        "backend (saying so); flash fails if FlashAttention cannot run; any does not ask")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--self_check", type=int, default=0, metavar="N",
                   help="first decode N tokens from an empty cache and compare the last logits "
                        "with a full causal forward over the same tokens (--dtype fp32 only)")
    args = p.parse_args(argv)
    args.modes = ["sliced", "masked_graph"] if args.attention == "both" else [args.attention]
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


def attention(q, k, v, mask=None):
    """q [1, H, 1, dh]; k, v [1, H, T, dh]; mask [T] bool (True = attend), or
    None: every row of k and v (for a single query row at the last position,
    that is causal attention, and SDPA may then use FlashAttention)."""
    if hasattr(F, "scaled_dot_product_attention"):
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.view(1, 1, 1, -1))
    # torch < 2.0 (the CPU check only): the same product written out.
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask.view(1, 1, 1, -1), float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


def flash_only():
    """A context manager under which SDPA may use its FlashAttention kernel
    only (it raises when that kernel cannot run), or None when this torch has
    no way to ask. A new one per use: they may be single-use."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # torch >= 2.3
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:
        pass
    sdp_kernel = getattr(torch.backends.cuda, "sdp_kernel", None)  # torch 2.0 - 2.2
    if sdp_kernel is not None:
        return sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)
    return None


class DecodeStep:
    """One token through the model, reading and extending a static KV cache.

    Masked (sliced=False): all inputs live in fixed tensors (token,
    position), so that the step can be captured once and replayed: the
    position selects the cache row to write and masks the rows not yet
    written. Sliced: the host also keeps the position (self.length), and
    attention reads a view of the rows written so far, with no mask; the
    shapes change every token, so it cannot be captured."""

    def __init__(self, weights, a, max_len, dtype, device, sliced=False):
        self.w, self.a, self.sliced = weights, a, sliced
        H, dh = a.heads, a.hidden // a.heads
        shape = (a.layers, 2, 1, H, max_len, dh)
        self.cache = torch.randn(shape, device=device, dtype=dtype)
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.length = 0  # == position, on the host (sliced)
        self.rows = torch.arange(max_len, device=device)
        self.logits = None

    def seek(self, position):
        """The next step writes cache row `position` and reads rows 0..position."""
        self.position.fill_(position)
        self.length = position

    def __call__(self):
        a, w = self.a, self.w
        H, dh = a.heads, a.hidden // a.heads
        mask = None if self.sliced else self.rows <= self.position
        rows = self.length + 1  # rows written once this step's k, v are in (sliced)
        x = w.embed[self.token].view(1, a.hidden)
        for i, layer in enumerate(w.layers):
            q, k, v = (rms_norm(x, layer["norm1"]) @ layer["qkv"].t()).split(a.hidden, -1)
            self.cache[i, 0].index_copy_(2, self.position, k.view(1, H, 1, dh))
            self.cache[i, 1].index_copy_(2, self.position, v.view(1, H, 1, dh))
            keys, values = self.cache[i, 0], self.cache[i, 1]
            if self.sliced:
                keys, values = keys[:, :, :rows], values[:, :, :rows]
            o = attention(q.view(1, H, 1, dh), keys, values, mask)
            x = x + o.reshape(1, a.hidden) @ layer["o"].t()
            gate, up = (rms_norm(x, layer["norm2"]) @ layer["gate_up"].t()).split(a.intermediate, -1)
            x = x + (F.silu(gate) * up) @ layer["down"].t()
        self.logits = rms_norm(x, w.norm) @ w.embed.t()
        self.token.copy_(self.logits.argmax(-1))
        self.position.add_(1)
        self.length += 1
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


def self_check(a, weights, dtype, device, mode):
    """Greedy-decodes a.self_check tokens through DecodeStep (eagerly, the
    attention of `mode`) from an empty cache, then compares its last logits
    with full_forward_logits over the tokens it fed itself. Returns the worst
    relative difference."""
    n = a.self_check
    step = DecodeStep(weights, a, n, dtype, device, sliced=mode == "sliced")
    fed = []
    for _ in range(n):
        fed.append(int(step.token.item()))
        step()
    expected = full_forward_logits(weights, a, torch.tensor(fed, device=device))
    got = step.logits.view(-1).float()
    return float((got - expected.float()).abs().max() / expected.float().abs().max())


def cache_bytes(a, max_len, dtype):
    return 2 * a.layers * max_len * a.hidden * torch.tensor([], dtype=dtype).element_size()


def copy_bandwidth(device, gib=1, runs=10):
    """Device memory bandwidth in bytes/s: the median of `runs` device-to-
    device copies of `gib` GiB (each reads and writes it: 2 x bytes)."""
    n = (gib << 30) // 4
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm up
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 4 / statistics.median(times)


def choose_sdpa_backend(a, step, context, device, mode):
    """For the sliced step on CUDA: whether SDPA runs with FlashAttention
    alone ("flash") or with whatever backend it picks ("any ..."), found by
    running one step under flash_only(). Raises if --sdpa_backend flash and
    FlashAttention cannot run."""
    if mode != "sliced" or device.type != "cuda" or a.sdpa_backend == "any":
        return "any (not restricted)"
    ctx = flash_only()
    if ctx is None:
        if a.sdpa_backend == "flash":
            raise RuntimeError("this torch cannot restrict SDPA to FlashAttention")
        return "any (this torch cannot restrict SDPA)"
    step.seek(context)
    try:
        with ctx:
            step()
        torch.cuda.synchronize(device)
        return "flash"
    except RuntimeError as e:
        if a.sdpa_backend == "flash":
            raise
        return "any (FlashAttention refused: " + str(e).strip().splitlines()[0][:120] + ")"


def measure(a, weights, context, dtype, device, mode, bandwidth=None):
    """Median ms per decode token at `context` tokens of cache, and memory,
    with the attention of `mode` (sliced or masked_graph)."""
    max_len = context + a.warmup + a.tokens
    need = cache_bytes(a, max_len, dtype)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # The step's workspace (scores over the cache, logits) is small beside
        # the cache; 5% of it plus 512 MiB is kept aside for it.
        if need * 1.05 + (512 << 20) > free:
            return {"context": context, "fits": False, "attention": mode, "kv_cache_gib": need / 2**30,
                    "free_gib": free / 2**30}
        torch.cuda.reset_peak_memory_stats(device)
    sliced = mode == "sliced"
    try:
        step = DecodeStep(weights, a, max_len, dtype, device, sliced=sliced)
        backend = choose_sdpa_backend(a, step, context, device, mode)
        step.seek(context)
        run = step
        graph = not a.no_graph and not sliced
        if graph:
            s = torch.cuda.Stream(device)
            s.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(s):
                for _ in range(2):  # warm cuBLAS / SDPA before capture
                    step()
            torch.cuda.current_stream(device).wait_stream(s)
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                step()
            run = cuda_graph.replay
            # The host copy of the position is not advanced by replays: only
            # the sliced step reads it.
        step.seek(context)

        def timed_steps():
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
            return times

        if backend == "flash":
            with flash_only():
                times = timed_steps()
        else:
            times = timed_steps()
        final_position = int(step.position.item())
        if final_position != context + a.warmup + a.tokens:
            raise RuntimeError(f"position {final_position} after the run: the step did not advance")
        out = {"context": context, "fits": True, "attention": mode, "sdpa_backend": backend,
               "cuda_graph": graph, "ms_per_token": statistics.median(times),
               "ms_min": min(times), "ms_max": max(times), "kv_cache_gib": need / 2**30,
               "finite_logits": bool(torch.isfinite(step.logits.float()).all())}
        if bandwidth:
            # A decode step reads every weight and every written KV row once
            # (at the median step, context + warmup + tokens / 2 rows).
            rows = context + a.warmup + a.tokens // 2
            floor_bytes = weights.bytes() + cache_bytes(a, rows, dtype)
            out["floor_ms"] = floor_bytes / bandwidth * 1e3
            out["x_floor"] = out["ms_per_token"] / out["floor_ms"]
        if device.type == "cuda":
            out["peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        del step
        return out
    except OUT_OF_MEMORY:
        return {"context": context, "fits": False, "attention": mode, "kv_cache_gib": need / 2**30,
                "oom": True}
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
              f"attention {' and '.join(a.modes)} (sliced eager, masked_graph "
              f"{'in a CUDA graph' if not a.no_graph else 'eager here'}), "
              f"{a.tokens} tokens timed"
              + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""))
        for mode in a.modes if a.self_check else []:
            diff = self_check(a, weights, dtype, device, mode)
            print(f"# self check ({mode}): {a.self_check} cached decode steps vs a full causal forward, "
                  f"worst |difference| / max |logit| = {diff:.2e}")
            # The two orders of summation differ by fp32 rounding only: measured
            # 3.5e-7 on the CPU check (2 layers, d 64, 20 steps).
            if diff > 1e-4:
                print(f"full_attention_peer: the cached decode step ({mode}) does not match the full "
                      "forward", file=sys.stderr)
                return 1
        bandwidth = copy_bandwidth(device) if device.type == "cuda" else None
        if bandwidth:
            print(f"# device-to-device copy bandwidth {bandwidth / 1e9:.0f} GB/s: the floor below is "
                  f"weights + KV rows read once at that rate")
        print("| context | attention | ms/token (median) | floor ms | x floor | KV cache GiB | peak GPU GiB "
              "| SDPA |")
        print("|---|---|---|---|---|---|---|---|")
        for context in a.contexts:
            results = [measure(a, weights, context, dtype, device, mode, bandwidth) for mode in a.modes]
            fitting = [r for r in results if r["fits"]]
            # The peer is the faster of the ways timed (marked only when there
            # are two to choose from).
            fastest = min(fitting, key=lambda r: r["ms_per_token"]) if fitting else None
            for r in results:
                r["peer"] = r is fastest
                label = r["attention"] + (" (peer: faster)" if r["peer"] and len(a.modes) > 1 else "")
                if not r["fits"]:
                    print(f"| {context} | {label} | does not fit | | | {r['kv_cache_gib']:.2f} | | |")
                else:
                    if not r["finite_logits"]:
                        print(f"full_attention_peer: non-finite logits at context {context}", file=sys.stderr)
                        return 1
                    peak = f"{r['peak_gpu_gib']:.2f}" if "peak_gpu_gib" in r else ""
                    floor = f"{r['floor_ms']:.3f}" if "floor_ms" in r else ""
                    ratio = f"{r['x_floor']:.1f}" if "x_floor" in r else ""
                    print(f"| {context} | {label} | {r['ms_per_token']:.3f} | {floor} | {ratio} "
                          f"| {r['kv_cache_gib']:.2f} | {peak} | {r['sdpa_backend']} |")
                print("json " + json.dumps(r), flush=True)
            if fastest is not None and fastest.get("x_floor", 0) > 3:
                print(f"# caveat: at context {context} the peer runs at {fastest['x_floor']:.1f}x its "
                      f"bandwidth floor ({fastest['sdpa_backend']}, {fastest['attention']}); a tuned peer "
                      f"(flash-decoding in a CUDA graph) may be faster", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

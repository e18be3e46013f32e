"""Self-check: the torch reference (drt_reference.py) against an independent,
loop-based numpy implementation of drt-model.md, plus safetensors_io and
export round-trips. Exit status 0 when everything matches.

    /usr/bin/python3 weights_tools/check_reference.py
    # also re-derive a fixture's golden data with the naive model (minutes):
    /usr/bin/python3 weights_tools/check_reference.py --fixture tests/fixtures/gqa_one_group
"""
import argparse
import math
import os
import sys
import tempfile

import numpy as np
import torch

import drt_config
import drt_reference
import safetensors_io


# ---------------------------------------------------------------- naive model

def rms(x, w, eps):
    return x / math.sqrt(float(np.mean(x * x)) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def mlp(W, p, x):
    gate = W[p + "mlp.gate_proj.weight"] @ x
    up = W[p + "mlp.up_proj.weight"] @ x
    return W[p + "mlp.down_proj.weight"] @ (silu(gate) * up)


def softmax(v):
    e = np.exp(v - np.max(v))
    return e / e.sum()


def decoder_attention(W, p, xs, cfg):
    """xs: list of normalised rows; returns o_proj(attention) per position."""
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    dh = cfg["hidden_size"] // H
    window = cfg["slide_window"]
    qs = [W[p + "self_attn.q_proj.weight"] @ x for x in xs]
    ks = [W[p + "self_attn.k_proj.weight"] @ x for x in xs]
    vs = [W[p + "self_attn.v_proj.weight"] @ x for x in xs]
    out = []
    for i in range(len(xs)):
        heads = []
        for h in range(H):
            slope = 1.0 / (2.0 ** (8.0 / H)) ** (h + 1)
            kv = h // (H // Hkv)
            q = qs[i][h * dh:(h + 1) * dh]
            js = list(range(max(0, i - window), i + 1))
            sc = np.array([q @ ks[j][kv * dh:(kv + 1) * dh] / math.sqrt(dh) - slope * (i - j) for j in js])
            pr = softmax(sc)
            heads.append(sum(pr[n] * vs[j][kv * dh:(kv + 1) * dh] for n, j in enumerate(js)))
        out.append(W[p + "self_attn.o_proj.weight"] @ np.concatenate(heads))
    return out


def rope_row(vec, pos, dh):
    out = vec.copy()
    half = dh // 2
    for i in range(half):
        ang = pos * 10000.0 ** (-2.0 * i / dh)
        a, b = vec[i], vec[i + half]
        out[i] = a * math.cos(ang) - b * math.sin(ang)
        out[i + half] = b * math.cos(ang) + a * math.sin(ang)
    return out


def encode_chunk(W, rows, cfg):
    H = cfg["num_attention_heads"]
    dh = cfg["hidden_size"] // H
    x = [rms(r, W["model.enc_prenorm.weight"], cfg["rms_norm_eps"]) for r in rows]
    for e in range(cfg["encoder_layers"]):
        p = f"model.encoder.layers.{e}."
        y = [rms(r, W[p + "input_layernorm.weight"], 1e-6) for r in x]
        q = [W[p + "self_attn.q_proj.weight"] @ r for r in y]
        k = [W[p + "self_attn.k_proj.weight"] @ r for r in y]
        v = [W[p + "self_attn.v_proj.weight"] @ r for r in y]
        new = []
        for i in range(len(x)):
            heads = []
            for h in range(H):
                sl = slice(h * dh, (h + 1) * dh)
                qi = rope_row(q[i][sl], i, dh)
                sc = np.array([qi @ rope_row(k[j][sl], j, dh) / math.sqrt(dh) for j in range(len(x))])
                pr = softmax(sc)
                heads.append(sum(pr[j] * v[j][sl] for j in range(len(x))))
            new.append(x[i] + W[p + "self_attn.o_proj.weight"] @ np.concatenate(heads))
        x = [r + mlp(W, p, rms(r, W[p + "post_attention_layernorm.weight"], 1e-6)) for r in new]
    return [rms(r, W["model.encoder.norm.weight"], 1e-6) for r in x]


def naive_forward(cfg, W, tokens):
    """Returns (logits at real positions [L, V], per group [(indices, weights)] per chunk)."""
    sp = cfg["enc_chunk_size"]
    S = sp + 1
    C = len(tokens) // sp
    d = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    dh = d // H
    eps = cfg["rms_norm_eps"]
    ids = []
    for c in range(C):
        ids += list(tokens[c * sp:(c + 1) * sp]) + [cfg["chunk_id"]]
    h = [W["model.embed_tokens.weight"][i].copy() for i in ids]

    def self_attn_block(p):
        xs = [rms(r, W[p + "input_layernorm.weight"], eps) for r in h]
        for i, o in enumerate(decoder_attention(W, p, xs, cfg)):
            h[i] = h[i] + o

    for i in range(cfg["decoder_layers"][0]):
        p = f"model.lower_layers.{i}."
        self_attn_block(p)
        for n in range(len(h)):
            h[n] = h[n] + mlp(W, p, rms(h[n], W[p + "post_attention_layernorm.weight"], eps))

    lmk, ck, cv = [], [], []
    for c in range(C):
        enc = encode_chunk(W, h[c * S:(c + 1) * S], cfg)
        lmk.append(enc[-1])
        ck.append([W["model.chunk_k_proj.weight"] @ r for r in enc[:-1]] + [np.zeros(d)])
        cv.append([W["model.chunk_v_proj.weight"] @ r for r in enc[:-1]] + [np.zeros(d)])

    selections = []
    for g, n_layers in enumerate(cfg["decoder_layers"][1:]):
        sel = []
        for t in range(C):
            q = rms(h[t * S + S - 1], W[f"model.lmk_norms.{g}.weight"], 1e-5)
            cand = sorted(((q @ lmk[c] / math.sqrt(d), c) for c in range(t)), reverse=True)
            top = cand[:cfg["chunk_topk"]]
            w = softmax(np.array([s for s, _ in top])) if top else np.zeros(0)
            sel.append(([c for _, c in top], w))
        selections.append(sel)
        for j in range(n_layers):
            p = f"model.upper_layers.{g}.{j}."
            self_attn_block(p)
            for n in range(len(h)):
                u = n // S
                gca = np.zeros(d)
                if u >= 1 and sel[u - 1][0]:
                    x = rms(h[n], W[p + "gca.pre_norm.weight"], eps)
                    q = W[p + "gca.q_proj.weight"] @ x
                    o = np.zeros(d)
                    for c, wc in zip(*sel[u - 1]):
                        for hh in range(H):
                            sl = slice(hh * dh, (hh + 1) * dh)
                            pr = softmax(np.array([q[sl] @ key[sl] / math.sqrt(dh) for key in ck[c]]))
                            o[sl] += wc * sum(pr[r] * cv[c][r][sl] for r in range(S))
                    gca = W[p + "gca.o_proj.weight"] @ o
                h[n] = h[n] + mlp(W, p, rms(h[n] + gca, W[p + "post_attention_layernorm.weight"], eps))

    lm = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    logits = [lm @ rms(h[n], W["model.norm.weight"], eps) for n in range(len(h)) if n % S != S - 1]
    return np.array(logits), selections


# ---------------------------------------------------------------- checks

def tiny_config():
    return drt_config.make_config(
        vocab_size=50, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, decoder_layers=[1, 1, 2], encoder_layers=2, slide_window=20,
        chunk_topk=2, pad_id=48, chunk_id=49, bos_id=48, eos_id=48, mask_id=48)


def random_weights(cfg, rng):
    W = {}
    for name, shape in drt_config.expected_tensors(cfg):
        if drt_config.is_norm_weight(name):
            W[name] = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            W[name] = 0.5 * rng.standard_normal(shape)
        else:
            W[name] = rng.standard_normal(shape) / math.sqrt(shape[1])
    return W


def check_against_naive():
    cfg = tiny_config()
    rng = np.random.default_rng(1234)
    W = random_weights(cfg, rng)
    C = 6
    tokens = rng.integers(0, 48, size=C * cfg["enc_chunk_size"])
    model = drt_reference.DRTForCausalLM(cfg).double()
    drt_reference.load_state_arrays(model, W)
    with torch.no_grad():
        out = model(torch.from_numpy(tokens))
    ref_logits, ref_sel = naive_forward(cfg, W, tokens)
    err = np.abs(out.logits.numpy() - ref_logits).max()
    print(f"naive vs torch: max |logit diff| = {err:.3e} (logit scale {np.abs(ref_logits).max():.2f})")
    assert err < 1e-9, err
    k = cfg["chunk_topk"]
    for g, sel in enumerate(ref_sel):
        r = out.retrieval[g]
        for t, (idx, w) in enumerate(sel):
            want_idx = idx + [-1] * (k - len(idx))
            want_w = list(w) + [0.0] * (k - len(idx))
            assert r.indices[t].tolist() == want_idx, (g, t, r.indices[t].tolist(), want_idx)
            assert np.allclose(r.weights[t].numpy(), want_w, atol=1e-12, rtol=0), (g, t)
    discriminating = sum(1 for sel in ref_sel for idx, _ in sel[k + 1:] if idx)
    print(f"retrieval equal in {len(ref_sel)} groups x {C} chunks "
          f"({discriminating} selections choose {k} of more than {k} chunks)")

    # Batched input gives the same as single sequences.
    tokens2 = rng.integers(0, 48, size=C * cfg["enc_chunk_size"])
    with torch.no_grad():
        both = model(torch.from_numpy(np.stack([tokens, tokens2])))
        second = model(torch.from_numpy(tokens2))
    assert torch.allclose(both.logits[0], out.logits, atol=1e-12, rtol=0)
    assert torch.allclose(both.logits[1], second.logits, atol=1e-12, rtol=0)
    # Gumbel noise keeps -1 slots and valid weights; gradients are finite.
    model.float()
    gen = torch.Generator().manual_seed(0)
    noisy = model(torch.from_numpy(tokens), gumbel=True, generator=gen)
    noisy.logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert (noisy.retrieval[0].indices[:2] == out.retrieval[0].indices[:2]).all()
    print("batch, gumbel and backward checks ok")


def check_safetensors():
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.nan, 1e-40, 3.4e38,
                        1.00390625, 1.01171875, 65504.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8], dtype=np.float32)
    values = np.concatenate([special, rng.standard_normal(5000).astype(np.float32) * 100])
    ours = safetensors_io.f32_to_bf16_bits(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(values)
    assert np.array_equal(ours[~nan], theirs[~nan]), "bf16 rounding differs from torch"
    assert np.isnan(safetensors_io.bf16_bits_to_f32(ours[nan])).all()

    tensors = {
        "b.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "a.f16": rng.standard_normal((7,)).astype(np.float16),
        "c.bf16": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "d.i32": rng.integers(-2 ** 31, 2 ** 31 - 1, size=(4, 1), dtype=np.int64).astype(np.int32),
        "e.i64": rng.integers(-2 ** 62, 2 ** 62, size=(5,), dtype=np.int64),
        "f.empty": np.zeros((0, 3), np.float32),
        "g.scalar": np.array(2.5, np.float32),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.safetensors")
        safetensors_io.save_file(tensors, path, metadata={"k": "v"}, dtypes={"c.bf16": "BF16"})
        back, dtypes, meta = safetensors_io.load_file(path, with_dtypes=True)
        header, _, start = safetensors_io.read_header(path)
        assert start % 8 == 0 and meta == {"k": "v"}
        names = sorted(tensors)
        assert list(header) == names
        offsets = [header[n]["data_offsets"] for n in names]
        assert offsets[0][0] == 0 and all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))
        assert os.path.getsize(path) == start + offsets[-1][1]
        for name, array in tensors.items():
            if name == "c.bf16":
                assert dtypes[name] == "BF16"
                want = torch.from_numpy(array).to(torch.bfloat16).float().numpy()
                assert np.array_equal(back[name], want)
            else:
                assert back[name].dtype == array.dtype and np.array_equal(back[name], array), name
        # BF16 -> F32 -> BF16 is lossless.
        path2 = os.path.join(tmp, "u.safetensors")
        safetensors_io.save_file({"x": back["c.bf16"]}, path2, dtypes={"x": "BF16"})
        with open(path2, "rb") as f2:
            raw2 = f2.read()
        data = open(path, "rb").read()[start:]
        b = header["c.bf16"]["data_offsets"]
        assert raw2.endswith(data[b[0]:b[1]])
    print("safetensors round-trip ok")


def check_export():
    """A reference-style checkpoint (module. prefix, ALiBi buffers, tied
    lm_head) exports to a model directory with identical outputs."""
    import export
    cfg = tiny_config()
    model = drt_reference.from_config(cfg, dtype=torch.float32, seed=5)
    state = {"module." + k: v for k, v in model.state_dict().items()}
    for name in list(state):
        if name.endswith("self_attn.q_proj.weight") and ".encoder." not in name:
            state[name.replace("q_proj.weight", "m")] = drt_reference.alibi_slopes(4).float()
    tokens = torch.randint(0, 48, (3 * 63,), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, cfg_path = os.path.join(tmp, "pytorch_model.bin"), os.path.join(tmp, "config.json")
        torch.save(state, ckpt)
        drt_config.save_config(cfg, cfg_path)
        # f32 is lossless (0.0). The bf16 bound 0.5 (absolute, on logits) has
        # no derivation or measurement behind it (review-tools 2026-11-24
        # #19): it was not recorded when written, and the machine of that
        # review had no torch to measure it. Where torch exists, print
        # (a - b).abs().max() for bf16 and replace 0.5 by that figure with a
        # stated margin.
        for dtype, tol in (("f32", 0.0), ("bf16", 0.5)):
            out_dir = os.path.join(tmp, dtype)
            notes, _ = export.export(ckpt, cfg_path, out_dir, dtype=dtype)
            header, _, _ = safetensors_io.read_header(os.path.join(out_dir, "model.safetensors"))
            assert "lm_head.weight" not in header and not any(n.endswith(".m") for n in header)
            loaded = drt_reference.load_model_dir(out_dir, dtype=torch.float64)
            with torch.no_grad():
                a = loaded(tokens).logits
                b = model.double()(tokens).logits
            assert (a - b).abs().max().item() <= tol, (dtype, (a - b).abs().max().item())
        bad = dict(state)
        del bad["module.model.norm.weight"]
        bad["module.model.extra.weight"] = torch.zeros(3)
        bad["module.model.chunk_k_proj.weight"] = torch.zeros(4, 4)
        torch.save(bad, ckpt)
        try:
            export.export(ckpt, cfg_path, os.path.join(tmp, "bad"))
            raise AssertionError("export accepted a bad checkpoint")
        except export.ExportError as e:
            msg = str(e)
            assert "model.norm.weight" in msg and "model.extra.weight" in msg
            assert "model.chunk_k_proj.weight: [4, 4], expected [32, 32]" in msg, msg
    print("export round-trip and error reporting ok")


def check_fixture(path):
    """The naive model, run on a fixture's stored weights, reproduces its golden data."""
    cfg = drt_config.load_config(os.path.join(path, "config.json"))
    W = {k: v.astype(np.float64) for k, v in safetensors_io.load_file(os.path.join(path, "model.safetensors")).items()}
    gold = safetensors_io.load_file(os.path.join(path, "golden.safetensors"))
    logits, sel = naive_forward(cfg, W, gold["tokens"].astype(np.int64))
    want = gold["logits"].astype(np.float64)
    got = logits[gold["logit_positions"]]
    err = np.abs(got - want).max()
    print(f"{path}: naive vs golden max |logit diff| {err:.2e} (f32 storage of logits up to {np.abs(want).max():.1f})")
    assert err < 1e-5, err
    k = cfg["chunk_topk"]
    for g, rows in enumerate(sel):
        for t, (idx, w) in enumerate(rows):
            assert gold["retrieval_indices"][g, t].tolist() == idx + [-1] * (k - len(idx)), (g, t)
            assert np.allclose(gold["retrieval_weights"][g, t][:len(idx)], w, atol=1e-6), (g, t)
    print(f"{path}: retrieval indices and weights equal")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixture", action="append", default=[], help="fixture directory to re-derive")
    args = parser.parse_args()
    check_safetensors()
    check_against_naive()
    check_export()
    for path in args.fixture:
        check_fixture(path)
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

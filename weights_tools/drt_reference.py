"""Plain-PyTorch (CPU) DRT model: the batch forward of the reference
model/DRT.py (ant-research/long-context-modeling), written from scratch.

state_dict names equal those of the reference DRTForCausalLM (minus its
non-learned `self_attn.m` ALiBi buffers). Use model.double() for golden data.
See ../shared/docs/drt-model.md for the math and docs/weights_tools.md for the
places where the reference code and that page differ.
"""
import math
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import drt_config
import safetensors_io


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


class MLP(nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def alibi_slopes(num_heads):
    base = 2.0 ** (8.0 / num_heads)
    return torch.tensor([1.0 / base ** (h + 1) for h in range(num_heads)], dtype=torch.float64)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, theta):
    """x: (..., T, dh) with positions 0..T-1 (Llama rotate_half convention)."""
    t, dh = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dh, 2, dtype=torch.float64, device=x.device) / dh)
    angles = torch.arange(t, dtype=torch.float64, device=x.device)[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return x * angles.cos().to(x.dtype) + rotate_half(x) * angles.sin().to(x.dtype)


def _softmax(scores):
    if scores.dtype in (torch.float16, torch.bfloat16):
        return F.softmax(scores.float(), dim=-1).to(scores.dtype)
    return F.softmax(scores, dim=-1)


def sliding_window_alibi(q, k, v, window, slopes, block=256):
    """Causal attention, query i sees keys j in [i-window, i], score
    q.k/sqrt(dh) - slope_h*(i-j). q, k, v: (N, H, T, dh). Blocked over queries
    so memory is O(T*(block+window))."""
    t, dh = q.shape[-2], q.shape[-1]
    slopes = slopes.to(device=q.device, dtype=q.dtype)[:, None, None]
    outs = []
    for s in range(0, t, block):
        e = min(t, s + block)
        ks = max(0, s - window)
        dist = (torch.arange(s, e, device=q.device)[:, None]
                - torch.arange(ks, e, device=q.device)[None, :]).to(q.dtype)
        scores = q[:, :, s:e] @ k[:, :, ks:e].transpose(-1, -2) / math.sqrt(dh) - slopes * dist
        scores = scores.masked_fill((dist < 0) | (dist > window), float("-inf"))
        outs.append(_softmax(scores) @ v[:, :, ks:e])
    return torch.cat(outs, dim=2)


class SelfAttention(nn.Module):
    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, d, bias=False)
        # Not a parameter: the reference stores it as buffer `m`, derived from H.
        self.register_buffer("alibi_slopes", alibi_slopes(heads), persistent=False)

    def _split(self, x, heads):
        n, t, _ = x.shape
        return x.view(n, t, heads, self.head_dim).transpose(1, 2)

    def forward(self, x, window=None, rope_theta=None):
        """Decoder: window given (sliding-window ALiBi, causal). Encoder:
        rope_theta given (bidirectional, RoPE positions 0..T-1)."""
        n, t, _ = x.shape
        q = self._split(self.q_proj(x), self.heads)
        k = self._split(self.k_proj(x), self.kv_heads)
        v = self._split(self.v_proj(x), self.kv_heads)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if rope_theta is not None:
            q, k = apply_rope(q, rope_theta), apply_rope(k, rope_theta)
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
            o = _softmax(scores) @ v
        else:
            o = sliding_window_alibi(q, k, v, window, self.alibi_slopes)
        return self.o_proj(o.transpose(1, 2).reshape(n, t, -1))


class Block(nn.Module):
    """Pre-norm Llama block: lower decoder layers and encoder layers."""

    def __init__(self, d, heads, kv_heads, ffn, eps):
        super().__init__()
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.self_attn = SelfAttention(d, heads, kv_heads)
        self.mlp = MLP(d, ffn)

    def forward(self, h, **attn_kwargs):
        h = h + self.self_attn(self.input_layernorm(h), **attn_kwargs)
        return h + self.mlp(self.post_attention_layernorm(h))


class GroupedCrossAttention(nn.Module):
    def __init__(self, d, heads, eps):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.pre_norm = RMSNorm(d, eps)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, h, chunk_k, chunk_v, indices, weights):
        """h: (N, C, S, d) decoder states grouped by chunk. chunk_k/v: (N, C, S, d)
        chunk memory (landmark row zero). indices/weights: (N, C, k), the
        retrieval serving each chunk (weight 0 for unused slots)."""
        n, c, s, d = h.shape
        hd, dh = self.heads, self.head_dim
        q = self.q_proj(self.pre_norm(h)).view(n, c, s, hd, dh)
        batch = torch.arange(n, device=h.device)[:, None, None]
        idx = indices.clamp(min=0)
        keys = chunk_k[batch, idx].view(n, c, -1, s, hd, dh)    # (N, C, k, S, H, dh)
        values = chunk_v[batch, idx].view(n, c, -1, s, hd, dh)
        scores = torch.einsum("ncqhe,ncjshe->ncjhqs", q, keys) / math.sqrt(dh)
        probs = _softmax(scores)  # the zero landmark row makes this softmax-off-by-one
        out = torch.einsum("ncjhqs,ncjshe,ncj->ncqhe", probs, values, weights.to(probs.dtype))
        return self.o_proj(out.reshape(n, c, s, d))


class UpperBlock(Block):
    def __init__(self, d, heads, kv_heads, ffn, eps):
        super().__init__(d, heads, kv_heads, ffn, eps)
        self.gca = GroupedCrossAttention(d, heads, eps)

    def forward(self, h, window, chunk_k, chunk_v, indices, weights, chunk_positions):
        h = h + self.self_attn(self.input_layernorm(h), window=window)
        n, t, d = h.shape
        g = self.gca(h.view(n, t // chunk_positions, chunk_positions, d),
                     chunk_k, chunk_v, indices, weights).view(n, t, d)
        # The GCA output reaches the residual stream only through the MLP input.
        return h + self.mlp(self.post_attention_layernorm(h + g))


class Encoder(nn.Module):
    def __init__(self, d, heads, ffn, num_layers):
        super().__init__()
        eps = drt_config.ENCODER_RMS_EPS
        self.layers = nn.ModuleList([Block(d, heads, heads, ffn, eps) for _ in range(num_layers)])
        self.norm = RMSNorm(d, eps)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, rope_theta=drt_config.ENCODER_ROPE_THETA)
        return self.norm(x)


@dataclass
class Retrieval:
    indices: torch.Tensor  # (N, C, k) long, best first, -1 where unused
    weights: torch.Tensor  # (N, C, k), 0 where unused
    scores: torch.Tensor   # (N, C, C), -inf where c >= t


def retrieve(queries, landmarks, topk, gumbel=False, generator=None):
    """Row t: chunks c < t ranked by q_t.l_c/sqrt(d) (plus Gumbel noise when
    `gumbel`), top min(k, t), softmax weights of the noiseless scores."""
    n, c, d = queries.shape
    scores = queries @ landmarks.transpose(-1, -2) / math.sqrt(d)
    future = torch.arange(c, device=scores.device)[None, :] >= torch.arange(c, device=scores.device)[:, None]
    scores = scores.masked_fill(future, float("-inf"))
    ranking = scores
    if gumbel:
        u = torch.rand(scores.shape, generator=generator, dtype=torch.float64,
                       device=generator.device if generator is not None else scores.device).to(scores.device)
        noise = -torch.log(-torch.log(u.clamp(1e-12, 1 - 1e-12)))
        ranking = scores + noise.to(scores.dtype)
    kk = min(topk, c)
    _, idx = torch.topk(ranking, kk, dim=-1)
    picked = scores.gather(-1, idx)
    valid = torch.isfinite(picked)
    # Finite fill keeps rows without any earlier chunk NaN-free (also in backward).
    weights = _softmax(picked.masked_fill(~valid, torch.finfo(picked.dtype).min)) * valid
    idx = idx.masked_fill(~valid, -1)
    if kk < topk:
        idx = F.pad(idx, (0, topk - kk), value=-1)
        weights = F.pad(weights, (0, topk - kk), value=0.0)
    return Retrieval(idx, weights, scores)


@dataclass
class DRTOutput:
    logits: Optional[torch.Tensor]  # (N, L, V) at real-token positions
    hidden: torch.Tensor            # (N, L, d) final-normed states at real positions
    retrieval: list                 # per group: Retrieval (row t = selection at chunk t's landmark)
    landmarks: torch.Tensor         # (N, C, d) encoder output at each landmark row


class DRTModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        drt_config.check_config(cfg)
        d, h, hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        ffn, eps = cfg["intermediate_size"], cfg["rms_norm_eps"]
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], d)
        self.lower_layers = nn.ModuleList(
            [Block(d, h, hkv, ffn, eps) for _ in range(cfg["decoder_layers"][0])])
        self.upper_layers = nn.ModuleList(
            [nn.ModuleList([UpperBlock(d, h, hkv, ffn, eps) for _ in range(n)])
             for n in cfg["decoder_layers"][1:]])
        self.lmk_norms = nn.ModuleList(
            [RMSNorm(d, drt_config.LMK_NORM_EPS) for _ in cfg["decoder_layers"][1:]])
        self.enc_prenorm = RMSNorm(d, eps)
        self.encoder = Encoder(d, h, ffn, cfg["encoder_layers"])
        self.chunk_k_proj = nn.Linear(d, d, bias=False)
        self.chunk_v_proj = nn.Linear(d, d, bias=False)
        self.norm = RMSNorm(d, eps)

    def forward(self, ids, gumbel=False, generator=None):
        """ids: (N, T) decoder ids with landmarks already inserted. Returns
        (final-normed hidden (N, T, d), [Retrieval per group], landmarks)."""
        cfg = self.cfg
        s = cfg["enc_chunk_size"] + 1
        window, topk = cfg["slide_window"], cfg["chunk_topk"]
        n, t = ids.shape
        c = t // s
        h = self.embed_tokens(ids)
        for layer in self.lower_layers:
            h = layer(h, window=window)

        enc = self.encoder(self.enc_prenorm(h.reshape(n * c, s, -1))).view(n, c, s, -1)
        landmarks = enc[:, :, -1]
        keep = torch.ones(s, 1, dtype=enc.dtype, device=enc.device)
        keep[-1] = 0  # landmark row of the chunk memory is zero (softmax-off-by-one)
        chunk_k = self.chunk_k_proj(enc) * keep
        chunk_v = self.chunk_v_proj(enc) * keep

        retrievals = []
        for g, group in enumerate(self.upper_layers):
            queries = self.lmk_norms[g](h[:, s - 1::s])
            r = retrieve(queries, landmarks, topk, gumbel, generator)
            retrievals.append(r)
            # The selection made at chunk t's landmark serves chunk t+1.
            serve_idx = F.pad(r.indices[:, :-1], (0, 0, 1, 0), value=-1)
            serve_w = F.pad(r.weights[:, :-1], (0, 0, 1, 0), value=0.0)
            for layer in group:
                h = layer(h, window, chunk_k, chunk_v, serve_idx, serve_w, s)
        return self.norm(h), retrievals, landmarks


class DRTForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = DRTModel(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        if cfg.get("tie_word_embeddings", True):
            self.lm_head.weight = self.model.embed_tokens.weight

    def insert_landmarks(self, input_ids):
        """(N, L) real tokens, L a multiple of enc_chunk_size -> (N, L + L/S') ids."""
        sp = self.cfg["enc_chunk_size"]
        n, length = input_ids.shape
        if length % sp:
            raise ValueError(f"input length {length} is not a multiple of enc_chunk_size {sp}")
        chunks = input_ids.reshape(n, length // sp, sp)
        marks = torch.full((n, length // sp, 1), self.cfg["chunk_id"], dtype=input_ids.dtype,
                           device=input_ids.device)
        return torch.cat([chunks, marks], dim=2).view(n, -1)

    def forward(self, input_ids, gumbel=False, generator=None, compute_logits=True):
        """input_ids: (L,) or (N, L) real tokens, L a multiple of enc_chunk_size.

        gumbel: add Gumbel noise to retrieval scores before top-k (training,
        as the reference does when model.training); off by default.
        Returns DRTOutput; for a 1-D input the batch dimension is dropped.
        """
        single = input_ids.dim() == 1
        ids = input_ids[None] if single else input_ids
        hidden, retrievals, landmarks = self.model(self.insert_landmarks(ids.long()), gumbel, generator)
        s = self.cfg["enc_chunk_size"] + 1
        n, t, d = hidden.shape
        hidden = hidden.view(n, t // s, s, d)[:, :, :-1].reshape(n, -1, d)
        logits = self.lm_head(hidden) if compute_logits else None
        if single:
            logits = None if logits is None else logits[0]
            hidden, landmarks = hidden[0], landmarks[0]
            retrievals = [Retrieval(r.indices[0], r.weights[0], r.scores[0]) for r in retrievals]
        return DRTOutput(logits, hidden, retrievals, landmarks)

    def model_dir_state(self):
        """name -> numpy array in the model-directory convention (no lm_head when tied)."""
        names = {name for name, _ in drt_config.expected_tensors(self.cfg)}
        return {k: v.detach().cpu().float().numpy() if v.is_floating_point() else v.numpy()
                for k, v in self.state_dict().items() if k in names}


def from_config(cfg, dtype=torch.float32, seed=None):
    """A model for `cfg` (a dict) with the reference's init (normal std
    initializer_range, norms one)."""
    if seed is not None:
        torch.manual_seed(seed)
    model = DRTForCausalLM(cfg)
    std = cfg.get("initializer_range", 0.02)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
    with torch.no_grad():
        model.model.embed_tokens.weight[cfg["pad_id"]] = 0.0
    return model.to(dtype)


def load_state_arrays(model, arrays):
    """Loads name -> numpy array (model-directory convention) into `model`."""
    cfg = model.cfg
    arrays = dict(arrays)
    if cfg.get("tie_word_embeddings", True):
        lm = arrays.pop("lm_head.weight", None)
        if lm is not None and not np.array_equal(lm, arrays["model.embed_tokens.weight"]):
            raise ValueError("tie_word_embeddings is true but lm_head.weight differs from embed_tokens")
        arrays["lm_head.weight"] = arrays["model.embed_tokens.weight"]
    dtype = next(model.parameters()).dtype
    state = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dtype) for k, v in arrays.items()}
    model.load_state_dict(state, strict=True)
    return model


def load_model_dir(path, dtype=torch.float64):
    """Builds the model of a model directory (config.json + model.safetensors)."""
    cfg = drt_config.load_config(os.path.join(path, "config.json"))
    model = DRTForCausalLM(cfg).to(dtype)
    arrays = safetensors_io.load_file(os.path.join(path, "model.safetensors"))
    return load_state_arrays(model, arrays).eval()

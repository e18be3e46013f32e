"""Faster training-time kernels for drt_reference's modules: the same math,
computed with fewer copies (for CPU training in train_passkey.py).

`enable(model)` switches the decoder self-attention and GCA modules of a
drt_reference.DRTForCausalLM to the classes below (same parameters, same
state_dict names); `disable(model)` switches them back. `check(model, ids)`
compares the two paths on one input (logits and retrieval). The reference
path stays the definition: golden data and exports never depend on this file.

- Sliding-window ALiBi attention: queries in blocks of 64 attend to their own
  block and the ceil(W/64) blocks before it in one batched matmul (keys outside
  [i-W, i] masked), instead of a Python loop over query blocks whose backward
  zero-fills full-size gradients per block.
- GCA: the k retrieved chunks of every chunk are laid out as one key matrix of
  k*S rows per head; per-chunk softmaxes are taken on a (k, S) view and scaled
  by the retrieval weights, then one matmul with the values. Equal to
  sum_i w_i softmax(q K_i^T) V_i.
"""
import math

import torch
import torch.nn.functional as F

import drt_reference as R

BLOCK = 64
_mask_cache = {}


def _window_mask(nb, block, prev, window, device):
    key = (nb, block, prev, window, str(device))
    if key not in _mask_cache:
        i = torch.arange(block)[:, None] + prev * block          # query position inside the key range
        j = torch.arange((prev + 1) * block)[None, :]
        dist = (i - j)                                            # (B, (P+1)B)
        bad = (dist < 0) | (dist > window)
        # keys before position 0 (the zero padding of the first blocks)
        absolute = torch.arange(nb)[:, None, None] * block - prev * block + j[None]
        bad = bad[None] | (absolute < 0)
        _mask_cache[key] = (dist.to(device=device, dtype=torch.float32), bad.to(device))
    return _mask_cache[key]


def sliding_window_alibi_fast(q, k, v, window, slopes):
    n, h, t, dh = q.shape
    if t % BLOCK:
        return R.sliding_window_alibi(q, k, v, window, slopes)
    nb = t // BLOCK
    prev = -(-window // BLOCK)
    dist, bad = _window_mask(nb, BLOCK, prev, window, q.device)
    kp = F.pad(k, (0, 0, prev * BLOCK, 0)).view(n, h, nb + prev, BLOCK, dh)
    vp = F.pad(v, (0, 0, prev * BLOCK, 0)).view(n, h, nb + prev, BLOCK, dh)
    keys = torch.cat([kp[:, :, i:i + nb] for i in range(prev + 1)], dim=3)    # (N,H,nb,(P+1)B,dh)
    values = torch.cat([vp[:, :, i:i + nb] for i in range(prev + 1)], dim=3)
    qb = q.view(n, h, nb, BLOCK, dh)
    bias = -slopes.to(q.dtype)[:, None, None, None] * dist.to(q.dtype)       # (H,1,B,(P+1)B)
    scores = qb @ keys.transpose(-1, -2) / math.sqrt(dh) + bias
    scores = scores.masked_fill(bad, float("-inf"))
    out = R._softmax(scores) @ values
    return out.view(n, h, t, dh)


class FastSelfAttention(R.SelfAttention):
    def forward(self, x, window=None, rope_theta=None):
        if rope_theta is not None:
            return R.SelfAttention.forward(self, x, window=window, rope_theta=rope_theta)
        n, t, _ = x.shape
        q = self._split(self.q_proj(x), self.heads)
        k = self._split(self.k_proj(x), self.kv_heads)
        v = self._split(self.v_proj(x), self.kv_heads)
        rep = self.heads // self.kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = sliding_window_alibi_fast(q, k, v, window, self.alibi_slopes)
        return self.o_proj(o.transpose(1, 2).reshape(n, t, -1))


class FastGCA(R.GroupedCrossAttention):
    def forward(self, h, chunk_k, chunk_v, indices, weights):
        n, c, s, d = h.shape
        hd, dh = self.heads, self.head_dim
        q = self.q_proj(self.pre_norm(h)).view(n, c, s, hd, dh).permute(0, 1, 3, 2, 4)  # (N,C,H,S,dh)
        kk = indices.shape[-1]
        batch = torch.arange(n, device=h.device)[:, None, None]
        idx = indices.clamp(min=0)
        ck = chunk_k.view(n, c, s, hd, dh).permute(0, 1, 3, 2, 4)        # (N,C,H,S,dh)
        cv = chunk_v.view(n, c, s, hd, dh).permute(0, 1, 3, 2, 4)
        keys = ck[batch, idx].permute(0, 1, 3, 2, 4, 5).reshape(n, c, hd, kk * s, dh)
        values = cv[batch, idx].permute(0, 1, 3, 2, 4, 5).reshape(n, c, hd, kk * s, dh)
        scores = (q @ keys.transpose(-1, -2) / math.sqrt(dh)).view(n, c, hd, s, kk, s)
        probs = R._softmax(scores) * weights.to(scores.dtype)[:, :, None, None, :, None]
        out = probs.view(n, c, hd, s, kk * s) @ values                     # (N,C,H,S,dh)
        return self.o_proj(out.permute(0, 1, 3, 2, 4).reshape(n, c, s, d))


_SWAPS = [(R.SelfAttention, FastSelfAttention), (R.GroupedCrossAttention, FastGCA)]


def enable(model):
    for m in model.modules():
        for slow, fast in _SWAPS:
            if type(m) is slow:
                m.__class__ = fast
    return model


def disable(model):
    for m in model.modules():
        for slow, fast in _SWAPS:
            if type(m) is fast:
                m.__class__ = slow
    return model


@torch.no_grad()
def check(model, ids):
    """Max |logit difference| between the fast and the reference path, and
    whether the retrieval indices agree."""
    was_fast = any(type(m) in (FastSelfAttention, FastGCA) for m in model.modules())
    disable(model)
    ref = model(ids)
    enable(model)
    fast = model(ids)
    if not was_fast:
        disable(model)
    diff = (ref.logits - fast.logits).abs().max().item()
    same = all(torch.equal(a.indices, b.indices) for a, b in zip(ref.retrieval, fast.retrieval))
    return diff, same

"""Lesson 07 solutions: one way to write the exercises in `exercises.py` (same contracts)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


def sdpa_reference(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
    """SDPA's contract in matmul + softmax (see exercises.py)."""
    if enable_gqa:
        groups = q.shape[-3] // k.shape[-3]  # consecutive query heads share a KV head
        k, v = k.repeat_interleave(groups, -3), v.repeat_interleave(groups, -3)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, Hq, L, S)
    if is_causal:
        L, S = scores.shape[-2:]
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()  # upper left
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)  # rows with no key left
    return weights.masked_fill(empty, 0.0) @ v  # 0 instead of NaN, as SDPA does


def document_causal_mask(doc_lens: Sequence[int]) -> Callable:
    """mask_mod: same document and kv_idx <= q_idx (see exercises.py)."""
    lens = torch.as_tensor(doc_lens)
    doc_id = torch.repeat_interleave(torch.arange(len(lens)), lens)  # (N,): document of each token

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc_id[q_idx] == doc_id[kv_idx]) & (kv_idx <= q_idx)

    return mask_mod


def tiled_attention(q, k, v, block):
    """Online-softmax attention over chunks of `block` keys (see exercises.py)."""
    scale = 1 / math.sqrt(q.shape[-1])
    m = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=q.dtype, device=q.device)  # (..., L, 1)
    total = torch.zeros_like(m)  # (..., L, 1): running sum of exp(score - m)
    acc = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)  # (..., L, Dv)
    for start in range(0, k.shape[-2], block):
        kb, vb = k[..., start : start + block, :], v[..., start : start + block, :]  # (..., b, D)
        s = q @ kb.transpose(-2, -1) * scale  # (..., L, b): this chunk's scores only
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p = torch.exp(s - m_new)  # (..., L, b)
        fix = torch.exp(m - m_new)  # rescales what was summed against the old maximum
        total = total * fix + p.sum(dim=-1, keepdim=True)
        acc = acc * fix + p @ vb
        m = m_new
    return acc / total

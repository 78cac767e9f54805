"""Lesson 07b solutions: one way to write the exercises in `exercises.py` (same contracts)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


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

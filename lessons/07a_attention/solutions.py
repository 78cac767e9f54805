"""Lesson 07a solutions: one way to write the exercise in `exercises.py` (same contract)."""

from __future__ import annotations

import math

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

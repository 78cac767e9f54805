"""Lesson 04b solutions: one way to write the exercises in `exercises.py` (same contracts)."""

from __future__ import annotations

import torch


def batch_indices(n, batch_size, shuffle, drop_last, seed=0):
    if n == 0:
        return []
    if shuffle:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    else:
        order = list(range(n))
    stop = n - n % batch_size if drop_last else n  # drop only a *short* last batch
    return [order[i : i + batch_size] for i in range(0, stop, batch_size)]


def pad_collate(seqs, pad_id=0):
    seqs = [torch.as_tensor(s, dtype=torch.int64).reshape(-1) for s in seqs]  # list [] -> (0,)
    L = max((len(s) for s in seqs), default=0)
    tokens = torch.full((len(seqs), L), pad_id, dtype=torch.int64)  # (B, L)
    mask = torch.zeros((len(seqs), L), dtype=torch.bool)  # (B, L)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
        mask[i, : len(s)] = True
    return tokens, mask

"""Lesson 10 solutions: tensor-parallel shards, the 1F1B order, and what scale_grads divides."""

import torch  # noqa: F401


def local_weight(w, rank, world, style):
    """Colwise splits the output features: dim 0 of the stored [out, in] weight; rowwise dim 1."""
    dim = {"colwise": 0, "rowwise": 1}[style]
    return w.chunk(world, dim=dim)[rank].clone()


def one_f_one_b(p, m):
    """Stage s: p - 1 - s warm-up forwards, then F/B pairs, then the remaining backwards."""
    stages = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        seq = [f"F{i}" for i in range(warm)]
        for i in range(m - warm):
            seq += [f"F{warm + i}", f"B{i}"]
        stages.append(seq + [f"B{i}" for i in range(m - warm, m)])
    return stages


def grad_scale(loss, divide_loss, scale_grads, m):
    """Backward on each micro-batch's loss accumulates: m means of b samples sum to m x the
    full-batch mean, while sums add up to the full-batch sum exactly. Then divide as told."""
    factor = float(m) if loss == "mean" else 1.0
    if divide_loss:
        factor /= m
    if scale_grads:
        factor /= m
    return factor

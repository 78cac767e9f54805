"""Lesson 06b solutions: one way to write the exercises in `exercises.py` (same contract)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def matmul_flops(shape_a: Sequence[int], shape_b: Sequence[int]) -> int:
    """FLOPs of torch.matmul on (..., m, k) @ (..., k, n), batch dims broadcast."""
    *batch_a, m, k = shape_a
    *batch_b, k2, n = shape_b
    assert k == k2, f"inner dimensions differ: {k} and {k2}"
    batch = torch.broadcast_shapes(tuple(batch_a), tuple(batch_b))
    return 2 * math.prod(batch) * m * k * n


def mlp_step_flops(sizes: Sequence[int], batch: int) -> int:
    """Forward 2·B·in·out per layer; backward twice that, minus the first layer's input grad."""
    total = 0
    for i, (d_in, d_out) in enumerate(zip(sizes, sizes[1:])):
        mm = 2 * batch * d_in * d_out  # one (B, in) x (in, out) product
        total += mm + mm + (mm if i > 0 else 0)  # forward, weight grad, input grad
    return total

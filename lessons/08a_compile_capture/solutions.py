"""Lesson 08a solutions: one way to write the exercises in `exercises.py` (same contracts)."""

from __future__ import annotations

import torch


def h_fullgraph(x: torch.Tensor) -> torch.Tensor:
    """`h` without a Python branch on tensor data: both results, chosen by torch.where."""
    z = x.sin() * 2
    return torch.where(z.sum() > 0, z + 1, z - 1)  # the 0-d condition broadcasts over z


def scale_arg(scale: float):
    """A 0-d tensor: Dynamo guards on its dtype and shape, never on its value."""
    return torch.tensor(scale)  # float32 and 0-d: f's result keeps x's dtype and shape

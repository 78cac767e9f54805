"""Lesson 03b solutions: one way to write the exercises in `exercises.py` (same contracts)."""

from __future__ import annotations

import numpy as np

GELU_C = np.sqrt(2.0 / np.pi)
GELU_A = 0.044715


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5·x·(1 + tanh(sqrt(2/pi)·(x + 0.044715·x³))), elementwise."""
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + GELU_A * x**3)))


def gelu_tanh_backward(x: np.ndarray, grad_out: np.ndarray) -> np.ndarray:
    """grad_out times the derivative of gelu_tanh at x (see exercises.py)."""
    t = np.tanh(GELU_C * (x + GELU_A * x**3))
    du = GELU_C * (1.0 + 3.0 * GELU_A * x**2)
    return grad_out * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


def combine_microbatch_grads(grads: list[np.ndarray], counts: list[int]) -> np.ndarray:
    """The full-batch mean gradient from micro-batch means and token counts (see exercises.py)."""
    total = sum(counts)
    out = np.zeros_like(np.asarray(grads[0], dtype=np.float64))
    for g, n in zip(grads, counts, strict=True):
        if n > 0:  # an empty micro-batch's "mean" may be NaN: skip it, never multiply it by 0
            out = out + g * (n / total)
    return out

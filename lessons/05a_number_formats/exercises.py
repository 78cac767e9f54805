"""Lesson 05a exercise: a dynamic loss scaler that decides exactly as `torch.amp.GradScaler`.

Replace the `raise NotImplementedError` lines with your code, then run `make exercises N=05a`:
the tests feed many scripted gradient sequences (with inf and NaN at chosen steps) to your
scaler and to `torch.amp.GradScaler` and compare the scale, the skip decision and the
unscaled gradients at every step.
"""

from __future__ import annotations

import torch


class DynamicLossScaler:
    """Loss scaling with a scale that adapts, as in section 3 of the lesson.

    - `scale` (a float attribute) starts at `init_scale`. The training loop multiplies the
      loss by `scale`, so the gradients it passes to `step` are scaled by it.
    - `step(scaled_grads)` takes a list of float32 tensors. If any element of any of them
      is inf, -inf or NaN, the optimizer step must be skipped: return None, multiply
      `scale` by `backoff_factor`, and restart the count of clean steps from zero.
      Otherwise return a new list holding each gradient divided by the scale the gradients
      were made with (same shapes, same dtype; do not modify the inputs), and count one
      clean step; when `growth_interval` clean steps in a row have been counted, multiply
      `scale` by `growth_factor` (after unscaling) and restart the count.

    Factors and scales are powers of two in the tests, so dividing is exact.

    >>> s = DynamicLossScaler(init_scale=8.0, growth_interval=2)
    >>> s.step([torch.tensor([8.0, 16.0])])
    [tensor([1., 2.])]
    >>> s.step([torch.tensor([float("inf")])]) is None, s.scale
    (True, 4.0)
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        raise NotImplementedError("DynamicLossScaler.__init__")

    def step(self, scaled_grads: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """The unscaled gradients, or None when the step must be skipped (see the class)."""
        raise NotImplementedError("DynamicLossScaler.step")

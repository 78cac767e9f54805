"""Lesson 05a solution: one way to write `DynamicLossScaler` (same contract as exercises.py)."""

from __future__ import annotations

import torch


class DynamicLossScaler:
    """Skip and back off on inf/NaN, grow after `growth_interval` clean steps (see exercises.py)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        self.scale = float(init_scale)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.clean_steps = 0  # clean steps since the last overflow or growth

    def step(self, scaled_grads: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """The unscaled gradients, or None when the step must be skipped."""
        if not all(torch.isfinite(g).all() for g in scaled_grads):  # inf, -inf or NaN
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            return None
        grads = [g / self.scale for g in scaled_grads]  # with the scale they were made with
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0
        return grads

"""Lesson 05b exercise: one mixed-precision optimizer step from several micro-batches.

Replace the `raise NotImplementedError` line with your code, then run `make exercises N=05b`:
the tests compare your step with one step on the whole batch, overflow one micro-batch,
clip, and leave stale gradients behind before calling it.
"""

from __future__ import annotations

import torch


def accumulated_step(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                     micro_batches: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype,
                     max_norm: float) -> tuple[float, bool]:
    """One optimizer step whose loss is the mean over `micro_batches`, as in section 2's step.

    - `micro_batches` is a list of `(x, y)` pairs of equal sizes: `x` float32 inputs, `y`
      class labels. Each micro-batch's forward pass runs under
      `torch.autocast("cpu", dtype=dtype)`; its loss is `F.cross_entropy` on the float32
      logits, divided by the number of micro-batches, so that the gradients add up to those
      of the mean loss over all of them.
    - Gradients left over from before the call must not count.
    - Each micro-batch's loss goes backward through `scaler.scale(...)`; after the last one,
      unscale once, clip the gradient norm to `max_norm`, let the scaler step the optimizer
      and update its scale, in the order of section 2 (a disabled scaler, for bfloat16,
      passes everything through).
    - Return `(norm, stepped)`: the total norm that `clip_grad_norm_` returned (a float: inf
      or NaN when a gradient overflowed) and whether `opt.step()` ran. A hint: a skipped
      step halves the scale; a disabled scaler never skips.
    """
    raise NotImplementedError("accumulated_step")

"""Lesson 05b solution: one way to write `accumulated_step` (same contract as exercises.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def accumulated_step(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                     micro_batches: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype,
                     max_norm: float) -> tuple[float, bool]:
    """One optimizer step on the mean loss over `micro_batches` (see exercises.py)."""
    opt.zero_grad(set_to_none=True)  # nothing left over from an earlier step counts
    for x, y in micro_batches:
        with torch.autocast("cpu", dtype=dtype):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y) / len(micro_batches)  # the mean, piece by piece
        scaler.scale(loss).backward()  # gradients add up, scaled
    scaler.unscale_(opt)  # once, after the last micro-batch: true gradients, inf/NaN noted
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scale = scaler.get_scale()
    scaler.step(opt)  # skipped if unscale_ found inf/NaN
    scaler.update()
    stepped = not scaler.is_enabled() or scaler.get_scale() >= scale  # a skip halves the scale
    return norm.item(), stepped

"""Lesson 08b exercises: write a training step that torch.compile captures with fewer breaks.

Replace the `raise NotImplementedError` with your code, then run `make exercises N=08b`. The
tests compile your step with a counting backend that hands each graph to `aot_eager` (real
forward and backward graphs, no Inductor, no waiting) and compare with eager PyTorch.
"""

from __future__ import annotations

import torch


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """One training step, section 6's `whole_step`, with one graph break fewer.

    `whole_step` runs `loss = F.mse_loss(model(x), y)`, `loss.backward()`, `opt.step()`,
    `opt.zero_grad()` and returns `loss.detach()`. Compiled whole, it breaks the graph 4
    times: at `backward`, twice inside `opt.step()`, and at `opt.zero_grad()`, a function
    Dynamo is told to skip. Write the same step so that, compiled with
    `torch.compile(train_step)`, it breaks the graph only 3 times (not at the end), and so
    that several steps leave the parameters where several eager `whole_step`s leave them
    (within 1e-5) and every `.grad` cleared after each step: None, as `opt.zero_grad()`
    leaves it, or zeros. The loss returned is the loss before the update, detached.
    """
    raise NotImplementedError("train_step")

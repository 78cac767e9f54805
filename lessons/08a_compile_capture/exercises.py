"""Lesson 08a exercises: write code that torch.compile captures the way you intend.

Replace each `raise NotImplementedError` with your code, then run `make exercises N=08a`. The
tests compile your code with a counting backend (it records each captured graph and runs
it eagerly: no Inductor, no waiting) and compare the results with eager PyTorch.
"""

from __future__ import annotations

import torch


def h_fullgraph(x: torch.Tensor) -> torch.Tensor:
    """Section 4's `h`, without its `print`, written so that Dynamo captures ONE graph.

    The values must be those of

        y = x.sin(); z = y * 2
        return z + 1 if z.sum() > 0 else z - 1   # strictly greater: a zero sum gives z - 1

    for any float tensor `x`, and `torch.compile(h_fullgraph, fullgraph=True)` must accept
    it (no graph break) and capture a single graph that serves inputs of both signs.

    >>> h_fullgraph(torch.zeros(3)).tolist()
    [-1.0, -1.0, -1.0]
    """
    raise NotImplementedError("h_fullgraph")


def scale_arg(scale: float):
    """What to pass as `scale` to `f(x, scale) = x.square() * scale` (section 1).

    With `f` compiled with `dynamic=False`, calls `cf(x, scale_arg(s))` for many different
    floats `s` (same `x` shape) must all reuse ONE captured graph, and each result must
    equal `f(x, s)` in values, shape and dtype (float32 for a float32 `x`).
    """
    raise NotImplementedError("scale_arg")

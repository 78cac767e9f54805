"""Lesson 02 exercise: which inputs does a function write? Read it from the schemas.

Replace the `raise NotImplementedError` with your code, then run `make exercises N=02`: the
tests compare your answers with what really happens, on functions chosen to catch the usual
slips. You need `torch` and `torch.utils._python_dispatch.TorchDispatchMode` (section 2 of the
lesson); in `__torch_dispatch__`, `func._schema.arguments` lists the op's arguments, each
with `.name` and `.alias_info` (None, or an object whose `.is_write` is True for `Tensor(a!)`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def written_inputs(fn: Callable, *inputs: torch.Tensor) -> set[int]:
    """Run `fn(*inputs)` once; return the positions in `inputs` of the tensors it writes to.

    - A write counts however it reaches the input's memory: in place on the input
      (`a.add_(1)`), through a view of it (`a[0].zero_()`, `a[1] = 5`), or as an output
      argument (`torch.add(b, c, out=a)`), also when the written argument is a list of tensors.
    - A write counts even when it changes no value (`a.mul_(1)` writes `a`).
    - Writes to tensors that share no memory with an input (a clone, a result) do not count;
      reading an input is not writing it.
    - Decide from the schemas of the ATen ops that run (`Tensor(a!)` marks an argument the
      op writes), as a dispatch mode sees them: not by comparing values (see above), and
      not with version counters (`fn` may run inside `torch.inference_mode()` on inference
      tensors, which have none).
    - Positional arguments reach `__torch_dispatch__` in `args`, keyword-only ones (after
      `*` in the schema, like `out`) in `kwargs`, by name.

    The inputs are non-empty tensors that share no memory with each other. Lesson 01's
    `same_storage` tells whether two tensors read the same memory.

    >>> a, b = torch.zeros(3), torch.ones(3)
    >>> written_inputs(lambda a, b: a.add_(b), a, b)
    {0}
    >>> written_inputs(lambda a, b: torch.add(a, a, out=b), a, b)
    {1}
    >>> written_inputs(lambda a, b: a.t() + b, a, b)
    set()
    """
    raise NotImplementedError("written_inputs")

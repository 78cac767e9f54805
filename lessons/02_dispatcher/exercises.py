"""Lesson 02 exercise: count the ATen ops a function really runs.

Replace the `raise NotImplementedError` with your code, then run `make exercises N=02`: the
tests compare your counts with a reference dispatch mode on functions chosen to catch the
usual slips. You need `torch` and `torch.utils._python_dispatch.TorchDispatchMode` (see
section 2 of the lesson).
"""

from __future__ import annotations

from collections.abc import Callable


def count_aten_ops(fn: Callable, *args) -> dict[str, int]:
    """Run `fn(*args)` once and count the ATen operator overloads it runs (forward only).

    - Keys are overload names as `str(op)` writes them: `"aten.mm.default"`,
      `"aten.add.Tensor"`, `"aten.sum.dim_IntList"`: the overload, not just the op.
    - Values are how many times that overload ran (an op run twice counts 2); no zero entries.
    - Count what reaches the dispatcher's bottom (what a `TorchDispatchMode` sees), after
      composite ops have decomposed: `F.linear(x, w)` runs `aten.t.default` and
      `aten.mm.default`, never an `aten.linear`.
    - Count every ATen op `fn` runs, including those that create tensors from nothing
      (`torch.zeros(3)`) and those that return a Python number (`t.item()`).
    - Only the `aten` namespace: ops of other namespaces (`prims.*`, custom ops such as
      `course02.*`) are left out.
    - Do not call `backward()`; return a plain `dict` (a `Counter` is fine too).

    >>> x, w = torch.randn(2, 3), torch.randn(3, 4)
    >>> count_aten_ops(lambda a, b: (a @ b) @ b.t(), x, w)
    {'aten.mm.default': 2, 'aten.t.default': 1}
    """
    raise NotImplementedError("count_aten_ops")

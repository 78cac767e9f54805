"""Lesson 02 solutions: one way to write the exercise in `exercises.py` (same contract)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in an argument's value: a tensor, a list or tuple of them, or none."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


class _Writes(TorchDispatchMode):
    """Collects the storages of every argument that an op's schema marks as written."""

    def __init__(self):
        super().__init__()
        self.storages = set()  # start addresses of the written storages

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for k, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:  # Tensor(a!), Tensor(a!)[]
                value = args[k] if k < len(args) else kwargs.get(arg.name)  # out= comes by name
                self.storages |= {t.untyped_storage().data_ptr() for t in _tensors(value)}
        return func(*args, **kwargs)


def written_inputs(fn: Callable, *inputs: torch.Tensor) -> set[int]:
    """Positions of the inputs whose memory fn writes, from the schemas (see exercises.py)."""
    with _Writes() as mode:
        fn(*inputs)
    # a view shares its base's storage: a write through any view of an input lands here
    return {k for k, t in enumerate(inputs) if t.untyped_storage().data_ptr() in mode.storages}

"""Lesson 01 solutions: one way to write the exercises in `exercises.py` (same contracts)."""

from __future__ import annotations

import math


def element_offset(index: tuple[int, ...], strides: tuple[int, ...], offset: int) -> int:
    """The storage position of the element at `index` (see exercises.py)."""
    return offset + sum(i * s for i, s in zip(index, strides, strict=True))


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """`torch.empty(shape).stride()`, computed right to left (see exercises.py)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)  # a size-0 dim still leaves its neighbours' strides non-zero
    return tuple(reversed(strides))


def _chunks(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int]:
    """Numbers of elements of the runs of dims that read storage like one flat dim."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]  # size-1 strides never matter
    out = []
    for k, (n, s) in enumerate(dims):
        if k > 0 and dims[k - 1][1] == n * s:  # the outer stride steps over this whole dim
            out[-1] *= n
        else:
            out.append(n)
    return out


def can_view(shape: tuple[int, ...], strides: tuple[int, ...], new_shape: tuple[int, ...]) -> bool:
    """Whether `.view(new_shape)` works on this layout, as PyTorch decides (see exercises.py)."""
    numel = math.prod(shape)
    if numel != math.prod(new_shape):
        return False
    if numel <= 1:
        return True  # no element, or one: there is nothing to step over
    sizes = [n for n in new_shape if n != 1]
    i = 0
    for c in _chunks(shape, strides):  # each chunk must be rebuilt by consecutive new dims
        p = 1
        while p < c and i < len(sizes):
            p *= sizes[i]
            i += 1
        if p != c:
            return False
    return True  # equal numels: the chunks used up every new dim

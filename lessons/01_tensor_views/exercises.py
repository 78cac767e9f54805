"""Lesson 01 exercises: the arithmetic of strided tensors, in plain Python.

Replace each `raise NotImplementedError` with your code (no torch needed), then run
`make exercises N=01`: the tests compare your functions with PyTorch on hundreds of random
tensors. Shapes, strides and indices are tuples of non-negative ints; strides and the
offset count elements, as `Tensor.stride()` and `Tensor.storage_offset()` do.
"""

from __future__ import annotations


def element_offset(index: tuple[int, ...], strides: tuple[int, ...], offset: int) -> int:
    """The storage position of the element at `index`.

    `index` has one entry per dimension (same length as `strides`, each entry within its
    dimension's size); `offset` is the tensor's storage offset. The result is the position,
    in elements from the start of the storage, that `t[index]` reads.

    >>> element_offset((1, 2), (4, 1), 1)  # m[:, 1:] of a 3x4 m: m[1, 3] lives at 7
    7
    >>> element_offset((), (), 5)  # a 0-d tensor reads its offset
    5
    """
    raise NotImplementedError("element_offset")


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides PyTorch gives a new contiguous tensor of `shape`: `torch.empty(shape).stride()`.

    Row-major: the last dimension has stride 1 and each other dimension steps over one
    block of everything to its right. A dimension of size 0 or 1 counts as size 1 in the
    strides of the dimensions to its left (so no stride is ever 0). `()` gives `()`.

    >>> contiguous_strides((2, 3, 4))
    (12, 4, 1)
    >>> contiguous_strides((2, 0, 3))
    (3, 3, 1)
    """
    raise NotImplementedError("contiguous_strides")


def can_view(shape: tuple[int, ...], strides: tuple[int, ...], new_shape: tuple[int, ...]) -> bool:
    """Whether a tensor with these sizes and strides can be `.view(new_shape)`-ed.

    True exactly when `torch.empty(N).as_strided(shape, strides).view(new_shape)` (N large
    enough) raises no error. `new_shape` holds explicit sizes (no -1). Rules to respect:

    - the numbers of elements must be equal, else False;
    - a tensor with 0 elements, or a single element, can take any shape of the same numel;
    - dimensions of size 1 never move you through storage: their strides do not matter;
    - otherwise, neighbouring dimensions that read storage like one flat dimension
      (`strides[k] == shape[k+1] * strides[k+1]`) form a chunk; `new_shape` must split into
      consecutive groups with the same numbers of elements as those chunks, in order.
      That also holds for stride 0 (an expanded dimension).

    >>> can_view((2, 3), (3, 1), (3, 2))  # contiguous: any regrouping works
    True
    >>> can_view((3, 2), (1, 3), (6,))  # a transpose cannot be flattened
    False
    >>> can_view((3, 2), (1, 3), (3, 1, 2))  # but it can gain a size-1 dimension
    True
    """
    raise NotImplementedError("can_view")

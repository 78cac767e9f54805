"""Lesson 03a exercises: a tape autograd in NumPy.

Replace each `raise NotImplementedError` with your code (NumPy only, no torch), then run
`make exercises N=03a`: the tests compare your results with PyTorch's on many random
cases. Arrays are float64.
"""

from __future__ import annotations

import numpy as np


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum `grad` back to `shape`, undoing NumPy broadcasting.

    `grad` has the shape of the result of an operation in which an input of shape `shape`
    was broadcast (`shape` broadcasts to `grad.shape`). Each input element was used once
    per copy broadcasting made of it, so its gradient is the sum over those copies: sum
    over the leading dimensions broadcasting added in front, and over every dimension where
    `shape` has size 1 and `grad` does not. Return an array of exactly `shape` (`()` for a
    0-d input); do not modify `grad`.

    >>> unbroadcast(np.ones((2, 3, 4)), (3, 1)).tolist()  # 2 * 4 copies of each element
    [[8.0], [8.0], [8.0]]
    >>> unbroadcast(np.ones((2, 3)), ()).shape
    ()
    """
    raise NotImplementedError("unbroadcast")


class Tensor:
    """A float64 NumPy array that records how it was made, so that it can run backward.

    `data` is the array; `grad` is None until a backward pass reaches the tensor, then an
    array of `data`'s shape. `parents` are the tensors an operation read and `grad_fn` maps
    the gradient of the result to a tuple with one gradient per parent (None for a leaf).
    Implement, each returning a new Tensor that records its parents and its `grad_fn`:

    - `a + b`: NumPy broadcasting in forward; in backward each input gets its gradient
      un-broadcast to its own shape (any shapes that broadcast, in either direction);
    - `a @ b`: 2-D matrix product, (N, K) @ (K, M);
    - `a.relu()`: max(a, 0); the gradient at exactly 0 is 0, as in PyTorch;
    - `z.bce_with_logits(y)`: the 0-d mean over all elements of the binary cross-entropy of
      sigmoid(z) against the array `y` (same shape, values in [0, 1]), as
      `torch.nn.functional.binary_cross_entropy_with_logits`: finite for logits as large
      as ±1000 (no overflow), with gradient (sigmoid(z) - y) / z.size;
    - `loss.backward()` (loss 0-d): set `loss.grad` to 1, then visit every tensor the loss
      depends on, each one only after all the tensors computed from it, and add each
      parent's share into `parent.grad`. A tensor used several times (a weight applied
      twice, an activation read by two operations) receives the sum of its gradients.

    >>> w = Tensor([[2.0]])
    >>> loss = (Tensor([[1.0]]) @ w + w).bce_with_logits(np.array([[1.0]]))
    >>> loss.backward()
    >>> round(float(w.grad[0, 0]), 4)  # 2 * (sigmoid(4) - 1)
    -0.036
    """

    def __init__(self, data, parents=(), grad_fn=None):
        self.data = np.asarray(data, dtype=np.float64)
        self.grad = None
        self.parents = parents
        self.grad_fn = grad_fn

    def __add__(self, other):
        raise NotImplementedError("Tensor.__add__")

    def __matmul__(self, other):
        raise NotImplementedError("Tensor.__matmul__")

    def relu(self):
        raise NotImplementedError("Tensor.relu")

    def bce_with_logits(self, y):
        raise NotImplementedError("Tensor.bce_with_logits")

    def backward(self):
        raise NotImplementedError("Tensor.backward")

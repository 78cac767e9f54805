"""Lesson 03 exercises: a tape autograd, a GELU backward, and micro-batch gradients, in NumPy.

Replace each `raise NotImplementedError` with your code (NumPy only, no torch), then run
`make exercises N=03`: the tests compare your results with PyTorch's on many random
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


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The tanh approximation of GELU, elementwise: what `F.gelu(x, approximate="tanh")` gives.

    gelu(x) = 0.5·x·(1 + tanh(u)) with u = sqrt(2/pi)·(x + 0.044715·x³). `x` is a float64
    array of any shape; return an array of the same shape. Must hold for large |x| too.

    >>> gelu_tanh(np.array([0.0, 1.0])).round(4).tolist()
    [0.0, 0.8412]
    """
    raise NotImplementedError("gelu_tanh")


def gelu_tanh_backward(x: np.ndarray, grad_out: np.ndarray) -> np.ndarray:
    """The gradient with respect to x of sum(grad_out * gelu_tanh(x)).

    That is `grad_out` times the derivative of `gelu_tanh` at `x`, elementwise (both arrays
    have the same shape; so does the result). Differentiate 0.5·x·(1 + tanh(u)) with the
    product and chain rules; tanh'(u) = 1 - tanh(u)². It must agree with PyTorch's gradient
    of `F.gelu(x, approximate="tanh")` from x = -50 to 50 and beyond.

    >>> gelu_tanh_backward(np.array([0.0]), np.array([2.0])).tolist()  # 2 * 0.5
    [1.0]
    """
    raise NotImplementedError("gelu_tanh_backward")


def combine_microbatch_grads(grads: list[np.ndarray], counts: list[int]) -> np.ndarray:
    """The gradient of the full batch's mean loss, from its micro-batches.

    `grads[i]` is the gradient of micro-batch i's *mean* loss over its `counts[i]` tokens
    (all arrays have one shape). The full batch's loss is the mean over all its tokens.
    Return its gradient: an array of the same shape. A micro-batch may hold 0 tokens: its
    entry in `grads` is then meaningless (it may even be NaN) and must not affect the
    result. At least one count is positive. Do not modify the inputs.

    >>> combine_microbatch_grads([np.array([1.0]), np.array([4.0])], [1, 3]).tolist()
    [3.25]
    """
    raise NotImplementedError("combine_microbatch_grads")

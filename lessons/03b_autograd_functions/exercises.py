"""Lesson 03b exercises: a GELU backward and micro-batch gradients, in NumPy.

Replace each `raise NotImplementedError` with your code (NumPy only, no torch), then run
`make exercises N=03b`: the tests compare your results with PyTorch's on many random
cases. Arrays are float64.
"""

from __future__ import annotations

import numpy as np


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
    result. A NaN in a micro-batch with a positive count must reach the result. At least one
    count is positive. Do not modify the inputs.

    >>> combine_microbatch_grads([np.array([1.0]), np.array([4.0])], [1, 3]).tolist()
    [3.25]
    """
    raise NotImplementedError("combine_microbatch_grads")

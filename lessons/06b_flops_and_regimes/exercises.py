"""Lesson 06b exercises: counting FLOPs.

Replace each `raise NotImplementedError` with your code, then run `make exercises N=06b`.
The tests compare your counts with `torch.utils.flop_counter.FlopCounterMode` on many
shapes, and call your functions where any torch operator raises: count from the shapes
alone, without running torch (a helper such as `torch.broadcast_shapes`, which runs no
operator, is fine).
"""

from __future__ import annotations

from collections.abc import Sequence


def matmul_flops(shape_a: Sequence[int], shape_b: Sequence[int]) -> int:
    """The FLOPs of `torch.matmul(a, b)` for inputs of these shapes, as FlopCounterMode counts,
    computed from the shapes alone, without running torch.

    Both shapes have at least 2 dimensions: `(..., m, k)` and `(..., k, n)`. The leading
    (batch) dimensions broadcast against each other as in any elementwise op, and every
    (m, k) @ (k, n) product of the broadcast batch costs 2·m·k·n FLOPs (a multiply and an
    add per term). A dimension of size 0 gives 0 FLOPs.

    >>> matmul_flops((4, 8), (8, 3))
    192
    >>> matmul_flops((2, 1, 4, 8), (3, 8, 5))  # batch (2, 1) and (3,) broadcast to (2, 3)
    1920
    """
    raise NotImplementedError("matmul_flops")


def mlp_step_flops(sizes: Sequence[int], batch: int) -> int:
    """The matmul FLOPs of one training step of an MLP, as FlopCounterMode counts them,
    computed from the sizes alone, without running torch.

    The model is `nn.Sequential` of `nn.Linear(sizes[0], sizes[1])`, an activation,
    `nn.Linear(sizes[1], sizes[2])`, ... (len(sizes) - 1 linear layers, with biases). The
    step: forward on an input of shape (batch, sizes[0]) that does not require grad, a
    scalar loss, `backward()`. Count what the counter sees: per layer with weights of shape
    (out, in), the forward matmul, the gradient of the weights, and the gradient of the
    layer's input when autograd needs it (it does not for the first layer: nothing wants
    the gradient of the data). Biases, activations and the loss count 0.

    >>> mlp_step_flops([512, 512, 10], 1024)  # the lesson's MLP
    1105199104
    """
    raise NotImplementedError("mlp_step_flops")

"""Lesson 06 exercises: counting FLOPs and timing queued work.

Replace each `raise NotImplementedError` with your code, then run `make exercises N=06`.
The FLOP tests compare your counts with `torch.utils.flop_counter.FlopCounterMode` on many
shapes; the timing tests run your function on a simulated GPU queue with a fake clock, so
they are exact and fast.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


def matmul_flops(shape_a: Sequence[int], shape_b: Sequence[int]) -> int:
    """The FLOPs of `torch.matmul(a, b)` for inputs of these shapes, as FlopCounterMode counts.

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
    """The matmul FLOPs of one training step of an MLP, as FlopCounterMode counts them.

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


def per_call_time(
    fn: Callable[[], object],
    sync: Callable[[], None],
    calls: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds per call when `calls` calls of `fn` are queued back to back.

    On a GPU `fn()` returns as soon as its work is queued and `sync()` waits until the queue
    is empty. Do: `warmup` untimed calls; then time `calls` calls of `fn` with no wait
    between them, so that the device can overlap them, such that the time contains all the
    work of those calls and none of the warm-up's. Read the time with `clock()` (seconds; in
    real use `time.perf_counter`, the default) and return the elapsed time divided by
    `calls`. Call `sync` as few times as that allows.
    """
    raise NotImplementedError("per_call_time")

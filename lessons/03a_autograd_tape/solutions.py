"""Lesson 03a solutions: one way to write the exercises in `exercises.py` (same contracts)."""

from __future__ import annotations

import numpy as np


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum `grad` back to `shape`, undoing NumPy broadcasting (see exercises.py)."""
    lead = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(lead)))  # the dims broadcasting added in front
    ones = tuple(i for i, n in enumerate(shape) if n == 1)  # the dims it stretched from 1
    return np.asarray(grad.sum(axis=ones, keepdims=True))


class Tensor:
    """A float64 NumPy array on a tape (see exercises.py for the contract)."""

    def __init__(self, data, parents=(), grad_fn=None):
        self.data = np.asarray(data, dtype=np.float64)
        self.grad = None
        self.parents = parents
        self.grad_fn = grad_fn

    def __add__(self, other):
        def grad_fn(g):
            return unbroadcast(g, self.data.shape), unbroadcast(g, other.data.shape)
        return Tensor(self.data + other.data, (self, other), grad_fn)

    def __matmul__(self, other):
        a, b = self.data, other.data  # (N, K), (K, M)
        return Tensor(a @ b, (self, other), lambda g: (g @ b.T, a.T @ g))

    def relu(self):
        on = (self.data > 0).astype(np.float64)  # 0 at exactly 0, as in PyTorch
        return Tensor(self.data * on, (self,), lambda g: (g * on,))

    def bce_with_logits(self, y):
        z, y = self.data, np.asarray(y, dtype=np.float64)
        softplus = np.logaddexp(0.0, z)  # log(1 + e^z) without overflow
        p = np.exp(z - softplus)  # sigmoid(z) = e^z / (1 + e^z)
        loss = np.mean(softplus - y * z)
        return Tensor(loss, (self,), lambda g: (g * (p - y) / z.size,))

    def backward(self):
        order, seen = [], set()
        stack = [(self, iter(self.parents))]  # depth-first, parents before children
        seen.add(id(self))
        while stack:
            node, parents = stack[-1]
            nxt = next((p for p in parents if id(p) not in seen), None)
            if nxt is None:
                order.append(stack.pop()[0])
            else:
                seen.add(id(nxt))
                stack.append((nxt, iter(nxt.parents)))
        self.grad = np.ones_like(self.data)
        for node in reversed(order):  # every consumer of a node runs before the node
            if node.grad_fn is not None and node.grad is not None:
                for p, g in zip(node.parents, node.grad_fn(node.grad)):
                    p.grad = g if p.grad is None else p.grad + g

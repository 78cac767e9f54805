# %% [markdown]
# # 03 · Autograd: a tape of what actually ran
#
# Backpropagation is a set of local rules: each operation knows how to turn the gradient
# of its output into gradients of its inputs. Autograd applies those rules for you. While
# the forward pass runs, it records which operations ran on which tensors; `backward()`
# walks that record from the loss back to the leaves. This lesson first writes such a
# recorder in NumPy, checks it against PyTorch to rounding, then opens PyTorch's own
# record: its nodes, the tensors it keeps alive, and the places where you can hook into it.
#
# **What you will learn**
#
# - how a tape autograd works, in about 60 lines of NumPy: gradients summed over uses,
#   un-broadcasting, reverse topological order; and that it trains a network (XOR);
# - how to walk the graph PyTorch records (`grad_fn`, `next_functions`) and why it is
#   rebuilt on every forward pass;
# - what version counters protect, why an in-place write to a leaf is refused (and why
#   `no_grad` is the wrong way around it), why `.grad` accumulates, what `gradcheck` checks;
# - backward of a non-scalar output (a vector-Jacobian product), second derivatives with
#   `create_graph`, and per-sample gradients with `torch.func` (`grad`, `vmap`);
# - how to write a `torch.autograd.Function` (a tanh-GELU, a straight-through estimator),
#   and what its backward must agree with: the forward's in-place writes, shapes, dtypes;
# - tensor, forward and backward hooks, how to count the bytes autograd saves, and what
#   activation checkpointing does to that count;
# - how to accumulate gradients over micro-batches of uneven sizes without changing the
#   result;
# - how to find where a NaN gradient comes from: a backward hook per module, then anomaly
#   mode (what it reports, and what it costs).
#
# **Prerequisites:** lesson 01 (views share storage), the chain rule, and the gradient of
# a matrix product (`dL/dA = dL/dC @ B.T` for `C = A @ B`).
#
# **How to run:** `python lessons/03_autograd/autograd.py` or `make lesson N=03` from the
# repository root, or open `autograd.ipynb`. Everything runs on the CPU in seconds.
# Each printing cell is followed by an *Output* block: what it printed with the pinned
# PyTorch (2.13.0).

# %%
import inspect
import os
import re
import sys
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: the same summation order on every run
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DEVICE = torch.device(os.environ.get("COURSE_DEVICE", "cpu"))


def first_sentence(err):
    """The first sentence of an error message: stable, and short enough to print."""
    return str(err).split(". ")[0]


# %% [markdown]
# ## 1. A tape autograd in NumPy
#
# Each `Tensor` below holds a NumPy array, the tensors it was computed from (`parents`)
# and a function `grad_fn` that maps the gradient of the output to one gradient per
# parent. That is the whole tape: every operation adds one node that points at its inputs.
# `backward` sorts the nodes so that each comes after its parents, then visits them in
# reverse, from the loss to the leaves, adding each node's contribution into its
# parents' `.grad`.
#
# Two rules carry the weight. A tensor used twice receives a gradient from each use, and
# they *add* (the chain rule summed over paths). And when `+` broadcasts, say a bias of
# shape (5,) added to every row of a (4, 5) matrix, the bias was used once per row, so
# its gradient is the sum over rows: `unbroadcast` sums the gradient back to the input's
# shape.


# %%
def unbroadcast(grad, shape):
    """Sum grad (the shape of a broadcast result) back to the input's shape."""
    grad = grad.sum(axis=tuple(range(grad.ndim - len(shape))))  # dims broadcasting added in front
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return np.asarray(grad.sum(axis=stretched, keepdims=True))  # size-1 dims it stretched


def topological_order(root):
    """Every tensor root depends on, each one after its parents (no recursion: any depth)."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        t, parents_done = stack.pop()
        if parents_done:
            order.append(t)
        elif id(t) not in seen:
            seen.add(id(t))
            stack.append((t, True))  # popped again once all its parents are in order
            stack.extend((p, False) for p in t.parents)
    return order


class Tensor:
    """A float64 NumPy array that remembers the operation that made it."""

    def __init__(self, data, parents=(), grad_fn=None):
        self.data = np.asarray(data, dtype=np.float64)
        self.grad = None
        self.parents = parents  # the tensors this one was computed from
        self.grad_fn = grad_fn  # gradient of self -> one gradient per parent

    def __add__(self, other):  # NumPy broadcasting, undone in backward
        def grad_fn(g):
            return unbroadcast(g, self.data.shape), unbroadcast(g, other.data.shape)
        return Tensor(self.data + other.data, (self, other), grad_fn)

    def __matmul__(self, other):  # (N, K) @ (K, M) -> (N, M)
        def grad_fn(g):  # g: (N, M)
            return g @ other.data.T, self.data.T @ g  # (N, K), (K, M)
        return Tensor(self.data @ other.data, (self, other), grad_fn)

    def relu(self):
        mask = self.data > 0  # PyTorch's convention: the gradient at exactly 0 is 0
        return Tensor(self.data * mask, (self,), lambda g: (g * mask,))

    def bce_with_logits(self, y):
        """Mean binary cross-entropy of sigmoid(self) against the 0/1 array y: a 0-d Tensor."""
        z = self.data
        e = np.exp(-np.abs(z))  # in (0, 1]: never overflows
        # log(1 + e^z) - y*z, rewritten as max(z, 0) - y*z + log(1 + e^-|z|): finite for any z
        loss = np.mean(np.maximum(z, 0) - y * z + np.log1p(e))
        p = np.where(z >= 0, 1, e) / (1 + e)  # sigmoid(z), written for either sign of z
        return Tensor(loss, (self,), lambda g: (g * (p - y) / z.size,))

    def backward(self):
        self.grad = np.ones_like(self.data)  # dL/dL = 1
        for t in reversed(topological_order(self)):  # the loss first, leaves last
            if t.grad_fn is None or t.grad is None:
                continue  # a leaf, or a tensor the loss does not depend on
            for p, g in zip(t.parents, t.grad_fn(t.grad)):
                p.grad = g if p.grad is None else p.grad + g  # used twice: gradients add


# %% [markdown]
# Every `grad_fn` is a closure over what its rule needs: `@` keeps both inputs, `relu`
# keeps a mask, the loss keeps its probabilities. Those captured arrays are the memory a
# framework must keep until backward runs; section 2 shows what PyTorch's nodes keep for
# the same operations, and section 6 counts the bytes.
#
# **Predict.** The worked example of a 2-2-1 XOR network: input `x = [[1, 0]]`, label
# `y = [[1]]`, `h = relu(x @ W1 + b1)`, logit `h @ w2 + b2`. The second hidden unit's
# pre-activation is `-0.4·1 + 0.8·0 + 0.1 = -0.3`. Which gradients must therefore be
# exactly 0? Will our tape and PyTorch agree, and to how many bits?

# %%
x_xor, y_xor = np.array([[1.0, 0.0]]), np.array([[1.0]])  # (1, 2), (1, 1)
XOR_PARAMS = {
    "W1": np.array([[0.5, -0.4], [0.3, 0.8]]),  # (2, 2)
    "b1": np.array([0.0, 0.1]),  # (2,), broadcast over the batch
    "w2": np.array([[0.7], [-0.6]]),  # (2, 1)
    "b2": np.array([0.1]),  # (1,)
}


def xor_ours(params):
    """Loss and gradients of the 2-2-1 network with our tape."""
    W1, b1, w2, b2 = (Tensor(a) for a in params.values())
    loss = ((Tensor(x_xor) @ W1 + b1).relu() @ w2 + b2).bce_with_logits(y_xor)
    loss.backward()
    return float(loss.data), {k: t.grad for k, t in zip(params, (W1, b1, w2, b2))}


def xor_torch(params):
    """The same network in PyTorch, float64."""
    W1, b1, w2, b2 = (torch.tensor(a, requires_grad=True) for a in params.values())
    h = torch.relu(torch.tensor(x_xor) @ W1 + b1)  # (1, 2)
    loss = F.binary_cross_entropy_with_logits(h @ w2 + b2, torch.tensor(y_xor))
    loss.backward()
    return loss.item(), {k: t.grad.numpy() for k, t in zip(params, (W1, b1, w2, b2))}


loss_ours, grads_ours = xor_ours(XOR_PARAMS)
loss_ref, grads_ref = xor_torch(XOR_PARAMS)
print(f"loss: ours {loss_ours:.4f}  PyTorch {loss_ref:.4f}")
for k in XOR_PARAMS:
    print(f"dL/d{k:<2} {np.round(grads_ours[k], 4).ravel().tolist()}")
xor_gap = max(np.abs(grads_ours[k] - grads_ref[k]).max() for k in XOR_PARAMS)
same_zeros = all(((grads_ours[k] == 0) == (grads_ref[k] == 0)).all() for k in XOR_PARAMS)
print(f"largest gap to PyTorch below 1e-15: {xor_gap < 1e-15}; the same entries exactly 0: {same_zeros}")

z_rand = np.random.default_rng(0).normal(scale=4, size=1000)  # (1000,) random logits
e_rand = np.exp(-np.abs(z_rand))
sig_ours = np.where(z_rand >= 0, 1, e_rand) / (1 + e_rand)  # the sigmoid of bce_with_logits
sig_torch = torch.sigmoid(torch.from_numpy(z_rand)).numpy()
sig_gap = np.abs(sig_ours - sig_torch).max()
print(f"our sigmoid vs torch.sigmoid, 1000 logits: all bitwise equal {(sig_ours == sig_torch).all()}; "
      f"largest gap below 1e-15 {sig_gap < 1e-15}")

# %% [markdown]
# Output:
# ```text
# loss: ours 0.4932  PyTorch 0.4932
# dL/dW1 [-0.2726, 0.0, 0.0, 0.0]
# dL/db1 [-0.2726, 0.0]
# dL/dw2 [-0.1947, 0.0]
# dL/db2 [-0.3894]
# largest gap to PyTorch below 1e-15: True; the same entries exactly 0: True
# our sigmoid vs torch.sigmoid, 1000 logits: all bitwise equal False; largest gap below 1e-15 True
# ```
#
# The active hidden unit is `0.5`, so the logit is `z = 0.5·0.7 + 0.1 = 0.45` and the loss
# `log(1 + e^-z) = 0.4932`. The logit's gradient `sigmoid(z) - 1 = -0.3894` is `dL/db2`;
# it flows back along every path that was active: times the activation 0.5 for `w2[0]`,
# times `w2[0] = 0.7` for `b1[0]`, and times the input 1 for `W1[0, 0]`. The second hidden
# unit was switched off by its ReLU, so everything behind it (column 2 of `W1`, `b1[1]`)
# and the weight it feeds (`w2[1]`, multiplied by an activation of 0) get exactly 0. The
# input's second feature is 0, so row 2 of `W1` gets 0 too. Those zeros are exact in both
# implementations on any CPU: a product with 0 is 0.
#
# The other entries all carry `sigmoid(0.45)`. Our tape computes it from NumPy's `exp`,
# PyTorch with its own kernel, and the last line shows that the two disagree in
# the last bit for some logits. Whether they happen to agree at 0.45 depends on your CPU
# and libraries, so the lesson prints the bound, which holds everywhere, not the gap.
#
# **Predict.** Now 200 random networks where things get harder: a square weight `W`
# applied twice (`relu(relu(x @ W + b) @ W + b)`, so `W` and the (1, 5) bias `b` each get
# two contributions), a batch of 4, and random 0/1 labels. How close will the two
# gradients be in float64?


# %%
def random_case(rng):
    """Parameters and data of one network with a weight and a bias each used twice."""
    return {
        "x": rng.normal(size=(4, 5)),  # (N, D)
        "W": rng.normal(size=(5, 5)) / 2,  # (D, D), used twice
        "b": rng.normal(size=(1, 5)),  # (1, D), broadcast over N, used twice
        "v": rng.normal(size=(5, 1)),  # (D, 1)
        "y": rng.integers(0, 2, size=(4, 1)).astype(float),  # (N, 1)
    }


def twice_ours(c):
    x, W, b, v = (Tensor(c[k]) for k in "xWbv")
    h = ((x @ W + b).relu() @ W + b).relu()  # (N, D)
    (h @ v).bce_with_logits(c["y"]).backward()
    return [t.grad for t in (W, b, v)]


def twice_torch(c):
    W, b, v = (torch.tensor(c[k], requires_grad=True) for k in "Wbv")
    h = torch.relu(torch.relu(torch.tensor(c["x"]) @ W + b) @ W + b)  # (N, D)
    F.binary_cross_entropy_with_logits(h @ v, torch.tensor(c["y"])).backward()
    return [t.grad.numpy() for t in (W, b, v)]


def largest_gap(n_cases=200, seed=0):
    """Largest |ours - PyTorch| over all gradient entries of n_cases random networks, and
    the largest |gradient|."""
    rng = np.random.default_rng(seed)
    gap = g_max = 0.0
    for _ in range(n_cases):
        c = random_case(rng)
        for a, b in zip(twice_ours(c), twice_torch(c)):
            gap, g_max = max(gap, np.abs(a - b).max()), max(g_max, np.abs(b).max())
    return gap, g_max


gap_random, g_max = largest_gap()
ulp = np.spacing(g_max)  # the distance from g_max to the next float64 up
print(f"200 random networks: largest gradient gap {gap_random:.0e}")
print(f"largest gradient {g_max:.2f}; one unit in its last place (ulp) {ulp:.1e}")
print(f"gap within 2 ulps of the largest gradient: {gap_random <= 2 * ulp}")

# %% [markdown]
# Output:
# ```text
# 200 random networks: largest gradient gap «number»
# largest gradient 4.15; one unit in its last place (ulp) 8.9e-16
# gap within 2 ulps of the largest gradient: True
# ```
#
# float64 carries 53 significant bits, so between 4 and 8 neighbouring values are 8.9e-16
# apart. The two implementations compute the same sums of products, but PyTorch's matmul
# and loss kernels may add the terms in another order, and each addition rounds: here the
# results differ by at most the last bit or two of the largest values. A wrong rule (a
# forgotten sum over a broadcast dimension, a transposed product) changes gradients by
# amounts the size of the gradients themselves. The gap's exact value depends on your CPU's
# kernels, so the Output block shows it as «number»; the bound is what must hold (and the
# gap is not 0: the two really are computed differently).
#
# One thing our tape does not do that PyTorch's does: free itself. PyTorch drops the
# arrays saved for backward as soon as backward has used them (call `backward` twice on the
# same graph and it refuses, unless the first call passed `retain_graph=True`).

# %% [markdown]
# ### Training XOR with the tape
#
# Matching gradients are a means; training is the end. XOR's four points cannot be
# separated by one straight line ((0, 1) and (1, 0) on one side, (0, 0) and (1, 1) on the
# other), so the network needs its hidden layer. We train a 2-8-1 network by full-batch
# gradient descent: 500 steps of `param -= 0.5 * grad`, every gradient from our tape. Each
# step builds a fresh tape from fresh leaves, as PyTorch rebuilds its graph on every
# forward pass.
#
# **Predict.** The loss starts near `log 2 = 0.69`, the loss of a network that answers 0.5
# everywhere. Where does it end, and do the predictions round to the labels 0, 1, 1, 0?

# %%
XOR_X = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])  # (4, 2)
XOR_Y = np.array([[0.0], [1.0], [1.0], [0.0]])  # (4, 1)


def init_xor(seed=0, hidden=8):
    """Random weights (standard normal) and zero biases of a 2-hidden-1 network."""
    rng = np.random.default_rng(seed)
    return {"W1": rng.normal(size=(2, hidden)), "b1": np.zeros(hidden),  # (2, H), (H,)
            "w2": rng.normal(size=(hidden, 1)), "b2": np.zeros(1)}  # (H, 1), (1,)


def xor_logits(p):
    """The network's logits for the four XOR inputs; p maps names to Tensors."""
    return (Tensor(XOR_X) @ p["W1"] + p["b1"]).relu() @ p["w2"] + p["b2"]  # (4, 1)


def train_xor(steps=500, lr=0.5, seed=0):
    """Gradient descent with our tape: the loss before each step, whether all four
    predictions were on the right side of 0.5 then, and the final arrays."""
    arrays, losses, right = init_xor(seed), [], []
    for _ in range(steps):
        p = {k: Tensor(a) for k, a in arrays.items()}  # fresh leaves, a fresh tape
        z = xor_logits(p)  # (4, 1)
        right.append(bool(((z.data > 0) == (XOR_Y == 1)).all()))
        loss = z.bce_with_logits(XOR_Y)
        loss.backward()
        losses.append(float(loss.data))
        arrays = {k: a - lr * p[k].grad for k, a in arrays.items()}
    return losses, right, arrays


def xor_predictions(arrays):
    """sigmoid(logit) for the four inputs: the probability of label 1."""
    z = xor_logits({k: Tensor(a) for k, a in arrays.items()}).data  # (4, 1)
    return (1 / (1 + np.exp(-z))).ravel()


xor_losses, xor_right, xor_trained = train_xor()
for step in (0, 50, 100, 200, 499):
    print(f"step {step:>3}: loss {xor_losses[step]:.4f}")
xor_probs = xor_predictions(xor_trained)
print(f"predictions {np.round(xor_probs, 3).tolist()} for labels {XOR_Y.ravel().astype(int).tolist()}")
xor_miss = np.abs(xor_probs - XOR_Y.ravel()).max()  # the worst prediction's distance to its label
print(f"loss fell {xor_losses[0] / xor_losses[-1]:.0f}x; worst prediction {xor_miss:.3f} from its label")
xor_settled = len(xor_right) - xor_right[::-1].index(False)  # first step of the final all-right run
print(f"all four predictions on the right side of 0.5 from step {xor_settled} on "
      f"(loss then {xor_losses[xor_settled]:.4f})")
first50, last50 = xor_losses[0] / xor_losses[50], xor_losses[449] / xor_losses[499]
print(f"loss divided by {first50:.2f} over steps 0-50, by {last50:.2f} over steps 449-499")


# %% [markdown]
# Output:
# ```text
# step   0: loss 0.7107
# step  50: loss 0.1320
# step 100: loss 0.0380
# step 200: loss 0.0122
# step 499: loss 0.0033
# predictions [0.005, 0.997, 0.998, 0.002] for labels [0, 1, 1, 0]
# loss fell 218x; worst prediction 0.005 from its label
# all four predictions on the right side of 0.5 from step 11 on (loss then 0.5141)
# loss divided by 5.38 over steps 0-50, by 1.16 over steps 449-499
# ```
#
# Sixty lines of NumPy are enough to train: the loss falls by a factor of more than 200 and
# every prediction ends within 0.01 of its label. Nothing in the tape is specific to XOR;
# what it lacks for bigger networks is more operations (each with its backward rule),
# speed, and the memory management of the next sections.


# %%
def plot_xor_loss(losses):
    """The training loss per step, on a log scale."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(range(len(losses)), losses, color="tab:blue")
    ax.set_yscale("log")
    ax.set_xlabel("gradient-descent step")
    ax.set_ylabel("binary cross-entropy")
    ax.set_title("XOR, 2-8-1 ReLU network, trained with the NumPy tape")
    fig.tight_layout()
    return fig


fig = plot_xor_loss(xor_losses)
fig.savefig(HERE / "xor_loss.png", dpi=100)

# %% [markdown]
# The network classifies all four points correctly after only 11 steps, while the loss
# is still near 0.5; the other 489 steps make it more confident. The cross-entropy of a
# correct answer keeps shrinking as its logit grows, without end, but ever more slowly:
# on the log scale the curve flattens (the loss fell by a factor of 5.38 over the first
# 50 steps and of only 1.16 over the last 50).

# %% [markdown]
# ## 2. The graph PyTorch records
#
# PyTorch builds the same structure. A tensor computed from tensors that require gradients
# has a `grad_fn`: the node that will run its backward rule. `grad_fn.next_functions` lists
# the nodes of its inputs; a leaf with `requires_grad=True` appears as an `AccumulateGrad`
# node, the one that writes `.grad`.
#
# **Predict.** `z = relu(x @ W1) @ w2` with `W1` and `w2` leaves. Walking from `z.grad_fn`,
# which nodes do you meet, and in which order?


# %%
def print_graph(fn, depth=0):
    """Print the backward graph under node fn, one node per line, indented by depth."""
    print("  " * depth + type(fn).__name__)
    for nxt, _ in fn.next_functions:
        if nxt is not None:  # None: an input that needs no gradient (here x)
            print_graph(nxt, depth + 1)


def count_nodes(fn, seen=None):
    """Distinct nodes reachable from fn (a node reached twice counts once)."""
    seen = set() if seen is None else seen
    if fn is None or fn in seen:
        return 0
    seen.add(fn)
    return 1 + sum(count_nodes(nxt, seen) for nxt, _ in fn.next_functions)


def saved(fn):
    """The names of the tensors a node saved for backward (its `_saved_*` tensor attributes)."""
    names = [a for a in dir(fn) if a.startswith("_saved_")]
    return [a[len("_saved_"):] for a in names if isinstance(getattr(fn, a), torch.Tensor)]


x1 = torch.tensor([[1.0, 0.0]])  # (1, 2), no gradient needed
W1 = torch.tensor(XOR_PARAMS["W1"], dtype=torch.float32, requires_grad=True)  # (2, 2)
w2 = torch.tensor(XOR_PARAMS["w2"], dtype=torch.float32, requires_grad=True)  # (2, 1)
z = torch.relu(x1 @ W1) @ w2  # (1, 1)
print_graph(z.grad_fn)
relu_fn = z.grad_fn.next_functions[0][0]
mm_first = relu_fn.next_functions[0][0]  # the node of x1 @ W1
print(f"next_functions of x1 @ W1: {[type(f).__name__ if f else None for f, _ in mm_first.next_functions]}")
print(f"saved: MmBackward0 {saved(z.grad_fn)}, ReluBackward0 {saved(relu_fn)}, "
      f"AddBackward0 {saved((W1 + W1).grad_fn)}")
print(f"ReluBackward0 keeps the ReLU's output itself: {relu_fn._saved_result.equal(torch.relu(x1 @ W1))}")

# %% [markdown]
# Output:
# ```text
# MmBackward0
#   ReluBackward0
#     MmBackward0
#       AccumulateGrad
#   AccumulateGrad
# next_functions of x1 @ W1: [None, 'AccumulateGrad']
# saved: MmBackward0 ['mat2', 'self'], ReluBackward0 ['result'], AddBackward0 []
# ReluBackward0 keeps the ReLU's output itself: True
# ```
#
# The graph is the forward pass read backwards: the last matmul first, its two inputs
# below it (the ReLU, and `w2`'s accumulator), then the first matmul and `W1`'s
# accumulator. `x1` does not require a gradient, so its slot in `next_functions` is `None`
# and nothing is recorded for it.
#
# What the nodes keep is what our closures kept: `MmBackward0` both factors of the product
# (`self` and `mat2`), since each one's gradient needs the other. `ReluBackward0` keeps
# the ReLU's output instead of a mask (the output is positive exactly where the mask is
# true), and an addition keeps no tensor at all: its gradient is the incoming one.
#
# **Predict.** Apply one layer `h = relu(h @ W)` once, then three times in a Python loop.
# How many distinct nodes does each graph have? And what is `grad_fn` under
# `torch.no_grad()`?

# %%
W = torch.eye(2, requires_grad=True)  # (2, 2), one weight shared by every application
graph_sizes = {}
for repeats in (1, 3):
    h = x1
    for _ in range(repeats):
        h = torch.relu(h @ W)  # (1, 2)
    graph_sizes[repeats] = count_nodes(h.grad_fn)
    print(f"layer applied {repeats}x: {graph_sizes[repeats]} nodes")
with torch.no_grad():
    h_nograd = torch.relu(x1 @ W)
print(f"under no_grad: grad_fn {h_nograd.grad_fn}  requires_grad {h_nograd.requires_grad}")

# %% [markdown]
# Output:
# ```text
# layer applied 1x: 3 nodes
# layer applied 3x: 7 nodes
# under no_grad: grad_fn None  requires_grad False
# ```
#
# Once: `ReluBackward0`, `MmBackward0`, and `W`'s `AccumulateGrad`. Three times: three of
# each operation node but still one accumulator, because `W` is one leaf (its three
# gradients meet there and add). The loop ran in ordinary Python and the graph records
# what ran: had an `if` skipped a layer, the graph would lack it. That is "define by run",
# and it is why the graph is rebuilt on every forward pass. Under `no_grad` nothing is
# recorded: no node, no saved tensors, and the result does not require a gradient.

# %% [markdown]
# ## 3. Version counters, accumulation, gradcheck
#
# **Predict.** For `y = x * x` at `x = 3`, `dy/dx = 2x = 6`. To compute it, the `mul` node
# saved `x`. What happens if we change `x` in place through a detached alias (lesson 01: a
# detached tensor shares storage) before calling backward? And if we change a
# `detach().clone()` instead?
#
# The third experiment of the cell uses a tool section 6 comes back to:
# `torch.autograd.graph.saved_tensors_hooks(pack, unpack)`. Inside it, each tensor an
# operation saves for backward goes to `pack`, autograd keeps whatever `pack` returns, and
# at backward `unpack` turns that back into the tensor. Here both return the tensor itself:
# autograd's saved entry then holds what `pack` returned (`x` itself), and at backward it
# skips the version check, since it cannot follow versions through your hooks.
# **Predict** too: does the same write through the alias still fail then?

# %%
x = torch.tensor([3.0], requires_grad=True)
(x * x).backward()
print(f"d(x^2)/dx at 3: {x.grad.item():.1f}")

x = torch.tensor([3.0], requires_grad=True)
y = x * x  # MulBackward0 saved x (at version 0)
alias = x.detach()  # no gradient, same storage, same version counter
alias.mul_(2)  # x now holds 6
print(f"x {x.item():.1f}  version of x {x._version}, of the alias {alias._version}")
try:
    y.backward()
except RuntimeError as err:
    print(f"backward failed: {first_sentence(err)}")

x_hooked = torch.tensor([3.0], requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):  # we keep x ourselves
    y = x_hooked * x_hooked
x_hooked.detach().mul_(2)  # the same write through an alias
y.backward()
print(f"same write, x saved through hooks: no error, grad {x_hooked.grad.item():.1f}")

x = torch.tensor([3.0], requires_grad=True)
y = x * x
copy = x.detach().clone()  # new storage: writing it cannot touch what autograd saved
copy.mul_(2)
y.backward()
print(f"after writing a detach().clone(): grad {x.grad.item():.1f}  version of x {x._version}")

# %% [markdown]
# Output:
# ```text
# d(x^2)/dx at 3: 6.0
# x 6.0  version of x 1, of the alias 1
# backward failed: one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [1]] is at version 1; expected version 0 instead
# same write, x saved through hooks: no error, grad 12.0
# after writing a detach().clone(): grad 6.0  version of x 0
# ```
#
# Every tensor carries a version counter, shared with its views and with the results of
# `detach()`, and bumped by each in-place write. A node records the version of each tensor
# it saves; at backward it compares. Writing through the alias made the saved `x` hold 6.
# The third experiment shows what the check prevents: saved-tensor hooks take the keeping
# of saved tensors out of autograd's hands, and its version check with them, so
# the same write goes unnoticed and backward returns 12, the derivative at 6, with no
# error. The counter turns that silent error into an exception. The full message goes on
# with a hint to enable anomaly detection, which makes the error also name the operation
# whose saved input was overwritten, with the line of the forward pass that ran it
# (section 8 shows it). The clone has its own storage and counter, so `x` stays at
# version 0 and the gradient is 6.
#
# The version counter catches an in-place write late, at backward. A write to a *leaf*
# that requires a gradient is refused at once, whether or not anything saved it.
#
# **Predict.** A forward pass normalises a weight `w = [3, 4]` in place, `w.div_(w.norm())`,
# then computes `w @ x` for `x = [1, 0]`. What happens? A common "fix" wraps the write in
# `torch.no_grad()`. What gradient does `w` get then, and what value does `w` keep?

# %%
x_in = torch.tensor([1.0, 0.0])  # (2,)
w_leaf = torch.tensor([3.0, 4.0], requires_grad=True)  # (2,), a leaf: a parameter
try:
    w_leaf.div_(w_leaf.norm())
except RuntimeError as err:
    print(f"in place on the leaf: {err}")
with torch.no_grad():  # the "fix": autograd no longer sees the write
    w_leaf.div_(w_leaf.norm())
(w_leaf @ x_in).backward()
print(f"no_grad 'fix': w {[round(v, 3) for v in w_leaf.tolist()]}, "
      f"grad {[round(v, 3) for v in w_leaf.grad.tolist()]}")
w_ok = torch.tensor([3.0, 4.0], requires_grad=True)
(w_ok / w_ok.norm() @ x_in).backward()  # out of place: the normalisation is on the graph
print(f"out of place:  w {[round(v, 3) for v in w_ok.tolist()]}, grad {[round(v, 3) for v in w_ok.grad.tolist()]}")

# %% [markdown]
# Output:
# ```text
# in place on the leaf: a leaf Variable that requires grad is being used in an in-place operation.
# no_grad 'fix': w [0.6, 0.8], grad [1.0, 0.0]
# out of place:  w [3.0, 4.0], grad [0.128, -0.096]
# ```
#
# The error comes before any backward: a leaf's value is what its gradient is taken with
# respect to, and an in-place write would change it behind autograd's back. `no_grad`
# silences the error and hides the bug. Autograd no longer sees the normalisation, so it
# differentiates `w @ x` as if `w` were free: the gradient `[1, 0]` points along `x`,
# although changing `w` along its own direction changes nothing after normalisation. The
# correct gradient, `(x - u·(u·x)) / |w|` with `u = w / |w|`, is `[0.128, -0.096]`:
# perpendicular to `w`. And the parameter itself was overwritten, outside any optimizer,
# on every forward pass. Write the operation out of place, as an operation on the graph.
# `no_grad` is for writes that are not part of the function being differentiated, such
# as an optimizer's update of the parameters after backward.
#
# **Predict.** Call backward on `x * x` twice without clearing `.grad`. What does `x.grad`
# hold? And after `zero_grad()` on a module, with no argument? Does an SGD step with weight
# decay then move the weight?

# %%
x = torch.tensor([3.0], requires_grad=True)
grad_history = []  # x.grad after each backward
for step in (1, 2):
    (x * x).backward()  # a new graph each time; .grad is added to, never overwritten
    grad_history.append(x.grad.item())
    print(f"after backward {step}: x.grad {x.grad.item():.1f}")
layer = nn.Linear(3, 1)
layer(torch.ones(1, 3)).sum().backward()
print(f"before zero_grad: weight.grad {layer.weight.grad.tolist()}")
layer.zero_grad()
print(f"after zero_grad(): weight.grad {layer.weight.grad}")


def decay_moves(set_to_none):
    """Backward, zero_grad(set_to_none), one SGD step with weight decay: did the weight change?"""
    layer(torch.ones(1, 3)).sum().backward()
    before = layer.weight.detach().clone()
    layer.zero_grad(set_to_none=set_to_none)
    torch.optim.SGD(layer.parameters(), lr=0.1, weight_decay=0.1).step()
    return not torch.equal(before, layer.weight)


decay_none, decay_zeros = decay_moves(True), decay_moves(False)
print(f"SGD step with weight decay: grad None -> weight moved {decay_none}; grad zeros -> moved {decay_zeros}")

# %% [markdown]
# Output:
# ```text
# after backward 1: x.grad 6.0
# after backward 2: x.grad 12.0
# before zero_grad: weight.grad [[1.0, 1.0, 1.0]]
# after zero_grad(): weight.grad None
# SGD step with weight decay: grad None -> weight moved False; grad zeros -> moved True
# ```
#
# `.grad` is accumulated into, exactly like `p.grad + g` in our tape. Inside one backward
# that is how a shared weight sums its uses; across backward calls it is how gradient
# accumulation works (section 7), and a bug when you forget to clear it. `zero_grad()`
# sets `.grad` to `None` by default (`set_to_none=True`) instead of filling it with zeros:
# the next backward then writes a fresh gradient instead of adding to zeros, and an
# optimizer skips a parameter whose `.grad` is `None` altogether. With zeros it does not:
# the weight decay still shrinks the weight, a difference that matters when some
# parameters get no gradient in a step.
#
# **Predict.** `torch.autograd.gradcheck` compares the analytic gradient with finite
# differences `(f(x + eps) - f(x - eps)) / 2eps`. Why does it want float64 inputs?

# %%
gen = torch.Generator().manual_seed(0)
xc = torch.randn(4, 3, dtype=torch.float64, generator=gen, requires_grad=True)  # (4, 3)
wc = torch.randn(3, 2, dtype=torch.float64, generator=gen, requires_grad=True)  # (3, 2)
ok = torch.autograd.gradcheck(lambda a, b: torch.tanh(a @ b).sum(), (xc, wc))
print(f"gradcheck of tanh(x @ w).sum(): {ok}")
GC_DEFAULTS = {k: v.default for k, v in inspect.signature(torch.autograd.gradcheck).parameters.items()
               if k in ("eps", "atol", "rtol")}
print(f"gradcheck's defaults: {GC_DEFAULTS}")


def finite_difference_error(dtype, eps=1e-6):
    """Largest |central difference - autograd| over the entries of xc, in dtype."""
    a, w = xc.detach().to(dtype), wc.detach().to(dtype)
    f = lambda t: torch.tanh(t @ w).sum()  # noqa: E731
    a_req = a.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(a_req), a_req)  # (4, 3)
    err = 0.0
    for i, j in np.ndindex(*a.shape):
        e = torch.zeros_like(a)
        e[i, j] = eps
        err = max(err, ((f(a + e) - f(a - e)) / (2 * eps) - g[i, j]).abs().item())
    return err


fd_err = {dt: finite_difference_error(dt) for dt in (torch.float64, torch.float32)}
print(f"finite differences, eps 1e-6: float64 error below 1e-9: {fd_err[torch.float64] < 1e-9}")
print(f"finite differences, eps 1e-6: float32 error above 1e-2: {fd_err[torch.float32] > 1e-2}")
x32, w32 = (t.detach().float().requires_grad_() for t in (xc, wc))
with warnings.catch_warnings(record=True) as caught:  # recorded, to be printed
    warnings.simplefilter("always")
    ok32 = torch.autograd.gradcheck(lambda a, b: torch.tanh(a @ b).sum(), (x32, w32),
                                    raise_exception=False)
print(f"gradcheck of the same function in float32: {ok32}")
print(f"  its warning: {first_sentence(caught[0].message)}")

# %% [markdown]
# Output:
# ```text
# gradcheck of tanh(x @ w).sum(): True
# gradcheck's defaults: {'eps': 1e-06, 'atol': 1e-05, 'rtol': 0.001}
# finite differences, eps 1e-6: float64 error below 1e-9: True
# finite differences, eps 1e-6: float32 error above 1e-2: True
# gradcheck of the same function in float32: False
#   its warning: Input #0 requires gradient and is not a double precision floating point or complex
# ```
#
# float32 resolves only about 1e-7 relative, so `f(x + eps) - f(x - eps)`, a change of
# about 2e-6, keeps one or two correct digits: the central difference is off by more than
# 0.01, and gradcheck rejects a correct backward (after warning about it). In float64 the
# numerical derivative is good to better than 1e-9, far inside gradcheck's tolerances
# (`atol=1e-5`, `rtol=1e-3`), so a backward rule that is off by more than those is
# rejected (section 5 shows one).

# %% [markdown]
# ## 4. Beyond one scalar loss: vector-Jacobian products, second derivatives, per-sample gradients
#
# `backward()` starts from a scalar: `dL/dL = 1`. For an output `y` with several entries
# there is no single gradient but a Jacobian `J` (`J[i, j] = dy_i/dx_j`), and reverse mode
# never builds it. What one backward pass computes is a *vector-Jacobian product*: given a
# vector `v` shaped like `y` (`grad_outputs`), it returns `v @ J`, the gradient of the scalar
# `sum(v * y)`. Our tape did the same: `grad_fn(g)` maps the gradient of an output to
# those of its inputs, for any `g`.
#
# **Predict.** `y = (x0·x1, x1·x2, x2·x0)` at `x = (1, 2, 3)`. What does `y.backward()`
# without arguments do? With `v = (1, 10, 100)`, what is `v @ J`?

# %%
x3 = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)  # (3,)


def pair_products(x):
    return torch.stack([x[0] * x[1], x[1] * x[2], x[2] * x[0]])  # (3,)


y3 = pair_products(x3)
try:
    y3.backward()
except RuntimeError as err:
    print(f"y.backward(): {first_sentence(err)}")
v3 = torch.tensor([1.0, 10.0, 100.0])  # (3,), shaped like y
(vjp,) = torch.autograd.grad(y3, x3, grad_outputs=v3, retain_graph=True)  # keep the graph
jac_passes = []  # one entry per backward pass that reaches x


def counted_pair_products(x):
    x = x.view_as(x)  # a non-leaf alias of the input, so that it can carry a hook
    x.register_hook(lambda g: jac_passes.append(1))
    return pair_products(x)


jac = torch.autograd.functional.jacobian(counted_pair_products, x3.detach())  # (3, 3)
print(f"Jacobian rows {jac.tolist()}, built by {len(jac_passes)} backward passes")
print(f"grad(y, x, grad_outputs=v) {vjp.tolist()}; v @ J {(v3 @ jac).tolist()}")
y3.backward(v3)  # the same product, accumulated into x3.grad; frees the graph
print(f"y.backward(v) puts {x3.grad.tolist()} in x.grad")
try:
    y3.backward(v3)
except RuntimeError as err:
    print(f"a second backward: {first_sentence(err)}")

# %% [markdown]
# Output:
# ```text
# y.backward(): grad can be implicitly created only for scalar outputs
# Jacobian rows [[2.0, 1.0, 0.0], [0.0, 3.0, 2.0], [3.0, 0.0, 1.0]], built by 3 backward passes
# grad(y, x, grad_outputs=v) [302.0, 31.0, 120.0]; v @ J [302.0, 31.0, 120.0]
# y.backward(v) puts [302.0, 31.0, 120.0] in x.grad
# a second backward: Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed)
# ```
#
# One backward pass gives one combination of the rows of `J`, however many inputs there
# are: that is why training (one scalar loss, millions of parameters) uses reverse mode.
# The full Jacobian needs one pass per output entry: `jacobian` ran three, one per row (a
# hook on `x` counted them). `retain_graph=True` kept the saved tensors for the next call;
# the plain `backward(v)` freed them, so a second one refuses.
#
# **Predict.** The gradient is itself computed by operations. If autograd records them
# (`create_graph=True`), the gradient gets a `grad_fn` and can be differentiated again.
# For `y = x³` at `x = 3`, what are the first and second derivatives?

# %%
x = torch.tensor(3.0, requires_grad=True)
(d1,) = torch.autograd.grad(x**3, x, create_graph=True)  # 3x^2, recorded on the graph
(d2,) = torch.autograd.grad(d1, x)  # d(3x^2)/dx = 6x
print(f"dy/dx {d1.item():.1f} (requires_grad {d1.requires_grad}); d2y/dx2 {d2.item():.1f}")
(d1_plain,) = torch.autograd.grad(x**3, x)
print(f"without create_graph: dy/dx {d1_plain.item():.1f}, requires_grad {d1_plain.requires_grad}")


def saved_by_backward(create_graph):
    """How many tensors the backward pass of x**3 at x = 3 saves for a further backward."""
    x = torch.tensor(3.0, requires_grad=True)
    y = x**3  # its forward graph, saved outside the hooks
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        torch.autograd.grad(y, x, create_graph=create_graph)
    return len(kept)


print(f"tensors saved during backward: {saved_by_backward(False)} without create_graph, "
      f"{saved_by_backward(True)} with it")

# %% [markdown]
# Output:
# ```text
# dy/dx 27.0 (requires_grad True); d2y/dx2 18.0
# without create_graph: dy/dx 27.0, requires_grad False
# tensors saved during backward: 0 without create_graph, 2 with it
# ```
#
# `3·3² = 27` and `6·3 = 18`. Without `create_graph` the backward runs without recording
# (the usual case: the gradient is a number to step with, not something to differentiate).
# With it, the backward's own operations are recorded like a forward pass and save what
# their backward needs: memory for a second graph (two scalars here; activation-sized
# tensors in a real network). Gradient penalties, meta-learning and Hessian-vector products
# use `create_graph=True`.
#
# `torch.func` offers the same machinery as functions: `grad(f)` is a function that returns
# the gradient of the scalar function `f`, and `vmap(g)` runs `g` over a batch dimension as
# if the batch were one sample. Together they give *per-sample* gradients (for gradient
# clipping per example, as in differentially private training, or to study gradient
# noise), which one ordinary backward cannot give: it adds all samples' contributions
# into one `.grad`.
#
# **Predict.** For an MLP and a batch of 8, `vmap(grad(loss))` returns one gradient per
# sample. How do its shapes differ from the parameters'? Does it equal a loop of 8
# separate backward calls?

# %%
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1)).double()
xs8 = torch.randn(8, 5, dtype=torch.float64)  # (B, 5)
ys8 = torch.randn(8, 1, dtype=torch.float64)  # (B, 1)
weights = {k: p.detach() for k, p in mlp.named_parameters()}


sample_calls = []  # the shape of x at each call of sample_loss


def sample_loss(params, x, y):  # x (5,), y (1,): one sample
    sample_calls.append(tuple(x.shape))
    out = torch.func.functional_call(mlp, params, (x[None],))  # (1, 1): the module, our weights
    return F.mse_loss(out, y[None])


per_sample = torch.func.vmap(torch.func.grad(sample_loss), in_dims=(None, 0, 0))(weights, xs8, ys8)


def loop_grads():
    """The same per-sample gradients, one backward per sample: {name: (B, *shape)}."""
    rows = []
    for i in range(len(xs8)):
        mlp.zero_grad()
        F.mse_loss(mlp(xs8[i : i + 1]), ys8[i : i + 1]).backward()
        rows.append({k: p.grad.clone() for k, p in mlp.named_parameters()})
    return {k: torch.stack([r[k] for r in rows]) for k in weights}


looped = loop_grads()
vmap_gap = max((per_sample[k] - looped[k]).abs().max().item() for k in weights)
vmap_scale = max(looped[k].abs().max().item() for k in weights)
for k in weights:
    print(f"{k:<9} parameter {tuple(weights[k].shape)}  per-sample gradients {tuple(per_sample[k].shape)}")
print(f"vmap ran sample_loss {len(sample_calls)} time(s), seeing x of shape {sample_calls[0]}")
print(f"vmap vs loop: gap within 4 ulps of the largest gradient: {vmap_gap <= 4 * np.spacing(vmap_scale)}")
mlp.zero_grad()
F.mse_loss(mlp(xs8), ys8, reduction="sum").backward()  # one backward of the summed loss
sum_gap = max((per_sample[k].sum(0) - p.grad).abs().max().item() for k, p in mlp.named_parameters())
print(f"per-sample gradients summed over the batch vs one backward of the summed loss: "
      f"gap below 1e-13 {sum_gap < 1e-13}")

# %% [markdown]
# Output:
# ```text
# 0.weight  parameter (16, 5)  per-sample gradients (8, 16, 5)
# 0.bias    parameter (16,)  per-sample gradients (8, 16)
# 2.weight  parameter (1, 16)  per-sample gradients (8, 1, 16)
# 2.bias    parameter (1,)  per-sample gradients (8, 1)
# vmap ran sample_loss 1 time(s), seeing x of shape (5,)
# vmap vs loop: gap within 4 ulps of the largest gradient: True
# per-sample gradients summed over the batch vs one backward of the summed loss: gap below 1e-13 True
# ```
#
# Every gradient gains a leading batch dimension. `functional_call` runs the module with
# the weights we pass in, so that `grad` can differentiate with respect to them. `vmap`
# ran our Python function once, and inside it `x` looked like one sample of shape (5,):
# each operation on it ran once for the whole batch of eight. The results agree with the
# loop to rounding (batched kernels may add in another order), and their sum over the
# batch is the one gradient an ordinary backward gives.

# %% [markdown]
# ## 5. Custom `torch.autograd.Function`s
#
# When you want a backward rule of your own, subclass `torch.autograd.Function`: a
# `forward` that computes the output and saves what backward needs with
# `ctx.save_for_backward`, and a `backward` that gets the output's gradient and returns
# one gradient per input. The tanh approximation of GELU,
# `gelu(x) = 0.5·x·(1 + tanh(u))` with `u = sqrt(2/pi)·(x + 0.044715·x³)`, has the
# derivative `0.5·(1 + tanh(u)) + 0.5·x·(1 - tanh(u)²)·sqrt(2/pi)·(1 + 3·0.044715·x²)`.

# %%
GELU_C = (2 / torch.pi) ** 0.5  # sqrt(2/pi)


class TanhGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)  # the input is enough to rebuild every factor
        u = GELU_C * (x + 0.044715 * x**3)
        return 0.5 * x * (1 + torch.tanh(u))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        t = torch.tanh(GELU_C * (x + 0.044715 * x**3))
        du = GELU_C * (1 + 3 * 0.044715 * x**2)  # du/dx
        return grad_out * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du)


class TanhGELUWrong(TanhGELU):
    """The same forward; a backward that forgets the x³ term's share of du/dx."""

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        t = torch.tanh(GELU_C * (x + 0.044715 * x**3))
        return grad_out * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_C)  # du/dx taken as sqrt(2/pi)


xg = torch.linspace(-6, 6, 25, dtype=torch.float64, requires_grad=True)  # (25,)
print(f"gradcheck TanhGELU: {torch.autograd.gradcheck(TanhGELU.apply, (xg,))}")
gc_wrong = torch.autograd.gradcheck(TanhGELUWrong.apply, (xg,), raise_exception=False)
print(f"gradcheck of the backward without the x³ term: {gc_wrong}")
ref = F.gelu(xg, approximate="tanh")
gelu_gap = (TanhGELU.apply(xg) - ref).abs().max().item()
(g_ours,) = torch.autograd.grad(TanhGELU.apply(xg).sum(), xg)
(g_ref,) = torch.autograd.grad(ref.sum(), xg)
gelu_grad_gap = (g_ours - g_ref).abs().max().item()
print(f"forward gap to F.gelu(approximate='tanh') below 1e-15: {gelu_gap < 1e-15}")
print(f"gradient gap below 1e-15: {gelu_grad_gap < 1e-15}")

# %% [markdown]
# Output:
# ```text
# gradcheck TanhGELU: True
# gradcheck of the backward without the x³ term: False
# forward gap to F.gelu(approximate='tanh') below 1e-15: True
# gradient gap below 1e-15: True
# ```
#
# gradcheck accepts our backward and rejects the one with a term missing. Both forward and
# backward agree with PyTorch's built-in tanh-GELU to rounding: the values here are
# between -0.16 and 6, the gradients between -0.13 and 1.13, and 1e-15 is a few units in
# the last place at that size (float64 spacing is 2.2e-16 at 1, 8.9e-16 at 4 to 8). The
# exact gaps, zero or a unit or two in the last place, depend on which kernels your CPU
# runs (with or without vector instructions), so they are not printed. Saving only `x`
# and recomputing `tanh` in backward is a choice: saving `tanh(u)` too would spend memory
# to save a little compute, the same trade-off that section 6 makes at the scale of a
# whole block.
#
# A custom backward does not even have to be the derivative. Rounding has derivative 0
# almost everywhere, so a network that rounds (quantization-aware training) would learn
# nothing through it. The *straight-through estimator* rounds in forward and pretends the
# operation was the identity in backward.
#
# **Predict.** For `x = [0.2, 0.7, 1.4, -1.6]`, what gradient of `sum(3·round(x))` does
# the straight-through estimator give, and what does PyTorch's own `round` give?


# %%
class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out  # pretend round(x) = x: the gradient passes through unchanged


xs = torch.tensor([0.2, 0.7, 1.4, -1.6], requires_grad=True)  # (4,)
(g_ste,) = torch.autograd.grad((3 * RoundSTE.apply(xs)).sum(), xs)
(g_true,) = torch.autograd.grad((3 * torch.round(xs)).sum(), xs)
print(f"forward {RoundSTE.apply(xs).tolist()}")
print(f"straight-through gradient {g_ste.tolist()}")
print(f"true gradient of round    {g_true.tolist()}")

# %% [markdown]
# Output:
# ```text
# forward [0.0, 1.0, 1.0, -2.0]
# straight-through gradient [3.0, 3.0, 3.0, 3.0]
# true gradient of round    [0.0, 0.0, 0.0, 0.0]
# ```
#
# The forward is a real rounding; the gradient is the one of `3·x`. The true gradient is
# 0 everywhere (PyTorch's `round` backward returns zeros), which is correct and useless for
# learning. The STE's gradient is "wrong" on purpose: it tells the weights below which
# direction would help if the rounding were not there.
#
# A custom backward is trusted: autograd checks little of what it returns, and nothing of
# what the forward did to its inputs. Three contracts, three ways to break them.
#
# **Predict.** A `Function` doubles its input in place (`x.mul_(2)`) and returns it; its
# backward, `2·grad`, is right. We apply it to `b = a.clone()`, then use `b`:
# `(5·b).sum()`. What gradient reaches `a`, without and with `ctx.mark_dirty(x)`?


# %%
def doubling(mark_dirty):
    """A Function that doubles its input in place, declaring it with ctx.mark_dirty or not."""

    class DoubleInPlace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if mark_dirty:
                ctx.mark_dirty(x)  # "I wrote x in place": autograd records x as my output
            return x.mul_(2)

        @staticmethod
        def backward(ctx, grad_out):
            return 2 * grad_out

    return DoubleInPlace


dirty_grads = {}
for dirty in (False, True):
    a = torch.ones(3, requires_grad=True)
    b = a.clone()  # (3,), recorded as CloneBackward0 of a
    doubling(dirty).apply(b)  # b now holds 2a
    (5 * b).sum().backward()
    dirty_grads[dirty] = a.grad.tolist()
    print(f"mark_dirty {dirty!s:<5}: b {b.tolist()}, b.grad_fn {type(b.grad_fn).__name__}, "
          f"d(5b)/da {a.grad.tolist()}")

# %% [markdown]
# Output:
# ```text
# mark_dirty False: b [2.0, 2.0, 2.0], b.grad_fn CloneBackward0, d(5b)/da [5.0, 5.0, 5.0]
# mark_dirty True : b [2.0, 2.0, 2.0], b.grad_fn DoubleInPlaceBackward, d(5b)/da [10.0, 10.0, 10.0]
# ```
#
# Without `mark_dirty`, autograd never learns that `b` changed: `b` still says it is a clone
# of `a`, so every later use of `b` is differentiated as if `b = a`, and the gradient is 5
# instead of 10. No error, no warning. With `mark_dirty`, autograd re-records `b` as the
# Function's output (`b.grad_fn` changed), and the doubling is on the graph.
#
# **Predict.** What happens when a backward returns a gradient of the wrong shape? Of the
# wrong dtype, computed in float32 for a float64 input? And when a forward returns a view
# of its input, which the caller then modifies in place?


# %%
class Third(torch.autograd.Function):
    """x / 3, with a backward that returns the right gradient or makes `mistake`."""

    @staticmethod
    def forward(ctx, x, mistake):
        ctx.mistake = mistake
        return x / 3

    @staticmethod
    def backward(ctx, grad_out):
        g = grad_out / 3  # (N,)
        if ctx.mistake == "shape":
            g = g[:1]  # (1,) for an (N,) input
        if ctx.mistake == "dtype":
            g = g.float()  # computed in float32
        return g, None  # no gradient for `mistake`


for mistake in ("shape", "dtype"):
    x64 = torch.ones(2, dtype=torch.float64, requires_grad=True)  # (2,)
    try:
        Third.apply(x64, mistake).sum().backward()
        print(f"wrong {mistake}: no error; x.grad is {x64.grad.dtype} {x64.grad[0].item()!r} (1/3 is {1 / 3!r})")
    except RuntimeError as err:
        print(f"wrong {mistake}: {err}")


class FirstTwo(torch.autograd.Function):
    """x[:2], returned as a view of the input."""

    @staticmethod
    def forward(ctx, x):
        return x[:2]

    @staticmethod
    def backward(ctx, grad_out):
        return torch.cat([grad_out, grad_out.new_zeros(1)])  # (3,)


view_out = FirstTwo.apply(torch.ones(3, requires_grad=True).clone())  # (2,)
print(f"a view out of a Function: _base set {view_out._base is not None}")
try:
    view_out.mul_(2)
except RuntimeError as err:
    print(f"  written in place: {first_sentence(err)}")

# %% [markdown]
# Output:
# ```text
# wrong shape: Function ThirdBackward returned an invalid gradient at index 0 - got [1] but expected shape compatible with [2]
# wrong dtype: no error; x.grad is torch.float64 0.3333333432674408 (1/3 is 0.3333333333333333)
# a view out of a Function: _base set True
#   written in place: Output 0 of FirstTwo is a view and is being modified inplace
# ```
#
# The shape is checked: a gradient must fit its input. The dtype is not: autograd casts
# the float32 gradient to float64 without a word, and what arrives has float32's seven
# digits (an error of 1e-8 where float64 promised 1e-16). Compute a backward in the dtype
# of its input. A view returned by a Function shares the input's storage, and autograd
# refuses to let it be written in place: its usual handling of a write into a view would
# replace the custom backward (the full message says so). Return `x[:2].clone()` if the
# caller may write to it. Check a new Function with `gradcheck` in float64, and with its
# real callers.

# %% [markdown]
# ## 6. Hooks, and the bytes autograd keeps
#
# Hooks let you look at, or change, what flows through the graph without rewriting the
# model:
#
# - `tensor.register_hook(fn)`: `fn(grad)` runs when that tensor's gradient is computed;
#   returning a tensor replaces the gradient.
# - `module.register_forward_hook(fn)`: `fn(module, inputs, output)` runs after each forward.
# - `module.register_full_backward_hook(fn)`: `fn(module, grad_input, grad_output)` runs
#   when the gradients with respect to the module's inputs are computed.
#
# Each `register_*` returns a handle; `handle.remove()` unregisters it.
#
# **Predict.** A hook on `x` returns `grad * 10` for `y = (2·x).sum()`. What ends up in
# `x.grad`? After `handle.remove()`, and with `x.grad` reset to `None` (backward adds to
# what is there), what does a second backward put in `x.grad`?

# %%
x = torch.ones(3, requires_grad=True)
handle = x.register_hook(lambda g: g * 10)  # edits the gradient before it is accumulated
(2 * x).sum().backward()
grad_hooked = x.grad.tolist()
print(f"with the hook: x.grad {grad_hooked}")
handle.remove()
x.grad = None  # start again from nothing: a backward adds to .grad
(2 * x).sum().backward()
grad_unhooked = x.grad.tolist()
print(f"hook removed:  x.grad {grad_unhooked}")

# %% [markdown]
# Output:
# ```text
# with the hook: x.grad [20.0, 20.0, 20.0]
# hook removed:  x.grad [2.0, 2.0, 2.0]
# ```
#
# The true gradient 2 was multiplied by 10 before it reached `.grad`. Gradient clipping
# per tensor, or logging gradient norms, are written this way.
#
# Now a small MLP: four residual blocks `h + Linear(GELU(Linear(h)))`, width 64, hidden
# width 256, a batch of 32, float32.
#
# **Predict.** A forward hook on every block records its output's shape; a full backward
# hook on the last block records the gradients' shapes. How many records of each after one
# forward and backward?

# %%
D, HID, BATCH = 64, 256, 32


def make_block():
    return nn.Sequential(nn.Linear(D, HID), nn.GELU(), nn.Linear(HID, D))


blocks = nn.ModuleList(make_block() for _ in range(4)).to(DEVICE)
x_mlp = torch.randn(BATCH, D, device=DEVICE)  # (B, D)


def mlp_loss(x, use_checkpoint=False):
    """Mean square of the output of the residual blocks; optionally checkpoint each block."""
    h = x  # (B, D)
    for block in blocks:
        # use_reentrant=False: the recommended variant (the default still warns in 2.13)
        h = h + (checkpoint(block, h, use_reentrant=False) if use_checkpoint else block(h))
    return h.pow(2).mean()


acts, grads = [], []
handles = [b.register_forward_hook(lambda m, inp, out: acts.append(tuple(out.shape))) for b in blocks]
handles.append(blocks[-1].register_full_backward_hook(
    lambda m, g_in, g_out: grads.append((tuple(g_in[0].shape), tuple(g_out[0].shape)))))
mlp_loss(x_mlp).backward()
print(f"forward hook records {acts}")
print(f"backward hook records (grad_input, grad_output) shapes {grads}")
for hd in handles:
    hd.remove()
mlp_loss(x_mlp).backward()
print(f"after remove(): still {len(acts)} forward and {len(grads)} backward records")

# %% [markdown]
# Output:
# ```text
# forward hook records [(32, 64), (32, 64), (32, 64), (32, 64)]
# backward hook records (grad_input, grad_output) shapes [((32, 64), (32, 64))]
# after remove(): still 4 forward and 1 backward records
# ```
#
# One forward record per block, one backward record for the hooked block; after
# `remove()` the second pass adds nothing.
#
# `torch.autograd.graph.saved_tensors_hooks(pack, unpack)`, met in section 3, goes one level
# deeper: `pack` sees every tensor an operation saves for backward, the moment it is saved
# (section 4 counted them with it). We count the
# bytes of those tensors, leaving out the parameters (a `Linear` saves its weight, as the
# first line below shows, but the weight lives in the model anyway).
#
# **Predict.** Per block, the first `Linear` saves its (32, 64) input, GELU its (32, 256)
# input, the second `Linear` the (32, 256) GELU output. How many bytes in all, with the
# final `pow`'s input? And with activation checkpointing, which keeps only each checkpointed
# block's input and recomputes the block during backward?


# %%
def saved_bytes(run):
    """Bytes of distinct non-parameter storages saved for backward while run() executes,
    how many parameters were saved too, and what run() returned."""
    params = {p.untyped_storage().data_ptr() for p in blocks.parameters()}
    kept, kept_params = {}, set()

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() in params:
            kept_params.add(s.data_ptr())
        else:
            kept[s.data_ptr()] = s.nbytes()  # a storage saved twice counts once
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return sum(kept.values()), len(kept_params), out


def block_grads(loss):
    """The blocks' parameter gradients from one backward of loss (cleared first)."""
    blocks.zero_grad()
    loss.backward()  # under checkpointing, this recomputes each block's forward
    return [p.grad.clone() for p in blocks.parameters()]


bytes_full, params_full, loss_full = saved_bytes(lambda: mlp_loss(x_mlp))
bytes_ckpt, _, loss_ckpt = saved_bytes(lambda: mlp_loss(x_mlp, use_checkpoint=True))
pairs = zip(block_grads(loss_full), block_grads(loss_ckpt))
ckpt_identical = all(torch.equal(a, b) for a, b in pairs)
print(f"saved for backward: {bytes_full} bytes without checkpointing, and {params_full} of the "
      f"{len(list(blocks.parameters()))} parameters (not counted)")
print(f"saved for backward: {bytes_ckpt} bytes with checkpointing ({bytes_full / bytes_ckpt:.1f}x less)")
print(f"gradients with and without checkpointing bitwise equal: {ckpt_identical}")

# %% [markdown]
# Output:
# ```text
# saved for backward: 303104 bytes without checkpointing, and 7 of the 16 parameters (not counted)
# saved for backward: 40960 bytes with checkpointing (7.4x less)
# gradients with and without checkpointing bitwise equal: True
# ```
#
# The saved parameters are Linear weights: a product saves each factor that the *other*
# factor's gradient needs. The very first Linear's input `x_mlp` needs no gradient, so its
# weight is not kept: 7 of the 8 weights, and no bias (a bias's gradient is a sum of the
# incoming gradient, which needs nothing saved). Without checkpointing: 4 blocks × (32·64 + 2·32·256) floats × 4 bytes = 294,912 bytes,
# plus 8,192 for the input of `pow`. With checkpointing, each block keeps only its (32, 64)
# input, 8,192 bytes, and so does `pow`: 5 × 8,192. The price is a second forward of every
# block during backward (more compute, the same result: the gradients are bit-identical
# here because the recomputation runs the same kernels on the same inputs). The count is
# what `pack` sees: on a GPU, peak memory also depends on when tensors are freed.
#
# `checkpoint` has two implementations, chosen by `use_reentrant`. We passed `False`, the
# one PyTorch recommends.
#
# **Predict.** The first block's input `x_mlp` needs no gradient, only the block's
# weights do. What does each variant give, and what happens if you leave the argument out?


# %%
def checkpointed_first_block(**kwargs):
    """Whether the checkpointed first block's output needs a gradient, and the warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = checkpoint(blocks[0], x_mlp, **kwargs)  # (B, D)
    return out.requires_grad, [(w.category.__name__, ". ".join(str(w.message).split(". ")[:2]))
                               for w in caught]


for kwargs in ({"use_reentrant": False}, {"use_reentrant": True}, {}):
    needs_grad, messages = checkpointed_first_block(**kwargs)
    print(f"{kwargs or 'argument left out'}: output requires_grad {needs_grad}")
    for category, m in messages:
        print(f"  {category}: {m}")

# %% [markdown]
# Output:
# ```text
# {'use_reentrant': False}: output requires_grad True
# {'use_reentrant': True}: output requires_grad False
#   UserWarning: None of the inputs have requires_grad=True. Gradients will be None
# argument left out: output requires_grad False
#   UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. Starting in PyTorch 2.9, calling checkpoint without use_reentrant will raise an exception
#   UserWarning: None of the inputs have requires_grad=True. Gradients will be None
# ```
#
# The reentrant variant runs the block under `no_grad` and replays it inside its own
# backward node, which it only builds when an *input* requires a gradient: here none does,
# so the output is cut from the graph and the block's weights would silently get no
# gradient (the warning is all you get). The non-reentrant variant records the block
# normally and only swaps what autograd saves, through saved-tensor hooks of its own, so
# it works here. Leaving the argument out still picks the reentrant variant in 2.13.0 and
# warns. The warning's claim that PyTorch 2.9 would raise an exception is out of date: 2.13.0
# still only warns, with a `UserWarning`. Always write `use_reentrant=False`.


# %%
def plot_saved_bytes(counts):
    """Bar chart of bytes saved for backward, one bar per configuration."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    names, values = list(counts), [counts[n] / 1024 for n in counts]
    bars = ax.bar(names, values, color=["tab:red", "tab:blue", "tab:gray"][: len(names)])
    ax.bar_label(bars, labels=[f"{v:.0f} KiB" for v in values])
    ax.set_ylabel("saved for backward (KiB)")
    ax.set_title(f"4-block MLP, batch {BATCH}: what autograd keeps")
    ax.set_ylim(0, max(values) * 1.2)
    fig.tight_layout()
    return fig


with torch.no_grad():
    bytes_nograd, _, _ = saved_bytes(lambda: mlp_loss(x_mlp))
SAVED = {"full graph": bytes_full, "checkpointed": bytes_ckpt, "no_grad": bytes_nograd}
fig = plot_saved_bytes(SAVED)
fig.savefig(HERE / "saved_bytes.png", dpi=100)
print(f"no_grad: {bytes_nograd} bytes saved")

# %% [markdown]
# Output:
# ```text
# no_grad: 0 bytes saved
# ```
#
# Under `no_grad` nothing is recorded, so nothing is saved: that is why inference should
# run under `no_grad` (or `inference_mode`). Training keeps the whole left bar alive from
# the forward pass until backward reaches each node; checkpointing shrinks it to the block
# boundaries.

# %% [markdown]
# ## 7. Gradient accumulation with uneven micro-batches
#
# A batch too large for memory is split into micro-batches: run backward on each, let
# `.grad` accumulate, step once. With language models the loss is a mean over *tokens*,
# and micro-batches rarely hold the same number of tokens.
#
# **Predict.** Four micro-batches hold 3, 7, 2 and 12 tokens. The full-batch loss is the
# mean over all 24 tokens. If each micro-batch's loss is its own mean, and we divide each
# by 4 before backward, do we get the full-batch gradient? What weight should each
# micro-batch's mean loss get instead?

# %%
COUNTS = [3, 7, 2, 12]
gen = torch.Generator().manual_seed(1)
feats = torch.randn(sum(COUNTS), 8, dtype=torch.float64, generator=gen)  # (T, F): one row per token
targets = torch.randn(sum(COUNTS), dtype=torch.float64, generator=gen)  # (T,)
w_true = torch.randn(8, dtype=torch.float64, generator=gen)  # (F,)


def token_loss(w, rows):
    """Mean squared error over the tokens in rows."""
    return ((feats[rows] @ w - targets[rows]) ** 2).mean()


def accumulated_grad(weight_of):
    """Backward on each micro-batch's mean loss times weight_of(count), summed in .grad."""
    w = w_true.clone().requires_grad_()
    start = 0
    for n in COUNTS:
        (token_loss(w, slice(start, start + n)) * weight_of(n)).backward()
        start += n
    return w.grad


w = w_true.clone().requires_grad_()
token_loss(w, slice(None)).backward()
g_full = w.grad  # (F,)
g_tokens = accumulated_grad(lambda n: n / sum(COUNTS))  # weight = share of the tokens
g_means = accumulated_grad(lambda n: 1 / len(COUNTS))  # weight = share of the micro-batches
gap_tokens = (g_tokens - g_full).abs().max().item()
gap_means = (g_means - g_full).abs().max().item()
print(f"micro-batch token counts {COUNTS}")
print(f"token-weighted accumulation: largest gap to full batch {gap_tokens:.1e}")
print(f"mean of micro-batch means:   largest gap to full batch {gap_means:.1e}")

# %% [markdown]
# Output:
# ```text
# micro-batch token counts [3, 7, 2, 12]
# token-weighted accumulation: largest gap to full batch «number»
# mean of micro-batch means:   largest gap to full batch 1.7e+00
# ```
#
# The full-batch loss is `(1/24)·Σ over tokens`, which is `Σ_i (n_i/24)·mean_i`: weighting
# each micro-batch's mean by its share of tokens reproduces it exactly, up to the order of
# the float64 additions. Averaging the four means instead gives each of the 2 tokens of
# micro-batch 3 six times the weight of each of the 12 tokens of micro-batch 4: a
# different loss, so a different gradient, by far more than rounding. In practice, divide
# each micro-batch's summed loss by the total token count of the whole accumulated batch
# (count the tokens first, or all-reduce the count across ranks).

# %% [markdown]
# ## 8. Where does a NaN come from?
#
# A NaN in one gradient spreads to every parameter it touches at the next step, and by the
# time the loss prints `nan` the operation that made it is long gone. A classic source:
# `torch.where(h > 0, torch.sqrt(h), 0)`, meant to take the square root only where it
# exists.
#
# **Predict.** In a small network with that layer, and some negative `h`, is the forward
# pass finite? The gradients?


# %%
def sqrt_where_positive(h):
    return torch.where(h > 0, torch.sqrt(h), 0.0)  # sqrt(h) is NaN where h < 0, then dropped


class SafeSqrt(nn.Module):
    def forward(self, h):
        return sqrt_where_positive(h)


torch.manual_seed(0)
net = nn.Sequential(nn.Linear(2, 4), SafeSqrt(), nn.Linear(4, 1))
x_nan = torch.randn(8, 2).requires_grad_()  # (B, 2); see the hooks below


def nan_loss():
    return net(x_nan).pow(2).mean()


net.zero_grad()
loss_nan = nan_loss()
loss_nan.backward()
print(f"loss finite: {loss_nan.isfinite().item()}")
print(f"finite gradients: {[(n, p.grad.isfinite().all().item()) for n, p in net.named_parameters()]}")

# %% [markdown]
# Output:
# ```text
# loss finite: True
# finite gradients: [('0.weight', False), ('0.bias', False), ('2.weight', True), ('2.bias', True)]
# ```
#
# The forward pass is clean: `where` picked 0 wherever `sqrt` gave NaN. But backward runs
# through both branches. `where` sends a gradient of 0 to the branch it did not pick, and
# `sqrt`'s backward divides that 0 by `2·sqrt(h)`, which is NaN there: 0 / NaN is NaN. The
# first layer's parameters are poisoned, the last layer's are not.
#
# A first detector is a backward hook on every module that names the module whose input
# gradient is not finite although its output gradient is: that module turned clean
# gradients into NaN. Anomaly mode goes further: it checks the output of every
# backward node, raises at the first NaN, and shows where in the forward pass that node
# was recorded.
#
# **Predict.** Which module does the hook name? Which node does anomaly mode stop at? And
# what does it say about section 3's overwritten saved tensor?


# %%
def nan_hooks(model):
    """Backward hooks naming each module whose input gradient is not finite while its
    output gradient is; returns the list they fill and the handles. (The model's input
    requires a gradient, so that the first module has an input gradient to show.)"""
    found, handles = [], []

    def finite(grads):
        return all(g is None or g.isfinite().all() for g in grads)

    for name, m in model.named_children():
        def hook(mod, grad_in, grad_out, name=name):
            if finite(grad_out) and not finite(grad_in):
                found.append(f"{name} ({type(mod).__name__})")
        handles.append(m.register_full_backward_hook(hook))
    return found, handles


found_nan, handles = nan_hooks(net)
nan_loss().backward()
for hd in handles:
    hd.remove()
print(f"the hooks name: {found_nan}")


def under_anomaly(run):
    """run() under anomaly mode: the error's first sentence, and the warning it left."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly():
                run()
            error = None
        except RuntimeError as err:
            error = first_sentence(err)
    notes = [str(w.message) for w in caught if "Error detected" in str(w.message)]
    return error, notes[0] if notes else ""


def last_frame(traceback_text):
    """The function named by the last `File ..., line N, in name` of a traceback."""
    return re.findall(r", in (\w+)", traceback_text)[-1]


def overwritten_saved_tensor():
    x = torch.tensor([3.0], requires_grad=True)
    y = x * x
    x.detach().mul_(2)
    y.backward()


for what, run in [("NaN", lambda: nan_loss().backward()), ("section 3", overwritten_saved_tensor)]:
    error, note = under_anomaly(run)
    print(f"{what}: {error}")
    print(f"  its warning: {note.splitlines()[0]}")
    print(f"  the forward traceback ends in: {last_frame(note)}")

# %% [markdown]
# Output:
# ```text
# the hooks name: ['1 (SafeSqrt)']
# NaN: Function 'SqrtBackward0' returned nan values in its 0th output.
#   its warning: Error detected in SqrtBackward0. Traceback of forward call that caused the error:
#   the forward traceback ends in: sqrt_where_positive
# section 3: one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [1]] is at version 1; expected version 0 instead
#   its warning: Error detected in MulBackward0. Traceback of forward call that caused the error:
#   the forward traceback ends in: overwritten_saved_tensor
# ```
#
# The hook points at `SafeSqrt`; anomaly mode at the node inside it, `SqrtBackward0`, and
# its warning carries the traceback of the forward call that recorded the node, ending in
# `sqrt_where_positive`, with file and line (uncaught, the warning prints in full). For
# section 3's error it names `MulBackward0` and the line that recorded it, `y = x * x`:
# the operation whose saved input was overwritten, not the write. The fix here: take the
# square root of `h.clamp(min=tiny)` (or mask the input, not only the output), so that
# neither branch is NaN.
#
# Anomaly mode is a debugging tool, not a setting to leave on: recording a Python
# traceback for every forward operation, and checking every backward output, costs time.
#
# **Predict.** How much slower is one forward and backward of section 6's four-block MLP
# under anomaly mode?


# %%
def step_ms(anomaly, repeats=15):
    """Fastest thread CPU time of one forward + backward of the section 6 MLP, in ms."""
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        with torch.autograd.set_detect_anomaly(anomaly):
            mlp_loss(x_mlp).backward()
        best = min(best, time.thread_time() - start)
    return best * 1e3


anomaly_ratio = step_ms(True) / step_ms(False)
print(f"forward + backward under anomaly mode: {anomaly_ratio:.1f}x the time without it")

# %% [markdown]
# Output:
# ```text
# forward + backward under anomaly mode: «ratio»x the time without it
# ```
#
# The ratio depends on how fast your CPU runs the matrix products, so the Output block
# shows it as «ratio»; it stays above 1.5. The time is thread CPU
# time, the fastest of 15 runs, so other programs on the machine barely move it. Turn
# anomaly mode on to find a NaN or an overwritten tensor, then off again.

# %% [markdown]
# ## Summary
#
# - Autograd is a tape: each operation records its inputs and a backward rule; `backward`
#   visits the nodes in reverse topological order, sums the gradients of a tensor used
#   twice, and un-broadcasts gradients to the shapes of the inputs. Our 60-line NumPy tape
#   matches PyTorch within 2 float64 ulps of the largest gradient (not bit for bit: each
#   library has its own `exp`), and trains a network on XOR.
# - PyTorch's graph is walkable (`grad_fn`, `next_functions`, `AccumulateGrad` for leaves),
#   rebuilt on every forward pass, and not recorded under `no_grad`; its nodes save what
#   their backward needs (both factors of a product, a ReLU's output).
# - Saved tensors are guarded by version counters: an in-place write to one (even through a
#   detached alias) makes backward raise. An in-place write to a leaf that requires a
#   gradient raises at once; hiding it under `no_grad` gives a wrong gradient instead.
#   `.grad` accumulates; `zero_grad()` sets it to `None`, and an optimizer skips such a
#   parameter. `gradcheck` in float64 checks a backward against finite differences.
# - A backward pass computes a vector-Jacobian product (`grad_outputs`); `create_graph=True`
#   records the backward itself, for second derivatives; `torch.func.vmap(grad(f))` gives
#   per-sample gradients in one batched call.
# - `torch.autograd.Function` lets you write the backward yourself: a tanh-GELU, or a
#   straight-through estimator that is deliberately not the derivative. Declare in-place
#   writes with `ctx.mark_dirty`, return gradients of the input's shape and dtype (a wrong
#   dtype is cast silently), and do not return views of inputs that callers will write to.
# - Hooks observe or edit gradients and activations; `saved_tensors_hooks` shows what
#   autograd keeps (here 296 KiB for a small MLP, 40 KiB with checkpointing).
# - Accumulate micro-batch gradients with token weights, not as a mean of means.
# - To find a NaN: a backward hook per module names the module that made it; anomaly mode
#   names the backward node and the forward line that recorded it, at a multiple of the
#   step's time.

# %% [markdown]
# ## Read the source
#
# Where, in the PyTorch you installed, what this lesson showed is implemented. Open each file
# in your editor at the line printed (the line numbers are those of your installed torch;
# they move between releases). The stops follow the lesson: the hooks and nodes of the
# recorded graph, the version counter and the saved tensor that checks it, the engine that
# runs backward, then a custom `Function`'s in-place contract and checkpointing.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/autograd/graph.py", "class saved_tensors_hooks:",
     "`__enter__` pushes your `pack_hook`/`unpack_hook` pair as the default for every tensor "
     "an operation saves inside the block (sections 3, 4 and 6 used it to keep, count or see "
     "saved tensors); `class Node` at the top of the file is the interface every `grad_fn` "
     "answers to: `name()`, `next_functions`, `register_hook`."),
    ("torch/include/c10/core/TensorImpl.h", "struct C10_API VariableVersion",
     "The counter behind `x._version`: `bump()` adds one, and the note [ Version Counter "
     "Sharing ] just above says when (every in-place operation) and who shares one counter: "
     "a view and `x.detach()` share their base's, `x.data` does not."),
    ("torch/include/torch/csrc/autograd/saved_variable.h", "class TORCH_API SavedVariable {",
     "What a node keeps per saved tensor: `saved_version_` is the tensor's version when it was "
     "saved, and `unpack()` (its body is in `saved_variable.cpp`, not in the wheel) raises "
     "section 3's error when the current version differs. With saved-tensor hooks, `hooks_` "
     "keeps what `pack_hook` returned, `data_` stays empty and that check is skipped: section "
     "3's silent 12.0."),
    ("torch/include/torch/csrc/autograd/engine.h", "struct TORCH_API Engine {",
     "`execute()` takes the roots (the loss's `grad_fn`), `keep_graph` (what `retain_graph` "
     "sets) and `create_graph`. In `engine.cpp` (not in the wheel) `compute_dependencies` "
     "counts the edges into each node, and a node runs once all of them have delivered, their "
     "gradients summed (how `W`'s three uses meet in one `AccumulateGrad`); among the ready "
     "nodes, the `ReadyQueue` above runs the one with the highest `sequence_nr` first "
     "(`AccumulateGrad` nodes, then the operation recorded latest in forward)."),
    ("torch/autograd/function.py", "def mark_dirty(",
     "`mark_dirty` only records the tensors (`self.dirty_tensors`); autograd then re-records "
     "each as an output of the Function, which is why `b.grad_fn` became "
     "`DoubleInPlaceBackward` and the gradient 10 in section 5."),
    ("torch/utils/checkpoint.py", "def checkpoint(",
     "Without `use_reentrant` it warns and takes `True`: `CheckpointFunction`, whose forward "
     "runs the block under `torch.no_grad()`. `False` goes through "
     "`_checkpoint_without_reentrant_generator`, which records the block normally and swaps "
     "what it saves through `_checkpoint_hook`, a `saved_tensors_hooks` subclass."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/autograd/graph.py:«line»  `class saved_tensors_hooks:`
#     `__enter__` pushes your `pack_hook`/`unpack_hook` pair as the default for every
#     tensor an operation saves inside the block (sections 3, 4 and 6 used it to keep,
#     count or see saved tensors); `class Node` at the top of the file is the interface
#     every `grad_fn` answers to: `name()`, `next_functions`, `register_hook`.
# torch/include/c10/core/TensorImpl.h:«line»  `struct C10_API VariableVersion`
#     The counter behind `x._version`: `bump()` adds one, and the note [ Version Counter
#     Sharing ] just above says when (every in-place operation) and who shares one
#     counter: a view and `x.detach()` share their base's, `x.data` does not.
# torch/include/torch/csrc/autograd/saved_variable.h:«line»  `class TORCH_API SavedVariable {`
#     What a node keeps per saved tensor: `saved_version_` is the tensor's version when it
#     was saved, and `unpack()` (its body is in `saved_variable.cpp`, not in the wheel)
#     raises section 3's error when the current version differs. With saved-tensor hooks,
#     `hooks_` keeps what `pack_hook` returned, `data_` stays empty and that check is
#     skipped: section 3's silent 12.0.
# torch/include/torch/csrc/autograd/engine.h:«line»  `struct TORCH_API Engine {`
#     `execute()` takes the roots (the loss's `grad_fn`), `keep_graph` (what
#     `retain_graph` sets) and `create_graph`. In `engine.cpp` (not in the wheel)
#     `compute_dependencies` counts the edges into each node, and a node runs once all of
#     them have delivered, their gradients summed (how `W`'s three uses meet in one
#     `AccumulateGrad`); among the ready nodes, the `ReadyQueue` above runs the one with
#     the highest `sequence_nr` first (`AccumulateGrad` nodes, then the operation recorded
#     latest in forward).
# torch/autograd/function.py:«line»  `def mark_dirty(`
#     `mark_dirty` only records the tensors (`self.dirty_tensors`); autograd then
#     re-records each as an output of the Function, which is why `b.grad_fn` became
#     `DoubleInPlaceBackward` and the gradient 10 in section 5.
# torch/utils/checkpoint.py:«line»  `def checkpoint(`
#     Without `use_reentrant` it warns and takes `True`: `CheckpointFunction`, whose
#     forward runs the block under `torch.no_grad()`. `False` goes through
#     `_checkpoint_without_reentrant_generator`, which records the block normally and
#     swaps what it saves through `_checkpoint_hook`, a `saved_tensors_hooks` subclass.
# ```

# %% [markdown]
# ## Mastery check
#
# Answer each question before you open its answer; every answer points to the section whose
# printed lines show it.
#
# 1. **Reproduce and explain.** Which four lines make `backward` fail with "one of the
#    variables needed for gradient computation has been modified by an inplace operation"?
#    What do the two version numbers in the message count, and what does the check protect
#    you from?
#
#    <details><summary>Answer</summary>
#
#    `x = torch.tensor([3.0], requires_grad=True)`, `y = x * x` (its `MulBackward0` saves
#    `x`, at version 0), `x.detach().mul_(2)`, `y.backward()`. The detached alias shares
#    `x`'s storage and its one version counter, so the in-place write bumped that counter
#    and both read 1 (`version of x 1, of the alias 1`), and backward refuses:
#    `[torch.FloatTensor [1]] is at version 1; expected version 0 instead`, the count of
#    in-place writes now against the count when `x` was saved. Without the check the
#    gradient would be wrong: when saved-tensor hooks keep `x` instead, the same write passes
#    with no error and the gradient is 12.0, the derivative at 6, not 6.0. Writing to
#    `x.detach().clone()` touches neither: `x` stays at version 0 and its gradient is 6.0.
#    (*§ Version counters, accumulation, gradcheck*)
#
#    </details>
#
# 2. **Predict.** One weight `W` (a leaf that requires a gradient) is applied three times
#    in a Python loop, `h = torch.relu(h @ W)`, starting from an input `h` that needs no
#    gradient. How many distinct nodes does the recorded graph have, and why not three per
#    application? What is the result's `grad_fn` under `torch.no_grad()`?
#
#    <details><summary>Answer</summary>
#
#    7: one `MmBackward0` and one `ReluBackward0` per application, and a single
#    `AccumulateGrad`, because `W` is one leaf; its three gradients meet and add there (one
#    application gives 3 nodes). The graph records the operations that ran, loop or not.
#    Under `no_grad` nothing is recorded: `grad_fn None  requires_grad False`.
#    (*§ The graph PyTorch records*)
#
#    </details>
#
# 3. **Spot the bug.** A custom `Function` doubles its input in place, `return x.mul_(2)`,
#    with a correct backward, `2 * grad_out`, and no `ctx.mark_dirty(x)`. It is applied to
#    `b = a.clone()`, with `a = torch.ones(3, requires_grad=True)`, and then
#    `(5 * b).sum().backward()` runs. What lands in `a.grad`?
#
#    <details><summary>Answer</summary>
#
#    `[5.0, 5.0, 5.0]` instead of `[10.0, 10.0, 10.0]`, with no error. `b` holds `[2.0, 2.0,
#    2.0]`, but its `grad_fn` is still `CloneBackward0`: autograd never learned that the
#    Function rewrote it, so `5 * b` is differentiated as if `b = a`. With
#    `ctx.mark_dirty(x)` in the forward, `b.grad_fn` is `DoubleInPlaceBackward` and the
#    gradient is 10. (*§ Custom `torch.autograd.Function`s*)
#
#    </details>
#
# 4. **Predict.** Four residual MLP blocks, batch 32: autograd saves 303104 bytes of
#    activations for backward. Activation checkpointing keeps only each checkpointed block's
#    input and recomputes the block during backward. How many bytes are saved with every block
#    checkpointed, and do the parameter gradients change?
#
#    <details><summary>Answer</summary>
#
#    40960 bytes, 7.4x less: five (32, 64) float32 tensors of 8192 bytes, the input of each
#    of the four blocks and the input of the final `pow`. The gradients with and without
#    checkpointing are bitwise equal. (*§ Hooks, and the bytes autograd keeps*)
#
#    </details>
#
# 5. **Spot the bug.** A layer computes `torch.where(h > 0, torch.sqrt(h), 0.0)` to take
#    square roots only where they exist, and some `h` are negative. The loss is finite; are the
#    gradients? Which backward node does anomaly mode stop at?
#
#    <details><summary>Answer</summary>
#
#    The first layer's gradients are not finite (`('0.weight', False), ('0.bias', False)`),
#    the last layer's are. Backward runs through both branches of `where`: the branch it did
#    not pick gets a gradient of 0, and `sqrt`'s backward turns that into NaN where `h < 0`.
#    Anomaly mode stops at `SqrtBackward0` ("returned nan values in its 0th output"), and the
#    forward traceback in its warning ends in `sqrt_where_positive`; a backward hook on every
#    module names `1 (SafeSqrt)`. (*§ Where does a NaN come from?*)
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement:
#
# 1. `unbroadcast(grad, shape)` and the `Tensor` tape (`+` with broadcasting, `@`, `relu`,
#    `bce_with_logits`, `backward`), without looking back at section 1. The tests compare
#    your gradients with PyTorch's on random networks with leading-dimension and size-1
#    broadcasting and a tensor used twice, and run your backward on a chain 3000
#    operations deep and on 40 stacked diamonds (each tensor read twice by the next), where
#    a recursive or path-by-path backward fails.
# 2. `gelu_tanh(x)` and `gelu_tanh_backward(x, grad_out)` on NumPy arrays, checked against
#    `F.gelu(approximate="tanh")` and its gradient from x = -50 to 50.
# 3. `combine_microbatch_grads(grads, counts)`: the full-batch mean gradient from
#    per-micro-batch mean gradients and their token counts (some counts may be 0).
#
# Check your answers with `make exercises N=03`; `solutions.py` has one way to write them.

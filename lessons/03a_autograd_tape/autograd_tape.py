# %% [markdown]
# # 03a · Autograd, part a: the tape and the graph
#
# Backpropagation is a set of local rules: each operation knows how to turn the gradient
# of its output into gradients of its inputs. Autograd applies those rules for you. While
# the forward pass runs, it records which operations ran on which tensors; `backward()`
# walks that record from the loss back to the leaves. This lesson first writes such a
# recorder in NumPy, checks it against PyTorch to rounding and trains a network with it,
# then opens PyTorch's own record: its nodes, what they save, and the counters that guard
# what they saved. Lesson 03b, the second part, goes on to vector-Jacobian products,
# custom `Function`s, hooks and the bytes autograd keeps, gradient accumulation and NaNs.
#
# **What you will learn**
#
# - how a tape autograd works, in about 60 lines of NumPy: gradients summed over uses,
#   un-broadcasting, reverse topological order; and that it trains a network (XOR);
# - how to walk the graph PyTorch records (`grad_fn`, `next_functions`), what its nodes
#   save for backward, and why the graph is rebuilt on every forward pass;
# - what version counters protect, why an in-place write to a leaf is refused (and why
#   `no_grad` is the wrong way around it), why `.grad` accumulates, what `gradcheck` checks.
#
# **Prerequisites:** lesson 01 (views share storage), the chain rule, and the gradient of
# a matrix product (`dL/dA = dL/dC @ B.T` for `C = A @ B`). Lesson 02 helps: the
# dispatcher's autograd layer it shows is what records the graph this lesson opens.
#
# **How to run:** `python lessons/03a_autograd_tape/autograd_tape.py` or `make lesson N=03a`
# from the repository root, or open `autograd_tape.ipynb`. Everything runs on the CPU in
# seconds. Each printing cell is followed by an *Output* block: what it printed with the
# pinned PyTorch (2.13.0). Your run prints the same lines, except the parts marked
# `«number»` (a rounding gap that depends on your CPU's kernels), `«version»` and
# `«folder»` (which torch you installed, and where) and `«line»` (line numbers in its
# source files).

# %%
import inspect
import sys
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: the same summation order on every run
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()


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
# parents' `.grad`. The order matters: a tensor read by two later operations must have
# received both gradients before its own `grad_fn` passes their sum on. Visited earlier, it
# would pass on a partial gradient; visited once per path, the work grows exponentially.
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
# the same operations (lesson 03b counts the bytes).
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
# The other entries all carry `sigmoid(0.45)`. Our tape computes it with the formula of
# `bce_with_logits`, PyTorch with its own kernel, and the last line shows that the two
# disagree in the last bit for some logits. The gap's exact value depends on your CPU's
# kernels; the bound holds everywhere.
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


def torch_mm(a, b):
    return (torch.from_numpy(a) @ torch.from_numpy(b)).numpy()


def matmul_by_torch(self, other):  # Tensor.__matmul__, each product computed by PyTorch
    return Tensor(torch_mm(self.data, other.data), (self, other),
                  lambda g: (torch_mm(g, other.data.T), torch_mm(self.data.T, g)))


def bce_by_torch(self, y):  # Tensor.bce_with_logits's gradient, with torch.sigmoid
    p = torch.sigmoid(torch.from_numpy(self.data)).numpy()
    return Tensor(0.0, (self,), lambda g: (g * (p - y) / self.data.size,))  # loss value unused


tape_ops = Tensor.__matmul__, Tensor.bce_with_logits
Tensor.__matmul__, Tensor.bce_with_logits = matmul_by_torch, bce_by_torch
try:
    gap_swapped, _ = largest_gap()
finally:
    Tensor.__matmul__, Tensor.bce_with_logits = tape_ops  # our tape again
print(f"PyTorch's matmul and sigmoid inside our tape: gradients bitwise equal {gap_swapped == 0}")

# %% [markdown]
# Output:
# ```text
# 200 random networks: largest gradient gap «number»
# largest gradient 4.15; one unit in its last place (ulp) 8.9e-16
# gap within 2 ulps of the largest gradient: True
# PyTorch's matmul and sigmoid inside our tape: gradients bitwise equal True
# ```
#
# float64 carries 53 significant bits, so between 4 and 8 neighbouring values are 8.9e-16
# apart. The two implementations compute the same sums, products and sigmoids, but
# PyTorch may evaluate them in another order, and each operation rounds: here the results
# differ by at most the last bit or two of the largest values. The last line finds where:
# with PyTorch's matrix products and sigmoid swapped into our tape for one more run, the
# gradients are bitwise equal. A wrong rule (a forgotten sum over a broadcast dimension, a
# transposed product) changes gradients by amounts the size of the gradients themselves.
# The gap's exact value depends on your CPU's kernels; the bound holds everywhere (and the
# gap is not 0: the two really are computed differently).
#
# One thing our tape does not do that PyTorch's does: free itself. PyTorch drops the
# arrays saved for backward as soon as backward has used them (call `backward` twice on the
# same graph and it refuses, unless the first call passed `retain_graph=True`; lesson 03b
# shows it).

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
# The third experiment of the cell uses a tool lesson 03b comes back to:
# `torch.autograd.graph.saved_tensors_hooks(pack, unpack)`. Inside it, each tensor an
# operation saves for backward goes to `pack`, autograd keeps whatever `pack` returns, and
# at backward `unpack` turns that back into the tensor. Here both return the tensor itself,
# so autograd's saved entry holds `x` itself rather than its own record of it.
# **Predict** too: does the same write through the alias still fail then, and if not, what
# gradient comes out?

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
# of saved tensors out of autograd's hands, and at backward autograd skips the version
# check for them, since it cannot follow versions through your hooks. So the same write
# goes unnoticed and backward returns 12, the derivative at 6, with no error. The counter
# turns that silent error into an exception. The full message goes on
# with a hint to enable anomaly detection, which makes the error also name the operation
# whose saved input was overwritten, with the line of the forward pass that ran it
# (lesson 03b shows it). The clone has its own storage and counter, so `x` stays at
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
# accumulation works (lesson 03b), and a bug when you forget to clear it. `zero_grad()`
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
# rejected (lesson 03b shows one, a custom backward with a term missing).


# %% [markdown]
# ## Summary
#
# - Autograd is a tape: each operation records its inputs and a backward rule; `backward`
#   visits the nodes in reverse topological order, sums the gradients of a tensor used
#   twice, and un-broadcasts gradients to the shapes of the inputs. Our 60-line NumPy tape
#   matches PyTorch within 2 float64 ulps of the largest gradient (not bit for bit: the
#   two libraries round some sums and products in a different order; with PyTorch's matmul
#   and sigmoid inside, our tape is bitwise equal), and trains a network on XOR.
# - PyTorch's graph is walkable (`grad_fn`, `next_functions`, `AccumulateGrad` for leaves),
#   rebuilt on every forward pass, and not recorded under `no_grad`; its nodes save what
#   their backward needs (both factors of a product, a ReLU's output, nothing for a sum).
# - Saved tensors are guarded by version counters: an in-place write to one (even through a
#   detached alias) makes backward raise. An in-place write to a leaf that requires a
#   gradient raises at once; hiding it under `no_grad` gives a wrong gradient instead.
#   `.grad` accumulates; `zero_grad()` sets it to `None`, and an optimizer skips such a
#   parameter. `gradcheck` in float64 checks a backward against finite differences; in
#   float32 the finite differences themselves are too coarse.

# %% [markdown]
# ## References
#
# - [`torch.autograd`](https://docs.pytorch.org/docs/2.13/autograd.html): the package this
#   lesson opens: `backward` and `grad`, the graph's nodes (`torch.autograd.graph`), in-place
#   correctness checks, `gradcheck`.
# - [`torch.Tensor.backward`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.backward.html) and
#   [`torch.autograd.backward`](https://docs.pytorch.org/docs/2.13/generated/torch.autograd.backward.html): what a
#   backward call accumulates into `.grad`, and `retain_graph`.
# - [`torch.no_grad`](https://docs.pytorch.org/docs/2.13/generated/torch.no_grad.html): the context in which nothing
#   is recorded (section 2), and the wrong "fix" of section 3.
# - [`torch.optim.Optimizer.zero_grad`](https://docs.pytorch.org/docs/2.13/generated/torch.optim.Optimizer.zero_grad.html):
#   `set_to_none=True`, and why an optimizer then skips the parameter.
# - [`torch.autograd.gradcheck.gradcheck`](https://docs.pytorch.org/docs/2.13/generated/torch.autograd.gradcheck.gradcheck.html):
#   the finite-difference check of section 3, its `eps`, `atol` and `rtol`.
# - Baydin et al., [Automatic differentiation in machine learning: a survey](https://arxiv.org/abs/1502.05767)
#   (2015): reverse mode, the tape, and why one backward pass costs about one forward.
# - Paszke et al., [PyTorch: An Imperative Style, High-Performance Deep Learning Library](https://arxiv.org/abs/1912.01703)
#   (2019): define-by-run, the graph rebuilt on every forward pass, and version counters.

# %% [markdown]
# ## Read the source
#
# Where, in the PyTorch you installed, what this lesson showed is implemented. Open each file
# in your editor at the line printed (the line numbers are those of your installed torch;
# they move between releases). The stops follow the lesson: the nodes of the recorded
# graph, the version counter and the saved tensor that checks it, the engine that runs
# backward, and gradcheck.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/autograd/graph.py", "class saved_tensors_hooks:",
     "`__enter__` pushes your `pack_hook`/`unpack_hook` pair as the default for every tensor "
     "an operation saves inside the block (section 3 used it to keep `x` itself); `class Node` "
     "at the top of the file is the interface every `grad_fn` answers to: `name()`, "
     "`next_functions`, `register_hook`."),
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
    ("torch/autograd/gradcheck.py", "def _slow_gradcheck(",
     "The default path of `gradcheck`: `_get_numerical_jacobian` perturbs one input entry at a "
     "time by `eps`, and each analytical Jacobian must be `allclose` to it within `rtol` and "
     "`atol`. `_check_inputs`, above, is where section 3's float32 warning comes from."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/autograd/graph.py:«line»  `class saved_tensors_hooks:`
#     `__enter__` pushes your `pack_hook`/`unpack_hook` pair as the default for every
#     tensor an operation saves inside the block (section 3 used it to keep `x` itself);
#     `class Node` at the top of the file is the interface every `grad_fn` answers to:
#     `name()`, `next_functions`, `register_hook`.
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
# torch/autograd/gradcheck.py:«line»  `def _slow_gradcheck(`
#     The default path of `gradcheck`: `_get_numerical_jacobian` perturbs one input entry
#     at a time by `eps`, and each analytical Jacobian must be `allclose` to it within
#     `rtol` and `atol`. `_check_inputs`, above, is where section 3's float32 warning
#     comes from.
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
# 3. **Spot the bug.** A forward pass normalises a parameter in place under `no_grad`, to
#    get past "a leaf Variable that requires grad is being used in an in-place operation":
#    `with torch.no_grad(): w.div_(w.norm())`, then `(w @ x).backward()` with `w = [3, 4]`,
#    `x = [1, 0]`. What gradient does `w` get, and what is wrong with it?
#
#    <details><summary>Answer</summary>
#
#    `[1.0, 0.0]`, the gradient of `w @ x` with the normalisation ignored: autograd never saw
#    it. The parameter itself was overwritten too (`w [0.6, 0.8]`). Written out of place,
#    `w / w.norm() @ x`, the gradient is `[0.128, -0.096]`, perpendicular to `w`: moving `w`
#    along itself changes nothing after normalisation.
#    (*§ Version counters, accumulation, gradcheck*)
#
#    </details>
#
# 4. **Explain.** `gradcheck` passes on `tanh(x @ w).sum()` in float64 and fails on the very
#    same function in float32, although the backward is correct in both. Why?
#
#    <details><summary>Answer</summary>
#
#    It compares autograd's gradient with central differences `(f(x + eps) - f(x - eps)) / 2eps`
#    at `eps = 1e-6`. In float32 the difference of two nearby values keeps only a digit or
#    two: the numerical derivative is off by more than 1e-2, outside the tolerances
#    (`atol=1e-5`, `rtol=1e-3`), and gradcheck warns that the input is not double precision.
#    In float64 the numerical derivative is good to better than 1e-9.
#    (*§ Version counters, accumulation, gradcheck*)
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement `unbroadcast(grad, shape)` and the
# `Tensor` tape (`+` with broadcasting, `@`, `relu`, `bce_with_logits`, `backward`), without
# looking back at section 1. Your gradients are compared with PyTorch's on random networks
# with leading-dimension and size-1 broadcasting and a tensor used twice, and your backward
# runs on a chain 3000 operations deep, where a recursive backward hits Python's default
# recursion limit, and on 40 stacked diamonds (each tensor read twice by the next), where
# each tensor must run its `grad_fn` once, after all its readers.
#
# Check your answers with `make exercises N=03a`; `solutions.py` has one way to write them.

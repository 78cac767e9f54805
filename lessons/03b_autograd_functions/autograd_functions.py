# %% [markdown]
# # 03b · Autograd, part b: VJPs, Functions and hooks
#
# Lesson 03a built a tape autograd and opened PyTorch's: the graph of nodes a forward pass
# records, what they save, and the version counters that guard it. This part uses that
# record. A backward pass is a vector-Jacobian product, and can itself be recorded;
# `torch.autograd.Function` lets you write a node's backward yourself; hooks let you watch
# and change what flows through the graph, and count (or keep) what it saves. Then two
# things that go wrong in real training loops: gradient accumulation that is not the
# full-batch gradient, and a NaN whose origin you must find.
#
# **What you will learn**
#
# - backward of a non-scalar output (a vector-Jacobian product), second derivatives with
#   `create_graph`, and per-sample gradients with `torch.func` (`grad`, `vmap`);
# - how to write a `torch.autograd.Function` (a tanh-GELU, a straight-through estimator),
#   and what its backward must agree with: the forward's in-place writes, shapes, dtypes;
# - tensor, forward and backward hooks, how to count the bytes autograd saves, what
#   activation checkpointing does to that count, and how a hook keeps tensors alive;
# - how to accumulate gradients over micro-batches of uneven sizes without changing the
#   result, and what accumulation cannot make equal (BatchNorm, dropout);
# - how to find where a NaN gradient comes from: a backward hook per module, then anomaly
#   mode (what it reports, and what it costs).
#
# **Prerequisites:** lesson 03a (the recorded graph, `grad_fn`, saved tensors, version
# counters, `.grad` accumulating, `gradcheck`), and lesson 01's views.
#
# **How to run:** `python lessons/03b_autograd_functions/autograd_functions.py` or
# `make lesson N=03b` from the repository root, or open `autograd_functions.ipynb`.
# Everything runs on the CPU in seconds. Each printing cell is followed by an *Output*
# block: what it printed with the pinned PyTorch (2.13.0). Your run prints the same lines,
# except the parts marked `«ratio»` (a speed ratio that depends on your CPU), `«version»`
# and `«folder»` (which torch you installed, and where) and `«line»` (line numbers in its
# source files).

# %%
import gc
import os
import re
import sys
import time
import warnings
import weakref
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
    """The first sentence of an error message: stable, and short enough to print (as in 03a)."""
    return str(err).split(". ")[0]


# %% [markdown]
# ## 1. Beyond one scalar loss: vector-Jacobian products, second derivatives, per-sample gradients
#
# `backward()` starts from a scalar: `dL/dL = 1`. For an output `y` with several entries
# there is no single gradient but a Jacobian `J` (`J[i, j] = dy_i/dx_j`), and reverse mode
# never builds it. What one backward pass computes is a *vector-Jacobian product*: given a
# vector `v` shaped like `y` (`grad_outputs`), it returns `v @ J`, the gradient of the scalar
# `sum(v * y)`. Lesson 03a's NumPy tape did the same: `grad_fn(g)` maps the gradient of an
# output to those of its inputs, for any `g`.
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
# hook on `x` counted them; tensor hooks are section 3's topic). `retain_graph=True` kept the saved tensors for the next call;
# the plain `backward(v)` freed them, so a second one refuses.
#
# **Predict.** The gradient is itself computed by operations. If autograd records them
# (`create_graph=True`), the gradient gets a `grad_fn` and can be differentiated again.
# For `y = x³` at `x = 3`, what are the first and second derivatives?
#
# The cell also counts what the backward pass itself saves, with the tool lesson 03a used
# to keep a saved tensor: inside `torch.autograd.graph.saved_tensors_hooks(pack, unpack)`,
# every tensor an operation saves for backward is handed to `pack` first. Here `pack`
# appends it to a list and returns it unchanged (`kept.append(t) or t`: `append` returns
# `None`, so the `or` gives `t`). **Predict** too: does a backward pass
# without `create_graph` save anything?

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
# ## 2. Custom `torch.autograd.Function`s
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
# to save a little compute, the same trade-off that section 3 makes at the scale of a
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
# A custom backward is trusted: autograd checks little of what it returns, and of what the
# forward did to its inputs only what lesson 03a's version counters catch. Three
# contracts, three ways to break them.
#
# **Predict.** A `Function` doubles its input in place (`x.mul_(2)`) and returns it; its
# backward, `2·grad`, is right. We apply it to `b = a.clone()`, then use `b`:
# `(5·b).sum()`. What gradient reaches `a`, without and with `ctx.mark_dirty(x)`? And if
# `b * b` had saved `b` before the unmarked write?


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

a = torch.ones(3, requires_grad=True)
b = a.clone()
b_squared = b * b  # MulBackward0 saves b, at version 0
doubling(False).apply(b)  # unmarked, but the write still bumps b's version counter
try:
    b_squared.sum().backward()
    unmarked_error = None
except RuntimeError as err:
    unmarked_error = first_sentence(err)
    print(f"b saved before the unmarked write: {unmarked_error}")

# %% [markdown]
# Output:
# ```text
# mark_dirty False: b [2.0, 2.0, 2.0], b.grad_fn CloneBackward0, d(5b)/da [5.0, 5.0, 5.0]
# mark_dirty True : b [2.0, 2.0, 2.0], b.grad_fn DoubleInPlaceBackward, d(5b)/da [10.0, 10.0, 10.0]
# b saved before the unmarked write: one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [3]], which is output 0 of Clone, is at version 1; expected version 0 instead
# ```
#
# Without `mark_dirty`, the graph never learns that `b` changed: `b` still says it is a clone
# of `a`, so every later use of `b` is differentiated as if `b = a`, and the gradient is 5
# instead of 10. No error, no warning. Only `b`'s version counter saw the write, so a node
# that saved `b` before it still refuses at backward (the last line). With `mark_dirty`,
# autograd re-records `b` as the Function's output (`b.grad_fn` changed), and the doubling
# is on the graph.
#
# **Guess.** What happens when a backward returns a gradient of the wrong shape? Of the
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
# ## 3. Hooks, and the bytes autograd keeps
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
# `torch.autograd.graph.saved_tensors_hooks(pack, unpack)`, which section 1 counted with,
# goes one level deeper: `pack` sees every tensor an operation saves for backward, the
# moment it is saved. We count the bytes of those tensors, leaving out the parameters (a
# `Linear` saves its weight, as the first line below shows, but the weight lives in the
# model anyway).
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
# what `pack` sees: peak memory also depends on when tensors are freed.
#
# `checkpoint` has two implementations, chosen by `use_reentrant`. We passed `False`, the
# one PyTorch recommends.
#
# **Guess.** The first block's input `x_mlp` needs no gradient, only the block's
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
# warns. Always write `use_reentrant=False`.


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
#
# ### What a hook holds stays alive
#
# A hook is a Python function, and whatever it refers to lives as long as the hook does.
# `scaled_by(factor)` below returns a gradient hook that multiplies by `factor.mean()`: its
# closure holds `factor`, and the tensor it is registered on holds the hook until
# `handle.remove()`. What a `pack` hook returns is held by the graph instead, as the saved
# tensor itself would be. A weak reference (`weakref.ref(t)`) tells whether a tensor is
# still alive without keeping it alive.
#
# **Predict.** We register `scaled_by(big)` on a tensor, `big` being 4 MiB, then `del big`.
# Is the 4 MiB freed? After `handle.remove()`? A `pack` hook returns a copy of each saved
# tensor: is the copy alive before backward, after it? And when `pack` also appends the
# tensor to a list of its own?


# %%
def scaled_by(factor):
    """A gradient hook that multiplies the gradient by factor.mean(): its closure holds factor."""
    return lambda g: g * factor.mean()


def alive(ref):
    """Whether the tensor behind a weak reference still exists (after a garbage collection)."""
    gc.collect()
    return ref() is not None


x_hook = torch.ones(3, requires_grad=True)
big = torch.ones(1024, 1024)  # (1024, 1024) float32: 4 MiB
big_ref = weakref.ref(big)  # does not keep big alive
hook_handle = x_hook.register_hook(scaled_by(big))
del big  # our last name for it
big_kept = alive(big_ref)
hook_handle.remove()
big_freed = not alive(big_ref)
print(f"4 MiB in a hook's closure: alive after del {big_kept}; freed after handle.remove() {big_freed}")

copies, stash = [], []  # weak references to what pack returned; a list pack appends to


def pack_copy(t):
    c = t.clone()
    copies.append(weakref.ref(c))
    return c  # the graph holds this until backward frees it


def pack_and_stash(t):
    stash.append(t)  # a strong reference: lives as long as the list
    return t


w_hook = torch.randn(256, 256, generator=torch.Generator().manual_seed(3), requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack_copy, lambda t: t):
    loss_hook = w_hook.tanh().sum()  # tanh saves its output: one packed copy
copy_before = alive(copies[0])
loss_hook.backward()
copy_after = alive(copies[0])
print(f"pack returns a copy: alive before backward {copy_before}; after backward {copy_after}")
with torch.autograd.graph.saved_tensors_hooks(pack_and_stash, lambda t: t):
    loss_hook = w_hook.tanh().sum()
loss_hook.backward()
stash_ref = weakref.ref(stash[0])
stash_kept = alive(stash_ref)
stash.clear()
stash_freed = not alive(stash_ref)
print(f"pack appends to a list: alive after backward {stash_kept}; freed once the list is cleared {stash_freed}")

# %% [markdown]
# Output:
# ```text
# 4 MiB in a hook's closure: alive after del True; freed after handle.remove() True
# pack returns a copy: alive before backward True; after backward False
# pack appends to a list: alive after backward True; freed once the list is cleared True
# ```
#
# Deleting your own name frees nothing while a hook still refers to the tensor: a
# forgotten hook handle on a model that lives for the whole run keeps its closure alive
# just as long. What `pack` returns is the graph's: freed when backward has used it (or
# when the graph goes, if backward never runs). A reference your hook keeps elsewhere is
# yours to drop; that is why `saved_bytes` above records only sizes, `s.nbytes()`, never
# the tensors.

# %% [markdown]
# ## 4. Gradient accumulation, and what it cannot make equal
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
print(f"token-weighted accumulation: within 1e-13 of the full batch {gap_tokens < 1e-13}")
print(f"mean of micro-batch means:   largest gap to full batch {gap_means:.1e}")

# %% [markdown]
# Output:
# ```text
# micro-batch token counts [3, 7, 2, 12]
# token-weighted accumulation: within 1e-13 of the full batch True
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
#
# Token weighting is exact because the loss is a sum of per-token terms, each computed from
# its own row. Two common layers break that premise. BatchNorm in training mode normalises
# each sample with the mean and variance of *its* batch, and updates its running statistics
# once per forward call; dropout draws a new random mask at every forward call.
#
# **Predict.** A network `Linear → norm → Tanh → Linear` in float64, and a batch of 24 split
# into 3 micro-batches of 8 (equal sizes: a weight of 1/3 each is the token weighting). With
# LayerNorm, which normalises each sample over its own 16 features, is the accumulated
# gradient the full batch's? With BatchNorm in training mode? In eval mode, where BatchNorm
# uses its running statistics? And do BatchNorm's running means end up the same?


# %%
def small_net(norm=None, p=0.0):
    """Linear(8, 16) -> norm -> Tanh -> Dropout(p) -> Linear(16, 1), float64: the same
    weights at every call, drawn without touching the lesson's random stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        layer = {None: nn.Identity(), "LayerNorm": nn.LayerNorm(16), "BatchNorm": nn.BatchNorm1d(16)}[norm]
        return nn.Sequential(nn.Linear(8, 16), layer, nn.Tanh(), nn.Dropout(p), nn.Linear(16, 1)).double()


gen = torch.Generator().manual_seed(2)
x24 = torch.randn(24, 8, dtype=torch.float64, generator=gen)  # (B, 8)
y24 = torch.randn(24, 1, dtype=torch.float64, generator=gen)  # (B, 1)


def net_grad(model, micro_batches):
    """All parameter gradients, flattened, accumulated over equal micro-batches (weight 1/n each)."""
    model.zero_grad()
    for rows in torch.arange(24).chunk(micro_batches):
        (F.mse_loss(model(x24[rows]), y24[rows]) / micro_batches).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def accumulation_gap(full, micro):
    """Largest |full-batch gradient - gradient accumulated over 3 micro-batches|."""
    return (net_grad(full, 1) - net_grad(micro, 3)).abs().max().item()


norm_gaps = {}
for norm, mode in [("LayerNorm", "train"), ("BatchNorm", "train"), ("BatchNorm", "eval")]:
    full_net, micro_net = small_net(norm).train(mode == "train"), small_net(norm).train(mode == "train")
    norm_gaps[norm, mode] = accumulation_gap(full_net, micro_net)
    print(f"{norm}, {mode} mode: accumulated gradient within 1e-13 of the full batch's "
          f"{norm_gaps[norm, mode] < 1e-13}")
    if (norm, mode) == ("BatchNorm", "train"):
        bn_full, bn_micro = full_net[1], micro_net[1]
print(f"BatchNorm running_mean equal to the full batch's: {torch.equal(bn_full.running_mean, bn_micro.running_mean)}; "
      f"updates {bn_micro.num_batches_tracked.item()} instead of {bn_full.num_batches_tracked.item()}")

# %% [markdown]
# Output:
# ```text
# LayerNorm, train mode: accumulated gradient within 1e-13 of the full batch's True
# BatchNorm, train mode: accumulated gradient within 1e-13 of the full batch's False
# BatchNorm, eval mode: accumulated gradient within 1e-13 of the full batch's True
# BatchNorm running_mean equal to the full batch's: False; updates 3 instead of 1
# ```
#
# LayerNorm's statistics belong to one sample, so splitting the batch changes nothing. In
# training mode BatchNorm normalises the first 8 samples with the mean of those 8, not of
# all 24: a different function of the parameters, so a different gradient, by far more than
# rounding. Its running statistics moved three times, each time by `momentum` (0.1) towards
# one micro-batch's mean, instead of once towards the full batch's. In eval mode BatchNorm
# is a fixed affine map per feature and accumulation is exact again. Nothing makes training
# mode exact: the usual remedies are per-sample norms (LayerNorm, GroupNorm) or micro-batches
# large enough that their statistics are good estimates.
#
# **Predict.** Now no norm layer, and `Dropout(0.5)` before the last `Linear`. Two
# full-batch backward passes of the same network on the same batch: the same gradient? And
# the gradient accumulated over 3 micro-batches?

# %%
drop_net = small_net(p=0.5)
with torch.random.fork_rng(devices=[]):  # the masks come from a stream of their own
    torch.manual_seed(5)
    g_drop = [net_grad(drop_net, 1), net_grad(drop_net, 1), net_grad(drop_net, 3)]
print(f"Dropout(0.5), two full-batch passes: gradients equal {torch.equal(g_drop[0], g_drop[1])}; "
      f"accumulated equal to either {torch.equal(g_drop[2], g_drop[0]) or torch.equal(g_drop[2], g_drop[1])}")
drop_eval_gap = accumulation_gap(small_net(p=0.5).eval(), small_net(p=0.5).eval())
print(f"Dropout(0.5), eval mode: accumulated gradient within 1e-13 of the full batch's {drop_eval_gap < 1e-13}")

# %% [markdown]
# Output:
# ```text
# Dropout(0.5), two full-batch passes: gradients equal False; accumulated equal to either False
# Dropout(0.5), eval mode: accumulated gradient within 1e-13 of the full batch's True
# ```
#
# With dropout there is no single full-batch gradient to match: each forward pass draws
# new masks, so even two full-batch passes disagree. Accumulation draws its masks in three
# calls instead of one; each element's mask is still an independent coin flip with the
# same odds, so the accumulated gradient is one more draw from the same distribution. It
# cannot be compared with a full-batch run bit for bit, and need not be. In eval mode
# dropout is the identity and accumulation is exact.

# %% [markdown]
# ## 5. Where does a NaN come from?
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
# what does it say about lesson 03a's overwritten saved tensor?


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


for what, run in [("NaN", lambda: nan_loss().backward()), ("03a's write", overwritten_saved_tensor)]:
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
# 03a's write: one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [1]] is at version 1; expected version 0 instead
#   its warning: Error detected in MulBackward0. Traceback of forward call that caused the error:
#   the forward traceback ends in: overwritten_saved_tensor
# ```
#
# The hook points at `SafeSqrt`; anomaly mode at the node inside it, `SqrtBackward0`, and
# its warning carries the traceback of the forward call that recorded the node, ending in
# `sqrt_where_positive`, with file and line (uncaught, the warning prints in full). For
# lesson 03a's error it names `MulBackward0` and the line that recorded it, `y = x * x`:
# the operation whose saved input was overwritten, not the write. The fix here: take the
# square root of `h.clamp(min=tiny)` (or mask the input, not only the output), so that
# neither branch is NaN.
#
# Anomaly mode is a debugging tool, not a setting to leave on: recording a Python
# traceback for every forward operation, and checking every backward output, costs time.
#
# **Guess.** How much slower is one forward and backward of section 3's four-block MLP
# under anomaly mode?


# %%
def step_ms(anomaly, repeats=15):
    """Fastest thread CPU time of one forward + backward of the section 3 MLP, in ms."""
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
# The ratio depends on how fast your CPU runs the matrix products; expect a few times.
# The time is thread CPU time, the fastest of 15 runs, so other programs on the machine barely move it. Turn
# anomaly mode on to find a NaN or an overwritten tensor, then off again.

# %% [markdown]
# ## Summary
#
# - A backward pass computes a vector-Jacobian product (`grad_outputs`); `create_graph=True`
#   records the backward itself, for second derivatives; `torch.func.vmap(grad(f))` gives
#   per-sample gradients in one batched call.
# - `torch.autograd.Function` lets you write the backward yourself: a tanh-GELU, or a
#   straight-through estimator that is deliberately not the derivative. Declare in-place
#   writes with `ctx.mark_dirty`, return gradients of the input's shape and dtype (a wrong
#   dtype is cast silently), and do not return views of inputs that callers will write to.
# - Hooks observe or edit gradients and activations; `saved_tensors_hooks` shows what
#   autograd keeps (here 296 KiB for a small MLP, 40 KiB with checkpointing). What a hook
#   refers to lives as long as the hook; what `pack` returns, as long as the graph needs it.
# - Accumulate micro-batch gradients with token weights, not as a mean of means. BatchNorm
#   in training mode and dropout make accumulation differ from the full batch; per-sample
#   layers and eval mode keep it exact.
# - To find a NaN: a backward hook per module names the module that made it; anomaly mode
#   names the backward node and the forward line that recorded it, at a multiple of the
#   step's time.

# %% [markdown]
# ## References
#
# - [`torch.autograd.grad`](https://docs.pytorch.org/docs/2.13/generated/torch.autograd.grad.html) and
#   [`torch.autograd.functional.jacobian`](https://docs.pytorch.org/docs/2.13/generated/torch.autograd.functional.jacobian.html):
#   `grad_outputs`, `retain_graph`, `create_graph`, and the Jacobian one row per pass.
# - [`torch.func.grad`](https://docs.pytorch.org/docs/2.13/generated/torch.func.grad.html),
#   [`torch.func.vmap`](https://docs.pytorch.org/docs/2.13/generated/torch.func.vmap.html) and
#   [`torch.func.functional_call`](https://docs.pytorch.org/docs/2.13/generated/torch.func.functional_call.html):
#   the per-sample gradients of section 1.
# - [`torch.autograd.Function`](https://docs.pytorch.org/docs/2.13/generated/torch.autograd.Function.html) and
#   [`FunctionCtx.mark_dirty`](https://docs.pytorch.org/docs/2.13/generated/torch.autograd.function.FunctionCtx.mark_dirty.html):
#   writing a backward, and declaring an in-place write.
# - [`torch.Tensor.register_hook`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.register_hook.html),
#   [`torch.nn.Module`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.Module.html#torch.nn.Module.register_full_backward_hook)
#   (`register_forward_hook`, `register_full_backward_hook`) and
#   [`saved_tensors_hooks`](https://docs.pytorch.org/docs/2.13/autograd.html#torch.autograd.graph.saved_tensors_hooks):
#   the hooks of section 3.
# - [`torch.nn.BatchNorm1d`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.BatchNorm1d.html) and
#   [`torch.nn.Dropout`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.Dropout.html): `momentum`, the running
#   statistics and what training and eval mode change (section 4).
# - [`torch.autograd.detect_anomaly`](https://docs.pytorch.org/docs/2.13/generated/torch.autograd.detect_anomaly.html):
#   anomaly mode, section 5.
# - Hendrycks and Gimpel, [Gaussian Error Linear Units (GELUs)](https://arxiv.org/abs/1606.08415) (2016): the tanh
#   approximation of section 2.
# - [Estimating or Propagating Gradients Through Stochastic Neurons for Conditional Computation](https://arxiv.org/abs/1308.3432)
#   (Bengio, Léonard and Courville, 2013): the straight-through estimator.
# - Chen et al., [Training Deep Nets with Sublinear Memory Cost](https://arxiv.org/abs/1604.06174) (2016): activation
#   checkpointing, the trade of section 3.
# - Ioffe and Szegedy, [Batch Normalization](https://arxiv.org/abs/1502.03167) (2015): batch statistics and the
#   running averages of section 4.

# %% [markdown]
# ## Read the source
#
# Where, in the PyTorch you installed, what this lesson showed is implemented. Open each file
# in your editor at the line printed (the line numbers are those of your installed torch;
# they move between releases). The stops follow the lesson: a custom `Function`'s in-place
# contract, the hooks and their handles, checkpointing, BatchNorm's running statistics, and
# anomaly mode.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/autograd/function.py", "def mark_dirty(",
     "`mark_dirty` only records the tensors (`self.dirty_tensors`); autograd then re-records "
     "each as an output of the Function, which is why `b.grad_fn` became "
     "`DoubleInPlaceBackward` and the gradient 10 in section 2."),
    ("torch/utils/hooks.py", "class RemovableHandle:",
     "What every `register_*` returns: it holds only a weak reference to the dictionary of "
     "hooks, and `remove()` deletes its entry there, the hook's last reference: section 3's "
     "closure and its 4 MiB go with it."),
    ("torch/utils/checkpoint.py", "def checkpoint(",
     "Without `use_reentrant` it warns and takes `True`: `CheckpointFunction`, whose forward "
     "runs the block under `torch.no_grad()`. `False` goes through "
     "`_checkpoint_without_reentrant_generator`, which records the block normally and swaps "
     "what it saves through `_checkpoint_hook`, a `saved_tensors_hooks` subclass."),
    ("torch/nn/modules/batchnorm.py", "class _BatchNorm(_NormBase):",
     "`forward` picks batch statistics when `self.training` (or no running statistics are "
     "kept) and bumps `num_batches_tracked` once per call, which is why three micro-batches "
     "count 3 updates in section 4; `F.batch_norm` then updates `running_mean` by `momentum`."),
    ("torch/autograd/anomaly_mode.py", "class detect_anomaly:",
     "The context manager of section 5: it sets `torch.set_anomaly_enabled(True, check_nan)`; "
     "the engine then checks each backward node's outputs for NaN, and every forward "
     "operation records its Python traceback, the cost measured there."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/autograd/function.py:«line»  `def mark_dirty(`
#     `mark_dirty` only records the tensors (`self.dirty_tensors`); autograd then
#     re-records each as an output of the Function, which is why `b.grad_fn` became
#     `DoubleInPlaceBackward` and the gradient 10 in section 2.
# torch/utils/hooks.py:«line»  `class RemovableHandle:`
#     What every `register_*` returns: it holds only a weak reference to the dictionary of
#     hooks, and `remove()` deletes its entry there, the hook's last reference: section
#     3's closure and its 4 MiB go with it.
# torch/utils/checkpoint.py:«line»  `def checkpoint(`
#     Without `use_reentrant` it warns and takes `True`: `CheckpointFunction`, whose
#     forward runs the block under `torch.no_grad()`. `False` goes through
#     `_checkpoint_without_reentrant_generator`, which records the block normally and
#     swaps what it saves through `_checkpoint_hook`, a `saved_tensors_hooks` subclass.
# torch/nn/modules/batchnorm.py:«line»  `class _BatchNorm(_NormBase):`
#     `forward` picks batch statistics when `self.training` (or no running statistics are
#     kept) and bumps `num_batches_tracked` once per call, which is why three
#     micro-batches count 3 updates in section 4; `F.batch_norm` then updates
#     `running_mean` by `momentum`.
# torch/autograd/anomaly_mode.py:«line»  `class detect_anomaly:`
#     The context manager of section 5: it sets `torch.set_anomaly_enabled(True,
#     check_nan)`; the engine then checks each backward node's outputs for NaN, and every
#     forward operation records its Python traceback, the cost measured there.
# ```

# %% [markdown]
# ## Mastery check
#
# Answer each question before you open its answer; every answer points to the section whose
# printed lines show it.
#
# 1. **Spot the bug.** A custom `Function` doubles its input in place, `return x.mul_(2)`,
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
# 2. **Predict.** Four residual MLP blocks, batch 32: autograd saves 303104 bytes of
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
# 3. **Explain.** You `del` the only name of a 4 MiB statistics tensor that a gradient hook
#    uses through its closure. Is the memory freed? When is it?
#
#    <details><summary>Answer</summary>
#
#    No: the hook's closure still refers to it (`alive after del True`). It is freed when the
#    hook goes, here at `handle.remove()` (`freed after handle.remove() True`). In the same
#    way a `pack` hook that appends saved tensors to a list keeps them after backward, until
#    the list is cleared, while what `pack` merely returns is freed by backward.
#    (*§ Hooks, and the bytes autograd keeps*)
#
#    </details>
#
# 4. **Predict.** A batch of 24 is split into 3 micro-batches of 8, each loss weighted 1/3,
#    and the gradients accumulate. The network has a BatchNorm layer in training mode. Is
#    the gradient the full batch's? Are BatchNorm's running means? And with LayerNorm instead?
#
#    <details><summary>Answer</summary>
#
#    Neither: the gradient is not within rounding of the full batch's, since each micro-batch
#    is normalised with its own mean and variance, and the running means differ, updated 3
#    times instead of once. With LayerNorm, whose statistics belong to one sample, the
#    accumulated gradient is within 1e-13 of the full batch's; so is BatchNorm's in eval
#    mode. (*§ Gradient accumulation, and what it cannot make equal*)
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
# 1. `gelu_tanh(x)` and `gelu_tanh_backward(x, grad_out)` on NumPy arrays, section 2's
#    Function without torch; they are compared with `F.gelu(approximate="tanh")` and its
#    gradient from x = -50 to 50.
# 2. `combine_microbatch_grads(grads, counts)`: the full-batch mean gradient from
#    per-micro-batch mean gradients and their token counts (some counts may be 0). A NaN in
#    a micro-batch with a positive count must reach the result.
#
# Check your answers with `make exercises N=03b`; `solutions.py` has one way to write them.

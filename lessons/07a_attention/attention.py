# %% [markdown]
# # 07a · Attention: the formula, SDPA, heads and masks
#
# Attention is one formula, `softmax(Q Kᵀ / √d + M) · V`. PyTorch computes it with
# `F.scaled_dot_product_attention` (SDPA), which picks a kernel for you. This lesson, the
# first of two parts, takes the formula apart on tiny tensors, where each number can be
# read: why it divides by √d, what SDPA computes and how a multi-head layer calls it, and
# what masks, causal alignment, dropout and grouped-query attention do. Part 07b opens the
# kernels: the online softmax that lets them skip the score matrix, SDPA's backends, and
# FlexAttention.
#
# **What you will learn**
#
# - how many score cells attention makes (B·H·S·S), and why the scores are divided by √d;
# - that SDPA's math backend *is* the formula, forward and backward, seen with three tools
#   of earlier lessons: a float64 comparison, lesson 02's dispatch log and lesson 03a's
#   `gradcheck`;
# - that SDPA reads lesson 01's permuted head views without copying them, and multi-head
#   attention end to end (projections, heads, SDPA, merge), equal to `nn.MultiheadAttention`;
# - the mask conventions (SDPA: True = keep; `MultiheadAttention`'s `key_padding_mask`:
#   True = ignore), what masks do to the attention weights, in a picture, and what a query
#   with no key left gets;
# - `is_causal`'s upper-left alignment and what a decode step needs; that `dropout_p`
#   ignores `model.eval()`;
# - grouped-query attention with `enable_gqa`, and which backend copies K and V for it.
#
# **Prerequisites:** lesson 01 (the (B, H, S, D) layout), lesson 02 (a `TorchDispatchMode`
# that logs ATen ops), lesson 03a (`gradcheck`), lesson 06a (the profiler). Softmax and
# matrix products.
#
# **How to run:** `python lessons/07a_attention/attention.py` or `make lesson N=07a` from the
# repository root, or open `attention.ipynb`. Everything runs on the CPU in a few seconds.
# Each printing cell is followed by an *Output* block: what it printed with the pinned
# PyTorch (2.13.0). Your run prints the same lines, except the parts marked `«version»`,
# `«folder»` or `«line»` in the last one: which torch you installed, and where. Run outside
# the course's venv, this lesson may also print PyTorch's own diagnostic lines to stderr:
# `USDT: ... profiler_start` and `profiler_stop` around each profiler run and, on a CUDA
# build without a GPU, `gpuGetDeviceCount failed`. They are harmless, and `make lesson` runs
# the lesson in the course's own environment, which turns them off.

# %%
import contextlib
import math
import os
import sys
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right
from torch.profiler import profile
from torch.utils._python_dispatch import TorchDispatchMode

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DEVICE = torch.device(os.environ.get("COURSE_DEVICE", "cpu"))


def formula(q, k, v, keep=None):
    """softmax(q kᵀ / √d + M) v, with M = 0 where keep is True and -inf elsewhere."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, L, S)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, H, L, D)


def rows(t):
    """A small tensor as nested lists of numbers with one decimal, for printing."""
    return np.round(t.detach().cpu().numpy(), 1).tolist()


# %% [markdown]
# ## 1. The formula, and the size of the score matrix
#
# With queries, keys and values of shape (B, H, S, D), attention computes a score for every
# (query, key) pair of every head of every batch element: `Q Kᵀ` has shape (B, H, S, S).
#
# **Predict.** How many score cells for B=1, H=2, S=4? For the same two heads at S=8192?
# How many bytes is that in fp32 and in bf16?


# %%
def score_cells(b, h, s_q, s_k=None):
    """Cells of the (B, H, S_q, S_k) score matrix."""
    return b * h * s_q * (s_q if s_k is None else s_k)


for bhs in [(1, 2, 4), (1, 2, 8192)]:
    n = score_cells(*bhs)
    print(f"(B, H, S) = {bhs}: {n:,} score cells, fp32 {4 * n:,} bytes, bf16 {2 * n:,} bytes")
print(f"(1, 2, 8192) fp32 scores: {4 * score_cells(1, 2, 8192) / 2**20:.0f} MiB per layer")

# %% [markdown]
# Output:
# ```text
# (B, H, S) = (1, 2, 4): 32 score cells, fp32 128 bytes, bf16 64 bytes
# (B, H, S) = (1, 2, 8192): 134,217,728 score cells, fp32 536,870,912 bytes, bf16 268,435,456 bytes
# (1, 2, 8192) fp32 scores: 512 MiB per layer
# ```
#
# The scores grow with S², while Q, K, V and the output grow with S·D. At S = 8192 two heads
# already need half a GiB of fp32 scores; a real model has 32 heads, a batch, and keeps
# what backward needs for every layer. Written as the formula, attention also *moves* those
# bytes: it writes the scores, reads them for the softmax, writes the probabilities and
# reads them again for the product with V. Fused kernels never store the matrix; part 07b
# shows how. This part stays with the formula.
#
# ### Why the scores are divided by √d
#
# The formula divides `q · k` by √d, d being the size of a query (and key) vector. A dot
# product of two vectors of d independent entries, each with mean 0 and variance 1, is a
# sum of d independent products, each with mean 0 and variance 1.
#
# **Predict.** For d = 16, 64 and 256, what is the variance of `q · k`, and of `q · k / √d`?
# With d = 256, what does a softmax over 64 keys look like without the division?


# %%
def dot_variance(d, n=4096, gen=None):
    """Variance of q · k over n pairs of independent standard normal d-vectors, unscaled and scaled."""
    q, k = (torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(2))  # (n, d)
    dots = (q * k).sum(-1)  # (n,)
    return dots.var().item(), (dots / math.sqrt(d)).var().item()


def softmax_spread(scores):
    """Rows nearly one-hot (largest probability above 0.99), mean largest probability, and
    the median norm of each row's softmax Jacobian diag(p) - p pᵀ (how much gradient passes)."""
    p = torch.softmax(scores, dim=-1)  # (L, S)
    jacobian = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # (L, S, S)
    top = p.max(dim=-1).values
    return int((top > 0.99).sum()), top.mean().item(), jacobian.flatten(1).norm(dim=1).median().item()


scale_gen = torch.Generator().manual_seed(0)  # its own stream: the cells below keep their numbers
for d in (16, 64, 256):
    raw, scaled = dot_variance(d, gen=scale_gen)
    print(f"d={d:>3}: var(q·k) {raw:6.1f}, var(q·k/√d) {scaled:.2f}")
q_s, k_s = (torch.randn(n, 256, generator=scale_gen, dtype=torch.float64) for n in (128, 64))  # (L, d), (S, d)
spread = {"unscaled": softmax_spread(q_s @ k_s.T), "scaled": softmax_spread(q_s @ k_s.T / math.sqrt(256))}
for name, (hot, top, jac) in spread.items():
    print(f"{name:<8} d=256, 128 queries x 64 keys: {hot:>3} rows nearly one-hot, mean largest "
          f"probability {top:.3f}, median Jacobian norm {jac:.3f}")

# %% [markdown]
# Output:
# ```text
# d= 16: var(q·k)   15.8, var(q·k/√d) 0.99
# d= 64: var(q·k)   61.6, var(q·k/√d) 0.96
# d=256: var(q·k)  261.7, var(q·k/√d) 1.02
# unscaled d=256, 128 queries x 64 keys:  57 rows nearly one-hot, mean largest probability 0.891, median Jacobian norm 0.033
# scaled   d=256, 128 queries x 64 keys:   0 rows nearly one-hot, mean largest probability 0.104, median Jacobian norm 0.177
# ```
#
# The variance grows with d, as the sum of d unit-variance products predicts, and dividing
# by √d brings it back to about 1 whatever the head size. Without the division, scores of
# spread √256 = 16 make the softmax nearly one-hot: 57 of 128 rows put more than 99 % of
# their weight on one key. Such a row passes almost no gradient to its scores: the
# softmax's Jacobian, `diag(p) - p pᵀ`, is nearly zero when `p` is one-hot, and its median
# norm is here about five times smaller than with the scale (the factor depends on the
# draw; it stays well above 1). With the scale, a head starts out spreading its attention
# and can learn where to look. (The variance argument assumes unit-variance entries; a
# model's q and k are whatever training makes them, and the scale keeps their starting
# point sane.)

# %% [markdown]
# ## 2. SDPA is the formula
#
# `sdpa_kernel(SDPBackend.MATH)` restricts SDPA to its reference implementation, written
# with ordinary ATen ops.
#
# **Predict.** In float64, does SDPA's output equal `formula` above? And the gradients with
# respect to Q, K and V?

# %%
shape = (1, 2, 4, 8)  # (B, H, S, D)
q, k, v = (torch.randn(shape, dtype=torch.float64, device=DEVICE, requires_grad=True) for _ in range(3))
grad_out = torch.randn(shape, dtype=torch.float64, device=DEVICE)  # (B, H, S, D)
with sdpa_kernel(SDPBackend.MATH):
    out_sdpa = F.scaled_dot_product_attention(q, k, v)
out_ref = formula(q, k, v)
grads_sdpa = torch.autograd.grad(out_sdpa, (q, k, v), grad_out)
grads_ref = torch.autograd.grad(out_ref, (q, k, v), grad_out)
for name, a, b in zip(["out", "dQ", "dK", "dV"], (out_sdpa, *grads_sdpa), (out_ref, *grads_ref)):
    torch.testing.assert_close(a, b)  # float64 tolerances: rtol 1e-7, atol 1e-7
    print(f"{name:<3} {tuple(a.shape)} matches the formula, max error below 1e-12: "
          f"{(a - b).abs().max().item() < 1e-12}")

# %% [markdown]
# Output:
# ```text
# out (1, 2, 4, 8) matches the formula, max error below 1e-12: True
# dQ  (1, 2, 4, 8) matches the formula, max error below 1e-12: True
# dK  (1, 2, 4, 8) matches the formula, max error below 1e-12: True
# dV  (1, 2, 4, 8) matches the formula, max error below 1e-12: True
# ```
#
# All four agree within float64 tolerance (`assert_close` would have raised otherwise), and
# each largest gap is rounding-level. They need not be zero, nor the same on every CPU: the
# math backend rounds in another order than `formula` (it scales Q and K before their
# product), and a CPU's matmul sums in an order set by its vector width and its BLAS. So a
# comparison of two implementations asserts a bound, never `torch.equal`. The math backend
# is the formula in plain ATen ops, which makes it a good reference of your own: when a
# fused result looks odd, rerun it under `MATH`.
#
# ### What one SDPA call dispatches: lesson 02's log
#
# Lesson 02's `TorchDispatchMode` logs every ATen op that reaches the kernels.
#
# **Predict.** Which ops does one SDPA call dispatch on the CPU, in float32 and in float64?
# (A guess: you may have read that fused attention kernels take only half precision, so
# float64 could well fall back to the formula.) And under the math backend?


# %%
class OpLog(TorchDispatchMode):
    """Lesson 02's dispatch mode: the name of every ATen op that reaches it, in order."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def dispatched(dtype, backend=None):
    """The ATen ops one SDPA call on (1, 2, 4, 8) inputs dispatches, as OpLog sees them."""
    x = torch.ones(1, 2, 4, 8, dtype=dtype)  # (B, H, S, D): the values do not matter here
    ctx = sdpa_kernel(SDPBackend.__members__[backend]) if backend else contextlib.nullcontext()
    with ctx, OpLog() as log:
        F.scaled_dot_product_attention(x, x, x)
    return log.ops


for dtype in (torch.float32, torch.float64):
    print(f"{str(dtype):<13} default: {dispatched(dtype)}")
math_ops = dispatched(torch.float64, "MATH")
print(f"torch.float64 MATH: {len(math_ops)} ops, distinct {list(dict.fromkeys(math_ops))}")

# %% [markdown]
# Output:
# ```text
# torch.float32 default: ['_scaled_dot_product_flash_attention_for_cpu']
# torch.float64 default: ['_scaled_dot_product_flash_attention_for_cpu']
# torch.float64 MATH: 16 ops, distinct ['mul', 'transpose', 'expand', 'view', 'bmm', '_unsafe_view', '_safe_softmax']
# ```
#
# `F.scaled_dot_product_attention` itself never reaches the mode: like lesson 02's `matmul`
# it is a composite, which picks a backend and calls that backend's op. By default on the
# CPU that is one op, the CPU flash kernel, in float32 and in float64 alike. The
# half-precision rule you may have read about is the CUDA flash kernel's (unverified on a
# GPU; part 07b says where PyTorch writes such rules). Under the math backend the formula
# appears op by op: two `mul` (Q and K each scaled by √(1/√d), so that their product
# carries the scale), the `transpose` of K, a `bmm` for the scores, a
# `_safe_softmax`, and a `bmm` with V; the `expand`, `view` and `_unsafe_view` around
# each `bmm` are `matmul`'s reshapes to 3-D. `_safe_softmax` returns in section 3.
#
# ### Gradients: lesson 03a's `gradcheck`
#
# `torch.autograd.gradcheck` compares the gradients autograd computes with finite
# differences, in float64 (lesson 03a).
#
# **Predict.** Does SDPA's backward pass it under the math backend, whose backward autograd
# assembles from the ops above? And under the CPU flash kernel, whose backward is one
# hand-written op?

# %%
check_gen = torch.Generator().manual_seed(2)  # its own stream: the cells below keep their numbers
qc, kc, vc = (torch.randn(1, 2, 4, 8, dtype=torch.float64, generator=check_gen, requires_grad=True)
              for _ in range(3))  # (B, H, S, D)
passed = {}
for backend in ("MATH", "FLASH_ATTENTION"):
    with sdpa_kernel(SDPBackend.__members__[backend]):
        passed[backend] = torch.autograd.gradcheck(F.scaled_dot_product_attention, (qc, kc, vc))
    print(f"gradcheck, float64, {backend}: {passed[backend]}")

# %% [markdown]
# Output:
# ```text
# gradcheck, float64, MATH: True
# gradcheck, float64, FLASH_ATTENTION: True
# ```
#
# Both pass: for each input, the Jacobian that backward implies matches the one finite
# differences measure, within `gradcheck`'s tolerances. The math backend's backward is
# autograd's own, chained through `bmm` and `_safe_softmax`; the flash kernel's is a
# separate C++ op, and `gradcheck` is how you would catch a mistake in such a hand-written
# derivative. (In float32 the finite differences themselves are too coarse, and `gradcheck`
# warns and fails: lesson 03a showed it on a smaller function.)
#
# ### Lesson 01's views, through SDPA
#
# A transformer gets its queries from one projection laid out (B, S, H·D) and swaps S and H
# with a free view (lesson 01, *01 § The attention layout*). There, `q @ kᵀ` on those
# permuted views copied both operands: `matmul` reshapes to 3-D for one `bmm`, and the
# reshape cannot merge B and H on those strides.
#
# **Predict** (a guess: nothing so far shows how SDPA reads its inputs). Does SDPA copy the
# permuted views too? And is its result the same as on contiguous copies of them? The
# profiler (lesson 06a) lists every `aten::copy_` a call runs.


# %%
def copies(fn):
    """The destination shape of every `aten::copy_` that fn runs, nested calls included."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return [tuple(e.input_shapes[0]) for e in prof.events() if e.name == "aten::copy_"]


views = torch.Generator().manual_seed(0)  # its own stream: the cells below keep their numbers
B1, S1, H1, D1 = 2, 4, 3, 5
q_view, k_view, v_view = (torch.randn(B1, S1, H1 * D1, generator=views).view(B1, S1, H1, D1).transpose(1, 2)
                          for _ in range(3))  # (B, H, S, D) views of (B, S, H*D) projections
print(f"q @ k^T on the views: copies {copies(lambda: q_view @ k_view.transpose(-2, -1))}")
print(f"SDPA on the views:    copies {copies(lambda: F.scaled_dot_product_attention(q_view, k_view, v_view))}")
out_views = F.scaled_dot_product_attention(q_view, k_view, v_view)  # (B, H, S, D)
out_copies = F.scaled_dot_product_attention(*(t.contiguous() for t in (q_view, k_view, v_view)))
print(f"bitwise equal to SDPA on contiguous copies: {torch.equal(out_views, out_copies)}")
merged = out_views.transpose(1, 2)  # (B, S, H, D): back to the projection's layout
print(f"output strides {out_views.stride()}; transposed back, contiguous: {merged.is_contiguous()}")

# %% [markdown]
# Output:
# ```text
# q @ k^T on the views: copies [(2, 3, 4, 5), (2, 3, 5, 4)]
# SDPA on the views:    copies []
# bitwise equal to SDPA on contiguous copies: True
# output strides (60, 5, 15, 1); transposed back, contiguous: True
# ```
#
# The CPU flash kernel reads Q, K and V through their strides: no copy op runs, and the
# result is the same, bit for bit, as on contiguous inputs. So a `.contiguous()` before
# SDPA would only add a copy. Its output even comes back in the query's layout: strides
# (60, 5, 15, 1) are a (B, H, S, D) view of (B, S, H, D) memory, so the transpose back to
# (B, S, H·D) that the next projection needs is contiguous already, and
# `y.transpose(1, 2).contiguous()` (lesson 01's nanoGPT line) returns `y`'s storage
# without copying.

# %% [markdown]
# ### Multi-head attention, end to end
#
# A transformer layer does not call SDPA on its input. It projects each token's vector x
# (size E) three times, to a query, a key and a value, each of size E; splits each into H
# heads of size D = E / H (a view and a transpose, as above); runs SDPA once for all heads;
# merges the heads back to (B, S, E); and projects the result once more. Each head attends
# with its own slice of the projections, so different heads can look at different keys.
# `nn.MultiheadAttention` is that layer, with the three input projections stored as one
# (3E, E) matrix `in_proj_weight` and the last one as `out_proj`.
#
# **Predict.** Written by hand with the weights of an `nn.MultiheadAttention` (E = 16,
# H = 4), in float64, how close is our output to the module's? And are its per-head
# attention weights the softmax of our scores?


# %%
def multi_head_attention(x, w_in, b_in, w_out, b_out, heads):
    """x (B, S, E) -> (B, S, E): project to q, k, v, split the heads, SDPA, merge, project."""
    b, s, e = x.shape
    q, k, v = (x @ w_in.T + b_in).chunk(3, dim=-1)  # each (B, S, E)
    q, k, v = (t.view(b, s, heads, e // heads).transpose(1, 2) for t in (q, k, v))  # (B, H, S, D)
    y = F.scaled_dot_product_attention(q, k, v)  # (B, H, S, D), laid out as (B, S, H, D)
    y = y.transpose(1, 2).reshape(b, s, e)  # (B, S, E): a view after the CPU flash kernel
    return y @ w_out.T + b_out, (q, k)


E, H_MHA = 16, 4
with torch.random.fork_rng(devices=[]):  # the init gets its own numbers: the cells below keep theirs
    torch.manual_seed(1)
    layer = nn.MultiheadAttention(E, H_MHA, batch_first=True, dtype=torch.float64)
    for bias in (layer.in_proj_bias, layer.out_proj.bias):  # they start at 0: give them values
        nn.init.normal_(bias)
    x_mha = torch.randn(2, 5, E, dtype=torch.float64)  # (B, S, E)
print(f"in_proj_weight {tuple(layer.in_proj_weight.shape)}, out_proj.weight {tuple(layer.out_proj.weight.shape)}")
ours, (q_mha, k_mha) = multi_head_attention(x_mha, layer.in_proj_weight, layer.in_proj_bias,
                                            layer.out_proj.weight, layer.out_proj.bias, H_MHA)
theirs, weights = layer(x_mha, x_mha, x_mha, need_weights=True, average_attn_weights=False)
print(f"output {tuple(ours.shape)}: max |ours - nn.MultiheadAttention| below 1e-12: "
      f"{(ours - theirs).abs().max().item() < 1e-12}")
probs = torch.softmax(q_mha @ k_mha.transpose(-2, -1) / math.sqrt(E // H_MHA), dim=-1)  # (B, H, S, S)
print(f"attention weights {tuple(weights.shape)}: our softmax(q kᵀ/√D) within 1e-12: "
      f"{(probs - weights).abs().max().item() < 1e-12}")

# %% [markdown]
# Output:
# ```text
# in_proj_weight (48, 16), out_proj.weight (16, 16)
# output (2, 5, 16): max |ours - nn.MultiheadAttention| below 1e-12: True
# attention weights (2, 4, 5, 5): our softmax(q kᵀ/√D) within 1e-12: True
# ```
#
# The module is these five steps: one (3E, E) product gives q, k and v, a view and a
# transpose give each head its (S, D) slice, SDPA runs all heads at once, and the merge
# is free when the CPU flash kernel runs (the default): its output already sits in
# (B, S, H, D) order, as the previous cell showed. The math backend, which SDPA picks for
# example when `dropout_p > 0`, returns (B, H, S, D) memory, and then the merge copies.
# The per-head weights are one (S, S) softmax per batch element and head, scaled by
# √D with D = E / H = 4 (the head's size, not the model's). `average_attn_weights=False`
# asks for them per head; by default the module averages them over the heads. The outputs
# agree to rounding, not necessarily bit for bit.

# %% [markdown]
# ## 3. Masks: True means keep (and `key_padding_mask` says the opposite)
#
# A boolean `attn_mask` of shape (L, S) (broadcast over batch and heads) says which
# (query, key) pairs take part. Take two queries, two keys, and values `[10, 0]` and
# `[0, 10]`.
#
# **Predict.** With the mask `[[True, False], [True, False]]`, what are the two output rows?

# %%
q2 = torch.randn(1, 1, 2, 2, dtype=torch.float64)  # (B, H, L, D)
k2 = torch.randn(1, 1, 2, 2, dtype=torch.float64)  # (B, H, S, D)
v2 = torch.tensor([[10.0, 0.0], [0.0, 10.0]], dtype=torch.float64).view(1, 1, 2, 2)  # (B, H, S, D)
keep_key0 = torch.tensor([[True, False], [True, False]])  # (L, S): True = attend
out_keep = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=keep_key0)
print(f"SDPA, attn_mask keeps key 0: {rows(out_keep[0, 0])}")
print(f"no mask:                     {rows(F.scaled_dot_product_attention(q2, k2, v2)[0, 0])}")

# %% [markdown]
# Output:
# ```text
# SDPA, attn_mask keeps key 0: [[10.0, 0.0], [10.0, 0.0]]
# no mask:                     [[4.9, 5.1], [7.4, 2.6]]
# ```
#
# Each query row sees one key only, so its softmax puts weight 1 on it and the output is
# value row 0, whatever the scores are. A float mask is *added* to the scores instead
# (0 keeps, `-inf` removes, anything else biases).
#
# `nn.MultiheadAttention` has a `key_padding_mask` of shape (B, S) for padded keys. Build
# one whose projections are the identity, so it computes exactly SDPA on the same data.
#
# **Predict.** Passing it SDPA's "keep key 0" row `[True, False]`, which key does it use?


# %%
def identity_mha(dim):
    """A one-head MultiheadAttention whose Q, K, V and output projections are the identity."""
    mha = nn.MultiheadAttention(dim, num_heads=1, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.eye(dim).repeat(3, 1))  # (3*dim, dim): [I; I; I]
        mha.out_proj.weight.copy_(torch.eye(dim))
    return mha


mha = identity_mha(2)
for pad in ([True, False], [False, True]):
    out_mha, _ = mha(q2[0], k2[0], v2[0], key_padding_mask=torch.tensor([pad]), need_weights=False)
    print(f"MHA key_padding_mask {pad}: {rows(out_mha[0])}")
pad = torch.tensor([[True, False]])  # (B, S): True = padding, MHA's convention
as_sdpa = (~pad).view(1, 1, 1, 2)  # (B, 1, 1, S): True = keep, broadcast over heads and queries
same = torch.allclose(F.scaled_dot_product_attention(q2, k2, v2, attn_mask=as_sdpa),
                      mha(q2[0], k2[0], v2[0], key_padding_mask=pad, need_weights=False)[0].unsqueeze(1))
print(f"SDPA with ~key_padding_mask as (B, 1, 1, S) equals MHA: {same}")

# %% [markdown]
# Output:
# ```text
# MHA key_padding_mask [True, False]: [[0.0, 10.0], [0.0, 10.0]]
# MHA key_padding_mask [False, True]: [[10.0, 0.0], [10.0, 0.0]]
# SDPA with ~key_padding_mask as (B, 1, 1, S) equals MHA: True
# ```
#
# For `key_padding_mask` True means *padding, ignore it*: the same row that kept key 0 in
# SDPA drops key 0 here. To keep key 0 you pass `[False, True]`. When you move code from
# `MultiheadAttention` to SDPA, invert the padding mask (`~key_padding_mask`) and give it
# SDPA's shape: (B, 1, 1, S), broadcast over heads and queries (the last line checks it).

# %% [markdown]
# ### A picture of the weights
#
# Masks act on the weights, the softmax of the scores, before they multiply V. Take six
# tokens of one head: a causal mask (each query sees itself and the keys before it), a
# padding mask (the last two keys are padding), and both at once, as a decoder on a padded
# batch uses them.
#
# **Predict.** In each picture, which cells are exactly 0? What does every row add up to?


# %%
def attention_weights(q, k, keep=None):
    """softmax(q kᵀ / √d) with the cells where keep is False removed: (L, S) for (L, d), (S, d)."""
    scores = q @ k.T / math.sqrt(q.shape[-1])  # (L, S)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1)


def plot_attention_weights(panels, keeps):
    """One heat map per (title, (L, S) weights): rows are queries, columns keys. The cells
    that keeps[title] masks (False) are left out of the colour scale and drawn light grey."""
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.85")  # "bad": the masked cells
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2), squeeze=False)
    for ax, (title, w) in zip(axes[0], panels.items()):
        image = ax.imshow(np.ma.masked_where(~keeps[title].numpy(), w.numpy()), vmin=0, vmax=1, cmap=cmap)
        ax.set_title(title)
        ax.set_xlabel("key")
    axes[0, 0].set_ylabel("query")
    fig.colorbar(image, ax=axes[0].tolist(), label="weight (grey: masked)")
    return fig


mask_gen = torch.Generator().manual_seed(0)  # its own stream: the cells below keep their numbers
q6, k6 = (torch.randn(6, 8, generator=mask_gen, dtype=torch.float64) for _ in range(2))  # (S, d)
causal_keep = torch.ones(6, 6, dtype=torch.bool).tril()  # (L, S): query i keeps keys 0..i
not_padding = torch.tensor([True] * 4 + [False] * 2).expand(6, 6)  # (L, S): keys 4 and 5 are padding
keeps = {"causal": causal_keep, "padding": not_padding, "causal + padding": causal_keep & not_padding}
panels = {title: attention_weights(q6, k6, keep) for title, keep in keeps.items()}  # (L, S) weights each
fig = plot_attention_weights(panels, keeps)
fig.savefig(HERE / "attention_weights.png", dpi=100)
for title, w in panels.items():
    print(f"{title:<16}: zero cells {int((w == 0).sum()):>2}, rows sum to 1: "
          f"{torch.allclose(w.sum(-1), torch.ones(6, dtype=torch.float64))}")
print("saved attention_weights.png")

# %% [markdown]
# Output:
# ```text
# causal          : zero cells 15, rows sum to 1: True
# padding         : zero cells 12, rows sum to 1: True
# causal + padding: zero cells 18, rows sum to 1: True
# saved attention_weights.png
# ```
#
# The figure draws the masked cells in grey, and each of them gets weight exactly 0 (its
# score is `-inf`, and `exp(-inf) = 0`): the zero cells printed are the masked ones, 15
# above the diagonal of the causal picture, two columns of six in the padding one, and the
# 18 of their union in the third (15 + 12, less the 9 both mask). Every row still
# sums to 1, because the softmax normalises over the keys it keeps: a query does not lose
# attention to a masked key, it gives it to the others. With both masks, the first four
# queries look like the causal case, and queries 4 and 5, which are padding positions
# themselves, may only look at keys 0 to 3.
#
# **Predict.** A query row whose keys are *all* masked has nothing to normalise over: the
# softmax of a row of `-inf` is 0/0. What does the formula give, and what does SDPA give?

# %%
keep_none = torch.tensor([[True, True], [False, False]])  # (L, S): query 1 sees no key
print(f"formula:         {rows(formula(q2, k2, v2, keep_none)[0, 0])}")
for name in ("MATH", "FLASH_ATTENTION"):
    with sdpa_kernel(SDPBackend.__members__[name]):
        out = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=keep_none)
    print(f"{name:<16} {rows(out[0, 0])}")
pad_all = {}  # MHA with both keys padded, without and with its own weights (the default)
for need_weights in (False, True):
    pad_all[need_weights], _ = mha(q2[0], k2[0], v2[0], key_padding_mask=torch.tensor([[True, True]]),
                                   need_weights=need_weights)
    print(f"MHA, all padded, need_weights={need_weights!s:<5}: {rows(pad_all[need_weights][0])}")

# %% [markdown]
# Output:
# ```text
# formula:         [[4.9, 5.1], [nan, nan]]
# MATH             [[4.9, 5.1], [0.0, 0.0]]
# FLASH_ATTENTION  [[4.9, 5.1], [0.0, 0.0]]
# MHA, all padded, need_weights=False: [[0.0, 0.0], [0.0, 0.0]]
# MHA, all padded, need_weights=True : [[nan, nan], [nan, nan]]
# ```
#
# The textbook formula gives NaN, and a NaN spreads to the loss and every gradient. SDPA in
# 2.13.0 returns zeros instead: the math backend uses a "safe" softmax (the
# `_safe_softmax` of section 2's dispatch log) that writes 0 for fully masked rows, and the
# CPU flash kernel agrees. `nn.MultiheadAttention` gives 0 only with `need_weights=False`,
# when it calls SDPA; with the default `need_weights=True` it computes the weights with its
# own softmax and gives NaN. Do not rely on the zeros: they are a choice of these kernels in
# this version, not of the formula, and a zero vector is not a meaningful output either. Make
# sure every query keeps at least one key (for left padding, let padded queries see
# themselves, and drop their outputs from the loss).

# %% [markdown]
# ## 4. `is_causal=True` is aligned to the upper left
#
# `is_causal=True` keeps key j for query i when j ≤ i, counting both from 0. For a square
# matrix that is the usual lower triangle. In a decode step with a KV cache, one new query
# (the latest token) meets all the cached keys: L = 1, S = 2 here.
#
# **Predict.** Which keys does `is_causal=True` let the single query see?

# %%
q_last = q2[:, :, 1:]  # (B, H, 1, D): the last query alone, as in a decode step
upper_left = F.scaled_dot_product_attention(q_last, k2, v2, is_causal=True)
no_mask = F.scaled_dot_product_attention(q_last, k2, v2, is_causal=False)
lower_right = F.scaled_dot_product_attention(q_last, k2, v2, attn_mask=causal_lower_right(1, 2))
full = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True)[:, :, 1:]  # row 1 of the square case
print(f"is_causal=True (upper left):   {rows(upper_left[0, 0])}")
print(f"is_causal=False:               {rows(no_mask[0, 0])}")
print(f"causal_lower_right(1, 2):      {rows(lower_right[0, 0])}")
print(f"row 1 of the full causal pass: {rows(full[0, 0])}")
bottom_right = torch.ones(2, 4, dtype=torch.bool).tril(4 - 2)  # (L, S): what causal_lower_right(2, 4) keeps
print(f"bottom-right (L=2, S=4) keeps: {bottom_right.int().tolist()}")

# %% [markdown]
# Output:
# ```text
# is_causal=True (upper left):   [[10.0, 0.0]]
# is_causal=False:               [[7.4, 2.6]]
# causal_lower_right(1, 2):      [[7.4, 2.6]]
# row 1 of the full causal pass: [[7.4, 2.6]]
# bottom-right (L=2, S=4) keeps: [[1, 1, 1, 0], [1, 1, 1, 1]]
# ```
#
# With `is_causal=True` the one query is numbered 0, so it sees key 0 only: as if it were
# the *first* token, not the last. The decode step must reproduce row 1 of the full causal
# pass, and only the bottom-right alignment does: `is_causal=False` (one new query may see
# the whole cache) or, for several new queries at once, an explicit mask aligned to the
# bottom right (`torch.nn.attention.bias.causal_lower_right(L, S)`, or
# `torch.ones(L, S, dtype=torch.bool).tril(S - L)`).

# %% [markdown]
# ## 5. `dropout_p` does not know about `eval()`
#
# `F.scaled_dot_product_attention` is a function: it has no `training` flag. A module that
# hard-codes `dropout_p=0.5` keeps dropping attention weights after `model.eval()`.
#
# **Predict.** In eval mode, do two calls of such a module on the same input agree?


# %%
class Attention(nn.Module):
    def __init__(self, p, respect_eval):
        super().__init__()
        self.p, self.respect_eval = p, respect_eval

    def forward(self, q, k, v):
        p = self.p if (self.training or not self.respect_eval) else 0.0  # the fix: 0.0 in eval
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p)


for respect_eval in (False, True):
    model = Attention(0.5, respect_eval).eval()
    a, b = model(q2, k2, v2), model(q2, k2, v2)
    print(f"respect_eval={respect_eval!s:<5}: two eval calls equal {torch.equal(a, b)}, "
          f"equal to no dropout {torch.equal(a, F.scaled_dot_product_attention(q2, k2, v2))}")
mha_drop = nn.MultiheadAttention(2, num_heads=1, dropout=0.5, batch_first=True, dtype=torch.float64).eval()
x3 = q2[0]  # (B, S, D)
print(f"nn.MultiheadAttention(dropout=0.5) in eval: two calls equal "
      f"{torch.equal(mha_drop(x3, x3, x3)[0], mha_drop(x3, x3, x3)[0])}")

# %% [markdown]
# Output:
# ```text
# respect_eval=False: two eval calls equal False, equal to no dropout False
# respect_eval=True : two eval calls equal True, equal to no dropout True
# nn.MultiheadAttention(dropout=0.5) in eval: two calls equal True
# ```
#
# `eval()` only flips `self.training` on modules; a functional call sees the number you
# pass. Write `dropout_p=self.p if self.training else 0.0`, as `nn.MultiheadAttention` does
# internally (last line: a module, so `eval()` reaches it), or validation numbers are noisy:
# they change from one evaluation of the same weights to the next.

# %% [markdown]
# ## 6. Grouped-query attention
#
# In grouped-query attention (GQA) several query heads share one key/value head, which
# shrinks the KV cache. With 4 query heads and 2 KV heads, query heads 0 and 1 use KV
# head 0, heads 2 and 3 use KV head 1.
#
# **Predict.** `enable_gqa=True` should equal repeating K and V along the head dimension.
# Which repeat: `repeat_interleave(2, dim=1)` (0, 0, 1, 1) or `repeat(1, 2, 1, 1)` (0, 1, 0, 1)?

# %%
qg = torch.randn(1, 4, 5, 8)  # (B, Hq, S, D)
kg, vg = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)  # (B, Hkv, S, D)
out_gqa = F.scaled_dot_product_attention(qg, kg, vg, enable_gqa=True)  # (B, Hq, S, D)
groups = qg.shape[1] // kg.shape[1]
interleaved = F.scaled_dot_product_attention(qg, kg.repeat_interleave(groups, 1), vg.repeat_interleave(groups, 1))
repeated = F.scaled_dot_product_attention(qg, kg.repeat(1, groups, 1, 1), vg.repeat(1, groups, 1, 1))
print(f"enable_gqa vs repeat_interleave: equal {torch.equal(out_gqa, interleaved)}")
print(f"enable_gqa vs repeat:            equal {torch.equal(out_gqa, repeated)}")
try:
    F.scaled_dot_product_attention(qg, kg, vg)
except RuntimeError as err:
    print(f"without enable_gqa: {err}")

# %% [markdown]
# Output:
# ```text
# enable_gqa vs repeat_interleave: equal True
# enable_gqa vs repeat:            equal False
# without enable_gqa: The size of tensor a (4) must match the size of tensor b (2) at non-singleton dimension 1
# ```
#
# Consecutive query heads share a KV head, so the equivalent copy is `repeat_interleave`.
# Without the flag the head counts must match, and the error is a plain broadcasting error.
#
# **Predict.** The point of GQA is a smaller K and V. Does `enable_gqa=True` avoid making
# the 4-head copies that `repeat_interleave` makes? Ask the two CPU backends, with the
# profiler's log of every ATen op the dispatcher runs and the bytes each op allocates.


# %%
def gqa_log(backend):
    """The ATen ops one enable_gqa SDPA call dispatches under `backend`, in order, and the
    bytes allocated by its head repetitions (repeat_interleave and what it calls)."""
    with sdpa_kernel(SDPBackend.__members__[backend]), profile(profile_memory=True) as prof:
        F.scaled_dot_product_attention(qg, kg, vg, enable_gqa=True)
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    copied = sum(e.cpu_memory_usage for e in events if e.name == "aten::repeat_interleave")
    return [e.name.removeprefix("aten::") for e in events], copied


kv_at_hq = 2 * qg.shape[1] * kg[0, 0].numel() * kg.element_size()  # K and V at 4 heads
for backend in ("FLASH_ATTENTION", "MATH"):
    ops, copied = gqa_log(backend)
    print(f"{backend:<15}: repeat_interleave {ops.count('repeat_interleave')}x, "
          f"allocating {copied:,} bytes (K and V at 4 heads: {kv_at_hq:,})")

# %% [markdown]
# Output:
# ```text
# FLASH_ATTENTION: repeat_interleave 0x, allocating 0 bytes (K and V at 4 heads: 1,280)
# MATH           : repeat_interleave 2x, allocating 1,280 bytes (K and V at 4 heads: 1,280)
# ```
#
# It depends on the backend. The CPU flash kernel (the default here) takes K and V as they
# are, with their 2 heads: no `repeat_interleave`, not a byte allocated for one. The math
# backend implements `enable_gqa` exactly as the `repeat_interleave` above, once for K and
# once for V, 640 bytes each: K and V are materialised at the query head count, the very
# memory GQA exists to save; on a long KV cache that is Hq / Hkv times its size, for the
# duration of the call. So "`enable_gqa=True` avoids the
# copies" is true of the fused kernels, not of the math reference.
#
# **Predict.** What does `enable_gqa=True` require of the head counts? Try 6 query heads
# with 4 KV heads, and 4 query heads with 2 key heads but 1 value head, on the default
# choice and on the flash kernel alone.


# %%
def gqa_try(hq, hk, hv, backend=None):
    """enable_gqa SDPA with these head counts: the output's head count, or the error."""
    q, k, v = (torch.randn(1, h, 5, 8) for h in (hq, hk, hv))  # (B, H, S, D)
    ctx = sdpa_kernel(SDPBackend.__members__[backend]) if backend else contextlib.nullcontext()
    try:
        with ctx, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the flash kernel also warns why it refuses
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    except RuntimeError as err:
        return f"RuntimeError: {str(err).strip()}"
    same = torch.allclose(out, F.scaled_dot_product_attention(
        q, k.repeat_interleave(hq // hk, 1), v.repeat_interleave(hq // hv, 1)), atol=1e-6)
    return f"{out.shape[1]} heads, equal to repeat_interleave {same}"


for hq, hk, hv in ((6, 4, 4), (4, 2, 1)):
    for backend in (None, "FLASH_ATTENTION"):
        print(f"Hq={hq} Hk={hk} Hv={hv} {backend or 'default':<15}: {gqa_try(hq, hk, hv, backend)}")

# %% [markdown]
# Output:
# ```text
# Hq=6 Hk=4 Hv=4 default        : RuntimeError: Number of heads in key and value must divide the number of heads in
# Hq=6 Hk=4 Hv=4 FLASH_ATTENTION: RuntimeError: No available kernel.  Aborting execution.
# Hq=4 Hk=2 Hv=1 default        : 4 heads, equal to repeat_interleave True
# Hq=4 Hk=2 Hv=1 FLASH_ATTENTION: RuntimeError: No available kernel.  Aborting execution.
# ```
#
# The query head count must be a multiple of the key head count and of the value head
# count: 6 and 4 is refused (the message is cut short in 2.13.0, as printed). The
# documentation requires the same head count for K and V (SDPA's docstring lists
# `number_of_heads_key == number_of_heads_value` among GQA's constraints). The math backend
# accepts different ones anyway, but the CPU flash kernel declines them, so the default
# quietly falls back to the math backend, the one that copies K and V (above). Keep
# Hk = Hv. (The same docstring says GQA "currently works only for Flash_attention and math
# kernel on CUDA tensor": out of date for the CPU, where this section ran it on both
# backends.) Which kernel a call reaches, and how to choose it, is where part 07b begins.

# %% [markdown]
# ## Summary
#
# - Attention = softmax(QKᵀ/√d + M)·V: B·H·S·S scores (134,217,728 for two heads at
#   S = 8192, 512 MiB in fp32). Dividing by √d keeps var(q·k) near 1 whatever the head size;
#   without it a large head makes the softmax nearly one-hot, and a one-hot softmax passes
#   almost no gradient.
# - `sdpa_kernel(SDPBackend.MATH)` gives the reference; it matches the formula, forward and
#   gradients, within rounding in float64: check it with a bound, not `torch.equal`.
#   A dispatch mode sees one op per call by default on the CPU, the CPU flash kernel, in
#   float32 and float64; under `MATH` it sees the formula op by op. `gradcheck` passes on
#   both backends in float64.
# - On the CPU, SDPA reads lesson 01's permuted (B, H, S, D) views through their strides:
#   no copy (where `q @ kᵀ` copies both), the same bits as on contiguous inputs, and an
#   output already laid out for the next projection.
# - Multi-head attention: one (3E, E) projection, a view and a transpose per head, one SDPA
#   for all heads, a merge and an output projection: `nn.MultiheadAttention`, to 1e-12.
# - SDPA's boolean mask: True = keep. `key_padding_mask`: True = ignore. Float masks add.
#   A masked weight is exactly 0 and each row still sums to 1 over the keys it keeps. A row
#   with no key left gives NaN in the formula and 0 in SDPA 2.13.0 (in
#   `nn.MultiheadAttention` only with `need_weights=False`): avoid such rows.
# - `is_causal=True` aligns to the upper left; a decode step needs `is_causal=False` (one
#   query) or a bottom-right mask (`causal_lower_right`).
# - `dropout_p` is applied whatever `eval()` says: pass `0.0` at inference.
# - `enable_gqa=True` equals `repeat_interleave` of the K/V heads; the CPU flash kernel does
#   it without copies, the math backend copies K and V to the query head count, and K and V
#   of different head counts send the default to the math backend.

# %% [markdown]
# ## References
#
# - [`torch.nn.functional.scaled_dot_product_attention`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.functional.scaled_dot_product_attention.html):
#   the formula as reference code, the mask conventions, `is_causal`, `dropout_p` and
#   `enable_gqa` of sections 2 to 6.
# - [`torch.nn.MultiheadAttention`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.MultiheadAttention.html):
#   `in_proj_weight`, `key_padding_mask` and `average_attn_weights` (sections 2 and 3).
# - [`torch.nn.attention.sdpa_kernel`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.attention.sdpa_kernel.html):
#   restricting SDPA to some backends, as every section does with `MATH`.
# - [`torch.nn.attention.bias.causal_lower_right`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.attention.bias.causal_lower_right.html):
#   the bottom-right causal mask of section 4.
# - [`torch.autograd.gradcheck`](https://docs.pytorch.org/docs/2.13/generated/torch.autograd.gradcheck.gradcheck.html):
#   the finite-difference check of section 2.
# - Vaswani et al., [Attention Is All You Need](https://arxiv.org/abs/1706.03762) (2017):
#   scaled dot-product attention, the √d scale and multi-head attention.
# - Ainslie et al., [GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints](https://arxiv.org/abs/2305.13245)
#   (2023), after Shazeer, [Fast Transformer Decoding: One Write-Head is All You Need](https://arxiv.org/abs/1911.02150)
#   (2019): grouped- and multi-query attention (section 6).

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each path is relative to the folder that holds your installed
# `torch` (your site-packages), and the line numbers are those of your installation; the C++
# file the wheel does not ship is a link at the release's tag. The stops follow the lesson:
# the formula as PyTorch documents it, the math backend that computes it, the module of
# section 2, and the bottom-right mask of section 4.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/nn/functional.py", "scaled_dot_product_attention = _add_docstr(",
     "Only a docstring on the C++ op, whose reference code is `formula` with every option: "
     "scale `1 / math.sqrt(query.size(-1))`, a boolean mask turned into `-inf` where it is "
     "False and a float mask added (section 3), `is_causal` as `ones(L, S).tril(diagonal=0)`, "
     "which for L < S is section 4's upper-left alignment, `repeat_interleave` for GQA "
     "(section 6) and `torch.dropout(..., train=True)`, blind to `eval()` (section 5). Its "
     "plain softmax gives NaN for a fully masked row, where SDPA gives 0 (section 3)."),
    ("pytorch:aten/src/ATen/native/transformers/attention.cpp",
     "std::tuple<Tensor, Tensor> _scaled_dot_product_attention_math(",
     "The math backend: it multiplies Q and K each by the square root of the scale before "
     "their product (section 2's two `mul`, and why its rounding differs from `formula`), "
     "`pre_process_group_query_attention_input` copies K and V with `repeat_interleave` "
     "(section 6, and its cut-short head-count message), and `at::_safe_softmax` writes 0 "
     "for fully masked rows (section 3)."),
    ("torch/nn/modules/activation.py", "class MultiheadAttention(Module):",
     "The module of section 2: `in_proj_weight` of shape (3E, E) and `out_proj`. Its `forward`, "
     "when it does not take the fused fast path it checks for first, turns `key_padding_mask` "
     "(True = padding) into a float mask (`F._canonical_mask`) and calls "
     "`F.multi_head_attention_forward`, which sets `dropout_p = 0.0` when not training "
     "(section 5), calls SDPA when `need_weights=False`, and computes the weights by hand "
     "(`bmm` or `baddbmm`, `softmax`, `bmm`) when you ask for them (section 3's NaN)."),
    ("torch/nn/attention/bias.py", "def causal_lower_right(",
     "Section 4's bottom-right alignment: a `CausalBias` whose variant is `LOWER_RIGHT`. "
     "`CausalBias._lower_right`, above, materialises it as `torch.tril(..., "
     "diagonal=self.seq_len_kv - self.seq_len_q)`, the `tril(S - L)` the cell printed; "
     "`_upper_left`, just before it, is a plain `tril`, what `is_causal=True` means."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/nn/functional.py:«line»  `scaled_dot_product_attention = _add_docstr(`
#     Only a docstring on the C++ op, whose reference code is `formula` with every option:
#     scale `1 / math.sqrt(query.size(-1))`, a boolean mask turned into `-inf` where it is
#     False and a float mask added (section 3), `is_causal` as `ones(L,
#     S).tril(diagonal=0)`, which for L < S is section 4's upper-left alignment,
#     `repeat_interleave` for GQA (section 6) and `torch.dropout(..., train=True)`, blind
#     to `eval()` (section 5). Its plain softmax gives NaN for a fully masked row, where
#     SDPA gives 0 (section 3).
# https://github.com/pytorch/pytorch/blob/v«version»/aten/src/ATen/native/transformers/attention.cpp
#     search for `std::tuple<Tensor, Tensor> _scaled_dot_product_attention_math(`: The
#     math backend: it multiplies Q and K each by the square root of the scale before
#     their product (section 2's two `mul`, and why its rounding differs from `formula`),
#     `pre_process_group_query_attention_input` copies K and V with `repeat_interleave`
#     (section 6, and its cut-short head-count message), and `at::_safe_softmax` writes 0
#     for fully masked rows (section 3).
# torch/nn/modules/activation.py:«line»  `class MultiheadAttention(Module):`
#     The module of section 2: `in_proj_weight` of shape (3E, E) and `out_proj`. Its
#     `forward`, when it does not take the fused fast path it checks for first, turns
#     `key_padding_mask` (True = padding) into a float mask (`F._canonical_mask`) and
#     calls `F.multi_head_attention_forward`, which sets `dropout_p = 0.0` when not
#     training (section 5), calls SDPA when `need_weights=False`, and computes the weights
#     by hand (`bmm` or `baddbmm`, `softmax`, `bmm`) when you ask for them (section 3's
#     NaN).
# torch/nn/attention/bias.py:«line»  `def causal_lower_right(`
#     Section 4's bottom-right alignment: a `CausalBias` whose variant is `LOWER_RIGHT`.
#     `CausalBias._lower_right`, above, materialises it as `torch.tril(...,
#     diagonal=self.seq_len_kv - self.seq_len_q)`, the `tril(S - L)` the cell printed;
#     `_upper_left`, just before it, is a plain `tril`, what `is_causal=True` means.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Predict.** You check `F.scaled_dot_product_attention`, restricted to the math backend,
#    against `softmax(Q Kᵀ / √d) · V` written by hand, in float64: the output and the
#    gradients with respect to Q, K and V. Do you assert `torch.equal`, or a bound? Which?
#
#    <details><summary>Answer</summary>
#
#    A bound. All four agree within `torch.testing.assert_close`'s float64 tolerances
#    (rtol and atol 1e-7: the cell would have raised otherwise), and each largest gap is
#    rounding-level, below 1e-12, as the cell prints. The gaps are not zero, and their last
#    digits can change with the order in which a CPU's matmul sums (the math backend also
#    scales Q and K before their product, `formula` after), so only a bound holds on every
#    student's machine (*§ SDPA is the formula*).
#
#    </details>
#
# 2. **Predict.** On the CPU, which ATen op does a dispatch mode see for one default SDPA
#    call in float64: the math formula's ops, or a fused kernel? And which ops under
#    `sdpa_kernel(SDPBackend.MATH)`?
#
#    <details><summary>Answer</summary>
#
#    One op, `_scaled_dot_product_flash_attention_for_cpu`, in float64 as in float32: the
#    CPU flash kernel takes both (the half-precision rule is the CUDA flash kernel's).
#    `scaled_dot_product_attention` itself never reaches the mode: it is a composite that
#    calls the chosen backend's op. Under `MATH` the mode sees the formula: two `mul`, a
#    `transpose`, `bmm`, `_safe_softmax`, `bmm`, with `matmul`'s views around each `bmm`
#    (*§ What one SDPA call dispatches: lesson 02's log*).
#
#    </details>
#
# 3. **Spot the bugs.** Porting a model from `nn.MultiheadAttention`, someone writes
#    `F.scaled_dot_product_attention(q, k, v, attn_mask=key_padding_mask.view(B, 1, 1, S),
#    dropout_p=0.1)` and validates after `model.eval()`. What is wrong, twice?
#
#    <details><summary>Answer</summary>
#
#    The mask is inverted: in `key_padding_mask` True means padding, in SDPA's boolean
#    `attn_mask` True means keep. The row `[True, False]` that keeps key 0 in SDPA drops key
#    0 in MHA, and SDPA given `~key_padding_mask` as (B, 1, 1, S) equals MHA
#    (*§ Masks: True means keep (and `key_padding_mask` says the opposite)*). And the
#    dropout ignores `eval()`: with a fixed `dropout_p`, two eval calls on the same input
#    differ, while `dropout_p=self.p if self.training else 0.0` gives the result without
#    dropout (*§ `dropout_p` does not know about `eval()`*).
#
#    </details>
#
# 4. **Predict.** In a decode step with a KV cache, the newest token's single query meets
#    all the cached keys, and the code passes `is_causal=True`. Which keys does that query
#    see, and what should the code pass instead?
#
#    <details><summary>Answer</summary>
#
#    Key 0 only: `is_causal=True` counts queries and keys from 0 at the upper left, so the
#    one query is treated as the first token. With the lesson's two keys it outputs value
#    row 0, `[[10.0, 0.0]]`, where row 1 of the full causal pass is `[[7.4, 2.6]]`; both
#    `is_causal=False` and `causal_lower_right(1, 2)` reproduce that row. For several new
#    queries at once, pass a mask aligned to the bottom right
#    (*§ `is_causal=True` is aligned to the upper left*).
#
#    </details>
#
# 5. **Explain.** A colleague says "`enable_gqa=True` never copies K and V, that is its
#    point". When is that true on the CPU, and when not?
#
#    <details><summary>Answer</summary>
#
#    True of the CPU flash kernel, the default: with 4 query heads and 2 KV heads it runs no
#    `repeat_interleave` and allocates 0 bytes for it. The math backend implements
#    `enable_gqa` with `repeat_interleave` of K and of V, allocating 1,280 bytes, K and V
#    at the query head count; and when K and V have different head counts (4, 2, 1) the
#    flash kernel declines and the default falls back to that math backend
#    (*§ Grouped-query attention*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement `sdpa_reference(q, k, v, attn_mask,
# is_causal, enable_gqa)`: SDPA's contract in a few lines, with boolean and float masks,
# upper-left causal alignment, GQA, and zeros for a query with no key left. Check it with
# `make exercises N=07a`: it is compared with SDPA's math backend on the cases this lesson
# showed and a few more. `solutions.py` has one way to write it.

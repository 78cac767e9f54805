# %% [markdown]
# # 07 · Attention: scaled dot-product attention and FlexAttention
#
# Attention is one formula, `softmax(Q Kᵀ / √d + M) · V`, and a zoo of kernels that compute
# it without ever storing the S × S score matrix. PyTorch exposes the formula as
# `F.scaled_dot_product_attention` (SDPA), picks a kernel for you, and adds FlexAttention
# for masks and score changes that SDPA does not know. This lesson checks every contract
# of that API on tiny tensors, where each number can be read.
#
# **What you will learn**
#
# - how many score cells attention makes (B·H·S·S), why fused kernels work in tiles, and
#   the online softmax that normalises a row of scores it never holds whole;
# - why the scores are divided by √d;
# - that SDPA's math backend *is* the formula, forward and backward, and that it reads
#   lesson 01's permuted head views without copying them;
# - multi-head attention end to end (projections, heads, SDPA, merge), equal to
#   `nn.MultiheadAttention`; what masks do to the attention weights, in a picture;
# - the mask conventions (SDPA: True = keep; `MultiheadAttention`'s `key_padding_mask`:
#   True = ignore), `is_causal`'s upper-left alignment and what a decode step needs;
# - that `dropout_p` ignores `model.eval()`; grouped-query attention with `enable_gqa`, and
#   which backend copies K and V for it;
# - which SDPA backends this build has and which one the CPU runs, and, on x86 CPUs
#   without fast fp16 matrix instructions, a dtype where the fused default is the slower
#   one; what all-masked rows do;
# - FlexAttention: mask functions, block masks and their sparsity, a score function
#   (ALiBi), one compiled kernel checked against SDPA.
#
# **Prerequisites:** lesson 01 (the (B, H, S, D) layout), lesson 03 (autograd), lesson 06
# (the profiler). Softmax and matrix products.
#
# **How to run:** `python lessons/07_attention/attention.py` or `make lesson N=07` from the
# repository root, or open `attention.ipynb`. Everything runs on the CPU. One cell compiles
# FlexAttention with `torch.compile`: with an empty Inductor cache that takes most of the
# lesson's run time (the cell prints how long), far less once the cache
# (`TORCHINDUCTOR_CACHE_DIR`, set by the course tools) holds the generated code. Where
# PyTorch refuses to compile FlexAttention for the CPU (no AVX2, or macOS: Apple silicon,
# Intel Macs, Arm Linux), that cell prints PyTorch's reason and skips. Each printing cell is
# followed by an *Output* block: what it printed with the pinned PyTorch (2.13.0); parts
# that depend on the machine appear there as `«time»` or `«number»`.
# Run outside the course's venv, this lesson may also print PyTorch's own diagnostic lines
# to stderr: `USDT: ... profiler_start` and `profiler_stop` around each profiler run and, on
# a CUDA build without a GPU, `gpuGetDeviceCount failed` and `No CUDA runtime is found`.
# They are harmless, and the course's venv (`.venv`, made by any `make lesson`) turns them
# off.

# %%
import contextlib
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right
from torch.nn.attention.flex_attention import and_masks, create_block_mask, create_mask, flex_attention
from torch.profiler import profile
from torch.utils._python_dispatch import TorchDispatchMode

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results, comparable timings
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DEVICE = torch.device(os.environ.get("COURSE_DEVICE", "cpu"))


def formula(q, k, v, keep=None):
    """softmax(q kᵀ / √d + M) v, with M = 0 where keep is True and -inf elsewhere."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, L, S)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, H, L, D)


def first_sentence(err):
    """The first sentence of an error message: stable, and short enough to print."""
    return str(err).split(". ")[0]


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
# what backward needs for every layer. A naive implementation also *moves* those bytes:
# it writes the scores, reads them for the softmax, writes the probabilities, reads them
# again for the product with V. Fused kernels (FlashAttention and its relatives) never
# store the matrix: they walk K and V in tiles, keep a running maximum and a running sum
# per query row (the *online softmax*), and rescale the partial output as each tile
# arrives. Their working memory is a few tiles, whatever S is. The figure puts numbers on
# that; the exercise `tiled_attention` has you write the online softmax.


# %%
def tile_bytes(block_q=128, block_k=128, d=128, elem=2):
    """Working set of one tile step: Q, K, V tiles (elem bytes), fp32 scores, output, max, sum."""
    inputs = (block_q + 2 * block_k) * d * elem
    fp32 = (block_q * block_k + block_q * d + 2 * block_q) * 4
    return inputs + fp32


def plot_memory(seq_lens, heads=2, d=128):
    """Bytes of the score matrix vs sequence length, next to Q/K/V/O and one tile's working set."""
    s = np.array(seq_lens, dtype=float)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(s, 4 * heads * s**2, "o-", label="scores, fp32")
    ax.loglog(s, 2 * heads * s**2, "s-", label="scores, bf16")
    ax.loglog(s, 4 * 2 * heads * s * d, "^-", label=f"Q, K, V, O, bf16 (D={d})")
    ax.loglog(s, np.full_like(s, heads * tile_bytes(d=d)), "k--", label="tiled kernel working set")
    ax.set_xlabel("sequence length S")
    ax.set_ylabel("bytes (B=1, H=2)")
    ax.set_title("Materialised scores grow as S², tiles do not")
    ax.legend()
    fig.tight_layout()
    return fig


seq_lens = [2**p for p in range(8, 18)]  # 256 ... 131072
fig = plot_memory(seq_lens)
fig.savefig(HERE / "score_memory.png", dpi=100)
print(f"one tile step (128 x 128, D=128): {tile_bytes():,} bytes per head")
print(f"at S=8192 the fp32 scores are {4 * score_cells(1, 2, 8192) / (2 * tile_bytes()):,.0f} x that")
print("saved score_memory.png")

# %% [markdown]
# Output:
# ```text
# one tile step (128 x 128, D=128): 230,400 bytes per head
# at S=8192 the fp32 scores are 1,165 x that
# saved score_memory.png
# ```
#
# A tile step holds a 128-row block of queries, one 128-row block of keys and values, the
# 128 × 128 block of scores, the running output and two numbers per row: about 225 KiB,
# the order of a GPU's on-chip memory (shared memory and registers), and the same at every
# S. The price is recomputation: backward recomputes the scores tile by tile instead of
# reading them.

# %% [markdown]
# ### The online softmax, on two chunks of keys
#
# How can a kernel normalise a row of scores it never holds whole? Take one query and four
# keys with scores `[1, 2, 3, 0]` and one-number values `[10, 20, 30, 40]`, read in two
# chunks of two keys. Keep three running numbers: the largest score seen so far `m`, the
# sum `total` of `exp(s - m)` over the keys seen, and the output so far `acc`, the sum of
# `exp(s - m) · v`. When a chunk brings a larger score, `m` grows, and everything summed
# before was computed against the old `m`: multiply `total` and `acc` by
# `exp(m_old - m_new)` and carry on. At the end, `acc / total` is the attention output.
#
# **Predict.** After the first chunk, what are `m`, `total` and `acc`? By what factor does
# the second chunk rescale them? Does `acc / total` equal `softmax(scores) @ values`?


# %%
def online_softmax(scores, values, chunk):
    """softmax(scores) @ values for one query, reading `chunk` keys at a time: a running
    maximum m, a running sum total of exp(s - m) and a running output acc, both rescaled by
    exp(m_old - m_new) whenever the maximum grows. Returns acc / total and each step's numbers."""
    m, total, acc, steps = -math.inf, 0.0, 0.0, []
    for start in range(0, len(scores), chunk):
        s, v = scores[start:start + chunk], values[start:start + chunk]
        m_new = max(m, *s)
        rescale = math.exp(m - m_new)  # exp(-inf) = 0 on the first chunk: nothing to rescale
        p = [math.exp(x - m_new) for x in s]  # this chunk's exponentials, against the new max
        total = total * rescale + sum(p)
        acc = acc * rescale + sum(pi * vi for pi, vi in zip(p, v))
        m = m_new
        steps.append((s, m, rescale, p, total, acc))
    return acc / total, steps


scores_1q, values_1q = [1.0, 2.0, 3.0, 0.0], [10.0, 20.0, 30.0, 40.0]
out_online, online_steps = online_softmax(scores_1q, values_1q, chunk=2)
for i, (s_, m_, rescale, p, total, acc) in enumerate(online_steps, start=1):
    print(f"chunk {i} scores {s_}: m {m_}, rescale {rescale:.4f}, exp(s - m) {[round(x, 4) for x in p]}, "
          f"total {total:.4f}, acc {acc:.4f}")
direct = (torch.softmax(torch.tensor(scores_1q, dtype=torch.float64), 0) @ torch.tensor(values_1q, dtype=torch.float64)).item()
print(f"acc / total = {out_online:.4f}; softmax(scores) @ values = {direct:.4f}; equal within 1e-12: "
      f"{abs(out_online - direct) < 1e-12}")

# %% [markdown]
# Output:
# ```text
# chunk 1 scores [1.0, 2.0]: m 2.0, rescale 0.0000, exp(s - m) [0.3679, 1.0], total 1.3679, acc 23.6788
# chunk 2 scores [3.0, 0.0]: m 3.0, rescale 0.3679, exp(s - m) [1.0, 0.0498], total 1.5530, acc 40.7024
# acc / total = 26.2089; softmax(scores) @ values = 26.2089; equal within 1e-12: True
# ```
#
# The first chunk's largest score is 2, so its keys weigh `e^(1-2) = 0.3679` and `e^0 = 1`.
# The second chunk brings a 3: the running sum and output were measured against 2, so both
# are multiplied by `e^(2-3) = 0.3679` before the new terms are added. The result is the
# softmax, exactly (up to float rounding): nothing was approximated, and no step held more
# than one chunk of scores. A fused kernel does the same with a block of queries against a
# block of keys, `acc` a block of output rows. The exercise `tiled_attention` asks you to
# write it for tensors.
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
# draw; it stays well above 1). With the scale, a head starts out spreading its
# attention and can learn where to look. (The variance argument assumes unit-variance
# entries; a model's q and k are whatever training makes them, and the scale keeps their
# starting point sane.)

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
    print(f"{name:<3} {tuple(a.shape)} matches the formula, max error {(a - b).abs().max():.1e}")

# %% [markdown]
# Output:
# ```text
# out (1, 2, 4, 8) matches the formula, max error «number»
# dQ  (1, 2, 4, 8) matches the formula, max error «number»
# dK  (1, 2, 4, 8) matches the formula, max error «number»
# dV  (1, 2, 4, 8) matches the formula, max error «number»
# ```
#
# All four agree within float64 tolerance (`assert_close` would have raised otherwise). The
# last digits can change with the order in which a CPU's matmul sums (its vector width, its
# BLAS), so the errors are shown as placeholders; they are rounding-level (below 1e-12).
# The math backend is the formula written in plain ATen ops, so it makes a
# good reference of your own: when a fused result looks odd, rerun it under `MATH`.
#
# **Predict.** For backward, autograd keeps tensors from the forward. Does the CPU flash
# kernel keep the (S, S) probabilities, as the math backend must?


# %%
def saved_shapes(fn, seen=None):
    """Shapes of every tensor autograd saved for backward in the graph behind grad_fn fn."""
    seen = set() if seen is None else seen
    if fn is None or fn in seen:
        return []
    seen.add(fn)
    here = [tuple(getattr(fn, a).shape) for a in dir(fn)
            if a.startswith("_saved_") and isinstance(getattr(fn, a), torch.Tensor)]
    return here + [s for nxt, _ in fn.next_functions for s in saved_shapes(nxt, seen)]


seeded = torch.Generator().manual_seed(1)  # its own stream: the cells below keep their numbers
qs = torch.randn(1, 2, 64, 16, generator=seeded, requires_grad=True)  # (B, H, S, D), S = 64
for backend in ("MATH", "FLASH_ATTENTION"):
    with sdpa_kernel(SDPBackend.__members__[backend]):
        o = F.scaled_dot_product_attention(qs, qs, qs)
    shapes = sorted(set(saved_shapes(o.grad_fn)))
    print(f"{backend:<15} {o.grad_fn.name()}: saves {shapes}")

# %% [markdown]
# Output:
# ```text
# MATH            UnsafeViewBackward0: saves [(1, 2, 64, 64), (2, 16, 64), (2, 64, 16), (2, 64, 64)]
# FLASH_ATTENTION ScaledDotProductFlashAttentionForCpuBackward0: saves [(1, 2, 64), (1, 2, 64, 16)]
# ```
#
# The math backend's graph saves (S, S) tensors, the softmax's result and the probabilities
# for the product with V: memory that grows as S². The flash kernel's single backward node
# saves Q, K, V and the output, (B, H, S, D) each, plus one number per query row (the
# log-sum-exp of its scores, shape (B, H, S)). From those its backward recomputes the
# scores tile by tile, which is the recomputation of section 1.

# ### Lesson 01's views, through SDPA
#
# A transformer gets its queries from one projection laid out (B, S, H·D) and swaps S and H
# with a free view (lesson 01, *01 § The attention layout*). There, `q @ kᵀ` on those
# permuted views copied both operands: `matmul` reshapes to 3-D for one `bmm`, and the
# reshape cannot merge B and H on those strides.
#
# **Predict.** Does SDPA copy the permuted views too? And is its result the same as on
# contiguous copies of them? The profiler (lesson 06) lists every `aten::copy_` a call runs.


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
# (B, S, H, D) order (the revisit above). The math backend, which SDPA picks for example
# when `dropout_p > 0`, returns (B, H, S, D) memory, and then the merge copies.
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


def plot_attention_weights(panels):
    """One heat map per (title, (L, S) weights): rows are queries, columns keys."""
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2), squeeze=False)
    for ax, (title, w) in zip(axes[0], panels.items()):
        image = ax.imshow(w.numpy(), vmin=0, vmax=1, cmap="viridis")
        ax.set_title(title)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    fig.colorbar(image, ax=axes[0].tolist(), label="weight (exactly 0 where masked)")
    return fig


mask_gen = torch.Generator().manual_seed(0)  # its own stream: the cells below keep their numbers
q6, k6 = (torch.randn(6, 8, generator=mask_gen, dtype=torch.float64) for _ in range(2))  # (S, d)
causal_keep = torch.ones(6, 6, dtype=torch.bool).tril()  # (L, S): query i keeps keys 0..i
not_padding = torch.tensor([True] * 4 + [False] * 2).expand(6, 6)  # (L, S): keys 4 and 5 are padding
panels = {"causal": attention_weights(q6, k6, causal_keep), "padding": attention_weights(q6, k6, not_padding),
          "causal + padding": attention_weights(q6, k6, causal_keep & not_padding)}
fig = plot_attention_weights(panels)
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
# A masked cell gets weight exactly 0 (its score is `-inf`, and `exp(-inf) = 0`): 15 above
# the diagonal of the causal picture, two columns of six in the padding one. Every row still
# sums to 1, because the softmax normalises over the keys it keeps: a query does not lose
# attention to a masked key, it gives it to the others. With both masks, the first four
# queries look like the causal case, and queries 4 and 5, which are padding positions
# themselves, may only look at keys 0 to 3. A row with every key masked would have nothing
# to normalise over: section 7 shows what each implementation does then.

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
    print(f"{backend}: repeat_interleave {ops.count('repeat_interleave')}x, "
          f"allocating {copied:,} bytes (K and V at 4 heads: {kv_at_hq:,})")
    if "repeat_interleave" in ops:  # from the first repetition to the view that ends it
        ops = ops[ops.index("repeat_interleave"):ops.index("view") + 1]
    print(f"  distinct ops: {list(dict.fromkeys(ops))}")

# %% [markdown]
# Output:
# ```text
# FLASH_ATTENTION: repeat_interleave 0x, allocating 0 bytes (K and V at 4 heads: 1,280)
#   distinct ops: ['scaled_dot_product_attention', '_scaled_dot_product_flash_attention_for_cpu', 'empty_like', 'empty_strided', 'transpose', 'as_strided', 'empty']
# MATH: repeat_interleave 2x, allocating 1,280 bytes (K and V at 4 heads: 1,280)
#   distinct ops: ['repeat_interleave', 'unsqueeze', 'as_strided', 'expand', 'clone', 'empty_like', 'empty', 'copy_', 'flatten', 'view']
# ```
#
# It depends on the backend. The CPU flash kernel (the default here) takes K and V with
# their 2 heads: besides its own op it only allocates its output and scratch buffers
# (`empty*`) and makes views (`transpose`, `as_strided`); query head h reads KV head
# h // 2 inside its loops. The math backend implements `enable_gqa` exactly as the
# `repeat_interleave` above: for K and then V, `unsqueeze` and `expand` to (1, 2, 2, 5, 8),
# `clone` (the copy: 640 bytes each), and a `view` as 4 heads. K and V are materialised at
# the query head count, the very memory GQA exists to save; on a long KV cache that is
# Hq / Hkv times its size, for the duration of the call. So "`enable_gqa=True` avoids the
# copies" is true of the fused kernels, not of the math reference.

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
# count: 6 and 4 is refused (the message is cut short in 2.13.0, as printed). Key and value
# may even have different head counts, but the CPU flash kernel then declines and the
# default quietly falls back to the math backend, the one that copies K and V (above). So
# the copy-free path needs Hq divisible by Hkv, and the same Hkv for K and V; check which
# kernel you get with the profiler, as in the next section.

# %% [markdown]
# ## 7. Backends: which kernels this build has, and which one runs
#
# SDPA chooses among backends listed in `SDPBackend`; `sdpa_kernel(...)` restricts the
# choice (it does not force a backend that cannot handle the inputs).
#
# **Predict.** On a CPU build, which backends can run? Which ATen op does a plain call reach?


# %%
def sdpa_op(q, k, v, **kwargs):
    """The name of the SDPA implementation op a call reaches, read from the profiler."""
    with profile() as prof:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    names = [e.key for e in prof.key_averages()]
    return next(n for n in names if n.startswith("aten::_scaled_dot_product"))


backends = list(SDPBackend.__members__)
print(f"SDPBackend members: {backends}")
x = torch.randn(1, 2, 4, 8)  # (B, H, S, D)
for name in backends[1:]:  # ERROR is a sentinel, not a backend
    try:
        with sdpa_kernel(SDPBackend.__members__[name]):
            print(f"{name:<19} -> {sdpa_op(x, x, x)}")
    except RuntimeError as err:
        print(f"{name:<19} -> {first_sentence(err)}")
print(f"{'default':<19} -> {sdpa_op(x, x, x)}")

# %% [markdown]
# Output:
# ```text
# SDPBackend members: ['ERROR', 'MATH', 'FLASH_ATTENTION', 'EFFICIENT_ATTENTION', 'CUDNN_ATTENTION', 'OVERRIDEABLE']
# MATH                -> aten::_scaled_dot_product_attention_math
# FLASH_ATTENTION     -> aten::_scaled_dot_product_flash_attention_for_cpu
# EFFICIENT_ATTENTION -> No viable backend for scaled_dot_product_attention was found
# CUDNN_ATTENTION     -> No viable backend for scaled_dot_product_attention was found
# OVERRIDEABLE        -> No viable backend for scaled_dot_product_attention was found
# default             -> aten::_scaled_dot_product_flash_attention_for_cpu
# ```
#
# The enum lists every backend PyTorch knows, not what this build can run. On the CPU two
# work: the math reference and a CPU flash kernel (tiled, with the online softmax of
# section 1), which the default picks. Memory-efficient attention and cuDNN are CUDA
# kernels; `OVERRIDEABLE` is for out-of-tree devices. Restricting SDPA to them leaves no
# candidate, and the error (its next sentence blames "turning off both the math kernel and
# the fused kernels") is the same for every such case. (The profiler also prints its own
# start/stop lines to stderr; they are not part of the output.)
#
# **Predict.** On CUDA, the flash kernel takes only fp16/bf16 and no arbitrary `attn_mask`.
# Does the CPU flash kernel refuse fp64 or a boolean mask?

# %%
keep = torch.ones(4, 4, dtype=torch.bool).tril()  # (L, S)
for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
    t = torch.randn(1, 2, 4, 8, dtype=dtype)  # (B, H, S, D): tiny, bf16/fp16 matmuls can be slow
    print(f"{str(dtype):<14} no mask -> {sdpa_op(t, t, t)}, bool mask -> {sdpa_op(t, t, t, attn_mask=keep)}")

# %% [markdown]
# Output:
# ```text
# torch.float32  no mask -> aten::_scaled_dot_product_flash_attention_for_cpu, bool mask -> aten::_scaled_dot_product_flash_attention_for_cpu
# torch.float64  no mask -> aten::_scaled_dot_product_flash_attention_for_cpu, bool mask -> aten::_scaled_dot_product_flash_attention_for_cpu
# torch.bfloat16 no mask -> aten::_scaled_dot_product_flash_attention_for_cpu, bool mask -> aten::_scaled_dot_product_flash_attention_for_cpu
# torch.float16  no mask -> aten::_scaled_dot_product_flash_attention_for_cpu, bool mask -> aten::_scaled_dot_product_flash_attention_for_cpu
# ```
#
# The CPU flash kernel takes fp32, fp64, bf16 and fp16, with or without a mask. The
# "half precision only, no arbitrary mask" rules you will read about are limits of the CUDA
# flash kernel; backend eligibility is per device, per build, per version. Check it with
# the profiler rather than trusting a list (the CUDA test of this lesson does that on a GPU).
#
# **Predict.** With bf16 inputs, does the math reference multiply and normalise in bf16, or
# in fp32? And the flash kernel, which works on blocks of keys: is its error against a
# float64 reference smaller or larger than the math backend's? (A guess: nothing so far
# shows what happens inside a kernel.)


# %%
class DtypeLog(TorchDispatchMode):
    """Records (ATen op, dtype of its result) for every op that reaches Python dispatch."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func.overloadpacket.__name__, out.dtype if isinstance(out, torch.Tensor) else None))
        return out


g = torch.Generator().manual_seed(0)  # k and v from their own stream: q, k, v independent
qb = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)  # (B, H, S, D)
kb, vb = (torch.randn(1, 2, 64, 64, generator=g).bfloat16() for _ in range(2))
with sdpa_kernel(SDPBackend.MATH), DtypeLog() as log:
    out_bf16 = F.scaled_dot_product_attention(qb, kb, vb)
steps = [f"{n}->{str(d).removeprefix('torch.')}" for n, d in log.ops if n in ("_to_copy", "bmm", "_safe_softmax")]
print(f"MATH on bf16: {steps}")
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    out_flash = F.scaled_dot_product_attention(qb, kb, vb)
ref64 = F.scaled_dot_product_attention(qb.double(), kb.double(), vb.double())  # (B, H, S, D)
bf16_err = {name: (out.double() - ref64).abs().mean().item()  # mean |error| against float64
            for name, out in (("MATH", out_bf16), ("FLASH", out_flash), ("formula in bf16", formula(qb, kb, vb)))}
print(f"output {out_bf16.dtype}; mean error vs float64: " + ", ".join(f"{k} {v:.2e}" for k, v in bf16_err.items()))
print(f"MATH closer to float64 than the formula in bf16: {bf16_err['MATH'] < bf16_err['formula in bf16']}")
print(f"FLASH error above MATH error: {bf16_err['FLASH'] > bf16_err['MATH']}")

# %% [markdown]
# Output:
# ```text
# MATH on bf16: ['_to_copy->float32', '_to_copy->float32', '_to_copy->float32', 'bmm->float32', '_safe_softmax->float32', '_to_copy->bfloat16', 'bmm->float32', '_to_copy->bfloat16']
# output torch.bfloat16; mean error vs float64: MATH «number», FLASH «number», formula in bf16 «number»
# MATH closer to float64 than the formula in bf16: True
# FLASH error above MATH error: True
# ```
#
# The math backend first copies Q, K and V to fp32 (three `_to_copy`), computes the scores,
# the softmax and the product with V in fp32, and rounds only the output back to bf16 (the
# last `_to_copy`; the one in between is the bf16 copy of the probabilities it also
# returns, which the second `bmm` does not use). So its error is little more than one bf16
# rounding of the output, smaller than the formula run in bf16 throughout. The price: fp32
# copies of Q, K and V and fp32 scores, twice the bytes of bf16 ones. `TorchDispatchMode`
# (lesson 02) sees each ATen op with its result; it cannot see inside the flash kernel,
# which is one op. Its error tells what it does: larger than the math backend's, because
# the CPU flash kernel keeps the scores, the running maximum and sum and the output in
# fp32, but rounds each block's exponentials (the probabilities before their final
# division) to the input dtype, bf16 here, before multiplying them by V (read from
# `aten/src/ATen/native/cpu/FlashAttentionKernel.cpp`). "Fused kernels compute in fp32" is
# true of their accumulators, not of every intermediate. With q = k = v the gap nearly
# vanishes (each query's softmax then leans hard on its own key, so rounding the
# exponentials costs little): comparing kernels needs independent inputs.
#
# **Predict.** The flash kernel is the CPU's default in every dtype above. Is it also the
# faster of the two in every dtype? Time both on one shape, (1, 2, 128, 64), in fp32, bf16
# and fp16.


# %%
def seconds(fn):
    """Wall time of one call of fn(), in seconds."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def math_over_flash(q, k, v, reps=101):
    """Median MATH time / median FLASH_ATTENTION time (above 1: flash is faster). The two
    backends run in alternation, so that a load on the machine slows both alike."""
    times = {"MATH": [], "FLASH_ATTENTION": []}
    for i in range(reps + 1):  # the first round is a warm-up
        for name, ts in times.items():
            with sdpa_kernel(SDPBackend.__members__[name]):
                t = seconds(lambda: F.scaled_dot_product_attention(q, k, v))
            if i:
                ts.append(t)
    return statistics.median(times["MATH"]) / statistics.median(times["FLASH_ATTENTION"])


speed = {}
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    qt, kt, vt = (torch.randn(1, 2, 128, 64, dtype=dtype) for _ in range(3))  # (B, H, S, D)
    speed[dtype] = math_over_flash(qt, kt, vt)
    print(f"{str(dtype).removeprefix('torch.'):<9} math time / flash time {speed[dtype]:.2f}")
fp16_check = getattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", None)  # PyTorch's own check
FP16_MATMUL = bool(fp16_check and fp16_check())  # False too in a build without oneDNN
print(f"oneDNN has an fp16 matrix path for this CPU: {FP16_MATMUL}")

# %% [markdown]
# Output:
# ```text
# float32   math time / flash time «ratio»
# bfloat16  math time / flash time «ratio»
# float16   math time / flash time «ratio»
# oneDNN has an fp16 matrix path for this CPU: «name»
# ```
#
# A ratio above 1 means the flash kernel is faster. Timings depend on the machine, hence
# the placeholders, and so does the last line: it is PyTorch's own check
# (`torch.ops.mkldnn._is_mkldnn_fp16_supported()`), True on x86 CPUs that have the fp16
# instructions oneDNN needs (recent Xeons with AVX512-FP16, for example). Where it prints
# False on an x86 CPU, fp16 reverses the order: the math backend is faster, at the very
# shape where flash wins in fp32 (there fp16's ratio stays below 0.85, and fp32's above 1
# and at least 1.5 times fp16's, even on a loaded machine). Yet the default picks the
# flash kernel for fp16 too (the dtype cell above). (The bf16
# row is shown for comparison, not asserted.)
#
# **Predict.** Why would fp16 be slow in the flash kernel and not in the math backend?
# Read the math backend's op log in fp16, and time one fp16 matrix product against the
# same product in fp32.


# %%
def matmul_slowdown(reps=41):
    """Median time of a (128, 64) @ (64, 128) matmul in fp16 / the same in fp32, alternating."""
    a16 = torch.randn(128, 64, dtype=torch.float16, generator=torch.Generator().manual_seed(2))  # (S, D)
    a32 = a16.float()
    t16, t32 = [], []
    for _ in range(reps):
        t16.append(seconds(lambda: a16 @ a16.T))
        t32.append(seconds(lambda: a32 @ a32.T))
    return statistics.median(t16) / statistics.median(t32)


t16 = torch.randn(1, 2, 128, 64, dtype=torch.float16, generator=torch.Generator().manual_seed(3))  # (B, H, S, D)
with sdpa_kernel(SDPBackend.MATH), DtypeLog() as log16:
    F.scaled_dot_product_attention(t16, t16, t16)
steps16 = [f"{n}->{str(d).removeprefix('torch.')}" for n, d in log16.ops if n in ("_to_copy", "bmm")]
print(f"MATH on fp16: {steps16}")
mm_slowdown = matmul_slowdown()
print(f"fp16 matmul time / fp32 matmul time {mm_slowdown:.1f}")

# %% [markdown]
# Output:
# ```text
# MATH on fp16: ['_to_copy->float32', '_to_copy->float32', '_to_copy->float32', 'bmm->float32', '_to_copy->float16', 'bmm->float32', '_to_copy->float16']
# fp16 matmul time / fp32 matmul time «ratio»
# ```
#
# The two code paths explain it. The math backend casts fp16 to fp32 first, as it does
# bf16 above (three `_to_copy` to float32), and both its products run in fp32, with the
# fp32 BLAS. The flash kernel multiplies its fp16 tiles as they are (accumulating in fp32),
# and without fp16 matrix instructions PyTorch's CPU matrix product for fp16 has no fast
# path: the last line is a plain fp16 matmul's time over fp32's (at least 3 on x86 CPUs
# where the check above printed False). A fused kernel saves memory traffic;
# it cannot make up for slow arithmetic. So "fused is faster" is a rule of thumb, not a
# law: on your machine, with your shapes and dtype, time the `sdpa_kernel` choices as the
# timing cell does (alternating the two, taking medians) before trusting the default.
#
# **Predict.** Older code restricts backends with `torch.backends.cuda.sdp_kernel(...)`.
# Does it still work in 2.13.0?

# %%
with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_mem_efficient=False):  # warns
    old = F.scaled_dot_product_attention(x, x, x)  # (B, H, S, D)
print(f"the old call ran: output {tuple(old.shape)}, "
      f"close to the default backend's: {torch.allclose(old, F.scaled_dot_product_attention(x, x, x), atol=1e-6)}")

# %% [markdown]
# Output:
# ```text
# the old call ran: output (1, 2, 4, 8), close to the default backend's: True
# ```
#
# It still works, with a `FutureWarning` that Python prints above the output (on stderr:
# `torch.backends.cuda.sdp_kernel() is deprecated ...`, naming the replacement,
# `torch.nn.attention.sdpa_kernel`, used throughout this lesson, which takes a list of
# `SDPBackend` values instead of one flag per backend). A `FutureWarning` announces a
# removal in a later release: in your own code, replace the old call (running your tests
# with `-W error::FutureWarning` finds every such call).
#
# **Predict.** A query row whose keys are *all* masked: softmax of a row of `-inf` is
# 0/0. What does the formula give, and what does SDPA give?

# %%
keep_none = torch.tensor([[True, True], [False, False]])  # (L, S): query 1 sees no key
print(f"formula:         {rows(formula(q2, k2, v2, keep_none)[0, 0])}")
for name in ("MATH", "FLASH_ATTENTION"):
    with sdpa_kernel(SDPBackend.__members__[name]):
        out = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=keep_none)
    print(f"{name:<16} {rows(out[0, 0])}")
pad_all, _ = mha(q2[0], k2[0], v2[0], key_padding_mask=torch.tensor([[True, True]]), need_weights=False)
print(f"MHA, all padded: {rows(pad_all[0])}")

# %% [markdown]
# Output:
# ```text
# formula:         [[4.9, 5.1], [nan, nan]]
# MATH             [[4.9, 5.1], [0.0, 0.0]]
# FLASH_ATTENTION  [[4.9, 5.1], [0.0, 0.0]]
# MHA, all padded: [[0.0, 0.0], [0.0, 0.0]]
# ```
#
# The textbook formula gives NaN, and a NaN spreads to the loss and every gradient. SDPA in
# 2.13.0 returns zeros instead: the math backend uses a "safe" softmax
# (`aten::_safe_softmax`, visible in section 7's op log) that writes 0 for fully masked
# rows, and the CPU flash kernel agrees. Do not rely on it: it is a choice of these kernels
# in this version, not of the formula, and a zero vector is not a meaningful output either. Make sure every query keeps at least one
# key (for left padding, let padded queries see themselves, and drop their outputs from
# the loss).

# %% [markdown]
# ## 8. FlexAttention: masks as functions, sparsity as blocks
#
# FlexAttention (`torch.nn.attention.flex_attention`) takes two small Python functions:
#
# - a `mask_mod(b, h, q_idx, kv_idx) -> bool` that says which pairs are kept;
# - a `score_mod(score, b, h, q_idx, kv_idx) -> score` that changes a kept score.
#
# `create_block_mask` evaluates the `mask_mod` once, in blocks of 128 × 128, and records
# which blocks are empty (skipped), full (no mask needed) or partial. `torch.compile`
# then writes one fused kernel with the functions inlined.
#
# **Predict.** With S = 512 (a 4 × 4 grid of blocks), what fraction of blocks does a causal
# mask skip? A sliding window of 128 keys? Three packed documents of 200, 150 and 162 tokens?

# %%
S_FLEX, WINDOW = 512, 128
doc_lens = torch.tensor([200, 150, 162])
doc_id = torch.repeat_interleave(torch.arange(len(doc_lens)), doc_lens)  # (S,): document of each token


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)


def document(b, h, q_idx, kv_idx):
    return doc_id[q_idx] == doc_id[kv_idx]  # packed sequences: no attention across documents


mask_mods = {"causal": causal, "sliding window": sliding_window,
             "document": document, "document + causal": and_masks(document, causal)}
block_masks = {n: create_block_mask(m, None, None, S_FLEX, S_FLEX, device="cpu") for n, m in mask_mods.items()}
dense = {n: create_mask(m, None, None, S_FLEX, S_FLEX, device="cpu")[0, 0] for n, m in mask_mods.items()}  # (S, S)
for name, bm in block_masks.items():
    print(f"{name:<18} kept cells {dense[name].float().mean():.1%}  block sparsity {bm.sparsity():.2f}%")
print(block_masks["causal"].to_string(grid_size=(4, 4)).rstrip())  # one character pair per block

# %% [markdown]
# Output:
# ```text
# causal             kept cells 50.1%  block sparsity 37.50%
# sliding window     kept cells 21.9%  block sparsity 56.25%
# document           kept cells 33.9%  block sparsity 37.50%
# document + causal  kept cells 17.0%  block sparsity 56.25%
# (0, 0)
# ██
# ████
# ██████
# ████████
# ```
#
# Sparsity counts whole blocks: a causal 4 × 4 grid computes 10 of 16 blocks, so 37.5 % are
# skipped, even though half the *cells* are masked (the diagonal blocks are partial: they
# are computed, with the mask applied inside). The document mask keeps a third of the cells
# but cuts across block boundaries (200 is not a multiple of 128), so it skips only 6 of 16
# blocks. Block sparsity is what saves time; the masked cells inside a partial block still
# cost.


# %%
def plot_masks(dense, block_masks, block=128):
    """The dense masks as images, with the block grid and each mask's block sparsity."""
    fig, axes = plt.subplots(1, len(dense), figsize=(3.2 * len(dense), 3.4))
    for ax, (name, keep) in zip(axes, dense.items()):
        ax.imshow(keep.numpy(), cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
        for edge in range(block, keep.shape[0], block):
            ax.axhline(edge - 0.5, color="0.6", lw=0.5)
            ax.axvline(edge - 0.5, color="0.6", lw=0.5)
        ax.set_title(f"{name}\nblock sparsity {block_masks[name].sparsity():.2f}%", fontsize=9)
        ax.set_xlabel("key index")
    axes[0].set_ylabel("query index")
    fig.tight_layout()
    return fig


fig = plot_masks(dense, block_masks)
fig.savefig(HERE / "masks.png", dpi=100)
print("saved masks.png")

# %% [markdown]
# Output:
# ```text
# saved masks.png
# ```
#
# **Predict.** Can we train through FlexAttention on this CPU?

# %%
qr = torch.randn(1, 2, S_FLEX, 16, requires_grad=True)  # (B, H, S, D)
try:
    flex_attention(qr, qr, qr, block_mask=block_masks["causal"])
except NotImplementedError as err:
    print(f"NotImplementedError: {err}")

# %% [markdown]
# Output:
# ```text
# NotImplementedError: FlexAttention does not support backward on CPU. Please set the input requires_grad to False or use another device.
# ```
#
# No: in 2.13.0 FlexAttention refuses CPU inputs that require grad, before computing
# anything. Forward (inference) works; the backward check of this lesson runs in a CUDA
# test.
#
# ## 9. One compiled kernel, checked against SDPA
#
# `torch.compile(flex_attention)` inlines the `mask_mod` and `score_mod` into the kernel it
# generates, so four different mask functions mean four kernels and four compiles. The masks above are all *intervals*: query i keeps the keys
# from `first[i]` to `last[i]`. Written that way, one `mask_mod` covers them all and only
# the data changes: one compile. We add ALiBi as the `score_mod`: head h adds
# `slope[h] · (kv − q)` to each score, a penalty that grows with distance.
#
# **Predict.** Do the interval masks equal the four mask functions? Does compiled flex with
# ALiBi equal SDPA given the same bias and mask as a dense float `attn_mask`?


# %%
def interval_mask(first, last):
    """A mask_mod keeping keys first[q] <= kv <= last[q]: one code, any interval data."""
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx >= first[q_idx]) & (kv_idx <= last[q_idx])
    return mask_mod


pos = torch.arange(S_FLEX)
doc_start = (torch.cumsum(doc_lens, 0) - doc_lens)[doc_id]  # (S,)
doc_end = torch.cumsum(doc_lens, 0)[doc_id] - 1  # (S,)
intervals = {"causal": (torch.zeros_like(pos), pos), "sliding window": ((pos - WINDOW + 1).clamp(min=0), pos),
             "document": (doc_start, doc_end), "document + causal": (doc_start, pos)}
for name, (first, last) in intervals.items():
    keep = create_mask(interval_mask(first, last), None, None, S_FLEX, S_FLEX, device="cpu")[0, 0]  # (S, S)
    print(f"{name:<18} interval mask equals the mask function: {torch.equal(keep, dense[name])}")

# %% [markdown]
# Output:
# ```text
# causal             interval mask equals the mask function: True
# sliding window     interval mask equals the mask function: True
# document           interval mask equals the mask function: True
# document + causal  interval mask equals the mask function: True
# ```


# %%
def alibi(slopes):
    """A score_mod adding slopes[h] * (kv - q): closures, not globals, carry the data."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    return score_mod


def dense_bias(keep):
    """ALiBi bias plus -inf where masked: the float attn_mask that SDPA needs to match flex."""
    bias = slopes.view(-1, 1, 1) * (pos.view(1, 1, -1) - pos.view(1, -1, 1))  # (H, S, S)
    return bias.masked_fill(~keep, float("-inf")).unsqueeze(0)  # (1, H, S, S)


def graph_count():
    """Graphs Dynamo has compiled in this process so far (other lessons may have compiled some)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def check_flex(flex):
    """Compiled flex (ALiBi + each interval mask) against SDPA given the same dense bias:
    prints each call's time, returns the max error per mask."""
    errors = {}
    for i, (name, (first, last)) in enumerate(intervals.items()):
        bm = create_block_mask(interval_mask(first, last), None, None, S_FLEX, S_FLEX, device="cpu")
        t0 = time.perf_counter()
        out_flex = flex(qf, kf, vf, score_mod=alibi(slopes), block_mask=bm)  # (B, H, S, D)
        seconds = time.perf_counter() - t0
        out_dense = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=dense_bias(dense[name]))
        errors[name] = (out_flex - out_dense).abs().max().item()
        took = f"compile + run {seconds:.2f} s" if i == 0 else f"run {seconds * 1e3:.1f} ms"
        print(f"{name:<18} {took}, below 1e-5: {errors[name] < 1e-5}")
    return errors


H_FLEX = 2
slopes = 2.0 ** (-8 * torch.arange(1, H_FLEX + 1) / H_FLEX)  # ALiBi slopes: 1/16, 1/256
qf, kf, vf = (torch.randn(1, H_FLEX, S_FLEX, 16) for _ in range(3))  # (B, H, S, D)
flex = torch.compile(flex_attention)
graphs_before, errors = graph_count(), {}
try:  # PyTorch decides whether this CPU may compile FlexAttention; ask it by trying
    errors = check_flex(flex)
except torch._inductor.exc.InductorError as err:  # refused while lowering, before any kernel
    reason = str(err).splitlines()[0]
    if "not supported for CPU" not in reason:
        raise  # any other failure is a real error, not a refusal
    print(f"skipped: PyTorch refuses compiled FlexAttention on this CPU: {reason}")
FLEX_REFUSED = not errors  # compiled flex did not run here: no AVX2, or macOS
if not FLEX_REFUSED:
    print(f"largest error {max(errors.values()):.1e} (fp32)")
    print(f"graphs compiled: {graph_count() - graphs_before}")
n_graphs = graph_count() - graphs_before

# %% [markdown]
# Output:
# ```text
# causal             compile + run «time» s, below 1e-5: True
# sliding window     run «time» ms, below 1e-5: True
# document           run «time» ms, below 1e-5: True
# document + causal  run «time» ms, below 1e-5: True
# largest error «number» (fp32)
# graphs compiled: 1
# ```
#
# ```text when=no-cpu-flex-attention
# skipped: PyTorch refuses compiled FlexAttention on this CPU: LoweringException: NotImplementedError: torch.compile on current platform is not supported for CPU.
# ```
#
# The first call compiles: Dynamo traces flex, Inductor writes and compiles a C++ kernel
# with `interval_mask` and `alibi` inlined. That takes seconds, most of them spent in the
# C++ compiler when the cache is empty. The other calls reuse that kernel, because only
# tensors changed, and take milliseconds. The errors are fp32 rounding: flex and SDPA sum
# in different orders, and those orders depend on the CPU's vector width, so the largest
# error is a placeholder; it stays below 1e-5. Had we passed the four mask functions of
# section 8 instead, Dynamo would have compiled a graph for each (lesson 08 shows how to
# count graphs with a backend that generates no code). Timings are machine-dependent,
# hence the placeholders.
#
# The second block is what this cell prints where PyTorch refuses to compile FlexAttention
# for the CPU. Its rule in 2.13.0 (`check_cpu_supported` in
# `torch/_inductor/kernel/flex/flex_cpu.py`) asks for AVX2 (and `ATEN_CPU_CAPABILITY` not
# set to `default`) and excludes macOS: so Apple silicon, Intel Macs, Arm Linux and x86
# CPUs without AVX2 all get this block. The cell does not guess: it tries, and catches
# PyTorch's own `InductorError`, raised while lowering, before any C++ is compiled; any other
# error is re-raised. There `FLEX_REFUSED` is True and nothing below depends on a compiled
# kernel. The mask functions and block masks of section 8 need no compiler and run
# everywhere.
#
# The data travels in closures (`interval_mask(first, last)`, `alibi(slopes)`) rather than
# through module globals: Dynamo guards on what a compiled function reads, and closure
# cells are the robust way to hand it tensors.

# %% [markdown]
# ## 10. On a GPU
#
# (Unverified on a GPU: what follows is what a GPU run should show.) On a CUDA GPU, bf16
# causal attention at S = 1024 to 8192 can run on every SDPA backend the GPU and build
# support (flash, memory-efficient, cuDNN, math); each that runs should agree with the math
# backend's output, and its time and peak memory (`torch.cuda.max_memory_allocated`) should
# behave as its algorithm says: the math backend's extra memory grows about 4 times per
# doubling of S (it stores the scores), a fused backend's about 2 times at most, and at S =
# 8192 every fused backend should be faster than math and use a tenth of its memory or
# less. FlexAttention's backward runs on CUDA and can be compared with SDPA's and a float64
# reference (in fp32 throughout: PyTorch leaves TF32 off for matmuls by default).

# %% [markdown]
# ## Summary
#
# - Attention = softmax(QKᵀ/√d + M)·V: B·H·S·S scores (134,217,728 for two heads at
#   S = 8192, 512 MiB in fp32). Fused kernels tile K and V with an online softmax (a
#   running max, sum and output, rescaled by exp(m_old − m_new) when the max grows: exact,
#   not an approximation), so they never store the scores; backward recomputes them.
# - Dividing by √d keeps var(q·k) near 1 whatever the head size; without it a large head
#   makes the softmax nearly one-hot, and a one-hot softmax passes almost no gradient.
# - `sdpa_kernel(SDPBackend.MATH)` gives the reference; it matches the formula, forward and
#   gradients, within rounding in float64: check it with a bound, not `torch.equal`.
# - Multi-head attention: one (3E, E) projection, a view and a transpose per head, one SDPA
#   for all heads, a merge and an output projection: `nn.MultiheadAttention`, to 1e-12.
# - On the CPU, SDPA reads lesson 01's permuted (B, H, S, D) views through their strides:
#   no copy (where `q @ kᵀ` copies both), the same bits as on contiguous inputs, and an
#   output already laid out for the next projection.
# - The CPU flash kernel keeps its sums in fp32 but rounds each block's exponentials to
#   bf16 before P·V: its bf16 error is above the math backend's.
# - SDPA's boolean mask: True = keep. `key_padding_mask`: True = ignore. Float masks add.
#   A masked weight is exactly 0 and each row still sums to 1 over the keys it keeps.
# - `is_causal=True` aligns to the upper left; a decode step needs `is_causal=False` (one
#   query) or a bottom-right mask (`causal_lower_right`).
# - `dropout_p` is applied whatever `eval()` says: pass `0.0` at inference.
# - `enable_gqa=True` equals `repeat_interleave` of the K/V heads; the CPU flash kernel does
#   it without copies, the math backend copies K and V to the query head count.
# - On this CPU build: MATH and a CPU flash kernel (the default; fp32/fp64/bf16/fp16, masks
#   allowed); EFFICIENT/CUDNN fail with "No viable backend". All-masked rows give 0 in
#   SDPA 2.13.0 and NaN in the formula: avoid them.
# - Fused is not always faster: on an x86 CPU without oneDNN's fp16 matrix path, fp16
#   attention of shape (1, 2, 128, 64) runs faster on the math backend (fp32 inside) than
#   on the default flash kernel. Time the backends on your own shapes and dtype.
# - FlexAttention: `mask_mod` + `create_block_mask` (block sparsity) + `score_mod`, one
#   compiled kernel per pair of functions; put the varying data in tensors to compile
#   once. No backward on CPU in 2.13.0, and no compiled CPU kernel without AVX2 or on
#   macOS (PyTorch's own check; the lesson tries and reports the refusal).

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each path is relative to the folder that holds your installed
# `torch` (your site-packages), and the line numbers are those of your installation; the two
# C++ files the wheel does not ship are links at the release's tag. The stops follow the
# lesson: the formula as PyTorch documents it, the math backend that computes it, what the
# flash kernel keeps for backward and how it walks the keys, the backend switch, and
# FlexAttention's block masks.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/nn/functional.py", "scaled_dot_product_attention = _add_docstr(",
     "Only a docstring on the C++ op, whose reference code is section 2's `formula` with every "
     "option: scale `1 / math.sqrt(query.size(-1))`, a boolean mask turned into `-inf` where it "
     "is False and a float mask added (section 3), `is_causal` as `ones(L, S).tril(diagonal=0)`, "
     "which for L < S is section 4's upper-left alignment, `repeat_interleave` for GQA (section "
     "6) and `torch.dropout(..., train=True)`, blind to `eval()` (section 5). Its plain softmax "
     "gives NaN for a fully masked row, where SDPA gives 0 (section 7)."),
    ("pytorch:aten/src/ATen/native/transformers/attention.cpp",
     "std::tuple<Tensor, Tensor> _scaled_dot_product_attention_math(",
     "The math backend: fp16 and bf16 inputs go `.to(at::kFloat)` first (section 7's three "
     "`_to_copy`), `pre_process_group_query_attention_input` copies K and V with "
     "`repeat_interleave` (section 6, and its cut-short head-count message), and "
     "`at::_safe_softmax` writes 0 for fully masked rows. It multiplies Q and K each by the "
     "square root of the scale before their product, where `formula` divides the product: the "
     "same in exact arithmetic, a different rounding, hence section 2's bound."),
    ("torchgen/packaged/autograd/derivatives.yaml",
     "name: _scaled_dot_product_flash_attention_for_cpu(",
     "The CPU flash kernel's autograd entry: of `(output, logsumexp)` only the output is "
     "differentiable, and the backward op gets `query, key, value, output, logsumexp` and "
     "`attn_mask` (None in section 2): the tensors section 2 found saved, none of size S x S. "
     "The math backend has no entry: it is composite, so autograd records the ops it runs, "
     "probabilities included."),
    ("pytorch:aten/src/ATen/native/cpu/FlashAttentionKernel.cpp", "void cpu_flash_attention(",
     "The online softmax of section 1: for each block of queries, a loop over blocks of keys "
     "keeps `qk_max` and `qk_sum` per row and rescales the partial output `dst` by "
     "`exp(old max - new max)`. After the loop a row whose sum is 0 (every key masked) is "
     "divided by 1, so it outputs 0 (section 7), and `max + log(sum)` is stored as the "
     "`logsumexp` that backward uses (section 2)."),
    ("torch/nn/attention/__init__.py", "def sdpa_kernel(",
     "`_sdpa_kernel`, just above, switches one flag per backend "
     "(`torch._C._set_sdp_use_flash`, `..._math`, ...) on or off by whether it is in your "
     "list, and the `finally` restores the previous flags: it only sets which backends are "
     "candidates, it cannot make a kernel accept inputs it refuses. With no candidate left, "
     "section 7's \"No viable backend\" follows."),
    ("torch/nn/attention/flex_attention.py", "def create_block_mask(",
     "It evaluates your `mask_mod` into a dense mask with `create_mask`, then "
     "`_convert_mask_to_block_mask` (above) sums each 128 x 128 block: all kept is a full "
     "block, none kept is skipped, anything between is a partial block, masked inside. "
     "`BlockMask.sparsity` is the skipped share (section 8), and `_validate_device`, below, "
     "raises section 8's error for CPU inputs that require grad."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/nn/functional.py:«line»  `scaled_dot_product_attention = _add_docstr(`
#     Only a docstring on the C++ op, whose reference code is section 2's `formula` with
#     every option: scale `1 / math.sqrt(query.size(-1))`, a boolean mask turned into
#     `-inf` where it is False and a float mask added (section 3), `is_causal` as `ones(L,
#     S).tril(diagonal=0)`, which for L < S is section 4's upper-left alignment,
#     `repeat_interleave` for GQA (section 6) and `torch.dropout(..., train=True)`, blind
#     to `eval()` (section 5). Its plain softmax gives NaN for a fully masked row, where
#     SDPA gives 0 (section 7).
# https://github.com/pytorch/pytorch/blob/v«version»/aten/src/ATen/native/transformers/attention.cpp
#     search for `std::tuple<Tensor, Tensor> _scaled_dot_product_attention_math(`: The
#     math backend: fp16 and bf16 inputs go `.to(at::kFloat)` first (section 7's three
#     `_to_copy`), `pre_process_group_query_attention_input` copies K and V with
#     `repeat_interleave` (section 6, and its cut-short head-count message), and
#     `at::_safe_softmax` writes 0 for fully masked rows. It multiplies Q and K each by
#     the square root of the scale before their product, where `formula` divides the
#     product: the same in exact arithmetic, a different rounding, hence section 2's
#     bound.
# torchgen/packaged/autograd/derivatives.yaml:«line»  `name: _scaled_dot_product_flash_attention_for_cpu(`
#     The CPU flash kernel's autograd entry: of `(output, logsumexp)` only the output is
#     differentiable, and the backward op gets `query, key, value, output, logsumexp` and
#     `attn_mask` (None in section 2): the tensors section 2 found saved, none of size S x
#     S. The math backend has no entry: it is composite, so autograd records the ops it
#     runs, probabilities included.
# https://github.com/pytorch/pytorch/blob/v«version»/aten/src/ATen/native/cpu/FlashAttentionKernel.cpp
#     search for `void cpu_flash_attention(`: The online softmax of section 1: for each
#     block of queries, a loop over blocks of keys keeps `qk_max` and `qk_sum` per row and
#     rescales the partial output `dst` by `exp(old max - new max)`. After the loop a row
#     whose sum is 0 (every key masked) is divided by 1, so it outputs 0 (section 7), and
#     `max + log(sum)` is stored as the `logsumexp` that backward uses (section 2).
# torch/nn/attention/__init__.py:«line»  `def sdpa_kernel(`
#     `_sdpa_kernel`, just above, switches one flag per backend
#     (`torch._C._set_sdp_use_flash`, `..._math`, ...) on or off by whether it is in your
#     list, and the `finally` restores the previous flags: it only sets which backends are
#     candidates, it cannot make a kernel accept inputs it refuses. With no candidate
#     left, section 7's "No viable backend" follows.
# torch/nn/attention/flex_attention.py:«line»  `def create_block_mask(`
#     It evaluates your `mask_mod` into a dense mask with `create_mask`, then
#     `_convert_mask_to_block_mask` (above) sums each 128 x 128 block: all kept is a full
#     block, none kept is skipped, anything between is a partial block, masked inside.
#     `BlockMask.sparsity` is the skipped share (section 8), and `_validate_device`,
#     below, raises section 8's error for CPU inputs that require grad.
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
#    rounding-level: the test asserts it below 1e-12. The gaps are printed as placeholders
#    because their last digits can change with the order in which a CPU's matmul sums, so
#    only a bound holds on every student's machine (*§ SDPA is the formula*).
#
#    </details>
#
# 2. **Explain.** For backward, what does each CPU backend keep from an attention call at
#    S = 64, and why does the difference decide what fits at S = 8192?
#
#    <details><summary>Answer</summary>
#
#    The math backend's graph keeps (S, S) tensors, (1, 2, 64, 64) and (2, 64, 64) among
#    them: the probabilities. The flash kernel's one backward node keeps Q, K, V and the
#    output, (1, 2, 64, 16) each, and one log-sum-exp per query row, (1, 2, 64): nothing
#    of size S × S, so its backward must recompute the scores (*§ SDPA is the formula*).
#    The S × S part grows as S²: at S = 8192 the fp32 scores of two heads alone are
#    512 MiB per layer (*§ The formula, and the size of the score matrix*).
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
# 5. **Predict.** FlexAttention with a causal `mask_mod` at S = 512 and 128 × 128 blocks
#    keeps about half the cells. What share of the blocks does it skip, and why not half?
#
#    <details><summary>Answer</summary>
#
#    37.5 %: 10 of the 16 blocks hold a kept cell and are computed (the printed grid), 6
#    are skipped, while 50.1 % of the cells are kept. A block is skipped only when every
#    cell in it is masked; the blocks on the diagonal are half masked and still computed.
#    Block sparsity counts the blocks left out of the computation, not masked cells: the
#    document mask keeps 33.9 % of the cells and also skips 37.5 % of the blocks
#    (*§ FlexAttention: masks as functions, sparsity as blocks*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement:
#
# 1. `sdpa_reference(q, k, v, attn_mask, is_causal, enable_gqa)`: SDPA's contract in a few
#    lines: boolean and float masks, upper-left causal, GQA, zeros for all-masked rows.
# 2. `document_causal_mask(doc_lens)`: a `mask_mod` for packed documents, causal inside
#    each document.
# 3. `tiled_attention(q, k, v, block)`: attention with the online softmax, never holding
#    more than `block` keys' scores at a time.
#
# Check them with `make exercises N=07`; `solutions.py` has one way to write them.

# %% [markdown]
# # 07b · Attention kernels: the online softmax, SDPA's backends, FlexAttention
#
# Part 07a took attention's formula apart, `softmax(Q Kᵀ / √d + M) · V`, and found that SDPA
# computes it. This part opens the kernels that compute it without ever storing the
# S × S score matrix: the online softmax they rely on, which backends SDPA has and which
# one runs, what they do in bf16, and FlexAttention, which compiles a kernel for masks and
# score changes that SDPA does not know. As in 07a, every contract is checked on tiny
# tensors, where each number can be read.
#
# **What you will learn**
#
# - why fused kernels work in tiles, the online softmax that normalises a row of scores it
#   never holds whole (worked on two chunks of keys), and what such a kernel keeps for
#   backward;
# - which SDPA backends a build has, which one the CPU runs, what `sdpa_kernel(...,
#   set_priority=True)` changes, what lesson 06a's profiler shows of each backend, and how
#   stable the documentation says these APIs are;
# - what bf16 does inside the math backend and the CPU flash kernel, and SDPA under lesson
#   05b's autocast;
# - FlexAttention: mask functions, block masks and their sparsity, score functions
#   (soft-capping, ALiBi), a prefix-LM mask, what it does when not compiled, and one
#   compiled kernel checked against SDPA.
#
# **Prerequisites:** lesson 07a (the formula, SDPA and its math backend, masks, GQA);
# lesson 02 (a `TorchDispatchMode`), lesson 05b (autocast), lesson 06a (the profiler).
#
# **How to run:** `python lessons/07b_attention_kernels/attention_kernels.py` or
# `make lesson N=07b` from the repository root, or open `attention_kernels.ipynb`.
# Everything runs on the CPU. One cell compiles FlexAttention with `torch.compile`: with an
# empty Inductor cache that takes most of the lesson's run time (the cell prints how long),
# far less once the generated code is cached on disk; `make lesson` points
# `TORCHINDUCTOR_CACHE_DIR` at `build/inductor-cache` so that later runs reuse it. Where
# PyTorch refuses to compile FlexAttention for the CPU (on macOS, Apple silicon or Intel,
# and on any CPU without AVX2, Arm Linux included), that cell prints PyTorch's reason and
# skips. Each printing cell is followed by an *Output* block: what it printed with the
# pinned PyTorch (2.13.0); parts that depend on the machine appear there as `«time»`,
# `«ratio»` or `«name»`, and the last cell's `«version»`, `«folder»` and `«line»` say which
# torch you installed, and where. One cell calls a deprecated function on purpose, and
# Python prints its `FutureWarning` above the output. Run outside the course's venv, this
# lesson may also print PyTorch's own diagnostic lines to stderr: `USDT: ... profiler_start`
# and `profiler_stop` around each profiler run and, on a CUDA build without a GPU,
# `gpuGetDeviceCount failed` and `No CUDA runtime is found`. They are harmless, and
# `make lesson` runs the lesson in the course's own environment, which turns them off.

# %%
import math
import os
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import and_masks, create_block_mask, create_mask, flex_attention
from torch.profiler import profile
from torch.utils._python_dispatch import TorchDispatchMode

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results, comparable timings
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DEVICE = torch.device(os.environ.get("COURSE_DEVICE", "cpu"))


def formula(q, k, v, keep=None):
    """Part 07a's reference: softmax(q kᵀ / √d + M) v, M = 0 where keep is True, -inf elsewhere."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, L, S)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, H, L, D)


def score_cells(b, h, s_q, s_k=None):
    """Part 07a's count: cells of the (B, H, S_q, S_k) score matrix."""
    return b * h * s_q * (s_q if s_k is None else s_k)


def first_sentence(err):
    """The first sentence of an error message: stable, and short enough to print."""
    return str(err).split(". ")[0]


# %% [markdown]
# ## 1. The online softmax: attention without the score matrix
#
# Part 07a counted the scores: B·H·S·S cells, 512 MiB of fp32 for two heads at S = 8192,
# growing as S². Fused kernels (FlashAttention and its relatives) never store them: they
# walk K and V in tiles, keep a running maximum and a running sum per query row (the
# *online softmax*), and rescale the partial output as each tile arrives.
#
# **Predict.** A tile step holds a 128-row block of queries, a 128-row block of keys and
# values (D = 128, bf16), their 128 × 128 fp32 scores, the fp32 running output and two
# numbers per row. Roughly how many bytes is that, and how many times smaller than the fp32
# scores of two heads at S = 8192?


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
# About 225 KiB per head: the order of a GPU's on-chip memory (shared memory and
# registers), and the same at every S, where the scores grow as S² (the figure). The price
# is recomputation: backward recomputes the scores tile by tile instead of reading them.
#
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
# ### What a fused kernel keeps for backward
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
# scores tile by tile: the recomputation above.

# %% [markdown]
# ## 2. Backends: which kernels this build has, and which one runs
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
# the fused kernels") is the same for every such case.
#
# ### The order of the list: `set_priority=True`
#
# **Predict** (a guess: nothing so far shows how SDPA orders its candidates). `sdpa_kernel`
# takes a list of backends. Does their order matter? On the CPU, with
# `[MATH, FLASH_ATTENTION]` and `set_priority=True`, which kernel runs?


# %%
NAMES = {int(member): name for name, member in SDPBackend.__members__.items()}


def priority():
    """The backends in the order the CUDA chooser tries them (the getter sdpa_kernel itself uses)."""
    return [NAMES[i] for i in torch._C._get_sdp_priority_order()]


default_order = priority()
print(f"default priority:       {default_order}")
with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], set_priority=True):
    print(f"with set_priority=True: {priority()}")
    prioritised = sdpa_op(x, x, x)
print(f"the CPU call inside ran {prioritised}; after the block, the default order again: "
      f"{priority() == default_order}")

# %% [markdown]
# Output:
# ```text
# default priority:       ['FLASH_ATTENTION', 'EFFICIENT_ATTENTION', 'MATH', 'CUDNN_ATTENTION', 'OVERRIDEABLE']
# with set_priority=True: ['MATH', 'FLASH_ATTENTION', 'EFFICIENT_ATTENTION', 'CUDNN_ATTENTION', 'OVERRIDEABLE']
# the CPU call inside ran aten::_scaled_dot_product_flash_attention_for_cpu; after the block, the default order again: True
# ```
#
# Without `set_priority`, the list only says which backends are candidates. The order
# among candidates is a global priority list, which `set_priority=True` rewrites for the
# block: your backends first, in your order, then the others; on exit the old order comes
# back. The CUDA chooser walks that list and takes the first backend that accepts the
# inputs (the default order, printed above, is written in `torch/include/ATen/Context.h`;
# unverified on a GPU). The CPU chooser ignores it: it tries the flash kernel, then math,
# always (`priority_order_cpp` in `sdp_utils_cpp.cpp`, in *Read the source*), so MATH first
# changes nothing here. To run the math backend on the CPU, leave the flash kernel out of
# the list.
#
# ### What the profiler shows of each backend
#
# Part 07a's dispatch mode saw one op for a default call. The profiler (lesson 06a) records
# every op that runs, composites and nested calls included.
#
# **Predict.** For one call under each CPU backend, what does the profiler record on top,
# and how many matrix products and softmaxes run inside?


# %%
def profiled(backend):
    """The ATen ops the profiler records for one SDPA call under `backend`, in order."""
    with sdpa_kernel(SDPBackend.__members__[backend]), profile() as prof:
        F.scaled_dot_product_attention(x, x, x)
    return [e.name.removeprefix("aten::") for e in prof.events()]


for backend in ("MATH", "FLASH_ATTENTION"):
    ops = profiled(backend)
    print(f"{backend:<15} {ops[0]} > {ops[1]}: {len(ops) - 2} ops beneath, "
          f"bmm {ops.count('bmm')}x, _softmax {ops.count('_softmax')}x")

# %% [markdown]
# Output:
# ```text
# MATH            scaled_dot_product_attention > _scaled_dot_product_attention_math: 48 ops beneath, bmm 2x, _softmax 1x
# FLASH_ATTENTION scaled_dot_product_attention > _scaled_dot_product_flash_attention_for_cpu: 17 ops beneath, bmm 0x, _softmax 0x
# ```
#
# On top, the profiler shows `scaled_dot_product_attention` itself, the composite that a
# dispatch mode never sees, and under it the backend's op. The math backend's work is
# visible as ordinary ops: two `bmm` and a softmax, each one pass over the (S, S) scores in
# memory. The flash kernel's is not: beneath its op the profiler sees only allocations
# (`empty*`) and views (`transpose`, `as_strided`), because the products and the online
# softmax run inside one C++ function. A profile of a fused kernel tells you which kernel
# ran and how long it took, not what happened inside.
#
# **Predict.** You may read that the flash kernel takes only fp16/bf16 and no arbitrary
# `attn_mask`. Does the CPU flash kernel refuse fp64 or a boolean mask?

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
# "half precision only, no arbitrary mask" rules are limits of the CUDA flash kernel
# (*Going further* says where PyTorch writes what each CUDA backend accepts): eligibility
# is per device, per build, per version. Check it with the profiler rather than trusting a
# list.
#
# **Predict** (a guess, unless you have read their docstrings). How stable do the docstrings
# say SDPA, its GQA option, `sdpa_kernel` and FlexAttention are?

# %%
MATURITY = re.compile(r"This (?:function|class) is beta"  # "This function is beta"
                      r"|(?:`[\w.]+`|[A-Z][\w ()]*?) is an? (?:experimental|prototype) feature")  # "X is a ... feature"
for name, api in (("F.scaled_dot_product_attention", F.scaled_dot_product_attention),
                  ("sdpa_kernel", sdpa_kernel), ("flex_attention", flex_attention)):
    print(f"{name:<30} {MATURITY.findall(' '.join(api.__doc__.split()))}")

# %% [markdown]
# Output:
# ```text
# F.scaled_dot_product_attention ['This function is beta', 'Grouped Query Attention (GQA) is an experimental feature']
# sdpa_kernel                    ['This function is beta']
# flex_attention                 ['`torch.nn.attention.flex_attention` is a prototype feature']
# ```
#
# SDPA and `sdpa_kernel` are *beta*, GQA (`enable_gqa`) *experimental*, FlexAttention a
# *prototype*. None of these words promises backward compatibility (PyTorch's feature
# classification, which the `flex_attention` docstring links to): a signature or a
# behaviour may change from one release to the next. That is one more reason to pin the
# release you depend on, and to keep a check like part 07a's comparison with the formula
# among your own tests.
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

# %% [markdown]
# ## 3. Inside the kernels: bf16, and SDPA under autocast
#
# **Predict.** With bf16 inputs, does the math reference multiply and normalise in bf16, or
# in fp32? And the flash kernel, which works on blocks of keys: is its error against a
# float64 reference smaller or larger than the math backend's? (A guess: nothing so far
# shows what happens inside a kernel.)


# %%
class DtypeLog(TorchDispatchMode):
    """Lesson 02's dispatch mode, keeping (ATen op, dtype of its first result) for every op."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        self.ops.append((func.overloadpacket.__name__, first.dtype if isinstance(first, torch.Tensor) else None))
        return out


g = torch.Generator().manual_seed(0)  # its own stream: q, k and v independent of each other
qb, kb, vb = (torch.randn(1, 2, 64, 64, generator=g).bfloat16() for _ in range(3))  # (B, H, S, D)
with sdpa_kernel(SDPBackend.MATH), DtypeLog() as log:
    out_bf16 = F.scaled_dot_product_attention(qb, kb, vb)
steps = [f"{n}->{str(d).removeprefix('torch.')}" for n, d in log.ops if n in ("_to_copy", "bmm", "_safe_softmax")]
print(f"MATH on bf16: {steps}")
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    out_flash = F.scaled_dot_product_attention(qb, kb, vb)
ref64 = F.scaled_dot_product_attention(qb.double(), kb.double(), vb.double())  # (B, H, S, D)
bf16_err = {name: (out.double() - ref64).abs().mean().item()  # mean |error| against float64
            for name, out in (("MATH", out_bf16), ("FLASH", out_flash), ("formula in bf16", formula(qb, kb, vb)),
                              ("one rounding", ref64.bfloat16()))}  # the exact output, rounded once to bf16
print(f"output {out_bf16.dtype}; MATH error / one bf16 rounding's, within 1 %: "
      f"{abs(bf16_err['MATH'] / bf16_err['one rounding'] - 1) < 0.01}")
print(f"MATH closer to float64 than the formula in bf16: {bf16_err['MATH'] < bf16_err['formula in bf16']}")
print(f"FLASH / MATH error above 1.1: {bf16_err['FLASH'] > 1.1 * bf16_err['MATH']}")

# %% [markdown]
# Output:
# ```text
# MATH on bf16: ['_to_copy->float32', '_to_copy->float32', '_to_copy->float32', 'bmm->float32', '_safe_softmax->float32', '_to_copy->bfloat16', 'bmm->float32', '_to_copy->bfloat16']
# output torch.bfloat16; MATH error / one bf16 rounding's, within 1 %: True
# MATH closer to float64 than the formula in bf16: True
# FLASH / MATH error above 1.1: True
# ```
#
# The math backend first copies Q, K and V to fp32 (three `_to_copy`), computes the scores,
# the softmax and the product with V in fp32, and rounds only the output back to bf16 (the
# last `_to_copy`; the one in between is the bf16 copy of the probabilities it also returns,
# which the second `bmm` does not use). So its mean error against float64 is that of one
# bf16 rounding of the exact output, within 1 %, and smaller than that of the formula run in
# bf16 throughout. The price: fp32 copies of Q, K and V and fp32 scores, twice the bytes of
# bf16 ones. A dispatch mode cannot see inside the flash kernel, which is one op. Its error
# tells what it does: more than 1.1 times the math backend's, because the CPU flash kernel
# keeps the scores, the running maximum and sum and the output in fp32, but rounds each
# block's exponentials (the probabilities before their final division) to the input dtype,
# bf16 here, before multiplying them by V (read from
# `aten/src/ATen/native/cpu/FlashAttentionKernel.cpp`, in *Read the source*). "Fused kernels
# compute in fp32" is true of their accumulators, not of every intermediate. With q = k = v
# the gap nearly vanishes (each query's softmax then leans hard on its own key, so rounding
# the exponentials costs little): comparing kernels needs independent inputs.
#
# **Predict.** Lesson 05b ran a model under `torch.autocast("cpu", dtype=torch.bfloat16)`.
# Given float32 Q, K and V inside such a region, which dtype does SDPA return, and which
# kernel gets which inputs?

# %%
with torch.autocast("cpu", dtype=torch.bfloat16), DtypeLog() as autocast_log:
    out_autocast = F.scaled_dot_product_attention(x, x, x)  # x: float32, (B, H, S, D)
print(f"inputs {x.dtype}, output under bf16 autocast {out_autocast.dtype}")
autocast_steps = [f"{n}->{str(d).removeprefix('torch.')}" for n, d in autocast_log.ops]
print(f"dispatched: {autocast_steps}")

# %% [markdown]
# Output:
# ```text
# inputs torch.float32, output under bf16 autocast torch.bfloat16
# dispatched: ['_to_copy->bfloat16', '_to_copy->bfloat16', '_to_copy->bfloat16', '_scaled_dot_product_flash_attention_for_cpu->bfloat16']
# ```
#
# SDPA is on autocast's list of ops that run in the lower precision: autocast casts Q, K
# and V to bf16 (three `_to_copy`) and the CPU flash kernel runs on bf16 inputs, returning
# bf16. Inside an autocast region, attention therefore carries the flash kernel's bf16
# error of the previous cell, not fp32's. Where a model needs fp32 attention (long
# contexts, a sensitive loss), run that call with autocast switched off
# (`torch.autocast("cpu", enabled=False)`) and float32 inputs.

# %% [markdown]
# ## 4. FlexAttention: masks as functions, sparsity as blocks
#
# FlexAttention (`torch.nn.attention.flex_attention`) takes two small Python functions:
#
# - a `mask_mod(b, h, q_idx, kv_idx) -> bool` that says which pairs are kept;
# - a `score_mod(score, b, h, q_idx, kv_idx) -> score` that changes a kept score.
#
# `create_block_mask` evaluates the `mask_mod` on every (query, key) pair, then records for
# each 128 × 128 block whether it is empty (skipped), full (no mask needed) or partial.
# `torch.compile` then writes one fused kernel with the functions inlined.
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
# ### Soft-capping and a prefix LM, uncompiled
#
# Two patterns from recent models. *Soft-capping* (Gemma 2) squashes each score into
# (-cap, cap) with `cap · tanh(score / cap)`: a `score_mod`. A *prefix LM* lets every token
# see a prefix of P tokens (an instruction, an image's patches) in both directions, and
# the rest causally: a `mask_mod`, `kv_idx < P or q_idx >= kv_idx`. Neither is an SDPA
# option, but both are easy to write densely: cap the scaled scores, mask, softmax.
#
# **Predict.** Called without `torch.compile`, does `flex_attention` run at all? If it
# does, how close is it to the dense formula?


# %%
def soft_cap(cap):
    """A score_mod squashing every score into (-cap, cap)."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return score_mod


def prefix_lm(prefix):
    """A mask_mod: every query sees the first `prefix` keys, and the other keys causally."""
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx < prefix) | (q_idx >= kv_idx)
    return mask_mod


S_CAP, PREFIX, CAP = 128, 32, 20.0
cap_gen = torch.Generator().manual_seed(4)  # its own stream: the cells below keep their numbers
qp, kp, vp = (3 * torch.randn(1, 2, S_CAP, 16, generator=cap_gen) for _ in range(3))  # (B, H, S, D)
prefix_keep = create_mask(prefix_lm(PREFIX), None, None, S_CAP, S_CAP, device="cpu")[0, 0]  # (S, S)
prefix_block = create_block_mask(prefix_lm(PREFIX), None, None, S_CAP, S_CAP, device="cpu")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out_capped = flex_attention(qp, kp, vp, score_mod=soft_cap(CAP), block_mask=prefix_block)  # (B, H, S, D)
for w in caught:
    print(f"{w.category.__name__}: {str(w.message).splitlines()[0]}")
raw = qp @ kp.transpose(-2, -1) / math.sqrt(16)  # (B, H, S, S): the scaled scores
capped = CAP * torch.tanh(raw / CAP)
dense_capped = torch.softmax(capped.masked_fill(~prefix_keep, float("-inf")), dim=-1) @ vp
print(f"keys kept by queries 0, 31, 32, 127: {prefix_keep.sum(-1)[[0, 31, 32, 127]].tolist()}")
print(f"largest |score| above 40 before the cap: {raw.abs().max().item() > 40}, "
      f"below 20 after: {capped.abs().max().item() < CAP}")
print(f"uncompiled flex vs the dense formula, max error below 1e-5: "
      f"{(out_capped - dense_capped).abs().max().item() < 1e-5}")

# %% [markdown]
# Output:
# ```text
# UserWarning: flex_attention called without torch.compile() - this will use an unfused implementation that materializes the full scores matrix instead of generating a fused kernel.
# keys kept by queries 0, 31, 32, 127: [32, 32, 33, 128]
# largest |score| above 40 before the cap: True, below 20 after: True
# uncompiled flex vs the dense formula, max error below 1e-5: True
# ```
#
# It runs, and warns once per process (the line above, printed by the cell that caught
# it): without `torch.compile`, FlexAttention builds the full score matrix and computes
# the formula, the memory the fused kernel exists to avoid. Inside, `flex_attention`
# traces the call with Dynamo and runs it with the `eager` backend, no code generation;
# the computation is `math_attention` in `torch/_higher_order_ops/flex_attention.py`
# (read from there and from `torch/nn/attention/flex_attention.py`): the scores times the
# scale, your `score_mod` applied to every cell, the mask, a softmax, the product with V.
# So the uncompiled call is the reference for your functions, and a way to debug them on
# small inputs; the compiled kernel of section 5 is the one to train with. The prefix
# queries 0 to 31 each keep the 32 prefix keys, query 32 keeps 33 keys, the last all 128;
# the cap turned scores above 40 into scores below 20, and flex agrees with the dense
# formula to fp32 rounding.
#
# **Predict** (a guess: nothing so far says what FlexAttention does with gradients on the
# CPU). Can we train through FlexAttention on the CPU?

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
# anything. Forward (inference) works, compiled or not; backward needs a GPU (section 6).
#
# ## 5. One compiled kernel, checked against SDPA
#
# `torch.compile(flex_attention)` inlines the `mask_mod` and `score_mod` into the kernel it
# generates, so four different mask functions mean four kernels and four compiles. The
# masks above are all *intervals*: query i keeps the keys from `first[i]` to `last[i]`.
# Written that way, one `mask_mod` covers them all and only the data changes: one compile.
# We add ALiBi as the `score_mod`: head h adds `slope[h] · (kv − q)` to each score, a
# penalty that grows with distance.
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
    print(f"largest error below 1e-5 (fp32): {max(errors.values()) < 1e-5}")
    print(f"graphs compiled: {graph_count() - graphs_before}")
n_graphs = graph_count() - graphs_before

# %% [markdown]
# Output:
# ```text
# causal             compile + run «time» s, below 1e-5: True
# sliding window     run «time» ms, below 1e-5: True
# document           run «time» ms, below 1e-5: True
# document + causal  run «time» ms, below 1e-5: True
# largest error below 1e-5 (fp32): True
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
# in different orders, and those orders depend on the CPU's vector width, so only their
# bound is printed. Had we passed the four mask functions of section 4 instead, Dynamo
# would have compiled a graph for each (lesson 08a shows how to count graphs with a backend
# that generates no code). Timings depend on your machine.
#
# The second block is what this cell prints where PyTorch refuses to compile FlexAttention
# for the CPU (no AVX2, or macOS: *Going further* has the rule). The cell does not guess: it
# tries, and catches PyTorch's own `InductorError`, raised while lowering, before any C++ is
# compiled; any other error is re-raised. The mask functions, block masks and uncompiled
# calls of section 4 need no compiler and run everywhere.
#
# The data travels in closures (`interval_mask(first, last)`, `alibi(slopes)`) rather than
# through module globals: Dynamo guards on what a compiled function reads, and closure
# cells are the robust way to hand it tensors.

# %% [markdown]
# ## 6. On a GPU
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
# - Fused kernels tile K and V with an online softmax (a running max, sum and output,
#   rescaled by exp(m_old − m_new) when the max grows: exact, not an approximation), so a
#   tile step's working set (about 225 KiB per head) does not grow with S. The CPU flash
#   kernel saves Q, K, V, the output and one log-sum-exp per row for backward, no (S, S)
#   tensor, and recomputes the scores there.
# - On this CPU build: MATH and a CPU flash kernel (the default; fp32/fp64/bf16/fp16, masks
#   allowed); EFFICIENT/CUDNN fail with "No viable backend". `set_priority=True` reorders
#   the global priority list for a block; the CPU chooser ignores it (flash, then math).
#   The profiler shows SDPA's composite on top and the math backend's `bmm` and softmax
#   beneath, while the flash kernel's work stays inside one op.
# - SDPA and `sdpa_kernel` are beta, GQA experimental, FlexAttention a prototype.
#   `torch.backends.cuda.sdp_kernel` still works in 2.13.0 but is deprecated.
# - In bf16 the math backend computes in fp32 and rounds once; the CPU flash kernel keeps
#   fp32 accumulators but rounds each block's probabilities to bf16 before P·V: its bf16
#   error is above the math backend's. Under CPU bf16 autocast SDPA runs, and returns, bf16.
# - FlexAttention: `mask_mod` + `create_block_mask` (block sparsity) + `score_mod`.
#   Uncompiled, it warns and computes the dense formula (a reference for soft-capping, a
#   prefix LM or any other function); compiled, one kernel per pair of functions, so put
#   the varying data in tensors to compile once. No backward on CPU in 2.13.0, and no
#   compiled CPU kernel without AVX2 or on macOS (the lesson tries and reports the refusal).

# %% [markdown]
# ## Going further
#
# ### Fused is not always faster
#
# The flash kernel is the CPU's default in every dtype. Is it also the faster of the two
# CPU backends in every dtype? Time both on one shape, (1, 2, 128, 64), in fp32, bf16 and
# fp16, alternating them so that a load on the machine slows both alike.


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
# A ratio above 1 means the flash kernel is faster. Timings depend on your machine, and so
# does the last line: it is PyTorch's own check
# (`torch.ops.mkldnn._is_mkldnn_fp16_supported()`), True on x86 CPUs that have the fp16
# instructions oneDNN needs (recent Xeons with AVX512-FP16, for example). Where it prints
# False on an x86 CPU, fp16 reverses the order: the math backend is faster, at the very
# shape where flash wins in fp32 (there fp16's ratio stays below 0.85, and fp32's above 1
# and at least 1.5 times fp16's, even on a loaded machine), yet the default picks the flash
# kernel for fp16 too. Where it prints True on an x86 CPU, fp16 stays on the flash
# kernel's side (its ratio above 1, as in fp32), though a small fp16 matmul can still be
# slower than fp32's. (The bf16 row is shown for comparison only.) Why does fp16 reverse
# the order on the other CPUs? Read the math backend's op log in fp16, and time one fp16
# matrix product against the same in fp32.


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
# The math backend casts fp16 to fp32 first, as it does bf16 (three `_to_copy` to float32),
# and both its products run in fp32, with the fp32 BLAS. The flash kernel multiplies its
# fp16 tiles as they are (accumulating in fp32), and without fp16 matrix instructions
# PyTorch's CPU matrix product for fp16 has no fast path: the last line is a plain fp16
# matmul's time over fp32's (at least 3 on x86 CPUs where the check above printed False, and
# still above 1 where it printed True). A fused kernel saves memory traffic; it cannot make
# up for slow arithmetic. So "fused is faster" is a rule of thumb: with your shapes and
# dtype, time the `sdpa_kernel` choices (alternating them, taking medians) before trusting
# the default.
#
# ### Which inputs each CUDA backend accepts
#
# The rules are C++ filters in `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`,
# which neither the CPU wheel nor the CUDA wheel ships as source; the installed Python
# gives you only `torch.backends.cuda.can_use_flash_attention(params, debug=True)` (and
# `can_use_efficient_attention`, `can_use_cudnn_attention`), which on a CUDA build warn
# the reason a backend declines, and SDPA's docstring says only that "each of the fused
# kernels has specific input limitations" and that the C++ math implementation supports
# float64. What PyTorch's main branch says in that file (read there, not verified against
# 2.13.0, and unverified on a GPU): the flash kernel takes fp16 and bf16 (fp16 only before
# sm80), head sizes equal for Q, K and V and at most 256, no `attn_mask`, no `is_causal`
# with L ≠ S, on sm80 to sm121; memory-efficient attention also takes fp32, with head
# sizes a multiple of the GEMM alignment (8 for half types on tensor cores, 4 for fp32);
# cuDNN takes fp16 and bf16, head sizes a multiple of 8 and at most 128 (256 on sm90 and
# sm100 with a recent cuDNN), and is skipped under deterministic algorithms; on sm90 and
# sm100 with cuDNN newer than 9.15, the first choice moves cuDNN to the front of the
# priority list of section 2. The optional
# FlashAttention-3 and -4 implementations have Python checks you can read in the wheel,
# `torch/nn/attention/_fa3.py` (fp16, bf16 and float8_e4m3fn, compute capability 9.0) and
# `_fa4.py` (fp16 and bf16, 9.0 or 10.0).
#
# ### Where PyTorch refuses compiled FlexAttention on the CPU
#
# The rule in 2.13.0 (`check_cpu_supported` in `torch/_inductor/kernel/flex/flex_cpu.py`)
# asks for AVX2 (and `ATEN_CPU_CAPABILITY` not set to `default`) and excludes macOS: Apple
# silicon, Intel Macs, Arm Linux and x86 CPUs without AVX2 all get the second block of
# section 5's cell, and there `FLEX_REFUSED` is True.

# %% [markdown]
# ## References
#
# - [`torch.nn.attention.sdpa_kernel`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.attention.sdpa_kernel.html)
#   and [`torch.nn.attention.SDPBackend`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.attention.SDPBackend.html):
#   the backends, `set_priority` (section 2).
# - [`torch.nn.functional.scaled_dot_product_attention`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.functional.scaled_dot_product_attention.html):
#   the three implementations, their maturity note, the math backend's fp32 intermediates.
# - [`torch.nn.attention.flex_attention`](https://docs.pytorch.org/docs/2.13/nn.attention.flex_attention.html): `flex_attention`,
#   `create_block_mask`, `create_mask`, `and_masks` and `BlockMask` (sections 4 and 5).
# - [`torch.profiler`](https://docs.pytorch.org/docs/2.13/profiler.html) and [`torch.amp`](https://docs.pytorch.org/docs/2.13/amp.html):
#   lesson 06a's profiler and lesson 05b's autocast, revisited in sections 2 and 3.
# - [`torch.compile`](https://docs.pytorch.org/docs/2.13/generated/torch.compile.html): the compile of section 5.
# - Milakov and Gimelshein, [Online normalizer calculation for softmax](https://arxiv.org/abs/1805.02867) (2018):
#   the online softmax of section 1.
# - Dao et al., [FlashAttention](https://arxiv.org/abs/2205.14135) (2022), and Dao,
#   [FlashAttention-2](https://arxiv.org/abs/2307.08691) (2023): tiling attention with the online softmax,
#   and recomputation in backward.
# - Rabe and Staats, [Self-attention Does Not Need O(n²) Memory](https://arxiv.org/abs/2112.05682) (2021):
#   the idea behind memory-efficient attention.
# - Dong et al., [Flex Attention: A Programming Model for Generating Optimized Attention Kernels](https://arxiv.org/abs/2412.05496)
#   (2024): `mask_mod`, `score_mod` and block sparsity.
# - Press et al., [Train Short, Test Long: Attention with Linear Biases](https://arxiv.org/abs/2108.12409) (2021):
#   ALiBi (section 5); Gemma Team, [Gemma 2](https://arxiv.org/abs/2408.00118) (2024): soft-capping;
#   Raffel et al., [T5](https://arxiv.org/abs/1910.10683) (2019): the prefix LM (section 4).

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each path is relative to the folder that holds your installed
# `torch` (your site-packages), and the line numbers are those of your installation; the
# C++ files the wheel does not ship are links at the release's tag. The stops follow the
# lesson: how the CPU flash kernel walks the keys and what it keeps for backward, how the
# backend switch and the CPU chooser work, FlexAttention's block masks and its uncompiled
# reference.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("pytorch:aten/src/ATen/native/cpu/FlashAttentionKernel.cpp", "void cpu_flash_attention(",
     "The online softmax of section 1: for each block of queries, a loop over blocks of keys "
     "keeps `qk_max` and `qk_sum` per row and rescales the partial output `dst` by "
     "`exp(old max - new max)`. The exponentials are written to a buffer of the input type "
     "before the product with V (section 3's bf16 rounding), `max + log(sum)` is stored as "
     "the `logsumexp` that backward uses, and a row whose sum is 0 (every key masked) is "
     "divided by 1, so it outputs 0."),
    ("torchgen/packaged/autograd/derivatives.yaml",
     "name: _scaled_dot_product_flash_attention_for_cpu(",
     "The CPU flash kernel's autograd entry: of `(output, logsumexp)` only the output is "
     "differentiable, and the backward op gets `query, key, value, output, logsumexp` and "
     "`attn_mask`: the tensors section 1 found saved, none of size S x S. The math backend "
     "has no entry: it is composite, so autograd records the ops it runs, probabilities "
     "included."),
    ("torch/nn/attention/__init__.py", "def sdpa_kernel(",
     "`_sdpa_kernel`, just above, switches one flag per backend (`torch._C._set_sdp_use_flash`, "
     "`..._math`, ...) on or off by whether it is in your list and, with `set_priority=True`, "
     "writes your order followed by the others with `torch._C._set_sdp_priority_order`; the "
     "`finally` restores both. It only sets which backends are candidates and in which order: "
     "it cannot make a kernel accept inputs it refuses. With no candidate left, section 2's "
     "\"No viable backend\" follows."),
    ("pytorch:aten/src/ATen/native/transformers/sdp_utils_cpp.cpp", "priority_order_cpp(",
     "The CPU chooser: `priority_order_cpp` returns a fixed `{flash_attention, math}`, whatever "
     "the global priority (section 2's `set_priority` changes nothing on the CPU), and "
     "`use_flash_attention_cpp` lists the CPU flash kernel's filters: no dropout, equal head "
     "sizes, dtypes float, double, bfloat16 and half."),
    ("torch/nn/attention/flex_attention.py", "def create_block_mask(",
     "It evaluates your `mask_mod` into a dense mask with `create_mask`, then "
     "`_convert_mask_to_block_mask` (above) sums each 128 x 128 block: all kept is a full "
     "block, none kept is skipped, anything between is a partial block, masked inside. "
     "`BlockMask.sparsity` is the skipped share (section 4). Further down, `flex_attention` "
     "raises section 4's error for CPU inputs that require grad and, when not compiled, "
     "warns and wraps the call in `torch.compile` with the `eager` backend."),
    ("torch/_higher_order_ops/flex_attention.py", "def math_attention(",
     "What an uncompiled call computes (section 4): `_math_attention_inner` scales the scores "
     "and applies your `score_mod` through `torch.vmap` over batch, head, query and key, then "
     "the mask; a `_safe_softmax` and the product with V follow. The full (B, H, L, S) score "
     "tensor exists here, which is why the warning says it materialises the scores."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# https://github.com/pytorch/pytorch/blob/v«version»/aten/src/ATen/native/cpu/FlashAttentionKernel.cpp
#     search for `void cpu_flash_attention(`: The online softmax of section 1: for each
#     block of queries, a loop over blocks of keys keeps `qk_max` and `qk_sum` per row and
#     rescales the partial output `dst` by `exp(old max - new max)`. The exponentials are
#     written to a buffer of the input type before the product with V (section 3's bf16
#     rounding), `max + log(sum)` is stored as the `logsumexp` that backward uses, and a
#     row whose sum is 0 (every key masked) is divided by 1, so it outputs 0.
# torchgen/packaged/autograd/derivatives.yaml:«line»  `name: _scaled_dot_product_flash_attention_for_cpu(`
#     The CPU flash kernel's autograd entry: of `(output, logsumexp)` only the output is
#     differentiable, and the backward op gets `query, key, value, output, logsumexp` and
#     `attn_mask`: the tensors section 1 found saved, none of size S x S. The math backend
#     has no entry: it is composite, so autograd records the ops it runs, probabilities
#     included.
# torch/nn/attention/__init__.py:«line»  `def sdpa_kernel(`
#     `_sdpa_kernel`, just above, switches one flag per backend
#     (`torch._C._set_sdp_use_flash`, `..._math`, ...) on or off by whether it is in your
#     list and, with `set_priority=True`, writes your order followed by the others with
#     `torch._C._set_sdp_priority_order`; the `finally` restores both. It only sets which
#     backends are candidates and in which order: it cannot make a kernel accept inputs it
#     refuses. With no candidate left, section 2's "No viable backend" follows.
# https://github.com/pytorch/pytorch/blob/v«version»/aten/src/ATen/native/transformers/sdp_utils_cpp.cpp
#     search for `priority_order_cpp(`: The CPU chooser: `priority_order_cpp` returns a
#     fixed `{flash_attention, math}`, whatever the global priority (section 2's
#     `set_priority` changes nothing on the CPU), and `use_flash_attention_cpp` lists the
#     CPU flash kernel's filters: no dropout, equal head sizes, dtypes float, double,
#     bfloat16 and half.
# torch/nn/attention/flex_attention.py:«line»  `def create_block_mask(`
#     It evaluates your `mask_mod` into a dense mask with `create_mask`, then
#     `_convert_mask_to_block_mask` (above) sums each 128 x 128 block: all kept is a full
#     block, none kept is skipped, anything between is a partial block, masked inside.
#     `BlockMask.sparsity` is the skipped share (section 4). Further down,
#     `flex_attention` raises section 4's error for CPU inputs that require grad and, when
#     not compiled, warns and wraps the call in `torch.compile` with the `eager` backend.
# torch/_higher_order_ops/flex_attention.py:«line»  `def math_attention(`
#     What an uncompiled call computes (section 4): `_math_attention_inner` scales the
#     scores and applies your `score_mod` through `torch.vmap` over batch, head, query and
#     key, then the mask; a `_safe_softmax` and the product with V follow. The full (B, H,
#     L, S) score tensor exists here, which is why the warning says it materialises the
#     scores.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Predict.** A kernel reads the scores `[1, 2, 3, 0]` of one query in two chunks of two
#    keys, with the online softmax. What is the running maximum after each chunk, by what
#    factor does the second chunk rescale the running sum and output, and is the result an
#    approximation of the softmax?
#
#    <details><summary>Answer</summary>
#
#    The maximum is 2 after the first chunk and 3 after the second; the second chunk
#    multiplies the running sum and output by `exp(2 - 3) = 0.3679` before adding its own
#    terms. `acc / total` is 26.2089, equal to `softmax(scores) @ values` within 1e-12: the
#    softmax exactly, up to float rounding, with never more than one chunk of scores held
#    (*§ The online softmax, on two chunks of keys*).
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
#    of size S × S, so its backward must recompute the scores
#    (*§ What a fused kernel keeps for backward*). The S × S part grows as S²: at S = 8192
#    the fp32 scores of two heads alone are 512 MiB per layer
#    (*07a § The formula, and the size of the score matrix*).
#
#    </details>
#
# 3. **Predict.** On the CPU you wrap a call in `sdpa_kernel([SDPBackend.MATH,
#    SDPBackend.FLASH_ATTENTION], set_priority=True)`, to run the math reference. Which
#    kernel runs, and how do you get the math backend?
#
#    <details><summary>Answer</summary>
#
#    The CPU flash kernel: `set_priority=True` puts MATH first in the global priority list
#    (printed inside the block, and restored after it), but the CPU chooser tries flash,
#    then math, whatever that list says, and both are candidates. Leave the flash kernel
#    out: `sdpa_kernel(SDPBackend.MATH)` (*§ The order of the list: `set_priority=True`*).
#
#    </details>
#
# 4. **Spot the bug.** "Fused attention kernels compute in fp32 inside, so in bf16 the CPU
#    flash kernel is at least as accurate as the math backend." What does the lesson's
#    bf16 comparison show, and why?
#
#    <details><summary>Answer</summary>
#
#    The flash kernel's mean error against float64 is above the math backend's
#    (`FLASH / MATH error above 1.1: True`). The math backend copies Q, K and V to fp32 and
#    rounds only its output to bf16; the CPU flash kernel keeps fp32 accumulators but rounds
#    each block's exponentials to bf16 before multiplying them by V. Under CPU bf16
#    autocast, SDPA gets bf16 inputs and runs that kernel
#    (*§ Inside the kernels: bf16, and SDPA under autocast*).
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
# 1. `document_causal_mask(doc_lens)`: a `mask_mod` for packed documents, causal inside
#    each document (section 4's `and_masks(document, causal)`, for any document lengths).
# 2. `tiled_attention(q, k, v, block)`: attention with the online softmax of section 1,
#    never holding more than `block` keys' scores at a time.
#
# Check them with `make exercises N=07b`; `solutions.py` has one way to write them.

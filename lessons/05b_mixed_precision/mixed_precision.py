# %% [markdown]
# # 05b · Mixed-precision training: autocast, the step and its bytes
#
# Lesson 05a showed what the 16-bit formats can and cannot hold, why the weights stay in
# float32 and how loss scaling rescues small float16 gradients. This part puts them to work
# in a training step: `torch.autocast` picks a dtype for every op, the step calls the
# scaler, the clipping and the optimizer in one correct order, and the step keeps a
# number of bytes per parameter that you can count. It ends with `torch.optim.AdamW`
# written out in NumPy.
#
# **What you will learn**
#
# - which ops CPU autocast runs in bfloat16, where it differs from CUDA autocast, why to
#   compute the loss on float32 logits, and what a 16-bit matmul costs on your CPU;
# - what `torch.set_float32_matmul_precision` and the per-backend `fp32_precision`
#   settings ask for (TF32 and bfloat16 inside float32 matmuls), and why not to mix them;
# - a whole mixed-precision training step in order (unscale before clipping), why
#   bfloat16 needs no scaler, and what a float16 forward overflow does to a scaler;
# - the `torch.amp` spelling that replaces `torch.cuda.amp`, and which GPUs suit bfloat16;
# - the bytes per parameter a mixed-precision AdamW step keeps, measured;
# - that `torch.optim.AdamW` is a few lines of NumPy, matched to rounding level.
#
# **Prerequisites:** lesson 05a (the formats' ranges and steps, float32 master weights,
# loss scaling and `GradScaler`'s skip/halve/double rule), lesson 02 (dispatch keys) and
# lesson 03b (saved-tensor hooks); a training loop with an optimizer and a scheduler.
#
# **How to run:** `python lessons/05b_mixed_precision/mixed_precision.py` or
# `make lesson N=05b` from the repository root, or open `mixed_precision.ipynb`.
# Everything runs on the CPU in a few seconds. Every 16-bit matmul here is tiny on
# purpose: on a CPU without 16-bit matrix instructions it can be ten to a hundred times
# slower than float32 (section 1 measures yours). Section 4 reads `data/four_classes.csv`
# from the repository's top (or a copy next to the script). Each printing cell is followed
# by an *Output* block: what it printed with the pinned PyTorch (2.13.0); a part marked
# `«time»` or `«ratio»` depends on your machine. Run outside the course's venv, this lesson
# may also print PyTorch's own diagnostic lines to stderr: `USDT: ... profiler_start` and
# `profiler_stop` around each profiler run and, on a CUDA build without a GPU,
# `gpuGetDeviceCount failed`. They are harmless, and the course's venv (`.venv`, made by
# any `make lesson`) turns them off.

# %%
import csv
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DEVICE = torch.device(os.environ.get("COURSE_DEVICE", "cpu"))
FORMATS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}  # as in 05a

# %% [markdown]
# ## 1. Autocast on the CPU: which ops run in bfloat16
#
# Inside `torch.autocast(device_type, dtype)`, each op is looked up in per-device lists:
# ops that gain from low precision (matmul, linear, convolutions) cast their float32
# inputs down, ops that need range or precision cast up to float32, and the rest run in
# whatever dtype their inputs have.
#
# **Predict.** Under CPU autocast with bfloat16, what dtype comes out of a linear layer
# fed float32? Of a softmax or a layer norm of that output? Of the cross-entropy loss?

# %%
x = torch.randn(8, 16)  # (B, D_in) float32, on the CPU: this section is CPU autocast
w = torch.randn(4, 16)  # (C, D_in) float32
labels = torch.randint(0, 4, (8,))  # (B,)
with torch.autocast("cpu", dtype=torch.bfloat16):
    logits = F.linear(x, w)  # (B, C)
    dtypes = {
        "linear(x fp32)": logits.dtype,
        "x @ w.T": (x @ w.T).dtype,
        "relu(logits)": F.relu(logits).dtype,
        "softmax(logits)": logits.softmax(-1).dtype,
        "layer_norm(logits)": F.layer_norm(logits, (4,)).dtype,
        "softmax(x fp32)": x.softmax(-1).dtype,
        "cross_entropy(logits)": F.cross_entropy(logits, labels).dtype,
    }
for op, dtype in dtypes.items():
    print(f"{op:22} -> {dtype}")

# %% [markdown]
# Output:
# ```text
# linear(x fp32)         -> torch.bfloat16
# x @ w.T                -> torch.bfloat16
# relu(logits)           -> torch.bfloat16
# softmax(logits)        -> torch.bfloat16
# layer_norm(logits)     -> torch.bfloat16
# softmax(x fp32)        -> torch.float32
# cross_entropy(logits)  -> torch.float32
# ```
#
# The matmuls cast their float32 inputs to bfloat16. softmax and layer_norm do *not*
# change dtype on the CPU: given bfloat16 logits they compute in bfloat16, given float32
# they stay float32. The cross-entropy loss comes out float32.
#
# Autocast is a dispatch key (lesson 02): an op is cast only if it has a kernel registered
# under `AutocastCPU` or `AutocastCUDA`, and that kernel applies the op's list (lower
# precision, or float32). The CUDA registrations are compiled into every build of PyTorch,
# so the CPU can tell us which ops each device's autocast handles, through
# `torch._C._dispatch_has_kernel_for_dispatch_key` (private, like lesson 02's
# `_dispatch_dump`).
#
# **Predict.** A guess: on a GPU, cross-entropy under autocast also comes out float32. Is
# that because `cross_entropy_loss` is on CUDA's float32 list too?


# %%
def autocast_rule(op, key):
    """Whether autocast has a kernel for `op` under dispatch key `key` (a rule to apply)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, key)


AUTOCAST_OPS = ["aten::mm", "aten::cross_entropy_loss", "aten::log_softmax.int",
                "aten::nll_loss", "aten::softmax.int", "aten::layer_norm"]
print(f"{'op':26} {'AutocastCPU':11} AutocastCUDA")
for op in AUTOCAST_OPS:
    print(f"{op:26} {autocast_rule(op, 'AutocastCPU')!s:11} {autocast_rule(op, 'AutocastCUDA')}")
composite = autocast_rule("aten::cross_entropy_loss", "CompositeImplicitAutograd")
print(f"cross_entropy_loss decomposes into other ops (CompositeImplicitAutograd): {composite}")

# %% [markdown]
# Output:
# ```text
# op                         AutocastCPU AutocastCUDA
# aten::mm                   True        True
# aten::cross_entropy_loss   True        False
# aten::log_softmax.int      False       True
# aten::nll_loss             True        True
# aten::softmax.int          False       True
# aten::layer_norm           False       True
# cross_entropy_loss decomposes into other ops (CompositeImplicitAutograd): True
# ```
#
# No. On the CPU, `cross_entropy_loss` itself is on the float32 list, and autocast casts
# its input up before it runs. CUDA autocast has no rule for it at all: the op falls
# through and decomposes into `log_softmax` and `nll_loss`, and CUDA's autocast has a rule
# for each. CUDA's rules also cover `softmax` and `layer_norm`, which the CPU's do not: on
# a GPU those two calls return float32 (unverified on a GPU).
#
# The rules differ in kind. `nll_loss` is on the plain float32 list: its input is cast up.
# `softmax` and `log_softmax` are on a list whose rule only fills in their `dtype`
# argument with float32 when the call left it unset; a `dtype` the caller passed is kept
# (read from `torch/include/ATen/autocast_mode.h`, `enum class CastPolicy`; unverified on a
# GPU). The decomposition passes `log_softmax` the logits' own dtype (*Going further* shows
# it with the profiler), so CUDA's rule for `log_softmax` leaves it in bfloat16, and it is
# `nll_loss`, on the plain float32 list, that casts the bfloat16 log-probabilities up: the
# loss is float32, summed from log-probabilities already rounded to bfloat16 (read from the
# same header; unverified on a GPU).
#
# So the same line of Python gets its float32 loss from different ops on each device: do
# not rely on either device's lists, compute the loss on float32 logits yourself.
#
# **Predict.** Outside autocast, what does cross-entropy on the bfloat16 logits give,
# compared with the same logits cast to float32 first?

# %%
loss_bf16 = F.cross_entropy(logits, labels)  # no autocast here: computed in bfloat16
loss_fp32 = F.cross_entropy(logits.float(), labels)  # the same logits, cast up first
print(f"loss on bf16 logits {loss_bf16.item():.4f} ({loss_bf16.dtype})")
print(f"loss on fp32 logits {loss_fp32.item():.4f} ({loss_fp32.dtype})")

# %% [markdown]
# Output:
# ```text
# loss on bf16 logits 3.5625 (torch.bfloat16)
# loss on fp32 logits 3.5418 (torch.float32)
# ```
#
# Same logits, two answers 0.02 apart. The bfloat16 loss is a bfloat16 number, and near
# 3.5 those are 1/64 = 0.016 apart, but that alone would cost at most half a step.
#
# **Predict.** Where does the rest come from? Round the float32 loss to bfloat16 once;
# round the exact log-probabilities to bfloat16 and let `nll_loss` average them; average
# the same rounded log-probabilities in float32.

# %%
nearest = loss_fp32.to(torch.bfloat16)  # the float32 loss, rounded once
logp = F.log_softmax(logits.float(), dim=-1).to(torch.bfloat16)  # (B, C) rounded log-probs
picked = -logp.float()[torch.arange(len(labels)), labels]  # (B,) the terms of the loss
print(f"float32 loss rounded to bfloat16 once:           {nearest.item():.4f}")
print(f"nll_loss of the rounded log-probs (in bfloat16): {F.nll_loss(logp, labels).item():.4f}")
print(f"the same rounded log-probs averaged in float32:  {picked.mean().item():.4f}")
nll_sum = F.nll_loss(logp, labels, reduction="sum")  # the sum alone, in bfloat16
print(f"summed, not averaged: nll_loss {nll_sum.item():g}, float32 {picked.sum().item():.3f}, "
      f"rounded once {picked.sum().to(torch.bfloat16).item():g}")

# %% [markdown]
# Output:
# ```text
# float32 loss rounded to bfloat16 once:           3.5469
# nll_loss of the rounded log-probs (in bfloat16): 3.5625
# the same rounded log-probs averaged in float32:  3.5437
# summed, not averaged: nll_loss 28.5, float32 28.349, rounded once 28.375
# ```
#
# Rounding the answer once gives 3.5469, 0.005 off; rounding each log-probability costs
# about as little (3.5437, averaged in float32). `nll_loss` on bfloat16 input lands a whole
# bfloat16 step further, on the loss above: no single rounding of a float32 result gives
# that. Its running sums are bfloat16 numbers too, rounded to 8 bits at every addition
# (read from `pytorch:aten/src/ATen/native/LossNLL.cpp`), as in lesson 05a's stalled sums:
# the sum alone is 28.5 in bfloat16, a step of 0.125 above 28.375, the float32 sum rounded
# once. `logits.float()` costs one small cast and makes the loss, and the start of the
# backward pass, float32 on every device.
#
# ### What a 16-bit matmul costs on your CPU
#
# Autocast chose bfloat16 for the matmuls because on most accelerators 16-bit products
# are several times faster than float32 ones. On a CPU that depends on its instruction set.
#
# **Predict.** Is a 128×128 matmul faster in bfloat16 than in float32 on your CPU? In
# float16?


# %%
def best_time(fn, repeats=5, calls=3):
    """Seconds per call of fn: the fastest of `repeats` timings of `calls` calls."""
    fn()  # warm-up: the first call picks (and may build) the kernel
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


N_MM = 128  # small on purpose: where a format is slow, it is ten to a hundred times slower
a32, b32 = torch.randn(N_MM, N_MM), torch.randn(N_MM, N_MM)  # (n, n) float32
mm_time, mm_out = {}, {}
for name, dtype in FORMATS.items():
    a16, b16 = a32.to(dtype), b32.to(dtype)  # converted outside the clock
    mm_time[name] = best_time(lambda: a16 @ b16)
    mm_out[name] = a16 @ b16  # (n, n): the product each format computed
print(f"{N_MM}x{N_MM} matmul, fastest of 5: float32 {mm_time['float32'] * 1e6:.0f} us")
a_bf16, b_bf16 = a32.to(torch.bfloat16), b32.to(torch.bfloat16)
mm_time["bf16 via fp32"] = best_time(lambda: a_bf16.float() @ b_bf16.float())
for name in ("bfloat16", "float16", "bf16 via fp32"):
    print(f"{name:13} takes {mm_time[name] / mm_time['float32']:.2f} x the float32 time")

# %% [markdown]
# Output:
# ```text
# 128x128 matmul, fastest of 5: float32 «time» us
# bfloat16      takes «ratio» x the float32 time
# float16       takes «ratio» x the float32 time
# bf16 via fp32 takes «ratio» x the float32 time
# ```
#
# The ratios are your CPU's (times vary a little from run to run; the ratios' order of
# magnitude does not). Where the CPU multiplies bfloat16 in hardware (AVX-512 BF16 or AMX
# instructions, which oneDNN, PyTorch's CPU library for such kernels, uses), bfloat16
# takes up to about 3 times float32's time at this size; without them, ten to a hundred
# times or more, and converting both inputs to float32 first (the last line) costs little
# more than float32 itself. float16 is slower still on most CPUs. *Going further* explains
# the bands and the CPU flags behind them. On GPUs the 16-bit formats are the fast ones
# (unverified on a GPU).

# %% [markdown]
# ### Float32 matmuls with fewer bits inside
#
# Autocast changes the dtype of a matmul's inputs. A separate setting lets a float32
# matmul, float32 in and float32 out, compute inside with fewer mantissa bits.
# `torch.set_float32_matmul_precision` takes `"highest"` (the default: float32 all the
# way), `"high"` (on NVIDIA GPUs from Ampere on, TF32: float32's range with float16's 10
# mantissa bits, on the tensor cores) and `"medium"` (bfloat16 inside). Newer settings name
# each backend and op on their own: `torch.backends.cuda.matmul.fp32_precision` for cuBLAS
# matmuls, `torch.backends.cudnn.conv.fp32_precision` for cuDNN convolutions and
# `torch.backends.mkldnn.matmul.fp32_precision` for oneDNN, PyTorch's CPU library.
#
# **Predict.** A guess: are the two linked? Set the old one to each value and print the
# new ones; then set a new one alone and ask the old one what it is.


# %%
BACKENDS = {"cuda.matmul": torch.backends.cuda.matmul, "mkldnn.matmul": torch.backends.mkldnn.matmul,
            "cudnn.conv": torch.backends.cudnn.conv}


def fp32_settings():
    """(the old setting, then each backend's fp32_precision)."""
    return (torch.get_float32_matmul_precision(), *(b.fp32_precision for b in BACKENDS.values()))


defaults = fp32_settings()
rows, out_dtypes = {"defaults": defaults}, {(x @ w.T).dtype}  # x, w: section 1's float32 tensors
gen = torch.Generator().manual_seed(5)
a512, b512 = torch.randn(512, 512, generator=gen), torch.randn(512, 512, generator=gen)  # (n, n)
products = {"highest": a512 @ b512}  # float32, at the default setting
try:
    for level in ("high", "medium", "highest"):
        torch.set_float32_matmul_precision(level)
        rows[f"set_float32_matmul_precision({level!r})"] = fp32_settings()
        out_dtypes.add((x @ w.T).dtype)
        products[level] = a512 @ b512
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # the new setting alone
    try:
        torch.get_float32_matmul_precision()
        mixed = "no error"
    except RuntimeError as err:  # what 2.13.0 raises is the point
        mixed = f"RuntimeError, mix of the legacy and new APIs: {'mix of the legacy and new APIs' in str(err)}"
finally:  # restore every setting, so that later cells (and lessons) run as before
    torch.set_float32_matmul_precision(defaults[0])
    for backend, value in zip(BACKENDS.values(), defaults[1:]):
        backend.fp32_precision = value
print(f"{'':39} {'old':8} " + " ".join(f"{name:13}" for name in BACKENDS))
for name, row in rows.items():
    print(f"{name:39} {row[0]:8} " + " ".join(f"{v:13}" for v in row[1:]))
print(f"cuda.matmul set to 'tf32' alone, then get_float32_matmul_precision(): {mixed}")
print(f"a float32 matmul's output dtype under every setting: {sorted(map(str, out_dtypes))}")
medium_same = torch.equal(products["medium"], products["highest"])  # bitwise
print(f"512x512 float32 product unchanged under 'medium', on your CPU: {medium_same}")
exact512 = a512.double() @ b512.double()  # (n, n) the reference, in float64
mm_error = {k: ((v.double() - exact512).norm() / exact512.norm()).item() for k, v in products.items()}
medium_fp32 = mm_error["medium"] < 10 * mm_error["highest"]  # bfloat16 pieces would be ~1e-3 off
print(f"'medium' error vs float64 within 10 x of 'highest' (float32 arithmetic): {medium_fp32}")
print(f"every setting back to its default: {fp32_settings() == defaults}")

# %% [markdown]
# Output:
# ```text
#                                         old      cuda.matmul   mkldnn.matmul cudnn.conv
# defaults                                highest  none          none          tf32
# set_float32_matmul_precision('high')    high     tf32          tf32          tf32
# set_float32_matmul_precision('medium')  medium   tf32          bf16          tf32
# set_float32_matmul_precision('highest') highest  ieee          ieee          tf32
# cuda.matmul set to 'tf32' alone, then get_float32_matmul_precision(): RuntimeError, mix of the legacy and new APIs: True
# a float32 matmul's output dtype under every setting: ['torch.float32']
# 512x512 float32 product unchanged under 'medium', on your CPU: «name»
# 'medium' error vs float64 within 10 x of 'highest' (float32 arithmetic): «name»
# every setting back to its default: True
# ```
#
# Setting the old one writes the new ones: `"high"` asks cuBLAS and oneDNN for TF32,
# `"medium"` asks cuBLAS for TF32 and oneDNN for bfloat16, and `"highest"` asks both for
# `ieee`, full float32.
# The defaults read `none`: not set, follow the backend's parent setting (read from
# `torch/include/ATen/Context.h`). cuDNN convolutions default to TF32 while matmuls do not,
# and no `set_float32_matmul_precision` changes that. The other way round there is no
# link: a new setting the old one cannot describe makes the old getter raise. Use one of
# the two in a program, the per-backend one where you need convolutions and matmuls apart.
#
# The output stays float32 under every setting; what changes is the arithmetic inside. On
# a GPU, `"high"` makes float32 matmuls several times faster and about as exact as float16
# inputs (unverified on a GPU). Under `"medium"` PyTorch hands float32 matmuls to oneDNN
# with bfloat16 allowed; oneDNN uses it only where it has a bfloat16 kernel, and computes
# in float32 elsewhere. A changed product alone can just be a different float32 kernel:
# compare the errors. Against float64, float32 arithmetic is about 3e-7 off here, bfloat16
# inputs 3e-3.

# %% [markdown]
# ## 2. A mixed-precision training step, in order
#
# Here are the pieces put together: a float16 step with a `GradScaler`, gradient clipping
# and a learning-rate schedule. The order of the calls is the whole point:
#
# 1. `opt.zero_grad()`;
# 2. the forward pass under autocast, the loss in float32;
# 3. `scaler.scale(loss).backward()`: the gradients of `loss × scale`;
# 4. `scaler.unscale_(opt)`: divide the gradients by the scale (and note any inf/NaN);
# 5. clip the gradient norm, and log the norm `clip_grad_norm_` returns;
# 6. `scaler.step(opt)`: the optimizer step, skipped if step 4 found inf/NaN;
# 7. `scaler.update()`: halve or grow the scale (lesson 05a's rule);
# 8. `sched.step()`: once per step, after the optimizer.
#
# The model is a small MLP (16 → 32 → 4) on random points labelled by which of their first
# four coordinates is largest; SGD, learning rate 0.1 divided by the step number.
#
# **Predict.** What scale does each step use, and what gradient norm reaches the
# optimizer when the clipping threshold is 0.5?


# %%
def make_model():
    torch.manual_seed(1)  # the same initial weights for every run below
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


torch.manual_seed(2)
xs = torch.randn(64, 16)  # (N, 16)
ys = xs[:, :4].argmax(1)  # (N,) class = the largest of the first 4 features
MAX_NORM = 0.5  # clip the gradient norm to this


def train_step(model, opt, sched, scaler, x, y, dtype, clip_first=False):
    """One step in the order above; clip_first=True clips before unscale_ (a bug)."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype):
        logits = model(x)  # (B, 4), 16-bit matmuls
    loss = F.cross_entropy(logits.float(), y)  # the loss in float32 (section 1)
    scaler.scale(loss).backward()  # gradients of loss * scale
    if clip_first:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)  # scaled grads!
        scaler.unscale_(opt)
    else:
        scaler.unscale_(opt)  # gradients / scale, in place; inf/NaN recorded
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)  # the true norm
    used = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])  # what SGD gets
    lr, scale = sched.get_last_lr()[0], scaler.get_scale()
    scaler.step(opt)  # opt.step(), unless inf/NaN was found
    scaler.update()
    sched.step()
    return {"lr": lr, "scale": scale, "loss": loss.item(), "norm": norm.item(), "used": used.item()}


def train(dtype, use_scaler=True, clip_first=False, steps=4):
    """[row per step] of a fresh model trained on batches of 16."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 / (1 + k))  # 0.1, 0.05, ...
    scaler = torch.amp.GradScaler("cpu", enabled=use_scaler)  # disabled: scale 1, no checks
    batches = zip(xs.split(16), ys.split(16))  # (16, 16) and (16,) each
    return [train_step(model, opt, sched, scaler, x, y, dtype, clip_first)
            for _, (x, y) in zip(range(steps), batches)]


def show(rows):
    for k, r in enumerate(rows, start=1):
        print(f"step {k}: lr {r['lr']:.4f} scale {r['scale']:5.0f} loss {r['loss']:.3f} "
              f"grad norm {r['norm']:.3f}, after clipping {r['used']:.3f}")


fp16_rows = train(torch.float16)
show(fp16_rows)

# %% [markdown]
# Output:
# ```text
# step 1: lr 0.1000 scale 65536 loss 1.513 grad norm 0.787, after clipping 0.500
# step 2: lr 0.0500 scale 65536 loss 1.359 grad norm 0.684, after clipping 0.500
# step 3: lr 0.0333 scale 65536 loss 1.324 grad norm 0.591, after clipping 0.500
# step 4: lr 0.0250 scale 65536 loss 1.553 grad norm 0.900, after clipping 0.500
# ```
#
# The scale stays at its initial 65,536: no gradient overflowed, and growth would take
# 2,000 clean steps. The norm that `clip_grad_norm_` returns and that you log is the true
# one, because `unscale_` ran first; every step's norm is above 0.5, so every step is
# clipped to 0.5 before SGD uses it. `scaler.step` knows the gradients are already
# unscaled and does not divide them again. The learning rate printed is the one the step
# used: `sched.step()` comes last and sets the next one. (Losses and norms are printed to
# 3 decimals; float16 products may differ in the last bits between CPUs.)
#
# **Predict.** Swap steps 4 and 5: clip first, then unscale. What norm does clipping see,
# and what norm reaches the optimizer?

# %%
wrong_rows = train(torch.float16, clip_first=True)
seen, true = wrong_rows[0]["norm"], fp16_rows[0]["norm"]  # the same first step and batch
print(f"clip before unscale_: norm seen {seen:.3g} = {seen / true:.1f} x the true norm {true:.3f}")
print(f"norm reaching SGD: {wrong_rows[0]['used']:.3g} = {MAX_NORM} / "
      f"{MAX_NORM / wrong_rows[0]['used']:.0f}, instead of {fp16_rows[0]['used']:.3f}")

# %% [markdown]
# Output:
# ```text
# clip before unscale_: norm seen 5.16e+04 = 65536.0 x the true norm 0.787
# norm reaching SGD: 7.63e-06 = 0.5 / 65536, instead of 0.500
# ```
#
# Clipping saw the gradients of `loss × 65536`, so the norm it measured (and that you
# would log) is 65,536 times the true one, and it cut the gradients down to norm 0.5 *in
# scaled units*. `unscale_` then divided by 65,536: the optimizer stepped with a gradient
# 65,536 times too small, and nothing failed.
#
# **Predict.** Adam divides each gradient by its own running size. Run the four steps with
# `torch.optim.Adam` (lr 1e-3) in both orders: how far do the weights move with the bug,
# compared with the right order? And with Adam's `eps` set to 0?


# %%
def adam_moves(clip_first, eps=1e-8):
    """((P,) how far 4 fp16 steps of Adam move every weight, [row per step]), in train_step's order."""
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)  # a constant lr
    scaler = torch.amp.GradScaler("cpu")
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    rows = [train_step(model, opt, sched, scaler, x, y, torch.float16, clip_first)
            for x, y in zip(xs.split(16), ys.split(16))]
    return torch.cat([p.detach().flatten() for p in model.parameters()]) - before, rows


runs = {(eps, bug): adam_moves(bug, eps) for eps in (1e-8, 0.0) for bug in (False, True)}
adam = {eps: (runs[eps, False][0], runs[eps, True][0]) for eps in (1e-8, 0.0)}  # (right, wrong)
adam_clipped = all(r["norm"] > MAX_NORM for _, rows in runs.values() for r in rows)
print(f"every step clipped, in both orders: {adam_clipped}")
for eps, (right, wrong) in adam.items():
    cos = F.cosine_similarity(right, wrong, dim=0).item()
    print(f"Adam, eps {eps:g}: with the bug the weights move {wrong.norm() / right.norm():.2f} x "
          f"as far, direction cosine {cos:.2f}")

# %% [markdown]
# Output:
# ```text
# every step clipped, in both orders: True
# Adam, eps 1e-08: with the bug the weights move 0.91 x as far, direction cosine 0.99
# Adam, eps 0: with the bug the weights move 1.00 x as far, direction cosine 1.00
# ```
#
# Adam's update is the gradient's running average over the square root of its running
# square: multiply every gradient by the same factor and it cancels, except against `eps`.
# Here every step is clipped in both orders, so with the bug each step's gradient is the
# right order's divided by 65,536 (up to rounding), and with `eps` 0 the weights move the
# same way; the default `eps` of 1e-8 is no longer negligible next to gradients that are
# now about 1e-7, and the steps come out about a tenth shorter. The bug hides: training
# looks normal, the norm you log is 65,536 times too large, and your threshold no longer
# means anything: every step is clipped, whatever its true norm. Unscale first, then clip.
#
# ### bfloat16 needs no scaler
#
# Loss scaling exists because float16's range ends at 6e-8 (lesson 05a). bfloat16 has
# float32's range.
#
# **Predict.** Multiply the loss by 1e-7, so that every gradient is tiny (as the gradients
# of a deep network's early layers can be). Which runs still get the gradient that float32
# gets: float16 without a scaler, float16 with `GradScaler`'s 65,536, bfloat16 without one?


# %%
def tiny_grad_norm(dtype, scale=1.0):
    """Norm of the (unscaled) gradients of 1e-7 * loss, forward under `dtype` autocast."""
    model = make_model()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        logits = model(xs[:16])  # (16, 4)
    loss = 1e-7 * F.cross_entropy(logits.float(), ys[:16])
    (loss * scale).backward()
    return torch.nn.utils.get_total_norm([p.grad / scale for p in model.parameters()]).item()


reference = tiny_grad_norm(torch.float32)
tiny = {"float16, no scaler": tiny_grad_norm(torch.float16),
        "float16, scale 65536": tiny_grad_norm(torch.float16, 2.0**16),
        "bfloat16, no scaler": tiny_grad_norm(torch.bfloat16)}
for name, value in tiny.items():
    print(f"{name:21} gradient norm / float32's {value / reference:.2f}")
bf16_rows = train(torch.bfloat16, use_scaler=False)
bf16_losses = ", ".join(f"{r['loss']:.2f}" for r in bf16_rows)
print(f"bfloat16, 4 steps without a scaler: scale {bf16_rows[0]['scale']:.0f}, "
      f"losses {bf16_losses}")

# %% [markdown]
# Output:
# ```text
# float16, no scaler    gradient norm / float32's 0.00
# float16, scale 65536  gradient norm / float32's 1.00
# bfloat16, no scaler   gradient norm / float32's 1.00
# bfloat16, 4 steps without a scaler: scale 1, losses 1.51, 1.36, 1.32, 1.55
# ```
#
# In float16 every gradient of the logits (below 1e-8) rounds to 0 on its way back into
# the float16 graph, and nothing upstream survives: the step would do nothing. Scaled by
# 65,536 they become normal float16 numbers, and unscaling in float32 brings back the
# float32 gradient. bfloat16 reaches down to 1e-38 like float32, so it keeps them with no
# scaling at all: a bfloat16 recipe drops `GradScaler` (with `enabled=False`, as in the
# last run, it passes everything through with a scale of 1), and the four bfloat16 steps
# give the float16 run's losses to 2 decimals. bfloat16 pays in precision instead, 8 bits
# against float16's 11, which is why the weights and the sums stay in float32 (lesson 05a).

# %% [markdown]
# ### A forward pass that overflows float16
#
# Loss scaling protects the gradients at the small end of float16's range. The large end
# can be hit in the forward pass, by an activation.
#
# **Predict.** A linear layer sums 1,024 products of an input of 8 and a weight of 10, both
# exact in float16. What comes out in float32, under float16 autocast and under bfloat16
# autocast? And if you train it with `GradScaler` for three steps, what does the scaler do?

# %%
big = torch.nn.Linear(1024, 4, bias=False)
torch.nn.init.constant_(big.weight, 10.0)  # (4, 1024)
x_big = torch.full((2, 1024), 8.0)  # (B, 1024): each output is 1024 x 80 = 81,920
outs = {"float32": big(x_big)}
for name in ("float16", "bfloat16"):
    with torch.autocast("cpu", dtype=FORMATS[name]):
        outs[name] = big(x_big)  # (B, 4)
print("activation: " + ", ".join(f"{k} {v.max().item():g}" for k, v in outs.items()))
opt_big, scaler_big = torch.optim.SGD(big.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
w_before, big_steps = big.weight.detach().clone(), []
for _ in range(3):
    opt_big.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = big(x_big).float().pow(2).mean()
    big_steps.append((scaler_big.get_scale(), loss.item()))
    scaler_big.scale(loss).backward()
    scaler_big.step(opt_big)
    scaler_big.update()
print("float16 steps (scale, loss): " + ", ".join(f"({s:.0f}, {v:g})" for s, v in big_steps))
print(f"weights changed: {not torch.equal(w_before, big.weight)}; "
      f"scale now {scaler_big.get_scale():.0f}")

# %% [markdown]
# Output:
# ```text
# activation: float32 81920, float16 inf, bfloat16 81920
# float16 steps (scale, loss): (65536, inf), (32768, inf), (16384, inf)
# weights changed: False; scale now 8192
# ```
#
# 81,920 is past float16's 65,504: the activation is inf, and so is the loss built on it.
# No loss scale helps, because the overflow happens before any scaling: `GradScaler` sees
# inf gradients at every step, skips it and halves its scale, and the weights never move;
# it keeps halving for as long as the activation overflows. bfloat16, with float32's range,
# holds 81,920 exactly. The float16 remedies are to keep activations small (normalisation
# layers, a scaled initialisation) or to run the offending op in float32, which is what
# autocast's float32 list does for ops whose insides need range or precision (on CUDA,
# softmax and layer_norm, section 1).

# %% [markdown]
# ### On a GPU: the `torch.amp` spelling, and bfloat16 or float16
#
# This lesson's step runs on the CPU; on a GPU the same code takes `"cuda"` as its first
# argument: `torch.autocast("cuda", dtype=torch.bfloat16)` (also spelled
# `torch.amp.autocast("cuda", ...)`) and `torch.amp.GradScaler("cuda")`. Older code and
# many tutorials write `torch.cuda.amp.autocast()` and `torch.cuda.amp.GradScaler()`.
#
# **Predict.** A guess: what does PyTorch 2.13.0 do with the old names: raise, warn, or
# quietly accept them?


# %%
def warnings_of(make):
    """(what make() returned, the warnings it raised), caught here so that none escapes."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        made = make()
    return made, caught


old_names = {"torch.cuda.amp.autocast": (lambda: torch.cuda.amp.autocast(dtype=torch.bfloat16), torch.amp.autocast),
             "torch.cuda.amp.GradScaler": (lambda: torch.cuda.amp.GradScaler(), torch.amp.GradScaler)}
for name, (make, new_class) in old_names.items():
    made, caught = warnings_of(make)
    future = [w for w in caught if w.category is FutureWarning]  # a GPU-less run adds a UserWarning
    print(f"{name}(): {future[0].category.__name__}: {future[0].message}")
    print(f"  what it makes is a {new_class.__module__}.{new_class.__name__}: {isinstance(made, new_class)}")

# %% [markdown]
# Output:
# ```text
# torch.cuda.amp.autocast(): FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cuda', args...)` instead.
#   what it makes is a torch.amp.autocast_mode.autocast: True
# torch.cuda.amp.GradScaler(): FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated. Please use `torch.amp.GradScaler('cuda', args...)` instead.
#   what it makes is a torch.amp.grad_scaler.GradScaler: True
# ```
#
# The old names still work, as thin subclasses of the `torch.amp` classes that pass
# `"cuda"` as the device (read from `torch/cuda/amp/autocast_mode.py` and
# `grad_scaler.py` beside it), and each warns with a `FutureWarning` that names its
# replacement: a future release may remove them. Write the new spelling. (Without a GPU
# each also warns that it disables itself; that warning is not the deprecation.)
#
# Which format on which GPU? bfloat16 gets fast tensor-core matmuls on NVIDIA GPUs of
# compute capability 8.0 (A100; RTX 30 cards are 8.6) and later, TF32 too; float16 has
# them from Volta (7.0) on. So on Ampere or later, bfloat16 autocast without a scaler is
# the simpler recipe (no scale, no skipped steps, no forward overflow); on older GPUs, float16
# with `GradScaler` is the fast one (unverified on a GPU). `torch.cuda.is_bf16_supported()`
# answers for your GPU, but read it closely: it returns True for capability 8.0 or later
# and, by default, also where an older GPU can only emulate bfloat16; pass
# `including_emulation=False` to ask about the hardware (read from `torch/cuda/__init__.py`).

# %% [markdown]
# ## 3. What a training step keeps
#
# Take an MLP 1024 → 4096 → 1024 (8,393,728 parameters) trained with AdamW under CPU
# bfloat16 autocast, the usual PyTorch recipe: float32 parameters, bfloat16 matmuls. We
# run one step and count bytes: the parameters, their gradients, and the optimizer's real
# state after the step. A `saved_tensors_hooks` pack hook sees every tensor autograd keeps
# for the backward pass; we look among them for bfloat16 copies of the weights.
#
# **Predict.** How many bytes per parameter do the weights, the gradients and AdamW's
# state take? Are the gradients float32 or bfloat16?


# %%
def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def weight_copies(saved, model):
    """[(name, tensor)]: saved tensors that are bfloat16 copies of a weight (or its transpose)."""
    found = []
    for name, p in model.named_parameters():
        for t in saved:
            for view in (t, t.T) if t.dim() == 2 else ():
                if view.shape == p.shape and torch.equal(view, p.detach().to(torch.bfloat16)):
                    found.append((name, t))
    return found


mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
batch = torch.randn(2, 1024)  # (B, 1024): a tiny batch (bf16 may be slow here, section 1)
saved = []  # everything autograd keeps for backward
with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mlp(batch)  # (B, 1024) bfloat16
    loss = out.float().pow(2).mean()  # the loss on float32 outputs
copies = weight_copies(saved, mlp)  # before the step changes the weights
loss.backward()
opt.step()
print(f"saved for backward: {', '.join(f'{str(t.dtype)[6:]} {tuple(t.shape)}' for t in saved)}")

# %% [markdown]
# Output:
# ```text
# saved for backward: bfloat16 (2, 1024), bfloat16 (2, 4096), bfloat16 (2, 4096), bfloat16 (4096, 1024), float32 (2, 1024)
# ```
#
# Five tensors: the bfloat16 input of the first linear (its weight's gradient needs it),
# the ReLU output twice (ReLU's backward and the second linear's weight gradient each save
# it), a (4096, 1024) bfloat16 tensor, and the float32 output that `pow` needs. That big
# one is the second layer's weight, cast to bfloat16 and saved transposed for the input
# gradient. Now the bytes.

# %%
n = sum(p.numel() for p in mlp.parameters())
state = list(opt.state.values())  # one dict per parameter: step, exp_avg, exp_avg_sq
parts = {
    "weights": list(mlp.parameters()),
    "gradients": [p.grad for p in mlp.parameters()],
    "AdamW m and v": [s[k] for s in state for k in ("exp_avg", "exp_avg_sq")],
}
for name, ts in parts.items():
    print(f"{name:14} {nbytes(ts) / n:4.1f} bytes/param ({ts[0].dtype})")
total = sum(nbytes(ts) for ts in parts.values())
print(f"{'total':14} {total / n:4.1f} bytes/param = {total:,} bytes for {n:,} parameters")
steps = [s["step"] for s in state]
print(f"AdamW step counters: {len(steps)} tensors of shape {tuple(steps[0].shape)}, "
      f"{nbytes(steps)} bytes")
for name, t in copies:
    size = nbytes([t])
    print(f"bf16 copy of {name} saved for backward: {size:,} bytes = {size / n:.1f} bytes/param")

# %% [markdown]
# Output:
# ```text
# weights         4.0 bytes/param (torch.float32)
# gradients       4.0 bytes/param (torch.float32)
# AdamW m and v   8.0 bytes/param (torch.float32)
# total          16.0 bytes/param = 134,299,648 bytes for 8,393,728 parameters
# AdamW step counters: 4 tensors of shape (), 16 bytes
# bf16 copy of 2.weight saved for backward: 8,388,608 bytes = 1.0 bytes/param
# ```
#
# Between steps the model keeps 4 + 4 + 8 = 16 bytes per parameter, all float32: the
# master weights, gradients that flow back through autocast's casts and land in the
# parameters' own dtype, and AdamW's two running averages (plus one scalar step counter per
# parameter tensor, which counts for nothing). Mixed precision did not make this smaller;
# it made the matmuls cheaper (on hardware that has fast bfloat16).
#
# During the step there is more. The second layer's bfloat16 copy is saved for backward:
# 2 bytes for each of its 4,194,304 weights, about 1 byte per parameter of the model. The
# first layer's copy is not saved, because its input `batch` needs no gradient, and the
# weight is only needed to compute that one.
#
# **Predict.** Run the same forward pass on an input that requires a gradient (as every
# layer but the first has in a deep network): which bfloat16 weight copies are saved then?
# And how often does autocast cast a weight: call one `Linear` 3 times inside one autocast
# region, then once in each of 3 regions, and count the casts (`aten::_to_copy`).


# %%
def casts(calls_per_region, regions):
    """aten::_to_copy calls (casts) when a Linear(64, 64) runs under bfloat16 autocast."""
    lin, inp = torch.nn.Linear(64, 64), torch.ones(2, 64)  # (B, 64)
    with torch.profiler.profile() as prof:
        for _ in range(regions):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                for _ in range(calls_per_region):
                    lin(inp)
    return sum(e.name == "aten::_to_copy" for e in prof.events())


saved_req = []
with torch.autograd.graph.saved_tensors_hooks(lambda t: saved_req.append(t) or t, lambda t: t):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mlp(batch.clone().requires_grad_())  # (B, 1024), an input that needs a gradient
copies_req = [name for name, _ in weight_copies(saved_req, mlp)]
print(f"input needs a gradient: bfloat16 copies saved of {', '.join(copies_req)}")
cast_counts = {"3 calls in 1 region": casts(3, 1), "1 call in each of 3 regions": casts(1, 3)}
for name, count in cast_counts.items():
    print(f"{name:27}: {count} casts")

# %% [markdown]
# Output:
# ```text
# input needs a gradient: bfloat16 copies saved of 0.weight, 2.weight
# 3 calls in 1 region        : 5 casts
# 1 call in each of 3 regions: 9 casts
# ```
#
# With a requires-grad input both layers' copies are kept: in a deep network the saved
# copies approach 2 bytes per parameter, on top of the activations. Autocast casts a
# weight the first time an op uses it inside a region and reuses that copy until the
# region ends: 3 calls in one region cast the input 3 times but the weight and the bias
# once (5 casts); 3 regions cast all three every time (9). So put the whole forward pass in
# one autocast region, not each layer in its own.
#
# And the split matters when tensors travel between processes: float32 gradients make a
# data-parallel all-reduce move 4 bytes per parameter. Reducing them in 16 bits would
# halve that, but a sum of many ranks' gradients in bfloat16 rounds every partial sum to 8
# bits, as lesson 05a's sums and section 1's loss did. Lesson 11b's FSDP2 setup splits it the
# way this section does: it gathers the weights for compute in bfloat16 (2 bytes per
# parameter) and reduces the gradients in float32.

# %% [markdown]
# ## 4. AdamW is a few lines of NumPy
#
# The state counted above, `exp_avg` and `exp_avg_sq`, is Adam's first and second moment.
# Here is AdamW written out in NumPy, trained side by side with `torch.optim.AdamW` on a
# small 4-class dataset made for this course (`data/four_classes.csv` at the repository's
# top, written by `scripts/make_four_classes.py`: four overlapping 2-D Gaussian clouds, 400
# training and 200 validation points). The model is a linear classifier in float64, started
# at zero; the weight gets weight decay 0.1, the bias none (AdamW takes one parameter group
# per setting). Both see the same mini-batches of 16.
#
# **Predict.** What is the loss at step 1, when every logit is 0? How far apart will the
# two sets of weights be after 300 steps?


# %%
def load_data(name="four_classes.csv"):
    """(x_train, y_train, x_val, y_val) as float64 / int64 NumPy arrays, from <repo>/data/ or
    from the lesson folder."""
    places = [HERE.parent.parent / "data" / name, HERE / name]
    path = next((p for p in places if p.is_file()), None)
    if path is None:
        raise FileNotFoundError(f"{name} not found in {[str(p) for p in places]}: copy "
                                f"data/{name} from the course repository next to this lesson")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    x = np.array([[float(r["x1"]), float(r["x2"])] for r in rows])  # (N, 2)
    y = np.array([int(r["label"]) for r in rows])  # (N,)
    train = np.array([r["split"] == "train" for r in rows])
    return x[train], y[train], x[~train], y[~train]


class NumpyAdamW:
    """AdamW on NumPy arrays, updated in place: decoupled weight decay, bias-corrected moments."""

    def __init__(self, lr, betas=(0.9, 0.999), eps=1e-8):
        self.lr, (self.b1, self.b2), self.eps = lr, betas, eps
        self.state = {}  # name -> (m, v, t)

    def step(self, name, p, grad, weight_decay):
        m, v, t = self.state.get(name, (np.zeros_like(p), np.zeros_like(p), 0))
        t += 1
        p *= 1 - self.lr * weight_decay  # decay the weight itself, not the gradient
        m = self.b1 * m + (1 - self.b1) * grad
        v = self.b2 * v + (1 - self.b2) * grad**2
        m_hat, v_hat = m / (1 - self.b1**t), v / (1 - self.b2**t)  # undo the zero start
        p -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)
        self.state[name] = (m, v, t)


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# %%
x_tr, y_tr, x_val, y_val = load_data()
LR, DECAY, BATCH, STEPS = 0.05, 0.1, 16, 300
model = torch.nn.Linear(2, 4, dtype=torch.float64)
torch.nn.init.zeros_(model.weight)
torch.nn.init.zeros_(model.bias)
adamw = torch.optim.AdamW([{"params": [model.weight], "weight_decay": DECAY},
                           {"params": [model.bias], "weight_decay": 0.0}], lr=LR)
W, b, ours_opt = np.zeros((4, 2)), np.zeros(4), NumpyAdamW(LR)  # W (C, D) like model.weight
xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
rng = np.random.default_rng(0)
gaps = []
for step in range(1, STEPS + 1):
    i = rng.choice(len(y_tr), BATCH, replace=False)  # the same batch for both
    loss = F.cross_entropy(model(xt[i]), yt[i])
    adamw.zero_grad()
    loss.backward()
    adamw.step()
    dz = (softmax(x_tr[i] @ W.T + b) - np.eye(4)[y_tr[i]]) / BATCH  # (B, C) dloss/dlogits
    ours_opt.step("W", W, dz.T @ x_tr[i], DECAY)
    ours_opt.step("b", b, dz.sum(axis=0), 0.0)
    gaps.append(max(np.abs(model.weight.detach().numpy() - W).max(),
                    np.abs(model.bias.detach().numpy() - b).max()))
    if step in (1, 10, 100, STEPS):
        print(f"step {step:3d}: loss {loss.item():.4f}, largest weight gap {gaps[-1]:.1e}")
with torch.no_grad():
    acc = (model(torch.from_numpy(x_val)).argmax(1).numpy() == y_val).mean()
acc_np = ((x_val @ W.T + b).argmax(1) == y_val).mean()
ULP = 2.0**-52  # float64's step between 1 and 2
halves = max(gaps[: STEPS // 2]) / ULP, max(gaps[STEPS // 2 :]) / ULP
print(f"largest gap in units of 2**-52: steps 1-150 {halves[0]:.0f}, steps 151-300 {halves[1]:.0f}")
print(f"second half within 2 x the first + 2 units: {halves[1] <= 2 * halves[0] + 2}")
print(f"below 16 x 2**-52 = {16 * ULP:.1e} at every step: {max(gaps) < 16 * ULP}; ln 4 = {math.log(4):.4f}")
w_abs = np.abs(W)
print(f"weights' sizes {w_abs.min():.2f} to {w_abs.max():.2f}; "
      f"validation accuracy: torch {acc:.3f}, numpy {acc_np:.3f}")

# %% [markdown]
# Output:
# ```text
# step   1: loss 1.3863, largest weight gap «number»
# step  10: loss 0.7280, largest weight gap «number»
# step 100: loss 0.4182, largest weight gap «number»
# step 300: loss 0.3553, largest weight gap «number»
# largest gap in units of 2**-52: steps 1-150 «number», steps 151-300 «number»
# second half within 2 x the first + 2 units: True
# below 16 x 2**-52 = 3.6e-15 at every step: True; ln 4 = 1.3863
# weights' sizes 1.12 to 1.68; validation accuracy: torch 0.865, numpy 0.865
# ```
#
# At step 1 all logits are 0, the softmax is uniform over 4 classes, and the loss is
# −ln(1/4) = ln 4 = 1.3863. The two optimizers then agree for all 300 steps to within a
# few units in the last place of weights of size 1 to 2, where float64's numbers are
# 2**-52 = 2.2e-16 apart (the exact count depends on the CPU's kernels, hence «number»
# above), and the second half's gap stays within twice the first's (plus 2 units): it is
# rounding, and it does not grow. It is there because PyTorch evaluates algebraically
# equal formulas arranged differently (`exp_avg.lerp_(grad, 1 - beta1)` for the running
# average, the bias corrections folded into the step size and the denominator).
# `torch.optim.AdamW` *is* the few lines of `NumpyAdamW.step`. The clouds overlap, so a
# linear classifier cannot be perfect: 86.5% of the validation points land on their own
# side.


# %% [markdown]
# ## Summary
#
# - CPU autocast runs linear/matmul in bfloat16, keeps softmax and layer_norm in their
#   input dtype (CUDA's lists put them in float32), and returns float32 cross-entropy:
#   on the CPU because `cross_entropy_loss` is on its float32 list, on CUDA because the op
#   decomposes into `log_softmax`, which keeps the bfloat16 dtype the decomposition asks
#   for, and `nll_loss`, which is on CUDA's float32 list. Compute the loss on
#   `logits.float()`: a bfloat16 `nll_loss` sums in bfloat16 and lands a step off. Whether
#   a 16-bit matmul beats float32 on a CPU depends on its instructions: measure it.
#   `set_float32_matmul_precision` writes the per-backend `fp32_precision` settings, not
#   the other way round: use one of the two.
# - The step's order: zero grads, forward under autocast, `scaler.scale(loss).backward()`,
#   `scaler.unscale_(opt)`, clip (and log the norm), `scaler.step`, `scaler.update`,
#   `sched.step()`. Clipping before `unscale_` clips scaled gradients: the optimizer then
#   gets a gradient `scale` times too small (Adam hides it: only its `eps` notices).
#   bfloat16 keeps tiny gradients without a scaler. An activation past 65,504 makes every
#   float16 step inf, whatever the scale: `GradScaler` skips and halves, step after step.
#   `torch.cuda.amp.*` warns with a FutureWarning: write `torch.amp.*("cuda")`.
# - A mixed-precision AdamW step keeps 16 bytes per parameter (4 weights, 4 gradients,
#   8 moments), plus the bfloat16 weight copies saved for backward during the step (about
#   2 bytes per parameter when inputs need gradients); autocast casts each weight once per
#   region.
# - `torch.optim.AdamW` matches a few lines of NumPy to rounding level in float64, step
#   after step.

# %% [markdown]
# ## Going further
#
# ### The three bands of a 16-bit matmul on a CPU
#
# Section 1's ratios fall into three bands, set by your CPU's instructions. Up to about 3:
# the CPU multiplies bfloat16 in hardware (AVX-512 BF16 or AMX), which oneDNN uses when
# the instructions are there; even then bfloat16 need not beat float32 at 128×128, and
# converting to float32 first (the last line) can win. Around 5: AVX-512 without BF16,
# where oneDNN converts inside its kernel. Ten to a hundred or more: neither, and the
# product runs in a generic loop, not in a tuned kernel. float16 is slower than float32 on
# most CPUs, tens of times: only recent server CPUs (AMX-FP16, AVX512-FP16) multiply it
# natively, and at this size even they take one to two times as long as for float32.
# `lscpu` lists your CPU's flags (`avx512_bf16`, `amx_bf16`, `avx512_fp16`): compare them
# with your timings. `torch.backends.cpu.get_cpu_capability()` names the vector
# instructions PyTorch's own kernels use (`AVX512`, `AVX2` or `DEFAULT`), which is not the
# same question.
#
# ### The `dtype` that `cross_entropy_loss` passes to `log_softmax`
#
# Section 1 said that the decomposition of `cross_entropy_loss` asks `log_softmax` for the
# logits' own dtype, which is why CUDA's rule leaves that `log_softmax` in bfloat16. The
# profiler shows it: it records the arguments of every op it sees (`record_shapes=True`), so
# compare those of the `log_softmax` inside `F.cross_entropy` with those of `log_softmax`
# calls whose `dtype` we choose.
#
# **Predict.** Which `dtype` does it pass for section 1's bfloat16 logits: none, bfloat16
# or float32?


# %%
def log_softmax_dtype_arg(fn):
    """The `dtype` argument of the aten::log_softmax call inside fn, as the profiler records it."""
    with torch.profiler.profile(record_shapes=True) as prof:
        fn()
    return next(e.concrete_inputs[2] for e in prof.events() if e.name == "aten::log_softmax")


arg_of = {d: log_softmax_dtype_arg(lambda d=d: F.log_softmax(logits, -1, dtype=d))
          for d in (None, torch.bfloat16, torch.float32)}  # the recorded form of each choice
ce_arg = log_softmax_dtype_arg(lambda: F.cross_entropy(logits, labels))  # bfloat16 logits
ce_dtype = next(d for d, a in arg_of.items() if a == ce_arg)
print(f"cross_entropy_loss on {logits.dtype} logits calls log_softmax with dtype={ce_dtype}")

# %% [markdown]
# Output:
# ```text
# cross_entropy_loss on torch.bfloat16 logits calls log_softmax with dtype=torch.bfloat16
# ```
#
# It passes bfloat16, the logits' own: a `dtype` that is set, which CUDA's
# `fp32_set_opt_dtype` rule keeps (unverified on a GPU). Computing the loss on
# `logits.float()` makes the question moot on every device.

# %% [markdown]
# ## References
#
# - [`torch.amp`](https://docs.pytorch.org/docs/2.13/amp.html): autocast and `GradScaler`,
#   with the per-device op lists that section 1 reads from the dispatcher.
# - [`torch.autocast`](https://docs.pytorch.org/docs/2.13/generated/torch.autocast.html): the
#   context manager, its `device_type` and `dtype`.
# - [`torch.set_float32_matmul_precision`](https://docs.pytorch.org/docs/2.13/generated/torch.set_float32_matmul_precision.html):
#   "highest", "high" and "medium", and the bfloat16 decomposition behind "high".
# - [`torch.backends`](https://docs.pytorch.org/docs/2.13/backends.html): the per-backend
#   `fp32_precision` settings of cuBLAS, cuDNN and oneDNN.
# - [`torch.cuda.is_bf16_supported`](https://docs.pytorch.org/docs/2.13/generated/torch.cuda.is_bf16_supported.html):
#   whether your GPU has bfloat16, natively or emulated.
# - [`torch.nn.utils.clip_grad_norm_`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.utils.clip_grad_norm_.html)
#   and [`torch.optim.AdamW`](https://docs.pytorch.org/docs/2.13/generated/torch.optim.AdamW.html):
#   the clipping and the optimizer of sections 2 to 4.
# - Micikevicius et al., [Mixed Precision Training](https://arxiv.org/abs/1710.03740) (2017):
#   the float16 recipe of section 2, master weights and loss scaling.
# - Henry et al., [Leveraging the bfloat16 Artificial Intelligence Datatype For Higher-Precision Computations](https://arxiv.org/abs/1904.06376)
#   (2019): float32 products from bfloat16 pieces, what `"high"` may use.
# - Loshchilov and Hutter, [Decoupled Weight Decay Regularization](https://arxiv.org/abs/1711.05101)
#   (2017): AdamW; Kingma and Ba, [Adam](https://arxiv.org/abs/1412.6980) (2014): its moments
#   and bias corrections.

# %% [markdown]
# ## Read the source
#
# Where PyTorch implements what this lesson showed. Open each file in your editor at the
# line printed: the paths are inside the torch you installed, so the line numbers are
# those of your installation. The stops follow a mixed-precision step: autocast's op lists
# (the CPU's in a C++ file the wheel does not ship, printed as a link at your release's tag)
# and its cast cache, the float32 matmul settings, the bfloat16 check for a GPU, then the
# AdamW update itself.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/include/ATen/autocast_mode.h", "#define AT_FORALL_FP32(_)",
     "The float32 list that CUDA autocast registers: `layer_norm` and `nll_loss` "
     "are in it, `softmax` and `log_softmax` are in `AT_FORALL_FP32_SET_OPT_DTYPE` just "
     "below, and `cross_entropy_loss` is in neither, so on CUDA it falls through and "
     "decomposes. `enum class CastPolicy`, further up, says what each list's rule does: "
     "`fp32` casts the inputs up, `fp32_set_opt_dtype` only fills in a `dtype` argument the "
     "call left unset (`set_opt_dtype`, just above it, keeps one that is set, as in the "
     "`log_softmax` call of *Going further*)."),
    ("pytorch:aten/src/ATen/autocast_mode.cpp", "TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)",
     "CPU autocast's own lists, op by op: `mm` and `linear` under `lower_precision_fp`, "
     "`cross_entropy_loss` and `nll_loss` under `fp32`, no `softmax` and no `layer_norm`. "
     "Higher up, `cached_cast` keeps the low-precision copy of a float32 leaf that requires "
     "grad (a weight) and casts every other tensor anew at each op."),
    ("torch/amp/autocast_mode.py", "def __exit__(",
     "Leaving the outermost autocast region (`autocast_decrement_nesting() == 0`) calls "
     "`torch.clear_autocast_cache()`: the cached weight copies are dropped, so the next "
     "region casts every weight again."),
    ("torch/include/ATen/Context.h", "enum class TORCH_API Float32Precision",
     "The values an `fp32_precision` setting takes, and the comment above them: `NONE` "
     "means inherit, `DEFAULT` the backend's legacy default. Further down, the table "
     "`fp32_precision` holds every (backend, op) pair's start: `NONE` for matmuls (TF32 "
     "only if the environment sets `TORCH_ALLOW_TF32_CUBLAS_OVERRIDE`), `DEFAULT` for "
     "cuDNN's convolutions and RNNs, whose legacy default `allow_tf32_cudnn = true`, a "
     "little above, makes section 1's `tf32`."),
    ("torch/cuda/__init__.py", "def is_bf16_supported(",
     "True on ROCm, False without CUDA, True for compute capability 8.0 or later, and "
     "otherwise, unless `including_emulation=False`, True if a bfloat16 tensor can be "
     "created at all: emulated bfloat16 counts by default. `is_tf32_supported` below asks "
     "for native bfloat16."),
    ("torch/optim/adam.py", "def _single_tensor_adam(",
     "The per-parameter loop that `torch.optim.AdamW` (an `Adam` with "
     "`decoupled_weight_decay=True`) runs on CPU tensors by default: `param.mul_(1 - lr * "
     "weight_decay)`, `exp_avg.lerp_(grad, 1 - beta1)`, and the bias corrections folded into "
     "`step_size` and `denom` before one `addcdiv_`, the rearrangement behind section "
     "4's rounding-level gap."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/include/ATen/autocast_mode.h:«line»  `#define AT_FORALL_FP32(_)`
#     The float32 list that CUDA autocast registers: `layer_norm` and `nll_loss` are in
#     it, `softmax` and `log_softmax` are in `AT_FORALL_FP32_SET_OPT_DTYPE` just below,
#     and `cross_entropy_loss` is in neither, so on CUDA it falls through and decomposes.
#     `enum class CastPolicy`, further up, says what each list's rule does: `fp32` casts
#     the inputs up, `fp32_set_opt_dtype` only fills in a `dtype` argument the call left
#     unset (`set_opt_dtype`, just above it, keeps one that is set, as in the
#     `log_softmax` call of *Going further*).
# https://github.com/pytorch/pytorch/blob/v«version»/aten/src/ATen/autocast_mode.cpp
#     search for `TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)`: CPU autocast's own lists, op
#     by op: `mm` and `linear` under `lower_precision_fp`, `cross_entropy_loss` and
#     `nll_loss` under `fp32`, no `softmax` and no `layer_norm`. Higher up, `cached_cast`
#     keeps the low-precision copy of a float32 leaf that requires grad (a weight) and
#     casts every other tensor anew at each op.
# torch/amp/autocast_mode.py:«line»  `def __exit__(`
#     Leaving the outermost autocast region (`autocast_decrement_nesting() == 0`) calls
#     `torch.clear_autocast_cache()`: the cached weight copies are dropped, so the next
#     region casts every weight again.
# torch/include/ATen/Context.h:«line»  `enum class TORCH_API Float32Precision`
#     The values an `fp32_precision` setting takes, and the comment above them: `NONE`
#     means inherit, `DEFAULT` the backend's legacy default. Further down, the table
#     `fp32_precision` holds every (backend, op) pair's start: `NONE` for matmuls (TF32
#     only if the environment sets `TORCH_ALLOW_TF32_CUBLAS_OVERRIDE`), `DEFAULT` for
#     cuDNN's convolutions and RNNs, whose legacy default `allow_tf32_cudnn = true`, a
#     little above, makes section 1's `tf32`.
# torch/cuda/__init__.py:«line»  `def is_bf16_supported(`
#     True on ROCm, False without CUDA, True for compute capability 8.0 or later, and
#     otherwise, unless `including_emulation=False`, True if a bfloat16 tensor can be
#     created at all: emulated bfloat16 counts by default. `is_tf32_supported` below asks
#     for native bfloat16.
# torch/optim/adam.py:«line»  `def _single_tensor_adam(`
#     The per-parameter loop that `torch.optim.AdamW` (an `Adam` with
#     `decoupled_weight_decay=True`) runs on CPU tensors by default: `param.mul_(1 - lr *
#     weight_decay)`, `exp_avg.lerp_(grad, 1 - beta1)`, and the bias corrections folded
#     into `step_size` and `denom` before one `addcdiv_`, the rearrangement behind section
#     4's rounding-level gap.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Explain.** Under autocast, cross-entropy comes out float32 on the CPU and on a GPU.
#    Does autocast intercept the same op on both devices?
#
#    <details><summary>Answer</summary>
#
#    No. `aten::cross_entropy_loss` has an `AutocastCPU` kernel but no `AutocastCUDA` one;
#    it is `CompositeImplicitAutograd`, so on CUDA it decomposes and autocast acts on the
#    pieces, `log_softmax.int` and `nll_loss`, which have `AutocastCUDA` kernels. Do not
#    lean on either list: outside autocast, the same bfloat16 logits give a loss of 3.5625
#    against 3.5418 from `logits.float()`
#    (*§ Autocast on the CPU: which ops run in bfloat16*).
#
#    </details>
#
# 2. **Spot the bug.** A training script starts with
#    `torch.backends.cuda.matmul.fp32_precision = "tf32"`; a library it imports later calls
#    `torch.get_float32_matmul_precision()`. What happens, and what would have kept the two
#    in step?
#
#    <details><summary>Answer</summary>
#
#    The library's call raises a `RuntimeError` about a mix of the legacy and new APIs: the
#    new per-backend setting is not written back to the old one, which cannot describe it.
#    The link runs one way only: `set_float32_matmul_precision("high")` writes `tf32` into
#    `cuda.matmul.fp32_precision` (*§ Float32 matmuls with fewer bits inside*). Use one of
#    the two in a program.
#
#    </details>
#
# 3. **Spot the bug.** A float16 step runs `scaler.scale(loss).backward()`, then
#    `clip_grad_norm_(model.parameters(), 0.5)`, then `scaler.unscale_(opt)` and
#    `scaler.step(opt)`. Nothing raises. What goes wrong?
#
#    <details><summary>Answer</summary>
#
#    Clipping runs on the scaled gradients: it sees a norm 65,536 times the true one
#    (5.16e+04 against 0.787) and cuts it to 0.5 in scaled units, so after `unscale_` SGD
#    steps with a norm of 0.5 / 65,536 = 7.63e-06 instead of 0.5. With Adam the bug hides:
#    the weights still move 0.91 times as far, in nearly the same direction (cosine 0.99),
#    and 1.00 times as far (cosine 1.00) with `eps` 0. Unscale first, then clip
#    (*§ A mixed-precision training step, in order*).
#
#    </details>
#
# 4. **Predict.** A model's activations reach 81,920 in one layer. Its float16 run uses a
#    `GradScaler`; what do the first three steps do? And the same model under bfloat16?
#
#    <details><summary>Answer</summary>
#
#    Every float16 step sees an inf loss, whatever the scale: the overflow happens in the
#    forward pass, before any scaling. `GradScaler` skips each step and halves the scale
#    (65,536, 32,768, 16,384, then 8,192), and the weights never move. bfloat16 has
#    float32's range and holds 81,920 exactly (*§ A forward pass that overflows float16*).
#
#    </details>
#
# 5. **Predict.** An MLP of 8,393,728 parameters takes one AdamW step under CPU bfloat16
#    autocast. How many bytes per parameter does it keep between steps, and in which dtype
#    are the gradients?
#
#    <details><summary>Answer</summary>
#
#    16 bytes per parameter, all float32: 4 for the weights, 4 for the gradients (float32,
#    the parameters' dtype) and 8 for AdamW's two moments. During the step autocast adds
#    the bfloat16 weight copies saved for backward (here the second layer's, about 1 byte
#    per parameter; both layers' when the input needs a gradient), and it casts each
#    weight once per region: 5 casts for 3 calls in one region, 9 for 3 regions
#    (*§ What a training step keeps*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement `accumulated_step`: one optimizer step
# from several micro-batches under autocast and a `GradScaler`, in the order of section 2.
# Each micro-batch's loss is cross-entropy on float32 logits, divided by the number of
# micro-batches, so that the step sees the mean loss over all of them; after the last one,
# unscale, clip, step and update once. Return the norm `clip_grad_norm_` returned and
# whether the optimizer stepped. Check it with `make exercises N=05b`: the tests compare
# your step with one step on the whole batch, overflow one micro-batch, and leave stale
# gradients behind. `solutions.py` has one way to write it.

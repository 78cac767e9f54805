# %% [markdown]
# # 05 · Precision: bits, ranges and mixed-precision training
#
# A float is a sign, an exponent and a mantissa. How a format splits its bits between the
# last two decides which numbers it can hold at all (its range) and how finely it can tell
# them apart (its precision). Mixed-precision training runs the heavy matrix products in a
# 16-bit format and keeps everything that accumulates in float32; this lesson shows why,
# with numbers you can check, and then measures what such a training step keeps in memory.
#
# **What you will learn**
#
# - the range and the precision of float32, float16 and bfloat16, read from `torch.finfo`;
# - what happens to a value outside a format's range or between two of its numbers;
# - why weights and optimizer state stay in float32 while the matmuls run in 16 bits;
# - how loss scaling keeps small float16 gradients alive, and the skip/halve/double rule of
#   `torch.amp.GradScaler`; the two fp8 formats, and why each fp8 tensor gets a scale;
# - which ops CPU autocast runs in bfloat16, where it differs from CUDA autocast, and what
#   a 16-bit matmul costs on your CPU;
# - a whole mixed-precision training step in order (unscale before clipping), why
#   bfloat16 needs no scaler, and what a float16 forward overflow does to a scaler;
# - the bytes per parameter a mixed-precision AdamW step keeps, measured;
# - that `torch.optim.AdamW` is a few lines of NumPy, matched to rounding level.
#
# **Prerequisites:** lessons 01–04 (tensors, autograd, modules, a training loop), and the
# idea of a gradient step.
#
# **How to run:** `python lessons/05_precision/precision.py` or `make lesson N=05` from the
# repository root, or open `precision.ipynb`. Everything runs on the CPU, within the
# lesson's budget of 30 seconds on a shared 2-core machine. Whether a 16-bit matrix multiply
# is fast on a CPU depends on its instruction set: section 4 measures it on yours. Where the
# CPU has no 16-bit matrix instructions it can be tens of times slower than float32, so
# every low-precision matmul here is tiny on purpose. Each printing cell is followed by an
# *Output* block: what it printed with the pinned PyTorch (2.13.0).
# Run outside the course's venv, this lesson may also print PyTorch's own diagnostic lines
# to stderr: `USDT: ... profiler_start` and `profiler_stop` around each profiler run and, on
# a CUDA build without a GPU, `gpuGetDeviceCount failed`. They are harmless, and the
# course's venv (`.venv`, made by any `make lesson`) turns them off.

# %%
import csv
import math
import os
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DEVICE = torch.device(os.environ.get("COURSE_DEVICE", "cpu"))
FORMATS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def stored(value, dtype):
    """The number `dtype` actually keeps for `value` (rounded to it, read back as a float)."""
    return torch.tensor(value, dtype=torch.float32, device=DEVICE).to(dtype).item()


def fmt(values, spec=".3g"):
    return "[" + ", ".join(f"{v:{spec}}" for v in values) + "]"


# %% [markdown]
# ## 1. Three formats, one table
#
# `torch.finfo(dtype)` describes a float format: its total bits, its largest value (`max`),
# its smallest *normal* value (`tiny`) and `eps`, the gap between 1.0 and the next number.
# The mantissa stores `m` bits after the leading 1, so `eps = 2**-m`, and the exponent gets
# the bits that are left after the sign.
#
# **Predict.** float16 and bfloat16 both have 16 bits. Which of the two reaches larger
# numbers? Which one has the finer step at 1.0?


# %%
def format_row(dtype):
    """(exponent bits, mantissa bits, largest, smallest normal, smallest subnormal, step at 1)."""
    f = torch.finfo(dtype)
    mantissa = round(-math.log2(f.eps))  # eps = 2**-mantissa
    exponent = f.bits - 1 - mantissa  # what the sign and the mantissa leave
    # Below `tiny` the exponent is stuck at its minimum and the leading 1 is gone: the
    # mantissa's last bit is then worth tiny * eps, the smallest positive number.
    return exponent, mantissa, f.max, f.tiny, f.tiny * f.eps, f.eps


print(f"{'':9} {'exponent':>8} {'mantissa':>8} {'largest':>9} {'smallest normal':>15} "
      f"{'smallest subnormal':>18} {'step at 1.0':>11}")
for name, dtype in FORMATS.items():
    e, m, big, tiny, sub, eps = format_row(dtype)
    print(f"{name:9} {e:8d} {m:8d} {big:9.3g} {tiny:15.3g} {sub:18.3g} {eps:11.3g}")

# %% [markdown]
# Output:
# ```text
#           exponent mantissa   largest smallest normal smallest subnormal step at 1.0
# float32          8       23   3.4e+38        1.18e-38            1.4e-45    1.19e-07
# float16          5       10  6.55e+04         6.1e-05           5.96e-08    0.000977
# bfloat16         8        7  3.39e+38        1.18e-38           9.18e-41     0.00781
# ```
#
# bfloat16 is float32 with the mantissa cut from 23 bits to 7: the same 8 exponent bits,
# so the same range (up to 3.4e38), but a step of 1/128 at 1.0. float16 spends 3 more
# bits on the mantissa (a step of 1/1024) and pays with a 5-bit exponent: nothing above
# 65,504, nothing normal below 6.1e-5. Below the smallest normal number a format keeps
# going with *subnormals*, which lose one bit of precision per halving, down to
# `tiny * eps`. The test of this lesson checks that this last value really is stored
# (and that half of it is not).
#
# **Predict.** Store 1e-8, 70,000 and 1.001 in each 16-bit format. Which ones survive, and
# what comes back?

# %%
for v in (1e-8, 70_000.0, 1.001):
    f16, bf16 = stored(v, torch.float16), stored(v, torch.bfloat16)
    print(f"{v:>8g} stored as float16 {f16:<10.6g} bfloat16 {bf16:.6g}")

# %% [markdown]
# Output:
# ```text
#    1e-08 stored as float16 0          bfloat16 1.00117e-08
#    70000 stored as float16 inf        bfloat16 70144
#    1.001 stored as float16 1.00098    bfloat16 1
# ```
#
# - 1e-8 is below float16's smallest subnormal (6e-8): it *underflows* to 0. bfloat16 has
#   float32's exponent range and keeps it, rounded to its 8 significant bits: 1.00117e-8,
#   0.12% off.
# - 70,000 is above float16's largest value: it *overflows* to inf. In bfloat16 the
#   numbers between 65,536 and 131,072 are 512 apart (2**16 times the step at 1.0), and
#   70,144 is the nearest.
# - 1.001 sits between two numbers of each format. float16's nearest is 1 + 1/1024 =
#   1.00098; bfloat16's neighbours are 1 and 1.0078, and 1 is nearer.
#
# Range is where a format stops; precision is the gap between its numbers. float16 has the
# better precision, bfloat16 the (much) better range.

# %% [markdown]
# ## 2. Why the weights stay in float32
#
# An optimizer adds a small update to every weight, thousands of times.
#
# **Predict.** Start at 1 and add 1e-4 ten thousand times. What do you get in float32?
# In bfloat16? (Hint: compare 1e-4 with half of bfloat16's step at 1.0.)

# %%
sums = {}
for name in ("float32", "bfloat16"):
    total = torch.tensor(1.0, dtype=FORMATS[name])
    step = torch.tensor(1e-4, dtype=FORMATS[name])
    for _ in range(10_000):
        total = total + step  # each sum is rounded to the format
    sums[name] = total.item()
    print(f"1 + 10,000 x 1e-4 in {name:8} = {sums[name]:.4f} (exact: 2.0000)")
one = torch.tensor(1.0) + torch.tensor(1e-4)  # one float32 addition, result in [1, 2)
moved, ulp = one.item() - 1.0, torch.finfo(torch.float32).eps  # eps: the step in [1, 2)
print(f"float32 step in [1, 2): {ulp:.3g}; one addition moves 1.0 by {moved:.6g} "
      f"= {moved / ulp:.0f} steps (1e-4 is {1e-4 / ulp:.2f} steps)")

# %% [markdown]
# Output:
# ```text
# 1 + 10,000 x 1e-4 in float32  = 2.0002 (exact: 2.0000)
# 1 + 10,000 x 1e-4 in bfloat16 = 1.0000 (exact: 2.0000)
# float32 step in [1, 2): 1.19e-07; one addition moves 1.0 by 0.000100017 = 839 steps (1e-4 is 838.86 steps)
# ```
#
# In bfloat16 the next number after 1 is 1.0078, so 1 + 1e-4 is rounded back to 1: every
# one of the 10,000 additions is lost, not just a little of each. float32 gets there, 2e-4
# too far. All partial sums but the last two lie in [1, 2), where float32's numbers are
# 2**-23 = 1.19e-7 apart, and 1e-4 is 838.86 of those steps: each addition rounds to 839
# steps, 1.7e-8 too much, and 10,000 of them add up to 1.7e-4, which prints as 2.0002.
# (The rounding is IEEE arithmetic on one scalar: these digits are the same on every CPU.)
#
# **Predict.** The weights of a freshly initialised layer are about 0.02 in size, and an
# Adam step moves each one by about the learning rate. Store 10,000 such weights in
# bfloat16 and add ±lr to each: what share of them does not move at all, for lr = 1e-3,
# 1e-4 and 1e-5? And in float32?

# %%
gen = torch.Generator().manual_seed(3)  # a generator of its own: later cells' data unchanged
w = torch.randn(10_000, generator=gen) * 0.02  # (10000,) weights of a typical initialisation
w_bf16 = w.to(torch.bfloat16)
stuck = {}
for lr in (1e-3, 1e-4, 1e-5):
    update = lr * torch.randn(10_000, generator=gen).sign()  # (10000,) about lr each, either sign
    stuck[lr] = (((w_bf16.float() + update).to(torch.bfloat16) == w_bf16).float().mean().item(),
                 ((w + update) == w).float().mean().item())
    print(f"lr {lr:g}: weights that do not move: bfloat16 {stuck[lr][0]:5.1%}, "
          f"float32 {stuck[lr][1]:.1%}")

# %% [markdown]
# Output:
# ```text
# lr 0.001: weights that do not move: bfloat16  0.0%, float32 0.0%
# lr 0.0001: weights that do not move: bfloat16 11.8%, float32 0.0%
# lr 1e-05: weights that do not move: bfloat16 84.5%, float32 0.0%
# ```
#
# A bfloat16 weight moves only if the update is more than half the step between bfloat16
# numbers at that weight, which is 0.2% to 0.4% of the weight itself (2**-9 to 2**-8 of
# it). At lr = 1e-3 every update is larger than that. At 1e-4 the weights of 2**-5 =
# 0.031 or more are stuck (there bfloat16's numbers are 2.4e-4 apart); at 1e-5, a learning
# rate a decaying schedule reaches, most of them are. And a weight that does move lands on
# a bfloat16 number: it moves by a whole step, not by the update it was given. In float32
# every one of them moves, by the update.
# Mixed precision therefore keeps a float32 *master copy* of the weights, and the
# optimizer's running averages in float32 too; only the products that read them run in 16
# bits.

# %% [markdown]
# ## 3. Loss scaling: keeping small float16 gradients
#
# Gradients are often tiny. float16's range stops at 6e-8 (subnormal) at the small end.
#
# **Predict.** Store the gradients [1e-8, 2e-7, 1e-4] in float16. Which come back intact?
# What if you multiply them by 1024 first, and divide by 1024 after reading them back?

# %%
g = torch.tensor([1e-8, 2e-7, 1e-4], device=DEVICE)  # (3,) float32
plain = g.half().float()
scaled = (g * 1024).half().float() / 1024  # scale, store in float16, unscale in float32
print(f"gradients                 {fmt(g.tolist(), '.4g')}")
print(f"stored in float16         {fmt(plain.tolist(), '.4g')}")
print(f"x 1024, stored, / 1024    {fmt(scaled.tolist(), '.4g')}")

# %% [markdown]
# Output:
# ```text
# gradients                 [1e-08, 2e-07, 0.0001]
# stored in float16         [0, 1.788e-07, 0.0001]
# x 1024, stored, / 1024    [1.001e-08, 2e-07, 0.0001]
# ```
#
# Stored directly, 1e-8 underflows to 0 and 2e-7 lands among the subnormals, which are
# 6e-8 apart: 1.788e-7 is 11% off. Multiplied by 1024, 2e-7 becomes 2e-4, a normal
# float16 number with all 11 bits of precision, and comes back exact to 4 digits. 1e-8
# becomes 1.02e-5: still a subnormal, but now 172 steps of 6e-8 instead of a fraction of
# one, so it comes back 0.1% off instead of lost. Dividing by 1024 (a power of two) adds no
# error of its own. A larger scale would lift 1e-8 into the normal
# range too; that is what the dynamic scaler below does, starting at 65,536. In training
# you scale the *loss*: by the chain rule every gradient is then scaled by the same factor.
# The catch is the other end of the range: scale too much and a large gradient overflows
# to inf.
#
# ### A dynamic loss scaler
#
# `torch.amp.GradScaler` picks the scale as it goes. It starts at 2**16; when any gradient
# comes back inf or NaN it skips the optimizer step and halves the scale; after
# `growth_interval` clean steps in a row (2000 by default) it doubles the scale. Here is
# that rule, written out, next to the real `GradScaler` on the CPU. Each step's true
# gradients are scaled and stored in float16, as an fp16 backward pass would produce them;
# at steps 3 and 4 one gradient is 3.0, which overflows float16 (max 65,504) at a scale
# of 65,536 or 32,768.
#
# **Predict.** With `growth_interval=3`, which steps are skipped, and what is the scale
# at step 10?

# %%
GROWTH_INTERVAL = 3  # instead of 2000, so that growth shows within a few steps
TRUE_GRADS = [torch.tensor([1e-8, 2e-7, 3.0 if step in (3, 4) else 1e-4]) for step in range(1, 11)]


def fp16_scaled(grad, scale):
    """What an fp16 backward pass hands over: the scaled gradient, rounded to float16."""
    return (grad * scale).half().float()  # GradScaler unscales float32 gradients only


def our_trace(true_grads, interval, scale=2.0**16):
    """[(scale used, unscaled grads or None if skipped)] by the skip/halve/double rule."""
    clean, trace = 0, []
    for grad in true_grads:
        scaled_grad = fp16_scaled(grad, scale)
        if not torch.isfinite(scaled_grad).all():  # inf or NaN: skip the step
            trace.append((scale, None))
            scale, clean = scale * 0.5, 0
            continue
        trace.append((scale, scaled_grad / scale))
        clean += 1
        if clean == interval:
            scale, clean = scale * 2.0, 0
    return trace


# %%
class Recorder(torch.optim.Optimizer):
    """An optimizer that only records the (unscaled) gradients it is asked to step with."""

    def __init__(self, params):
        super().__init__(params, {})
        self.seen = []

    def step(self, closure=None):
        self.seen.append(self.param_groups[0]["params"][0].grad.clone())


def torch_trace(true_grads, interval, scale=2.0**16, scaler=None):
    """The same run driven through torch.amp.GradScaler on the CPU (pass `scaler` to keep it)."""
    p = torch.nn.Parameter(torch.zeros(3))
    opt = Recorder([p])
    scaler = scaler or torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=interval)
    trace = []
    for grad in true_grads:
        scaler.scale(torch.ones(()))  # a stand-in loss (the first call creates the scale tensor)
        scale, n_seen = scaler.get_scale(), len(opt.seen)
        p.grad = fp16_scaled(grad, scale)
        scaler.step(opt)  # unscales, checks for inf/NaN, calls opt.step() only if clean
        scaler.update()
        trace.append((scale, opt.seen[-1] if len(opt.seen) > n_seen else None))
    return trace


def action(unscaled):
    return "skip" if unscaled is None else "step"


scaler = torch.amp.GradScaler("cpu", growth_interval=GROWTH_INTERVAL)  # starts at 2**16
ours = our_trace(TRUE_GRADS, GROWTH_INTERVAL)
theirs = torch_trace(TRUE_GRADS, GROWTH_INTERVAL, scaler=scaler)  # the scaler is kept: its next scale
print("step  ours: scale   action  GradScaler: scale   action")
for k, ((s1, g1), (s2, g2)) in enumerate(zip(ours, theirs), start=1):
    print(f"{k:4d}  {s1:11.0f}   {action(g1):6}  {s2:17.0f}   {action(g2)}")
same = all(s1 == s2 and action(g1) == action(g2) and (g1 is None or torch.equal(g1, g2))
           for (s1, g1), (s2, g2) in zip(ours, theirs))
print(f"same scales, decisions and unscaled gradients: {same}")
print(f"scale after step 10 (for step 11): {scaler.get_scale():.0f}")
smallest = sorted({f"{u[0].item():.3g}" for _, u in theirs if u is not None})
print(f"smallest gradient after unscaling, in every step that ran: {smallest}")

# %% [markdown]
# Output:
# ```text
# step  ours: scale   action  GradScaler: scale   action
#    1        65536   step                65536   step
#    2        65536   step                65536   step
#    3        65536   skip                65536   skip
#    4        32768   skip                32768   skip
#    5        16384   step                16384   step
#    6        16384   step                16384   step
#    7        16384   step                16384   step
#    8        32768   step                32768   step
#    9        32768   step                32768   step
#   10        32768   step                32768   step
# same scales, decisions and unscaled gradients: True
# scale after step 10 (for step 11): 65536
# smallest gradient after unscaling, in every step that ran: ['1e-08']
# ```
#
# Step 3: 3.0 × 65,536 overflows, so the step is skipped and the scale halves. Step 4: 3.0
# × 32,768 = 98,304 still overflows: skipped again, halved to 16,384, where 3.0 fits. The
# two clean steps before the overflow do not count towards growth: the clean-step counter
# restarts at every overflow. Steps 5, 6, 7 are three clean steps in a row, so the scale
# doubles *after* step 7 and step 8 runs at 32,768; step 10 completes the next run of
# three, so step 11 runs at 65,536. A skipped step costs one batch; it does not corrupt
# the weights, because the inf never reaches the optimizer: on a batch that overflows, the
# training step of section 5 leaves every weight where it was.
# And the 1e-8 gradient, lost in plain float16, comes out of every step that ran intact.

# %% [markdown]
# ### 8-bit floats: a scale for every tensor
#
# GPUs from NVIDIA's H100 on multiply 8-bit floats. PyTorch has two such formats for
# training: `float8_e4m3fn` (4 exponent bits, 3 mantissa bits; "fn": finite, it has no inf)
# and `float8_e5m2`. `torch.finfo` describes them like the others, on any machine.
#
# **Predict.** What are their largest numbers and their steps at 1.0? Store 1000, 100,000,
# inf and 1e-3 in each: what comes back?

# %%
FP8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
for name, dtype in FP8.items():
    e, m, big, tiny, sub, eps = format_row(dtype)
    print(f"{name:13} exponent {e}, mantissa {m}: largest {big:g}, smallest normal {tiny:.3g}, "
          f"subnormals down to {sub:.3g}, step at 1 {eps:g}")
for v in (1000.0, 1e5, math.inf, 1e-3):
    print(f"{v:>6g} stored as " + ", ".join(f"{name} {stored(v, dtype):g}" for name, dtype in FP8.items()))

# %% [markdown]
# Output:
# ```text
# float8_e4m3fn exponent 4, mantissa 3: largest 448, smallest normal 0.0156, subnormals down to 0.00195, step at 1 0.125
# float8_e5m2   exponent 5, mantissa 2: largest 57344, smallest normal 6.1e-05, subnormals down to 1.53e-05, step at 1 0.25
#   1000 stored as float8_e4m3fn 448, float8_e5m2 1024
# 100000 stored as float8_e4m3fn 448, float8_e5m2 inf
#    inf stored as float8_e4m3fn 448, float8_e5m2 inf
#  0.001 stored as float8_e4m3fn 0.00195312, float8_e5m2 0.000976562
# ```
#
# Eight bits leave little of either. float8_e4m3fn keeps 3 mantissa bits (a step of 1/8 at
# 1.0) and stops at 448 = 1.75 × 2**8 (having no inf, it uses the top exponent, which other
# formats keep for inf and NaN, for numbers: only the all-ones code is NaN); float8_e5m2 has
# float16's 5 exponent bits, so nearly its range (up to 57,344), and 2 mantissa bits. Out of
# range they differ: in PyTorch 2.13.0 a cast to float8_e4m3fn *saturates*, 1000, 100,000
# and even inf become 448, while float8_e5m2 rounds 1000 to 1024 and overflows to inf past
# its range, as float16 does. At the small end, 1e-3 is about half of float8_e4m3fn's
# smallest subnormal (2**-9 = 0.00195) and rounds up to it: 95% off.
#
# **Predict.** A tensor of small values (a gradient, say: 1e-3 times a normal sample) is
# stored in each format directly, and again after multiplying it by the format's largest
# number over the tensor's largest magnitude (then dividing back in float32). How large is
# the error each way?

# %%
t8 = torch.randn(1000, generator=torch.Generator().manual_seed(4)) * 1e-3  # (1000,)
amax = t8.abs().max()  # the tensor's largest magnitude


def rel_error(approx):
    return ((approx - t8).norm() / t8.norm()).item()


fp8_errors = {}
for name, dtype in FP8.items():
    direct8 = t8.to(dtype).float()
    scale8 = torch.finfo(dtype).max / amax  # the largest value lands on the format's largest
    scaled8 = (t8 * scale8).to(dtype).float() / scale8
    fp8_errors[name] = (rel_error(direct8), (direct8 == 0).float().mean().item(), rel_error(scaled8))
    print(f"{name:13} stored directly: error {fp8_errors[name][0]:5.1%} ({fp8_errors[name][1]:.0%} "
          f"became 0); scaled by max/amax: error {fp8_errors[name][2]:.1%}")

# %% [markdown]
# Output:
# ```text
# float8_e4m3fn stored directly: error 55.9% (65% became 0); scaled by max/amax: error 2.8%
# float8_e5m2   stored directly: error  5.4% (1% became 0); scaled by max/amax: error 5.2%
# ```
#
# float8_e4m3fn cannot hold values this small: nearly two thirds of them become 0. Scaled
# so that the largest one lands on 448, nearly all fall in its normal range and keep 3
# bits each. float8_e5m2 reaches down to 1.5e-5 and needs no scale here, but with 2
# mantissa bits its error, scaled or not, is twice that of scaled e4m3. This is loss
# scaling again, for every tensor and with a scale of its own: fp8 training keeps a scale
# per tensor, computed from its largest magnitude (its *amax*), and multiplies with
# `torch._scaled_mm`, which takes the two fp8 tensors and their scales. This lesson's CUDA
# test measures its rate against bfloat16's.

# %% [markdown]
# ## 4. Autocast on the CPU: which ops run in bfloat16
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
# so the CPU can tell us which ops each device's autocast handles.
#
# **Predict.** On a GPU, cross-entropy under autocast also comes out float32. Is that
# because `cross_entropy_loss` is on CUDA's float32 list too?


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
# argument with float32 when the call left it unset; a `dtype` the caller passed is kept.
#
# **Predict.** Which `dtype` does `cross_entropy_loss` pass to the `log_softmax` it calls?
# The profiler records the arguments of every op it sees (`record_shapes=True`); compare
# them with those of `log_softmax` calls whose `dtype` we choose.


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
# The decomposition asks `log_softmax` for the logits' own dtype, so CUDA's rule for
# `log_softmax` leaves it in bfloat16, and it is `nll_loss`, on the plain float32 list,
# that casts the bfloat16 log-probabilities up: the loss is float32, summed from
# log-probabilities already rounded to bfloat16. The same line of Python gets its float32
# loss from different ops on different devices, and a change to either device's lists
# changes what you get.
#
# So do not rely on one device's lists: compute the loss on float32 logits yourself.
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

# %% [markdown]
# Output:
# ```text
# float32 loss rounded to bfloat16 once:           3.5469
# nll_loss of the rounded log-probs (in bfloat16): 3.5625
# the same rounded log-probs averaged in float32:  3.5437
# ```
#
# Rounding the answer once gives 3.5469, 0.005 off; rounding each log-probability costs
# about as little (3.5437, averaged in float32). `nll_loss` on bfloat16 input lands a whole
# bfloat16 step further, on the loss above: no single rounding of a float32 result gives
# that. Its running sums are bfloat16 numbers too, rounded to 8 bits at every addition as
# in section 2. `logits.float()` costs one small cast and makes the loss, and the start of
# the backward pass, float32 on every device.
#
# ### What a 16-bit matmul costs on this CPU
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


N_MM = 128  # small on purpose: where a format is slow, it is tens of times slower
a32, b32 = torch.randn(N_MM, N_MM), torch.randn(N_MM, N_MM)  # (n, n) float32
mm_time, mm_out = {}, {}
for name, dtype in FORMATS.items():
    a16, b16 = a32.to(dtype), b32.to(dtype)  # converted outside the clock
    mm_time[name] = best_time(lambda: a16 @ b16)
    mm_out[name] = a16 @ b16  # (n, n), kept for the test: a real product was computed
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
# magnitude does not), and they fall into three bands. Up to about 3: the CPU multiplies
# bfloat16 in hardware (AVX-512 BF16 or AMX instructions, which oneDNN, PyTorch's CPU
# library for such kernels, uses when they are there), and even then bfloat16 need not beat
# float32 here: converting to float32 first (the last line) can win.
# Around 5: AVX-512 without BF16, where oneDNN converts inside its kernel. Tens: neither,
# and the product runs in a generic loop, not in a tuned kernel; converting both bfloat16
# inputs to float32 and multiplying there costs little more than float32 itself. float16
# is slower than float32 on most CPUs, tens of times: only recent server CPUs (AMX-FP16,
# AVX512-FP16) multiply it natively, and at this size even they take one to two times as
# long as for float32. `lscpu` lists your CPU's flags (`avx512_bf16`, `amx_bf16`,
# `avx512_fp16`): compare them with section 4's timings. On GPUs the 16-bit formats are
# the fast ones (unverified on a GPU).

# %% [markdown]
# ## 5. A mixed-precision training step, in order
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
# 7. `scaler.update()`: halve or grow the scale (section 3);
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
    loss = F.cross_entropy(logits.float(), y)  # the loss in float32 (section 4)
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
# 65,536 times too small, and nothing failed. With SGD the model just stops learning.
#
# **Predict.** Adam divides each gradient by its own running size. Run the four steps with
# `torch.optim.Adam` (lr 1e-3) in both orders: how far do the weights move with the bug,
# compared with the right order? And with Adam's `eps` set to 0?


# %%
def adam_moves(clip_first, eps=1e-8):
    """(P,) how far 4 fp16 steps of Adam move every weight, in the order of train_step."""
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)  # a constant lr
    scaler = torch.amp.GradScaler("cpu")
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    for x, y in zip(xs.split(16), ys.split(16)):
        train_step(model, opt, sched, scaler, x, y, torch.float16, clip_first)
    return torch.cat([p.detach().flatten() for p in model.parameters()]) - before


adam = {eps: (adam_moves(False, eps), adam_moves(True, eps)) for eps in (1e-8, 0.0)}
for eps, (right, wrong) in adam.items():
    cos = F.cosine_similarity(right, wrong, dim=0).item()
    print(f"Adam, eps {eps:g}: with the bug the weights move {wrong.norm() / right.norm():.2f} x "
          f"as far, direction cosine {cos:.2f}")

# %% [markdown]
# Output:
# ```text
# Adam, eps 1e-08: with the bug the weights move 0.91 x as far, direction cosine 0.99
# Adam, eps 0: with the bug the weights move 1.00 x as far, direction cosine 1.00
# ```
#
# Adam's update is the gradient's running average over the square root of its running
# square: multiply every gradient by the same factor and it cancels, except against `eps`.
# With the bug each step's gradient is the right order's gradient divided by 65,536 (up
# to rounding), so with `eps` 0 the weights move the same way; the default `eps` of 1e-8 is
# no longer negligible next to gradients that are now about 1e-7, and the steps come out
# about a tenth shorter. The bug
# hides: training looks normal, and the clipping you asked for silently does nothing.
# Unscale first, then clip.
#
# ### bfloat16 needs no scaler
#
# Loss scaling exists because float16's range ends at 6e-8 (section 3). bfloat16 has
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
# give the float16 run's losses to 2 decimals. bfloat16 pays in precision
# instead, 8 bits against float16's 11, which is why the weights and the sums stay in
# float32 (section 2).

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
# softmax and layer_norm, section 4).

# %% [markdown]
# ## 6. What a training step keeps
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
batch = torch.randn(2, 1024)  # (B, 1024): a tiny batch (bf16 may be slow here, section 4)
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
# bits, as section 2's sums and section 4's loss did. Lesson 11's FSDP2 setup splits it the
# way this section does: it gathers the weights for compute in bfloat16 (2 bytes per
# parameter) and reduces the gradients in float32.

# %% [markdown]
# ## 7. AdamW is a few lines of NumPy
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
def load_data(path):
    """(x_train, y_train, x_val, y_val) as float64 / int64 NumPy arrays."""
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
x_tr, y_tr, x_val, y_val = load_data(HERE.parent.parent / "data" / "four_classes.csv")
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
# below 16 x 2**-52 = 3.6e-15 at every step: True; ln 4 = 1.3863
# weights' sizes 1.12 to 1.68; validation accuracy: torch 0.865, numpy 0.865
# ```
#
# At step 1 all logits are 0, the softmax is uniform over 4 classes, and the loss is
# −ln(1/4) = ln 4 = 1.3863. The two optimizers then agree for all 300 steps to within a few
# units in the last place of weights of size 1 to 2, where float64's numbers are 2**-52 =
# 2.2e-16 apart (the exact count depends on the CPU's kernels, hence «number» above), and
# the second half of the run is no worse than the first: the gap is rounding, and it does
# not grow. It is there because PyTorch evaluates algebraically equal formulas arranged
# differently (`exp_avg.lerp_(grad, 1 - beta1)` for the running average, the bias
# corrections folded into the step size and the denominator). `torch.optim.AdamW` *is* the
# few lines of `NumpyAdamW.step`. The clouds overlap, so a linear classifier cannot be
# perfect: 86.5% of the validation points land on their own side.

# %% [markdown]
# ## 8. Picture it: three number lines
#
# **Predict.** On a log scale from 1e-46 to 1e39, where does each format hold normal
# numbers, where only subnormals, and where does it overflow?


# %%
def plot_formats(formats, marks=(1e-8, 7e4)):
    """One horizontal line per format: subnormal range, normal range, overflow, on log x."""
    fig, ax = plt.subplots(figsize=(9, 2.8))
    right = 1e40  # the plot's right edge: "overflow" runs from max to here
    for row, (name, dtype) in enumerate(formats.items()):
        _, _, big, tiny, sub, _ = format_row(dtype)
        for lo, hi, part, color in [(sub, tiny, "subnormal", "tab:orange"),
                                    (tiny, big, "normal", "tab:blue"),
                                    (big, right, "overflow", "tab:red")]:
            ax.barh(row, hi - lo, left=lo, height=0.5, color=color, label=f"{name} {part}")
    for v in marks:
        ax.axvline(v, color="black", linestyle=":", linewidth=1)
        ax.text(v * 3, -0.7, f"{v:g}", va="center")  # just right of the line, above the bars
    ax.set_xscale("log")
    ax.set_xlim(1e-46, right)
    ax.set_ylim(len(formats) - 0.5, -1.0)  # inverted: the first format on top
    ax.set_yticks(range(len(formats)), list(formats))
    ax.set_xlabel("magnitude (log scale)")
    ax.set_title("orange: subnormal, blue: normal, red: overflow to inf")
    fig.tight_layout()
    return fig


# %%
fig = plot_formats(FORMATS)
fig.savefig(HERE / "formats.png", dpi=100)
print("saved formats.png")

# %% [markdown]
# Output:
# ```text
# saved formats.png
# ```
#
# float32 and bfloat16 cover the same 76 decades of normal numbers (bfloat16's subnormals
# stop earlier, at 9e-41, because it has fewer mantissa bits to give up). float16's normal
# range is a band of 9 decades, from 6e-5 to 65,504, with subnormals down to 6e-8: the
# dotted line at 1e-8 falls off its left end, the one at 70,000 into its overflow. What the
# picture does not show is precision: 8 significant bits (about 2.4 decimal digits) for
# bfloat16, 11 (3.3 digits) for float16, 24 (7.2 digits) for float32, the same relative
# precision everywhere in each format's normal range.

# %% [markdown]
# ## Summary
#
# - float32 (8 exponent, 23 mantissa bits), float16 (5, 10) and bfloat16 (8, 7): bfloat16
#   has float32's range and little precision; float16 more precision and a range of
#   6e-8 (subnormal) to 65,504.
# - Small updates vanish in bfloat16 (1 + 10,000 × 1e-4 stays 1; at lr 1e-5, 85% of
#   weights of size 0.02 do not move), so master weights and optimizer state stay in
#   float32; only the matmuls run in 16 bits.
# - float16 needs loss scaling: multiply the loss, unscale the gradients in float32.
#   `GradScaler` starts at 2**16, skips the step and halves on inf/NaN, doubles after
#   `growth_interval` clean steps; a dozen lines reproduce its decisions exactly.
# - fp8: float8_e4m3fn (3 mantissa bits, up to 448, saturating casts in 2.13.0) and
#   float8_e5m2 (2 bits, up to 57,344); small values need a per-tensor scale from the
#   tensor's largest magnitude, loss scaling for every tensor.
# - CPU autocast runs linear/matmul in bfloat16, keeps softmax and layer_norm in their
#   input dtype (CUDA's lists put them in float32), and returns float32 cross-entropy:
#   on the CPU because `cross_entropy_loss` is on its float32 list, on CUDA because the op
#   decomposes into `log_softmax`, which keeps the bfloat16 dtype the decomposition asks
#   for, and `nll_loss`, which is on CUDA's float32 list. Compute the loss on
#   `logits.float()`: a bfloat16 `nll_loss` sums in bfloat16 and lands a step off.
# - Whether a 16-bit matmul is faster than float32 on a CPU depends on its instructions
#   (AVX-512 BF16, AMX): measure it. Without them it can be tens of times slower.
# - The step's order: zero grads, forward under autocast, `scaler.scale(loss).backward()`,
#   `scaler.unscale_(opt)`, clip (and log the norm), `scaler.step`, `scaler.update`,
#   `sched.step()`. Clipping before `unscale_` clips scaled gradients: the optimizer then
#   gets a gradient `scale` times too small (Adam hides it: only its `eps` notices).
#   bfloat16 keeps tiny gradients without a scaler. An activation past 65,504 makes every
#   float16 step inf, whatever the scale: `GradScaler` skips and halves, step after step.
# - A mixed-precision AdamW step keeps 16 bytes per parameter (4 weights, 4 gradients,
#   8 moments), plus the bfloat16 weight copies saved for backward during the step (about
#   2 bytes per parameter when inputs need gradients); autocast casts each weight once per
#   region.
# - `torch.optim.AdamW` matches a few lines of NumPy to rounding level in float64, step
#   after step.
# - On a GPU the 16-bit (and fp8) matmuls are the fast ones, and CUDA autocast has its own
#   rules, `softmax` and `layer_norm` in float32 among them (unverified on a GPU).

# %% [markdown]
# ## Read the source
#
# Open these files in your editor: each path is relative to the folder that holds your
# installed `torch` (your site-packages), and the line numbers are those of your
# installation. The stops follow a mixed-precision step: autocast's op lists and its cast
# cache, then `GradScaler`'s unscale, skip and update, then the AdamW update itself.

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
     "call left unset (`set_opt_dtype`, just above it, keeps one that is set, as in section "
     "4's `log_softmax` call)."),
    ("pytorch:aten/src/ATen/autocast_mode.cpp", "TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)",
     "CPU autocast's own lists, op by op: `mm` and `linear` under `lower_precision_fp`, "
     "`cross_entropy_loss` and `nll_loss` under `fp32`, no `softmax` and no `layer_norm`. "
     "Higher up, `cached_cast` keeps the low-precision copy of a float32 leaf that requires "
     "grad (a weight) and casts every other tensor anew at each op."),
    ("torch/amp/autocast_mode.py", "def __exit__(",
     "Leaving the outermost autocast region (`autocast_decrement_nesting() == 0`) calls "
     "`torch.clear_autocast_cache()`: the cached weight copies are dropped, so the next "
     "region casts every weight again."),
    ("torch/amp/grad_scaler.py", "def unscale_(",
     "Multiplies the gradients by the reciprocal of the scale (computed in float64, except on "
     "MPS) through `_unscale_grads_`, which, called from here with `allow_fp16=False`, refuses "
     "float16 gradients, and records the stage `UNSCALED` so "
     "that `step()` does not divide again; `_maybe_opt_step` below calls `optimizer.step()` "
     "only when no inf/NaN was found, and `update()` hands the scale to `torch._amp_update_scale_`."),
    ("pytorch:aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp", "_amp_update_scale_cpu_kernel(",
     "the skip/halve/double rule on the CPU: after an inf/NaN the scale is multiplied by "
     "`backoff_factor` and the growth tracker reset to 0; otherwise the tracker counts the "
     "clean step, and when it reaches `growth_interval` the scale is multiplied by "
     "`growth_factor` (unless that would overflow) and the tracker restarts."),
    ("torch/optim/adam.py", "def _single_tensor_adam(",
     "The per-parameter loop that `torch.optim.AdamW` (an `Adam` with "
     "`decoupled_weight_decay=True`) runs on CPU tensors by default: `param.mul_(1 - lr * "
     "weight_decay)`, `exp_avg.lerp_(grad, 1 - beta1)`, and the bias corrections folded into "
     "`step_size` and `denom` before one `addcdiv_`, the rearrangement behind section 7's "
     "rounding-level gap."),
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
#     unset (`set_opt_dtype`, just above it, keeps one that is set, as in section 4's
#     `log_softmax` call).
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
# torch/amp/grad_scaler.py:«line»  `def unscale_(`
#     Multiplies the gradients by the reciprocal of the scale (computed in float64, except
#     on MPS) through `_unscale_grads_`, which, called from here with `allow_fp16=False`,
#     refuses float16 gradients, and records the stage `UNSCALED` so that `step()` does
#     not divide again; `_maybe_opt_step` below calls `optimizer.step()` only when no
#     inf/NaN was found, and `update()` hands the scale to `torch._amp_update_scale_`.
# https://github.com/pytorch/pytorch/blob/v«version»/aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp
#     search for `_amp_update_scale_cpu_kernel(`: the skip/halve/double rule on the CPU:
#     after an inf/NaN the scale is multiplied by `backoff_factor` and the growth tracker
#     reset to 0; otherwise the tracker counts the clean step, and when it reaches
#     `growth_interval` the scale is multiplied by `growth_factor` (unless that would
#     overflow) and the tracker restarts.
# torch/optim/adam.py:«line»  `def _single_tensor_adam(`
#     The per-parameter loop that `torch.optim.AdamW` (an `Adam` with
#     `decoupled_weight_decay=True`) runs on CPU tensors by default: `param.mul_(1 - lr *
#     weight_decay)`, `exp_avg.lerp_(grad, 1 - beta1)`, and the bias corrections folded
#     into `step_size` and `denom` before one `addcdiv_`, the rearrangement behind section
#     7's rounding-level gap.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Explain.** bfloat16 has float32's exponent range. Why, then, does a bfloat16
#    recipe still keep the master weights and AdamW's state in float32?
#
#    <details><summary>Answer</summary>
#
#    Range is not the problem: bfloat16 keeps 1e-8 (as 1.00117e-08) and 70,000 (as
#    70,144) where float16 gives 0 and inf; precision is: with 7 mantissa bits its step at
#    1.0 is 0.00781 (*§ Three formats, one table*). So 1 + 10,000 × 1e-4, a running sum of
#    small updates, stays 1.0000, and at lr 1e-5, 84.5% of weights of size 0.02 do not move
#    at all, against 0.0% in float32 (*§ Why the weights stay in float32*). Small updates,
#    to a weight or to a running sum, need float32 to land.
#
#    </details>
#
# 2. **Predict.** `GradScaler("cpu", growth_interval=3)` starts at 65,536. A gradient of
#    3.0 arrives at steps 3 and 4, small ones at every other step. Which steps run, and at
#    what scale does step 8 run?
#
#    <details><summary>Answer</summary>
#
#    Steps 3 and 4 are skipped: 3.0 × 65,536 and 3.0 × 32,768 both overflow float16, and
#    each skip halves the scale, to 16,384. The clean-step count restarts at each overflow,
#    so steps 5, 6 and 7 are the three clean steps that double it: step 8 runs at 32,768,
#    and a dozen lines of our own make the same decisions as `GradScaler`
#    (*§ A dynamic loss scaler*).
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
# 4. **Explain.** Under autocast, cross-entropy comes out float32 on the CPU and on a GPU.
#    Does autocast intercept the same op on both devices?
#
#    <details><summary>Answer</summary>
#
#    No. `aten::cross_entropy_loss` has an `AutocastCPU` kernel but no `AutocastCUDA` one;
#    it is `CompositeImplicitAutograd`, so on CUDA it decomposes and autocast acts on the
#    pieces, `log_softmax.int` and `nll_loss`, which have `AutocastCUDA` kernels. The
#    decomposition calls `log_softmax` with `dtype=torch.bfloat16`, the logits' own, which
#    CUDA's rule for it keeps; `nll_loss`'s float32 rule is the one that casts up. Do not
#    lean on either list: outside autocast, the same bfloat16 logits give a loss of 3.5625
#    against 3.5418 from `logits.float()`
#    (*§ Autocast on the CPU: which ops run in bfloat16*).
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
# Open `exercises.py` in this folder and implement `DynamicLossScaler`: the loss scaler of
# section 3 as a reusable object, with `GradScaler`'s arguments (`init_scale`,
# `growth_factor`, `backoff_factor`, `growth_interval`), a `scale` attribute and
# `step(scaled_grads)`, which returns the unscaled gradients or `None` when the step must
# be skipped. Mind NaN as well as inf, growth exactly at the interval, and the clean-step
# counter after an overflow. Check it with `make exercises N=05`: the tests replay many
# scripted gradient sequences through your scaler and through `torch.amp.GradScaler` and
# compare every decision. `solutions.py` has one way to write it.

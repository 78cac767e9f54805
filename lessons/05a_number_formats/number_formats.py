# %% [markdown]
# # 05a · Number formats: bits, ranges and loss scaling
#
# A float is a sign, an exponent and a mantissa. How a format splits its bits between the
# last two decides which numbers it can hold at all (its range) and how finely it can tell
# them apart (its precision). Mixed-precision training runs the heavy matrix products in a
# 16-bit (or 8-bit) format and keeps everything that accumulates in float32. This lesson, the
# first of two on precision, shows why with numbers you can check; lesson 05b then puts the
# formats to work in a training step.
#
# **What you will learn**
#
# - the range and the precision of float32, float16 and bfloat16, read from `torch.finfo`;
# - what happens to a value outside a format's range or between two of its numbers;
# - why weights and optimizer state stay in float32 while the matmuls run in 16 bits;
# - how loss scaling keeps small float16 gradients alive, and the skip/halve/double rule of
#   `torch.amp.GradScaler`, reproduced in a dozen lines;
# - the two fp8 formats of PyTorch, and why each fp8 tensor gets a scale of its own.
#
# **Prerequisites:** lessons 01–04b (tensors, autograd, modules, a training loop), and the
# idea of a gradient step. No knowledge of floating point beyond "a float has limited digits".
#
# **How to run:** `python lessons/05a_number_formats/number_formats.py` or
# `make lesson N=05a` from the repository root, or open `number_formats.ipynb`. Everything
# runs on the CPU in a few seconds. Each printing cell is followed by an *Output* block:
# what it printed with the pinned PyTorch (2.13.0). Your run prints the same lines, except
# the parts marked `«version»`, `«folder»` or `«line»` at the end: which torch you
# installed, and where.

# %%
import math
import os
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import torch

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
subnormal_min = {name: format_row(dtype)[4] for name, dtype in FORMATS.items()}  # tiny * eps
last_kept = all(stored(v, FORMATS[name]) == v and stored(v / 2, FORMATS[name]) == 0
                for name, v in subnormal_min.items())
print(f"smallest subnormal stored exactly, half of it rounds to 0: {last_kept}")

# %% [markdown]
# Output:
# ```text
#           exponent mantissa   largest smallest normal smallest subnormal step at 1.0
# float32          8       23   3.4e+38        1.18e-38            1.4e-45    1.19e-07
# float16          5       10  6.55e+04         6.1e-05           5.96e-08    0.000977
# bfloat16         8        7  3.39e+38        1.18e-38           9.18e-41     0.00781
# smallest subnormal stored exactly, half of it rounds to 0: True
# ```
#
# bfloat16 is float32 with the mantissa cut from 23 bits to 7: the same 8 exponent bits,
# so the same range (up to 3.4e38), but a step of 1/128 at 1.0. float16 spends 3 more
# bits on the mantissa (a step of 1/1024) and pays with a 5-bit exponent: nothing above
# 65,504, nothing normal below 6.1e-5. Below the smallest normal number a format keeps
# going with *subnormals*, which lose one bit of precision per halving, down to
# `tiny * eps`: the last line shows that each format keeps that number, and that half of it
# rounds to 0.
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
# Each addition is one correctly rounded operation, so these digits are the same on any machine.
#
# **Predict.** The weights of a freshly initialised layer are about 0.02 in size, and an
# Adam step moves each one by about the learning rate. Store 10,000 such weights in
# bfloat16 and add ±lr to each: what share of them does not move at all, for lr = 1e-3,
# 1e-4 and 1e-5? And in float32?

# %%
gen = torch.Generator().manual_seed(3)  # a generator of its own: later cells' data unchanged
w = torch.randn(10_000, generator=gen) * 0.02  # (10000,) weights of a typical initialisation
w_bf16 = w.to(torch.bfloat16)
stuck, updates = {}, {}
for lr in (1e-3, 1e-4, 1e-5):
    update = lr * torch.randn(10_000, generator=gen).sign()  # (10000,) about lr each, either sign
    updates[lr] = update
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
# numbers at that weight. That step is 2**-8 to 2**-7 of the weight (0.4% to 0.8%), so an
# update must exceed 0.2% to 0.4% of it. At lr = 1e-3 every update is larger than that. At
# 1e-4 the weights of 2**-5 = 0.031 or more are stuck (there bfloat16's numbers are 2.4e-4
# apart); at 1e-5, a learning rate a decaying schedule reaches, most of them are. And a
# weight that does move lands on the bfloat16 number nearest to weight + update: it moves by
# whole bfloat16 steps, never by exactly the update it was given. In float32 every one of
# them moves, by the update (to float32's rounding).
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
# `growth_interval` clean steps in a row (2000 by default, the cell below prints it) it
# doubles the scale. Here is that rule, written out, next to the real `GradScaler` on the
# CPU. Each step's true gradients are scaled and stored in float16, as an fp16 backward
# pass would produce them; at steps 3 and 4 one gradient is 3.0, which overflows float16
# (max 65,504) at a scale of 65,536 or 32,768.
#
# **Predict.** With `growth_interval=3`, which steps are skipped, and what is the scale
# at step 10?

# %%
GROWTH_INTERVAL = 3  # instead of 2000, so that growth shows within a few steps
TRUE_GRADS = [torch.tensor([1e-8, 2e-7, 3.0 if step in (3, 4) else 1e-4]) for step in range(1, 11)]


def fp16_scaled(grad, scale):
    """What an fp16 backward pass hands over: the scaled gradient, rounded to float16."""
    # float32 again: GradScaler refuses float16 .grad ("Attempting to unscale FP16 gradients.")
    return (grad * scale).half().float()


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
print(f"growth_interval by default: {torch.amp.GradScaler('cpu').get_growth_interval()}")
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
# growth_interval by default: 2000
# smallest gradient after unscaling, in every step that ran: ['1e-08']
# ```
#
# Step 3: 3.0 × 65,536 overflows, so the step is skipped and the scale halves. Step 4: 3.0
# × 32,768 = 98,304 still overflows: skipped again, halved to 16,384, where 3.0 fits. The
# two clean steps before the overflow do not count towards growth: the clean-step counter
# restarts at every overflow. Steps 5, 6, 7 are three clean steps in a row, so the scale
# doubles *after* step 7 and step 8 runs at 32,768; step 10 completes the next run of
# three, so step 11 runs at 65,536. A skipped step costs one batch; it does not corrupt
# the weights, because the inf never reaches the optimizer: on a batch that overflows,
# lesson 05b's training step leaves every weight where it was.
# And the 1e-8 gradient, lost in plain float16, comes out of every step that ran intact.

# %% [markdown]
# ## 4. 8-bit floats: a scale for every tensor
#
# NVIDIA's GPUs multiply 8-bit floats in hardware from compute capability 8.9 on (Ada;
# Hopper, the H100, is 9.0) (unverified on a GPU). PyTorch has two such formats for
# training: `float8_e4m3fn` (4 exponent bits, 3 mantissa bits; "fn": finite, it has no inf)
# and `float8_e5m2`. `torch.finfo` describes them like the others, on any machine.
#
# **Predict.** What are their largest numbers and their steps at 1.0? Store 1000, 100,000,
# inf and 1e-3 in each: what comes back? A guess for float8_e4m3fn, whose name says it has
# no inf: what can 100,000 and inf become?

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
# `torch._scaled_mm` (a private function, as its underscore says). It takes the two fp8
# tensors and, for each, the factor that brings its values back to real units: one over
# the scale it was multiplied by.
#
# **Predict.** `torch._scaled_mm` runs on the CPU too. Cast a (64, 128) tensor of small
# values and a (128, 32) one to float8_e4m3fn, each with its own scale, and multiply them:
# how close is the result to the product of the fp8 values read back in float32 and
# multiplied by their factors? And to the product of the float32 tensors themselves?

# %%
gen8 = torch.Generator().manual_seed(6)
a = torch.randn(64, 128, generator=gen8) * 1e-3  # (M, K) small values, as above
b = torch.randn(128, 32, generator=gen8)  # (K, N)
E4M3 = torch.float8_e4m3fn
back_a, back_b = a.abs().max() / 448, b.abs().max() / 448  # one over each tensor's scale
a8 = (a / back_a).to(E4M3)  # (M, K), its largest value on 448
b8 = (b / back_b).to(E4M3).t().contiguous().t()  # (K, N) column-major: required off the CPU
prod8 = torch._scaled_mm(a8, b8, scale_a=back_a, scale_b=back_b, out_dtype=torch.float32)  # (M, N)
dequantised = (a8.float() * back_a) @ (b8.float() * back_b)  # the same fp8 values, in float32
gap8 = ((prod8 - dequantised).norm() / dequantised.norm()).item()
err8 = ((prod8 - a @ b).norm() / (a @ b).norm()).item()
print(f"_scaled_mm matches the dequantised product, gap below 1e-6: {gap8 < 1e-6}")
print(f"error vs the float32 inputs below 5%: {err8 < 0.05}")

# %% [markdown]
# Output:
# ```text
# _scaled_mm matches the dequantised product, gap below 1e-6: True
# error vs the float32 inputs below 5%: True
# ```
#
# On the CPU, `_scaled_mm` gives what its arguments describe: the product of the fp8 values
# times their factors, computed in float32. It is as exact as its inputs allow, and the
# inputs are what fp8 costs: each lost its low bits to a 3-bit mantissa (2.8% for the
# tensor above), so the product is a few percent off the float32 one.

# %% [markdown]
# ## 5. Picture it: three number lines
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
# bfloat16, 11 (3.3 digits) for float16, 24 (7.2 digits) for float32, about the same
# relative precision (within a factor of 2) everywhere in each format's normal range.

# %% [markdown]
# ## Summary
#
# - float32 (8 exponent, 23 mantissa bits), float16 (5, 10) and bfloat16 (8, 7): bfloat16
#   has float32's range and little precision; float16 more precision and a range of
#   6e-8 (subnormal) to 65,504. Out of range a value becomes 0 or inf; between two numbers
#   it is rounded to the nearer one.
# - Small updates vanish in bfloat16 (1 + 10,000 × 1e-4 stays 1; at lr 1e-5, 85% of
#   weights of size 0.02 do not move), so master weights and optimizer state stay in
#   float32; only the matmuls run in 16 bits.
# - float16 needs loss scaling: multiply the loss, unscale the gradients in float32.
#   `GradScaler` starts at 2**16, skips the step and halves on inf/NaN, doubles after
#   `growth_interval` clean steps; a dozen lines reproduce its decisions exactly.
# - fp8: float8_e4m3fn (3 mantissa bits, up to 448, saturating casts in 2.13.0) and
#   float8_e5m2 (2 bits, up to 57,344); small values need a per-tensor scale from the
#   tensor's largest magnitude: loss scaling for every tensor. `torch._scaled_mm`
#   multiplies two fp8 tensors with their factors, on the CPU too.
# - On a log scale, float32 and bfloat16 cover the same 76 decades; float16's normal range
#   is 9 decades wide.

# %% [markdown]
# ## References
#
# - [`torch.amp`](https://docs.pytorch.org/docs/2.13/amp.html): automatic mixed precision,
#   with `GradScaler` and its arguments (`init_scale`, `growth_interval`, ...) as section 3
#   uses them.
# - [`torch.Tensor.to`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.to.html): the
#   cast that rounds a value to a format, overflowing or underflowing as section 1 shows.
# - [`torch.nextafter`](https://docs.pytorch.org/docs/2.13/generated/torch.nextafter.html): the
#   next number of a format, the step between neighbours.
# - [`torch.isfinite`](https://docs.pytorch.org/docs/2.13/generated/torch.isfinite.html): the
#   inf/NaN check behind every skipped step.
# - Micikevicius et al., [Mixed Precision Training](https://arxiv.org/abs/1710.03740) (2017):
#   float32 master weights and loss scaling for float16 training.
# - Kalamkar et al., [A Study of BFLOAT16 for Deep Learning Training](https://arxiv.org/abs/1905.12322)
#   (2019): bfloat16, float32's range in 16 bits.
# - Micikevicius et al., [FP8 Formats for Deep Learning](https://arxiv.org/abs/2209.05433)
#   (2022): E4M3 and E5M2, and per-tensor scaling.

# %% [markdown]
# ## Read the source
#
# Where PyTorch implements what this lesson showed. Open each file in your editor at the
# line printed: the paths are inside the torch you installed, so the line numbers are
# those of your installation. The stops follow the lesson: rounding to bfloat16 and to
# float16, the saturating cast to float8_e4m3fn, then `GradScaler`'s unscale and skip and
# its update rule (a C++ file the wheel does not ship, printed as a link at your release's
# tag).

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/include/torch/headeronly/util/BFloat16.h", "inline C10_HOST_DEVICE uint16_t round_to_nearest_even(",
     "A float32 becomes a bfloat16 by keeping its top 16 bits, after adding 0x7FFF plus the "
     "lowest kept bit: round to nearest, ties to even. The exponent bits are float32's, so "
     "the range is too; 1.001 loses its small part and comes back as 1 (section 1)."),
    ("torch/include/torch/headeronly/util/Half.h", "inline uint16_t fp16_ieee_from_fp32_value(",
     "The float16 conversion. Compiled with F16C enabled (`__F16C__`), it is one instruction, "
     "`_cvtss_sh`, rounding to nearest; otherwise float32 arithmetic does it: multiplying by "
     "2**112 sends every value past float16's range to inf, and adding a bias rounds the "
     "mantissa to 10 bits, subnormals included: section 1's 70,000 and 1e-8."),
    ("torch/include/torch/headeronly/util/Float8_e4m3fn.h", "inline C10_HOST_DEVICE uint8_t fp8e4m3fn_from_fp32_value(",
     "The cast to float8_e4m3fn: from 480 up, and for inf, the result is 0x7e, the largest "
     "finite value 448 (\"saturate to max finite value\"); NaN becomes 0x7f, the format's only "
     "NaN. This is section 4's saturation."),
    ("torch/amp/grad_scaler.py", "def unscale_(",
     "Multiplies the gradients by the reciprocal of the scale (computed in float64, except on "
     "MPS) through `_unscale_grads_`, which, called from here with `allow_fp16=False`, refuses "
     "float16 gradients, and records the stage `UNSCALED` so that `step()` does not divide "
     "again; `_maybe_opt_step` below calls `optimizer.step()` only when no inf/NaN was found, "
     "and `update()` hands the scale to `torch._amp_update_scale_`."),
    ("pytorch:aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp", "_amp_update_scale_cpu_kernel(",
     "the skip/halve/double rule on the CPU: after an inf/NaN the scale is multiplied by "
     "`backoff_factor` and the growth tracker reset to 0; otherwise the tracker counts the "
     "clean step, and when it reaches `growth_interval` the scale is multiplied by "
     "`growth_factor` (unless that would overflow) and the tracker restarts."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/include/torch/headeronly/util/BFloat16.h:«line»  `inline C10_HOST_DEVICE uint16_t round_to_nearest_even(`
#     A float32 becomes a bfloat16 by keeping its top 16 bits, after adding 0x7FFF plus
#     the lowest kept bit: round to nearest, ties to even. The exponent bits are
#     float32's, so the range is too; 1.001 loses its small part and comes back as 1
#     (section 1).
# torch/include/torch/headeronly/util/Half.h:«line»  `inline uint16_t fp16_ieee_from_fp32_value(`
#     The float16 conversion. Compiled with F16C enabled (`__F16C__`), it is one
#     instruction, `_cvtss_sh`, rounding to nearest; otherwise float32 arithmetic does it:
#     multiplying by 2**112 sends every value past float16's range to inf, and adding a
#     bias rounds the mantissa to 10 bits, subnormals included: section 1's 70,000 and
#     1e-8.
# torch/include/torch/headeronly/util/Float8_e4m3fn.h:«line»  `inline C10_HOST_DEVICE uint8_t fp8e4m3fn_from_fp32_value(`
#     The cast to float8_e4m3fn: from 480 up, and for inf, the result is 0x7e, the largest
#     finite value 448 ("saturate to max finite value"); NaN becomes 0x7f, the format's
#     only NaN. This is section 4's saturation.
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
# 2. **Predict.** A gradient of 2e-7 is stored in float16 directly, and once more after
#    multiplying it by 1024 (dividing by 1024 in float32 after reading it back). What comes
#    back each time, and why does the division cost nothing?
#
#    <details><summary>Answer</summary>
#
#    Directly it lands among float16's subnormals, which are 6e-8 apart, and comes back as
#    1.788e-07, 11% off. Times 1024 it is 2e-4, a normal float16 number with 11 significant
#    bits, and comes back as 2e-07. Dividing by a power of two only changes the exponent,
#    so it adds no error of its own (*§ Loss scaling: keeping small float16 gradients*).
#
#    </details>
#
# 3. **Predict.** `GradScaler("cpu", growth_interval=3)` starts at 65,536. A gradient of
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
# 4. **Spot the bug.** An fp8 recipe casts activations of about 1e-3 straight to
#    `float8_e4m3fn`, and clips its weights' outliers by casting them too ("the cast
#    saturates, so nothing becomes inf"). What goes wrong with each?
#
#    <details><summary>Answer</summary>
#
#    Values of 1e-3 are below e4m3's normal range (its smallest normal number is 0.0156):
#    65% of such a tensor became 0 and the error was 55.9%, against 2.8% once the tensor
#    was scaled by 448 over its largest magnitude. And saturation is silent: 1000, 100,000
#    and even inf all came back as 448, so an outlier is not clipped to a chosen value but
#    flattened onto the format's largest one, and an inf that should stop training goes
#    unnoticed (*§ 8-bit floats: a scale for every tensor*).
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
# counter after an overflow. Check it with `make exercises N=05a`: the tests replay many
# scripted gradient sequences through your scaler and through `torch.amp.GradScaler` and
# compare every decision. `solutions.py` has one way to write it.

# %% [markdown]
# # 06b · FLOPs, MFU and the three regimes
#
# Lesson 06a made timings honest. This lesson asks what they should be: how much work a
# training step does, counted in FLOPs; how fast the hardware could do it, its peak; and
# what holds a kernel below that peak. The answer sizes a GPU run before you rent the GPU,
# and tells you which fix helps a slow kernel: faster arithmetic, fewer bytes moved, or
# fewer calls. It ends with the other budget of a GPU run, its memory.
#
# **What you will learn**
#
# - FLOPs: 2·m·k·n for a matmul, 6·N per token plus attention for a transformer, and what
#   `FlopCounterMode` counts (and does not: embeddings);
# - achieved FLOP/s, this CPU's peak from its vector instructions and clock, and the model
#   FLOPs utilisation (MFU) of a training step; sizing a GPU run from a datasheet;
# - the three regimes of a kernel (compute, memory, overhead) on this CPU's roofline;
# - on a GPU: pinned memory with `non_blocking` copies, the caching allocator (allocated vs
#   reserved, `empty_cache`, expandable segments, memory snapshots), and the settings of
#   `PYTORCH_ALLOC_CONF`.
#
# **Prerequisites:** lesson 06a, which this part follows (honest timing: warm-up,
# repeats, the median, and `torch.utils.benchmark.Timer`; the MLP step it profiled), and
# lesson 05b (the 16 bytes per parameter that a mixed-precision training step keeps).
#
# **How to run:** `python lessons/06b_flops_and_regimes/flops_and_regimes.py` or `make
# lesson N=06b` from the repository root, or open `flops_and_regimes.ipynb`. It runs on the
# CPU in about fifteen seconds. Timings and rates change from run to run: the *Output*
# blocks write them as placeholders such as `«time»` and `«rate»`; everything else prints
# as shown. The GPU section says what a GPU would show (unverified on a GPU).

# %%
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch import nn
from torch.utils import benchmark
from torch.utils.flop_counter import FlopCounterMode

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: comparable timings, and one core's peak to compare with
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()


def time_runs(fn, sync=torch.cpu.synchronize, warmup=3, repeats=21):
    """Seconds per call of fn, one entry per repeat, after `warmup` untimed calls (06a § 3)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()  # start with an idle device: no earlier work inside this clock
        t0 = time.perf_counter()
        fn()
        sync()  # stop the clock when the work is done, not when it is queued
        times.append(time.perf_counter() - t0)
    return times


# The MLP that lesson 06a profiled: batch 1024, 512 -> 512 -> 10, trained with SGD
B, D, H, C = 1024, 512, 512, 10
mlp = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, C))
xb = torch.randn(B, D)  # (B, D)
yb = torch.randint(0, C, (B,))  # (B,) class labels
sgd = torch.optim.SGD(mlp.parameters(), lr=0.1)


def mlp_step():
    loss = nn.functional.cross_entropy(mlp(xb), yb)
    sgd.zero_grad()
    loss.backward()
    sgd.step()


mlp_step()  # warm-up: the first step also creates the gradient buffers


# %% [markdown]
# ## 1. FLOPs: counting what a step does
#
# A matmul of (m, k) by (k, n) does m·n dot products of length k: m·k·n multiplies and as
# many adds, so **2·m·k·n FLOPs**, or 2n³ for two n×n matrices. Divided by the measured
# time it gives the achieved FLOP/s, which you compare with the device's peak.
#
# **Predict.** `torch.utils.flop_counter.FlopCounterMode` counts the FLOPs of the ops that
# run. What does it say for a 256² matmul? And for one training step of 06a's MLP, which
# the first cell built again (batch 1024, 512 → 512 → 10)? For the step, make a guess: how
# many matmuls do the forward and the backward of one linear layer run?

# %%
with FlopCounterMode(display=False) as fc:
    torch.randn(256, 256) @ torch.randn(256, 256)
print(f"256x256 @ 256x256: counted {fc.get_total_flops():,} FLOPs, 2*n**3 = {2 * 256**3:,}")

W = D * H + H * C  # weights that take part in matmuls (biases are adds, not counted)
with FlopCounterMode(display=False) as fc:
    mlp_step()
step_flops = fc.get_total_flops()
counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
print(f"MLP step: counted {step_flops:,} FLOPs {counts}")
print(f"6 * weights * batch = {6 * W * B:,}; minus the input's gradient 2*B*D*H: "
      f"{6 * W * B - 2 * B * D * H:,}")

# %% [markdown]
# Output:
# ```text
# 256x256 @ 256x256: counted 33,554,432 FLOPs, 2*n**3 = 33,554,432
# MLP step: counted 1,105,199,104 FLOPs {'aten.addmm': 547356672, 'aten.mm': 557842432}
# 6 * weights * batch = 1,642,070,016; minus the input's gradient 2*B*D*H: 1,105,199,104
# ```
#
# The counter agrees with 2n³ exactly. For the training step, the forward pass does
# 2 FLOPs per weight per example (`addmm`); the backward does twice that, one matmul for the
# gradient of the weights and one for the gradient of the layer's input: 6 per weight per
# example in all. That is where MFU's "6 × parameters × tokens" comes from. The count here
# is lower than 6·W·B by exactly one matmul: nothing needs the gradient of the input batch
# `xb`, so autograd skips it. (Biases, activations, the loss and the optimizer are left
# out: they are a few FLOPs per element, not per weight.)
#
# **Predict.** A transformer's first layer is an embedding, with millions of parameters.
# How many FLOPs does it do? And a transformer also multiplies matrices that are not
# weights: the attention scores `q @ kᵀ` and their weighted sum of `v`. How many FLOPs do
# they cost per token, forward and backward?

# %%
emb = nn.Embedding(1000, 64)  # (vocab, d): 64,000 parameters
tokens = torch.randint(0, 1000, (4, 32))  # (B, S)
with FlopCounterMode(display=False) as fc:
    emb(tokens).square().mean().backward()
print(f"nn.Embedding(1000, 64), forward + backward: counted {fc.get_total_flops()} FLOPs")
S_A, D_A = 128, 64  # one attention head: sequence length, head width
q, k, v = (torch.randn(1, S_A, D_A, requires_grad=True) for _ in range(3))  # (1, S, d) each
with FlopCounterMode(display=False) as fc:
    (((q @ k.transpose(1, 2)) / D_A**0.5).softmax(-1) @ v).sum().backward()  # (1, S, d)
print(f"attention, S={S_A}, d={D_A}, forward + backward: counted {fc.get_total_flops():,} FLOPs "
      f"= 12*S*S*d = {12 * S_A * S_A * D_A:,}")

# %% [markdown]
# Output:
# ```text
# nn.Embedding(1000, 64), forward + backward: counted 0 FLOPs
# attention, S=128, d=64, forward + backward: counted 12,582,912 FLOPs = 12*S*S*d = 12,582,912
# ```
#
# An embedding is a gather: it copies the rows of the tokens it is given, and its
# backward adds gradients into those rows. No multiply-adds, so its parameters do not
# belong in the N of 6·N·tokens; count N as the weights that multiply (the output
# projection to the vocabulary is a real matmul and counts). Attention's two products
# cost 2·S·d FLOPs per token each in the forward pass and twice that in the backward:
# 12·S·d per token per layer, with no weights at all, and growing with the sequence. For
# a model of L layers, 6·N·tokens leaves out 12·L·d·S per token.
#
# **Predict.** For a GPT-style model with 32 layers of width 4096 (about 6.6 billion
# weights that multiply), how much does attention add to 6·N at a sequence of 2,048
# tokens? At 8,192?


# %%
def matmul_weights(layers, d, vocab):
    """Weights a GPT-style model multiplies by: per layer 4*d*d in attention's projections
    and 8*d*d in a 4d-wide MLP; plus the d x vocab output head (the input embedding is a gather)."""
    return 12 * layers * d * d + d * vocab


def train_flops_per_token(layers, d, vocab, seq):
    """(6 * matmul weights, attention's 12 * layers * d * seq): forward and backward, per token."""
    return 6 * matmul_weights(layers, d, vocab), 12 * layers * d * seq


L_GPT, D_GPT, V_GPT = 32, 4096, 50_304
print(f"L={L_GPT}, d={D_GPT}, vocabulary {V_GPT:,}: N = {matmul_weights(L_GPT, D_GPT, V_GPT):,}")
for seq in (2_048, 8_192):
    dense, attn = train_flops_per_token(L_GPT, D_GPT, V_GPT, seq)
    print(f"S={seq:,}: 6N = {dense:.3e}, attention {attn:.3e} FLOPs per token: +{attn / dense:.1%}")

# %% [markdown]
# Output:
# ```text
# L=32, d=4096, vocabulary 50,304: N = 6,648,496,128
# S=2,048: 6N = 3.989e+10, attention 3.221e+09 FLOPs per token: +8.1%
# S=8,192: 6N = 3.989e+10, attention 1.288e+10 FLOPs per token: +32.3%
# ```
#
# At 2,048 tokens 6·N·tokens misses 8% of the work; at 8,192, a third. Long-context
# training is where the shortcut fails, so an honest MFU counts attention too (a causal
# kernel that skips the masked half of the scores does about half of the 12·L·d·S; state
# which convention you use). Kaplan et al. count half of it, 2·L·S·d per token in the
# forward pass, where the two products make 4·L·S·d; PaLM's MFU counts the full 12·L·d·S.

# %% [markdown]
# ## 2. Achieved FLOP/s, this CPU's peak, and MFU
#
# **Predict.** Make a guess: how close to its peak does one CPU core get on a matmul, and
# does the matrix size matter?


# %%
def gflops(n):
    """(median seconds, achieved GFLOP/s) of an n x n matmul on this CPU, one thread."""
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    t = benchmark.Timer("torch.mm(a, b, out=c)", globals={"torch": torch, "a": a, "b": b, "c": c})
    sec = t.blocked_autorange(min_run_time=0.1).median
    return sec, 2 * n**3 / sec / 1e9


sizes = [16, 32, 64, 128, 256, 512, 1024]
rates, secs = {}, {}
for n in sizes:
    secs[n], rates[n] = gflops(n)
    print(f"n {n:>4}: {2 * n**3:>13,} FLOPs, median {secs[n] * 1e3:.4f} ms, {rates[n]:.1f} GFLOP/s")

# %% [markdown]
# Output:
# ```text
# n   16:         8,192 FLOPs, median «time» ms, «rate» GFLOP/s
# n   32:        65,536 FLOPs, median «time» ms, «rate» GFLOP/s
# n   64:       524,288 FLOPs, median «time» ms, «rate» GFLOP/s
# n  128:     4,194,304 FLOPs, median «time» ms, «rate» GFLOP/s
# n  256:    33,554,432 FLOPs, median «time» ms, «rate» GFLOP/s
# n  512:   268,435,456 FLOPs, median «time» ms, «rate» GFLOP/s
# n 1024: 2,147,483,648 FLOPs, median «time» ms, «rate» GFLOP/s
# ```
#
# The rate climbs with the size and then levels off. A small matmul cannot reach the
# plateau: the time of a call includes a fixed cost (Python, the dispatcher, the BLAS
# library's setup: microseconds) that 8,192 FLOPs do not amortise. On a GPU that fixed
# cost (the launch) is larger and the peak far higher, so small matmuls use an even
# smaller share of it. When another job shares the core, points drop; the figure shows
# whichever run you made.


# %%
def plot_rates(rates):
    """Achieved GFLOP/s against matrix size, one measured point per size."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ns = sorted(rates)
    ax.plot(ns, [rates[n] for n in ns], "o-", label="torch.mm, fp32, 1 thread")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("matrix size n (n x n @ n x n)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title("Matmul throughput on this CPU")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    return fig


fig = plot_rates(rates)
fig.savefig(HERE / "gflops_vs_size.png", dpi=100)
print("saved gflops_vs_size.png")

# %% [markdown]
# Output:
# ```text
# saved gflops_vs_size.png
# ```
#
# Where is the plateau relative to what the core could do? A core's peak is
# *cores × FLOPs per cycle × cycles per second*, and FLOPs per cycle come from its vector
# instructions: each fp32 lane of a fused multiply-add (FMA) does 2 FLOPs, and recent x86
# cores have 2 FMA units (Intel since Haswell, AMD since Zen 2); without AVX, SSE has 4
# lanes and separate multiply and add units.
#
# **Predict.** Which vector ISA does PyTorch use on your CPU, and what peak follows?


# %%
FLOPS_PER_CYCLE = {  # fp32, one core: (lanes per vector, FLOPs per lane per cycle)
    "DEFAULT": (4, 2),  # no AVX: SSE, 4 lanes, one multiply and one add unit
    "AVX2": (8, 4),  # 8 lanes, 2 FMA units of 2 FLOPs each
    "AVX512": (16, 4),  # 16 lanes, 2 FMA units
}


def clock_ghz():
    """(GHz, where it was read): cpufreq's maximum, else /proc/cpuinfo's clock, else 3.0 assumed."""
    cpufreq = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")  # kHz, bare metal
    if cpufreq.is_file():
        return int(cpufreq.read_text()) / 1e6, str(cpufreq)
    cpuinfo = Path("/proc/cpuinfo")  # "cpu MHz": in a VM, usually the base clock
    mhz = [float(line.split(":")[1]) for line in cpuinfo.read_text().splitlines()
           if line.startswith("cpu MHz")] if cpuinfo.is_file() else []
    return (max(mhz) / 1e3, str(cpuinfo)) if mhz else (3.0, "assumed")


def peak_flops(capability, ghz, threads):
    """fp32 FLOP/s of `threads` cores: lanes x FLOPs per lane per cycle x clock."""
    lanes, per_lane = FLOPS_PER_CYCLE.get(capability, FLOPS_PER_CYCLE["DEFAULT"])
    return threads * lanes * per_lane * ghz * 1e9


for isa, (lanes, per_lane) in FLOPS_PER_CYCLE.items():
    print(f"{isa:<8} {lanes:2d} lanes x {per_lane} FLOPs = {lanes * per_lane:2d} FLOPs per cycle")
capability, threads = torch.backends.cpu.get_cpu_capability(), torch.get_num_threads()
ghz, source = clock_ghz()
peak = peak_flops(capability, ghz, threads)
print(f"this CPU: {peak_flops(capability, 1, 1) / 1e9:.0f} FLOPs per cycle, {ghz:.2f} GHz ({source})")
print(f"{os.cpu_count()} logical CPUs, {threads} thread used: peak {peak / 1e9:.1f} GFLOP/s")
print(f"1024x1024 matmul: {rates[1024]:.1f} GFLOP/s = {rates[1024] * 1e9 / peak:.0%} of that peak")

# %% [markdown]
# Output:
# ```text
# DEFAULT   4 lanes x 2 FLOPs =  8 FLOPs per cycle
# AVX2      8 lanes x 4 FLOPs = 32 FLOPs per cycle
# AVX512   16 lanes x 4 FLOPs = 64 FLOPs per cycle
# this CPU: «number» FLOPs per cycle, «number» GHz («path»)
# «number» logical CPUs, 1 thread used: peak «rate» GFLOP/s
# 1024x1024 matmul: «rate» GFLOP/s = «number»% of that peak
# ```
#
# `torch.backends.cpu.get_cpu_capability()` names the vector ISA PyTorch's own kernels use
# ("AVX512", "AVX2" or "DEFAULT" on x86). The clock is the least certain part. Linux on
# real hardware reports the maximum (turbo) clock in `cpufreq`, and that is what we use:
# it makes the peak an upper bound. A virtual machine usually has no `cpufreq` and
# `/proc/cpuinfo` shows its base clock, which a busy core may exceed; elsewhere (macOS,
# Windows) we assume 3.0 GHz. The parenthesis says which one you got. The table is an
# estimate too: the BLAS library picks its own kernels, which need not match the ISA
# PyTorch reports, and some cores run AVX-512 at half the table's rate (one 512-bit FMA
# unit, or two 256-bit halves). So read the percentage as "about": a value above 100%
# means the estimate, not the matmul, is wrong. A large matmul shows about the best a
# core does with this BLAS.
#
# Model FLOPs utilisation (MFU) is achieved FLOP/s of the *model's* FLOPs divided by that
# peak. Here it is for the MLP step of section 1 (the one 06a profiled), with the FLOPs the
# counter gave. Most of those FLOPs are in two products of 1024 × 512 × 512 multiply-adds
# (the first layer's forward and its weight gradient); we time them alone too, in turn
# with the step, so that both see the same machine. The timing loop is 06a's `time_runs`
# (warm-up calls, then each call between two synchronizes), defined again in the first
# cell.
#
# **Predict.** Does the step reach the FLOP rate of its two large products run alone?

# %%
w1 = mlp[0].weight.detach()  # (H, D), the first layer's weight (updated in place by SGD)
h1, gw1, g1 = torch.empty(B, H), torch.empty(H, D), torch.randn(B, H)  # outputs; a gradient


def big_products():
    """The step's two large matmuls alone: layer 1's forward and its weight gradient."""
    torch.addmm(mlp[0].bias.detach(), xb, w1.t(), out=h1)  # (B, D) @ (D, H)
    torch.mm(g1.t(), xb, out=gw1)  # (H, B) @ (B, D)


step_times, big_times = [], []
for _ in range(11):  # in pairs, one right after the other: both see the same machine
    step_times += time_runs(mlp_step, warmup=1, repeats=1)
    big_times += time_runs(big_products, warmup=1, repeats=1)
step_s, products_s = statistics.median(step_times), statistics.median(big_times)  # seconds
step_rate, products_rate = step_flops / step_s, 2 * 2 * B * D * H / products_s  # FLOP/s
pair_ratio = statistics.median(  # the step's rate over the products', pair by pair
    (step_flops / st) / (2 * 2 * B * D * H / bt) for st, bt in zip(step_times, big_times))
print(f"MLP step: {step_flops:,} FLOPs in {step_s * 1e3:.2f} ms (median of 11) "
      f"= {step_rate / 1e9:.1f} GFLOP/s")
print(f"its two large products alone: {products_rate / 1e9:.1f} GFLOP/s; "
      f"step / products, median of the 11 pairs {pair_ratio:.2f}")
print(f"share of the step's FLOPs in those two: {2 * 2 * B * D * H / step_flops:.0%}")
print(f"MFU = {step_rate / 1e9:.1f} / {peak / 1e9:.1f} GFLOP/s = {step_rate / peak:.0%}")

# %% [markdown]
# Output:
# ```text
# MLP step: 1,105,199,104 FLOPs in «time» ms (median of 11) = «rate» GFLOP/s
# its two large products alone: «rate» GFLOP/s; step / products, median of the 11 pairs «ratio»
# share of the step's FLOPs in those two: 97%
# MFU = «rate» / «rate» GFLOP/s = «number»%
# ```
#
# No: pair by pair, the step runs at a lower rate than its two large products (the ratio
# printed above; noise can bring one run close to 1). They hold 97% of its counted FLOPs,
# but the step also runs three thin products (one side of 10) and the bias adds, ReLU,
# loss and SGD update, which take time for few or no counted FLOPs.
# That gap is what MFU measures in a real run too, where the usual thieves are waiting for
# data, for communication, for the host (06a's hidden synchronisations), or many small
# kernels.
#
# The same arithmetic sizes a GPU run. NVIDIA's datasheet gives the H200 SXM "141 GB" of
# memory and about 989 TFLOP/s of dense bf16 matmul (the larger figure there assumes 2:4
# sparsity; the H200 NVL, a PCIe card, has lower peaks: name the part). The cell assumes
# the datasheet's "141 GB" means GiB, 151 · 10⁹ bytes (unverified on a GPU; the memory a
# program can use is a little less). Before asking how fast a model trains on one, check
# that it fits: lesson 05b counted 16 bytes per parameter for weights, gradients and AdamW's
# state in mixed-precision training, before any activation.
#
# **Predict.** Does an 8-billion-parameter model train on one H200 SXM this way? What MFU
# does a 1-billion-parameter model (16 layers of width 2,048, sequences of 2,048 tokens)
# have if it trains at 60,000 tokens per second?


# %%
def mfu(flops_per_token, tokens_per_s, peak_flops):
    """Model FLOPs utilisation: the model's FLOPs per second over the device's peak."""
    return flops_per_token * tokens_per_s / peak_flops


# NVIDIA H200 SXM datasheet: "141 GB" (read as GiB) and dense bf16
H200_BYTES, H200_BF16 = 141 * 2**30, 989e12  # bytes, FLOP/s
print(f"H200 SXM: {H200_BYTES / 2**30:.0f} GiB = {H200_BYTES / 1e9:.1f} GB, dense bf16 {H200_BF16 / 1e12:.0f} TFLOP/s")
print(f"8e9 parameters: 16 B x 8e9 = {16 * 8e9 / 1e9:.0f} GB = {16 * 8e9 / H200_BYTES:.0%} of an H200")
L1, D1, V1, S1, TOKENS_PER_S = 16, 2048, 50_304, 2_048, 60_000
params = matmul_weights(L1, D1, V1) + V1 * D1  # + the input embedding (untied)
dense, attn = train_flops_per_token(L1, D1, V1, S1)
print(f"L={L1}, d={D1}: {params:,} parameters, 16 B each = {16 * params / 1e9:.1f} GB "
      f"= {16 * params / H200_BYTES:.0%} of an H200")
print(f"per token at S={S1:,}: 6N {dense:.3e} + attention {attn:.3e} = {dense + attn:.3e} FLOPs")
print(f"at {TOKENS_PER_S:,} tokens/s: {(dense + attn) * TOKENS_PER_S / 1e12:.0f} TFLOP/s, "
      f"MFU {mfu(dense + attn, TOKENS_PER_S, H200_BF16):.1%}")
print(f"at 50% MFU: {0.5 * H200_BF16 / (dense + attn):,.0f} tokens/s")

# %% [markdown]
# Output:
# ```text
# H200 SXM: 141 GiB = 151.4 GB, dense bf16 989 TFLOP/s
# 8e9 parameters: 16 B x 8e9 = 128 GB = 85% of an H200
# L=16, d=2048: 1,011,351,552 parameters, 16 B each = 16.2 GB = 11% of an H200
# per token at S=2,048: 6N 5.450e+09 + attention 8.053e+08 = 6.255e+09 FLOPs
# at 60,000 tokens/s: 375 TFLOP/s, MFU 37.9%
# at 50% MFU: 79,053 tokens/s
# ```
#
# An 8-billion-parameter model needs 128 GB for its training state alone, 85% of the H200,
# with activations still to come: it does not train on one H200 this way. Shard its state
# across several GPUs (lesson 11a's FSDP2), offload part of it to the host, or use an
# optimizer that keeps less. The 1-billion-parameter model fits with room for activations,
# and 60,000 tokens/s would be an MFU of 38%; a low MFU usually means the GPU waits (for
# data, for communication, for the host). MFU counts only the model's FLOPs: recomputation
# (activation checkpointing) makes the GPU do more work without raising MFU. The peak must
# match the dtype: fp32 matmuls have a much lower one.

# %% [markdown]
# ## 3. Three regimes: compute, memory, overhead
#
# Every kernel spends its time in one of three ways. It computes (its FLOPs at the
# core's peak: large matmuls); it waits for memory (a few FLOPs per byte it must read and
# write: elementwise ops); or it pays fixed costs that have nothing to do with its data
# (Python, dispatch, a launch: tiny ops). Which one a kernel is in decides what speeds it
# up: faster arithmetic (lower precision, tensor cores), fewer bytes (fusion, lesson 08b),
# or fewer calls (batching, CUDA graphs, compilation).
#
# The *roofline* draws the first two. A kernel's *arithmetic intensity* is its FLOPs per
# byte of memory traffic. A core that streams B bytes/s from memory cannot do more than
# B × intensity FLOP/s, and never more than its peak: the roof is min(peak, B × intensity),
# a slope that meets a flat ceiling at the *ridge point* peak / B. Overhead does not show
# on the roof: it is a kernel sitting far below it.
#
# We need the bandwidth. Copying a 64 MiB tensor into another reads and writes each byte
# once: 128 MiB of traffic, more than the last-level cache of most CPUs holds, so the
# bytes come from memory. The first line prints your CPU's largest cache (0 where Linux's
# sysfs is not there to say): a server's last-level cache can exceed 128 MiB, but one core
# rarely gets that much of it; if a copy 4× larger is clearly slower, your bytes came from
# cache.
#
# The elementwise chain `((x * 1.5 + 0.5).relu() - 0.25) * 2` runs as 5 eager ops, each
# reading one 64 MiB tensor and writing another: 1 FLOP per 8 bytes. A 1×1 matmul does
# almost nothing, so its time is the fixed cost of a call. Each kernel's time is its
# fastest run here: the fastest is the one least disturbed by whatever else the machine
# does.
#
# **Predict.** Where do the 1024² matmul, the chain and the 16² matmul sit against the
# roof? Which regime is each in?

# %%
ELEMS = 4096 * 4096  # 16M floats, 64 MiB per tensor
xe = torch.randn(ELEMS)  # (ELEMS,)
ye, ze = torch.empty_like(xe), torch.empty_like(xe)  # preallocated outputs: no page faults


def chain():
    """((x * 1.5 + 0.5).relu() - 0.25) * 2, one eager op at a time, 5 FLOPs per element."""
    torch.mul(xe, 1.5, out=ye)
    torch.add(ye, 0.5, out=ze)
    torch.clamp_min(ze, 0.0, out=ye)  # relu
    torch.sub(ye, 0.25, out=ze)
    torch.mul(ze, 2.0, out=ye)


def small_mm_time(n, number=200):
    """Seconds per call of an n x n matmul, over a block of `number` calls."""
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    t = benchmark.Timer("torch.mm(a, b, out=c)", globals={"torch": torch, "a": a, "b": b, "c": c})
    return t.timeit(number).median


copies, chains = [], []
for _ in range(7):  # in turn, the fastest of each: the copy and the chain see the same machine
    copies += time_runs(lambda: ye.copy_(xe), warmup=1, repeats=1)
    chains += time_runs(chain, warmup=1, repeats=1)
copy_s, chain_s = min(copies), min(chains)
bandwidth = 2 * 4 * ELEMS / copy_s  # bytes/s: read and write every float once
a1, b1, c1 = torch.randn(1024, 1024), torch.randn(1024, 1024), torch.empty(1024, 1024)
big_s = min(time_runs(lambda: torch.mm(a1, b1, out=c1), warmup=1, repeats=7))
small = {1: [], 16: []}  # a 1x1 matmul (the fixed cost of a call) and the 16² one
for _ in range(7):  # interleaved, the fastest block of each: both see the same machine
    for k in small:
        small[k].append(small_mm_time(k))
call_s, tiny_s = min(small[1]), min(small[16])
ridge = peak / bandwidth  # FLOP/byte where the slope meets the ceiling
points = {  # name: (FLOPs, bytes moved at least, seconds)
    "1024² matmul": (2 * 1024**3, 3 * 4 * 1024**2, big_s),
    "elementwise chain": (5 * ELEMS, 5 * 2 * 4 * ELEMS, chain_s),
    "16² matmul": (2 * 16**3, 3 * 4 * 16**2, tiny_s),
}


def largest_cache_mib():
    """CPU 0's largest cache in MiB, from Linux's sysfs; 0 where the system does not say."""
    sizes = [p.read_text().strip() for p in
             Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size")]
    kib = [int(v[:-1]) for v in sizes if v.endswith("K") and v[:-1].isdigit()]
    return max(kib) // 1024 if kib else 0


def regime(flops, nbytes, seconds):
    if seconds < 3 * call_s:  # hardly longer than a call that does nothing
        return "overhead"
    return "compute" if flops / nbytes > ridge else "memory"


print(f"largest cache {largest_cache_mib()} MiB; copy of 64 MiB: {bandwidth / 1e9:.1f} GB/s")
print(f"peak {peak / 1e9:.1f} GFLOP/s; ridge {ridge:.2f} FLOP/byte; 1x1 matmul {call_s * 1e6:.2f} us")
for name, (flops, nbytes, seconds) in points.items():
    intensity, rate = flops / nbytes, flops / seconds
    roof = min(peak, bandwidth * intensity)
    print(f"{name:<18} {intensity:8.3f} FLOP/byte, {rate / 1e9:.2f} GFLOP/s = "
          f"{rate / roof:.0%} of the roof: {regime(flops, nbytes, seconds)}")

# %% [markdown]
# Output:
# ```text
# largest cache «number» MiB; copy of 64 MiB: «rate» GB/s
# peak «rate» GFLOP/s; ridge «number» FLOP/byte; 1x1 matmul «time» us
# 1024² matmul        170.667 FLOP/byte, «rate» GFLOP/s = «number»% of the roof: compute
# elementwise chain     0.125 FLOP/byte, «rate» GFLOP/s = «number»% of the roof: memory
# 16² matmul            2.667 FLOP/byte, «rate» GFLOP/s = «number»% of the roof: overhead
# ```
#
# The intensities count the bytes each kernel must move at least, so they are exact: a
# 1024² matmul reads two matrices and writes one (12 MiB) for 2 GFLOPs, 170 FLOPs per
# byte, far right of the ridge point. Its roof is the flat peak: it reaches about the
# share of the (estimated) peak that section 2 measured, often more (this is its fastest
# run, section 2's the median), while its bytes would allow 170 times the bandwidth, far
# more; arithmetic limits it. The chain does 1 FLOP per 8 bytes, far left:
# it runs near the slope (within a factor of 5 of it), limited by memory,
# whatever the core's peak. The 16² matmul has a middling intensity, but 8,192 FLOPs take
# less than 3 times as long as a 1×1 matmul: its time is the call, not the arithmetic or
# the bytes, and it sits far below both roofs (under half of either).
# (The code names the regime from the kernel's intensity against the ridge, and
# "overhead" from its time against a 1×1 call; the percentages are what your machine
# measured.)

# %%
def plot_roofline(peak, bandwidth, points):
    """Log-log roofline: min(peak, bandwidth x intensity), and each measured kernel on it."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    grid = [10 ** (k / 20) for k in range(-60, 61)]  # 1e-3 .. 1e3 FLOP/byte
    ax.plot(grid, [min(peak, bandwidth * i) / 1e9 for i in grid], color="black",
            label="roof: min(peak, bandwidth x intensity)")
    for (name, (flops, nbytes, seconds)), marker in zip(points.items(), "os^"):
        ax.scatter([flops / nbytes], [flops / seconds / 1e9], marker=marker, s=50, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("Roofline of this CPU, fp32, 1 thread")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


fig_roof = plot_roofline(peak, bandwidth, points)
fig_roof.savefig(HERE / "roofline.png", dpi=100)
print("saved roofline.png")

# %% [markdown]
# Output:
# ```text
# saved roofline.png
# ```
#
# Each regime has its own fix. The matmul is at the roof: only a higher roof helps (more
# cores, wider vectors, lower precision on hardware that has it, a GPU). The chain is on
# the slope: fewer bytes help, by fusing the five ops into one pass that reads `x` once
# and writes the result once (lesson 08b compiles exactly this chain). The 16² matmul is in
# the basement: batch many small products into one call, or remove the per-call cost
# (CUDA graphs, compilation). On a GPU the same picture holds with a roof hundreds of times
# higher, and a launch of a few microseconds puts many more kernels in the basement.

# %% [markdown]
# ## 4. Memory on a GPU: pinned copies and the caching allocator
#
# Two mechanisms decide how fast data reaches a GPU and how much memory a run appears to
# take. Both need a GPU to show (unverified on a GPU).
#
# **Pinned memory.** An ordinary host tensor lives in *pageable* memory, which the
# operating system may move or swap. A GPU's copy engine reads host memory directly, so it
# needs memory that stays put: *page-locked*, or pinned. From pageable memory CUDA first
# copies into a pinned staging buffer of its own, and the host waits for that. From pinned
# memory, `x.to("cuda", non_blocking=True)` only queues the copy and returns, so the host
# can prepare the next batch while the copy runs (`DataLoader(pin_memory=True)`, lesson
# 04b, hands out batches already pinned). The same holds the other way, with a catch: after
# `y.to("cpu", non_blocking=True)` into pinned memory the values are there only after a
# synchronize.
#
# **Predict.** Is an ordinary CPU tensor pinned?

# %%
print(f"torch.randn(4).is_pinned(): {torch.randn(4).is_pinned()}")

# %% [markdown]
# Output:
# ```text
# torch.randn(4).is_pinned(): False
# ```
#
# Pinning is explicit (`x.pin_memory()`, `torch.empty(..., pin_memory=True)`), and it
# needs an accelerator: on a machine without one, `pin_memory()` raises. Pinned memory
# cannot be paged out, so it comes out of what the whole machine has: pin the buffers you
# copy from, not everything. For a copy of 256 MiB, a non-blocking copy from pinned memory
# returns long before the copy is done, while one from pageable memory keeps the host
# waiting for most of it.
#
# **The caching allocator.** Asking CUDA for memory (`cudaMalloc`) costs far more than a
# kernel launch, and giving it back (`cudaFree`) waits for the whole device, so PyTorch
# asks CUDA for large *segments* and hands out blocks from them itself. A freed tensor's
# block goes back to PyTorch's cache, not to CUDA: `torch.cuda.memory_allocated()` (bytes
# in live tensors) drops, while `torch.cuda.memory_reserved()` (bytes held from CUDA;
# `nvidia-smi` shows that plus the CUDA context) stays. The next tensor of that size reuses
# the block, much faster than the first one got it. `torch.cuda.empty_cache()` returns
# unused segments to CUDA; it does not free a live tensor, and a training loop rarely
# needs it. So for a 256 MiB tensor made, deleted, made again and deleted: allocated
# rises by 256 MiB and falls back each time; reserved rises once and stays, until
# `empty_cache()` after the last delete gives the segment back.
#
# A cache can fragment: a freed 512 MiB block cannot hold a 520 MiB tensor, so the
# allocator asks CUDA for a new 520 MiB segment and holds both.
# `PYTORCH_ALLOC_CONF=expandable_segments:True`, set before the first CUDA call, makes
# segments that grow by mapping more memory at their end instead, and the same pattern
# reserves far less (about 520 MiB instead of 1,032, unverified on a GPU). And when memory
# runs out, a *memory snapshot* tells you what held it:
# `torch.cuda.memory._record_memory_history()` starts recording every allocation with its
# Python stack, `torch.cuda.memory._snapshot()` returns the segments, blocks and recorded
# events, and `torch.cuda.memory._dump_snapshot(path)` writes a file that
# <https://pytorch.org/memory_viz> draws as a timeline, each block with the Python line
# that allocated it.
#
# ### The allocator's settings
#
# `expandable_segments` is one of several settings. The allocator reads them once, from an
# environment variable that holds `key:value` pairs separated by commas. Its name is
# `PYTORCH_ALLOC_CONF`, shared by all accelerators; the older `PYTORCH_CUDA_ALLOC_CONF` is
# still read. `max_split_size_mb`, `roundup_power2_divisions` and
# `garbage_collection_threshold` are three more (*Going further*, after the Summary, says
# what each one does).
#
# **Predict.** Make a guess: an old job script exports `PYTORCH_CUDA_ALLOC_CONF`, a new one
# exports `PYTORCH_ALLOC_CONF`, and a process inherits both, with different values. Which
# one does PyTorch use? And is a value it cannot accept ignored, or refused? The CPU build
# parses the same settings, so a fresh Python process can show both.

# %%
PROBE = """
import torch
print(torch._C._accelerator_getAllocatorSettings())  # the settings string it parsed
for setting in {settings!r}:
    try:
        torch._C._accelerator_setAllocatorSettings(setting)  # parse a new settings string
        print(f"{{setting}}: accepted")
    except ValueError as err:
        print(f"{{setting}}: refused: {{str(err).splitlines()[0].strip()}}")
"""
CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def allocator_settings(*cases):
    """For each (variables, settings strings): the lines printed by a fresh Python that starts
    with those variables set and then tries each settings string in turn. The processes run
    side by side."""
    runs = []
    for conf, settings in cases:
        env = {k: v for k, v in os.environ.items() if k not in CONF_VARIABLES} | conf
        runs.append(subprocess.Popen([sys.executable, "-c", PROBE.format(settings=tuple(settings))],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    try:
        for run in runs:
            out, err = run.communicate(timeout=120)
            if run.returncode != 0:
                raise RuntimeError(err)
            outputs.append(out.splitlines())
    finally:
        for run in runs:  # none outlives the cell, even after an error
            if run.poll() is None:
                run.kill()
                run.wait()
    return outputs


new_only, both = allocator_settings(
    ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:512"},
     ["max_split_size_mb:10", "garbage_collection_threshold:1.5", "roundup_power2_divisions:3",
      "expandable_segments:true",
      "max_split_size_mb:256,roundup_power2_divisions:[256:1,>:4],expandable_segments:True"]),
    ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:512", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}, []))
print(f"PYTORCH_ALLOC_CONF alone: the allocator reads {new_only[0]}")
print(f"both set (512 in the new name, 128 in the old): it reads {both[0]}")
for line in new_only[1:]:
    print(line)

# %% [markdown]
# Output:
# ```text
# PYTORCH_ALLOC_CONF alone: the allocator reads max_split_size_mb:512
# both set (512 in the new name, 128 in the old): it reads max_split_size_mb:128
# max_split_size_mb:10: refused: CachingAllocator option max_split_size_mb too small, must be >= 20
# garbage_collection_threshold:1.5: refused: garbage_collect_threshold is invalid, set it in (0.0, 1.0)
# roundup_power2_divisions:3: refused: For roundups, the divisions has to be power of 2
# expandable_segments:true: refused: Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'
# max_split_size_mb:256,roundup_power2_divisions:[256:1,>:4],expandable_segments:True: accepted
# ```
#
# With both variables set, PyTorch 2.13 reads `PYTORCH_CUDA_ALLOC_CONF` and ignores the
# newer name (the comment in `AllocatorConfig.h` calls the old name the lower priority; in
# `CUDAAllocatorConfig.h`, the code reads it first): set one, and unset the other. A value
# out of range is refused with a `ValueError`, not ignored, and the check is
# case-sensitive: `true` is refused where `True` is accepted. These strings are
# parsed with a private function, `torch._C._accelerator_setAllocatorSettings`, which
# `torch/cuda/memory.py` names as the replacement of the deprecated
# `torch.cuda.memory._set_allocator_settings`; in your own jobs, set the variable.

# %% [markdown]
# ## Summary
#
# - A matmul costs 2·m·k·n FLOPs; a training step 6 FLOPs per weight that multiplies
#   (embeddings are gathers, 0 FLOPs) per token, minus the input gradient nobody needs,
#   plus attention's 12·L·d·S, which 6·N leaves out (a third at S = 8,192 for a
#   4096-wide model).
# - A CPU core's peak is lanes × FLOPs per lane × clock (an estimate); the MLP step runs
#   no faster than its own two large products alone (timed pair by pair). MFU = model
#   FLOPs per second ÷ peak; check first that the training state (16 bytes per parameter)
#   fits: an 8-billion-parameter model needs 85% of an H200 before any activation.
# - Three regimes: compute-bound (large matmuls, at the flat roof), memory-bound
#   (elementwise chains, on the bandwidth slope), overhead-bound (tiny ops, far below
#   both). The roofline, min(peak, bandwidth × FLOPs per byte), tells the first two apart;
#   a comparison with an empty call finds the third.
# - On a GPU, copy from pinned memory with `non_blocking=True` to overlap copies with host
#   work; `memory_reserved` (what the caching allocator holds) exceeds `memory_allocated`
#   (live tensors); `expandable_segments` curbs fragmentation; a memory snapshot says who
#   held what. `PYTORCH_ALLOC_CONF` holds the allocator's settings; an old
#   `PYTORCH_CUDA_ALLOC_CONF` beside it wins, and a bad value is refused, not ignored.

# %% [markdown]
# ## Going further
#
# ### The allocator's settings, one by one
#
# What each setting of section 4 does, read from `torch/include/c10/core/AllocatorConfig.h`
# and `torch/include/c10/cuda/CUDAAllocatorConfig.h` in your installation:
#
# | setting | what it changes | when it helps |
# |---|---|---|
# | `max_split_size_mb:N` | blocks larger than N MiB are never split for a smaller request (default: any block may be) | an out-of-memory error while much is reserved but not allocated: large blocks cut into pieces that no later request fits |
# | `roundup_power2_divisions:K` | rounds each request up to one of K sizes between two powers of two, per size range from 1 MiB to 64 GiB (`[256:1,>:4]`) | many tensors of slightly different sizes, such as batches of varying sequence length |
# | `garbage_collection_threshold:F` | frees cached blocks that no tensor uses once the memory in use passes the fraction F of what the process may use (default 0: never) | a cache that grows until an allocation fails |
# | `expandable_segments:True` | segments that grow, instead of a new segment for each miss | sizes that change from step to step |
# | `backend:cudaMallocAsync` | CUDA's own stream-ordered allocator replaces PyTorch's cache | see below |
#
# `cudaMallocAsync` gives things up: the native allocator's settings above, most of
# `torch.cuda.memory_stats()` ("some stats are not meaningful, and are always reported as
# zero", read from `torch/cuda/memory.py`), and memory snapshots, since it does not track
# individual blocks (unverified on a GPU). CUDA graphs (recorded kernels replayed with the
# same addresses) take their memory from a private pool of the allocator; whether a CUDA
# graph's pool uses expandable segments depends on the release (unverified on a GPU).

# %% [markdown]
# ## References
#
# - [`torch.backends.cpu.get_cpu_capability`](https://docs.pytorch.org/docs/2.13/backends.html#torch.backends.cpu.get_cpu_capability):
#   the vector instructions behind section 2's peak.
# - [`torch.cuda.memory_allocated`](https://docs.pytorch.org/docs/2.13/generated/torch.cuda.memory_allocated.html),
#   [`torch.cuda.memory_reserved`](https://docs.pytorch.org/docs/2.13/generated/torch.cuda.memory_reserved.html) and
#   [`torch.cuda.empty_cache`](https://docs.pytorch.org/docs/2.13/generated/torch.cuda.empty_cache.html): the caching
#   allocator's two counters and its release.
# - [`torch.cuda.memory_stats`](https://docs.pytorch.org/docs/2.13/generated/torch.cuda.memory_stats.html) and
#   [`torch.cuda.get_allocator_backend`](https://docs.pytorch.org/docs/2.13/generated/torch.cuda.get_allocator_backend.html):
#   everything the allocator counts, and which allocator runs.
# - [`torch.Tensor.pin_memory`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.pin_memory.html): page-locked
#   host memory for copies that do not make the host wait.
# - Kaplan et al., [Scaling Laws for Neural Language Models](https://arxiv.org/abs/2001.08361)
#   (2020): the 6·N FLOPs per token of training, and the attention term beside it (its
#   Table 1).
# - Chowdhery et al., [PaLM: Scaling Language Modeling with Pathways](https://arxiv.org/abs/2204.02311)
#   (2022): where model FLOPs utilisation is defined (its appendix B).
# - Narayanan et al., [Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM](https://arxiv.org/abs/2104.04473)
#   (2021): the FLOPs of a transformer step, attention and the vocabulary included.

# %% [markdown]
# ## Read the source
#
# Open these files in your editor: each path is relative to the folder that holds your
# installed `torch` (your site-packages), and the line numbers are those of your
# installation. The stops follow the lesson: the FLOP counter, the vector ISA, the counters
# of the CUDA caching allocator, and where its settings are read.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/utils/flop_counter.py", "def mm_flop(",
     "`m * n * 2 * k`, section 1's 2·m·k·n, registered for `aten.mm`; `addmm_flop` reuses it, "
     "so a bias add counts nothing. `FlopCounterMode._count_flops` adds a count only for an op "
     "with a formula in `flop_registry`, and `_FlopCounterMode.__torch_dispatch__` first "
     "decomposes an op without one, where it can: nothing the embedding runs has one, so it "
     "counts 0."),
    ("torch/backends/cpu/__init__.py", "def get_cpu_capability(",
     "The name of the vector instruction set PyTorch's own CPU kernels were dispatched to "
     "(`DEFAULT`, `AVX2`, `AVX512`, ...), the lanes of section 2's peak."),
    ("torch/cuda/memory.py", "def memory_reserved(",
     "It reads `reserved_bytes.all.current` from the caching allocator's `memory_stats()`, "
     "where `memory_allocated`, two functions above, reads `allocated_bytes.all.current`: bytes held "
     "from CUDA against bytes in live tensors. `empty_cache`, near the top of the file, "
     "releases the cached memory that no tensor occupies."),
    ("torch/include/c10/core/AllocatorConfig.h", "class C10_API AcceleratorAllocatorConfig {",
     "The settings every accelerator's allocator shares, each with its meaning and default: "
     "`max_split_size`, `roundup_power2_divisions`, `garbage_collection_threshold`, "
     "`use_expandable_segments`. The note just above names `PYTORCH_ALLOC_CONF`."),
    ("torch/include/c10/cuda/CUDAAllocatorConfig.h", "static CUDAAllocatorConfig& instance()",
     "The CUDA settings, `backend` among them, read from `PYTORCH_CUDA_ALLOC_CONF` first and "
     "from `PYTORCH_ALLOC_CONF` only when the old name is unset: the order section 4 printed."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/utils/flop_counter.py:«line»  `def mm_flop(`
#     `m * n * 2 * k`, section 1's 2·m·k·n, registered for `aten.mm`; `addmm_flop` reuses
#     it, so a bias add counts nothing. `FlopCounterMode._count_flops` adds a count only
#     for an op with a formula in `flop_registry`, and
#     `_FlopCounterMode.__torch_dispatch__` first decomposes an op without one, where it
#     can: nothing the embedding runs has one, so it counts 0.
# torch/backends/cpu/__init__.py:«line»  `def get_cpu_capability(`
#     The name of the vector instruction set PyTorch's own CPU kernels were dispatched to
#     (`DEFAULT`, `AVX2`, `AVX512`, ...), the lanes of section 2's peak.
# torch/cuda/memory.py:«line»  `def memory_reserved(`
#     It reads `reserved_bytes.all.current` from the caching allocator's `memory_stats()`,
#     where `memory_allocated`, two functions above, reads `allocated_bytes.all.current`:
#     bytes held from CUDA against bytes in live tensors. `empty_cache`, near the top of
#     the file, releases the cached memory that no tensor occupies.
# torch/include/c10/core/AllocatorConfig.h:«line»  `class C10_API AcceleratorAllocatorConfig {`
#     The settings every accelerator's allocator shares, each with its meaning and
#     default: `max_split_size`, `roundup_power2_divisions`,
#     `garbage_collection_threshold`, `use_expandable_segments`. The note just above names
#     `PYTORCH_ALLOC_CONF`.
# torch/include/c10/cuda/CUDAAllocatorConfig.h:«line»  `static CUDAAllocatorConfig& instance()`
#     The CUDA settings, `backend` among them, read from `PYTORCH_CUDA_ALLOC_CONF` first
#     and from `PYTORCH_ALLOC_CONF` only when the old name is unset: the order section 4
#     printed.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Predict.** `FlopCounterMode` counts one training step of an MLP (batch 1024,
#    512 → 512 → 10). Is it 6 × weights × batch? And what does an `nn.Embedding` of 64,000
#    parameters count, forward and backward?
#
#    <details><summary>Answer</summary>
#
#    Not quite: 1,105,199,104 FLOPs, which is 6 · W · B = 1,642,070,016 minus one matmul of
#    2 · B · D · H. The forward pass does 2 FLOPs per weight per example and the backward
#    4 (the weight gradient and the input gradient), but nothing needs the gradient of the
#    input batch, so that matmul never runs. The embedding counts 0 FLOPs: it is a gather,
#    so its parameters do not belong in the N of 6 · N · tokens
#    (*§ FLOPs: counting what a step does*).
#
#    </details>
#
# 2. **Explain.** A model of 8 billion parameters trains with AdamW in mixed precision on
#    one H200 SXM (141 GiB, reading the datasheet's "141 GB" as GiB). Before you measure its
#    speed, what do you check, and what does it show?
#
#    <details><summary>Answer</summary>
#
#    That its training state fits: 16 bytes per parameter for the float32 weights,
#    gradients and AdamW's two moments make 128 GB, 85% of the H200 before any activation,
#    so it does not train on one this way; shard the state across GPUs or keep less of it
#    (*§ Achieved FLOP/s, this CPU's peak, and MFU*).
#
#    </details>
#
# 3. **Explain.** A 16² matmul has an arithmetic intensity of 2.667 FLOP/byte, the
#    elementwise chain 0.125. Which regime is each in, and which is the 1024² matmul in?
#
#    <details><summary>Answer</summary>
#
#    The 16² matmul is overhead-bound: its 8,192 FLOPs take less than 3 times as long as a
#    1×1 matmul, so its time is the call, not the arithmetic or the bytes, whatever its
#    intensity. The chain, at 0.125 FLOP/byte, is left of the ridge: memory-bound. The 1024²
#    matmul, at 170.667 FLOP/byte, is right of it: compute-bound
#    (*§ Three regimes: compute, memory, overhead*).
#
#    </details>
#
# 4. **Spot the bug.** A job exports `PYTORCH_ALLOC_CONF=expandable_segments:true` to
#    fight fragmentation; its environment still holds `PYTORCH_CUDA_ALLOC_CONF=
#    max_split_size_mb:512` from an old script. What does PyTorch 2.13 do with each?
#
#    <details><summary>Answer</summary>
#
#    It reads only the old variable, so `max_split_size_mb:512` applies and the new line is
#    never seen; and the new line would be refused anyway, because the value must be
#    spelled `True`. Unset the old name and write `expandable_segments:True`
#    (*§ Memory on a GPU: pinned copies and the caching allocator*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement:
#
# 1. `matmul_flops(shape_a, shape_b)`: the FLOPs of `torch.matmul` on inputs of these
#    shapes, batch dimensions broadcast, from the shapes alone, without running torch.
# 2. `mlp_step_flops(sizes, batch)`: the matmul FLOPs of one training step of a stack of
#    `nn.Linear` layers, as `FlopCounterMode` counts them, from the sizes alone, without
#    running torch.
#
# The checks compare your counts with `FlopCounterMode` on many shapes, and call your
# functions where any torch operator raises: arithmetic on the shapes is the exercise.
#
# Check your answers with `make exercises N=06b`; `solutions.py` has one way to write them.

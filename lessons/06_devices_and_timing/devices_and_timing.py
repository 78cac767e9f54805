# %% [markdown]
# # 06 · Devices and honest timing
#
# Every tensor lives on a device, and a GPU does its work *later*: a call queues a kernel
# and returns. That one fact decides how you must move data, how you must time code, and
# which innocent-looking lines of a training loop stall it. This lesson measures on the
# CPU what can be measured there, and leaves the GPU measurements to tests marked `cuda`
# and `mps`.
#
# **What you will learn**
#
# - where a tensor lives, which copies are explicit, and why data moves once and stays;
# - a device helper (cuda → mps → cpu, with an override);
# - why a timer without synchronisation measures the launch, not the work;
# - honest timing: warm-up, repeats, the median, `torch.utils.benchmark.Timer`, and how
#   much runs vary on a shared machine;
# - the hidden synchronisations of a training loop (`.item()`, printing, branching on a
#   tensor, `.cpu()`), found in the profiler's op list;
# - `torch.profiler` with `record_function` regions, a sorted table and a Chrome trace;
# - FLOPs: 2n³ for a matmul, achieved FLOP/s, and model FLOPs utilisation (MFU).
#
# **Prerequisites:** lesson 02 (ATen ops and the dispatcher), lesson 03 (a training step:
# forward, backward, optimizer).
#
# **How to run:** `python lessons/06_devices_and_timing/devices_and_timing.py` or
# `make lesson N=06` from the repository root, or open `devices_and_timing.ipynb`. It runs
# on the CPU in a few seconds. Timings change from run to run: the *Output* blocks write
# them as placeholders such as `«time»` and `«rate»`, and `make test` checks everything
# else. The GPU measurements run with `make test-gpu` on a machine that has one.

# %%
import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils import benchmark
from torch.utils.flop_counter import FlopCounterMode

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: comparable timings, and one core's peak to compare with
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()


def pick_device(override=None, has_cuda=None, has_mps=None):
    """cuda, then mps, then cpu. An override ("cpu", "cuda:1") wins; None probes the machine."""
    if override:
        return torch.device(override)
    has_cuda = torch.cuda.is_available() if has_cuda is None else has_cuda
    has_mps = torch.backends.mps.is_available() if has_mps is None else has_mps
    return torch.device("cuda" if has_cuda else "mps" if has_mps else "cpu")


# The course runs on the CPU unless COURSE_DEVICE says otherwise ("auto" probes).
choice = os.environ.get("COURSE_DEVICE", "cpu")
DEVICE = pick_device(None if choice == "auto" else choice)


def first_sentence(err):
    return str(err).split(". ")[0]


# %% [markdown]
# ## 1. Where a tensor lives
#
# **Predict.** `x` is made on the CPU. What does `x.to("cpu")` return: a copy, or `x`
# itself? And `x.to("cpu", copy=True)`? What happens when you add a tensor on another
# device to `x`?

# %%
x = torch.randn(2, 3)  # (2, 3), on the CPU: factories use the default device
print(f"x.device {x.device}")
print(f"x.to('cpu') is x: {x.to('cpu') is x}")
print(f"x.cpu() is x: {x.cpu() is x}")
xc = x.to("cpu", copy=True)
print(f"x.to('cpu', copy=True) is x: {xc is x}  same memory: {xc.data_ptr() == x.data_ptr()}")
m = torch.ones(2, 3, device="meta")  # a device with shapes but no data
try:
    x + m
except RuntimeError as err:
    print(f"x + meta tensor: {first_sentence(err)}")

# %% [markdown]
# Output:
# ```text
# x.device cpu
# x.to('cpu') is x: True
# x.cpu() is x: True
# x.to('cpu', copy=True) is x: False  same memory: False
# x + meta tensor: Tensor on device meta is not on the expected device cpu!
# ```
#
# `.to(device)` copies only when the tensor is elsewhere; when it already is on that
# device it returns the very same object. Moving is never implicit: an op whose inputs
# sit on two devices raises (here the `meta` device, which has shapes but no data, stands
# in for a GPU; with a CUDA tensor the message reads "Expected all tensors to be on the
# same device"). The exception is a 0-d CPU tensor, which ops accept next to a CUDA
# tensor as if it were a Python number.
#
# On a GPU machine `x.to("cuda")` is a real copy over PCIe or NVLink, and it is paid each
# time the line runs. Hence the rule *move once and stay*: put the model and the data on
# the device once, before the loop, and keep every intermediate there. The costly
# patterns are data that starts every step on the host (a batch built on the CPU, a
# tensor made without `device=`) and results pulled back every step (`.cpu()`, section 4).
#
# **Predict.** A module moves differently from a tensor. After `net.to(torch.float64)`
# and `t.to(torch.float64)` (a dtype change goes through the same `.to` as a device
# change, and is a real copy on the CPU too), which of `net` and `t` has changed?

# %%
net = nn.Linear(4, 2)
t = torch.randn(4)  # (4,) float32
moved_net, moved_t = net.to(torch.float64), t.to(torch.float64)
print(f"net.to(...) is net: {moved_net is net}  weight now {net.weight.dtype}")
print(f"t.to(...) is t: {moved_t is t}  t still {t.dtype}, the copy {moved_t.dtype}")
net = net.float()  # back to float32 (in place, like any Module.to)

# %% [markdown]
# Output:
# ```text
# net.to(...) is net: True  weight now torch.float64
# t.to(...) is t: False  t still torch.float32, the copy torch.float64
# ```
#
# `Module.to` changes the module in place (every parameter and buffer) and returns it, so
# `model.to(device)` needs no assignment; `Tensor.to` returns a new tensor and leaves the
# original where it was, so `batch = batch.to(device)` does. Forgetting that assignment is
# the classic way to end up with the model on the GPU and the data still on the CPU: the
# first op raises the device error above.
#
# **Predict.** The helper below tries cuda, then mps, then the CPU. What does it pick for
# each combination, and what does an override do?

# %%
cases = [(None, True, True), (None, False, True), (None, False, False), ("cpu", True, False)]
for override, has_cuda, has_mps in cases:
    picked = pick_device(override, has_cuda, has_mps)
    print(f"override {str(override):<5} cuda {has_cuda!s:<5} mps {has_mps!s:<5} -> {picked}")
print(f"this lesson runs on {DEVICE} (COURSE_DEVICE={choice!r})")

# %% [markdown]
# Output:
# ```text
# override None  cuda True  mps True  -> cuda
# override None  cuda False mps True  -> mps
# override None  cuda False mps False -> cpu
# override cpu   cuda True  mps False -> cpu
# this lesson runs on cpu (COURSE_DEVICE='cpu')
# ```
#
# The probe order puts the fastest likely device first; the override lets you force the
# CPU (to compare, or to debug) or pick one GPU among several (`"cuda:1"`). The lesson
# reads it from `COURSE_DEVICE`; `COURSE_DEVICE=auto` runs the probe.

# %% [markdown]
# ## 2. Why GPU timings lie
#
# A CUDA or MPS op does not compute anything while Python waits: it puts a kernel in the
# device's queue and returns. The host races ahead, queueing more work, and only stops
# when it needs a result. So a clock read right after the call measures the *launch*
# (microseconds), not the work. `torch.cuda.synchronize()` (or `torch.mps.synchronize()`)
# blocks until the queue is empty: read the clock after it. On the CPU there is no queue:
# an op returns when its result is ready, and `torch.cpu.synchronize()` exists only so
# that device-agnostic code runs, doing nothing.
#
# **Predict.** On the CPU, time a 512² matmul with the clock stopped right at the call's
# return, and again after `torch.cpu.synchronize()`. How far apart are the two medians?

# %%
n = 512
a, b = torch.randn(n, n), torch.randn(n, n)  # (n, n) each
c = torch.empty(n, n)  # a preallocated output: no allocation inside the timing


def mm():
    torch.mm(a, b, out=c)


def one_run(fn, sync):
    """Seconds for one call; sync=None stops the clock when the call returns."""
    t0 = time.perf_counter()
    fn()
    if sync:
        sync()
    return time.perf_counter() - t0


mm()  # warm-up
runs = {"no sync": [], "sync": []}
for _ in range(15):  # interleaved, so that a busy moment on the machine hits both
    runs["no sync"].append(one_run(mm, None))
    runs["sync"].append(one_run(mm, torch.cpu.synchronize))
med = {k: statistics.median(v) * 1e3 for k, v in runs.items()}  # ms
print(f"{n}x{n} matmul, CPU, no sync: median {med['no sync']:.3f} ms")
print(f"{n}x{n} matmul, CPU, sync:    median {med['sync']:.3f} ms")
print(f"ratio sync / no sync {med['sync'] / med['no sync']:.2f}")

# %% [markdown]
# Output:
# ```text
# 512x512 matmul, CPU, no sync: median «time» ms
# 512x512 matmul, CPU, sync:    median «time» ms
# ratio sync / no sync «ratio»
# ```
#
# The times and their ratio change from run to run, but the ratio stays near 1 (the test
# checks that it lies between 1/5 and 5): on the CPU both clocks stop after the work.
# On a GPU the same two lines differ by orders of magnitude. The CUDA test of this lesson
# times a 4096² matmul both ways: without the synchronize the "time" is the launch, tens of
# microseconds, against milliseconds of real work (one reference text measured 0.05 ms
# against 47.58 ms on a laptop GPU). It also shows the other half of the story: 200 small
# matmuls queued back to back take less time per call than the same calls with a wait
# after each, because the GPU works through the queue while Python launches more. So:
# synchronise before reading a clock, never inside the work.

# %% [markdown]
# ## 3. Honest timing: warm-up, repeats, the median
#
# One run tells you little: the first call pays one-time costs (lazy initialisation,
# memory allocation, on a GPU the CUDA context and autotuning), and any run can be hit by
# another process on the same cores. The recipe: a few untimed warm-up calls, many timed
# repeats, each stopped after a synchronize, and the median, which one slow outlier does
# not move.
#
# **Predict.** Over 21 repeats of the same matmul, how far apart are the fastest and the
# slowest run? Does it depend on what else the machine is doing?


# %%
def time_runs(fn, sync=torch.cpu.synchronize, warmup=3, repeats=21):
    """Seconds per call of fn, one entry per repeat, after `warmup` untimed calls."""
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


times = time_runs(mm)
lo, mid, hi = min(times) * 1e3, statistics.median(times) * 1e3, max(times) * 1e3
print(f"{len(times)} runs: min {lo:.3f} ms, median {mid:.3f} ms, max {hi:.3f} ms")
print(f"slowest / fastest {hi / lo:.2f}")

# %% [markdown]
# Output:
# ```text
# 21 runs: min «time» ms, median «time» ms, max «time» ms
# slowest / fastest «ratio»
# ```
#
# On the course's 2-core machine, the slowest of 21 runs was within a few percent of the
# fastest when the machine was quiet, and about 2.7 times the fastest with two busy
# processes sharing the cores, while the median moved by 2%: an outlier lands in the max,
# not in the median. The
# median lies between min and max by construction (the test asserts it); report it with
# the number of runs, and treat a difference of a few percent between two medians as noise
# unless it holds over several runs of the whole measurement.
#
# `torch.utils.benchmark.Timer` does all this for you. `blocked_autorange` first times
# growing blocks of 1, 10, 100, ... calls until the timer's own overhead is negligible
# (which doubles as the warm-up), then repeats blocks of that size for at least
# `min_run_time` seconds; each measurement is one block's time per call. Its clock
# synchronises the accelerator (CUDA, MPS) before each reading, and it runs with one
# thread unless told otherwise.
#
# **Predict.** Will the `Timer`'s median agree with our loop's?

# %%
timer = benchmark.Timer("torch.mm(a, b, out=c)", globals={"torch": torch, "a": a, "b": b, "c": c})
meas = timer.blocked_autorange(min_run_time=0.2)  # at least 0.2 s of timed calls
print(f"Timer: median {meas.median * 1e3:.3f} ms, IQR {meas.iqr * 1e3:.3f} ms")
print(f"Timer: {len(meas.times)} measurements of {meas.number_per_run} calls, "
      f"{meas.task_spec.num_threads} thread")
print(f"Timer median / loop median {meas.median * 1e3 / mid:.2f}")

# %% [markdown]
# Output:
# ```text
# Timer: median «time» ms, IQR «time» ms
# Timer: «number» measurements of «number» calls, 1 thread
# Timer median / loop median «ratio»
# ```
#
# The two medians agree to within the noise. (The test only checks that the Timer's median
# lies between half the loop's fastest run and five times its slowest: the two measure at
# different moments on a shared machine.)
# `blocked_autorange` chose how many calls to group per measurement by itself: one call
# of a 512² matmul already lasts milliseconds, so blocks stay small; for a 64² matmul they
# hold hundreds or thousands of calls. The IQR (the spread of the middle half of the
# measurements) is the honest error bar to quote with the median. Both timings pass
# `out=c`: a fresh 1 MiB output per call would add the allocator's work to what we
# measure (and, for outputs of tens of MiB, page faults: each new mapping is touched page
# by page).

# %% [markdown]
# ## 4. Hidden synchronisations in a training loop
#
# On a GPU anything that needs a tensor's *value* on the host waits for the queue to drain:
# `.item()`, `float(t)`, printing or formatting a tensor, `if t > 0:`, `.cpu()`,
# `.tolist()`. Each one costs a round trip and leaves the GPU idle while Python catches up.
# On the CPU they cost nothing special, but the profiler still shows where they are: the
# op that turns a tensor into a Python number is `aten::_local_scalar_dense`.
#
# **Predict.** The loop below trains a small linear model and, each step, logs the loss
# with `.item()`, formats it as `print` would, stops early if the loss is small, and keeps
# a `.cpu()` copy of the prediction. How many host reads does each of those lines make
# per step?

# %%
torch.manual_seed(0)  # this section's numbers do not depend on the cells above
xs = torch.randn(64, 8)  # (N, D)
ys = xs @ torch.randn(8, 1)  # (N, 1): a linear target
lin = nn.Linear(8, 1)
opt = torch.optim.SGD(lin.parameters(), lr=0.05)
SUSPECTS = ["log .item()", "format", "branch", ".cpu()"]


def train_step(log, keep):
    pred = lin(xs)  # (N, 1)
    loss = nn.functional.mse_loss(pred, ys)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with record_function("log .item()"):
        log.append(loss.item())  # a host read
    with record_function("format"):
        text = f"loss {loss:.4f}"  # what print(f"...") would show: a host read too
    with record_function("branch"):
        stop = bool(loss < 1e-3)  # Python needs True or False now
    out = pred.detach()  # (N, 1), no graph: safe to keep
    with record_function(".cpu()"):
        keep.append(out.cpu())  # on a GPU: a device-to-host copy that waits
    return stop, text


# %%
def region_of(event):
    """The name of the record_function region an op ran in, or None."""
    while event is not None and event.name not in SUSPECTS:
        event = event.cpu_parent
    return event.name if event else None


def count_reads(events):
    """{region: number of aten::_local_scalar_dense calls (host reads of a value)}"""
    counts = dict.fromkeys(SUSPECTS, 0)
    for e in events:
        if e.name == "aten::_local_scalar_dense" and region_of(e):
            counts[region_of(e)] += 1
    return counts


log, keep = [], []
with profile(activities=[ProfilerActivity.CPU]) as sync_prof:
    for step in range(5):
        stop, text = train_step(log, keep)
reads = count_reads(sync_prof.events())
parents = [(e.cpu_parent.name, e.name) for e in sync_prof.events() if e.cpu_parent]
ops_in = {s: sorted({op for parent, op in parents if parent == s}) for s in SUSPECTS}  # children
for s in SUSPECTS:
    print(f"{s:<12} host reads {reads[s]} in 5 steps, ops {ops_in[s]}")
print(f"last step: {text}, stop {stop}")

# %% [markdown]
# Output:
# ```text
# log .item()  host reads 5 in 5 steps, ops ['aten::item']
# format       host reads 5 in 5 steps, ops ['aten::detach', 'aten::item']
# branch       host reads 5 in 5 steps, ops ['aten::is_nonzero', 'aten::lt']
# .cpu()       host reads 0 in 5 steps, ops ['aten::to']
# last step: loss 1.6392, stop False
# ```
#
# Three of the four lines read a value every step: `.item()` directly, formatting through
# `Tensor.__format__` (which calls `.detach().item()` on a 0-d tensor), and the branch through
# `bool()`, which dispatches `aten::is_nonzero` and then `item`. Each would stall a GPU 3
# times per step. `.cpu()` shows only `aten::to` here because the tensor already is on the
# CPU (section 1: no copy); on a GPU the same line is `aten::_to_copy` + `aten::copy_`, a
# device-to-host copy that waits for the queue. (On the CPU, `.tolist()` reads values
# without passing through `_local_scalar_dense`, so it hides even from this list.)
#
# The fix is to keep values on the device and read them rarely: accumulate
# `total += loss.detach()` and call `.item()` once every N steps; decide on early stopping
# every N steps; keep predictions on the device and move them once, at the end. On CUDA,
# `torch.cuda.set_sync_debug_mode("warn")` flags every synchronising call (the GPU test
# uses it to catch an `.item()`).

# %% [markdown]
# ## 5. The profiler: named regions, a sorted table, a Chrome trace
#
# `torch.profiler.profile` records every op with its time and its caller (and, with
# `record_shapes=True`, its inputs' shapes); `record_function("name")` adds your own
# regions. On a GPU you would add
# `ProfilerActivity.CUDA` and see each kernel next to the op that launched it.
#
# **Predict.** A 2-layer MLP (batch 1024, 512 → 512 → 10) trains for 3 steps in regions
# `forward`, `backward` and `optimizer`. Which ops run most often, and which share of the
# time goes to matrix multiplies?

# %%
B, D, H, C = 1024, 512, 512, 10
mlp = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, C))
xb = torch.randn(B, D)  # (B, D)
yb = torch.randint(0, C, (B,))  # (B,) class labels
sgd = torch.optim.SGD(mlp.parameters(), lr=0.1)


def mlp_step():
    with record_function("forward"):
        loss = nn.functional.cross_entropy(mlp(xb), yb)
    with record_function("backward"):
        sgd.zero_grad()
        loss.backward()
    with record_function("optimizer"):
        sgd.step()


mlp_step()  # warm-up: the first step also creates the gradient buffers
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(3):
        mlp_step()
table = sorted(prof.key_averages(), key=lambda e: (-e.count, e.key))  # by calls, then name
for e in table[:6]:
    print(f"{e.key:<28} calls {e.count:>3}  self CPU {e.self_cpu_time_total / 1e3:.3f} ms")
total = sum(e.self_cpu_time_total for e in table)
matmul = sum(e.self_cpu_time_total for e in table if e.key in ("aten::mm", "aten::addmm"))
print(f"aten::mm + aten::addmm: {100 * matmul / total:.1f}% of self CPU time")

# %% [markdown]
# Output:
# ```text
# aten::as_strided             calls  33  self CPU «time» ms
# aten::resolve_conj           calls  33  self CPU «time» ms
# aten::t                      calls  27  self CPU «time» ms
# aten::transpose              calls  27  self CPU «time» ms
# aten::add_                   calls  12  self CPU «time» ms
# aten::detach                 calls  12  self CPU «time» ms
# aten::mm + aten::addmm: «number»% of self CPU time
# ```
#
# `prof.key_averages()` groups the events by op name; `.table(sort_by="self_cpu_time_total",
# row_limit=10)` prints them as the usual text table, sorted by time. We sort by the number
# of calls instead, because those counts are the same on every run while the time ranking
# can shuffle its small entries. The most frequent ops are views and bookkeeping
# (`t`, `transpose`, `as_strided`, all free) and the SGD update's `add_`; the time is
# elsewhere: the two matmul ops take most of it (80–90% on a quiet machine; the test
# checks more than half, as one preemption by another process can land in any op), since
# each linear layer runs one `addmm` forward and up to two `mm` backward. Read a profile
# both ways: *counts* tell you what your code asked for (e.g. how many host reads per
# step), *self time* where the time went.

# %% [markdown]
# **Predict.** The profile can be saved as a Chrome trace: a JSON timeline you open in
# `chrome://tracing` or <https://ui.perfetto.dev>. Do our named regions appear in it?

# %%
trace = HERE / "devices_and_timing_trace.json"
prof.export_chrome_trace(str(trace))
events = json.loads(trace.read_text())["traceEvents"]
regions = [e["name"] for e in events if e.get("name") in ("forward", "backward", "optimizer")]
print(f"wrote {trace.name}")
print(f"regions in the trace {dict(sorted(Counter(regions).items()))}")

# %% [markdown]
# Output:
# ```text
# wrote devices_and_timing_trace.json
# regions in the trace {'backward': 3, 'forward': 3, 'optimizer': 3}
# ```
#
# Each `record_function` region becomes a bar in the timeline, with the ops it ran nested
# under it: one `forward`, `backward` and `optimizer` per profiled step. The file is
# written next to the lesson (names ending in `_trace.json` are ignored by git). In a GPU
# trace, the gaps between kernels on the device row are where the GPU waited for the host:
# a hidden synchronisation shows up as such a gap.

# %% [markdown]
# ## 6. FLOPs, achieved FLOP/s and MFU
#
# A matmul of (m, k) by (k, n) does m·n dot products of length k: m·k·n multiplies and as
# many adds, so **2·m·k·n FLOPs**, or 2n³ for two n×n matrices. Divided by the measured
# time it gives the achieved FLOP/s, which you compare with the device's peak.
#
# **Predict.** `torch.utils.flop_counter.FlopCounterMode` counts the FLOPs of the ops that
# run. What does it say for a 256² matmul, and for one training step of the MLP above?

# %%
with FlopCounterMode(display=False) as fc:
    torch.randn(256, 256) @ torch.randn(256, 256)
print(f"256x256 @ 256x256: counted {fc.get_total_flops():,} FLOPs, 2*n**3 = {2 * 256**3:,}")

W = D * H + H * C  # weights that take part in matmuls (biases are adds, not counted)
with FlopCounterMode(display=False) as fc:
    mlp_step()
counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
print(f"MLP step: counted {fc.get_total_flops():,} FLOPs {counts}")
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
# `xb`, so autograd skips it. In a transformer the embeddings play that role and are a
# small share of the parameters, so 6·N·tokens is a good estimate. (Biases, activations,
# the loss and the optimizer are left out: they are a few FLOPs per element, not per
# weight.)

# %% [markdown]
# **Predict.** How close to its peak does one CPU core get, and does the matrix size
# matter?


# %%
def gflops(n):
    """(median seconds, achieved GFLOP/s) of an n x n matmul on this CPU, one thread."""
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    t = benchmark.Timer("torch.mm(a, b, out=c)", globals={"torch": torch, "a": a, "b": b, "c": c})
    sec = t.blocked_autorange(min_run_time=0.1).median
    return sec, 2 * n**3 / sec / 1e9


sizes = [32, 64, 128, 256, 512, 1024]
rates = {}
for n in sizes:
    sec, rates[n] = gflops(n)
    print(f"n {n:>4}: {2 * n**3:>13,} FLOPs, median {sec * 1e3:.4f} ms, {rates[n]:.1f} GFLOP/s")

# %% [markdown]
# Output:
# ```text
# n   32:        65,536 FLOPs, median «time» ms, «rate» GFLOP/s
# n   64:       524,288 FLOPs, median «time» ms, «rate» GFLOP/s
# n  128:     4,194,304 FLOPs, median «time» ms, «rate» GFLOP/s
# n  256:    33,554,432 FLOPs, median «time» ms, «rate» GFLOP/s
# n  512:   268,435,456 FLOPs, median «time» ms, «rate» GFLOP/s
# n 1024: 2,147,483,648 FLOPs, median «time» ms, «rate» GFLOP/s
# ```
#
# On the machine this lesson was written on (one core of an AMD EPYC) a quiet run gave 25–40 GFLOP/s at
# n = 32 and 105–115 GFLOP/s from n = 128 up. A core with two 256-bit FMA units does at
# most 2 × 8 × 2 = 32 fp32 FLOPs per cycle, about 110 GFLOP/s at 3.5 GHz: large matmuls
# run close to that peak. Small ones cannot: the time of a call includes a fixed cost
# (dispatch, a few microseconds) that 65,536 FLOPs do not amortise, and on a GPU that fixed
# cost (the launch) is larger and the peak far higher, so small matmuls use an even smaller
# share of it. When another job shares the core, points drop; the figure shows whichever
# run you made.


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

# %% [markdown]
# **Predict.** A dense transformer with 8 billion parameters trains at 8,000 tokens per
# second on one H200, whose datasheet gives about 990 TFLOP/s of dense bf16. What share
# of the peak does it use?

# %%
def mfu(n_params, tokens_per_s, peak_flops):
    """Model FLOPs utilisation of a dense transformer: 6 FLOPs per parameter per token."""
    return 6 * n_params * tokens_per_s / peak_flops


n_params, tokens_per_s, peak = 8e9, 8_000, 990e12
achieved = 6 * n_params * tokens_per_s
print(f"6 x {n_params:.0e} params x {tokens_per_s:,} tokens/s = {achieved / 1e12:.0f} TFLOP/s")
print(f"MFU = {achieved / 1e12:.0f} / {peak / 1e12:.0f} = {mfu(n_params, tokens_per_s, peak):.1%}")
print(f"at 50% MFU: {0.5 * peak / (6 * n_params):,.0f} tokens/s")

# %% [markdown]
# Output:
# ```text
# 6 x 8e+09 params x 8,000 tokens/s = 384 TFLOP/s
# MFU = 384 / 990 = 38.8%
# at 50% MFU: 10,312 tokens/s
# ```
#
# 38.8% is a typical figure for a well-tuned large run (published runs report roughly
# 35–50% on H100-class GPUs); much lower usually means the GPU waits: for data, for
# communication, for the host (hidden synchronisations), or on many small kernels. MFU
# counts only the model's FLOPs: recomputation (activation checkpointing) makes the GPU do
# more work without raising MFU. The peak must match the dtype: 990 TFLOP/s is dense bf16
# (the datasheet's larger figure assumes 2:4 sparsity); fp32 matmuls have a much lower peak.

# %% [markdown]
# ## Summary
#
# - A tensor lives on one device; `.to(device)` copies only when it must (and returns the
#   tensor itself otherwise); ops refuse inputs on different devices. Move the model and
#   data once, before the loop.
# - GPU calls queue work and return. Without a synchronize before reading the clock, you
#   time the launch; on the CPU the two agree, on a GPU they differ by orders of magnitude.
#   Synchronise around the measurement, never inside the work.
# - Time honestly: warm up, repeat, take the median, quote a spread (IQR or min–max);
#   `torch.utils.benchmark.Timer.blocked_autorange` does this; timings on a shared
#   machine vary, ratios and counts do not.
# - `.item()`, formatting or printing a tensor, `if tensor:`, `.cpu()` and `.tolist()`
#   read values on the host: on a GPU each one waits for the queue. The profiler's
#   `aten::_local_scalar_dense` finds most of them.
# - `torch.profiler` + `record_function` give a table (count by calls for what ran, by
#   self time for where the time went) and a Chrome trace.
# - A matmul costs 2·m·k·n FLOPs; a training step about 6 FLOPs per parameter per token;
#   MFU = 6 × params × tokens/s ÷ peak.
#
# ## Exercises
#
# Open `exercises.py` in this folder and implement:
#
# 1. `matmul_flops(shape_a, shape_b)`: the FLOPs of `torch.matmul` on inputs of these
#    shapes, batch dimensions broadcast.
# 2. `mlp_step_flops(sizes, batch)`: the matmul FLOPs of one training step of a stack of
#    `nn.Linear` layers, as `FlopCounterMode` counts them.
# 3. `per_call_time(fn, sync, calls, warmup, clock)`: the time per call of `calls` queued
#    calls, synchronised only around them. The tests run it on a simulated GPU queue.
#
# Check your answers with `make exercises N=06`; `solutions.py` has one way to write them.

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
# - why a timer without synchronisation measures the launch, not the work (seen on a
#   simulated device queue);
# - honest timing: warm-up, repeats, the median, `torch.utils.benchmark.Timer`, and how
#   much runs vary on a shared machine;
# - the hidden synchronisations of a training loop (`.item()`, printing, branching on a
#   tensor, `.cpu()`), found in the profiler's op list;
# - `torch.profiler` with `record_function` regions, a sorted table and a Chrome trace;
#   a `schedule` with `prof.step()`, `profile_memory` and `with_stack`;
# - FLOPs: 2n³ for a matmul, 6·N per token plus attention for a transformer, achieved
#   FLOP/s, this CPU's peak, and the MFU of a step we profiled;
# - the three regimes of a kernel (compute, memory, overhead) on this CPU's roofline;
# - on a GPU: pinned memory with `non_blocking` copies, and the caching allocator
#   (allocated vs reserved, `empty_cache`, expandable segments, memory snapshots).
#
# **Prerequisites:** lesson 02 (ATen ops and the dispatcher), lesson 03 (a training step:
# forward, backward, optimizer).
#
# **How to run:** `python lessons/06_devices_and_timing/devices_and_timing.py` or `make
# lesson N=06` from the repository root, or open `devices_and_timing.ipynb`. It runs on the
# CPU, within the lesson's budget of 30 seconds on a shared 2-core machine. Timings change
# from run to run: the *Output* blocks write them as placeholders such as `«time»` and
# `«rate»`; everything else prints as shown. The GPU sections say what a GPU would show
# (unverified on a GPU). Run outside the course's venv, this lesson may also
# print PyTorch's own diagnostic lines to stderr: `USDT: ... profiler_start` and
# `profiler_stop` around each profiler run and, on a CUDA build without a GPU,
# `gpuGetDeviceCount failed` and `No CUDA runtime is found`. They are harmless, and the
# course's venv (`.venv`, made by any `make lesson`) turns them off.

# %%
import json
import os
import statistics
import sys
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
print(f"meta tensor + 0-d CPU tensor: allowed, result on {(m + torch.tensor(2.0)).device}")

# %% [markdown]
# Output:
# ```text
# x.device cpu
# x.to('cpu') is x: True
# x.cpu() is x: True
# x.to('cpu', copy=True) is x: False  same memory: False
# x + meta tensor: Tensor on device meta is not on the expected device cpu!
# meta tensor + 0-d CPU tensor: allowed, result on meta
# ```
#
# `.to(device)` copies only when the tensor is elsewhere; when it already is on that
# device it returns the very same object. Moving is never implicit: an op whose inputs
# sit on two devices raises (here the `meta` device, which has shapes but no data, stands
# in for a GPU; with a CUDA tensor the message reads "Expected all tensors to be on the
# same device"; this lesson's CUDA test checks it). The exception is a 0-d CPU tensor,
# which ops accept next to a tensor on another device as if it were a Python number (the
# last line; the CUDA test checks it next to a CUDA tensor too).
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
# blocks until the queue is empty: read the clock after it.
#
# A CPU op has no queue to hide in: it returns when its result is ready. To watch a timer
# lie on the CPU we simulate the device: `SimulatedGPU.launch()` books `work` seconds of
# device time at the end of its queue and returns at once, and `synchronize()` sleeps
# until the queue would be empty. Both use the host's real clock; only the device is
# imaginary.
#
# **Predict.** A kernel takes 5 ms of device time. Time one launch with the clock stopped
# when the call returns, and again after `synchronize()`. What do the two clocks read? And
# for 4 launches in a row, then one `synchronize()`?


# %%
class SimulatedGPU:
    """A device queue on the host's real clock: launch() queues `work` seconds of device
    time and returns at once; synchronize() waits until the queue is empty."""

    def __init__(self, work=0.005):
        self.work = work
        self.free_at = 0.0  # time.perf_counter() value at which the queue is empty

    def launch(self):
        start = max(self.free_at, time.perf_counter())  # the device starts when it is free
        self.free_at = start + self.work

    def synchronize(self):
        time.sleep(max(0.0, self.free_at - time.perf_counter()))


def one_run(fn, sync, calls=1):
    """Seconds for `calls` calls of fn; sync=None stops the clock when the last call returns."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if sync:
        sync()
    return time.perf_counter() - t0


gpu = SimulatedGPU()
runs = {"no sync": [], "sync": [], "4 calls, sync": []}
for _ in range(7):
    runs["no sync"].append(one_run(gpu.launch, None))
    gpu.synchronize()  # drain the queue before the next measurement
    runs["sync"].append(one_run(gpu.launch, gpu.synchronize))
    runs["4 calls, sync"].append(one_run(gpu.launch, gpu.synchronize, calls=4))
med = {k: statistics.median(v) * 1e3 for k, v in runs.items()}  # ms
print(f"device work per launch: {gpu.work * 1e3:.1f} ms")
for k, v in med.items():
    print(f"{k:<14} median over 7: {v:.3f} ms")
print(f"sync / no sync {med['sync'] / med['no sync']:.0f}")

# %% [markdown]
# Output:
# ```text
# device work per launch: 5.0 ms
# no sync        median over 7: «time» ms
# sync           median over 7: «time» ms
# 4 calls, sync  median over 7: «time» ms
# sync / no sync «ratio»
# ```
#
# Without the synchronize the clock reads the launch, a few microseconds, whatever the
# work: that is the lie, and on a real GPU it looks just like this (this lesson's CUDA test
# times a 4096² matmul both ways). With it, the clock reads the 5 ms of device time (plus
# the sleep's wake-up, a fraction of a millisecond). Four launches in a row cost the host
# four launches, and the device works through them back to back: 20 ms at the
# synchronize: the unsynchronised median is below a tenth of the work, the synchronised
# ones at least 1× and 4× the work. So: synchronise before reading a clock, and never
# inside the work you time, or the device idles while Python launches the next call.
# Exercise 3 uses the same queue with a fake clock, which makes every reading exact.

# %% [markdown]
# ## 3. Honest timing: warm-up, repeats, the median
#
# One run tells you little: the first call pays one-time costs (lazy initialisation,
# memory allocation, on a GPU the CUDA context and autotuning), and any run can be hit by
# another process on the same cores. The recipe: a few untimed warm-up calls, many timed
# repeats, each stopped after a synchronize *of the device that does the work*, and the
# median, which one slow outlier does not move.
#
# **Predict.** Over 21 repeats of a 512² matmul, how far apart are the fastest and the
# slowest run? And what does the same loop report for the simulated GPU if it
# synchronises the CPU instead of the simulated device?


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


n = 512
a, b = torch.randn(n, n), torch.randn(n, n)  # (n, n) each
c = torch.empty(n, n)  # a preallocated output: no allocation inside the timing


def mm():
    torch.mm(a, b, out=c)


times = time_runs(mm)
lo, mid, hi = min(times) * 1e3, statistics.median(times) * 1e3, max(times) * 1e3
print(f"{len(times)} runs: min {lo:.3f} ms, median {mid:.3f} ms, max {hi:.3f} ms")
print(f"slowest / fastest {hi / lo:.2f}")
sim = {name: statistics.median(time_runs(gpu.launch, sync)) * 1e3  # ms
       for name, sync in [("own", gpu.synchronize), ("cpu", torch.cpu.synchronize)]}
print(f"simulated GPU, {gpu.work * 1e3:.1f} ms per call: with its own synchronize "
      f"{sim['own']:.3f} ms, with the CPU's {sim['cpu']:.3f} ms")

# %% [markdown]
# Output:
# ```text
# 21 runs: min «time» ms, median «time» ms, max «time» ms
# slowest / fastest «ratio»
# simulated GPU, 5.0 ms per call: with its own synchronize «time» ms, with the CPU's «time» ms
# ```
#
# The spread is your machine's at that moment: close to 1 on a quiet machine, several
# times that when other processes share the cores. The last line is the same loop with
# the wrong synchronize: `torch.cpu.synchronize()` knows nothing of the simulated queue,
# so the loop times launches again. Synchronising *some* device is not enough; it must be
# the one that does the work (`torch.cuda.synchronize()` for CUDA work).
#
# **Predict.** Another process takes the core for 50 ms during one of the 21 timed calls.
# What happens to the median, the mean and the max?


# %%
def held_up(fn, at=10, seconds=0.05):
    """fn, except that its call number `at` (counting from 0) is held up `seconds` longer."""
    calls = iter(range(10**9))

    def run():
        fn()
        if next(calls) == at:  # the 3 warm-up calls are 0-2: call 10 is a timed one
            time.sleep(seconds)

    return run


stalled = time_runs(held_up(mm))
print(f"one call held up 50 ms: median {statistics.median(stalled) * 1e3:.3f} ms, "
      f"mean {statistics.mean(stalled) * 1e3:.3f} ms, max {max(stalled) * 1e3:.3f} ms")

# %% [markdown]
# Output:
# ```text
# one call held up 50 ms: median «time» ms, mean «time» ms, max «time» ms
# ```
#
# The max holds the 50 ms; the mean carries a 21st of it (2.4 ms), on top of whatever else
# disturbed the run; the median is still the median of the undisturbed calls (below half
# the max). That is why the median is
# the number to report, with the number of runs, and why a difference of a few percent
# between two medians is noise until it holds over several runs of the whole measurement.
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
a64, b64, c64 = torch.randn(64, 64), torch.randn(64, 64), torch.empty(64, 64)  # (64, 64) each
meas64 = benchmark.Timer("torch.mm(a, b, out=c)",
                         globals={"torch": torch, "a": a64, "b": b64, "c": c64}).blocked_autorange()
print(f"64x64 matmul: blocks of {meas64.number_per_run} calls, median {meas64.median * 1e6:.1f} us")

# %% [markdown]
# Output:
# ```text
# Timer: median «time» ms, IQR «time» ms
# Timer: «number» measurements of «number» calls, 1 thread
# Timer median / loop median «ratio»
# 64x64 matmul: blocks of «number» calls, median «time» us
# ```
#
# The two medians agree to within the noise of a shared machine (within a factor of 2
# either way: the two ran at different moments). `blocked_autorange` chose how many calls
# to group per measurement by itself: one call of a 512² matmul already lasts milliseconds,
# so blocks stay small; a 64² matmul lasts microseconds, and its blocks hold far more
# calls. The IQR (the spread of the middle half of the
# measurements) is the honest error bar to quote with the median. Both timings pass `out=c`:
# a fresh 1 MiB output per call would add the allocator's work to what we measure (and, for
# outputs of tens of MiB, page faults as each fresh output is mapped into memory: lesson 08
# counts them).

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
    for _ in range(5):
        stop, text = train_step(log, keep)
reads = count_reads(sync_prof.events())
parents = [(e.cpu_parent.name, e.name) for e in sync_prof.events() if e.cpu_parent]
ops_in = {s: sorted({op for parent, op in parents if parent == s}) for s in SUSPECTS}  # children
for s in SUSPECTS:
    print(f"{s:<12} host reads {reads[s]} in 5 steps, ops {ops_in[s]}")
print(f"last step: {text}, stop {stop}")
with profile(activities=[ProfilerActivity.CPU]) as tolist_prof:
    values = keep[-1].tolist()  # (N, 1) -> a list of lists of Python floats
print(f".tolist() of {len(values)} values: ops {sorted({e.name for e in tolist_prof.events()})}")

# %% [markdown]
# Output:
# ```text
# log .item()  host reads 5 in 5 steps, ops ['aten::item']
# format       host reads 5 in 5 steps, ops ['aten::detach', 'aten::item']
# branch       host reads 5 in 5 steps, ops ['aten::is_nonzero', 'aten::lt']
# .cpu()       host reads 0 in 5 steps, ops ['aten::to']
# last step: loss 1.6392, stop False
# .tolist() of 64 values: ops ['aten::resolve_conj', 'aten::resolve_neg']
# ```
#
# Three of the four lines read a value every step: `.item()` directly, formatting through
# `Tensor.__format__` (which calls `.detach().item()` on a 0-d tensor), and the branch
# through `bool()`, which dispatches `aten::is_nonzero`, which calls `item`. On a GPU each
# of the three would stall it once per step. `.cpu()` shows only `aten::to` here because the
# tensor already is on the CPU (section 1: no copy); on a GPU the same line is
# `aten::_to_copy` + `aten::copy_`, a device-to-host copy that waits for the queue (the CUDA
# test profiles it). On the CPU, `.tolist()` reads the values without passing through
# `_local_scalar_dense` (last line): searching a profile for that op does not find it.
#
# The fix is to keep values on the device and read them rarely: accumulate
# `total += loss.detach()` and call `.item()` once every N steps; decide on early stopping
# every N steps; keep predictions on the device and move them once, at the end.
#
# On CUDA, `torch.cuda.set_sync_debug_mode("warn")` (or `"error"`) reports synchronising
# calls as they happen; this lesson's GPU test uses it to catch an `.item()`. It is a
# debugging aid, not a proof that a loop is free of them.
#
# **Predict.** Does it catch every synchronising call? Its own docstring says (the CPU
# build of PyTorch carries the same text):

# %%
doc = " ".join(torch.cuda.set_sync_debug_mode.__doc__.split())  # the docstring on one line
limit = doc[doc.index("not all"):]
for sentence in limit.split(". "):
    print(f"set_sync_debug_mode: {sentence.rstrip('.')}.")

# %% [markdown]
# Output:
# ```text
# set_sync_debug_mode: not all synchronizing operations will trigger warning or error.
# set_sync_debug_mode: In particular, operations in torch.distributed and torch.sparse namespaces are not covered yet.
# ```
#
# So a silent run under `"warn"` means "none of the calls it watches synchronised", not
# "nothing synchronised". The profiler's view is the complement: on a GPU trace a
# synchronisation shows as the device row going idle while the host waits (section 5).

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
# can shuffle its small entries. The most frequent ops are views and bookkeeping (`t`,
# `transpose`, `as_strided`: new metadata, no data moved) and the SGD update's `add_`; the
# time is elsewhere: the two matmul ops take most of it (more than half; one preemption by
# another process can land in any op and move the share), since each linear
# layer runs one `addmm` forward and up to two `mm` backward. Read a profile both ways:
# *counts* tell you what your code asked for (e.g. how many host reads per step), *self
# time* where the time went.

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
# ### Profiling part of a long run: schedule, memory, stacks
#
# Profiling a whole training run is slow and gives a huge trace. A `schedule` picks the
# steps: `prof.step()` at the end of every step advances it; the first `wait` steps are
# not profiled, the next `warmup` steps are profiled and thrown away (the profiler's own
# start-up lands there), the next `active` steps are recorded, and then `on_trace_ready`
# is called with the profiler (`torch.profiler.tensorboard_trace_handler(folder)` is a
# ready-made handler that writes a trace file). `repeat` says how many such cycles to run.
#
# **Predict.** With `wait=1, warmup=1, active=2, repeat=1` over 6 steps numbered 0 to 5,
# which steps are recorded, and at which `prof.step_num` is the handler called?

# %%
ready = []  # prof.step_num each time a recording is handed over
cycle = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
with profile(activities=[ProfilerActivity.CPU], schedule=cycle,
             on_trace_ready=lambda p: ready.append(p.step_num)) as cycle_prof:
    for step in range(6):
        with record_function(f"step {step}"):
            mlp_step()
        cycle_prof.step()  # one training step ended
recorded = sorted({e.name for e in cycle_prof.events() if e.name.startswith("step ")})
print(f"recorded {recorded}; on_trace_ready called at step_num {ready}")

# %% [markdown]
# Output:
# ```text
# recorded ['step 2', 'step 3']; on_trace_ready called at step_num [4]
# ```
#
# Step 0 waits, step 1 warms up, steps 2 and 3 are recorded, and the handler runs as step
# 3 ends (`step_num` is then 4). With `repeat=1` nothing after that is profiled: steps 4
# and 5 run at full speed. In a real loop, wait a few steps past the first ones (which pay
# one-time costs), then record a handful.
#
# Two more switches of `profile` answer other questions. `profile_memory=True` records
# every allocation and free with the op that made it; `with_stack=True` records the Python
# frames that called each op.
#
# **Predict.** How many bytes does the MLP's forward pass (no autograd) allocate in
# `aten::addmm`, and in the ReLU? How many does it free before it ends?

# %%
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as mem_prof:
    with torch.no_grad():
        mlp(xb)  # (B, C), dropped at once
mem = {e.key: e.self_cpu_memory_usage for e in mem_prof.key_averages()}  # bytes
print(f"aten::addmm allocated {mem['aten::addmm']:,} bytes = 4 x ({B}x{H} + {B}x{C})")
print(f"aten::clamp_min (the ReLU) allocated {mem['aten::clamp_min']:,} bytes = 4 x {B}x{H}")
print(f"freed before the pass ended ([memory] row): {-mem['[memory]']:,} bytes")

# %% [markdown]
# Output:
# ```text
# aten::addmm allocated 2,138,112 bytes = 4 x (1024x512 + 1024x10)
# aten::clamp_min (the ReLU) allocated 2,097,152 bytes = 4 x 1024x512
# freed before the pass ended ([memory] row): 4,235,264 bytes
# ```
#
# Each linear layer's `addmm` allocates its output, (B, H) and (B, C) float32, and the ReLU
# (`relu` runs as `clamp_min`) one more (B, H) tensor. Frees carry no op (the row
# `[memory]`), and here everything is freed: the hidden activations once the next layer
# has read them, the output because nothing keeps it. With autograd on, the tensors saved
# for backward would stay. `prof.key_averages().table(sort_by="self_cpu_memory_usage")`
# ranks the ops by what they allocate; on a GPU add `ProfilerActivity.CUDA` and the
# columns for device memory fill in.
#
# **Predict.** Which Python frames lie between `mlp_step` and the first layer's
# `aten::addmm`?

# %%
with profile(activities=[ProfilerActivity.CPU], with_stack=True) as stack_prof:
    mlp_step()
frame = next(e for e in stack_prof.events() if e.name == "aten::addmm")  # the first layer's
frames = []
while frame is not None and not frame.name.endswith("mlp_step"):
    frames.append(frame.name.split("): ")[-1])  # "path/file.py(line): name" -> name
    frame = frame.cpu_parent
print(" <- ".join(frames))

# %% [markdown]
# Output:
# ```text
# aten::addmm <- aten::linear <- <built-in function linear> <- forward <- _call_impl <- nn.Module: Linear_0 <- forward <- _call_impl <- nn.Module: Sequential_0 <- forward
# ```
#
# Read it from the op outward: `addmm` was called by `aten::linear`, which the Python
# built-in `F.linear` dispatched, called by `Linear.forward`, called by `Module._call_impl`
# (what `module(x)` runs), inside the `Linear` module (the profiler names modules by class
# and number), inside `Sequential.forward` and its module, inside our `forward` region.
# Exported as a Chrome trace, the same frames appear as bars above each op, which is how a
# slow op in a large model is traced back to the line of model
# code that issued it.

# %% [markdown]
# ## 6. FLOPs: counting what a step does
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
# which convention you use).

# %% [markdown]
# ## 7. Achieved FLOP/s, this CPU's peak, and MFU
#
# **Predict.** How close to its peak does one CPU core get, and does the matrix size
# matter?


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
# peak. Here it is for the training step we profiled in section 5, with the FLOPs the
# counter gave. Most of those FLOPs are in two products of 1024 × 512 × 512 multiply-adds
# (the first layer's forward and its weight gradient); we time them alone too, in turn
# with the step, so that both see the same machine.
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
print(f"profiled MLP step: {step_flops:,} FLOPs in {step_s * 1e3:.2f} ms (median of 11) "
      f"= {step_rate / 1e9:.1f} GFLOP/s")
print(f"its two large products alone: {products_rate / 1e9:.1f} GFLOP/s; "
      f"step / products, median of the 11 pairs {pair_ratio:.2f}")
print(f"share of the step's FLOPs in those two: {2 * 2 * B * D * H / step_flops:.0%}")
print(f"MFU = {step_rate / 1e9:.1f} / {peak / 1e9:.1f} GFLOP/s = {step_rate / peak:.0%}")

# %% [markdown]
# Output:
# ```text
# profiled MLP step: 1,105,199,104 FLOPs in «time» ms (median of 11) = «rate» GFLOP/s
# its two large products alone: «rate» GFLOP/s; step / products, median of the 11 pairs «ratio»
# share of the step's FLOPs in those two: 97%
# MFU = «rate» / «rate» GFLOP/s = «number»%
# ```
#
# No: the step runs below its large products' rate (the median ratio of the pairs, which a
# busy machine disturbs least, is under 1.1, a margin for noise). They
# hold 97% of its counted FLOPs, but the step also runs three thin products (one side of 10)
# and the bias adds, ReLU, loss and SGD update, which take time for few or no counted FLOPs.
# That gap is what MFU measures in a real run too, where the usual thieves are waiting for
# data, for communication, for the host (section 4), or many small kernels.
#
# The same arithmetic sizes a GPU run. NVIDIA's datasheet gives the H200 SXM "141 GB" of
# memory and about 989 TFLOP/s of dense bf16 matmul (the larger figure there assumes 2:4
# sparsity; the H200 NVL, a PCIe card, has lower peaks: name the part). The cell assumes
# the datasheet's "141 GB" means GiB, 151 · 10⁹ bytes (unverified on a GPU; the memory a
# program can use is a little less). Before asking how fast a model trains on one, check
# that it fits: lesson 05 counted 16 bytes per parameter for weights, gradients and AdamW's
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
# across several GPUs (lesson 11's FSDP2), offload part of it to the host, or use an
# optimizer that keeps less. The 1-billion-parameter model fits with room for activations,
# and 60,000 tokens/s would be an MFU of 38%; a low MFU usually means the GPU waits (for
# data, for communication, for the host). MFU counts only the model's FLOPs: recomputation
# (activation checkpointing) makes the GPU do more work without raising MFU. The peak must
# match the dtype: fp32 matmuls have a much lower one.

# %% [markdown]
# ## 8. Three regimes: compute, memory, overhead
#
# Every kernel spends its time in one of three ways. It computes (its FLOPs at the
# core's peak: large matmuls); it waits for memory (a few FLOPs per byte it must read and
# write: elementwise ops); or it pays fixed costs that have nothing to do with its data
# (Python, dispatch, a launch: tiny ops). Which one a kernel is in decides what speeds it
# up: faster arithmetic (lower precision, tensor cores), fewer bytes (fusion, lesson 08),
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
# bytes come from memory (the first line prints your CPU's largest cache, 0 where Linux's
# sysfs is not there to say; if it holds 128 MiB, the bandwidth you measure is the
# cache's).
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


copy_s = min(time_runs(lambda: ye.copy_(xe), warmup=1, repeats=7))
bandwidth = 2 * 4 * ELEMS / copy_s  # bytes/s: read and write every float once
chain_s = min(time_runs(chain, warmup=1, repeats=7))
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
# byte, far right of the ridge point. Its roof is the flat peak: it reaches the share of
# the (estimated) peak that section 7 measured, while its bytes would allow 170 times the
# bandwidth, far more; arithmetic limits it. The chain does 1 FLOP per 8 bytes, far left:
# it runs near the slope (within a factor of 5 of it), limited by memory,
# whatever the core's peak. The 16² matmul has a middling intensity, but 8,192 FLOPs take
# less than 3 times as long as a 1×1 matmul: its time is the call, not the arithmetic or
# the bytes, and it sits far below both roofs (under half of either).
# (The regime is decided from the intensity against the ridge, and for overhead from the
# time against a 1×1 call, so the words are the same on every machine; the percentages
# are yours.)

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
# and writes the result once (lesson 08 compiles exactly this chain). The 16² matmul is in
# the basement: batch many small products into one call, or remove the per-call cost
# (CUDA graphs, compilation). On a GPU the same picture holds with a roof hundreds of times
# higher, and a launch of a few microseconds puts many more kernels in the basement.

# %% [markdown]
# ## 9. Memory on a GPU: pinned copies and the caching allocator
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
# 04, hands out batches already pinned). The same holds the other way, with a catch: after
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
# needs an accelerator: on a machine without one, `pin_memory()` raises.
# Pinned memory cannot be paged out, so it comes out of what the whole machine has: pin
# the buffers you copy from, not everything. The CUDA test `test_cuda_pinned_copies`
# copies 256 MiB: it checks that a non-blocking copy from pinned memory returns before the
# copy is done while one from pageable memory keeps the host waiting, records both
# bandwidths, and reads a non-blocking device-to-host copy only after synchronising.
#
# **The caching allocator.** Asking CUDA for memory (`cudaMalloc`) costs far more than a
# kernel launch, and giving it back (`cudaFree`) waits for the whole device, so PyTorch
# asks CUDA for large *segments* and hands out blocks from them itself. A freed tensor's
# block goes back to PyTorch's cache, not to CUDA: `torch.cuda.memory_allocated()` (bytes
# in live tensors) drops, while `torch.cuda.memory_reserved()` (bytes held from CUDA;
# `nvidia-smi` shows that plus the CUDA context) stays. The next tensor of that size reuses
# the block, much faster than the first one got it. `torch.cuda.empty_cache()` returns
# unused segments to CUDA; it does not free a live tensor, and a training loop rarely
# needs it.
#
# **Predict.** A 256 MiB tensor is made, deleted, made again, deleted, then `empty_cache()`
# runs. What do allocated and reserved read after each step? (`test_cuda_caching_allocator`
# asserts the answer and records the readings and the two allocation times.)
#
# A cache can fragment: a freed 512 MiB block cannot hold a 520 MiB tensor, so the
# allocator asks CUDA for a new 520 MiB segment and holds both.
# `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, set before the first CUDA call,
# makes segments that grow by mapping more memory at their end instead
# (`test_cuda_expandable_segments` runs that 512-then-520 MiB pattern in two fresh
# processes and compares what each reserves). And when memory runs out, a *memory
# snapshot* tells you what held it: `torch.cuda.memory._record_memory_history()` starts
# recording every allocation with its Python stack, `torch.cuda.memory._snapshot()` returns
# the segments, blocks and recorded events, and `torch.cuda.memory._dump_snapshot(path)`
# writes a file that <https://pytorch.org/memory_viz> draws as a timeline, each block with
# the Python line that allocated it.

# %% [markdown]
# ## Summary
#
# - A tensor lives on one device; `.to(device)` copies only when it must (and returns the
#   tensor itself otherwise); ops refuse inputs on different devices. Move the model and
#   data once, before the loop.
# - GPU calls queue work and return. Without a synchronize before reading the clock, you
#   time the launch, microseconds, whatever the work (section 2's simulated queue shows
#   it on the CPU). Synchronise the device that does the work, around the measurement,
#   never inside it.
# - Time honestly: warm up, repeat, take the median (one 50 ms stall moves the max and the
#   mean, not the median), quote a spread (IQR or min–max);
#   `torch.utils.benchmark.Timer.blocked_autorange` does this, with blocks of calls sized
#   to the work; timings on a shared machine vary, ratios and counts do not.
# - `.item()`, formatting or printing a tensor, `if tensor:`, `.cpu()` and `.tolist()`
#   read values on the host: on a GPU each one waits for the queue. On the CPU the
#   profiler's `aten::_local_scalar_dense` finds `.item()`, formatting and `if tensor:`,
#   not `.cpu()` (no copy there) or `.tolist()`; `torch.cuda.set_sync_debug_mode`
#   reports many, not all.
# - `torch.profiler` + `record_function` give a table (count by calls for what ran, by
#   self time for where the time went) and a Chrome trace; `schedule` + `prof.step()`
#   record chosen steps of a long run, `profile_memory` each op's allocations,
#   `with_stack` the Python frames behind each op.
# - A matmul costs 2·m·k·n FLOPs; a training step 6 FLOPs per weight that multiplies
#   (embeddings are gathers, 0 FLOPs) per token, plus attention's 12·L·d·S, which 6·N
#   leaves out (a third at S = 8,192 for a 4096-wide model). MFU = model FLOPs per second
#   ÷ peak; check that the training state (16 bytes per parameter) fits first.
# - A CPU core's peak is lanes × FLOPs per lane × clock (an estimate); the profiled MLP
#   step runs no faster than its own two large products alone (timed pair by pair), and
#   MFU is its rate over that peak.
# - Three regimes: compute-bound (large matmuls, at the flat roof), memory-bound
#   (elementwise chains, on the bandwidth slope), overhead-bound (tiny ops, far below
#   both). The roofline, min(peak, bandwidth × FLOPs per byte), tells the first two apart;
#   a comparison with an empty call finds the third.
# - On a GPU, copy from pinned memory with `non_blocking=True` to overlap copies with host
#   work; `memory_reserved` (what the caching allocator holds) exceeds `memory_allocated`
#   (live tensors); `expandable_segments` curbs fragmentation; a memory snapshot says who
#   held what.

# %% [markdown]
# ## Read the source
#
# Open these files in your editor: each path is relative to the folder that holds your
# installed `torch` (your site-packages), and the line numbers are those of your
# installation. The stops follow the lesson: the host read behind `.item()` and
# formatting, the benchmark timer, the profiler's schedule, the FLOP counter, and the
# counters of the CUDA caching allocator.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/_tensor.py", "def __format__(",
     "A 0-d tensor (a plain `Tensor`, not a subclass, not on the meta device) is formatted as "
     "`self.detach().item()`: an f-string of the loss is a host read, the `aten::detach` and "
     "`aten::item` that section 4 found in its `format` region."),
    ("torchgen/packaged/ATen/native/native_functions.yaml",
     "func: _local_scalar_dense(Tensor self) -> Scalar",
     "The op that reads one value into Python, with a kernel per device (CPU, CUDA, MPS); the "
     "CUDA kernel copies the value to the host and waits for the stream. `func: item`, a few "
     "entries above, has no `dispatch:` of its own: it is a composite that calls this op."),
    ("torch/utils/benchmark/utils/timer.py", "def _estimate_block_size(",
     "How `blocked_autorange` (just below) picks its block: 1, 10, 100, ... calls, until the "
     "timer's own overhead is at most 1e-4 of a block and a block lasts `min_run_time / 1000` "
     "(or one block outlasts `min_run_time`); these runs are its warm-up. `timer()` at the top "
     "of the file synchronises the accelerator before reading the clock, and `Timer.__init__` "
     "defaults to `num_threads=1`."),
    ("torch/profiler/profiler.py", "def schedule(",
     "`schedule_fn` turns a step number into NONE, WARMUP, RECORD or, on a cycle's last active "
     "step, RECORD_AND_SAVE, and returns NONE once `repeat` cycles are done (`repeat=0`, the "
     "default, cycles for ever); `profile.step()` "
     "asks it about the next step, and `action_map` calls `on_trace_ready` when "
     "RECORD_AND_SAVE ends."),
    ("torch/utils/flop_counter.py", "def mm_flop(",
     "`m * n * 2 * k`, section 6's 2·m·k·n, registered for `aten.mm`; `addmm_flop` reuses it, "
     "so a bias add counts nothing. `FlopCounterMode._count_flops` adds a count only for an op "
     "with a formula in `flop_registry`, and `_FlopCounterMode.__torch_dispatch__` first "
     "decomposes an op without one, where it can: nothing the embedding runs has one, so it "
     "counts 0."),
    ("torch/cuda/memory.py", "def memory_reserved(",
     "It reads `reserved_bytes.all.current` from the caching allocator's `memory_stats()`, "
     "where `memory_allocated`, two functions above, reads `allocated_bytes.all.current`: bytes held "
     "from CUDA against bytes in live tensors. `empty_cache`, near the top of the file, "
     "releases the cached memory that no tensor occupies."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/_tensor.py:«line»  `def __format__(`
#     A 0-d tensor (a plain `Tensor`, not a subclass, not on the meta device) is formatted
#     as `self.detach().item()`: an f-string of the loss is a host read, the
#     `aten::detach` and `aten::item` that section 4 found in its `format` region.
# torchgen/packaged/ATen/native/native_functions.yaml:«line»  `func: _local_scalar_dense(Tensor self) -> Scalar`
#     The op that reads one value into Python, with a kernel per device (CPU, CUDA, MPS);
#     the CUDA kernel copies the value to the host and waits for the stream. `func: item`,
#     a few entries above, has no `dispatch:` of its own: it is a composite that calls
#     this op.
# torch/utils/benchmark/utils/timer.py:«line»  `def _estimate_block_size(`
#     How `blocked_autorange` (just below) picks its block: 1, 10, 100, ... calls, until
#     the timer's own overhead is at most 1e-4 of a block and a block lasts `min_run_time
#     / 1000` (or one block outlasts `min_run_time`); these runs are its warm-up.
#     `timer()` at the top of the file synchronises the accelerator before reading the
#     clock, and `Timer.__init__` defaults to `num_threads=1`.
# torch/profiler/profiler.py:«line»  `def schedule(`
#     `schedule_fn` turns a step number into NONE, WARMUP, RECORD or, on a cycle's last
#     active step, RECORD_AND_SAVE, and returns NONE once `repeat` cycles are done
#     (`repeat=0`, the default, cycles for ever); `profile.step()` asks it about the next
#     step, and `action_map` calls `on_trace_ready` when RECORD_AND_SAVE ends.
# torch/utils/flop_counter.py:«line»  `def mm_flop(`
#     `m * n * 2 * k`, section 6's 2·m·k·n, registered for `aten.mm`; `addmm_flop` reuses
#     it, so a bias add counts nothing. `FlopCounterMode._count_flops` adds a count only
#     for an op with a formula in `flop_registry`, and
#     `_FlopCounterMode.__torch_dispatch__` first decomposes an op without one, where it
#     can: nothing the embedding runs has one, so it counts 0.
# torch/cuda/memory.py:«line»  `def memory_reserved(`
#     It reads `reserved_bytes.all.current` from the caching allocator's `memory_stats()`,
#     where `memory_allocated`, two functions above, reads `allocated_bytes.all.current`:
#     bytes held from CUDA against bytes in live tensors. `empty_cache`, near the top of
#     the file, releases the cached memory that no tensor occupies.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Predict.** A kernel queues 5 ms of device work and returns. You read the clock
#    (a) when the call returns, (b) after that device's `synchronize()`, (c) after
#    `torch.cpu.synchronize()`. What does each reading measure?
#
#    <details><summary>Answer</summary>
#
#    (a) The launch: on the simulated queue the median stays below a tenth of the 5 ms,
#    whatever the work, while (b) reads at least the 5 ms, and 4 queued launches at least
#    20 ms, the test checks (*§ Why GPU timings lie*). (c) The launch again: the CPU's
#    synchronize knows nothing of that device's queue, so the same loop times launches
#    (*§ Honest timing: warm-up, repeats, the median*). Synchronise the device that does the
#    work.
#
#    </details>
#
# 2. **Explain.** One of 21 timed calls is held up 50 ms by another process. Which of the
#    median, the mean and the max do you report, and why?
#
#    <details><summary>Answer</summary>
#
#    The median. The max holds the whole 50 ms and the mean carries at least a 21st of it,
#    while the median stays that of the undisturbed calls, below half the max (the test
#    checks all three). Quote it with the number of runs and a spread, such as the IQR
#    that `Timer.blocked_autorange` reports (*§ Honest timing: warm-up, repeats, the median*).
#
#    </details>
#
# 3. **Spot the bug.** Every step of a GPU training loop runs `log.append(loss.item())`,
#    `print(f"loss {loss:.4f}")`, `if loss < 1e-3: break` and `keep.append(pred.cpu())`.
#    Which of them does a CPU profile show reading a value on the host, and which does it
#    miss?
#
#    <details><summary>Answer</summary>
#
#    It shows three: `.item()`, the f-string (through `Tensor.__format__`: `aten::detach`,
#    `aten::item`) and the branch (`aten::lt`, then `bool()`'s `aten::is_nonzero`) each make
#    one `aten::_local_scalar_dense` per step, 5 in 5 steps. It misses `.cpu()`: on the CPU
#    that line runs only `aten::to` and reads nothing, because the tensor is already there,
#    so a CPU profile cannot show what it costs on a GPU. It would miss `.tolist()` too,
#    which reads its values without `_local_scalar_dense`
#    (*§ Hidden synchronisations in a training loop*).
#
#    </details>
#
# 4. **Predict.** `FlopCounterMode` counts one training step of an MLP (batch 1024,
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
# 5. **Explain.** A 16² matmul has an arithmetic intensity of 2.667 FLOP/byte, the
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

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement:
#
# 1. `matmul_flops(shape_a, shape_b)`: the FLOPs of `torch.matmul` on inputs of these
#    shapes, batch dimensions broadcast.
# 2. `mlp_step_flops(sizes, batch)`: the matmul FLOPs of one training step of a stack of
#    `nn.Linear` layers, as `FlopCounterMode` counts them.
# 3. `per_call_time(fn, sync, calls, warmup, clock)`: the time per call of `calls` queued
#    calls, synchronised only around them. The tests run it on a simulated GPU queue
#    like section 2's, with a fake clock.
#
# Check your answers with `make exercises N=06`; `solutions.py` has one way to write them.

# %% [markdown]
# # 06a · Devices and honest timing
#
# Every tensor lives on a device, and a GPU does its work *later*: a call queues a kernel
# and returns. That one fact decides how you must move data, how you must time code, and
# which innocent-looking lines of a training loop stall it. This lesson measures on the
# CPU what can be measured there, and says what a GPU would show (unverified on a GPU).
# Lesson 06b follows it: what a step costs in FLOPs, how close it gets to the hardware's
# peak, and where the memory of a GPU goes.
#
# **What you will learn**
#
# - where a tensor lives, which copies are explicit, and why data moves once and stays;
# - a device helper (cuda → mps → cpu, with an override);
# - why a timer without synchronisation measures the launch, not the work (seen on a
#   simulated device queue);
# - honest timing: warm-up, repeats, the median, `torch.utils.benchmark.Timer`, and how
#   much runs vary when other programs share the cores;
# - the hidden synchronisations of a training loop (`.item()`, printing, branching on a
#   tensor, `.cpu()`), found in the profiler's op list;
# - `torch.profiler` with `record_function` regions, a sorted table and a Chrome trace;
#   a `schedule` with `prof.step()`, `profile_memory` and `with_stack`.
#
# **Prerequisites:** this part follows lesson 05b in the course, and assumes nothing from
# it. It uses lesson 02 (ATen ops and the dispatcher), lessons 03a and 03b (a training
# step: forward, backward, optimizer) and lesson 04a (a module's parameters and buffers).
#
# **How to run:** `python lessons/06a_devices_and_timing/devices_and_timing.py` or `make
# lesson N=06a` from the repository root, or open `devices_and_timing.ipynb`. It runs on the
# CPU in about ten seconds. Timings change from run to run: the *Output* blocks write them
# as placeholders such as `«time»` and `«ratio»`; everything else prints as shown. Run
# outside the course's venv, this lesson may also print PyTorch's own diagnostic lines to
# stderr: `USDT: ... profiler_start` and `profiler_stop` around each profiler run and, on a
# CUDA build without a GPU, `gpuGetDeviceCount failed`. They are harmless, and the course's
# venv (`.venv`, made by any `make lesson`) turns them off.

# %%
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils import benchmark

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: comparable timings
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
# same device", unverified on a GPU). The exception is a 0-d CPU tensor, which ops accept
# next to a tensor on another device as if it were a Python number (the last line).
#
# On a GPU machine `x.to("cuda")` is a real copy over PCIe or NVLink, and it is paid each
# time the line runs. Hence the rule *move once and stay*: put the model and the data on
# the device once, before the loop, and keep every intermediate there. The costly
# patterns are data that starts every step on the host (a batch built on the CPU, a
# tensor made without `device=`) and results pulled back every step (`.cpu()`, section 4).
#
# **Predict.** A module moves differently from a tensor. After `net.to(torch.float64)`
# and `t.to(torch.float64)` (a dtype change goes through the same `.to` as a device
# change, and is a real copy on the CPU too), which of `net` and `t` has changed? And
# does a BatchNorm's integer step counter, one of its buffers, become float64 too?

# %%
net = nn.Linear(4, 2)
t = torch.randn(4)  # (4,) float32
moved_net, moved_t = net.to(torch.float64), t.to(torch.float64)
print(f"net.to(...) is net: {moved_net is net}  weight now {net.weight.dtype}")
print(f"t.to(...) is t: {moved_t is t}  t still {t.dtype}, the copy {moved_t.dtype}")
net = net.float()  # back to float32 (in place, like any Module.to)
bn = nn.BatchNorm1d(3).to(torch.float64)  # buffers: running_mean, running_var, num_batches_tracked
print(f"BatchNorm1d.to(float64): running_mean {bn.running_mean.dtype}, "
      f"num_batches_tracked {bn.num_batches_tracked.dtype}")
bn.to("meta")  # a device: every parameter and buffer goes
on_meta = all(v.device.type == "meta" for v in [*bn.parameters(), *bn.buffers()])
print(f"BatchNorm1d.to('meta'): every parameter and buffer on meta: {on_meta}")

# %% [markdown]
# Output:
# ```text
# net.to(...) is net: True  weight now torch.float64
# t.to(...) is t: False  t still torch.float32, the copy torch.float64
# BatchNorm1d.to(float64): running_mean torch.float64, num_batches_tracked torch.int64
# BatchNorm1d.to('meta'): every parameter and buffer on meta: True
# ```
#
# `Module.to` changes the module in place (every parameter and buffer for a device; only
# the floating-point ones for a dtype, so BatchNorm's step counter stays an integer) and
# returns it, so `model.to(device)` needs no assignment; `Tensor.to` returns a new tensor
# and leaves the original where it was, so `batch = batch.to(device)` does. Forgetting
# that assignment is the classic way to end up with the model on the GPU and the data
# still on the CPU: the first op raises the device error above.
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
work_ms = gpu.work * 1e3
print(f"device work per launch: {work_ms:.1f} ms")
for k, v in med.items():
    print(f"{k:<14} median over 7: {v:.3f} ms")
print(f"sync / no sync {med['sync'] / med['no sync']:.0f}")
print(f"no sync below a tenth of the work: {med['no sync'] < 0.1 * work_ms}")
print(f"sync at least the work: {med['sync'] >= work_ms}")
print(f"4 calls, sync at least 4x the work: {med['4 calls, sync'] >= 4 * work_ms}")

# %% [markdown]
# Output:
# ```text
# device work per launch: 5.0 ms
# no sync        median over 7: «time» ms
# sync           median over 7: «time» ms
# 4 calls, sync  median over 7: «time» ms
# sync / no sync «ratio»
# no sync below a tenth of the work: True
# sync at least the work: True
# 4 calls, sync at least 4x the work: True
# ```
#
# Without the synchronize the clock reads the launch, microseconds, whatever the work:
# that is the lie, and a real GPU's clock lies the same way. With it, the clock reads the
# 5 ms of device time plus the sleep's wake-up (usually a fraction of a millisecond). Four
# launches cost the host four launches and the device works through them back to back,
# so the clock reads 20 ms at the synchronize. The medians and their ratio change from
# run to run; the last three lines do not. So: synchronise before reading a clock, and
# never inside the work you time, or the device idles while Python launches the next
# call. The exercise at the end of the lesson uses the same queue with a fake clock, which
# makes every reading exact.

# %% [markdown]
# ## 3. Honest timing: warm-up, repeats, the median
#
# One run tells you little: the first call pays one-time costs (lazy initialisation,
# memory allocation, on a GPU the CUDA context and autotuning), and any run can be hit by
# another process on the same cores. The recipe: a few untimed warm-up calls, many timed
# repeats, each stopped after a synchronize *of the device that does the work*, and the
# median, which one slow outlier does not move.
#
# **Predict.** Make a guess: over 21 repeats of a 512² matmul, how far apart are the
# fastest and the slowest run? And what does the same loop report for the simulated GPU
# if it synchronises the CPU instead of the simulated device?


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
      f"{sim['own']:.3f} ms, with the CPU's {sim['cpu'] * 1e3:.1f} us")

# %% [markdown]
# Output:
# ```text
# 21 runs: min «time» ms, median «time» ms, max «time» ms
# slowest / fastest «ratio»
# simulated GPU, 5.0 ms per call: with its own synchronize «time» ms, with the CPU's «time» us
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
# disturbed the run; the median hardly moves: it is still the time of an ordinary call.
# That is why the median is the number to report, with the number of runs, and why a
# difference of a few percent between two medians is noise until it holds over several
# runs of the whole measurement.
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
print(f"Timer: {len(meas.times)} measurements, block size {meas.number_per_run}, "
      f"{meas.task_spec.num_threads} thread")  # calls per measurement: 1, 10, 100, ...
print(f"Timer median / loop median {meas.median * 1e3 / mid:.2f}")
a64, b64, c64 = torch.randn(64, 64), torch.randn(64, 64), torch.empty(64, 64)  # (64, 64) each
meas64 = benchmark.Timer("torch.mm(a, b, out=c)",
                         globals={"torch": torch, "a": a64, "b": b64, "c": c64}).blocked_autorange()
print(f"64x64 matmul: blocks of {meas64.number_per_run} calls, median {meas64.median * 1e6:.1f} us")

# %% [markdown]
# Output:
# ```text
# Timer: median «time» ms, IQR «time» ms
# Timer: «number» measurements, block size «number», 1 thread
# Timer median / loop median «ratio»
# 64x64 matmul: blocks of «number» calls, median «time» us
# ```
#
# The two medians come out of the same size, not equal: they ran at different moments,
# and on a shared machine either can be pushed up. `blocked_autorange` chose how many
# calls to group per measurement by itself: one call of a 512² matmul already lasts
# milliseconds, so blocks stay small; a 64² matmul lasts microseconds, and its blocks hold
# far more calls. The IQR (the spread of the middle half of the measurements) is the
# honest error bar to quote with the median. Both timings pass `out=c`: a fresh 1 MiB
# output per call would add the allocator's work to what we measure (and, for outputs of
# tens of MiB, page faults as each fresh output is mapped into memory: lesson 08b counts
# them).

# %% [markdown]
# ## 4. Hidden synchronisations in a training loop
#
# On a GPU anything that needs a tensor's *value* on the host waits for the queue to drain:
# `.item()`, `float(t)`, printing or formatting a tensor, `if t > 0:`, `.cpu()`,
# `.tolist()`. Each one costs a round trip and leaves the GPU idle while Python catches up.
# On the CPU they cost nothing special, but the profiler still shows where they are: the
# op that turns a tensor into a Python number is `aten::_local_scalar_dense`. Inside
# `with torch.profiler.profile() as prof:` every op that runs is recorded, and
# `record_function("name")` puts the ops of a block under a region of that name; each
# recorded event's `cpu_parent` is the region or op it ran inside. Section 5 shows these
# tools in full.
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


def host_reads(fn):
    """aten::_local_scalar_dense calls while fn runs."""
    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
    return sum(e.name == "aten::_local_scalar_dense" for e in p.events())


loss = nn.functional.mse_loss(lin(xs), ys)  # a 0-d tensor with a grad_fn, like the loop's
fmt_reads, print_reads = host_reads(lambda: f"{loss:.4f}"), host_reads(lambda: str(loss))
print(f"f-string: {fmt_reads} host read; str(loss), what print(loss) writes, more: {print_reads > fmt_reads}")

# %% [markdown]
# Output:
# ```text
# log .item()  host reads 5 in 5 steps, ops ['aten::item']
# format       host reads 5 in 5 steps, ops ['aten::detach', 'aten::item']
# branch       host reads 5 in 5 steps, ops ['aten::is_nonzero', 'aten::lt']
# .cpu()       host reads 0 in 5 steps, ops ['aten::to']
# last step: loss 1.6392, stop False
# .tolist() of 64 values: ops ['aten::resolve_conj', 'aten::resolve_neg']
# f-string: 1 host read; str(loss), what print(loss) writes, more: True
# ```
#
# Three of the four lines read a value every step: `.item()` directly, formatting through
# `Tensor.__format__` (which calls `.detach().item()` on a 0-d tensor), and the branch
# through `bool()`, which dispatches `aten::is_nonzero`, which calls `item`. On a GPU each
# of the three would stall it once per step. `.cpu()` shows only `aten::to` here because the
# tensor already is on the CPU (section 1: no copy); on a GPU the same line is
# `aten::_to_copy` + `aten::copy_`, a device-to-host copy that waits for the queue
# (unverified on a GPU). On the CPU, `.tolist()` reads the values without passing through
# `_local_scalar_dense`: searching a profile for that op does not find it. Printing the
# tensor itself is worse than the f-string (last line): `print(loss)` writes `str(loss)`,
# and the tensor printer reads values several times while it chooses a format.
#
# The fix is to keep values on the device and read them rarely: accumulate
# `total += loss.detach()` and call `.item()` once every N steps; decide on early stopping
# every N steps; keep predictions on the device and move them once, at the end.
#
# On CUDA, `torch.cuda.set_sync_debug_mode("warn")` (or `"error"`) reports synchronising
# calls as they happen, an `.item()` among them (unverified on a GPU). It is a debugging
# aid, not a proof that a loop is free of them.
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
# regions. On a GPU you would add `ProfilerActivity.CUDA` and see each kernel next to the
# op that launched it.
#
# **Predict.** A 2-layer MLP (batch 1024, 512 → 512 → 10) trains for 3 steps in regions
# `forward`, `backward` and `optimizer`. Make a guess: which ops run most often, and which
# share of the time goes to matrix multiplies?

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
# `transpose`, `as_strided`: new metadata, no data moved; `resolve_conj`, a check that
# `mm` and `addmm` make on their matrices, which returns a real tensor unchanged, since
# only a lazily conjugated complex tensor needs work) and the SGD update's `add_`; the
# time is elsewhere: the two matmul ops take most of it (more than half; one preemption by
# another process can land in any op and move the share), since each linear layer runs
# one `addmm` forward and up to two `mm` backward. Read a profile both ways: *counts* tell
# you what your code asked for (e.g. how many host reads per step), *self time* where the
# time went.

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
# slow op in a large model is traced back to the line of model code that issued it.


# %% [markdown]
# ## Summary
#
# - A tensor lives on one device; `.to(device)` copies only when it must (and returns the
#   tensor itself otherwise); ops refuse inputs on different devices, except a 0-d CPU
#   tensor. `Module.to` moves a module in place (a dtype: only its floating-point tensors),
#   `Tensor.to` returns a new tensor. Move the model and data once, before the loop.
# - GPU calls queue work and return. Without a synchronize before reading the clock, you
#   time the launch, microseconds, whatever the work (section 2's simulated queue shows
#   it on the CPU). Synchronise the device that does the work, around the measurement,
#   never inside it.
# - Time honestly: warm up, repeat, take the median (one 50 ms stall moves the max and the
#   mean, not the median), quote a spread (IQR or min–max);
#   `torch.utils.benchmark.Timer.blocked_autorange` does this, with blocks of calls sized
#   to the work. Timings, and ratios of timings, vary from run to run; counts (calls, host
#   reads, bytes) do not.
# - `.item()`, formatting or printing a tensor, `if tensor:`, `.cpu()` and `.tolist()`
#   read values on the host: on a GPU each one waits for the queue. On the CPU the
#   profiler's `aten::_local_scalar_dense` finds `.item()`, formatting and `if tensor:`,
#   not `.cpu()` (no copy there) or `.tolist()`; `print(loss)` reads more than an
#   f-string; `torch.cuda.set_sync_debug_mode` reports many, not all.
# - `torch.profiler` + `record_function` give a table (count by calls for what ran, by
#   self time for where the time went) and a Chrome trace; `schedule` + `prof.step()`
#   record chosen steps of a long run, `profile_memory` each op's allocations,
#   `with_stack` the Python frames behind each op.

# %% [markdown]
# ## References
#
# - [`torch.Tensor.to`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.to.html) and
#   [`torch.nn.Module.to`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.Module.html#torch.nn.Module.to):
#   when a tensor is copied, and why a module moves in place (section 1).
# - [`torch.cuda.synchronize`](https://docs.pytorch.org/docs/2.13/generated/torch.cuda.synchronize.html) and
#   [`torch.cuda.Event`](https://docs.pytorch.org/docs/2.13/generated/torch.cuda.Event.html): waiting for a device's
#   queue, and timestamps taken by the GPU itself (sections 2 and 3).
# - [`torch.Tensor.item`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.item.html) and
#   [`torch.cuda.set_sync_debug_mode`](https://docs.pytorch.org/docs/2.13/generated/torch.cuda.set_sync_debug_mode.html):
#   a host read, and the switch that reports many of them (section 4).
# - [`torch.profiler`](https://docs.pytorch.org/docs/2.13/profiler.html): `profile`, `schedule`,
#   `record_function` and `tensorboard_trace_handler`, the tools of section 5.

# %% [markdown]
# ## Read the source
#
# Open these files in your editor: each path is relative to the folder that holds your
# installed `torch` (your site-packages), and the line numbers are those of your
# installation. The stops follow the lesson: the host read behind `.item()` and
# formatting and the wait it makes on CUDA, the benchmark timer, and the profiler's
# regions and schedule.

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
     "The op that reads one value into Python, with a kernel per device (CPU, CUDA, MPS). "
     "`func: item`, a few entries above, has no `dispatch:` of its own: it is a composite that "
     "calls this op."),
    ("torch/include/c10/cuda/CUDAFunctions.h", "C10_CUDA_API void __inline__ memcpy_and_sync(",
     "What the CUDA kernel, `_local_scalar_dense_cuda`, calls to fetch the value (unverified on "
     "a GPU): `cudaMemcpyAsync` to the host, then `cudaStreamSynchronize`, the wait behind "
     "every host read of section 4. Before them it calls `warn_or_error_on_sync()` when "
     "`torch.cuda.set_sync_debug_mode` has turned the check on."),
    ("torch/utils/benchmark/utils/timer.py", "def _estimate_block_size(",
     "How `blocked_autorange` (just below) picks its block: 1, 10, 100, ... calls, until the "
     "timer's own overhead is at most 1e-4 of a block and a block lasts `min_run_time / 1000` "
     "(or one block outlasts `min_run_time`); these runs are its warm-up. `timer()` at the top "
     "of the file synchronises the accelerator before reading the clock, and `Timer.__init__` "
     "defaults to `num_threads=1`."),
    ("torch/autograd/profiler.py", "class record_function(",
     "The region of section 5: entering it records an op named after your label, so the "
     "profiler nests every op that runs inside under it, in the table, the trace and "
     "`cpu_parent`."),
    ("torch/profiler/profiler.py", "def schedule(",
     "`schedule_fn` turns a step number into NONE, WARMUP, RECORD or, on a cycle's last active "
     "step, RECORD_AND_SAVE, and returns NONE once `repeat` cycles are done (`repeat=0`, the "
     "default, cycles for ever); `profile.step()` "
     "asks it about the next step, and `action_map` calls `on_trace_ready` when "
     "RECORD_AND_SAVE ends."),
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
#     The op that reads one value into Python, with a kernel per device (CPU, CUDA, MPS).
#     `func: item`, a few entries above, has no `dispatch:` of its own: it is a composite
#     that calls this op.
# torch/include/c10/cuda/CUDAFunctions.h:«line»  `C10_CUDA_API void __inline__ memcpy_and_sync(`
#     What the CUDA kernel, `_local_scalar_dense_cuda`, calls to fetch the value
#     (unverified on a GPU): `cudaMemcpyAsync` to the host, then `cudaStreamSynchronize`,
#     the wait behind every host read of section 4. Before them it calls
#     `warn_or_error_on_sync()` when `torch.cuda.set_sync_debug_mode` has turned the check
#     on.
# torch/utils/benchmark/utils/timer.py:«line»  `def _estimate_block_size(`
#     How `blocked_autorange` (just below) picks its block: 1, 10, 100, ... calls, until
#     the timer's own overhead is at most 1e-4 of a block and a block lasts `min_run_time
#     / 1000` (or one block outlasts `min_run_time`); these runs are its warm-up.
#     `timer()` at the top of the file synchronises the accelerator before reading the
#     clock, and `Timer.__init__` defaults to `num_threads=1`.
# torch/autograd/profiler.py:«line»  `class record_function(`
#     The region of section 5: entering it records an op named after your label, so the
#     profiler nests every op that runs inside under it, in the table, the trace and
#     `cpu_parent`.
# torch/profiler/profiler.py:«line»  `def schedule(`
#     `schedule_fn` turns a step number into NONE, WARMUP, RECORD or, on a cycle's last
#     active step, RECORD_AND_SAVE, and returns NONE once `repeat` cycles are done
#     (`repeat=0`, the default, cycles for ever); `profile.step()` asks it about the next
#     step, and `action_map` calls `on_trace_ready` when RECORD_AND_SAVE ends.
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
#    20 ms (*§ Why GPU timings lie*). (c) The launch again: the CPU's synchronize knows
#    nothing of that device's queue, so the same loop times launches
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
#    while the median hardly moves: it is still the time of an ordinary call. Quote it
#    with the number of runs and a spread, such as the IQR that `Timer.blocked_autorange`
#    reports (*§ Honest timing: warm-up, repeats, the median*).
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
# 4. **Predict.** A profiler runs with `schedule(wait=0, warmup=1, active=1, repeat=2)`
#    over 6 training steps numbered 0 to 5, each ending in `prof.step()`. Which steps are
#    recorded, at which `prof.step_num` is `on_trace_ready` called, and what do steps 4
#    and 5 cost?
#
#    <details><summary>Answer</summary>
#
#    A cycle is now two steps, one warm-up and one recorded, run twice: step 0 warms up,
#    step 1 is recorded and the handler runs as it ends (`step_num` 2); step 2 warms up,
#    step 3 is recorded, the handler runs at `step_num` 4. After `repeat` cycles nothing is
#    profiled, so steps 4 and 5 run at full speed, as steps 4 and 5 did after the lesson's
#    single cycle (*§ The profiler: named regions, a sorted table, a Chrome trace*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement:
#
# 1. `per_call_time(fn, sync, calls, warmup, clock)`: the time per call of `calls` queued
#    calls, synchronised only around them. It is checked on a simulated GPU queue like
#    section 2's, with a fake clock, so every reading is exact.
#
# Check your answer with `make exercises N=06a`; `solutions.py` has one way to write it.

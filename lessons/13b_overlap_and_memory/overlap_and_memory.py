# %% [markdown]
# # 13b · Composing parallelism: overlap, memory, several machines, compile
#
# Part 13a composed tensor parallelism and FSDP2 on a 2-D mesh of 4 ranks and counted the
# bytes every strategy sends. This part, the second of three, asks what a real job needs next:
# whether those bytes travel while the ranks compute (overlap), how to fit the model and its
# activations (activation checkpointing, building on the meta device, clipping sharded
# gradients), how the same 4 ranks start as two machines, and how `torch.compile` works
# inside DDP and FSDP2. Part 13c applies torchtitan's recipe.
#
# **What you will learn**
#
# - FSDP2's issue order (forward and backward prefetching), and what overlaps on gloo: its
#   collectives are synchronous by default; `module.unshard(async_op=True)`, and
#   `dist.all_reduce(..., async_op=True)` with its handle's `wait()`, overlap; what CUDA
#   does instead;
# - activation checkpointing under FSDP2 (what a block keeps, the peak, the gradients),
#   building on the meta device with `to_empty`, `clip_grad_norm_` over DTensors;
# - how 4 ranks start as 2 "nodes" (two torchrun agents, one rendezvous), and which mesh
#   dimension belongs inside a node;
# - compile inside DDP and FSDP2: DDPOptimizer cuts the graph at bucket boundaries; which
#   order breaks the graph; FSDP2's hooks stay outside the compiled blocks;
# - graded exercises: data parallelism written by hand, naive, then bucketed and overlapped.
#
# **Prerequisites:** part 13a (the model, the 2-D mesh, `fully_shard` over it), lesson 06a
# (the profiler), lessons 08a and 08b (torch.compile) for section 4.
#
# **How to run:** `python lessons/13b_overlap_and_memory/overlap_and_memory.py` or `make
# lesson N=13b` from the repository root, or open `overlap_and_memory.ipynb`. It launches
# `worker.py` once on 4 CPU ranks as two torchrun agents, with the course's kit
# (`lessons/multirank.py`, lesson 09; the cell prints how long it took); sections 1 to 3 read
# that launch's output, section 4 compiles in this process. The cells that start with
# `#@worker` are the code each rank runs, written into `worker.py`; executing them here only
# defines functions. Run the worker yourself with `torchrun --standalone --nproc-per-node=4
# lessons/13b_overlap_and_memory/worker.py main` (or two agents, section 3). Each printing
# cell is followed by an *Output* block: what it printed with the pinned PyTorch (2.13.0).
# A plain run may also print, to stderr, profiler lines (`USDT: ... profiler_start`) and,
# on a CUDA build without a GPU, `No CUDA runtime is found`: harmless.

# %%
import re
import sys
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

# lessons/ (the course's multi-rank kit and source map), then this folder (model.py, part 13a's model)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] if "__file__" in globals() else Path.cwd().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from multirank import launch, section, show

# %% [markdown]
# ## 1. Overlap: when FSDP2's collectives travel
#
# Communication hides behind computation only if it is *issued* before the computation that
# could hide it, and runs while that computation does. FSDP2 issues each unit's all-gather
# in the unit's pre-forward hook, so by default block 1's parameters are requested when
# block 1 starts. `blocks[0].set_modules_to_forward_prefetch([blocks[1]])` asks block 0 to
# issue block 1's all-gather as well when it starts; `set_modules_to_backward_prefetch` is
# the same for backward. The rank code starts with its imports and part 13a's `fsdp` (each
# block a unit, the root last) and `Wire` (a dispatch mode that records each collective),
# which now also notes when each collective was issued and keeps its handle.

# %%
#@worker
import importlib.util
import os
import time

import torch
import torch.distributed as dist
from model import BIG, HEADS, Block, Model, S, batch, build, init_weights, loss_fn
from multirank import heading, say, serve, shared
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

KINDS = {"allreduce_": "all-reduce", "all_reduce": "all-reduce", "_allgather_base_": "all-gather",
         "all_gather_into_tensor": "all-gather", "_reduce_scatter_base_": "reduce-scatter",
         "reduce_scatter_tensor": "reduce-scatter"}
QUIET = {"wait_tensor", "_wrap_tensor_autograd"}  # funcol bookkeeping, not collectives
ROUNDING = 1e-12  # float64 gaps below this are rounding: the order of additions, not the math


def fsdp(model, mesh, **kw):
    """fully_shard bottom-up: each block is a unit, the root takes embed, norm and head."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **kw)
    return fully_shard(model, mesh=mesh, **kw)


class Wire(TorchDispatchMode):
    """Records every collective dispatched while it is active: kind, group ranks, elements,
    the last DTensor op before it, when it was issued, its handle (c10d ops) and, where the
    handle has a future, when it completed."""

    def __init__(self):
        super().__init__()
        self.calls, self.start, self.op = [], time.perf_counter(), None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            self.op = func.overloadpacket.__name__
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.namespace in ("c10d", "_c10d_functional") and name not in QUIET:
            self.record(KINDS.get(name, name), args, out)
        return out

    def now(self):
        return time.perf_counter() - self.start

    def record(self, kind, args, out):
        groups = [a for a in args if isinstance(a, torch.ScriptObject)]
        if groups:  # c10d op: (outputs, inputs, group, ...); it returns (..., work)
            group, work = dist.ProcessGroup.unbox(groups[0]), dist.distributed_c10d.Work.unbox(out[-1])
            tensors = args[1] if kind == "reduce-scatter" else args[0]
        else:  # functional collective: (tensor, ..., group name)
            group, work, tensors = dist.distributed_c10d._resolve_process_group(args[-1]), None, args[0]
        tensors = tensors if isinstance(tensors, (list, tuple)) else [tensors]
        size = sum(t.numel() for t in tensors) * (group.size() if kind == "all-gather" and not groups else 1)
        call = {"kind": kind, "ranks": dist.get_process_group_ranks(group), "numel": size,
                "bytes": size * tensors[0].element_size(), "op": self.op, "issued": self.now(), "done": None,
                "work": work}
        self.calls.append(call)
        try:  # the work runs on gloo's threads: note when it completes
            work.get_future().then(lambda _: call.update(done=self.now()))
        except (AttributeError, RuntimeError):  # no handle; "Work::getFuture not implemented" (reduce-scatter)
            pass

    def in_flight(self):
        """How many recorded all-gathers have not completed yet (asked of their handles)."""
        return sum(1 for c in self.calls if c["kind"] == "all-gather" and not c["work"].is_completed())


# %%
torch.manual_seed(0)
torch.set_num_threads(1)  # the ranks get one thread each too (the kit sets OMP_NUM_THREADS=1)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
WORKER = HERE / "worker.py"

# %% [markdown]
# The worker runs FSDP2 over the 4 ranks (float32, 32 sequences per rank) with and without
# explicit prefetching, and records on one clock per rank when each block computed (module
# hooks for forward, gradient hooks on each block's output and input for backward) and,
# each time a block's computation begins or ends, how many all-gathers are still in flight
# (`work.is_completed()` on each one's handle).
#
# **Predict.** Without explicit prefetching, is block 1's all-gather issued before block 0
# computes? With it? In backward, is block 1's reduce-scatter issued before block 0's
# backward? And is any all-gather still travelling while a block computes?

# %%
#@worker
def traced_step(model, tokens, wire):
    """One forward + backward: [(label, start, end)] of each block's forward and backward on
    wire's clock, and the most all-gathers in flight at any block's start or end."""
    spans, open_, flying = [], {}, [0]

    def begin(key):
        flying[0] = max(flying[0], wire.in_flight())
        open_[key] = wire.now()

    def end(key):
        flying[0] = max(flying[0], wire.in_flight())
        spans.append((key, open_.pop(key), wire.now()))

    handles = []
    for i, block in enumerate(model.blocks):
        def pre(mod, args, i=i):
            begin(f"fwd {i}")
            args[0].register_hook(lambda g: end(f"bwd {i}"))  # the grad of its input: done
        def post(mod, args, out, i=i):
            end(f"fwd {i}")
            out.register_hook(lambda g: begin(f"bwd {i}"))  # the grad of its output: starts
        handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]
    with wire:
        loss_fn(model, tokens).backward()
    for h in handles:
        h.remove()
    return sorted(spans, key=lambda s: s[1]), flying[0]


def fsdp_model(device, prefetch, tokens):
    """FSDP2 over all 4 ranks (float32), with or without explicit prefetching; one warm-up."""
    mesh = init_device_mesh(device.type, (4,), mesh_dim_names=("all",))
    model = fsdp(build(torch.float32, device), mesh)
    if prefetch:  # each block gathers the next one's parameters when it starts
        model.blocks[0].set_modules_to_forward_prefetch([model.blocks[1]])
        model.blocks[1].set_modules_to_backward_prefetch([model.blocks[0]])
    loss_fn(model, tokens).backward()
    return model


def step_time(model, tokens, repeat=3):
    """Seconds per forward + backward, the median of `repeat` (a barrier before each)."""
    times = []
    for _ in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        loss_fn(model, tokens).backward()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def show_overlap(device):
    heading("overlap")
    _, mine = batch(device, 4, dist.get_rank(), size=4 * BIG)
    steps, traces = {}, {}
    for prefetch in (False, True):
        model = fsdp_model(device, prefetch, mine)
        wire = Wire()
        spans, flying = traced_step(model, mine, wire)
        at = {k: (a, b) for k, a, b in spans}
        gathers = [c["issued"] for c in wire.calls if c["kind"] == "all-gather"]  # root, 0, 1, then backward
        scatters = [c["issued"] for c in wire.calls if c["kind"] == "reduce-scatter"]  # 1, 0, root
        p = f"prefetch {prefetch!s:5s}:"
        shared(f"{p} all-gathers {len(gathers)}, reduce-scatters {len(scatters)}")
        shared(f"{p} blocks.1's all-gather issued before blocks.0's forward began: "
               f"{gathers[2] < at['fwd 0'][0]}, after it ended: {gathers[2] > at['fwd 0'][1]}")
        shared(f"{p} blocks.0's backward all-gather issued after blocks.1's and before blocks.1's backward "
               f"began: {gathers[3] < gathers[4] < at['bwd 1'][0]}")
        shared(f"{p} blocks.1's reduce-scatter issued before blocks.0's backward began: "
               f"{scatters[0] < at['bwd 0'][0]}")
        flown = torch.tensor([flying])
        dist.all_reduce(flown, op=dist.ReduceOp.MAX)
        shared(f"{p} all-gathers in flight when a block's computation began or ended, most on any rank: "
               f"{flown.item()} of {len(gathers)}")
        traces[prefetch] = (spans, wire)
        steps[prefetch] = step_time(model, mine)
    shared(f"step time with prefetch / without: {steps[True] / steps[False]:.2f}")
    return traces


def every_section(device, answers=None):
    """Sections 1 to 3, in order: what the lesson's launch runs."""
    traces = show_overlap(device)
    show_unshard(device)
    heading("async")
    show_async(device)
    heading("timeline")
    for prefetch, (spans, wire) in traces.items():
        timeline(prefetch, spans, wire)
    show_memory(device)
    show_nodes(device)


def main():
    solutions = str(Path(__file__).with_name("solutions.py"))
    serve({"main": every_section, "nodes": lambda device, answers: show_nodes(device),
           "exercises": show_exercises},
          lambda parser: parser.add_argument("--answers", nargs="+", default=[solutions]))


# %%
run = launch(WORKER, ["main"], nproc=2, nnodes=2, timeout=300)
print(f"exit code {run.code} after {run.seconds:.0f} s, output from ranks {sorted(run.out)}")
show(run, "overlap")

# %% [markdown]
# Output:
# ```text
# exit code 0 after «time» s, output from ranks [0, 1, 2, 3]
# rank 0: prefetch False: all-gathers 5, reduce-scatters 3
# rank 0: prefetch False: blocks.1's all-gather issued before blocks.0's forward began: False, after it ended: True
# rank 0: prefetch False: blocks.0's backward all-gather issued after blocks.1's and before blocks.1's backward began: True
# rank 0: prefetch False: blocks.1's reduce-scatter issued before blocks.0's backward began: True
# rank 0: prefetch False: all-gathers in flight when a block's computation began or ended, most on any rank: 0 of 5
# rank 0: prefetch True : all-gathers 5, reduce-scatters 3
# rank 0: prefetch True : blocks.1's all-gather issued before blocks.0's forward began: True, after it ended: False
# rank 0: prefetch True : blocks.0's backward all-gather issued after blocks.1's and before blocks.1's backward began: True
# rank 0: prefetch True : blocks.1's reduce-scatter issued before blocks.0's backward began: True
# rank 0: prefetch True : all-gathers in flight when a block's computation began or ended, most on any rank: 0 of 5
# rank 0: step time with prefetch / without: «ratio»
# ```

# %% [markdown]
# `main()` hands the kit's `serve` the parts this worker can run: `serve` joins the process
# group, runs the part named on the command line (`main`: sections 1 to 3) and ends the group
# on every path (lesson 09). The launch ran two torchrun agents of 2 ranks; section 3 takes
# that apart.
#
# **The order.** Without prefetching, block 1's all-gather is issued after block 0's forward
# ended; with it, before block 0's forward began. In backward the two settings read the
# same: without being told (its default backward prefetch), FSDP2 issues block 0's
# all-gather in block 1's pre-backward hook, right after block 1's own and before block 1's
# backward computes; block 1's reduce-scatter is issued before block 0's backward begins.
#
# **No overlap here.** Yet no all-gather was in flight when any block's computation began or
# ended, with or without prefetching. FSDP2 calls its all-gathers synchronously by default
# (`unshard_async_op = False` in `_fsdp_param_group.py`), its reduce-scatters too (no
# `async_op` is passed in `_fsdp_collectives.py`; both read from the installed source), and
# on gloo a synchronous all-gather holds the calling thread until it is done: prefetching
# changed *when* each all-gather ran, not that the thread waited for it. On CUDA the same
# calls only enqueue each collective on FSDP2's own all-gather and reduce-scatter streams
# and return, and the computation on the default stream runs beside them: that is FSDP2's
# default overlap (unverified on a GPU). There, says the docstring of
# `set_modules_to_forward_prefetch` (read from `_fully_shard.py`), a list of one module, the
# next, gives the same overlap as the default, only issued earlier from the CPU; a list of
# two or more overlaps more, at the price of more reserved memory.
#
# The step-time ratio is printed, not promised: 4 ranks sharing a few CPU cores, it moves
# from run to run.
#
# **Overlap on gloo, by hand.** `module.unshard(async_op=True)` issues a unit's all-gather and
# returns an `UnshardHandle` at once; FSDP2 waits for it in the unit's pre-forward, or you
# call `handle.wait()` earlier. The worker makes the last rank join 0.3 s late (a slow peer,
# so that the collective cannot finish at once), calls `blocks[1].unshard(...)` on every
# rank, computes something that does not need block 1, then waits; once with `async_op=True`,
# once with the default.
#
# **Predict.** On rank 0, is block 1's all-gather still in flight when the computation
# begins, in each case?

# %%
#@worker
def compute(device):
    """About a few milliseconds of work that needs no collective."""
    a = torch.randn(64, 64, device=device)
    for _ in range(50):
        a = torch.tanh(a @ a)
    return a


def show_unshard(device):
    heading("unshard")
    _, mine = batch(device, 4, dist.get_rank(), size=4 * BIG)
    model = fsdp_model(device, False, mine)  # after its warm-up step every unit is sharded again
    for async_op in (True, False):
        dist.barrier()
        if dist.get_rank() == dist.get_world_size() - 1:
            time.sleep(0.3)  # a slow peer: the all-gather cannot complete before it joins
        wire = Wire()
        with wire:
            handle = model.blocks[1].unshard(async_op=async_op)  # a handle, or None once done
        began = wire.in_flight()
        compute(device)
        ended = wire.in_flight()
        if handle is not None:
            handle.wait()
        held = type(model.blocks[1].mlp.up.weight).__name__
        shared(f"unshard(async_op={async_op!s:5s}): all-gathers in flight when the computation began {began}, "
               f"when it ended {ended}; after the wait blocks.1's weights are {held}s")
        model.blocks[1].reshard()


# %%
show(run, "unshard")

# %% [markdown]
# Output:
# ```text
# rank 0: unshard(async_op=True ): all-gathers in flight when the computation began 1, when it ended 1; after the wait blocks.1's weights are Parameters
# rank 0: unshard(async_op=False): all-gathers in flight when the computation began 0, when it ended 0; after the wait blocks.1's weights are Parameters
# ```

# %% [markdown]
# With `async_op=True` the call returned with the all-gather still travelling, and it was
# still travelling when the computation ended: computation and communication overlapped.
# With the default, the call returned only once the all-gather was done, 0 in flight. After
# the wait, the unit's weights are plain `Parameter`s, the gathered parameters, instead of
# DTensor shards (`reshard()` puts the shards back). FSDP2 waits on such a pending unshard in
# the unit's own pre-forward (read from `unshard`'s docstring), so issuing it from a forward
# pre-hook of block 0 would be a prefetch that overlaps on gloo too; this part does not run
# that variant.
#
# **Async handles.** Any collective can be issued the same way: `dist.all_reduce(x,
# async_op=True)` returns a handle at once; the result is valid after `handle.wait()`. The
# worker again makes the last rank join late, issues the all-reduce on every rank, computes,
# then waits.
#
# **Predict.** On rank 0, when does the all-reduce complete: before or after the compute
# began?

# %%
#@worker
def show_async(device):
    """async_op=True: issue, compute, wait, with a slow last rank. Then: which gloo handles
    have a future to note their completion (the timeline's reduce-scatters have none)."""
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    x = torch.full((1024,), float(rank + 1), device=device)
    dist.barrier()  # all ranks start here together
    if rank == last:
        time.sleep(0.5)  # a slow peer: the all-reduce cannot finish before it joins
    start, done = time.perf_counter(), []
    work = dist.all_reduce(x, async_op=True)  # returns at once with a handle
    noted = work.get_future().then(lambda _: done.append(time.perf_counter() - start))
    began = time.perf_counter() - start
    compute(device)  # work that does not need x
    computed = time.perf_counter() - start
    work.wait()  # x is the sum from here on
    waited = time.perf_counter() - start
    noted.wait()  # the callback that noted the completion has run too
    if rank == 0:
        say(f"async all_reduce: issued, compute began at {1e3 * began:.1f} ms, ended {1e3 * computed:.1f} ms, "
            f"the collective completed {1e3 * done[0]:.1f} ms, wait() returned {1e3 * waited:.1f} ms")
        say(f"compute began before the collective completed: {began < done[0]}; "
            f"x after wait() {x[0].item():.0f} (1 + 2 + 3 + 4)")
    shard, full = torch.ones(8, device=device), torch.ones(8 * dist.get_world_size(), device=device)
    for kind, issue, args in (("all-gather", dist.all_gather_single, (full.clone(), shard)),
                              ("reduce-scatter", dist.reduce_scatter_single, (shard.clone(), full))):
        work = issue(*args, async_op=True)
        try:
            work.get_future()
            has = True
        except RuntimeError as e:  # gloo: "Work::getFuture not implemented."
            if "not implemented" not in str(e):
                raise
            has = False
        work.wait()
        shared(f"gloo's {kind} handle: get_future() available: {has}")


# %%
show(run, "async")

# %% [markdown]
# Output:
# ```text
# rank 0: async all_reduce: issued, compute began at «time» ms, ended «time» ms, the collective completed «time» ms, wait() returned «time» ms
# rank 0: compute began before the collective completed: True; x after wait() 10 (1 + 2 + 3 + 4)
# rank 0: gloo's all-gather handle: get_future() available: True
# rank 0: gloo's reduce-scatter handle: get_future() available: False
# ```

# %% [markdown]
# The call returned at once and rank 0 computed while the all-reduce waited for the late
# rank: its completion, noted by a callback on the handle's future, came after the compute
# began (the times are this run's; the order holds on every run). After `wait()`, `x` holds
# the sum, 10 = 1 + 2 + 3 + 4. Such a callback needs the handle's future, and gloo gives one
# for an all-gather but not for a reduce-scatter (the last two lines), which is why the
# figure below can time one and not the other.

# %%
#@worker
def timeline(prefetch, spans, wire):
    """Lines the lesson's figure reads (not shown): every span on this rank, in ms."""
    for key, a, b in spans:
        say(f"span prefetch={prefetch} compute {key} {1e3 * a:.3f} {1e3 * b:.3f}")
    for c in wire.calls:
        end = c["done"] if c["done"] is not None else c["issued"]
        say(f"span prefetch={prefetch} {c['kind']} {c['numel']} {1e3 * c['issued']:.3f} {1e3 * end:.3f}")


# %%
def spans(run):
    """{prefetch: {rank: [(lane, label, start ms, end ms)]}} from the 'timeline' lines."""
    found = {False: {}, True: {}}
    pattern = re.compile(r"rank (\d): span prefetch=(\w+) (compute|all-gather|reduce-scatter) (.+) (\S+) (\S+)")
    for rank, lines in section(run, "timeline").items():
        for line in lines:
            if m := pattern.fullmatch(line):
                lane = "compute" if m[3] == "compute" else "comm"
                found[m[2] == "True"].setdefault(rank, []).append((lane, f"{m[3]} {m[4]}", float(m[5]), float(m[6])))
    return found


def plot_timeline(found):
    """One row pair per rank: compute (blocks' forward/backward) above, collectives below."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, prefetch in zip(axes, (False, True)):
        for rank, events in sorted(found[prefetch].items()):
            for lane, label, a, b in events:
                y = rank + (0.2 if lane == "compute" else -0.2)
                color = "C2" if lane == "compute" else ("C0" if "gather" in label else "C3")
                ax.broken_barh([(a, max(b - a, 0.3))], (y - 0.15, 0.3), color=color)
        ax.set_title(f"FSDP2 step, explicit prefetch {prefetch}")
        ax.set_xlabel("ms since the step began (each rank's own clock)")
        ax.set_yticks(range(4), [f"rank {r}" for r in range(4)])
    fig.legend(handles=[Rectangle((0, 0), 1, 1, color=c) for c in ("C2", "C0", "C3")],
               labels=["compute (block fwd/bwd)", "all-gather (issue to done)", "reduce-scatter (issued)"],
               loc="lower center", ncol=3, fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


fig = plot_timeline(spans(run))
fig.savefig(HERE / "timeline.png")

# %% [markdown]
# Each rank is a pair of rows: green bars are the blocks' forward and backward computation,
# blue bars all-gathers from issue to completion (a callback on the collective's future, run
# on gloo's thread, so a bar's end can come a little late), red ticks reduce-scatters at the
# moment they were issued (gloo's reduce-scatter handle has no future to time its end). The
# white gaps between a rank's green bars in backward are mostly those reduce-scatters: FSDP2
# waits for each one synchronously before the next block's backward, and the red tick marks
# only its start, not its length. A collective completes only once the slowest rank has
# joined it, so a blue bar also holds the time its rank waited for the others. The two panels differ in *where*
# the blue bars sit, prefetching moves block 1's earlier; what they share is the printed
# count above: no all-gather in flight when a block began or ended its computation. The
# picture changes from run to run with the load on the machine; the order and the count do
# not.

# %% [markdown]
# ## 2. Memory: activation checkpointing, meta-device init, clipping
#
# **Activation checkpointing** keeps only a block's input for backward and runs the block's
# forward again during backward to rebuild what the gradient needs. Under FSDP2 it wraps
# what the block computes (`Block.forward` in `model.py` calls `torch.utils.checkpoint.
# checkpoint(self.inner, x, use_reentrant=False)` when `checkpointed` is set), and FSDP2's
# hooks stay on the block, so the recomputation finds the block's parameters gathered for its
# backward. The worker measures, on each rank, the peak of the bytes allocated during one
# forward + backward (`torch.profiler` with `profile_memory=True`: the running sum of its
# allocation events) and counts the blocks' forward computations; on one plain block it
# lists what autograd keeps for backward (`saved_tensors_hooks`, the parameters left out).
#
# **Predict.** How many block computations per step with checkpointing? Does the peak go down,
# and do the gradients change?

# %%
#@worker
def peak_bytes(prof):
    """The most bytes allocated at once (above the start) while the profiler ran: the
    running sum of its memory events (allocations +, frees -), in time order."""
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    now = peak = 0
    for e in events:
        now += e.nbytes()
        peak = max(peak, now)
    return peak


def profiled(fn):
    """fn() under the profiler with memory recording; returns (fn's result, peak bytes)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    return out, peak_bytes(prof)


def ac_run(device, on, tokens):
    """FSDP2 over 4 ranks, blocks checkpointed or not: (peak bytes of one forward + backward,
    block computations, this rank's gradient shards, seconds per step)."""
    model = fsdp(build(torch.float32, device), init_device_mesh(device.type, (4,), mesh_dim_names=("all",)))
    for block in model.blocks:
        block.checkpointed = on
    loss_fn(model, tokens).backward()  # warm-up
    model.zero_grad(set_to_none=True)
    for block in model.blocks:
        block.runs = 0
    _, peak = profiled(lambda: loss_fn(model, tokens).backward())
    runs = sum(block.runs for block in model.blocks)
    grads = [p.grad.to_local().clone() for p in model.parameters()]
    return peak, runs, grads, step_time(model, tokens)


def kept(block, x):
    """What autograd keeps for backward while `block` runs forward on x, its parameters left
    out: (distinct tensors, their bytes, the shapes as saved: a view counts once per save)."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    storages, shapes = {}, []

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            shapes.append(list(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    return len(storages), sum(storages.values()), shapes


def show_kept(device):
    """One plain float32 block on BIG sequences, without and with checkpointing."""
    block, x = Block().to(device), torch.randn(BIG, S, 16, device=device, requires_grad=True)
    n_off, b_off, shapes = kept(block, x)
    block.checkpointed = True
    n_on, b_on, _ = kept(block, x)
    shared(f"one block, {BIG} sequences: kept for backward without AC {n_off} tensors, {b_off} B; "
           f"with AC {n_on}, {b_on} B")
    counts = {}
    for shape in shapes:
        counts[str(shape)] = counts.get(str(shape), 0) + 1
    shared("without AC, saved: " + ", ".join(f"{k} x{n}" for k, n in counts.items()))
    shared(f"any saved [..., {S}, {S}] (attention probabilities, S x S): {any(s[-2:] == [S, S] for s in shapes)}")


def show_checkpointing(device):
    heading("checkpointing")
    _, mine = batch(device, 4, dist.get_rank(), size=4 * BIG)
    off, on = ac_run(device, False, mine), ac_run(device, True, mine)
    shared(f"block computations per step: without AC {off[1]}, with AC {on[1]}")
    show_kept(device)
    say(f"peak bytes in forward + backward: without AC {off[0]}, with AC {on[0]}, ratio {on[0] / off[0]:.2f}; "
        f"lower with AC: {on[0] < off[0]}")
    same = all(torch.equal(a, b) for a, b in zip(off[2], on[2]))
    shared(f"gradients with AC equal those without, bitwise: {same}")
    shared(f"time per forward + backward, with AC / without: {on[3] / off[3]:.2f}")


def show_memory(device):
    show_checkpointing(device)
    mesh, model, ref = show_meta(device)
    show_clip(device, mesh, model, ref)


# %%
show(run, "checkpointing")

# %% [markdown]
# Output:
# ```text
# rank 0: block computations per step: without AC 2, with AC 4
# rank 0: one block, 32 sequences: kept for backward without AC 15 tensors, 270336 B; with AC 1, 16384 B
# rank 0: without AC, saved: [32, 8, 16] x2, [32, 8, 1] x4, [256, 16] x5, [32, 4, 8, 4] x4, [32, 4, 8] x1, [32, 8, 64] x1, [256, 64] x1
# rank 0: any saved [..., 8, 8] (attention probabilities, S x S): False
# rank 0: peak bytes in forward + backward: without AC «number», with AC «number», ratio «ratio»; lower with AC: True
# rank 0: gradients with AC equal those without, bitwise: True
# rank 0: time per forward + backward, with AC / without: «ratio»
# rank 1: peak bytes in forward + backward: without AC «number», with AC «number», ratio «ratio»; lower with AC: True
# rank 2: peak bytes in forward + backward: without AC «number», with AC «number», ratio «ratio»; lower with AC: True
# rank 3: peak bytes in forward + backward: without AC «number», with AC «number», ratio «ratio»; lower with AC: True
# ```

# %% [markdown]
# Each block computes twice (4 instead of 2): once in forward, once again in backward. The
# gradients are bitwise the same, since the same operations run on the same inputs.
#
# Without AC a block keeps 15 tensors: the norms' inputs `[32, 8, 16]` and their statistics
# `[32, 8, 1]`, the inputs of the linear layers (`[256, 16]`: q, k and v share one),
# attention's q, k, v and output `[32, 4, 8, 4]` and a log-sum-exp `[32, 4, 8]`, the MLP's
# 64-wide hidden layer before and after the GELU. No `[…, 8, 8]` tensor: the CPU's fused
# attention kernel keeps no S × S probability matrix; it recomputes the probabilities in
# backward from the log-sum-exp. With AC the block keeps one tensor: its input. The
# profiler's peak drops on every rank, but by less than the two blocks' kept bytes
# (2 × 270,336 B down to 2 × 16,384 B): in backward each block's activations are rebuilt,
# one block at a time, and the peak holds more than the blocks' activations (the head's
# logits, for one). The price is one more forward per block; on these loaded cores the time
# ratio is too noisy to read (it moves from run to run).
#
# **Meta-device initialisation.** Building the full model on every rank and then sharding it
# needs the whole model's memory on every rank first. torchtitan builds the model on the
# `meta` device (shapes, no storage), applies TP and FSDP there, then `model.to_empty(
# device=...)` allocates storage for this rank's shards only, uninitialised, and an
# `init_weights` fills them. Here it is part 13a's 2-D model (its tensor-parallel plan,
# repeated below so that this part runs alone). `init_weights` in `model.py` makes one full
# parameter at a time from its own generator; the worker's `cut` keeps this rank's piece
# (`distribute_tensor(full, mesh, placements, src_data_rank=None)`: each rank cuts its own
# piece). The worker counts the collectives issued meanwhile.
#
# **Predict.** How many of the model's bytes does each rank hold after `to_empty`, and is the
# result equal to building the full model in one process?

# %%
#@worker
def tp_plan(model, tp):
    """Part 13a's tensor parallelism with sequence parallelism, over the 1-D mesh tp."""
    seq, rep = Shard(1), Replicate()
    parallelize_module(model, tp, {"embed": RowwiseParallel(input_layouts=rep, output_layouts=seq),
                                   "head": ColwiseParallel(input_layouts=seq, output_layouts=rep),
                                   "norm": SequenceParallel()})
    for block in model.blocks:
        plan = {f"attn.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")}
        plan |= {"attn.wo": RowwiseParallel(output_layouts=seq), "mlp.up": ColwiseParallel(),
                 "mlp.down": RowwiseParallel(output_layouts=seq),
                 "norm1": SequenceParallel(), "norm2": SequenceParallel()}
        plan |= {name: PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(rep,))
                 for name in ("attn", "mlp")}
        parallelize_module(block, tp, plan)
        block.attn.heads = HEADS // tp.size()
    return model


def cut(full, p):
    """This rank's piece of the full parameter, with p's own placements; nothing is sent."""
    return distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)


def below(value, bound=ROUNDING):
    """A rounding-level gap as text: its digits depend on the CPU, its comparison with the bound does not."""
    return f"{value:.1e}, below {bound:.0e}: {value < bound}"


def gap(t, ref):
    """Largest |t - ref| over all ranks; a DTensor is compared shard by shard with the same
    pieces of ref (no rank gathers the full tensor)."""
    t, ref = t.detach(), ref.detach()
    if isinstance(t, DTensor):
        ref, t = cut(ref.to(t.device), t).to_local(), t.to_local()
    worst = (t - ref.to(t.device)).abs().max().reshape(1).to(torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()


def show_meta(device):
    heading("meta")
    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))

    def materialise():
        with torch.device("meta"):  # no storage at all: shapes and placements only
            model = fsdp(tp_plan(Model().to(torch.float64), mesh["tp"]), mesh["dp"])
        on_meta = all(p.is_meta for p in model.parameters())
        model.to_empty(device=device)  # storage for this rank's shards, uninitialised
        return init_weights(model, cut=cut), on_meta

    wire = Wire()  # every collective while building, sharding, allocating, initialising
    with wire:
        (model, on_meta), peak = profiled(materialise)
    full = sum(p.numel() for p in model.parameters()) * 8
    local = sum(p.to_local().numel() for p in model.parameters()) * 8
    shared(f"built on meta: every parameter on the meta device: {on_meta}; collectives meanwhile: "
           f"{len(wire.calls)}")
    say(f"after to_empty + init: holds {local} B of the model's {full} B; peak while building {peak} B, "
        f"below the full model: {peak < full}")
    ref = build(device=device)
    same = max(gap(p, q) for p, q in zip(model.parameters(), ref.parameters())) == 0.0
    shared(f"parameters equal to one process's init, bitwise: {same}")
    return mesh, model, ref


# %%
show(run, "meta")

# %% [markdown]
# Output:
# ```text
# rank 0: built on meta: every parameter on the meta device: True; collectives meanwhile: 0
# rank 0: after to_empty + init: holds 15424 B of the model's 60160 B; peak while building «number» B, below the full model: True
# rank 0: parameters equal to one process's init, bitwise: True
# rank 1: after to_empty + init: holds 15424 B of the model's 60160 B; peak while building «number» B, below the full model: True
# rank 2: after to_empty + init: holds 15424 B of the model's 60160 B; peak while building «number» B, below the full model: True
# rank 3: after to_empty + init: holds 15424 B of the model's 60160 B; peak while building «number» B, below the full model: True
# ```

# %% [markdown]
# A quarter of the float64 model plus a larger share of what TP replicates (15,424 B of
# 60,160, where a quarter is 15,040), built without a single collective, and the profiler's
# peak while building, sharding, allocating and initialising stays below the full model's
# bytes on every rank: no rank ever held the model. The values are bitwise those of the
# one-process build, because each parameter's values depend only on its own generator, not
# on how it is sharded.
#
# **Gradient clipping over DTensors.** `torch.nn.utils.clip_grad_norm_` needs the norm of all
# gradients together (the L2 norm by default: the square root of the sum of every gradient
# element squared), and each rank holds only pieces of them. Over DTensor gradients the norm
# is a DTensor computation like any other: partial norms on each rank, reduced over the mesh.
# The worker records the collectives the call issues.
#
# **Predict.** Is the 2-D model's total norm the one-process norm, and are the clipped
# gradients equal?

# %%
#@worker
def show_clip(device, mesh, model, ref):
    heading("clip")
    tokens, mine = batch(device, 2, mesh.get_local_rank("dp"))
    loss_fn(model, mine).backward()
    loss_fn(ref, tokens).backward()
    wire = Wire()
    with wire:
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
    expect = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm=0.5)
    shared(f"total L2 norm of the gradients: one process {expect.item():.6f}; 2-D a {type(total).__name__} "
           f"{total.placements}, gap {below(abs(total.full_tensor().item() - expect.item()))}")
    worst = max(gap(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters()))
    shared(f"clipped gradients vs one process: max gap {below(worst)}")
    shared("collectives in clip_grad_norm_: " + ", ".join(
        f"{c['kind']} of {c['numel']} elements ({c['bytes']} B) over {c['ranks']} (from {c['op']})"
        for c in wire.calls))


# %%
show(run, "clip")
warning = next(line for line in run.err[0].splitlines() if "sequential all_reduce" in line)
said = warning[warning.index("While redistributing"):]
print("rank 0's stderr:", said[:said.index(" This is suboptimal")], said[said.index("To optimize"):])

# %% [markdown]
# Output:
# ```text
# rank 0: total L2 norm of the gradients: one process 1.581103; 2-D a DTensor (Replicate(), Replicate()), gap «number», below 1e-12: True
# rank 0: clipped gradients vs one process: max gap «number», below 1e-12: True
# rank 0: collectives in clip_grad_norm_: all-reduce of 29 elements (232 B) over [0, 2] (from linalg_vector_norm), all-reduce of 29 elements (232 B) over [0, 1] (from linalg_vector_norm)
# rank 0's stderr: While redistributing from (_NormPartial(2.0), _NormPartial(2.0)) to (Replicate(), Replicate()), 2 sequential all_reduce operations will be performed. To optimize, flatten mesh dimensions ["dp", "tp"] so DTensor can use a single operation instead.
# ```

# %% [markdown]
# The total norm comes back as a DTensor replicated on both mesh dimensions, equal to the
# one-process norm, and the clipped gradients match to rounding. No special API: the same
# call as on one process. Its communication is two all-reduces of 29 elements each (232 B
# in float64): each rank computes the norms of its pieces of the 29 gradients, and DTensor
# reduces the 29 partial norms once over dp, then once over tp. The last line is DTensor's
# warning from rank 0's stderr (`run.err[0]`): two sequential all-reduces are suboptimal,
# and flattening the mesh's two dimensions would allow one.

# %% [markdown]
# ## 3. Past one machine: two agents, one rendezvous
#
# This part's launch ran two torchrun agents on one machine, each with
# `--nproc-per-node=2`, both with `--nnodes=2`, the same `--rdzv-id`, `--rdzv-backend=c10d`
# and `--rdzv-endpoint=127.0.0.1:PORT` (the kit's `launch(..., nnodes=2)`, which also gives
# the first agent `--rdzv-conf=is_host=1`: it hosts the rendezvous store, the other connects
# to it). Two terminals reproduce it; without `is_host`, each agent whose machine the
# endpoint names tries to host the store, and the one that finds the port taken connects to
# it instead:
#
# ```sh
# torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29500 \
#     --rdzv-id=13 lessons/13b_overlap_and_memory/worker.py nodes     # once in each terminal
# ```
#
# The agents agree on the group, number themselves (the node rank, `GROUP_RANK`) and give
# their ranks `RANK`, `LOCAL_RANK` and the sizes.
#
# **Predict.** Which `GROUP_RANK` does rank 3 get? Which mesh groups cross between nodes?

# %%
#@worker
def node_of(rank):
    return rank // int(os.environ.get("LOCAL_WORLD_SIZE", "2"))


def show_nodes(device):
    heading("nodes")
    names = ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
    say(" ".join(f"{k}={os.environ[k]}" for k in names))
    same = torch.tensor([int(node_of(dist.get_rank()) == int(os.environ["GROUP_RANK"]))])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    shared(f"node = rank // LOCAL_WORLD_SIZE = GROUP_RANK on every rank: {bool(same.item())}")
    for dims in (("dp", "tp"), ("replicate", "shard")):
        mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=dims)
        grid = mesh.mesh.tolist()  # rows: one value of dims[0]; columns: one of dims[1]
        for name, groups in ((dims[0], [list(c) for c in zip(*grid)]), (dims[1], grid)):
            nodes = [sorted({node_of(r) for r in g}) for g in groups]
            shared(f"{name:9s} groups {groups}: nodes {nodes}, crosses nodes: {any(len(n) > 1 for n in nodes)}")


# %%
show(run, "nodes")

# %% [markdown]
# Output:
# ```text
# rank 0: RANK=0 LOCAL_RANK=0 GROUP_RANK=0 LOCAL_WORLD_SIZE=2 WORLD_SIZE=4
# rank 0: node = rank // LOCAL_WORLD_SIZE = GROUP_RANK on every rank: True
# rank 0: dp        groups [[0, 2], [1, 3]]: nodes [[0, 1], [0, 1]], crosses nodes: True
# rank 0: tp        groups [[0, 1], [2, 3]]: nodes [[0], [1]], crosses nodes: False
# rank 0: replicate groups [[0, 2], [1, 3]]: nodes [[0, 1], [0, 1]], crosses nodes: True
# rank 0: shard     groups [[0, 1], [2, 3]]: nodes [[0], [1]], crosses nodes: False
# rank 1: RANK=1 LOCAL_RANK=1 GROUP_RANK=0 LOCAL_WORLD_SIZE=2 WORLD_SIZE=4
# rank 2: RANK=2 LOCAL_RANK=0 GROUP_RANK=1 LOCAL_WORLD_SIZE=2 WORLD_SIZE=4
# rank 3: RANK=3 LOCAL_RANK=1 GROUP_RANK=1 LOCAL_WORLD_SIZE=2 WORLD_SIZE=4
# ```

# %% [markdown]
# Ranks are numbered node by node: node 0 has ranks 0–1, node 1 ranks 2–3, so `rank //
# LOCAL_WORLD_SIZE` is the node. `init_device_mesh` lays ranks out row-major, so the *last*
# mesh dimension varies fastest and holds consecutive ranks: with `(dp, tp)` = (2, 2) the tp
# groups are `[0, 1]` and `[2, 3]`, each inside one node, and the dp groups cross. That is
# the rule for mapping a mesh to hardware: put the dimension that communicates most, and on
# the critical path (TP: activations in every block, forward and backward), last, so that it
# stays on the fast links inside a node (NVLink), and put data parallelism (FSDP's gradient
# reduction, or HSDP's replicate all-reduce) across nodes: part 13a counted what then leaves
# a node. The same holds for HSDP: `("replicate", "shard")` shards inside a node and
# replicates across.
#
# On a real cluster the launch differs in three places: each node runs one agent with
# `--nproc-per-node` set to its GPU count; `--rdzv-endpoint` is a host and port every node
# can reach (usually the first node's address, given by the scheduler); and the workers use
# `backend="nccl"` with one GPU per rank, set from `LOCAL_RANK` (`worker.py ... --backend
# nccl` does it through the kit). The mesh code does not change.

# %% [markdown]
# ## 4. Compile inside the data-parallel wrapper: DDP and FSDP2
#
# Lesson 08b compiled a model in one process. DDP and FSDP2 both send gradients from hooks
# that fire while autograd runs the backward, and a compiled region's backward is *one*
# autograd node: every gradient it makes becomes ready at the same moment, when the whole
# node has finished. So where the compiled regions begin and end decides when the
# wrapper's hooks can fire, and whether communication can overlap the backward (section 1).
#
# We need no launch to watch this: a gloo process group of *one* rank can live inside this
# notebook's process (`dist.HashStore()` is an in-memory rendezvous). Its all-reduce has
# nothing to add, but DDP and FSDP2 do all their bookkeeping, and Dynamo sees what it sees
# with many ranks. Each cell destroys its group and restores Dynamo's settings, so later
# cells start clean. The backend is lesson 08b's counting backend that hands each graph
# to `aot_eager`: real forward and backward graphs, no generated code.
#
# **Predict.** A stack of four `Linear(512, 512)` + ReLU layers (1 MiB of weights each) is
# wrapped in DDP with `bucket_cap_mb=1`, a bucket size that one layer's gradients fill, and
# compiled. How many graphs does Dynamo hand the backend with the default
# `torch._dynamo.config.optimize_ddp=True`? With `False`? Does it matter whether you compile
# the DDP module, `torch.compile(DDP(model))`, or compile the model and then wrap it,
# `model.compile()` then `DDP(model)`?

# %%
import collections  # noqa: E402
import contextlib  # noqa: E402

import torch._dynamo as dynamo  # noqa: E402
import torch.distributed as dist  # noqa: E402, F811
from torch.distributed.fsdp import fully_shard  # noqa: E402, F811
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402, F811


# From lessons 08a and 08b: backends that keep every graph they are given, and ways to read them.
class CountingBackend:
    """A torch.compile backend that keeps every FX graph it is given and runs it as is."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


class AotCounting(CountingBackend):
    """Keeps each graph, like CountingBackend, and hands it to aot_eager (a real backward)."""

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def graph_ops(gm):
    """The operations of an FX graph, by name: ['linear', 'relu']."""
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    return [getattr(n.target, "__name__", str(n.target)) for n in calls]


def graph_breaks():
    """Dynamo's count of graph breaks by reason so far (kept whatever the log settings say)."""
    return collections.Counter(dynamo.utils.counters["graph_break"])


def max_gap(a, b):
    return max((u - v).abs().max().item() for u, v in zip(a, b))


class Stack(torch.nn.Module):
    """n Linear(d, d) + ReLU layers, in a class of our own (below: why not nn.Sequential)."""

    def __init__(self, n=4, d=512):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(n))

    def forward(self, x):  # (B, d)
        for layer in self.layers:
            x = layer(x).relu()
        return x


@contextlib.contextmanager
def one_rank_group():
    """A gloo process group of one rank in this process: no launcher, no other rank."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def autograd_nodes(loss):
    """The class name of every node of loss's autograd graph, each node once."""
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [n for n, _ in node.next_functions]
    return [type(node).__name__ for node in seen]


def train_step(model, x, nodes=None):
    """[loss, grad of each parameter] after one forward and backward (full tensors); a list
    given as `nodes` receives the names of the loss's autograd nodes, before backward."""
    model.zero_grad(set_to_none=True)
    loss = model(x).square().mean()
    if nodes is not None:
        nodes += autograd_nodes(loss)
    loss.backward()
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
    return [loss.detach()] + [g.clone() for g in grads]


def ddp_graphs(order, optimize_ddp, x, ref, cap=1):
    """Graphs captured for one DDP training step (bucket_cap_mb=cap), the gap to eager DDP's,
    the graph breaks Dynamo met meanwhile (a Counter: reason -> count) and the number of
    compiled backward nodes in the loss's autograd graph."""
    dynamo.reset()
    saved, dynamo.config.optimize_ddp = dynamo.config.optimize_ddp, optimize_ddp
    try:
        torch.manual_seed(0)
        model, counting, before = Stack(), AotCounting(), graph_breaks()
        if order == "compile(DDP(model))":
            ddp = torch.compile(DDP(model, bucket_cap_mb=cap), backend=counting)
        else:  # "DDP(model.compile())": compile the model, then wrap it
            model.compile(backend=counting)
            ddp = DDP(model, bucket_cap_mb=cap)
        nodes = []
        gap = max_gap(train_step(ddp, x, nodes), ref)
        return counting.graphs, gap, graph_breaks() - before, nodes.count("CompiledFunctionBackward")
    finally:
        dynamo.config.optimize_ddp = saved
        dynamo.reset()


def graphs_word(n):
    return f"{n} graph" + "s" * (n != 1)


def sequential_graphs():
    """Graphs captured by model.compile() and by torch.compile(model) for an nn.Sequential."""
    seq, a, b = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), CountingBackend(), CountingBackend()
    torch.compile(seq, backend=a)(torch.randn(2, 8))
    dynamo.reset()
    seq.compile(backend=b)
    seq(torch.randn(2, 8))
    dynamo.reset()
    return len(b.graphs), len(a.graphs)


layer_bytes = sum(p.nbytes for p in Stack().layers[0].parameters())
print(f"one layer's parameters: {layer_bytes:,} bytes; bucket_cap_mb=1: {2**20:,} bytes")
xd = torch.randn(8, 512)  # (B, d)
ddp_runs = {}
with one_rank_group():
    torch.manual_seed(0)
    ddp_ref = train_step(DDP(Stack(), bucket_cap_mb=1), xd)  # eager DDP
    for order in ["compile(DDP(model))", "DDP(model.compile())"]:
        for opt in [True, False]:
            graphs, gap, breaks, backward_nodes = ddp_runs[order, opt] = ddp_graphs(order, opt, xd, ddp_ref)
            per_graph = [graph_ops(gm).count("linear") for gm in graphs]
            print(f"{order:<21} optimize_ddp={opt!s:<5}: {graphs_word(len(graphs))}, layers per graph "
                  f"{per_graph}, CompiledFunctionBackward nodes {backward_nodes}, graph breaks {breaks.total()}, "
                  f"loss and grads within 1e-6 of eager DDP: {gap < 1e-6}")
print(f"dist initialized after the block: {dist.is_initialized()}, optimize_ddp: {dynamo.config.optimize_ddp}")
seq_counts = sequential_graphs()
print(f"nn.Sequential: model.compile() {graphs_word(seq_counts[0])}, torch.compile(model) {graphs_word(seq_counts[1])}")

# %% [markdown]
# Output:
# ```text
# one layer's parameters: 1,050,624 bytes; bucket_cap_mb=1: 1,048,576 bytes
# compile(DDP(model))   optimize_ddp=True : 4 graphs, layers per graph [1, 1, 1, 1], CompiledFunctionBackward nodes 4, graph breaks 3, loss and grads within 1e-6 of eager DDP: True
# compile(DDP(model))   optimize_ddp=False: 1 graph, layers per graph [4], CompiledFunctionBackward nodes 1, graph breaks 3, loss and grads within 1e-6 of eager DDP: True
# DDP(model.compile())  optimize_ddp=True : 4 graphs, layers per graph [1, 1, 1, 1], CompiledFunctionBackward nodes 4, graph breaks 0, loss and grads within 1e-6 of eager DDP: True
# DDP(model.compile())  optimize_ddp=False: 1 graph, layers per graph [4], CompiledFunctionBackward nodes 1, graph breaks 0, loss and grads within 1e-6 of eager DDP: True
# dist initialized after the block: False, optimize_ddp: True
# nn.Sequential: model.compile() 0 graphs, torch.compile(model) 1 graph
# ```
#
# With `optimize_ddp` on (the default), Dynamo captured the forward as usual, then its
# *DDPOptimizer* (`torch/_dynamo/backends/distributed.py`) cut it into four graphs, one per
# layer, and handed each to the backend on its own. It walks the graph from the end (the
# order in which backward makes the gradients ready) adding up parameter bytes, and cuts
# where a bucket is full, using the DDP module's `bucket_cap_mb` (and 1 MiB for the first
# bucket from the end, `dist._DEFAULT_FIRST_BUCKET_BYTES`: with a 2 MiB cap the graphs hold
# 1, 2 and 1 layers). Each piece gets its own compiled backward (the loss's autograd graph
# holds four `CompiledFunctionBackward` nodes with the split, one without: the lines above
# count them), so the last layer's gradients are ready, and DDP's hook can start their
# all-reduce, while the earlier layers' backward still runs: communication overlaps
# computation (the reason its docstring, *Note [DDPOptimizer]*, gives for the split). With
# `optimize_ddp=False` there is one graph and one backward node: every bucket's all-reduce
# waits for the whole backward. The same loss and gradients either way (within 1e-6:
# `aot_eager` runs the same kernels as eager); only the time at which communication can
# start differs, which section 1 showed for FSDP2.
#
# Both orders gave the same graphs. DDPOptimizer is switched on by *when* Dynamo compiles,
# not by what it was handed: Dynamo checks whether a DDP module's forward is running
# (`DistributedDataParallel._get_active_ddp_module()`, read from
# `torch/_dynamo/convert_frame.py`), which is the case in both orders.
# They differ in the graph breaks. In `torch.compile(DDP(model))` ("wrap, then compile")
# Dynamo starts tracing in DDP's own `forward`, meets Python it does not trace there
# (DDP's bookkeeping; `TORCH_LOGS=graph_breaks` names a logger call and
# `_inside_ddp_forward`, marked not to be traced) and breaks the graph 3 times around your
# model's `forward`, which DDP calls and Dynamo captures as a frame of its own. Those
# pieces of DDP held no tensor operation, so the backend never received them. Compiling the
# model and then wrapping it left DDP's `forward` to run eagerly: no break at all. That is
# the order PyTorch's page
# [*Where to apply torch.compile?*](https://docs.pytorch.org/docs/2.13/compile/programming_model.where_to_apply_compile.html)
# recommends, saying that `torch.compile` does not handle distributed wrappers like DDP or
# FSDP very well; torchtitan does the same, compiling each transformer block and then
# applying its data-parallel wrapper.
#
# The last line is why `Stack` is a class of our own: Going further explains it.
#
# **Predict.** FSDP2 the way torchtitan does it (part 13a's order, with compile added):
# compile each of four residual blocks, then `fully_shard` each block, then the root. How
# many graphs? Do FSDP's all-gathers appear in them? What does a graph receive for the
# weights: the sharded `DTensor`s that rest on the module, or plain tensors?

# %%
class Residual(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)

    def forward(self, x):  # (B, d)
        return x + self.lin(x).relu()


class Tower(torch.nn.Module):
    """n residual blocks and a head: the shape of a transformer, much smaller."""

    def __init__(self, n=4, d=64):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Residual(d) for _ in range(n))
        self.head = torch.nn.Linear(d, 1)

    def forward(self, x):  # (B, d) -> (B, 1)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class InputTypes(AotCounting):
    """AotCounting that also records the type of every tensor each graph receives."""

    def __init__(self):
        super().__init__()
        self.types = set()

    def __call__(self, gm, example_inputs):
        self.types |= {type(t).__name__ for t in example_inputs if isinstance(t, torch.Tensor)}
        return super().__call__(gm, example_inputs)


def fsdp_compiled(backend, n=4):
    """torchtitan's order: compile each block, fully_shard each block, then the root."""
    torch.manual_seed(0)
    model = Tower(n)
    for block in model.blocks:
        block.compile(backend=backend)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


xf = torch.randn(8, 64)  # (B, d)
torch.manual_seed(0)
fsdp_ref = train_step(Tower(), xf)  # plain eager, no FSDP
dynamo.reset()
fsdp_backend = InputTypes()
with one_rank_group():
    fsdp_model = fsdp_compiled(fsdp_backend)
    fsdp_gap = max_gap(train_step(fsdp_model, xf), fsdp_ref)
    at_rest = type(fsdp_model.blocks[0].lin.weight).__name__
dynamo.reset()
print(f"4 blocks compiled: {len(fsdp_backend.graphs)} graphs, ops {[graph_ops(gm) for gm in fsdp_backend.graphs]}")
print(f"weights at rest: {at_rest}; tensors the graphs receive: {sorted(fsdp_backend.types)}")
print(f"one step's loss and grads within 1e-6 of the eager model without FSDP: {fsdp_gap < 1e-6}")

# %% [markdown]
# Output:
# ```text
# 4 blocks compiled: 2 graphs, ops [['linear', 'relu', 'add'], ['linear', 'relu', 'add']]
# weights at rest: DTensor; tensors the graphs receive: ['Parameter', 'Tensor']
# one step's loss and grads within 1e-6 of the eager model without FSDP: True
# ```
#
# Two graphs for four blocks, as in lesson 08b's regional compilation (block 0's input
# does not require grad, the others' do, and `requires_grad` is guarded), holding only the
# block's own `linear`, `relu` and `add`: no collective. The parameters rest on the module
# as sharded `DTensor`s, and the graphs receive plain `Parameter`s and `Tensor`s, no
# `DTensor`: as `fully_shard`'s docstring describes, FSDP's forward pre-hook all-gathers
# the shards into full parameters *before* the block's graph runs and its forward hook
# frees them after; in backward its hooks all-gather again and reduce-scatter the block's
# gradients once that block's compiled backward has run. Here either order gives these two
# graphs (compile each block then `fully_shard`, or `fully_shard` then compile): the hooks
# stay outside them both ways. torchtitan compiles first by convention: "turn on
# per-TransformerBlock compile after AC wrapping and before FSDP", says a comment in
# `parallelize_llama` (read from torchtitan 0.3.0,
# `torchtitan/models/llama3/parallelize.py`). Each compiled region is one block: FSDP keeps
# scheduling its collectives block by block around it, exactly as in eager (lesson 11a and
# section 1), and the identical blocks share their graphs (eight blocks give the same two).
# FSDP2 keeps its hooks out of every graph: it wraps each of them in `torch._dynamo.disable`
# (`_dynamo_disable`, in `torch/distributed/fsdp/_fully_shard/_fsdp_common.py`). So a
# `torch.compile` of the whole sharded model does not make one graph of it either: Dynamo
# breaks the graph where a block's hooks are called, inside the root's loop, gives up on
# the root's `forward` (it runs eagerly) and captures only each block's `forward`, the
# same two graphs, none with the head. Activation checkpointing goes on before the
# compile, tensor parallelism before both: torchtitan's order is TP, activation
# checkpointing, compile each block, then `fully_shard` each block and the root.

# %% [markdown]
# ## Summary
#
# - Prefetching is about *issue order*: forward prefetch issues the next block's all-gather
#   before the current block computes, FSDP2's default backward prefetch gathers the next
#   block during backward. By default FSDP2's collectives are synchronous: on gloo no
#   all-gather was in flight while a block computed, with or without prefetch; on CUDA the
#   same calls enqueue on FSDP2's own streams and overlap (unverified on a GPU).
#   `module.unshard(async_op=True)` and `async_op=True` + `wait()` overlap on gloo too.
# - Activation checkpointing under FSDP2: twice the block computations, identical gradients,
#   a block keeps only its input, a lower peak. Meta-device init + `to_empty` + a
#   per-parameter init: no rank ever holds the model. `clip_grad_norm_` over DTensors is the
#   global L2 norm, two small all-reduces on a 2-D mesh.
# - Several torchrun agents with one c10d rendezvous make a multi-node job; ranks are numbered
#   node by node, so keep tp inside a node (the last mesh dimension), dp across.
# - Compiled under DDP, Dynamo cuts the graph where DDP's buckets end (`optimize_ddp=True`,
#   the default), so each bucket's all-reduce can start during backward; compiling the DDP
#   module also breaks the graph inside DDP's own `forward`, compiling the model and then
#   wrapping it does not. With FSDP2, compile each block and `fully_shard` each block and
#   the root, in either order: FSDP's hooks, never traced, stay outside the graphs.

# %% [markdown]
# ## Going further
#
# **`model.compile()` on an `nn.Sequential`** (section 4's last line). `model.compile()`
# installs `torch.compile(model._call_impl)`; for an `nn.Sequential` of torch's layers, that method
# and every `forward` below it live in torch's files, which Dynamo skips as starting
# frames, so it captured nothing and the model ran eagerly, with no error or warning
# (pytorch/pytorch#150915; a Sequential that holds a module of your own captures only that
# module's `forward`, and the torch layers beside it run eagerly). `torch.compile(model)`
# wraps the module itself and captures it. Count your graphs (a counting backend, or
# `TORCH_LOGS=graph`) before trusting either.
#
# **DDP's `record_function`.** Tracing DDP's `forward` in `torch.compile(DDP(model))`,
# Dynamo also meets the profiler `record_function` that DDP opens to label its work, and
# ignores it: it says so on stderr, `Profiler record function ... will be ignored`, once per
# process.

# %% [markdown]
# ## References
#
# - [`torch.distributed.fsdp.fully_shard`](https://docs.pytorch.org/docs/2.13/distributed.fsdp.fully_shard.html):
#   `FSDPModule.unshard`, `set_modules_to_forward_prefetch` and `set_modules_to_backward_prefetch`
#   (section 1).
# - [`torch.utils.checkpoint`](https://docs.pytorch.org/docs/2.13/checkpoint.html):
#   `checkpoint(..., use_reentrant=False)` (section 2).
# - [`torch.nn.utils.clip_grad_norm_`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.utils.clip_grad_norm_.html):
#   the total norm over all gradients (section 2).
# - [`torch.distributed.elastic`](https://docs.pytorch.org/docs/2.13/distributed.elastic.html):
#   torchrun's agents and the c10d rendezvous (section 3).
# - [`torch.nn.parallel.DistributedDataParallel`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.parallel.DistributedDataParallel.html):
#   `bucket_cap_mb`, the buckets DDPOptimizer follows (section 4 and the exercises).
# - [Training deep nets with sublinear memory cost](https://arxiv.org/abs/1604.06174):
#   activation checkpointing, recomputing a segment's activations in backward.

# %% [markdown]
# ## Read the source
#
# Where, in the PyTorch you installed, what this part showed is implemented. Open each file
# in your editor at the line printed (the line numbers are those of your installed torch;
# they move between releases). The stops follow the lesson: FSDP2's synchronous default and
# its backward prefetch, the prefetch lists, sharding a tensor without sending it, how two
# torchrun agents number four ranks, DDPOptimizer's cut, and FSDP2's hooks kept out of
# Dynamo.

# %%
from sourcemap import read_the_source  # noqa: E402  (lessons/ is on sys.path: first cell)

read_the_source([
    ("torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "self.unshard_async_op: bool = False",
     "The default behind section 1's count: `pre_forward` and `pre_backward` call "
     "`self.unshard(self.unshard_async_op)`, and `_prefetch_unshard` does the same for "
     "prefetched units, so on gloo every all-gather is waited for before the hook returns (on "
     "NCCL `async_op=False` makes a stream wait, not the CPU). Below, `_backward_prefetch` "
     "picks the unit whose forward ended just before this one's "
     "(`post_forward_order[curr_index - 1]`): why `blocks.0`'s all-gather was issued before "
     "`blocks.1`'s backward began with prefetch False too."),
    ("torch/distributed/fsdp/_fully_shard/_fully_shard.py", "def set_modules_to_forward_prefetch(",
     "The docstring on a singleton list (the same overlap as the default, issued earlier from "
     "the CPU) and on longer lists (more overlap, more reserved memory). `unshard`, above it, "
     "returns the `UnshardHandle` of section 1 when `async_op=True`."),
    ("torch/distributed/tensor/_api.py", "def distribute_tensor(",
     "With `src_data_rank=None` each placement only cuts this rank's piece out of the tensor "
     "it was given: `Shard` and `_StridedShard` split locally (`_shard_tensor` scatters only "
     "from a source rank) and `Replicate` keeps it (`_make_replicate_tensor` broadcasts only "
     "from a source rank). That is how section 2's meta-device init issued 0 collectives; "
     "the default, `src_data_rank=0`, scatters and broadcasts rank 0's tensor instead."),
    ("torch/distributed/elastic/agent/server/api.py", "def _assign_worker_ranks(",
     "How two agents number four ranks: each agent writes its `local_world_size` to the "
     "rendezvous store, the agent of group rank 0 gives each agent, in group-rank order, a "
     "base equal to the sum of the local world sizes before it, and a worker's `RANK` is that "
     "base plus its `LOCAL_RANK`: node by node, so that, with the same `LOCAL_WORLD_SIZE` on "
     "every agent, `rank // LOCAL_WORLD_SIZE` is `GROUP_RANK` (section 3)."),
    ("torch/_dynamo/backends/distributed.py", "class DDPOptimizer:",
     "Its docstring, *Note [DDPOptimizer]*, gives the reason for section 4's four graphs: "
     "`compile_fn` walks the captured graph from its end, adds up parameter bytes and cuts "
     "where a bucket of `bucket_bytes_cap` is full (the first bucket from the end at "
     "`first_bucket_cap`), then compiles each piece on its own, so each gets its own backward."),
    ("torch/distributed/fsdp/_fully_shard/_fsdp_common.py", "def _dynamo_disable(",
     "FSDP2 wraps its hooks in `torch._dynamo.disable` through this function: why section 4's "
     "graphs hold no all-gather or reduce-scatter, and why compiling the whole sharded model "
     "breaks the graph at each block's hooks."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py:«line»  `self.unshard_async_op: bool = False`
#     The default behind section 1's count: `pre_forward` and `pre_backward` call
#     `self.unshard(self.unshard_async_op)`, and `_prefetch_unshard` does the same for
#     prefetched units, so on gloo every all-gather is waited for before the hook returns
#     (on NCCL `async_op=False` makes a stream wait, not the CPU). Below,
#     `_backward_prefetch` picks the unit whose forward ended just before this one's
#     (`post_forward_order[curr_index - 1]`): why `blocks.0`'s all-gather was issued
#     before `blocks.1`'s backward began with prefetch False too.
# torch/distributed/fsdp/_fully_shard/_fully_shard.py:«line»  `def set_modules_to_forward_prefetch(`
#     The docstring on a singleton list (the same overlap as the default, issued earlier
#     from the CPU) and on longer lists (more overlap, more reserved memory). `unshard`,
#     above it, returns the `UnshardHandle` of section 1 when `async_op=True`.
# torch/distributed/tensor/_api.py:«line»  `def distribute_tensor(`
#     With `src_data_rank=None` each placement only cuts this rank's piece out of the
#     tensor it was given: `Shard` and `_StridedShard` split locally (`_shard_tensor`
#     scatters only from a source rank) and `Replicate` keeps it (`_make_replicate_tensor`
#     broadcasts only from a source rank). That is how section 2's meta-device init issued
#     0 collectives; the default, `src_data_rank=0`, scatters and broadcasts rank 0's
#     tensor instead.
# torch/distributed/elastic/agent/server/api.py:«line»  `def _assign_worker_ranks(`
#     How two agents number four ranks: each agent writes its `local_world_size` to the
#     rendezvous store, the agent of group rank 0 gives each agent, in group-rank order, a
#     base equal to the sum of the local world sizes before it, and a worker's `RANK` is
#     that base plus its `LOCAL_RANK`: node by node, so that, with the same
#     `LOCAL_WORLD_SIZE` on every agent, `rank // LOCAL_WORLD_SIZE` is `GROUP_RANK`
#     (section 3).
# torch/_dynamo/backends/distributed.py:«line»  `class DDPOptimizer:`
#     Its docstring, *Note [DDPOptimizer]*, gives the reason for section 4's four graphs:
#     `compile_fn` walks the captured graph from its end, adds up parameter bytes and cuts
#     where a bucket of `bucket_bytes_cap` is full (the first bucket from the end at
#     `first_bucket_cap`), then compiles each piece on its own, so each gets its own
#     backward.
# torch/distributed/fsdp/_fully_shard/_fsdp_common.py:«line»  `def _dynamo_disable(`
#     FSDP2 wraps its hooks in `torch._dynamo.disable` through this function: why section
#     4's graphs hold no all-gather or reduce-scatter, and why compiling the whole sharded
#     model breaks the graph at each block's hooks.
# ```

# %% [markdown]
# ## Mastery check
#
# Answer each question before you open its answer; every answer points to the section whose
# printed lines show it.
#
# 1. **Explain.** With `set_modules_to_forward_prefetch([blocks[1]])` on a gloo run, block 1's
#    all-gather is issued before block 0's forward begins. Does it travel while block 0
#    computes? What would make it do so on gloo?
#
#    <details><summary>Answer</summary>
#
#    No: no all-gather was in flight when any block's computation began or ended, with or
#    without prefetch. FSDP2 issues its collectives synchronously by default
#    (`unshard_async_op = False`), and on gloo the calling thread waits for each one, so
#    prefetching only moved the wait earlier. `blocks[1].unshard(async_op=True)` returned
#    with its all-gather in flight, still in flight when the computation after it ended.
#    (*§ Overlap: when FSDP2's collectives travel*)
#
#    </details>
#
# 2. **Predict.** Under FSDP2, each block computes through `checkpoint(...,
#    use_reentrant=False)`. How many block computations does a step make, what does one
#    block keep for backward, does the peak drop, and do the gradients change?
#
#    <details><summary>Answer</summary>
#
#    4 instead of 2: each block runs again in backward. One block keeps 1 tensor, its input
#    (16,384 B), instead of 15 (270,336 B), and even without checkpointing none of them is an
#    S × S attention matrix. The profiler's peak is lower with checkpointing on every rank,
#    and the gradients are bitwise those without it.
#    (*§ Memory: activation checkpointing, meta-device init, clipping*)
#
#    </details>
#
# 3. **Explain.** The model is built on the meta device, sharded, then `to_empty` and
#    `init_weights` run. How many collectives does that issue, and why are the values
#    bitwise those of a one-process build?
#
#    <details><summary>Answer</summary>
#
#    None: each rank cuts its own piece of each full parameter with `distribute_tensor(...,
#    src_data_rank=None)`, which sends nothing. Each parameter's values come from a
#    generator of its own, so they do not depend on how the model is sharded; each rank holds
#    15,424 of the 60,160 B. (*§ Memory: activation checkpointing, meta-device init, clipping*)
#
#    </details>
#
# 4. **Explain.** The 4 ranks start as two torchrun agents of 2 ranks, two "nodes". Why does
#    the 2-D mesh name its dimensions `("dp", "tp")`, tp last?
#
#    <details><summary>Answer</summary>
#
#    The agents number the ranks node by node (`rank // LOCAL_WORLD_SIZE` is `GROUP_RANK` on
#    every rank), and the mesh holds consecutive ranks along its last dimension
#    (`[[0, 1], [2, 3]]`): the tp groups `[0, 1]` and `[2, 3]` stay inside a node, the dp
#    groups `[0, 2]` and `[1, 3]` cross. Tensor parallelism communicates activations in every
#    block, forward and backward, so it belongs on the fast links inside a node.
#    (*§ Past one machine: two agents, one rendezvous*)
#
#    </details>
#
# 5. **Predict.** Eight `Linear(512, 512)` + ReLU layers (1,050,624 B of parameters each),
#    in a model class of your own, are compiled with `model.compile()` and then wrapped in
#    `DDP(model, bucket_cap_mb=2)`. How many graphs does the backend receive with the
#    default `optimize_ddp=True`, how many layers does each hold, and why does that split
#    matter for communication?
#
#    <details><summary>Answer</summary>
#
#    5 graphs, of [1, 2, 2, 2, 1] layers in forward order. DDPOptimizer walks the graph from
#    its end and starts a new piece once the current one holds at least its cap: the first
#    piece from the end at 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`), which the last layer
#    alone fills, then 2 MiB, which two layers fill (2,101,248 B); the first layer is left
#    over. Each graph has its own backward node, so the last layers' all-reduce can start
#    while the earlier layers' backward still runs; with `optimize_ddp=False` there is one
#    graph, and every all-reduce waits for the whole backward.
#    (*§ Compile inside the data-parallel wrapper: DDP and FSDP2*)
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder; `make exercises N=13b` runs your code on 2 gloo ranks
# (through the kit) beside `nn.parallel.DistributedDataParallel` on the same model and data
# and compares gradients and parameters after 3 steps (`solutions.py` has one way):
#
# 1. `all_reduce_grads(model)`: naive data parallelism, one all-reduce per gradient after
#    backward. Forgetting to divide by the world size is caught.
# 2. `Bucketed(model, bucket_bytes)` with `finish()`: gradients in buckets, each bucket
#    all-reduced asynchronously from a `register_post_accumulate_grad_hook` as soon as it is
#    full, all handles waited in `finish()`. It must issue fewer collectives than (1), start
#    while other gradients are still being computed, never wait inside backward, and flush
#    every bucket (a last, partly filled bucket included).
#
# The check is rank code too, the last of this part: `show_exercises` trains your answer and
# DDP side by side on each rank and prints, per exercise, the comparison and what the
# watched `dist.all_reduce` saw (`[naive] ...`, `[bucketed 2000] ...` lines).

# %%
#@worker
class Handle:
    """What the checker's dist.all_reduce returns for async_op=True: the real work, with its
    wait() noted in the log."""

    def __init__(self, work, log):
        self.work, self.log = work, log

    def wait(self, *args, **kwargs):
        self.log.append("wait")
        return self.work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.work, name)


class Watch:
    """While active, dist.all_reduce notes each call ('issue' or 'blocking') and each wait on
    its handle; the step notes each gradient as it is ready ('grad') and where backward ended."""

    def __init__(self):
        self.log, self.original = [], dist.all_reduce

    def __enter__(self):
        self.log = []  # a new log for each step

        def all_reduce(tensor, *args, async_op=False, **kwargs):
            self.log.append("issue" if async_op else "blocking")
            work = self.original(tensor, *args, async_op=async_op, **kwargs)
            return Handle(work, self.log) if async_op else work
        dist.all_reduce = all_reduce
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self.original


def train(model, tokens, make_sync, steps=3):
    """`steps` SGD steps of this rank's tokens; make_sync(model) returns after_backward(step),
    which syncs the gradients. Returns the gradients of every step and the Watch logs."""
    opt, grads, logs, watch = torch.optim.SGD(model.parameters(), lr=0.1), [], [], Watch()
    for p in model.parameters():  # registered before the answer's hooks, so each runs before them
        p.register_post_accumulate_grad_hook(lambda p: watch.log.append("grad"))
    after_backward = make_sync(model)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        with watch:
            loss_fn(model, tokens[step]).backward()
            watch.log.append("backward ended")
            after_backward(step)
        grads.append([p.grad.clone() for p in model.parameters()])
        logs.append(watch.log)
        opt.step()
    return grads, logs


REFERENCE = {}  # DDP's gradients and parameters: the same for every check, trained once


def against_ddp(device, make_sync, tag):
    """Train with the student's synchronisation and with DDP; print the comparison."""
    world, rank = dist.get_world_size(), dist.get_rank()
    tokens = [batch(device, world, rank, size=4 * world)[1].roll(step, dims=1) for step in range(3)]
    if not REFERENCE:
        ddp = DDP(build(device=device))
        REFERENCE["grads"], _ = train(ddp, tokens, lambda model: lambda step: None)
        REFERENCE["params"] = [p.detach().clone() for p in ddp.module.parameters()]
    model = build(device=device)
    grads, logs = train(model, tokens, make_sync)
    worst = max((a - b).abs().max().item() for g, h in zip(grads, REFERENCE["grads"]) for a, b in zip(g, h))
    params = max((p - q).abs().max().item() for p, q in zip(model.parameters(), REFERENCE["params"]))
    say(f"{tag} grads of 3 steps vs DDP max gap {below(worst)}; parameters after 3 steps max gap {below(params)}")
    return logs


def naive(device, module, tag):
    logs = against_ddp(device, lambda model: lambda step: module.all_reduce_grads(model), tag)
    n = sum(1 for _ in Model().parameters())
    say(f"{tag} all-reduces per step {[log.count('issue') + log.count('blocking') for log in logs]}, parameters {n}")


def bucketed(device, module, tag, size):
    sync = lambda model: (lambda b: lambda step: b.finish())(module.Bucketed(model, size))  # noqa: E731
    logs = against_ddp(device, sync, tag)
    say(f"{tag} all-reduces per step {[log.count('issue') + log.count('blocking') for log in logs]}, "
        f"blocking {sum(log.count('blocking') for log in logs)}")
    last = [len(log) - 1 - log[::-1].index("grad") for log in logs]  # where the last gradient was ready
    first = [log.index("issue") < at if "issue" in log else False for log, at in zip(logs, last)]
    early = [log[:log.index("backward ended")].count("wait") for log in logs]
    late = [log[log.index("backward ended"):].count("wait") for log in logs]
    say(f"{tag} first all-reduce issued before the last gradient was ready {first}; "
        f"waits before backward ended {early}, after {late}")


def show_exercises(device, answers):
    """The exercises' check, for each file named by --answers (the tests pass solutions.py or
    yours), each after an `answers from <file>` line; `file::naive` runs only that check."""
    for entry in answers:
        path, _, only = entry.partition("::")
        say(f"answers from {Path(path).name}")
        spec = importlib.util.spec_from_file_location("answers", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        checks = [("[naive]", lambda tag: naive(device, module, tag))]
        checks += [(f"[bucketed {size}]", lambda tag, size=size: bucketed(device, module, tag, size))
                   for size in (2000, 10_000, 1 << 20)]
        for tag, check in [(tag, check) for tag, check in checks if only in ("", tag[1:-1])]:
            try:
                check(tag)
            except NotImplementedError:
                say(f"{tag} not attempted: NotImplementedError")
            except Exception as e:  # noqa: BLE001  (every rank fails alike: say so, go on)
                say(f"{tag} failed: {type(e).__name__}: {e}")

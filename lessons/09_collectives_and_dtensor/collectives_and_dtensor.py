# %% [markdown]
# # 09 · Collectives and DTensor: two processes, one tensor
#
# Distributed training is several processes (*ranks*) that each run the same script on
# their own piece of the work and meet in *collectives*: calls that every rank of a
# *process group* makes together, like summing a gradient across ranks. This lesson starts
# two ranks on this CPU, runs every basic collective on a small vector, breaks the rule that
# holds them together, and then shows DTensor: a tensor whose placement across ranks is
# written in its type, so that PyTorch itself picks the collective.
#
# **What you will learn**
#
# - what world size, rank, local rank, backend and process group are, and where torchrun
#   puts them;
# - what all_reduce, all_gather, reduce_scatter, broadcast and barrier compute, on the
#   sum-partials [1, 2] (rank 0) and [10, 20] (rank 1) of the vector [11, 22];
# - why the order of collectives is a contract, how a broken one ends (an error after a
#   timeout you set, not a hang), and how `TORCH_DISTRIBUTED_DEBUG=DETAIL` and
#   `monitored_barrier` name the culprit;
# - DeviceMesh and the DTensor placements Shard, Replicate and Partial; which collective
#   each redistribution runs; a sharded matmul whose result is Partial.
#
# **Prerequisites:** lessons 01 (tensors) and 06a (devices); Python's `subprocess`.
#
# **How to run:** `python lessons/09_collectives_and_dtensor/collectives_and_dtensor.py` or
# `make lesson N=09` from the repository root, or open `collectives_and_dtensor.ipynb`. It
# launches three 2-rank runs of `worker.py` (under a minute on two CPU cores, more when
# they are busy, with the gloo backend) through the course's multi-rank kit, `lessons/multirank.py`, which this lesson
# introduces (copy the whole course, not only this folder). `worker.py` is the code each
# rank runs, written from this lesson's `#@worker` cells (section 1). You can run it
# yourself, each rank's output then interleaved:
# `torchrun --standalone --nproc-per-node=2 lessons/09_collectives_and_dtensor/worker.py collectives`
# (or `mismatch`; add `--backend nccl` on a machine with 2 GPUs). Each printing cell is followed
# by an *Output* block: what it printed with the pinned PyTorch (2.13.0).

# %%
import ast
import re
import sys
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle
from torch.distributed.constants import default_pg_timeout

# lessons/, the folder of the course's multi-rank kit (multirank.py) and source map (sourcemap.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] if "__file__" in globals() else Path.cwd().parent))
from multirank import launch, section, show, still_running

# %% [markdown]
# ## 1. Launching ranks without ever hanging
#
# `torchrun` (the module `torch.distributed.run`) starts one Python process per rank and
# tells each, through environment variables, who it is: `RANK` (0 or 1 here), `WORLD_SIZE`
# (2), `LOCAL_RANK` (its number among the ranks of its own machine: the GPU it should use),
# and where rank 0 listens so that the others can find it (`MASTER_ADDR`, `MASTER_PORT`;
# `--standalone` picks a free port on localhost).
#
# Every rank runs the same file, `worker.py`, and you read its code in this notebook: a
# code cell whose first line is `#@worker` is code the ranks run. Such a cell only defines
# (imports, functions, constants) and calls nothing, so running it here changes nothing;
# the course copies these cells, in order, into `worker.py` beside the lesson, and that file
# is what torchrun launches (to change the worker, edit a cell and regenerate the file, as
# *Exercises* says). Each rank function comes just before the cell that shows what the
# ranks printed. The first holds the worker's imports:

# %%
#@worker
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from multirank import MARK, heading, say, serve, shared

# %%
torch.manual_seed(0)
torch.set_num_threads(1)  # the ranks get one thread each too (OMP_NUM_THREADS=1): 2 cores
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
WORKER = HERE / "worker.py"

# %% [markdown]
# Starting ranks safely takes more code than one call, and every lesson from here on needs
# it, so it lives in one module they all import, the course's *multi-rank kit*,
# `lessons/multirank.py` (the first code cell put its folder on Python's path). In this
# notebook, `launch(WORKER, ["part"])` runs
# `torchrun --standalone --nproc-per-node=2 worker.py part` and returns a `Run`: torchrun's
# exit code, the wall time, and what each rank printed. In the worker, `serve` reads the
# part's name from the command line, joins the process group, runs the part and tears the
# rank down (section 2 says how); `say` prints one line prefixed `rank N:`, `shared` prints
# a fact every rank shares from rank 0 only, and `heading("world")` starts the section that
# `show(run, "world")` prints.
#
# Why a launch never hangs and never leaves a process behind: `launch` bounds it with a hard
# timeout (120 s unless you pass `timeout=`), because a rank stuck in a collective waits as
# long as its group's timeout (gloo's default is 30 minutes, printed in section 5; the kit
# gives the default group 60 s) and a rank stuck before that can wait forever. However
# `launch` ends (normally, at the timeout, on an exception, on Ctrl-C or a notebook's
# Interrupt, on SIGTERM, even when the notebook's kernel is killed outright), every process
# of the launch is killed.
# Killing torchrun is not enough for that: it starts each rank in a process *session* of its
# own, out of reach of a signal to torchrun's session, so every process of a launch carries
# a mark in its environment, `COURSE_LAUNCH_ID`, and the kit kills each process that
# carries it. And each rank writes its output to a log file of its own, which `launch` reads
# into `run.out[rank]`: two ranks printing to one terminal can interleave inside a line. The
# kit's docstring lists every precaution, why it is there, and what proves it.
#
# The part `collectives` runs sections 1 to 4 in one launch; each section below shows its
# function before its output. Here are the worker's parts, and its `main`, which torchrun's
# command line reaches through `serve`:

# %%
#@worker
def collectives(device):
    world(device)
    basics(device)
    late_rank(device)
    mesh = init_device_mesh(device.type, (2,), mesh_dim_names=("dp",))
    sharded, partial = placements(mesh, device)
    redistributions_of(mesh, sharded, partial)
    sharded_matmul(mesh, device)
    random_matmul(mesh, device)
    return 0  # the exit code


def main():
    serve({"collectives": collectives, "mismatch": mismatch, "hang": hang})

# %% [markdown]
# **Predict.** Both ranks run the same script. What differs between the two ranks' first
# lines? Which lines appear only once? The first function of the part says who each rank is:

# %%
#@worker
def world(device):
    heading("world")
    env = " ".join(f"{k}={os.environ[k]}" for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    say(f"rank {dist.get_rank()} of {dist.get_world_size()}, env {env}, device {device.type}")
    shared(f"backend {dist.get_backend()}, default group ranks {dist.get_process_group_ranks(dist.group.WORLD)}")
    # what the kit relies on to kill a launch: each rank leads a session of its own (torchrun
    # starts it so), and carries the launch's mark in its environment
    say(f"leads a process session of its own: {os.getsid(0) == os.getpid()}; carries {MARK}: {MARK in os.environ}")

# %%
run = launch(WORKER, ["collectives"])
print(f"torchrun exit code {run.code} after {run.seconds:.1f} s, output from ranks {sorted(run.out)}")
show(run, "world")

# %% [markdown]
# Output:
# ```text
# torchrun exit code 0 after «time» s, output from ranks [0, 1]
# rank 0: rank 0 of 2, env RANK=0 LOCAL_RANK=0 WORLD_SIZE=2, device cpu
# rank 0: backend gloo, default group ranks [0, 1]
# rank 0: leads a process session of its own: True; carries COURSE_LAUNCH_ID: True
# rank 1: rank 1 of 2, env RANK=1 LOCAL_RANK=1 WORLD_SIZE=2, device cpu
# rank 1: leads a process session of its own: True; carries COURSE_LAUNCH_ID: True
# ```
#
# Each rank read its identity from the environment torchrun gave it, then called
# `dist.init_process_group("gloo", timeout=...)` (in the kit's `setup`, which `serve`
# calls), which used `MASTER_ADDR`/`MASTER_PORT` to meet the other rank and build the
# *default process group*: every rank of the world, with a *backend* that moves the bytes.
# gloo runs on CPUs over TCP; NCCL is the backend for CUDA GPUs (the worker takes
# `--backend nccl`). Facts both ranks share (backend, group) are printed by rank 0 only.
# Each rank leads a session of its own, which is why killing torchrun's session could not
# reach it, and carries the launch's mark, which is how the kit finds it. The launch took the
# seconds printed above, most of them spent starting Python processes that import torch.
#
# **Predict.** The worker's `hang` part never ends. Launched with `timeout=2`, when does
# `launch` return, with which exit code, and what is left running?

# %%
#@worker
def hang(device):
    """A rank that never finishes, as one stuck before its first collective would."""
    while True:
        time.sleep(1)

# %%
stuck = launch(WORKER, ["hang"], timeout=2)
print(f"timed out: {stuck.timed_out} after {stuck.seconds:.1f} s; torchrun's exit code {stuck.code}")
print(f"processes of the launch still running: {len(still_running(WORKER, stuck.mark))}")

# %% [markdown]
# Output:
# ```text
# timed out: True after «time» s; torchrun's exit code None
# processes of the launch still running: 0
# ```
#
# `launch` returned a little after its 2 s (the time varies with the machine's load), with
# no exit code: torchrun did not finish, it was stopped (SIGTERM first, which torchrun
# forwards to its ranks, then SIGKILL 3 s later for whatever is left). Nothing is left:
# `still_running` lists the processes whose command line names the worker (torchrun's and
# the ranks') and, on Linux, that carry this launch's mark. (After 2 s the ranks may still
# be importing torch or already hanging: the kill does not care which.) A hang costs the
# timeout you chose, never more; the same holds for a hang after the process group is up,
# and for an interrupted or killed notebook.

# %% [markdown]
# ## 2. Collectives on sum-partials
#
# Each rank holds a *partial* of one logical vector: rank 0 has [1, 2], rank 1 has
# [10, 20], and the vector they stand for is their sum, [11, 22] (gradients computed on two
# halves of a batch are partials like these). Every rank calls the same collectives in the
# same order:
#
# - `all_reduce(x)`: every rank ends with the elementwise sum;
# - `all_gather(list, x)`: every rank ends with every rank's x; `all_gather_single(out, x)`
#   writes them side by side into one tensor;
# - `reduce_scatter_single(out, x)`: sum, then rank r keeps only the r-th chunk;
# - `broadcast(x, src=0)`: every rank ends with rank 0's x.
#
# **Predict.** What does each rank hold after each call? How many elements does
# `all_gather_single` produce, and is that the vector [11, 22]?

# %%
#@worker
def partial_vector(device):
    """The sum-partials of the logical vector [11, 22]: [1, 2] on rank 0, [10, 20] on rank 1."""
    return torch.tensor([1, 2] if dist.get_rank() == 0 else [10, 20], device=device)


def basics(device):
    heading("collectives")
    x = partial_vector(device)
    say(f"partial x = {x.tolist()}")
    y = x.clone()  # every collective here writes in place or into an output we allocate
    dist.all_reduce(y)  # SUM by default
    say(f"all_reduce            -> {y.tolist()}")
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    say(f"all_gather            -> {[p.tolist() for p in parts]}")
    cat = torch.empty(2 * x.numel(), dtype=x.dtype, device=device)
    dist.all_gather_single(cat, x)  # the current name; all_gather_into_tensor is deprecated
    say(f"all_gather_single     -> {cat.tolist()}  ({cat.numel()} elements)")
    mine = torch.empty(x.numel() // 2, dtype=x.dtype, device=device)
    dist.reduce_scatter_single(mine, x)  # the current name; reduce_scatter_tensor is deprecated
    say(f"reduce_scatter_single -> {mine.tolist()}")
    b = x.clone()
    dist.broadcast(b, src=0)
    say(f"broadcast(src=0)      -> {b.tolist()}")

# %%
show(run, "collectives")

# %% [markdown]
# Output:
# ```text
# rank 0: partial x = [1, 2]
# rank 0: all_reduce            -> [11, 22]
# rank 0: all_gather            -> [[1, 2], [10, 20]]
# rank 0: all_gather_single     -> [1, 2, 10, 20]  (4 elements)
# rank 0: reduce_scatter_single -> [11]
# rank 0: broadcast(src=0)      -> [1, 2]
# rank 1: partial x = [10, 20]
# rank 1: all_reduce            -> [11, 22]
# rank 1: all_gather            -> [[1, 2], [10, 20]]
# rank 1: all_gather_single     -> [1, 2, 10, 20]  (4 elements)
# rank 1: reduce_scatter_single -> [22]
# rank 1: broadcast(src=0)      -> [1, 2]
# ```
#
# `all_reduce` completes the partials: both ranks hold [11, 22]. `reduce_scatter` does the
# same sum but leaves each rank only its half, [11] on rank 0 and [22] on rank 1: half the
# memory, and on a ring of N ranks about half the traffic of an all-reduce (a ring
# all-reduce *is* a reduce-scatter followed by an all-gather). Gathering is the classic mistake with
# partials: `all_gather_single` puts them side by side, 4 elements where the logical vector
# has 2, and none of the four is right. A gather is for *shards* (pieces of a tensor); a
# reduction is for *partials* (summands of it). `broadcast` copies rank 0's tensor over
# everyone's, the way a training run makes sure all ranks start from the same weights.
#
# The names are PyTorch 2.13's: `all_gather_into_tensor` and `reduce_scatter_tensor` still
# work but emit a `FutureWarning` pointing to `all_gather_single` and
# `reduce_scatter_single` (read from `torch/distributed/distributed_c10d.py`). Every
# collective here is *blocking* (it returns when this rank's part is done); with
# `async_op=True` it returns a work handle to `wait()` on instead.
#
# **Predict.** Below, rank 1 sleeps 0.5 s before calling `dist.barrier()`, rank 0 does not.
# How long does each wait inside the barrier?

# %%
#@worker
def late_rank(device):
    heading("barrier")
    time.sleep(0.5 * dist.get_rank())  # rank 1 is late: it has "more work" to do
    entered = time.monotonic()  # one clock for every process of this machine
    dist.barrier()
    left = time.monotonic()
    say(f"waited {left - entered:.2f} s at the barrier")
    times = [torch.zeros(2, dtype=torch.float64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(times, torch.tensor([entered, left], dtype=torch.float64, device=device))
    last_in = max(t[0] for t in times)
    shared(f"every rank left the barrier after the last one entered it: {all(t[1] >= last_in for t in times)}")

# %%
show(run, "barrier")

# %% [markdown]
# Output:
# ```text
# rank 0: waited «time» s at the barrier
# rank 0: every rank left the barrier after the last one entered it: True
# rank 1: waited «time» s at the barrier
# ```
#
# Rank 0 waits about 0.5 s, rank 1 about nothing (times vary from run to run and with the
# machine's load): a barrier returns on no rank before every rank has entered it, which the
# ranks confirmed by exchanging the moments they entered and left it (on one machine, every
# process reads the same monotonic clock). The early rank pays for the late one. Every
# collective synchronises this way: a slow rank stalls the whole group, which is why a
# distributed job runs at the speed of its slowest rank.
#
# A barrier is also how `serve` ends a rank that finished its part normally, so that no rank
# tears down while another still talks to it; then, on every path, it calls
# `dist.destroy_process_group()`. Do the same in your own scripts: a rank that just falls off
# the end of its script can die *after* its work with "terminate called without an active
# exception" (SIGABRT), and a barrier alone does not prevent that abort. Nor does
# `destroy_process_group()` while a DeviceMesh or a DTensor (section 3) still holds the
# group: its gloo threads live on into Python's shutdown. So `serve` ends the process with
# `os._exit`, skipping that shutdown, and lesson 14's `train.py` does the same (the evidence
# is in the docstring of [`tests/workers/all_reduce.py`](../../tests/workers/all_reduce.py)).

# %% [markdown]
# ## 3. DeviceMesh and DTensor placements
#
# Calling collectives by hand means remembering, for each tensor, whether a rank holds a
# shard, a copy or a partial. DTensor writes that down. A `DeviceMesh` names the ranks as an
# array (here 1-D: `init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))`), and a DTensor
# carries one *placement* per mesh dimension:
#
# - `Shard(0)`: split along dim 0, each rank holds one piece;
# - `Replicate()`: every rank holds the whole tensor;
# - `Partial()`: every rank holds a full-sized summand; the tensor is their sum.
#
# `distribute_tensor(t, mesh, [placement])` makes a DTensor from a tensor every rank has;
# `DTensor.from_local(local, mesh, [placement])` declares what each rank already holds.
#
# **Predict.** `torch.arange(4)` distributed as `Shard(0)` and as `Replicate()`, and our
# partials declared `Partial()`: what is the global shape of each, and what does each rank
# hold locally?

# %%
#@worker
def placements(mesh, device):
    heading("placements")
    shared(f"mesh {mesh}")
    say(f"mesh coordinate dp={mesh.get_local_rank('dp')}")
    full = torch.arange(4, device=device)
    for placement in (Shard(0), Replicate()):
        d = distribute_tensor(full, mesh, [placement])
        say(f"{placement}: global {list(d.shape)} local {d.to_local().tolist()}")
    p = DTensor.from_local(partial_vector(device), mesh, [Partial()])
    say(f"{p.placements[0]}: global {list(p.shape)} local {p.to_local().tolist()}")
    return distribute_tensor(full, mesh, [Shard(0)]), p

# %%
show(run, "placements")

# %% [markdown]
# Output:
# ```text
# rank 0: mesh DeviceMesh((dp=2), 'cpu', stride=(1,))
# rank 0: mesh coordinate dp=0
# rank 0: S(0): global [4] local [0, 1]
# rank 0: R: global [4] local [0, 1, 2, 3]
# rank 0: P(sum): global [2] local [1, 2]
# rank 1: mesh coordinate dp=1
# rank 1: S(0): global [4] local [2, 3]
# rank 1: R: global [4] local [0, 1, 2, 3]
# rank 1: P(sum): global [2] local [10, 20]
# ```
#
# A DTensor's shape is the *global* shape, whatever the placement: 4 for the sharded and
# the replicated arange, 2 for the partial vector, whose value is [11, 22] though no rank
# holds that. `to_local()` gives the rank's own piece (`S(0)`, `R` and `P(sum)` are how
# PyTorch prints the placements). The mesh coordinate is the rank's index along `dp`; on a
# 2-D mesh, say (2 nodes, 4 GPUs), each rank has one coordinate per dimension.
#
# **Predict.** `d.redistribute(mesh, [new_placement])` changes a placement. Which
# collective must run for Shard→Replicate, Partial→Replicate, Partial→Shard(0), and
# Replicate→Shard(0)? `CommDebugMode` counts the collectives run inside its `with` block.

# %%
#@worker
def comms(counts):
    """CommDebugMode's counts as text: 'all_reduce x1', or 'none' when nothing was sent."""
    text = ", ".join(f"{str(op).split('.')[-1]} x{n}" for op, n in counts.items())
    return text or "none"


def redistribute(d, mesh, placement):
    """Redistribute, print before/after local pieces, and which collective it ran."""
    with CommDebugMode() as counter:
        out = d.redistribute(mesh, [placement])
    say(f"{d.placements[0]} -> {placement}: local {d.to_local().tolist()} -> {out.to_local().tolist()}")
    shared(f"{d.placements[0]} -> {placement} ran: {comms(counter.get_comm_counts())}")
    return out


def redistributions_of(mesh, sharded, partial):
    heading("redistribute")
    redistribute(sharded, mesh, Replicate())
    redistribute(partial, mesh, Replicate())
    redistribute(partial, mesh, Shard(0))
    replicated = distribute_tensor(torch.arange(4, device=sharded.device), mesh, [Replicate()])
    redistribute(replicated, mesh, Shard(0))

# %%
show(run, "redistribute")

# %% [markdown]
# Output:
# ```text
# rank 0: S(0) -> R: local [0, 1] -> [0, 1, 2, 3]
# rank 0: S(0) -> R ran: all_gather_into_tensor x1
# rank 0: P(sum) -> R: local [1, 2] -> [11, 22]
# rank 0: P(sum) -> R ran: all_reduce x1
# rank 0: P(sum) -> S(0): local [1, 2] -> [11]
# rank 0: P(sum) -> S(0) ran: reduce_scatter_tensor x1
# rank 0: R -> S(0): local [0, 1, 2, 3] -> [0, 1]
# rank 0: R -> S(0) ran: none
# rank 1: S(0) -> R: local [2, 3] -> [0, 1, 2, 3]
# rank 1: P(sum) -> R: local [10, 20] -> [11, 22]
# rank 1: P(sum) -> S(0): local [10, 20] -> [22]
# rank 1: R -> S(0): local [0, 1, 2, 3] -> [2, 3]
# ```
#
# Each redistribution is one collective from section 2: Shard→Replicate is an all-gather,
# Partial→Replicate an all-reduce, Partial→Shard a reduce-scatter (the same [11] and [22] as
# `reduce_scatter_single`), and Replicate→Shard needs no communication at all: every rank
# already has the whole tensor and keeps its slice. (DTensor calls the *functional*
# collectives, the operators in `torch.ops._c10d_functional`, which return new tensors
# instead of writing in place: the counts name these operators, not the deprecated
# `torch.distributed` functions of the same name.) The figure
# below draws each rank's local pieces before and after, from the lines the ranks printed.

# %%
REDIST = re.compile(r"rank (\d): (\S+) -> (\S+): local (\[.*\]) -> (\[.*\])")
RAN = re.compile(r"rank 0: (\S+) -> (\S+) ran: (.+)")


def redistributions(run):
    """[(src, dst, collective, {rank: (before, after)})] parsed from the ranks' output."""
    steps, pieces = [], {}
    for rank, lines in section(run, "redistribute").items():
        for line in lines:
            if m := REDIST.fullmatch(line):
                key = (m[2], m[3])
                pieces.setdefault(key, {})[rank] = (ast.literal_eval(m[4]), ast.literal_eval(m[5]))
            elif m := RAN.fullmatch(line):
                steps.append((m[1], m[2], m[3]))
    return [(src, dst, ran, pieces[(src, dst)]) for src, dst, ran in steps]


COLORS = {"S": "tab:blue", "R": "tab:green", "P": "tab:orange"}


def draw_piece(ax, values, x0, y, placement, offset):
    """One rank's local tensor as a row of cells, at its logical offset for a shard."""
    for i, v in enumerate(values):
        ax.add_patch(Rectangle((x0 + offset + i, y), 1, 0.8, facecolor=COLORS[placement[0]],
                               alpha=0.35, edgecolor="black"))
        ax.text(x0 + offset + i + 0.5, y + 0.4, str(v), ha="center", va="center")


def plot_redistributions(steps):
    fig, axes = plt.subplots(len(steps), 1, figsize=(8, 1.9 * len(steps)))
    for ax, (src, dst, ran, pieces) in zip(axes, steps):
        for side, placement, x0 in ((0, src, 0), (1, dst, 6)):
            for rank in sorted(pieces):
                lower = [len(pieces[r][side]) for r in pieces if r < rank]
                offset = sum(lower) if placement.startswith("S") else 0
                draw_piece(ax, pieces[rank][side], x0, 1 - rank, placement, offset)
        ax.annotate("", xy=(5.8, 0.9), xytext=(4.2, 0.9), arrowprops={"arrowstyle": "->"})
        ax.set_title(f"{src} -> {dst}: {ran}", fontsize=10)
        ax.set_xlim(-0.2, 10.2)
        ax.set_ylim(-0.1, 1.9)
        ax.set_yticks([1.4, 0.4], ["rank 0", "rank 1"])
        ax.set_xticks([])
    fig.suptitle("Local pieces before (left) and after (right) each redistribution")
    fig.tight_layout()
    return fig


steps = redistributions(run)
fig = plot_redistributions(steps)
fig.savefig(HERE / "redistributions.png")

# %% [markdown]
# Read each row from left to right: blue cells are shards, drawn at their place in the
# global tensor; green cells are replicas; orange cells are partials, whose *sum* is the
# tensor. Shards spread out along the tensor, replicas and partials each cover all of it.
# The colour of the right side tells you the collective that had to run: gathering blue into
# green, summing orange into green, summing orange into blue, or (last row) no message at
# all.

# %% [markdown]
# ## 4. A sharded matmul comes out Partial
#
# Placements propagate through operations. Take `a` (2×4) sharded by columns, `Shard(1)`,
# and `b` (4×3) sharded by rows, `Shard(0)`: rank 0 holds a's first two columns and b's
# first two rows, rank 1 the other halves. Since `a @ b = a[:, :2] @ b[:2] + a[:, 2:] @ b[2:]`,
# each rank can multiply its pieces with no communication.
#
# **Predict.** What placement does DTensor give `a @ b`? What must `full_tensor()` then
# run, and is the result exactly the single-process `a @ b`? The second function repeats
# the split on random float32 inputs, 64 wide.

# %%
#@worker
def sharded_matmul(mesh, device):
    heading("matmul")
    a = torch.arange(8.0, device=device).reshape(2, 4)  # (2, 4): small integers, exact sums
    b = torch.arange(12.0, device=device).reshape(4, 3)  # (4, 3)
    da = distribute_tensor(a, mesh, [Shard(1)])  # each rank: 2 of a's 4 columns
    db = distribute_tensor(b, mesh, [Shard(0)])  # each rank: the matching 2 of b's 4 rows
    with CommDebugMode() as counter:
        dc = da @ db
    say(f"a local {da.to_local().tolist()}, b local {db.to_local().tolist()}")
    say(f"a @ b local {dc.to_local().tolist()}")
    shared(f"a @ b placement {dc.placements[0]}, ran: {comms(counter.get_comm_counts())}")
    with CommDebugMode() as counter:
        full = dc.full_tensor()
    shared(f"full_tensor() {full.tolist()}, ran: {comms(counter.get_comm_counts())}")
    shared(f"equal to the single-process a @ b: {torch.equal(full, a @ b)}")


def random_matmul(mesh, device):
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 64, generator=gen).to(device), torch.randn(64, 3, generator=gen).to(device)
    full = (distribute_tensor(a, mesh, [Shard(1)]) @ distribute_tensor(b, mesh, [Shard(0)])).full_tensor()
    halves = a[:, :32].contiguous() @ b[:32] + a[:, 32:].contiguous() @ b[32:]  # the two ranks' products, added
    # Bitwise equality with one process's a @ b depends on the order the BLAS sums in (it
    # differs between CPUs), so it is not printed as a fact: the gap is, against a bound.
    shared(f"random fp32: bitwise equal to the two half-products added: {torch.equal(full, halves)}; "
           f"max gap to one process's a @ b below 1e-5: {(full - a @ b).abs().max().item() < 1e-5}")

# %%
show(run, "matmul")

# %% [markdown]
# Output:
# ```text
# rank 0: a local [[0.0, 1.0], [4.0, 5.0]], b local [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
# rank 0: a @ b local [[3.0, 4.0, 5.0], [15.0, 24.0, 33.0]]
# rank 0: a @ b placement P(sum), ran: none
# rank 0: full_tensor() [[42.0, 48.0, 54.0], [114.0, 136.0, 158.0]], ran: all_reduce x1
# rank 0: equal to the single-process a @ b: True
# rank 0: random fp32: bitwise equal to the two half-products added: True; max gap to one process's a @ b below 1e-5: True
# rank 1: a local [[2.0, 3.0], [6.0, 7.0]], b local [[6.0, 7.0, 8.0], [9.0, 10.0, 11.0]]
# rank 1: a @ b local [[39.0, 44.0, 49.0], [99.0, 112.0, 125.0]]
# ```
#
# The product is `Partial(sum)`: each rank holds a full 2×3 summand, computed without a
# message. `full_tensor()` (redistribute to Replicate, then `to_local()`) runs one
# all-reduce, and the sum of the summands is exactly the single-process product here
# because the inputs are small integers, whose float sums are exact. With random fp32 inputs
# each rank sums its half of the 64 products and the all-reduce adds the two halves: the
# result is bitwise the two half-products added, and within rounding of one process's
# matmul. Whether it is also bitwise equal to that matmul depends on the order in which your
# CPU's BLAS sums 64 products (floating-point addition is not associative), so check it
# against a bound, never with `torch.equal`. Lesson 10 builds tensor parallelism on exactly
# this column-then-row pattern.

# %% [markdown]
# ## 5. Collective order is a contract
#
# A collective is matched by *position*: the group's n-th collective on rank 0 meets the
# n-th on rank 1. Nothing checks by default that they are the same call. The second launch
# runs the worker's part `mismatch`, where rank 0 calls `all_reduce` while rank 1 calls
# `all_gather` on a group made with `dist.new_group(backend="gloo", timeout=3 s)`, a new
# group with a short timeout of its own.
#
# **Predict.** Does this hang forever (gloo's default timeout, printed below, is 30
# minutes), silently return garbage, or fail? After how long?

# %%
#@worker
SHORT = datetime.timedelta(seconds=3)  # the mismatch demos' groups


def mismatched_call(group):
    """Rank 0 all_reduce, rank 1 all_gather, on the same group: the contract is broken."""
    x = partial_vector(torch.device("cpu"))
    start = time.perf_counter()
    try:
        if dist.get_rank() == 0:
            dist.all_reduce(x, group=group)
        else:
            dist.all_gather([torch.empty_like(x) for _ in range(2)], x, group=group)
    except RuntimeError as err:
        return time.perf_counter() - start, str(err)
    return time.perf_counter() - start, None


def timeout_demo():
    heading("timeout")
    group = dist.new_group(backend="gloo", timeout=SHORT)  # gloo: works beside an NCCL default
    seconds, err = mismatched_call(group)
    # the message varies ("Timed out waiting 3000ms for recv ..." or "Connection closed by
    # peer"): stable is that it raises, after about the group's timeout
    verb = "raised RuntimeError" if err else "returned (no error)"
    say(f"{'all_reduce' if dist.get_rank() == 0 else 'all_gather'} {verb} after {seconds:.1f} s")
    return err is not None


def mismatch(device):
    found = [timeout_demo(), detail_demo(), monitored_demo()]
    say(f"raised in {sum(found)} of {len(found)} demos; exiting with 1")
    return 1  # a mismatch is a failure

# %%
bad = launch(WORKER, ["mismatch"], timeout=60)
print(f"torchrun exit code {bad.code} after {bad.seconds:.1f} s (launch timeout 60 s)")
print(f"a group made without timeout= would wait (gloo's default): {default_pg_timeout}")
show(bad, "timeout")

# %% [markdown]
# Output:
# ```text
# torchrun exit code 1 after «time» s (launch timeout 60 s)
# a group made without timeout= would wait (gloo's default): 0:30:00
# rank 0: all_reduce raised RuntimeError after «time» s
# rank 1: all_gather raised RuntimeError after «time» s
# ```
#
# Both ranks raise after about 3 s, the group's timeout: each waits for bytes the other
# never sends. The message says only that much, and it varies ("Timed out waiting 3000ms
# for recv operation to complete", or "Connection closed by peer" when the partner gives up
# first): nothing in it names the mismatched call. With gloo's default timeout the same job
# would sit for 30 minutes; set `timeout=` in `init_process_group` and `new_group`. (Can
# it be worse than a hang? Exercise C gives the two ranks' `all_reduce` calls different
# shapes.) The part catches these errors and returns exit code 1 on both ranks; both ranks
# got there normally, so the teardown's barrier and `destroy_process_group()` run, and
# torchrun reports the failure (exit code 1) well inside the launcher's 60 s.
#
# **Predict.** With the debug level DETAIL, each collective is first checked against the
# other ranks' (its "fingerprint": op type, shapes, dtypes). How fast is the mismatch
# found now, and what does the error say?

# %%
#@worker
def detail_demo():
    heading("detail")
    dist.set_debug_level(dist.DebugLevel.DETAIL)  # what TORCH_DISTRIBUTED_DEBUG=DETAIL sets at import
    group = dist.new_group(backend="gloo", timeout=SHORT)  # wrapped: fingerprints checked first
    dist.set_debug_level(dist.DebugLevel.OFF)
    seconds, err = mismatched_call(group)
    say(f"raised after {seconds:.2f} s: {err.split('. ')[0] if err else 'no error'}")
    if err:
        say(" ".join(err.split("following aspects:")[-1].split()))
    return err is not None

# %%
show(bad, "detail")

# %% [markdown]
# Output:
# ```text
# rank 0: raised after «time» s: Detected mismatch between collectives on ranks
# rank 0: Op type: ALLREDUCEvs ALLGATHER
# rank 1: raised after «time» s: Detected mismatch between collectives on ranks
# rank 1: Op type: ALLGATHERvs ALLREDUCE
# ```
#
# In milliseconds, and the full message names both sides: "Rank 0 is running collective:
# CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[2], ...), but Rank
# 1 is running collective: ... OpType=ALLGATHER ..." (the missing space in "ALLREDUCEvs" is
# PyTorch's). `TORCH_DISTRIBUTED_DEBUG=DETAIL` in the environment sets this level when
# `torch.distributed` is imported, and every group then gets the checking wrapper; the
# worker calls `dist.set_debug_level(DebugLevel.DETAIL)` around one `new_group` instead, so
# that one launch shows both behaviours. The check costs extra messages on every call, so
# it is a debugging switch, not a default.
#
# A rank that never arrives at all (stuck in a data loader, an infinite loop) is the other
# common failure. `dist.monitored_barrier(timeout=...)` (gloo only) makes rank 0 wait for
# each other rank separately and name the first rank that did not come (every one with
# `wait_all_ranks=True`). Here rank 1 is busy
# elsewhere and never enters it:

# %%
#@worker
def monitored_demo():
    heading("monitored_barrier")
    group = dist.new_group(backend="gloo", timeout=SHORT)
    if dist.get_rank() == 1:
        time.sleep(1.5)  # stuck elsewhere: never enters the monitored barrier
        say("was busy and never entered the monitored barrier")
        return False
    start = time.perf_counter()
    try:
        dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=1))
    except RuntimeError as err:
        say(f"raised after {time.perf_counter() - start:.1f} s: {str(err).splitlines()[0]}")
        return True
    say("monitored barrier passed")
    return False

# %%
show(bad, "monitored_barrier")

# %% [markdown]
# Output:
# ```text
# rank 0: raised after «time» s: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms
# rank 0: raised in 3 of 3 demos; exiting with 1
# rank 1: was busy and never entered the monitored barrier
# rank 1: raised in 2 of 3 demos; exiting with 1
# ```
#
# A plain barrier would only time out; the monitored one says *which* rank is missing. Both
# tools point at the culprit; the fix is always to make every rank call the same
# collectives, in the same order, with matching shapes: no collective inside an `if rank ==
# 0:` unless the other ranks make the same call in their branch.

# %% [markdown]
# ## Summary
#
# - torchrun starts one process per rank and passes `RANK`, `LOCAL_RANK`, `WORLD_SIZE` and
#   the rendezvous address in the environment; `init_process_group` builds the default
#   group over a backend (gloo on CPU, NCCL on CUDA). What each rank runs is this lesson's
#   `#@worker` cells, copied into `worker.py`. The course's kit, `multirank.py`, launches
#   under a hard timeout, kills every process of a launch however the launch ends
#   (torchrun's session, its descendants, every process carrying the launch's mark), gives
#   each rank's output its own file, and ends every rank with `barrier()` (only after
#   success) then `destroy_process_group()` (always).
# - On the sum-partials [1, 2] and [10, 20]: all_reduce gives [11, 22] on both ranks,
#   reduce_scatter gives [11] and [22], all_gather of partials gives 4 meaningless elements,
#   broadcast copies rank 0's tensor. A barrier, like every collective, waits for the
#   slowest rank.
# - Collectives match by order. A mismatch fails only after the group's timeout (so set a
#   short one) with a vague message; `TORCH_DISTRIBUTED_DEBUG=DETAIL` names the mismatched
#   ops at once, and `monitored_barrier` names a rank that never arrives.
# - A DTensor is a global tensor plus placements on a DeviceMesh: Shard, Replicate, Partial.
#   Redistribution picks the collective: Shard→Replicate all-gathers, Partial→Replicate
#   all-reduces, Partial→Shard reduce-scatters, Replicate→Shard sends nothing. A
#   column-sharded times row-sharded matmul is Partial, and `full_tensor()` equals the
#   single-process product up to the order of additions.

# %% [markdown]
# ## References
#
# - [`torch.distributed`](https://docs.pytorch.org/docs/2.13/distributed.html): process
#   groups and backends, every collective of section 2, `new_group`'s `timeout`,
#   `monitored_barrier` and `TORCH_DISTRIBUTED_DEBUG` (section 5), torchrun's environment.
# - [`init_device_mesh`](https://docs.pytorch.org/docs/2.13/distributed.html#torch.distributed.device_mesh.init_device_mesh):
#   the mesh of section 3, its named dimensions and their process groups.
# - [`torch.distributed.tensor`](https://docs.pytorch.org/docs/2.13/distributed.tensor.html):
#   DTensor, `Shard`, `Replicate`, `Partial`, `distribute_tensor`, `from_local`,
#   `redistribute`, `full_tensor` and `CommDebugMode` (sections 3 and 4).
# - [Horovod](https://arxiv.org/abs/1802.05799): ring all-reduce for data-parallel training,
#   the reduce-scatter then all-gather of section 2.
# - [PyTorch Distributed](https://arxiv.org/abs/2006.15704): how DDP overlaps its gradient
#   all-reduces with the backward pass, built on the collectives of this lesson.

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each stop is a file of your installed torch and the line, in
# *your* version, where something this lesson showed is implemented, with what to look for
# there. They follow the lesson: a rank joining its group, a mesh getting its groups, DTensor
# choosing a collective and a placement, and the DETAIL check. (The course's kit,
# `lessons/multirank.py`, is not PyTorch: it has no stop here.)

# %%
from sourcemap import read_the_source  # noqa: E402  (lessons/ is on sys.path: first cell)

read_the_source([
    ("torch/distributed/rendezvous.py", "def _env_rendezvous_handler(",
     "What `init_process_group` runs when given neither `init_method` nor `store` (`env://`): "
     "it reads "
     "`RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` from the environment torchrun set "
     "(raising 'environment variable ... expected, but not set' when one is missing), then "
     "`_create_c10d_store` opens a TCPStore at that address, the key-value store through which "
     "the ranks meet."),
    ("torch/distributed/device_mesh.py", "def init_device_mesh(",
     "It builds a layout from `mesh_shape` and the identity rank map `torch.arange(n)` over the "
     "mesh's n ranks, and `DeviceMesh.__init__` calls `_init_process_groups`: one process group "
     "per mesh dimension. "
     "For a 1-D mesh over the whole world, `_init_one_process_group` uses the default group "
     "itself (a new group only when CUDA is available and the default group is gloo), and "
     "`get_local_rank('dp')` is this rank's rank in that group: the printed mesh coordinate."),
    ("torch/distributed/tensor/_redistribute.py", "def redistribute_local_tensor(",
     "The loop over the planned steps, one mesh dimension at a time. Towards `Replicate`, a "
     "Partial source calls `_reduce_value` and a Shard source `_to_replicate_tensor` (an "
     "all-gather); towards `Shard`, a Partial source calls `_reduce_shard_value` and a Replicate "
     "source `_replicate_to_shard`, which only takes its own slice, locally: the four rows of "
     "section 3, the last one sending nothing."),
    ("torch/distributed/tensor/placement_types.py", "class Partial(",
     "`_reduce_value` is one `funcol.all_reduce` over the mesh dimension's group, and "
     "`_reduce_shard_value` hands over to `Shard._reduce_shard_tensor`, a "
     "`funcol.reduce_scatter_single`. These functional collectives run "
     "`_c10d_functional.all_reduce` and `reduce_scatter_tensor`, the names `CommDebugMode` "
     "counted."),
    ("torch/distributed/tensor/_ops/_matrix_ops.py", "def gen_single_dim_einsum_strategies(",
     "The sharding rules of `mm` (`mk,kn->mn`, registered by `mm_single_dim_strategy` below). "
     "The 'split contracting dim' loop makes the output `Partial()` when both inputs are "
     "sharded on k (a's dim 1, b's dim 0): why section 4's `a @ b` came out P(sum) with no "
     "message."),
    ("torch/distributed/distributed_c10d.py", "def _create_process_group_wrapper(",
     "`_new_process_group_helper` calls it only when the debug level is DETAIL at the moment a "
     "group is made: it wraps the group's backend in a `_ProcessGroupWrapper`, with a gloo "
     "helper group that checks each collective against the other ranks' before it runs. The "
     "level counts when the group is made, which is why the worker sets it around one "
     "`new_group`."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/distributed/rendezvous.py:«line»  `def _env_rendezvous_handler(`
#     What `init_process_group` runs when given neither `init_method` nor `store`
#     (`env://`): it reads `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` from the
#     environment torchrun set (raising 'environment variable ... expected, but not set'
#     when one is missing), then `_create_c10d_store` opens a TCPStore at that address,
#     the key-value store through which the ranks meet.
# torch/distributed/device_mesh.py:«line»  `def init_device_mesh(`
#     It builds a layout from `mesh_shape` and the identity rank map `torch.arange(n)`
#     over the mesh's n ranks, and `DeviceMesh.__init__` calls `_init_process_groups`: one
#     process group per mesh dimension. For a 1-D mesh over the whole world,
#     `_init_one_process_group` uses the default group itself (a new group only when CUDA
#     is available and the default group is gloo), and `get_local_rank('dp')` is this
#     rank's rank in that group: the printed mesh coordinate.
# torch/distributed/tensor/_redistribute.py:«line»  `def redistribute_local_tensor(`
#     The loop over the planned steps, one mesh dimension at a time. Towards `Replicate`,
#     a Partial source calls `_reduce_value` and a Shard source `_to_replicate_tensor` (an
#     all-gather); towards `Shard`, a Partial source calls `_reduce_shard_value` and a
#     Replicate source `_replicate_to_shard`, which only takes its own slice, locally: the
#     four rows of section 3, the last one sending nothing.
# torch/distributed/tensor/placement_types.py:«line»  `class Partial(`
#     `_reduce_value` is one `funcol.all_reduce` over the mesh dimension's group, and
#     `_reduce_shard_value` hands over to `Shard._reduce_shard_tensor`, a
#     `funcol.reduce_scatter_single`. These functional collectives run
#     `_c10d_functional.all_reduce` and `reduce_scatter_tensor`, the names `CommDebugMode`
#     counted.
# torch/distributed/tensor/_ops/_matrix_ops.py:«line»  `def gen_single_dim_einsum_strategies(`
#     The sharding rules of `mm` (`mk,kn->mn`, registered by `mm_single_dim_strategy`
#     below). The 'split contracting dim' loop makes the output `Partial()` when both
#     inputs are sharded on k (a's dim 1, b's dim 0): why section 4's `a @ b` came out
#     P(sum) with no message.
# torch/distributed/distributed_c10d.py:«line»  `def _create_process_group_wrapper(`
#     `_new_process_group_helper` calls it only when the debug level is DETAIL at the
#     moment a group is made: it wraps the group's backend in a `_ProcessGroupWrapper`,
#     with a gloo helper group that checks each collective against the other ranks' before
#     it runs. The level counts when the group is made, which is why the worker sets it
#     around one `new_group`.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Predict.** Rank 0 holds [1, 2] and rank 1 holds [10, 20], two summands of one vector
#    (as gradients of two halves of a batch are). A colleague combines them with
#    `all_gather_single`. What does each rank end with, and which collective gives the vector?
#
#    <details><summary>Answer</summary>
#
#    Both ranks end with [1, 2, 10, 20]: the summands side by side, 4 elements where the
#    vector has 2, and none of them right. Summands need a reduction: `all_reduce` gives
#    [11, 22] on both ranks, and `reduce_scatter_single` gives each rank its half of it, [11]
#    and [22]. A gather is for shards; a reduction is for partials.
#    (*§ Collectives on sum-partials*)
#
#    </details>
#
# 2. **Explain.** Why can the kit not stop a hung launch by killing torchrun's process
#    session alone, and how does it reach the ranks anyway?
#
#    <details><summary>Answer</summary>
#
#    Each rank leads a process session of its own (both ranks printed `leads a process
#    session of its own: True`), so a signal sent to torchrun's session misses them. The
#    ranks also carry the launch's mark (`carries COURSE_LAUNCH_ID: True`), and the kit
#    kills every process that carries it as well: after the hung launch's 2 s timeout, 0
#    processes of it were still running. (*§ Launching ranks without ever hanging*)
#
#    </details>
#
# 3. **Predict.** On a 1-D mesh of 2 ranks, which collective does each redistribution run:
#    Shard(0) → Replicate, Partial → Replicate, Partial → Shard(0), Replicate → Shard(0)?
#
#    <details><summary>Answer</summary>
#
#    An all-gather (`all_gather_into_tensor x1`), an all-reduce (`all_reduce x1`), a
#    reduce-scatter (`reduce_scatter_tensor x1`), and none at all: from Replicate, every rank
#    already holds the whole tensor and keeps its slice, [0, 1] on rank 0 and [2, 3] on
#    rank 1. (*§ DeviceMesh and DTensor placements*)
#
#    </details>
#
# 4. **Predict.** `a` (2×4) is distributed `Shard(1)` and `b` (4×3) `Shard(0)` over 2 ranks.
#    What placement does `a @ b` get, and what does computing it send? Split the same way,
#    random float32 `a` (4×64) and `b` (64×3): how should you compare `full_tensor()` with
#    one process's `a @ b`?
#
#    <details><summary>Answer</summary>
#
#    `P(sum)`, and computing it sends nothing: each rank multiplies its two columns of `a` by
#    its two rows of `b` into a full-sized summand. `full_tensor()` then runs one all-reduce.
#    With the lesson's small integers the result equals the single-process product exactly.
#    With random float32 inputs, compare against a bound: each rank sums its 32 products and
#    the two halves are added, which is bitwise the two half-products added but another order
#    of additions than one process's matmul, whose own order depends on the BLAS; the gap is
#    below 1e-5. (*§ A sharded matmul comes out Partial*)
#
#    </details>
#
# 5. **Predict.** Four ranks each hold a full-sized summand of an 8-element gradient (what
#    rank r computed on its quarter of the batch), and each rank updates only its own
#    quarter of the weights. Which one collective gives every rank what it needs, what does
#    rank 2 end with, and which DTensor redistribution runs that collective?
#
#    <details><summary>Answer</summary>
#
#    A reduce-scatter: it sums the four summands and leaves rank r only the r-th chunk, so
#    rank 2 ends with elements 4 and 5 of the summed gradient. An all-reduce would give every
#    rank all 8 elements, 6 of them unused. As a DTensor the summands are `Partial()`, and
#    `Partial → Shard(0)` is the redistribution that ran `reduce_scatter_tensor x1` (on 2
#    ranks: [11] and [22]). (*§ Collectives on sum-partials*,
#    *§ DeviceMesh and DTensor placements*)
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and simulate, in one process, what the ranks did: each
# function takes a list with one tensor per rank and returns what each rank holds after.
#
# 1. `all_reduce(parts)` and `reduce_scatter(parts)`, for any number of ranks.
# 2. `shard(t, world)`: DTensor's `Shard(0)` pieces of a 1-D tensor. Sizes that do not
#    divide by the number of ranks are the point: find DTensor's rule with exercise B below.
# 3. `redistribute(parts, src, dst)` for the placements "S", "R" and "P" of a 1-D DTensor.
#
# Check them with `make exercises N=09`: the tests compare them with what the two ranks
# printed in this lesson and with DTensor's own sharding rule. `solutions.py` has one way.
#
# These change the worker: edit its `#@worker` cells in `collectives_and_dtensor.py`,
# rewrite `worker.py` from them with `make notebooks`, and run it with the `torchrun`
# command of *How to run* (the output above is your reference):
#
# A. Add `ReduceOp.AVG` and `ReduceOp.MAX` all-reduces of the partials to `basics`.
#    Predict both results first. Which one is DDP's gradient average? (AVG on the int64
#    partials raises "result type Float can't be cast to the desired output type Long":
#    all-reduce a `.float()` copy.)
# B. Distribute `torch.arange(5)` as `Shard(0)` on the 2-rank mesh and print each rank's
#    local piece and `d.shape`. Then redistribute it to `Replicate()`. How does DTensor
#    split a size that does not divide by the number of ranks?
# C. In `mismatched_call`, make both ranks call `all_reduce`, but with shapes [2] and [3].
#    What happens without the DETAIL wrapper, and with it? (Give the group a short timeout.)
# D. Start the worker with `--nproc-per-node=3`. Which lines break, and why does the
#    lesson's "[1, 2] and [10, 20]" assumption fail? Make `partial_vector` work for any
#    world size.

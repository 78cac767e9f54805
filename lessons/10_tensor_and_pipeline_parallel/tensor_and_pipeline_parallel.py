# %% [markdown]
# # 10 · Tensor and pipeline parallelism: one model, split two ways
#
# Data parallelism copies the whole model onto every rank. When the model itself is too big
# for one device, it has to be cut. *Tensor parallelism* (TP) cuts each weight matrix, so
# every rank computes a slice of every layer; *pipeline parallelism* (PP) cuts the stack of
# layers, so every rank computes whole layers, one after the other, on a stream of
# micro-batches. This lesson runs both on two CPU ranks and checks each against the same
# model in one process, to the last bit that floating point allows.
#
# **What you will learn**
#
# - how `parallelize_module` with `ColwiseParallel` then `RowwiseParallel` splits a 2-layer
#   MLP, why "colwise" shards dim 0 of `nn.Linear.weight` (stored as [out, in]), and that the
#   split MLP equals the whole one (outputs, gradients, one AdamW step) in float64;
# - where TP communicates: one all-reduce in forward, one in backward when the input needs
#   a gradient, none inside the sharded matmuls; why the pairing the other way round fails with the default layouts,
#   and what it costs once its layouts are given;
# - `torch.distributed.pipelining`: 2 stages, 4 micro-batches, `ScheduleGPipe` and
#   `Schedule1F1B`, equal to the full batch; the order each rank really runs; what
#   `scale_grads` divides, and how to divide twice by mistake; what unequal micro-batches do;
# - the pipeline *bubble*, (p−1)/(m+p−1), from a schedule simulator checked against the real
#   schedules;
# - several stages per rank: `ScheduleInterleaved1F1B` and `ScheduleLoopedBFS`, their orders
#   pinned on 2.13.0.
#
# **Prerequisites:** lesson 09 (process groups, DeviceMesh, DTensor placements, the launcher,
# `#@worker` cells) and lessons 03a–03b (autograd).
#
# **How to run:** `python lessons/10_tensor_and_pipeline_parallel/tensor_and_pipeline_parallel.py`
# or `make lesson N=10` from the repository root, or open `tensor_and_pipeline_parallel.ipynb`.
# It makes one 2-rank launch of `worker.py` (gloo backend; section 1's launch cell prints
# how long it took, 3 s of it a deliberate timeout) through the course's multi-rank kit,
# `lessons/multirank.py` (lesson 09 explains it). As in lesson 09, the code each rank runs
# is in the lesson's `#@worker` cells, which `worker.py` copies. By hand, each rank's
# output then interleaved:
# `torchrun --standalone --nproc-per-node=2 lessons/10_tensor_and_pipeline_parallel/worker.py all`
# (`tp` or `pp` for one half; on a machine with 2 GPUs add `--backend nccl`, unverified on a
# GPU). Each printing cell is followed by an *Output* block: what it printed with the pinned
# PyTorch (2.13.0).

# %%
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import torch

# ruff: noqa: E402 - the imports below and the rank code's (#@worker cells) follow this set-up
torch.manual_seed(0)
torch.set_num_threads(1)  # the ranks get one thread each too (OMP_NUM_THREADS=1)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's multi-rank kit (lesson 09)
from multirank import launch, section, show

WORKER = HERE / "worker.py"


# %% [markdown]
# The rank code starts with its imports: the DTensor and tensor-parallel API of lesson 09,
# `torch.distributed.pipelining`, and the kit's printing helpers (`say` prints a line as
# `rank N: ...`, `shared` a line that rank 0 prints for both, `heading` starts a section).
# Three small helpers of its own format what the ranks print: `gap` (the largest difference
# of two tensors), `below` (a gap against its bound) and `comms` (collectives counted).

# %%
#@worker
import datetime
import logging
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                         ScheduleInterleaved1F1B, ScheduleLoopedBFS)
from torch.distributed.pipelining.schedules import _ComputationType
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from multirank import heading, say, serve, shared

# %%
#@worker
ROUNDING = 1e-15  # float64 gaps this small are rounding: the order of additions, not the math


def gap(a, b):
    """Largest absolute difference: DTensors are gathered to full tensors first."""
    full = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731
    return (full(a) - full(b)).abs().max().item()


def below(value, bound=ROUNDING):
    """A gap and whether it is below its bound, e.g. '3.5e-17, below 1e-15: True'."""
    return f"{value:.1e}, below {bound:.0e}: {value < bound}"


def comms(counts):
    """CommDebugMode's counts as text: 'all_reduce x1', or 'none' when nothing was sent."""
    text = ", ".join(f"{str(op).split('.')[-1]} x{n}" for op, n in counts.items())
    return text or "none"


# %% [markdown]
# ## 1. Tensor parallelism: split every layer
#
# Lesson 09 ended with a matmul of a column-sharded `a` and a row-sharded `b`: each rank
# multiplied its own pieces and the result was `Partial`, one all-reduce away from the
# answer. Megatron-style TP builds an MLP on that pattern. The first linear layer is split
# so that each rank computes *some of the hidden units* for the whole batch (no message: the
# input is replicated); the activation is elementwise, so it runs on each rank's units
# alone; the second layer is split so that each rank multiplies *its* hidden units by the
# matching slice of the weight, giving a full-sized partial sum of the output. One
# all-reduce completes it.
#
# In PyTorch, `parallelize_module(model, mesh, {"up": ColwiseParallel(), "down":
# RowwiseParallel()})` swaps each layer's parameters for DTensors and adds the hooks that
# redistribute inputs and outputs. The names come from the math, `y = x @ W.T + b`, where
# `W.T` is split by columns (colwise) or rows (rowwise). But `nn.Linear` stores `W` as
# **[out, in]**, so the columns of `W.T` are the *rows* of the stored weight.
#
# The MLP is `Linear(6, 8)` → tanh → `Linear(8, 6)` in float64. Each rank builds it twice
# from the same seed, leaves one copy whole as the reference and splits the other over a 1-D
# mesh of 2 (`tp`) with the plan:

# %%
#@worker
class MLP(nn.Module):
    def __init__(self, dim=6, hidden=8):
        super().__init__()
        self.up = nn.Linear(dim, hidden)  # weight (hidden, dim): [out, in]
        self.down = nn.Linear(hidden, dim)  # weight (dim, hidden)

    def forward(self, x):  # (B, dim)
        return self.down(torch.tanh(self.up(x)))  # (B, dim)


PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel()}


def tp_models(mesh, device, plan=PLAN):
    """The same float64 MLP twice on every rank: one left whole, one split over the mesh."""
    torch.manual_seed(0)  # same weights and data on both ranks
    ref = MLP().double().to(device)
    tp = MLP().double().to(device)
    tp.load_state_dict(ref.state_dict())
    parallelize_module(tp, mesh, plan)  # in place: parameters become DTensors, hooks added
    return ref, tp


# %% [markdown]
# The worker's `main` names the parts you can launch. `serve` (lesson 09) joins the process
# group, runs the part named on the command line with the rank's device, and ends the group
# on every path. The lesson launches `all`: tensor parallelism (sections 1 and 2), then the
# pipeline (sections 3 to 5), one function per section, each shown in its section.

# %%
#@worker
def run_tp(device):
    mesh = init_device_mesh(device.type, (2,), mesh_dim_names=("tp",))
    ref, tp = tp_models(mesh, device)
    show_shapes(ref, tp)
    x, fwd, bwd = show_equal(ref, tp, device)
    show_comms(tp, x, fwd, bwd)
    show_swapped(mesh, device)
    return 0


def run_pp(device):
    show_schedules(device)
    show_scale_grads(device)
    show_virtual(device)
    show_unequal()
    return 0


def run_all(device):
    return max(run_tp(device), run_pp(device))


def main():
    serve({"tp": run_tp, "pp": run_pp, "all": run_all})


# %% [markdown]
# **Predict.** What global and local shape does each rank's `up.weight` have, and along
# which dim of the stored tensor is it sharded? And `down.weight`, `down.bias`?

# %%
#@worker
def show_shapes(ref, tp):
    heading("tp shapes")
    shared(f"nn.Linear(6, 8).weight shape {list(ref.up.weight.shape)}: [out, in]")
    for name in ("up", "down"):
        for p in ("weight", "bias"):
            d = getattr(getattr(tp, name), p)  # a DTensor
            say(f"{name}.{p}: global {list(d.shape)} {d.placements[0]}, local {list(d.to_local().shape)}")
    r = dist.get_rank()
    rows = torch.equal(tp.up.weight.to_local(), ref.up.weight[4 * r : 4 * r + 4])
    cols = torch.equal(tp.down.weight.to_local(), ref.down.weight[:, 4 * r : 4 * r + 4])
    say(f"up.weight local == full rows {4 * r}:{4 * r + 4}: {rows}; "
        f"down.weight local == full columns {4 * r}:{4 * r + 4}: {cols}")


# %%
run = launch(WORKER, ["all"])
print(f"torchrun exit code {run.code} after {run.seconds:.1f} s, output from ranks {sorted(run.out)}")
show(run, "tp shapes")

# %% [markdown]
# Output:
# ```text
# torchrun exit code 0 after «time» s, output from ranks [0, 1]
# rank 0: nn.Linear(6, 8).weight shape [8, 6]: [out, in]
# rank 0: up.weight: global [8, 6] S(0), local [4, 6]
# rank 0: up.bias: global [8] S(0), local [4]
# rank 0: down.weight: global [6, 8] S(1), local [6, 4]
# rank 0: down.bias: global [6] R, local [6]
# rank 0: up.weight local == full rows 0:4: True; down.weight local == full columns 0:4: True
# rank 1: up.weight: global [8, 6] S(0), local [4, 6]
# rank 1: up.bias: global [8] S(0), local [4]
# rank 1: down.weight: global [6, 8] S(1), local [6, 4]
# rank 1: down.bias: global [6] R, local [6]
# rank 1: up.weight local == full rows 4:8: True; down.weight local == full columns 4:8: True
# ```
#
# `ColwiseParallel` shards the stored `up.weight` along **dim 0**, its output dimension:
# rank 0 holds rows 0–3 (hidden units 0–3), rank 1 rows 4–7, and each rank's bias slice
# goes with its units. `RowwiseParallel` shards `down.weight` along **dim 1**, its input
# dimension, so each rank holds the columns that read its own hidden units. `down.bias` is
# replicated: it must be added once to the *sum* of the partials, not once per rank, and
# DTensor's rules for the sharded `linear` see to it (the outputs below match). The
# parameters are DTensors: the global shape is the layer's, the local one is half of it for
# the sharded ones and all of it for the replicated bias.
#
# **Predict.** Same input on both ranks, same weights. Is the TP output *bitwise* equal to
# the unsharded MLP's? The gradients? And after one AdamW step on each?

# %%
#@worker
def tp_step(model, x, y):
    """Forward, loss, backward: returns output and loss, counting collectives in each pass."""
    with CommDebugMode() as fwd:
        out = model(x)  # (B, dim)
        loss = (out - y).pow(2).mean()
    with CommDebugMode() as bwd:
        loss.backward()
    return out, loss, fwd.get_comm_counts(), bwd.get_comm_counts()


def show_equal(ref, tp, device):
    heading("tp equal")
    x = torch.randn(5, 6, dtype=torch.float64, device=device)  # (B, dim): same on both ranks
    y = torch.randn(5, 6, dtype=torch.float64, device=device)
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()  # as if from a layer below
    out_ref, loss_ref, _, _ = tp_step(ref, x_ref, y)
    out_tp, loss_tp, fwd, bwd = tp_step(tp, x_tp, y)
    shared(f"output: a DTensor? {isinstance(out_tp, DTensor)}, shape {list(out_tp.shape)}")
    shared(f"output max gap {below(gap(out_tp, out_ref))}")
    shared(f"loss gap {below(gap(loss_tp, loss_ref))}")
    shared(f"grad x           max gap {below(gap(x_tp.grad, x_ref.grad))}")
    for name, p in ref.named_parameters():
        shared(f"grad {name:11s} max gap {below(gap(tp.get_parameter(name).grad, p.grad))}")
    for model in (ref, tp):  # the optimizer takes DTensor parameters as they are
        torch.optim.AdamW(model.parameters(), lr=0.01).step()
    worst = max(gap(tp.get_parameter(n), p) for n, p in ref.named_parameters())
    shared(f"after one AdamW step: max parameter gap {below(worst)}")
    return x, fwd, bwd


# %%
show(run, "tp equal")

# %% [markdown]
# Output:
# ```text
# rank 0: output: a DTensor? False, shape [5, 6]
# rank 0: output max gap «number», below 1e-15: True
# rank 0: loss gap «number», below 1e-15: True
# rank 0: grad x           max gap «number», below 1e-15: True
# rank 0: grad up.weight   max gap «number», below 1e-15: True
# rank 0: grad up.bias     max gap «number», below 1e-15: True
# rank 0: grad down.weight max gap «number», below 1e-15: True
# rank 0: grad down.bias   max gap «number», below 1e-15: True
# rank 0: after one AdamW step: max parameter gap «number», below 1e-15: True
# ```
#
# Equal to rounding: every gap is below 1e-15, under float64's spacing near 1 (2.2e-16)
# times a few. The gaps themselves are a few 1e-17 or exactly 0: which last bits differ
# depends on the CPU's vector instructions (AVX-512, AVX2 or none change how a dot product
# groups its additions), so compare each gap with its bound. The output of `down` is a plain
# tensor on every rank (`RowwiseParallel`'s default is a replicated output converted back
# to a local tensor), so the loss code needs no change. The gaps come from the order of
# additions: the full MLP sums 8 products per output element in one go, the TP MLP sums 4
# on each rank and then adds the two halves. The input `x` requires a gradient here, as it
# would if a layer sat below the MLP; its gradient matches too. After one AdamW step (on
# the DTensor parameters, with no change to the optimizer) the parameters still agree to
# rounding: TP changes where the numbers live, not what they are.
#
# ## 2. Where tensor parallelism talks
#
# **Predict.** How many collectives does the TP MLP run in forward, and in backward? Which
# placement change causes each? And the matmul of `x` with one rank's local slice of
# `up.weight`? (`CommDebugMode`, lesson 09, counted them in `tp_step` above.)

# %%
#@worker
def show_comms(tp, x, fwd, bwd):
    heading("tp comms")
    shared(f"forward ran: {comms(fwd)}")
    shared(f"backward ran: {comms(bwd)}")
    with warnings.catch_warnings():  # a backward hook warns that no input needs a gradient
        warnings.simplefilter("ignore", UserWarning)
        *_, fwd0, bwd0 = tp_step(tp, x, torch.zeros_like(x))  # x.requires_grad False
    shared(f"x needs no gradient: forward ran {comms(fwd0)}, backward ran {comms(bwd0)}")
    w = tp.up.weight.to_local()  # the sharded matmul itself: local tensors only
    with CommDebugMode() as inner:
        torch.nn.functional.linear(x, w)
    shared(f"a rank's own matmul x @ up.weight_local.T ran: {comms(inner.get_comm_counts())}")


# %%
show(run, "tp comms")

# %% [markdown]
# Output:
# ```text
# rank 0: forward ran: all_reduce x1
# rank 0: backward ran: all_reduce x1
# rank 0: x needs no gradient: forward ran all_reduce x1, backward ran none
# rank 0: a rank's own matmul x @ up.weight_local.T ran: none
# ```
#
# One all-reduce each way (counted by `CommDebugMode`, as in lesson 09). In forward it is
# the `Partial` output of the row-sharded `down` being made `Replicate`. In backward it is
# the mirror image at the other end: the gradient of `x` (the layer's replicated input)
# comes back from `up` as a partial sum over each rank's hidden units, and must be summed
# before it flows further down. So it exists only when `x` needs a gradient, as it does when
# a layer sits below the MLP: for a first layer, whose input needs none, the same step runs
# no backward collective (the weight gradients are each rank's own slices). The matmuls themselves send nothing: each rank multiplies
# its own slice. That is the point of pairing colwise with rowwise: the sharded hidden
# activation (8 units, 4 per rank) never travels, and a whole MLP costs two all-reduces of
# a `(B, 6)` tensor. The price of TP is that these all-reduces sit *on the critical path*
# of every layer, which is why TP is kept within a node, on the fastest links.
#
# **Predict.** Pair them the other way round: `{"up": RowwiseParallel(), "down":
# ColwiseParallel()}`, same input `x` (5, 6) on both ranks. Does it run with the styles'
# default layouts? The rank code tries the defaults first, then a plan that tells each layer
# the layout it really receives and returns (`SWAPPED_FIXED`): what will that version cost
# in collectives, against section 1's pairing?

# %%
#@worker
SWAPPED = {"up": RowwiseParallel(), "down": ColwiseParallel()}  # default layouts
SWAPPED_FIXED = {"up": RowwiseParallel(input_layouts=Replicate()),  # x arrives whole
                 "down": ColwiseParallel(output_layouts=Replicate())}  # gather the output


def swapped_defaults(mesh, device, x):
    _, tp = tp_models(mesh, device, SWAPPED)
    shared(f"defaults: up.weight {tp.up.weight.placements[0]}, down.weight {tp.down.weight.placements[0]}")
    quiet = logging.getLogger("torch._subclasses.fake_tensor")  # it logs the error it re-raises
    quiet.setLevel(logging.CRITICAL)
    try:
        tp(x)
        shared("defaults: forward ran")
    except RuntimeError as err:
        shared(f"defaults: {type(err).__name__}: {str(err).splitlines()[0]}")
    finally:
        quiet.setLevel(logging.NOTSET)


def show_swapped(mesh, device):
    heading("tp swapped")
    torch.manual_seed(3)
    x = torch.randn(5, 6, dtype=torch.float64, device=device)  # (B, dim)
    y = torch.randn(5, 6, dtype=torch.float64, device=device)
    swapped_defaults(mesh, device, x)
    ref, tp = tp_models(mesh, device, SWAPPED_FIXED)
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, _, _, _ = tp_step(ref, x_ref, y)
    hidden = []
    tp.up.register_forward_hook(lambda mod, args, out: hidden.append(list(out.shape)))
    out_tp, _, fwd, bwd = tp_step(tp, x_tp, y)
    shared(f"up's output on each rank: a plain tensor {hidden[0]} (all 8 hidden units)")
    shared(f"input Replicate, output Replicate: output max gap {below(gap(out_tp, out_ref))}")
    worst = max(gap(tp.get_parameter(n).grad, p.grad) for n, p in ref.named_parameters())
    shared(f"input Replicate, output Replicate: grads max gap {below(max(worst, gap(x_tp.grad, x_ref.grad)))}")
    shared(f"forward ran: {comms(fwd)}")
    shared(f"backward ran: {comms(bwd)}")


# %%
show(run, "tp swapped")

# %% [markdown]
# Output:
# ```text
# rank 0: defaults: up.weight S(1), down.weight S(0)
# rank 0: defaults: RuntimeError: a and b must have same reduction dim, but got [5, 12] X [6, 8].
# rank 0: up's output on each rank: a plain tensor [5, 8] (all 8 hidden units)
# rank 0: input Replicate, output Replicate: output max gap «number», below 1e-15: True
# rank 0: input Replicate, output Replicate: grads max gap «number», below 1e-15: True
# rank 0: forward ran: all_reduce x1, all_gather_into_tensor x1
# rank 0: backward ran: all_reduce x1, all_gather_into_tensor x1
# ```
#
# It does not run, on either rank. Each style comes with default *layouts* that assume the
# colwise-then-rowwise pairing: `RowwiseParallel` expects its input already sharded on the
# last dim (`input_layouts=Shard(-1)`, as a colwise layer's output is), and
# `ColwiseParallel` leaves its output sharded on the last dim. So the rowwise `up` takes
# each rank's whole `x` (5, 6) for *its half* of a (5, 12) input, and the matmul's shape
# check finds 12 input features against a weight that reads 6: the `[5, 12] X [6, 8]` of
# the message (the global shapes DTensor checks before any local work). Saying what the
# layers really receive and must return makes the swap work: `RowwiseParallel(input_layouts=
# Replicate())` slices the replicated `x` locally, and `ColwiseParallel(output_layouts=
# Replicate())` gathers the sharded output. It then equals the unsharded MLP to rounding, but
# it costs more: in forward, `up`'s partial sums are all-reduced into all 8 hidden units on
# every rank (so both ranks compute the same tanh), then `down`'s output is all-gathered;
# backward needs an all-reduce and an all-gather too, twice the collectives of section 1's
# pairing. Colwise first keeps the hidden activation split; rowwise first makes it whole.
#
# ## 3. Pipeline parallelism: split the stack of layers
#
# A pipeline gives each rank whole layers: here a 4-linear-layer MLP (float64), layers
# 0–3 (two linears with their tanh) on rank 0 as stage 0, layers 4–6 on rank 1 as stage 1.
# Stage 0 sends activations forward, stage 1 sends their gradients back (point-to-point
# `send`/`recv`, not collectives). To keep both ranks busy, the batch of 8 is cut into 4
# *micro-batches* of 2 that flow through one after another. Every rank builds the whole
# model from one seed, so that it can compare with the one-process result:

# %%
#@worker
BATCH, MICRO = 8, 4  # pipeline: 8 samples in 4 micro-batches of 2


def pp_model(device):
    """4 linear layers in float64, same weights on every rank: stage 0 = modules 0-3, stage 1 = 4-6."""
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4)).double().to(device)


def pp_data(device, n=BATCH):
    torch.manual_seed(2)
    x = torch.randn(n, 4, dtype=torch.float64, device=device)  # (B, 4)
    y = torch.randn(n, 4, dtype=torch.float64, device=device)  # (B, 4)
    return x, y


def mean_loss(out, y):
    return (out - y).pow(2).mean()


def reference(loss_fn, device, n=BATCH):
    """The whole model, the whole batch, one process: loss and this rank's stage's grads."""
    full = pp_model(device)
    x, y = pp_data(device, n)
    loss = loss_fn(full(x), y)
    loss.backward()
    layers = list(full.children())
    mine = layers[:4] if dist.get_rank() == 0 else layers[4:]
    return loss, [p.grad for p in nn.Sequential(*mine).parameters()]


# %% [markdown]
# Then each rank keeps its own layers, wraps them in a `PipelineStage` (its index among the
# 2 stages: the rank here) and hands the stage to a schedule, which cuts the batch into
# micro-batches and runs the sends, receives, forwards and backwards. The first stage's
# `step` takes the input, the last stage's the target and a list to fill with the
# micro-batches' losses. To see the order a schedule really runs, `record` wraps the stage's
# `forward_one_chunk` (F) and `backward_one_chunk` (B); `planned` reads the schedule's own
# plan, its `pipeline_order` attribute (one action list per rank, `None` for idle steps).

# %%
#@worker
SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}


def pp_run(kind, loss_fn, scale_grads, device, n=BATCH, group=None, log=None):
    """One schedule step on 2 ranks; returns (stage module, losses, actions run, schedule)."""
    rank = dist.get_rank()
    layers = list(pp_model(device).children())
    module = nn.Sequential(*(layers[:4] if rank == 0 else layers[4:]))
    stage = PipelineStage(module, rank, 2, device, group=group)  # stage `rank` of 2
    schedule = SCHEDULES[kind](stage, n_microbatches=MICRO, loss_fn=loss_fn, scale_grads=scale_grads)
    log, losses = [] if log is None else log, []
    record(stage, log)
    x, y = pp_data(device, n)
    if rank == 0:
        schedule.step(x)  # the first stage takes the input
    else:
        schedule.step(target=y, losses=losses)  # the last stage computes the loss
    return module, losses, log, schedule


def record(stage, log, tag=""):
    """Log the order in which the schedule really calls forward and backward on this stage."""
    fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

    def forward_one_chunk(i, *args, **kwargs):
        log.append(f"F{i}{tag}")
        return fwd(i, *args, **kwargs)

    def backward_one_chunk(i, *args, **kwargs):
        log.append(f"B{i}{tag}")
        return bwd(i, *args, **kwargs)

    stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk


KINDS_OF = {_ComputationType.FORWARD: "F", _ComputationType.FULL_BACKWARD: "B"}


def planned(schedule, rank):
    """The schedule's own action list for this rank, as F<i>/B<i> (idle steps dropped)."""
    return [f"{KINDS_OF[a.computation_type]}{a.microbatch_index}" for a in schedule.pipeline_order[rank]
            if a is not None and a.computation_type in KINDS_OF]


def in_flight(order):
    """Most micro-batches whose activations are held at once: forwards not yet backwarded."""
    held = peak = 0
    for action in order:
        held += 1 if action[0] == "F" else -1
        peak = max(peak, held)
    return peak


# %% [markdown]
# **Predict.** In what order does each rank run its 4 forwards and 4 backwards under GPipe,
# and under 1F1B? Are the loss and gradients those of the full batch in one process?

# %%
#@worker
def show_schedules(device):
    heading("pp schedules")
    ref_loss, ref_grads = reference(mean_loss, device)
    shared(f"batch {BATCH} in {MICRO} micro-batches; reference loss {ref_loss.item():.6f}")
    for kind in SCHEDULES:
        module, losses, log, schedule = pp_run(kind, mean_loss, True, device)
        say(f"{kind}: ran     {' '.join(log)}")
        say(f"{kind}: planned {' '.join(planned(schedule, dist.get_rank()))}")
        say(f"{kind}: most micro-batches in flight {in_flight(log)}")
        if losses:  # the last stage: one loss per micro-batch
            mean = torch.stack(losses).mean()
            say(f"{kind}: {len(losses)} micro-batch losses, mean {mean.item():.6f}, gap {below(gap(mean, ref_loss))}")
        worst = max(gap(p.grad, g) for p, g in zip(module.parameters(), ref_grads))
        say(f"{kind}: stage {dist.get_rank()} grads max gap {below(worst)}")


# %%
show(run, "pp schedules")

# %% [markdown]
# Output:
# ```text
# rank 0: batch 8 in 4 micro-batches; reference loss 0.737810
# rank 0: GPipe: ran     F0 F1 F2 F3 B0 B1 B2 B3
# rank 0: GPipe: planned F0 F1 F2 F3 B0 B1 B2 B3
# rank 0: GPipe: most micro-batches in flight 4
# rank 0: GPipe: stage 0 grads max gap «number», below 1e-15: True
# rank 0: 1F1B: ran     F0 F1 B0 F2 B1 F3 B2 B3
# rank 0: 1F1B: planned F0 F1 B0 F2 B1 F3 B2 B3
# rank 0: 1F1B: most micro-batches in flight 2
# rank 0: 1F1B: stage 0 grads max gap «number», below 1e-15: True
# rank 1: GPipe: ran     F0 F1 F2 F3 B0 B1 B2 B3
# rank 1: GPipe: planned F0 F1 F2 F3 B0 B1 B2 B3
# rank 1: GPipe: most micro-batches in flight 4
# rank 1: GPipe: 4 micro-batch losses, mean 0.737810, gap «number», below 1e-15: True
# rank 1: GPipe: stage 1 grads max gap «number», below 1e-15: True
# rank 1: 1F1B: ran     F0 B0 F1 B1 F2 B2 F3 B3
# rank 1: 1F1B: planned F1 B0 F2 B1 F3 B2 F4 B3
# rank 1: 1F1B: most micro-batches in flight 1
# rank 1: 1F1B: 4 micro-batch losses, mean 0.737810, gap «number», below 1e-15: True
# rank 1: 1F1B: stage 1 grads max gap «number», below 1e-15: True
# ```
#
# Both schedules reproduce the full batch: the mean of the 4 micro-batch losses is the
# full-batch mean loss, and each stage's gradients match the corresponding layers of the
# one-process model to rounding.
# They differ in *order*. GPipe runs all forwards, then
# all backwards ("fill and drain"): every stage holds the activations of all 4 micro-batches
# at once. 1F1B ("one forward, one backward") starts a micro-batch's backward as soon as it
# can: stage 0 runs one forward ahead (its warm-up), then alternates; the last stage
# alternates from the start. At most 2 and 1 micro-batches are in flight instead of 4:
# activation memory grows with the number of stages, not with the number of micro-batches.
#
# The plan and the run agree except for one line, 1F1B's last stage (see Going further),
# so the figure below is drawn from the order the ranks *really ran*.
#
# **Predict.** `scale_grads=True` (the default) divides each stage's accumulated gradients
# by the number of micro-batches. With a mean loss per micro-batch, what do you get? If you
# also divide the loss by 4 yourself? With a sum loss? Each case below runs GPipe with one
# loss function and compares the gradients with the full batch's:

# %%
#@worker
def sum_loss(out, y):
    return (out - y).pow(2).sum()


def quarter_loss(out, y):  # "I split the batch in 4, so I divide by 4" (scale_grads does it too)
    return mean_loss(out, y) / MICRO


def grad_ratio(module, ref_grads):
    """Pipeline grad / reference grad, elementwise: its (min, max) over all parameters."""
    r = torch.cat([(p.grad / g).flatten() for p, g in zip(module.parameters(), ref_grads)])
    return r.min().item(), r.max().item()


def show_scale_grads(device):
    heading("scale_grads")
    cases = [("mean loss, scale_grads=True", mean_loss, True, mean_loss),
             ("mean loss / 4, scale_grads=True", quarter_loss, True, mean_loss),
             ("sum loss, scale_grads=True", sum_loss, True, sum_loss),
             ("sum loss, scale_grads=False", sum_loss, False, sum_loss)]
    for label, loss_fn, scale, ref_fn in cases:
        _, ref_grads = reference(ref_fn, device)
        module, _, _, _ = pp_run("GPipe", loss_fn, scale, device)
        low, high = grad_ratio(module, ref_grads)
        say(f"{label}: grad / full-batch {ref_fn.__name__} grad in [{low:.6f}, {high:.6f}]")


# %%
show(run, "scale_grads")

# %% [markdown]
# Output:
# ```text
# rank 0: mean loss, scale_grads=True: grad / full-batch mean_loss grad in [1.000000, 1.000000]
# rank 0: mean loss / 4, scale_grads=True: grad / full-batch mean_loss grad in [0.250000, 0.250000]
# rank 0: sum loss, scale_grads=True: grad / full-batch sum_loss grad in [0.250000, 0.250000]
# rank 0: sum loss, scale_grads=False: grad / full-batch sum_loss grad in [1.000000, 1.000000]
# rank 1: mean loss, scale_grads=True: grad / full-batch mean_loss grad in [1.000000, 1.000000]
# rank 1: mean loss / 4, scale_grads=True: grad / full-batch mean_loss grad in [0.250000, 0.250000]
# rank 1: sum loss, scale_grads=True: grad / full-batch sum_loss grad in [0.250000, 0.250000]
# rank 1: sum loss, scale_grads=False: grad / full-batch sum_loss grad in [1.000000, 1.000000]
# ```
#
# Each line is the elementwise ratio of the pipeline's gradient to the one-process
# full-batch gradient, min and max over every parameter of the stage. The schedule runs
# backward on each micro-batch's loss, so the gradients *accumulate*: 4 means of 2 samples
# summed are 4 × the mean over 8. `scale_grads=True` divides by 4 at the end, which gives
# exactly the full-batch mean. Dividing the loss by 4 yourself as well (the habit from
# gradient accumulation without a pipeline) divides twice: 0.25 of the right gradient,
# which a learning-rate search would silently "fix". With a sum loss the accumulated
# gradients already *are* the full-batch sum, and `scale_grads=True` shrinks them by 4:
# use `scale_grads=False`. Rule: divide exactly once, in the loss or in the schedule.
#
# **Predict.** 10 samples into 4 micro-batches: `torch.tensor_split` gives sizes 3, 3, 2,
# 2. Does the schedule weight them (a mean of means would be wrong), or fail? If it fails,
# does every rank find out, and how fast? The stages of this run get a process group of
# their own, with a 3 s timeout (`PipelineStage(..., group=group)` in `pp_run`):

# %%
#@worker
SHORT = datetime.timedelta(seconds=3)  # the unequal micro-batch demo's group


def show_unequal():
    heading("unequal")
    shared(f"batch 10 into {MICRO} micro-batches: torch.tensor_split sizes "
           f"{[len(c) for c in torch.tensor_split(torch.arange(10), MICRO)]}")
    group = dist.new_group(backend="gloo", timeout=SHORT)  # the stages' sends and receives
    log, start = [], time.perf_counter()
    try:  # on CPU whatever the backend: gloo raises at its timeout (unverified for NCCL's watchdog)
        pp_run("GPipe", mean_loss, True, torch.device("cpu"), n=10, group=group, log=log)
    except Exception as err:  # noqa: BLE001 - what 2.13.0 raises is the point
        seconds = time.perf_counter() - start
        say(f"ran {' '.join(log)}, then raised {type(err).__name__} after {seconds:.1f} s")
        if dist.get_rank() == 1:  # rank 0's message varies (a timeout or a closed connection)
            say(f"  {str(err).splitlines()[0]}")
    else:
        say(f"ran {' '.join(log)}, no error")
    short_recv()


def short_recv():
    """What stage 1's receive of micro-batch 2 did: 2 rows sent into a buffer of 3."""
    group = dist.new_group(backend="gloo")  # a fresh one: the timed-out group is done
    buf = torch.full((3, 4), -7.0, dtype=torch.float64)
    if dist.get_rank() == 0:
        dist.send(torch.ones(2, 4, dtype=torch.float64), 1, group=group)
    else:
        dist.recv(buf, 0, group=group)
        filled, kept = int((buf == 1).all(1).sum()), bool((buf[2] == -7).all())
        say(f"recv of [2, 4] into a [3, 4] buffer: no error, {filled} rows filled, row 3 kept: {kept}")


# %%
show(run, "unequal")

# %% [markdown]
# Output:
# ```text
# rank 0: batch 10 into 4 micro-batches: torch.tensor_split sizes [3, 3, 2, 2]
# rank 0: ran F0 F1 F2 F3, then raised RuntimeError after «time» s
# rank 1: ran F0 F1 F2, then raised RuntimeError after «time» s
# rank 1:   The size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 0
# rank 1: recv of [2, 4] into a [3, 4] buffer: no error, 2 rows filled, row 3 kept: True
# ```
#
# It fails, and not in the same way on both ranks. Stage 1 allocates its receive buffers
# from the shapes of the first micro-batch (3 samples); micro-batch 2 has 2, so its loss
# compares a 3-row output with a 2-row target and raises at once. The receive itself checks
# nothing: the last line sends 2 rows into a 3-row buffer directly, and gloo fills 2 rows
# without an error, leaving the third as it was (in the pipeline, whatever its buffer held).
# Stage 0 knows nothing of
# that: it has sent its 4 forwards and waits for a gradient that will never come, until the
# timeout of the process group its stage uses. With the kit's default group timeout (60 s,
# lesson 09; gloo's own default is 30 minutes) that is a long silent wait; with this demo's
# group of its own, rank 0 raises after about 3 s (timings vary with load) and both ranks go
# on to the normal teardown: the launch still ends with exit code 0, because
# `show_unequal` catches this expected error. Make the batch divisible by
# the number of micro-batches (drop or pad the remainder); if you must mix sizes, the
# weighting (a sum loss divided by the true sample count) is yours to write.
#
# ## 4. The bubble: GPipe vs 1F1B on a timeline
#
# A stage cannot start micro-batch i's forward before the previous stage has sent it, nor
# its backward before the next stage has sent the gradient. So at the start of a step the
# last stage waits, and at the end the first one does: the *bubble*. The function below
# simulates that: given each stage's action order, it starts every action as early as its
# stage is free and its input has arrived, with a forward taking 1 time unit and a backward
# 2 (a backward computes two matmuls per forward matmul). `orders` writes both schedules'
# action lists for any number of stages and micro-batches.
#
# **Predict.** Does `orders("1F1B", 2, 4)` reproduce what the ranks ran? Which schedule
# has the larger bubble?

# %%
KINDS = ("GPipe", "1F1B")


def ran(run, kind):
    """[stage 0's actions, stage 1's actions] as the ranks really ran them."""
    found = section(run, "pp schedules")
    return [next(x for x in found[r] if f"{kind}: ran " in x).split(" ran ")[1].split() for r in (0, 1)]


def orders(kind, p, m):
    """Each stage's actions: GPipe all F then all B; 1F1B warm up with p-1-s forwards, then alternate."""
    out = []
    for s in range(p):
        warm = m if kind == "GPipe" else min(p - 1 - s, m)
        seq = [f"F{i}" for i in range(warm)]
        for i in range(m - warm):
            seq += [f"F{warm + i}", f"B{i}"]
        out.append(seq + [f"B{i}" for i in range(m - warm, m)])  # drain the warm-up's backwards
    return out


def needs(s, action, p):
    """The other stage's action this one waits for: F from the stage before, B from the one after."""
    i = action[1:]
    if action[0] == "F":
        return (s - 1, "F" + i) if s > 0 else None
    return (s + 1, "B" + i) if s < p - 1 else None


def simulate(order, tf=1.0, tb=2.0):
    """{(stage, action): (start, end)}, each action as early as its stage and its input allow."""
    p = len(order)
    spans, pos, free = {}, [0] * p, [0.0] * p  # pos: each stage's next action; free: when idle
    while any(pos[s] < len(order[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if pos[s] == len(order[s]):
                continue
            action = order[s][pos[s]]
            need = needs(s, action, p)
            if need is not None and need not in spans:
                continue  # its input is not computed yet: the stage waits
            start = max(free[s], spans[need][1] if need else 0.0)
            spans[(s, action)] = (start, start + (tf if action[0] == "F" else tb))
            free[s], pos[s], moved = start + (tf if action[0] == "F" else tb), pos[s] + 1, True
        if not moved:
            raise ValueError(f"deadlock: no stage can run its next action in {order}")
    return spans


def bubble(spans, p):
    """Fraction of the step's stage-time spent idle: 1 - busy / (p * makespan)."""
    busy = sum(end - start for start, end in spans.values())
    return 1 - busy / (p * max(end for _, end in spans.values()))


for kind in KINDS:
    real = ran(run, kind)
    spans = simulate(real)
    print(f"{kind}: orders(kind, 2, 4) == what the ranks ran: {orders(kind, 2, 4) == real}")
    print(f"{kind}: simulated step {max(e for _, e in spans.values()):.0f} units, bubble {bubble(spans, 2):.3f}")
print(f"(p-1)/(m+p-1) for p=2, m=4: {1 / 5:.3f}")

# %% [markdown]
# Output:
# ```text
# GPipe: orders(kind, 2, 4) == what the ranks ran: True
# GPipe: simulated step 15 units, bubble 0.200
# 1F1B: orders(kind, 2, 4) == what the ranks ran: True
# 1F1B: simulated step 15 units, bubble 0.200
# (p-1)/(m+p-1) for p=2, m=4: 0.200
# ```
#
# The simulator's orders are the ranks' orders, and the two schedules take the same 15
# units: 12 units of work per stage (4 × (1 + 2)) plus a bubble of 3. The idle fraction is
# (p−1)/(m+p−1) = 1/5 for both. 1F1B does not shrink the bubble; it shrinks the memory (2
# and 1 micro-batches in flight instead of 4, section 3). The bubble shrinks with more
# micro-batches per step, which is why pipelines use many; interleaved schedules (several
# smaller stages per rank, `ScheduleInterleaved1F1B`) and zero-bubble schedules attack it
# further.

# %%
COLORS = {"F": "tab:blue", "B": "tab:orange"}


def draw_timeline(ax, spans, title):
    """One row per stage, one bar per action, labelled with its micro-batch."""
    for (s, action), (start, end) in sorted(spans.items()):
        ax.barh(s, end - start, left=start, height=0.6, color=COLORS[action[0]], edgecolor="black")
        ax.text((start + end) / 2, s, action, ha="center", va="center", fontsize=8)
    ax.set_yticks(range(2), ["stage 0", "stage 1"])
    ax.invert_yaxis()
    ax.set_xlabel("time (forward = 1 unit, backward = 2)")
    ax.set_title(f"{title}: bubble {bubble(spans, 2):.3f}")


def plot_schedules(run, p=2, ms=range(1, 17)):
    fig, axes = plt.subplots(3, 1, figsize=(8, 8.5))
    for ax, kind in zip(axes, KINDS):
        draw_timeline(ax, simulate(ran(run, kind)), kind)
    ms = list(ms)
    for kind, marker in zip(KINDS, ("o", "x")):
        sims = [bubble(simulate(orders(kind, p, m)), p) for m in ms]
        axes[2].plot(ms, sims, marker, label=f"{kind} simulated")
    axes[2].plot(ms, [(p - 1) / (m + p - 1) for m in ms], "-", color="gray", label="(p-1)/(m+p-1)")
    axes[2].set_xlabel("micro-batches per step m (p = 2 stages)")
    axes[2].set_ylabel("bubble fraction")
    axes[2].set_title("Bubble vs micro-batch count")
    axes[2].legend()
    fig.tight_layout()
    return fig


fig = plot_schedules(run)
fig.savefig(HERE / "schedules.png")

# %% [markdown]
# In the top two rows, blue bars are forwards, orange backwards, each labelled with its
# micro-batch, placed by the simulator from the order each rank really ran. Under GPipe,
# stage 1 waits 1 unit for its first input and idles the last 2 while stage 0 finishes;
# stage 0 waits 3 units between its last forward and the first gradient. 1F1B moves the
# backwards earlier and the gaps elsewhere, but each stage still idles 3 units of 15. The
# bottom panel is the bubble for 1 to 16 micro-batches from the simulator (both schedules,
# on the same points) against (p−1)/(m+p−1): with 1 micro-batch, half the time is idle; with
# 16, one step in 17. The simulator idealises: real forward and backward times vary, and the
# sends take time too; it measures the structure of the schedule, not any hardware.

# %% [markdown]
# ## 5. More stages than ranks: interleaved 1F1B and looped BFS
#
# PyTorch's documentation marks `torch.distributed.pipelining` (migrated from the PiPPy
# project) as *alpha* (read from the `torch.distributed.pipelining` page in References): its schedules and their plans may change from one release to the
# next: read the orders printed here as those of 2.13.0. Two more schedules give each rank
# *several* stages ("virtual stages"): the same 7 modules cut into 4 stages, rank 0 holding
# stages 0 and 2, rank 1 stages 1 and 3, so a micro-batch goes 0 → 1 → 0 → 1 across the
# ranks. Each takes a *list* of the rank's stages. Actions are written
# `F<micro-batch>s<stage>`.
#
# **Predict.** `ScheduleInterleaved1F1B` prefers the earliest micro-batch ("depth first"),
# `ScheduleLoopedBFS` the earliest stage ("breadth first"). In what order does rank 0 run
# its 16 actions under each, and how many (micro-batch, stage) activations does it hold at
# most?

# %%
#@worker
VIRTUAL = {"Interleaved1F1B": ScheduleInterleaved1F1B, "LoopedBFS": ScheduleLoopedBFS}
CUTS = [(0, 2), (2, 4), (4, 6), (6, 7)]  # 4 stages of the 7 modules: 2 per rank


def virtual_run(kind, device):
    """Stages r and r + 2 on rank r: the plan, the order really run, the stages' modules."""
    rank, layers = dist.get_rank(), list(pp_model(device).children())
    mods = [nn.Sequential(*layers[a:b]) for a, b in CUTS]
    stages = [PipelineStage(mods[i], i, 4, device) for i in (rank, rank + 2)]
    schedule = VIRTUAL[kind](stages, n_microbatches=MICRO, loss_fn=mean_loss)  # a list of stages
    log = []
    for st in stages:
        record(st, log, f"s{st.stage_index}")
    x, y = pp_data(device)
    schedule.step(x) if rank == 0 else schedule.step(target=y, losses=[])
    plan = [f"{KINDS_OF[a.computation_type]}{a.microbatch_index}s{a.stage_index}"
            for a in schedule.pipeline_order[rank] if a is not None]
    return plan, log, mods


def show_virtual(device):
    heading("pp virtual")
    rank, full = dist.get_rank(), pp_model(device)
    mean_loss(full(pp_data(device)[0]), pp_data(device)[1]).backward()  # the one-process grads
    layers = list(full.children())
    ref = [p.grad for i in (rank, rank + 2) for p in nn.Sequential(*layers[slice(*CUTS[i])]).parameters()]
    for kind in VIRTUAL:
        plan, log, mods = virtual_run(kind, device)
        say(f"{kind}: ran {' '.join(log)}")
        say(f"{kind}: ran as planned (pipeline_order): {log == plan}")
        say(f"{kind}: most activations held at once (micro-batch, stage) {in_flight(log)}")
        mine = [p for i in (rank, rank + 2) for p in mods[i].parameters()]
        say(f"{kind}: stages {rank}, {rank + 2} grads max gap {below(max(gap(p.grad, g) for p, g in zip(mine, ref)))}")


# %%
show(run, "pp virtual")

# %% [markdown]
# Output:
# ```text
# rank 0: Interleaved1F1B: ran F0s0 F1s0 F0s2 F1s2 F2s0 B0s2 F3s0 B1s2 F2s2 B0s0 F3s2 B1s0 B2s2 B3s2 B2s0 B3s0
# rank 0: Interleaved1F1B: ran as planned (pipeline_order): True
# rank 0: Interleaved1F1B: most activations held at once (micro-batch, stage) 5
# rank 0: Interleaved1F1B: stages 0, 2 grads max gap «number», below 1e-15: True
# rank 0: LoopedBFS: ran F0s0 F1s0 F2s0 F3s0 F0s2 F1s2 F2s2 F3s2 B3s2 B2s2 B1s2 B0s2 B3s0 B2s0 B1s0 B0s0
# rank 0: LoopedBFS: ran as planned (pipeline_order): True
# rank 0: LoopedBFS: most activations held at once (micro-batch, stage) 8
# rank 0: LoopedBFS: stages 0, 2 grads max gap «number», below 1e-15: True
# rank 1: Interleaved1F1B: ran F0s1 F1s1 F0s3 B0s3 F1s3 B1s3 F2s1 B0s1 F3s1 B1s1 F2s3 B2s3 F3s3 B3s3 B2s1 B3s1
# rank 1: Interleaved1F1B: ran as planned (pipeline_order): True
# rank 1: Interleaved1F1B: most activations held at once (micro-batch, stage) 3
# rank 1: Interleaved1F1B: stages 1, 3 grads max gap «number», below 1e-15: True
# rank 1: LoopedBFS: ran F0s1 F1s1 F2s1 F3s1 F0s3 F1s3 F2s3 F3s3 B3s3 B2s3 B1s3 B0s3 B3s1 B2s1 B1s1 B0s1
# rank 1: LoopedBFS: ran as planned (pipeline_order): True
# rank 1: LoopedBFS: most activations held at once (micro-batch, stage) 8
# rank 1: LoopedBFS: stages 1, 3 grads max gap «number», below 1e-15: True
# ```
#
# Both give the full-batch gradients again. Unlike `Schedule1F1B`, these multi-stage
# schedules execute their `pipeline_order` action by action, so plan and run agree. What
# they change is the order. Interleaved 1F1B moves micro-batch 0 on to stage 2 as soon as
# it can and starts backwards early: rank 0 holds at most 5 activations of its 8
# (micro-batch, stage) pairs. Looped BFS runs every micro-batch through stage 0, then every
# one through stage 2, then all backwards in reverse: it holds all 8, like GPipe. Why cut
# a rank's layers into non-adjacent stages at all? Each stage is smaller, so the first
# micro-batch reaches the last rank sooner and the pipeline fills and drains in less time:
# the aim is a smaller bubble (the papers in the classes' docstrings), paid for with more
# sends per micro-batch, one per stage boundary (3 here instead of 1). Section 4's
# simulator models one stage per rank, so this lesson does not measure that bubble.

# %% [markdown]
# ## Summary
#
# - Tensor parallelism splits each layer: `ColwiseParallel` shards `nn.Linear.weight`
#   ([out, in]) along dim 0, `RowwiseParallel` along dim 1. Colwise then rowwise gives an
#   MLP equal to the unsharded one (float64 gaps below 1e-15: the order of additions) in output,
#   gradients and an AdamW step, with one all-reduce in forward, one in backward when the
#   input needs a gradient (a layer below), and none in the matmuls.
# - Pipeline parallelism splits the layers into stages and the batch into micro-batches.
#   GPipe (all forwards, then all backwards) and 1F1B (alternate after a warm-up) give the
#   full-batch loss and gradients; 1F1B holds at most p micro-batches' activations instead of
#   m.
# - `scale_grads=True` divides the accumulated gradients by the number of micro-batches:
#   right for a mean loss, wrong (×1/4 here) if you also divide the loss, wrong for a sum
#   loss (use `scale_grads=False`). Micro-batches must have equal sizes: 10 into 4 fails on
#   the last stage at once and on the first only at its group's timeout, so give pipeline
#   groups a short one.
# - Both schedules idle for the same bubble, (p−1)/(m+p−1) of the step: more micro-batches
#   shrink it.
# - With several stages per rank, interleaved 1F1B (depth first) holds fewer activations
#   than looped BFS (breadth first); both run their plan as written. Pipelining is alpha in
#   PyTorch: these orders are those of 2.13.0.

# %% [markdown]
# ## Going further
#
# **A plan that is off by one.** In section 3 the plan and the run agree except for one
# line: for the *last* stage of 1F1B, `pipeline_order` in 2.13.0 lists `F1 … F4`, shifted
# by one and naming a micro-batch 4 that does not exist, while the runtime ran `F0 … F3`.
# The plan only describes the schedule: `ScheduleGPipe` and `Schedule1F1B` run their own
# hand-written loop over the micro-batches, not this list (Read the source shows both). The
# multi-stage schedules of section 5 execute their plan action by action, so there plan and
# run agree. Pipelining is alpha: read such a plan as describing 2.13.0 only, and trust the
# order you record.

# %% [markdown]
# ## References
#
# - [`torch.distributed.tensor.parallel`](https://docs.pytorch.org/docs/2.13/distributed.tensor.parallel.html):
#   `parallelize_module`, `ColwiseParallel` and `RowwiseParallel` with their `input_layouts`
#   and `output_layouts` (sections 1 and 2).
# - [`CommDebugMode`](https://docs.pytorch.org/docs/2.13/distributed.tensor.html#torch.distributed.tensor.debug.CommDebugMode):
#   the collective counts of section 2.
# - [`torch.distributed.pipelining`](https://docs.pytorch.org/docs/2.13/distributed.pipelining.html):
#   `PipelineStage`, the schedules, `step` and `scale_grads` (sections 3 to 5).
# - [Megatron-LM (Shoeybi et al., 2019)](https://arxiv.org/abs/1909.08053): the column-then-row
#   split of an MLP with one all-reduce each way (sections 1 and 2).
# - [GPipe (Huang et al., 2018)](https://arxiv.org/abs/1811.06965): micro-batches and the
#   fill-and-drain schedule (sections 3 and 4).
# - [PipeDream (Harlap et al., 2018)](https://arxiv.org/abs/1806.03377): the one-forward,
#   one-backward steady state, which 1F1B keeps without PipeDream's asynchronous updates (section 3).
# - [Efficient large-scale training on GPU clusters (Narayanan et al., 2021)](https://arxiv.org/abs/2104.04473):
#   interleaved 1F1B, the paper `ScheduleInterleaved1F1B`'s docstring cites (section 5).
# - [Breadth-first pipeline parallelism (Lamy-Poirier, 2022)](https://arxiv.org/abs/2211.05953):
#   looped BFS, cited by `ScheduleLoopedBFS`'s docstring (section 5).
# - [Zero bubble pipeline parallelism (Qi et al., 2024)](https://arxiv.org/abs/2401.10241):
#   the schedules that split the backward to fill the bubble of section 4.

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each stop is a file of your installed torch and the line, in
# *your* version, where something this lesson showed is implemented, with what to look for
# there. They follow the lesson: how a TP style splits a layer and where its hooks
# communicate, then the pipeline's 1F1B loop against its plan, how a schedule cuts the batch
# into micro-batches, and how a stage sizes its receive buffers.

# %%
from sourcemap import read_the_source  # lessons/ is on sys.path: first cell

read_the_source([
    ("torch/distributed/tensor/parallel/style.py", "class ColwiseParallel(",
     "`_partition_linear_fn` distributes the weight and the bias as `Shard(0)`, and `__init__` "
     "defaults to a `Replicate()` input and a `Shard(-1)` output. In `RowwiseParallel`, just "
     "below, the weight is `Shard(1)`, the bias `Replicate()`, the input defaults to `Shard(-1)` "
     "and the output to `Replicate()`: defaults that assume colwise first."),
    ("torch/distributed/tensor/_api.py", "def distribute_module(",
     "What each style's `_apply` calls: `partition_fn` swaps the module's parameters for "
     "DTensors, `input_fn` becomes a forward pre-hook and `output_fn` a forward hook. "
     "`RowwiseParallel`'s output hook redistributes `down`'s Partial output to `Replicate`: "
     "the forward all-reduce of section 2."),
    ("torch/distributed/pipelining/schedules.py", "class Schedule1F1B(",
     "`_step_microbatches` is the loop that ran: `min(n_microbatches, num_stages - stage_index)` "
     "forwards before the first backward (2 on stage 0, 1 on the last stage: the p - 1 - s "
     "warm-up forwards of section 3 and `orders`, plus the first forward of the steady state), "
     "then backward-forward pairs, the remaining backwards, then "
     "`perform_reduce_grad(n_microbatches if scale_grads else 1)`. "
     "`_get_pipeline_order` only writes the plan: on the last stage it increments `forward_mb` "
     "before the first forward, hence the plan's F1 to F4."),
    ("torch/distributed/pipelining/microbatch.py", "def split_args_kwargs_into_chunks(",
     "How `step(x)` cuts the batch: each tensor argument gets `TensorChunkSpec(DEFAULT_CHUNK_DIM)`, "
     "dim 0, and `_split_tensor` splits it with `torch.tensor_split`. Splitting checks only the "
     "count: with fewer rows than micro-batches, `_shard_dict_of_args` makes fewer chunks, which "
     "the schedule's `_check_inputs` then refuses. Nothing checks that the micro-batches are "
     "equal."),
    ("torch/distributed/pipelining/stage.py", "def _setup_forward_recv_info(",
     "Every stage but the first gets one receive buffer per micro-batch, all made by "
     "`_make_tensor_from_meta` from the same `_stage_meta.inputs`: shapes that "
     "`_forward_metadata_inference` (above) derives on stage 0 from the first micro-batch and "
     "sends to the next stage. Hence the 3-row output against a 2-row target when 10 samples "
     "made 4 micro-batches."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/distributed/tensor/parallel/style.py:«line»  `class ColwiseParallel(`
#     `_partition_linear_fn` distributes the weight and the bias as `Shard(0)`, and
#     `__init__` defaults to a `Replicate()` input and a `Shard(-1)` output. In
#     `RowwiseParallel`, just below, the weight is `Shard(1)`, the bias `Replicate()`, the
#     input defaults to `Shard(-1)` and the output to `Replicate()`: defaults that assume
#     colwise first.
# torch/distributed/tensor/_api.py:«line»  `def distribute_module(`
#     What each style's `_apply` calls: `partition_fn` swaps the module's parameters for
#     DTensors, `input_fn` becomes a forward pre-hook and `output_fn` a forward hook.
#     `RowwiseParallel`'s output hook redistributes `down`'s Partial output to
#     `Replicate`: the forward all-reduce of section 2.
# torch/distributed/pipelining/schedules.py:«line»  `class Schedule1F1B(`
#     `_step_microbatches` is the loop that ran: `min(n_microbatches, num_stages -
#     stage_index)` forwards before the first backward (2 on stage 0, 1 on the last stage:
#     the p - 1 - s warm-up forwards of section 3 and `orders`, plus the first forward of
#     the steady state), then backward-forward pairs, the remaining backwards, then
#     `perform_reduce_grad(n_microbatches if scale_grads else 1)`. `_get_pipeline_order`
#     only writes the plan: on the last stage it increments `forward_mb` before the first
#     forward, hence the plan's F1 to F4.
# torch/distributed/pipelining/microbatch.py:«line»  `def split_args_kwargs_into_chunks(`
#     How `step(x)` cuts the batch: each tensor argument gets
#     `TensorChunkSpec(DEFAULT_CHUNK_DIM)`, dim 0, and `_split_tensor` splits it with
#     `torch.tensor_split`. Splitting checks only the count: with fewer rows than
#     micro-batches, `_shard_dict_of_args` makes fewer chunks, which the schedule's
#     `_check_inputs` then refuses. Nothing checks that the micro-batches are equal.
# torch/distributed/pipelining/stage.py:«line»  `def _setup_forward_recv_info(`
#     Every stage but the first gets one receive buffer per micro-batch, all made by
#     `_make_tensor_from_meta` from the same `_stage_meta.inputs`: shapes that
#     `_forward_metadata_inference` (above) derives on stage 0 from the first micro-batch
#     and sends to the next stage. Hence the 3-row output against a 2-row target when 10
#     samples made 4 micro-batches.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Explain.** How many collectives does the colwise-then-rowwise MLP run in forward and
#    in backward, and why does a rank's matmul with its slice of `up.weight` send nothing?
#
#    <details><summary>Answer</summary>
#
#    One all-reduce in forward and, when the input needs a gradient (a layer below), one in
#    backward. The input is the same on every rank, so each rank computes its own 4 hidden
#    units from its rows of `up.weight` (`ran: none`), applies tanh to them alone, and
#    multiplies them by its columns of `down.weight`; only those full-sized partial outputs
#    must be summed. In backward, each rank's slice of `up` gives only a partial gradient of
#    `x`, which must be summed the same way; for an input that needs no gradient, backward
#    ran none. The result equals the unsharded MLP's to rounding (gaps below 1e-15 in
#    float64).
#    (*§ Where tensor parallelism talks*, *§ Tensor parallelism: split every layer*)
#
#    </details>
#
# 2. **Spot the bug.** A plan pairs the styles the other way round,
#    `{"up": RowwiseParallel(), "down": ColwiseParallel()}`, with the same `x` (5, 6) on both
#    ranks. What goes wrong, and what does the version with explicit layouts cost?
#
#    <details><summary>Answer</summary>
#
#    It raises `RuntimeError: a and b must have same reduction dim, but got [5, 12] X [6, 8]`:
#    the rowwise `up` takes each rank's whole `x` as its half of the input, 12 features
#    against a weight that reads 6. With `input_layouts=Replicate()` on `up` and
#    `output_layouts=Replicate()` on `down` it matches the unsharded MLP to rounding, but
#    forward and backward each run an all-reduce and an all-gather, twice the collectives
#    of colwise first. (*§ Where tensor parallelism talks*)
#
#    </details>
#
# 3. **Predict.** Two stages, 4 micro-batches. In what order does stage 0 run its forwards
#    and backwards under GPipe and under 1F1B, how many micro-batches does it hold at once,
#    and which schedule leaves the stages idle less?
#
#    <details><summary>Answer</summary>
#
#    GPipe: F0 F1 F2 F3 B0 B1 B2 B3, 4 micro-batches in flight. 1F1B: F0 F1 B0 F2 B1 F3 B2
#    B3, 2 in flight (1 on the last stage). Both give the full-batch gradients to rounding.
#    Neither idles less: simulated from these orders, both steps take 15 units with a bubble
#    of 0.200, (p−1)/(m+p−1) for p=2, m=4. What 1F1B cuts is the number of micro-batches
#    whose activations a stage holds at once, not the simulated step.
#    (*§ Pipeline parallelism: split the stack of layers*,
#    *§ The bubble: GPipe vs 1F1B on a timeline*)
#
#    </details>
#
# 4. **Spot the bug.** Each micro-batch's loss is a mean, and the loss function also divides
#    it by the number of micro-batches, as in gradient accumulation; the schedule keeps
#    `scale_grads=True`. What gradient comes out? And with a sum loss?
#
#    <details><summary>Answer</summary>
#
#    A quarter of the full-batch gradient (ratio 0.250000 on every parameter of both
#    stages): the 4 micro-batch gradients accumulate and `scale_grads=True` divides them by
#    4, so dividing the loss too divides twice. A plain mean loss with `scale_grads=True`
#    gives ratio 1. A sum loss gives 0.25 with `scale_grads=True` and 1 with
#    `scale_grads=False`: divide exactly once.
#    (*§ Pipeline parallelism: split the stack of layers*)
#
#    </details>
#
# 5. **Transfer.** A pipeline of p = 4 stages runs m = 8 micro-batches under 1F1B. What
#    fraction of the step is bubble, and at most how many micro-batches does stage 1 hold
#    in flight? And under GPipe?
#
#    <details><summary>Answer</summary>
#
#    The bubble is (p−1)/(m+p−1) = 3/11 ≈ 0.273 under both schedules: `simulate(orders(kind,
#    4, 8))` takes 33 units for 24 of work per stage. Stage 1 warms up with p − 1 − s = 2
#    forwards, then alternates, so it holds at most 3 micro-batches (p − s); under GPipe
#    every stage holds all 8. (*§ The bubble: GPipe vs 1F1B on a timeline*)
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder; `make exercises N=10` checks your answers against
# what the two ranks printed in this lesson.
#
# 1. `local_weight(w, rank, world, style)`: the slice of an `nn.Linear` weight that rank
#    `rank` holds under `"colwise"` or `"rowwise"` (equal shards).
# 2. `one_f_one_b(p, m)`: 1F1B's action order for every stage, without looking at `orders`
#    above. It must reproduce what the two ranks ran, and hold at most min(p − s, m)
#    micro-batches on stage s, for m < p as well. `Schedule1F1B` itself refuses m < p
#    (`ValueError: Number of microbatches ... must be greater than or equal to the number
#    of stages`, read from `torch/distributed/pipelining/schedules.py`): with it, cut the
#    batch into at least p micro-batches. Your function is a model, not the class: for
#    m < p, a stage whose p − 1 − s is m or more runs all m forwards first.
# 3. `grad_scale(loss, divide_loss, scale_grads, m)`: the factor between the pipeline's
#    gradient and the full-batch gradient of the same kind of loss (`"mean"` or `"sum"`).
#
# These change the rank code: edit the function in a copy of `worker.py` in this folder
# and run the copy with torchrun (the output above is your reference):
#
# A. In `show_swapped`'s `SWAPPED_FIXED` plan, drop `output_layouts=Replicate()` from
#    `down`. Predict what fails and where (the output is now sharded, the target `y` is
#    not). Then keep the output sharded and compute the loss on each rank's shard: which
#    collective disappears from the forward count?
# B. Run the pipeline with 8 micro-batches of 1. Predict the order and the in-flight count
#    of each schedule first.
# C. In `show_unequal`, remove `group=group`. How long does rank 0 wait now, and why?

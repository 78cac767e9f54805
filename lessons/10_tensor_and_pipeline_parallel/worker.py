"""The worker of lesson 10: tensor parallelism and pipeline parallelism on 2 ranks.

    torchrun --standalone --nproc-per-node=2 lessons/10_tensor_and_pipeline_parallel/worker.py all
    ... worker.py tp        # tensor parallel only
    ... worker.py pp        # pipeline parallel only (GPipe, 1F1B, scale_grads, unequal sizes)
    ... worker.py all --backend nccl   # 2 CUDA devices; --backend auto picks nccl there

- `tp`: a 2-layer MLP split by `parallelize_module` (ColwiseParallel, then RowwiseParallel)
  over a 1-D mesh of 2, in float64, against the same unsharded MLP on every rank: outputs,
  gradients, one AdamW step; each rank's local weight shapes; the collectives counted by
  CommDebugMode in forward and in backward.
- `pp`: a 4-layer MLP cut into 2 stages (one per rank), 4 micro-batches, ScheduleGPipe and
  Schedule1F1B, against the full batch in one process; the order in which each rank really
  ran its forward and backward chunks next to the schedule's own action list; scale_grads
  with a mean loss, a mean loss divided by 4 again, and a sum loss; a batch of 10 split into
  4 (unequal) micro-batches, always on the CPU over a gloo group with a 3 s timeout (so that
  the stage left waiting raises instead of hanging, whatever the backend of the rest).

Output, process group and teardown come from the course's kit, lessons/multirank.py (lesson
09): `say` prints one line prefixed `rank N:`, `shared` a fact both ranks share (rank 0
only), `heading` starts a `== name ==` section; `serve` runs the part between `setup` and
`teardown`.
"""

import datetime
import logging
import sys
import time
from pathlib import Path

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lessons/: the course's kit
from multirank import heading, say, serve, shared

SHORT = datetime.timedelta(seconds=3)  # the unequal micro-batch demo's group
BATCH, MICRO = 8, 4  # pipeline: 8 samples in 4 micro-batches of 2
SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}


ROUNDING = 1e-15  # float64 gaps this small are rounding: the order of additions, not the math


def gap(a, b):
    """Largest absolute difference: DTensors are gathered to full tensors first."""
    full = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731
    return (full(a) - full(b)).abs().max().item()


def below(value, bound=ROUNDING):
    """A rounding-level number as text: its last digits depend on the CPU's vector
    instructions (the order of additions), the comparison with its bound does not."""
    return f"{value:.1e}, below {bound:.0e}: {value < bound}"


def comms(counts):
    """CommDebugMode's counts as text: 'all_reduce x1', or 'none' when nothing was sent."""
    text = ", ".join(f"{str(op).split('.')[-1]} x{n}" for op, n in counts.items())
    return text or "none"


# ---------------------------------------------------------------------------- tensor parallel


class MLP(nn.Module):
    def __init__(self, dim=6, hidden=8):
        super().__init__()
        self.up = nn.Linear(dim, hidden)  # weight (hidden, dim): [out, in]
        self.down = nn.Linear(hidden, dim)  # weight (dim, hidden)

    def forward(self, x):  # (B, dim)
        return self.down(torch.tanh(self.up(x)))  # (B, dim)


PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel()}
SWAPPED = {"up": RowwiseParallel(), "down": ColwiseParallel()}  # default layouts
SWAPPED_FIXED = {"up": RowwiseParallel(input_layouts=Replicate()),  # x arrives whole
                 "down": ColwiseParallel(output_layouts=Replicate())}  # gather the output


def tp_models(mesh, device, plan=PLAN):
    """The same float64 MLP twice on every rank: one left whole, one split over the mesh."""
    torch.manual_seed(0)  # same weights and data on both ranks
    ref = MLP().double().to(device)
    tp = MLP().double().to(device)
    tp.load_state_dict(ref.state_dict())
    parallelize_module(tp, mesh, plan)
    return ref, tp


def show_shapes(ref, tp):
    heading("tp shapes")
    shared(f"nn.Linear(6, 8).weight shape {list(ref.up.weight.shape)}: [out, in]")
    for name in ("up", "down"):
        for p in ("weight", "bias"):
            d = getattr(getattr(tp, name), p)
            say(f"{name}.{p}: global {list(d.shape)} {d.placements[0]}, local {list(d.to_local().shape)}")
    r = dist.get_rank()
    rows = torch.equal(tp.up.weight.to_local(), ref.up.weight[4 * r : 4 * r + 4])
    cols = torch.equal(tp.down.weight.to_local(), ref.down.weight[:, 4 * r : 4 * r + 4])
    say(
        f"up.weight local == full rows {4 * r}:{4 * r + 4}: {rows}; "
        f"down.weight local == full columns {4 * r}:{4 * r + 4}: {cols}"
    )


def tp_step(model, x, y):
    """Forward, loss, backward: returns output and loss, counting collectives in each pass."""
    with CommDebugMode() as fwd:
        out = model(x)  # (B, dim)
        loss = (out - y).pow(2).mean()
    with CommDebugMode() as bwd:
        loss.backward()
    return out, loss, fwd.get_comm_counts(), bwd.get_comm_counts()


def show_tp(mesh, device):
    ref, tp = tp_models(mesh, device)
    show_shapes(ref, tp)
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
    adam = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in (ref, tp)]
    for opt in adam:
        opt.step()
    worst = max(gap(tp.get_parameter(n), p) for n, p in ref.named_parameters())
    shared(f"after one AdamW step: max parameter gap {below(worst)}")
    heading("tp comms")
    shared(f"forward ran: {comms(fwd)}")
    shared(f"backward ran: {comms(bwd)}")
    w = tp.up.weight.to_local()  # the sharded matmul itself: local tensors only
    with CommDebugMode() as inner:
        torch.nn.functional.linear(x, w)
    shared(f"a rank's own matmul x @ up.weight_local.T ran: {comms(inner.get_comm_counts())}")


def show_swapped(mesh, device):
    """Rowwise then colwise: with default layouts it fails, with explicit ones it costs more."""
    heading("tp swapped")
    torch.manual_seed(3)
    x = torch.randn(5, 6, dtype=torch.float64, device=device)  # (B, dim)
    y = torch.randn(5, 6, dtype=torch.float64, device=device)
    ref, tp = tp_models(mesh, device, SWAPPED)
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


# -------------------------------------------------------------------------- pipeline parallel


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


def sum_loss(out, y):
    return (out - y).pow(2).sum()


def quarter_loss(out, y):  # "I split the batch in 4, so I divide by 4" (scale_grads does it too)
    return mean_loss(out, y) / MICRO


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


def planned(schedule, rank):
    """The schedule's own action list for this rank, as F<i>/B<i> (idle steps dropped)."""
    kinds = {_ComputationType.FORWARD: "F", _ComputationType.FULL_BACKWARD: "B"}
    order = schedule.pipeline_order[rank]  # built by the schedule's __init__ for this purpose
    return [f"{kinds[a.computation_type]}{a.microbatch_index}" for a in order
            if a is not None and a.computation_type in kinds]


def in_flight(order):
    """Most micro-batches whose activations are held at once: forwards not yet backwarded."""
    held = peak = 0
    for action in order:
        held += 1 if action[0] == "F" else -1
        peak = max(peak, held)
    return peak


def pp_run(kind, loss_fn, scale_grads, device, n=BATCH, group=None, log=None):
    """One schedule step on 2 ranks; returns (stage module, losses, actions run, schedule)."""
    rank = dist.get_rank()
    layers = list(pp_model(device).children())
    module = nn.Sequential(*(layers[:4] if rank == 0 else layers[4:]))
    stage = PipelineStage(module, rank, 2, device, group=group)
    schedule = SCHEDULES[kind](stage, n_microbatches=MICRO, loss_fn=loss_fn, scale_grads=scale_grads)
    log, losses = [] if log is None else log, []
    record(stage, log)
    x, y = pp_data(device, n)
    if rank == 0:
        schedule.step(x)  # the first stage takes the input
    else:
        schedule.step(target=y, losses=losses)  # the last stage computes the loss
    return module, losses, log, schedule


def reference(loss_fn, device, n=BATCH):
    """The whole model, the whole batch, one process: loss and this rank's stage's grads."""
    full = pp_model(device)
    x, y = pp_data(device, n)
    loss = loss_fn(full(x), y)
    loss.backward()
    layers = list(full.children())
    mine = layers[:4] if dist.get_rank() == 0 else layers[4:]
    return loss, [p.grad for p in nn.Sequential(*mine).parameters()]


def grad_ratio(module, ref_grads):
    """Pipeline grad / reference grad, elementwise: its (min, max) over all parameters."""
    r = torch.cat([(p.grad / g).flatten() for p, g in zip(module.parameters(), ref_grads)])
    return r.min().item(), r.max().item()


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


def show_scale_grads(device):
    heading("scale_grads")
    cases = [("mean loss, scale_grads=True ", mean_loss, True, mean_loss),
             ("mean loss / 4, scale_grads=True ", quarter_loss, True, mean_loss),
             ("sum loss, scale_grads=True ", sum_loss, True, sum_loss),
             ("sum loss, scale_grads=False", sum_loss, False, sum_loss)]
    for label, loss_fn, scale, ref_fn in cases:
        _, ref_grads = reference(ref_fn, device)
        module, _, _, _ = pp_run("GPipe", loss_fn, scale, device)
        low, high = grad_ratio(module, ref_grads)
        say(f"{label.strip()}: grad / full-batch {ref_fn.__name__} grad in [{low:.6f}, {high:.6f}]")


VIRTUAL = {"Interleaved1F1B": ScheduleInterleaved1F1B, "LoopedBFS": ScheduleLoopedBFS}
CUTS = [(0, 2), (2, 4), (4, 6), (6, 7)]  # 4 stages of the 7 modules: 2 per rank


def label(action):
    """An action of a multi-stage plan as F<micro-batch>s<stage>, e.g. F0s2."""
    kinds = {_ComputationType.FORWARD: "F", _ComputationType.FULL_BACKWARD: "B"}
    return f"{kinds[action.computation_type]}{action.microbatch_index}s{action.stage_index}"


def virtual_run(kind, device):
    """Stages r and r + 2 on rank r: the plan, the order really run, the grads' max gap."""
    rank, layers = dist.get_rank(), list(pp_model(device).children())
    mods = [nn.Sequential(*layers[a:b]) for a, b in CUTS]
    stages = [PipelineStage(mods[i], i, 4, device) for i in (rank, rank + 2)]
    schedule = VIRTUAL[kind](stages, n_microbatches=MICRO, loss_fn=mean_loss)
    log = []
    for st in stages:
        record(st, log, f"s{st.stage_index}")
    x, y = pp_data(device)
    schedule.step(x) if rank == 0 else schedule.step(target=y, losses=[])
    plan = [label(a) for a in schedule.pipeline_order[rank] if a is not None]
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
        return True
    say(f"ran {' '.join(log)}, no error")
    return False


def run_tp(device):
    mesh = init_device_mesh(device.type, (2,), mesh_dim_names=("tp",))
    show_tp(mesh, device)
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


if __name__ == "__main__":
    serve({"tp": run_tp, "pp": run_pp, "all": run_all})

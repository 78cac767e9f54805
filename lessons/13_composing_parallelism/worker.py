"""The worker of lesson 13: data and tensor parallelism composed on 4 ranks.

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29500 \
        --rdzv-id=13 lessons/13_composing_parallelism/worker.py main     # in two terminals
    torchrun --standalone --nproc-per-node=4 lessons/13_composing_parallelism/worker.py main
    ... worker.py twod --backend nccl                 # 4 CUDA devices: section 1 only
    torchrun --standalone --nproc-per-node=2 ... worker.py exercises --answers PATH

- `main` runs every section of the lesson in order (each is also a part of its own: `twod`,
  `hsdp`, `comms`, `overlap`, `memory`, `nodes`); it needs 4 ranks.
- `exercises` runs a student's data-parallel exercises (`--answers` names the file) against
  `nn.parallel.DistributedDataParallel` on any number of ranks (the tests use 2).

Output: every line is one print that starts with `rank N:`; facts every rank shares come from
rank 0 only; `== name ==` lines start a section. The launcher, the process group and the
teardown are the course's kit (lessons/multirank.py, lesson 09).
"""

import importlib.util
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lessons/: the course's kit
from multirank import heading, say, serve, shared

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               parallelize_module)
from torch.distributed.tensor.debug import CommDebugMode
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

V, H, HEADS, S = 32, 16, 4, 8  # vocabulary, width, attention heads, tokens per sequence
BATCH = 8  # sequences in the global batch, split over the data-parallel ranks
BIG = 32  # sequences per rank where compute time or activation memory must show

# CommDebugMode tracks modules with full backward hooks; the model's input (token ids) needs no
# gradient, so PyTorch warns at every backward. Harmless here, and not this lesson's subject.
warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
ROUNDING = 1e-12  # float64 gaps below this are rounding: the order of additions, not the math


# ----------------------------------------------------------------------------- the model


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = HEADS  # tensor parallelism sets it to this rank's heads: HEADS // tp
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(H, H, bias=False) for _ in range(4))

    def forward(self, x):  # (B, S, H), the whole sequence
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, S, H // HEADS)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))  # (B, S, H)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x):  # (B, S, H)
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm attention and MLP, each with a residual; `checkpointed` recomputes in backward."""

    def __init__(self):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = nn.LayerNorm(H), Attention(), nn.LayerNorm(H), MLP()
        self.checkpointed, self.runs = False, 0

    def inner(self, x):  # (B, S, H) -> (B, S, H)
        self.runs += 1  # forward computations of this block, recomputations included
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def forward(self, x):
        if self.checkpointed:  # keep only x; run inner again in backward
            return checkpoint(self.inner, x, use_reentrant=False)
        return self.inner(x)


class Model(nn.Module):
    def __init__(self, blocks=2):
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
        self.norm, self.head = nn.LayerNorm(H), nn.Linear(H, V)

    def forward(self, tokens):  # (B, S) -> (B, S, V) log-probabilities
        x = self.embed(tokens)  # (B, S, H)
        for block in self.blocks:
            x = block(x)
        return F.log_softmax(self.head(self.norm(x)), dim=-1)


def init_weights(model, seed=0):
    """Every parameter from a generator of its own, one full parameter at a time; a DTensor
    keeps only its shard of it. The same values whether the model is sharded or not."""
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            gen = torch.Generator().manual_seed(seed + i)
            full = torch.randn(p.shape, generator=gen, dtype=p.dtype)  # one full parameter
            if p.dim() == 2:  # a matrix: scaled by its input width
                full = full / p.shape[1] ** 0.5
            else:  # a bias, or a norm's weight (around 1)
                full = 0.1 * full + ("norm" in name and name.endswith("weight"))
            if isinstance(p, DTensor):  # src_data_rank=None: keep this rank's piece, no messages
                full = distribute_tensor(full.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
            p.copy_(full)
    return model


def build(dtype=torch.float64, device="cpu", blocks=2):
    return init_weights(Model(blocks).to(device=device, dtype=dtype))


def batch(device, parts=1, part=0, size=BATCH):
    """The global batch (size, S + 1) and part `part` of `parts` equal pieces of it."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (size, S + 1), generator=gen).to(device)
    return tokens, tokens.chunk(parts)[part]


def loss_fn(model, tokens):  # next-token prediction, the mean over this batch
    return F.nll_loss(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())


def adamw_step(model, tokens, lr=1e-2):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)  # made after sharding: it sees DTensors
    loss = loss_fn(model, tokens)
    loss.backward()
    opt.step()
    return loss


# ----------------------------------------------------------------------------- sharding


def tp_plan(model, tp, sp=True):
    """Tensor parallelism over the 1-D mesh tp: q/k/v and up colwise, wo and down rowwise,
    the embedding rowwise and the head colwise; sp=True adds sequence parallelism: the norms
    and the residual stream hold S / tp tokens, and gathers/scatters replace all-reduces."""
    seq, rep = Shard(1), Replicate()
    top = {"embed": RowwiseParallel(input_layouts=rep, output_layouts=seq if sp else rep),
           "head": ColwiseParallel(input_layouts=seq if sp else rep, output_layouts=rep)}
    if sp:
        top["norm"] = SequenceParallel()
    parallelize_module(model, tp, top)
    for block in model.blocks:
        plan = {"attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
                "attn.wo": RowwiseParallel(output_layouts=seq if sp else rep),
                "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=seq if sp else rep)}
        for name in ("attn", "mlp"):  # one DTensor input for q, k and v: one collective
            plan[name] = PrepareModuleInput(input_layouts=(seq if sp else rep,), desired_input_layouts=(rep,))
        if sp:  # the norms run on the sequence shard
            plan |= {"norm1": SequenceParallel(), "norm2": SequenceParallel()}
        parallelize_module(block, tp, plan)
        block.attn.heads = HEADS // tp.size()  # this rank's heads: q/k/v hold H / tp columns
    return model


def fsdp(model, mesh, **kw):
    """fully_shard bottom-up: each block is a unit, the root takes embed, norm and head."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **kw)
    return fully_shard(model, mesh=mesh, **kw)


def make_2d(mesh, dtype=torch.float64, device="cpu", meta=False):
    """torchtitan's order: tensor parallelism over mesh['tp'] first, then FSDP over mesh['dp']."""
    if meta:
        with torch.device("meta"):
            model = Model().to(dtype)
    else:
        model = build(dtype, device)
    return fsdp(tp_plan(model, mesh["tp"]), mesh["dp"])


# ----------------------------------------------------------------------------- checks


def below(value, bound=ROUNDING):
    """A rounding-level gap as text: its digits depend on the CPU (the vector instructions
    change the order of additions), its comparison with the bound does not."""
    return f"{value:.1e}, below {bound:.0e}: {value < bound}"


def gap(t, ref):
    """Largest |t - ref| over all ranks; a DTensor is compared shard by shard with the same
    pieces of ref (no rank gathers the full tensor)."""
    t, ref = t.detach(), ref.detach()
    if isinstance(t, DTensor):
        ref = distribute_tensor(ref.to(t.device), t.device_mesh, t.placements, src_data_rank=None).to_local()
        t = t.to_local()
    worst = (t - ref.to(t.device)).abs().max().reshape(1).to(torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()


def model_gap(model, ref, grads=False):
    pairs = zip(model.parameters(), ref.parameters())
    return max(gap(p.grad, q.grad) if grads else gap(p, q) for p, q in pairs)


def rows_held(p, placements=None):
    """The rows of the full parameter p that this rank holds, as 'a-b': under p's own
    placements, or after redistributing p's layout to `placements`."""
    index = torch.arange(p.shape[0], dtype=p.dtype, device=p.device).view(-1, *[1] * (p.dim() - 1)).expand(p.shape)
    mine = distribute_tensor(index.contiguous(), p.device_mesh, p.placements, src_data_rank=None)
    if placements is not None and any(isinstance(q, Replicate) for q in placements):
        mine = mine.redistribute(placements=placements)  # a real collective, as FSDP's gather
    elif placements is not None:
        mine = distribute_tensor(index.contiguous(), p.device_mesh, placements, src_data_rank=None)
    rows = mine.to_local().reshape(mine.to_local().shape[0], -1)[:, 0].long().tolist()
    assert rows == list(range(rows[0], rows[-1] + 1)), rows  # one contiguous block of rows
    return f"{rows[0]}-{rows[-1]}"


# ----------------------------------------------------------------------------- 1. the 2-D mesh


def show_twod(device):
    heading("mesh")
    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))
    shared(f"mesh {mesh.mesh.tolist()}, dims {mesh.mesh_dim_names}")
    sums = {}
    for dim in ("dp", "tp"):  # each rank's own rank, summed over one of its groups
        x = torch.tensor([dist.get_rank()], device=device)
        dist.all_reduce(x, group=mesh[dim].get_group())
        sums[dim] = x.item()
    say(f"dp group {mesh['dp'].mesh.tolist()}, tp group {mesh['tp'].mesh.tolist()}; "
        f"all_reduce of the ranks over dp {sums['dp']}, over tp {sums['tp']}")
    model = make_2d(mesh, device=device)
    shared(f"attention heads per rank {model.blocks[0].attn.heads} of {HEADS}")
    heading("placements")
    for name, p in model.named_parameters():
        if not name.startswith("blocks.1."):
            shared(f"{name:24s} {str(list(p.shape)):9s} local {str(list(p.to_local().shape)):8s} {p.placements}")
    same = all(p.placements == model.get_parameter(n.replace("blocks.1.", "blocks.0.")).placements
               for n, p in model.named_parameters() if n.startswith("blocks.1."))
    shared(f"blocks.1.*: the same placements as blocks.0.*: {same}")
    heading("shards")
    w = model.blocks[0].mlp.up.weight
    where = f"dp {mesh.get_local_rank('dp')} tp {mesh.get_local_rank('tp')}"
    say(f"{where}: blocks.0.mlp.up.weight rows {rows_held(w)}")
    say(f"{where}: after an all-gather over dp, rows {rows_held(w, [Replicate(), Shard(0)])}; "
        f"under plain (Shard(0), Shard(0)) it would hold rows {rows_held(w, [Shard(0), Shard(0)])}")
    heading("step")
    check_step(model, mesh.get_local_rank("dp"), 2, device)
    return mesh, model


def check_step(model, part, parts, device):
    """One AdamW step of a sharded model on its part of the batch vs one process on all of it."""
    tokens, mine = batch(device, parts, part)
    ref = build(device=device)
    ref_loss = adamw_step(ref, tokens)
    loss = adamw_step(model, mine)
    mean = loss.detach().reshape(1).clone()
    dist.all_reduce(mean)
    mean = mean.item() / dist.get_world_size()  # tp ranks share a part: the mean is the same
    shared(f"loss: one process {ref_loss.item():.6f}, mean over ranks {mean:.6f}")
    shared(f"after one AdamW step, parameters vs one process: max gap {below(model_gap(model, ref))}")


# ----------------------------------------------------------------------------- 2. HSDP


def show_hsdp(device):
    heading("hsdp")
    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("replicate", "shard"))
    model = fsdp(build(device=device), mesh)
    kinds = sorted({str(p.placements) for p in model.parameters()})
    shared(f"placements of every parameter: {kinds}")
    w = model.blocks[0].mlp.up.weight
    say(f"replicate {mesh.get_local_rank('replicate')} shard {mesh.get_local_rank('shard')}: "
        f"blocks.0.mlp.up.weight rows {rows_held(w)}")
    check_step(model, dist.get_rank(), 4, device)


# ----------------------------------------------------------------------------- 3. bytes


KINDS = {"allreduce_": "all-reduce", "all_reduce": "all-reduce", "_allgather_base_": "all-gather",
         "all_gather_into_tensor": "all-gather", "_reduce_scatter_base_": "reduce-scatter",
         "reduce_scatter_tensor": "reduce-scatter"}
QUIET = {"wait_tensor", "_wrap_tensor_autograd"}  # funcol bookkeeping, not collectives


class Wire(TorchDispatchMode):
    """Records every collective dispatched while it is active: its kind, its group's ranks,
    the elements of the full tensor it works on, when it was issued and completed, and the
    last DTensor op seen before it (the op whose redistribution issued it). DTensor ops are
    let through first (NotImplemented), to see the collectives they become."""

    def __init__(self):
        super().__init__()
        self.calls, self.start, self.phase, self.op = [], time.perf_counter(), "", None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            self.op = func.overloadpacket.__name__
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.namespace in ("c10d", "_c10d_functional") and name not in QUIET:
            self.record(name, args, out)
        return out

    def now(self):
        return time.perf_counter() - self.start

    def record(self, name, args, out):
        kind = KINDS.get(name, name)  # anything else is listed under its own name
        groups = [a for a in args if isinstance(a, torch.ScriptObject)]
        if groups:  # c10d op: (outputs, inputs, group, ...); it returns (..., work)
            group = dist.ProcessGroup.unbox(groups[0])
            tensors = args[1] if kind == "reduce-scatter" else args[0]
        else:  # functional collective: (tensor, ..., group name)
            group = dist.distributed_c10d._resolve_process_group(args[-1])
            tensors = args[0]
        tensors = tensors if isinstance(tensors, (list, tuple)) else [tensors]
        size = sum(t.numel() for t in tensors) * (group.size() if kind == "all-gather" and not groups else 1)
        call = {"kind": kind, "ranks": dist.get_process_group_ranks(group), "numel": size, "phase": self.phase,
                "bytes": size * tensors[0].element_size(), "issued": self.now(), "done": None, "op": self.op}
        self.calls.append(call)
        if groups:  # the work runs on gloo's threads: note when it completes
            try:
                future = dist.distributed_c10d.Work.unbox(out[-1]).get_future()
            except RuntimeError:  # "Work::getFuture not implemented": gloo's reduce-scatter
                return
            future.then(lambda _: call.update(done=self.now()))


def ring_bytes(call):
    """Bytes one rank sends for this collective with the ring algorithms: (n-1)/n of the
    full tensor for an all-gather or a reduce-scatter, twice that for an all-reduce."""
    n = len(call["ranks"])
    return call["bytes"] * (n - 1) * (2 if call["kind"] == "all-reduce" else 1) // n


def one_step(model, tokens, opt_class=torch.optim.AdamW):
    """A warm-up step, then one recorded step: forward and backward under CommDebugMode
    (collectives per module), the whole step under Wire, each call tagged with its phase."""
    opt = opt_class(model.parameters(), lr=1e-2)
    for _ in range(2 if isinstance(model, DDP) else 1):  # DDP rebuilds its buckets once
        phase_step(model, opt, tokens, Wire())  # DTensor's caches fill
    wire, counts = Wire(), CommDebugMode()
    with counts:
        phase_step(model, opt, tokens, wire, opt_too=False)
    phase_step(model, opt, tokens, wire, fwd_bwd=False)
    return wire, counts


def phase_step(model, opt, tokens, wire, fwd_bwd=True, opt_too=True):
    with wire:
        if fwd_bwd:
            opt.zero_grad(set_to_none=True)
            wire.phase = "forward"
            loss = loss_fn(model, tokens)
            wire.phase = "backward"
            loss.backward()
        if opt_too:
            wire.phase = "optimizer"
            opt.step()


def strategies(device):
    """The same model (float32) and global batch, parallelised six ways over the 4 ranks:
    {name: (model, this rank's tokens)}."""
    rank, f32 = dist.get_rank(), torch.float32
    tokens, _ = batch(device)
    flat = init_device_mesh(device.type, (4,), mesh_dim_names=("all",))
    two = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))
    hsdp = init_device_mesh(device.type, (2, 2), mesh_dim_names=("replicate", "shard"))
    return {
        "DDP": (DDP(build(f32, device)), tokens.chunk(4)[rank]),
        "FSDP2": (fsdp(build(f32, device), flat), tokens.chunk(4)[rank]),
        "TP": (tp_plan(build(f32, device), flat, sp=False), tokens),
        "TP+SP": (tp_plan(build(f32, device), flat), tokens),
        "2-D": (make_2d(two, f32, device), tokens.chunk(2)[two.get_local_rank("dp")]),
        "HSDP": (fsdp(build(f32, device), hsdp), tokens.chunk(4)[rank]),
    }


def formula(name, psi, tokens):
    """The textbook's bytes per rank per step: psi parameter bytes, `tokens` = B*S on a
    rank, N = 4 ranks; TP: 4 all-reduces of B*S*H per block (2 forward, 2 backward)."""
    blocks, e = 2, 4  # float32
    act = lambda t, n: 4 * blocks * 2 * t * H * e * (n - 1) // n  # noqa: E731
    return {"DDP": 2 * psi * 3 // 4, "FSDP2": 3 * psi * 3 // 4, "TP": act(tokens, 4),
            "TP+SP": act(tokens, 4), "2-D": 3 * (psi // 2) // 2 + act(tokens, 2),
            "HSDP": 3 * psi // 2 + 2 * (psi // 2) // 2}[name]


FORMULAS = {"DDP": "2P(N-1)/N", "FSDP2": "3P(N-1)/N", "TP": "8LBSH(N-1)/N", "TP+SP": "8LBSH(N-1)/N",
            "2-D": "3(P/tp)(dp-1)/dp + 8LBSH(tp-1)/tp", "HSDP": "3P(s-1)/s + 2(P/s)(r-1)/r"}


def category(call, tokens):
    """What a collective carries: activations (B*S*H of this rank's tokens), logits
    (B*S*V), parameters or gradients (FSDP's and DDP's flat buffers), or one small
    gradient (a norm's weight or bias: H elements)."""
    if call["numel"] == tokens * H:
        return "activations"
    if call["numel"] == tokens * V:
        return "logits"
    return "small grads" if call["numel"] == H else "params"


def node_of(rank):
    return rank // int(os.environ.get("LOCAL_WORLD_SIZE", "2"))


def show_comms(device):
    heading("comms")
    psi = sum(p.numel() for p in Model().parameters()) * 4
    shared(f"P = {psi // 4} parameters x 4 B = {psi} B (float32); global batch {BATCH} x {S} tokens, H {H}, V {V}")
    root = sum(p.numel() for n, p in Model().named_parameters() if not n.startswith("blocks."))
    shared(f"FSDP units: root (embed, norm, head) {root} elements, each block {(psi // 4 - root) // 2}")
    rows = {}
    for name, (model, mine) in strategies(device).items():
        seen = []  # what block 1 receives: what one rank holds between the blocks
        hook = model.blocks[1].register_forward_pre_hook(lambda mod, args: seen.append(args[0])) \
            if name.startswith("TP") else None
        wire, counts = one_step(model, mine)
        rows[name] = summarise(name, wire, mine.shape[0] * S, psi)
        if hook:
            hook.remove()
            show_tp(name, counts, seen[-1])
        if name == "2-D":
            show_local(model, psi)
    show_partial(device)
    return rows


def show_tp(name, counts, x):
    """CommDebugMode's counts per module (where forward and backward issued collectives), and
    the residual stream one rank holds between the blocks."""
    for fqn in ("Model.embed", "Model.blocks.0", "Model.head"):
        got = counts.comm_module_counts.get(fqn, {"forward": {}, "backward": {}})
        text = "; ".join(f"{phase} " + (", ".join(f"{n} {op.__name__}" for op, n in sorted(
            got[phase].items(), key=lambda kv: kv[0].__name__)) or "none") for phase in ("forward", "backward"))
        shared(f"{name:6s} {fqn[6:]:9s} {text}")
    local = x.to_local() if isinstance(x, DTensor) else x
    shared(f"{name:6s} between the blocks each rank holds a {type(x).__name__} {list(local.shape)}")


def show_local(model, psi):
    """What FSDP shards over dp in the 2-D model: each tp rank's part of the parameters."""
    local = {n: p.numel() // (2 if p.placements[1].is_shard() else 1) for n, p in model.named_parameters()}
    root = sum(v for n, v in local.items() if not n.startswith("blocks."))
    shared(f"2-D    a tp rank's parameters {sum(local.values())} elements (P/tp = {psi // 8}), root unit {root}")


def summarise(name, wire, tokens, psi):
    """Print one strategy's collectives per phase, bytes measured vs formula, by payload."""
    for phase in ("forward", "backward", "optimizer"):
        kinds = {}
        for call in (c for c in wire.calls if c["phase"] == phase):
            kinds[call["kind"]] = kinds.get(call["kind"], 0) + 1
        text = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
        shared(f"{name:6s} {phase:9s} {text}")
    by = {}
    for call in wire.calls:
        by[category(call, tokens)] = by.get(category(call, tokens), 0) + ring_bytes(call)
    total, f = sum(by.values()), formula(name, psi, tokens)
    across = sum(ring_bytes(c) for c in wire.calls if len({node_of(r) for r in c["ranks"]}) > 1)
    shared(f"{name:6s} measured {total} B, formula {FORMULAS[name]} = {f} B, measured/formula {total / f:.3f}")
    shared(f"{name:6s} by payload: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items()))
           + f"; in groups spanning both nodes {across}")
    return total, f, by, across


def show_partial(device):
    """Sequence parallelism leaves the gradients of the replicated parameters Partial: every
    optimizer op that reads one all-reduces it again."""
    flat = init_device_mesh(device.type, (4,), mesh_dim_names=("all",))
    tokens, _ = batch(device)
    for opt in (torch.optim.AdamW, torch.optim.SGD):
        model = tp_plan(build(torch.float32, device), flat)
        wire, _ = one_step(model, tokens, opt)
        partial = [p for p in model.parameters() if p.grad is not None and p.grad.placements[0].is_partial()]
        ops = {}  # the DTensor op whose read of a Partial gradient issued each all-reduce
        for call in (c for c in wire.calls if c["phase"] == "optimizer"):
            ops[call["op"]] = ops.get(call["op"], 0) + 1
        shared(f"Partial gradients, TP+SP and {opt.__name__}: {len(partial)} after backward; "
               f"all-reduces in the optimizer step {sum(ops.values())}: "
               + ", ".join(f"{op} {n}" for op, n in sorted(ops.items())))


# ----------------------------------------------------------------------------- 4. overlap


def traced_step(model, tokens, wire):
    """One forward + backward with timestamps on wire's clock: [(label, start, end)] of each
    block's forward and backward computation; the collectives go to wire.calls."""
    spans, open_ = [], {}

    def begin(key):
        open_[key] = wire.now()

    def end(key):
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
        wire.phase = "step"
        loss_fn(model, tokens).backward()
    for h in handles:
        h.remove()
    return sorted(spans, key=lambda s: s[1])


def fsdp_model(device, prefetch, tokens):
    """FSDP2 over all 4 ranks (float32), with or without explicit prefetching; one warm-up."""
    mesh = init_device_mesh(device.type, (4,), mesh_dim_names=("all",))
    model = fsdp(build(torch.float32, device), mesh)
    if prefetch:  # each block gathers the next one's parameters when it starts
        model.blocks[0].set_modules_to_forward_prefetch([model.blocks[1]])
        model.blocks[1].set_modules_to_backward_prefetch([model.blocks[0]])
    loss_fn(model, tokens).backward()
    return model


def show_overlap(device):
    heading("overlap")
    _, mine = batch(device, 4, dist.get_rank(), size=4 * BIG)
    steps, traces = {}, {}
    for prefetch in (False, True):
        model = fsdp_model(device, prefetch, mine)
        wire = Wire()
        spans = traced_step(model, mine, wire)
        at = {k: (a, b) for k, a, b in spans}
        gathers = [c["issued"] for c in wire.calls if c["kind"] == "all-gather"]  # root, 0, 1, then backward
        scatters = [c["issued"] for c in wire.calls if c["kind"] == "reduce-scatter"]  # 1, 0, root
        shared(f"prefetch {prefetch!s:5s}: all-gathers {len(gathers)}, reduce-scatters {len(scatters)}")
        shared(f"prefetch {prefetch!s:5s}: blocks.1's all-gather issued before blocks.0's forward began: "
               f"{gathers[2] < at['fwd 0'][0]}, after it ended: {gathers[2] > at['fwd 0'][1]}")
        shared(f"prefetch {prefetch!s:5s}: blocks.0 gathered again before blocks.1's backward ended: "
               f"{gathers[4] < at['bwd 1'][1]}")
        shared(f"prefetch {prefetch!s:5s}: blocks.1's reduce-scatter issued before blocks.0's backward began: "
               f"{scatters[0] < at['bwd 0'][0]}")
        traces[prefetch] = (spans, wire)
        steps[prefetch] = step_time(model, mine)
    shared(f"step time with prefetch / without: {steps[True] / steps[False]:.2f}")
    heading("async")
    show_async(device)
    heading("timeline")
    for prefetch, (spans, wire) in traces.items():
        timeline(prefetch, spans, wire)


def timeline(prefetch, spans, wire):
    """Lines the lesson's figure reads (not shown): every span on this rank, in ms."""
    for key, a, b in spans:
        say(f"span prefetch={prefetch} compute {key} {1e3 * a:.3f} {1e3 * b:.3f}")
    for c in wire.calls:
        end = c["done"] if c["done"] is not None else c["issued"]
        say(f"span prefetch={prefetch} {c['kind']} {c['numel']} {1e3 * c['issued']:.3f} {1e3 * end:.3f}")


def step_time(model, tokens, repeat=3):
    """Seconds per forward + backward, the median of `repeat` (a barrier before each)."""
    times = []
    for _ in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        loss_fn(model, tokens).backward()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def show_async(device):
    """async_op=True: issue, compute, wait. The last rank joins late (a slow peer), so the
    collective is still in flight while the others compute. Then: which gloo handles have a
    future to note their completion (the timeline's reduce-scatters have none)."""
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    x = torch.full((1024,), float(rank + 1), device=device)
    a = torch.randn(64, 64, device=device)
    dist.barrier()  # all ranks start here together
    if rank == last:
        time.sleep(0.5)  # a slow peer: the all-reduce cannot finish before it joins
    start, done = time.perf_counter(), []
    work = dist.all_reduce(x, async_op=True)  # returns at once with a handle
    noted = work.get_future().then(lambda _: done.append(time.perf_counter() - start))
    began = time.perf_counter() - start
    for _ in range(50):
        a = torch.tanh(a @ a)  # compute that does not need x
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


# ----------------------------------------------------------------------------- 5. memory


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
    from torch.profiler import ProfilerActivity, profile

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
    block, x = Block().to(device), torch.randn(BIG, S, H, device=device, requires_grad=True)
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


def show_meta(device):
    heading("meta")
    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))

    def materialise():
        model = make_2d(mesh, meta=True)  # no storage at all: shapes and placements only
        on_meta = all(p.is_meta for p in model.parameters())
        model.to_empty(device=device)  # storage for this rank's shards, uninitialised
        return init_weights(model), on_meta

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
    shared(f"parameters equal to one process's init, bitwise: {model_gap(model, ref) == 0.0}")
    return mesh, model, ref


def show_clip(device, mesh, model, ref):
    heading("clip")
    tokens, mine = batch(device, 2, mesh.get_local_rank("dp"))
    loss_fn(model, mine).backward()
    loss_fn(ref, tokens).backward()
    wire = Wire()
    with wire:
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
    expect = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm=0.5)
    shared(f"total norm: one process {expect.item():.6f}; 2-D a {type(total).__name__} {total.placements}, "
           f"gap {below(abs(total.full_tensor().item() - expect.item()))}")
    shared(f"clipped gradients vs one process: max gap {below(model_gap(model, ref, grads=True))}")
    shared("collectives in clip_grad_norm_: " + ", ".join(
        f"{c['kind']} of {c['numel']} over {c['ranks']} (from {c['op']})" for c in wire.calls))


def show_memory(device):
    show_checkpointing(device)
    mesh, model, ref = show_meta(device)
    show_clip(device, mesh, model, ref)


# ----------------------------------------------------------------------------- 7. nodes


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


# ----------------------------------------------------------------------------- exercises


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
    its handle; the step notes where backward ended."""

    def __init__(self):
        self.log, self.original = [], dist.all_reduce

    def __enter__(self):
        def all_reduce(tensor, *args, async_op=False, **kwargs):
            self.log.append("issue" if async_op else "blocking")
            work = self.original(tensor, *args, async_op=async_op, **kwargs)
            return Handle(work, self.log) if async_op else work
        dist.all_reduce = all_reduce
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self.original


def load_answers(path):
    spec = importlib.util.spec_from_file_location("answers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(model, tokens, after_backward, steps=3):
    """`steps` SGD steps of this rank's tokens; after_backward(step) syncs the gradients.
    Returns the gradients of every step and the Watch logs."""
    opt, grads, logs = torch.optim.SGD(model.parameters(), lr=0.1), [], []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        with Watch() as watch:
            loss_fn(model, tokens[step]).backward()
            watch.log.append("backward ended")
            after_backward(step)
        grads.append([p.grad.clone() for p in model.parameters()])
        logs.append(watch.log)
        opt.step()
    return grads, logs


def against_ddp(device, make_sync, label):
    """Train with the student's synchronisation and with DDP; print the comparison."""
    world, rank = dist.get_world_size(), dist.get_rank()
    tokens = [batch(device, world, rank, size=4 * world)[1][:, :] for _ in range(3)]
    tokens = [t.roll(step, dims=1) for step, t in enumerate(tokens)]  # a different batch each step
    ddp = DDP(build(device=device))
    ddp_grads, _ = train(ddp, tokens, lambda step: None)
    model = build(device=device)
    sync = make_sync(model)
    grads, logs = train(model, tokens, sync)
    worst = max((a - b).abs().max().item() for g, h in zip(grads, ddp_grads) for a, b in zip(g, h))
    params = max((p - q).abs().max().item() for p, q in zip(model.parameters(), ddp.module.parameters()))
    say(f"{label}: grads of 3 steps vs DDP max gap {below(worst)}; parameters after 3 steps max gap {below(params)}")
    return logs


def show_exercises(device, answers):
    module = load_answers(answers)
    heading("naive")
    attempt(lambda: naive(device, module))
    for size in (2000, 10_000, 1 << 20):
        heading(f"bucketed {size}")
        attempt(lambda: bucketed(device, module, size))


def attempt(fn):
    try:
        fn()
    except NotImplementedError:
        say("not attempted: NotImplementedError")


def naive(device, module):
    logs = against_ddp(device, lambda model: lambda step: module.all_reduce_grads(model), "naive")
    n = sum(1 for _ in Model().parameters())
    say(f"naive: all-reduces per step {[log.count('issue') + log.count('blocking') for log in logs]}, parameters {n}")


def bucketed(device, module, size):
    logs = against_ddp(device, lambda model: (lambda b: lambda step: b.finish())(module.Bucketed(model, size)),
                       "bucketed")
    say(f"bucketed: all-reduces per step {[log.count('issue') + log.count('blocking') for log in logs]}, "
        f"blocking {sum(log.count('blocking') for log in logs)}")
    first = [log.index("issue") < log.index("backward ended") if "issue" in log else False for log in logs]
    early = [log[:log.index("backward ended")].count("wait") for log in logs]
    late = [log[log.index("backward ended"):].count("wait") for log in logs]
    say(f"bucketed: first all-reduce issued before backward ended {first}; "
        f"waits before it ended {early}, after {late}")


# ----------------------------------------------------------------------------- parts


def main_part(device):
    """Every section of the lesson, in order."""
    show_twod(device)
    show_hsdp(device)
    show_comms(device)
    show_overlap(device)
    show_memory(device)
    show_nodes(device)


def part(show):
    """A part of the worker: `show(device)`, exit code 0 (what show returns is for main_part);
    the exercises' --answers is not its business."""
    def run(device, answers):
        show(device)
        return 0
    return run


PARTS = {"main": part(main_part), "twod": part(show_twod), "hsdp": part(show_hsdp), "comms": part(show_comms),
         "overlap": part(show_overlap), "memory": part(show_memory), "nodes": part(show_nodes),
         "exercises": show_exercises}

if __name__ == "__main__":
    solutions = str(Path(__file__).with_name("solutions.py"))
    serve(PARTS, lambda parser: parser.add_argument("--answers", default=solutions))

# %% [markdown]
# # 11b · FSDP2: what a rank holds through a step
#
# Part 11a sharded a small model with `fully_shard` on two CPU ranks: each parameter became
# a DTensor `Shard(0)`, one AdamW step equalled one process, and FSDP2's hooks on
# `__call__` gathered each unit just before it ran. This second part follows the bytes: when
# a gathered unit is freed again, what mixed precision changes, what a rank holds compared
# with DDP (counted from the tensors, then measured by the allocator, then by formula for an
# 8B-parameter model), and how gradient accumulation and CPU offload fit in.
#
# **What you will learn**
#
# - `reshard_after_forward` True / False / None: which modules are full or sharded between
#   forward and backward, traced through one step, and the peak each gives, backward
#   prefetch included;
# - an integer `reshard_after_forward` as a group size, on 4 ranks played by this one
#   process in a *fake* process group (real shapes, no data moved);
# - `MixedPrecisionPolicy`: bf16 compute, fp32 master parameters and gradients;
# - memory per rank: a model counted from the tensors beside the CPU allocator's bytes
#   (profiler) for DDP, DDP with `gradient_as_bucket_view=True` and FSDP2, and an
#   8B-parameter model on 8 GPUs by formula;
# - gradient accumulation with `set_requires_gradient_sync(False)`; CPU offload.
#
# **Prerequisites:** lesson 11a (the model, `fully_shard`, the hooks), lesson 09
# (collectives, DTensor placements), lesson 05a (bf16), lesson 06a (the profiler).
#
# **How to run:** `python lessons/11b_fsdp2_memory/fsdp2_memory.py` or `make lesson N=11b`
# from the repository root, or open `fsdp2_memory.ipynb`. It launches `worker.py` once on
# 2 ranks (10–15 s on the CPU, gloo backend) through the course's multi-rank kit,
# `lessons/multirank.py` (lesson 09 explains it); every section reads that launch's output,
# except two cells of section 2, which run in this process on a fake group of 4 ranks. The
# code the ranks run is in this lesson: each cell that starts with `#@worker` only defines
# functions, and `worker.py` is written from those cells. Run the worker yourself:
# `torchrun --standalone --nproc-per-node=2 lessons/11b_fsdp2_memory/worker.py main` (add
# `--backend nccl` on a machine with 2 GPUs; `pinned` instead of `main` shows a launch that
# fails cleanly; `--nproc-per-node=4 ... worker.py int4` is section 2's part on 4 real
# ranks). Each printing cell is followed by an *Output* block: what it printed with the
# pinned PyTorch (2.13.0). Run outside the course's venv, that `torchrun` command also
# prints PyTorch's own diagnostic lines from each rank to stderr: `USDT: ...
# profiler_start` and `profiler_stop` around each profiler run. They are harmless.

# %%
import contextlib
import re
import sys
from pathlib import Path

import matplotlib.pyplot as plt

# lessons/ on the path, for the multi-rank kit (lesson 09) and the source map; a notebook
# runs in the lesson's folder and has no __file__
sys.path.insert(0, str((Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()).parent))

# %% [markdown]
# ## The model and the step of part 11a
#
# The ranks' code starts with part 11a's, repeated here so that this part runs on its own:
# the imports, the model `Tiny` (an embedding of 64 tokens × 32, two pre-norm transformer
# blocks, a final LayerNorm and a head: 29,632 parameters, the same weights on every rank),
# `shard` (`fully_shard` on each block, then on the root: three units), the batch (8
# sequences of 9 tokens, 4 per rank), the loss and one AdamW step, and the helpers that
# compare a sharded model with one process.

# %%
#@worker
import gc
import logging
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

from multirank import heading, say, serve, shared

V, D, T, B = 64, 32, 8, 4  # vocabulary, width, tokens per sequence, sequences per rank


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, each with a residual."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.up, self.down = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):  # (B, T, D)
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)  # each (B, T, D): one head
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V)

    def forward(self, tokens):  # (B, T) -> (B*T, V)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        # a 2-D input to the head: a 3-D one returns a view, and FSDP2 warns that an in-place
        # op on a view output would skip its pre-backward hook
        return self.head(self.norm(x).flatten(0, 1))


def make_model(dtype, device):
    torch.manual_seed(0)  # the same initial weights on every rank and in the reference
    return Tiny().to(device=device, dtype=dtype)


def shard(model, **kw):
    """fully_shard bottom-up: each block is a unit, the root takes embed, norm and head."""
    for block in model.blocks:
        fully_shard(block, **kw)
    return fully_shard(model, **kw)


def batch(device, seed=1):
    """The global batch (2B sequences) and this rank's share of it."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (2 * B, T + 1), generator=gen).to(device)  # (2B, T+1)
    mine = tokens.chunk(dist.get_world_size())[dist.get_rank()]  # (B, T+1) on 2 ranks
    return tokens, mine


def loss_fn(model, tokens):  # next-token prediction, mean over this batch
    logits = model(tokens[:, :-1])  # (b*T, V)
    return F.cross_entropy(logits, tokens[:, 1:].flatten())


def adamw_step(model, tokens):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # after sharding: it sees DTensors
    loss_fn(model, tokens).backward()
    opt.step()
    return opt


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def below(value, bound):
    """A rounding-level gap as its comparison with a bound (its digits depend on the CPU)."""
    return f"{value:.1e}, below {bound:.0e}: {value < bound}"


def max_gap(model, ref):
    pairs = zip(model.parameters(), ref.parameters())
    return max((full(p).detach().cpu() - q.detach().cpu()).abs().max().item() for p, q in pairs)


def grad_gap(model, ref):
    pairs = zip(model.parameters(), ref.parameters())
    return max((full(p.grad).cpu() - q.grad.cpu()).abs().max().item() for p, q in pairs)


# %%
from multirank import launch, section, show  # noqa: E402  (the kit's parent side: the lesson's launches)

torch.manual_seed(0)
torch.set_num_threads(1)  # the ranks get one thread each too (OMP_NUM_THREADS=1): 2 cores
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
WORKER = HERE / "worker.py"
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}  # the same CPU run on every machine (section 6 says why)


# %% [markdown]
# As in part 11a, one function runs every section's rank code in turn, and `main` hands it
# to the kit's `serve`, which joins the process group, runs the part named on the command
# line and ends the rank cleanly. The functions it calls are defined in the sections below.

# %%
#@worker
def main_part(device):
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    show_reshard(mesh, device)
    show_reshard_int(mesh, device)
    show_mixed(mesh, device)
    show_memory(mesh, device)
    show_no_sync(mesh, device)
    if device.type == "cpu":
        show_offload(mesh, device)
    else:
        show_cuda_memory(mesh, device)
    return 0


def main():
    serve({"main": main_part, "pinned": pinned_part, "int4": int4_part})


# %%
run = launch(WORKER, ["main"], env=CPU_ONLY)
print(f"torchrun exit code {run.code} after {run.seconds:.1f} s, output from ranks {sorted(run.out)}")

# %% [markdown]
# Output:
# ```text
# torchrun exit code 0 after «time» s, output from ranks [0, 1]
# ```
#
# The time is mostly starting two Python processes and importing torch; it varies with the
# load on the machine.

# %% [markdown]
# ## 1. `reshard_after_forward`: memory or a second all-gather
#
# After a unit's forward, FSDP2 can free the gathered parameters (`True`: backward gathers
# them again, one more all-gather per unit) or keep them until backward (`False`: no second
# all-gather, but every unit stays full from its forward until its backward, which for the
# first block is the whole step). `None`, the default, is True for every unit but the root,
# which backward needs first anyway. The worker watches each module's parameter type in hooks
# (a DTensor: sharded; a plain tensor: gathered) at each module's forward and backward and
# after the forward, before `backward()`, and adds up this rank's parameter bytes at each of
# those moments: the shards, every gathered copy, and the output of any all-gather already
# issued for a unit but not yet copied into its parameters.
#
# **Predict.** For each setting, which of embed, blocks.0, blocks.1 and head are full
# between forward and backward? Which setting has the highest peak, and do `True` and
# `None` differ there?

# %%
#@worker
NAMES = ("embed", "blocks.0", "blocks.1", "head")  # the modules we watch


def nbytes(tensors):
    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() * t.element_size() for t in tensors)


def residency(model):
    """'full' or 'shard' for each watched module: FSDP2 swaps a gathered param in as a plain
    tensor and the DTensor shard back in when it reshards."""
    mods = dict(model.named_modules())
    return ["shard" if isinstance(next(mods[n].parameters()), DTensor) else "full" for n in NAMES]


def gathered_bytes(model):
    """Bytes of the parameters gathered right now (plain tensors); the shards stay as well."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if not isinstance(p, DTensor))


def prefetched_bytes(model):
    """Bytes of all-gathers issued but not yet copied into their unit's parameters (a unit
    fetched ahead by backward prefetch): FSDP2's private state in 2.13.0."""
    groups = (g for m in model.modules() if isinstance(m, FSDPModule) for g in m._get_fsdp_state()._fsdp_param_groups)
    outs = [g._all_gather_result.all_gather_output for g in groups if g._all_gather_result is not None]
    return sum(t.numel() * t.element_size() for t in outs)


def no_prefetch(model):
    """Each unit's explicit backward-prefetch list names only itself, already gathered when
    its backward starts: nothing is fetched ahead (an empty list would mean the default)."""
    for unit in (model, *model.blocks):
        unit.set_modules_to_backward_prefetch([unit])
    return model


def trace_step(model, tokens):
    """Residency of each watched module at each point of one forward + backward."""
    events, mods = [], dict(model.named_modules())
    shards = nbytes(model.parameters())  # at rest: every parameter is this rank's shard

    def snap(label):  # parameter bytes held now: all shards, each gathered unit, each prefetched one
        events.append((label, residency(model), shards + gathered_bytes(model) + prefetched_bytes(model)))

    def during(name):
        return lambda mod, args: snap(f"fwd {name}")  # after FSDP's own pre-forward hook

    def after(name):
        def hook(mod, args, out):
            # a block's FSDP hook on `out` came first, so it runs first; head's output is also
            # the root's, whose FSDP hook comes after this one (the root's forward ends later)
            out.register_hook(lambda g: snap(f"bwd {name}"))
        return hook

    handles = [mods[n].register_forward_pre_hook(during(n)) for n in NAMES]
    handles += [mods[n].register_forward_hook(after(n)) for n in NAMES]
    loss = loss_fn(model, tokens)
    snap("after fwd")
    loss.backward()
    snap("after bwd")
    for h in handles:
        h.remove()
    return events


def show_reshard(mesh, device):
    heading("reshard")
    _, mine = batch(device)
    for mode in (True, False, None):
        model = shard(make_model(torch.float32, device), mesh=mesh, reshard_after_forward=mode)
        events = trace_step(model, mine)
        _, state, held = events[NAMES.index("head") + 1]  # "after fwd": before backward()
        shared(f"reshard_after_forward={mode}: between forward and backward {dict(zip(NAMES, state))}")
        peak = max(b for _, _, b in events)  # parameter bytes: shards, gathered and prefetched units
        model = no_prefetch(shard(make_model(torch.float32, device), mesh=mesh, reshard_after_forward=mode))
        alone = max(b for _, _, b in trace_step(model, mine))
        shared(f"reshard_after_forward={mode}: parameter bytes between forward and backward "
               f"{held}, peak {peak}, without backward prefetch {alone}")
        if mode is None:  # one line per moment: embed, blocks.0, blocks.1, head; param bytes
            for label, state, held in events:
                shared(f"trace {label:<12} | {' '.join(s[0] for s in state)} | {held:>6} bytes")


# %%
show(run, "reshard")

# %% [markdown]
# Output:
# ```text
# rank 0: reshard_after_forward=True: between forward and backward {'embed': 'shard', 'blocks.0': 'shard', 'blocks.1': 'shard', 'head': 'shard'}
# rank 0: reshard_after_forward=True: parameter bytes between forward and backward 59264, peak 177792, without backward prefetch 126976
# rank 0: reshard_after_forward=False: between forward and backward {'embed': 'full', 'blocks.0': 'full', 'blocks.1': 'full', 'head': 'full'}
# rank 0: reshard_after_forward=False: parameter bytes between forward and backward 177792, peak 177792, without backward prefetch 177792
# rank 0: reshard_after_forward=None: between forward and backward {'embed': 'full', 'blocks.0': 'shard', 'blocks.1': 'shard', 'head': 'full'}
# rank 0: reshard_after_forward=None: parameter bytes between forward and backward 76160, peak 177792, without backward prefetch 126976
# rank 0: trace fwd embed    | f s s f |  76160 bytes
# rank 0: trace fwd blocks.0 | f f s f | 126976 bytes
# rank 0: trace fwd blocks.1 | f s f f | 126976 bytes
# rank 0: trace fwd head     | f s s f |  76160 bytes
# rank 0: trace after fwd    | f s s f |  76160 bytes
# rank 0: trace bwd head     | f s s f |  76160 bytes
# rank 0: trace bwd blocks.1 | f s f f | 177792 bytes
# rank 0: trace bwd blocks.0 | f f s f | 126976 bytes
# rank 0: trace bwd embed    | f s s f |  76160 bytes
# rank 0: trace after bwd    | s s s s |  59264 bytes
# ```
#
# With `True` everything is sharded between forward and backward, the root too when you ask
# for it explicitly; with `False` everything is full, the same memory as DDP's parameters at
# that moment; with `None` only the root unit (embed and head: one unit, so both) stays full.
# The trace (for `None`) has one line per moment of the step: the states of embed, blocks.0,
# blocks.1 and head (f = full, s = shard), then this rank's parameter bytes: during the
# forward of block 0 the root and block 0 are full; block 0 is resharded before block 1 is
# gathered; in backward the blocks are gathered again in reverse order; after backward
# everything is sharded (59,264 bytes: half of the 29,632 fp32 parameters). At `bwd
# blocks.1` the bytes jump to 177,792 while blocks.0 still reads `s`: its all-gather has
# been issued and its output buffer is held, but not yet copied into its parameters.
#
# The bytes lines (the largest value over the same traced moments, for each setting) give
# the trade in numbers, with a surprise: all three settings peak at 177,792 bytes. Backward
# *prefetches*: when a unit's backward starts, FSDP2 issues the all-gather of the unit whose
# backward comes next, on every device (`_backward_prefetch`, read from
# `torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`). So while block 1 computes its
# gradients the rank holds the shards (59,264), the root unit (4,224 elements, 16,896
# bytes), block 1 (12,704 elements, 50,816 bytes) and block 0's gathered buffer (50,816
# more): with two blocks, the whole model, as `False` holds it from block 1's forward to its
# backward. `set_modules_to_backward_prefetch([unit])` on every unit (each names only itself,
# already gathered: nothing is fetched ahead) turns the prefetch off, and then `True` and
# `None` peak at 126,976, the root and one block, while `False` stays at 177,792.
# Between forward and backward `True` holds only the shards (59,264), `None` adds the root
# (76,160), `False` everything (177,792). What the extra memory buys is fewer all-gathers:
# every unit resharded after its forward is gathered a second time in backward, three units
# with `True`, the two blocks with `None`, none with `False`. With dozens of blocks, `False`
# holds all of them at once while `None` holds two at its peak, the block in backward and
# the prefetched one. That second block is the price of starting the next all-gather early,
# so that a GPU can overlap it with this block's compute (unverified on a GPU); here, on
# gloo, FSDP2's all-gather returns only when done (`unshard_async_op = False`, read from the
# same file), so it starts earlier but overlaps nothing.

# %% [markdown]
# ## 2. An integer `reshard_after_forward`, and a fake group of 4 ranks
#
# `reshard_after_forward` also takes an integer, and texts disagree on what it means (a
# number of layers? of steps?). **Predict.** On these 2 ranks, what do `1`, `2` and `3` do?

# %%
#@worker
def show_reshard_int(mesh, device):
    """An int reshard_after_forward: the group size the parameters are resharded to."""
    heading("reshard int")
    _, mine = batch(device)
    logged = []
    log = logging.getLogger("torch.distributed.fsdp.fully_shard")  # its name in 2.13.0
    catch = logging.Handler()
    catch.emit = lambda record: logged.append(record.getMessage())
    log.addHandler(catch)
    for k in (1, 2, 3):
        try:
            model = shard(make_model(torch.float32, device), mesh=mesh, reshard_after_forward=k)
        except ValueError as err:
            shared(f"reshard_after_forward={k}: ValueError: {err}")
            continue
        events = trace_step(model, mine)
        _, state, held = events[NAMES.index("head") + 1]  # "after fwd": before backward()
        shared(f"reshard_after_forward={k}: between forward and backward {dict(zip(NAMES, state))}, "
               f"parameter bytes {held}")
    log.removeHandler(catch)
    shared(f"logged: {logged[0] if logged else None}")


# %%
show(run, "reshard int")

# %% [markdown]
# Output:
# ```text
# rank 0: reshard_after_forward=1: between forward and backward {'embed': 'full', 'blocks.0': 'full', 'blocks.1': 'full', 'head': 'full'}, parameter bytes 177792
# rank 0: reshard_after_forward=2: between forward and backward {'embed': 'shard', 'blocks.0': 'shard', 'blocks.1': 'shard', 'head': 'shard'}, parameter bytes 59264
# rank 0: reshard_after_forward=3: ValueError: If passing reshard_after_forward as an int, it should be a factor of 2, not 3
# rank 0: logged: reshard_after_forward=1 (int) means resharding parameters to world size 1, instead of reshard_after_forward=True (bool)
# ```
#
# The integer is a *group size*: after forward, each unit's parameters are resharded over
# groups of that many ranks rather than over all of them, so each rank keeps 1/k of every
# parameter between forward and backward, and backward's all-gather stays inside a group
# (on real clusters, typically the ranks of one node, where links are fast). It must divide
# the number of ranks that shard (2 here: `3` raises). The two ends are the booleans: `1`
# (each rank keeps the whole parameter) is `False`, the same 177,792 bytes, and FSDP2 logs
# the warning above in case you meant `True`; `2`, all the ranks, is `True` (59,264). A
# value in between needs at least 4 ranks: `_fsdp_init.py` then builds a post-forward mesh
# of shape (world / k, k), each row a group of k ranks.
#
# A launch of 4 ranks is slow on 2 cores, but this process can *play* rank 0 of 4 on its
# own: `dist.init_process_group("fake", rank=0, world_size=4)` joins a group on PyTorch's
# fake backend (`dist.Backend.FAKE`), which needs no address to meet at (it makes a
# placeholder store for itself) and no other process. Every collective on it returns at
# once, and everything else is FSDP2's real code: the sharding, the post-forward mesh, the
# hooks. The rank code below prints shapes and counts only, never a value that went
# through a collective; the cell after it runs it in such a group, and destroys the group
# whatever happens, so nothing stays initialized after the cell.
#
# **Predict.** With `reshard_after_forward=2` on 4 ranks, what share of the 29,632
# elements does a rank hold at rest, between forward and backward, and after backward? On
# what mesh, and with how many of its 64 rows, is `head.weight` between forward and backward?

# %%
#@worker
def held(model):
    """This rank's parameter elements now, and head.weight's mesh, placements, local shape."""
    w = model.head.weight
    kind = f"mesh {tuple(w.device_mesh.mesh.shape)} {w.placements}, local {list(w.to_local().shape)}"
    total = sum(p.numel() for p in model.parameters())  # a DTensor's numel is the global one
    return f"{sum(p.to_local().numel() for p in model.parameters())} of {total}", kind


def int4_part(device):
    """reshard_after_forward=2 on 4 ranks: resharded to groups of 2 between fwd and bwd."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    _, mine = batch(device)
    model = shard(make_model(torch.float32, device), mesh=mesh, reshard_after_forward=2)

    def report(label):
        n, kind = held(model)
        shared(f"reshard_after_forward=2 on {dist.get_world_size()} ranks, {label}: "
               f"holds {n} elements; head.weight {kind}")

    report("at rest")
    loss = loss_fn(model, mine)
    report("between forward and backward")
    loss.backward()
    report("after backward")
    return 0


# %%
@contextlib.contextmanager
def fake_group(world):
    """This process as rank 0 of `world` ranks, on the fake backend; destroyed on the way
    out, error or not (other lessons may run in this process after this one)."""
    dist.init_process_group("fake", rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


with fake_group(4):
    int4_part(torch.device("cpu"))  # prints rank 0's lines, as in a real launch

# %% [markdown]
# Output:
# ```text
# rank 0: reshard_after_forward=2 on 4 ranks, at rest: holds 7408 of 29632 elements; head.weight mesh (4,) (Shard(dim=0),), local [16, 32]
# rank 0: reshard_after_forward=2 on 4 ranks, between forward and backward: holds 14816 of 29632 elements; head.weight mesh (2, 2) (Replicate(), Shard(dim=0)), local [32, 32]
# rank 0: reshard_after_forward=2 on 4 ranks, after backward: holds 7408 of 29632 elements; head.weight mesh (4,) (Shard(dim=0),), local [16, 32]
# ```
#
# A quarter of the elements at rest (7,408: `head.weight` has 16 of its 64 rows, on a 1-D
# mesh of 4), half between forward and backward (14,816: `head.weight` is a DTensor on a
# (2, 2) mesh, `Replicate()` across the 2 groups and `Shard(0)` within one, 32 rows), and a
# quarter again after backward, when each unit has been resharded over all 4. These are,
# line for line, what rank 0 of a real 4-rank launch of the `int4` part prints.
#
# Yet that step gathered parameters in forward and backward with no other rank in the
# group. **Predict.** On the same fake group of 4, what does `all_reduce` (a sum) leave in a
# tensor of ones, what does `all_gather` of each rank's own rank number return, and what
# does `reduce_scatter` (FSDP2's gradient collective) give rank 0 when every rank offers
# [1, 2, 3, 4]? Four real ranks would give 4.0, [0, 1, 2, 3] and 4.0 (the sum of the four
# first chunks).

# %%
def fake_collectives(world):
    """An all_reduce, all_gather and reduce_scatter on a fake group, as rank 0 sees them."""
    with fake_group(world):
        total = torch.ones(1)
        dist.all_reduce(total)  # a sum over the ranks
        slots = [torch.full((1,), -1.0) for _ in range(world)]  # -1: a slot left unwritten
        dist.all_gather(slots, torch.tensor([float(dist.get_rank())]))
        mine = torch.full((1,), -1.0)  # rank r gets the sum over ranks of chunk r
        dist.reduce_scatter(mine, [torch.full((1,), i + 1.0) for i in range(world)])
        who = f"backend {dist.get_backend()}, rank {dist.get_rank()} of {dist.get_world_size()}"
    return who, total.item(), [int(s.item()) for s in slots], mine.item()


who, total, slots, mine = fake_collectives(4)
print(f"{who}, one process: all_reduce of ones {total:.1f}, all_gather of the rank {slots}, "
      f"reduce_scatter of [1, 2, 3, 4] {mine:.1f}")
print(f"still initialized after the cell: {dist.is_initialized()}")

# %% [markdown]
# Output:
# ```text
# backend fake, rank 0 of 4, one process: all_reduce of ones 1.0, all_gather of the rank [0, 0, 0, 0], reduce_scatter of [1, 2, 3, 4] 1.0
# still initialized after the cell: False
# ```
#
# The sum of four ranks' ones is still 1.0, every slot of the gather holds rank 0's own
# number, and the reduce-scatter hands rank 0 its own first chunk, unsummed: a fake
# collective moves no data between ranks. (It is not a no-op everywhere: a gather copies
# the local tensor into each slot, a reduce-scatter this rank's chunk of its own input, so
# that nothing reads uninitialized memory; `all_reduce` leaves its tensor as it was.
# `torch/include/torch/csrc/distributed/c10d/FakeProcessGroup.hpp` in your install holds
# the backend.) What such a group is good for, then, is everything that depends only on
# shapes and on who holds what: placements, local shapes and bytes per rank, and whether a
# sharding plan runs at all on a world size you do not have. torchtitan (the PyTorch
# project's training platform) has a dry-run mode built on it: `NGPU=32
# COMM_MODE="fake_backend" ./run_train.sh` calls `init_process_group("fake", rank=...,
# world_size=32)` in one process to check a 32-GPU configuration (its `docs/debugging.md`,
# which warns that no data-dependent logic should be validated that way). What it cannot
# tell you: values (a loss or a gradient computed from a collective's result is not the
# real one), timing (no bytes move), and hangs (rank 0 here ran every collective alone and
# nothing waited; on a real group a rank whose collectives do not match the others' waits
# out the timeout, *09 § Collective order is a contract*).

# %% [markdown]
# ## 3. Mixed precision: bf16 compute, fp32 master weights
#
# `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)` casts each
# unit's parameters to bf16 *when it gathers them* (so the all-gather moves half the bytes)
# and computes in bf16; gradients are reduce-scattered in fp32. The sharded parameters the
# optimizer updates stay fp32.
#
# **Predict.** Inside `blocks[0].up` during forward, what dtype are its weight, its input
# and its output? What are the parameter and its gradient after backward?

# %%
#@worker
def show_mixed(mesh, device):
    heading("mixed")
    _, mine = batch(device)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = shard(make_model(torch.float32, device), mesh=mesh, mp_policy=mp)
    seen = {}
    model.blocks[0].up.register_forward_hook(
        lambda m, args, out: seen.update(w=m.weight.dtype, x=args[0].dtype, out=out.dtype))
    logits = model(mine[:, :-1])
    shared(f"inside blocks.0.up: weight {seen['w']}, input {seen['x']}, output {seen['out']}")
    shared(f"logits {logits.dtype}")
    F.cross_entropy(logits.float(), mine[:, 1:].flatten()).backward()
    w = model.blocks[0].up.weight
    shared(f"at rest: blocks.0.up.weight {type(w).__name__} {w.dtype}, grad {w.grad.dtype}")


# %%
show(run, "mixed")

# %% [markdown]
# Output:
# ```text
# rank 0: inside blocks.0.up: weight torch.bfloat16, input torch.bfloat16, output torch.bfloat16
# rank 0: logits torch.bfloat16
# rank 0: at rest: blocks.0.up.weight DTensor torch.float32, grad torch.float32
# ```
#
# Inside the block everything is bf16: the weight (the gathered bf16 copy), the activations
# (each unit's pre-forward casts its floating-point inputs to `param_dtype`, as
# `cast_forward_inputs=True`, the default, asks: read from `_fsdp_state.py`; the embedding
# output is bf16 because its weight is) and the output, the logits too. At rest the parameter
# is the fp32 DTensor shard and its gradient is fp32: the optimizer updates fp32 master
# weights, so tiny updates are not lost to bf16's 8-bit mantissa (lesson 05a). Unlike
# autocast, no list of operations decides: every op in a unit gets bf16 tensors.

# %% [markdown]
# ## 4. Memory per rank: a model from the tensors, then the allocator
#
# First a model. The worker adds up, on each rank, the bytes of the tensors it holds after
# one AdamW step (fp32): parameters, gradients, and AdamW's `exp_avg` and `exp_avg_sq` (the
# step counters left out: one scalar each). *Steady* is their sum. *Peak* adds, for FSDP2,
# the parameter bytes at the traced peak of section 1 (the shards, the gathered root, the
# block in backward and the prefetched one); for DDP, which never gathers, the model's peak
# is its steady state.
#
# Then a measurement. The worker runs the same step again (model built, wrapped, one
# forward, backward and AdamW step) under `torch.profiler.profile(profile_memory=True)`,
# which records every allocation (+bytes) and free (−bytes) of the CPU allocator. Their
# running sum over the step gives what is *live* when the step ends and its *peak*. Three
# set-ups: DDP, DDP with `gradient_as_bucket_view=True`, FSDP2. The profiler can miss a
# free made on one of gloo's own threads, which only adds to a count, so each set-up is
# measured three times and the smallest count is kept (*Going further* has the details).
#
# **Predict.** FSDP2 halves which columns on 2 ranks? Does the allocator find the model's
# numbers? Where is DDP's peak?

# %%
#@worker
def accounting(model, opt, peak_params):
    params = nbytes(model.parameters())
    grads = nbytes(p.grad for p in model.parameters())
    state = nbytes(v for s in opt.state.values() for k, v in s.items() if k != "step")
    return params, grads, state, params + grads + state, peak_params + grads + state


REPEATS = 3  # a free made on a thread the profiler does not watch (gloo's) goes unseen


def allocator_bytes(builds, tokens):
    """{name: (live, peak)}: the CPU allocator's bytes over building the model and one AdamW
    step, from the profiler's memory events (allocations +, frees -) inside each range.
    Each build runs REPEATS times; an unseen free only adds, so the smallest is kept."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for name, build in builds.items():
            for i in range(REPEATS):
                gc.collect()  # the previous model's reference cycles freed outside the ranges
                with record_function(f"measure {name} {i}"):
                    model = build()
                    opt = adamw_step(model, tokens)
                del model, opt  # freed after the range: live bytes are what the step leaves
    events = list(prof.profiler.kineto_results.events())
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    found = {}
    for e in (e for e in events if e.name().startswith("measure ")):
        live = peak = 0
        for t, n in memory:
            if e.start_ns() <= t <= e.start_ns() + e.duration_ns():
                live += n
                peak = max(peak, live)
        name = e.name().split()[1]
        found[name] = min(found.get(name, (live, peak)), (live, peak))
    return found


def show_memory(mesh, device):
    heading("memory")
    _, mine = batch(device)
    ddp = DDP(make_model(torch.float32, device))
    opt = adamw_step(ddp, mine)
    rows = {"DDP": accounting(ddp, opt, nbytes(ddp.parameters()))}
    model = shard(make_model(torch.float32, device), mesh=mesh)
    events = trace_step(model, mine)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.step()
    rows["FSDP2"] = accounting(model, opt, max(b for _, _, b in events))
    for name, row in rows.items():  # bytes: params, grads, AdamW, steady, peak
        say(f"{name} bytes: " + " ".join(str(v) for v in row))
    if device.type == "cpu":  # the profiler's memory events come from the CPU allocator here
        fp32 = lambda: make_model(torch.float32, device)  # noqa: E731
        measured = allocator_bytes({"DDP": lambda: DDP(fp32()),
                                    "DDP-view": lambda: DDP(fp32(), gradient_as_bucket_view=True),
                                    "FSDP2": lambda: shard(fp32(), mesh=mesh)}, mine)
        for name, (live, peak) in measured.items():
            say(f"{name} allocator: live after step {live}, peak {peak}")
        say(f"AdamW step counters: {sum(1 for _ in ddp.parameters())} x 4 bytes")
        log = ddp._get_ddp_logging_data()  # the reducer's own record (a private method)
        say(f"DDP buckets: sizes {log['bucket_sizes']} bytes, cap {log['bucket_cap_bytes']} bytes")
    units = {"root": sum(p.numel() for n, p in model.named_parameters() if not n.startswith("blocks.")),
             "block": sum(p.numel() for p in model.blocks[0].parameters())}
    shared(f"unit sizes (elements): root {units['root']}, block {units['block']}")


# %%
MEMORY = re.compile(r"rank (\d): (DDP|FSDP2) bytes: (\d+) (\d+) (\d+) (\d+) (\d+)")
MEASURED = re.compile(r"rank (\d): (DDP|DDP-view|FSDP2) allocator: live after step (\d+), peak (\d+)")
COLUMNS = ("params", "grads", "AdamW", "steady", "peak")
KIB = 1024  # the comparisons' tolerance: bookkeeping, and a free the profiler may miss


def memory_rows(run):
    """{rank: {"DDP": (params, grads, AdamW, steady, peak), "FSDP2": (...)}} in bytes."""
    rows = {}
    for lines in section(run, "memory").values():
        for m in filter(None, map(MEMORY.fullmatch, lines)):
            rows.setdefault(int(m[1]), {})[m[2]] = tuple(int(v) for v in m.groups()[2:])
    return rows


def measured_rows(run):
    """{rank: {"DDP" | "DDP-view" | "FSDP2": (live after step, peak)}} from the allocator."""
    rows = {}
    for lines in section(run, "memory").values():
        for m in filter(None, map(MEASURED.fullmatch, lines)):
            rows.setdefault(int(m[1]), {})[m[2]] = (int(m[3]), int(m[4]))
    return rows


rows, measured = memory_rows(run), measured_rows(run)
print(f"{'rank':>4} {'':6}" + "".join(f"{c:>9}" for c in COLUMNS) + "  (bytes, the model)")
for rank, per in rows.items():
    for name, values in per.items():
        print(f"{rank:>4} {name:6}" + "".join(f"{v:>9}" for v in values))
print([x for x in section(run, "memory")[0] if "unit sizes" in x][0])

# %% [markdown]
# Output:
# ```text
# rank          params    grads    AdamW   steady     peak  (bytes, the model)
#    0 DDP      118528   118528   237056   474112   474112
#    0 FSDP2     59264    59264   118528   237056   355584
#    1 DDP      118528   118528   237056   474112   474112
#    1 FSDP2     59264    59264   118528   237056   355584
# rank 0: unit sizes (elements): root 4224, block 12704
# ```
#
# Parameters, gradients and AdamW state are all halved: FSDP2 shards all three (in ZeRO's
# terms, stage 3; stage 1 shards only the optimizer state, stage 2 also the gradients). The
# model's FSDP2 peak adds back the gathered root (4,224 elements) and two blocks (12,704
# elements each: one in backward, one prefetched), 118,528 bytes, which on this two-block
# model is all of it. Now the allocator, beside the model:

# %%
MODEL = {"DDP": "DDP", "DDP-view": "DDP", "FSDP2": "FSDP2"}  # the model's row for each set-up


def near(a, b, tol=KIB):
    return abs(a - b) <= tol


low = {name: tuple(min(measured[r][name][i] for r in measured) for i in (0, 1)) for name in MODEL}
for name, (live, peak) in low.items():  # bytes: the smaller of the two ranks' counts
    model = rows[0][MODEL[name]]
    print(f"{name:8} model: steady {model[3]:>6}, peak {model[4]:>6} | allocator: live {live}, peak {peak}")
print(next(x for x in section(run, "memory")[0] if "DDP buckets" in x))
model, grads = rows[0], rows[0]["DDP"][1]
print(f"DDP live = model + one more copy of the gradients ({grads}), within 1 KiB: "
      f"{near(low['DDP'][0], model['DDP'][3] + grads)}")
print(f"DDP-view live = model, within 1 KiB: {near(low['DDP-view'][0], model['DDP'][3])}")
fsdp_live = low["FSDP2"][0]  # unseen frees only add: a floor at the model, a ceiling at DDP's
print(f"FSDP2 live at least the model's (1 KiB slack) and below DDP-view's: "
      f"{fsdp_live >= model['FSDP2'][3] - KIB and fsdp_live < low['DDP-view'][0]}")
print(f"every peak above its live bytes by more than 1 KiB: {all(p - v > KIB for v, p in low.values())}")
print(f"FSDP2 peak above the model's peak: {low['FSDP2'][1] > model['FSDP2'][4]}; "
      f"below DDP-view's live bytes: {low['FSDP2'][1] < low['DDP-view'][0]}")

# %% [markdown]
# Output:
# ```text
# DDP      model: steady 474112, peak 474112 | allocator: live «number», peak «number»
# DDP-view model: steady 474112, peak 474112 | allocator: live «number», peak «number»
# FSDP2    model: steady 237056, peak 355584 | allocator: live «number», peak «number»
# rank 0: DDP buckets: sizes 118528 bytes, cap 26214400 bytes
# DDP live = model + one more copy of the gradients (118528), within 1 KiB: True
# DDP-view live = model, within 1 KiB: True
# FSDP2 live at least the model's (1 KiB slack) and below DDP-view's: True
# every peak above its live bytes by more than 1 KiB: True
# FSDP2 peak above the model's peak: True; below DDP-view's live bytes: True
# ```
#
# Each count is the smaller of the two ranks'. Three things the model missed:
#
# - **DDP's buckets.** DDP does not all-reduce each gradient separately: its reducer copies
#   them into flat *buckets* (capped at 25 MiB by default: one bucket of 118,528 bytes
#   here, the fp32 gradients, as the reducer's own record above says), all-reduces a bucket
#   when it is full, and copies the averages back into `.grad`. The bucket is a second copy
#   of every gradient, kept from step to step: DDP's live bytes are the model's plus that copy
#   (within 1 KiB). With `gradient_as_bucket_view=True` each `.grad` *is* a view into the bucket,
#   and the copy disappears: the model's number again, plus AdamW's 29 step counters (4
#   bytes each) and a little bookkeeping.
# - **DDP has a peak.** "DDP never gathers" is true of parameters, not of memory: forward
#   stores activations for backward, and backward allocates temporaries, so the peak sits
#   above the steady state during every step.
# - **FSDP2's peak** is above the model's: the model counted gathered and prefetched
#   parameters, but in backward a unit also holds its *unsharded* gradients (a block's are
#   50,816 bytes in fp32) until they are reduce-scattered, beside the activations. Even so, on
#   2 ranks FSDP2's peak stays below what DDP keeps between steps, even with a bucket view.
#
# The same accounting by formula for a large model trained with FSDP2's bf16
# `MixedPrecisionPolicy` (section 3). What stays from one step to the next is all fp32: the
# sharded parameter (4 bytes), its gradient (4: section 3 printed `grad torch.float32`) and
# AdamW's two moments (8), 16 bytes per parameter. The bf16 copies are transient: a unit's
# bf16 parameters exist while it is gathered, its bf16 gradients until they are
# reduce-scattered. (The classic ZeRO count, bf16 parameter 2 + bf16 gradient 2 + fp32
# master 4 + moments 8, is also 16: it describes a trainer that keeps bf16 working weights
# all the time.) DDP keeps all 16 on every GPU, 20 with its bucket's copy of the fp32
# gradients unless `gradient_as_bucket_view=True` (above); FSDP2 keeps 16 / N per GPU, plus
# what is gathered at the moment.
#
# **Predict.** An 8B-parameter model on 8 GPUs of 80 GB: does it fit with DDP? With FSDP2?
# And what does FSDP2's peak add, given section 1 (the root unit stays gathered through the
# whole forward)?

# %%
GB = 1e9


def per_gpu_bytes(n_params, world, sharded, bytes_per_param=16):
    """Steady-state training state per GPU, mixed-precision Adam (no activations)."""
    return n_params * bytes_per_param / (world if sharded else 1)


big, world, blocks = 8e9, 8, 32
vocab, width = 128_256, 4096  # a Llama-3-8B-like model (untied embedding and head)
root = 2 * vocab * width  # the root unit's parameters: embedding and head (norms aside)
block = (big - root) / blocks  # one transformer block
print(f"DDP:   {per_gpu_bytes(big, world, False) / GB:.0f} GB per GPU")
print(f"FSDP2: {per_gpu_bytes(big, world, True) / GB:.0f} GB per GPU")
print(f"root unit (embedding + head): {root / 1e9:.2f}B parameters, {root * 2 / GB:.1f} GB in bf16")
print(f"one block: {block / 1e9:.2f}B parameters, {block * 2 / GB:.1f} GB in bf16")
print(f"FSDP2 peak adds the gathered root and two blocks (in backward, prefetched): {(root + 2 * block) * 2 / GB:.1f} GB")

# %% [markdown]
# Output:
# ```text
# DDP:   128 GB per GPU
# FSDP2: 16 GB per GPU
# root unit (embedding + head): 1.05B parameters, 2.1 GB in bf16
# one block: 0.22B parameters, 0.4 GB in bf16
# FSDP2 peak adds the gathered root and two blocks (in backward, prefetched): 3.0 GB
# ```
#
# 128 GB does not fit on an 80 GB GPU before a single activation is stored: DDP cannot
# train this model at all. Sharded over 8 GPUs the same state is 16 GB per GPU. The peak
# adds what is gathered, and with the default `reshard_after_forward=None` that is the root
# unit for the whole step (section 1), the block being computed and, in backward, the next
# one prefetched. With a large vocabulary the root is not small: the embedding and the head
# of this model are 13 % of its parameters, 2.1 GB in bf16, nearly five times one block.
# That is why large models
# often make the embedding and the head units of their own (`fully_shard(model.embed)`,
# `fully_shard(model.head)`), so that they too are freed after use. Either way most of the
# GPU is left for activations. On 2 GPUs the worker's `main` part with `--backend nccl`
# prints the peak CUDA memory of one step beside this formula (unverified on a GPU).

# %% [markdown]
# The figure puts both measurements side by side: each rank's bytes under DDP and FSDP2,
# and the residency trace of section 1 (the `None` setting) through one step.

# %%
TRACE = re.compile(r"rank 0: trace (.+?) +\| ([fs](?: [fs]){3}) \| +(\d+) bytes")


def trace_events(run):
    """[(label, [True if full, per module], param bytes)] from rank 0's trace lines."""
    found = filter(None, map(TRACE.fullmatch, section(run, "reshard")[0]))
    return [(m[1], [s == "f" for s in m[2].split()], int(m[3])) for m in found]


def plot_memory(ax, rows):
    width = 0.2
    for i, (rank, name) in enumerate((r, n) for r in sorted(rows) for n in ("DDP", "FSDP2")):
        xs = [c + (i - 1.5) * width for c in range(len(COLUMNS))]
        ax.bar(xs, [v / 1024 for v in rows[rank][name]], width, label=f"rank {rank} {name}",
               color="tab:blue" if name == "DDP" else "tab:orange", alpha=1.0 - 0.4 * rank)
    ax.set_xticks(range(len(COLUMNS)), COLUMNS)
    ax.set_ylabel("KiB per rank")
    ax.set_title("Bytes per rank after one AdamW step (fp32)")
    ax.legend(fontsize=8)


def plot_residency(ax, events):
    grid = torch.tensor([full for _, full, _ in events], dtype=torch.float32).T  # (modules, events)
    ax.imshow(grid.numpy(), cmap="Greens", vmin=-0.3, vmax=1.2, aspect="auto")
    ax.set_yticks(range(len(NAMES)), NAMES)
    ax.set_xticks(range(len(events)), [label for label, _, _ in events], rotation=60, ha="right")
    ax.set_title("Parameters over one step, reshard_after_forward=None\n(dark: gathered, light: sharded)")


def plot_step(rows, events):
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    plot_memory(left, rows)
    plot_residency(right, events)
    fig.tight_layout()
    return fig


events = trace_events(run)
fig = plot_step(rows, events)
fig.savefig(HERE / "fsdp2_step.png")

# %% [markdown]
# On the left, the orange bars (FSDP2) are half the blue ones (DDP) in every column but
# the peak; the two ranks' bars are equal. On the right, read each column as a moment of the
# step: the root unit (embed and head rows) is gathered from the first forward to the
# backward of the embedding, the blocks only while they compute, once in forward and once
# in backward; after backward every row is sharded. At `bwd blocks.1` the blocks.0 row is
# still light although its buffer is already gathered (prefetched, and counted in section
# 1's bytes): a row shows what a module computes with, not every byte the rank holds.

# %% [markdown]
# ## 5. Gradient accumulation without communication
#
# With several micro-batches per optimizer step, reducing the gradients after each one
# wastes communication. `model.set_requires_gradient_sync(False)` makes backward keep
# the gathered, unreduced gradients and skip the reduce-scatter; set it back to True for
# the last micro-batch, whose backward reduce-scatters the accumulated sum. (FSDP2's
# counterpart of DDP's `no_sync()`, lesson 11a; the price is that the unsharded gradients
# stay in memory between micro-batches.)
#
# **Predict.** Is the result the manual data-parallel accumulation: for each micro-batch, the
# average of the ranks' gradients, summed over micro-batches?

# %%
#@worker
def accumulated_reference(tokens, device):
    """One process: 2 micro-batches, each the average of the 2 ranks' mean losses."""
    ref = make_model(torch.float64, device)
    for micro in tokens.view(2, 2, B // 2, T + 1).transpose(0, 1):  # micro m: (2 ranks, B/2, T+1)
        (sum(loss_fn(ref, m) for m in micro) / 2).backward()  # grads accumulate in .grad
    return ref


def show_no_sync(mesh, device):
    heading("no_sync")
    tokens, mine = batch(device)
    ref = accumulated_reference(tokens, device)
    model = shard(make_model(torch.float64, device), mesh=mesh)
    model.set_requires_gradient_sync(False)  # micro-batch 1: keep unsharded grads, no reduce
    loss_fn(model, mine[: B // 2]).backward()
    model.set_requires_gradient_sync(True)  # micro-batch 2: reduce-scatter the accumulated sum
    loss_fn(model, mine[B // 2:]).backward()
    shared(f"set_requires_gradient_sync(False) accumulation vs manual: max grad gap "
           f"{below(grad_gap(model, ref), 1e-15)}")


# %%
show(run, "no_sync")

# %% [markdown]
# Output:
# ```text
# rank 0: set_requires_gradient_sync(False) accumulation vs manual: max grad gap «number», below 1e-15: True
# ```
#
# Equal to rounding: summing locally first and averaging once gives the same gradient as
# averaging each micro-batch, because both are linear.

# %% [markdown]
# ## 6. CPU offload
#
# `fully_shard(..., offload_policy=CPUOffloadPolicy())` keeps the shards, their gradients
# and the optimizer step on the CPU, and copies each unit to the GPU only to gather it. On a
# GPU machine that trades PCIe traffic for GPU memory. Its `pin_memory` option (default
# `True`) allocates page-locked host memory, which needs an accelerator.
#
# **Predict.** Without an accelerator, does offloading work? With the default
# `pin_memory=True`?

# %%
#@worker
def show_offload(mesh, device):
    heading("offload")
    tokens, mine = batch(device)
    ref = make_model(torch.float64, device)
    adamw_step(ref, tokens)
    model = shard(make_model(torch.float64, device), mesh=mesh,
                  offload_policy=CPUOffloadPolicy(pin_memory=False))
    adamw_step(model, mine)
    w = model.head.weight.to_local()
    shared(f"CPUOffloadPolicy(pin_memory=False): shards on {w.device.type}, "
           f"step gap {below(max_gap(model, ref), 1e-12)}")
    try:
        shard(make_model(torch.float64, device), mesh=mesh, offload_policy=CPUOffloadPolicy())
        shared("CPUOffloadPolicy() (pin_memory=True): no error")
    except Exception as err:  # noqa: BLE001 - the error depends on the build of torch: the failing call does not
        where = traceback.extract_tb(err.__traceback__)[-1].line
        shared(f"CPUOffloadPolicy() (pin_memory=True): {type(err).__name__} raised by `{where}`")
        shared(f"an accelerator to pin memory for: {torch.accelerator.is_available()}")


def pinned_part(device):
    """The default CPUOffloadPolicy without an accelerator, uncaught: the launch fails."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    shard(make_model(torch.float32, device), mesh=mesh, offload_policy=CPUOffloadPolicy())
    say("sharded with pinned CPU offload")
    return 0


# %%
show(run, "offload")
print(f"launch exit code {run.code}; ranks whose stderr has a traceback: {sum('Traceback' in e for e in run.err.values())}")

# %% [markdown]
# Output:
# ```text
# rank 0: CPUOffloadPolicy(pin_memory=False): shards on cpu, step gap «number», below 1e-12: True
# rank 0: CPUOffloadPolicy() (pin_memory=True): RuntimeError raised by `padded_sharded_param = padded_sharded_param.pin_memory()`
# rank 0: an accelerator to pin memory for: False
# launch exit code 0; ranks whose stderr has a traceback: 0
# ```
#
# With `pin_memory=False` the policy works on the CPU and the step still equals one
# process: the shards simply live where they already were. With the default
# `pin_memory=True`, `fully_shard` itself fails in 2.13.0, in FSDP2's own call to
# `Tensor.pin_memory()` on each shard: page-locked memory is allocated through an
# accelerator's runtime, and `torch.accelerator.is_available()` is False for these ranks.
# The message depends on the build of torch, which is why the lesson prints the failing call
# instead: the CPU build says "Cannot access accelerator device when none is available.", the
# CUDA build "Found no NVIDIA driver on your system ..." (unverified). Without an accelerator,
# pass `pin_memory=False` (or no offload policy: there is nowhere to offload to). The launch
# hides any GPU from the ranks (`CUDA_VISIBLE_DEVICES=` empty), so this section reads the same
# on every machine; with a GPU visible, pinned memory can be allocated and the default policy
# is expected to work (unverified on a GPU).

# %% [markdown]
# ## Summary
#
# - `reshard_after_forward`: True frees every unit after its forward (one more all-gather in
#   backward), False keeps all units full until backward (no second all-gather), None
#   (default) frees all but the root. Backward prefetches the next unit's all-gather, so on
#   this two-block model all three peak at 177,792 parameter bytes per rank; with the
#   prefetch off True and None peak at 126,976. With many blocks None's peak holds the root
#   and two blocks, False's every block.
# - An integer is a group size to reshard to: on 2 ranks `1` is False, `2` is True, `3`
#   raises; on 4 ranks `2` keeps half of every parameter between forward and backward (a
#   (2, 2) mesh, `Replicate()` across groups, `Shard(0)` within), a quarter at rest. This
#   process played rank 0 of those 4 in a fake process group: the real run's lines exactly,
#   but its collectives move no data (an all-reduce of ones leaves 1.0), so shapes and
#   bytes per rank are true, values and timings are not.
# - `MixedPrecisionPolicy(bf16, fp32)`: bf16 weights, activations and gathers; fp32 sharded
#   master parameters and gradients.
# - Per rank, FSDP2 halves parameters, gradients and AdamW state on 2 ranks; its peak adds
#   the gathered units, a unit's unsharded gradients and the activations. DDP keeps a second
#   copy of the gradients in its buckets unless `gradient_as_bucket_view=True`, and its peak
#   is above its steady state too. For 8B parameters on 8 GPUs: 128 GB per GPU with DDP, 16 GB
#   with FSDP2 (all fp32 between steps, bf16 policy or not), plus the gathered root
#   (embedding and head: 2.1 GB in bf16 for a 128k vocabulary) and two blocks (the one in
#   backward and the prefetched one).
# - `set_requires_gradient_sync(False)` accumulation is exact.
# - `CPUOffloadPolicy` needs `pin_memory=False` without an accelerator.

# %% [markdown]
# ## Going further
#
# ### What the allocator's counts can miss
#
# The profiler records only the threads it watches. A buffer handed to a collective is
# sometimes freed last by one of gloo's own threads, more often on a loaded machine; that
# free goes unseen and the sum comes out high, never low, which is why section 4's code
# keeps the smallest count it finds. FSDP2 hands gloo more buffers than DDP does, and one
# of them, such as the 50,816-byte buffer a block's gradients are reduce-scattered from, may
# still be counted as live however often it is measured: for FSDP2 section 4 therefore
# compares only with a floor, the model's bytes, and a ceiling, DDP's.
#
# ### A launch that fails cleanly
#
# The worker's `pinned` part lets section 6's error escape:
# `torchrun --standalone --nproc-per-node=2 lessons/11b_fsdp2_memory/worker.py pinned`. A
# rank whose part raised prints its traceback, skips the teardown's barrier (the other rank
# could be in any collective), destroys its process group and exits with code 1; torchrun,
# seeing a failure, stops the other rank with SIGTERM (exit -15) unless it has already
# failed the same way. The launch ends in seconds, not at the group's timeout.
#
# ### Peak CUDA memory on 2 GPUs
#
# With `--backend nccl` the `main` part ends with this function instead of section 6's
# (unverified on a GPU): the peak CUDA memory of one FSDP2 step above the sharded
# parameters, beside the formula of section 4 (sharded gradients and AdamW's moments, plus
# the gathered root and one block).

# %%
#@worker
def show_cuda_memory(mesh, device):
    """NCCL only: the peak CUDA memory of one FSDP2 step vs the steady-state formula."""
    _, mine = batch(device)
    model = shard(make_model(torch.float32, device), mesh=mesh)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    adamw_step(model, mine)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(device) - base
    state = 4 * 3 * sum(p.to_local().numel() for p in model.parameters())  # fp32 grads, 2 moments
    units = sum(p.numel() for p in model.parameters())  # the root, a block and the prefetched one
    say(f"peak above the sharded params {peak} bytes; formula: grads + AdamW {state} bytes, "
        f"+ root and two blocks gathered {state + 4 * units} bytes")


# %% [markdown]
# ## References
#
# - [`torch.distributed.fsdp.fully_shard`](https://docs.pytorch.org/docs/2.13/distributed.fsdp.fully_shard.html):
#   `reshard_after_forward` (bool or int), `MixedPrecisionPolicy`, `CPUOffloadPolicy` and
#   `FSDPModule.set_requires_gradient_sync` (sections 1 to 6).
# - [`torch.nn.parallel.DistributedDataParallel`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.parallel.DistributedDataParallel.html):
#   `bucket_cap_mb` and `gradient_as_bucket_view`, the buckets of section 4.
# - [`torch.profiler`](https://docs.pytorch.org/docs/2.13/profiler.html): `profile_memory=True`
#   and `record_function`, the allocator's counts of section 4.
# - [`torch.distributed`](https://docs.pytorch.org/docs/2.13/distributed.html):
#   `init_process_group` and the collectives of the fake group in section 2.
# - Rajbhandari et al., [ZeRO: Memory Optimizations Toward Training Trillion Parameter Models](https://arxiv.org/abs/1910.02054)
#   (2019): the 16 bytes per parameter of mixed-precision Adam, and stages 1 to 3.
# - Micikevicius et al., [Mixed Precision Training](https://arxiv.org/abs/1710.03740) (2017):
#   low-precision compute with fp32 master weights (section 3).

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each stop prints a file of the torch you installed, relative
# to its site-packages folder, and the line where to start reading (the numbers are your
# build's, hence `«line»` below). The stops follow this part: the decision to free a unit
# after its forward, the integer's group, the casts of mixed precision, DDP's buckets, and
# the pinned copy of CPU offload.

# %%
from sourcemap import read_the_source  # noqa: E402  (lessons/ is on sys.path: first cell)

read_the_source([
    ("torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "def reshard(self):",
     "Called after each unit's forward (`post_forward`): it returns at once, leaving the "
     "gathered parameters on the module, when `_reshard_after_forward` is False (no "
     "`post_forward_mesh_info`: `False`, or the root under `None`, which `_lazy_init` in "
     "`_fsdp_state.py` set), reshards to the smaller group for an int, and otherwise "
     "`_to_sharded` swaps the DTensor shards back and frees the gathered copy. "
     "`post_backward` below returns before any reduce-scatter when `reduce_grads` is False, "
     "which is what `set_requires_gradient_sync(False)` sets."),
    ("torch/distributed/fsdp/_fully_shard/_fsdp_init.py", "def _get_post_forward_mesh_info(",
     "An int `reshard_after_forward`: it must divide the shard group's size (section 2's "
     "`ValueError`), `1` becomes False (with the logged warning), the world size True, and "
     "any other value a mesh of shape (world / k, k) whose rows are the groups."),
    ("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "def foreach_all_gather(",
     "One all-gather per unit, of the shards cast to `param_dtype` when the policy sets one "
     "(section 3). `foreach_reduce` further down copies the unsharded gradients into one "
     "flat buffer of `reduce_dtype` and reduce-scatters it: the 50,816-byte buffer of a "
     "block that section 4's allocator sees."),
    ("torch/nn/parallel/distributed.py", "def _ddp_init_helper(",
     "DDP's gradients go through the C++ `dist.Reducer` built here, with the parameters "
     "assigned to buckets by size (`_DEFAULT_BUCKET_CAP_MB = 25` at the top of the file) and "
     "`gradient_as_bucket_view` handed to it: the switch that removed section 4's second copy "
     "of the gradients."),
    ("torch/distributed/fsdp/_fully_shard/_fsdp_param.py", "def _init_sharded_param(",
     "One parameter becomes its shard; under `offload_to_cpu` with `pin_memory`, the padded "
     "shard's `pin_memory()` call is the one that failed in section 6."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py:«line»  `def reshard(self):`
#     Called after each unit's forward (`post_forward`): it returns at once, leaving the
#     gathered parameters on the module, when `_reshard_after_forward` is False (no
#     `post_forward_mesh_info`: `False`, or the root under `None`, which `_lazy_init` in
#     `_fsdp_state.py` set), reshards to the smaller group for an int, and otherwise
#     `_to_sharded` swaps the DTensor shards back and frees the gathered copy.
#     `post_backward` below returns before any reduce-scatter when `reduce_grads` is
#     False, which is what `set_requires_gradient_sync(False)` sets.
# torch/distributed/fsdp/_fully_shard/_fsdp_init.py:«line»  `def _get_post_forward_mesh_info(`
#     An int `reshard_after_forward`: it must divide the shard group's size (section 2's
#     `ValueError`), `1` becomes False (with the logged warning), the world size True, and
#     any other value a mesh of shape (world / k, k) whose rows are the groups.
# torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:«line»  `def foreach_all_gather(`
#     One all-gather per unit, of the shards cast to `param_dtype` when the policy sets
#     one (section 3). `foreach_reduce` further down copies the unsharded gradients into
#     one flat buffer of `reduce_dtype` and reduce-scatters it: the 50,816-byte buffer of
#     a block that section 4's allocator sees.
# torch/nn/parallel/distributed.py:«line»  `def _ddp_init_helper(`
#     DDP's gradients go through the C++ `dist.Reducer` built here, with the parameters
#     assigned to buckets by size (`_DEFAULT_BUCKET_CAP_MB = 25` at the top of the file)
#     and `gradient_as_bucket_view` handed to it: the switch that removed section 4's
#     second copy of the gradients.
# torch/distributed/fsdp/_fully_shard/_fsdp_param.py:«line»  `def _init_sharded_param(`
#     One parameter becomes its shard; under `offload_to_cpu` with `pin_memory`, the
#     padded shard's `pin_memory()` call is the one that failed in section 6.
# ```

# %% [markdown]
# ## Mastery check
#
# Answer each before you open it; every answer points to the section whose printed lines
# show it.
#
# 1. **Explain.** What does FSDP2 keep resident on each rank, and when does it gather? Take
#    this lesson's model on 2 ranks with the default `reshard_after_forward=None`: what does
#    a rank hold at rest, during block 0's forward, and after backward?
#
#    <details><summary>Answer</summary>
#
#    At rest only shards: 59,264 bytes of fp32 parameters per rank. A unit is gathered just
#    before it computes: the root unit (embedding, final norm and head) stays gathered from
#    the first forward until the embedding's backward, and each block only while it
#    computes, once in forward and once more in backward, where its all-gather is issued
#    early, when the unit after it starts its backward (the prefetch). During block 0's
#    forward the trace shows `f f s f` (root and block 0 gathered, 126,976 parameter bytes);
#    during block 1's backward 177,792, block 0's buffer included; after backward `s s s s`,
#    the 59,264 bytes of the shards alone
#    (*§ `reshard_after_forward`: memory or a second all-gather*).
#
#    </details>
#
# 2. **Predict.** A colleague checks a 4-rank sharding plan in one process on a fake group,
#    and also prints the loss after an all-reduce. Which of the printed lines can be trusted?
#
#    <details><summary>Answer</summary>
#
#    The shapes, placements and counts: `reshard_after_forward=2` on 4 ranks gave 7,408,
#    14,816 and 7,408 elements and a (2, 2) mesh, the lines a real 4-rank launch prints. Not
#    the loss: a fake all-reduce of ones leaves 1.0 instead of 4.0, since no data moves
#    (*§ An integer `reshard_after_forward`, and a fake group of 4 ranks*).
#
#    </details>
#
# 3. **Predict.** With `MixedPrecisionPolicy(param_dtype=torch.bfloat16,
#    reduce_dtype=torch.float32)`, what dtype are the weights a block computes with, and
#    what dtype are the parameter and the gradient the optimizer updates?
#
#    <details><summary>Answer</summary>
#
#    Inside the block the gathered weight, its input and its output are all bf16, the
#    logits too. At rest the parameter is the fp32 DTensor shard and its gradient is fp32:
#    AdamW updates fp32 master weights
#    (*§ Mixed precision: bf16 compute, fp32 master weights*).
#
#    </details>
#
# 4. **Explain.** On 2 ranks, which of a rank's bytes does FSDP2 halve compared with DDP,
#    and why does plain DDP hold more than its parameters, gradients and AdamW state?
#
#    <details><summary>Answer</summary>
#
#    All three are halved: 59,264 bytes of parameters, 59,264 of gradients and 118,528 of
#    AdamW state per rank, against 118,528, 118,528 and 237,056 with DDP. DDP's allocator
#    count is the model plus one more copy of the gradients (118,528 bytes, within 1 KiB):
#    its reducer's bucket, still live after the step. With `gradient_as_bucket_view=True`
#    each gradient is a view into the bucket and the live bytes equal the model's, within
#    1 KiB (*§ Memory per rank: a model from the tensors, then the allocator*).
#
#    </details>
#
# 5. **Transfer.** The same root unit and blocks, but 4 blocks, on 4 ranks, fp32, with the
#    default `reshard_after_forward=None` and backward prefetch: how many parameter bytes
#    does a rank hold at the peak? And with `False`?
#
#    <details><summary>Answer</summary>
#
#    Section 1's peak is the shards, the root, the block in backward and the prefetched one.
#    The model has 4,224 + 4 × 12,704 = 55,040 elements, so a rank's shards are 13,760; at
#    the peak it also holds 4,224 + 2 × 12,704 = 29,632 gathered: 43,392 elements, 173,568
#    bytes. `False` holds every unit from the last block's forward on: 13,760 + 55,040
#    elements, 275,200 bytes (*§ `reshard_after_forward`: memory or a second all-gather*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder (check with `make exercises N=11b`; `solutions.py` has
# one way):
#
# 1. `peak_param_bytes(root, blocks, world, elem, reshard)`: a rank's parameter bytes at the
#    peak of one step with FSDP2's default backward prefetch, for `reshard_after_forward`
#    None and False. The tests compare it with the peaks the ranks printed in section 1.
# 2. `max_params(gpu_bytes, world, bytes_per_param)`: the largest model whose sharded
#    training state fits on each GPU.
#
# These change the worker's cells and run it with
# `torchrun --standalone --nproc-per-node=2 lessons/11b_fsdp2_memory/worker.py main`
# (regenerate `worker.py` from the cells with `make notebooks`, or edit a copy of it):
#
# A. Apply `fully_shard` to the root only (no blocks). How many units, and what does the
#    trace show? What happens to the peak?
# B. Give `MixedPrecisionPolicy` `output_dtype=torch.float32` and check the logits' dtype.

# %% [markdown]
# # 11a · FSDP2: shard the model, not just the batch
#
# Data parallelism (DDP) gives every rank a full copy of the model and averages the
# gradients. It scales the batch, not the model: each rank still stores every parameter,
# every gradient and the whole optimizer state. Fully sharded data parallelism (FSDP) keeps
# only a slice of each on every rank and gathers a layer's parameters just before the layer
# runs. PyTorch's current version, FSDP2, is the function `fully_shard`, built on the
# DTensors of lesson 09. This lesson, the first of two parts, runs both on two CPU ranks, on
# the same small transformer-like model, and checks every claim against one process: what a
# rank holds, that a sharded step is the one-process step, and how FSDP2's hooks make that
# happen. Part 11b follows what a rank holds through the step: `reshard_after_forward`, mixed
# precision, memory per rank, gradient accumulation and CPU offload.
#
# **What you will learn**
#
# - DDP as the baseline: one step on 2 ranks equals one process; `no_sync` accumulation;
# - `fully_shard` applied bottom-up, the optimizer made after it; parameters at rest are
#   DTensors `Shard(0)`, and each rank holds half the elements; one AdamW step equals one
#   process (float64: below 1e-12), why Adam amplifies the gradients' rounding in both
#   dtypes, and why a step check alone misses a classic bug;
# - `shard_placement_fn`, and which shards may be uneven: `Shard(0)` may, `Shard(1)` may not;
# - FSDP2's lazy initialisation at the first call, and why the hooks live on `__call__`:
#   what `model.forward(x)` does (an error, or silently lost gradients), and the two fixes,
#   `unshard()` after a first call and `register_fsdp_forward_method`.
#
# **Prerequisites:** lesson 09 (collectives, DeviceMesh, DTensor placements), lesson 03b
# (autograd hooks).
#
# **How to run:** `python lessons/11a_fsdp2_sharding/fsdp2_sharding.py` or `make lesson N=11a`
# from the repository root, or open `fsdp2_sharding.ipynb`. It launches `worker.py` once on
# 2 ranks (on the CPU, gloo backend; the first line §1 prints says how long it took)
# through the course's multi-rank kit, `lessons/multirank.py` (lesson 09 explains it);
# every section below reads that launch's output. The code the ranks run is in this lesson: each cell that starts with `#@worker`
# only defines functions, and `worker.py` is written from those cells. Run the worker
# yourself: `torchrun --standalone --nproc-per-node=2 lessons/11a_fsdp2_sharding/worker.py
# main` (add `--backend nccl` on a machine with 2 GPUs). Each printing cell is followed by an
# *Output* block: what it printed with the pinned PyTorch (2.13.0). Editing a `#@worker` cell
# changes nothing until `worker.py` is written again from the cells (*Exercises* says how);
# to try a variation, copy `worker.py` within this folder and run the copy with `torchrun`.
# Run by hand, that torchrun command may also print PyTorch profiler lines
# (`USDT: ... profiler_start` / `profiler_stop`) to stderr: harmless (`KINETO_LOG_LEVEL=6`
# silences them).

# %%
import sys
from pathlib import Path

# lessons/ on the path, for the multi-rank kit (lesson 09) and the source map; a notebook
# runs in the lesson's folder and has no __file__
sys.path.insert(0, str((Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()).parent))


# %% [markdown]
# ## 1. The model, and DDP as the baseline
#
# The ranks' code starts with its imports and the model: `Tiny`, an embedding (64 tokens ×
# 32), two pre-norm transformer blocks (causal self-attention and an MLP), a final LayerNorm
# and a linear head back to 64 logits: 29,632 parameters. Every model is built after
# `torch.manual_seed(0)`, so every rank and every single-process reference starts from the
# same weights. The global batch is 8 sequences of 9 tokens; rank r trains on sequences 4r
# to 4r+3, and the reference on all 8 at once (next-token cross-entropy, a mean).

# %%
#@worker
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, Shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

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

    def encode(self, tokens):  # (B, T) -> (B, T, D)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, tokens):  # (B, T) -> (B*T, V)
        # a 2-D input to the head: a 3-D one returns a view, and FSDP2 warns that an in-place
        # op on a view output would skip its pre-backward hook
        return self.head(self.encode(tokens).flatten(0, 1))


def make_model(dtype, device):
    torch.manual_seed(0)  # the same initial weights on every rank and in the reference
    return Tiny().to(device=device, dtype=dtype)


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


# %%
from multirank import launch, show  # noqa: E402  (the kit's parent side: the lesson's launches)

torch.manual_seed(0)
torch.set_num_threads(1)  # the ranks get one thread each too (OMP_NUM_THREADS=1): 2 cores
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
WORKER = HERE / "worker.py"
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}  # the ranks compute on the CPU on every machine


# %% [markdown]
# Every comparison with one process goes through a few small helpers: `full` turns a
# sharded DTensor back into the whole tensor (`full_tensor()` all-gathers it), and `below`
# prints a rounding-level gap as its comparison with a bound, since its digits depend on
# the CPU (its vector instructions group the additions differently).

# %%
#@worker
def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def below(value, bound):
    return f"{value:.1e}, below {bound:.0e}: {value < bound}"


def max_gap(model, ref):
    """Largest |difference| between a (possibly sharded) model's parameters and ref's."""
    pairs = zip(model.parameters(), ref.parameters())
    return max((full(p).detach().cpu() - q.detach().cpu()).abs().max().item() for p, q in pairs)


def grad_gap(model, ref):
    pairs = zip(model.parameters(), ref.parameters())
    return max((full(p.grad).cpu() - q.grad.cpu()).abs().max().item() for p, q in pairs)


def accumulated_reference(tokens, device):
    """One process: 2 micro-batches, each the average of the 2 ranks' mean losses."""
    ref = make_model(torch.float64, device)
    for micro in tokens.view(2, 2, B // 2, T + 1).transpose(0, 1):  # micro m: (2 ranks, B/2, T+1)
        (sum(loss_fn(ref, m) for m in micro) / 2).backward()  # grads accumulate in .grad
    return ref


# %% [markdown]
# One function runs every section's rank code in turn, and `main` hands it to the kit's
# `serve`, which joins the process group torchrun set up, runs the part named on the command
# line (`main`) and ends the rank cleanly whatever happens (lesson 09 shows how). The
# functions it calls are defined in the sections below, each just before the output it
# explains; the first, `show_ddp`, comes next.

# %%
#@worker
def main_part(device):
    show_ddp(device)
    show_ddp_knobs(device)  # Going further, after the Summary
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    show_placements(mesh, device)
    show_step(mesh, device)
    show_placement_fn(mesh, device)
    show_uneven(mesh, device)
    show_lazy_init(mesh, device)
    show_hooks(mesh, device)
    return 0


def main():
    serve({"main": main_part})


# %% [markdown]
# `DistributedDataParallel` wraps the model on each rank: it broadcasts rank 0's weights at
# construction, and during backward it all-reduces (averages) the gradients, bucket by
# bucket, while backward is still running (this model's gradients fit in one bucket: one
# all-reduce per backward, as *Going further* counts). `no_sync()` skips that all-reduce:
# gradients accumulate locally, and the next backward outside `no_sync` all-reduces the sum.
#
# **Predict.** Each rank computes the mean loss over *its* 4 sequences. Is the average of
# the two ranks' gradients the gradient of the mean loss over all 8? Then is one AdamW step
# equal to the single-process step, and to what precision in float64?

# %%
#@worker
def show_ddp(device):
    heading("ddp")
    tokens, mine = batch(device)
    ref = make_model(torch.float64, device)
    adamw_step(ref, tokens)  # one process, the whole batch
    ddp = DDP(make_model(torch.float64, device))
    n = sum(p.numel() for p in ddp.parameters())
    say(f"holds all {n} parameters, grads all-reduced (averaged) in backward")
    adamw_step(ddp, mine)  # each rank: its half of the batch
    shared(f"one AdamW step vs one process on the whole batch: max gap {below(max_gap(ddp.module, ref), 1e-12)}")
    acc = DDP(make_model(torch.float64, device))
    with acc.no_sync():  # micro-batch 1: no all-reduce, grads only accumulate locally
        loss_fn(acc, mine[: B // 2]).backward()
    loss_fn(acc, mine[B // 2:]).backward()  # micro-batch 2: all-reduce the accumulated sum
    gap = grad_gap(acc.module, accumulated_reference(tokens, device))
    shared(f"no_sync accumulation vs manual accumulation: max grad gap {below(gap, 1e-15)}")


# %%
run = launch(WORKER, ["main"], env=CPU_ONLY)
print(f"torchrun exit code {run.code} after {run.seconds:.1f} s, output from ranks {sorted(run.out)}")
show(run, "ddp")

# %% [markdown]
# Output:
# ```text
# torchrun exit code 0 after «time» s, output from ranks [0, 1]
# rank 0: holds all 29632 parameters, grads all-reduced (averaged) in backward
# rank 0: one AdamW step vs one process on the whole batch: max gap «number», below 1e-12: True
# rank 0: no_sync accumulation vs manual accumulation: max grad gap «number», below 1e-15: True
# rank 1: holds all 29632 parameters, grads all-reduced (averaged) in backward
# ```
#
# Yes: with equal-sized halves, the mean of the two half-batch means is the full-batch
# mean, and the gradient is linear, so the averaged gradient is the full-batch gradient up
# to rounding: the sums are just done in a different order. Two micro-batches of 2
# sequences per rank, the first under `no_sync()`, give the gradient that one process gets
# by adding the two micro-batches' gradients (each the average of the ranks' means):
# accumulation and the all-reduce commute. (The step's gap, below 1e-12, is larger than the
# gradients' rounding: section 3 shows why.) The cost is in the second line: every rank
# holds all 29,632 parameters, their gradients and AdamW's two moments for each. The
# launch's seconds, on the first line, vary with the load on the machine. (DDP's own
# options, for models whose forward skips a layer and for compressing its all-reduce, are
# in *Going further*.)

# %% [markdown]
# ## 2. `fully_shard`: parameters become DTensor shards
#
# FSDP2 is applied module by module, **bottom-up**: `fully_shard(block)` for each block,
# then `fully_shard(model)` for the root. Each call makes one *unit*: the parameters of that
# module not already in a unit below it, gathered together with one all-gather. Here there
# are three units: block 0, block 1, and the root (embedding, final norm, head). Sharding
# only the root would make one unit of everything, gathered all at once: the peak would hold
# the whole model (part 11b, exercise A).
#
# `fully_shard` replaces each parameter *in place* with a DTensor on the mesh: the
# optimizer must be created **after** it, so that it holds the sharded parameters and
# keeps its state per shard.
#
# **Predict.** What placement do the parameters get? `head.weight` is 64 × 32: what does
# each rank hold? How many of the 29,632 elements does each rank store?

# %%
#@worker
def shard(model, **kw):
    """fully_shard bottom-up: each block is a unit, the root takes embed, norm and head."""
    for block in model.blocks:
        fully_shard(block, **kw)
    return fully_shard(model, **kw)


def local_numel(model):
    return sum(p.to_local().numel() for p in model.parameters())


def show_placements(mesh, device):
    heading("placements")
    model = shard(make_model(torch.float64, device), mesh=mesh)
    kinds = {(type(p).__name__, str(p.placements)) for p in model.parameters()}
    shared(f"parameter types and placements at rest: {sorted(kinds)}")
    w = model.head.weight
    say(f"head.weight global {list(w.shape)}, local {list(w.to_local().shape)}")
    total = sum(p.numel() for p in model.parameters())  # a DTensor's numel is the global one
    mine = local_numel(model)
    counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, torch.tensor([mine], device=device))
    say(f"holds {mine} of {total} parameter elements ({mine / total:.3f})")
    shared(f"sum over ranks {sum(int(c) for c in counts)} = total {total}")


# %%
show(run, "placements")

# %% [markdown]
# Output:
# ```text
# rank 0: parameter types and placements at rest: [('DTensor', '(Shard(dim=0),)')]
# rank 0: head.weight global [64, 32], local [32, 32]
# rank 0: holds 14816 of 29632 parameter elements (0.500)
# rank 0: sum over ranks 29632 = total 29632
# rank 1: head.weight global [64, 32], local [32, 32]
# rank 1: holds 14816 of 29632 parameter elements (0.500)
# ```
#
# Every parameter is `Shard(0)`: split along its first dimension, as `torch.chunk` would,
# rank 0 keeping the first rows and rank 1 the rest. The head's 64 rows become 32 per rank;
# biases and LayerNorm weights (1-D) are split the same way. Each rank holds exactly half
# of the elements here, because every dimension 0 is even (section 4 shards an odd one).
# Sharding per parameter (FSDP2) instead of flattening a unit into one buffer (FSDP1) is
# what keeps each parameter a proper tensor with a name and a shape.

# %% [markdown]
# ## 3. One AdamW step equals one process
#
# The step: forward through `model(x)` (the root's hook all-gathers the root unit, each
# block's hook its block), backward (each unit's gradients are **reduce-scattered**: summed
# over ranks, averaged, and each rank keeps only its shard's gradient), then `opt.step()` on
# the shards: each rank updates only its half, with its half of AdamW's moments.
#
# **Predict.** The gradients can only differ by rounding (the sums run in another order):
# about eps of the dtype, 2.2e-16 in float64 and 1.2e-7 in float32. Is the gap after one
# AdamW step that small too, in either dtype?

# %%
#@worker
def show_step(mesh, device):
    heading("step")
    tokens, mine = batch(device)
    for dtype in (torch.float64, torch.float32):
        ref = make_model(dtype, device)
        adamw_step(ref, tokens)
        model = shard(make_model(dtype, device), mesh=mesh)
        opt = adamw_step(model, mine)
        state = opt.state[model.head.weight]
        name, eps = str(dtype)[6:], torch.finfo(dtype).eps
        grads, step = (1e-15, 1e-12) if dtype == torch.float64 else (1e-6, 1e-3)  # the bounds
        shared(f"{name}: grads vs one process: max gap {below(grad_gap(model, ref), grads)}")
        gap = max_gap(model, ref)
        shared(f"{name}: one AdamW step vs one process: max gap {below(gap, step)}, "
               f"{gap / eps:.0f} eps of {name} ({eps:.1e})")
    shared(f"optimizer state is sharded too: exp_avg {type(state['exp_avg']).__name__} "
           f"{state['exp_avg'].placements}, local {list(state['exp_avg'].to_local().shape)}")


# %%
show(run, "step")

# %% [markdown]
# Output:
# ```text
# rank 0: float64: grads vs one process: max gap «number», below 1e-15: True
# rank 0: float64: one AdamW step vs one process: max gap «number», below 1e-12: True, «number» eps of float64 (2.2e-16)
# rank 0: float32: grads vs one process: max gap «number», below 1e-06: True
# rank 0: float32: one AdamW step vs one process: max gap «number», below 1e-03: True, «number» eps of float32 (1.2e-07)
# rank 0: optimizer state is sharded too: exp_avg DTensor (Shard(dim=0),), local [32, 32]
# ```
#
# The gradients agree to rounding in both dtypes; the step does not: in both, it is off by
# hundreds of eps. AdamW's first step moves each weight by `lr * g / (|g| + 1e-8)`, about
# `lr * sign(g)` = 0.01 whatever the size of g. A gradient element that is nearly zero (its
# terms cancel) still carries the absolute rounding error of the larger terms it was summed
# from, in an order that differs between one process and two ranks; where |g| is near
# AdamW's eps (1e-8), the update changes by up to `lr / 1e-8` = 10⁶ times that error.
# Rounding in the gradient is amplified, not damped, in float64 as in float32: float64 only
# starts from a much smaller error, which is why the exactness claims in this lesson are
# made in float64. The optimizer's state is DTensor `Shard(0)` as well: AdamW never sees a
# full tensor.
#
# Why compare the gradients too? The same formula makes Adam's first step almost blind to
# the gradient's scale. A classic bug is ranks that *sum* their gradients instead of
# averaging them: twice the right gradient on 2 ranks.
#
# **Predict.** In one process, how far does one float32 AdamW step with doubled gradients
# land from the right one, and how far apart are the gradients?

# %%
tokens = torch.randint(0, V, (2 * B, T + 1), generator=torch.Generator().manual_seed(1))  # the ranks' batch
right, summed = make_model(torch.float32, "cpu"), make_model(torch.float32, "cpu")
adamw_step(right, tokens)
opt = torch.optim.AdamW(summed.parameters(), lr=1e-2)
(2 * loss_fn(summed, tokens)).backward()  # the bug: the 2 ranks' gradients summed, not averaged
opt.step()
print(f"float32, gradients doubled: grads max gap {grad_gap(summed, right):.1e}, above 1e-03: "
      f"{grad_gap(summed, right) > 1e-3}; one AdamW step: max gap {below(max_gap(summed, right), 2e-3)}")

# %% [markdown]
# Output:
# ```text
# float32, gradients doubled: grads max gap «number», above 1e-03: True; one AdamW step: max gap «number», below 2e-03: True
# ```
#
# The gradients are far apart, the step is not: `g / (|g| + 1e-8)` barely changes when g
# doubles, except where |g| is near 1e-8, and even there by at most 0.17 `lr` = 1.7e-3,
# whatever the gradients (the largest value of `2x / (2x + e) - x / (x + e)`, at
# `x = e / √2`). So the float32 step check of section 3 alone, below 1e-3, would not reliably
# catch summed-instead-of-averaged gradients; the gradient check catches them at once.

# %% [markdown]
# ## 4. Other placements, and shards that do not divide evenly
#
# `Shard(0)` is only the default. `fully_shard(..., shard_placement_fn=fn)` calls `fn` on
# each parameter and uses the `Shard(dim)` it returns (`None`: the default). Here `fn`
# returns `Shard(1)` for every 2-D weight whose columns divide evenly over the ranks, so
# each rank holds some *input* features of every row instead of some rows.
#
# **Predict.** Local shapes of `head.weight` (64, 32) and `head.bias` (64)? Does the step
# still equal one process?

# %%
#@worker
def by_columns(param):
    """shard_placement_fn: a 2-D weight split along dim 1 (its input features) where its
    columns divide evenly over the ranks; None (the default, Shard(0)) otherwise."""
    return Shard(1) if param.ndim == 2 and param.shape[1] % dist.get_world_size() == 0 else None


def show_placement_fn(mesh, device):
    heading("placement fn")
    tokens, mine = batch(device)
    ref = make_model(torch.float64, device)
    adamw_step(ref, tokens)
    model = shard(make_model(torch.float64, device), mesh=mesh, shard_placement_fn=by_columns)
    for name in ("head.weight", "head.bias", "embed.weight"):
        p = model.get_parameter(name)
        say(f"{name}: global {list(p.shape)} {p.placements[0]}, local {list(p.to_local().shape)}")
    adamw_step(model, mine)
    shared(f"one AdamW step vs one process: max gap {below(max_gap(model, ref), 1e-12)}")


# %%
show(run, "placement fn")

# %% [markdown]
# Output:
# ```text
# rank 0: head.weight: global [64, 32] S(1), local [64, 16]
# rank 0: head.bias: global [64] S(0), local [32]
# rank 0: embed.weight: global [64, 32] S(1), local [64, 16]
# rank 0: one AdamW step vs one process: max gap «number», below 1e-12: True
# rank 1: head.weight: global [64, 32] S(1), local [64, 16]
# rank 1: head.bias: global [64] S(0), local [32]
# rank 1: embed.weight: global [64, 32] S(1), local [64, 16]
# ```
#
# The weights are split by columns, the 1-D biases and norms keep `Shard(0)`, and the float64
# step still matches one process below 1e-12, as in section 3: the placement changes which elements a rank
# stores and updates, not the math, since AdamW is elementwise.
#
# Why "whose columns divide evenly"? A layer's sizes need not be multiples of the number of
# ranks. Take `nn.Linear(33, 97)`: its weight has 97 rows and 33 columns, neither even.
#
# **Predict.** On 2 ranks, does the default `Shard(0)` accept 97 rows, and how many does
# each rank get? And `Shard(1)` on 33 columns?

# %%
#@worker
def show_uneven(mesh, device):
    heading("uneven")
    odd = fully_shard(nn.Linear(33, 97, device=device), mesh=mesh)  # weight [97, 33]
    rows = torch.tensor([odd.weight.to_local().shape[0]], device=device)
    every = [torch.zeros_like(rows) for _ in range(dist.get_world_size())]
    dist.all_gather(every, rows)
    shared(f"Shard(0) of a [97, 33] weight: rows per rank {[int(r) for r in every]}")
    try:
        fully_shard(nn.Linear(33, 97, device=device), mesh=mesh,
                    shard_placement_fn=lambda p: Shard(1) if p.ndim == 2 else None)
        shared("Shard(1) of a [97, 33] weight: no error")
    except NotImplementedError as err:  # the message ends with the world size
        shared(f"Shard(1) of a [97, 33] weight: NotImplementedError: {str(err).split(' (world')[0]}")


# %%
show(run, "uneven")

# %% [markdown]
# Output:
# ```text
# rank 0: Shard(0) of a [97, 33] weight: rows per rank [49, 48]
# rank 0: Shard(1) of a [97, 33] weight: NotImplementedError: FSDP does not support uneven sharding on dim 1: torch.Size([97, 33])
# ```
#
# `Shard(0)` splits as `torch.chunk` does: chunks of ceil(97 / 2) = 49 rows, the last rank
# taking the remainder. (On 3 ranks that is 33, 33 and 31 rows: `torch.chunk` fills the
# first ranks first.) FSDP2 pads each rank's chunk to the same size for its collectives and
# hides the padding from you. On any other dimension it refuses: read from
# `torch/distributed/fsdp/_fully_shard/_fsdp_param.py`, `_init_sharded_param` raises unless
# that dimension divides by the number of ranks, since padding across columns would need
# extra copies around every all-gather and reduce-scatter. That is why `by_columns` falls
# back to `Shard(0)` where the columns do not divide: this model's 32 columns divide over
# 2 ranks, but not over 3.

# %% [markdown]
# ## 5. Lazy initialisation, and the hooks on `__call__`
#
# FSDP2 does its work in module hooks. A forward *pre*-hook all-gathers the unit, swaps the
# gathered plain tensors in as the module's parameters, and wraps the module's inputs in an
# autograd function whose backward is the unit's *post-backward* hook: once backward has
# passed through the unit, it reduce-scatters the gradients and swaps the shards back. A
# forward *post*-hook reshards (frees the gathered copy and swaps the DTensor shards back)
# and registers on the outputs the *pre-backward* hook that gathers the unit again before
# its backward. `nn.Module.__call__` runs hooks; `module.forward` is just the method.
#
# `fully_shard` does not finish the set-up: it cannot know yet which of its calls was the
# last, or which unit is the outermost. The first call through `__call__` does it: the
# pre-forward hook of the first unit to run forward makes that unit the *root*
# (`_lazy_init` in `_fsdp_state.py`), marks every unit below it as not the root, and from
# then on the root's hooks run the logic of the whole step around the others' (preparing
# each forward, and in backward registering the final callback that finishes every unit's
# backward, `_root_post_backward_final_callback`: read from that file). The worker reads each
# unit's private flag `_is_root` (None until that moment) before and after the first call. `model.unshard()` gathers the root unit's
# parameters by hand.
#
# **Predict.** Which flags does `unshard()` set, and which does the first `model(x)` set?

# %%
#@worker
def roots(model):
    """Each unit's root flag (a private attribute): None until lazy init, then True or False."""
    return [m._get_fsdp_state()._is_root for m in (model, *model.blocks)]


def show_lazy_init(mesh, device):
    heading("lazy init")
    _, mine = batch(device)
    model = shard(make_model(torch.float64, device), mesh=mesh)
    shared(f"after fully_shard, _is_root of model, blocks.0, blocks.1: {roots(model)}")
    model.unshard()
    shared(f"after model.unshard(): {roots(model)}")
    model(mine[:, :-1])
    shared(f"after the first model(x): {roots(model)}")


# %%
show(run, "lazy init")

# %% [markdown]
# Output:
# ```text
# rank 0: after fully_shard, _is_root of model, blocks.0, blocks.1: [None, None, None]
# rank 0: after model.unshard(): [None, None, None]
# rank 0: after the first model(x): [True, False, False]
# ```
#
# `unshard()` gathers but decides nothing: only a call through `__call__` makes the root.
# So calling the unit's methods yourself can skip both the hooks and this set-up.
#
# **Predict.** On a freshly sharded model, what does `model.forward(x)` do? And if we first
# call `model.unshard()` and then `forward`, what happens to the root's gradients?

# %%
#@worker
def root_grads(model, ref):
    """The root unit's own parameters (embed, norm, head): how many got a gradient, and the
    largest gap to the one-process gradient of the whole batch among those that did."""
    pairs = [(p, q) for (n, p), q in zip(model.named_parameters(), ref.parameters())
             if not n.startswith("blocks.")]
    gaps = [(full(p.grad) - q.grad).abs().max().item() for p, q in pairs if p.grad is not None]
    return f"{len(gaps)} of {len(pairs)}, max gap {below(max(gaps, default=float('nan')), 1e-15)}"


def show_hooks(mesh, device):
    heading("hooks")
    tokens, mine = batch(device)
    ref = make_model(torch.float64, device)
    loss_fn(ref, tokens).backward()  # one process, the whole batch: the gradient to expect
    model = shard(make_model(torch.float64, device), mesh=mesh)
    try:
        model.forward(mine[:, :-1])
        shared("model.forward(x) on a fresh model: no error")
    except Exception as err:  # noqa: BLE001 - we print which error: the root's params are still DTensor shards
        shared(f"model.forward(x) on a fresh model: {type(err).__name__}: {str(err).splitlines()[0]}")
    loss_fn(model, mine).backward()
    shared(f"model(x) through __call__: root params with a grad {root_grads(model, ref)}")
    show_trap(mesh, device, mine, ref)
    show_fixes(mesh, device, mine, ref)


def show_trap(mesh, device, mine, ref):
    """unshard() then forward() on a model never called: the root's hooks never ran."""
    trap = shard(make_model(torch.float64, device), mesh=mesh)
    root = [p for n, p in trap.named_parameters() if not n.startswith("blocks.")]  # DTensors
    trap.unshard()  # gathers the root's params, but the root's pre-forward hook never ran
    F.cross_entropy(trap.forward(mine[:, :-1]), mine[:, 1:].flatten()).backward()
    shared(f"unshard() + forward() on a never-called model: root DTensor params with a grad "
           f"{sum(p.grad is not None for p in root)} of {len(root)}")
    pairs = zip(trap.named_parameters(), ref.parameters())  # the blocks' own hooks did run
    blocks = [(full(p.grad) - q.grad).abs().max().item() for (n, p), q in pairs if n.startswith("blocks.")]
    shared(f"trap: the blocks' grads vs one process: max gap {below(max(blocks), 1e-15)}")
    left = trap.head.weight  # still the gathered plain tensor: never resharded
    half = make_model(torch.float64, device)
    loss_fn(half, mine).backward()  # this rank's half batch only, one process
    say(f"trap: head.weight is now a {type(left).__name__}, its grad equal to this rank's own "
        f"half-batch grad: {torch.equal(left.grad, half.head.weight.grad)}")


def show_fixes(mesh, device, mine, ref):
    x = mine[:, :-1]  # (B, T)
    fixed = shard(make_model(torch.float64, device), mesh=mesh)
    loss_fn(fixed, mine).backward()  # one call through __call__ first: the root is set up
    fixed.zero_grad(set_to_none=True)
    fixed.unshard()
    F.cross_entropy(fixed.forward(x), mine[:, 1:].flatten()).backward()
    shared(f"unshard() + forward() after one model(x): root params with a grad {root_grads(fixed, ref)}")
    enc = shard(make_model(torch.float64, device), mesh=mesh)
    register_fsdp_forward_method(enc, "encode")  # encode() now runs the hooks too
    h = enc.encode(x)  # (B, T, D)
    same = torch.equal(h, make_model(torch.float64, device).encode(x))
    shared(f"register_fsdp_forward_method(model, 'encode'): encode(x) -> {type(h).__name__} "
           f"{list(h.shape)}, equal to one process: {same}")


# %%
show(run, "hooks")

# %% [markdown]
# Output:
# ```text
# rank 0: model.forward(x) on a fresh model: RuntimeError: aten.embedding.default got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor before calling distributed operators!
# rank 0: model(x) through __call__: root params with a grad 5 of 5, max gap «number», below 1e-15: True
# rank 0: unshard() + forward() on a never-called model: root DTensor params with a grad 0 of 5
# rank 0: trap: the blocks' grads vs one process: max gap «number», below 1e-15: True
# rank 0: trap: head.weight is now a Parameter, its grad equal to this rank's own half-batch grad: True
# rank 0: unshard() + forward() after one model(x): root params with a grad 5 of 5, max gap «number», below 1e-15: True
# rank 0: register_fsdp_forward_method(model, 'encode'): encode(x) -> Tensor [4, 8, 32], equal to one process: True
# rank 1: trap: head.weight is now a Parameter, its grad equal to this rank's own half-batch grad: True
# ```
#
# `model.forward(x)` fails at the first operation that mixes the root's DTensor shard (the
# embedding weight) with a plain tensor (the tokens). Called as `model(x)`, the same model
# gives its root's 5 parameters (embedding; final norm weight and bias; head weight and
# bias) the one-process gradients of the whole batch (to rounding). The error is the lucky
# case.
# The unlucky one is silent: after `unshard()` the forward and backward run, but the root's
# pre-forward hook never ran, so there was no lazy initialisation and no backward hook to
# reduce-scatter the root's gradients and swap the shards back. The optimizer's DTensor
# parameters of the root get no gradient at all (0 of 5), and the module is left holding
# the gathered plain `Parameter`s, whose gradients are each rank's own half-batch gradient,
# never averaged. (The blocks' own hooks did run: their gradients match one process's.)
# Nothing above raised or warned, and an optimizer skips every parameter whose `.grad` is
# None: its step would move only the blocks.
#
# The documented fixes both go through the hooks: `unshard()` works once the model has been
# called through `__call__` (the lazy initialisation ran then); its gradients then equal the
# one-process gradients (to rounding). `register_fsdp_forward_method(model, "encode")` wraps
# another method (`encode`, or `forward` itself) so that calling it runs the same pre- and
# post-forward logic: `encode(x)` returns a plain tensor bitwise equal to the one-process
# one (the gathered weights are the same numbers, and a forward alone sums in the same
# order). The rule: call the model, `model(x)`, never `model.forward(x)`.

# %% [markdown]
# ## Summary
#
# - DDP keeps everything on every rank and all-reduces gradients: one step on 2 ranks equals
#   one process (float64: below 1e-12); `no_sync` accumulation equals manual accumulation.
# - `fully_shard` bottom-up (blocks, then the root) makes one unit per call; parameters at
#   rest are DTensors `Shard(0)`, each rank holding half of the 29,632 elements; create the
#   optimizer after sharding.
# - One AdamW step equals one process: the gradients to rounding, the step to hundreds of
#   eps in both dtypes (below 1e-12 in float64), because Adam's first step amplifies
#   rounding in small gradients. Compare gradients too: a step check alone barely sees
#   summed-instead-of-averaged gradients. AdamW's state is sharded too.
# - `shard_placement_fn` picks another `Shard(dim)` per parameter, and the step still equals
#   one process. `Shard(0)` may be uneven (97 rows: 49 and 48); any other dimension must
#   divide by the number of ranks, or `fully_shard` raises `NotImplementedError`.
# - The first call through `__call__` makes the root (lazy initialisation); `unshard()` does
#   not. The gathering happens in hooks on `__call__`: `model.forward(x)` raises "got mixed
#   torch.Tensor and DTensor", and `unshard()` + `forward()` on a never-called model silently
#   loses the root's gradients. Call `model(x)`; use `register_fsdp_forward_method` for other
#   entry points.

# %% [markdown]
# ## Going further
#
# ### DDP's options for unused parameters and compressed gradients
#
# By default DDP expects every parameter to receive a gradient in every backward: its
# reducer waits for all of them before a bucket is complete. `find_unused_parameters=True`
# makes it walk the autograd graph from the outputs after each forward and mark the
# parameters that will get no gradient as ready; `static_graph=True` instead records the
# first iteration and assumes every later one uses the same parameters. A comm hook
# replaces the bucket's all-reduce: `fp16_compress_hook` casts the bucket to fp16,
# all-reduces that, and casts back.
#
# **Predict.** A model with a layer its forward never calls: what do two backward passes do
# under each setting? Then guess (the lines below count them) how many all-reduces each
# iteration issues under each. And what does fp16 compression save and cost?

# %%
#@worker
def unused_steps(kw, device, tokens):
    """Two backward passes of a DDP model with a layer its forward never calls."""
    model = make_model(torch.float32, device)
    model.spare = nn.Linear(D, D)  # registered, never called: no gradient ever
    ddp = DDP(model, **kw)
    try:
        for _ in range(2):
            loss_fn(ddp, tokens).backward()
    except RuntimeError as err:
        return f"RuntimeError: {str(err).split('. ')[0]}"
    return f"2 backward passes ran, spare.weight.grad {ddp.module.spare.weight.grad}"


def compressed_grads(device, tokens, hook=None):
    """DDP grads (fp32 model) and the bytes each bucket all-reduce sent, with an optional hook."""
    ddp, sent = DDP(make_model(torch.float32, device)), []
    if hook is not None:
        def counting(state, bucket):  # the hook casts the bucket, then all-reduces the copy
            sent.append(bucket.buffer().numel() * 2)  # fp16: 2 bytes per element
            return hook(state, bucket)
        ddp.register_comm_hook(None, counting)
    loss_fn(ddp, tokens).backward()
    grads = [p.grad for p in ddp.parameters()]
    return grads, sum(sent) or 4 * sum(g.numel() for g in grads)


def graph_nodes(out):
    """The autograd nodes reachable from out: the graph find_unused_parameters walks."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [n for n, _ in node.next_functions]
    return len(seen)


def all_reduces(kw, device, tokens, steps=3):
    """All-reduces DDP issues in each of `steps` iterations (the profiler's c10d events);
    with a knob, the model has the unused layer. Also the reducer's unused-bytes record."""
    model = make_model(torch.float32, device)
    if kw:
        model.spare = nn.Linear(D, D)  # registered, never called
    ddp, counts = DDP(model, **kw), []
    for step in range(steps):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            loss_fn(ddp, tokens).backward()
        counts.append(sum(e.name == "c10d::allreduce_" for e in prof.events()))
        if step == 0:  # what each all-reduce carried: the backend's events record the tensors
            # sorted: gloo records these in its worker threads, so the list's order is not
            # reliably the order DDP issued them
            sent = sorted(f"{e.input_dtypes[0]} {e.input_shapes[0]}" for e in prof.events()
                          if e.name in ("gloo:all_reduce", "nccl:all_reduce"))
    tensors = len(list(model.parameters()))
    return counts, ddp._get_ddp_logging_data()["unused_parameter_size"], sent, tensors


def show_ddp_knobs(device):
    heading("ddp knobs")
    _, mine = batch(device)
    for kw in ({}, {"find_unused_parameters": True}, {"static_graph": True}):
        shared(f"unused layer, DDP({', '.join(f'{k}={v}' for k, v in kw.items()) or 'defaults'}): "
               f"{unused_steps(kw, device, mine)}")
    for kw in ({}, {"find_unused_parameters": True}, {"static_graph": True}):
        counts, unused, sent, tensors = all_reduces(kw, device, mine)
        name = ", ".join(f"{k}={v}" for k, v in kw.items()) or "defaults, every parameter used"
        shared(f"all-reduces in iterations 1, 2, 3, DDP({name}): {counts}; "
               f"reducer's unused_parameter_size {unused} bytes")
        shared(f"  iteration 1 all-reduced: {', '.join(sent)}; the model has {tensors} parameter tensors")
    nodes = graph_nodes(make_model(torch.float32, device)(mine[:, :-1]))
    shared(f"find_unused_parameters=True: the graph walked from the logits after each forward has "
           f"{nodes} autograd nodes")
    exact, fp32_bytes = compressed_grads(device, mine)
    half, small = compressed_grads(device, mine, default_hooks.fp16_compress_hook)
    rel = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(half, exact))
    shared(f"fp16_compress_hook: bytes all-reduced {small} vs {fp32_bytes}; largest grad gap, "
           f"relative to the tensor's largest grad, above 1e-6: {rel > 1e-6}, below 1e-3: {rel < 1e-3}")


# %%
show(run, "ddp knobs")

# %% [markdown]
# Output:
# ```text
# rank 0: unused layer, DDP(defaults): RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one
# rank 0: unused layer, DDP(find_unused_parameters=True): 2 backward passes ran, spare.weight.grad None
# rank 0: unused layer, DDP(static_graph=True): 2 backward passes ran, spare.weight.grad None
# rank 0: all-reduces in iterations 1, 2, 3, DDP(defaults, every parameter used): [1, 1, 1]; reducer's unused_parameter_size 0 bytes
# rank 0:   iteration 1 all-reduced: float [29632]; the model has 29 parameter tensors
# rank 0: all-reduces in iterations 1, 2, 3, DDP(find_unused_parameters=True): [2, 2, 2]; reducer's unused_parameter_size 4224 bytes
# rank 0:   iteration 1 all-reduced: float [30688], int [31]; the model has 31 parameter tensors
# rank 0: all-reduces in iterations 1, 2, 3, DDP(static_graph=True): [2, 1, 1]; reducer's unused_parameter_size 4224 bytes
# rank 0:   iteration 1 all-reduced: float [30688], int [31]; the model has 31 parameter tensors
# rank 0: find_unused_parameters=True: the graph walked from the logits after each forward has 112 autograd nodes
# rank 0: fp16_compress_hook: bytes all-reduced 59264 vs 118528; largest grad gap, relative to the tensor's largest grad, above 1e-6: True, below 1e-3: True
# ```
#
# With the defaults the first backward leaves the bucket that holds the unused layer
# incomplete, and DDP notices at the *second* forward, with an error that names the fix.
# `find_unused_parameters=True` works, at a price paid every iteration, which the lines
# above count rather than time (a time would be lost in this tiny model's noise). After
# each forward, DDP's reducer walks the autograd graph back from the outputs (112 nodes
# here, counted by the worker's own walk of the same graph) to find the parameters no
# gradient will reach; and every backward issues a second all-reduce: 31 `int` values, one
# per parameter tensor, so that the ranks agree on which parameters were used (the
# reducer's used-parameter map, `local_used_map_` in `reducer.cpp`). The gradients'
# all-reduce still carries the unused layer's slots: 30,688 floats, the model's 29,632 plus
# the spare layer's 1,056. `static_graph=True` pays that second all-reduce only in the
# first iteration, `[2, 1, 1]`: it records which parameters were unused (4,224 bytes, the
# spare layer's 32 × 32 + 32 fp32 values) and then assumes every later iteration uses the
# same ones, a promise that a model whose set of used parameters changes would break. The
# unused layer's gradient stays `None` either way. The fp16 hook halves the bytes each rank
# all-reduces, 59,264 instead of 118,528, and pays in precision: the averaged gradients
# differ from the fp32 ones by up to about fp16's rounding, more than 1e-6 and less than
# 1e-3 of each tensor's largest gradient.
#
# ### Debugging DDP
#
# `TORCH_DISTRIBUTED_DEBUG=DETAIL` is the collective checker of lesson 09. With PyTorch
# 2.13.0 on the CPU (gloo), this script, saved as `ddp_detail.py` and run with `TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone
# --nproc-per-node=2 ddp_detail.py`, dies with SIGSEGV on both ranks before printing;
# without the variable, or with INFO, it prints two lines and exits 0:
#
# ```python
# import torch
# import torch.distributed as dist
# from torch.nn.parallel import DistributedDataParallel as DDP
#
# dist.init_process_group("gloo")
# model = DDP(torch.nn.Linear(8, 8))
# model(torch.randn(4, 8)).sum().backward()
# print(f"rank {dist.get_rank()}: step done", flush=True)
# dist.destroy_process_group()
# ```
#
# That is a measurement, not a documented limit; keep the switch for code without DDP.

# %% [markdown]
# ## References
#
# - [`torch.distributed.fsdp.fully_shard`](https://docs.pytorch.org/docs/2.13/distributed.fsdp.fully_shard.html):
#   `fully_shard`, `shard_placement_fn`, `FSDPModule.unshard` and
#   `register_fsdp_forward_method` (sections 2 to 5).
# - [`torch.nn.parallel.DistributedDataParallel`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.parallel.DistributedDataParallel.html):
#   the baseline of section 1, `no_sync`, `find_unused_parameters` and `static_graph`.
# - [`torch.distributed.tensor`](https://docs.pytorch.org/docs/2.13/distributed.tensor.html):
#   DTensor, `Shard`, `to_local` and `full_tensor`, which every section reads.
# - Rajbhandari et al., [ZeRO: Memory Optimizations Toward Training Trillion Parameter Models](https://arxiv.org/abs/1910.02054)
#   (2019): sharding optimizer state, gradients and parameters across data-parallel ranks.
# - Zhao et al., [PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel](https://arxiv.org/abs/2304.11277)
#   (2023): FSDP's design (units, all-gather before use, reduce-scatter of gradients).

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each stop prints a file of the torch you installed, relative
# to its site-packages folder, and the line where to start reading (the numbers are your
# build's, hence `«line»` below). The stops follow this lesson: DDP's reducer, then
# `fully_shard` turning each parameter into a shard, the lazy initialisation that picks the
# root, and the reduce-scatter of a unit's gradients.

# %%
from sourcemap import read_the_source  # noqa: E402  (lessons/ is on sys.path: first cell)

read_the_source([
    ("torch/nn/parallel/distributed.py", "def _ddp_init_helper(",
     "DDP's gradients go through the C++ `dist.Reducer` built here, with the parameters "
     "assigned to buckets by size (`_DEFAULT_BUCKET_CAP_MB = 25` at the top of the file). "
     "`no_sync` further down only sets `require_backward_grad_sync = False`, and "
     "`_post_forward` then skips `reducer.prepare_for_backward`."),
    ("torch/distributed/fsdp/_fully_shard/_fully_shard.py", "@contract(state_cls=FSDPState)",
     "The real `fully_shard`, after its two `@overload`s: `_get_modules_and_states` collects "
     "the parameters of the module's submodules, stopping at any submodule already given to "
     "`fully_shard` (bottom-up: one unit per call). `_apply_to_module` then swaps the "
     "module's class for `FSDP<Class>`, which adds `FSDPModule`'s `unshard()` (further "
     "down: it runs the unit's own `lazy_init`, never the state's `_lazy_init`)."),
    ("torch/distributed/fsdp/_fully_shard/_fsdp_param.py", "def _init_sharded_param(",
     "One parameter becomes its shard: `Shard(0)` unless `shard_placement_fn` returns another "
     "`Shard`; a dimension other than 0 that does not divide by the world size raises the "
     "`NotImplementedError` of section 4; `_chunk_with_empty` splits it as `torch.chunk` "
     "does, this rank's chunk is copied into a padded buffer and put on the module in place "
     "of the original as a DTensor `nn.Parameter` (`_setattr_on_modules`)."),
    ("torch/distributed/fsdp/_fully_shard/_fsdp_state.py", "def _lazy_init(",
     "Called by `_root_pre_forward` from `_pre_forward`, the forward pre-hook that `init` "
     "above registers on the module, so only when the module is called through `__call__` (or "
     "a method wrapped by `register_fsdp_forward_method`): the first state to run forward "
     "sets `_is_root = True` and marks the states below it `False` (section 5)."),
    ("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "def foreach_reduce(",
     "A unit's unsharded gradients are copied into one flat buffer, reduce-scattered in one "
     "collective that averages (`ReduceOp.AVG` for fp32, from "
     "`_get_gradient_divide_factors`; float64, this lesson's exact checks, takes its other "
     "branch: divide first, by 2 on 2 ranks, then `ReduceOp.SUM`), and each rank keeps its shard's part: the step of "
     "section 3. `foreach_all_gather` above is the forward's mirror: one all-gather per unit."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/nn/parallel/distributed.py:«line»  `def _ddp_init_helper(`
#     DDP's gradients go through the C++ `dist.Reducer` built here, with the parameters
#     assigned to buckets by size (`_DEFAULT_BUCKET_CAP_MB = 25` at the top of the file).
#     `no_sync` further down only sets `require_backward_grad_sync = False`, and
#     `_post_forward` then skips `reducer.prepare_for_backward`.
# torch/distributed/fsdp/_fully_shard/_fully_shard.py:«line»  `@contract(state_cls=FSDPState)`
#     The real `fully_shard`, after its two `@overload`s: `_get_modules_and_states`
#     collects the parameters of the module's submodules, stopping at any submodule
#     already given to `fully_shard` (bottom-up: one unit per call). `_apply_to_module`
#     then swaps the module's class for `FSDP<Class>`, which adds `FSDPModule`'s
#     `unshard()` (further down: it runs the unit's own `lazy_init`, never the state's
#     `_lazy_init`).
# torch/distributed/fsdp/_fully_shard/_fsdp_param.py:«line»  `def _init_sharded_param(`
#     One parameter becomes its shard: `Shard(0)` unless `shard_placement_fn` returns
#     another `Shard`; a dimension other than 0 that does not divide by the world size
#     raises the `NotImplementedError` of section 4; `_chunk_with_empty` splits it as
#     `torch.chunk` does, this rank's chunk is copied into a padded buffer and put on the
#     module in place of the original as a DTensor `nn.Parameter` (`_setattr_on_modules`).
# torch/distributed/fsdp/_fully_shard/_fsdp_state.py:«line»  `def _lazy_init(`
#     Called by `_root_pre_forward` from `_pre_forward`, the forward pre-hook that `init`
#     above registers on the module, so only when the module is called through `__call__`
#     (or a method wrapped by `register_fsdp_forward_method`): the first state to run
#     forward sets `_is_root = True` and marks the states below it `False` (section 5).
# torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:«line»  `def foreach_reduce(`
#     A unit's unsharded gradients are copied into one flat buffer, reduce-scattered in
#     one collective that averages (`ReduceOp.AVG` for fp32, from
#     `_get_gradient_divide_factors`; float64, this lesson's exact checks, takes its other
#     branch: divide first, by 2 on 2 ranks, then `ReduceOp.SUM`), and each rank keeps its
#     shard's part: the step of section 3. `foreach_all_gather` above is the forward's
#     mirror: one all-gather per unit.
# ```

# %% [markdown]
# ## Mastery check
#
# Answer each before you open it; every answer points to the section whose printed lines
# show it.
#
# 1. **Explain.** What does a rank hold at rest after `fully_shard` on 2 ranks, and what
#    does AdamW keep for `head.weight`?
#
#    <details><summary>Answer</summary>
#
#    Only shards: every parameter is a DTensor `Shard(dim=0)`, 14,816 of the 29,632
#    elements on each rank, `head.weight` a [32, 32] local part of its [64, 32]
#    (*§ `fully_shard`: parameters become DTensor shards*). AdamW's state is sharded too:
#    `head.weight`'s `exp_avg` is a `Shard(dim=0)` DTensor with a [32, 32] local part
#    (*§ One AdamW step equals one process*).
#
#    </details>
#
# 2. **Predict.** You shard a model on 3 ranks with a `shard_placement_fn` that returns
#    `Shard(1)` for every 2-D weight, and one weight is [96, 32]. What happens? And with
#    the default `Shard(0)` on a [97, 33] weight on 2 ranks?
#
#    <details><summary>Answer</summary>
#
#    `fully_shard` raises `NotImplementedError: FSDP does not support uneven sharding on
#    dim 1`, since 32 columns do not divide by 3. `Shard(0)` may be uneven: 97 rows become
#    49 and 48 (*§ Other placements, and shards that do not divide evenly*).
#
#    </details>
#
# 3. **Spot the bug.** A training step on a freshly sharded model reads
#    `model.unshard(); loss = loss_fn(model.forward(x), y); loss.backward(); opt.step()`.
#    Nothing raises. What went wrong?
#
#    <details><summary>Answer</summary>
#
#    The model was never called through `__call__`, so no unit was made the root
#    (`_is_root` stays None after `unshard()`), and the root's forward hooks never ran: nothing
#    reduce-scattered the root's gradients or swapped its shards back. The root's 5 DTensor
#    parameters, the ones the optimizer holds, get no gradient (0 of 5), and `head.weight`
#    is left as a plain `Parameter` whose gradient is this rank's own half-batch gradient,
#    never averaged. Only the blocks' gradients match one process. Call `model(x)`, or wrap
#    another entry point with `register_fsdp_forward_method`
#    (*§ Lazy initialisation, and the hooks on `__call__`*).
#
#    </details>
#
# 4. **Explain.** Both sharded steps differ from one process by hundreds of eps of their
#    dtype, while the gradients agree to rounding. Why, and why are the exact checks made in
#    float64?
#
#    <details><summary>Answer</summary>
#
#    AdamW's first step moves each weight by `lr * g / (|g| + 1e-8)`, about `lr * sign(g)`
#    whatever the size of g. A nearly-zero gradient element carries the rounding error of
#    the larger terms it was summed from, in an order that differs between one process and
#    two ranks; where |g| is near 1e-8, the update changes by up to `lr / 1e-8` times that
#    error. Both dtypes are amplified the same way; float64 starts from an error about 5 × 10⁸
#    times smaller (the ratio of the two eps), so its step gap stays below 1e-12
#    (*§ One AdamW step equals one process*).
#
#    </details>
#
# 5. **Transfer.** Your own sharded training script passes a check that one float32 AdamW
#    step lands within 1e-3 of one process. A colleague suspects the ranks sum their
#    gradients instead of averaging them. Does the check rule that out, and what would?
#
#    <details><summary>Answer</summary>
#
#    No: doubling every gradient changes Adam's first update by at most 0.17 `lr`, only
#    where |g| is near 1e-8; here the step gap is below 2e-3 while the gradients are more
#    than 1e-3 apart. Compare the gradients with one process instead
#    (*§ One AdamW step equals one process*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder (check with `make exercises N=11a`; `solutions.py` has
# one way):
#
# 1. `local_numel(shapes, world, rank)`: how many elements rank `rank` holds under
#    `Shard(0)` for parameters of these shapes. The tests compare it with the ranks' printed
#    counts and with odd first dimensions.
#
# This one runs the worker with torchrun. Editing a `#@worker` cell of the lesson changes
# nothing until `worker.py` is regenerated (`make notebooks`); to try a variation, run a copy
# of `worker.py`, in this folder, with torchrun.
#
# A. Run the `main` part with `--nproc-per-node=3`:
#    `torchrun --standalone --nproc-per-node=3 lessons/11a_fsdp2_sharding/worker.py main`.
#    Which lines change? What are the rows per rank of section 4's [97, 33] weight, and
#    which weights does `by_columns` now leave at `Shard(0)`? (The 8 sequences do not split
#    evenly over 3 ranks: what does that do to the "vs one process" gaps?)

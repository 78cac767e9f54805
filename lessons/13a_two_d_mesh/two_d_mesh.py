# %% [markdown]
# # 13a · Composing parallelism: a 2-D mesh and what each step sends
#
# Lessons 09–12 took the parallelisms one at a time: collectives and DTensor, tensor and
# pipeline parallelism, FSDP2, checkpoints. A model that needs more than a few GPUs uses
# several at once: tensor parallelism inside a group of GPUs, sharded data parallelism across
# the groups. This lesson, the first of three parts, composes them the way torchtitan
# (PyTorch's reference trainer for large models) does, on 4 CPU ranks, and counts what every
# strategy puts on the wire. Part 13b goes on with overlap, memory, several machines and
# compiling inside the data-parallel wrappers; part 13c applies torchtitan's own recipe.
#
# **What you will learn**
#
# - a 2-D `DeviceMesh` (`dp` × `tp`): each dimension a family of process groups;
# - a transformer block's tensor-parallel plan, one piece at a time: the blocks' colwise and
#   rowwise layers with a local head count, a rowwise embedding and a colwise head, then
#   sequence parallelism (`SequenceParallel`, `PrepareModuleInput`);
# - `fully_shard` over `dp` after TP, in torchtitan's order; `_StridedShard`, the placement
#   this nesting produces, and the rows each rank holds; one step equal to one process;
# - HSDP: `fully_shard` on a (replicate, shard) mesh;
# - the bytes every collective of one training step moves for DDP, FSDP2, TP (with and
#   without sequence parallelism), 2-D and HSDP on the same model, beside the textbook
#   formulas, and the bytes that would leave each machine.
#
# **Prerequisites:** lesson 09 (collectives, DeviceMesh, DTensor), lesson 10 (colwise and
# rowwise tensor parallelism), lessons 11a (FSDP2) and 11b (`reshard_after_forward`).
#
# **How to run:** `python lessons/13a_two_d_mesh/two_d_mesh.py` or `make lesson N=13a` from
# the repository root, or open `two_d_mesh.ipynb`. It launches `worker.py` once on 4 CPU
# ranks with the course's kit (`lessons/multirank.py`, lesson 09; the cell prints how long it
# took). The code each rank runs is in the lesson: the cells that start with `#@worker` are
# written into `worker.py`, and executing them here only defines functions. Run the worker
# yourself with `torchrun --standalone --nproc-per-node=4 lessons/13a_two_d_mesh/worker.py
# main` (on a machine with 4 GPUs, `worker.py twod --backend nccl` runs section 1 with NCCL;
# unverified on a GPU). Each printing cell is followed by an *Output* block: what it printed
# with the pinned PyTorch (2.13.0).

# %%
import re
import sys
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

# lessons/ (the course's multi-rank kit and source map), then this folder (model.py, the model the ranks train)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] if "__file__" in globals() else Path.cwd().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()))
from multirank import launch, section, show


# %% [markdown]
# ## 1. Four ranks, one 2-D mesh
#
# The worker starts 4 ranks, 0–3. `init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp",
# "tp"))` arranges them in a 2 × 2 grid, row-major: `[[0, 1], [2, 3]]`. Each mesh dimension
# is a family of process groups: `mesh["tp"]` is this rank's row, `mesh["dp"]` its column.
# The first rank code imports what every section needs; the model the ranks train is in
# `model.py` beside the lesson (no distributed call there), described below.

# %%
#@worker
import warnings

import torch
import torch.distributed as dist
from model import BATCH, HEADS, H, S, V, Model, batch, build, loss_fn
from multirank import heading, say, serve, shared
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode

ROUNDING = 1e-12  # float64 gaps below this are rounding: the order of additions, not the math


# %%
torch.manual_seed(0)
torch.set_num_threads(1)  # the ranks get one thread each too (the kit sets OMP_NUM_THREADS=1)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
WORKER = HERE / "worker.py"


def pick(lines, *starts):
    """Print the lines of rank 0 (`rank 0: ...`) whose text starts with one of `starts`."""
    for line in lines:
        if line.split(": ", 1)[1].startswith(starts):
            print(line)


# %% [markdown]
# Each rank builds the mesh, then all-reduces its own rank number over its `dp` group, then
# over its `tp` group.
#
# **Predict.** Which ranks form rank 0's `dp` group, and which its `tp` group? Rank 1's?
# What sums come back?

# %%
#@worker
def show_mesh(device):
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
    return mesh


def two_d(device):
    """Section 1: the mesh, the 2-D model's placements and shards, one step."""
    mesh = show_mesh(device)
    model = make_2d(mesh, device=device)
    show_placements(model)
    show_shards(mesh, model)
    show_step(mesh, model, device)


def every_section(device):
    two_d(device)
    show_hsdp(device)
    show_comms(device)


def main():
    # CommDebugMode (section 3) tracks modules with full backward hooks; the model's input
    # (token ids) needs no gradient, so PyTorch warns at every backward. Not this lesson's subject.
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    serve({"main": every_section, "twod": two_d})


# %%
run = launch(WORKER, ["main"], nproc=4, timeout=300)
print(f"exit code {run.code} after {run.seconds:.0f} s, output from ranks {sorted(run.out)}")
show(run, "mesh")

# %% [markdown]
# Output:
# ```text
# exit code 0 after «time» s, output from ranks [0, 1, 2, 3]
# rank 0: mesh [[0, 1], [2, 3]], dims ('dp', 'tp')
# rank 0: dp group [0, 2], tp group [0, 1]; all_reduce of the ranks over dp 2, over tp 1
# rank 1: dp group [1, 3], tp group [0, 1]; all_reduce of the ranks over dp 4, over tp 1
# rank 2: dp group [0, 2], tp group [2, 3]; all_reduce of the ranks over dp 2, over tp 5
# rank 3: dp group [1, 3], tp group [2, 3]; all_reduce of the ranks over dp 4, over tp 5
# ```

# %% [markdown]
# `main()` hands the kit's `serve` the parts this worker can run: `serve` joins the process
# group, runs the part named on the command line (`main`: every section, in order) and ends
# the group on every path (lesson 09). A `tp` group is a row of the grid, a `dp` group a
# column. Every rank is in exactly one group of each, and a collective on `mesh["tp"]` runs in
# each row separately: the sum over tp is 0 + 1 = 1 in the first row and 2 + 3 = 5 in the
# second; over dp it is 0 + 2 = 2 and 1 + 3 = 4.
#
# **The model** (`model.py`): an embedding (vocabulary 32, width 16), two pre-norm blocks
# (LayerNorm, causal attention with 4 heads of width 4, LayerNorm, an MLP 16 → 64 → 16,
# residuals), a final LayerNorm and a linear head: 7,520 parameters, each initialised from a
# generator of its own, so every model in the lesson, sharded or not, starts from the same
# values.
#
# **The tensor-parallel plan**, applied with `parallelize_module` over `mesh["tp"]`, in three
# pieces, one cell each.
#
# *The blocks, as in lesson 10.* `attn.wq`, `attn.wk`, `attn.wv` and `mlp.up` are
# `ColwiseParallel`: each tp rank holds half their output features, so 2 of the 4 heads.
# `attn.wo` and `mlp.down` are `RowwiseParallel`: half their input features, and partial
# outputs that a collective sums. Attention reshapes q, k and v into heads of width 4; a
# colwise q holds half the features, so each block's `attn.heads` becomes `4 // tp`.
#
# The plan also puts a `PrepareModuleInput` on `attn` and on `mlp`, from `Replicate()` to
# `Replicate()`: it moves nothing in forward, but makes the module's input one replicated
# DTensor before q, k and v (or `mlp.up`) read it. Without it, each colwise layer would wrap
# the plain tensor it receives in a DTensor of its own, and in backward each would
# all-reduce its own input gradient. With one DTensor shared by the three, autograd sums
# their gradients on the rank, and the sum is all-reduced once, where the DTensor was made
# (the backward of `DTensor.from_local`, read from `torch/distributed/tensor/_api.py`).
# Section 3 counts the block's all-reduces; Exercise B removes the entry on `attn`.

# %%
#@worker
def block_plan():
    """One block, as in lesson 10: colwise q, k, v and up, rowwise wo and down; the input of
    attn and of mlp made one replicated DTensor, shared by their colwise layers."""
    plan = {"attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    for name in ("attn", "mlp"):  # one DTensor input for q, k and v: one all-reduce of its gradient
        plan[name] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),))
    return plan


def parallelize_blocks(model, tp, plan):
    """Apply plan() to every block, and give attention this rank's share of the heads."""
    for block in model.blocks:
        parallelize_module(block, tp, plan())
        block.attn.heads = HEADS // tp.size()  # this rank's heads: q/k/v hold H / tp columns


# %% [markdown]
# *The two ends.* The embedding table is split by rows, `RowwiseParallel(input_layouts=
# Replicate())`: each rank holds half the vocabulary and looks up the tokens it holds. Its
# output is a `_MaskPartial`, a sum still to be taken: before the sum over tp completes the
# lookup, the rows of the tokens this rank does not hold are set to zero (see Read the
# source). The head is `ColwiseParallel(output_layouts=Replicate())`: each rank computes
# half the logits (half the vocabulary), then they are gathered.

# %%
#@worker
def ends_plan():
    """The model's two ends: the embedding split by rows (the vocabulary), the head by columns."""
    return {"embed": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Replicate())}


# %% [markdown]
# *Sequence parallelism.* Between the blocks, the residual stream and the norms are the same
# on both tp ranks. `SequenceParallel()` on the norms makes each rank hold only its half of
# the tokens there (`Shard(1)`: dim 1 is the sequence). Attention and the MLP need every
# token, so the `PrepareModuleInput` of `attn` and `mlp` now starts from `Shard(1)` and
# all-gathers the sequence once, before q, k and v read it; the rowwise layers hand back a
# sequence shard (`output_layouts=Shard(1)`: a reduce-scatter instead of an all-reduce). At
# the ends, the embedding hands the first block a shard, the final norm is sequence-parallel
# too, and the head starts from a shard. `tp_plan` applies the ends, then the blocks; with
# `sp=False` it leaves sequence parallelism out (section 3 compares).

# %%
#@worker
SEQ = Shard(1)  # the sequence dimension of a [batch, sequence, width] activation


def sp_block_plan():
    """block_plan with sequence parallelism: the norms on this rank's tokens, one all-gather
    of the sequence before attention and the MLP, a reduce-scatter out of wo and down."""
    return block_plan() | {
        "attn.wo": RowwiseParallel(output_layouts=SEQ), "mlp.down": RowwiseParallel(output_layouts=SEQ),
        "attn": PrepareModuleInput(input_layouts=(SEQ,), desired_input_layouts=(Replicate(),)),
        "mlp": PrepareModuleInput(input_layouts=(SEQ,), desired_input_layouts=(Replicate(),)),
        "norm1": SequenceParallel(), "norm2": SequenceParallel()}


def sp_ends_plan():
    """ends_plan with sequence parallelism: the embedding hands out a sequence shard, the
    final norm works on it, the head gathers it back."""
    return {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=SEQ),
            "head": ColwiseParallel(input_layouts=SEQ, output_layouts=Replicate()),
            "norm": SequenceParallel()}


def tp_plan(model, tp, sp=True):
    """Tensor parallelism over the 1-D mesh tp: the ends, then every block."""
    parallelize_module(model, tp, sp_ends_plan() if sp else ends_plan())
    parallelize_blocks(model, tp, sp_block_plan if sp else block_plan)
    return model


# %% [markdown]
# Then `fully_shard` over `mesh["dp"]`, each block first and the root last: torchtitan's
# order, tensor parallelism first, FSDP second.

# %%
#@worker
def fsdp(model, mesh, **kw):
    """fully_shard bottom-up: each block is a unit, the root takes embed, norm and head."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **kw)
    return fully_shard(model, mesh=mesh, **kw)


def make_2d(mesh, dtype=torch.float64, device="cpu"):
    """torchtitan's order: tensor parallelism over mesh['tp'] first, then FSDP over mesh['dp']."""
    return fsdp(tp_plan(build(dtype, device), mesh["tp"]), mesh["dp"])


# %% [markdown]
# Every parameter is now a DTensor on the 2-D mesh, with one placement per mesh dimension,
# `(dp, tp)`. FSDP splits dim 0 of every parameter over dp. Where TP split a different dim,
# or nothing, that is a plain `Shard(0)`. Where TP already split dim 0 (the colwise layers,
# and the embedding's rows), FSDP splits each tp shard again, and DTensor records the
# nesting on dp as `_StridedShard(dim=0, sf=2)`: the split factor `sf=2` says that dim 0 was
# already split in 2 by the mesh dimension to the right (tp).
#
# **Predict.** `mlp.up.weight` is [64, 16], colwise; `mlp.down.weight` is [16, 64], rowwise; a
# norm's weight [16] is replicated by TP. What local shape does each rank hold of each, and
# what placements do they show?

# %%
#@worker
def show_placements(model):
    heading("placements")
    shared(f"attention heads per rank {model.blocks[0].attn.heads} of {HEADS}")
    for name, p in model.named_parameters():
        if not name.startswith("blocks.1."):
            shared(f"{name:24s} {str(list(p.shape)):9s} local {str(list(p.to_local().shape)):8s} {p.placements}")
    same = all(p.placements == model.get_parameter(n.replace("blocks.1.", "blocks.0.")).placements
               for n, p in model.named_parameters() if n.startswith("blocks.1."))
    shared(f"blocks.1.*: the same placements as blocks.0.*: {same}")


# %%
show(run, "placements")

# %% [markdown]
# Output:
# ```text
# rank 0: attention heads per rank 2 of 4
# rank 0: embed.weight             [32, 16]  local [8, 16]  (_StridedShard(dim=0, sf=2), Shard(dim=0))
# rank 0: blocks.0.norm1.weight    [16]      local [8]      (Shard(dim=0), Replicate())
# rank 0: blocks.0.norm1.bias      [16]      local [8]      (Shard(dim=0), Replicate())
# rank 0: blocks.0.attn.wq.weight  [16, 16]  local [4, 16]  (_StridedShard(dim=0, sf=2), Shard(dim=0))
# rank 0: blocks.0.attn.wk.weight  [16, 16]  local [4, 16]  (_StridedShard(dim=0, sf=2), Shard(dim=0))
# rank 0: blocks.0.attn.wv.weight  [16, 16]  local [4, 16]  (_StridedShard(dim=0, sf=2), Shard(dim=0))
# rank 0: blocks.0.attn.wo.weight  [16, 16]  local [8, 8]   (Shard(dim=0), Shard(dim=1))
# rank 0: blocks.0.norm2.weight    [16]      local [8]      (Shard(dim=0), Replicate())
# rank 0: blocks.0.norm2.bias      [16]      local [8]      (Shard(dim=0), Replicate())
# rank 0: blocks.0.mlp.up.weight   [64, 16]  local [16, 16] (_StridedShard(dim=0, sf=2), Shard(dim=0))
# rank 0: blocks.0.mlp.up.bias     [64]      local [16]     (_StridedShard(dim=0, sf=2), Shard(dim=0))
# rank 0: blocks.0.mlp.down.weight [16, 64]  local [8, 32]  (Shard(dim=0), Shard(dim=1))
# rank 0: blocks.0.mlp.down.bias   [16]      local [8]      (Shard(dim=0), Replicate())
# rank 0: norm.weight              [16]      local [8]      (Shard(dim=0), Replicate())
# rank 0: norm.bias                [16]      local [8]      (Shard(dim=0), Replicate())
# rank 0: head.weight              [32, 16]  local [8, 16]  (_StridedShard(dim=0, sf=2), Shard(dim=0))
# rank 0: head.bias                [32]      local [8]      (_StridedShard(dim=0, sf=2), Shard(dim=0))
# rank 0: blocks.1.*: the same placements as blocks.0.*: True
# ```

# %% [markdown]
# Three kinds of parameter, column by column:
#
# - split on dim 0 by TP (`wq`, `wk`, `wv`, `mlp.up`, `head`, the row-split `embed`):
#   `Shard(0)` on tp, `_StridedShard(dim=0, sf=2)` on dp. A 64-row weight ends with 16 rows
#   per rank: 64 / 4;
# - split on dim 1 by TP (the rowwise `wo`, `mlp.down`): `Shard(1)` on tp and plain `Shard(0)`
#   on dp, since FSDP's dim is not TP's;
# - replicated by TP (the norms, `mlp.down.bias`): `Replicate()` on tp, `Shard(0)` on dp.
#
# **Predict.** Which rows of `blocks.0.mlp.up.weight` does each rank hold? Does rank 1 (dp 0,
# tp 1) hold rows next to rank 0's?
#
# `rows_held` finds out with a tensor of row numbers of the parameter's shape, cut with the
# parameter's placements by `distribute_tensor(..., src_data_rank=None)`. By default
# `distribute_tensor` sends the data of the first rank of each mesh dimension to the others
# (a scatter or a broadcast); with `src_data_rank=None` each rank cuts its own piece from its
# own copy and nothing is sent (every rank builds the same row numbers). A `redistribute`
# to a placement with `Replicate()` is a real collective, as FSDP's all-gather is.

# %%
#@worker
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


def show_shards(mesh, model):
    heading("shards")
    w = model.blocks[0].mlp.up.weight
    where = f"dp {mesh.get_local_rank('dp')} tp {mesh.get_local_rank('tp')}"
    say(f"{where}: blocks.0.mlp.up.weight rows {rows_held(w)}")
    say(f"{where}: after an all-gather over dp, rows {rows_held(w, [Replicate(), Shard(0)])}; "
        f"under plain (Shard(0), Shard(0)) it would hold rows {rows_held(w, [Shard(0), Shard(0)])}")


# %%
show(run, "shards")


def shards(run):
    """{rank: ((mesh coordinates), (first row, last row))} from a section's 'rows a-b' lines."""
    found = {}
    for name in ("shards", "hsdp"):
        for rank, lines in section(run, name).items():
            for line in lines:
                if m := re.search(r": \w+ (\d) \w+ (\d): blocks\.0\.mlp\.up\.weight rows (\d+)-(\d+)", line):
                    found[name, rank] = ((int(m[1]), int(m[2])), (int(m[3]), int(m[4])))
    return found


def plot_mesh(run):
    """Which rows of blocks.0.mlp.up.weight [64, 16] each rank holds: 2-D mesh and HSDP."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    got = shards(run)
    for ax, name, dims in zip(axes, ("shards", "hsdp"), (("dp", "tp"), ("replicate", "shard"))):
        for (kind, rank), ((row, col), (first, last)) in sorted(got.items()):
            if kind == name:
                ax.add_patch(Rectangle((col, 1 - row), 1, 1, facecolor=f"C{rank}", alpha=0.35, edgecolor="k"))
                ax.text(col + 0.5, 1.5 - row, f"rank {rank}\nrows {first}-{last}", ha="center", va="center")
        ax.set_xlim(0, 2)
        ax.set_ylim(0, 2)
        ax.set_xticks([0.5, 1.5], [f"{dims[1]} 0", f"{dims[1]} 1"])
        ax.set_yticks([1.5, 0.5], [f"{dims[0]} 0", f"{dims[0]} 1"])
        ax.set_title(f"{'2-D: TP then FSDP' if name == 'shards' else 'HSDP'} ({dims[0]} x {dims[1]})")
    fig.suptitle("blocks.0.mlp.up.weight [64, 16]: the rows each rank holds")
    fig.tight_layout()
    return fig


fig = plot_mesh(run)
fig.savefig(HERE / "mesh_shards.png")

# %% [markdown]
# Output:
# ```text
# rank 0: dp 0 tp 0: blocks.0.mlp.up.weight rows 0-15
# rank 0: dp 0 tp 0: after an all-gather over dp, rows 0-31; under plain (Shard(0), Shard(0)) it would hold rows 0-15
# rank 1: dp 0 tp 1: blocks.0.mlp.up.weight rows 32-47
# rank 1: dp 0 tp 1: after an all-gather over dp, rows 32-63; under plain (Shard(0), Shard(0)) it would hold rows 16-31
# rank 2: dp 1 tp 0: blocks.0.mlp.up.weight rows 16-31
# rank 2: dp 1 tp 0: after an all-gather over dp, rows 0-31; under plain (Shard(0), Shard(0)) it would hold rows 32-47
# rank 3: dp 1 tp 1: blocks.0.mlp.up.weight rows 48-63
# rank 3: dp 1 tp 1: after an all-gather over dp, rows 32-63; under plain (Shard(0), Shard(0)) it would hold rows 48-63
# ```

# %% [markdown]
# No. TP splits first: tp 0 owns rows 0–31, tp 1 rows 32–63. FSDP then splits each TP
# shard over dp: within tp 0, dp 0 keeps rows 0–15 and dp 1 rows 16–31. So rank 1, rank 0's
# tp neighbour, holds rows 32–47, and rank 2 holds 16–31. That is what `_StridedShard`
# encodes: gathering over dp alone (what FSDP does before a block runs) gives each rank its
# contiguous TP shard back, rows 0–31 or 32–63, exactly what the colwise layer computes with.
# A plain `Shard(0)` on dp would have meant rank 2 held rows 32–47 instead. (The figure's left
# panel; its right panel is section 2's HSDP.)
#
# **Predict.** Each dp group trains on half of the global batch of 8 sequences; the two tp
# ranks of a group see the same 4. Is one AdamW step on this 2-D model equal to one process
# on all 8 sequences (float64)? How close?

# %%
#@worker
def adamw_step(model, tokens, lr=1e-2):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)  # made after sharding: it sees DTensors
    loss = loss_fn(model, tokens)
    loss.backward()
    opt.step()
    return loss


def below(value, bound=ROUNDING):
    """A rounding-level gap as text: its digits depend on the CPU, its comparison with the bound does not."""
    return f"{value:.1e}, below {bound:.0e}: {value < bound}"


def gap(t, ref):
    """Largest |t - ref| over all ranks; a DTensor is compared shard by shard with the same
    pieces of ref, cut with its own placements (no rank gathers the full tensor)."""
    t, ref = t.detach(), ref.detach()
    if isinstance(t, DTensor):
        ref = distribute_tensor(ref.to(t.device), t.device_mesh, t.placements, src_data_rank=None).to_local()
        t = t.to_local()
    worst = (t - ref.to(t.device)).abs().max().reshape(1).to(torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()


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
    worst = max(gap(p, q) for p, q in zip(model.parameters(), ref.parameters()))
    shared(f"after one AdamW step, parameters vs one process: max gap {below(worst)}")


def show_step(mesh, model, device):
    heading("step")
    check_step(model, mesh.get_local_rank("dp"), 2, device)


# %%
show(run, "step")

# %% [markdown]
# Output:
# ```text
# rank 0: loss: one process 3.877230, mean over ranks 3.877230
# rank 0: after one AdamW step, parameters vs one process: max gap «number», below 1e-12: True
# ```

# %% [markdown]
# Equal, to rounding: each rank's loss is the mean over its dp group's 4 sequences, and the
# mean over the ranks is the one-process loss (to the 6 digits printed). The parameters
# after the step match the one-process parameters to below 1e-12 (the gap's last digits
# depend on the CPU's vector instructions; what matters is the bound). `gap` compares
# shard by shard: it cuts the one-process tensor with the parameter's own placements (with
# `src_data_rank=None` again: nothing sent) and takes the largest gap over all ranks with an
# all-reduce, so no rank gathers a full model.

# %% [markdown]
# ## 2. HSDP: shard within a group, replicate across groups
#
# Hybrid sharding runs FSDP inside each group of a `shard` mesh dimension and plain data
# parallelism (an all-reduce of the gradient shards) across the `replicate` dimension. It is
# one call: `fully_shard(model, mesh=mesh)` with a 2-D mesh `("replicate", "shard")`. Every
# rank trains on its own quarter of the batch.
#
# **Predict.** What placements do the parameters get? Which ranks hold the same rows?

# %%
#@worker
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


# %%
show(run, "hsdp")

# %% [markdown]
# Output:
# ```text
# rank 0: placements of every parameter: ['(Replicate(), Shard(dim=0))']
# rank 0: replicate 0 shard 0: blocks.0.mlp.up.weight rows 0-31
# rank 0: loss: one process 3.877230, mean over ranks 3.877230
# rank 0: after one AdamW step, parameters vs one process: max gap «number», below 1e-12: True
# rank 1: replicate 0 shard 1: blocks.0.mlp.up.weight rows 32-63
# rank 2: replicate 1 shard 0: blocks.0.mlp.up.weight rows 0-31
# rank 3: replicate 1 shard 1: blocks.0.mlp.up.weight rows 32-63
# ```

# %% [markdown]
# `(Replicate(), Shard(dim=0))` for every parameter: sharded in two over `shard`, a full copy
# of that shard on each rank of a `replicate` group. Ranks 0 and 2 hold rows 0–31, ranks 1
# and 3 rows 32–63 (the figure's right panel). Memory per rank is half the model, not a
# quarter; what HSDP buys is in section 3: only the replicate all-reduce runs between the
# groups. The step equals one process to rounding, like the others.

# %% [markdown]
# ## 3. What one step sends
#
# The worker runs one training step (forward, backward, AdamW) of the same float32 model and
# the same global batch of 8 sequences six ways on the 4 ranks, and records every collective
# the step issues. `Wire`, a `TorchDispatchMode` (lesson 02), sees each `c10d` and functional
# collective as it is dispatched, FSDP2's and DDP's included, with the full tensor's size and
# the ranks of its group; `CommDebugMode` (lesson 09) counts them per module.

# %%
#@worker
KINDS = {"allreduce_": "all-reduce", "all_reduce": "all-reduce", "_allgather_base_": "all-gather",
         "all_gather_into_tensor": "all-gather", "_reduce_scatter_base_": "reduce-scatter",
         "reduce_scatter_tensor": "reduce-scatter"}
QUIET = {"wait_tensor", "_wrap_tensor_autograd"}  # funcol bookkeeping, not collectives


class Wire(TorchDispatchMode):
    """Records every collective dispatched while it is active: its kind, its group's ranks,
    the elements of the full tensor, the step's phase, and the last DTensor op seen before it
    (the op whose redistribution issued it). DTensor ops are let through first
    (NotImplemented), to see the collectives they become."""

    def __init__(self):
        super().__init__()
        self.calls, self.phase, self.op = [], "", None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            self.op = func.overloadpacket.__name__
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.namespace in ("c10d", "_c10d_functional") and name not in QUIET:
            self.record(KINDS.get(name, name), args)
        return out

    def record(self, kind, args):
        groups = [a for a in args if isinstance(a, torch.ScriptObject)]
        if groups:  # c10d op: (outputs, inputs, group, ...)
            group = dist.ProcessGroup.unbox(groups[0])
            tensors = args[1] if kind == "reduce-scatter" else args[0]
        else:  # functional collective: (tensor, ..., group name)
            group = dist.distributed_c10d._resolve_process_group(args[-1])
            tensors = args[0]
        tensors = tensors if isinstance(tensors, (list, tuple)) else [tensors]
        size = sum(t.numel() for t in tensors) * (group.size() if kind == "all-gather" and not groups else 1)
        self.calls.append({"kind": kind, "ranks": dist.get_process_group_ranks(group), "numel": size,
                           "bytes": size * tensors[0].element_size(), "phase": self.phase, "op": self.op})


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


# %% [markdown]
# The six strategies, each on all 4 ranks: DDP and FSDP2 over one flat group (each rank a
# quarter of the batch), TP with and without sequence parallelism over all 4 ranks (tp = 4:
# every rank sees all 8 sequences), the 2-D model of section 1 and HSDP.

# %%
#@worker
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


# %% [markdown]
# **Counted vs formula.** What a collective puts on the wire depends on its algorithm. The
# textbook uses ring algorithms: an all-gather or a reduce-scatter of a tensor of `b` bytes
# over `n` ranks sends `b(n−1)/n` bytes from each rank, an all-reduce (a reduce-scatter then
# an all-gather) twice that. The "counted" column applies this ring model to the collectives
# that were actually issued, with their real sizes; the formula column is the textbook's
# estimate from the parameter bytes `P` or the activation size `B·S·H`.
#
# **Predict.** DDP all-reduces the gradients: 2P(N−1)/N per rank. FSDP2 all-gathers the
# parameters in forward, again in backward, and reduce-scatters the gradients: 3P(N−1)/N.
# Will both match the formula exactly?

# %%
#@worker
def ring_bytes(call):
    """Bytes one rank sends for this collective with the ring algorithms: (n-1)/n of the
    full tensor for an all-gather or a reduce-scatter, twice that for an all-reduce."""
    n = len(call["ranks"])
    return call["bytes"] * (n - 1) * (2 if call["kind"] == "all-reduce" else 1) // n


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


def summarise(name, wire, tokens, psi):
    """Print one strategy's collectives per phase, bytes counted vs formula, by payload."""
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
    shared(f"{name:6s} counted {total} B, formula {FORMULAS[name]} = {f} B, counted/formula {total / f:.3f}")
    shared(f"{name:6s} by payload: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items()))
           + "; " + across_nodes(wire.calls))


def show_comms(device):
    heading("comms")
    psi = sum(p.numel() for p in Model().parameters()) * 4
    shared(f"P = {psi // 4} parameters x 4 B = {psi} B (float32); global batch {BATCH} x {S} tokens, H {H}, V {V}")
    root = sum(p.numel() for n, p in Model().named_parameters() if not n.startswith("blocks."))
    shared(f"FSDP units: root (embed, norm, head) {root} elements, each block {(psi // 4 - root) // 2}")
    for name, (model, mine) in strategies(device).items():
        seen = []  # what block 1 receives: what one rank holds between the blocks
        hook = model.blocks[1].register_forward_pre_hook(lambda mod, args: seen.append(args[0])) \
            if name.startswith("TP") else None
        wire, counts = one_step(model, mine)
        summarise(name, wire, mine.shape[0] * S, psi)
        if hook:
            hook.remove()
            show_tp(name, counts, seen[-1])
        if name == "2-D":
            show_local(model, psi)
    show_partial(device)


# %%
comms = section(run, "comms")[0]  # rank 0's lines of section 3
pick(comms, "P =", "FSDP units", "DDP", "FSDP2")

# %% [markdown]
# Output:
# ```text
# rank 0: P = 7520 parameters x 4 B = 30080 B (float32); global batch 8 x 8 tokens, H 16, V 32
# rank 0: FSDP units: root (embed, norm, head) 1088 elements, each block 3216
# rank 0: DDP    forward   none
# rank 0: DDP    backward  1 all-reduce
# rank 0: DDP    optimizer none
# rank 0: DDP    counted 45120 B, formula 2P(N-1)/N = 45120 B, counted/formula 1.000
# rank 0: DDP    by payload: params 45120; in groups spanning both nodes 45120; leaving each node [45120, 45120]
# rank 0: FSDP2  forward   3 all-gather
# rank 0: FSDP2  backward  2 all-gather, 3 reduce-scatter
# rank 0: FSDP2  optimizer none
# rank 0: FSDP2  counted 64416 B, formula 3P(N-1)/N = 67680 B, counted/formula 0.952
# rank 0: FSDP2  by payload: params 64416; in groups spanning both nodes 64416; leaving each node [64416, 64416]
# ```

# %% [markdown]
# DDP matches exactly: one all-reduce in backward, of one bucket holding every gradient.
# FSDP2 sends less than its formula: 5 all-gathers, not 6. The formula assumes every unit
# is gathered again for backward, but FSDP2 keeps the root unit (embedding, final norm and
# head) gathered from forward to backward (`reshard_after_forward=None` for the root, lesson
# 11b). The gap is that one all-gather: 67,680 − 64,416 = 3,264 B = 1,088 root elements × 4 B
# × 3/4. FSDP2 sends 1.43 times DDP's bytes here: the price of holding a quarter of the
# model. (The last number on each "by payload" line comes at the end of this section.)
#
# **Predict.** Tensor parallelism over all 4 ranks, without sequence parallelism: the
# textbook says two all-reduces of `B·S·H` per block in forward (after `wo` and after
# `mlp.down`) and two in backward (the gradients of the inputs of the colwise layers). Every
# rank sees all 8 sequences: B·S·H = 8 × 8 × 16 floats. With sequence parallelism, each
# all-reduce becomes an all-gather plus a reduce-scatter. Which bytes change?

# %%
#@worker
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


# %%
pick(comms, "TP ", "TP+SP ")

# %% [markdown]
# Output:
# ```text
# rank 0: TP     forward   1 all-gather, 5 all-reduce
# rank 0: TP     backward  5 all-reduce
# rank 0: TP     optimizer none
# rank 0: TP     counted 67584 B, formula 8LBSH(N-1)/N = 49152 B, counted/formula 1.375
# rank 0: TP     by payload: activations 61440, logits 6144; in groups spanning both nodes 67584; leaving each node [67584, 67584]
# rank 0: TP     embed     forward 1 all_reduce; backward none
# rank 0: TP     blocks.0  forward 2 all_reduce; backward 2 all_reduce
# rank 0: TP     head      forward 1 all_gather_into_tensor; backward 1 all_reduce
# rank 0: TP     between the blocks each rank holds a Tensor [8, 8, 16]
# rank 0: TP+SP  forward   6 all-gather, 5 reduce-scatter
# rank 0: TP+SP  backward  5 all-gather, 5 reduce-scatter
# rank 0: TP+SP  optimizer 30 all-reduce
# rank 0: TP+SP  counted 70464 B, formula 8LBSH(N-1)/N = 49152 B, counted/formula 1.434
# rank 0: TP+SP  by payload: activations 61440, logits 6144, small grads 2880; in groups spanning both nodes 70464; leaving each node [70464, 70464]
# rank 0: TP+SP  embed     forward 1 reduce_scatter_tensor; backward 1 all_gather_into_tensor
# rank 0: TP+SP  blocks.0  forward 2 all_gather_into_tensor, 2 reduce_scatter_tensor; backward 2 all_gather_into_tensor, 2 reduce_scatter_tensor
# rank 0: TP+SP  head      forward 2 all_gather_into_tensor; backward 1 reduce_scatter_tensor
# rank 0: TP+SP  between the blocks each rank holds a Tensor [8, 2, 16]
# ```

# %% [markdown]
# Inside a block the textbook is exact: `CommDebugMode` counts 2 all-reduces in forward and
# 2 in backward in `blocks.0` (each of 8 × 8 × 16 × 4 = 4,096 B: 6,144 B per rank), 49,152 B
# for two blocks. The model also communicates at its ends, which the formula leaves out: the
# rowwise embedding's forward all-reduce, the colwise head's backward all-reduce (the
# gradient of its replicated input), and the head's all-gather of the logits, which are
# `V` = 32 wide (8 × 8 × 32 × 4 × 3/4 = 6,144 B): 67,584 − 49,152 = 18,432 B = 3 × 6,144.
# The logits are V/H times the size of one `B·S·H` activation: 2 here, 32 for a vocabulary
# of 128k and a width of 4k (part 13c removes that all-gather).
#
# With sequence parallelism every all-reduce inside the blocks became an all-gather and a
# reduce-scatter: the activations line is 61,440 B both ways. The same bytes, less memory:
# between the blocks each rank now holds `[8, 2, 16]` instead of `[8, 8, 16]`, a quarter of
# the sequence, and the norms compute on that quarter. Two things were added: the
# embedding's backward now all-gathers (its rowwise weight gradient needs every token's
# gradient), and the optimizer issues 30 small all-reduces. The next cell finds them.

# %%
#@worker
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


# %%
pick(comms, "Partial")

# %% [markdown]
# Output:
# ```text
# rank 0: Partial gradients, TP+SP and AdamW: 10 after backward; all-reduces in the optimizer step 30: addcmul_ 20, lerp_ 10
# rank 0: Partial gradients, TP+SP and SGD: 10 after backward; all-reduces in the optimizer step 10: add_ 10
# ```

# %% [markdown]
# Under sequence parallelism the norm weights and biases (replicated over tp) get gradients
# from a quarter of the tokens on each rank: their gradients are `Partial` (a sum still to
# be taken) after backward, 10 of them. Nothing reduces them until something reads them: each
# optimizer operation that reads a `Partial` gradient redistributes it to `Replicate`, an
# all-reduce, and does not keep the result. SGD reads each gradient once (`add_`: 10), AdamW
# three times (`lerp_` for the first moment, and `addcmul_(grad, grad)` for the second, which
# reads it twice: 30). Correct, but wasteful. With FSDP on top (next cell) each is
# all-reduced once, in backward: the 2-D step's backward issues 10 all-reduces and its
# optimizer none.
#
# **Predict.** The 2-D step: FSDP over dp = 2 of each tp rank's half of the model, plus
# tensor parallelism over tp = 2 for a dp group's 4 sequences. HSDP: FSDP inside shard
# groups of 2, an all-reduce of the gradient shards across replicate groups of 2. Which is
# closer to its formula?

# %%
#@worker
def show_local(model, psi):
    """What FSDP shards over dp in the 2-D model: each tp rank's part of the parameters."""
    local = {n: p.numel() // (2 if p.placements[1].is_shard() else 1) for n, p in model.named_parameters()}
    root = sum(v for n, v in local.items() if not n.startswith("blocks."))
    shared(f"2-D    a tp rank's parameters {sum(local.values())} elements (P/tp = {psi // 8}), root unit {root}")


# %%
pick(comms, "2-D", "HSDP")

# %% [markdown]
# Output:
# ```text
# rank 0: 2-D    forward   9 all-gather, 5 reduce-scatter
# rank 0: 2-D    backward  7 all-gather, 10 all-reduce, 8 reduce-scatter
# rank 0: 2-D    optimizer none
# rank 0: 2-D    counted 45184 B, formula 3(P/tp)(dp-1)/dp + 8LBSH(tp-1)/tp = 38944 B, counted/formula 1.160
# rank 0: 2-D    by payload: activations 20480, logits 2048, params 22016, small grads 640; in groups spanning both nodes 22016; leaving each node [44032, 44032]
# rank 0: 2-D    a tp rank's parameters 3856 elements (P/tp = 3760), root unit 560
# rank 0: HSDP   forward   3 all-gather
# rank 0: HSDP   backward  2 all-gather, 3 all-reduce, 3 reduce-scatter
# rank 0: HSDP   optimizer none
# rank 0: HSDP   counted 57984 B, formula 3P(s-1)/s + 2(P/s)(r-1)/r = 60160 B, counted/formula 0.964
# rank 0: HSDP   by payload: params 57984; in groups spanning both nodes 15040; leaving each node [30080, 30080]
# ```

# %% [markdown]
# HSDP's formula is FSDP's within a shard group plus an all-reduce of `P/s` across the
# replicate group; again the root's backward all-gather is skipped (60,160 − 57,984 =
# 2,176 B = 1,088 × 4 B × 1/2). The 2-D step's 45,184 B are 6,240 above its formula: TP's
# two ends and the logits again, the `Partial` norm gradients, and a tp rank's half of the
# model is 3,856 elements, not P/tp = 3,760, because what TP replicates is held whole by
# both tp ranks (Going further takes the 6,240 B apart).
#
# **Between machines.** On a cluster the bytes that matter most are those that leave a
# machine: its links to the others are slower than those inside it. Count them with the
# same ring model, as if ranks 0–1 and 2–3 were two machines (part 13b starts them that
# way): in each collective, every rank sends its ring bytes to the next rank of its group,
# and only the links to a rank on the other node cross. In the ring 0 → 1 → 2 → 3 → 0 over
# all 4 ranks, 2 of the 4 links cross: 1 → 2 and 3 → 0, one leaving each node. The cell
# below ends every "by payload" line with two counts: what this rank sends in groups that
# span both nodes, then the bytes leaving each node, summed over the node's ranks by an
# all-reduce.
#
# **Predict.** Each FSDP2 rank sends 64,416 B per step, all of it in the group of 4, which
# spans both nodes. Each HSDP rank sends 15,040 B in its replicate group, the only group
# that spans both. How many bytes leave a node per step in each case?

# %%
#@worker
RANKS_PER_NODE = 2  # counted as if ranks 0-1 and 2-3 were two machines (part 13b launches them so)


def leaving_each_node(calls):
    """Ring model: in each collective this rank sends ring_bytes to the next rank of its
    group (in rank order, the last to the first); count it where that rank is on another
    node, and sum over each node's ranks: [bytes leaving node 0, node 1]."""
    rank, node = dist.get_rank(), dist.get_rank() // RANKS_PER_NODE
    mine = 0
    for call in calls:
        ranks = call["ranks"]
        after = ranks[(ranks.index(rank) + 1) % len(ranks)]
        mine += ring_bytes(call) if after // RANKS_PER_NODE != node else 0
    per_node = torch.zeros(dist.get_world_size() // RANKS_PER_NODE, dtype=torch.int64)
    per_node[node] = mine
    dist.all_reduce(per_node)
    return per_node.tolist()


def across_nodes(calls):
    """The end of a 'by payload' line: what this rank sends in groups that span both nodes,
    then the bytes leaving each node."""
    spanning = sum(ring_bytes(c) for c in calls if len({r // RANKS_PER_NODE for r in c["ranks"]}) > 1)
    return f"in groups spanning both nodes {spanning}; leaving each node {leaving_each_node(calls)}"


# %%
pick(comms, "DDP    by", "FSDP2  by", "TP     by", "TP+SP  by", "2-D    by", "HSDP   by")

# %% [markdown]
# Output:
# ```text
# rank 0: DDP    by payload: params 45120; in groups spanning both nodes 45120; leaving each node [45120, 45120]
# rank 0: FSDP2  by payload: params 64416; in groups spanning both nodes 64416; leaving each node [64416, 64416]
# rank 0: TP     by payload: activations 61440, logits 6144; in groups spanning both nodes 67584; leaving each node [67584, 67584]
# rank 0: TP+SP  by payload: activations 61440, logits 6144, small grads 2880; in groups spanning both nodes 70464; leaving each node [70464, 70464]
# rank 0: 2-D    by payload: activations 20480, logits 2048, params 22016, small grads 640; in groups spanning both nodes 22016; leaving each node [44032, 44032]
# rank 0: HSDP   by payload: params 57984; in groups spanning both nodes 15040; leaving each node [30080, 30080]
# ```

# %% [markdown]
# The last number of each line, counted with the ring model, is what leaves each node per
# step. DDP, FSDP2 and TP over all 4 ranks send one rank's worth across from each node: the
# ring's one crossing link out of it carries as much as any other. The 2-D mesh sends only
# FSDP's dp traffic across and keeps TP's inside a node: both ranks of a node send their
# 22,016 B over dp, 44,032 B. HSDP sends only its replicate all-reduce: 2 × 15,040 =
# 30,080 B leave each node, 0.47 of flat FSDP2's 64,416 B over the same 4 ranks. (How gloo
# or NCCL really route these bytes depends on their algorithms; this is the ring model's
# count, not a measurement.)

# %%
def comm_rows(run):
    """{strategy: (counted, formula, leaving a node)} in bytes, from the comms lines."""
    rows = {}
    for line in (line.split(": ", 1)[1] for line in section(run, "comms")[0]):
        if m := re.fullmatch(r"(\S+) +counted (\d+) B, formula .* = (\d+) B, counted/formula .*", line):
            rows[m[1]] = [int(m[2]), int(m[3])]
        if m := re.fullmatch(r"(\S+) +by payload: .*; leaving each node \[(\d+), (\d+)\]", line):
            rows[m[1]].append(int(m[2]))
    return {k: tuple(v) for k, v in rows.items()}


def plot_bytes(rows):
    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(rows)
    bars = (("counted, per rank", "C0"), ("formula, per rank", "C1"), ("leaving a node", "C3"))
    for i, (label, color) in enumerate(bars):
        ax.bar([x + 0.27 * (i - 1) for x in range(len(names))], [rows[n][i] / 1024 for n in names],
               width=0.27, label=label, color=color)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("KiB per step")
    ax.set_title("One training step, 4 ranks as 2 nodes, the same model (ring model)")
    ax.legend()
    fig.tight_layout()
    return fig


rows = comm_rows(run)
print(f"leaving a node, HSDP / FSDP2: {rows['HSDP'][2] / rows['FSDP2'][2]:.2f}, "
      f"2-D / FSDP2: {rows['2-D'][2] / rows['FSDP2'][2]:.2f}")
fig = plot_bytes(rows)
fig.savefig(HERE / "bytes_per_step.png")

# %% [markdown]
# Output:
# ```text
# leaving a node, HSDP / FSDP2: 0.47, 2-D / FSDP2: 0.68
# ```

# %% [markdown]
# The bars repeat the table: counted (blue) beside formula (orange) per rank, and in red what
# leaves a node. At this toy size TP's activation traffic (61,440 B) is of the order of DDP's
# parameter traffic (45,120 B); which one dominates in a real model depends on `B·S·H`
# against `P`. The difference in kind stays: TP's collectives sit in every block, forward and
# backward, between one matmul and the next, while data parallelism's reduce once per step.
# That is why a cluster keeps tp inside a machine and dp across (part 13b).

# %% [markdown]
# ## Summary
#
# - A 2-D mesh `(dp, tp)` is a grid of ranks; each dimension is a family of process groups,
#   a collective on one runs in each row (or column) separately.
# - torchtitan's order: tensor parallelism over `tp` (colwise q/k/v and up, rowwise output
#   projections, the head count divided by tp; a rowwise embedding and a colwise head;
#   `SequenceParallel` norms with `PrepareModuleInput` before attention and the MLP), then
#   `fully_shard` over `dp`. FSDP's split nests inside TP's (`_StridedShard`: an all-gather
#   over dp gives back the contiguous TP shard); one step equals one process to rounding.
# - HSDP is `fully_shard` on a `(replicate, shard)` mesh: `(Replicate(), Shard(0))`, half the
#   model per rank here.
# - Bytes per rank per step, counted with the ring model from the collectives issued: DDP =
#   2P(N−1)/N exactly; FSDP2 a little under 3P(N−1)/N (the root is not gathered twice); TP's
#   blocks match the textbook, but the embedding and the head (the logits) add to it;
#   sequence parallelism sends the same activation bytes as all-gathers and reduce-scatters
#   and holds 1/tp of the sequence between blocks (a quarter at tp = 4), but leaves `Partial` norm gradients
#   that every optimizer read all-reduces again.
# - Between two nodes of 2 ranks, a flat ring crosses on 2 of its 4 links: DDP, FSDP2 and TP
#   send one rank's bytes out of each node; the 2-D mesh sends only FSDP's dp traffic across,
#   HSDP only its replicate all-reduce, 0.47 of FSDP2's.

# %% [markdown]
# ## Going further
#
# **The 2-D step's 6,240 B above its formula**, in four pieces, each visible in the printed
# lines. The activation part has the same two extra ends as TP (the embedding and the head:
# 4 more collectives of 2,048 B × 1/2, 4,096 B) and the logits' all-gather (2,048 B). The 10
# `Partial` norm gradients are all-reduced once in backward (640 B). And the FSDP part
# differs by −544 B: a tp rank's half of the model is 3,856 elements, not P/tp = 3,760,
# because what TP replicates (norms, `mlp.down.bias`) is held whole by both tp ranks (+96
# elements × 4 B × 3 × 1/2 = +576 B), and the root unit (560 elements here) is not gathered
# again (−1,120 B).
#
# **`PrepareModuleOutput`** is the mirror of `PrepareModuleInput`, for a module whose
# *output* must change layout. The plan needs none: the rowwise layers' `output_layouts=
# Shard(1)` already hand back the sequence shard.
#
# **Why the ring model.** NCCL picks rings or trees per collective and message size, and
# gloo has algorithms of its own; on 2 nodes a tree or a hierarchical all-reduce can send
# fewer bytes across than the ring. The ring model is the one the textbook formulas use, so
# it keeps the counted and the formula columns comparable; for what your cluster really
# sends, read its library's own counters.

# %% [markdown]
# ## References
#
# - [`torch.distributed.device_mesh.init_device_mesh`](https://docs.pytorch.org/docs/2.13/distributed.html):
#   the mesh, its named dimensions and their process groups (section 1).
# - [`torch.distributed.tensor.parallel`](https://docs.pytorch.org/docs/2.13/distributed.tensor.parallel.html):
#   `parallelize_module`, `ColwiseParallel`, `RowwiseParallel`, `SequenceParallel`,
#   `PrepareModuleInput` (section 1).
# - [`torch.distributed.fsdp.fully_shard`](https://docs.pytorch.org/docs/2.13/distributed.fsdp.fully_shard.html):
#   the `mesh` argument, 1-D for FSDP, 2-D for HSDP (sections 1 and 2).
# - [`torch.distributed.tensor`](https://docs.pytorch.org/docs/2.13/distributed.tensor.html):
#   DTensor's placements and `distribute_tensor` (sections 1 and 3).
# - [Megatron-LM: training multi-billion parameter language models using model parallelism](https://arxiv.org/abs/1909.08053):
#   the colwise/rowwise split of attention and the MLP, two all-reduces per block each way.
# - [Reducing activation recomputation in large transformer models](https://arxiv.org/abs/2205.05198):
#   sequence parallelism, all-gathers and reduce-scatters in place of the all-reduces.

# %% [markdown]
# ## Read the source
#
# Where, in the PyTorch you installed, what this part composed is implemented. Open each
# file in your editor at the line printed (the line numbers are those of your installed
# torch; they move between releases). The stops follow the lesson: the rowwise embedding's
# masked lookup, the nested placement that TP-then-FSDP produces, how `fully_shard` builds
# it, and the sequence-parallel norm.

# %%
from sourcemap import read_the_source  # noqa: E402  (lessons/ is on sys.path: first cell)

read_the_source([
    ("torch/distributed/tensor/_ops/_embedding_ops.py", "def embedding_strategy(",
     "The rowwise embedding of section 1: a weight `Shard(0)` gives an output `_MaskPartial`. "
     "The class, in `placement_types.py`, does the rest: `_mask_tensor` shifts the token ids "
     "into this rank's rows and maps the others to row 0, remembering them in a mask; `_reduce_value` "
     "(or `_reduce_shard_value`, under sequence parallelism) sets the masked rows to zero "
     "before the sum over tp."),
    ("torch/distributed/tensor/placement_types.py", "class _StridedShard(",
     "The docstring's example is section 1's on an [8, 8] tensor: on the mesh [[0, 1], [2, 3]], "
     "`(Shard(0), Shard(0))` gives rank 1 the second quarter of the rows, TP-then-FSDP gives it "
     "the third. `split_factor` is the number of shards the dimension already has from the "
     "mesh dimensions to the right (tp), so that reading the placements left to right finds "
     "the rows FSDP really holds."),
    ("torch/distributed/fsdp/_fully_shard/_fsdp_param.py", "def _init_sharding_spec_tp(",
     "`fully_shard` on a parameter that TP already made a DTensor: it joins the dp mesh to TP's "
     "(`DeviceMesh._concatenate`) and puts `_StridedShard(shard_dim, split_factor=...)` on dp "
     "when TP already split FSDP's dim 0 (`num_shards_map`: the colwise layers and the "
     "row-split embedding), plain `Shard(0)` otherwise (rowwise `Shard(1)`, what TP "
     "replicates): section 1's three kinds of "
     "placement. `_init_sharding_spec_plain`, just below, gives a plain parameter on a 2-D "
     "mesh `(Replicate(), Shard(0))`: HSDP."),
    ("torch/distributed/tensor/parallel/style.py", "class SequenceParallel(",
     "`_replicate_module_fn` turns the norm's weight and bias into `Replicate()` DTensors with "
     "`DTensor.from_local` (nothing is sent: every rank is trusted to hold the same values), "
     "and `_prepare_input_fn` makes the input `Shard(1)`, this rank's part of the sequence. A "
     "replicated weight applied to part of the tokens gets part of its gradient: section 3's "
     "10 `Partial` norm gradients."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/distributed/tensor/_ops/_embedding_ops.py:«line»  `def embedding_strategy(`
#     The rowwise embedding of section 1: a weight `Shard(0)` gives an output
#     `_MaskPartial`. The class, in `placement_types.py`, does the rest: `_mask_tensor`
#     shifts the token ids into this rank's rows and maps the others to row 0, remembering
#     them in a mask; `_reduce_value` (or `_reduce_shard_value`, under sequence
#     parallelism) sets the masked rows to zero before the sum over tp.
# torch/distributed/tensor/placement_types.py:«line»  `class _StridedShard(`
#     The docstring's example is section 1's on an [8, 8] tensor: on the mesh [[0, 1], [2,
#     3]], `(Shard(0), Shard(0))` gives rank 1 the second quarter of the rows,
#     TP-then-FSDP gives it the third. `split_factor` is the number of shards the
#     dimension already has from the mesh dimensions to the right (tp), so that reading
#     the placements left to right finds the rows FSDP really holds.
# torch/distributed/fsdp/_fully_shard/_fsdp_param.py:«line»  `def _init_sharding_spec_tp(`
#     `fully_shard` on a parameter that TP already made a DTensor: it joins the dp mesh to
#     TP's (`DeviceMesh._concatenate`) and puts `_StridedShard(shard_dim,
#     split_factor=...)` on dp when TP already split FSDP's dim 0 (`num_shards_map`: the
#     colwise layers and the row-split embedding), plain `Shard(0)` otherwise (rowwise
#     `Shard(1)`, what TP replicates): section 1's three kinds of placement.
#     `_init_sharding_spec_plain`, just below, gives a plain parameter on a 2-D mesh
#     `(Replicate(), Shard(0))`: HSDP.
# torch/distributed/tensor/parallel/style.py:«line»  `class SequenceParallel(`
#     `_replicate_module_fn` turns the norm's weight and bias into `Replicate()` DTensors
#     with `DTensor.from_local` (nothing is sent: every rank is trusted to hold the same
#     values), and `_prepare_input_fn` makes the input `Shard(1)`, this rank's part of the
#     sequence. A replicated weight applied to part of the tokens gets part of its
#     gradient: section 3's 10 `Partial` norm gradients.
# ```

# %% [markdown]
# ## Mastery check
#
# Answer each question before you open its answer; every answer points to the section whose
# printed lines show it.
#
# 1. **Predict.** On the `(dp, tp)` mesh `[[0, 1], [2, 3]]`, `blocks.0.mlp.up.weight`
#    [64, 16] is split colwise over tp, then `fully_shard` splits it over dp. Which rows does
#    rank 1 (dp 0, tp 1) hold? What does its dp placement, `_StridedShard(dim=0, sf=2)`,
#    record, and which rows would a plain `(Shard(0), Shard(0))` give it?
#
#    <details><summary>Answer</summary>
#
#    Rows 32-47. TP splits first (tp 1 owns rows 32-63), then FSDP splits that half over dp.
#    `sf=2` records that the dp split is nested inside a tp split of 2, so an all-gather over
#    dp alone gives rank 1 back rows 32-63, the contiguous TP shard its colwise layer computes
#    with. Under plain `(Shard(0), Shard(0))` it would hold rows 16-31.
#    (*§ Four ranks, one 2-D mesh*)
#
#    </details>
#
# 2. **Explain.** The textbook cost of FSDP is 3P(N−1)/N bytes per rank per step: gather the
#    parameters for forward, again for backward, reduce-scatter the gradients. FSDP2 counted
#    0.952 of it, while DDP matched its 2P(N−1)/N exactly. Which collective is missing, and
#    how many bytes is it?
#
#    <details><summary>Answer</summary>
#
#    FSDP2 issued 3 all-gathers in forward but only 2 in backward: one unit is not gathered
#    again. The missing bytes, 67,680 − 64,416 = 3,264 B, are exactly one all-gather of the
#    root unit (embedding, final norm and head: 1,088 elements × 4 B × 3/4); a block's would
#    be 3,216 elements. DDP sends one all-reduce of all gradients in backward: 45,120 B,
#    formula and count alike. (*§ What one step sends*)
#
#    </details>
#
# 3. **Spot the waste.** Tensor parallelism with sequence parallelism and AdamW: the
#    optimizer step issues 30 all-reduces, though an optimizer communicates nothing on one
#    process. Where do they come from, why 30 with AdamW and 10 with SGD, and what does the
#    2-D step, with FSDP on top, do instead?
#
#    <details><summary>Answer</summary>
#
#    The norms' weights and biases are replicated over tp but see only this rank's tokens,
#    so their 10 gradients are `Partial` after backward. Each optimizer operation that reads
#    one redistributes it to `Replicate`, an all-reduce, and keeps nothing: SGD reads each
#    gradient once (`add_`: 10), AdamW three times (`lerp_` once, `addcmul_` twice: 30). In
#    the 2-D step the 10 all-reduces happen once, in backward, and the optimizer issues none.
#    (*§ What one step sends*)
#
#    </details>
#
# 4. **Predict.** Ranks 0–1 and 2–3 are two nodes. Each FSDP2 rank sends 64,416 B per step
#    over the flat group of 4; each HSDP rank sends 15,040 B in its replicate all-reduce,
#    its only group that spans both nodes. With the ring model, how many bytes leave a node
#    per step in each case, and why is HSDP's not a quarter of FSDP2's?
#
#    <details><summary>Answer</summary>
#
#    FSDP2: 64,416 B. In the ring 0 → 1 → 2 → 3 → 0 only 1 → 2 and 3 → 0 cross, one link
#    out of each node, and each link carries one rank's 64,416 B. HSDP: 30,080 B. Its
#    replicate rings are [0, 2] and [1, 3]: every link crosses, so both ranks of a node send
#    their 15,040 B out, 0.47 of FSDP2's. Counting per rank (15,040 against 64,416) forgets
#    that only half of FSDP2's ring links cross. (*§ What one step sends*)
#
#    </details>
#
# 5. **Transfer.** Eight ranks as two nodes of four (ranks 0–3 and 4–7), on a `(dp, tp)` mesh
#    of shape (2, 4), the same model. Which rows of `blocks.0.mlp.up.weight` [64, 16] does
#    rank 5 hold, and which of its groups cross the nodes?
#
#    <details><summary>Answer</summary>
#
#    The mesh is `[[0, 1, 2, 3], [4, 5, 6, 7]]`, row-major, so rank 5 is dp 1, tp 1. TP over
#    4 ranks gives tp 1 rows 16–31; FSDP splits them over dp: rank 5 holds rows 24–31, and
#    an all-gather over dp gives it rows 16–31 back. Its tp group [4, 5, 6, 7] is a row of
#    the grid, inside node 1; its dp group [1, 5] is a column and crosses, like every dp
#    group. As in the 2-D line of section 3, only FSDP's dp traffic leaves a node, now from
#    all four ranks of each. (*§ Four ranks, one 2-D mesh*, *§ What one step sends*)
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder; `make exercises N=13a` checks your answers in this
# process (no ranks needed) against the numbers this part printed (`solutions.py` has one
# way):
#
# 1. `ring_bytes(kind, nbytes, n)`: the bytes one rank sends for one collective with the ring
#    algorithms.
# 2. `leaving_node(kind, nbytes, groups, ranks_per_node)`: the bytes that leave node 0 when
#    each group of `groups` runs that collective, with the ring model of section 3.
# 3. `rows_held(rows, tp, dp, tp_rank, dp_rank)`: the rows a rank holds of a colwise weight
#    after TP over `tp` ranks, then FSDP over `dp` (the `_StridedShard` layout).
#
# These change the rank code: copy `worker.py`, edit the copy and run it with `torchrun
# --standalone --nproc-per-node=4 <copy> main` from the repository root.
#
# A. Remove `block.attn.heads = HEADS // tp.size()` from `parallelize_blocks`. Does anything
#    raise? Compare the 2-D step with one process.
# B. In `block_plan` (the plan without sequence parallelism), drop the `PrepareModuleInput`
#    of `attn`. How many all-reduces does `blocks.0`'s backward issue in the TP strategy now,
#    and why?
# C. In `strategies`, name the 2-D mesh's dimensions `("tp", "dp")` (tp first). Which groups
#    span both nodes now, what does section 3's last column become for the 2-D strategy, and
#    how would that grow with `B·S·H` against `P` in a larger model?

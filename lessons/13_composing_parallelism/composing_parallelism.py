# %% [markdown]
# # 13 · Composing parallelism: a 2-D mesh, what each step sends, and DDP by hand
#
# Lessons 09–12 took the parallelisms one at a time: collectives and DTensor, tensor and
# pipeline parallelism, FSDP2, checkpoints. A model that needs more than a few GPUs uses
# several at once: tensor parallelism inside a group of GPUs, sharded data parallelism across
# the groups. This lesson composes them the way torchtitan (PyTorch's reference trainer for
# large models) does, on 4 CPU ranks, and measures what every strategy puts on the wire.
#
# **What you will learn**
#
# - a 2-D `DeviceMesh` (`dp` × `tp`), a transformer block's tensor-parallel plan (q/k/v and
#   the MLP's up projection colwise, the output projections rowwise, a local head count,
#   `SequenceParallel` norms with `PrepareModuleInput`), then `fully_shard` over `dp`, in
#   torchtitan's order; each parameter's placements on both mesh dimensions; one step equal
#   to one process;
# - HSDP: `fully_shard` on a (replicate, shard) mesh;
# - the bytes every collective of one training step moves for DDP, FSDP2, TP (with and
#   without sequence parallelism), 2-D and HSDP on the same model, beside the textbook
#   formulas, and where and why they differ;
# - overlap: FSDP2's prefetching and `async_op=True` handles, on a per-rank timeline;
# - activation checkpointing under FSDP2 (peak memory, time), building on the meta device
#   with `to_empty`, `clip_grad_norm_` over DTensors;
# - how 4 ranks start as 2 "nodes" (two torchrun agents, one rendezvous), and which mesh
#   dimension belongs inside a node;
# - compile inside DDP and FSDP2: DDPOptimizer cuts the graph at bucket boundaries; which
#   order breaks the graph; FSDP2's hooks stay outside the compiled blocks;
# - graded exercises: data parallelism written by hand, naive, then bucketed and overlapped.
#
# **Prerequisites:** lesson 09 (collectives, DeviceMesh, DTensor), lesson 10 (colwise and
# rowwise tensor parallelism), lesson 11 (FSDP2), lesson 06a (the profiler), lessons 08a
# and 08b (torch.compile) for section 7.
#
# **How to run:** `python lessons/13_composing_parallelism/composing_parallelism.py` or
# `make lesson N=13` from the repository root, or open `composing_parallelism.ipynb`. It
# launches `worker.py` once on 4 CPU ranks with the course's kit (`lessons/multirank.py`,
# lesson 09; the first cell prints how long it took); every section below reads that
# launch's output, except section 7, which compiles in this process. Each printing cell is
# followed by an *Output* block: what it printed with the pinned PyTorch (2.13.0), checked
# by `make test`. Run outside the course's venv on a CUDA build without a GPU,
# `torch.compile` may also log PyTorch's own diagnostic line `No CUDA runtime is found` to
# stderr. It is harmless, and the course's venv (`.venv`, made by any `make lesson`) turns
# it off.

# %%
import re
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

torch.manual_seed(0)
torch.set_num_threads(1)  # the ranks get one thread each too (the kit sets OMP_NUM_THREADS=1)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
WORKER = HERE / "worker.py"
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's multi-rank kit and source map
from multirank import launch, section, show  # noqa: E402


def rank0(run, name):
    """Rank 0's lines of one section, without the 'rank 0: ' prefix."""
    return [line.split(": ", 1)[1] for line in section(run, name)[0]]


def pick(run, name, *starts):
    """Print rank 0's lines of a section that start with one of `starts`."""
    for line in rank0(run, name):
        if line.startswith(starts):
            print(f"rank 0: {line}")


# %% [markdown]
# ## 1. Four ranks, one 2-D mesh
#
# The worker starts 4 ranks, as two torchrun *agents* of 2 ranks each that meet at one
# rendezvous: exactly how a job on two machines starts (section 6 takes that apart). For
# now, the ranks are 0–3 and `init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))`
# arranges them in a 2 × 2 grid, row-major: `[[0, 1], [2, 3]]`. Each mesh dimension is a
# family of process groups. `mesh["tp"]` is this rank's row, `mesh["dp"]` its column.
#
# **Predict.** Which ranks form rank 0's `dp` group, and which its `tp` group? Rank 1's? Each
# rank all-reduces its own rank number over its `dp` group, then over its `tp` group: what
# sums come back?

# %%
run = launch(WORKER, ["main"], nproc=2, nnodes=2, timeout=300)
print(f"exit code {run.code} after {run.seconds:.0f} s, output from ranks {sorted(run.out)}")
show(run, "mesh")

# %% [markdown]
# Output:
# ```text
# exit code 0 after «time» s, output from ranks [0, 1, 2, 3]
# rank 0: mesh [[0, 1], [2, 3]], dims ('dp', 'tp')
# rank 0: dp group [0, 2], tp group [0, 1]; all_reduce of the ranks over dp 2, over tp 1
# rank 0: attention heads per rank 2 of 4
# rank 1: dp group [1, 3], tp group [0, 1]; all_reduce of the ranks over dp 4, over tp 1
# rank 2: dp group [0, 2], tp group [2, 3]; all_reduce of the ranks over dp 2, over tp 5
# rank 3: dp group [1, 3], tp group [2, 3]; all_reduce of the ranks over dp 4, over tp 5
# ```

# %% [markdown]
# A `tp` group is a row (ranks that differ in their last mesh coordinate), a `dp` group a
# column. The two dimensions are independent: every rank is in exactly one group of each,
# and a collective on `mesh["tp"]` runs in each row separately, never mixing the rows: the
# sum over tp is 0 + 1 = 1 in the first row and 2 + 3 = 5 in the second; over dp it is
# 0 + 2 = 2 in the first column and 1 + 3 = 4 in the second.
#
# **The model.** `worker.py` defines a small decoder: an embedding (vocabulary 32, width 16),
# two pre-norm blocks (LayerNorm, causal attention with 4 heads of width 4, LayerNorm, an
# MLP 16 → 64 → 16, residuals), a final LayerNorm and a linear head: 7,520 parameters. Each
# parameter is initialised from a generator of its own (`init_weights`), so every model in
# the lesson, sharded or not, starts from the same values.
#
# **The tensor-parallel plan** (`tp_plan`, applied with `parallelize_module` on `mesh["tp"]`):
#
# | module | style | what each tp rank holds |
# |---|---|---|
# | `attn.wq`, `attn.wk`, `attn.wv` | `ColwiseParallel` | half the output features: 2 of the 4 heads |
# | `attn.wo` | `RowwiseParallel(output_layouts=Shard(1))` | half the input features |
# | `mlp.up` / `mlp.down` | colwise / rowwise, like `wq` / `wo` | half the hidden units |
# | `norm1`, `norm2`, `norm` | `SequenceParallel()` | the whole weight; runs on half the tokens |
# | `attn`, `mlp` | `PrepareModuleInput(Shard(1) → Replicate())` | gathers the tokens once for q, k and v |
# | `embed` | `RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))` | half the vocabulary rows |
# | `head` | `ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())` | half the vocabulary rows |
#
# With sequence parallelism (`Shard(1)` between the blocks), the residual stream and the
# norms hold only this rank's half of the sequence; attention and the MLP need every token,
# so `PrepareModuleInput` all-gathers the sequence before them and the rowwise layers
# reduce-scatter back to it. The attention module reshapes q, k and v into `heads` heads
# of width 4; a colwise q holds only half the features, so the plan sets each block's
# `attn.heads = 4 // tp` (printed above). No `PrepareModuleOutput` is needed: it is the
# mirror of `PrepareModuleInput`, for a module whose *output* must change layout, and here the
# rowwise layers' `output_layouts=Shard(1)` already hand back the sequence shard. Then
# `fully_shard` over `mesh["dp"]`, each block first and the root last: torchtitan's order,
# tensor parallelism first, FSDP second.
#
# **Predict.** `mlp.up.weight` is [64, 16]. Colwise splits it along dim 0 over tp; FSDP
# then shards every parameter along dim 0 over dp. What does each rank hold, and what
# placements does the parameter show? What about a norm's weight, which TP replicates?

# %%
show(run, "placements")

# %% [markdown]
# Output:
# ```text
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
# Every parameter is now a DTensor on the 2-D mesh, with one placement per mesh dimension,
# `(dp, tp)`. Column by column:
#
# - colwise weights and biases (`wq`, `wk`, `wv`, `mlp.up`, `head`, and the row-split
#   `embed`) are `Shard(0)` on tp, and on dp a `_StridedShard(dim=0, sf=2)`: FSDP splits dim 0
#   again, but *inside* each tp shard, and `sf=2` (the split factor) records that the dp
#   split is nested in a tp split of 2. A 64-row weight ends with 16 rows per rank: 64 / 4;
# - rowwise weights (`wo`, `mlp.down`) are `Shard(1)` on tp (their input features) and plain
#   `Shard(0)` on dp: FSDP's dim 0 is not the dim TP split, so the two compose simply;
# - what TP replicates (the norms, `mlp.down.bias`) is `Replicate()` on tp and `Shard(0)` on dp.
#
# `blocks.1`'s parameters have the same placements as `blocks.0`'s (the last line).
#
# **Predict.** Which rows of `blocks.0.mlp.up.weight` does each rank hold? Does rank 1 (dp 0,
# tp 1) hold rows next to rank 0's?

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
show(run, "step")

# %% [markdown]
# Output:
# ```text
# rank 0: loss: one process 3.877230, mean over ranks 3.877230
# rank 0: after one AdamW step, parameters vs one process: max gap «number», below 1e-12: True
# ```

# %% [markdown]
# Equal, to rounding: each rank's loss is the mean over its dp group's 4 sequences, and the
# mean over the ranks is the one-process loss (to the 6 digits printed). The
# parameters after the step match the one-process parameters to below 1e-12 (the gap itself
# is printed, but its last digits depend on the CPU's vector instructions, so only the bound
# is documented). The worker compares shard by shard: it cuts the one-process tensor with the
# parameter's own placements (`distribute_tensor(..., src_data_rank=None)`, which sends
# nothing: section 5 counts the collectives of a whole build made of such calls) and
# takes the largest gap over all ranks with an all-reduce, so no rank gathers a full model.

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
# quarter; what HSDP buys is in section 3: only the replicate all-reduce crosses between
# the groups. The step equals one process to rounding, like the others.

# %% [markdown]
# ## 3. What one step sends
#
# The worker runs one training step (forward, backward, AdamW) of the same float32 model and
# the same global batch of 8 sequences six ways on the 4 ranks, and records every collective
# the step issues: a `TorchDispatchMode` of its own (`Wire`) sees each `c10d` and functional
# collective as it is dispatched, FSDP2's and DDP's included, with the full tensor's size and
# the ranks of its group; `CommDebugMode` (lesson 09) counts them per module.
#
# **Measured vs formula.** What a collective puts on the wire depends on the algorithm. The
# textbook uses ring algorithms: an all-gather or a reduce-scatter of a tensor of `b` bytes
# over `n` ranks sends `b(n−1)/n` bytes from each rank, an all-reduce (a reduce-scatter then
# an all-gather) twice that. The "measured" column applies these to the collectives that were
# actually issued, with their real sizes; the formula column is the textbook's estimate from
# the parameter bytes `P` or the activation size `B·S·H`. (Gloo's own algorithms may send
# other amounts; the lesson compares what is issued, not what gloo does with it.)
#
# **Predict.** DDP all-reduces the gradients: 2P(N−1)/N per rank. FSDP2 all-gathers the
# parameters in forward, again in backward, and reduce-scatters the gradients: 3P(N−1)/N.
# Will both match the formula exactly?

# %%
pick(run, "comms", "P =", "FSDP units", "DDP", "FSDP2")

# %% [markdown]
# Output:
# ```text
# rank 0: P = 7520 parameters x 4 B = 30080 B (float32); global batch 8 x 8 tokens, H 16, V 32
# rank 0: FSDP units: root (embed, norm, head) 1088 elements, each block 3216
# rank 0: DDP    forward   none
# rank 0: DDP    backward  1 all-reduce
# rank 0: DDP    optimizer none
# rank 0: DDP    measured 45120 B, formula 2P(N-1)/N = 45120 B, measured/formula 1.000
# rank 0: DDP    by payload: params 45120; in groups spanning both nodes 45120
# rank 0: FSDP2  forward   3 all-gather
# rank 0: FSDP2  backward  2 all-gather, 3 reduce-scatter
# rank 0: FSDP2  optimizer none
# rank 0: FSDP2  measured 64416 B, formula 3P(N-1)/N = 67680 B, measured/formula 0.952
# rank 0: FSDP2  by payload: params 64416; in groups spanning both nodes 64416
# ```

# %% [markdown]
# DDP matches exactly: one all-reduce in backward, of one bucket holding every gradient.
# FSDP2 sends less than its formula: 5 all-gathers, not 6. The formula assumes every unit
# is gathered again for backward, but FSDP2 keeps the root unit (embedding, final norm and
# head) gathered from forward to backward (`reshard_after_forward=None` for the root, lesson
# 11). The gap is that one all-gather: 67,680 − 64,416 = 3,264 B = 1,088 root elements × 4 B
# × 3/4. FSDP2 sends 1.43 times DDP's bytes here: the price of holding a quarter of the
# model.
#
# **Predict.** Tensor parallelism without sequence parallelism: the textbook says two
# all-reduces of `B·S·H` per block in forward (after `wo` and after `mlp.down`) and two in
# backward (the gradients of the inputs of the colwise layers). Here every rank sees all 8
# sequences: B·S·H = 8 × 8 × 16 floats. With sequence parallelism, each all-reduce becomes
# an all-gather plus a reduce-scatter. Which bytes change?

# %%
pick(run, "comms", "TP ", "TP+SP ")

# %% [markdown]
# Output:
# ```text
# rank 0: TP     forward   1 all-gather, 5 all-reduce
# rank 0: TP     backward  5 all-reduce
# rank 0: TP     optimizer none
# rank 0: TP     measured 67584 B, formula 8LBSH(N-1)/N = 49152 B, measured/formula 1.375
# rank 0: TP     by payload: activations 61440, logits 6144; in groups spanning both nodes 67584
# rank 0: TP     embed     forward 1 all_reduce; backward none
# rank 0: TP     blocks.0  forward 2 all_reduce; backward 2 all_reduce
# rank 0: TP     head      forward 1 all_gather_into_tensor; backward 1 all_reduce
# rank 0: TP     between the blocks each rank holds a Tensor [8, 8, 16]
# rank 0: TP+SP  forward   6 all-gather, 5 reduce-scatter
# rank 0: TP+SP  backward  5 all-gather, 5 reduce-scatter
# rank 0: TP+SP  optimizer 30 all-reduce
# rank 0: TP+SP  measured 70464 B, formula 8LBSH(N-1)/N = 49152 B, measured/formula 1.434
# rank 0: TP+SP  by payload: activations 61440, logits 6144, small grads 2880; in groups spanning both nodes 70464
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
# of 128k and a width of 4k.
#
# With sequence parallelism every all-reduce inside the blocks became an all-gather and a
# reduce-scatter: the activations line is 61,440 B both ways. The same bytes, less memory:
# between the blocks each rank now holds `[8, 2, 16]` instead of `[8, 8, 16]`, a quarter of
# the sequence, and the norms compute on that quarter; only inside attention and the MLP is
# the whole sequence gathered. Two things were added: the embedding's backward now
# all-gathers (its rowwise weight gradient needs every token's gradient), and the optimizer
# issues 30 small all-reduces. The next cell explains them.

# %%
pick(run, "comms", "Partial")

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
# all-reduce, and does not keep the result. The line names the operation that issued each
# all-reduce: SGD reads each gradient once (`add_`: 10), AdamW three times (`lerp_` for the
# first moment, and `addcmul_(grad, grad)` for the second, which reads it twice: 30).
# Correct, but wasteful. With FSDP on top (next cell) each is all-reduced once, in backward:
# the 2-D step's backward issues 10 all-reduces and its optimizer none.
#
# **Predict.** The 2-D step: FSDP over dp = 2 of each tp rank's half of the model, plus
# tensor parallelism over tp = 2 for a dp group's 4 sequences. HSDP: FSDP inside shard
# groups of 2, an all-reduce of the gradient shards across replicate groups of 2. Which
# bytes cross between the two "nodes" (ranks 0–1 and 2–3)?

# %%
pick(run, "comms", "2-D", "HSDP")

# %% [markdown]
# Output:
# ```text
# rank 0: 2-D    forward   9 all-gather, 5 reduce-scatter
# rank 0: 2-D    backward  7 all-gather, 10 all-reduce, 8 reduce-scatter
# rank 0: 2-D    optimizer none
# rank 0: 2-D    measured 45184 B, formula 3(P/tp)(dp-1)/dp + 8LBSH(tp-1)/tp = 38944 B, measured/formula 1.160
# rank 0: 2-D    by payload: activations 20480, logits 2048, params 22016, small grads 640; in groups spanning both nodes 22016
# rank 0: 2-D    a tp rank's parameters 3856 elements (P/tp = 3760), root unit 560
# rank 0: HSDP   forward   3 all-gather
# rank 0: HSDP   backward  2 all-gather, 3 all-reduce, 3 reduce-scatter
# rank 0: HSDP   optimizer none
# rank 0: HSDP   measured 57984 B, formula 3P(s-1)/s + 2(P/s)(r-1)/r = 60160 B, measured/formula 0.964
# rank 0: HSDP   by payload: params 57984; in groups spanning both nodes 15040
# ```

# %% [markdown]
# The 2-D step's 45,184 B are 6,240 above its formula, in four pieces, each visible in the
# lines: the activation part has the same two extra ends as TP (embedding and head: 4 more
# collectives of 2,048 B × 1/2, 4,096 B), the logits' all-gather (2,048 B), the 10 `Partial`
# norm gradients all-reduced in backward (640 B), and the FSDP part differs by −544 B: a tp
# rank's half of the model is 3,856 elements, not P/tp = 3,760, because what TP replicates
# (norms, `mlp.down.bias`) is held whole by both tp ranks (+96 elements × 4 B × 3 × 1/2 =
# +576 B), and the root unit (560 elements here) is not gathered again (−1,120 B).
#
# HSDP's formula is FSDP's within a shard group plus an all-reduce of `P/s` across the
# replicate group; again the root's backward all-gather is skipped (60,160 − 57,984 =
# 2,176 B = 1,088 × 4 B × 1/2).
#
# The last column is the one that matters on a cluster: the bytes in groups that span both
# nodes. DDP, FSDP2 and TP over all 4 ranks send everything across. The 2-D mesh sends only
# FSDP's dp traffic across (22,016 B) and keeps TP's inside a node; HSDP sends only its
# replicate all-reduce across: 15,040 B = 2(P/2)(1/2), under a quarter of the 64,416 B
# FSDP2 sends across over the same 4 ranks.


# %%
def comm_rows(run):
    """{strategy: (measured, formula, across nodes)} in bytes per rank, from the comms lines."""
    rows = {}
    for line in rank0(run, "comms"):
        if m := re.fullmatch(r"(\S+) +measured (\d+) B, formula .* = (\d+) B, measured/formula .*", line):
            rows[m[1]] = [int(m[2]), int(m[3])]
        if m := re.fullmatch(r"(\S+) +by payload: .*; in groups spanning both nodes (\d+)", line):
            rows[m[1]].append(int(m[2]))
    return {k: tuple(v) for k, v in rows.items()}


def plot_bytes(rows):
    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(rows)
    for i, (label, color) in enumerate((("measured", "C0"), ("formula", "C1"), ("measured, across nodes", "C3"))):
        ax.bar([x + 0.27 * (i - 1) for x in range(len(names))], [rows[n][i] / 1024 for n in names],
               width=0.27, label=label, color=color)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("KiB sent per rank per step")
    ax.set_title("One training step, 4 ranks, the same model: bytes per rank (ring algorithms)")
    ax.legend()
    fig.tight_layout()
    return fig


fig = plot_bytes(comm_rows(run))
fig.savefig(HERE / "bytes_per_step.png")

# %% [markdown]
# The bars repeat the table: measured (blue) beside formula (orange), and in red the part
# sent in groups that span both nodes. At this toy size TP's activation traffic (61,440 B)
# is of the order of DDP's parameter traffic (45,120 B); which one dominates in a real model
# depends on `B·S·H` against `P`. The difference in kind stays: TP's collectives sit in every
# block, forward and backward, between one matmul and the next, while data parallelism's
# reduce once per step. Section 6 puts each where it belongs.

# %% [markdown]
# ## 4. Overlap: prefetching and asynchronous collectives
#
# Communication can hide behind computation only if it is *issued* before the computation
# that could hide it. FSDP2 issues each unit's all-gather in the unit's pre-forward hook, so
# by default block 1's parameters are requested when block 1 starts.
# `blocks[0].set_modules_to_forward_prefetch([blocks[1]])` asks block 0 to issue block 1's
# all-gather as well when it starts; `set_modules_to_backward_prefetch` is the same for
# backward. The worker runs FSDP2 over the 4 ranks (float32, 32 sequences per rank) with and
# without these settings and records, on one clock per rank, when each collective was
# issued and completed and when each block computed (module hooks for forward, gradient
# hooks on each block's output and input for backward).
#
# **Predict.** Without explicit prefetching, is block 1's all-gather issued before block 0
# computes? With it? In backward, is block 1's reduce-scatter issued before backward is over?

# %%
show(run, "overlap")

# %% [markdown]
# Output:
# ```text
# rank 0: prefetch False: all-gathers 5, reduce-scatters 3
# rank 0: prefetch False: blocks.1's all-gather issued before blocks.0's forward began: False, after it ended: True
# rank 0: prefetch False: blocks.0 gathered again before blocks.1's backward ended: True
# rank 0: prefetch False: blocks.1's reduce-scatter issued before blocks.0's backward began: True
# rank 0: prefetch True : all-gathers 5, reduce-scatters 3
# rank 0: prefetch True : blocks.1's all-gather issued before blocks.0's forward began: True, after it ended: False
# rank 0: prefetch True : blocks.0 gathered again before blocks.1's backward ended: True
# rank 0: prefetch True : blocks.1's reduce-scatter issued before blocks.0's backward began: True
# rank 0: step time with prefetch / without: «ratio»
# ```

# %% [markdown]
# Without prefetching, block 1's all-gather is issued after block 0's forward ended; with it,
# before block 0's forward began, so it can travel while block 0 computes. In backward the
# two settings read the same: FSDP2 already issues block 0's all-gather before block 1's
# backward is over, without being told, and block 1's reduce-scatter is issued before block
# 0's backward begins: the blocks below still have backward to do while it travels. That is
# where data-parallel communication hides: behind the rest of backward.
#
# The step-time ratio is printed, not promised: 4 ranks on 2 cores have no idle core, the
# collectives here are gloo's threads competing with compute for the same two cores, and the
# ratio moves from run to run.
#
# **Async handles.** Any collective can be issued the same way by hand: `dist.all_reduce(x,
# async_op=True)` returns a handle at once; the result is valid after `handle.wait()`. The
# worker makes the last rank join 0.5 s late (a slow peer), issues the all-reduce on every
# rank, computes something that does not need `x`, then waits.
#
# **Predict.** On rank 0, when does the all-reduce complete: before or after the compute?

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
# began (the times are this run's; the order is what the test checks). After `wait()`, `x`
# holds the sum, 10 = 1 + 2 + 3 + 4. Such a callback needs the handle's future, and gloo
# gives one for an all-gather but not for a reduce-scatter (the last two lines), which is
# why the figure below can time one and not the other.


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
# blue bars all-gathers from issue to completion (a callback on the collective's future),
# red ticks reduce-scatters at the moment they were issued (gloo's reduce-scatter handle has
# no future to time its end, as the previous cell printed). Where a blue bar runs under a green one, communication and
# computation overlap. The picture changes from run to run with the load on the machine;
# the order the previous cell printed does not.

# %% [markdown]
# ## 5. Memory: activation checkpointing, meta-device init, clipping
#
# **Activation checkpointing** keeps only a block's input for backward and runs the block's
# forward again during backward to rebuild what the gradient needs. Under FSDP2 it wraps
# what the block computes (the worker's `Block.forward` calls `torch.utils.checkpoint.
# checkpoint(self.inner, x, use_reentrant=False)`), and FSDP2's hooks stay on the block, so
# the recomputation finds the block's parameters gathered for its backward. The worker
# measures, on each rank, the peak of the bytes allocated during one forward + backward
# (`torch.profiler` with `profile_memory=True`: the running sum of its allocation events) and
# counts the blocks' forward computations.
#
# **Predict.** How many block computations per step with checkpointing? Does the peak go down,
# and do the gradients change?

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
# What checkpointing saves is visible in what autograd keeps (`saved_tensors_hooks` on one
# plain block, its parameters left out). Without AC a block keeps 15 tensors: the norms'
# inputs `[32, 8, 16]` and their statistics `[32, 8, 1]`, the inputs of the linear layers
# (`[256, 16]`: q, k and v share one), attention's q, k, v and output `[32, 4, 8, 4]` and a
# log-sum-exp `[32, 4, 8]`, the MLP's 64-wide hidden layer before and after the GELU. No
# `[…, 8, 8]` tensor: the CPU's fused attention kernel keeps no S × S probability matrix; it
# recomputes the probabilities in backward from the log-sum-exp. With AC the block keeps one
# tensor: its input. The profiler's peak drops on every rank (the test checks below 80 % of
# the peak without AC), but by less than the two blocks' kept bytes (2 × 270,336 B down to
# 2 × 16,384 B): in backward each block's activations are rebuilt, one block at a time, and
# the peak holds more than the blocks' activations (the head's logits, for one).
# The price is one more forward per block; on these loaded cores the time ratio is too noisy
# to read (it is printed, not checked).
#
# **Meta-device initialisation.** Building the full model on every rank and then sharding it
# needs the whole model's memory on every rank first. torchtitan builds the model on the
# `meta` device (shapes, no storage), applies TP and FSDP there, then `model.to_empty(
# device=...)` allocates storage for this rank's shards only, uninitialised, and an
# `init_weights` fills them. The worker's `init_weights` makes one full parameter at a time
# from its own generator and keeps this rank's piece (`distribute_tensor(full, mesh,
# placements, src_data_rank=None)`: each rank cuts its own piece). The worker counts the
# collectives issued meanwhile.
#
# **Predict.** How many of the model's bytes does each rank hold after `to_empty`, and is the
# result equal to building the full model in one process?

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
# bytes on every rank: no rank ever held the model. The values are bitwise those of
# the one-process build, because each parameter's values depend only on its own generator,
# not on how it is sharded.
#
# **Gradient clipping over DTensors.** `torch.nn.utils.clip_grad_norm_` needs the norm of all
# gradients together, and each rank holds only pieces of them. Over DTensor gradients the
# norm is a DTensor computation like any other: partial norms on each rank, reduced over the
# mesh. The worker records the collectives the call issues.
#
# **Predict.** Is the 2-D model's total norm the one-process norm, and are the clipped
# gradients equal?

# %%
show(run, "clip")

# %% [markdown]
# Output:
# ```text
# rank 0: total norm: one process 1.581103; 2-D a DTensor (Replicate(), Replicate()), gap «number», below 1e-12: True
# rank 0: clipped gradients vs one process: max gap «number», below 1e-12: True
# rank 0: collectives in clip_grad_norm_: all-reduce of 29 over [0, 2] (from linalg_vector_norm), all-reduce of 29 over [0, 1] (from linalg_vector_norm)
# ```

# %% [markdown]
# The total norm comes back as a DTensor replicated on both mesh dimensions, equal to the
# one-process norm, and the clipped gradients match to rounding. No special API: the same
# call as on one process. Its communication is two small all-reduces: each rank computes
# the norms of its pieces of the 29 gradients, and DTensor reduces the 29 partial norms
# once over dp, then once over tp. (Rank 0's log also carries DTensor's warning that two
# sequential all-reduces are suboptimal and that flattening the mesh's two dimensions
# would allow one.)

# %% [markdown]
# ## 6. Past one machine: two agents, one rendezvous
#
# The launch in section 1 ran two torchrun agents on this machine, each with
# `--nproc-per-node=2`, both with `--nnodes=2`, the same `--rdzv-id`, `--rdzv-backend=c10d`
# and `--rdzv-endpoint=127.0.0.1:PORT` (the kit's `launch(..., nnodes=2)`, which also gives
# the first agent `--rdzv-conf=is_host=1`: it hosts the rendezvous store, the other connects
# to it). Two terminals reproduce it; without `is_host`, each agent whose machine the
# endpoint names tries to host the store, and the one that finds the port taken connects to
# it instead:
#
# ```sh
# torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29500 \
#     --rdzv-id=13 lessons/13_composing_parallelism/worker.py nodes     # once in each terminal
# ```
#
# The agents agree on the group, number themselves (the node rank, `GROUP_RANK`) and give
# their ranks `RANK`, `LOCAL_RANK` and the sizes.
#
# **Predict.** Which `GROUP_RANK` does rank 3 get? Which mesh groups cross between nodes?

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
# reduction, which overlaps with backward, or HSDP's replicate all-reduce) across nodes. The
# same holds for HSDP: `("replicate", "shard")` shards inside a node and replicates across.
#
# On a real cluster the launch differs in three places: each node runs one agent with
# `--nproc-per-node` set to its GPU count; `--rdzv-endpoint` is a host and port every node
# can reach (usually the first node's address, given by the scheduler); and the workers
# use `backend="nccl"` with one GPU per rank, set from `LOCAL_RANK`
# (`worker.py ... --backend nccl` does it through the kit). The mesh code does not change.
#
# **On 4 GPUs.** `worker.py twod --backend nccl` runs section 1 on a CUDA mesh with NCCL; the
# test `test_two_d_step_on_nccl` (marker `multigpu`, skipped with fewer than 4 GPUs) runs it.
# It was written without such a machine and has not been run: unverified.

# %% [markdown]
# ## 7. Compile inside the data-parallel wrapper: DDP and FSDP2
#
# Lesson 08b compiled a model in one process. DDP and FSDP2 both send gradients from hooks
# that fire while autograd runs the backward, and a compiled region's backward is *one*
# autograd node: every gradient it makes becomes ready at the same moment, when the whole
# node has finished. So where the compiled regions begin and end decides when the
# wrapper's hooks can fire, and whether communication overlaps the backward (section 4).
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
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


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
# holds four `CompiledFunctionBackward` nodes with the split, one without: the lines
# above count them), so the last
# layer's gradients are ready, and DDP's hook can start their all-reduce, while the earlier
# layers' backward still runs: communication overlaps computation (the reason its
# docstring, *Note [DDPOptimizer]*, gives for the split). With `optimize_ddp=False` there
# is one graph and one backward node: every bucket's all-reduce waits for the whole
# backward. The same loss and gradients either way (within 1e-6: `aot_eager` runs the
# same kernels as eager); only the time at which communication can start differs, which
# section 4's timeline shows for FSDP2.
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
# pieces of DDP held no tensor operation, so the backend never received them. (Tracing
# DDP's `forward`, Dynamo also met the profiler `record_function` that DDP opens to label
# its work, and ignored it: it says so on stderr, `Profiler record function ... will be
# ignored`, once per process.) Compiling the model and then wrapping it left DDP's
# `forward` to run eagerly: no break at all. That is the order PyTorch's page *Where to
# apply torch.compile?* recommends, saying that `torch.compile` does not handle distributed
# wrappers like DDP or FSDP very well; torchtitan does the same, compiling each
# transformer block and then applying its data-parallel wrapper.
#
# The last line is why `Stack` is a class of our own. `model.compile()` installs
# `torch.compile(model._call_impl)`; for an `nn.Sequential` of torch's layers, that method
# and every `forward` below it live in torch's files, which Dynamo skips as starting
# frames, so it captured nothing and the model ran eagerly, with no error or warning
# (pytorch/pytorch#150915; a Sequential that holds a module of your own captures only that
# module's `forward`, and the torch layers beside it run eagerly). `torch.compile(model)`
# wraps the module itself and captures it. Count your graphs (a counting backend, or `TORCH_LOGS=graph`) before trusting either.
#
# **Predict.** FSDP2 the way torchtitan does it (section 1's order, with compile added):
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
# stay outside them both ways. torchtitan compiles first by convention (read from
# torchtitan's `parallelize.py`). Each compiled region is one block: FSDP keeps scheduling
# its collectives block by block around it, exactly as in eager (lesson 11 and section 4),
# and the identical blocks share their graphs (eight blocks give the same two). FSDP2
# keeps its hooks out of every graph: it wraps each of them in `torch._dynamo.disable`
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
# - A 2-D mesh `(dp, tp)` is a grid of ranks; each dimension is a family of process groups.
#   torchtitan's order: tensor parallelism over `tp` (colwise q/k/v and up, rowwise output
#   projections, the head count divided by tp, `SequenceParallel` norms with
#   `PrepareModuleInput` before attention and MLP), then `fully_shard` over `dp`. FSDP's split
#   nests inside TP's (`_StridedShard`); one step equals one process to rounding.
# - HSDP is `fully_shard` on a `(replicate, shard)` mesh: `(Replicate(), Shard(0))`.
# - Bytes per rank per step, measured from the collectives issued: DDP = 2P(N−1)/N exactly;
#   FSDP2 a little under 3P(N−1)/N (the root is not gathered twice); TP's blocks match the
#   textbook, but the embedding and the head (the logits) add to it; sequence parallelism
#   sends the same activation bytes as all-gathers and reduce-scatters and holds a quarter
#   of the sequence between blocks, but leaves `Partial` norm gradients that every optimizer
#   read all-reduces again; 2-D and HSDP send across nodes only their data-parallel part.
# - Overlap is about *issue order*: forward prefetch issues the next block's all-gather
#   before the current block computes; backward issues each reduce-scatter while backward
#   goes on; `async_op=True` + `wait()` does the same by hand.
# - Activation checkpointing under FSDP2: twice the block computations, identical gradients,
#   a block keeps only its input, a lower peak. Meta-device init + `to_empty` + a per-parameter init: no rank ever holds
#   the model. `clip_grad_norm_` over DTensors is the global norm.
# - Several torchrun agents with one c10d rendezvous make a multi-node job; keep tp inside a
#   node (last mesh dimension), dp across.
# - Compiled under DDP, Dynamo cuts the graph where DDP's buckets end (`optimize_ddp=True`,
#   the default), so each bucket's all-reduce can start during backward; compiling the DDP
#   module also breaks the graph inside DDP's own `forward`, compiling the model and then
#   wrapping it does not. With FSDP2, compile each block and `fully_shard` each block and
#   the root, in either order: FSDP's hooks, never traced, stay outside the graphs. `model.compile()` on an
#   `nn.Sequential` of torch's layers captures nothing: count graphs.

# %% [markdown]
# ## Read the source
#
# Where, in the PyTorch you installed, what this lesson composed is implemented. Open each
# file in your editor at the line printed (the line numbers are those of your installed
# torch; they move between releases). The stops follow the lesson: the nested placement
# that TP-then-FSDP produces and how `fully_shard` builds it, the sequence-parallel norm,
# FSDP2's default backward prefetch, sharding a tensor without sending it, and how two
# torchrun agents number four ranks.

# %%
from sourcemap import read_the_source  # noqa: E402  (lessons/ is on sys.path: first cell)

read_the_source([
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
    ("torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "def _backward_prefetch(",
     "`pre_backward` calls it when the unit has no explicit backward-prefetch list: it takes "
     "the unit whose forward ended just before this one's (`post_forward_order[curr_index - 1]`) "
     "and issues its all-gather (`_prefetch_unshard`) before this unit's backward runs, which "
     "is why `blocks.0` was gathered again before `blocks.1`'s backward ended with prefetch "
     "False too. Forward has no such default: `_pre_forward` in `_fsdp_state.py` prefetches "
     "only the list `set_modules_to_forward_prefetch` fills."),
    ("torch/distributed/tensor/_api.py", "def distribute_tensor(",
     "With `src_data_rank=None` each placement only cuts this rank's piece out of the tensor "
     "it was given: `Shard` and `_StridedShard` split locally (`_shard_tensor` scatters only "
     "from a source rank) and `Replicate` keeps it (`_make_replicate_tensor` broadcasts only "
     "from a source rank). That is how section 5's meta-device init issued 0 collectives; "
     "the default, `src_data_rank=0`, scatters and broadcasts rank 0's tensor instead."),
    ("torch/distributed/elastic/agent/server/api.py", "def _assign_worker_ranks(",
     "How two agents number four ranks: each agent writes its `local_world_size` to the "
     "rendezvous store, the agent of group rank 0 gives each agent, in group-rank order, a "
     "base equal to the sum of the local world sizes before it, and a worker's `RANK` is that "
     "base plus its `LOCAL_RANK`: node by node, so that, with the same `LOCAL_WORLD_SIZE` on "
     "every agent, `rank // LOCAL_WORLD_SIZE` is `GROUP_RANK` (section 6)."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
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
# torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py:«line»  `def _backward_prefetch(`
#     `pre_backward` calls it when the unit has no explicit backward-prefetch list: it
#     takes the unit whose forward ended just before this one's
#     (`post_forward_order[curr_index - 1]`) and issues its all-gather
#     (`_prefetch_unshard`) before this unit's backward runs, which is why `blocks.0` was
#     gathered again before `blocks.1`'s backward ended with prefetch False too. Forward
#     has no such default: `_pre_forward` in `_fsdp_state.py` prefetches only the list
#     `set_modules_to_forward_prefetch` fills.
# torch/distributed/tensor/_api.py:«line»  `def distribute_tensor(`
#     With `src_data_rank=None` each placement only cuts this rank's piece out of the
#     tensor it was given: `Shard` and `_StridedShard` split locally (`_shard_tensor`
#     scatters only from a source rank) and `Replicate` keeps it (`_make_replicate_tensor`
#     broadcasts only from a source rank). That is how section 5's meta-device init issued
#     0 collectives; the default, `src_data_rank=0`, scatters and broadcasts rank 0's
#     tensor instead.
# torch/distributed/elastic/agent/server/api.py:«line»  `def _assign_worker_ranks(`
#     How two agents number four ranks: each agent writes its `local_world_size` to the
#     rendezvous store, the agent of group rank 0 gives each agent, in group-rank order, a
#     base equal to the sum of the local world sizes before it, and a worker's `RANK` is
#     that base plus its `LOCAL_RANK`: node by node, so that, with the same
#     `LOCAL_WORLD_SIZE` on every agent, `rank // LOCAL_WORLD_SIZE` is `GROUP_RANK`
#     (section 6).
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
#    parameters for forward, again for backward, reduce-scatter the gradients. FSDP2 measured
#    0.952 of it, while DDP matched its 2P(N−1)/N exactly. Which collective is missing, and
#    how many bytes is it?
#
#    <details><summary>Answer</summary>
#
#    FSDP2 issued 3 all-gathers in forward but only 2 in backward: one unit is not gathered
#    again. The missing bytes, 67,680 − 64,416 = 3,264 B, are exactly one all-gather of the
#    root unit (embedding, final norm and head: 1,088 elements × 4 B × 3/4); a block's would
#    be 3,216 elements. DDP sends one all-reduce of all gradients in backward: 45,120 B,
#    formula and measurement alike. (*§ What one step sends*)
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
# 4. **Predict.** Under FSDP2, each block computes through `checkpoint(...,
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
# 5. **Explain.** The 4 ranks start as two torchrun agents of 2 ranks, two "nodes". Why does
#    the lesson name the mesh dimensions `("dp", "tp")`, tp last, and what does the 2-D step
#    send between the nodes?
#
#    <details><summary>Answer</summary>
#
#    The agents number the ranks node by node (`rank // LOCAL_WORLD_SIZE` is `GROUP_RANK` on
#    every rank), and the mesh holds consecutive ranks along its last dimension
#    (`[[0, 1], [2, 3]]`): the tp groups `[0, 1]` and `[2, 3]` stay inside a node, the dp
#    groups `[0, 2]` and `[1, 3]` cross (*§ Past one machine: two agents, one rendezvous*).
#    Tensor parallelism communicates activations inside every block, forward and backward
#    (`blocks.0` alone: 2 + 2 all-reduces without sequence parallelism, 2 all-gathers and
#    2 reduce-scatters each way with it); with tp inside a node, the 2-D step sends across
#    nodes only FSDP's traffic over dp (its parameter all-gathers and gradient
#    reduce-scatters, the `params` payload), 22,016 of its 45,184 B
#    (*§ What one step sends*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder; `make exercises N=13` runs your code on 2 gloo ranks
# (through the kit) beside `nn.parallel.DistributedDataParallel` on the same model and data
# and compares gradients and parameters after 3 steps (`solutions.py` has one way):
#
# 1. `all_reduce_grads(model)`: naive data parallelism, one all-reduce per gradient after
#    backward. Forgetting to divide by the world size is caught.
# 2. `Bucketed(model, bucket_bytes)` with `finish()`: gradients in buckets, each bucket
#    all-reduced asynchronously from a `register_post_accumulate_grad_hook` as soon as it is
#    full, all handles waited in `finish()`. The tests check that it issues fewer
#    collectives than (1), starts before backward ends, never waits inside backward, and
#    flushes every bucket (a last, partly filled bucket included).
#
# These change the worker:
#
# A. Remove `block.attn.heads = HEADS // tp.size()` from `tp_plan`. Does anything raise?
#    Compare the 2-D step with one process.
# B. In `tp_plan`, drop the `PrepareModuleInput` of `attn` in the plan without sequence
#    parallelism. How many all-reduces does `blocks.0`'s backward issue now, and why?
# C. In `strategies`, name the 2-D mesh's dimensions `("tp", "dp")` (tp first). Which groups
#    cross the nodes now, and what does section 3's last column become for the 2-D strategy?

# %% [markdown]
# # 13c · Composing parallelism: torchtitan's recipe on a fake 8-rank world
#
# Parts 13a and 13b composed tensor parallelism and FSDP2 on 4 CPU ranks and measured what
# each step sends, overlaps and keeps in memory. This part reads how torchtitan, PyTorch's
# reference trainer for large models, puts the same pieces together, in a named release
# (torchtitan 0.3.0, read from its wheel; the course does not install it), and applies that
# recipe to a small transformer on a world of 8 ranks simulated in this one process.
#
# **What you will learn**
#
# - torchtitan's choices, read from its source: its mesh dimension names (`pp`,
#   `dp_replicate`, `fsdp`, `tp`), the order TP → activation checkpointing → per-block
#   compile → FSDP, and its FSDP units (the embedding, each block, `[norm, lm_head]` kept
#   unsharded after forward, the root);
# - a fake process group: 8 ranks' shapes and collectives without 8 processes, and what it
#   does not compute;
# - the recipe applied: every FSDP unit, what it holds on each mesh dimension, and which
#   parameters stay gathered after a forward;
# - `loss_parallel`: the loss on vocabulary-sharded logits, with three all-reduces of one
#   value per token instead of an all-gather of the logits, and why the result is exact;
# - what changes between this process and a cluster of GPUs.
#
# **Prerequisites:** parts 13a and 13b (a 2-D mesh, HSDP, `_StridedShard`, activation
# checkpointing, compile under FSDP2), lesson 10 (colwise and rowwise tensor parallelism,
# `SequenceParallel`), parts 11a (`fully_shard` and its units) and 11b (`reshard_after_forward`,
# the fake process group), lesson 08a
# (`torch.compile`).
#
# **How to run:** `python lessons/13c_cluster_recipe/cluster_recipe.py` or
# `make lesson N=13c` from the repository root, or open `cluster_recipe.ipynb`. Everything
# runs in this process on the CPU: no rank is launched. Each printing cell is followed by an
# *Output* block: what it printed with the pinned PyTorch (2.13.0). Run outside the course's
# venv on a CUDA build without a GPU, `torch.compile` may also log PyTorch's own diagnostic
# line `No CUDA runtime is found` to stderr. It is harmless.

# %%
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

torch.manual_seed(0)
torch.set_num_threads(1)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()

# %% [markdown]
# ## 1. What torchtitan 0.3.0 does
#
# torchtitan's recipe for a Llama model, read from its 0.3.0 wheel (every path below is
# inside its `torchtitan/` package), takes five steps, and each section of this part runs
# one or two of them after quoting the file it follows: a mesh of named dimensions
# (section 2); tensor parallelism on each block and on the head (section 3); activation
# checkpointing, per-block compile and FSDP, in that order (section 4); and the loss on the
# vocabulary-sharded logits (section 5). The order is `parallelize_llama`'s, in
# `models/llama3/parallelize.py`: TP first, then AC, then "per-TransformerBlock compile
# after AC wrapping and before FSDP", then FSDP last.
#
# Mapped to what you did: 13a's `("dp", "tp")` mesh is `("fsdp", "tp")` here, and its HSDP
# mesh `(replicate, shard)` is `("dp_replicate", "fsdp")`; 13a's order (TP, then FSDP over
# the data-parallel dimension) is torchtitan's, with 13b's checkpointing and per-block
# compile slotted in between; 11a's units were the blocks and the root, and
# `[norm, lm_head]` is the new one.

# %% [markdown]
# ## 2. Eight ranks in one process: a fake process group
#
# torchtitan builds its mesh in `distributed/parallel_dims.py` from five degrees, `pp`,
# `dp_replicate`, `dp_shard`, `cp` (context parallelism) and `tp`, whose product is the
# world size (`dp_shard = -1` takes what the others leave). It can lay them out three ways
# (`spmd_backend`, `config/configs.py`). The default, `spmd_types`, runs on a package of
# that name outside PyTorch, which the wheel requires (`spmd_types==0.2.3` in its metadata;
# `parallel_dims.py` imports it); `full_dtensor` keeps `dp_shard` and `cp` as separate
# dimensions. This part follows `partial_dtensor`, which `parallel_dims.py` calls the legacy
# path, because it uses only the DTensor APIs of lessons 09–13: it names the dense mesh
# `("pp", "dp_replicate", "fsdp", "tp")` with `fsdp = dp_shard × cp`, so context-parallel
# ranks also shard the weights. A dimension of size 1 gets a fake group, so no communicator
# is built for it, except the dense mesh's `fsdp`, kept real even at size 1 so that
# `fully_shard` can apply its mixed-precision policy (`_mesh_exist` in `parallel_dims.py`).
#
# Eight real ranks would cost eight processes. As in 11b, this process plays rank 0 on
# PyTorch's fake backend, now of a world of 8: every shape is right, no value a collective
# would have brought in is. A `FakeStore` (from `torch.testing._internal.distributed.fake_pg`)
# stands in for the store.
#
# **Predict:** rank 0 all-reduces a tensor of ones over 8 fake ranks. What does it hold?

# %%
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
ones = torch.ones(2)
dist.all_reduce(ones)  # a real group of 8 would give 8 in each entry
print(f"world size {dist.get_world_size()}, rank {dist.get_rank()}, backend {dist.get_backend()}")
print(f"all_reduce of ones over 8 fake ranks: {ones.tolist()}")

mesh = init_device_mesh("cpu", (1, 2, 2, 2), mesh_dim_names=("pp", "dp_replicate", "fsdp", "tp"))
print(f"mesh {mesh.mesh_dim_names}, shape {tuple(mesh.shape)}")
for name in mesh.mesh_dim_names:
    print(f"  {name:>12}: size {mesh[name].size()}, rank 0's group {mesh[name].mesh.tolist()}")
dp_mesh, tp_mesh = mesh["dp_replicate", "fsdp"], mesh["tp"]
print(f"FSDP's mesh {dp_mesh.mesh_dim_names}, shape {tuple(dp_mesh.shape)}")

# %% [markdown]
# Output:
# ```text
# world size 8, rank 0, backend fake
# all_reduce of ones over 8 fake ranks: [1.0, 1.0]
# mesh ('pp', 'dp_replicate', 'fsdp', 'tp'), shape (1, 2, 2, 2)
#             pp: size 1, rank 0's group [0]
#   dp_replicate: size 2, rank 0's group [0, 4]
#           fsdp: size 2, rank 0's group [0, 2]
#             tp: size 2, rank 0's group [0, 1]
# FSDP's mesh ('dp_replicate', 'fsdp'), shape (2, 2)
# ```
#
# The sum came back as 1, not 8: nothing was added. The mesh is torchtitan's, with degrees
# pp 1, dp_replicate 2, dp_shard 2, cp 1, tp 2, so `fsdp` = 2 × 1. The last dimension varies
# fastest, so `tp` pairs neighbouring ranks (0 and 1, which a launcher places on one
# node), `fsdp` pairs ranks 2 apart and `dp_replicate` ranks 4 apart
# (two "nodes" of 4). From here on every line printed is rank 0's view: the placements,
# the local shapes and the list of collectives are what rank 0 of a real 8-rank job would
# see; no loss or gradient value printed below means anything.
#
# ## 3. The model and its tensor-parallel plan
#
# A Llama-shaped decoder with torchtitan's module names, simplified: an embedding, three
# blocks of (RMSNorm, attention with `wq`, `wk`, `wv`, `wo`; RMSNorm, a SwiGLU feed-forward
# `w2(silu(w1 x) · w3 x)`), a final RMSNorm and `lm_head`, with vocabulary 64 and width 32.
# In 0.3.0 the projections sit one level deeper, under `attention.qkv_linear`, and Llama 3's
# configurations fuse them into one `wqkv` (`fuse_qkv=True`, `models/llama3/__init__.py`);
# here they stay three linears at the attention's top level.

# %%
V, D, HEADS, B, S = 64, 32, 4, 4, 16  # vocabulary, width, heads, sequences, tokens


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_heads = HEADS  # tensor parallelism sets it to this rank's heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(D, D, bias=False) for _ in range(4))

    def forward(self, x):  # (B, S, D)
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, self.n_heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(D, 4 * D, bias=False), nn.Linear(D, 4 * D, bias=False)
        self.w2 = nn.Linear(4 * D, D, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = nn.RMSNorm(D), Attention()
        self.ffn_norm, self.feed_forward = nn.RMSNorm(D), FeedForward()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Decoder(nn.Module):
    def __init__(self, n_layers=3):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(n_layers)})
        self.norm, self.lm_head = nn.RMSNorm(D), nn.Linear(D, V, bias=False)

    def forward(self, tokens):  # (B, S) -> (B, S, V) logits
        h = self.tok_embeddings(tokens)
        for block in self.layers.values():
            h = block(h)
        return self.lm_head(self.norm(h))


# %% [markdown]
# The plan follows the one torchtitan declares for a Llama block with sequence parallelism
# (its default). torchtitan declares it as `ShardingConfig`s, one per module
# (`models/common/decoder_sharding.py`); here it is written with the styles of lesson 10,
# which give the same placements: between blocks the activations are
# `Shard(1)` (split along the sequence) on `tp`; each norm runs on its sequence shard; the
# attention and the feed-forward gather the sequence first (`PrepareModuleInput`), their
# first projections are colwise, and their output projections rowwise with a
# reduce-scatter back to `Shard(1)`. At the root, the embedding is rowwise (its table split
# by rows, the output reduce-scattered to `Shard(1)`), and `lm_head` is colwise with its
# output left `Shard(-1)`. One more simplification: torchtitan gathers the sequence at the
# root norm's output (`pre_lm_head_norm_config`), where this plan lets `lm_head`'s
# colwise style gather it at its input; both hand `lm_head` the whole sequence.
#
# **Predict:** after the plan, what shape does rank 0 hold of `wq.weight` (32 × 32), of
# `wo.weight`, and of `lm_head.weight` (64 × 32)?

# %%
def block_plan():
    gather_seq = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {
        "attention_norm": SequenceParallel(),
        "attention": gather_seq,
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": gather_seq,
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


ROOT_PLAN = {
    "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
    "norm": SequenceParallel(),
    "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
}


def apply_tp(model, tp_mesh):
    parallelize_module(model, tp_mesh, ROOT_PLAN)
    for block in model.layers.values():
        block.attention.n_heads = HEADS // tp_mesh.size()  # colwise q/k/v: this rank's heads
        parallelize_module(block, tp_mesh, block_plan())
    return model


torch.manual_seed(0)
model = apply_tp(Decoder(), tp_mesh)
for name in ("tok_embeddings.weight", "layers.0.attention_norm.weight", "layers.0.attention.wq.weight",
             "layers.0.attention.wo.weight", "layers.0.feed_forward.w2.weight", "lm_head.weight"):
    p = model.get_parameter(name)
    print(f"{name:>32}: {p.placements} on {p.device_mesh.mesh_dim_names}, "
          f"global {tuple(p.shape)}, local {tuple(p.to_local().shape)}")

# %% [markdown]
# Output:
# ```text
#            tok_embeddings.weight: (Shard(dim=0),) on ('tp',), global (64, 32), local (32, 32)
#   layers.0.attention_norm.weight: (Replicate(),) on ('tp',), global (32,), local (32,)
#     layers.0.attention.wq.weight: (Shard(dim=0),) on ('tp',), global (32, 32), local (16, 32)
#     layers.0.attention.wo.weight: (Shard(dim=1),) on ('tp',), global (32, 32), local (32, 16)
#  layers.0.feed_forward.w2.weight: (Shard(dim=1),) on ('tp',), global (32, 128), local (32, 64)
#                   lm_head.weight: (Shard(dim=0),) on ('tp',), global (64, 32), local (32, 32)
# ```
#
# A colwise linear keeps half the rows of its weight (PyTorch stores `(out, in)`), a rowwise
# one half the columns; the embedding's table and `lm_head` keep half the vocabulary each.
# The norms' weights are whole on both ranks (`Replicate`): sequence parallelism splits
# their activations, not their weights.
#
# ## 4. Checkpointing, compile, then FSDP, in torchtitan's order
#
# Now the other three steps, as torchtitan 0.3.0 takes them.
#
# - **Activation checkpointing** (`distributed/activation_checkpoint.py`) replaces each
#   block of `model.layers` by `checkpoint_wrapper(block, ...)`, a `CheckpointWrapper` that
#   recomputes the block in backward (13b). That is its full mode; the default config is
#   selective AC, which saves some ops' outputs and recomputes the rest.
# - **Compile** is off by default (`CompileConfig.enable = False`, `config/configs.py`).
#   When enabled, `apply_compile` (`distributed/compile.py`) calls
#   `transformer_block.compile(backend=backend, fullgraph=True)` on each wrapped block, so
#   that the checkpointed region is inside the compiled one, with `inductor` as the default
#   backend; FSDP's hooks stay outside the compiled region (13b). This part compiles with
#   `backend="eager"`, which captures the graph with Dynamo and runs it as it is, to keep
#   the run short.
# - **FSDP** comes last (`distributed/fsdp.py`, `apply_fsdp_to_decoder`), on the mesh
#   `["dp_replicate", "fsdp"]` (HSDP) or `["fsdp"]`; here on the 2-D one: sharded over
#   `fsdp`, replicated over `dp_replicate`. Its units: the embedding alone, with the general `reshard_after_forward`
#   (True unless pipeline parallelism is on); `[norm, lm_head]` as one unit with
#   `reshard_after_forward=(reshard_after_forward_policy == "always")`, False under the
#   default policy ("do not reshard_after_forward the last layers by default since FSDP
#   would prefetch them immediately"); each block; then the root. With
#   `enable_weight_tying`, set by Llama 3's 1B and 3B configurations
#   (`models/llama3/__init__.py`), the embedding shares its weight with `lm_head` and joins
#   that unit: `[tok_embeddings, norm, lm_head]`. By default the parameters are bf16 and the
#   reductions float32 (`MixedPrecisionPolicy`, defaults in `config/configs.py`), and the
#   gradient divide factor is 1 (the loss is summed and scaled by the global token count
#   instead); this part stays in float32.
#
# **Predict:** which of the four kinds of unit will still hold its parameters gathered
# after a forward pass?

# %%
def apply_ac(model):
    for name, block in list(model.layers.named_children()):
        model.layers.register_module(name, checkpoint_wrapper(block, preserve_rng_state=True))


def apply_compile(model):
    for block in model.layers.values():
        block.compile(backend="eager", fullgraph=True)


def apply_fsdp(model, dp_mesh):
    fully_shard(model.tok_embeddings, mesh=dp_mesh, reshard_after_forward=True)
    fully_shard([model.norm, model.lm_head], mesh=dp_mesh, reshard_after_forward=False)
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=True)
    fully_shard(model, mesh=dp_mesh)
    return model


apply_ac(model)
apply_compile(model)
apply_fsdp(model, dp_mesh)
block0 = model.layers["0"]
print(f"layers.0 is {type(block0).__name__} (FSDP: {isinstance(block0, FSDPModule)}, "
      f"checkpointed: {isinstance(block0, CheckpointWrapper)}, compiled: {block0._compiled_call_impl is not None})")
for name in ("tok_embeddings.weight", "layers.0._checkpoint_wrapped_module.attention.wq.weight",
             "layers.0._checkpoint_wrapped_module.attention_norm.weight", "lm_head.weight"):
    p = model.get_parameter(name)
    print(f"{name.replace('_checkpoint_wrapped_module.', ''):>32}: {p.placements}, local {tuple(p.to_local().shape)}")

# %% [markdown]
# Output:
# ```text
# layers.0 is FSDPCheckpointWrapper (FSDP: True, checkpointed: True, compiled: True)
#            tok_embeddings.weight: (Replicate(), _StridedShard(dim=0, sf=2), Shard(dim=0)), local (16, 32)
#     layers.0.attention.wq.weight: (Replicate(), _StridedShard(dim=0, sf=2), Shard(dim=0)), local (8, 32)
#   layers.0.attention_norm.weight: (Replicate(), Shard(dim=0), Replicate()), local (16,)
#                   lm_head.weight: (Replicate(), _StridedShard(dim=0, sf=2), Shard(dim=0)), local (16, 32)
# ```
#
# One module is now three things at once: `fully_shard` changed the class of the
# checkpoint wrapper to `FSDPCheckpointWrapper`, and the wrapper carries the compiled call.
# Each parameter's placements read along the 3-D mesh `("dp_replicate", "fsdp", "tp")`:
# replicated over `dp_replicate`, then sharded on dim 0 by FSDP over `fsdp` on top of TP's
# `Shard(0)`, which is 13a's `_StridedShard`. A norm's weight, whole on `tp`, gets a plain
# `Shard(0)` from FSDP. Rank 0 holds a quarter of
# `wq.weight`'s rows (8 of 32), not an eighth: the two `dp_replicate` groups hold copies.
#
# One forward pass, then the check the prediction asked for: the parameters FSDP registers
# on a unit are its sharded DTensors when it resharded, and the gathered ones while it holds
# them.

# %%
tokens = torch.randint(0, V, (B, S + 1), generator=torch.Generator().manual_seed(1))
graphs_before = counters["stats"]["unique_graphs"]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    logits = model(tokens[:, :-1])
graphs = counters["stats"]["unique_graphs"] - graphs_before
units = {"tok_embeddings": model.tok_embeddings.weight,
         "layers.0": block0._checkpoint_wrapped_module.attention.wq.weight,
         "[norm, lm_head]": model.lm_head.weight}
for unit, p in units.items():
    gathered = p.device_mesh.mesh_dim_names == ("tp",)
    print(f"after forward {unit:>15}: on {p.device_mesh.mesh_dim_names}, local {tuple(p.to_local().shape)}, "
          f"still gathered: {gathered}")
print(f"logits: {logits.placements} on {logits.device_mesh.mesh_dim_names}, "
      f"global {tuple(logits.shape)}, local {tuple(logits.to_local().shape)}")
print(f"graphs Dynamo compiled for the 3 blocks: {graphs}")
print(f"warnings: {sorted({type(w.message).__name__ + ': ' + str(w.message)[:60] for w in caught})}")

# %% [markdown]
# Output:
# ```text
# after forward  tok_embeddings: on ('dp_replicate', 'fsdp', 'tp'), local (16, 32), still gathered: False
# after forward        layers.0: on ('dp_replicate', 'fsdp', 'tp'), local (8, 32), still gathered: False
# after forward [norm, lm_head]: on ('tp',), local (32, 32), still gathered: True
# logits: (Shard(dim=2),) on ('tp',), global (4, 16, 64), local (4, 16, 32)
# graphs Dynamo compiled for the 3 blocks: 2
# warnings: ['UserWarning: FSDP2-wrapped module (FSDPEmbedding) returned a view tensor.']
# ```
#
# The embedding and the blocks went back to their shards; `[norm, lm_head]` still holds its
# all-gathered weights, now a DTensor on `tp` only (TP's half of the vocabulary), because
# backward needs them first: resharding them to gather them again at once would double the
# unit's all-gather for nothing. The logits come out split along the vocabulary, 32 of 64
# columns per rank.
#
# The three blocks did not share one graph, nor did they need three. Block 0 receives the
# embedding's reduce-scatter as an `AsyncCollectiveTensor` (a functional collective's
# result, whose wait runs at first use), blocks 1 and 2 a plain tensor; Dynamo guards on its
# input's type, so it compiled the block's code a second time for block 1
# (`TORCH_LOGS=recompiles` names that guard), and block 2 reused that graph. Per-block
# compile pays for each distinct kind of input, not for each block.
#
# FSDP2 also warned that the embedding's output is a view: an in-place op on it (`h += ...`)
# would skip its backward hook. The model adds out of place, so the warning is harmless here.
#
# ## 5. The loss on sharded logits: `loss_parallel`
#
# The cross-entropy of one token needs the whole row of its logits: the log of a sum of
# exponentials over the vocabulary. The obvious way gathers the `Shard(-1)` logits to a full
# tensor first: each rank receives the (tp − 1)/tp of every row that it lacks and ends up
# holding all B·S·V values. `loss_parallel()` (in `torch.distributed.tensor.parallel`)
# teaches DTensor's `log_softmax` and `nll_loss` to work on the shards: each rank computes
# its part of every row, and the ranks exchange one value per token.
#
# torchtitan 0.3.0 keeps the logits split too: `models/common/decoder_sharding.py` shards
# `lm_head`'s weight `Shard(0)` on `tp` and declares its output `Shard(-1)`, as section 3's
# plan does, and `components/loss.py` computes the loss on that shard with three TP
# all-reduces (max, sum of exponentials, the label's log-probability); its docstring says
# it replaces PyTorch's `loss_parallel()`, which this section runs.
#
# **Predict:** how many collectives, of what kind and size, for each way in forward? And a
# guess for backward: does either way send anything more there?
#
# The cell below records each collective with `CommDebugMode` and, to see their tensors, a
# small dispatch mode (lesson 02) that logs every `_c10d_functional` call's input; the bytes
# are computed from those shapes and dtypes.

# %%
class WireLog(TorchDispatchMode):
    """Each functional collective's name and the shape, dtype and bytes of its input tensor."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if func.namespace == "_c10d_functional" and name in ("all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor"):
            t = args[0]
            self.calls.append((name, tuple(t.shape), t.dtype, t.numel() * t.element_size()))
        return func(*args, **(kwargs or {}))


def loss_collectives(logits, labels, parallel):
    """The loss of `logits` (a Shard(-1) DTensor, (N, V)) and its backward: the collectives."""
    logits = logits.detach().requires_grad_()
    with WireLog() as wire, CommDebugMode() as comm:
        if parallel:
            with loss_parallel():
                loss = F.cross_entropy(logits, labels)
                loss.backward()
        else:
            loss = F.cross_entropy(logits.full_tensor(), labels)
            loss.backward()
    return comm.get_total_counts(), wire.calls


def bytes_per_rank(tokens, vocab, tp, itemsize=4):
    """Bytes each rank hands to the loss's collectives: (gathering the logits, loss_parallel)."""
    return tokens * (vocab // tp) * itemsize, 3 * tokens * itemsize


flat = logits.flatten(0, 1)  # (B·S, V) = (64, 64), Shard(1) on tp
labels = tokens[:, 1:].flatten()
wire_bytes = {}
for parallel in (False, True):
    count, calls = loss_collectives(flat, labels, parallel)
    wire_bytes[parallel] = sum(c[3] for c in calls)
    print(f"{'loss_parallel()' if parallel else 'full_tensor() first'}: {count} collectives, "
          f"{wire_bytes[parallel]:,} bytes of input")
    for name, shape, dtype, nbytes in calls:
        print(f"  {name}{shape} {dtype}: {nbytes:,} bytes")
print(f"full logits: {flat.shape[0]} tokens x {flat.shape[1]} = {flat.numel() * 4:,} bytes of float32")
tp = tp_mesh.size()
ratio = wire_bytes[False] / wire_bytes[True]
print(f"gathering / loss_parallel: {ratio:.2f}; V/(3·tp) = {V}/(3·{tp}) = {V / (3 * tp):.2f}; "
      f"bytes_per_rank agrees: {bytes_per_rank(flat.shape[0], V, tp) == (wire_bytes[False], wire_bytes[True])}")
LLAMA3_VOCAB = 128_256  # read from torchtitan 0.3.0, models/llama3/__init__.py
print(f"Llama 3's V = {LLAMA3_VOCAB:,} on tp 8: V/(3·tp) = {LLAMA3_VOCAB / (3 * 8):,.0f}")

# %% [markdown]
# Output:
# ```text
# full_tensor() first: 1 collectives, 8,192 bytes of input
#   all_gather_into_tensor(64, 32) torch.float32: 8,192 bytes
# loss_parallel(): 3 collectives, 768 bytes of input
#   all_reduce(64, 1) torch.float32: 256 bytes
#   all_reduce(64, 1) torch.float32: 256 bytes
#   all_reduce(64, 1) torch.float32: 256 bytes
# full logits: 64 tokens x 64 = 16,384 bytes of float32
# gathering / loss_parallel: 10.67; V/(3·tp) = 64/(3·2) = 10.67; bytes_per_rank agrees: True
# Llama 3's V = 128,256 on tp 8: V/(3·tp) = 5,344
# ```
#
# Gathering, each rank hands in its half of the logits (8,192 bytes) and receives the other
# half: B·S·V/2 values. Under `loss_parallel()`, three all-reduces of B·S = 64 values each,
# whatever the vocabulary: the row's maximum (for a stable softmax), the sum of
# `exp(x - max)` over the vocabulary, and in the NLL each row's log-probability of its
# label, which only the rank owning that label's column contributes. The backward sends
# nothing: the gradient `softmax - onehot` of each column is local. Per rank, the gathering
# path hands in V/(3·tp) times more bytes (8,192 against 768 here; with Llama 3's
# vocabulary on tp 8, 5,344 times more), and its `Replicate` logits cost a full B·S·V tensor
# of memory per rank, the largest activation of a small model.
#
# The fake group cannot show that the three reductions give the right loss: its
# all-reduces return rank 0's own numbers. In one process, with real values, you can do the
# reductions by hand over the two halves of a row and compare.

# %%
def sharded_cross_entropy(shards, labels):
    """Cross-entropy from the vocabulary shards of the logits, as loss_parallel's three
    all-reduces combine them (here a max and two sums over a Python list)."""
    row_max = torch.stack([s.amax(-1) for s in shards]).amax(0)  # all-reduce MAX
    sum_exp = sum((s - row_max[:, None]).exp().sum(-1) for s in shards)  # all-reduce SUM
    start, picked = 0, torch.zeros_like(row_max)
    for s in shards:  # each shard contributes the labels in its columns: all-reduce SUM
        mine = (labels >= start) & (labels < start + s.shape[1])
        local = (labels - start).clamp(0, s.shape[1] - 1)
        picked += torch.where(mine, s.gather(1, local[:, None]).squeeze(1) - row_max, 0.0)
        start += s.shape[1]
    return (sum_exp.log() - picked).mean()


gen = torch.Generator().manual_seed(2)
full = 4 * torch.randn(B * S, V, generator=gen, dtype=torch.float64)
gap = (sharded_cross_entropy(full.chunk(2, dim=1), labels) - F.cross_entropy(full, labels)).abs().item()
print(f"2 shards vs the whole row: gap below 1e-12: {gap < 1e-12}")

# %% [markdown]
# Output:
# ```text
# 2 shards vs the whole row: gap below 1e-12: True
# ```
#
# Exact up to rounding: `log Σ exp` over the vocabulary is `max + log Σ_shards Σ_columns
# exp(x - max)`, and a sum can be split into shards. torchtitan 0.3.0's own
# `_LossParallelCrossEntropy` (read from torchtitan 0.3.0, `components/loss.py`) is this
# function with `funcol.all_reduce` over the `tp` group in place of the list, and a sum
# reduction instead of the mean.
#
# One step closes the loop: the loss under `loss_parallel()`, backward through the compiled,
# checkpointed blocks, and the gradients FSDP reduce-scattered onto the shards.

# %%
with loss_parallel():
    loss = F.cross_entropy(flat, labels)
    loss.backward()
print(f"loss: {type(loss).__name__} {loss.placements}, shape {tuple(loss.shape)}")
for name in ("tok_embeddings.weight", "lm_head.weight"):
    g = model.get_parameter(name).grad
    print(f"{name:>21}.grad: {g.placements}, local {tuple(g.to_local().shape)}")

# %% [markdown]
# Output:
# ```text
# loss: DTensor (Replicate(),), shape ()
# tok_embeddings.weight.grad: (Replicate(), _StridedShard(dim=0, sf=2), Shard(dim=0)), local (16, 32)
#        lm_head.weight.grad: (Replicate(), _StridedShard(dim=0, sf=2), Shard(dim=0)), local (16, 32)
# ```
#
# Every gradient has its parameter's placements and local shape: the recipe's step runs end
# to end for 8 ranks. What the fake group cannot tell you is whether the numbers are
# right. 13a checked that on real gloo ranks for its 2-D model (one step equal to one
# process, with the logits gathered); lesson 14's `train.py` is the script to run on GPUs,
# FSDP2 only (unverified on a GPU). torchtitan also has a mode that checks numbers in one
# process: `comm.mode = "local_tensor"` (read from torchtitan 0.3.0, `config/configs.py`)
# runs every rank in this one process, one after another, "the numerics should be the
# same", on PyTorch's `LocalTensorMode` (`torch.distributed._local_tensor`); under it, the
# all-reduce of ones over 8 ranks gives 8.
#
# ## 6. From here to a cluster
#
# What you ran is rank 0's code of an 8-rank job; on a cluster every rank runs it, and a
# few things change. Each fact about GPUs below comes from PyTorch's documentation and
# torchtitan's source, not from a run (unverified on a GPU).
#
# - **The backend and the device.** `init_process_group("nccl")` instead of the fake one,
#   one process per GPU, `torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))` before
#   building the mesh with `init_device_mesh("cuda", ...)`. The mesh's order matters there:
#   `tp` last, so that its groups stay inside a node's fast links (13a).
# - **The launch.** `torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d
#   --rdzv-endpoint=HOST:PORT train.py` on each node (13b's two agents and one rendezvous,
#   across machines); under SLURM, `srun` starts one such command per node.
# - **The model.** torchtitan builds it on the meta device and materialises it after
#   `parallelize_llama` (`to_empty`, then its own `init_weights`; read from torchtitan
#   0.3.0, `trainer.py`; 13b), so no rank ever holds the whole model; it trains in bf16
#   through `MixedPrecisionPolicy`, and, when compile is enabled, compiles with Inductor.
# - **What this part could not show.** Real values, timings and overlap: FSDP2's
#   all-gathers run on their own CUDA streams beside compute (13b).
#
# Lesson 14 turns the capstone's training into a standalone script that runs unchanged on
# CPU with gloo and on GPUs with NCCL. torchtitan's documentation, the `docs/` folder of
# its repository (the wheel's metadata links it), walks through the configuration of each
# parallelism of section 1.
#
# Every path through a job ends its process group; so does this part:

# %%
dist.destroy_process_group()
print(f"process group initialized: {dist.is_initialized()}")

# %% [markdown]
# Output:
# ```text
# process group initialized: False
# ```

# %% [markdown]
# ## Summary
#
# - torchtitan 0.3.0 (read from its source) names its mesh `pp`, `dp_replicate`, `fsdp`,
#   `tp` with `fsdp = dp_shard × cp`, and applies TP, then activation checkpointing, then
#   per-block compile, then FSDP, whose units are the embedding, each block, `[norm,
#   lm_head]` (kept gathered after forward under the default policy; the embedding joins it
#   when weights are tied), and the root. This part follows its legacy `partial_dtensor`
#   mesh, made of PyTorch's DTensor APIs only.
# - A fake process group plays one rank of any world: shapes, placements and the list of
#   collectives are those of the real job; an all-reduce of ones over 8 fake ranks gives 1.
# - The recipe on 8 fake ranks: TP's plan shards q/k/v and `w1`/`w3` by rows, `wo` and `w2`
#   by columns, the embedding and `lm_head` along the vocabulary; FSDP adds `_StridedShard`
#   on `fsdp` and replicates over `dp_replicate`; one module is at once FSDP unit,
#   checkpoint wrapper and compiled; after forward only `[norm, lm_head]` stays gathered;
#   Dynamo compiled 2 graphs for 3 blocks, because block 0's input is an
#   `AsyncCollectiveTensor`.
# - `loss_parallel()` computes the cross-entropy on `Shard(-1)` logits with three
#   all-reduces of B·S values and no collective in backward, where gathering the logits
#   brings each rank the (tp − 1)/tp of B·S·V values it lacks: V/(3·tp) times more bytes
#   handed in per rank; the three reductions give the exact loss.
# - On a cluster: NCCL, one process per GPU from `LOCAL_RANK`, torchrun across nodes,
#   meta-device init, bf16 and, when compile is on, Inductor.

# %% [markdown]
# ## References
#
# - [`torch.distributed.tensor.parallel.loss_parallel`](https://docs.pytorch.org/docs/2.13/generated/torch.distributed.tensor.parallel.loss_parallel.html):
#   the context manager of section 5 and its requirements (`Shard(-1)` logits, class indices).
# - [`torch.distributed.tensor.parallel.parallelize_module`](https://docs.pytorch.org/docs/2.13/generated/torch.distributed.tensor.parallel.parallelize_module.html):
#   the plan of section 3, with `ColwiseParallel`, `RowwiseParallel`, `SequenceParallel`
#   and `PrepareModuleInput`.
# - [`torch.distributed.fsdp.fully_shard`](https://docs.pytorch.org/docs/2.13/generated/torch.distributed.fsdp.fully_shard.html):
#   a list of modules as one unit and `reshard_after_forward` (section 4).
# - [`torch.distributed.device_mesh.init_device_mesh`](https://docs.pytorch.org/docs/2.13/generated/torch.distributed.device_mesh.init_device_mesh.html):
#   named mesh dimensions and slicing a sub-mesh (section 2).
# - [`torch.distributed.tensor.debug.CommDebugMode`](https://docs.pytorch.org/docs/2.13/generated/torch.distributed.tensor.debug.CommDebugMode.html):
#   counting DTensor's collectives (section 5).
# - Liang et al., [TorchTitan: One-stop PyTorch native solution for production ready LLM pre-training](https://arxiv.org/abs/2410.06511)
#   (2024): the recipe of section 1 and its measurements on GPUs.

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each path is relative to the folder that holds your installed
# `torch` (your site-packages), and the line numbers are those of your installation. The
# stops follow the lesson: the fake group, the loss on shards, a list of modules as one FSDP
# unit, and the wrapper that checkpoints a block.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/testing/_internal/distributed/fake_pg.py", "def _create_fake_pg(",
     "Section 2's backend: its docstring says it \"doesn't actually do any communication, it "
     "just hallucinates some communication\" and \"would produce wrong results for every "
     "collective\"; it is registered under the name `fake` below it."),
    ("torch/distributed/tensor/parallel/loss.py", "def _log_softmax(x, dim, half_to_float, mesh, mesh_dim):",
     "Section 5's first two all-reduces: the local `amax`, `funcol.all_reduce(..., "
     "reduceOp=c10d.ReduceOp.MAX.name, ...)`, then the sum of `exp(x - max)` all-reduced "
     "with SUM. `_nll_loss_forward`, below, masks the labels outside this rank's columns and "
     "all-reduces the picked values, the third. `loss_parallel` itself, above, only "
     "registers these handlers (`_enable_custom_loss_ops`) for the `with` block; its "
     "docstring notes that `reduction=\"mean\"` needs a one-dimensional mesh."),
    ("torch/distributed/fsdp/_fully_shard/_fully_shard.py", "def fully_shard(",
     "The `module` argument may be a list of modules (`[norm, lm_head]` of section 4): they "
     "form one parameter group, gathered and resharded together; `reshard_after_forward` "
     "False keeps the gathered parameters after forward."),
    ("torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py", "def checkpoint_wrapper(",
     "The wrapper torchtitan puts around each block (section 4): a `CheckpointWrapper` whose "
     "forward runs the wrapped module through `torch.utils.checkpoint.checkpoint` (non-"
     "reentrant by default), and whose `__getattr__` forwards to `_checkpoint_wrapped_module`."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/testing/_internal/distributed/fake_pg.py:«line»  `def _create_fake_pg(`
#     Section 2's backend: its docstring says it "doesn't actually do any communication,
#     it just hallucinates some communication" and "would produce wrong results for every
#     collective"; it is registered under the name `fake` below it.
# torch/distributed/tensor/parallel/loss.py:«line»  `def _log_softmax(x, dim, half_to_float, mesh, mesh_dim):`
#     Section 5's first two all-reduces: the local `amax`, `funcol.all_reduce(...,
#     reduceOp=c10d.ReduceOp.MAX.name, ...)`, then the sum of `exp(x - max)` all-reduced
#     with SUM. `_nll_loss_forward`, below, masks the labels outside this rank's columns
#     and all-reduces the picked values, the third. `loss_parallel` itself, above, only
#     registers these handlers (`_enable_custom_loss_ops`) for the `with` block; its
#     docstring notes that `reduction="mean"` needs a one-dimensional mesh.
# torch/distributed/fsdp/_fully_shard/_fully_shard.py:«line»  `def fully_shard(`
#     The `module` argument may be a list of modules (`[norm, lm_head]` of section 4):
#     they form one parameter group, gathered and resharded together;
#     `reshard_after_forward` False keeps the gathered parameters after forward.
# torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py:«line»  `def checkpoint_wrapper(`
#     The wrapper torchtitan puts around each block (section 4): a `CheckpointWrapper`
#     whose forward runs the wrapped module through `torch.utils.checkpoint.checkpoint`
#     (non-reentrant by default), and whose `__getattr__` forwards to
#     `_checkpoint_wrapped_module`.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Predict.** On a fake process group of 8 ranks, rank 0 all-reduces (sum) a tensor of
#    ones. What does it hold afterwards, and what does that tell you about a loss printed on
#    such a group?
#
#    <details><summary>Answer</summary>
#
#    Ones: the fake group sends and adds nothing, so the sum over 8 ranks comes back as 1,
#    not 8. Shapes and placements are those of the real job, but any value that a
#    collective touched (a loss, a gradient) is not
#    (*§ Eight ranks in one process: a fake process group*).
#
#    </details>
#
# 2. **Explain.** Why does torchtitan's default policy give `[norm, lm_head]`
#    `reshard_after_forward=False`, and what did the forward pass of this part show for that
#    unit?
#
#    <details><summary>Answer</summary>
#
#    The last unit of forward is the first of backward: resharding it after forward would
#    mean all-gathering it again at once. After the forward, the embedding and the blocks
#    were back on their 3-D-mesh shards, while `lm_head.weight` was still gathered, a
#    DTensor on `tp` only with local shape (32, 32)
#    (*§ Checkpointing, compile, then FSDP, in torchtitan's order*).
#
#    </details>
#
# 3. **Predict.** The logits are (B·S, V) = (64, 64) float32, `Shard(-1)` on a `tp` of 2.
#    Which collectives does the loss and its backward issue with `full_tensor()` first, and
#    under `loss_parallel()`?
#
#    <details><summary>Answer</summary>
#
#    Gathering: one all-gather, each rank's input its (64, 32) half, 8,192 bytes. Under
#    `loss_parallel()`: three all-reduces of (64, 1) float32, 256 bytes each (the row
#    maximum, the sum of exponentials, the label's log-probability) and nothing in
#    backward; their size does not grow with V
#    (*§ The loss on sharded logits: `loss_parallel`*).
#
#    </details>
#
# 4. **Spot the bug.** A student's plan makes `attention.wo` `ColwiseParallel()` "like the
#    other three projections". What is wrong with `wo.weight`'s placement, and what does the
#    lesson's plan use instead?
#
#    <details><summary>Answer</summary>
#
#    Colwise would give `wo.weight` `Shard(0)`, splitting its output features, while its
#    input is already split by heads. The plan makes `wo` rowwise: `Shard(1)`, local
#    (32, 16), with its partial sums reduce-scattered to the `Shard(1)` sequence layout
#    between blocks (*§ The model and its tensor-parallel plan*).
#
#    </details>
#
# 5. **Transfer.** Llama 3's vocabulary, V = 128,256, on tp = 4, with the same 64 tokens in
#    float32: how many bytes does each rank hand to the loss's collectives when it gathers
#    the logits, and under `loss_parallel()`? How many times more is the first?
#
#    <details><summary>Answer</summary>
#
#    Gathering: its (64, 32,064) shard, 64 × 32,064 × 4 = 8,208,384 bytes. Under
#    `loss_parallel()`: three all-reduces of 64 values, 768 bytes, as before, since they do
#    not depend on V or tp. The ratio is V/(3·tp) = 128,256/12 = 10,688
#    (*§ The loss on sharded logits: `loss_parallel`*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# In `exercises.py`, write `hf_block_plan()`: the sequence-parallel TP plan for the block of
# `hf_block.py`, a Llama block with Hugging Face's names (`input_layernorm`,
# `self_attn.q_proj` ... `o_proj`, `post_attention_layernorm`, `mlp.gate_proj`, `up_proj`,
# `down_proj`), the same plan as `block_plan()` for a new layout of names.
# `make exercises N=13c` checks the placements it gives each weight, the layout between
# blocks and the collectives of one forward on a fake group.

# %% [markdown]
# # 12 · Distributed checkpoint and restart
#
# A long training run will be interrupted: a machine fails, a job is preempted, a rank runs
# out of memory. What survives is what was written to disk. This lesson saves training
# state with `torch.distributed.checkpoint` (DCP), proves that a restored run takes the next
# step *bit for bit* like the run that never stopped, moves a checkpoint between 2 ranks and
# 1 process, and then kills a rank in the middle of a real 2-rank job and lets torchrun
# restart it.
#
# **What you will learn**
#
# - how DCP saves a model and an Adam optimizer (`get_state_dict`, `dcp.save`, `dcp.load`,
#   `set_state_dict`), which files it writes and what its `.metadata` says;
# - that a checkpoint is more than weights: step, learning-rate schedule, random state and
#   the data loader's position, and what goes wrong without each;
# - how a checkpoint saved by 2 FSDP2 ranks loads into 1 process, which trains on and saves,
#   and how 2 ranks continue from that (resharding), and how to turn a checkpoint into one
#   `torch.save` file;
# - `dcp.async_save`: writing a checkpoint while the next step runs;
# - the restart drill: `torchrun --max-restarts=1`, a rank killed from outside while it
#   writes a checkpoint, a restart from the latest *complete* checkpoint that checks what
#   the checkpoint was made with, and a final result bitwise equal to an uninterrupted run
#   (with dropout and a shuffled data order);
# - an elastic job (`--nnodes=1:2`) that loses a node and goes on with one: the survivor's
#   `RANK` and `WORLD_SIZE` change, a file named after a rank now belongs to someone else,
#   and DCP loads the 2 ranks' checkpoint into the one that is left;
# - why `torch.load` of a stranger's file is dangerous and what `weights_only=True` and
#   safetensors do about it.
#
# **Prerequisites:** lessons 09 (process groups, torchrun, DTensor) and 11 (FSDP2); lesson
# 04 (modules, optimizers, data loaders).
#
# **How to run:** `python lessons/12_checkpoint_and_restart/checkpoint_and_restart.py` or
# `make lesson N=12` from the repository root, or open `checkpoint_and_restart.ipynb`. It
# writes checkpoints into a temporary folder (removed at the end), launches two 2-rank runs
# of `worker.py` on the CPU with gloo and then one elastic run of two 1-rank nodes (two
# torchrun agents), and saves its figure next to the lesson. `worker.py`'s
# docstring says how to run it with torchrun yourself. Each printing cell is followed by an
# *Output* block: what it printed with the pinned PyTorch (2.13.0), checked by `make test`.

# %%
import atexit
import json
import pathlib
import pickle
import re
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

torch.manual_seed(0)
torch.set_num_threads(1)  # the ranks get one thread each too (OMP_NUM_THREADS=1): 2 cores
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE.parent))  # lessons/: the multi-rank kit (lesson 09), the source map
sys.path.insert(0, str(HERE))  # this folder: worker.py, the ranks' code and the drill's helpers
from multirank import kill_when, launch, node_of, section, show  # noqa: E402
from worker import CONFIG, REVISION, Trainer, compatible, held_pid, plot_drill  # noqa: E402

WORKER = HERE / "worker.py"
TMP = Path(tempfile.mkdtemp(prefix="lesson12-"))  # the lesson's checkpoints; removed at the end
atexit.register(shutil.rmtree, TMP, ignore_errors=True)  # ... and at exit, should a cell fail
F = torch.nn.functional


def same(a, b):
    """Bitwise equality (rtol=0, atol=0): torch.equal compares every element exactly."""
    return torch.equal(a, b)


# %% [markdown]
# ## 1. One process: save after one Adam step, restore, take the second step
#
# A model's `state_dict()` maps names to tensors; an optimizer's maps parameter *numbers* to
# its state (Adam: `step`, `exp_avg`, `exp_avg_sq`) plus its hyperparameters.
# `get_state_dict(model, optim)` returns both in one convention, with the optimizer keyed by
# parameter *names*, and works the same for a plain model and for FSDP2's sharded one.
# `dcp.save(state, checkpoint_id=folder)` writes a nested dict of them into a folder;
# `dcp.load(state, checkpoint_id=folder)` reads *in place* into tensors you already have, so
# a restore first builds the model and optimizer, asks for their state dicts as a template,
# loads into it, and hands the result back with `set_state_dict`.
#
# The test is strict: one model takes two Adam updates without stopping; another is built
# fresh (different weights), restored from the checkpoint written after update 1, and takes
# update 2.
#
# **Predict.** Which files does `dcp.save` write for a single process? After the restore,
# is the second update equal to the uninterrupted one exactly, or only to rounding?


# %%
def tiny(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def update(model, optim, x, y):  # x (4, 4), y (4, 2)
    optim.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optim.step()
    return loss.detach()


gen = torch.Generator().manual_seed(0)
xs, ys = torch.randn(2, 4, 4, generator=gen), torch.randn(2, 4, 2, generator=gen)  # 2 batches
model, optim = tiny(0)
update(model, optim, xs[0], ys[0])
msd, osd = get_state_dict(model, optim)
one = TMP / "one"
dcp.save({"model": msd, "optim": osd}, checkpoint_id=one, no_dist=True)
print(f"files: {sorted(p.name for p in one.iterdir())}")
loss2 = update(model, optim, xs[1], ys[1])  # the uninterrupted run goes on

fresh, fresh_optim = tiny(1)  # other weights, an optimizer with no state yet
msd, osd = get_state_dict(fresh, fresh_optim)  # the template DCP fills in place
loaded = {"model": msd, "optim": osd}
dcp.load(loaded, checkpoint_id=one, no_dist=True)
set_state_dict(fresh, fresh_optim, model_state_dict=loaded["model"],
               optim_state_dict=loaded["optim"])
loss2_restored = update(fresh, fresh_optim, xs[1], ys[1])
print(f"update 2 loss: uninterrupted {loss2.item():.6f}, restored {loss2_restored.item():.6f}, "
      f"equal {same(loss2, loss2_restored)}")
for (name, p), q in zip(model.named_parameters(), fresh.parameters()):
    s, t = optim.state[p], fresh_optim.state[q]
    eq = {k: same(s[k], t[k]) for k in ("exp_avg", "exp_avg_sq", "step")}
    print(f"{name}: param {same(p, q)}, exp_avg {eq['exp_avg']}, exp_avg_sq {eq['exp_avg_sq']}, "
          f"step {eq['step']} ({t['step'].item():.0f})")

# %% [markdown]
# Output:
# ```text
# files: ['.metadata', '__0_0.distcp']
# update 2 loss: uninterrupted 1.529952, restored 1.529952, equal True
# weight: param True, exp_avg True, exp_avg_sq True, step True (2)
# bias: param True, exp_avg True, exp_avg_sq True, step True (2)
# ```
#
# Exactly equal, every element of every tensor: the restored model and optimizer hold the
# same bits as the uninterrupted ones after update 1, and update 2 is the same arithmetic on
# the same bits. A restore is a correct one only when it is *bitwise*: "close" would hide a
# missing piece of state (section 2 shows what that looks like). DCP wrote two files:
# `__0_0.distcp` holds the bytes written by rank 0 (here the only process), `.metadata`
# says where every tensor is. `no_dist=True` says there is no process group; DCP also warns
# "assuming the intent is to save/load in a single process" (a `UserWarning` it always
# raises there).
#
# **Predict.** What does the metadata list: only the parameters, or the optimizer's
# hyperparameters too? How does it store a learning rate?

# %%
meta = dcp.FileSystemReader(one).read_metadata()
for key, item in meta.state_dict_metadata.items():
    if key.startswith("optim.param_groups") and not key.endswith((".lr", ".params")):
        continue  # the other hyperparameters look like .lr
    tensor = hasattr(item, "size")
    kind = f"tensor {list(item.size)} {item.properties.dtype}" if tensor else "bytes (pickled)"
    where = [s for i, s in meta.storage_data.items() if i.fqn == key][0]
    print(f"{key:32} {kind:28} in {where.relative_path} at byte {where.offset}")

# %% [markdown]
# Output:
# ```text
# model.weight                     tensor [2, 4] torch.float32  in __0_0.distcp at byte 15132
# model.bias                       tensor [2] torch.float32     in __0_0.distcp at byte 16709
# optim.state.weight.step          tensor [] torch.float32      in __0_0.distcp at byte 18286
# optim.state.weight.exp_avg       tensor [2, 4] torch.float32  in __0_0.distcp at byte 19863
# optim.state.weight.exp_avg_sq    tensor [2, 4] torch.float32  in __0_0.distcp at byte 21440
# optim.state.bias.step            tensor [] torch.float32      in __0_0.distcp at byte 23017
# optim.state.bias.exp_avg         tensor [2] torch.float32     in __0_0.distcp at byte 24594
# optim.state.bias.exp_avg_sq      tensor [2] torch.float32     in __0_0.distcp at byte 26171
# optim.param_groups.0.lr          bytes (pickled)              in __0_0.distcp at byte 0
# optim.param_groups.0.params      bytes (pickled)              in __0_0.distcp at byte 13871
# ```
#
# The nested dict is flattened into dotted keys. Every tensor has a global shape and dtype
# (and, when saved by several ranks, the list of *chunks* each rank holds: section 3);
# everything that is not a tensor (the learning rate, the betas, the parameter names) is
# pickled as bytes. Adam's `step` is a tensor too: a float32 scalar (1 in this checkpoint).
# The storage index says which file and which byte offset to read, so a loader reads only
# what it needs. The offsets show the cost of a tiny tensor: each item is its own small
# `torch.save` record (1577 bytes for a tensor of 8 floats here), so the offsets are those of
# the pinned torch and would change with it.

# %% [markdown]
# ## 2. A checkpoint is the whole training state
#
# The bitwise restore above worked because the next update depended only on the model and
# optimizer. A real training loop also depends on:
#
# - the **step** count and the **learning-rate scheduler** (here `StepLR`: the LR halves
#   every 4 steps);
# - the **random state** (here dropout draws from torch's global generator);
# - the **data loader's cursor**: the shuffled order of this epoch (drawn from the loader's
#   own generator when the epoch starts) and how many batches of it were consumed.
#
# `Trainer` (in `worker.py`: read it beside this lesson) keeps all of them and has
# `state_dict()` / `load_state_dict()`: DCP treats such an object as *Stateful* and calls
# those methods itself on save and on load.
# A run of 12 steps (8 batches of 4 per epoch) is checkpointed after step 6; then it is
# resumed three times: from a checkpoint of only the model and optimizer, from the full
# state but with a new process's random state, and from the full state.
#
# **Predict.** At step 7, what LR, which batch and which loss does each resume see,
# compared with the run that never stopped?


# %%
def resume(kind):
    """A fresh Trainer restored from the step-6 checkpoint of `kind`, then steps 7-12."""
    t = Trainer(seed=1)  # other initial weights: the checkpoint must overwrite them
    if kind == "weights only":
        msd, osd = get_state_dict(t.model, t.optim)
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, checkpoint_id=TMP / "weights6", no_dist=True)
        set_state_dict(t.model, t.optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        t.step = 6  # the step count survives in the file name; nothing else does
    else:
        dcp.load({"app": t}, checkpoint_id=TMP / "full6", no_dist=True)  # calls t.load_state_dict
    if kind == "all but RNG":
        torch.manual_seed(1)  # what a new process would have seeded
    return t, [t.train_step() for _ in range(6)]


straight = Trainer()
log = [straight.train_step() for _ in range(12)]  # the run that never stops
first = Trainer()
for _ in range(6):
    first.train_step()
msd, osd = get_state_dict(first.model, first.optim)
dcp.save({"model": msd, "optim": osd}, checkpoint_id=TMP / "weights6", no_dist=True)
dcp.save({"app": first}, checkpoint_id=TMP / "full6", no_dist=True)  # calls first.state_dict
runs = {"uninterrupted": (straight, log[6:])}
runs |= {k: resume(k) for k in ("weights only", "all but RNG", "full state")}
saved = dcp.FileSystemReader(TMP / "full6").read_metadata().state_dict_metadata
print(f"the full checkpoint holds app.{sorted({k.split('.')[1] for k in saved})}")
print(f"step 1 of the run used batch {log[0]['batch']}")
for name, (_, steps) in runs.items():
    print(f"{name:13} step 7: batch {steps[0]['batch']} loss {steps[0]['loss']:.4f}")
for name, (_, steps) in runs.items():
    lrs = " ".join(f"{s['lr']:.4f}" for s in steps)
    print(f"{name:13} lr at steps 7-12: {lrs}")
for name, (t, steps) in runs.items():
    pairs = zip(t.model.parameters(), straight.model.parameters())
    diff = max((p - q).abs().max().item() for p, q in pairs)
    equal = [s["loss"] for s in steps] == [s["loss"] for s in log[6:]]
    print(f"{name:13} after step 12: losses equal {equal}, max |param diff| {diff:.2e}")

# %% [markdown]
# Output:
# ```text
# the full checkpoint holds app.['cursor', 'model', 'optim', 'rng', 'sched']
# step 1 of the run used batch [25, 6, 15, 30]
# uninterrupted step 7: batch [27, 21, 11, 5] loss 1.1660
# weights only  step 7: batch [25, 6, 15, 30] loss 1.3019
# all but RNG   step 7: batch [27, 21, 11, 5] loss 0.7160
# full state    step 7: batch [27, 21, 11, 5] loss 1.1660
# uninterrupted lr at steps 7-12: 0.0500 0.0500 0.0250 0.0250 0.0250 0.0250
# weights only  lr at steps 7-12: 0.0500 0.0500 0.0500 0.0500 0.0250 0.0250
# all but RNG   lr at steps 7-12: 0.0500 0.0500 0.0250 0.0250 0.0250 0.0250
# full state    lr at steps 7-12: 0.0500 0.0500 0.0250 0.0250 0.0250 0.0250
# uninterrupted after step 12: losses equal True, max |param diff| 0.00e+00
# weights only  after step 12: losses equal False, max |param diff| 1.87e-01
# all but RNG   after step 12: losses equal False, max |param diff| 7.13e-02
# full state    after step 12: losses equal True, max |param diff| 0.00e+00
# ```
#
# The uninterrupted run's step 7 took batch [27, 21, 11, 5] (the 7th batch of epoch 0's
# shuffled order) at LR 0.05. Each partial resume goes wrong in its own way:
#
# - **weights only** restored the model, Adam's moments and even the *current* LR (it is a
#   hyperparameter in the optimizer's state dict), but not the scheduler, the cursor or
#   the RNG state (its dropout masks came from the new process's generator, like the next
#   run's). Its new data loader started the epoch over: step 7 trained on step 1's batch
#   [25, 6, 15, 30] again, and its fresh `StepLR` counted from 0, so it halved the LR two
#   steps late (0.05 at steps 9-10 instead of 0.025). Nothing crashes; the run silently
#   trains on a different schedule and data order.
# - **all but RNG** had the right batch and LR, but dropout drew another mask from the
#   global generator, and step 7's loss already differs (0.716 instead of 1.166).
# - **full state** (`Trainer` as a Stateful object: model, optimizer, scheduler, RNG state,
#   cursor) reproduced steps 7-12 exactly: same losses, parameters bitwise equal (a max
#   difference of 0.00e+00).
#
# The cursor is `(epoch, batches used, the loader generator's state at the epoch's start)`:
# restoring the generator redraws the same permutation, and the used batches are skipped.
# With multi-worker loaders or streaming data the cursor is harder, but the requirement is
# the same: the restored run must see the next batch the old run would have seen.


# %% [markdown]
# ## 3. Two ranks save, one process trains on, two ranks take it back
#
# Now the model is sharded. The worker builds the same kind of MLP on 2 ranks, shards it with
# FSDP2 (`fully_shard`: every parameter a DTensor `Shard(0)`, each rank holding half the
# rows), takes one step on a global batch of 8 (4 rows per rank) and saves with `dcp.save`:
# *each rank writes its own shards*, nothing is gathered. Then it takes steps 2 and 3 (the
# uninterrupted reference; rank 0 writes both to files for this notebook) and builds a fresh
# sharded model with other weights, loads the checkpoint into it, and takes step 2 again.
# The chain 2 → 1 → 2 follows: this notebook, one process, loads the 2-rank checkpoint,
# takes step 2 and saves; the next launch (section 5) loads that on 2 ranks and takes step 3.
#
# The launch goes through the course's multi-rank kit, `lessons/multirank.py` (lesson 09).
#
# **Predict.** How many `.distcp` files does a 2-rank save write? Is the reloaded step 2
# bitwise equal to the uninterrupted one?

# %%
ck = TMP / "reshard"
ck.mkdir()
run = launch(WORKER, ["reshard", str(ck)])
print(f"torchrun exit code {run.code} after {run.seconds:.1f} s, ranks {sorted(run.out)}")
show(run, "save")
show(run, "reload")
print(f"files in step1: {sorted(p.name for p in (ck / 'step1').iterdir())}")

# %% [markdown]
# Output:
# ```text
# torchrun exit code 0 after «time» s, ranks [0, 1]
# rank 0: step 1 loss «number»; saved reshard/step1
# rank 0: local weight shard (8, 8) of global (16, 8)
# rank 0: uninterrupted step 2 loss «number»
# rank 1: local weight shard (8, 8) of global (16, 8)
# rank 0: restored step 1; step 2 loss «number», equal True
# rank 0: parameters after step 2 bitwise equal to the uninterrupted run: True
# files in step1: ['.metadata', '__0_0.distcp', '__1_0.distcp']
# ```
#
# Both ranks wrote their own file, `__0_0.distcp` and `__1_0.distcp`, and rank 0 (the
# *coordinator*) wrote the one `.metadata` once every rank had reported what it wrote.
# Each rank holds an (8, 8) half of the first layer's (16, 8) weight, and the fresh model,
# built from other weights, took step 2 exactly as the run that never stopped: loss and all
# four gathered parameters bitwise equal. (The checkpoint also holds the LR scheduler and
# the step, the cursor of this worker's data: its batches are a function of the step.) The
# losses are shown as `«number»`: their sixth digit differs between CPUs (the vector
# instructions change the order of additions); that a restored run's are *equal* to the
# uninterrupted run's is printed as True or False and holds on every machine.
#
# **Predict.** The checkpoint was written by 2 ranks. Can one process without any process
# group read it? What does the metadata say about the first layer's weight?

# %%
sharded = dcp.FileSystemReader(ck / "step1").read_metadata()
for chunk in sharded.state_dict_metadata["model.0.weight"].chunks:
    print(f"model.0.weight chunk at offset {list(chunk.offsets)} size {list(chunk.sizes)}")
step_key = [i for i in sharded.storage_data if i.fqn == "step"][0]
print(f"'step' (a plain int) is stored once, in {sharded.storage_data[step_key].relative_path}")

# %% [markdown]
# Output:
# ```text
# model.0.weight chunk at offset [0, 0] size [8, 8]
# model.0.weight chunk at offset [8, 0] size [8, 8]
# 'step' (a plain int) is stored once, in __1_0.distcp
# ```
#
# The metadata records each tensor's *global* shape and, for a sharded one, where each
# rank's chunk sits in it: rows 0-7 from rank 0, rows 8-15 from rank 1. That is what makes
# resharding possible: a loader asks for the pieces *it* needs, in whatever layout it has,
# and DCP reads the overlapping parts of the stored chunks. A value that is not a DTensor
# (the `step` here, hyperparameters, the scheduler) is stored once, by one rank, whichever
# the planner picks (rank 1 here): DCP assumes it is the same on every rank. A per-rank
# value (each rank's RNG state) must therefore be stored under a per-rank key or as rows
# of one tensor that every rank holds (the drill of section 5 does that), or all ranks but
# one lose theirs.
#
# So one process can load it. Below, a plain (unsharded) copy of the worker's model, with
# other weights, loads the 2-rank checkpoint with `no_dist=True` and takes step 2 the way
# the ranks did: each rank's half-batch loss gives a gradient, FSDP2's reduce-scatter
# averages the two, `(g0 + g1) / 2`, then Adam steps.
#
# **Predict.** Is this single-process step 2 bitwise equal to the 2 ranks' step 2?


# %%
def mlp(seed):
    """The worker's model and optimizer, unsharded (worker.build without fully_shard)."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    return net, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)


def two_rank_step(net, opt, step, split=True):
    """One step as 2 data-parallel ranks take it: the mean of the two half-batch gradients
    (split=False: one backward over the whole batch of 8 instead)."""
    gen = torch.Generator().manual_seed(1000 + step)  # the worker's batch(step)
    x, y = torch.randn(8, 8, generator=gen), torch.randn(8, 4, generator=gen)  # (8, 8), (8, 4)
    halves = (slice(0, 4), slice(4, 8)) if split else (slice(0, 8),)  # rank 0's, rank 1's
    losses, grads = [], []
    for rows in halves:
        net.zero_grad()
        loss = F.mse_loss(net(x[rows]), y[rows])
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in net.parameters()])
    for p, *g in zip(net.parameters(), *grads):
        p.grad = (g[0] + g[1]) / 2 if split else g[0]  # the reduce-scatter's average
    opt.step()
    return (sum(losses) / len(losses)).item()


def load_one(seed):
    """A plain model, Adam and StepLR with other weights, loaded from the 2-rank checkpoint."""
    net, opt, sched = mlp(seed)
    msd, osd = get_state_dict(net, opt)
    sd = {"model": msd, "optim": osd, "sched": sched.state_dict(), "step": 0}
    dcp.load(sd, checkpoint_id=ck / "step1", no_dist=True)  # 2 ranks' shards -> 1 process
    set_state_dict(net, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    sched.load_state_dict(sd["sched"])
    return net, opt, sched, sd["step"]


net, opt, sched, step = load_one(seed=7)
before = {n: p.detach().clone() for n, p in net.named_parameters()}  # as loaded
ref = torch.load(ck / "reference.pt")  # rank 0 saved the ranks' step-2 loss and parameters
lr = opt.param_groups[0]["lr"]
one_loss = two_rank_step(net, opt, step + 1)
sched.step()  # as the ranks' scheduler did after step 2
print(f"loaded step {step} into 1 process; weight {list(net[0].weight.shape)}, lr {lr}")
print(f"step 2 loss {one_loss:.6f}, equal to the 2 ranks' {one_loss == ref['loss']}")
equal = all(same(p, ref["params"][n]) for n, p in net.named_parameters())
print(f"parameters bitwise equal to the 2 ranks' step 2: {equal}")
whole, whole_opt, _, _ = load_one(seed=8)
two_rank_step(whole, whole_opt, 2, split=False)
gap = max((p - ref["params"][n]).abs().max().item() for n, p in whole.named_parameters())
print(f"one backward over all 8 rows instead: bitwise {gap == 0}, max |diff| {gap:.1e}, "
      f"below 1e-06: {gap < 1e-6}")

# %% [markdown]
# Output:
# ```text
# loaded step 1 into 1 process; weight [16, 8], lr 0.05
# step 2 loss «number», equal to the 2 ranks' True
# parameters bitwise equal to the 2 ranks' step 2: True
# one backward over all 8 rows instead: bitwise False, max |diff| «number», below 1e-06: True
# ```
#
# Resharding 2 → 1 is exact: DCP put the two (8, 8) chunks into the full (16, 8) weight,
# and one process reproduced the ranks' step 2 bit for bit. Bitwise needs the *same
# arithmetic*, not only the same data: two half-batch gradients averaged, as FSDP2's
# reduce-scatter averages them. One backward over all 8 rows computes the same mathematical
# gradient with its sums in another order, and the parameters after Adam differ in the last
# bits (a gap below 1e-6; which bits, depends on the CPU).
#
# Now this process saves what it trained, model, Adam, scheduler and step, as any
# single-process job would: `dcp.save(..., no_dist=True)` into `step2_one`.
#
# **Predict.** How many files, and how many chunks of the (16, 8) weight, does one process
# write?

# %%
msd, osd = get_state_dict(net, opt)
dcp.save({"model": msd, "optim": osd, "sched": sched.state_dict(), "step": step + 1},
         checkpoint_id=ck / "step2_one", no_dist=True)
print(f"files in step2_one: {sorted(p.name for p in (ck / 'step2_one').iterdir())}")
single = dcp.FileSystemReader(ck / "step2_one").read_metadata()
for chunk in single.state_dict_metadata["model.0.weight"].chunks:
    print(f"step2_one: model.0.weight chunk at offset {list(chunk.offsets)} size "
          f"{list(chunk.sizes)}")

# %% [markdown]
# Output:
# ```text
# files in step2_one: ['.metadata', '__0_0.distcp']
# step2_one: model.0.weight chunk at offset [0, 0] size [16, 8]
# ```
#
# One file and one chunk: the whole (16, 8) weight at offset [0, 0]. Section 5's launch
# loads it into 2 fresh sharded ranks; each asks for *its* rows (rank 0 rows 0-7, rank 1 rows
# 8-15) and DCP reads that part of the one stored chunk, the mirror image of the 2 → 1 load.
#
# A checkpoint folder is convenient for training and awkward for anything else. DCP's
# format utilities convert it: `dcp_to_torch_save(folder, file)` gathers every tensor into
# one `torch.save` file of full tensors (it must fit in one process's memory).
#
# **Predict.** What does the converted file hold, and is its first weight the one the
# 1-process model loaded (before step 2)?

# %%
dcp_to_torch_save(ck / "step1", ck / "step1.pt")
flat = torch.load(ck / "step1.pt")
print(f"keys {sorted(flat)}; model keys {sorted(flat['model'])}")
equal = same(flat["model"]["0.weight"], before["0.weight"])
print(f"model.0.weight {list(flat['model']['0.weight'].shape)}, equal to what 1 process "
      f"loaded: {equal}")
print(f"file size {(ck / 'step1.pt').stat().st_size} bytes")

# %% [markdown]
# Output:
# ```text
# keys ['model', 'optim', 'sched', 'step']; model keys ['0.bias', '0.weight', '2.bias', '2.weight']
# model.0.weight [16, 8], equal to what 1 process loaded: True
# file size 7815 bytes
# ```
#
# The same nested dict as the one saved (model, optimizer, scheduler, step) with full
# tensors; `torch_save_to_dcp` goes the other way. Use it to hand a model to someone who
# does not run DCP, or to inspect a checkpoint in a notebook.

# %% [markdown]
# ## 4. Saving while the next step runs: `dcp.async_save`
#
# Writing a checkpoint stops training for as long as the write takes. `dcp.async_save`
# first *stages* the state (copies it into CPU memory, so that the training step may change
# the parameters at once), returns a future, and writes from a background thread. Two
# rules: wait on the future (`future.result()`) before the next save, and give it its own
# process group. The writing thread runs collectives (gathering the write results to the
# coordinator) while the training step runs its own; on one shared gloo group the two
# interleave and break the collective-order contract of lesson 09. The worker makes one with
# `dist.new_group(backend="gloo")`, which also serves a job whose training group is NCCL.
#
# Timings alone cannot prove that the write overlaps the step (on a busy machine the
# background thread may finish before step 3 starts), so the worker makes the overlap
# certain: its `FileSystemWriter` subclass, `GatedWriter`, has a `write_data` (which writes
# this rank's shard file, called from DCP's background thread) that first waits, at most
# 30 s, on a `threading.Event`. The main thread runs step 3, prints `future.done()`, and
# only then sets the event. (A `FileSystemWriter` is also `async_save`'s stager: its
# `stage()` copies the state into new CPU tensors.)
#
# **Predict.** When step 3 has finished, is the future done? Which thread writes the
# shards? The state is saved after step 2 and step 3 changes the parameters before the
# write: which parameters end up in the checkpoint?

# %%
show(run, "async")
net2, opt2, _ = mlp(seed=7)
msd2, osd2 = get_state_dict(net2, opt2)
dcp.load({"model": msd2}, checkpoint_id=ck / "step2", no_dist=True)
equal = all(same(msd2[n], ref["params"][n]) for n in msd2)
print(f"step2 checkpoint holds the step-2 parameters: {equal}")

# %% [markdown]
# Output:
# ```text
# rank 0: async_save returned after «time» ms (state staged)
# rank 0: step 3 done (loss «number»); checkpoint finished before the gate opened: False
# rank 0: future.result() returned after «time» ms
# rank 0: shards written by thread 'AsyncCheckpointExecutor_0', not 'MainThread'
# rank 0: step2 has .metadata: True
# rank 1: step 3 done (loss «number»); checkpoint finished before the gate opened: False
# step2 checkpoint holds the step-2 parameters: True
# ```
#
# `async_save` returned once the state was staged, and step 3 (forward, backward,
# reduce-scatter, Adam) ran on both ranks while the checkpoint was still in flight:
# `future.done()` was False after it, as it had to be, since the writer was held at the
# gate. Only then did the main thread open the gate and wait in `future.result()`. The
# shards were written by `AsyncCheckpointExecutor_0`, the one thread of the pool
# `async_save` creates, not by the main thread. (The milliseconds are this shared 2-core
# machine's and vary from run to run: placeholders. Without the gate, how much of the
# write overlaps step 3 would depend on the load; the gate turns that race into a fact.)
# The checkpoint holds the parameters *after step 2*, bitwise, although step 3 changed the
# live parameters before a byte was written: staging copied them first. On a GPU the
# staging copy is device-to-host, and the overlap is what hides a checkpoint's cost on big
# models.

# %% [markdown]
# ## 5. Back to 2 ranks, then the restart drill: kill a rank, let torchrun restart the job
#
# The second launch first closes the chain of section 3: fresh sharded models (other weights
# again) on 2 ranks load `step2_one`, the checkpoint this notebook's single process saved
# after training step 2, take step 3, and compare with the ranks' uninterrupted step 3
# (written by the first launch).
#
# Then a real failure. `worker.py drill` trains 12 steps of an MLP *with dropout* (each rank
# draws its own masks from its own RNG) on a *shuffled* data set (48 rows, 6 batches of 8 an
# epoch, a new order each epoch) and saves after every 3rd step into `step_3`, `step_6`, ...
# The checkpoint is section 2's whole state, on 2 ranks: model, Adam, scheduler, the data
# cursor (epoch, batches used, the shuffle generator's state at the epoch's start), every
# rank's RNG state as one row of a `(world, 5056)` tensor, and what the run was made with
# (config, code revision, world size).
#
# The *parent*, this notebook, kills a rank from outside. It passes the worker a step
# (`--hold 9`): on the first attempt every rank stops there (at a checkpoint step, inside
# the write, once its own shard file is on disk), writes its pid and waits, so that the kill
# lands at the same point on every run (the tests kill other ranks at other steps). A
# thread of the parent (the kit's `kill_when`, told by `held_pid` in `worker.py` which
# process holds as rank 1) sends it SIGKILL. torchrun runs with
# `--max-restarts=1`: when a rank fails, it stops the others and starts all ranks again,
# new processes with `TORCHELASTIC_RESTART_COUNT=1` (the kit sets
# `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, without which the restarted ranks' rendezvous
# reads the first attempt's stale addresses: PyTorch issue #135712).
#
# Which checkpoint is complete? DCP's coordinator writes `.metadata` last, only after every
# rank's write succeeded, to `.metadata.tmp` first, then renames it (a rename is atomic on
# one file system): a folder with `.metadata` is whole, a folder without it is not.
#
# **Predict.** Is the 2 ranks' step 3 from a 1-process checkpoint bitwise equal to the run
# that never stopped? Which checkpoint does the drill's second attempt load, and which steps
# does it compute twice (the *replay window*)?

# %%
drill_dir = TMP / "drill"
drill_dir.mkdir()
with kill_when(lambda: held_pid(drill_dir, 1)) as killed:  # a thread: SIGKILL rank 1 once it holds
    drill = launch(WORKER, ["drill", str(drill_dir), "--one", str(ck), "--hold", "9"], restarts=1)
print(f"torchrun exit code {drill.code} after {drill.seconds:.1f} s; attempts {drill.attempts}")
show(drill, "one to two", 0)

# %% [markdown]
# Output:
# ```text
# torchrun exit code 0 after «time» s; attempts [0, 1]
# rank 0: loaded local weight shard (8, 8) from the full (16, 8)
# rank 0: restored step 2; step 3 loss «number», equal True
# rank 0: parameters after step 3 bitwise equal to the uninterrupted run: True
# rank 1: loaded local weight shard (8, 8) from the full (16, 8)
# ```
#
# 2 → 1 → 2 loses nothing: 2 ranks saved step 1, one process loaded it, trained step 2 and
# saved, and 2 new ranks loaded that and took step 3 bitwise equal to the 2 ranks that never
# stopped. Then the drill ran, twice.
#
# **Predict.** What did attempt 0 print before the kill?

# %%
show(drill, "attempt", 0)
show(drill, "train", 0)
pid1 = int(re.search(r"pid (\d+)", section(drill, "attempt", 0)[1][0])[1])
print(f"the parent's SIGKILL went to rank 1 of attempt 0: {killed == [pid1]}")
died = "failed (exitcode: -9) local_rank: 1" in drill.agent  # torchrun's own log line
print(f"torchrun saw rank 1 exit with -9 (SIGKILL): {died}")

# %% [markdown]
# Output:
# ```text
# rank 0: attempt 0: RANK=0 of WORLD_SIZE=2, pid «pid»
# rank 1: attempt 0: RANK=1 of WORLD_SIZE=2, pid «pid»
# rank 0: step 1 loss «number» lr 0.0500
# rank 0: step 2 loss «number» lr 0.0500
# rank 0: step 3 loss «number» lr 0.0500
# rank 0: saved step_3
# rank 0: step 4 loss «number» lr 0.0500
# rank 0: step 5 loss «number» lr 0.0250
# rank 0: step 6 loss «number» lr 0.0250
# rank 0: saved step_6
# rank 0: step 7 loss «number» lr 0.0250
# rank 0: step 8 loss «number» lr 0.0250
# rank 0: step 9 loss «number» lr 0.0125
# rank 0: holding in checkpoint 9, my shard written
# rank 1: holding in checkpoint 9, my shard written
# the parent's SIGKILL went to rank 1 of attempt 0: True
# torchrun saw rank 1 exit with -9 (SIGKILL): True
# ```
#
# Attempt 0 trained steps 1-9 and saved `step_3` and `step_6`; in checkpoint 9 both ranks
# wrote their shards and held, and the parent killed rank 1 (the pids are the processes',
# different on every run). torchrun saw a rank die by signal 9, stopped rank 0 (SIGTERM) and,
# with one restart allowed, started a new group.
#
# **Predict.** What does attempt 1 find on disk, and where does it start?

# %%
show(drill, "attempt", 1)
show(drill, "train", 1)
show(drill, "reference", 1)

# %% [markdown]
# Output:
# ```text
# rank 0: attempt 1: RANK=0 of WORLD_SIZE=2, pid «pid»
# rank 0: found step_3: 2 shard files, .metadata True -> complete
# rank 0: found step_6: 2 shard files, .metadata True -> complete
# rank 0: found step_9: 2 shard files, .metadata False -> INCOMPLETE, skipped
# rank 0: checkpoint matches this run's config True, code revision True, world size True
# rank 0: resumed from step_6: epoch 0, 6 batches of it used
# rank 1: attempt 1: RANK=1 of WORLD_SIZE=2, pid «pid»
# rank 0: step 7 loss «number» lr 0.0250
# rank 0: step 8 loss «number» lr 0.0250
# rank 0: step 9 loss «number» lr 0.0125
# rank 0: saved step_9
# rank 0: step 10 loss «number» lr 0.0125
# rank 0: step 11 loss «number» lr 0.0125
# rank 0: step 12 loss «number» lr 0.0125
# rank 0: saved step_12
# rank 0: uninterrupted losses: «number» «number» «number» «number» «number» «number» «number» «number» «number» «number» «number» «number»
# rank 0: resumed losses bitwise equal: True
# rank 0: final parameters bitwise equal: True
# ```
#
# Attempt 1 runs in *new* processes (other pids, `TORCHELASTIC_RESTART_COUNT=1`). It found
# `step_9` with both shard files but without `.metadata`, skipped it, loaded `step_6` into
# freshly built and sharded models, and replayed steps 7-9. Step 7 starts epoch 1: its
# order came from the shuffle generator restored at epoch 0's start and advanced past epoch
# 0's draw, as in the run that never stopped. Every resumed loss equals the uninterrupted
# run's and the final parameters are bitwise equal, dropout masks included. (The
# uninterrupted run is computed by the same ranks at the end of attempt 1, from a fresh
# model, with the same code minus the checkpoints.)
#
# Taking the newest folder, `step_9`, would have been wrong: it holds shard files but no
# index of them. The rule: only a checkpoint that is *known* complete exists.
#
# **Identity comes from the environment, at every start.** A restarted rank is a new
# process: attempt 1's pids are not attempt 0's. Here it came back with the same `RANK`
# and `WORLD_SIZE` (one torchrun agent, a fixed 2 ranks); section 6 shows a job where
# they change. The worker does not rely on them staying: it reads `RANK` and `WORLD_SIZE`
# (through `dist.get_rank()`) at each start, never opens a file named after a rank, and
# picks its RNG row by its rank *now*. The checkpoint records the config, a hash of `worker.py` (the
# code revision) and the world size, and a resume refuses a checkpoint that does not match:
# the next cell shows that a run on 4 ranks would not match `step_6`. When a run uses a
# `GradScaler` (fp16, lesson 05a), its `state_dict()` belongs in the checkpoint too.
#
# **Predict.** Read `step_6`'s record with one process. Would a run with another learning
# rate, or on 4 ranks, accept it?

# %%
want = {"app": {"meta": {"config": "", "revision": "", "world": 0}}}
dcp.load(want, checkpoint_id=drill_dir / "step_6", no_dist=True)  # only these keys are read
rec = want["app"]["meta"]
made = json.loads(rec["config"])
print(f"step_6 was made on {rec['world']} ranks with {len(made)} config values, lr {made['lr']}")
print(f"same code: {rec['revision'] == REVISION}")
print(f"this config: {compatible(rec, CONFIG, 2)}")
print(f"lr 0.1:      {compatible(rec, CONFIG | {'lr': 0.1}, 2)}")
print(f"4 ranks:     {compatible(rec, CONFIG, 4)}")
drill_meta = dcp.FileSystemReader(drill_dir / "step_6").read_metadata().state_dict_metadata
scaler = torch.amp.GradScaler("cpu")
print(f"a GradScaler's state: {sorted(scaler.state_dict())}, scale {scaler.get_scale()}")

# %% [markdown]
# Output:
# ```text
# step_6 was made on 2 ranks with 9 config values, lr 0.05
# same code: True
# this config: {'config': True, 'code revision': True, 'world size': True}
# lr 0.1:      {'config': False, 'code revision': True, 'world size': True}
# 4 ranks:     {'config': True, 'code revision': True, 'world size': False}
# a GradScaler's state: ['_growth_tracker', 'backoff_factor', 'growth_factor', 'growth_interval', 'scale'], scale 65536.0
# ```
#
# A resume that accepted another learning rate, or other code, would go on silently with
# a run that is not the one it claims to continue; the world size matters here because the
# RNG rows and the data split are per rank. A scaler's `scale` and `_growth_tracker` change
# as training runs; a fresh one starts again at 65536 (printed above), whatever scale the
# run had reached.
#
# The figure below puts the two attempts' losses on the uninterrupted run's curve.

# %%
fig = plot_drill(drill, checkpoint=6, killed=9)
fig.savefig(HERE / "restart_drill.png")

# %% [markdown]
# The grey band is the run that was never interrupted, the blue dots attempt 0 up to the
# kill, the orange crosses attempt 1 from the checkpoint at step 6 on: steps 7-9 were
# computed twice (the replay window) with the same losses. The replay window is the price
# of a checkpoint interval: saving every N steps loses up to N steps of work per failure
# (here 3, plus the unfinished checkpoint).

# %% [markdown]
# ## 6. An elastic job: a node dies, the job goes on smaller, the ranks are renumbered
#
# The drill restarted a fixed job: one torchrun agent, 2 ranks, the same 2 ranks again. On a
# cluster each machine (a *node*) runs its own agent, and the agents meet in a *rendezvous*:
# a key-value store (c10d's `TCPStore`, hosted by one of them) where they register and
# agree on who takes part. `torchrun --nnodes=1:2` makes the job *elastic*: it starts with 2
# nodes and goes on with 1 if the other is lost. Every restart is a new round of the
# rendezvous, and each round numbers its nodes afresh: it sorts them by host, then by the
# agent's pid, and node 0's ranks come first.
#
# The kit runs 2 agents of 1 rank each, as two simulated nodes on this machine
# (`launch(WORKER, [...], nproc=1, nnodes=2, min_nodes=1, restarts=1)`), with short
# rendezvous timings: a node that misses 2 heartbeats 1 s apart is dropped, and a round
# closes when both nodes are in, or 2 s after the first one joined (torchrun's defaults: 3
# heartbeats 5 s apart, 30 s). `LOGLEVEL=INFO` in the agents' environment makes torchrun's
# agents log why they restart their ranks.
# `worker.py elastic` trains one step of section 3's FSDP2 model and saves it with DCP. It
# also does, on purpose, what the drill's worker never does: each rank writes its part of
# the data set into a file named after its rank (`rank0.json`, `rank1.json`). Then both
# ranks wait in a loop of barriers, and the parent kills *node 0*, its agent and its rank
# at once (the kit's `node_of`), as when a machine loses power.
#
# **Predict.** How does node 1 learn that node 0 is gone? Its agent restarts its rank
# (`--max-restarts=1`): with which `RANK` and `WORLD_SIZE`, and what does it find in the
# file named after its rank?

# %%
elastic_dir = TMP / "elastic"
elastic_dir.mkdir()
with kill_when(lambda: node_of(held_pid(elastic_dir, 0))) as gone:  # node 0: agent and rank
    elastic = launch(WORKER, ["elastic", str(elastic_dir)], nproc=1, nnodes=2, min_nodes=1,
                     restarts=1, env={"LOGLEVEL": "INFO"})
print(f"killed {len(gone)} processes; agents' exit codes {list(elastic.agent_codes)}; "
      f"attempts {elastic.attempts}; processes left {elastic.leftover}")
show(elastic, "elastic", 0)
agents = [int(re.search(r"agent (\d+)", lines[0])[1])
          for lines in section(elastic, "elastic", 0).values()]  # [RANK 0's, RANK 1's]
print(f"RANK 0's agent has the lower pid: {agents[0] < agents[1]}")
print(f"rank 1's attempt 0 failed in a barrier: {'in hold_in_barriers' in elastic.logs[0, 1][1]}")
why = re.findall(r"\[default\] (Worker group \w+\..*|Detected \d+ new nodes.*)", elastic.agent)
print(f"why node 1's agent restarted its rank: {why}")

# %% [markdown]
# Output:
# ```text
# killed 2 processes; agents' exit codes [-9, 0]; attempts [0, 1]; processes left 0
# rank 0: attempt 0: RANK=0 of WORLD_SIZE=2, pid «pid», agent «pid»
# rank 0: saved step_1; rows 0-23 of 48 noted in rank0.json
# rank 1: attempt 0: RANK=1 of WORLD_SIZE=2, pid «pid», agent «pid»
# rank 1: saved step_1; rows 24-47 of 48 noted in rank1.json
# RANK 0's agent has the lower pid: True
# rank 1's attempt 0 failed in a barrier: True
# why node 1's agent restarted its rank: ['Worker group FAILED. 1/1 attempts left; will restart worker group']
# ```
#
# The kill took 2 processes, node 0's agent and its rank (`gone` lists their pids); the agents'
# exit codes are in the order the kit started them: node 0's agent died by SIGKILL (-9),
# node 1's ended normally (0). Nothing was left running. Node 0's agent had the lower pid,
# so its rank was `RANK=0`.
#
# A torchrun agent restarts its ranks for one of two reasons (`_invoke_run` in
# `torch/distributed/elastic/agent/server/api.py`): one of them failed (a restart that
# counts against `--max-restarts`), or a new node waits to join (one that does not count).
# A node that dies is neither: node 1's agent did nothing about node 0's death until its
# rank's next barrier raised and the rank exited with an error. Its log names that failure
# as the reason (`1/1 attempts left`: this restart is the one `--max-restarts=1` allows).
# The traceback is in that rank's stderr, which the kit keeps with its stdout
# (`elastic.logs[0, 1]`: attempt 0, rank 1).
#
# **Predict.** Now the second attempt, on node 1 alone.

# %%
show(elastic, "elastic", 1)
again = int(re.search(r"agent (\d+)", section(elastic, "elastic", 1)[0][0])[1])
print(f"attempt 1's rank runs under the agent of attempt 0's RANK 1: {again == agents[1]}")

# %% [markdown]
# Output:
# ```text
# rank 0: attempt 1: RANK=0 of WORLD_SIZE=1, pid «pid», agent «pid»
# rank 0: rank0.json, named after my RANK: rows 0-23 of 48, written under another agent: True
# rank 0: my part, from RANK and WORLD_SIZE now: rows 0-47 of 48
# rank 0: loaded step_1 (saved by 2 ranks) into 1 rank: parameters bitwise equal: True
# attempt 1's rank runs under the agent of attempt 0's RANK 1: True
# ```
#
# The same node, the same agent, a new process with another identity: `RANK=1` of 2 became
# `RANK=0` of 1. A rank's number is not the name of a machine or of its work; it is its
# place in the current round.
#
# The file named after its rank, `rank0.json`, was written by node 0's rank, the dead one:
# a worker that reloaded "its" notes from it would take rows 0-23, node 0's old part, and
# rows 24-47 would never be seen. Computed from `RANK` and `WORLD_SIZE` now, its part is
# rows 0-47, the whole data set. So: read identity from the environment at every start,
# never from a file named after an old rank, and keep state that must outlive a restart
# in the checkpoint, stored by what it is (DCP's keys are parameter names) rather than by
# who held it. DCP then loaded the 2 ranks' shard files into the single rank, and the
# parameters are bitwise equal to those saved. Section 5's drill would refuse a world of 1
# as its record check refused 4 ranks: its RNG rows and its data split are per rank, so an
# elastic job must keep such state in a form the new world can split again, or not restore
# it.

# %% [markdown]
# ## 7. `torch.save` is a pickle
#
# `torch.save` writes a zip file whose `data.pkl` is a Python pickle, and a pickle can name
# any importable function for the loader to *call*: an object's `__reduce__` returns
# "call f(*args) to rebuild me". The class below rebuilds itself by calling
# `pathlib.Path.touch(marker)`: harmless, but it could as well be `os.system`. Since
# PyTorch 2.6, `torch.load` defaults to `weights_only=True`: an unpickler that allows only
# tensors, plain containers and an allow-list of types.
#
# **Predict.** Which globals does the file ask for? Does `weights_only=True` run them?

# %%
marker = TMP / "pwned.txt"


class Payload:
    def __reduce__(self):
        return (pathlib.Path.touch, (marker,))  # unpickling calls marker.touch()


torch.save({"weight": torch.ones(2), "extra": Payload()}, TMP / "evil.pt")
needs = torch.serialization.get_unsafe_globals_in_checkpoint(TMP / "evil.pt")
# the names without their module: Python 3.13 moved the Path classes to `pathlib._local`
print(f"globals the file needs: {sorted(name.rsplit('.', 1)[-1] for name in needs)}")
try:
    torch.load(TMP / "evil.pt", weights_only=True)
    refusal = None
except Exception as err:  # noqa: BLE001 - we print which error it is
    lines = [line.strip() for line in str(err).splitlines() if "WeightsUnpickler" in line]
    refusal = lines[0].split(" Please")[0]
    print(f"weights_only=True: {type(err).__name__}")
    print(refusal)
created = {"weights_only=True": marker.exists()}
print(f"marker created: {created['weights_only=True']}")
torch.load(TMP / "evil.pt", weights_only=False)  # what an old default, or a careless flag, does
created["weights_only=False"] = marker.exists()
print(f"after weights_only=False, marker created: {created['weights_only=False']}")

# %% [markdown]
# Output:
# ```text
# globals the file needs: ['Path', 'PosixPath', 'getattr']
# weights_only=True: UnpicklingError
# WeightsUnpickler error: Unsupported global: GLOBAL getattr was not an allowed global by default.
# marker created: False
# after weights_only=False, marker created: True
# ```
#
# To rebuild `Payload`, the file asks the unpickler for `getattr(pathlib.Path, "touch")`
# (Python's `builtins.getattr`; the Path classes are `pathlib.…`, or `pathlib._local.…` from
# Python 3.13 on, hence only the names above) and then to call it: `get_unsafe_globals_in_checkpoint` lists what a file needs beyond
# the safe set, without loading it. `weights_only=True` refused the first global it did not
# allow, before calling anything: the marker was not created. With `weights_only=False` the
# same load ran the code and created the marker: any `torch.load(..., weights_only=False)`
# of a file from a stranger runs the stranger's code. If you need your own class in a
# checkpoint, allow exactly it (`torch.serialization.add_safe_globals([...])`), or better,
# keep checkpoints to tensors and plain values.
#
# **Predict.** A DCP checkpoint folder from a stranger: section 1's files, with `.metadata`
# replaced. `dcp.load` starts by reading `.metadata` (`FileSystemReader.read_metadata`).
# Does it refuse code the way `weights_only=True` did?

# %%
stranger = TMP / "stranger"
shutil.copytree(one, stranger)  # section 1's checkpoint, as if downloaded ...
dcp_marker = TMP / "pwned_by_dcp.txt"


class IndexPayload:
    def __reduce__(self):
        return (pathlib.Path.touch, (dcp_marker,))  # unpickling calls dcp_marker.touch()


(stranger / ".metadata").write_bytes(pickle.dumps(IndexPayload()))  # ... with its index replaced
try:
    dcp.FileSystemReader(stranger).read_metadata()  # the first thing dcp.load(..., stranger) does
    print("read_metadata: no error")
except Exception as err:  # noqa: BLE001 - we print which error it is
    print(f"read_metadata raised {type(err).__name__}")
dcp_ran = dcp_marker.exists()
print(f"marker created: {dcp_ran}")

# %% [markdown]
# Output:
# ```text
# read_metadata raised AttributeError
# marker created: True
# ```
#
# No: DCP reads `.metadata` with plain `pickle.load`, so the file's code ran (the marker
# exists) and only *then* did something fail, because what it unpickled was not metadata.
# A malicious file would return real metadata and go unnoticed. DCP's non-tensor values
# (the learning rate, the step, the scheduler of section 3) are read with
# `torch.load(..., weights_only=False)` as well; only its tensors go through
# `weights_only=True`. A checkpoint folder is code: load only checkpoints that you or your
# own job wrote, and hand out weights in a format without pickles.
#
# **Predict.** safetensors stores tensors with no pickle at all. What is in the file?

# %%
tensors = {"weight": torch.arange(6, dtype=torch.float32).reshape(2, 3),
           "bias": torch.tensor([0.5, -1.0])}
save_file(tensors, TMP / "tiny.safetensors")
raw = (TMP / "tiny.safetensors").read_bytes()
(n,) = struct.unpack("<Q", raw[:8])  # the header's length: 8 bytes, little-endian
header = json.loads(raw[8:8 + n])
print(f"file {len(raw)} bytes = 8 + header {n} + data {len(raw) - 8 - n}")
for name, info in header.items():
    print(f"{name}: {info}")
start, end = header["weight"]["data_offsets"]
body = raw[8 + n + start:8 + n + end]
print(f"weight bytes {body.hex(' ', 4)}")
print(f"equal to the tensor's own bytes: {body == tensors['weight'].numpy().tobytes()}")
back = load_file(TMP / "tiny.safetensors")
print(f"load_file gives back the tensors: {all(same(v, tensors[k]) for k, v in back.items())}")
with safe_open(TMP / "tiny.safetensors", framework="pt") as f:  # reads the header only
    print(f"safe_open: keys {sorted(f.keys())}, bias alone {f.get_tensor('bias').tolist()}")

# %% [markdown]
# Output:
# ```text
# file 160 bytes = 8 + header 120 + data 32
# bias: {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]}
# weight: {'dtype': 'F32', 'shape': [2, 3], 'data_offsets': [8, 32]}
# weight bytes 00000000 0000803f 00000040 00004040 00008040 0000a040
# equal to the tensor's own bytes: True
# load_file gives back the tensors: True
# safe_open: keys ['bias', 'weight'], bias alone [0.5, -1.0]
# ```
#
# A safetensors file is 8 bytes of header length (little-endian), a JSON header with each
# tensor's dtype, shape and byte range, then the raw bytes: `weight` is the six float32
# numbers 0 to 5, little-endian (`0000803f` is 1.0), exactly `tensor.numpy().tobytes()`.
# Loading it parses JSON and copies bytes; no code from the file runs, and a loader can
# memory-map it and read one tensor without the others (`safe_open`). It holds tensors
# only: optimizer hyperparameters, a scheduler or a cursor need another file (or the JSON `__metadata__`
# field, strings only), which is why training checkpoints use DCP and releases of weights
# use safetensors.

# %% [markdown]
# ## Summary
#
# - `get_state_dict(model, optim)` → `dcp.save(state, checkpoint_id=folder)`; restoring is
#   build, `get_state_dict` as a template, `dcp.load` (in place), `set_state_dict`. A fresh
#   model and Adam restored after update 1 took update 2 bitwise equal to the uninterrupted
#   one: loss, parameters, `exp_avg`, `exp_avg_sq`, `step`. DCP wrote `__0_0.distcp` (data)
#   and `.metadata` (keys, global shapes, chunks, byte offsets; non-tensors pickled).
# - A checkpoint is the full training state: without the scheduler and the data cursor the
#   resumed run used LR 0.05 where it should use 0.025 and re-trained step 1's batch; without
#   the RNG state dropout diverged at once; with all of them (a Stateful object DCP calls)
#   the resume was exact.
# - DCP writes one file per rank and records each shard's offset in the global tensor: a
#   2-rank FSDP2 checkpoint loaded into 1 process (`no_dist=True`), which took step 2
#   bitwise equal to the ranks (given the same `(g0 + g1) / 2` average) and saved; 2 new
#   ranks loaded that and took step 3 bitwise equal to the ranks that never stopped:
#   2 → 1 → 2. `dcp_to_torch_save` turns a checkpoint into one file of full tensors.
# - `dcp.async_save` stages a copy and writes in the background while training goes on:
#   with the writer held at a gate, step 3 finished while the future was not done, and the
#   checkpoint still held step 2's parameters. Give it its own gloo group and wait on its
#   future before the next save.
# - The restart drill: the parent SIGKILLed rank 1 while checkpoint 9 was being written;
#   `torchrun --max-restarts=1` (with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`) restarted the
#   job; attempt 1 skipped the folder without `.metadata`, loaded `step_6` (model, Adam,
#   scheduler, every rank's RNG state, the shuffled loader's cursor), checked its config,
#   code revision and world size, replayed steps 7-9 and ended bitwise equal to an
#   uninterrupted run, dropout included. Attempt 1's ranks were new processes with the
#   same `RANK` and `WORLD_SIZE` (one agent, 2 ranks), which the worker reads from the
#   environment at every start.
# - An elastic job (`--nnodes=1:2`, two agents of one rank): the parent killed node 0's
#   agent and rank together; node 1's rank saw it only as a failed barrier, and its agent
#   restarted it alone, now `RANK=0` of `WORLD_SIZE=1` (each rendezvous round numbers the
#   nodes by host and pid). The file named after its new rank held node 0's rows 0-23; from
#   the environment its part is rows 0-47. DCP loaded the 2 ranks' checkpoint into the one
#   rank, bitwise.
# - `torch.save` files are pickles that can run code when loaded; `weights_only=True` (the
#   default since 2.6) refuses them. DCP reads `.metadata` with plain `pickle.load`: a
#   checkpoint folder can run code too. safetensors stores a JSON header and raw bytes.

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each stop prints a file of the torch you installed, relative
# to its site-packages folder, and the line where to start reading (the numbers are your
# build's, hence `«line»` below). The stops follow a checkpoint's life: the state dicts
# `get_state_dict` builds, the save's plan and write rounds, resharding on load, the
# `.metadata` file that makes a checkpoint complete, the launcher that restarts the job, and
# the unpickler behind `weights_only=True`.

# %%
from sourcemap import read_the_source  # noqa: E402  (lessons/ is on sys.path: first cell)

read_the_source([
    ("torch/distributed/checkpoint/state_dict.py", "def _get_optim_state_dict(",
     "Behind `get_state_dict(model, optim)`: an optimizer with no state yet first takes one "
     "`step()` with zero gradients and lr 0 (`_init_optim_state`, above), so that the template "
     "already holds the `step`, `exp_avg` and `exp_avg_sq` tensors `dcp.load` fills in place; "
     "then the parameter numbers are replaced by names (`fqn_pid_mapping`), the "
     "`optim.state.weight...` keys of section 1's metadata."),
    ("torch/distributed/checkpoint/state_dict_saver.py", "def _save_state_dict(",
     "A save in two rounds: each rank plans what it holds and the coordinator (rank 0) merges "
     "the plans into the global metadata (`reduce_scatter(\"plan\", ...)`); then each rank "
     "writes its own file, and only when `all_reduce(\"write\", ...)` has gathered every "
     "rank's results without a failure does the coordinator's `finish_checkpoint` write "
     "`.metadata`. `save` and `async_save` above first call each Stateful value's "
     "`state_dict()` (`_stateful_to_state_dict`); `async_save` stages a copy, then runs `save` "
     "on an executor thread."),
    ("torch/distributed/checkpoint/planner_helpers.py", "def create_read_items_for_chunk_list(",
     "DCP's resharding: for each chunk the loading process holds (a whole tensor, or a "
     "DTensor's local shard), it finds the saved chunks that overlap it, by the offsets and "
     "sizes the metadata recorded (section 3 printed them), and makes one read item per "
     "overlap. That is how one process read the 2 ranks' two (8, 8) chunks into a (16, 8) "
     "weight, and 2 ranks later read their rows out of one stored chunk."),
    ("torch/distributed/checkpoint/filesystem.py", "def finish(self, metadata: Metadata",
     "In a save with collectives, called once, on the coordinator, after every rank has "
     "written: it pickles the global metadata into `.metadata.tmp` and renames that to "
     "`.metadata`, the file the drill takes as proof of a complete checkpoint. "
     "`FileSystemReader.read_metadata` further down reads it back with plain `pickle.load` "
     "(why section 7's replaced `.metadata` ran its code), while `read_data` loads tensors "
     "with `weights_only=True`."),
    ("torch/distributed/run.py", "def config_from_args(",
     "torchrun's command line becomes a `LaunchConfig`, `--max-restarts` its `max_restarts` "
     "(refused below 0). `run` below gives `--standalone` a local c10d rendezvous and hands "
     "the config to `elastic_launch`, whose agent (`_invoke_run` in "
     "`torch/distributed/elastic/agent/server/api.py`) stops and restarts the whole worker "
     "group after a failure while `_remaining_restarts > 0`, and also, without counting it, "
     "when a new node waits to join (`num_nodes_waiting`). `--nnodes=1:2` becomes "
     "`min_nodes`, `max_nodes` (`parse_min_max_nnodes`); each restart is a new rendezvous "
     "round, and `_mark_rendezvous_complete` in "
     "`torch/distributed/elastic/rendezvous/dynamic_rendezvous.py` numbers its nodes by "
     "sorting them (host, pid): section 6's survivor, node 1 of round 0, was node 0 of "
     "round 1."),
    ("torch/_weights_only_unpickler.py", "class Unpickler:",
     "What `torch.load(..., weights_only=True)` unpickles with: `load` reads the pickle opcode "
     "by opcode and, at each `GLOBAL`, looks the name up in `_get_allowed_globals()` and in "
     "what `add_safe_globals` allowed, raising `Unsupported global` otherwise, before anything "
     "is called (section 7's refusal of `getattr`). `get_globals_in_pkl` above reads the same "
     "opcodes for `get_unsafe_globals_in_checkpoint`."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/distributed/checkpoint/state_dict.py:«line»  `def _get_optim_state_dict(`
#     Behind `get_state_dict(model, optim)`: an optimizer with no state yet first takes
#     one `step()` with zero gradients and lr 0 (`_init_optim_state`, above), so that the
#     template already holds the `step`, `exp_avg` and `exp_avg_sq` tensors `dcp.load`
#     fills in place; then the parameter numbers are replaced by names
#     (`fqn_pid_mapping`), the `optim.state.weight...` keys of section 1's metadata.
# torch/distributed/checkpoint/state_dict_saver.py:«line»  `def _save_state_dict(`
#     A save in two rounds: each rank plans what it holds and the coordinator (rank 0)
#     merges the plans into the global metadata (`reduce_scatter("plan", ...)`); then each
#     rank writes its own file, and only when `all_reduce("write", ...)` has gathered
#     every rank's results without a failure does the coordinator's `finish_checkpoint`
#     write `.metadata`. `save` and `async_save` above first call each Stateful value's
#     `state_dict()` (`_stateful_to_state_dict`); `async_save` stages a copy, then runs
#     `save` on an executor thread.
# torch/distributed/checkpoint/planner_helpers.py:«line»  `def create_read_items_for_chunk_list(`
#     DCP's resharding: for each chunk the loading process holds (a whole tensor, or a
#     DTensor's local shard), it finds the saved chunks that overlap it, by the offsets
#     and sizes the metadata recorded (section 3 printed them), and makes one read item
#     per overlap. That is how one process read the 2 ranks' two (8, 8) chunks into a (16,
#     8) weight, and 2 ranks later read their rows out of one stored chunk.
# torch/distributed/checkpoint/filesystem.py:«line»  `def finish(self, metadata: Metadata`
#     In a save with collectives, called once, on the coordinator, after every rank has
#     written: it pickles the global metadata into `.metadata.tmp` and renames that to
#     `.metadata`, the file the drill takes as proof of a complete checkpoint.
#     `FileSystemReader.read_metadata` further down reads it back with plain `pickle.load`
#     (why section 7's replaced `.metadata` ran its code), while `read_data` loads tensors
#     with `weights_only=True`.
# torch/distributed/run.py:«line»  `def config_from_args(`
#     torchrun's command line becomes a `LaunchConfig`, `--max-restarts` its
#     `max_restarts` (refused below 0). `run` below gives `--standalone` a local c10d
#     rendezvous and hands the config to `elastic_launch`, whose agent (`_invoke_run` in
#     `torch/distributed/elastic/agent/server/api.py`) stops and restarts the whole worker
#     group after a failure while `_remaining_restarts > 0`, and also, without counting
#     it, when a new node waits to join (`num_nodes_waiting`). `--nnodes=1:2` becomes
#     `min_nodes`, `max_nodes` (`parse_min_max_nnodes`); each restart is a new rendezvous
#     round, and `_mark_rendezvous_complete` in
#     `torch/distributed/elastic/rendezvous/dynamic_rendezvous.py` numbers its nodes by
#     sorting them (host, pid): section 6's survivor, node 1 of round 0, was node 0 of
#     round 1.
# torch/_weights_only_unpickler.py:«line»  `class Unpickler:`
#     What `torch.load(..., weights_only=True)` unpickles with: `load` reads the pickle
#     opcode by opcode and, at each `GLOBAL`, looks the name up in
#     `_get_allowed_globals()` and in what `add_safe_globals` allowed, raising
#     `Unsupported global` otherwise, before anything is called (section 7's refusal of
#     `getattr`). `get_globals_in_pkl` above reads the same opcodes for
#     `get_unsafe_globals_in_checkpoint`.
# ```

# %% [markdown]
# ## Mastery check
#
# Answer each before you open it; every answer points to the section whose printed lines
# show it.
#
# 1. **Verify.** You restore a model and its Adam optimizer, built fresh with other
#    weights, from a DCP checkpoint taken after update 1. How do you show that the restore
#    is right, and with what tolerance?
#
#    <details><summary>Answer</summary>
#
#    Take update 2 in the restored run and in the run that never stopped, and compare them
#    bitwise, with no tolerance: the loss, and for every parameter the parameter itself,
#    Adam's `exp_avg`, `exp_avg_sq` and `step`. Every one was equal, `step` 2 in both
#    (*§ One process: save after one Adam step, restore, take the second step*). Both runs
#    do the same arithmetic, so a complete restore gives the same bits; a difference means
#    some state was not restored, or the arithmetic changed (one backward over 8 rows
#    instead of two averaged halves was not bitwise equal). The same held on 2 FSDP2 ranks:
#    the restored step 2's loss and parameters were bitwise equal to the uninterrupted run's
#    (*§ Two ranks save, one process trains on, two ranks take it back*).
#
#    </details>
#
# 2. **Predict.** A run of 12 steps is resumed after step 6 from a checkpoint of only the
#    model and the optimizer (whose state dict carries the current learning rate). Which
#    batch does step 7 train on, and which learning rate do steps 9 and 10 use?
#
#    <details><summary>Answer</summary>
#
#    Step 1's batch again, [25, 6, 15, 30] instead of [27, 21, 11, 5]: the new data loader
#    started the epoch over. Steps 9 and 10 use 0.05 instead of 0.025: the fresh `StepLR`
#    counted from 0 and halved two steps late. Restoring the scheduler and the cursor but
#    not the RNG state gets the batch and the LR right, yet step 7's loss already differs
#    (0.7160 instead of 1.1660: another dropout mask). With all of them, as one Stateful
#    object, steps 7-12 matched: losses equal, parameters 0.00e+00 apart
#    (*§ A checkpoint is the whole training state*).
#
#    </details>
#
# 3. **Spot the bug.** An elastic job (`--nnodes=1:2`, one rank per node) keeps each rank's
#    position in the data in `cursor_{RANK}.json` and reloads it at every start. Node 0
#    dies; node 1's agent restarts its rank. Which file does that rank open, and what
#    should the job do instead? Can it still load the model checkpoint the 2 ranks wrote?
#
#    <details><summary>Answer</summary>
#
#    It opens `cursor_0.json`, node 0's: the restarted rank is `RANK=0` of `WORLD_SIZE=1`
#    now (it was `RANK=1` of 2), because each rendezvous round numbers the nodes that are
#    left. In the lesson the file named after its new rank held rows 0-23, node 0's part,
#    while its part from `RANK` and `WORLD_SIZE` now is rows 0-47. Read identity from the
#    environment at every start and keep what must survive in the checkpoint, keyed by
#    what it is. The model checkpoint loads: DCP's metadata records each shard's offset in
#    the global tensor, and the one rank's parameters were bitwise equal to the 2 ranks'
#    (*§ An elastic job: a node dies, the job goes on smaller, the ranks are renumbered*).
#
#    </details>
#
# 4. **Spot the bug.** After a crash, a restart resumes from the newest `step_N` folder. The
#    job was killed while writing `step_9`, and both ranks' shard files of `step_9` are on
#    disk. What is wrong, and what should the restart do?
#
#    <details><summary>Answer</summary>
#
#    `step_9` has no `.metadata`, which DCP's coordinator writes last, once every rank's
#    write has succeeded: the folder is incomplete. The drill's second attempt skipped it
#    (`INCOMPLETE, skipped`), checked that `step_6` was made with this run's config, code
#    revision and world size, resumed from `step_6`, replayed steps 7-9 and ended with its
#    losses and final parameters bitwise equal to an uninterrupted run's
#    (*§ Back to 2 ranks, then the restart drill: kill a rank, let torchrun restart the job*).
#
#    </details>
#
# 5. **Predict.** From an unknown source you get a `.pt` file and a DCP checkpoint folder,
#    each built to run code when loaded. Which runs it: `torch.load(path)` with its default
#    `weights_only=True`, or `dcp.load` of the folder?
#
#    <details><summary>Answer</summary>
#
#    `torch.load` with `weights_only=True` refused the global the file asked for
#    (`UnpicklingError`, `Unsupported global: GLOBAL getattr`) and the marker was not
#    created; only `weights_only=False` created it. Reading the folder's `.metadata`, the
#    first file `dcp.load` reads, created its marker, then raised `AttributeError`: the
#    code ran. Load only checkpoints your own jobs wrote, and hand out weights as
#    safetensors, a JSON header and raw bytes (*§ `torch.save` is a pickle*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder; `make exercises N=12` checks your answers
# (`solutions.py` has one way).
#
# 1. `latest_complete(root)`: the step of the newest complete checkpoint folder `step_N`
#    under `root` (one with `.metadata`), or None. Beware of sorting names as text.
# 2. `replay_window(every, killed_after, saved_before_kill=True)`: the steps a restart
#    computes twice when a job saving every `every` steps dies after step `killed_after`.
#    When the kill came while the checkpoint of that very step was being written
#    (`saved_before_kill=False`), that checkpoint does not count.
# 3. `safetensors_header(path)`: read a safetensors file's header by hand (the layout of
#    section 7) and return `{name: (dtype, shape, (start, end))}` for its tensors.
#
# These change the worker and run it with torchrun (the lesson's output is your reference):
#
# A. Run the drill with `--hold 8` and kill rank 0 (between checkpoints; rank 0 hosts the
#    rendezvous store and coordinates DCP). Predict the replay window, then check it.
# B. Let attempt 1 hold too (drop the `attempt == 0` test) and kill a rank in both
#    attempts. What does torchrun do after `--max-restarts=1` is used up, and with what
#    exit code?
# C. Save the drill's checkpoints with `dcp.async_save` (its own gloo group, one future
#    waited before the next save). Is the final result still bitwise equal? What must the
#    restart logic check when a kill comes during a background write?
# D. In `Job.state_dict`, save this rank's `torch.get_rng_state()` under the key `"rng"`
#    instead of the gathered `(world, 5056)` tensor. Load it back on 2 ranks and compare:
#    what did rank 1 get, and does the drill still end bitwise equal?

# %%
shutil.rmtree(TMP, ignore_errors=True)  # every checkpoint, log and file of the lesson

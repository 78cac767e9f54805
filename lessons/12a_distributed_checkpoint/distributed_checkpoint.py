# %% [markdown]
# # 12a · Distributed checkpoint
#
# A long training run will be interrupted: a machine fails, a job is preempted, a rank runs
# out of memory. What survives is what was written to disk. This lesson, the first of two
# parts, saves training state with `torch.distributed.checkpoint` (DCP), proves that a
# restored run takes the next step *bit for bit* like the run that never stopped, and moves
# a checkpoint between one process and 2 FSDP2 ranks, both ways. Part 12b then kills a rank
# in the middle of a real 2-rank job and lets torchrun restart it.
#
# **What you will learn**
#
# - how DCP saves a model and an Adam optimizer (`get_state_dict`, `dcp.save`, `dcp.load`,
#   `set_state_dict`), which files it writes and what its `.metadata` says;
# - that a checkpoint is more than weights: step, learning-rate schedule, random state and
#   the data loader's position, and what goes wrong without each;
# - how a checkpoint saved by one process loads into 2 FSDP2 ranks and one saved by 2 ranks
#   into one process (resharding), and how to turn a checkpoint into one `torch.save` file;
# - `dcp.async_save`: writing a checkpoint while the next step runs;
# - why `torch.load` of a stranger's file is dangerous, why a DCP folder is no safer, and
#   what `weights_only=True` and safetensors do about it.
#
# **Prerequisites:** lessons 09 (process groups, torchrun, DTensor) and 11a (FSDP2's
# sharding); lesson 04a (modules, optimizers) and 04b (data loaders).
#
# **How to run:** `python lessons/12a_distributed_checkpoint/distributed_checkpoint.py` or
# `make lesson N=12a` from the repository root, or open `distributed_checkpoint.ipynb`. It
# writes checkpoints into a temporary folder (removed at the end) and launches `worker.py`
# once on 2 ranks (the CPU, gloo backend) through the course's multi-rank kit,
# `lessons/multirank.py` (lesson 09 explains it). The code the ranks run is in this lesson:
# each cell that starts with `#@worker` only defines functions, and `worker.py` is written
# from those cells. Run it yourself with `torchrun --standalone --nproc-per-node=2
# lessons/12a_distributed_checkpoint/worker.py reshard DIR`, DIR an empty folder (add
# `--backend nccl` on a machine with 2 GPUs; unverified on a GPU). Each printing cell is
# followed by an *Output* block: what it printed with the pinned PyTorch (2.13.0).

# %%
import atexit
import json
import pathlib
import pickle
import shutil
import struct
import sys
import tempfile
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

# lessons/ on the path: the multi-rank kit (lesson 09) and the source map; a notebook has no __file__
sys.path.insert(0, str((Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()).parent))
from multirank import launch, show

# %%
#@worker
# The ranks' imports: worker.py starts with this cell (their code comes in section 3).
import datetime
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from multirank import GROUP_TIMEOUT_S, heading, say, serve, shared

# %%
torch.manual_seed(0)
torch.set_num_threads(1)  # the ranks get one thread each too (OMP_NUM_THREADS=1): 2 cores
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
WORKER = HERE / "worker.py"
TMP = Path(tempfile.mkdtemp(prefix="lesson12a-"))  # the lesson's checkpoints; removed at the end
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
# The experiment is strict: one model takes two Adam updates without stopping; another is built
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
weight1, exp_avg1 = model.weight.detach().clone(), optim.state[model.weight]["exp_avg"].clone()  # as saved
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
# **Predict.** For a plain model the template holds the parameters themselves and Adam's
# state tensors, so `dcp.load` fills them in place. What is `set_state_dict` for, then?
# Below, a fresh optimizer with another learning rate (0.5) loads the checkpoint (saved
# with 0.1).

# %%
other, other_optim = tiny(1)
other_optim.param_groups[0]["lr"] = 0.5  # as if the new run's config said another LR
msd, osd = get_state_dict(other, other_optim)
dcp.load({"model": msd, "optim": osd}, checkpoint_id=one, no_dist=True)
lr_pair = (other_optim.param_groups[0]["lr"], osd["param_groups"][0]["lr"])
filled = (same(other.weight, weight1), same(other_optim.state[other.weight]["exp_avg"], exp_avg1))
print(f"dcp.load alone: weight loaded {filled[0]}, exp_avg loaded {filled[1]}; optimizer lr "
      f"{lr_pair[0]}, the template's {lr_pair[1]}")
set_state_dict(other, other_optim, model_state_dict=msd, optim_state_dict=osd)
lr_after = other_optim.param_groups[0]["lr"]
print(f"after set_state_dict: optimizer lr {lr_after}")

# %% [markdown]
# Output:
# ```text
# dcp.load alone: weight loaded True, exp_avg loaded True; optimizer lr 0.5, the template's 0.1
# after set_state_dict: optimizer lr 0.1
# ```
#
# A tensor can be filled in place; a number cannot. DCP replaced the learning rate in the
# template dict only, and without `set_state_dict` the optimizer would have trained on with
# its own 0.5. `set_state_dict` hands the whole template back to the model and optimizer,
# so a restore never depends on which values DCP could fill in place.
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
items = [i for i in meta.storage_data if hasattr(meta.state_dict_metadata[i.fqn], "size")]
sizes = sorted({meta.storage_data[i].length for i in items})  # the tensors' byte lengths
print(f"bytes per tensor item, 8 floats or 1: {sizes}")

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
# bytes per tensor item, 8 floats or 1: [1577]
# ```
#
# The nested dict is flattened into dotted keys. Every tensor has a global shape and dtype
# (and, when saved by several ranks, the list of *chunks* each rank holds: section 3);
# everything that is not a tensor (the learning rate, the betas, the parameter names) is
# pickled as bytes. Adam's `step` is a tensor too: a float32 scalar (1 in this checkpoint).
# The storage index says which file and which byte offset to read, so a loader reads only
# what it needs. The last line shows the cost of a tiny tensor: every one takes the same
# 1577 bytes, as each is its own small `torch.save` record (read from
# `torch/distributed/checkpoint/filesystem.py`, `_write_item`) whose framing outweighs 32
# bytes of data; the offsets are those of the pinned torch and would change with it.

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
# `Trainer` below keeps all of them and has `state_dict()` / `load_state_dict()`: DCP treats
# such an object as *Stateful* and calls those methods itself on save and on load.


# %%
class Trainer:
    """One process: model + Adam + StepLR + dropout RNG + a shuffling DataLoader with its
    cursor; state_dict()/load_state_dict() make it Stateful for DCP."""

    def __init__(self, seed=0):
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5),
                                         torch.nn.Linear(8, 1))
        self.optim = torch.optim.Adam(self.model.parameters(), lr=0.1)
        self.sched = torch.optim.lr_scheduler.StepLR(self.optim, step_size=4, gamma=0.5)
        data = torch.randn(32, 5, generator=torch.Generator().manual_seed(42))  # (32, 5)
        ds = torch.utils.data.TensorDataset(torch.arange(32), data[:, :4], data[:, 4:])
        self.gen = torch.Generator().manual_seed(7)  # the loader's shuffle generator
        self.loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True,
                                                  generator=self.gen)
        self.step, self.epoch, self.used, self.it = 0, 0, 0, None
        self.epoch_rng = self.gen.get_state()  # the state that decides this epoch's order

    def batch(self):
        if self.it is None:  # (re)start the epoch's iterator at the cursor
            self.gen.set_state(self.epoch_rng)
            self.it = iter(self.loader)
            for _ in range(self.used):
                next(self.it)  # skip what was already consumed
        try:
            idx, x, y = next(self.it)
        except StopIteration:  # a new epoch: record the generator state, then shuffle
            self.epoch, self.used, self.it = self.epoch + 1, 0, None
            self.epoch_rng = self.gen.get_state()
            return self.batch()
        self.used += 1
        return idx, x, y

    def train_step(self):
        idx, x, y = self.batch()  # idx (4,), x (4, 4), y (4, 1)
        lr = self.optim.param_groups[0]["lr"]
        self.optim.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.optim.step()
        self.sched.step()
        self.step += 1
        return {"lr": lr, "batch": idx.tolist(), "loss": loss.item()}

    def state_dict(self):
        msd, osd = get_state_dict(self.model, self.optim)
        cursor = {"step": self.step, "epoch": self.epoch, "used": self.used,
                  "epoch_rng": self.epoch_rng}
        return {"model": msd, "optim": osd, "sched": self.sched.state_dict(),
                "rng": torch.get_rng_state(), "cursor": cursor}

    def load_state_dict(self, sd):
        set_state_dict(self.model, self.optim, model_state_dict=sd["model"],
                       optim_state_dict=sd["optim"])
        self.sched.load_state_dict(sd["sched"])
        torch.set_rng_state(sd["rng"])
        c = sd["cursor"]
        self.step, self.epoch, self.used = c["step"], c["epoch"], c["used"]
        self.epoch_rng, self.it = c["epoch_rng"], None


# %% [markdown]
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
#   the RNG state (its dropout masks came from the new process's generator, as in the next
#   bullet's run). Its new data loader started the epoch over: step 7 trained on step 1's batch
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
# ## 3. Resharding: one process saves, two ranks load, and back
#
# Now the model is sharded. The ranks build the small MLP below, shard it with FSDP2
# (`fully_shard`: every parameter a DTensor `Shard(0)`, each rank holding half the rows) and
# train on a global batch of 8 rows, 4 per rank. A DCP checkpoint is not tied to the layout
# that wrote it: here one process saves a checkpoint that 2 ranks load, and 2 ranks save one
# that one process loads.
#
# The next cell, like every `#@worker` cell, is code the ranks run too. It holds what this
# notebook and the ranks share: the model, its optimizer and schedule, the batch of each
# step (a function of the step alone, so the step count is this data's cursor) and what a
# checkpoint holds.

# %%
#@worker
BATCH = 8  # the global batch of every step


def make_net(seed):
    """The model, on one process: 8 -> 16 -> 4."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def make_optim(net):
    """Adam and a StepLR that halves the learning rate every 4 steps."""
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)


def global_batch(step):
    """The batch of a step, from the step number alone: x (8, 8), y (8, 4)."""
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, 8, generator=gen), torch.randn(BATCH, 4, generator=gen)


def state(model, optim, sched, step):
    """What a checkpoint holds: model and Adam (sharded DTensors on the ranks, plain tensors
    on one process), the schedule and the step (plain values)."""
    msd, osd = get_state_dict(model, optim)
    return {"model": msd, "optim": osd, "sched": sched.state_dict(), "step": step}


# %% [markdown]
# One process can take the step the 2 ranks take with the same arithmetic: each rank's
# half-batch loss gives a gradient, FSDP2's reduce-scatter averages the two, `(g0 + g1) / 2`,
# then Adam steps. `two_rank_step` does exactly that in one process. Here it takes step 1
# from the weights the ranks start from (`make_net(0)`) and saves model, Adam, schedule and
# step with `dcp.save(..., no_dist=True)` into `step1_one`, as any single-process job would.
#
# **Predict.** How many files, and how many chunks of the (16, 8) first weight, does one
# process write?


# %%
def mlp(seed):
    net = make_net(seed)
    return (net, *make_optim(net))


def two_rank_step(net, opt, sched, step, split=True):
    """One step as 2 data-parallel ranks take it: the mean of the two half-batch gradients
    (split=False: one backward over the whole batch of 8 instead)."""
    x, y = global_batch(step)
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
    sched.step()
    return (sum(losses) / len(losses)).item()


ck = TMP / "reshard"
ck.mkdir()
net1, opt1, sched1 = mlp(seed=0)  # the ranks' initial weights
two_rank_step(net1, opt1, sched1, 1)
dcp.save(state(net1, opt1, sched1, 1), checkpoint_id=ck / "step1_one", no_dist=True)
print(f"files in step1_one: {sorted(p.name for p in (ck / 'step1_one').iterdir())}")
single = dcp.FileSystemReader(ck / "step1_one").read_metadata()
for chunk in single.state_dict_metadata["model.0.weight"].chunks:
    print(f"step1_one: model.0.weight chunk at offset {list(chunk.offsets)} size "
          f"{list(chunk.sizes)}")

# %% [markdown]
# Output:
# ```text
# files in step1_one: ['.metadata', '__0_0.distcp']
# step1_one: model.0.weight chunk at offset [0, 0] size [16, 8]
# ```
#
# One file and one chunk: the whole (16, 8) weight at offset [0, 0].
#
# The ranks' side. `build` makes the same model on every rank from one seed and shards it,
# each layer then the whole model (lesson 11a), before the optimizer is made from the
# sharded parameters; `train_step` takes one step on this rank's rows and returns the mean
# loss of both ranks (an all-reduce); `restore` is section 1's restore on a sharded model:
# `state` as the template, `dcp.load` in place, `set_state_dict`.

# %%
#@worker
def build(device, seed=0):
    """make_net on every rank from one seed, sharded by FSDP2 (dim 0); then its optimizer."""
    model = make_net(seed).to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return (model, *make_optim(model))


def train_step(model, optim, sched, step, device):
    """One step on this rank's rows of the global batch; the mean loss of all ranks."""
    per = BATCH // dist.get_world_size()
    rows = slice(dist.get_rank() * per, (dist.get_rank() + 1) * per)  # rank 0: 0-3, rank 1: 4-7
    x, y = (t[rows].to(device) for t in global_batch(step))
    optim.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # FSDP2 reduce-scatters the gradients: each rank gets the mean of its shard
    optim.step()
    sched.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return (total / dist.get_world_size()).item()


def full_params(model):
    """{name: full tensor} gathered from the shards (a collective: every rank calls it)."""
    return {n: p.full_tensor().cpu() for n, p in model.named_parameters()}


def restore(model, optim, sched, path):
    """Load a checkpoint into an already built (sharded) model, optimizer and scheduler."""
    sd = state(model, optim, sched, 0)  # the layout to fill: DCP loads in place
    dcp.load(sd, checkpoint_id=path)
    set_state_dict(model, optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    sched.load_state_dict(sd["sched"])
    return sd["step"]


def bitwise(a, b):
    return all(torch.equal(a[n], b[n]) for n in a)


# %% [markdown]
# The launch runs three parts of the rank code, each under its own heading (**save**,
# **reload**, **one to two**), then section 4's (**async**). **save**: train step 1 from
# seed 0 and `dcp.save` it into `step1` (*each rank writes its own shards*, nothing is
# gathered), then the uninterrupted step 2 (rank 0 writes its loss and parameters to a
# file for this notebook). **reload**: a fresh sharded model with other weights loads
# `step1` and takes step 2 again. **one to two**: another fresh one loads `step1_one`, the
# checkpoint the one process just saved, and takes step 2.

# %%
#@worker
def save_and_reference(root, device):
    heading("save")
    model, optim, sched = build(device)
    loss1 = train_step(model, optim, sched, 1, device)
    dcp.save(state(model, optim, sched, 1), checkpoint_id=root / "step1")
    shared(f"step 1 loss {loss1:.6f}; saved {root.name}/step1")
    shape = tuple(model[0].weight.to_local().shape)
    say(f"local weight shard {shape} of global {tuple(model[0].weight.shape)}")
    loss2 = train_step(model, optim, sched, 2, device)
    params = full_params(model)
    if dist.get_rank() == 0:  # for the notebook's 1-process check of step 2
        torch.save({"loss": loss2, "params": params}, root / "reference.pt")
    shared(f"uninterrupted step 2 loss {loss2:.6f}")
    return loss2, params, (model, optim, sched)


def reload_two_ranks(root, device, loss2, params):
    heading("reload")
    model, optim, sched = build(device, seed=123)  # other weights: the load must overwrite them
    step = restore(model, optim, sched, root / "step1")
    loss = train_step(model, optim, sched, step + 1, device)
    shared(f"restored step {step}; step 2 loss {loss:.6f}, equal {loss == loss2}")
    equal = bitwise(full_params(model), params)
    shared(f"parameters after step 2 bitwise equal to the uninterrupted run: {equal}")


def one_to_two(root, device, loss2, params):
    heading("one to two")
    if not (root / "step1_one").is_dir():  # run by hand: the notebook's one process writes it
        shared("no step1_one here: skipped")
        return
    model, optim, sched = build(device, seed=321)  # other weights again
    step = restore(model, optim, sched, root / "step1_one")  # 1 full chunk -> 2 shards
    say(f"loaded local weight shard {tuple(model[0].weight.to_local().shape)} from the full (16, 8)")
    loss = train_step(model, optim, sched, step + 1, device)
    shared(f"restored step {step} of one process; step 2 loss {loss:.6f}, equal {loss == loss2}")
    equal = bitwise(full_params(model), params)
    shared(f"parameters after step 2 bitwise equal to the uninterrupted run: {equal}")


# %% [markdown]
# `main` hands the part named on the command line to the kit's `serve`, which joins the
# process group, runs the part on every rank and ends the group on every path.
#
# **Predict.** How many `.distcp` files does a 2-rank save write? Are both reloaded step 2s
# bitwise equal to the uninterrupted one?

# %%
#@worker
def reshard(device, root):
    loss2, params, trained = save_and_reference(root, device)
    reload_two_ranks(root, device, loss2, params)
    one_to_two(root, device, loss2, params)
    async_checkpoint(root, device, trained)  # section 4
    return 0


def main():
    serve({"reshard": reshard}, lambda parser: parser.add_argument("root", type=Path))


# %%
run = launch(WORKER, ["reshard", str(ck)])
print(f"torchrun exit code {run.code} after {run.seconds:.1f} s, ranks {sorted(run.out)}")
show(run, "save")
show(run, "reload")
show(run, "one to two")
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
# rank 0: loaded local weight shard (8, 8) from the full (16, 8)
# rank 0: restored step 1 of one process; step 2 loss «number», equal True
# rank 0: parameters after step 2 bitwise equal to the uninterrupted run: True
# rank 1: loaded local weight shard (8, 8) from the full (16, 8)
# files in step1: ['.metadata', '__0_0.distcp', '__1_0.distcp']
# ```
#
# Both ranks wrote their own file, `__0_0.distcp` and `__1_0.distcp`, and rank 0 (the
# *coordinator*) wrote the one `.metadata` once every rank had reported what it wrote.
# Each rank holds an (8, 8) half of the first layer's (16, 8) weight. The fresh model,
# built from other weights, took step 2 exactly as the run that never stopped: loss and all
# four gathered parameters bitwise equal. So did the one built from `step1_one`: each rank
# asked for *its* rows of the one stored (16, 8) chunk (rank 0 rows 0-7, rank 1 rows 8-15),
# and one process's step 1 was the ranks' own, bit for bit. The losses are shown as
# `«number»`: their sixth digit differs between CPUs (the vector instructions change the
# order of additions); that a restored run's are *equal* to the uninterrupted run's is
# printed as True or False and holds on every machine.
#
# **Predict.** The checkpoint `step1` was written by 2 ranks. Can one process without any
# process group read it? What does the metadata say about the first layer's weight?

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
# of one tensor that every rank holds whole (gathered with `all_gather`, so every rank's
# copy is the same; part 12b's drill does that), or all ranks but one lose theirs. A plain
# tensor is no exception: the same key and offset on two ranks is one item, kept once (read
# from `torch/distributed/checkpoint/_dedup_save_plans.py`).
#
# So one process can load it. Below, a plain (unsharded) model with other weights loads
# the 2-rank checkpoint with `no_dist=True` and takes step 2 the way the ranks did.
#
# **Predict.** Is this single-process step 2 bitwise equal to the 2 ranks' step 2? And with
# one backward over all 8 rows instead of two averaged halves?


# %%
def load_one(seed):
    """A plain model, Adam and StepLR with other weights, loaded from the 2-rank checkpoint."""
    net, opt, sched = mlp(seed)
    sd = state(net, opt, sched, 0)
    dcp.load(sd, checkpoint_id=ck / "step1", no_dist=True)  # 2 ranks' shards -> 1 process
    set_state_dict(net, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    sched.load_state_dict(sd["sched"])
    return net, opt, sched, sd["step"]


net, opt, sched, step = load_one(seed=7)
before = {n: p.detach().clone() for n, p in net.named_parameters()}  # as loaded
ref = torch.load(ck / "reference.pt")  # rank 0 saved the ranks' step-2 loss and parameters
lr = opt.param_groups[0]["lr"]
one_loss = two_rank_step(net, opt, sched, step + 1)
print(f"loaded step {step} into 1 process; weight {list(net[0].weight.shape)}, lr {lr}")
print(f"step 2 loss {one_loss:.6f}, equal to the 2 ranks' {one_loss == ref['loss']}")
equal = all(same(p, ref["params"][n]) for n, p in net.named_parameters())
print(f"parameters bitwise equal to the 2 ranks' step 2: {equal}")
whole, whole_opt, whole_sched, _ = load_one(seed=8)
two_rank_step(whole, whole_opt, whole_sched, 2, split=False)
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
# interleave and break the collective-order contract of lesson 09. The ranks make one with
# `dist.new_group(backend="gloo")`, which also serves a job whose training group is NCCL
# (`async_save` refuses a group without a CPU backend: read from
# `torch/distributed/checkpoint/state_dict_saver.py`, `async_save`; unverified on a GPU).
#
# **Predict.** When step 3 has finished, is the future done? Which thread writes the
# shards? The state is saved after step 2 and step 3 changes the parameters before the
# write: which parameters end up in the checkpoint?
#
# Timings alone cannot prove that the write overlaps the step (on a busy machine the
# background thread may finish before step 3 starts), so the code below makes the overlap
# certain: its `FileSystemWriter` subclass, `GatedWriter`, has a `write_data` (which writes
# this rank's shard file, called from DCP's background thread) that first waits, at most
# 30 s, on a `threading.Event`. The main thread runs step 3, prints `future.done()`, and
# only then sets the event. (A `FileSystemWriter` is also `async_save`'s stager: its
# `stage()` copies the state into new CPU tensors.) This is the launch's last section,
# continuing the **save** section's model after its step 2.

# %%
#@worker
GATE_S = 30.0  # the longest the writer waits for the main thread's step 3


class GatedWriter(dcp.FileSystemWriter):
    """A FileSystemWriter whose write_data (run by async_save's background thread) first
    waits until the main thread opens the gate: the write cannot finish before that."""

    def __init__(self, path):
        super().__init__(path)
        self.gate, self.thread = threading.Event(), None

    def write_data(self, plan, planner):
        self.thread = threading.current_thread().name  # which thread writes the shards
        if not self.gate.wait(GATE_S):  # bounded: a main thread that died cannot hang us
            raise TimeoutError(f"the gate stayed closed for {GATE_S} s")
        return super().write_data(plan, planner)


def async_checkpoint(root, device, trained):
    heading("async")
    model, optim, sched = trained  # after step 2
    # its own group: async_save's background collectives must not interleave with training's
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    writer = GatedWriter(root / "step2")
    start = time.perf_counter()
    future = dcp.async_save(state(model, optim, sched, 2), storage_writer=writer, process_group=group)
    shared(f"async_save returned after {(time.perf_counter() - start) * 1000:.1f} ms (state staged)")
    loss3 = train_step(model, optim, sched, 3, device)  # the background thread waits at the gate
    say(f"step 3 done (loss {loss3:.6f}); checkpoint finished before the gate opened: "
        f"{future.done()}")
    writer.gate.set()  # only now may the shards be written
    future.result()  # wait before the next save (and before anyone reads step2)
    shared(f"future.result() returned after {(time.perf_counter() - start) * 1000:.1f} ms")
    shared(f"shards written by thread {writer.thread!r}, not {threading.current_thread().name!r}")
    shared(f"step2 has .metadata: {(root / 'step2' / '.metadata').is_file()}")


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
# `async_save` creates, not by the main thread. (The milliseconds depend on the machine and
# its load: placeholders. Without the gate, how much of the write overlaps step 3 would
# depend on the load; the gate turns that race into a fact.) The checkpoint holds the
# parameters *after step 2*, bitwise, although step 3 changed the live parameters before a
# byte was written: staging copied them first. On a GPU the staging copy is
# device-to-host, and the overlap is what hides a checkpoint's cost on big models
# (unverified on a GPU).

# %% [markdown]
# ## 5. `torch.save` is a pickle
#
# `torch.save` writes a zip file whose `data.pkl` is a Python pickle, and a pickle can name
# any importable function for the loader to *call*: an object's `__reduce__` returns
# "call f(*args) to rebuild me". The class below rebuilds itself by calling
# `pathlib.Path.touch(path)`: harmless, but it could as well be `os.system`. Since
# PyTorch 2.6, `torch.load` defaults to `weights_only=True`: an unpickler that allows only
# tensors, plain containers and an allow-list of types.
#
# **Predict.** Which globals does the file ask for? Does `weights_only=True` run them?

# %%
marker = TMP / "pwned.txt"


class Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))  # unpickling calls path.touch()


torch.save({"weight": torch.ones(2), "extra": Payload(marker)}, TMP / "evil.pt")
needs = torch.serialization.get_unsafe_globals_in_checkpoint(TMP / "evil.pt")
# the names without their module: Python 3.13 moved the Path classes to `pathlib._local`
print(f"globals the file needs: {sorted(name.rsplit('.', 1)[-1] for name in needs)}")
try:
    torch.load(TMP / "evil.pt")  # the default since PyTorch 2.6: weights_only=True
    refusal = None
except Exception as err:  # noqa: BLE001 - we print which error it is
    load_error = type(err).__name__
    lines = [line.strip() for line in str(err).splitlines() if "WeightsUnpickler" in line]
    refusal = lines[0].split(" Please")[0]
    print(f"torch.load(path), its default: {load_error}")
    print(refusal)
created = {"default": marker.exists()}
print(f"marker created: {created['default']}")
torch.load(TMP / "evil.pt", weights_only=False)  # what an old default, or a careless flag, does
created["weights_only=False"] = marker.exists()
print(f"after weights_only=False, marker created: {created['weights_only=False']}")

# %% [markdown]
# Output:
# ```text
# globals the file needs: ['Path', 'PosixPath', 'getattr']
# torch.load(path), its default: UnpicklingError
# WeightsUnpickler error: Unsupported global: GLOBAL getattr was not an allowed global by default.
# marker created: False
# after weights_only=False, marker created: True
# ```
#
# To rebuild `Payload`, the file asks the unpickler for `getattr(Path, "touch")` and calls
# it on the function's argument, the marker's path, itself rebuilt from the class
# `PosixPath` (the cell drops the modules, which Python 3.13 renamed).
# `get_unsafe_globals_in_checkpoint` lists what a file needs beyond the safe set, without
# loading it. The default load, `weights_only=True`, refused the first global it did not
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


(stranger / ".metadata").write_bytes(pickle.dumps(Payload(dcp_marker)))  # ... its index replaced
try:
    dcp.FileSystemReader(stranger).read_metadata()  # the first thing dcp.load(..., stranger) does
    print("read_metadata: no error")
except Exception as err:  # noqa: BLE001 - we print which error it is
    print(f"read_metadata raised {type(err).__name__}")
dcp_ran = dcp_marker.exists()
print(f"marker created: {dcp_ran}")
value_marker = TMP / "pwned_by_value.txt"  # now a pickled value inside a real checkpoint
dcp.save({"w": torch.ones(2), "x": Payload(value_marker)}, checkpoint_id=TMP / "value", no_dist=True)
value_ran = {"save": value_marker.exists()}
dcp.load({"w": torch.empty(2), "x": None}, checkpoint_id=TMP / "value", no_dist=True)
value_ran["load"] = value_marker.exists()
print(f"a Payload value: marker after dcp.save {value_ran['save']}, after dcp.load {value_ran['load']}")

# %% [markdown]
# Output:
# ```text
# read_metadata raised AttributeError
# marker created: True
# a Payload value: marker after dcp.save False, after dcp.load True
# ```
#
# No: DCP reads `.metadata` with plain `pickle.load`, so the file's code ran (the marker
# exists) and only *then* did something fail, because what it unpickled was not metadata.
# A malicious file would return real metadata and go unnoticed (read from
# `torch/distributed/checkpoint/filesystem.py`, `read_metadata`). DCP's non-tensor values
# (the learning rate, the step, the scheduler of section 3) are read with
# `torch.load(..., weights_only=False)` (read from
# `torch/distributed/checkpoint/default_planner.py`, `load_bytes`): the last line's
# `Payload` ran its code in `dcp.load`, not in `dcp.save`. Only tensors go through
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
# only: optimizer hyperparameters, a scheduler or a cursor need another file (or the JSON
# `__metadata__` field, strings only), which is why training checkpoints use DCP and
# releases of weights use safetensors.

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
# - DCP writes one file per rank and records each shard's offset in the global tensor, so a
#   checkpoint loads into another layout: 2 FSDP2 ranks loaded the one chunk one process had
#   saved after step 1, and one process (`no_dist=True`) loaded the 2 ranks' two chunks; both
#   took step 2 bitwise equal to the ranks that never stopped, given the same
#   `(g0 + g1) / 2` average. `dcp_to_torch_save` turns a checkpoint into one file of full
#   tensors.
# - `dcp.async_save` stages a copy and writes in the background while training goes on:
#   with the writer held at a gate, step 3 finished while the future was not done, and the
#   checkpoint still held step 2's parameters. Give it its own gloo group and wait on its
#   future before the next save.
# - `torch.save` files are pickles that can run code when loaded; `weights_only=True` (the
#   default since 2.6) refuses them. DCP reads `.metadata` with plain `pickle.load`: a
#   checkpoint folder can run code too. safetensors stores a JSON header and raw bytes.
#
# Part 12b uses all of it under failure: a rank killed while it writes a checkpoint, a
# torchrun restart, and an elastic job that loses a node.

# %% [markdown]
# ## References
#
# - [`torch.distributed.checkpoint`](https://docs.pytorch.org/docs/2.13/distributed.checkpoint.html):
#   `save`, `load`, `async_save`, `FileSystemWriter` and `FileSystemReader`,
#   `get_state_dict` / `set_state_dict`, `Stateful`, and the format utilities
#   (`dcp_to_torch_save`), sections 1 to 4.
# - [`torch.distributed.fsdp.fully_shard`](https://docs.pytorch.org/docs/2.13/distributed.fsdp.fully_shard.html):
#   the sharding the ranks' checkpoints of section 3 come from.
# - [`torch.load`](https://docs.pytorch.org/docs/2.13/generated/torch.load.html): `weights_only`
#   and `torch.serialization.add_safe_globals`, section 5.
# - [`torch.optim.lr_scheduler.StepLR`](https://docs.pytorch.org/docs/2.13/generated/torch.optim.lr_scheduler.StepLR.html):
#   the schedule whose `state_dict()` section 2 restores.

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each stop prints a file of the torch you installed, relative
# to its site-packages folder, and the line where to start reading (the numbers are your
# build's, hence `«line»` below). The stops follow a checkpoint's life: the state dicts
# `get_state_dict` builds, the save's plan and write rounds, resharding on load, the
# `.metadata` file that makes a checkpoint complete, and the unpickler behind
# `weights_only=True`.

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
     "overlap. That is how 2 ranks read their rows out of one stored (16, 8) chunk, and one "
     "process read the 2 ranks' two (8, 8) chunks into a (16, 8) weight."),
    ("torch/distributed/checkpoint/filesystem.py", "def finish(self, metadata: Metadata",
     "In a save with collectives, called once, on the coordinator, after every rank has "
     "written: it pickles the global metadata into `.metadata.tmp` and renames that to "
     "`.metadata`, so a folder with `.metadata` holds a whole checkpoint (part 12b's restart "
     "relies on it). `FileSystemReader.read_metadata` further down reads it back with plain "
     "`pickle.load` (why section 5's replaced `.metadata` ran its code), while `read_data` "
     "loads tensors with `weights_only=True`."),
    ("torch/_weights_only_unpickler.py", "class Unpickler:",
     "What `torch.load(..., weights_only=True)` unpickles with: `load` reads the pickle opcode "
     "by opcode and, at each `GLOBAL`, looks the name up in `_get_allowed_globals()` and in "
     "what `add_safe_globals` allowed, raising `Unsupported global` otherwise, before anything "
     "is called (section 5's refusal of `getattr`). `get_globals_in_pkl` above reads the same "
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
#     per overlap. That is how 2 ranks read their rows out of one stored (16, 8) chunk,
#     and one process read the 2 ranks' two (8, 8) chunks into a (16, 8) weight.
# torch/distributed/checkpoint/filesystem.py:«line»  `def finish(self, metadata: Metadata`
#     In a save with collectives, called once, on the coordinator, after every rank has
#     written: it pickles the global metadata into `.metadata.tmp` and renames that to
#     `.metadata`, so a folder with `.metadata` holds a whole checkpoint (part 12b's
#     restart relies on it). `FileSystemReader.read_metadata` further down reads it back
#     with plain `pickle.load` (why section 5's replaced `.metadata` ran its code), while
#     `read_data` loads tensors with `weights_only=True`.
# torch/_weights_only_unpickler.py:«line»  `class Unpickler:`
#     What `torch.load(..., weights_only=True)` unpickles with: `load` reads the pickle
#     opcode by opcode and, at each `GLOBAL`, looks the name up in
#     `_get_allowed_globals()` and in what `add_safe_globals` allowed, raising
#     `Unsupported global` otherwise, before anything is called (section 5's refusal of
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
#    (*§ Resharding: one process saves, two ranks load, and back*).
#
#    </details>
#
# 2. **Spot the bug.** Each of 2 ranks keeps its own random state, and the job saves it
#    with DCP under one key, `"rng"`, a plain value every rank passes with its own contents.
#    Whose state does the checkpoint hold?
#
#    <details><summary>Answer</summary>
#
#    One rank's only. DCP stores a value that is not a DTensor once, written by one rank the
#    planner picks (the 2-rank checkpoint's plain `step` was in `__1_0.distcp` only),
#    because it assumes every rank holds the same; the other rank's state is lost. A
#    per-rank value needs a per-rank key, or one tensor with a row per rank
#    (*§ Resharding: one process saves, two ranks load, and back*).
#
#    </details>
#
# 3. **Predict.** `dcp.async_save` is called after step 2, and step 3 changes the parameters
#    before the background thread has written a byte. What does the checkpoint hold, and
#    what must the job do before its next save?
#
#    <details><summary>Answer</summary>
#
#    Step 2's parameters, bitwise: `async_save` staged a copy before it returned, and step 3
#    ran while the future was not done (the writer was held at a gate). Before the next
#    save the job waits on the future (`future.result()`), and the save runs on a process
#    group of its own (*§ Saving while the next step runs: `dcp.async_save`*).
#
#    </details>
#
# 4. **Predict.** From an unknown source you get a `.pt` file and a DCP checkpoint folder,
#    each built to run code when loaded. Which runs it: `torch.load(path)` with its default
#    `weights_only=True`, or `dcp.load` of the folder?
#
#    <details><summary>Answer</summary>
#
#    `torch.load(path)`, whose default is `weights_only=True`, refused the global the file
#    asked for (`UnpicklingError`, `Unsupported global: GLOBAL getattr`) and the marker was
#    not created; only `weights_only=False` created it. Reading the folder's `.metadata`, the
#    first file `dcp.load` reads, created its marker, then raised `AttributeError`: the
#    code ran; so did a pickled value inside a checkpoint, in `dcp.load`. Load only checkpoints your own jobs wrote, and hand out weights as
#    safetensors, a JSON header and raw bytes (*§ `torch.save` is a pickle*).
#
#    </details>
#
# 5. **Transfer.** The 2-rank checkpoint `step1` is loaded by 3 FSDP2 ranks. FSDP2 splits
#    the 16 rows of `model.0.weight` as `torch.chunk` does. Which rows does rank 1 hold, and
#    from which stored chunks does DCP read them?
#
#    <details><summary>Answer</summary>
#
#    `torch.chunk` gives 6, 6 and 4 rows (FSDP2's `_chunk_with_empty`, read from
#    `torch/distributed/fsdp/_fully_shard/_fsdp_param.py`), so rank 1 holds rows 6-11. The metadata lists
#    rows 0-7 (rank 0's chunk, `__0_0.distcp`) and 8-15 (`__1_0.distcp`): rank 1 reads two
#    pieces, rows 6-7 of the first chunk and rows 8-11 of the second, one read item per
#    overlap (*§ Resharding: one process saves, two ranks load, and back*; *Read the
#    source*'s `create_read_items_for_chunk_list`).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder; `make exercises N=12a` checks your answer
# (`solutions.py` has one way).
#
# 1. `safetensors_header(path)`: read a safetensors file's header by hand (the layout of
#    section 5) and return `{name: (dtype, shape, (start, end))}` for its tensors.
#
# These run the rank code with torchrun yourself (the command of *How to run*; in an empty
# folder the **one to two** section is skipped); for B, edit a copy of `worker.py`, which
# the lesson writes from its `#@worker` cells:
#
# A. Run `reshard` on 4 ranks (`--nproc-per-node=4`). Predict the chunks of
#    `model.0.weight` that `step1`'s metadata lists, then read them with
#    `dcp.FileSystemReader(folder / "step1").read_metadata()`. Load that checkpoint into one
#    process as section 3 did: does it care how many ranks wrote it?
# B. In `async_checkpoint`, drop `process_group=group`, so that the background write shares
#    the training group. Predict what happens, then run it: it may stop at once with gloo's
#    error "Received data size doesn't match expected size. Is there a distributed
#    collective mismatch in your code?", or hang until the group's timeout (the kit's 60 s).

# %%
shutil.rmtree(TMP, ignore_errors=True)  # every checkpoint and file of the lesson

# %% [markdown]
# # 04 · Modules and data: where parameters live and how batches are made
#
# An `nn.Module` is a Python object with three registries: parameters, submodules and
# buffers. Everything PyTorch does "to the whole model" (`parameters()`, the optimizer,
# `state_dict()`, `.to()`, `train()`) walks those registries, never your attributes in
# general. A `DataLoader` is a sampler that picks indices, a `collate_fn` that glues items
# into a batch, and optionally worker processes that each hold a copy of your dataset.
# This lesson opens both up.
#
# **What you will learn**
#
# - how `nn.Module.__setattr__` sorts values into `_parameters`, `_modules` and `_buffers`;
# - why layers kept in a plain Python list silently drop out of training, saving and
#   `.to()`, and how `nn.ModuleList` fixes it;
# - tied weights, `state_dict` keys, what `load_state_dict(strict=True)` complains about, and
#   non-persistent buffers;
# - the three separate switches: `train()`/`eval()`, `no_grad`, `inference_mode`;
# - why `total_loss += loss` grows a graph every step, and `loss.item()` does not;
# - optimizer parameter groups: weight decay on matrices only, and what the optimizer's
#   `state_dict` keeps;
# - how a DataLoader orders, batches, pads and masks variable-length token sequences, how its
#   worker processes start (fork, spawn, forkserver) and are seeded, how to make two runs
#   give the same batches, and how an `IterableDataset` must split itself among workers;
# - how many batches are in flight (`num_workers`, `prefetch_factor`), what `pin_memory`
#   does, and the reproducibility switches beyond seeding (deterministic kernels, cuDNN,
#   cuBLAS).
#
# **Prerequisites:** lesson 03 (autograd: `grad_fn`, saved tensors, `backward()` freeing
# them), and basic `nn.Linear` / optimizer use.
#
# **How to run:** `python lessons/04_modules_and_data/modules_and_data.py` or
# `make lesson N=04` from the repository root, or open `modules_and_data.ipynb`. It runs on
# the CPU in seconds, including DataLoader worker processes. It reads the small
# corpus `data/tiny_corpus.txt` of the course repository (or a copy of that file placed in
# this folder). Each printing cell is followed by an *Output* block: what it printed with
# the pinned PyTorch (2.13.0).

# %%
import io
import os
import random
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

# The dataset, collate_fn and worker_init_fn that DataLoader workers run (section 9 says why
# they live in a module of this folder)
from text_data import (Lines, LineStream, collate, first_draws_per_epoch, main_script_hidden, reseed,
                       run_loader, run_stream, start_method)

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()


def count(params):
    """Number of scalar values in an iterable of parameters."""
    return sum(p.numel() for p in params)


def first_line(err):
    """The first line of an error message: stable and short enough to print."""
    return str(err).strip().splitlines()[0]


# %% [markdown]
# ## 1. `__setattr__` sorts what you assign
#
# `self.lin = nn.Linear(3, 2)` looks like an ordinary attribute assignment. `nn.Module`
# overrides `__setattr__`: an `nn.Parameter` goes into `self._parameters`, an `nn.Module`
# into `self._modules`, and a tensor registered with `register_buffer` lives in
# `self._buffers`. Anything else, including a plain tensor, is an ordinary attribute.
#
# **Predict.** `Tiny` below assigns a Linear, a Parameter, two buffers (one
# non-persistent) and a plain tensor. Which registry holds each name? Which names reach
# `state_dict()`?


# %%
class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)  # a Module: goes to _modules
        self.scale = nn.Parameter(torch.ones(2))  # a Parameter: goes to _parameters
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))  # saved, not trained
        self.register_buffer("mask", torch.ones(2), persistent=False)  # neither
        self.note = torch.zeros(2)  # a plain tensor: an ordinary attribute


tiny = Tiny()
print(f"_parameters {list(tiny._parameters)}")
print(f"_modules    {list(tiny._modules)}")
print(f"_buffers    {list(tiny._buffers)}")
print(f"in __dict__: note {'note' in tiny.__dict__}, lin {'lin' in tiny.__dict__}")
print(f"named_parameters {[n for n, _ in tiny.named_parameters()]}")
print(f"state_dict keys  {list(tiny.state_dict())}; non-persistent {tiny._non_persistent_buffers_set}")
print(f"BatchNorm1d's buffers {[n for n, _ in nn.BatchNorm1d(3).named_buffers()]}")

# %% [markdown]
# Output:
# ```text
# _parameters ['scale']
# _modules    ['lin']
# _buffers    ['steps', 'mask']
# in __dict__: note True, lin False
# named_parameters ['scale', 'lin.weight', 'lin.bias']
# state_dict keys  ['scale', 'steps', 'lin.weight', 'lin.bias']; non-persistent {'mask'}
# BatchNorm1d's buffers ['running_mean', 'running_var', 'num_batches_tracked']
# ```
#
# `lin` is *not* in the instance `__dict__`: `tiny.lin` works only because
# `nn.Module.__getattr__` (called when normal lookup fails) searches the three registries.
# `named_parameters()` walks `_parameters`, then each submodule's, joining names with dots.
# `state_dict()` adds the persistent buffers: `steps` is saved, `mask` is not (it is listed
# in `_non_persistent_buffers_set`), and the plain tensor `note` is invisible to all of it.
# A buffer is state that is not trained: BatchNorm's running statistics (and its count of
# batches seen) are buffers.

# %% [markdown]
# ## 2. The silent bug: layers in a plain list
#
# **Predict.** `Stack` keeps four hidden layers in a Python list, `Fixed` in an
# `nn.ModuleList`; both have the same head. Both run forward fine. How many parameter values
# does each report? After one optimizer step, do the hidden weights move?


# %%
class Stack(nn.Module):
    def __init__(self, width=4, depth=4, wrap=list):
        super().__init__()
        self.layers = wrap([nn.Linear(width, width) for _ in range(depth)])  # `list` hides them
        self.head = nn.Linear(width, 1)

    def forward(self, x):  # (B, width) -> (B, 1)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def step_moves_first_layer(model, x):
    """One SGD step on model.parameters(): did layers[0].weight change? Did it get a grad?"""
    before = model.layers[0].weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).pow(2).mean().backward()
    opt.step()
    got_grad = model.layers[0].weight.grad is not None
    return got_grad, not torch.equal(before, model.layers[0].weight)


torch.manual_seed(0)
plain, fixed = Stack(wrap=list), Stack(wrap=nn.ModuleList)
xb = torch.randn(8, 4)  # (B, width)
for name, model in [("list", plain), ("ModuleList", fixed)]:
    got_grad, moved = step_moves_first_layer(model, xb)
    print(f"{name:<10} parameters {count(model.parameters()):>3} values in "
          f"{len(list(model.parameters()))} tensors; layers[0]: grad {got_grad}, moved {moved}")

# %% [markdown]
# Output:
# ```text
# list       parameters   5 values in 2 tensors; layers[0]: grad True, moved False
# ModuleList parameters  85 values in 10 tensors; layers[0]: grad True, moved True
# ```
#
# With a list, `parameters()` sees only the head: 4 + 1 = 5 values instead of
# 4 × (16 + 4) + 5 = 85. The hidden layers still run, and autograd still fills their
# `.grad` (autograd follows the graph, not the module), but the optimizer was built from
# `model.parameters()`, so it never updates them: they keep their random initial weights
# forever and only the head learns. No error, no warning.
#
# **Predict.** What else misses the hidden layers: `state_dict()`? `.to(torch.float64)`?
# `.eval()`?

# %%
for name, model in [("list", plain), ("ModuleList", fixed)]:
    keys = list(model.state_dict())
    model.to(torch.float64)  # converts every registered parameter and buffer in place
    dtypes = f"layers[0] {model.layers[0].weight.dtype}, head {model.head.weight.dtype}"
    print(f"{name:<10} state_dict {len(keys):>2} keys {keys[:3]}; after .to: {dtypes}")
try:
    plain(xb.double())
except RuntimeError as err:
    print(f"list forward in float64 failed: {first_line(err)}")
print(f"ModuleList forward in float64: {fixed(xb.double()).dtype}")
for name, model in [("list", plain), ("ModuleList", fixed)]:
    model.eval()
    print(f"{name:<10} after .eval(): layers[0].training {model.layers[0].training}, "
          f"head.training {model.head.training}")

# %% [markdown]
# Output:
# ```text
# list       state_dict  2 keys ['head.weight', 'head.bias']; after .to: layers[0] torch.float32, head torch.float64
# ModuleList state_dict 10 keys ['layers.0.weight', 'layers.0.bias', 'layers.1.weight']; after .to: layers[0] torch.float64, head torch.float64
# list forward in float64 failed: mat1 and mat2 must have the same dtype, but got Double and Float
# ModuleList forward in float64: torch.float64
# list       after .eval(): layers[0].training True, head.training False
# ModuleList after .eval(): layers[0].training False, head.training False
# ```
#
# `state_dict()` walks the same registries, so a checkpoint of the list model holds only
# the head: reload it and the hidden layers are whatever the new random init gives.
# `.to()` (and `.cuda()`, `.half()`, `.double()`) converts registered tensors only, so the
# hidden layers stay float32 while the head becomes float64; the first matmul that mixes
# them fails (after `.to("cuda")` the error names devices instead: the lesson's GPU test
# checks it). `.eval()` walks the same registry, so the hidden layers of the list model
# stay in training mode: their dropout, had they any, would stay on at evaluation. Of
# these symptoms only the dtype error is loud. `nn.ModuleList` (or `nn.Sequential`, or
# `nn.ModuleDict` for names) registers each layer under its index, giving keys like
# `layers.0.weight`.

# %% [markdown]
# ## 3. Tied weights, `state_dict` keys, strict loading
#
# Language models often use one matrix for the input embedding and the output
# projection ("weight tying"): assign the same `Parameter` object to both modules.
#
# **Predict.** For a tied embedding (10 × 4) and head, how many tensors does
# `parameters()` yield? How many keys does `state_dict()` have?


# %%
class TinyLM(nn.Module):
    def __init__(self, vocab=10, dim=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)  # weight (vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False)  # weight (vocab, dim) too
        self.head.weight = self.emb.weight  # tie: one Parameter, registered twice
        self.register_buffer("causal", torch.ones(8, 8).tril().bool(), persistent=False)


def tied_grad_is_sum(lm, tokens):
    """Is the tied weight's gradient the sum of its two uses' gradients? (the two uses
    recomputed with separate copies of the matrix)"""
    lm.zero_grad()
    F.cross_entropy(lm.head(lm.emb(tokens)), tokens).backward()  # (T, vocab) logits
    emb_w, head_w = (lm.emb.weight.detach().clone().requires_grad_() for _ in range(2))
    F.cross_entropy(F.embedding(tokens, emb_w) @ head_w.T, tokens).backward()
    return torch.allclose(lm.emb.weight.grad, emb_w.grad + head_w.grad, rtol=1e-6, atol=1e-7)


def storages_written(state):
    """How many storages torch.save writes for a state dict (its zip holds one file each)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return sum("/data/" in n for n in zipfile.ZipFile(buf).namelist())


lm = TinyLM()
sd = lm.state_dict()
print(f"parameters(): {len(list(lm.parameters()))} tensor, {count(lm.parameters())} values")
print(f"named_parameters {[n for n, _ in lm.named_parameters()]}")
same = sd["emb.weight"].data_ptr() == sd["head.weight"].data_ptr()
print(f"state_dict keys  {list(sd)}; same memory: {same}; storages torch.save writes: {storages_written(sd)}")
print(f"gradient of the tied matrix = embedding's share + head's share: "
      f"{tied_grad_is_sum(lm, torch.tensor([1, 2, 3]))}")
print(f"buffers {[n for n, _ in lm.named_buffers()]}; 'causal' saved: {'causal' in sd}; "
      f"after .to('meta') it is on {TinyLM().to('meta').causal.device}")

# %% [markdown]
# Output:
# ```text
# parameters(): 1 tensor, 40 values
# named_parameters ['emb.weight']
# state_dict keys  ['emb.weight', 'head.weight']; same memory: True; storages torch.save writes: 1
# gradient of the tied matrix = embedding's share + head's share: True
# buffers ['causal']; 'causal' saved: False; after .to('meta') it is on meta
# ```
#
# `parameters()` removes duplicates (by object identity): the optimizer sees the tied matrix
# once, and its gradient is the sum of both uses. `state_dict()` does not: it lists every
# name, and both entries share one memory (they are detached tensors over the parameter's
# storage, so `torch.save` writes that storage once). The causal mask is a buffer, so
# `.to(device)` moves it with the model (here to the `meta` device, which has shapes but no
# data), but it is non-persistent: rebuilt by `__init__`, never written to a checkpoint.
#
# **Predict.** Load a state dict that lacks `head.weight` and has an extra key. What does
# `strict=True` (the default) say? And `strict=False`?

# %%
bad = {"emb.weight": torch.zeros(10, 4), "extra.bias": torch.zeros(3)}
print(f"emb.weight sum before: {lm.emb.weight.sum().item():.4f}")
try:
    lm.load_state_dict(bad)
except RuntimeError as err:
    for line in str(err).strip().splitlines():
        print(line.strip())
print(f"emb.weight sum after the failed strict load: {lm.emb.weight.sum().item():.4f}")
result = lm.load_state_dict(bad, strict=False)
print(f"strict=False: missing {result.missing_keys}, unexpected {result.unexpected_keys}; "
      f"head.weight sum {lm.head.weight.sum().item():.4f}")

# %% [markdown]
# Output:
# ```text
# emb.weight sum before: -0.8938
# Error(s) in loading state_dict for TinyLM:
# Missing key(s) in state_dict: "head.weight".
# Unexpected key(s) in state_dict: "extra.bias".
# emb.weight sum after the failed strict load: 0.0000
# strict=False: missing ['head.weight'], unexpected ['extra.bias']; head.weight sum 0.0000
# ```
#
# Strict loading names every missing and unexpected key. But look at the sum: the error
# is raised *after* the matching keys were copied, so the model the exception leaves behind
# is half loaded. Treat a failed strict load as a ruined model (load into a fresh one).
# Non-strict loading copies what matches and returns the two lists: always look at them,
# or a renamed layer silently keeps its random weights. Here `head.weight` is "missing"
# although the tie means it was loaded through `emb.weight` (its sum is 0 too): the check
# is by name.

# %% [markdown]
# ## 4. Three switches: `train()`/`eval()`, `no_grad`, `inference_mode`
#
# `model.eval()` sets a flag, `self.training = False`, on every module; layers read it.
# `torch.no_grad()` and `torch.inference_mode()` are autograd modes of the current thread;
# they know nothing about modules.
#
# **Predict.** For each combination below, will two forward passes on the same input agree
# (dropout)? Will BatchNorm's `running_mean` move? Will the output have a `grad_fn`?


# %%
def probe(model, x, train, ctx):
    """Run model twice on x under a mode and a context; report what changed."""
    model.train(train)
    bn = model[1]
    before = bn.running_mean.clone()
    with ctx():
        y1, y2 = model(x), model(x)  # (B, 1) each
    return {
        "same output twice": torch.equal(y1, y2),
        "running_mean moved": not torch.equal(before, bn.running_mean),
        "output has grad_fn": y1.grad_fn is not None,
        "inference tensor": y1.is_inference(),
    }


torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 1))
x4 = torch.randn(16, 4)  # (B, 4)
cases = [(train, name, ctx) for train in (True, False)
         for name, ctx in [("grad", torch.enable_grad), ("no_grad", torch.no_grad),
                           ("inference_mode", torch.inference_mode)]]
rows = {f"{'train' if t else 'eval'} + {name}": probe(net, x4, t, ctx) for t, name, ctx in cases}
cols = list(next(iter(rows.values())))
print(f"{'':<22}" + "".join(f"{c:>20}" for c in cols))
for label, row in rows.items():
    print(f"{label:<22}" + "".join(f"{str(v):>20}" for v in row.values()))
other_thread = []  # what another thread sees while this one is inside no_grad
with torch.no_grad():
    t = threading.Thread(target=lambda: other_thread.append(torch.is_grad_enabled()))
    t.start()
    t.join()
    print(f"inside no_grad: grad enabled here {torch.is_grad_enabled()}, in another thread {other_thread[0]}")

# %% [markdown]
# Output:
# ```text
#                          same output twice  running_mean moved  output has grad_fn    inference tensor
# train + grad                         False                True                True               False
# train + no_grad                      False                True               False               False
# train + inference_mode               False                True               False                True
# eval + grad                           True               False                True               False
# eval + no_grad                        True               False               False               False
# eval + inference_mode                 True               False               False                True
# inside no_grad: grad enabled here False, in another thread True
# ```
#
# The columns split cleanly. `train()`/`eval()` decides the first two: in training mode
# dropout draws a new mask on every call and BatchNorm normalises with the batch's own
# statistics *and updates its running averages*, even under `no_grad`. That is the trap:
# evaluating with `no_grad` but without `eval()` changes your model's buffers and gives
# noisy outputs. The autograd modes decide the last two: `no_grad` and `inference_mode`
# both stop recording a graph; `inference_mode` also marks its outputs as *inference
# tensors*. Evaluation wants `model.eval()` *and* one of the two modes. The last line shows
# that the modes belong to a thread: a data-loading or logging thread started inside
# `no_grad` still records graphs unless it enters the mode itself.
#
# **Predict.** What can you not do with an inference tensor once you are out of the mode:
# read its version counter, write it in place, use it where autograd must save it?

# %%
with torch.inference_mode():
    t_inf = net(x4)  # (B, 1), an inference tensor
w_needs_grad = torch.ones(16, 1, requires_grad=True)
attempts = {"t._version": lambda: t_inf._version, "t.add_(1)": lambda: t_inf.add_(1),
            "(t * w).sum().backward()": lambda: (t_inf * w_needs_grad).sum().backward()}
for what, attempt in attempts.items():
    try:
        attempt()
        print(f"{what}: allowed")
    except RuntimeError as err:
        print(f"{what}: {str(err).split('.')[0]}")
print(f"t.clone() is an inference tensor: {t_inf.clone().is_inference()}")

# %% [markdown]
# Output:
# ```text
# t._version: Inference tensors do not track version counter
# t.add_(1): Inplace update to inference tensor outside InferenceMode is not allowed
# (t * w).sum().backward(): Inference tensors cannot be saved for backward
# t.clone() is an inference tensor: False
# ```
#
# An inference tensor carries no version counter, so autograd could never check that it
# was not overwritten (lesson 03, section 3): it refuses to save one for backward, and
# refuses in-place writes to it outside the mode. That bookkeeping skipped is what
# `inference_mode` buys over `no_grad`. Use it for pure inference; where results may feed
# training later, use `no_grad` (or clone the result).

# %% [markdown]
# ## 5. The leak: `total_loss += loss`
#
# To log an average loss, you add up the losses of each step. `loss` is a tensor with a
# `grad_fn`; adding it to a running total records an `AddBackward0` node whose inputs are
# the total so far and this step's whole graph.
#
# **Predict.** We count the autograd nodes reachable from the total, and the bytes of the
# saved tensors they still hold (each distinct storage once). How do the counts grow per
# step with `total += loss`, when each step calls `backward()` (training) and when it does
# not (an evaluation loop without `no_grad`)? With `total += loss.item()`, or
# `total += loss.detach()`?


# %%
def graph_stats(t):
    """(nodes, saved bytes) of the autograd graph behind t; freed saved tensors count 0."""
    if not isinstance(t, torch.Tensor) or t.grad_fn is None:
        return 0, 0
    seen, stack, storages = set(), [t.grad_fn], {}
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    v = getattr(node, attr)
                except RuntimeError:  # freed by backward(): nothing held any more
                    continue
                if isinstance(v, torch.Tensor):
                    storages[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
        stack += [f for f, _ in node.next_functions]
    return len(seen), sum(storages.values())


def run_steps(how, steps=5, seed=0):
    """Sum the loss of `steps` steps; return [(nodes, saved bytes)] of the total per step,
    and the total."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16), torch.randn(32, 1)  # (B, 16), (B, 1)
    total, stats = 0.0, []
    for _ in range(steps):
        loss = F.mse_loss(model(x), y)
        if how != "eval":  # a training step frees the saved tensors of this step's graph
            opt.zero_grad()
            loss.backward()
            opt.step()
        total += {"item": loss.item, "detach": loss.detach}.get(how, lambda: loss)()
        stats.append(graph_stats(total))
    return stats, total


leak, totals = {}, {}
for how in ("train", "eval", "item", "detach"):
    leak[how], totals[how] = run_steps(how)
for how, stats in leak.items():
    print(f"{how:<6} nodes {[n for n, _ in stats]}  saved bytes {[b for _, b in stats]}")
print(f"the total: a {type(totals['item']).__name__} with .item(), a {type(totals['detach']).__name__} "
      f"with .detach()")

# %% [markdown]
# Output:
# ```text
# train  nodes [11, 18, 25, 32, 39]  saved bytes [0, 0, 0, 0, 0]
# eval   nodes [11, 18, 25, 32, 39]  saved bytes [10752, 19072, 27392, 35712, 44032]
# item   nodes [0, 0, 0, 0, 0]  saved bytes [0, 0, 0, 0, 0]
# detach nodes [0, 0, 0, 0, 0]  saved bytes [0, 0, 0, 0, 0]
# the total: a float with .item(), a Tensor with .detach()
# ```
#
# Each step adds 7 nodes: `AddBackward0`, `MseLossBackward0`, two `AddmmBackward0`, two
# `TBackward0` and `ReluBackward0` (the four `AccumulateGrad` leaves of the parameters are
# shared by all steps, so they are counted once). In training, `backward()` already freed
# the saved tensors, so only the nodes pile up: small, but without bound. In an evaluation
# loop that never calls `backward()`, every step's saved tensors stay alive too: 8320 bytes
# more per step, the (32, 64) float32 hidden activation (8192 bytes, one storage shared by
# `ReluBackward0` and the next `AddmmBackward0`) plus the (32, 1) prediction that
# `MseLossBackward0` keeps (128). The first step also holds the input, the target and the
# second weight, which every later step shares. With a real model that is megabytes of
# activations per step, until the process runs out of memory. `loss.item()` returns a
# Python float: nothing is kept. `loss.detach()` keeps nothing either, and the sum stays a
# tensor on the loss's device: on a GPU, `.item()` makes the CPU wait for the GPU at every
# step, `.detach()` does not (lesson 06).


# %%
LABELS = {"train": "+= loss, backward each step", "eval": "+= loss, no backward",
          "item": "+= loss.item()", "detach": "+= loss.detach()"}


def plot_leak(leak):
    """Nodes and saved KiB of the running total, per step, for each way of summing."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for k, (how, stats) in enumerate(leak.items()):
        steps = range(1, len(stats) + 1)
        style = dict(marker="os^v"[k], markersize=10 - 2 * k, zorder=1 + k, label=LABELS[how])
        axes[0].plot(steps, [n for n, _ in stats], **style)  # train and eval overlap, item and detach too
        axes[1].plot(steps, [b / 1024 for _, b in stats], **style)
    for ax, ylabel in zip(axes, ["graph nodes kept", "saved tensors kept (KiB)"]):
        ax.set_xlabel("step")
        ax.set_xticks(list(steps))
        ax.set_ylabel(ylabel)
        ax.legend()
    fig.suptitle("total += loss keeps every step's graph; loss.item() or loss.detach() keeps nothing")
    fig.tight_layout()
    return fig


fig = plot_leak(leak)
fig.savefig(HERE / "loss_leak.png")

# %% [markdown]
# ## 6. Optimizer parameter groups: no weight decay on biases and norms
#
# An optimizer receives parameters, not a module, and it can receive them in *groups*,
# each with its own hyperparameters. The usual use: weight decay (AdamW shrinks every
# parameter towards 0 by `lr·wd` of its value each step) on the weight matrices only.
# Pulling a bias, or the gain of a LayerNorm, towards 0 does not make the model simpler;
# it only fights what those parameters are for. A common rule (nanoGPT's, for one):
# parameters with 2 or more dimensions decay, 1-D ones do not.
#
# **Predict.** For `Linear(8, 16) → LayerNorm(16) → GELU → Linear(16, 4)`, which parameters
# land in which group? What does the optimizer's `state_dict()` store for them?


# %%
def decay_groups(model, weight_decay):
    """Two parameter groups: matrices decay; biases and norm weights (1-D) do not."""
    named = list(model.named_parameters())
    return [{"params": [p for _, p in named if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for _, p in named if p.ndim < 2], "weight_decay": 0.0}]


torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))
LR, WD = 0.01, 0.1
opt = torch.optim.AdamW(decay_groups(mlp, WD), lr=LR)
names = {id(p): n for n, p in mlp.named_parameters()}
for g in opt.param_groups:
    print(f"weight_decay {g['weight_decay']}: {[names[id(p)] for p in g['params']]}")
opt_sd = opt.state_dict()
print(f"state_dict keys {list(opt_sd)}; state {opt_sd['state']}")
print(f"a group in it: {sorted(opt_sd['param_groups'][0])}")
for g in opt_sd["param_groups"]:
    print(f"  lr {g['lr']}, weight_decay {g['weight_decay']}, params {g['params']}")

# %% [markdown]
# Output:
# ```text
# weight_decay 0.1: ['0.weight', '3.weight']
# weight_decay 0.0: ['0.bias', '1.weight', '1.bias', '3.bias']
# state_dict keys ['state', 'param_groups']; state {}
# a group in it: ['amsgrad', 'betas', 'capturable', 'decoupled_weight_decay', 'differentiable', 'eps', 'foreach', 'fused', 'lr', 'maximize', 'params', 'weight_decay']
#   lr 0.01, weight_decay 0.1, params [0, 1]
#   lr 0.01, weight_decay 0.0, params [2, 3, 4, 5]
# ```
#
# `1.weight` is the LayerNorm's gain: 1-D, so it joins the biases. Every group carries a
# full copy of the hyperparameters (what you did not give, here `lr` and the betas, comes
# from the optimizer's defaults), so one group's values can differ from another's and be
# changed alone. The `state_dict` names no parameter: `params` holds positions 0, 1, 2, ...
# counted through the groups in order, and `state` (empty until the first step) is keyed by
# those positions. It fits only an optimizer built with the same groups, in the same order.
#
# **Predict.** One step with all gradients zero: Adam's own update is then exactly 0, so
# only the decay acts. What happens to each group? Then we load this state into three other
# AdamWs: one built from plain `model.parameters()` (one group), one with the two groups
# swapped, and one with groups of the same sizes (2 and 4) but other parameters in them.
# Which loads fail?

# %%
before = [p.detach().clone() for p in mlp.parameters()]
for p in mlp.parameters():
    p.grad = torch.zeros_like(p)
opt.step()
was = dict(zip(mlp.parameters(), before))  # parameter -> its value before the step
shrunk = all(torch.equal(p, was[p] * (1 - LR * WD)) for p in opt.param_groups[0]["params"])
kept = all(torch.equal(p, was[p]) for p in opt.param_groups[1]["params"])
print(f"decay group: every value times exactly 1 - lr*wd = {1 - LR * WD:.3f}: {shrunk}")
print(f"no-decay group unchanged: {kept}")
print(f"state after the step: {sorted(opt.state_dict()['state'])}, each {list(opt.state_dict()['state'][0])}")
named = dict(mlp.named_parameters())


def grouped(*groups):
    """An AdamW whose parameter groups hold the named parameters, in this order."""
    return torch.optim.AdamW([{"params": [named[n] for n in g]} for g in groups], lr=LR)


others = {"one group": torch.optim.AdamW(mlp.parameters(), lr=LR),
          "groups swapped": grouped(["0.bias", "1.weight", "1.bias", "3.bias"], ["0.weight", "3.weight"]),
          "same sizes, other params": grouped(["0.bias", "3.bias"], ["0.weight", "1.weight", "1.bias", "3.weight"])}
for what, other in others.items():
    try:
        other.load_state_dict(opt.state_dict())
        avg = other.state[named["0.bias"]]["exp_avg"]
        print(f"{what}: loaded; 0.bias {tuple(named['0.bias'].shape)} got an exp_avg of {tuple(avg.shape)}")
    except ValueError as err:
        print(f"{what}: {err}")

# %% [markdown]
# Output:
# ```text
# decay group: every value times exactly 1 - lr*wd = 0.999: True
# no-decay group unchanged: True
# state after the step: [0, 1, 2, 3, 4, 5], each ['step', 'exp_avg', 'exp_avg_sq']
# one group: loaded state dict has a different number of parameter groups
# groups swapped: loaded state dict contains a parameter group that doesn't match the size of optimizer's group
# same sizes, other params: loaded; 0.bias (16,) got an exp_avg of (16, 8)
# ```
#
# AdamW's decay is *decoupled*: `p ← p·(1 - lr·wd)` happens apart from the gradient step,
# so with zero gradients it is all that moves, and only in the group that asked for it.
# The step created the state: a step count and Adam's two running averages per parameter,
# keyed 0 to 5. Loading checks only the number of groups and the size of each: the third
# optimizer accepted the state and gave a (16,) bias the (16, 8) running average of
# `0.weight`, without a word (had the shapes matched, nothing would ever complain).
# A checkpoint of the optimizer is only as good as the code that rebuilds the same groups
# in the same order.

# %% [markdown]
# ## 7. Data: a corpus, a sampler, batches
#
# The course ships a small corpus written for it: `data/tiny_corpus.txt`, 32 short
# sentences, one per line. The lesson looks for it in the repository's `data/` folder, then
# in the lesson's own folder (in case you copied only this folder: copy the file next to the
# lesson). If neither exists it stops with a message that says so, rather than quietly
# using other text: every printed number below depends on that file.
#
# The dataset, and the `collate_fn` of the next section, live in `text_data.py` in this
# folder, for a reason section 9 explains (worker processes must be able to import them).
# The dataset is the smallest map-style one: a length, and item `i` on request.
#
# ```python
# class Lines(Dataset):
#     """Item i: {"idx": i, "ids": the word ids of line i (int64, variable length)}."""
#
#     def __init__(self, lines, vocab):
#         self.lines, self.vocab = lines, vocab
#
#     def __len__(self):
#         return len(self.lines)
#
#     def __getitem__(self, i):
#         return {"idx": i, "ids": encode(self.lines[i], self.vocab)}
# ```
#
# `encode(line, vocab)` looks up each word's id: `torch.tensor([vocab[w] for w in line.split()])`.


# %%
def load_lines(name="tiny_corpus.txt"):
    """The corpus lines, from <repo>/data/ or from the lesson folder."""
    places = [HERE.parent.parent / "data" / name, HERE / name]
    for path in places:
        if path.is_file():
            return [ln for ln in path.read_text().splitlines() if ln.strip()]  # one per line
    raise FileNotFoundError(f"{name} not found in {[str(p) for p in places]}: copy "
                            f"data/{name} from the course repository next to this lesson")


lines = load_lines()
words = Counter(w for line in lines for w in line.split())
vocab = {w: k + 1 for k, w in enumerate(sorted(words))}  # sorted: ids do not depend on order; 0 is PAD
ds = Lines(lines, vocab)
lengths = [len(ds[i]["ids"]) for i in range(len(ds))]
print(f"{len(ds)} lines, {sum(lengths)} tokens, vocabulary {len(vocab)} words + pad")
print(f"lengths min {min(lengths)} max {max(lengths)}; line 0 {ds[0]['ids'].tolist()}")

# %% [markdown]
# Output:
# ```text
# 32 lines, 237 tokens, vocabulary 171 words + pad
# lengths min 4 max 9; line 0 [151, 70, 130, 16, 151, 150, 68, 117]
# ```
#
# Word-level tokens, a sorted vocabulary, id 0 reserved for padding. Sentences have
# different lengths, so items cannot simply be stacked into one tensor.
#
# **Predict.** A sampler yields indices. What do `SequentialSampler` and a
# `RandomSampler` with a seeded `torch.Generator` yield? Does the random one repeat itself
# when iterated again with a freshly seeded generator?

# %%
seq = list(SequentialSampler(ds))
rand_a = list(RandomSampler(ds, generator=torch.Generator().manual_seed(0)))
rand_b = list(RandomSampler(ds, generator=torch.Generator().manual_seed(0)))
print(f"sequential {seq[:10]} ...")
print(f"random     {rand_a[:10]} ...")
print(f"same seed, same order: {rand_a == rand_b}; a permutation: {sorted(rand_a) == seq}")
print(f"DataLoader(shuffle=True) samples with a {type(DataLoader(ds, shuffle=True).sampler).__name__}")

# %% [markdown]
# Output:
# ```text
# sequential [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] ...
# random     [12, 31, 25, 28, 19, 29, 9, 10, 6, 27] ...
# same seed, same order: True; a permutation: True
# DataLoader(shuffle=True) samples with a RandomSampler
# ```
#
# `shuffle=True` in a DataLoader means a `RandomSampler`: one `torch.randperm(n)` per epoch,
# drawn from the loader's `generator` (or from a seed drawn from the global RNG when you
# give none). Every index appears exactly once per epoch.
#
# **Predict.** With 32 items and `batch_size=10`, how many batches, of which sizes, with
# and without `drop_last`?

# %%
for drop_last in (False, True):
    loader = DataLoader(ds, batch_size=10, drop_last=drop_last, collate_fn=lambda items: items)
    sizes = [len(b) for b in loader]
    print(f"drop_last={drop_last!s:<5} len(loader) {len(loader)}  batch sizes {sizes}")
try:
    nn.BatchNorm1d(4)(torch.randn(1, 4))  # a last batch of 1, in training mode
except ValueError as err:
    print(f"BatchNorm1d on a batch of 1: {err}")

# %% [markdown]
# Output:
# ```text
# drop_last=False len(loader) 4  batch sizes [10, 10, 10, 2]
# drop_last=True  len(loader) 3  batch sizes [10, 10, 10]
# BatchNorm1d on a batch of 1: Expected more than 1 value per channel when training, got input size torch.Size([1, 4])
# ```
#
# The `BatchSampler` cuts the sampler's order into chunks of `batch_size`. The last short
# chunk is kept unless `drop_last=True`. Training code drops it when a short batch would
# hurt: a last batch of one item makes BatchNorm raise in training mode (its batch variance
# needs two values), and a short batch is a new shape for a compiled graph (lesson 08).
# Here the `collate_fn` returns the list of items unchanged, to see the batch sizes.

# %% [markdown]
# ## 8. Pad and mask: a `collate_fn` for variable-length sequences
#
# The default `collate_fn` stacks tensors, which fails for different lengths. Ours pads each
# batch to its *own* longest sequence with `PAD` (0), and returns a boolean mask that is
# True on real tokens (attention and the loss use it to ignore the padding):
#
# ```python
# def collate(items):
#     """items: dicts with "ids" (L_i,) -> tokens (B, L) int64, mask (B, L) bool, + other keys."""
#     ids = [it["ids"] for it in items]
#     tokens = nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=PAD)  # (B, L)
#     lens = torch.tensor([len(s) for s in ids])  # (B,)
#     mask = torch.arange(tokens.shape[1]) < lens[:, None]  # (B, L): True on real tokens
#     rest = {k: [it[k] for it in items] for k in items[0] if k != "ids"}
#     return {"tokens": tokens, "mask": mask, **rest}
# ```
#
# **Predict.** For the first batch of 4 lines (lengths 8, 9, 7, 6), what are the shapes of
# `tokens` and `mask`, and how many values are padding?

# %%
batch = next(iter(DataLoader(ds, batch_size=4, collate_fn=collate)))
tokens, mask = batch["tokens"], batch["mask"]
print(f"tokens {tuple(tokens.shape)} {tokens.dtype}, mask {tuple(mask.shape)} {mask.dtype}")
print(f"lengths {mask.sum(1).tolist()}, padding {(~mask).sum().item()} of {mask.numel()}")
for row, m in zip(tokens.tolist(), mask.int().tolist()):
    print(f"{str(row):<42} {''.join(map(str, m))}")
widths = [b["tokens"].shape[1] for b in DataLoader(ds, batch_size=4, collate_fn=collate)]
print(f"padded length of each of the {len(widths)} batches: {widths}")


def padding(batches):
    """Pad tokens in an epoch of collated batches."""
    return sum((~b["mask"]).sum().item() for b in batches)


by_length = sorted(range(len(ds)), key=lambda i: lengths[i])  # indices, shortest line first
sorted_batches = [collate([ds[i] for i in by_length[k : k + 4]]) for k in range(0, len(ds), 4)]
pad_as_is = padding(DataLoader(ds, batch_size=4, collate_fn=collate))
print(f"padding in the epoch: {pad_as_is} tokens; with the lines sorted by length: {padding(sorted_batches)}")

# %% [markdown]
# Output:
# ```text
# tokens (4, 9) torch.int64, mask (4, 9) torch.bool
# lengths [8, 9, 7, 6], padding 6 of 36
# [151, 70, 130, 16, 151, 150, 68, 117, 0]   111111110
# [1, 134, 20, 158, 23, 151, 58, 61, 159]    111111111
# [116, 149, 100, 151, 167, 6, 93, 0, 0]     111111100
# [151, 12, 31, 80, 11, 36, 0, 0, 0]         111111000
# padded length of each of the 8 batches: [9, 8, 9, 9, 8, 7, 9, 9]
# padding in the epoch: 35 tokens; with the lines sorted by length: 11
# ```
#
# Each batch is as long as its own longest line, not as the longest line of the corpus
# (last line but one): a batch of short lines costs less. Sorting lines by length before
# batching cuts the padding further (last line). Sorted batches are no longer random, so a
# training loader shuffles within and across *buckets* of similar lengths instead. The mask is
# computed from the lengths, not from `tokens != PAD`, so a real token that happens to have
# the pad id would still count.

# %% [markdown]
# ## 9. Worker processes and their random state
#
# With `num_workers=2` the DataLoader starts two processes each time you iterate it. Worker
# `w` builds whole batches (batch `k` goes to worker `k % 2`) and sends them back through a
# queue. Before its first batch, the loader seeds each worker from `base_seed + w`: that
# number is the worker's `get_worker_info().seed`; torch's generator and Python's `random`
# are seeded with it, NumPy's global RNG with a seed mixed from the same two numbers.
# `base_seed` is drawn from the loader's `generator` when the iterator is created.
#
# How a worker process starts is the *start method* of Python's `multiprocessing`:
#
# - **fork** (Linux's default up to Python 3.13): a copy of the parent at that moment.
#   Fast, but only the thread that forked exists in the copy; if another thread held a lock
#   then, the child may wait for it forever. From Python 3.12, forking a process that runs
#   other threads emits `DeprecationWarning: ... use of fork() may lead to deadlocks`, and
#   such processes are common: a notebook kernel runs several threads.
# - **spawn** (the default on macOS and Windows): a fresh Python process that imports torch,
#   then receives the dataset, `collate_fn` and `worker_init_fn` by pickle. Pickle stores a
#   class or function by module and name, so they must live in an importable module, not in
#   a notebook cell. And the fresh process first runs the main *script* again, as the
#   module `__mp_main__`, to find what was defined there.
# - **forkserver** (Linux's default from Python 3.14): a server process, started once, fresh
#   like spawn, that forks each worker from itself; each worker then runs the main script
#   again, as under spawn. The same rules as spawn; but with torch imported into the server
#   beforehand, the workers need not import it again.
#
# **Predict.** A six-line script starts one child process by spawn, without and with
# `if __name__ == "__main__":` around its work. What does each print?


# %%
SPAWNING = """import multiprocessing
{guard}ctx = multiprocessing.get_context("spawn")
{indent}p = ctx.Process(target=print, args=("child ran",))
{indent}p.start()
{indent}p.join()
{indent}print("exit code", p.exitcode)
"""


def run_spawning(guarded):
    """Run SPAWNING as a script in a fresh Python: (stdout lines, the child's error, if any)."""
    guard, indent = ('if __name__ == "__main__":\n    ', "    ") if guarded else ("", "")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "spawning.py"
        script.write_text(SPAWNING.format(guard=guard, indent=indent))
        # PYTHON_COLORS=0: a notebook's kernel sets FORCE_COLOR, and Python 3.13 then colours
        # tracebacks, which would hide the "RuntimeError:" this function looks for
        env = {**os.environ, "PYTHON_COLORS": "0"}
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=120, env=env)
    _, raised, message = proc.stderr.partition("RuntimeError:")  # the child's traceback, if any
    error = " ".join(message.split()).split(". ")[0] if raised else None  # its first sentence
    return proc.stdout.splitlines(), error


spawned = {guarded: run_spawning(guarded) for guarded in (False, True)}
for guarded, (out, error) in spawned.items():
    print(f"{'guarded' if guarded else 'unguarded'}: prints {out}")
    if error:
        print(f"  the child: RuntimeError: {error}")

# %% [markdown]
# Output:
# ```text
# unguarded: prints ['exit code 1']
#   the child: RuntimeError: An attempt has been made to start a new process before the current process has finished its bootstrapping phase
# guarded: prints ['child ran', 'exit code 0']
# ```
#
# Without the guard, the child ran the script again up to `p.start()`, and a child may not
# start children of its own while it is still being set up: it raised, and exited with 1.
# With the guard, the child skipped the script's work, ran its target and exited with 0.
# A DataLoader in an unguarded script fails the same way under spawn or forkserver: every
# worker would run the whole script again and die in its `iter(loader)`.
#
# This lesson's workers run only what `text_data.py` defines, and `text_data.run_loader`
# starts them with forkserver on Linux and spawn elsewhere: never by forking the lesson's
# own process. The lesson is a script and a notebook at once, and no guard can span cells.
# While the workers start, `text_data.main_script_hidden()` hides the script's file from
# `multiprocessing`, which reads `__main__.__file__` (and `__main__.__spec__`) to decide
# what to run again; a notebook has neither, so the script then starts workers as a
# notebook does. That is a shortcut for this lesson. In your own training script, write the
# guard.
#
# A random generator that the dataset created in `__init__` is copied, state and all, into
# every worker (by fork, or by pickle), and nobody reseeds it. `Noisy` draws a random
# "augmentation" number per item three times: from its own NumPy generator, created once
# with seed 0, from Python's `random` and from NumPy's global RNG:
#
# ```python
#     def __getitem__(self, i):
#         info = get_worker_info()  # None in the main process
#         item = super().__getitem__(i)
#         item.update(worker=info.id if info else -1, seed=self.seed, torch_seed=torch.initial_seed(),
#                     own=int(self.rng.integers(100)), py=random.randrange(100),
#                     glob=int(np.random.randint(100)))
#         return item
# ```
#
# **Predict.** A shuffled loader over `Noisy`, 2 workers, batches of 3, its generator
# seeded 0, no `worker_init_fn`. Which batches will carry the same draws?


# %%
def show(batches):
    for b in batches:
        print(f"worker {b['worker'][0]}  indices {str(b['idx']):<13} own rng {str(b['own']):<13} "
              f"random {str(b['py']):<13} np.random {b['glob']}")


run_0 = run_loader(lines, vocab)  # no worker_init_fn
show(run_0)
print(f"own rng, first batch, generator seed 1: {run_loader(lines, vocab, seed=1, count=1)[0]['own']}")

# %% [markdown]
# Output:
# ```text
# worker 0  indices [21, 15, 1]   own rng [85, 63, 51]  random [27, 35, 7]   np.random [10, 41, 50]
# worker 1  indices [9, 31, 2]    own rng [85, 63, 51]  random [98, 20, 82]  np.random [23, 74, 37]
# worker 0  indices [23, 5, 13]   own rng [26, 30, 4]   random [5, 81, 40]   np.random [70, 75, 83]
# worker 1  indices [18, 12, 6]   own rng [26, 30, 4]   random [59, 92, 24]  np.random [65, 62, 79]
# own rng, first batch, generator seed 1: [85, 63, 51]
# ```
#
# The dataset's own generator gives worker 1 exactly the draws of worker 0: both received
# the same generator state, so half of the "random" augmentations are duplicates. It is
# worse: every new set of workers receives a fresh copy of the parent's untouched
# generator, so every epoch, and every generator seed, repeats the same draws (last line).
# Python's `random` and NumPy's global RNG, on the other hand, differ per worker: the
# loader seeds both in each worker. Many older texts and posts still say that every worker
# inherits the same NumPy seed; in 2.13.0 that holds for generator objects you made
# yourself, and for libraries the loader does not know about.
#
# The order of indices also differs from the bare `RandomSampler` above, with the same seed
# 0: the loader first draws `base_seed` from the generator, then the sampler draws its
# permutation from what follows.
#
# The fix is a `worker_init_fn`, which the loader calls in each worker before its first
# item:
#
# ```python
# def reseed(worker_id):
#     """worker_init_fn: give the dataset's RNG the worker's own seed (differs per worker)."""
#     info = get_worker_info()  # info.dataset is this worker's copy
#     info.dataset.seed = info.seed  # base_seed + worker_id
#     info.dataset.rng = np.random.default_rng(info.seed)
# ```
#
# **Predict.** The same loader with `worker_init_fn=reseed`, run twice with the generator
# seeded 0, and once seeded 1. Do the draws still repeat across workers? Are the two seed-0
# runs equal?


# %%
def replays_random(batches):
    """Are each worker's Python `random` draws those of random.Random(its torch seed)?"""
    ok = True
    for w in {b["worker"][0] for b in batches}:
        mine = [b for b in batches if b["worker"][0] == w]
        draws = [d for b in mine for d in b["py"]]
        rng = random.Random(mine[0]["torch_seed"][0])
        ok = ok and draws == [rng.randrange(100) for _ in draws]
    return ok


run_a, run_b = run_loader(lines, vocab, init=reseed), run_loader(lines, vocab, init=reseed)
show(run_a)
print(f"worker seeds {sorted({(b['worker'][0], b['seed'][0]) for b in run_a})}")
print(f"inside each worker, torch.initial_seed() is that seed: "
      f"{all(b['torch_seed'] == b['seed'] for b in run_a)}; Python's random starts from it: "
      f"{replays_random(run_a)}")
print(f"two runs, generator seed 0: same batches {run_a == run_b}")
print(f"generator seed 1: same batches {run_loader(lines, vocab, init=reseed, seed=1) == run_a}")

# %% [markdown]
# Output:
# ```text
# worker 0  indices [21, 15, 1]   own rng [52, 77, 52]  random [27, 35, 7]   np.random [10, 41, 50]
# worker 1  indices [9, 31, 2]    own rng [24, 65, 8]   random [98, 20, 82]  np.random [23, 74, 37]
# worker 0  indices [23, 5, 13]   own rng [64, 84, 35]  random [5, 81, 40]   np.random [70, 75, 83]
# worker 1  indices [18, 12, 6]   own rng [26, 81, 93]  random [59, 92, 24]  np.random [65, 62, 79]
# worker seeds [(0, 900450186894289455), (1, 900450186894289456)]
# inside each worker, torch.initial_seed() is that seed: True; Python's random starts from it: True
# two runs, generator seed 0: same batches True
# generator seed 1: same batches False
# ```
#
# `reseed` replaced the copied generator with one seeded from `info.seed`, which is
# `base_seed + worker_id`: the two workers' seeds differ by one, so their draws differ.
# Because `base_seed` comes from the loader's seeded `generator`, a second run repeats every
# index and every draw, and another seed changes them. The recipe: give the loader a seeded
# `torch.Generator`, and seed every other random source in `worker_init_fn` from
# `get_worker_info().seed` (inside a worker, `torch.initial_seed()` returns the same
# number). None of this depends on the start method: the lesson's tests run this loader
# with spawn too, and get the same batches.
#
# **Predict.** Without a `worker_init_fn`, every epoch repeated the dataset's own draws,
# because every epoch started new workers. With `persistent_workers=True` the workers
# survive from one epoch to the next. What do the first batches of two epochs draw then?


# %%
for persistent in (False, True):
    draws = first_draws_per_epoch(lines, vocab, persistent)
    print(f"persistent_workers={persistent!s:<5}: own rng of each epoch's first batch {draws}")

# %% [markdown]
# Output:
# ```text
# persistent_workers=False: own rng of each epoch's first batch [[85, 63, 51], [85, 63, 51]]
# persistent_workers=True : own rng of each epoch's first batch [[85, 63, 51], [54, 55, 93]]
# ```
#
# New workers each epoch start again from the copied generator; persistent workers keep
# their copy, which moves on. Persistence changes when the copies restart, not that the
# workers' copies start out equal: the `worker_init_fn` remains the fix.

# %% [markdown]
# ## 10. Iterable datasets: every worker runs the whole stream
#
# A map-style dataset answers "item `i`?", and the sampler in the main process decides which
# `i` goes to which worker. An `IterableDataset` (a stream: lines read from files, records
# from a network) has only `__iter__`, and each worker runs its own copy of it from the
# start. Unless the stream splits itself, `num_workers=2` reads everything twice.
# `get_worker_info()` tells the copy which worker it runs in (`id`) and how many there are
# (`num_workers`); `LineStream` shards on them when asked:
#
# ```python
#     def __iter__(self):
#         info = get_worker_info()  # None in the main process
#         first, step = (info.id, info.num_workers) if self.shard and info else (0, 1)
#         for i in range(first, len(self.lines), step):
#             yield {"idx": i, "ids": encode(self.lines[i], self.vocab),
#                    "worker": info.id if info else -1}
# ```
#
# **Predict.** A 2-worker loader, batches of 4, over the 32 lines, without and with
# `shard=True`. How many batches and items, and which lines does each batch hold?

# %%
streams = {}  # shard -> [(worker, indices), ...] for every batch
for shard in (False, True):
    streams[shard] = run_stream(lines, vocab, shard=shard)
    seen = Counter(i for _, idx in streams[shard] for i in idx)
    print(f"shard={shard}: {len(streams[shard])} batches, {sum(seen.values())} items for "
          f"{len(lines)} lines; each line seen {sorted(set(seen.values()))} time(s)")
    print("  " + ", ".join(f"worker {w} {idx}" for w, idx in streams[shard][:3]))
try:
    DataLoader(LineStream(lines, vocab, shard=True), batch_size=4, shuffle=True)
except ValueError as err:
    print(f"shuffle=True: {err}")

# %% [markdown]
# Output:
# ```text
# shard=False: 16 batches, 64 items for 32 lines; each line seen [2] time(s)
#   worker 0 [0, 1, 2, 3], worker 1 [0, 1, 2, 3], worker 0 [4, 5, 6, 7]
# shard=True: 8 batches, 32 items for 32 lines; each line seen [1] time(s)
#   worker 0 [0, 2, 4, 6], worker 1 [1, 3, 5, 7], worker 0 [8, 10, 12, 14]
# shuffle=True: DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle=True
# ```
#
# Without sharding, an epoch holds every line twice, and nothing warns you: each duplicate
# batch is one more step on data the model has just seen. With sharding, worker `w` keeps
# lines `w, w + 2, w + 4, ...` and the two workers together read each line once. The loader still takes batches from the workers in turn,
# so the order of an epoch is interleaved, not the file's order. For a stream, batches are
# built inside each worker and the loader refuses `shuffle` (there is no index to shuffle):
# any shuffling (a buffer, shuffled shards) is the dataset's own job.

# %% [markdown]
# ## 11. Batches in flight: `num_workers`, `prefetch_factor`, `pin_memory`
#
# With workers, the main process does not wait for a batch to be asked for: as soon as the
# iterator exists it hands each worker `prefetch_factor` batches of indices (2 by default),
# and every time it receives a batch it hands out one more. The main process runs your
# training step meanwhile, and the workers prepare the next batches. With
# `num_workers=0` there are no workers: each batch is built in the main process when you
# ask for it.
#
# **Predict.** A batch sampler counts how many batches of indices the loader has taken
# from it. How many right after `iter(loader)`, and after the first batch, with 0 workers,
# with 2 workers and the default `prefetch_factor`, and with 2 workers and
# `prefetch_factor=4`?


# %%
class CountingBatches:
    """Batches of 2 consecutive indices, counting how many the loader has taken. It runs in
    the main process only (workers receive indices, not the sampler), so it may live here."""

    def __init__(self, n, size=2):
        self.batches, self.taken = [list(range(i, min(i + size, n))) for i in range(0, n, size)], 0

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for b in self.batches:
            self.taken += 1
            yield b


def taken(num_workers, prefetch_factor):
    """(batches taken when iter() returns, batches taken after the first batch arrived)"""
    sampler = CountingBatches(len(ds))
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers,
                        prefetch_factor=prefetch_factor,
                        multiprocessing_context=start_method() if num_workers else None)
    with main_script_hidden():
        it = iter(loader)  # workers start here
    at_iter = sampler.taken
    next(it)
    del it  # shuts the workers down
    return at_iter, sampler.taken


for workers, prefetch in [(0, None), (2, None), (2, 4)]:
    at_iter, after_first = taken(workers, prefetch)
    print(f"num_workers {workers}, prefetch_factor {prefetch or 'default'}: batches taken at iter() "
          f"{at_iter}, after the first batch {after_first}")
try:
    DataLoader(ds, num_workers=0, prefetch_factor=2)
except ValueError as err:
    print(f"prefetch_factor with num_workers=0: {err}")

# %% [markdown]
# Output:
# ```text
# num_workers 0, prefetch_factor default: batches taken at iter() 0, after the first batch 1
# num_workers 2, prefetch_factor default: batches taken at iter() 4, after the first batch 5
# num_workers 2, prefetch_factor 4: batches taken at iter() 8, after the first batch 9
# prefetch_factor with num_workers=0: prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.
# ```
#
# The default `prefetch_factor` is 2, and `num_workers × prefetch_factor` batches are in
# flight at any time: that many batches' worth of memory, and that much work done ahead.
# Workers are worth their cost when building batches is slow (decoding images, tokenizing
# on the fly): each one is a process with a copy of the dataset and its batches in flight.
#
# The last step of a batch's journey is the copy to the GPU. A CPU tensor normally lives
# in *pageable* memory, which the operating system may move or swap; the GPU's copy engine
# can only read *pinned* (page-locked) memory, so a copy from pageable memory first goes
# through a pinned staging buffer, and the CPU waits for it. `pin_memory=True` makes the
# loader put each batch in pinned memory itself; then
# `batch.to("cuda", non_blocking=True)` can return at once while the copy proceeds, and
# overlap with the GPU's work (lesson 06's GPU tests measure it).
#
# **Predict.** Does `pin_memory=True` give pinned batches on your machine? On one without
# a GPU?

# %%
pinned_batch = next(iter(DataLoader(ds, batch_size=4, collate_fn=collate, pin_memory=True)))
is_pinned = pinned_batch["tokens"].is_pinned()
print(f"pin_memory=True: tokens in pinned memory exactly when a CUDA GPU is present: "
      f"{is_pinned == torch.cuda.is_available()}")

# %% [markdown]
# Output:
# ```text
# pin_memory=True: tokens in pinned memory exactly when a CUDA GPU is present: True
# ```
#
# Pinned memory is allocated through an accelerator's driver. Without one (a CPU-only
# machine), the loader warns on stderr ("'pin_memory' argument is set as true but no
# accelerator is found, then device pinned memory won't be used") and returns ordinary
# tensors; a Mac's MPS backend gets a warning of its own and no pinning either. With a
# CUDA GPU the batch comes back pinned. The printed line states that rule, so that it reads
# the same on every machine; the lesson's GPU test checks the pinned batches and measures
# the copy to the GPU from pinned and from pageable memory.


# %% [markdown]
# ## 12. Reproducibility switches
#
# `torch.manual_seed(s)` seeds the default generator of the CPU (and of every GPU):
# parameter initialisation, dropout masks, `randperm`, and the `base_seed` of loaders that
# have no generator of their own. `torch.use_deterministic_algorithms(True)` is a different
# switch: it makes ops that have a nondeterministic implementation either use a
# deterministic one or raise an error.
#
# **Predict.** Does the same seed give the same initial weights, and the same order from a
# shuffled loader without a generator? Under the switch, does an accumulating `index_put_`
# (two additions to the same cell, an op the documentation lists as nondeterministic on
# CPU) still run? And `put_`, which writes values at flat indices (if an index repeats,
# which write wins)? What does `torch.empty` contain?

# %%
torch.manual_seed(0)
w1 = nn.Linear(3, 2).weight.detach().clone()
order_1 = [b["idx"] for b in DataLoader(ds, batch_size=8, shuffle=True, collate_fn=collate)]
torch.manual_seed(0)
w2 = nn.Linear(3, 2).weight.detach().clone()
order_2 = [b["idx"] for b in DataLoader(ds, batch_size=8, shuffle=True, collate_fn=collate)]
print(f"same seed: same init {torch.equal(w1, w2)}, same loader order {order_1 == order_2}")
torch.use_deterministic_algorithms(True)
try:
    idx = torch.tensor([0, 0, 2])  # cell 0 receives two additions
    acc = torch.zeros(3).index_put_((idx,), torch.ones(3), accumulate=True)  # (3,)
    print(f"deterministic mode {torch.are_deterministic_algorithms_enabled()}: "
          f"index_put_ {acc.tolist()}")
    try:
        torch.zeros(3).put_(torch.tensor([0, 2]), torch.tensor([1.0, 2.0]))  # no index repeats
    except RuntimeError as err:
        print(f"put_ at indices [0, 2]: {str(err).split(', but')[0]}")
    print(f"torch.empty under it: {torch.empty(3).tolist()} "
          f"(fill_uninitialized_memory {torch.utils.deterministic.fill_uninitialized_memory})")
finally:
    torch.use_deterministic_algorithms(False)  # global state: do not leak into later code
print(f"deterministic mode now {torch.are_deterministic_algorithms_enabled()}")
print(f"cuDNN switches: deterministic {torch.backends.cudnn.deterministic}, "
      f"benchmark {torch.backends.cudnn.benchmark}")

# %% [markdown]
# Output:
# ```text
# same seed: same init True, same loader order True
# deterministic mode True: index_put_ [2.0, 0.0, 1.0]
# put_ at indices [0, 2]: put_ does not have a deterministic implementation
# torch.empty under it: [nan, nan, nan] (fill_uninitialized_memory True)
# deterministic mode now False
# cuDNN switches: deterministic False, benchmark False
# ```
#
# Seeding makes the *random numbers* repeat: same initial weights, same dropout masks, same
# loader order. The deterministic switch is about *kernels*: the accumulating `index_put_`
# takes its deterministic path on the CPU. `put_` has no deterministic implementation at
# all (with a repeated index, which write wins is unspecified), and it does not look at
# its indices to find out: under the switch it raises, on the CPU too, even when no index
# repeats. Most ops that raise under the switch are GPU kernels whose parallel threads add
# into the same place in a varying order. A visible CPU effect:
# `torch.empty` fills new memory with NaN (`fill_uninitialized_memory` is True by
# default), so code that reads memory it never wrote shows NaN instead of old garbage. The
# switch is global state, so the cell turns it back off.
#
# On a GPU two more switches matter. cuDNN picks a convolution algorithm per shape:
# `torch.backends.cudnn.benchmark = True` times several and keeps the fastest, which can
# differ from run to run, and `torch.backends.cudnn.deterministic = True` restricts it to
# deterministic ones (both are off by default, as printed). And cuBLAS, under the
# deterministic switch, refuses to run a matrix product unless the environment variable
# `CUBLAS_WORKSPACE_CONFIG` is `:4096:8` or `:16:8` before the process first uses it: a
# fixed workspace makes its reductions repeat. The lesson's GPU test checks both. Full
# reproducibility also needs the same library versions and hardware.

# %% [markdown]
# ## Summary
#
# - `nn.Module.__setattr__` files a `Parameter` under `_parameters`, a `Module` under
#   `_modules`; `register_buffer` files a tensor under `_buffers`. `parameters()`,
#   `state_dict()`, `.to()`, `train()`/`eval()` and the optimizer see only those registries.
# - Layers in a plain list still run and still get gradients, but they are not trained,
#   not saved, not converted and not switched to `eval()`. Use `nn.ModuleList` /
#   `nn.ModuleDict` / `nn.Sequential`.
# - `parameters()` yields a tied parameter once (its gradient sums both uses);
#   `state_dict()` lists it under every name, and `torch.save` writes its storage once.
#   `load_state_dict(strict=True)` raises, naming missing and unexpected keys; with
#   `strict=False`, read the two lists it returns. Non-persistent buffers are not saved.
# - Three independent switches: `train()`/`eval()` (dropout, BatchNorm's batch statistics
#   and running-stat updates), `no_grad` (no graph), `inference_mode` (no graph, inference
#   tensors). Evaluation wants `eval()` and one of the two modes; the modes are per thread.
# - `total += loss` chains every step's graph to the total (nodes always; saved activations
#   too when no `backward()` frees them). Sum `loss.item()` or `loss.detach()`.
# - Parameter groups carry their own hyperparameters: AdamW's decoupled decay on the
#   matrices, none on biases and norm gains. The optimizer's `state_dict` refers to
#   parameters by position in the groups; loading checks only the groups' number and
#   sizes, so rebuild the same grouping in the same order.
# - A DataLoader = sampler (order) → batch sampler (`batch_size`, `drop_last`) →
#   `collate_fn` (here: pad to the batch's longest sequence, mask True on real tokens).
#   Workers get a copy of the dataset (forked, or pickled under spawn and forkserver: keep
#   the dataset, `collate_fn` and `worker_init_fn` in an importable module, and a script's
#   work under `if __name__ == "__main__":`, since spawn and forkserver run the main script
#   again in every worker). The loader seeds torch, `random` and NumPy's global RNG per
#   worker from `base_seed`, which comes from its `generator`. Reseed anything else (a
#   dataset's own generator) in `worker_init_fn`; a seeded `torch.Generator` then makes two
#   runs give the same batches.
# - Each worker runs an `IterableDataset`'s whole `__iter__`: shard it with
#   `get_worker_info()`, or every item comes once per worker.
# - `num_workers × prefetch_factor` batches are in flight; `pin_memory=True` puts batches in
#   page-locked memory for asynchronous copies to a CUDA GPU (and does nothing without one).
# - `torch.manual_seed` repeats random numbers; `use_deterministic_algorithms(True)` picks
#   deterministic kernels or raises (mostly on GPUs, but `put_` raises on the CPU too, even
#   when no index repeats) and fills `torch.empty` with NaN. On a GPU, also mind cuDNN's
#   `benchmark` and `deterministic` switches and `CUBLAS_WORKSPACE_CONFIG`.

# %% [markdown]
# ## Read the source
#
# Where, in the PyTorch you installed, what this lesson showed is implemented. Open each file
# in your editor at the line printed (the line numbers are those of your installed torch;
# they move between releases). The stops follow the lesson: how a module files what you
# assign, the autograd modes, the optimizer's loading by position, then a batch's way from
# the sampler through the loader's prefetching to the worker that seeds itself.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/nn/modules/module.py", "def __setattr__(",
     "A `Parameter` goes through `register_parameter` into `_parameters`, a `Module` into "
     "`_modules`, a `Buffer` (or a tensor assigned to a name already in `_buffers`) into "
     "`_buffers`; anything else, a plain list of layers or a plain tensor, reaches the final "
     "`super().__setattr__` and lands in `__dict__`, where `parameters()`, `state_dict()` and "
     "`.to()` never look."),
    ("torch/autograd/grad_mode.py", "class inference_mode(",
     "`no_grad.__enter__` (above it) only turns this thread's grad mode off with "
     "`torch.set_grad_enabled(False)`, and `inference_mode.__enter__` enters the C++ "
     "`torch._C._InferenceMode` guard; neither touches a module's `training` flag (a warning "
     "in `inference_mode`'s docstring says you must still call `model.eval()`), hence "
     "section 4's two independent pairs of columns."),
    ("torch/optim/optimizer.py", "def load_state_dict(",
     "It checks the number of groups and the length of each (section 6's two errors), then "
     "`id_map` pairs the saved positions with this optimizer's parameters in order: the state "
     "goes by position, whatever the shapes, which is how a (16,) bias got a (16, 8) `exp_avg`."),
    ("torch/utils/data/sampler.py", "class RandomSampler(",
     "`__iter__` yields one `torch.randperm(n)` per epoch from `self.generator`; without one it "
     "first draws a seed from the global RNG, which is why `torch.manual_seed` alone repeated "
     "a shuffled loader's order in section 12."),
    ("torch/utils/data/dataloader.py", "class _MultiProcessingDataLoaderIter(",
     "`_reset` primes the workers with `prefetch_factor * num_workers` calls of "
     "`_try_put_index`, and `_process_data` puts one more for every batch received (section "
     "11's 4, then 5); the `_base_seed` the workers' seeds start from is drawn from the "
     "loader's `generator` in `_BaseDataLoaderIter.__init__`, above it."),
    ("torch/utils/data/_utils/worker.py", "def _worker_loop(",
     "Before its first item a worker seeds `random` and torch with `base_seed + worker_id`, "
     "NumPy's global RNG with `_generate_state(base_seed, worker_id)`, records the seed in "
     "`WorkerInfo` and calls your `worker_init_fn`; nothing here reseeds a generator your "
     "dataset made itself, hence section 9's repeated draws."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/nn/modules/module.py:«line»  `def __setattr__(`
#     A `Parameter` goes through `register_parameter` into `_parameters`, a `Module` into
#     `_modules`, a `Buffer` (or a tensor assigned to a name already in `_buffers`) into
#     `_buffers`; anything else, a plain list of layers or a plain tensor, reaches the
#     final `super().__setattr__` and lands in `__dict__`, where `parameters()`,
#     `state_dict()` and `.to()` never look.
# torch/autograd/grad_mode.py:«line»  `class inference_mode(`
#     `no_grad.__enter__` (above it) only turns this thread's grad mode off with
#     `torch.set_grad_enabled(False)`, and `inference_mode.__enter__` enters the C++
#     `torch._C._InferenceMode` guard; neither touches a module's `training` flag (a
#     warning in `inference_mode`'s docstring says you must still call `model.eval()`),
#     hence section 4's two independent pairs of columns.
# torch/optim/optimizer.py:«line»  `def load_state_dict(`
#     It checks the number of groups and the length of each (section 6's two errors), then
#     `id_map` pairs the saved positions with this optimizer's parameters in order: the
#     state goes by position, whatever the shapes, which is how a (16,) bias got a (16, 8)
#     `exp_avg`.
# torch/utils/data/sampler.py:«line»  `class RandomSampler(`
#     `__iter__` yields one `torch.randperm(n)` per epoch from `self.generator`; without
#     one it first draws a seed from the global RNG, which is why `torch.manual_seed`
#     alone repeated a shuffled loader's order in section 12.
# torch/utils/data/dataloader.py:«line»  `class _MultiProcessingDataLoaderIter(`
#     `_reset` primes the workers with `prefetch_factor * num_workers` calls of
#     `_try_put_index`, and `_process_data` puts one more for every batch received
#     (section 11's 4, then 5); the `_base_seed` the workers' seeds start from is drawn
#     from the loader's `generator` in `_BaseDataLoaderIter.__init__`, above it.
# torch/utils/data/_utils/worker.py:«line»  `def _worker_loop(`
#     Before its first item a worker seeds `random` and torch with `base_seed +
#     worker_id`, NumPy's global RNG with `_generate_state(base_seed, worker_id)`, records
#     the seed in `WorkerInfo` and calls your `worker_init_fn`; nothing here reseeds a
#     generator your dataset made itself, hence section 9's repeated draws.
# ```

# %% [markdown]
# ## Mastery check
#
# Answer each question before you open its answer; every answer points to the section whose
# printed lines show it.
#
# 1. **Spot the bug.** A model keeps its four hidden `Linear` layers in a plain Python list,
#    `self.layers = [nn.Linear(4, 4) for _ in range(4)]`, with a registered head
#    `self.head = nn.Linear(4, 1)`, and trains with
#    `torch.optim.SGD(model.parameters(), lr=0.1)`. Forward and backward run without error.
#    What happens to the hidden layers' weights, to a checkpoint made with `state_dict()`,
#    and to a forward pass on float64 inputs after `model.to(torch.float64)`?
#
#    <details><summary>Answer</summary>
#
#    `parameters()` sees only the head: 5 values in 2 tensors instead of 85 in 10, so the
#    optimizer never updates the hidden layers, although autograd fills their `.grad`
#    (`layers[0]: grad True, moved False`). `state_dict()` has 2 keys, the head's, and
#    `.to(torch.float64)` converts only the head (`layers[0] torch.float32, head
#    torch.float64`), so a float64 forward fails: `mat1 and mat2 must have the same dtype,
#    but got Double and Float`. With `nn.ModuleList` the layers are registered: 85 values,
#    10 keys, `layers[0]` float64 like the head, and the float64 forward runs.
#    (*§ The silent bug: layers in a plain list*)
#
#    </details>
#
# 2. **Predict.** An evaluation loop runs a model with `BatchNorm1d` and `Dropout` under
#    `torch.no_grad()`, but never calls `model.eval()`. Do two passes over the same batch
#    give the same output? Does BatchNorm's `running_mean` change?
#
#    <details><summary>Answer</summary>
#
#    No, and yes: the row `train + no_grad` reads `False` (same output twice) and `True`
#    (running_mean moved). `no_grad` only stops the recording of a graph (output has grad_fn:
#    `False`); dropout and BatchNorm follow the module's `training` flag, which
#    `train()`/`eval()` set and the autograd modes leave alone. With `model.eval()` and
#    `no_grad`, the row reads `True`, `False`, `False`.
#    (*§ Three switches: `train()`/`eval()`, `no_grad`, `inference_mode`*)
#
#    </details>
#
# 3. **Explain.** To log the mean loss, an evaluation loop that never calls `backward()`
#    (and forgot `no_grad`) does `total += loss` at every step, with the lesson's model
#    (`Linear(16, 64)`, ReLU, `Linear(64, 1)`, MSE loss, batch 32). What grows, and by how
#    much per step? What does `total += loss.item()` keep?
#
#    <details><summary>Answer</summary>
#
#    The graph behind `total`: each `+=` records an `AddBackward0` that links the total so far
#    to this step's whole graph, so the nodes go 11, 18, 25, 32, 39 (7 more per step), and,
#    since no `backward()` frees them, the saved tensors too: 10752, 19072, 27392, ... bytes,
#    8320 more per step. With `loss.item()` the total is a Python float, and nothing is
#    kept: 0 nodes, 0 bytes (the same with `loss.detach()`). In a training loop `backward()`
#    frees the saved tensors, but the nodes still pile up.
#    (*§ The leak: `total_loss += loss`*)
#
#    </details>
#
# 4. **Spot the bug.** A dataset creates `self.rng = np.random.default_rng(0)` in `__init__`
#    and draws a random augmentation from it in `__getitem__`. The loader has 2 workers, a
#    seeded `generator` and no `worker_init_fn`. Which draws repeat, and what fixes it?
#
#    <details><summary>Answer</summary>
#
#    Each worker receives a copy of the same generator state, so worker 1's batches draw what
#    worker 0's drew (`own rng [85, 63, 51]` in the first batch of each); each new set of
#    workers starts again from a fresh copy, so every generator seed, and every epoch unless
#    `persistent_workers=True` keeps the workers (and their copies) alive, repeats them too.
#    Python's `random` and NumPy's global RNG do differ per worker: the loader seeds those.
#    The fix is a `worker_init_fn` that reseeds the dataset's generator from
#    `get_worker_info().seed` (`base_seed + worker_id`): the workers' draws then differ, two
#    runs with generator seed 0 give the same batches, and seed 1 other ones.
#    (*§ Worker processes and their random state*)
#
#    </details>
#
# 5. **Predict.** An AdamW with two parameter groups (2 matrices with weight decay, then 4
#    one-dimensional parameters without) has taken a step. Its `state_dict()` is loaded into
#    an AdamW whose two groups have the same sizes, 2 and 4, but hold other parameters. Does
#    the load fail?
#
#    <details><summary>Answer</summary>
#
#    No: the number of groups and the size of each match, and the saved state is keyed by
#    position, so it lands on whatever parameter now holds that position. In the lesson the
#    (16,) bias `0.bias` received the (16, 8) `exp_avg` of `0.weight`, silently. Loading into one group,
#    or into the two groups swapped, does raise. Rebuild the same groups in the same order.
#    (*§ Optimizer parameter groups: no weight decay on biases and norms*)
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement:
#
# 1. `Module` and `ModuleList`: a registry in plain Python (torch is used only to recognise
#    an `nn.Parameter`): `__setattr__` files parameters and submodules, `parameters()`
#    yields each shared object once in registration order, `named_parameters()` gives
#    dotted names, `state_dict()` lists every name.
# 2. `batch_indices(n, batch_size, shuffle, drop_last, seed=0)`: one epoch of batches of
#    indices, as a `BatchSampler` over a `SequentialSampler`, or over a `RandomSampler`
#    with `generator=torch.Generator().manual_seed(seed)`, produces them, without touching
#    the global random state.
# 3. `pad_collate(seqs, pad_id=0)`: pad a batch of token sequences to its longest one and
#    return `(tokens, mask)`, empty sequences included.
#
# Check your answers with `make exercises N=04`: the tests compare your registry with
# `nn.Module` on the same structures, your batches with PyTorch's samplers (and check that
# torch's global RNG is left alone), and your padding with hand-made batches. `solutions.py` has one way to write them.

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
#   give the same batches, and how an `IterableDataset` must split itself among workers.
#
# **Prerequisites:** lesson 03 (autograd: `grad_fn`, saved tensors, `backward()` freeing
# them), and basic `nn.Linear` / optimizer use.
#
# **How to run:** `python lessons/04_modules_and_data/modules_and_data.py` or
# `make lesson N=04` from the repository root, or open `modules_and_data.ipynb`. It runs on
# the CPU in a few seconds, including DataLoader worker processes. It reads the small
# corpus `data/tiny_corpus.txt` of the course repository (or a copy of that file placed in
# this folder). Each printing cell is followed by an *Output* block: what it printed with
# the pinned PyTorch (2.13.0), checked by `make test`.

# %%
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

# The dataset, collate_fn and worker_init_fn that DataLoader workers run (section 9 says why
# they live in a module of this folder)
from text_data import Lines, LineStream, collate, reseed, run_loader, run_stream

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
print(f"state_dict keys  {list(tiny.state_dict())}")

# %% [markdown]
# Output:
# ```text
# _parameters ['scale']
# _modules    ['lin']
# _buffers    ['steps', 'mask']
# in __dict__: note True, lin False
# named_parameters ['scale', 'lin.weight', 'lin.bias']
# state_dict keys  ['scale', 'steps', 'lin.weight', 'lin.bias']
# ```
#
# `lin` is *not* in the instance `__dict__`: `tiny.lin` works only because
# `nn.Module.__getattr__` (called when normal lookup fails) searches the three registries.
# `named_parameters()` walks `_parameters`, then each submodule's, joining names with dots.
# `state_dict()` adds the persistent buffers: `steps` is saved, `mask` is not (it is listed
# in `_non_persistent_buffers_set`), and the plain tensor `note` is invisible to all of it.
# A buffer is state that is not trained: BatchNorm's running statistics are buffers.

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

# %% [markdown]
# Output:
# ```text
# list       state_dict  2 keys ['head.weight', 'head.bias']; after .to: layers[0] torch.float32, head torch.float64
# ModuleList state_dict 10 keys ['layers.0.weight', 'layers.0.bias', 'layers.1.weight']; after .to: layers[0] torch.float64, head torch.float64
# list forward in float64 failed: mat1 and mat2 must have the same dtype, but got Double and Float
# ModuleList forward in float64: torch.float64
# ```
#
# `state_dict()` walks the same registries, so a checkpoint of the list model holds only
# the head: reload it and the hidden layers are whatever the new random init gives.
# `.to()` (and `.cuda()`, `.half()`, `.double()`) converts registered tensors only, so the
# hidden layers stay float32 while the head becomes float64; the first matmul that mixes
# them fails (after `.to("cuda")` the error would name devices instead). Of the four
# symptoms this is the only loud one. `nn.ModuleList` (or `nn.Sequential`, or
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


lm = TinyLM()
sd = lm.state_dict()
print(f"parameters(): {len(list(lm.parameters()))} tensor, {count(lm.parameters())} values")
print(f"named_parameters {[n for n, _ in lm.named_parameters()]}")
same = sd["emb.weight"].data_ptr() == sd["head.weight"].data_ptr()
print(f"state_dict keys  {list(sd)}; same memory: {same}")
print(f"buffers {[n for n, _ in lm.named_buffers()]}; 'causal' saved: {'causal' in sd}")

# %% [markdown]
# Output:
# ```text
# parameters(): 1 tensor, 40 values
# named_parameters ['emb.weight']
# state_dict keys  ['emb.weight', 'head.weight']; same memory: True
# buffers ['causal']; 'causal' saved: False
# ```
#
# `parameters()` removes duplicates (by object identity): the optimizer sees the tied matrix
# once, and its gradient is the sum of both uses. `state_dict()` does not: it lists every
# name, and both entries share one memory (they are detached tensors over the parameter's
# storage, so `torch.save` writes that storage once). The causal mask is a buffer, so
# `.to(device)` moves it with the model, but it is non-persistent: rebuilt by `__init__`,
# never written to a checkpoint.
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
print(f"strict=False: missing {result.missing_keys}, unexpected {result.unexpected_keys}")

# %% [markdown]
# Output:
# ```text
# emb.weight sum before: -0.8938
# Error(s) in loading state_dict for TinyLM:
# Missing key(s) in state_dict: "head.weight".
# Unexpected key(s) in state_dict: "extra.bias".
# emb.weight sum after the failed strict load: 0.0000
# strict=False: missing ['head.weight'], unexpected ['extra.bias']
# ```
#
# Strict loading names every missing and unexpected key. But look at the sum: the error
# is raised *after* the matching keys were copied, so the model the exception leaves behind
# is half loaded. Treat a failed strict load as a ruined model (load into a fresh one).
# Non-strict loading copies what matches and returns the two lists: always look at them,
# or a renamed layer silently keeps its random weights. Here `head.weight` is "missing"
# although the tie means it was loaded through `emb.weight`: the check is by name.

# %% [markdown]
# ## 4. Three switches: `train()`/`eval()`, `no_grad`, `inference_mode`
#
# `model.eval()` sets a flag, `self.training = False`, on every module; layers read it.
# `torch.no_grad()` and `torch.inference_mode()` are thread-local autograd modes; they know
# nothing about modules.
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
# ```
#
# The columns split cleanly. `train()`/`eval()` decides the first two: in training mode
# dropout draws a new mask on every call and BatchNorm normalises with the batch's own
# statistics *and updates its running averages*, even under `no_grad`. That is the trap:
# evaluating with `no_grad` but without `eval()` changes your model's buffers and gives
# noisy outputs. The autograd modes decide the last two: `no_grad` and `inference_mode`
# both stop recording a graph; `inference_mode` also marks its outputs as *inference
# tensors*. Evaluation wants `model.eval()` *and* one of the two modes.
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
# not (an evaluation loop without `no_grad`)? With `total += loss.item()`?


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
    """Sum the loss of `steps` steps; return [(nodes, saved bytes)] of the total per step."""
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
        total += loss.item() if how == "item" else loss
        stats.append(graph_stats(total))
    return stats


leak = {how: run_steps(how) for how in ("train", "eval", "item")}
for how, stats in leak.items():
    print(f"{how:<5} nodes {[n for n, _ in stats]}  saved bytes {[b for _, b in stats]}")

# %% [markdown]
# Output:
# ```text
# train nodes [11, 18, 25, 32, 39]  saved bytes [0, 0, 0, 0, 0]
# eval  nodes [11, 18, 25, 32, 39]  saved bytes [10752, 19072, 27392, 35712, 44032]
# item  nodes [0, 0, 0, 0, 0]  saved bytes [0, 0, 0, 0, 0]
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
# Python float: nothing is kept. `loss.detach()` works as well and keeps the sum on the
# device (`.item()` on a GPU waits for the GPU; lesson 06).


# %%
LABELS = {"train": "+= loss, backward each step", "eval": "+= loss, no backward",
          "item": "+= loss.item()"}


def plot_leak(leak):
    """Nodes and saved KiB of the running total, per step, for each way of summing."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for k, (how, stats) in enumerate(leak.items()):
        steps = range(1, len(stats) + 1)
        style = dict(marker="os^"[k], markersize=10 - 3 * k, zorder=1 + k, label=LABELS[how])
        axes[0].plot(steps, [n for n, _ in stats], **style)  # train and eval overlap here
        axes[1].plot(steps, [b / 1024 for _, b in stats], **style)
    for ax, ylabel in zip(axes, ["graph nodes kept", "saved tensors kept (KiB)"]):
        ax.set_xlabel("step")
        ax.set_xticks(list(steps))
        ax.set_ylabel(ylabel)
        ax.legend()
    fig.suptitle("total += loss keeps every step's graph; total += loss.item() keeps nothing")
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
# from the optimizer's defaults), so a scheduler can change one group's learning rate
# alone. The `state_dict` names no parameter: `params` holds positions 0, 1, 2, ...
# counted through the groups in order, and `state` (empty until the first step) is keyed by
# those positions. It can only be loaded into an optimizer built with the same groups, in
# the same order.
#
# **Predict.** One step with all gradients zero: Adam's own update is then exactly 0, so
# only the decay acts. What happens to each group? And what does loading this state into
# an AdamW built from plain `model.parameters()` (one group) say?

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
try:
    torch.optim.AdamW(mlp.parameters(), lr=LR).load_state_dict(opt.state_dict())
except ValueError as err:
    print(f"loading into one group: {err}")

# %% [markdown]
# Output:
# ```text
# decay group: every value times exactly 1 - lr*wd = 0.999: True
# no-decay group unchanged: True
# state after the step: [0, 1, 2, 3, 4, 5], each ['step', 'exp_avg', 'exp_avg_sq']
# loading into one group: loaded state dict has a different number of parameter groups
# ```
#
# AdamW's decay is *decoupled*: `p ← p·(1 - lr·wd)` happens apart from the gradient step,
# so with zero gradients it is all that moves, and only in the group that asked for it.
# The step created the state: a step count and Adam's two running averages per parameter,
# keyed 0 to 5. A checkpoint of the optimizer is only as good as the code that rebuilds the
# same groups.

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

# %% [markdown]
# Output:
# ```text
# sequential [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] ...
# random     [12, 31, 25, 28, 19, 29, 9, 10, 6, 27] ...
# same seed, same order: True; a permutation: True
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

# %% [markdown]
# Output:
# ```text
# drop_last=False len(loader) 4  batch sizes [10, 10, 10, 2]
# drop_last=True  len(loader) 3  batch sizes [10, 10, 10]
# ```
#
# The `BatchSampler` cuts the sampler's order into chunks of `batch_size`. The last short
# chunk is kept unless `drop_last=True`; training code drops it when a batch of 2 would
# upset BatchNorm or a fixed-shape compiled graph. Here the `collate_fn` returns the list of
# items unchanged, to see the batch sizes.

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
# ```
#
# Each batch is as long as its own longest line, not as the longest line of the corpus
# (last line): a batch of short lines costs less. Sorting or bucketing lines by length
# before batching would cut the padding further. The mask is computed from the lengths, not from
# `tokens != PAD`, so a real token that happens to have the pad id would still count.

# %% [markdown]
# ## 9. Worker processes and their random state
#
# With `num_workers=2` the DataLoader starts two processes each time you iterate it. Worker
# `w` builds whole batches (batch `k` goes to worker `k % 2`) and sends them back through a
# queue. Before its first batch, the loader seeds each worker: Python's `random` and torch
# with `base_seed + w`, NumPy's global RNG with a seed mixed from the same two numbers.
# `base_seed` is drawn from the loader's `generator` when the iterator is created.
#
# How a worker process starts is the *start method* of Python's `multiprocessing`:
#
# - **fork** (Linux's default up to Python 3.13): a copy of the parent at that moment.
#   Fast, but only the thread that forked exists in the copy; if another thread held a lock
#   then, the child may wait for it forever. Python 3.12 warns (`DeprecationWarning: ... use
#   of fork() may lead to deadlocks`) whenever a process that runs other threads forks, and
#   such processes are common: a notebook kernel runs several, and so does a process whose
#   BLAS library started its thread pool.
# - **spawn** (the default on macOS and Windows): a fresh Python process that imports torch,
#   then receives the dataset, `collate_fn` and `worker_init_fn` by pickle. Pickle stores a
#   class or function by module and name, so they must live in an importable module, not in
#   a notebook cell. And the fresh process first runs the main *script* again (to find what
#   was defined there): a script that starts workers keeps its work under
#   `if __name__ == "__main__":`, or every worker would run the whole script, and fail with
#   "An attempt has been made to start a new process before the current process has
#   finished its bootstrapping phase".
# - **forkserver** (Linux's default from Python 3.14): a server process, started once, fresh
#   like spawn, that forks each worker from itself. The same rules as spawn; but with torch
#   imported into the server beforehand, the workers need not import it again.
#
# This lesson's workers run only what `text_data.py` defines, and `text_data.run_loader`
# starts them with forkserver on Linux and spawn elsewhere: never by forking the lesson's
# own process. The lesson is a script and a notebook at once, and no guard can span cells;
# while workers start, `text_data.main_script_hidden()` makes the script look like a
# notebook (no main file to run again). In your own training script, write the guard.
#
# A random generator that the dataset created in `__init__` is copied, state and all, into
# every worker (by fork, or by pickle), and nobody reseeds it. `Noisy` draws a random
# "augmentation" number per item twice: from its own NumPy generator, created once with
# seed 0, and from NumPy's global RNG:
#
# ```python
#     def __getitem__(self, i):
#         info = get_worker_info()  # None in the main process
#         item = super().__getitem__(i)
#         item.update(worker=info.id if info else -1, seed=self.seed,
#                     own=int(self.rng.integers(100)), glob=int(np.random.randint(100)))
#         return item
# ```
#
# **Predict.** A shuffled loader over `Noisy`, 2 workers, batches of 3, its generator
# seeded 0, no `worker_init_fn`. Which batches will carry the same draws?


# %%
def show(batches):
    for b in batches:
        print(f"worker {b['worker'][0]}  indices {str(b['idx']):<13} "
              f"own rng {str(b['own']):<13} np.random {b['glob']}")


run_0 = run_loader(lines, vocab)  # no worker_init_fn
show(run_0)
print(f"own rng, first batch, generator seed 1: {run_loader(lines, vocab, seed=1, count=1)[0]['own']}")

# %% [markdown]
# Output:
# ```text
# worker 0  indices [21, 15, 1]   own rng [85, 63, 51]  np.random [10, 41, 50]
# worker 1  indices [9, 31, 2]    own rng [85, 63, 51]  np.random [23, 74, 37]
# worker 0  indices [23, 5, 13]   own rng [26, 30, 4]   np.random [70, 75, 83]
# worker 1  indices [18, 12, 6]   own rng [26, 30, 4]   np.random [65, 62, 79]
# own rng, first batch, generator seed 1: [85, 63, 51]
# ```
#
# The dataset's own generator gives worker 1 exactly the draws of worker 0: both received
# the same generator state, so half of the "random" augmentations are duplicates. It is
# worse: every new set of workers receives a fresh copy of the parent's untouched
# generator, so every epoch, and every generator seed, repeats the same draws (last line).
# NumPy's global RNG, on the other hand, differs per worker: the loader seeds it in each
# worker (since PyTorch 1.9). Many older texts and posts still say that every worker
# inherits the same NumPy seed; in 2.13.0 that holds only for generator objects you made
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
run_a, run_b = run_loader(lines, vocab, init=reseed), run_loader(lines, vocab, init=reseed)
show(run_a)
print(f"worker seeds {sorted({(b['worker'][0], b['seed'][0]) for b in run_a})}")
print(f"two runs, generator seed 0: same batches {run_a == run_b}")
print(f"generator seed 1: same batches {run_loader(lines, vocab, init=reseed, seed=1) == run_a}")

# %% [markdown]
# Output:
# ```text
# worker 0  indices [21, 15, 1]   own rng [52, 77, 52]  np.random [10, 41, 50]
# worker 1  indices [9, 31, 2]    own rng [24, 65, 8]   np.random [23, 74, 37]
# worker 0  indices [23, 5, 13]   own rng [64, 84, 35]  np.random [70, 75, 83]
# worker 1  indices [18, 12, 6]   own rng [26, 81, 93]  np.random [65, 62, 79]
# worker seeds [(0, 900450186894289455), (1, 900450186894289456)]
# two runs, generator seed 0: same batches True
# generator seed 1: same batches False
# ```
#
# `reseed` replaced the copied generator with one seeded from `info.seed`, which is
# `base_seed + worker_id`: the two workers' seeds differ by one, so their draws differ.
# Because `base_seed` comes from the loader's seeded `generator`, a second run repeats every
# index and every draw, and another seed changes them. The recipe: give the loader a seeded
# `torch.Generator`, and seed every other random source in `worker_init_fn` from
# `get_worker_info().seed` (or from `torch.initial_seed()`, which is the same number inside
# a worker). With `persistent_workers=True` the workers survive between epochs, so their
# generators move on instead of restarting. None of this depends on the start method: the
# lesson's tests run this loader, and the sharded stream of the next section, with spawn
# too, and get the same batches.

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
# batch is one more step on data the model has just seen. With sharding, worker `w` keeps lines `w, w + 2, w + 4, ...` and the two workers
# together read each line once. The loader still takes batches from the workers in turn,
# so the order of an epoch is interleaved, not the file's order. For a stream, batches are
# built inside each worker and the loader refuses `shuffle` (there is no index to shuffle):
# any shuffling (a buffer, shuffled shards) is the dataset's own job.

# %% [markdown]
# ## 11. Reproducibility switches
#
# `torch.manual_seed(s)` seeds the default generator of the CPU (and of every GPU):
# parameter initialisation, dropout masks, `randperm`, and the `base_seed` of loaders that
# have no generator of their own. `torch.use_deterministic_algorithms(True)` is a different
# switch: it makes ops that have a nondeterministic implementation either use a
# deterministic one or raise an error.
#
# **Predict.** Does the same seed give the same initial weights? Under the switch, does an
# accumulating `index_put_` (two writes to the same cell, one of the ops the documentation
# lists as nondeterministic on CPU) still run? What does `torch.empty` contain?

# %%
torch.manual_seed(0)
w1 = nn.Linear(3, 2).weight.detach().clone()
torch.manual_seed(0)
w2 = nn.Linear(3, 2).weight.detach().clone()
print(f"same seed, same init: {torch.equal(w1, w2)}")
torch.use_deterministic_algorithms(True)
try:
    idx = torch.tensor([0, 0, 2])  # cell 0 receives two additions
    acc = torch.zeros(3).index_put_((idx,), torch.ones(3), accumulate=True)  # (3,)
    print(f"deterministic mode {torch.are_deterministic_algorithms_enabled()}: "
          f"index_put_ {acc.tolist()}")
    print(f"torch.empty under it: {torch.empty(3).tolist()}")
finally:
    torch.use_deterministic_algorithms(False)  # global state: do not leak into later code
print(f"deterministic mode now {torch.are_deterministic_algorithms_enabled()}")

# %% [markdown]
# Output:
# ```text
# same seed, same init: True
# deterministic mode True: index_put_ [2.0, 0.0, 1.0]
# torch.empty under it: [nan, nan, nan]
# deterministic mode now False
# ```
#
# Seeding makes the *random numbers* repeat: same initial weights, same dropout masks, same
# loader order. The deterministic switch is about *kernels*: on this CPU the accumulating
# `index_put_` simply takes its deterministic path, and almost every op that raises under
# the switch is a CUDA kernel (atomic adds, some cuDNN and pooling backwards), so on a CPU
# you see no error. One visible CPU effect: `torch.empty` now fills new memory with NaN
# (`torch.utils.deterministic.fill_uninitialized_memory` is True by default), so code that
# reads memory it never wrote shows up as NaN instead of old garbage. The switch is global
# state, so the cell turns it back off. Full reproducibility also needs the same library
# versions and hardware, and on GPUs the cuBLAS workspace setting the error message names.

# %% [markdown]
# ## Summary
#
# - `nn.Module.__setattr__` files a `Parameter` under `_parameters`, a `Module` under
#   `_modules`; `register_buffer` files a tensor under `_buffers`. `parameters()`,
#   `state_dict()`, `.to()`, `train()`/`eval()` and the optimizer see only those registries.
# - Layers in a plain list still run and still get gradients, but they are not trained,
#   not saved and not converted. Use `nn.ModuleList` / `nn.ModuleDict` / `nn.Sequential`.
# - `parameters()` yields a tied parameter once; `state_dict()` lists it under every name.
#   `load_state_dict(strict=True)` raises, naming missing and unexpected keys; with
#   `strict=False`, read the two lists it returns. Non-persistent buffers are not saved.
# - Three independent switches: `train()`/`eval()` (dropout, BatchNorm's batch statistics
#   and running-stat updates), `no_grad` (no graph), `inference_mode` (no graph, inference
#   tensors). Evaluation wants `eval()` and one of the two modes.
# - `total += loss` chains every step's graph to the total (nodes always; saved activations
#   too when no `backward()` frees them). Sum `loss.item()` or `loss.detach()`.
# - Parameter groups carry their own hyperparameters: AdamW's decoupled decay on the
#   matrices, none on biases and norm gains. The optimizer's `state_dict` refers to
#   parameters by position in the groups, so it loads only into the same grouping.
# - A DataLoader = sampler (order) → batch sampler (`batch_size`, `drop_last`) →
#   `collate_fn` (here: pad to the batch's longest sequence, mask True on real tokens).
#   Workers get a copy of the dataset (forked, or pickled under spawn and forkserver: keep
#   the dataset, `collate_fn` and `worker_init_fn` in an importable module, and a script's
#   work under `if __name__ == "__main__":`). The loader seeds torch, `random` and NumPy's
#   global RNG per worker from `base_seed`, which comes from its `generator`. Reseed
#   anything else (a dataset's own generator) in `worker_init_fn`; a seeded
#   `torch.Generator` then makes two runs give the same batches.
# - Each worker runs an `IterableDataset`'s whole `__iter__`: shard it with
#   `get_worker_info()`, or every item comes once per worker.
# - `torch.manual_seed` repeats random numbers; `use_deterministic_algorithms(True)` picks
#   deterministic kernels or raises (mostly on CUDA) and fills `torch.empty` with NaN.
#
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

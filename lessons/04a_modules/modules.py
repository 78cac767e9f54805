# %% [markdown]
# # 04a · Modules: where parameters live, and what a model does with them
#
# An `nn.Module` is a Python object with three registries: parameters, submodules and
# buffers. Everything PyTorch does "to the whole model" (`parameters()`, the optimizer,
# `state_dict()`, `.to()`, `train()`) walks those registries, never your attributes in
# general. This lesson, the first of lesson 04's two parts, opens them up, then looks at
# what a training loop does with a module: its modes, the loss you log, the optimizer's
# groups, and the hooks that change what a module computes. Part b, `04b_data`, does the
# same for the DataLoader that feeds it.
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
# - module hooks that change what a module computes: a forward hook whose return value
#   replaces the output, a forward pre-hook that replaces the input, and why the old
#   `register_backward_hook` gives way to `register_full_backward_hook`.
#
# **Prerequisites:** lesson 03a (autograd's graph: `grad_fn`, saved tensors, version
# counters, `backward()` freeing them) and 03b (tensor and module hooks), and basic
# `nn.Linear` / optimizer use.
#
# **How to run:** `python lessons/04a_modules/modules.py` or `make lesson N=04a` from the
# repository root, or open `modules.ipynb`. It runs on the CPU in seconds. Each printing
# cell is followed by an *Output* block: what it printed with the pinned PyTorch (2.13.0).

# %%
import io
import sys
import threading
import warnings
import zipfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

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
# `.to()` (and `.cuda()`, `.half()`, `.double()`: all go through `Module._apply`, read from
# `torch/nn/modules/module.py`) converts registered tensors only, so the hidden layers stay
# float32 while the head becomes float64; the first matmul that mixes them fails (after
# `.to("cuda")` the error names devices instead; unverified on a GPU). `.eval()` walks the
# same registry, so the hidden layers of the list model stay in training mode: their
# dropout, had they any, would stay on at evaluation. Of these symptoms only the dtype
# error is loud. `nn.ModuleList` (or `nn.Sequential`, or
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
# **Predict.** A guess, from what lesson 03a showed autograd needs a version counter for:
# which of these can you not do with an inference tensor once you are out of the mode:
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
# was not overwritten (lesson 03a, section 3): it refuses to save one for backward, and
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
# step, `.detach()` does not (lesson 06a explains the wait; unverified on a GPU).


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
# Groups built from `(name, parameter)` pairs, as `named_parameters()` yields them, also
# save the names, under `param_names`; loading still pairs the state by position (and
# copies those names over).
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
# ## 7. Module hooks that change what a module computes
#
# Lesson 03b's hooks *watched*: a forward hook recorded each block's output shape, a full
# backward hook the gradients' shapes. A module hook can also *change* what the module
# computes, without touching its code:
#
# - `module.register_forward_pre_hook(fn)`: `fn(module, args)` runs before `forward`; a
#   tuple it returns replaces the positional arguments.
# - `module.register_forward_hook(fn)`: `fn(module, args, output)` runs after `forward`; a
#   value it returns replaces the output.
#
# A hook that returns `None` changes nothing. This is how you ablate a unit (zero its output
# and see what the model loses), normalise or cast inputs, or add an adapter to a layer of
# a pretrained model you cannot edit.
#
# **Predict.** A `Linear(3, 2)` gets a pre-hook that returns `(2 * x,)` and a forward hook
# that sets the output's unit 0 to zero. In which order do they run? What does `lin(x)`
# return, next to the plain layer? Which input does the forward hook see? And after both
# handles' `remove()`?


# %%
with torch.random.fork_rng(devices=[]):  # a layer of its own, leaving the global RNG alone
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
x3 = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))  # (B, 3)
with torch.no_grad():
    plain_x, plain_2x = lin(x3), lin(2 * x3)  # the layer without hooks, on x and on 2x
calls, seen_input = [], []


def double_input(module, args):
    """A forward pre-hook: what it returns replaces the positional arguments."""
    calls.append("pre-hook")
    return (2 * args[0],)


def zero_unit_0(module, args, output):
    """A forward hook: what it returns replaces the output."""
    calls.append("forward hook")
    seen_input.append(args[0])
    out = output.clone()  # (B, 2)
    out[:, 0] = 0
    return out


handles = [lin.register_forward_pre_hook(double_input), lin.register_forward_hook(zero_unit_0)]
hooked = lin(x3)  # (B, 2)
print(f"hooks ran in the order {calls}")
print(f"output unit 0 all zero: {bool((hooked[:, 0] == 0).all())}; unit 1 is the plain layer's on 2 * x: "
      f"{torch.equal(hooked[:, 1], plain_2x[:, 1])}")
print(f"the forward hook saw the pre-hook's input, 2 * x: {torch.equal(seen_input[0], 2 * x3)}")
for handle in handles:
    handle.remove()
print(f"after remove(): lin(x) is the plain layer's again: {torch.equal(lin(x3), plain_x)}")
watching = lin.register_forward_hook(lambda module, args, output: None)  # returns None: only watches
print(f"a forward hook that returns None leaves the output alone: {torch.equal(lin(x3), plain_x)}")
watching.remove()

# %% [markdown]
# Output:
# ```text
# hooks ran in the order ['pre-hook', 'forward hook']
# output unit 0 all zero: True; unit 1 is the plain layer's on 2 * x: True
# the forward hook saw the pre-hook's input, 2 * x: True
# after remove(): lin(x) is the plain layer's again: True
# a forward hook that returns None leaves the output alone: True
# ```
#
# The pre-hook's tuple became `forward`'s arguments, so the layer computed on `2 * x`; the
# forward hook then received those arguments with the output, and what it returned is what
# the caller got. Pre-hooks run first, then `forward`, then forward hooks. The handles undo
# them: a forgotten hook goes on changing every later call.
#
# Backward hooks come in two kinds. `register_full_backward_hook(fn)` (lesson 03b) calls
# `fn(module, grad_input, grad_output)` with the gradients with respect to the module's
# inputs and outputs, however many operations `forward` runs. The older
# `register_backward_hook` is cruder: it hooks the *last* autograd node that `forward`
# created, so its `grad_input` holds the gradients at that node's inputs. For a forward of
# one node fed only by the module's inputs (`nn.Tanh` on an input computed by an earlier
# layer) that is the same thing. Otherwise PyTorch warns, at the forward call, with a
# `FutureWarning`: the old hook is deprecated.
#
# **Predict.** `TanhOfDouble` computes `tanh(2 * x)`: two nodes, `MulBackward0`, then
# `TanhBackward0`. With the old hook, is `grad_input[0]` the gradient at the module's
# input? Which of `nn.Tanh`, `TanhOfDouble`, `nn.Linear` and `InputTimesWeight`, whose
# forward is the single node `x @ self.w`, warn? (For `nn.Linear`, a guess: what else,
# besides `x`, feeds its matrix product?) The cell records the warnings with
# `warnings.catch_warnings(record=True)` and prints their category.


# %%
class TanhOfDouble(nn.Module):
    def forward(self, x):  # two autograd nodes: MulBackward0, then TanhBackward0
        return torch.tanh(2 * x)


class InputTimesWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 2))  # used as it is: no transpose

    def forward(self, x):  # one autograd node: MmBackward0
        return x @ self.w


def backward_hook_report(module, register, leaf_input=False):
    """Hook `module` with `register` (a method name), run forward and backward: the warnings
    recorded, how many the forward call raised, the hook's grad_input, the true gradient."""
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(2), requires_grad=True)
    h = x if leaf_input else 3 * x  # (B, 3): the module's input, computed by an earlier op
    h.retain_grad()  # keep the true gradient at the module's input
    got = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # record each warning, even one seen before
        handle = getattr(module, register)(lambda m, grad_input, grad_output: got.append(grad_input))
        out = module(h)  # (B, 3) or (B, 2)
        in_forward = len(caught)
        out.sum().backward()
        handle.remove()
    fed_by = [type(node).__name__ for node, _ in out.grad_fn.next_functions]  # the last node's inputs
    return {"warnings": caught, "in_forward": in_forward, "grad_input": got[0], "true": h.grad,
            "last_node": type(out.grad_fn).__name__, "fed_by": fed_by}


with torch.random.fork_rng(devices=[]):
    torch.manual_seed(0)
    hook_cases = [("register_backward_hook", "Tanh", nn.Tanh(), False),
                  ("register_backward_hook", "Tanh, leaf input", nn.Tanh(), True),
                  ("register_backward_hook", "TanhOfDouble", TanhOfDouble(), False),
                  ("register_backward_hook", "Linear", nn.Linear(3, 2), False),
                  ("register_backward_hook", "x @ w, one node", InputTimesWeight(), False),
                  ("register_full_backward_hook", "TanhOfDouble", TanhOfDouble(), False),
                  ("register_full_backward_hook", "Linear", nn.Linear(3, 2), False)]
reports = {(register, name): backward_hook_report(module, register, leaf)
           for register, name, module, leaf in hook_cases}
print(f"{'hook':<29}{'module':<18}{'warning':<15}grad_input[0] is the gradient at the input")
for (register, name), r in reports.items():
    category = ", ".join(sorted({w.category.__name__ for w in r["warnings"]})) or "none"
    print(f"{register:<29}{name:<18}{category:<15}{torch.equal(r['grad_input'][0], r['true'])}")
print(f"every warning raised by the forward call: {all(r['in_forward'] == len(r['warnings']) for r in reports.values())}")
print(f"the warnings say: {sorted({str(w.message).split(' is deprecated')[0] for r in reports.values() for w in r['warnings']})}")
old_double = reports[("register_backward_hook", "TanhOfDouble")]
print(f"TanhOfDouble, old hook: 2 * grad_input[0] equals the true gradient: "
      f"{torch.equal(2 * old_double['grad_input'][0], old_double['true'])}")
print(f"Linear, old hook: grad_input shapes "
      f"{[tuple(g.shape) for g in reports[('register_backward_hook', 'Linear')]['grad_input']]}")
for name in ("Linear", "x @ w, one node"):
    r = reports[("register_backward_hook", name)]
    print(f"{name}: last node {r['last_node']}, fed by {r['fed_by']}")

# %% [markdown]
# Output:
# ```text
# hook                         module            warning        grad_input[0] is the gradient at the input
# register_backward_hook       Tanh              none           True
# register_backward_hook       Tanh, leaf input  FutureWarning  True
# register_backward_hook       TanhOfDouble      FutureWarning  False
# register_backward_hook       Linear            FutureWarning  False
# register_backward_hook       x @ w, one node   FutureWarning  True
# register_full_backward_hook  TanhOfDouble      none           True
# register_full_backward_hook  Linear            none           True
# every warning raised by the forward call: True
# the warnings say: ['Using a non-full backward hook when the forward contains multiple autograd Nodes']
# TanhOfDouble, old hook: 2 * grad_input[0] equals the true gradient: True
# Linear, old hook: grad_input shapes [(2,), (4, 3), (3, 2)]
# Linear: last node AddmmBackward0, fed by ['AccumulateGrad', 'MulBackward0', 'TBackward0']
# x @ w, one node: last node MmBackward0, fed by ['MulBackward0', 'AccumulateGrad']
# ```
#
# On `TanhOfDouble` the old hook received the gradient at `tanh`'s input, `2 * x`: half the
# true gradient at the module's input, and nothing but the warning says so. The check
# behind the warning compares the nodes that feed the last node with the nodes that made
# the module's inputs (read from `_maybe_warn_non_full_backward_hook` in
# `torch/nn/modules/module.py`). `nn.Linear` computes `addmm(bias, x, weight.t())`: its
# last node is fed by the bias (`AccumulateGrad`) and the transposed weight (`TBackward0`)
# as well as by the input (`MulBackward0`, the `3 * x` that made it), so it warns too; its
# `grad_input` holds the bias's, the input's and the transposed weight's gradients, in that
# order. The single node `x @ self.w` warns as well, although its `grad_input[0]` is right:
# a parameter is not one of the module's inputs. And a leaf input was made by no node:
# `nn.Tanh` on a leaf warns although its gradient is right. The full hook gave the
# gradient at the module's input in every case, without a warning: use
# `register_full_backward_hook`. The cell caught the warnings so that you see them here,
# printed; in your own code, let them show.

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
#   `load_state_dict(strict=True)` raises, naming missing and unexpected keys, after
#   copying the keys that match; with `strict=False`, read the two lists it returns.
#   Non-persistent buffers are not saved.
# - Three independent switches: `train()`/`eval()` (dropout, BatchNorm's batch statistics
#   and running-stat updates), `no_grad` (no graph), `inference_mode` (no graph, inference
#   tensors). Evaluation wants `eval()` and one of the two modes; the modes are per thread.
# - `total += loss` chains every step's graph to the total (nodes always; saved activations
#   too when no `backward()` frees them). Sum `loss.item()` or `loss.detach()`.
# - Parameter groups carry their own hyperparameters: AdamW's decoupled decay on the
#   matrices, none on biases and norm gains. The optimizer's `state_dict` refers to
#   parameters by position in the groups; loading checks only the groups' number and
#   sizes, so rebuild the same grouping in the same order.
# - A forward pre-hook's returned tuple replaces a module's arguments, a forward hook's
#   returned value its output; `handle.remove()` undoes either. `register_backward_hook`
#   sees only the last autograd node of `forward` and warns (`FutureWarning`, at the
#   forward call) when that node is not fed by the module's inputs alone; use
#   `register_full_backward_hook`.

# %% [markdown]
# ## References
#
# - [`torch.nn.Module`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.Module.html): the registries' methods
#   (`register_buffer`, `named_parameters`, `state_dict`, `load_state_dict`, `to`, `train`), sections 1 to 3.
# - [`torch.nn.ModuleList`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.ModuleList.html): the registered list
#   that fixes section 2's bug.
# - [`torch.no_grad`](https://docs.pytorch.org/docs/2.13/generated/torch.no_grad.html) and
#   [`torch.inference_mode`](https://docs.pytorch.org/docs/2.13/generated/torch.autograd.grad_mode.inference_mode.html):
#   the two autograd modes of section 4.
# - [`torch.Tensor.item`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.item.html) and
#   [`torch.Tensor.detach`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.detach.html): the two ways to
#   log a loss without its graph, section 5.
# - [`torch.optim`](https://docs.pytorch.org/docs/2.13/optim.html) (per-parameter options) and
#   [`torch.optim.AdamW`](https://docs.pytorch.org/docs/2.13/generated/torch.optim.AdamW.html): parameter groups and the
#   decoupled decay of section 6.
# - [`register_forward_hook`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.Module.html#torch.nn.Module.register_forward_hook),
#   [`register_forward_pre_hook`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.Module.html#torch.nn.Module.register_forward_pre_hook)
#   and [`register_full_backward_hook`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.Module.html#torch.nn.Module.register_full_backward_hook):
#   section 7's hooks and what their return values do.
# - Press and Wolf, [Using the Output Embedding to Improve Language Models](https://arxiv.org/abs/1608.05859)
#   (2016): the weight tying of section 3.
# - Ioffe and Szegedy, [Batch Normalization](https://arxiv.org/abs/1502.03167) (2015): the batch statistics and
#   running averages that section 4's `train()`/`eval()` switch.
# - Loshchilov and Hutter, [Decoupled Weight Decay Regularization](https://arxiv.org/abs/1711.05101) (2017): AdamW,
#   the decay that section 6 sees acting alone.

# %% [markdown]
# ## Read the source
#
# Where, in the PyTorch you installed, what this lesson showed is implemented. Open each file
# in your editor at the line printed (the line numbers are those of your installed torch;
# they move between releases). The stops follow the lesson: how a module files what you
# assign, the autograd modes, the optimizer's loading by position, then the hooks.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/nn/modules/module.py", "def __setattr__(",
     "A `Parameter` goes through `register_parameter` into `_parameters`, a `Module` into "
     "`_modules`, a `Buffer` (or a tensor assigned to a name already in `_buffers`) into "
     "`_buffers`; anything else, a plain list of layers or a plain tensor, reaches the final "
     "`super().__setattr__` and lands in `__dict__`, where `parameters()`, `state_dict()` and "
     "`.to()` never look. Above it, `_call_impl` runs the pre-hooks, `forward` and the "
     "forward hooks, keeping what each returns (section 7), and "
     "`_maybe_warn_non_full_backward_hook` decides when the old backward hook warns."),
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
    ("torch/utils/hooks.py", "class BackwardHook",
     "What `register_full_backward_hook` installs: `setup_input_hook` and `setup_output_hook` "
     "pass the module's inputs, then its outputs, through an identity autograd Function "
     "(`BackwardHookFunction`), so the hook sees the gradients at the module's own inputs and "
     "outputs, however many nodes `forward` made (section 7)."),
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
#     `state_dict()` and `.to()` never look. Above it, `_call_impl` runs the pre-hooks,
#     `forward` and the forward hooks, keeping what each returns (section 7), and
#     `_maybe_warn_non_full_backward_hook` decides when the old backward hook warns.
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
# torch/utils/hooks.py:«line»  `class BackwardHook`
#     What `register_full_backward_hook` installs: `setup_input_hook` and
#     `setup_output_hook` pass the module's inputs, then its outputs, through an identity
#     autograd Function (`BackwardHookFunction`), so the hook sees the gradients at the
#     module's own inputs and outputs, however many nodes `forward` made (section 7).
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
# 4. **Predict.** An AdamW with two parameter groups (2 matrices with weight decay, then 4
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
#
# 5. **Spot the bug.** To log the gradient reaching a block `y = torch.tanh(2 * x)` written
#    as a module, someone registers `block.register_backward_hook(log)` and logs
#    `grad_input[0]`. A `FutureWarning` appeared at the first forward call and was ignored.
#    What does the log hold, and what is the fix?
#
#    <details><summary>Answer</summary>
#
#    The gradient at the input of the forward's last node, `tanh`, that is with respect to
#    `2 * x`: half the gradient at the block's input (`2 * grad_input[0] equals the true
#    gradient: True`). The old hook sees only the last autograd node, and warns because
#    that node is fed by the forward's own `2 * x`, not by the block's input.
#    `register_full_backward_hook` gives the gradient at the module's own input, without a
#    warning (the rows `register_full_backward_hook ... True`).
#    (*§ Module hooks that change what a module computes*)
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement `Module` and `ModuleList`: a registry in
# plain Python (torch is used only to recognise an `nn.Parameter`): `__setattr__` files
# parameters and submodules, `parameters()` yields each shared object once in registration
# order, `named_parameters()` gives dotted names, `state_dict()` lists every name.
#
# Check your answers with `make exercises N=04a`: your registry is compared with `nn.Module`
# on the same structures, random ones included. `solutions.py` has one way to write them.

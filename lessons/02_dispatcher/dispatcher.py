# %% [markdown]
# # 02 · Operators and the dispatcher: one Python call, many layers
#
# `torch.mm(x, w)` looks like one function call. Underneath, it names an *operator* of
# ATen, PyTorch's C++ tensor library, with a typed *schema*; the *dispatcher* then looks at
# the tensors' *dispatch keys* and passes the call down a stack of layers (autograd, then
# the CPU kernel) until one of them computes. This lesson opens that path up and watches
# it work.
#
# **What you will learn**
#
# - what an operator schema says, including the alias annotations `Tensor(a!)` and
#   `Tensor(a)` that mark in-place and view ops;
# - how different Python spellings (`torch.mm`, `@`, `F.linear`) reach ATen overloads;
# - what dispatch keys a tensor carries, and what `requires_grad`, `torch.no_grad()` and
#   `torch.inference_mode()` change, for ordinary and for inference tensors;
# - how a `TorchDispatchMode` sees every ATen op a function runs, forward and backward,
#   and how watching with one changes what runs (the profiler shows it);
# - how the `meta` device computes shapes and dtypes with no memory at all;
# - where an op's schema and kernels come from (`native_functions.yaml`, torchgen), and the
#   layers of `vmap`, functionalization and fake tensors, each with its own dispatch key;
# - why a custom op whose fake (meta) implementation lies about strides breaks later, under
#   `torch.compile`, and how `torch.library.opcheck` catches it early.
#
# **Prerequisites:** lesson 01 (sizes, strides, views, `reshape` vs `view`).
#
# **How to run:** `python lessons/02_dispatcher/dispatcher.py` or `make lesson N=02` from
# the repository root, or open `dispatcher.ipynb`. Everything runs on the CPU in a few
# seconds. Each printing cell is followed by an *Output* block: what it printed with the
# pinned PyTorch (2.13.0). Your run prints the same lines, except the parts marked
# `«version»`, `«folder»` or `«line»`: which torch you installed, and where. Run outside
# the course's venv, this lesson may also print PyTorch's own diagnostic lines to stderr:
# `USDT: ... profiler_start` and `profiler_stop` around each profiler run and, on a CUDA
# build without a GPU, `gpuGetDeviceCount failed` and `No CUDA runtime is found`. They are
# harmless, and the course's venv (`.venv`, made by any `make lesson`) turns them off.
#
# Some tools used here are private, marked by an underscore: `torch._C._dispatch_keys` and
# an op's `._schema` (they may change without notice), and the module
# `torch.utils._python_dispatch` of `TorchDispatchMode` (documented all the same, in the
# *Extending PyTorch* notes, and the simplest way to watch ATen calls from Python). Under
# another PyTorch release their output may differ from the lesson's.

# %%
import contextlib
import os
import re
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DEVICE = torch.device(os.environ.get("COURSE_DEVICE", "cpu"))
Key = torch._C.DispatchKey  # private: the dispatcher's key names


def first_sentence(err):
    """The first sentence of an error message: stable, and short enough to print."""
    return str(err).split(". ")[0]


def shapes(args):
    """The shapes of the tensors among args, as text: '(4, 8) (8, 3)'."""
    return " ".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor))


class OpLog(TorchDispatchMode):
    """Records each ATen call that reaches the mode (below autograd): (op, in, out)."""

    def __init__(self):
        super().__init__()
        self.calls = []  # (op overload, input shapes, output shapes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))  # the mode is off in here: no recursion
        outs = out if isinstance(out, (tuple, list)) else (out,)
        self.calls.append((func, shapes(args), shapes(outs)))
        return out

    def names(self):
        return [str(func) for func, _, _ in self.calls]


def print_calls(calls, label=""):
    for func, ins, outs in calls:
        print(f"{label}{str(func):<40} {ins:<22} -> {outs}")


# %% [markdown]
# ## 1. Every call names an operator with a schema
#
# ATen declares each operator once, in a schema: a typed signature written in a small
# language of its own. Python reaches the operators through `torch.ops.aten.<name>`; each
# has one or more *overloads* (`default`, `Tensor`, `Scalar`, `out`, ...), and each overload
# has its own schema.
#
# **Predict.** `mm` multiplies two matrices, `add_` adds in place, `transpose` returns a
# view. The schema has to tell a compiler which outputs alias which inputs and which inputs
# get written. How would you write that down?

# %%
ops = {
    "mm": torch.ops.aten.mm.default,
    "add_": torch.ops.aten.add_.Tensor,
    "transpose": torch.ops.aten.transpose.int,
    "add (out=)": torch.ops.aten.add.out,
}
for name, op in ops.items():
    print(f"{name:<11} {op._schema}")
print(f"aten.add overloads: {len(torch.ops.aten.add.overloads())}, e.g. "
      f"{sorted(torch.ops.aten.add.overloads())[:4]}")

# %% [markdown]
# Output:
# ```text
# mm          aten::mm(Tensor self, Tensor mat2) -> Tensor
# add_        aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)
# transpose   aten::transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)
# add (out=)  aten::add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)
# aten.add overloads: 16, e.g. ['Scalar', 'Scalar_out', 'Tensor', 'complex']
# ```
#
# The name is `namespace::op.overload`. A bare `Tensor` is a fresh value: `mm` reads its
# inputs and returns a new tensor that aliases nothing. `Tensor(a)` on an input and on the
# output says "the output shares memory with this input": `transpose` returns a view (lesson
# 01). `Tensor(a!)` adds a `!`: this input is *written*, and the output is that same memory:
# `add_` mutates `self` and returns it, and the `out=` variant writes into `out`. Everything
# after `*` is keyword-only. These annotations are how autograd, functionalization and
# `torch.compile` know, without reading any kernel, what an op may alias or mutate.
#
# **Where schemas and kernels come from.** Each ATen operator is declared once, in a file
# of the PyTorch source, `native_functions.yaml`: its schema (`func:`) and which C++
# function implements it for which backend (`dispatch:`). Its derivative is declared in
# `derivatives.yaml`. At build time *torchgen*, PyTorch's code generator, reads both and
# writes the C++ that registers a kernel for each dispatch key. Both files ship with torch
# (in the `torchgen` package next to it), so we can read them for one op, `mul.Tensor`, and
# ask the dispatcher where its kernels were registered (`torch._C._dispatch_dump`, private).
#
# **Predict.** Is the schema PyTorch reports for `aten::mul.Tensor` the yaml's `func:` line?
# Which of its kernels (CPU, autograd, the `vmap` rule) were written by torchgen?


# %%
def yaml_entry(path, name):
    """The lines of the entry `name` (e.g. 'mul.Tensor') in one of torchgen's yaml files."""
    lines = path.read_text().splitlines()
    heads = (f"- func: {name}(", f"- name: {name}(")  # native_functions.yaml, derivatives.yaml
    first = next(k for k, line in enumerate(lines) if line.startswith(heads))
    last = next(k for k in range(first + 1, len(lines)) if not lines[k].strip() or lines[k].startswith("- "))
    return [line.strip().removeprefix("- ") for line in lines[first:last]]


def kernel_files(op):
    """{dispatch key: source file} of the kernels registered for `op`, shard numbers dropped."""
    files = {}
    for line in torch._C._dispatch_dump(op).splitlines():  # 'CPU: registered at <path>:<line> :: ...'
        found = re.match(r"(\S+): registered at (.+):\d+ ::", line)
        if found:
            key, path = found[1], found[2].replace("\\", "/")
            generated = "/build/" in path or "/generated/" in path  # torchgen writes there
            files[key] = (re.sub(r"_\d+\.cpp$", ".cpp", path.split("/")[-1]), generated)
    return files


TORCHGEN = Path(torch.__file__).resolve().parent.parent / "torchgen" / "packaged"
native = yaml_entry(TORCHGEN / "ATen/native/native_functions.yaml", "mul.Tensor")
out_variant = yaml_entry(TORCHGEN / "ATen/native/native_functions.yaml", "mul.out")
grads = yaml_entry(TORCHGEN / "autograd/derivatives.yaml", "mul.Tensor")
print("native_functions.yaml:")
for line in [native[0], next(x for x in native if x.startswith("structured_delegate")),
             out_variant[0], next(x for x in out_variant if x.startswith("CPU"))]:
    print(f"  {line}")
print("derivatives.yaml:")
for line in grads[:3]:
    print(f"  {line}")
reported = str(torch.ops.aten.mul.Tensor._schema)  # 'aten::mul.Tensor(...) -> Tensor'
print(f"schema reported == yaml func line: {reported == 'aten::' + native[0].removeprefix('func: ')}")
files = kernel_files("aten::mul.Tensor")
for key in ("CPU", "Autograd[alias]", "FuncTorchBatched"):
    print(f"  kernel for {key:<17} in {files[key][0]:<24} generated by torchgen: {files[key][1]}")

# %% [markdown]
# Output:
# ```text
# native_functions.yaml:
#   func: mul.Tensor(Tensor self, Tensor other) -> Tensor
#   structured_delegate: mul.out
#   func: mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)
#   CPU, CUDA, MPS, MTIA: mul_out
# derivatives.yaml:
#   name: mul.Tensor(Tensor self, Tensor other) -> Tensor
#   self: mul_tensor_backward(grad, other, self.scalar_type())
#   other: mul_tensor_backward(grad, self, other.scalar_type())
# schema reported == yaml func line: True
#   kernel for CPU               in RegisterCPU.cpp          generated by torchgen: True
#   kernel for Autograd[alias]   in VariableType.cpp         generated by torchgen: True
#   kernel for FuncTorchBatched  in BatchRulesBinaryOps.cpp  generated by torchgen: False
# ```
#
# The yaml line is the schema, word for word. `mul.Tensor` has no CPU kernel of its own: it
# is `structured_delegate: mul.out`, so torchgen generates its CPU kernel (in
# `RegisterCPU.cpp`) around the C++ function that the `out=` variant's `dispatch:` line
# names for CPU and CUDA alike, `mul_out`. The
# autograd kernel in `VariableType.cpp` is generated too, from the two formulas of
# `derivatives.yaml` (one per input that can need a gradient: lesson 03a). The `vmap` rule
# (`FuncTorchBatched`, section 6) is written by hand. To find what runs for an op, read its
# yaml entry first: it names the C++ function for each backend.

# %% [markdown]
# ## 2. Watching the calls: a dispatch mode
#
# A `TorchDispatchMode` is a Python object the dispatcher calls for every ATen op once the
# layers above it (autograd among them) have done their part: it sees the operator overload
# and its arguments, and must run the op itself (`func(*args, **kwargs)`). `OpLog`, defined
# at the top, records each call with its input and output shapes.
#
# **Predict.** `torch.mm(x, w)`, `x @ w` and `torch.matmul(x, w)` give the same numbers.
# Do they run the same ATen op? And `F.linear(x, w.t())`, which computes `x @ w` too? We
# ask the mode and, for comparison, the profiler (its top-level calls).

# %%
x = torch.randn(2, 3, device=DEVICE)  # (2, 3)
w = torch.randn(3, 4, device=DEVICE)  # (3, 4)
spellings = {
    "torch.mm(x, w)": lambda: torch.mm(x, w),
    "x @ w": lambda: x @ w,
    "torch.matmul(x, w)": lambda: torch.matmul(x, w),
    "F.linear(x, w.t())": lambda: F.linear(x, w.t()),
}


def top_level_ops(fn):
    """The ATen ops the profiler records at the top level (called from Python) when fn runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]


for name, fn in spellings.items():
    with OpLog() as log:
        fn()
    print(f"{name:<19} -> mode sees {', '.join(log.names()):<48} profiler: {', '.join(top_level_ops(fn))}")

# %% [markdown]
# Output:
# ```text
# torch.mm(x, w)      -> mode sees aten.mm.default                                  profiler: aten::mm
# x @ w               -> mode sees aten.mm.default                                  profiler: aten::matmul
# torch.matmul(x, w)  -> mode sees aten.mm.default                                  profiler: aten::matmul
# F.linear(x, w.t())  -> mode sees aten.t.default, aten.t.default, aten.mm.default  profiler: aten::t, aten::linear
# ```
#
# The profiler (which records every operator call that goes through the dispatcher) shows
# what Python called: `x @ w` calls `Tensor.__matmul__`, which is `aten::matmul`, and
# `F.linear` is `aten::linear`. But `matmul` never reaches the mode: it is a *composite*
# op, written in C++ in terms of other ATen ops, and it decides
# from the shapes (2-D @ 2-D) to call `aten::mm`. So three spellings end in the same
# overload, `aten.mm.default`. `F.linear` is composite too: with no bias it transposes its
# weight (our `w.t()` is transposed back, two `t` views, no copy) and calls `mm`. A mode
# sees what really runs, after composites have decomposed; what Python code you wrote is
# invisible to it.

# %% [markdown]
# ## 3. Dispatch keys: which layers a call goes through
#
# Every tensor carries a *dispatch key set*. The dispatcher combines the keys of all the
# arguments with per-thread settings, then calls the kernel of the highest-priority key;
# that layer does its part and re-dispatches to the next key, down to the backend (`CPU`).
# `torch._C._dispatch_keys` (private) shows the set.
#
# **Predict.** Does a tensor with `requires_grad=True` carry different keys from a plain
# one? What do `torch.no_grad()` and `torch.inference_mode()` change?

# %%
plain = torch.ones(3)  # (3,)
leaf = torch.ones(3, requires_grad=True)  # (3,)
with torch.no_grad():
    nograd = leaf * 2  # (3,)
with torch.inference_mode():
    infer = leaf * 2  # (3,)
for name, t in [("plain", plain), ("requires_grad", leaf), ("leaf * 2", leaf * 2),
                ("no_grad result", nograd), ("inference result", infer)]:
    keys = str(torch._C._dispatch_keys(t)).removeprefix("DispatchKeySet")
    print(f"{name:<16} {keys:<48} requires_grad {t.requires_grad!s:<5} "
          f"grad_fn {type(t.grad_fn).__name__ if t.grad_fn else None}")

# %% [markdown]
# Output:
# ```text
# plain            (CPU, ADInplaceOrView, AutogradCPU, AutocastCPU) requires_grad False grad_fn None
# requires_grad    (CPU, ADInplaceOrView, AutogradCPU, AutocastCPU) requires_grad True  grad_fn None
# leaf * 2         (CPU, ADInplaceOrView, AutogradCPU, AutocastCPU) requires_grad True  grad_fn MulBackward0
# no_grad result   (CPU, ADInplaceOrView, AutogradCPU, AutocastCPU) requires_grad False grad_fn None
# inference result (CPU, AutocastCPU)                               requires_grad False grad_fn None
# ```
#
# On 2.13.0 `requires_grad` does **not** change the keys: every ordinary CPU tensor carries
# `AutogradCPU`, so every call on it passes through the autograd layer. That layer looks at
# the `requires_grad` flags (stored on the tensor, not in its keys) and records a node
# (`MulBackward0`) only when an input needs a gradient. `AutocastCPU` is there too, and does
# nothing unless autocast is on (lesson 05b: the next cell shows the switch);
# `ADInplaceOrView` is the layer that bumps version counters on in-place ops and records
# which tensor a view came from.
#
# `no_grad` changes nothing on the tensors: it sets a per-thread flag, the autograd layer
# still runs and simply records nothing. `inference_mode` goes further, and the tensors it
# creates are *inference tensors*, which carry neither `AutogradCPU` nor `ADInplaceOrView`.
# But which layers does a call skip inside it? That depends on the tensor.
#
# **Predict.** Inside `inference_mode`, take an ordinary tensor `t`, made before, and an
# inference tensor `i`, made inside. Does `t.add_(1)` still bump `t._version`? Is `t[:2]`
# still a view that knows its base? And for `i`? Is `t * 2` an ordinary tensor? (A guess:
# nothing so far says which layers an inference tensor skips; the two tables do.)


# %%
def switched_off():
    """Which layers this thread skips for every call now (private API)."""
    keys = {"Autograd": Key.AutogradFunctionality, "ADInplaceOrView": Key.ADInplaceOrView,
            "AutocastCPU": Key.AutocastCPU}
    return {name: torch._C._dispatch_tls_is_dispatch_key_excluded(k) for name, k in keys.items()}


def inside_inference_mode(u):
    """What add_, [:2] and * 2 do to u inside inference_mode: one row of the table."""
    before = u._version if not u.is_inference() else None  # an inference tensor has no counter
    u.add_(1)  # in place
    view = u[:2]  # (2,) a view
    change = f"{before} -> {u._version}" if before is not None else "no counter"
    return change, view._base is u, view.is_inference(), (u * 2).is_inference()


off = {"no mode": switched_off()}
with torch.no_grad():
    off["no_grad"] = switched_off()
with torch.autocast("cpu", dtype=torch.bfloat16):
    off["autocast"] = switched_off()
t = torch.zeros(4)  # (4,) an ordinary tensor, made outside the mode
with torch.inference_mode():
    off["inference_mode"] = switched_off()
    i = torch.zeros(4)  # (4,) made inside: an inference tensor
    rows = {"ordinary t": inside_inference_mode(t), "inference i": inside_inference_mode(i)}
    leaf_times_2 = leaf * 2  # (3,) leaf requires grad
print("layers switched off for every call:")
for mode, layers in off.items():
    print(f"  {mode:<15} " + "  ".join(f"{k} {v!s:<5}" for k, v in layers.items()))
print(f"{'tensor':<12} {'add_ on _version':<17} {'[:2]._base is it':<17} {'[:2] inference':<15} * 2 inference")
for name, (change, based, view_inf, times2_inf) in rows.items():
    print(f"{name:<12} {change:<17} {based!s:<17} {view_inf!s:<15} {times2_inf}")
print(f"leaf * 2 inside: grad_fn {leaf_times_2.grad_fn}, requires_grad {leaf_times_2.requires_grad}")

# %% [markdown]
# Output:
# ```text
# layers switched off for every call:
#   no mode         Autograd False  ADInplaceOrView False  AutocastCPU True
#   no_grad         Autograd False  ADInplaceOrView False  AutocastCPU True
#   autocast        Autograd False  ADInplaceOrView False  AutocastCPU False
#   inference_mode  Autograd True   ADInplaceOrView False  AutocastCPU True
# tensor       add_ on _version  [:2]._base is it  [:2] inference  * 2 inference
# ordinary t   0 -> 1            True              False           True
# inference i  no counter        False             True            True
# leaf * 2 inside: grad_fn None, requires_grad False
# ```
#
# The first table is the dispatcher's per-thread switchboard. `AutocastCPU` is switched off
# for every call unless autocast is on: that is why a tensor can carry its key and never
# meet the layer. Under `no_grad` nothing more is switched off: the autograd layer runs
# and reads the grad-mode flag. Under
# `inference_mode` the autograd layer is off for every call of the thread: no call records
# a graph, not even `leaf * 2` on a tensor that requires grad. `ADInplaceOrView` is *not*
# switched off. It runs for every call whose inputs carry its key, that is for ordinary
# tensors: `t.add_(1)` still bumps `t`'s version, and `t[:2]` is still a view that knows
# its base and is itself an ordinary tensor, so that autograd can check both later, outside
# the mode. An inference tensor carries neither key, so every call on it skips both layers,
# inside the mode and after it: it has no version counter, and its views record no base
# (`_base` is None) and are inference tensors too. A result that is not a view is an
# inference tensor whoever its inputs were: `t * 2` is one.
#
# **Predict.** Lesson 01 said autograd tracks in-place writes with a *version counter*. What
# is `plain._version` after two in-place writes? And what may you still do, outside the
# mode, with the inference tensor `infer`?

# %%
plain.add_(1)
plain[0] = 5  # an indexed assignment is in place too: select, then copy_
print(f"plain: version {plain._version}, is_inference {plain.is_inference()}")
print(f"inference: is_inference {infer.is_inference()}")
for what, fn in [("infer._version", lambda: infer._version),
                 ("infer.add_(1)", lambda: infer.add_(1)),
                 ("infer * leaf", lambda: infer * leaf)]:  # leaf requires grad: mul must save infer
    try:
        fn()
    except RuntimeError as err:
        print(f"{what}: {first_sentence(err)}")

# %% [markdown]
# Output:
# ```text
# plain: version 2, is_inference False
# inference: is_inference True
# infer._version: Inference tensors do not track version counter.
# infer.add_(1): Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone to get a normal tensor before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 for more details.
# infer * leaf: Inference tensors cannot be saved for backward
# ```
#
# Each in-place op bumps an ordinary tensor's version; autograd compares versions to detect
# a saved tensor that was overwritten (lesson 03a). Inference tensors have no counter at
# all, so PyTorch refuses every use that would need one: reading `_version`, writing in
# place outside inference mode, saving them for a backward pass (the message is PyTorch's,
# missing spaces included). Use `inference_mode` for pure evaluation, `no_grad` when the
# results may later meet autograd.

# %% [markdown]
# ## 4. What a training step really runs, forward and backward
#
# **Predict.** A classifier's step: `F.linear(x, w, b)` then `F.cross_entropy(logits,
# target)`, then `loss.backward()`. How many ATen ops run forward? Is there a softmax op?
# And which ops does autograd schedule for the backward pass?

# %%
xs = torch.randn(4, 8, device=DEVICE)  # (N, D) inputs
target = torch.tensor([0, 2, 1, 0], device=DEVICE)  # (N,) class indices
weight = torch.randn(3, 8, device=DEVICE, requires_grad=True)  # (C, D)
bias = torch.zeros(3, device=DEVICE, requires_grad=True)  # (C,)
with OpLog() as step_log:
    loss = F.cross_entropy(F.linear(xs, weight, bias), target)  # scalar
    n_forward = len(step_log.calls)
    loss.backward()
forward_calls, backward_calls = step_log.calls[:n_forward], step_log.calls[n_forward:]
print(f"forward: {len(forward_calls)} ops")
print_calls(forward_calls, "  ")
print(f"backward: {len(backward_calls)} ops")
print_calls(backward_calls, "  ")

# %% [markdown]
# Output:
# ```text
# forward: 5 ops
#   aten.t.default                           (3, 8)                 -> (8, 3)
#   aten.addmm.default                       (3,) (4, 8) (8, 3)     -> (4, 3)
#   aten._log_softmax.default                (4, 3)                 -> (4, 3)
#   aten.detach.default                      (4, 3)                 -> (4, 3)
#   aten.nll_loss_forward.default            (4, 3) (4,)            -> () ()
# backward: 12 ops
#   aten.ones_like.default                   ()                     -> ()
#   aten.nll_loss_backward.default           () (4, 3) (4,) ()      -> (4, 3)
#   aten.detach.default                      (4, 3)                 -> (4, 3)
#   aten._log_softmax_backward_data.default  (4, 3) (4, 3)          -> (4, 3)
#   aten.t.default                           (4, 3)                 -> (3, 4)
#   aten.mm.default                          (3, 4) (4, 8)          -> (3, 8)
#   aten.t.default                           (3, 8)                 -> (8, 3)
#   aten.sum.dim_IntList                     (4, 3)                 -> (1, 3)
#   aten.view.default                        (1, 3)                 -> (3,)
#   aten.detach.default                      (3,)                   -> (3,)
#   aten.t.default                           (8, 3)                 -> (3, 8)
#   aten.detach.default                      (3, 8)                 -> (3, 8)
# ```
#
# Forward: `F.linear` with a bias is `t` + `addmm` (bias + x @ wᵀ, one fused call).
# `cross_entropy` is no kernel of its own: it is `_log_softmax` then `nll_loss_forward`
# (which also returns the total weight, the second `()`). The softmax is there, in its
# numerically safer log form. The `detach` after `_log_softmax` is not math. The backward
# of `log_softmax` needs the op's own output, so autograd saves it, as a shallow copy: a new
# record over the same storage (lesson 01). Hold that thought: the next cell shows that
# this `detach` is there only because our mode is watching.
#
# Backward runs the chain rule in reverse, one ATen call per step: `ones_like` is the seed
# dLoss/dLoss = 1; `nll_loss_backward` and `_log_softmax_backward_data` give dLoss/dlogits
# (4, 3); `addmm`'s backward turns that into the gradient of its (8, 3) operand wᵀ (`t`,
# `mm`, `t`: gradᵀ @ x, then transposed) and the bias's (`sum` over the batch, then `view`
# to (3,)); the later `t`, (8, 3) -> (3, 8), is the backward of the forward's `t` and gives
# the gradient in the shape of `weight`. The first backward `detach` unpacks the saved
# `log_softmax` output for its backward formula; the last two belong to `AccumulateGrad`,
# which stores each parameter's gradient in `.grad`. The order is fixed by the graph: the
# same on every run.
#
# **Predict.** An observer should not change what it observes. Profile the same step with
# `torch.profiler`, once with no mode and once inside a mode that only runs each op
# (`NoOp`). How many `aten::detach` calls does each profile record, and who makes them?


# %%
class NoOp(TorchDispatchMode):
    """Runs every op unchanged and records nothing."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def profile_step(mode=None):
    """The profiler's events for one training step of section 4's model, inside `mode`."""
    w, b = weight.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with mode or contextlib.nullcontext():
            F.cross_entropy(F.linear(xs, w, b), target).backward()
    return prof.events()


def callers(events, op):
    """{who called: how many times} for the recorded calls of `op`."""
    names = (e.cpu_parent.name if e.cpu_parent else "(top)" for e in events if e.name == op)
    return Counter(n.removeprefix("torch::autograd::").removeprefix("aten::") for n in names)


for label, mode in [("no mode", None), ("NoOp mode", NoOp())]:
    events = profile_step(mode)
    for op in ("aten::detach", "aten::addmm"):
        found = callers(events, op)
        print(f"{label:<10} {op:<13} {sum(found.values())}  called by "
              + ", ".join(f"{k} {v}" for k, v in sorted(found.items())))

# %% [markdown]
# Output:
# ```text
# no mode    aten::detach  2  called by AccumulateGrad 2
# no mode    aten::addmm   1  called by linear 1
# NoOp mode  aten::detach  6  called by AccumulateGrad 2, LogSoftmaxBackward0 1, PythonDispatchMode 2, _log_softmax 1
# NoOp mode  aten::addmm   2  called by PythonDispatchMode 1, linear 1
# ```
#
# With no mode, the step calls `aten::detach` twice, both from `AccumulateGrad`. With a
# mode that changes nothing, the profiler records 6. Two effects add up. First, every op
# that the dispatcher hands to a Python mode is recorded twice: once when it is called, and
# once more when the mode runs it (`func(*args)`, under `PythonDispatchMode`); `addmm` goes
# from 1 to 2 that way, and `AccumulateGrad`'s 2 detaches count 4. Second, two detaches
# appear that do not exist without a mode, each recorded once: one inside `_log_softmax`
# and one inside `LogSoftmaxBackward0`. Saving the output for backward, and unpacking it
# there, makes a shallow copy of the tensor: a new record over the same storage (lesson
# 01). With no mode, that copy is plain C++ that calls no operator. With a Python mode
# active, PyTorch makes the copy by handing `aten::detach` to the mode directly (in the C++
# function `TensorImpl::shallow_copy_and_detach`; the next cell shows it on its own).
# Saving an *input* keeps the tensor itself (no copy, no call): no detach appears inside
# `addmm`, whose backward needs its inputs, not its output.
#
# So `OpLog`'s 1 + 3 detaches are 2 from autograd and 2 that the watching itself caused.
# An observer can change what it observes; the profiler (which is not a dispatch mode)
# shows what runs when nobody watches with a mode.
#
# **Predict.** `t.data` is the same kind of shallow copy, made on request. Does it call an
# ATen op with no mode active? And inside `OpLog`?

# %%
fresh = torch.ones(3)  # (3,)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    fresh.data  # a shallow copy: new record, same storage  # noqa: B018
no_mode_ops = [e.name for e in prof.events()]
with OpLog() as data_log:
    shallow = fresh.data  # (3,)
print(f"fresh.data with no mode: ATen calls recorded: {no_mode_ops or 'none'}")
print(f"fresh.data inside OpLog: {', '.join(data_log.names())}  "
      f"same storage: {shallow.untyped_storage().data_ptr() == fresh.untyped_storage().data_ptr()}")

# %% [markdown]
# Output:
# ```text
# fresh.data with no mode: ATen calls recorded: none
# fresh.data inside OpLog: aten.detach.default  same storage: True
# ```
#
# The same shallow copy: no operator at all when nobody watches, an `aten.detach` call
# when a Python mode is active. That is the mechanism behind the extra detaches above.

# %% [markdown]
# ## 5. Meta tensors: shapes without data
#
# The `meta` device has kernels that compute only the output's metadata: shape, dtype,
# strides. No memory is allocated and no arithmetic is done.
#
# **Predict.** What happens when you ask for 10⁹ float32 elements on `meta`? How many bytes
# would they take on the CPU, and what can you read from them?

# %%
big = torch.empty(10**9, device="meta")  # (1e9,) float32, nothing allocated
print(f"shape {tuple(big.shape)}  dtype {big.dtype}  device {big.device}")
print(f"would take {big.numel() * big.element_size():,} bytes "
      f"({big.numel() * big.element_size() / 2**30:.2f} GiB); data pointer {big.data_ptr()}")
total = big.sum()  # runs the meta kernel of aten::sum: a shape, no value
print(f"big.sum(): shape {tuple(total.shape)}  device {total.device}")
try:
    total.item()
except RuntimeError as err:
    print(f"item(): {first_sentence(err)}")

# %% [markdown]
# Output:
# ```text
# shape (1000000000,)  dtype torch.float32  device meta
# would take 4,000,000,000 bytes (3.73 GiB); data pointer 0
# big.sum(): shape ()  device meta
# item(): Tensor.item() cannot be called on meta tensors
# ```
#
# The tensor has every piece of metadata and a null data pointer. Ops on it run their
# *meta kernels*, which apply the op's shape and dtype rules; asking for a value fails.
#
# **Predict.** Build a 134-million-parameter MLP on `meta` and push a (64, 4096) batch
# through it. Which ATen ops run, and what is the output's shape?

# %%
with torch.device("meta"):  # every parameter is created on meta
    mlp = nn.Sequential(nn.Linear(4096, 16384), nn.GELU(), nn.Linear(16384, 4096))
batch = torch.empty(64, 4096, device="meta")  # (B, D)
with OpLog() as meta_log:
    out = mlp(batch)  # (B, D)
n_params = sum(p.numel() for p in mlp.parameters())
n_bytes = sum(p.numel() * p.element_size() for p in mlp.parameters())
print(f"parameters {n_params:,}, would take {n_bytes:,} bytes; "
      f"all on meta: {all(p.is_meta for p in mlp.parameters())}")
print_calls(meta_log.calls)
print(f"output shape {tuple(out.shape)}  device {out.device}  "
      f"would take {out.numel() * out.element_size():,} bytes")

# %% [markdown]
# Output:
# ```text
# parameters 134,238,208, would take 536,952,832 bytes; all on meta: True
# aten.t.default                           (16384, 4096)          -> (4096, 16384)
# aten.addmm.default                       (16384,) (64, 4096) (4096, 16384) -> (64, 16384)
# aten.gelu.default                        (64, 16384)            -> (64, 16384)
# aten.t.default                           (4096, 16384)          -> (16384, 4096)
# aten.addmm.default                       (4096,) (64, 16384) (16384, 4096) -> (64, 4096)
# output shape (64, 4096)  device meta  would take 1,048,576 bytes
# ```
#
# The same ATen ops as on the CPU, answered by meta kernels: half a gigabyte of parameters
# and a forward pass, with no memory and no arithmetic. This is how large models are built
# before they are sharded: create on `meta`, shard, then `to_empty(device=...)` allocates
# only the shard a process keeps, and an init fills it (lesson 13b, section 2, runs it on 4
# ranks). `torch.compile` relies on the same idea: it traces with *fake tensors*, which
# the next section opens, to learn every shape and stride of a program without running it.

# %% [markdown]
# ## 6. More layers: `vmap`, functionalization, fake tensors
#
# Autograd and the backend are not the only layers. `torch.func.vmap` runs a function written
# for one example on a whole batch; `torch.func.functionalize` removes in-place ops;
# `FakeTensorMode` (what `torch.compile` traces with) gives tensors that have metadata and
# no data. Each works as a layer of the dispatcher, with a key of its own on the tensors it
# hands to your function.
#
# **Predict.** `bump` adds 1 in place and doubles: `u.add_(1); return u * 2`. Run it on a
# (2, 3) tensor plainly, under `vmap`, under `functionalize`, and on a fake tensor. What
# shape does `bump` see, which keys does its input carry beyond a plain tensor's, and which
# ATen calls reach `OpLog`, below every layer?


# %%
def keys_of(t):
    return set(str(torch._C._dispatch_keys(t)).removeprefix("DispatchKeySet(").removesuffix(")").split(", "))


def bump(u):  # (..., 3)
    seen.append((type(u).__name__, tuple(u.shape), keys_of(u)))
    u.add_(1)
    return u * 2


PLAIN_KEYS = keys_of(torch.zeros(1))
layered = {"plain": bump, "vmap": torch.func.vmap(bump), "functionalize": torch.func.functionalize(bump),
           "fake": bump}
print(f"{'run':<14} {'bump sees':<18} {'keys beyond plain':<27} ATen calls that reach OpLog")
for name, fn in layered.items():
    seen = []
    with OpLog() as layer_log:
        with FakeTensorMode() if name == "fake" else contextlib.nullcontext():
            fn(torch.zeros(2, 3))  # (2, 3)
    kind, shape, keys = seen[0]
    calls = [f"{str(f).removeprefix('aten.')} {ins}" for f, ins, _ in layer_log.calls if "zeros" not in str(f)]
    added = ", ".join(sorted(keys - PLAIN_KEYS)) or "-"
    print(f"{name:<14} {kind + ' ' + str(shape):<18} {added:<27} {', '.join(calls)}")

# %% [markdown]
# Output:
# ```text
# run            bump sees          keys beyond plain           ATen calls that reach OpLog
# plain          Tensor (2, 3)      -                           add_.Tensor (2, 3), mul.Tensor (2, 3)
# vmap           Tensor (3,)        FuncTorchBatched            add_.Tensor (2, 3), mul.Tensor (2, 3)
# functionalize  Tensor (2, 3)      Functionalize               add.Tensor (2, 3), mul.Tensor (2, 3), copy_.default (2, 3) (2, 3)
# fake           FakeTensor (2, 3)  Python, PythonTLSSnapshot   add_.Tensor (2, 3), mul.Tensor (2, 3)
# ```
#
# Under `vmap`, `bump` sees one example, shape (3,), but its input carries `FuncTorchBatched`:
# the batching layer catches each call, applies a *batch rule*, and one call on the whole
# (2, 3) tensor reaches the layers below. Under `functionalize`, the `Functionalize` layer
# turns `add_` into the functional `add`, runs the rest on its result, and at the end copies
# the result back into the input (`copy_`), so the caller still sees the mutation. A fake
# tensor is a `FakeTensor`, a tensor subclass whose `Python` key sends every call to Python,
# where `FakeTensorMode` computes the output's metadata with meta kernels (section 5) and
# claims the device of the real tensor it stands for.
#
# **Predict.** Capture `bump` as a graph with `make_fx`, once as it is and once under
# `functionalize`. Which ATen ops does each graph hold? And the forward graph that
# `torch.compile` hands to its compiler (captured here by a backend that only records it)?

# %%
fake_t = None
with FakeTensorMode():
    fake_t = torch.zeros(2, 3)  # (2, 3) metadata only
print(f"a fake tensor: device {fake_t.device}, storage on {fake_t.untyped_storage().device}")


def grab(gm, example_inputs):
    """A compiler for AOTAutograd's forward graph that keeps it and runs it as it is."""
    captured.append(gm)
    return gm.forward


def show_graph(name, gm):
    print(f"{name}:")
    for node in gm.graph.nodes:
        if node.op in ("call_function", "output"):
            print(f"  {node.name} = {node.target}({', '.join(map(str, node.args))})")


seen, captured = [], []
show_graph("make_fx(bump)", make_fx(bump)(torch.zeros(3)))
show_graph("make_fx(functionalize(bump))", make_fx(torch.func.functionalize(bump))(torch.zeros(3)))
u = torch.zeros(3)  # (3,)
doubled = torch.compile(bump, backend=aot_autograd(fw_compiler=grab), fullgraph=True)(u)
show_graph("torch.compile's forward graph", captured[0])
print(f"after the compiled call: input {u.tolist()}, result {doubled.tolist()}")

# %% [markdown]
# Output:
# ```text
# a fake tensor: device cpu, storage on meta
# make_fx(bump):
#   add_ = aten.add_.Tensor(u_1, 1)
#   mul = aten.mul.Tensor(add_, 2)
#   output = output(mul)
# make_fx(functionalize(bump)):
#   add = aten.add.Tensor(u_1, 1)
#   mul = aten.mul.Tensor(add, 2)
#   copy_ = aten.copy_.default(u_1, add)
#   output = output(mul)
# torch.compile's forward graph:
#   add = aten.add.Tensor(arg0_1, 1)
#   mul = aten.mul.Tensor(add, 2)
#   output = output((add, mul))
# after the compiled call: input [1.0, 1.0, 1.0], result [2.0, 2.0, 2.0]
# ```
#
# The fake tensor says `cpu` but its storage is on `meta`: no bytes behind it. The plain
# capture keeps the in-place `add_`, and `mul` reads its result. The functionalized graph
# has no mutation until its very end: `add` makes a new tensor, `mul` uses it, and one
# `copy_` writes it back into the input. `torch.compile` goes one step further: the graph
# its compiler receives has no mutation at all. It returns the new value of the input
# (`add`) as an extra output, and the code around the graph copies it into the input, as
# the last line shows: the backend's graph holds no in-place write to reason about.

# %% [markdown]
# ## 7. A custom op's stride contract
#
# `torch.library.custom_op` adds your own operator to the dispatcher, under your own
# namespace (here `course02::`). A compiler cannot run the real kernel while tracing, so an
# op also needs a *fake* implementation: a function that returns an empty tensor with the
# shape, dtype **and strides** the real kernel will return. Nothing checks that promise when
# you register it.
#
# Our op doubles a matrix, and (as some hand-written kernels do) writes its result in
# column-major order. `define_double` registers it with an honest fake, or with a careless
# one that returns `empty_like(x)`: right shape and dtype, wrong strides. A second call of
# `custom_op` with the same name replaces the op, so re-running this cell is harmless.


# %%
def define_double(name, honest):
    """Register course02::<name>: 2 * x, returned column-major; honest or careless fake."""

    @torch.library.custom_op(f"course02::{name}", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty(x.shape[::-1]).t()  # (M, N), strides (1, M): column-major
        return out.copy_(x * 2)

    @double.register_fake
    def _(x):
        if honest:
            return x.new_empty(x.shape[::-1]).t()  # the same layout as the real kernel
        return torch.empty_like(x)  # row-major: right shape, wrong strides

    return double


double_bad = define_double("double_bad", honest=False)
double_good = define_double("double_good", honest=True)


def flat_bad(x):
    return double_bad(x).reshape(-1)  # (M*N,)


def flat_good(x):
    return double_good(x).reshape(-1)  # (M*N,)


# %% [markdown]
# **Predict.** `flat_bad` reshapes the op's output to 1-D. Run eagerly, does it work? A
# tracer (`make_fx` with fake tensors, what `torch.compile` does underneath) records the
# ATen ops instead of running them: which op will it record for `reshape`?

# %%
a = torch.randn(3, 4, device=DEVICE)  # (M, N)
print(f"real output strides {double_bad(a).stride()}")
with OpLog() as eager_log:
    eager = flat_bad(a)
print(f"eager: {', '.join(eager_log.names())}")
traced = make_fx(flat_bad, tracing_mode="fake")(a)  # runs the fake implementation
nodes = [n for n in traced.graph.nodes if n.op == "call_function"]
print(f"fake output strides {nodes[0].meta['val'].stride()}")
print(f"traced: {', '.join(str(n.target) for n in nodes)}")

# %% [markdown]
# Output:
# ```text
# real output strides (1, 3)
# eager: course02.double_bad.default, aten.clone.default, aten._unsafe_view.default
# fake output strides (4, 1)
# traced: course02.double_bad.default, aten.view.default
# ```
#
# `reshape` is composite (section 2): it decides from the strides. Eagerly, the real output
# is column-major, so it copies (`clone`) and then views the copy. While tracing, the fake
# output claims to be row-major, so `reshape` becomes a plain `view`, and that is what the
# graph records. The graph is now wrong for the real kernel, and nothing has failed yet.
#
# **Predict.** Compile both functions with `torch.compile(backend="aot_eager")` (trace to
# ATen with fake tensors, then run the graph's ops eagerly: no code generation, so it is
# quick). What happens on the first call?

# %%
for fn in (flat_bad, flat_good):
    try:
        same = torch.equal(torch.compile(fn, backend="aot_eager")(a), fn(a))
        print(f"{fn.__name__}: compiled result equals eager: {same}")
    except RuntimeError as err:
        print(f"{fn.__name__}: compiled call failed: {first_sentence(err)}")
        print(f"  the message advises .reshape(...): {'Use .reshape(...) instead' in str(err)}")

# %% [markdown]
# Output:
# ```text
# flat_bad: compiled call failed: view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces)
#   the message advises .reshape(...): True
# flat_good: compiled result equals eager: True
# ```
#
# The eager function works, the compiled one fails, and the error points at a `view` that
# does not appear in our code, with advice to use `.reshape(...)`, which is what we wrote.
# The traced graph ran for real: the real, column-major output reached the `view` that the
# fake output had justified. The op itself is correct; its *promise* was wrong. With the
# honest fake, the trace records the copy and the compiled function agrees with eager.
# Here the lie surfaced as an error far from the op, in an op our code never called.

# %% [markdown]
# **Predict.** Can the bug be caught where it is made, right after registering the op?
# `torch.library.opcheck` runs an op on sample inputs and compares the real and the fake
# outputs, among other tests.

# %%
for name, op in [("double_bad", double_bad), ("double_good", double_good)]:
    try:
        result = torch.library.opcheck(op, (a,))  # {test name: "SUCCESS"}
        print(f"{name}: {', '.join(f'{k} {v}' for k, v in result.items())}")
    except Exception as err:  # noqa: BLE001 - OpCheckError lives in a private module
        head, _, tail = str(err).partition(" with ")
        print(f"{name}: {type(err).__name__}: {head}")
        print(f"  {tail[tail.index('Stride mismatch'):].removesuffix(' (scroll up for stack trace)')}")

# %% [markdown]
# Output:
# ```text
# double_bad: OpCheckError: opcheck(op, ...): test_faketensor failed
#   Stride mismatch! Strides are (1, 3) and (4, 1) (mismatched at 0)!
# double_good: test_schema SUCCESS, test_autograd_registration SUCCESS, test_faketensor SUCCESS, test_aot_dispatch_dynamic SUCCESS
# ```
#
# `opcheck` ran the op on real tensors and on fake copies of them and compared the outputs'
# metadata: strides (1, 3) from the real kernel, (4, 1) from the fake. The honest op passes
# all four tests: the schema's aliasing claims hold, autograd is registered correctly, the
# fake matches the real kernel, and the op traces through the compile stack with dynamic
# shapes. The check that failed names the bug and the op, at the op: call `opcheck` in a
# custom op's unit tests, on inputs of several shapes and layouts.

# %% [markdown]
# ## Summary
#
# - Every tensor operation in `torch` ends in ATen operator overloads (`aten::mm`,
#   `aten::add_.Tensor`); schemas declare their types, and `Tensor(a)` / `Tensor(a!)`
#   declare aliasing and mutation, which is what autograd and compilers rely on.
# - Each op is declared in `native_functions.yaml` (schema, and the C++ function per
#   backend) and its derivative in `derivatives.yaml`; torchgen generates the registration
#   of the CPU and autograd kernels from them. Batch rules for `vmap` are written by hand.
# - Composite ops (`matmul`, `linear`, `reshape`, `cross_entropy`) decompose into other ATen
#   ops before a dispatch mode sees anything; `torch.mm(x, w)` and `x @ w` end in the same
#   `aten.mm.default`.
# - Dispatch keys choose the layers: an ordinary CPU tensor carries `AutogradCPU` whether
#   or not it requires grad; `AutocastCPU` is switched off unless autocast is on; `no_grad`
#   sets a flag and switches no layer off.
#   `inference_mode` switches the autograd layer off for every call, but not
#   `ADInplaceOrView`: ordinary tensors still get version bumps and tracked views inside
#   it. Its non-view results are inference tensors, which carry neither key: no version
#   counter, no tracked views, and no use in autograd afterwards.
# - A `TorchDispatchMode` sees each ATen call, forward and backward, in an order fixed by
#   the graph. It also changes what runs: while a Python mode is active, autograd's shallow
#   copies of saved outputs become `aten::detach` calls. The profiler, with no mode, shows
#   what runs when nobody watches.
# - `meta` tensors propagate shapes and dtypes through whole models with no memory.
# - `vmap`, functionalization and fake tensors are layers too, with keys of their own
#   (`FuncTorchBatched`, `Functionalize`, `Python`). Functionalization turns `add_` into
#   `add` plus a write-back; `torch.compile`'s graphs hold no mutation at all.
# - A custom op's fake implementation is a contract on shape, dtype *and strides*; break it
#   and eager code works while compiled code fails far from the op. Run
#   `torch.library.opcheck` on every custom op.

# %% [markdown]
# ## References
#
# - [`torch.library`](https://docs.pytorch.org/docs/2.13/library.html): defining operators, their schemas and kernels
#   (`custom_op`, `register_fake`, `opcheck`), the public face of the dispatcher.
# - [`torch.library.custom_op`](https://docs.pytorch.org/docs/2.13/generated/torch.library.custom_op.html) and
#   [`torch.library.opcheck`](https://docs.pytorch.org/docs/2.13/generated/torch.library.opcheck.html): section 7's op and
#   the check that catches its broken twin.
# - [`torch.overrides`](https://docs.pytorch.org/docs/2.13/torch.overrides.html): `__torch_function__`, the Python layer
#   above the dispatcher (section 2's dispatch mode sits below it).
# - [`torch.func.vmap`](https://docs.pytorch.org/docs/2.13/generated/torch.func.vmap.html) and
#   [`torch.func.functionalize`](https://docs.pytorch.org/docs/2.13/generated/torch.func.functionalize.html): two of the
#   layers of section 6.
# - [`torch.profiler`](https://docs.pytorch.org/docs/2.13/profiler.html): the profiler that
#   lists a training step's ops in section 4.

# %% [markdown]
# ## Read the source
#
# Where PyTorch implements the path this lesson followed. Open each file in your editor at
# the line printed: the paths are inside the torch you installed, so the line numbers are
# those of your installation. The stops go down one call: the Python hook above the
# dispatcher, the dispatcher's call, the order of the keys, the `Python` key that dispatch
# modes use; then where an operator comes from: its yaml entry, and the generator that
# turns the yaml into registered kernels.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/overrides.py", "def handle_torch_function(",
     "The layer above the dispatcher: when an argument defines `__torch_function__` or a "
     "`TorchFunctionMode` is active, the call is handed to that `__torch_function__` as the Python "
     "function you called, before any ATen op runs (this is the version for functions written in "
     "Python; built-ins such as `torch.mm` use the C++ twin its docstring names). "
     "`class TorchFunctionMode`, further down, is the mode that sees section 2's spellings "
     "(`torch.matmul`, `F.linear`), which `OpLog`, a dispatch mode, never sees."),
    ("torch/include/ATen/core/dispatch/Dispatcher.h", "Return Dispatcher::call(",
     "One call's whole path: the key set comes from the arguments through "
     "`getDispatchKeySetUnboxed` (which adds the thread's included keys and removes its excluded "
     "ones, in `DispatchKeyExtractor.h`), `lookup` finds the kernel of the highest key, and a "
     "profiler callback wraps it (`callWithDispatchKeySlowPath`). `Dispatcher::redispatch`, just "
     "below, is how a layer passes the call down, without the profiler: that is why section 4's "
     "profile counts `aten::addmm` once, not once per layer."),
    ("torch/include/c10/core/DispatchKey.h", "enum class DispatchKey : uint16_t",
     "The functionality keys in priority order, lowest first: `Dense` (the backend kernel, "
     "`CPU`), then `Python`, `Functionalize`, `ADInplaceOrView`, `AutogradFunctionality` "
     "(`AutogradCPU` for a CPU tensor), `AutocastCPU`, `FuncTorchBatched`, `PythonTLSSnapshot`: "
     "the keys of sections 3 and 6. A `DispatchKeySet` prints in this order, and the dispatcher "
     "runs the highest key the thread has not switched off first: autocast (when it is on), "
     "then autograd, then `ADInplaceOrView` (for view and in-place ops), then the CPU kernel."),
    ("torch/utils/_python_dispatch.py", "class TorchDispatchMode",
     "`OpLog`'s base class. `__enter__` ends in `_push_mode(self)`, which puts the mode on the "
     "thread's stack; while it is there the thread's included keys hold `Python` and "
     "`PythonTLSSnapshot`, so every ATen call that is not a composite (section 2: `matmul` has "
     "decomposed before this point) reaches the `Python` key once autograd (a higher key) has "
     "done its part, and that key calls your `__torch_dispatch__`."),
    ("torchgen/packaged/ATen/native/native_functions.yaml", "func: mm(Tensor self, Tensor mat2) -> Tensor",
     "The entry of `aten::mm`, where section 2's spellings end: its `func:` line is the schema "
     "section 1 printed and, like `mul.Tensor`, it is `structured_delegate: mm.out`, whose entry "
     "just below names the C++ kernel of each backend (`CPU: mm_out_cpu`). Earlier in the file, "
     "`func: matmul(` has no `CPU:` line, only `CompositeImplicitAutograd: matmul` (and "
     "nested-tensor kernels): a composite, which a dispatch mode never sees."),
    ("torchgen/gen.py", "def gen_source_files(",
     "Where the yaml becomes registration code: for each dispatch key it writes "
     "`Register{dispatch_key}.cpp` from the template `RegisterDispatchKey.cpp` (in 4 shards for "
     "CPU: the `RegisterCPU_<n>.cpp` in which section 1 found `mul.Tensor`'s CPU kernel), and "
     "further down `RegisterSchema.cpp`, which registers the schemas. `parse_native_yaml`, near "
     "the top, reads the yaml."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/overrides.py:«line»  `def handle_torch_function(`
#     The layer above the dispatcher: when an argument defines `__torch_function__` or a
#     `TorchFunctionMode` is active, the call is handed to that `__torch_function__` as
#     the Python function you called, before any ATen op runs (this is the version for
#     functions written in Python; built-ins such as `torch.mm` use the C++ twin its
#     docstring names). `class TorchFunctionMode`, further down, is the mode that sees
#     section 2's spellings (`torch.matmul`, `F.linear`), which `OpLog`, a dispatch mode,
#     never sees.
# torch/include/ATen/core/dispatch/Dispatcher.h:«line»  `Return Dispatcher::call(`
#     One call's whole path: the key set comes from the arguments through
#     `getDispatchKeySetUnboxed` (which adds the thread's included keys and removes its
#     excluded ones, in `DispatchKeyExtractor.h`), `lookup` finds the kernel of the
#     highest key, and a profiler callback wraps it (`callWithDispatchKeySlowPath`).
#     `Dispatcher::redispatch`, just below, is how a layer passes the call down, without
#     the profiler: that is why section 4's profile counts `aten::addmm` once, not once
#     per layer.
# torch/include/c10/core/DispatchKey.h:«line»  `enum class DispatchKey : uint16_t`
#     The functionality keys in priority order, lowest first: `Dense` (the backend kernel,
#     `CPU`), then `Python`, `Functionalize`, `ADInplaceOrView`, `AutogradFunctionality`
#     (`AutogradCPU` for a CPU tensor), `AutocastCPU`, `FuncTorchBatched`,
#     `PythonTLSSnapshot`: the keys of sections 3 and 6. A `DispatchKeySet` prints in this
#     order, and the dispatcher runs the highest key the thread has not switched off
#     first: autocast (when it is on), then autograd, then `ADInplaceOrView` (for view and
#     in-place ops), then the CPU kernel.
# torch/utils/_python_dispatch.py:«line»  `class TorchDispatchMode`
#     `OpLog`'s base class. `__enter__` ends in `_push_mode(self)`, which puts the mode on
#     the thread's stack; while it is there the thread's included keys hold `Python` and
#     `PythonTLSSnapshot`, so every ATen call that is not a composite (section 2: `matmul`
#     has decomposed before this point) reaches the `Python` key once autograd (a higher
#     key) has done its part, and that key calls your `__torch_dispatch__`.
# torchgen/packaged/ATen/native/native_functions.yaml:«line»  `func: mm(Tensor self, Tensor mat2) -> Tensor`
#     The entry of `aten::mm`, where section 2's spellings end: its `func:` line is the
#     schema section 1 printed and, like `mul.Tensor`, it is `structured_delegate:
#     mm.out`, whose entry just below names the C++ kernel of each backend (`CPU:
#     mm_out_cpu`). Earlier in the file, `func: matmul(` has no `CPU:` line, only
#     `CompositeImplicitAutograd: matmul` (and nested-tensor kernels): a composite, which
#     a dispatch mode never sees.
# torchgen/gen.py:«line»  `def gen_source_files(`
#     Where the yaml becomes registration code: for each dispatch key it writes
#     `Register{dispatch_key}.cpp` from the template `RegisterDispatchKey.cpp` (in 4
#     shards for CPU: the `RegisterCPU_<n>.cpp` in which section 1 found `mul.Tensor`'s
#     CPU kernel), and further down `RegisterSchema.cpp`, which registers the schemas.
#     `parse_native_yaml`, near the top, reads the yaml.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Predict.** `torch.mm(x, w)`, `x @ w` and `F.linear(x, w.t())` compute the same
#    product. Which ATen ops does a `TorchDispatchMode` see for each, and why does it never
#    see `aten::matmul` or `aten::linear`, which the profiler records?
#
#    <details><summary>Answer</summary>
#
#    All three end in `aten.mm.default`; for `F.linear(x, w.t())` the mode first sees two
#    `aten.t.default` (our `w.t()`, then `linear` transposing it back: two views, no copy
#    op). The profiler's
#    top-level calls are `aten::mm`, `aten::matmul`, and `aten::t`, `aten::linear`:
#    `matmul` and `linear` are composites, written in terms of other ATen ops, and they
#    have decomposed by the time a call reaches the mode
#    (*§ Watching the calls: a dispatch mode*).
#
#    </details>
#
# 2. **Predict.** Does `torch.ones(3, requires_grad=True)` carry other dispatch keys than
#    `torch.ones(3)`? Which layers do `torch.no_grad()` and `torch.inference_mode()` switch
#    off for every call?
#
#    <details><summary>Answer</summary>
#
#    The same keys, `(CPU, ADInplaceOrView, AutogradCPU, AutocastCPU)`: the autograd layer
#    runs for both and reads the `requires_grad` flag. `no_grad` switches off nothing more
#    than with no mode (only `AutocastCPU`, which is off unless autocast is on).
#    `inference_mode` switches off `Autograd`, but not `ADInplaceOrView`: `t.add_(1)` on an
#    ordinary tensor still bumps its version inside it
#    (*§ Dispatch keys: which layers a call goes through*).
#
#    </details>
#
# 3. **Explain.** In the training step, `OpLog` logged four `aten.detach` calls (one forward,
#    three backward); the profiler, with no mode, records two, both from `AccumulateGrad`.
#    Where do the other two come from?
#
#    <details><summary>Answer</summary>
#
#    From the watching itself. Saving `_log_softmax`'s output for backward, and unpacking it
#    in `LogSoftmaxBackward0`, each make a shallow copy of a tensor; with a Python mode
#    active that copy is an `aten::detach` call handed to the mode, and the profile under
#    `NoOp` shows one inside `_log_softmax` and one inside `LogSoftmaxBackward0`.
#    `fresh.data` shows the mechanism alone: no ATen call with no mode, `aten.detach.default`
#    inside `OpLog`
#    (*§ What a training step really runs, forward and backward*).
#
#    </details>
#
# 4. **Explain.** The entry of `mul.Tensor` in `native_functions.yaml` has no `CPU:` line.
#    Where does its CPU kernel come from, and who wrote it?
#
#    <details><summary>Answer</summary>
#
#    `mul.Tensor` is `structured_delegate: mul.out`, and the `mul.out` entry names the C++
#    function `mul_out` for CPU (and CUDA, MPS, MTIA). The kernel registered for
#    `mul.Tensor`'s CPU key is torchgen's, in `RegisterCPU.cpp`, built around that
#    `mul_out`; its autograd kernel, in `VariableType.cpp`, is generated by torchgen too;
#    the `vmap` rule (`FuncTorchBatched`) is written by hand
#    (*§ Every call names an operator with a schema*).
#
#    </details>
#
# 5. **Spot the bug.** A custom op returns its result column-major; its fake implementation
#    returns `torch.empty_like(x)`. Eager code that reshapes the output to 1-D works. What
#    breaks under `torch.compile(backend="aot_eager")`, and what catches the bug at the op?
#
#    <details><summary>Answer</summary>
#
#    The fake output claims strides (4, 1) where the real one has (1, 3), so while tracing
#    `reshape` becomes a plain `aten.view` (eagerly it was `clone` then `_unsafe_view`). The
#    compiled call runs that `view` on the real output and fails: "view size is not
#    compatible with input tensor's size and stride", an error in an op the code never
#    called. `torch.library.opcheck(op, (a,))`, run on the op alone, fails its
#    `test_faketensor` with the mismatch: strides (1, 3) real, (4, 1) fake
#    (*§ A custom op's stride contract*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder and implement `written_inputs(fn, *inputs)`: which of
# its inputs does `fn` write to? Answer from the schemas of the ops it runs (section 1),
# seen by a dispatch mode of your own (section 2), not from values or version counters:
# a write may leave every value unchanged, and `fn` may run on inference tensors, which have
# no counter (section 3). Mind the writes that go through a view, into an `out=` argument,
# or into a list of tensors. Check it with `make exercises N=02`; `solutions.py` has one way
# to write it.

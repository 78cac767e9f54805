# %% [markdown]
# # 08 · torch.compile: capture, guards, graph breaks, lowering
#
# `torch.compile(fn)` does not compile Python. It watches `fn`'s bytecode run once
# (TorchDynamo), records the tensor operations it meets into an FX graph, and hands that
# graph to a *backend*. Next to the graph it writes *guards*: the facts about the inputs the
# graph relied on. Each later call checks the guards; if they hold, the saved code runs, if
# not, Dynamo captures again. What Dynamo cannot record splits the function (a *graph
# break*). The default backend, Inductor, then lowers the graph to generated C++ (on CPU) or
# Triton (on GPU) kernels that fuse many operations into one pass over memory.
#
# **What you will learn**
#
# - how to see the captured graphs with a backend of your own, and why a new Python scalar
#   value captures again;
# - how to read the guard that failed, and what shapes do: one recompile, then a dynamic
#   dimension; `dynamic=True`; the recompile limit (8) and what happens past it;
# - what breaks a graph (`print`, `.item()`), how `torch._dynamo.explain` reports it, and
#   how `fullgraph=True` turns a silent break into an error;
# - `torch.compiler.set_stance("fail_on_recompile")` as a guard in tests;
# - what AOTAutograd adds (a backward graph), checked with `aot_eager`, and a case where the
#   compiled backward's autocast assumption changes the gradients;
# - what Inductor makes of an elementwise chain (one fused C++ kernel, as wide as this CPU's
#   vectors), what its cache key holds and why a cache must not travel between machines;
# - what fusion buys against two one-read-one-write floors (`copy_` and `clone`), in and out
#   of the CPU's last-level cache, and what the first call costs;
# - what AOTAutograd hands the compiler (functionalized, decomposed), what the compile modes
#   set, and regional compilation of repeated blocks;
# - what a whole training step compiles into (the backward is a break, the optimizer's
#   update a graph of its own) and what compiled autograd adds;
# - where compile goes with DDP and FSDP2: DDP's graph split at bucket boundaries
#   (`optimize_ddp`), and torchtitan's order, compile each block, then `fully_shard`;
# - what a `TORCH_TRACE` structured log holds, the input of `tlparse`.
#
# **Prerequisites:** lesson 02 (ATen operators and the dispatcher), lesson 03 (autograd),
# lesson 05 (autocast); lesson 06 for honest timing.
#
# **How to run:** `python lessons/08_compile/compile.py` or `make lesson N=08` from the
# repository root, or open `compile.ipynb`. Everything runs on the CPU: the outputs below
# are CPU facts (C++ kernels, CPU autocast), and the GPU comparisons live in the tests
# (`make test-gpu`). Only section 6 runs Inductor: its first call compiles C++ and takes
# seconds (the cell prints how many), far fewer once the generated code is cached on disk;
# the course tools point `TORCHINDUCTOR_CACHE_DIR` at `build/inductor-cache` so that later
# runs reuse it. Each printing cell is followed by an *Output* block: what it printed with
# the pinned PyTorch (2.13.0), checked by `make test`. Timings, rates and anything else that
# depends on the machine appear there as `«time»`, `«rate»`, `«ratio»`, `«number»`. The
# lesson also runs under the logging it recommends below, e.g. `TORCH_LOGS=output_code
# python lessons/08_compile/compile.py`. Run outside the course's venv on a CUDA build
# without a GPU, `torch.compile` may also log PyTorch's own diagnostic line `No CUDA runtime
# is found` to stderr. It is harmless, and the course's venv (`.venv`, made by `make
# install` or any `make lesson`) turns it off (the `Profiler record function ... will be
# ignored` warning is another matter: section 8 explains it).
#
# Several tools here are private (`torch._dynamo`, `torch._functorch.config`,
# `torch._inductor`): PyTorch's compile troubleshooting guides use
# most of them, and this lesson's tests pin what they print, so a change in a new release
# shows up there.

# %%
import collections
import contextlib
import json
import logging
import mmap
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch._dynamo as dynamo
import torch.distributed as dist
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import resource  # Unix only: counts page faults in section 6
except ImportError:  # Windows: that count is not available, the rest runs
    resource = None

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results, comparable timings
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
dynamo.reset()  # forget graphs compiled earlier in this process (tests share one process)


class CountingBackend:
    """A torch.compile backend that keeps every FX graph it is given and runs it as is."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward  # no code generation: the graph's ops run eagerly


def graph_ops(gm):
    """The operations of an FX graph, by name: ['square', 'mul']."""
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    return [getattr(n.target, "__name__", str(n.target)) for n in calls]


def graph_inputs(gm):
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


@contextlib.contextmanager
def captured_logs(name):
    """Collect what one torch logger emits (instead of printing it to stderr)."""
    records, logger = [], logging.getLogger(name)
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    saved = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.propagate = saved


def recompile_guards(fn):
    """The guard whose failure made Dynamo compile fn again, one per recompile: the text that
    `TORCH_LOGS=recompiles` prints. Dynamo records it whatever the log settings say."""
    reasons = dynamo.utils.guard_failures[fn.__code__]  # '0/0: scale == 2.0  # source...'
    return [r.splitlines()[0].split(": ", 1)[1].split("#")[0].strip() for r in reasons]


def failed_guards(message):
    """The failed guards of a recompile message, without frame ids and source comments."""
    lines = [ln.strip()[2:] for ln in message.splitlines() if ln.strip().startswith("- ")]
    guards = [ln.split(": ", 1)[1] for ln in lines if ln[:1].isdigit()]  # '0/1: guard'
    return [g.split("#")[0].strip() for g in guards]


# %% [markdown]
# ## 1. Capture: what the backend receives
#
# A backend is any callable `backend(gm, example_inputs)` that returns something to run in
# place of the graph. Ours stores each `torch.fx.GraphModule` and returns its `forward`, so
# nothing is generated: we only watch Dynamo.
#
# **Predict.** `f(x, scale) = x.square() * scale`, compiled with our backend, is called
# three times on the same `x`: with `scale=2.0`, `2.0` again, then `3.0`. How many graphs
# does the backend receive? Where does `scale` go in each graph?

# %%
def f(x, scale):
    return x.square() * scale


counting = CountingBackend()
cf = torch.compile(f, backend=counting)
x = torch.randn(8)  # (8,)
for scale in [2.0, 2.0, 3.0]:
    out = cf(x, scale)
    print(f"scale {scale}: graphs so far {len(counting.graphs)}, "
          f"same as eager {torch.equal(out, f(x, scale))}")
for i, gm in enumerate(counting.graphs):
    print(f"graph {i}: inputs {graph_inputs(gm)}  ops {graph_ops(gm)}")
reasons = recompile_guards(f)
print(f"recompiles {len(reasons)}, failed guard: {reasons}")

# %% [markdown]
# Output:
# ```text
# scale 2.0: graphs so far 1, same as eager True
# scale 2.0: graphs so far 1, same as eager True
# scale 3.0: graphs so far 2, same as eager True
# graph 0: inputs ['l_x_']  ops ['square', 'mul']
# graph 1: inputs ['l_x_', 'l_scale_']  ops ['square', 'item', 'mul']
# recompiles 1, failed guard: ['scale == 2.0']
# ```
#
# Three calls, two graphs. The first capture treated the Python float as a constant: the
# value 2.0 is baked into the graph (`mul` by 2.0, `scale` is not an input), and a guard
# `scale == 2.0` was written next to it. The second call passed the guard and reused the
# graph. The third failed it, and Dynamo recorded exactly which guard failed. We read that
# record (`torch._dynamo.utils.guard_failures`, private); `TORCH_LOGS=recompiles` prints the
# same text. (Reading the record rather than the log keeps the cell working when you run
# the lesson with `TORCH_LOGS` set to something else: the environment variable then
# overrides every `torch._logging.set_logs` call in the process.)
#
# On the recompile Dynamo did not bake 3.0 in: having seen the value change, it made
# `scale` a graph input (a 0-d tensor, turned back into a number by `item`), so a fourth
# value would reuse graph 1. That is *automatic dynamic*, PyTorch 2.13.0's default for
# scalars and shapes: specialise first, generalise on the first change.

# %% [markdown]
# ## 2. Guards on shapes: one recompile, then a dynamic dimension
#
# Tensor inputs are guarded on dtype, device, rank, sizes and strides (not values).
#
# **Predict.** `g(x) = x.square() * 2` is called with lengths 2, 3, ..., 13: twelve shapes.
# How many graphs with the default `dynamic=None`? With `dynamic=True`? With `dynamic=False`,
# where every new shape needs a graph of its own?

# %%
def g(x):
    return x.square() * 2


def count_graphs(dynamic, lengths):
    """Call g compiled with this `dynamic` on 1-D inputs of these lengths; graphs captured."""
    dynamo.reset()  # the recompile limit counts graphs per code object, across compile calls
    counting = CountingBackend()
    cg = torch.compile(g, backend=counting, dynamic=dynamic)
    with captured_logs("torch._dynamo.convert_frame") as logged:
        for n in lengths:
            assert torch.equal(cg(torch.ones(n)), g(torch.ones(n)))  # right answer either way
    return counting, logged


lengths = list(range(2, 14))  # 12 shapes
by_mode = {d: count_graphs(d, lengths) for d in [None, True, False]}
for d, (backend, _) in by_mode.items():
    last = graph_inputs(backend.graphs[-1])
    print(f"dynamic={d!s:<5}: {len(lengths)} calls, {len(backend.graphs)} graphs, "
          f"inputs of the last one {last}")
print(f"recompile_limit {dynamo.config.recompile_limit}")
print(by_mode[False][1][0].splitlines()[0])

# %% [markdown]
# Output:
# ```text
# dynamic=None : 12 calls, 2 graphs, inputs of the last one ['s77', 'l_x_']
# dynamic=True : 12 calls, 1 graphs, inputs of the last one ['s77', 'l_x_']
# dynamic=False: 12 calls, 8 graphs, inputs of the last one ['l_x_']
# recompile_limit 8
# torch._dynamo hit config.recompile_limit (8)
# ```
#
# - `dynamic=None` (the default): the first graph is specialised to length 2; length 3 fails
#   the size guard, and the recompile marks that dimension dynamic: graph 1 takes a
#   symbolic size `s77` (a `SymInt` input) and serves the other ten lengths.
# - `dynamic=True` starts symbolic: one graph. It can cost speed (a kernel that does not
#   know its sizes cannot unroll or pick tiles for them), so the default waits for evidence.
# - `dynamic=False` specialises every time. After 8 graphs for the same code
#   (`torch._dynamo.config.recompile_limit`) Dynamo logs the warning above and stops
#   compiling this function: the other four calls ran *eagerly*, still correct, with no
#   compiler and no error. In a real model this silent fallback is a common reason why
#   "compile made nothing faster". The limit is a config value: raise it only when you know
#   the number of variants is bounded (the older name `cache_size_limit` still reads it).

# %% [markdown]
# ## 3. Graph breaks
#
# Dynamo records tensor operations; what it cannot record it leaves to Python, ends the
# current graph there, and starts a new graph after it.
#
# **Predict.** `h` below has a `print` and a branch on `.item()`. How many graphs, and how
# many breaks, will `torch._dynamo.explain` report? Does `explain` run `h`?

# %%
def h(x):
    y = x.sin()
    print("h is running")  # Python side effect: not a tensor op
    z = y * 2
    if z.sum().item() > 0:  # a Python bool from tensor data
        return z + 1
    return z - 1


with captured_logs("torch._dynamo.variables.tensor"):  # its advice on .item(), see below
    report = dynamo.explain(h)(x)
print(f"graphs {report.graph_count}, graph breaks {report.graph_break_count}")
for b in report.break_reasons:
    line = b.user_stack[-1].lineno - h.__code__.co_firstlineno + 1  # 1 = the `def` line
    print(f"break at line {line} of h: {b.reason.splitlines()[0]}")

# %% [markdown]
# Output:
# ```text
# h is running
# graphs 3, graph breaks 2
# break at line 3 of h: Failed to trace builtin operator
# break at line 5 of h: Unsupported Tensor.item() call with capture_scalar_outputs=False
# ```
#
# `explain` runs the function (the `print` ran, once) and reports 3 graphs split by 2
# breaks: `sin` before the `print`; `mul` and `sum` up to the `.item()`; after it, the
# branch Python took (`z - 1`: this `x` gives a negative sum).
# At each break Dynamo compiles what it has, lets Python run the unsupported part, and
# resumes tracing in a generated continuation function. Each break costs a return to
# Python, and optimisations cannot cross it (no fusion of `sin` with `* 2` here).
# Dynamo also logs advice for the `.item()` break (set
# `torch._dynamo.config.capture_scalar_outputs = True` to keep the number in the graph); the
# cell above collected that log instead of printing it.
#
# **Predict.** What does `fullgraph=True` do with the same function?

# %%
try:
    torch.compile(h, backend="eager", fullgraph=True)(x)
except dynamo.exc.Unsupported as err:
    print(f"{type(err).__module__}.{type(err).__name__}: {str(err).splitlines()[0]}")

# %% [markdown]
# Output:
# ```text
# torch._dynamo.exc.Unsupported: Failed to trace builtin operator
# ```
#
# It raises at the first break, before the `print` runs: with `fullgraph=True` a break is an
# error, not a silent split. Use it on code you mean to be one graph (a model's forward, a
# training step), so that a break added later fails loudly. `backend="eager"` is a built-in
# backend that, like ours, runs the captured graph without generating code.

# %% [markdown]
# ## 4. A guard for tests: `fail_on_recompile`
#
# `torch.compiler.set_stance` changes how compiled functions behave everywhere in the
# process; as a context manager it restores the previous stance on exit. Under
# `"fail_on_recompile"`, a call that would compile raises instead.
#
# **Predict.** A fresh compiled function is called once inside
# `set_stance("fail_on_recompile")`. Does the first compile count as a recompile? And after a
# warm-up call outside it, what do the same shape and a new rank do?

# %%
def first_line(err):
    return str(err).splitlines()[0].split(" filename:")[0]  # without the file's path


cg = torch.compile(g, backend="eager")
with torch.compiler.set_stance("fail_on_recompile"):
    try:
        cg(torch.ones(4))
    except RuntimeError as err:
        print(f"cold call: {first_line(err)}")
cg(torch.ones(4))  # warm-up, outside the guard: the first compile happens here
with torch.compiler.set_stance("fail_on_recompile"):
    print(f"warm, same shape: {cg(torch.ones(4)).tolist()}")
    try:
        cg(torch.ones(2, 2))
    except RuntimeError as err:
        print(f"new rank: {first_line(err)}")
        print(f"  failed guard: {failed_guards(str(err))}")
print(f"stance after the blocks: {dynamo.eval_frame._stance.stance}")

# %% [markdown]
# Output:
# ```text
# cold call: Detected recompile when torch.compile stance is 'fail_on_recompile'.
# warm, same shape: [2.0, 2.0, 2.0, 2.0]
# new rank: Detected recompile when torch.compile stance is 'fail_on_recompile'.
#   failed guard: ["tensor 'x' rank mismatch. expected 1, actual 2"]
# stance after the blocks: default
# ```
#
# The stance refuses *any* compile, the first one included, so the pattern for a test is:
# warm up with every shape you expect, then run the steady state under the stance. A
# recompile there (a shape that changed, a Python scalar that is not constant, a module
# attribute that flips) becomes an error naming the failed guard, instead of a slowdown
# found weeks later. Other stances: `"eager_on_recompile"` (run eagerly instead of
# recompiling) and `"force_eager"` (ignore `torch.compile` entirely, for debugging).

# %% [markdown]
# ## 5. AOTAutograd: a backward graph, and an autocast assumption
#
# Dynamo's graph holds forward torch calls only. AOTAutograd traces it down to ATen
# operators and derives the backward graph ahead of time; the backend compiles both. The
# built-in backend `aot_eager` does exactly that and runs both graphs eagerly: the way to
# check that capture and autograd tracing are right before blaming Inductor.
#
# **Predict.** For a small two-layer network in fp32, do the loss and the gradients from
# `aot_eager` agree with eager? Exactly?

# %%
def mlp_loss(x, w1, w2):
    return ((x @ w1).relu() @ w2).square().mean()  # (16, 32) @ (32, 32) @ (32, 8)


def loss_and_grads(fn, x, w1, w2):
    """fn's loss and the gradients of w1 and w2 (fresh .grad each time)."""
    w1.grad = w2.grad = None
    loss = fn(x, w1, w2)
    loss.backward()  # outside any autocast region
    return loss.detach(), w1.grad.clone(), w2.grad.clone()


xb = torch.randn(16, 32)
w1 = torch.randn(32, 32, requires_grad=True)
w2 = torch.randn(32, 8, requires_grad=True)
ref = loss_and_grads(mlp_loss, xb, w1, w2)
got = loss_and_grads(torch.compile(mlp_loss, backend="aot_eager"), xb, w1, w2)
for name, a, b in zip(["loss", "grad w1", "grad w2"], ref, got):
    print(f"{name:<8} equal {torch.equal(a, b)}  max |diff| {(a - b).abs().max().item():.1e}")

# %% [markdown]
# Output:
# ```text
# loss     equal True  max |diff| 0.0e+00
# grad w1  equal True  max |diff| 0.0e+00
# grad w2  equal True  max |diff| 0.0e+00
# ```
#
# Bit for bit: `aot_eager` runs the same ATen kernels, in the same order, as eager
# autograd. (Inductor would not be bitwise equal in general: fused kernels may round in a
# different order.)
#
# One assumption the compiled backward makes: autograd's engine runs a backward whenever
# `.backward()` is called, often outside the `autocast` block of the forward, but the
# compiled backward graph is a single function that needs one autocast state.
# `torch._functorch.config.backward_pass_autocast` chooses it; the default
# `"same_as_forward"` runs the backward under the autocast state that was active when the
# compiled forward was *called*. That matches eager when autocast covers the whole forward.
# It does not when the forward turns autocast off locally for an fp32 region: eager runs
# that region's backward in fp32, the compiled backward replays it under bf16 autocast.
#
# **Predict.** The forward below runs under bf16 autocast, with its second matmul in a
# locally disabled region (fp32 on purpose); backward runs outside autocast. With the
# default setting, do the compiled gradients match eager? With `"off"`?

# %%
def mixed_loss(x, w1, w2):
    h1 = (x @ w1).relu()  # (16, 32) bf16: autocast is on in the caller
    with torch.autocast("cpu", enabled=False):
        y = h1.float() @ w2  # (16, 8) fp32: this matmul must stay exact
    return y.square().mean()


def autocast_grads(fn):
    with torch.autocast("cpu", dtype=torch.bfloat16):  # tiny bf16 matmuls: slow on this CPU
        loss = fn(xb, w1, w2)
    w1.grad = w2.grad = None
    loss.backward()  # outside autocast, as in a usual training loop
    return w1.grad.clone(), w2.grad.clone()


def grad_gap(mode):
    """Max |compiled - eager| of the two gradients with backward_pass_autocast = mode."""
    dynamo.reset()  # else the graph compiled under the previous setting is reused
    with torch._functorch.config.patch(backward_pass_autocast=mode):
        got = autocast_grads(torch.compile(mixed_loss, backend="aot_eager"))
    return [(a - b).abs().max().item() for a, b in zip(got, eager_grads)]


eager_grads = autocast_grads(mixed_loss)
gaps = {mode: grad_gap(mode) for mode in ["same_as_forward", "off"]}
print(f"largest gradient {max(g.abs().max().item() for g in eager_grads):.2f}")
for mode, (g1, g2) in gaps.items():
    print(f"{mode:<15}: max |grad w1 gap| {g1:.4f}  max |grad w2 gap| {g2:.4f}")
print(f"restored: backward_pass_autocast = {torch._functorch.config.backward_pass_autocast!r}")

# %% [markdown]
# Output:
# ```text
# largest gradient «number»
# same_as_forward: max |grad w1 gap| «number»  max |grad w2 gap| «number»
# off            : max |grad w1 gap| 0.0000  max |grad w2 gap| 0.0000
# restored: backward_pass_autocast = 'same_as_forward'
# ```
#
# With the default, both gradients differ from eager by less than 1/32 of the largest
# gradient (the test asserts it): the size of a bf16 rounding error, since bf16 keeps 8
# significant bits. The exact values depend on the random weights and on the CPU's bf16
# kernels, so they are «number» above. The compiled
# backward ran the fp32 region's matmuls (`grad_y @ w2.T` and `h1.T @ grad_y`) under bf16
# autocast, where eager ran them in fp32; the error in the gradient of `h1` then flows on
# into `grad w1`. With `"off"` the compiled backward runs without autocast, as eager's
# did, and both gaps are exactly 0. (Had `.backward()` been called *inside* the autocast
# block, the default would have matched eager and `"off"` would not; and a forward that is
# bf16 throughout shows no gap with either setting. The lesson's tests check both.) The
# knob matters only when the forward changes the autocast state inside the compiled region.
#
# `torch._functorch.config.patch` is a context manager, so the setting is back to its
# default after the cell (last line). The size of the gap depends on the random weights;
# that it is non-zero with the default and exactly zero with `"off"` does not.

# %% [markdown]
# **Predict.** What graph does AOTAutograd hand to the compiler? Take a function with an
# in-place `add_` on an intermediate and a `silu`. Does the in-place op survive? Is `silu`
# one op or several?


# %%
def scaled_silu(x):
    y = x * 2
    y.add_(1)  # in place, on an intermediate tensor
    return F.silu(y)


def aot_forward_ops(fn, x, decompositions=None):
    """The ATen ops of the forward graph AOTAutograd gives its compiler for fn(x)."""
    seen = []

    def grab(gm, example_inputs):
        seen.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    dynamo.reset()
    torch.compile(fn, backend=aot_autograd(fw_compiler=grab, decompositions=decompositions))(x)
    return seen[0]


print(f"AOT graph:                    {aot_forward_ops(scaled_silu, torch.randn(4))}")
print(f"with core ATen decompositions: {aot_forward_ops(scaled_silu, torch.randn(4), core_aten_decompositions())}")

# %% [markdown]
# Output:
# ```text
# AOT graph:                    ['aten.mul.Tensor', 'aten.add.Tensor', 'aten.silu.default']
# with core ATen decompositions: ['aten.mul.Tensor', 'aten.add.Tensor', 'aten.sigmoid.default', 'aten.mul.Tensor']
# ```
#
# Two rewrites happen on the way down. *Functionalization* replaces every in-place op by its
# out-of-place twin: `add_` became `add`, so the graph is pure data flow and the compiler
# may reorder and fuse freely (a mutation of an *input* would also add a `copy_` back at the
# end: lesson 02 shows it). *Decomposition* rewrites ops into smaller ones from a table:
# with the core ATen table, `silu` becomes `sigmoid` and `mul`. Inductor passes a table of
# its own, so what it lowers is written in fewer, simpler ops than the model was.
# `aot_autograd` (in `torch._dynamo.backends.common`) builds such a backend from a function
# that receives each graph; `aot_eager` is one with a compiler that just runs it.
#
# **Predict.** `torch.compile(mode=...)` takes `"default"`, `"reduce-overhead"`,
# `"max-autotune"` and `"max-autotune-no-cudagraphs"`. What does each change?

# %%
for mode in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
    print(f"{mode:<27} {torch._inductor.list_mode_options(mode)}")

# %% [markdown]
# Output:
# ```text
# default                     {}
# reduce-overhead             {'triton.cudagraphs': True}
# max-autotune                {'max_autotune': True, 'triton.cudagraphs': True, 'coordinate_descent_tuning': True}
# max-autotune-no-cudagraphs  {'max_autotune': True, 'coordinate_descent_tuning': True}
# ```
#
# A mode is a bundle of Inductor settings. `reduce-overhead` turns on CUDA graphs: on a
# GPU the compiled function's kernel launches are recorded once and replayed with a single
# launch, which removes per-kernel CPU overhead (the regime of small batches). The
# `max-autotune` modes benchmark several kernel configurations (matmul templates, tile
# sizes) at compile time, so they compile much longer. These settings act on GPU code; on
# a CPU the modes change little. A replayed CUDA graph reuses its output memory: call
# `torch.compiler.cudagraph_mark_step_begin()` before each training or inference step, and
# clone an output you keep across steps (the CUDA test of this lesson records and replays
# a graph).

# %% [markdown]
# ## 6. Inductor: the first call, the generated code, its cache
#
# Eager PyTorch runs one kernel per operation: `((x * 1.5 + 0.5).relu() - 0.25) * 2.0` is
# five kernels, each reading a whole tensor and writing a new one. Inductor, the default
# backend, fuses the chain into one loop that reads `x` once and writes the result once.
#
# **Predict.** The first call of the compiled chain traces, lowers, writes C++ and compiles
# it. Seconds or milliseconds? And the same function again after `torch._dynamo.reset()`?

# %%
def chain(x):
    return ((x * 1.5 + 0.5).relu() - 0.25) * 2.0  # 5 elementwise ops


def gelu_chain(x):
    return (F.gelu(x * 1.5 + 0.5) - 0.25) * 2.0  # 5 ops, GELU computes erf


# Importing Inductor in 2.13.0 raises DeprecationWarnings inside PyTorch itself (a module it
# imports still uses `torch.jit.script_method`); Python hides them by default, and the
# course's warning gate lists them as PyTorch's own in lessons/course.toml.
import torch._inductor.compile_fx  # noqa: E402
from torch._inductor.cpu_vec_isa import pick_vec_isa  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402


def first_call(cfn, x):
    """Seconds of one call cfn(x), and the Python wrapper code Inductor generated for it.
    run_and_get_code resets Dynamo before the call, so the call always compiles (from the
    disk cache when it can)."""
    t0 = time.perf_counter()
    _, code = run_and_get_code(cfn, x)
    return time.perf_counter() - t0, code


@contextlib.contextmanager
def cache_key_log():
    """Collect AOTAutograd's debug log, which lists every entry its cache key hashes."""
    name = "torch._functorch._aot_autograd.autograd_cache"
    logger = logging.getLogger(name)
    saved = logger.level
    logger.setLevel(logging.DEBUG)  # PyTorch builds that list only when DEBUG is on
    try:
        with captured_logs(name) as records:
            yield records
    finally:
        logger.setLevel(saved)


xs = torch.randn(2048, 1024)  # (2048, 1024) fp32: 8 MiB
cchain = torch.compile(chain, dynamic=False)  # dynamic=False: one kernel per input size
with cache_key_log() as key_log:
    t_first, chain_code = first_call(cchain, xs)
print(f"chain, first call: {t_first:.2f} s")
t_again, again_code = first_call(cchain, xs)  # after a reset: the same graph again
print(f"chain, first call after a reset: {t_again:.2f} s (first / again: {t_first / t_again:.1f})")
print(f"the same code generated again: {again_code == chain_code}")
cgelu = torch.compile(gelu_chain, dynamic=False)
t_gelu, gelu_code = first_call(cgelu, xs)
print(f"gelu chain, first call: {t_gelu:.2f} s")

# %% [markdown]
# Output:
# ```text
# chain, first call: «time» s
# chain, first call after a reset: «time» s (first / again: «ratio»)
# the same code generated again: True
# gelu chain, first call: «time» s
# ```
#
# Seconds, not milliseconds, when this is the process's first compile (run the script or a
# fresh notebook; in a process that has compiled before, as a test suite has, much less).
# The first call runs the whole pipeline: Dynamo captures the
# graph, AOTAutograd turns it into ATen operators, Inductor decides what to fuse, writes a
# C++ loop for each fused group, compiles it with the system's C++ compiler and loads the
# library; the first compile in a process also sets Inductor up. How long that takes
# depends on the machine, its load and above all the disk cache: with an empty
# `TORCHINDUCTOR_CACHE_DIR` the C++ compiler runs, once the cache holds this graph's code
# it is loaded instead.
#
# `run_and_get_code` (in `torch._inductor.utils`; PyTorch's own tests use it) calls
# `torch._dynamo.reset()` before it runs the function, so each `first_call` really goes
# through the compiler. The reset throws away what Dynamo holds in memory, not the disk
# cache: the second line is the same graph compiled again in the same process, and the
# ratio says how much of the first call was one-time work (near 1 in a process that had
# paid it before). The GELU chain is a different
# graph and needs code of its own, but the per-process costs are already paid. On a CPU,
# then: keep the number of distinct compiled functions small, and keep the cache directory
# between runs, as the course's tools do. (A side effect to know: the reset before the GELU
# chain also dropped the plain chain's compiled code from memory; its next call compiles
# again, from the disk cache.)

# %% [markdown]
# **Predict.** What did Inductor make of each chain: how many kernels, how many tensors
# does the generated code allocate per call, and how many floats does its loop handle per
# step?

# %%
def kernels_and_buffers(code):
    """Kernel names and per-call allocations in Inductor's generated Python wrappers."""
    kernels = [k for src in code for k in re.findall(r"^(\w+) = async_compile", src, re.M)]
    buffers = sum(src.count("= empty_strided_cpu(") for src in code)
    return kernels, buffers


def main_loop(src):
    """The header of the first loop of the generated C++, and its step."""
    m = re.search(r"for\(int64_t x0=.*?x0\+=static_cast<int64_t>\((\d+)L\)\)", src)
    return m.group(0), int(m.group(1))


for name, code in {"chain": chain_code, "gelu chain": gelu_code}.items():
    kernels, buffers = kernels_and_buffers(code)
    print(f"{name:<10}: {len(code)} generated file, kernels {kernels}, allocations per call {buffers}")
loop, step = main_loop(chain_code[0])
isa = pick_vec_isa()  # the vector ISA Inductor compiles for (false when there is none)
lanes, bits = (isa.nelements(torch.float), isa.bit_width()) if isa else (1, 32)
print(f"chain's loop: {loop}")
print(f"floats per step: {step}; Inductor's vector registers here: {bits} bits = {lanes} floats")
print(f"ATen's CPU capability here: {torch.backends.cpu.get_cpu_capability()}")

# %% [markdown]
# Output:
# ```text
# chain     : 1 generated file, kernels ['cpp_fused_add_mul_relu_sub_0'], allocations per call 1
# gelu chain: 1 generated file, kernels ['cpp_fused_add_gelu_mul_sub_0'], allocations per call 1
# chain's loop: for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(2097152L); x0+=static_cast<int64_t>(«number»L))
# floats per step: «number»; Inductor's vector registers here: «number» bits = «number» floats
# ATen's CPU capability here: «isa»
# ```
#
# One kernel per chain, named after the operations it fused, and one allocation per call:
# the result. The four intermediate tensors that eager creates do not exist in the compiled
# code. Each generated file is a Python module (the *wrapper*: allocate the output, call the
# kernel) that carries the kernel's C++ source in a string; `run_and_get_code` returned
# their text, and `TORCH_LOGS=output_code` prints the same code as it is compiled.
#
# The third line is the header of the kernel's only loop, over all 2,097,152 elements. Each
# step loads a group of floats into one `at::vec::Vectorized<float>` register, applies the
# five operations to the whole group and stores it. The group's size is the CPU's: Inductor
# compiles for the widest vector instructions it finds (and honours the environment
# variable `ATEN_CPU_CAPABILITY`, as ATen's own kernels do). The last line is
# `torch.backends.cpu.get_cpu_capability()`, the level ATen's kernels use on your machine:
# on x86 `AVX512` goes with 16 floats per step (512-bit registers), `AVX2` with 8, and
# `DEFAULT` (no vector instructions) with a plain scalar loop, one float per step and no
# `Vectorized` at all; there, the compiled chain runs slower than eager. The lesson's test checks the step
# against `get_cpu_capability()` on the machine it runs on, and a slow test
# (`make test-slow`) checks steps and speed under a simulated AVX2 CPU and one with no
# vector instructions.

# %% [markdown]
# **Predict.** The disk cache found the chain's code again by a *key*, a hash of
# everything that should decide what code gets generated. What goes into it? Does
# anything in it say which CPU, or which vector width, the code was made for?

# %%
KEY_FIELDS = {  # entries of the cache key, and what each one is
    "gm": "the graph, as ATen operators",
    "example_inputs": "dtype, shape, stride, device of each input",
    "default_dtype": "torch.get_default_dtype()",
    "deterministic_algorithms_settings": "torch.use_deterministic_algorithms and its options",
    "cpp_runtime_thread_count": "threads the C++ kernels may use",
    "torch_version": "a hash of PyTorch's own source code",
    "system_info": "GPU model, CUDA and Triton versions (when there is a GPU)",
    "inductor_config": "Inductor's settings",
}
ISA_NAMES = re.compile(r"\b(?:avx\w*|sse\d\w*|neon|sve\d*|vsx|amx\w*)\b", re.I)


def key_entries(log):
    """(field, setting, value) for each entry of AOTAutograd's 'cache hash details' debug log:
    ('inductor_config', 'cpp.simdlen', 'None'), ('cpp_runtime_thread_count', '', '1'), ..."""
    text = next(r for r in log if "cache hash details" in r)
    return re.findall(r"^\[\w+\] (\w+)(?:\[([^\]]*)\])?: ?(.*)$", text, re.M)


entries = key_entries(key_log)
fields = {name for name, _, _ in entries}
print(f"the chain's cache key hashes {len(entries)} entries; among them:")
for name, what in KEY_FIELDS.items():
    print(f"  {name:<34} {what if name in fields else '(absent)'}")
settings = {key: value for name, key, value in entries if name == "inductor_config"}
threads = next(value for name, _, value in entries if name == "cpp_runtime_thread_count")
print(f"Inductor settings: {len(settings)}, among them cpp.simdlen = {settings['cpp.simdlen']}")
print(f"cpp_runtime_thread_count = {threads}")
print(f"entries that name an instruction set: {sum(bool(ISA_NAMES.search(v)) for *_, v in entries)}")

# %% [markdown]
# Output:
# ```text
# the chain's cache key hashes «number» entries; among them:
#   gm                                 the graph, as ATen operators
#   example_inputs                     dtype, shape, stride, device of each input
#   default_dtype                      torch.get_default_dtype()
#   deterministic_algorithms_settings  torch.use_deterministic_algorithms and its options
#   cpp_runtime_thread_count           threads the C++ kernels may use
#   torch_version                      a hash of PyTorch's own source code
#   system_info                        GPU model, CUDA and Triton versions (when there is a GPU)
#   inductor_config                    Inductor's settings
# Inductor settings: «number», among them cpp.simdlen = None
# cpp_runtime_thread_count = 1
# entries that name an instruction set: 0
# ```
#
# The key is AOTAutograd's: its cache sits in front of Inductor's own (the FX graph cache,
# whose key hashes the same details without AOTAutograd's few). It covers what is compiled
# (the ATen graph; each input's dtype, shape, stride and device), the settings that change
# the generated code (every Inductor setting, the default dtype, deterministic mode, the
# thread count) and the software (a hash of PyTorch's own source; the GPU model and the CUDA
# and Triton versions where there is a GPU). No entry names an instruction set. The setting
# `cpp.simdlen = None` means "pick the vector width from the CPU when compiling": the key
# records that rule, not what it gave on this machine.
#
# So two machines with the same PyTorch and settings compute the same key for the chain,
# while the code behind it differs (16 floats per step on one, 8 on another). A cache
# directory shared between different machines (a network home directory, a container image
# or a CI cache built on another host) hands one machine the kernels compiled for another,
# and PyTorch 2.13.0 does not notice: kernels compiled under AVX-512 and loaded under
# `ATEN_CPU_CAPABILITY=avx2` return wrong values without any error. The lesson's slow test
# reproduces that in two subprocesses with a throwaway cache; do not try it on a cache you
# use. Give each kind of machine its own `TORCHINDUCTOR_CACHE_DIR`: the course's
# portability check gives every simulated CPU an empty one.

# %% [markdown]
# **Predict.** Per call, how do eager and compiled compare with a floor that reads `x`
# once and writes once? Take two floors: `out.copy_(x)` into a tensor allocated once, and
# `x.clone()`, which allocates its result on every call as the compiled chain does. Does
# the answer change when `x` and its result no longer fit in the CPU's last-level cache?

# %%
def fastest_ms(ways, burst=1, repeats=15, budget_s=1.0):
    """Fastest wall time in ms of each function of `ways`. They take turns, `burst` calls
    each, for `repeats` rounds, or fewer (3 at least) once the rounds have taken budget_s.
    The fastest, not the median: another job on the machine only ever adds time, so the
    minimum is the least disturbed measurement. Taking turns exposes every way to the same
    load; a burst of calls lets each find the caches as its own previous call left them."""
    best, rounds, start = dict.fromkeys(ways, float("inf")), 0, time.perf_counter()
    while rounds < repeats and (rounds < 3 or time.perf_counter() - start < budget_s):
        for name, fn in ways.items():
            for _ in range(burst):
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
        rounds += 1
    return best


def page_faults(fn, calls=2):
    """Minor page faults per call of fn (after one warm-up call): pages the kernel had to map.
    None where Python has no `resource` module (Windows)."""
    if resource is None:
        return None
    fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def chain_out(x, out):
    """The chain in eager, written into a preallocated buffer: 5 passes, no allocation."""
    torch.mul(x, 1.5, out=out)
    return out.add_(0.5).relu_().sub_(0.25).mul_(2.0)


def llc_mib():
    """Size of the largest CPU cache in MiB, as Linux reports it (0 where it does not)."""
    sizes = [p.read_text().strip() for p in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size")]
    units = {"K": 2**10, "M": 2**20}
    return max((int(s[:-1]) * units.get(s[-1], 1) / 2**20 for s in sizes), default=0)


# name: (passes over memory, the floor that allocates as it does). Each pass reads a tensor
# and writes one, so the bytes moved, and the predicted time, are `passes` times the floor's.
MODEL = {"eager": (5, "clone"), "eager out=": (5, "copy_"), "compiled": (1, "clone"),
         "gelu compiled": (1, "clone")}


def measure(x, gelu=False):
    """Fastest ms of the two floors and of each way to run the chain on x. Bursts of 3 calls
    for a tensor that may fit in a cache; past it, one call per turn (they are slow)."""
    out = torch.empty_like(x)
    ways = {"copy_": lambda: out.copy_(x), "clone": lambda: x.clone(), "eager": lambda: chain(x),
            "eager out=": lambda: chain_out(x, out), "compiled": lambda: cchain(x)}
    if gelu:
        ways["gelu compiled"] = lambda: cgelu(x)
    return fastest_ms(ways, burst=3 if x.nbytes <= 16 * 2**20 else 1)


def show(x, t, faults):
    gbs = {f: 2 * x.nbytes / t[f] / 1e6 for f in ("copy_", "clone")}  # one read + one write
    print(f"x {x.nbytes / 2**20:.0f} MiB, x + result {2 * x.nbytes / 2**20:.0f} MiB:")
    print(f"  {'copy_':<13} {t['copy_']:.3f} ms, {gbs['copy_']:.1f} GB/s")
    counted = "not counted (no resource module)" if faults is None else f"{faults:.0f} page faults per call"
    print(f"  {'clone':<13} {t['clone']:.3f} ms, {gbs['clone']:.1f} GB/s, {counted}")
    for name, (passes, f) in MODEL.items():
        if name in t:
            print(f"  {name:<13} {t[name]:.3f} ms, predicted {passes} x {f}, measured {t[name] / t[f]:.1f} x")


sizes = {"small": torch.randn(2048, 1024), "large": torch.randn(8192, 2048)}  # 8 and 64 MiB
print(f"largest CPU cache: {llc_mib():.0f} MiB; page size: {mmap.PAGESIZE // 1024} KiB")
timings, faults = {}, {}
for label, xt in sizes.items():
    timings[label] = measure(xt, gelu=label == "small")
    faults[label] = page_faults(lambda: xt.clone())
    show(xt, timings[label], faults[label])
same = {label: torch.allclose(cchain(xt), chain(xt), rtol=1e-5, atol=1e-5) for label, xt in sizes.items()}
same["gelu"] = torch.allclose(cgelu(xs), gelu_chain(xs), rtol=1e-5, atol=1e-5)
print(f"compiled allclose to eager (1e-5): {same}")

# %% [markdown]
# Output:
# ```text
# largest CPU cache: «number» MiB; page size: «number» KiB
# x 8 MiB, x + result 16 MiB:
#   copy_         «time» ms, «rate» GB/s
#   clone         «time» ms, «rate» GB/s, «number» page faults per call
#   eager         «time» ms, predicted 5 x clone, measured «ratio» x
#   eager out=    «time» ms, predicted 5 x copy_, measured «ratio» x
#   compiled      «time» ms, predicted 1 x clone, measured «ratio» x
#   gelu compiled «time» ms, predicted 1 x clone, measured «ratio» x
# x 64 MiB, x + result 128 MiB:
#   copy_         «time» ms, «rate» GB/s
#   clone         «time» ms, «rate» GB/s, «number» page faults per call
#   eager         «time» ms, predicted 5 x clone, measured «ratio» x
#   eager out=    «time» ms, predicted 5 x copy_, measured «ratio» x
#   compiled      «time» ms, predicted 1 x clone, measured «ratio» x
# compiled allclose to eager (1e-5): {'small': True, 'large': True, 'gelu': True}
# ```
#
# Each time is the fastest of several calls (`fastest_ms`): another job on the machine only
# adds time. The milliseconds move with the machine and its load; read the ratios, and put
# the two sizes next to the printed cache size: where the last-level cache holds 16 MiB but
# not 128 MiB (32 MiB on the machine this lesson was written on), the 8 MiB case runs from
# the cache and the 64 MiB case from main memory.
#
# - **8 MiB.** Both floors move data at cache speed and cost about the same: `clone`
#   allocates, but the allocator hands it the block the previous call freed, already
#   mapped (no page faults). The compiled chain does one pass, as predicted, and runs close
#   to `clone` (the test asserts within 1.5 times, measuring again when a busy machine
#   disturbed the lesson's run). Eager does five passes with five fresh results and costs
#   several times more. The compiled GELU chain also makes one pass but stays well above the
#   floor: `erf` costs enough arithmetic per element that one core cannot keep up with
#   memory. Fusion removed the traffic; what remains is compute.
# - **64 MiB.** `copy_` drops to what main memory delivers (fewer GB/s than at 8 MiB), and
#   `clone` drops much further: each call gets a fresh 64 MiB mapping from the operating
#   system, and every page of it faults on first touch (the printed count; on Windows,
#   where Python has no `resource` module, the line says `not counted` instead). glibc's
#   allocator returns blocks above its mmap threshold (32 MiB at most, by default) to the
#   system when they are freed, so the next call maps them again; 8 MiB stays in the
#   process. The compiled chain allocates its result the same way and runs at `clone`'s
#   speed, many times slower than `copy_`: past the cache, the page faults of a fresh output
#   cost more than all of the arithmetic. Eager pays them five times.
# - The byte count predicts the order, not the exact ratio: how a loop stores, and what the
#   caches keep between passes, move the measured ratios (`eager out=`, five passes into a
#   buffer allocated once, is usually below 5 times `copy_`).
# - On a GPU, PyTorch's CUDA caching allocator keeps freed blocks and hands them out again
#   without asking the driver, so a fresh output costs nothing there (the CUDA test of this
#   lesson checks that `clone` keeps pace with `copy_` on a 256 MiB tensor). On a CPU,
#   reuse buffers (`out=`) for large results in hot loops.
#
# The results agree with eager to 1e-5, not necessarily bit for bit: Inductor's generated
# loop computes each function with its own code, and may round in another order.

# %% [markdown]
# ## 7. Picture it
#
# **Predict.** Drawn as bandwidth (the bytes of one read and one write of `x`, divided by
# the time of one call), which bars stand out at each size?

# %%
KINDS = ["copy_", "clone", "compiled", "eager out=", "eager"]


def plot_fusion(timings, sizes):
    """Effective bandwidth of each way to run the chain, per size: 2 * x.nbytes / time."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    width = 0.16
    for k, kind in enumerate(KINDS):
        xpos = [i + (k - 2) * width for i in range(len(timings))]
        gbs = [2 * sizes[label].nbytes / t[kind] / 1e6 for label, t in timings.items()]
        bars = ax.bar(xpos, gbs, width, label=kind)
        ax.bar_label(bars, labels=[f"{g:.0f}" for g in gbs], fontsize=7)
    ax.set_xticks(range(len(timings)), [f"x of {sizes[label].nbytes // 2**20} MiB" for label in timings])
    ax.set_yscale("log")
    ax.set_ylabel("GB/s (one read + one write of x)")
    ax.set_title("The chain on one thread: two floors, compiled, eager")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


fig = plot_fusion(timings, sizes)
fig.savefig(HERE / "fusion.png", dpi=100)
print("saved fusion.png")

# %% [markdown]
# Output:
# ```text
# saved fusion.png
# ```
#
# The figure (`fusion.png`) draws every way as a bandwidth: the bytes of one read and one
# write of `x`, divided by the time of one call, on a log scale. At 8 MiB the compiled bar
# stands next to the two floors and eager far below them. At 64 MiB the bars of everything
# that allocates its result (`clone`, compiled, eager) drop together, and `copy_`, which
# allocates nothing, stays far above them.

# %% [markdown]
# ## 8. Where to apply compile: the whole model, or each repeated block
#
# A transformer repeats one block many times. Compiling the whole model captures every
# block into one long graph; compiling each block (*regional compilation*) captures the
# block once and reuses that code, so the compile work does not grow with the depth.
#
# **Predict.** Four identical blocks (Linear + GELU) are compiled one by one with the
# counting backend. How many graphs after one forward pass without gradients? With
# gradients? And for the whole model compiled at once?


# %%
def make_blocks(n=4):
    torch.manual_seed(0)
    block = lambda: torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())  # noqa: E731
    return torch.nn.Sequential(*[block() for _ in range(n)])


def regional_graphs(grad, n=4):
    """Graphs captured when each of n blocks is compiled on its own, for one forward pass."""
    dynamo.reset()
    counting, model = CountingBackend(), make_blocks(n)
    for i, block in enumerate(model):
        model[i] = torch.compile(block, backend=counting)
    with torch.set_grad_enabled(grad):
        model(torch.randn(2, 8))  # (B, 8)
    reasons = [r for v in dynamo.utils.guard_failures.values() for r in v]
    failed = [r.splitlines()[0].split(": ", 1)[1] for r in reasons]
    return counting.graphs, failed


graphs, _ = regional_graphs(grad=False)
print(f"regional, no grad: {len(graphs)} graph, inputs {graph_inputs(graphs[0])}")
graphs, failed = regional_graphs(grad=True)
print(f"regional, grad:    {len(graphs)} graphs, failed guard: {failed}")
dynamo.reset()
whole = CountingBackend()
torch.compile(make_blocks(), backend=whole)(torch.randn(2, 8))
print(f"whole model:       {len(whole.graphs)} graph, ops {graph_ops(whole.graphs[0]).count('linear')} linear")

# %% [markdown]
# Output:
# ```text
# regional, no grad: 1 graph, inputs ['l_fn_modules_0_parameters_weight_', 'l_fn_modules_0_parameters_bias_', 'l_args_0_']
# regional, grad:    2 graphs, failed guard: ["tensor 'args[0]' requires_grad mismatch. expected requires_grad=0"]
# whole model:       1 graph, ops 4 linear
# ```
#
# The block's weight and bias are graph *inputs*, not constants, so one graph serves all
# four blocks: the other three pass its guards. With gradients there is one more: block 0
# receives the data (no `requires_grad`), blocks 1 to 3 receive an activation that requires
# grad, and `requires_grad` is guarded. Still two graphs at any depth (the test checks 8
# blocks), where the whole model is one graph as long as all its blocks together, traced
# and compiled again for each change of depth.

# %% [markdown]
# **Predict.** Compile a whole training step instead of a module: one function that runs
# the forward of two of these blocks, the loss, `loss.backward()`, Adam's `opt.step()` and
# `opt.zero_grad()`. Is it one graph? Where does Dynamo stop, and does the optimizer's
# update end up in a graph?


# %%
class AotCounting(CountingBackend):
    """Keeps each graph, like CountingBackend, and hands it to aot_eager (a real backward)."""

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def graph_breaks():
    """Dynamo's count of graph breaks by reason so far (kept whatever the log settings say)."""
    return collections.Counter(dynamo.utils.counters["graph_break"])


def max_gap(a, b):
    return max((u - v).abs().max().item() for u, v in zip(a, b))


def whole_step(model, opt, x, y):
    """One training step in one function: forward, loss, backward, update, zero the grads."""
    loss = F.mse_loss(model(x), y)  # (B, 8) against (B, 8)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def run_steps(n=3, compiled=True, **config):
    """n steps of whole_step with Adam on make_blocks(2), compiled with AotCounting under these
    Dynamo settings (restored after) or eager: the backend, its graph count after the first
    step, the graph breaks (reason -> count), and the losses and parameters at the end."""
    dynamo.reset()
    model, backend, before = make_blocks(2), AotCounting(), graph_breaks()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with dynamo.config.patch(**config):
        step = torch.compile(whole_step, backend=backend) if compiled else whole_step
        losses = [step(model, opt, xw, yw)]
        first = len(backend.graphs)
        losses += [step(model, opt, xw, yw) for _ in range(n - 1)]
    dynamo.reset()
    return backend, first, graph_breaks() - before, losses + [p.detach() for p in model.parameters()]


def break_reason(reason):
    """The first line of a graph break's reason, and the function Dynamo refused to enter."""
    skipped = re.search(r"the function `([^`]+)` should not be traced", reason)
    return reason.splitlines()[0] + (f": {skipped.group(1)}" if skipped else "")


torch.manual_seed(1)
xw, yw = torch.randn(4, 8), torch.randn(4, 8)  # (B, 8) inputs and targets
*_, eager_end = run_steps(compiled=False)
step_backend, first, step_breaks, step_end = run_steps()
print(f"3 compiled steps: {len(step_backend.graphs)} graphs, all captured in the first step: "
      f"{first == len(step_backend.graphs)}")
for i, gm in enumerate(step_backend.graphs):
    ops = graph_ops(gm)
    print(f"  graph {i}: {len(ops):>2} ops, kinds {sorted(set(ops))}")
print(f"graph breaks {step_breaks.total()}:")
for reason, count in step_breaks.items():
    print(f"  {count} x {break_reason(reason)}")
step_gap = max_gap(step_end, eager_end)
print(f"losses and parameters within 1e-5 of 3 eager steps: {step_gap < 1e-5}, "
      f"bitwise equal: {step_gap == 0}")
ca_backend, _, _, ca_end = run_steps(compiled_autograd=True)
ca_ops = graph_ops(ca_backend.graphs[1])
print(f"with compiled_autograd=True: {len(ca_backend.graphs)} graphs; graph 1 now has "
      f"{len(ca_ops)} ops, kinds {sorted(set(ca_ops))}")
print(f"  within 1e-5 of eager: {max_gap(ca_end, eager_end) < 1e-5}; "
      f"restored: compiled_autograd = {dynamo.config.compiled_autograd}")

# %% [markdown]
# Output:
# ```text
# 3 compiled steps: 3 graphs, all captured in the first step: True
#   graph 0:  5 ops, kinds ['gelu', 'linear', 'mse_loss']
#   graph 1: 76 ops, kinds ['add_', 'addcdiv_', 'copy_', 'fma.default', 'iadd', 'lerp_', 'mul', 'mul_', 'neg', 'pow', 'sqrt', 'sub', 'truediv']
#   graph 2:  1 ops, kinds ['detach']
# graph breaks 4:
#   1 x Unsupported Tensor.backward() call
#   2 x Call to `torch._dynamo.graph_break()`
#   1 x Attempted to inline function marked as skipped: Optimizer.zero_grad
# losses and parameters within 1e-5 of 3 eager steps: True, bitwise equal: False
# with compiled_autograd=True: 4 graphs; graph 1 now has 48 ops, kinds ['AccumulateGrad', 'call_aot_bwd_prologue', 'gelu_backward.default', 'getitem', 'mm.default', 'mse_loss_backward.default', 'reshape.default', 'sum.dim_IntList', 't.default', 'validate_outputs']
#   within 1e-5 of eager: True; restored: compiled_autograd = False
# ```
#
# Three graphs, not one, and four breaks. Reading the step from the top:
#
# - **Graph 0** is the forward of the two blocks and the loss (`linear`, `gelu`, `mse_loss`).
# - **`loss.backward()` breaks the graph**: Dynamo does not trace `Tensor.backward()` (its
#   message names an experimental setting, `trace_autograd_ops`, off by default). Python
#   runs it, and autograd's engine executes the backward that AOTAutograd derived for
#   graph 0, as one node (section 9's test counts such nodes).
# - **The update is a graph of its own**, and on purpose: `opt.step()` runs through
#   `_use_grad` in `torch/optim/optimizer.py`, which calls `torch._dynamo.graph_break()`
#   before the update and after it (the 2 user-inserted breaks), so that AOTAutograd sees the
#   update alone, without gradients, and keeps its in-place writes visible to the compiler
#   (its comment says why). Graph 1 holds the whole Adam update of the 4 parameters, 76 ops.
#   Between the backward and the update nothing was left to record, so that stretch made no
#   graph.
# - **`opt.zero_grad()`** is a function Dynamo is told to skip: one more break, run by
#   Python. Graph 2 is what followed it, the `detach` of the returned loss. (The line on
#   stderr, `Profiler record function ... will be ignored`, is Dynamo meeting the profiler
#   label that `opt.step()` opens: it traces the work inside and drops the label.)
#
# All three graphs were captured in the first step and reused after it. The result is
# close to eager's but not bit for bit. One reason is visible in graph 1: the traced update
# computes Adam's bias corrections on float32 tensors (the `pow`: while compiling,
# `_get_value` in `optimizer.py` keeps the step count a tensor), where eager takes the
# step count out as a Python number and does that arithmetic in double precision.
#
# What compiling the whole step adds over compiling the module is the update: one graph
# of elementwise ops over every parameter, the kind of chain Inductor fuses (section 6
# fused a chain of five into one kernel), where eager runs each op for each parameter.
# This cell's backend, `aot_eager`, generates no code: it shows the graph, not a speed-up.
# The backward is the part Dynamo never sees. *Compiled autograd*
# (`torch._dynamo.config.compiled_autograd = True`, here patched for the cell only) is for
# that: when `.backward()` runs, it captures the autograd graph that actually exists as one
# more Dynamo graph and hands it to the same backend. The last lines show it: a new graph 1
# between the forward and the update, holding the backward's ATen ops (`mm`,
# `gelu_backward`, `mse_loss_backward`) and the `AccumulateGrad` that writes each `.grad`,
# with the same result within 1e-5. It costs one more graph to capture and compile.

# %% [markdown]
# ## 9. Compile inside the data-parallel wrapper: DDP and FSDP2
#
# Lessons 09 to 13 spread training over ranks with two wrappers: DDP (every rank holds the
# whole model and all-reduces the gradients) and FSDP2 (`fully_shard`: every rank holds a
# shard and all-gathers the parameters when a block runs). Both send gradients from hooks
# that fire while autograd runs the backward. A compiled region's backward is *one*
# autograd node: every gradient it makes becomes ready at the same moment, when the whole
# node has finished. So where the compiled regions begin and end decides when the
# wrapper's hooks can fire.
#
# We need no second process to watch this: a gloo process group of *one* rank can live
# inside this process (`dist.HashStore()` is an in-memory rendezvous). Its all-reduce has
# nothing to add, but DDP and FSDP2 do all their bookkeeping, and Dynamo sees what it sees
# with many ranks. The group is destroyed, and Dynamo's settings restored, before each cell
# ends.
#
# **Predict.** A stack of four `Linear(512, 512)` + ReLU layers (1 MiB of weights each) is
# wrapped in DDP with `bucket_cap_mb=1`, a bucket size that one layer's gradients fill, and
# compiled. How many graphs does Dynamo hand the backend with the default
# `torch._dynamo.config.optimize_ddp=True`? With `False`? Does it matter whether you compile
# the DDP module, `torch.compile(DDP(model))`, or compile the model and then wrap it,
# `model.compile()` then `DDP(model)`?

# %%
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


def train_step(model, x):
    """[loss, grad of each parameter] after one forward and backward (full tensors)."""
    model.zero_grad(set_to_none=True)
    loss = model(x).square().mean()
    loss.backward()
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
    return [loss.detach()] + [g.clone() for g in grads]


def ddp_graphs(order, optimize_ddp, x, ref, cap=1):
    """Graphs captured for one DDP training step (bucket_cap_mb=cap), the gap to eager DDP's,
    and the graph breaks Dynamo met meanwhile (a Counter: reason -> count)."""
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
        gap = max_gap(train_step(ddp, x), ref)
        return counting.graphs, gap, graph_breaks() - before
    finally:
        dynamo.config.optimize_ddp = saved
        dynamo.reset()


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
            graphs, gap, breaks = ddp_runs[order, opt] = ddp_graphs(order, opt, xd, ddp_ref)
            per_graph = [graph_ops(gm).count("linear") for gm in graphs]
            print(f"{order:<21} optimize_ddp={opt!s:<5}: {len(graphs)} graphs, layers per graph "
                  f"{per_graph}, graph breaks {breaks.total()}, "
                  f"loss and grads within 1e-6 of eager DDP: {gap < 1e-6}")
print(f"dist initialized after the block: {dist.is_initialized()}, optimize_ddp: {dynamo.config.optimize_ddp}")
seq_counts = sequential_graphs()
print(f"nn.Sequential: model.compile() {seq_counts[0]} graphs, torch.compile(model) {seq_counts[1]} graph")

# %% [markdown]
# Output:
# ```text
# one layer's parameters: 1,050,624 bytes; bucket_cap_mb=1: 1,048,576 bytes
# compile(DDP(model))   optimize_ddp=True : 4 graphs, layers per graph [1, 1, 1, 1], graph breaks 3, loss and grads within 1e-6 of eager DDP: True
# compile(DDP(model))   optimize_ddp=False: 1 graphs, layers per graph [4], graph breaks 3, loss and grads within 1e-6 of eager DDP: True
# DDP(model.compile())  optimize_ddp=True : 4 graphs, layers per graph [1, 1, 1, 1], graph breaks 0, loss and grads within 1e-6 of eager DDP: True
# DDP(model.compile())  optimize_ddp=False: 1 graphs, layers per graph [4], graph breaks 0, loss and grads within 1e-6 of eager DDP: True
# dist initialized after the block: False, optimize_ddp: True
# nn.Sequential: model.compile() 0 graphs, torch.compile(model) 1 graph
# ```
#
# With `optimize_ddp` on (the default), Dynamo captured the forward as usual, then its
# *DDPOptimizer* (`torch/_dynamo/backends/distributed.py`) cut it into four graphs, one per
# layer, and handed each to the backend on its own. It walks the graph from the end (the
# order in which backward makes the gradients ready) adding up parameter bytes, and cuts
# where a bucket is full, using the DDP module's `bucket_cap_mb` (and 1 MiB for the first
# bucket from the end, `dist._DEFAULT_FIRST_BUCKET_BYTES`; the test checks a 2 MiB cap).
# Each piece gets its own compiled backward (the test counts the loss's autograd nodes:
# four `CompiledFunctionBackward` with the split, one without), so the last layer's
# gradients are ready, and DDP's hook can start their all-reduce, while the earlier
# layers' backward still runs: communication overlaps computation (the reason its
# docstring, *Note [DDPOptimizer]*, gives for the split). With `optimize_ddp=False` there
# is one graph and one backward node: every bucket's all-reduce waits for the whole
# backward. The same loss and gradients either way (within 1e-6: `aot_eager` runs the
# same kernels as eager); only the time at which communication can start differs, and
# that needs two ranks to see (lesson 13 draws overlap on a per-rank timeline).
#
# Both orders gave the same graphs. DDPOptimizer is switched on by *when* Dynamo compiles,
# not by what it was handed: Dynamo checks whether a DDP module's forward is running
# (`DistributedDataParallel._get_active_ddp_module()`), which is the case in both orders.
# They differ in the graph breaks. In `torch.compile(DDP(model))` ("wrap, then compile")
# Dynamo starts tracing in DDP's own `forward`, meets Python it does not trace there
# (DDP's bookkeeping; `TORCH_LOGS=graph_breaks` names a logger call and
# `_inside_ddp_forward`, marked not to be traced; the test checks both) and breaks the
# graph 3 times around your model's `forward`, which DDP calls and Dynamo captures as a
# frame of its own. Those pieces of DDP held no tensor operation, so the backend never
# received them. (Tracing DDP's `forward`, Dynamo also met the profiler `record_function`
# that DDP opens to label its work, and ignored it. It says so on stderr once per process:
# in this script already at section 8's `opt.step()`, which opens one too.) Compiling the
# model and then wrapping it left DDP's `forward` to run eagerly: no break at all. That is
# the order PyTorch's page *Where to apply torch.compile?* recommends, saying that `torch.compile` does not handle
# distributed wrappers like DDP or FSDP very well; torchtitan does the same, compiling
# each transformer block and then applying its data-parallel wrapper.
#
# The last line is why `Stack` is a class of our own. `model.compile()` installs
# `torch.compile(model._call_impl)`; for an `nn.Sequential` of torch's layers, that method
# and every `forward` below it live in torch's files, which Dynamo skips as starting
# frames, so it captured nothing and the model ran eagerly, with no error or warning
# (pytorch/pytorch#150915). `torch.compile(model)` wraps the module itself and captures it.
# Count your graphs (a counting backend, or `TORCH_LOGS=graph`) before trusting either.
#
# **Predict.** FSDP2 the way torchtitan does it: compile each of four residual blocks, then
# `fully_shard` each block, then the root. How many graphs? Do FSDP's all-gathers appear in
# them? What does a graph receive for the weights: the sharded `DTensor`s that rest on the
# module, or plain tensors?

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
# Two graphs for four blocks, as in section 8 (block 0's input does not require grad, the
# others' do: the test finds that guard's failure), holding only the block's own `linear`, `relu` and `add`: no collective. The
# parameters rest on the module as sharded `DTensor`s, and the graphs receive plain
# `Parameter`s and `Tensor`s, no `DTensor`: as `fully_shard`'s docstring describes, FSDP's
# forward pre-hook all-gathers the shards into full parameters *before* the block's graph
# runs and its forward hook frees them after; in backward its hooks all-gather again and
# reduce-scatter the block's gradients once that block's compiled backward has run.
# That is the reason for the order. Compiled inside the `fully_shard` wrap, each region is
# one block: FSDP keeps scheduling its collectives block by block around it, exactly as in
# eager (lesson 11), and the identical blocks share their graphs (two here; the test checks
# that eight blocks give two as well). FSDP2 keeps its hooks out of every graph: it wraps
# each of them in `torch._dynamo.disable` (`_dynamo_disable`, in
# `torch/distributed/fsdp/_fully_shard/_fsdp_common.py`). So a `torch.compile` of the
# whole sharded model does not make one graph of it either: Dynamo breaks the graph where a
# block's hooks are called, inside the root's loop, gives up on the root's `forward` (it
# runs eagerly) and captures only each block's `forward` (the test checks that it gave
# these same two graphs, and none with the head). Activation checkpointing goes on before
# the compile, tensor parallelism before both (lesson 13 composes them with FSDP2):
# torchtitan's order is TP, activation checkpointing, compile each block, then
# `fully_shard` each block and the root.

# %% [markdown]
# ## Where next: structured logs and ahead-of-time compilation
#
# On a real model the tools of this lesson print too much to read: hundreds of graphs,
# guards and recompiles. `TORCH_TRACE=/some/dir python train.py` makes every compile in the
# process write a *structured log* there instead: one line of JSON per event, with what
# belongs to it (a graph, its guards, a reason) on the lines below. PyTorch reads the
# variable once, when `torch` is imported, so we run a small compile in a fresh Python
# process.
#
# **Predict.** The child process compiles `f`, which has a graph break, then calls it with a
# new dtype. How many compiles does the log record, and what does each one say?

# %%
TRACED = textwrap.dedent("""
    import torch

    def f(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y * 2

    cf = torch.compile(f, backend="eager")
    cf(torch.ones(3))
    cf(torch.ones(3, dtype=torch.float64))  # a new dtype: a recompile
""")


def torch_trace(code, folder):
    """Run code in a fresh Python process with TORCH_TRACE=folder; the files it wrote."""
    env = {**os.environ, "TORCH_TRACE": str(folder), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return sorted(Path(folder).iterdir())


def trace_events(text):
    """The events of a structured log: one JSON object per line that does not start with a
    tab (the lines below an event, tab-indented, hold its payload)."""
    lines = text.splitlines()
    return [json.loads(ln[ln.index("{"):]) for ln in lines if not ln.startswith("\t") and "{" in ln]


with tempfile.TemporaryDirectory() as folder:
    trace_files = torch_trace(TRACED, folder)
    trace_text = trace_files[0].read_text()
events = trace_events(trace_text)
names = [re.sub(r"^(dedicated_log_torch_trace_)\w+(\.log)$", r"\1<random>\2", p.name) for p in trace_files]
print(f"TORCH_TRACE wrote {len(trace_files)} file: {names}")  # <random>: tempfile's random part
kinds = collections.Counter(next(iter(e)) for e in events)  # an event's first key: its kind
artifacts = collections.Counter(e["artifact"]["name"] for e in events if "artifact" in e)
for m in (e["compilation_metrics"] for e in events if "compilation_metrics" in e):
    print(f"compile {m['compile_id']} of {m['co_name']}: {m['graph_op_count']} graph op, "
          f"recompile reason: {m['recompile_reason']}")
print("events: " + ", ".join(f"{k} {kinds[k]}" for k in ["dynamo_start", "dynamo_output_graph",
                                                          "dynamo_cpp_guards_str", "compilation_metrics"]))
print("among the artifacts: " + ", ".join(f"{k} {artifacts[k]}" for k in ["dynamo_graph_break_reason",
                                                                           "recompile_reasons"]))

# %% [markdown]
# Output:
# ```text
# TORCH_TRACE wrote 1 file: ['dedicated_log_torch_trace_<random>.log']
# compile 0/0 of f: 1 graph op, recompile reason: None
# compile 1/0 of torch_dynamo_resume_in_f_at_6: 1 graph op, recompile reason: None
# compile 0/1 of f: 1 graph op, recompile reason: 0/0: tensor 'x' dtype mismatch. expected Float, actual Double
# compile 1/1 of torch_dynamo_resume_in_f_at_6: 1 graph op, recompile reason: 1/0: tensor 'y' dtype mismatch. expected Float, actual Double
# events: dynamo_start 4, dynamo_output_graph 4, dynamo_cpp_guards_str 4, compilation_metrics 4
# among the artifacts: dynamo_graph_break_reason 2, recompile_reasons 2
# ```
#
# One file per process, named at random. Four compiles: `f` and its continuation after the
# break (`torch_dynamo_resume_in_f_at_6`, line 6 of the child's code), each captured once
# for float32 and once again for float64, with the guard that failed written next to the
# recompile, as section 1 read it from `guard_failures`. Each compile logs its start, its
# graph, its guards and a record of metrics (`compilation_metrics`: op and guard counts,
# times, cache hits, the reasons); artifacts carry longer texts, such as each graph
# break's reason with its line. The file is written for a program: `tlparse`, a separate
# tool not installed in the course's environment (`pip install tlparse`), turns it into a
# browsable report. It is the first thing to collect when a large model compiles slowly or
# recompiles often.
#
# - AOTInductor (`torch._inductor.aoti_compile_and_package`, with a graph from
#   `torch.export`) runs the same Inductor pipeline ahead of time and writes the result to a
#   package file, for serving a model without Dynamo's tracing at start-up. This lesson does
#   not run it (it compiles for tens of seconds); the test only checks that 2.13.0 has it.

# %% [markdown]
# ## Summary
#
# - `torch.compile` = Dynamo (bytecode captured into FX graphs, plus guards) → AOTAutograd
#   (ATen graphs, forward and backward) → a backend. A backend of your own sees each graph;
#   `backend="eager"` and `"aot_eager"` check capture without generating code.
# - Guards decide reuse. A Python scalar is a constant guarded by value until it changes;
#   a new shape recompiles once and then becomes a symbolic size (`dynamic=None`).
#   `dynamic=False` recompiles per shape until `recompile_limit` (8), then silently runs
#   eagerly. `TORCH_LOGS=recompiles` names the guard that failed.
# - Graph breaks (`print`, `.item()`, data-dependent branches) split a function into graphs
#   with Python in between; `torch._dynamo.explain` lists them with reasons;
#   `fullgraph=True` makes the first one an error.
# - `set_stance("fail_on_recompile")` refuses every compile, the first included: warm up,
#   then guard the steady state in tests.
# - `aot_eager` matches eager bit for bit. The compiled backward runs under the forward's
#   autocast state by default (`backward_pass_autocast="same_as_forward"`): wrong when the
#   forward disables autocast locally and backward runs outside it; `"off"` fixes that case.
# - Inductor fuses an elementwise chain into one loop, as wide as the CPU's vectors, that
#   reads once and writes once: close to a `clone`, several times faster than eager;
#   compute-heavy ops (erf) stay above that floor. Past the last-level cache a fresh large
#   output costs page faults, compiled or not; preallocated buffers avoid them.
# - The first call costs seconds on a CPU; the disk cache makes later runs cheaper. Its key
#   holds the graph, the settings and the versions but not the CPU's instruction set: one
#   cache directory per kind of machine. `torch._inductor.utils.run_and_get_code` returns
#   the generated code; `TORCH_LOGS=output_code` prints it.
# - AOTAutograd's graph is functional (`add_` becomes `add`) and decomposed by a table;
#   `mode=` is a bundle of Inductor settings (`reduce-overhead` = CUDA graphs). Compiling
#   each repeated block reuses one graph (two with gradients) whatever the depth.
# - This training step, compiled whole, made three graphs: forward and loss, the
#   optimizer's update (cut out on purpose by `torch.optim`) and the rest.
#   `loss.backward()` is a graph break; compiled autograd captures the backward as one more
#   graph when it runs.
# - Under DDP, Dynamo cuts the graph where DDP's buckets end (`optimize_ddp=True`, the
#   default), so each bucket's all-reduce can start during backward; it does so whether
#   you compile the DDP module or the model inside it, but only the first breaks the graph
#   inside DDP's own `forward`. With FSDP2, compile each block, then `fully_shard` each
#   block and the root: FSDP's hooks, never traced, stay outside the graphs.
#   `model.compile()` on an `nn.Sequential` of torch's layers captures nothing: count graphs.
# - `TORCH_TRACE=dir` (read when `torch` is imported) makes every compile write a structured
#   log: one JSON event per line, each compile's graph, guards and metrics, with its
#   recompile reason; `tlparse` renders it as a report.
# - On a GPU, this lesson's tests compare compiled and eager, check the caching allocator
#   against the `clone` floor, and prove that `mode="reduce-overhead"` records and replays a
#   CUDA graph: `make test-gpu`.

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each path is relative to the folder that holds your installed
# `torch` (your site-packages), and the line numbers are those of your installation. The
# stops follow one compiled call: the frame hook and the stance that decides what it does,
# where a graph breaks, how a failed guard is named, AOTAutograd's staging, Inductor's
# lowering, and the graph split that DDP gets.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/_dynamo/eval_frame.py", "def _callback_from_stance(",
     "A compiled function is `compile_wrapper`, in `_TorchDynamoContext.__call__` below: around "
     "each call it installs Dynamo's frame hook with "
     "`_maybe_set_eval_frame(_callback_from_stance(callback))`, so the stance is read at every "
     "call, not when `torch.compile` ran. Here `force_eager` turns the callback into None (no "
     "Dynamo), `eager_on_recompile` into False (run what is cached, compile nothing) and "
     "`fail_on_recompile` into `fail_callback`, which raises section 4's `Detected recompile ...` "
     "with the failed guards for a frame that holds tensors. The hook calls it only when no "
     "cached graph's guards pass, so a first compile raises too."),
    ("torch/_dynamo/symbolic_convert.py", "def break_graph_if_unsupported(",
     "The decorator on the bytecode handlers that may break a graph (`CALL`, `COMPARE_OP`, "
     "`STORE_ATTR`, ...). When tracing the instruction raises `Unsupported`, `wrapper` logs the "
     "graph break and restarts the analysis; on the second pass `handle_graph_break` compiles "
     "the graph traced so far (`compile_subgraph`), emits the instruction itself for Python to "
     "run, then a call to a generated function that resumes tracing after it "
     "(`create_call_resume_at`): section 3's 3 graphs and 2 breaks. With `fullgraph=True`, "
     "`should_compile_partial_graph()` is False and the `Unsupported` is raised instead."),
    ("torch/_dynamo/guards.py", "def get_guard_fail_reason(",
     "Called for each cached graph when a call passes none of them, by "
     "`get_and_maybe_log_recompilation_reasons` below (what `TORCH_LOGS=recompiles` prints). "
     "`get_guard_fail_reason_helper`, above, reruns the graph's guards verbosely, keeps the "
     "first that failed, the guard's own code (section 1's `scale == 2.0`) or a tensor check's "
     "message (section 4's `tensor 'x' rank mismatch ...`), and puts the compile id in front "
     "(`0/0: `). This function appends that line to `guard_failures`, the record section 1 "
     "reads, unless `skip_logging` is set, as the `fail_on_recompile` stance does."),
    ("torch/_functorch/aot_autograd.py", "def aot_module_simplified(",
     "What `aot_eager`, section 5's `aot_autograd(fw_compiler=...)` and Inductor all call with "
     "Dynamo's graph. With a compiler that can be serialized (Inductor's) it first asks "
     "AOTAutograd's cache, `AOTAutogradCache.try_load`, whose key section 6 listed. Otherwise "
     "`create_aot_state` (its docstring outlines the plan) and `aot_stage1_graph_capture` trace "
     "the ATen graph, joint forward and backward when gradients are needed, functionalized and "
     "decomposed (section 5: `add_` became `add`; with the core table `silu` became `sigmoid` "
     "and `mul`). When gradients are needed, `aot_stage2_compile` then splits the joint graph "
     "with `partition_fn` and hands forward and backward to their compilers, wrapped in one "
     "`torch.autograd.Function`; without gradients one forward graph goes to the inference "
     "compiler."),
    ("torch/_inductor/compile_fx.py", "def compile_fx(",
     "Inductor as a backend (`backend=\"inductor\"` calls it; its docstring says it calls into "
     "AOTAutograd). `_compile_fx_main`, below, wraps `compile_fx_inner` as the forward and "
     "backward compilers and passes Inductor's own decomposition table "
     "(`select_decomp_table()`) to the same `aot_autograd` helper section 5 used. The lowering "
     "is `_InProcessFxCompile.codegen_and_compile`: `GraphLowering(gm, ...)`, "
     "`graph.run(*example_inputs)` over the ATen graph, then `graph.compile_to_module()`, which "
     "generates section 6's wrapper and kernel and loads them. It runs only when neither "
     "AOTAutograd's cache nor Inductor's FX graph cache already holds the graph."),
    ("torch/_dynamo/backends/distributed.py", "class DDPOptimizer:",
     "Its docstring, Note [DDPOptimizer], gives the reason for section 9's split: one compiled "
     "backward makes every gradient ready at once. `compile_fn` walks the forward graph from "
     "the end, adds the bytes of each parameter a node uses to the current bucket and, once "
     "that bucket holds `bucket_bytes_cap` bytes (the first from the end: `first_bucket_cap`, "
     "by default `dist._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB) and feeds a later node, starts a "
     "new one. With more than one bucket it splits the graph (`split_module`) and compiles "
     "each piece with your backend: section 9's four graphs. `CatchErrorsWrapper.__call__` in "
     "`convert_frame.py` puts it in place while a DDP module's forward runs."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/_dynamo/eval_frame.py:«line»  `def _callback_from_stance(`
#     A compiled function is `compile_wrapper`, in `_TorchDynamoContext.__call__` below:
#     around each call it installs Dynamo's frame hook with
#     `_maybe_set_eval_frame(_callback_from_stance(callback))`, so the stance is read at
#     every call, not when `torch.compile` ran. Here `force_eager` turns the callback into
#     None (no Dynamo), `eager_on_recompile` into False (run what is cached, compile
#     nothing) and `fail_on_recompile` into `fail_callback`, which raises section 4's
#     `Detected recompile ...` with the failed guards for a frame that holds tensors. The
#     hook calls it only when no cached graph's guards pass, so a first compile raises
#     too.
# torch/_dynamo/symbolic_convert.py:«line»  `def break_graph_if_unsupported(`
#     The decorator on the bytecode handlers that may break a graph (`CALL`, `COMPARE_OP`,
#     `STORE_ATTR`, ...). When tracing the instruction raises `Unsupported`, `wrapper`
#     logs the graph break and restarts the analysis; on the second pass
#     `handle_graph_break` compiles the graph traced so far (`compile_subgraph`), emits
#     the instruction itself for Python to run, then a call to a generated function that
#     resumes tracing after it (`create_call_resume_at`): section 3's 3 graphs and 2
#     breaks. With `fullgraph=True`, `should_compile_partial_graph()` is False and the
#     `Unsupported` is raised instead.
# torch/_dynamo/guards.py:«line»  `def get_guard_fail_reason(`
#     Called for each cached graph when a call passes none of them, by
#     `get_and_maybe_log_recompilation_reasons` below (what `TORCH_LOGS=recompiles`
#     prints). `get_guard_fail_reason_helper`, above, reruns the graph's guards verbosely,
#     keeps the first that failed, the guard's own code (section 1's `scale == 2.0`) or a
#     tensor check's message (section 4's `tensor 'x' rank mismatch ...`), and puts the
#     compile id in front (`0/0: `). This function appends that line to `guard_failures`,
#     the record section 1 reads, unless `skip_logging` is set, as the `fail_on_recompile`
#     stance does.
# torch/_functorch/aot_autograd.py:«line»  `def aot_module_simplified(`
#     What `aot_eager`, section 5's `aot_autograd(fw_compiler=...)` and Inductor all call
#     with Dynamo's graph. With a compiler that can be serialized (Inductor's) it first
#     asks AOTAutograd's cache, `AOTAutogradCache.try_load`, whose key section 6 listed.
#     Otherwise `create_aot_state` (its docstring outlines the plan) and
#     `aot_stage1_graph_capture` trace the ATen graph, joint forward and backward when
#     gradients are needed, functionalized and decomposed (section 5: `add_` became `add`;
#     with the core table `silu` became `sigmoid` and `mul`). When gradients are needed,
#     `aot_stage2_compile` then splits the joint graph with `partition_fn` and hands
#     forward and backward to their compilers, wrapped in one `torch.autograd.Function`;
#     without gradients one forward graph goes to the inference compiler.
# torch/_inductor/compile_fx.py:«line»  `def compile_fx(`
#     Inductor as a backend (`backend="inductor"` calls it; its docstring says it calls
#     into AOTAutograd). `_compile_fx_main`, below, wraps `compile_fx_inner` as the
#     forward and backward compilers and passes Inductor's own decomposition table
#     (`select_decomp_table()`) to the same `aot_autograd` helper section 5 used. The
#     lowering is `_InProcessFxCompile.codegen_and_compile`: `GraphLowering(gm, ...)`,
#     `graph.run(*example_inputs)` over the ATen graph, then `graph.compile_to_module()`,
#     which generates section 6's wrapper and kernel and loads them. It runs only when
#     neither AOTAutograd's cache nor Inductor's FX graph cache already holds the graph.
# torch/_dynamo/backends/distributed.py:«line»  `class DDPOptimizer:`
#     Its docstring, Note [DDPOptimizer], gives the reason for section 9's split: one
#     compiled backward makes every gradient ready at once. `compile_fn` walks the forward
#     graph from the end, adds the bytes of each parameter a node uses to the current
#     bucket and, once that bucket holds `bucket_bytes_cap` bytes (the first from the end:
#     `first_bucket_cap`, by default `dist._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB) and feeds
#     a later node, starts a new one. With more than one bucket it splits the graph
#     (`split_module`) and compiles each piece with your backend: section 9's four graphs.
#     `CatchErrorsWrapper.__call__` in `convert_frame.py` puts it in place while a DDP
#     module's forward runs.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Tell them apart.** Three reports about compiled code: (a) one call of a function
#    became three graphs; (b) a later call captured again although the function had not
#    changed; (c) the first call spent its time after capture, with no more graphs than
#    before. Which is a graph break, which a guard failure, which kernel compilation, and
#    which tool of this lesson names the cause of each?
#
#    <details><summary>Answer</summary>
#
#    (a) Graph breaks: inside one call Dynamo met what it cannot record and split there.
#    `torch._dynamo.explain(h)` printed `graphs 3, graph breaks 2`, with a reason and a line
#    for each break (the `print`: `Failed to trace builtin operator`; `.item()`:
#    `Unsupported Tensor.item() call ...`), and `fullgraph=True` turned the first break into
#    `torch._dynamo.exc.Unsupported` (*§ Graph breaks*). (b) A guard failure: a new call
#    broke a fact the cached graph relied on. With `scale` 2.0 then 3.0, Dynamo's record
#    named the guard, `['scale == 2.0']`, and graph 1 takes `scale` as an input
#    (*§ Capture: what the backend receives*); under `fail_on_recompile` such a failure
#    raises and names its guard, `tensor 'x' rank mismatch. expected 1, actual 2`
#    (*§ A guard for tests: `fail_on_recompile`*); a structured log records it with the
#    compile, `recompile reason: 0/0: tensor 'x' dtype mismatch. expected Float, actual
#    Double` (*§ Where next: structured logs and ahead-of-time compilation*). (c) Kernel
#    compilation: the backend's work on a graph already captured. `run_and_get_code`
#    returned one generated file with one fused kernel, `cpp_fused_add_mul_relu_sub_0`,
#    and the same code again after
#    `torch._dynamo.reset()` (*§ Inductor: the first call, the generated code, its cache*).
#
#    </details>
#
# 2. **Predict.** A function compiled with `dynamic=False` is called on 1-D inputs of
#    twelve different lengths. How many graphs, and what happens to the calls past the
#    limit? With the default `dynamic=None`?
#
#    <details><summary>Answer</summary>
#
#    8 graphs, the `recompile_limit`: Dynamo logged
#    `torch._dynamo hit config.recompile_limit (8)` once and captured nothing for the other
#    four calls, which still returned eager's values (the cell asserts every call against
#    eager). No error, just no compiled code. With `dynamic=None` there are 2 graphs: the first for length 2,
#    then one whose inputs start with a symbolic size, `['s77', 'l_x_']`, that served every
#    later length; `dynamic=True` starts symbolic, 1 graph
#    (*§ Guards on shapes: one recompile, then a dynamic dimension*).
#
#    </details>
#
# 3. **Spot the bug.** A test wants to prove that a compiled model never recompiles:
#    `cm = torch.compile(model)`, then, inside
#    `with torch.compiler.set_stance("fail_on_recompile"):`, it calls `cm` on batches that all
#    have one shape. It fails on the first batch with `Detected recompile`. Why, and what is
#    the fix?
#
#    <details><summary>Answer</summary>
#
#    The stance refuses every compile, the first one included: the cold call raised that
#    same message. Warm up outside the block, once per shape you expect, then enter it.
#    After a warm-up the same shape ran (`[2.0, 2.0, 2.0, 2.0]`) and only a real recompile
#    raised, naming its guard (`tensor 'x' rank mismatch. expected 1, actual 2`); the stance
#    was `default` again after the blocks (*§ A guard for tests: `fail_on_recompile`*).
#
#    </details>
#
# 4. **Spot the bug.** A forward runs under `torch.autocast("cpu", dtype=torch.bfloat16)`
#    and turns autocast off around one matmul that must stay in fp32; `.backward()` is
#    called after the autocast block. Compiled, the gradients differ from eager's. Which
#    stage is responsible, and which setting fixes it?
#
#    <details><summary>Answer</summary>
#
#    AOTAutograd's compiled backward, not the capture: with `aot_eager` an fp32 model
#    without autocast gave loss and gradients equal to eager's bit for bit (`equal True`).
#    The compiled backward runs under one autocast state,
#    `torch._functorch.config.backward_pass_autocast`, by default `"same_as_forward"`: the
#    state active when the compiled forward was called, bf16 here. Both gradient gaps were
#    then non-zero and below 1/32 of the largest gradient (the test asserts both), and with
#    `"off"` both were `0.0000`
#    (*§ AOTAutograd: a backward graph, and an autocast assumption*).
#
#    </details>
#
# 5. **Predict.** Four `Linear(512, 512)` layers, 1,050,624 bytes of parameters each, are
#    trained under DDP with `bucket_cap_mb=1`, compiled either as `torch.compile(DDP(model))`
#    or as `model.compile()` then `DDP(model)`. How many graphs does the backend receive,
#    and does the order matter? Compiled block by block under FSDP2, what do the graphs
#    receive as weights?
#
#    <details><summary>Answer</summary>
#
#    Four graphs of one layer each, in both orders, with the default `optimize_ddp=True`:
#    Dynamo cut the graph where a bucket of 1 MiB fills, and with `optimize_ddp=False` it
#    was one graph of four layers; the loss and gradients were within 1e-6 of eager DDP's
#    every time. The order changed only the graph breaks: 3 inside DDP's own `forward` when
#    the DDP module was compiled, none when the model was compiled and then wrapped. Under
#    FSDP2 the four compiled blocks gave 2 graphs holding only `linear`, `relu` and `add`,
#    no collective, and while the weights rest on the module as `DTensor`s the graphs
#    received `Parameter`s and `Tensor`s: the all-gather runs outside the graphs, in FSDP's
#    hooks (*§ Compile inside the data-parallel wrapper: DDP and FSDP2*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder:
#
# 1. `h_fullgraph(x)`: rewrite section 3's `h` (without its `print`) so that it returns the
#    same values and compiles with `fullgraph=True` into a single graph. Hint: choose
#    between the two results with a tensor operation instead of a Python `if`.
# 2. `scale_arg(scale)`: what to pass as `f`'s `scale` so that `f` compiled with
#    `dynamic=False` captures one graph for any number of different scales and still gives
#    the values of `f(x, scale)`.
#
# Check your answers with `make exercises N=08`: the tests compile your code with a
# counting backend (no Inductor) and compare with eager. `solutions.py` has one way.
#
# Without tests: run this script with `TORCH_LOGS=recompiles,graph_breaks` and match each
# log line to a cell.

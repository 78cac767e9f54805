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
# - what Inductor makes of an elementwise chain (one fused C++ kernel), what that buys on a
#   CPU against a one-read-one-write floor, and what the first call costs.
#
# **Prerequisites:** lesson 02 (ATen operators and the dispatcher), lesson 03 (autograd),
# lesson 05 (autocast); lesson 06 for honest timing.
#
# **How to run:** `python lessons/08_compile/compile.py` or `make lesson N=08` from the
# repository root, or open `compile.ipynb`. Everything runs on the CPU: the outputs below are
# CPU facts (C++ kernels, CPU autocast), and the GPU comparisons live in the tests
# (`make test-gpu`). Only section 6 runs Inductor: its first call compiles C++ and takes
# seconds (6–9 s here with an empty cache, 1–2 s with a warm one); the course tools point
# `TORCHINDUCTOR_CACHE_DIR` at `build/inductor-cache` so that later runs reuse the
# generated code. Each printing cell is followed by an *Output* block: what it printed with
# the pinned PyTorch (2.13.0), checked by `make test`. Timings appear there as `«time»` and
# `«ratio»`: they change from run to run.
#
# Several tools here are private (`torch._dynamo`, `torch._functorch.config`,
# `torch._logging`, Inductor's code cache): PyTorch's compile troubleshooting guides use
# most of them, and this lesson's tests pin what they print, so a change in a new release
# shows up there.

# %%
import contextlib
import logging
import re
import time
from pathlib import Path
from unittest import mock

import matplotlib.pyplot as plt
import torch
import torch._dynamo as dynamo
import torch.nn.functional as F

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


@contextlib.contextmanager
def recompile_reasons():
    """Collect the guard failures behind each recompile (what TORCH_LOGS=recompiles shows)."""
    torch._logging.set_logs(recompiles=True)
    try:
        with captured_logs("torch._dynamo.guards.__recompiles") as records:
            yield records
    finally:
        torch._logging.set_logs()  # back to the default log settings


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
with recompile_reasons() as reasons:
    for scale in [2.0, 2.0, 3.0]:
        out = cf(x, scale)
        print(f"scale {scale}: graphs so far {len(counting.graphs)}, "
              f"same as eager {torch.equal(out, f(x, scale))}")
for i, gm in enumerate(counting.graphs):
    print(f"graph {i}: inputs {graph_inputs(gm)}  ops {graph_ops(gm)}")
print(f"recompiles {len(reasons)}, failed guard: {failed_guards(reasons[0])}")

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
# graph. The third failed it, and the recompile log says exactly which guard failed (we read
# it from the `recompiles` log, the same text `TORCH_LOGS=recompiles` prints).
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
# With the default, both gradients differ from eager by about 0.12 (on gradients up to 33,
# that is the size of a bf16 rounding error: bf16 keeps 8 significant bits; the exact
# values depend on the CPU's bf16 kernels, so they are «number» above). The compiled
# backward ran the fp32 region's matmuls (`grad_y @ w2.T` and `h1.T @ grad_y`) under bf16
# autocast, where eager ran them in fp32; the error in the gradient of `h1` then flows on
# into `grad w1`. With `"off"` the compiled backward runs without autocast, as eager's
# did, and both gaps are exactly 0. (Had `.backward()` been called *inside* the autocast
# block, the default would have matched eager and `"off"` would not.) A forward that is
# bf16 throughout shows no gap with either setting: the knob matters only when the forward
# changes the autocast state inside the compiled region.
#
# `torch._functorch.config.patch` is a context manager, so the setting is back to its
# default after the cell (last line). The issue for this lesson measured a gap of about
# 0.25 on another instance of the same construction: the size depends on the random
# weights; that it is non-zero with the default and exactly zero with `"off"` does not.

# %% [markdown]
# ## 6. Inductor: fusion on a CPU, and the first call
#
# Eager PyTorch runs one kernel per operation: `((x * 1.5 + 0.5).relu() - 0.25) * 2.0` is
# five kernels, each reading a full tensor from memory and writing a new one. Inductor
# fuses the chain into one loop that reads `x` once and writes the result once. No loop can
# do less than that, so the lesson's floor is one read and one write: a copy into a
# preallocated tensor (`out.copy_(x)`; a `clone()` would also allocate, and on this machine a
# fresh 16 MiB allocation can cost more in page faults than the copy itself).
#
# **Predict.** The first call of the compiled chain traces, lowers, writes C++ and compiles
# it. Seconds or milliseconds? And the same function again after `torch._dynamo.reset()`?

# %%
def chain(x):
    return ((x * 1.5 + 0.5).relu() - 0.25) * 2.0  # 5 elementwise ops


def gelu_chain(x):
    return (F.gelu(x * 1.5 + 0.5) - 0.25) * 2.0  # 5 ops, GELU computes erf


def first_call(fn, x):
    """fn compiled with Inductor (the default backend), and its first call's seconds."""
    cfn = torch.compile(fn)
    t0 = time.perf_counter()
    cfn(x)
    return cfn, time.perf_counter() - t0


# Importing Inductor in 2.13.0 raises DeprecationWarnings inside PyTorch itself (a module it
# imports still uses `torch.jit.script_method`); Python hides them by default, and the
# course's warning gate lists them as PyTorch's own in lessons/course.toml.
import torch._inductor.compile_fx  # noqa: F401, E402

from torch._inductor.codecache import PyCodeCache  # noqa: E402  loads the generated code


@contextlib.contextmanager
def loaded_wrappers():
    """Record the files of the generated Python wrappers Inductor loads (new or cached)."""
    paths, load = [], PyCodeCache.load_by_key_path

    def spy(key, path, *args, **kwargs):
        paths.append(path)
        return load(key, path, *args, **kwargs)

    with mock.patch.object(PyCodeCache, "load_by_key_path", staticmethod(spy)):
        yield paths


xs = torch.randn(2048, 2048)  # (2048, 2048) fp32: 16 MiB, far more than a core's L2 cache
with loaded_wrappers() as chain_files:
    cchain, t_first = first_call(chain, xs)
print(f"chain, first call: {t_first:.2f} s")
dynamo.reset()  # drops the code Dynamo holds; the on-disk cache stays
cchain, t_again = first_call(chain, xs)
print(f"chain, first call after reset: {t_again:.2f} s")
with loaded_wrappers() as gelu_files:
    cgelu, t_gelu = first_call(gelu_chain, xs)
print(f"gelu chain, first call: {t_gelu:.2f} s")

# %% [markdown]
# Output:
# ```text
# chain, first call: «time» s
# chain, first call after reset: «time» s
# gelu chain, first call: «time» s
# ```
#
# Seconds, not milliseconds. The first call runs the whole pipeline: Dynamo captures the
# graph, AOTAutograd turns it into ATen operators, Inductor decides what to fuse, writes a
# C++ loop for each fused group, compiles it with the system's C++ compiler and loads the
# library. On this 2-core machine the first call took 6–9 s with an empty cache and
# 1–2 s with a warm one. (The issue for this lesson measured 10–14 s and 4–6 s while other
# jobs were running, including the import of Inductor, 1.5–4.5 s on its own; here section
# 5's `aot_eager` loaded part of Inductor and the cell imports the rest before starting
# the clock.) *Warm* means that the FX graph cache under
# `TORCHINDUCTOR_CACHE_DIR` already holds this graph's generated code, found by a hash of
# the graph, its inputs' metadata, the configuration and the versions; the C++ build is
# skipped, and what remains is tracing and one-time set-up.
#
# `torch._dynamo.reset()` throws away the code Dynamo holds (`cchain` has to capture
# again), not the disk cache: the same function compiles again in a small fraction of the
# first time. A second, different function (the GELU chain) is also much cheaper than the
# first, because the per-process costs are paid. On a CPU, then: keep the number of
# distinct compiled functions small, and share one cache directory between runs, as the
# course's tools do.

# %% [markdown]
# **Predict.** What did Inductor make of each chain: how many kernels, and how many
# tensors does the generated code allocate per call?

# %%
def kernels_and_buffers(paths):
    """Kernel names and per-call allocations in Inductor's generated Python wrappers."""
    sources = [Path(p).read_text() for p in dict.fromkeys(paths)]  # one file per graph
    kernels = [k for src in sources for k in re.findall(r"^(\w+) = async_compile", src, re.M)]
    buffers = sum(src.count("= empty_strided_cpu(") for src in sources)
    return kernels, buffers, len(sources)


for name, paths in {"chain": chain_files, "gelu chain": gelu_files}.items():
    kernels, buffers, n_files = kernels_and_buffers(paths)
    print(f"{name:<10}: {n_files} generated file, kernels {kernels}, "
          f"allocations per call {buffers}")
print(f"generated code lives in {Path(chain_files[0]).parent.parent}")

# %% [markdown]
# Output:
# ```text
# chain     : 1 generated file, kernels ['cpp_fused_add_mul_relu_sub_0'], allocations per call 1
# gelu chain: 1 generated file, kernels ['cpp_fused_add_gelu_mul_sub_0'], allocations per call 1
# generated code lives in «path»
# ```
#
# One kernel per chain, named after the operations it fused, and one allocation per call:
# the result. The four intermediate tensors that eager creates do not exist in the compiled
# code. Each generated file is a Python module (the *wrapper*: allocate the output, call the
# kernel) that carries the kernel's C++ source in a string; open it to see one flat loop
# over all 4,194,304 elements, 16 per step, written with `at::vec::Vectorized<float>` SIMD
# operations (AVX2 or AVX-512: `torch.backends.cpu.get_cpu_capability()` says which). `TORCH_LOGS=output_code` prints the same code when it
# is compiled. (We found the files by watching an internal function, Inductor's
# `PyCodeCache.load_by_key_path`, with `unittest.mock`; the path is the cache directory,
# so it depends on where you run.)

# %% [markdown]
# **Predict.** Per call, how do eager and compiled compare with the floor for the plain
# chain? For the GELU chain? Do the results agree with eager?

# %%
def fastest_ms(fn, repeats=15):
    """Fastest wall time of fn() in ms over `repeats` calls, after one warm-up call (CPU: no
    sync needed). The fastest, not the median: another job on the machine only ever adds
    time, so the minimum is the measurement it disturbs least."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return min(times)


def chain_out(x, out):
    """The chain in eager, written into a preallocated buffer: 5 passes, no allocation."""
    torch.mul(x, 1.5, out=out)
    return out.add_(0.5).relu_().sub_(0.25).mul_(2.0)


out = torch.empty_like(xs)
floor = fastest_ms(lambda: out.copy_(xs))  # one read, one write
timings = {}
for name, fn, cfn in [("chain", chain, cchain), ("gelu chain", gelu_chain, cgelu)]:
    timings[name] = {"eager": fastest_ms(lambda: fn(xs)), "compiled": fastest_ms(lambda: cfn(xs)),
                     "floor": floor}
for name, row in timings.items():
    print(f"{name:<10}: eager {row['eager']:.2f} ms, compiled {row['compiled']:.2f} ms, "
          f"floor {row['floor']:.2f} ms")
    print(f"{'':<10}  eager/floor {row['eager'] / floor:.1f}, compiled/floor "
          f"{row['compiled'] / floor:.1f}, eager/compiled {row['eager'] / row['compiled']:.1f}")
t_out = fastest_ms(lambda: chain_out(xs, out))
print(f"chain eager into out=: {t_out:.2f} ms, {t_out / floor:.1f} x floor")
same = {"chain": torch.allclose(cchain(xs), chain(xs), rtol=1e-5, atol=1e-5),
        "gelu chain": torch.allclose(cgelu(xs), gelu_chain(xs), rtol=1e-5, atol=1e-5)}
print(f"allclose to eager (1e-5): chain {same['chain']}, gelu chain {same['gelu chain']}")

# %% [markdown]
# Output:
# ```text
# chain     : eager «time» ms, compiled «time» ms, floor «time» ms
#             eager/floor «ratio», compiled/floor «ratio», eager/compiled «ratio»
# gelu chain: eager «time» ms, compiled «time» ms, floor «time» ms
#             eager/floor «ratio», compiled/floor «ratio», eager/compiled «ratio»
# chain eager into out=: «time» ms, «ratio» x floor
# allclose to eager (1e-5): chain True, gelu chain True
# ```
#
# Each time is the fastest of 15 calls: another job on the machine can only add time, so
# the minimum is the least disturbed measurement (the course's tests run lessons two at a
# time, and a median of 15 once showed the GELU chain compiled *slower* than eager). Typical
# values on this machine (one thread): floor 1.4–1.5 ms; plain chain compiled 1.2–1.7× the
# floor, eager 6–28×; GELU chain compiled 3.1–3.8× the floor, eager 7–9×. On another day
# the same VM gave a floor of 0.6 ms: the milliseconds move with the hardware, the ratios
# much less. Read the ratios:
#
# - The compiled plain chain is at the floor: one loop reads `x` once, does its five cheap
#   operations per element in registers, and writes once. Nothing is left to gain.
# - The compiled GELU chain stays above the floor: `erf` costs enough arithmetic per element
#   that one core cannot keep up with memory. Fusion removed the memory traffic; what
#   remains is compute, which more threads or a GPU would address.
# - Eager pays five passes over memory and five fresh 16 MiB outputs. The `out=` line runs
#   the same five passes in one preallocated buffer: typically 2–3.6× the floor here, not 5×
#   (probably because 16 MiB fits in this machine's 32 MiB L3 cache). The rest of eager's
#   time is allocation: 16 MiB is above glibc's `mmap` threshold, and whenever the
#   allocator has handed such a block back to the kernel, a new output page-faults on
#   every 4 KiB page it first touches (4,096 pages per 16 MiB). Whether that happens on
#   every call depends on what else the process allocated: the plain chain's eager call
#   took 3.5 ms in a fresh process and 5–30 ms in runs of this lesson. That noise is a
#   real cost of eager code; fusion avoids it by allocating no intermediates.
#
# The results agree to 1e-5, not necessarily bit for bit: Inductor's vectorised `erf` is
# not ATen's implementation, and a fused loop may round in another order.

# %% [markdown]
# ## 7. Picture it
#
# **Predict.** On a bar chart of the three timings per chain, which bar stands out?

# %%
def plot_fusion(timings):
    """Grouped bars: eager / compiled / floor per chain, labelled with their ratio to the floor."""
    kinds = ["eager", "compiled", "floor"]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.27
    for k, kind in enumerate(kinds):
        xpos = [i + (k - 1) * width for i in range(len(timings))]
        heights = [row[kind] for row in timings.values()]
        bars = ax.bar(xpos, heights, width, label=kind)
        labels = [f"{row[kind] / row['floor']:.1f}x" for row in timings.values()]
        ax.bar_label(bars, labels=labels)
    ax.set_xticks(range(len(timings)), list(timings))
    ax.set_ylabel("fastest of 15 calls (ms)")
    ax.set_title("2048 x 2048 fp32, one thread: eager vs compiled vs copy floor")
    ax.legend()
    fig.tight_layout()
    return fig


fig = plot_fusion(timings)
fig.savefig(HERE / "fusion.png", dpi=100)
print("saved fusion.png")

# %% [markdown]
# Output:
# ```text
# saved fusion.png
# ```
#
# The figure (`fusion.png`) draws the three times per chain and labels each bar with its
# ratio to the floor: eager stands far above, the compiled plain chain sits on the floor,
# the compiled GELU chain a few times above it.

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
# - Inductor fuses an elementwise chain into one loop at the one-read-one-write floor;
#   compute-heavy ops (erf) stay above it. The first call costs seconds on a CPU; a shared
#   cache directory makes later runs cheaper. On a GPU, this lesson's tests compare compiled
#   and eager and try `mode="reduce-overhead"` (CUDA graphs): `make test-gpu`.
#
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

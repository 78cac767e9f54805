# %% [markdown]
# # 08a · torch.compile: capture, guards, graph breaks, AOTAutograd
#
# `torch.compile(fn)` does not compile Python. It watches `fn`'s bytecode run once
# (TorchDynamo), records the tensor operations it meets into an FX graph, and hands that
# graph to a *backend*. Next to the graph it writes *guards*: the facts about the inputs the
# graph relied on. Each later call checks the guards; if they hold, the saved code runs, if
# not, Dynamo captures again. What Dynamo cannot record splits the function (a *graph
# break*). Before the backend sees the graph, AOTAutograd rewrites it in ATen operators and
# derives its backward. This lesson, the first of two parts, stays in front of code
# generation: every backend here runs the captured graphs as they are, so nothing waits for
# a C++ compiler. Part 08b follows the graph into Inductor, the default backend, and asks
# where in a model to compile.
#
# **What you will learn**
#
# - how to see the captured graphs with a backend of your own, and why a new Python scalar
#   value captures again;
# - how to read the guards (the `guards` and `recompiles` logs), and that values read from
#   closures, module globals and global state (grad mode) are guarded too;
# - what shapes do: one recompile, then a dynamic dimension; `dynamic=True`;
#   `torch._dynamo.mark_dynamic`; the recompile limit (8) and what happens past it;
# - what breaks a graph (`print`, `.item()`), how `torch._dynamo.explain` reports it, and
#   how `fullgraph=True` turns a silent break into an error;
# - `torch.compiler.set_stance("fail_on_recompile")` as a guard in your own tests;
# - what AOTAutograd adds (a backward graph, functionalized and decomposed ATen), checked
#   with `aot_eager`; a case where the compiled backward's autocast assumption changes the
#   gradients; and what Dynamo and AOTAutograd make of lesson 07a's SDPA.
#
# **Prerequisites:** lesson 02 (ATen operators, functionalization), lessons 03a and 03b
# (autograd), lesson 05b (autocast), lessons 07a and 07b (`F.scaled_dot_product_attention`
# and the backend it picks).
#
# **How to run:** `python lessons/08a_compile_capture/compile_capture.py` or
# `make lesson N=08a` from the repository root, or open `compile_capture.ipynb`. Everything
# runs on the CPU in a few seconds. Each printing cell is followed by an *Output* block:
# what it printed with the pinned PyTorch (2.13.0). Your run prints the same lines, except
# the parts marked `«number»` (a gradient gap that depends on the random weights and on the
# CPU's bf16 kernels), `«version»`, `«folder»` or `«line»` (which torch you installed, and
# where). Run outside the course's venv on a CUDA build without a GPU, `torch.compile` may
# also log PyTorch's own diagnostic line `No CUDA runtime is found` to stderr. It is
# harmless, and the course's venv (`.venv`, made by any `make lesson`) turns it off.
#
# Several tools here are private (`torch._dynamo`, `torch._functorch.config`): PyTorch's
# compile troubleshooting guides use most of them, and under another PyTorch release what
# they print may differ from the lesson's.

# %%
import contextlib
import json
import logging
import os
import re
import sys
from pathlib import Path

import torch
import torch._dynamo as dynamo
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
dynamo.reset()  # forget graphs compiled earlier in this process


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


# Section 2's tool: turn on torch's `guards` and `recompiles` logs for a block and collect
# their messages in a list instead of printing them (then every log back as it was).
@contextlib.contextmanager
def torch_logs(*artifacts):
    """Turn on some of torch's logs (as TORCH_LOGS=guards,recompiles would) and collect their
    messages, [(log, message), ...], instead of printing them; all logs back to default after."""
    env = os.environ.pop("TORCH_LOGS", None)  # set when you run the lesson under TORCH_LOGS=...
    torch._logging.set_logs(**dict.fromkeys(artifacts, True))
    records, handler = [], logging.Handler()
    handler.emit = lambda record: records.append((record.name.rsplit("__", 1)[1], record.getMessage()))
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name.rsplit(".__", 1)[-1] in artifacts]  # 'torch._dynamo.guards.__guards'
    saved = [(logger, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False  # to our list, not to torch's handler on stderr
    try:
        yield records
    finally:
        for logger, propagate in saved:
            logger.removeHandler(handler)
            logger.propagate = propagate
        torch._logging.set_logs()  # the defaults: both logs off
        if env is not None:  # back to what TORCH_LOGS asked for (private functions read it again)
            os.environ["TORCH_LOGS"] = env
            torch._logging._internal._parse_log_settings.cache_clear()  # set_logs cleared its result
            torch._logging._internal._init_logs()


def logs_on():
    """Which of the two logs are on now."""
    return [a for a in ("guards", "recompiles") if torch._logging._internal.log_state.is_artifact_enabled(a)]


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
# record (`torch._dynamo.utils.guard_failures`, private); the next section turns on the
# log that prints it.
#
# On the recompile Dynamo did not bake 3.0 in: having seen the value change, it made
# `scale` a graph input (a 0-d tensor, turned back into a number by `item`), so a fourth
# value would reuse graph 1. That is *automatic dynamic*, PyTorch 2.13.0's default for
# scalars and shapes: specialise first, generalise on the first change.

# %% [markdown]
# ## 2. Reading the guards: closures, globals, global state
#
# Dynamo writes two logs about guards: `guards` prints every guard of each new graph,
# `recompiles` prints the guard that failed when a call captures again.
# `torch._logging.set_logs(guards=True, recompiles=True)` turns them on from Python, and
# `TORCH_LOGS=guards,recompiles` in the environment does the same for a whole run (and
# then takes precedence over every `set_logs` call, so the helper `torch_logs`, defined in
# the first code cell, sets it aside for its block). Both print to stderr; the helper
# collects the two logs' messages into a list instead, and turns them off again.
#
# **Predict.** Compile `f` afresh and call it with `scale=2.0`. Besides `scale == 2.0`,
# what must Dynamo check before it may reuse the graph for a later call? Then call it
# again inside `torch.no_grad()`: is that a new graph (a guess is fine)?

# %%
GUARD_LINE = re.compile(r"\+- (\w+): (.*?)(?:\s+#.*)?$", re.M)  # '| +- KIND: code  # where it came from'


def guard_kinds(tree):
    """{kind: [code, ...]} of the guard tree that the `guards` log prints for one graph."""
    kinds = {}
    for kind, code in GUARD_LINE.findall(tree):
        if kind != "GuardManager":  # a node of the tree (one per input), not a guard
            kinds.setdefault(kind, []).append(code)
    return kinds


dynamo.reset()
cf_logged = torch.compile(f, backend=CountingBackend())
with torch_logs("guards", "recompiles") as logs:
    cf_logged(x, 2.0)
    with torch.no_grad():
        cf_logged(x, 2.0)
trees = [m for name, m in logs if name == "guards" and "TREE_GUARD_MANAGER" in m]
kinds = guard_kinds(trees[0])
tensor_check = re.sub(r"DispatchKeySet\([^)]*\), ", "", kinds["TENSOR_MATCH"][0])
global_state = json.loads(kinds["GLOBAL_STATE"][0].split(" against ", 1)[1])
print(f"guards log: {len(trees)} guard trees; the first has {sum(map(len, kinds.values()))} guards")
print(f"  TENSOR_MATCH: {tensor_check}")
print(f"  EQUALS_MATCH: {kinds['EQUALS_MATCH']}")
print(f"  GLOBAL_STATE checks: {sorted(global_state)}")
recompiles = [m for name, m in logs if name == "recompiles"]
print(f"recompiles log: {len(recompiles)} message; its first line: {recompiles[0].splitlines()[0].split(' in ')[0]}")
print(f"  failed guard: {failed_guards(recompiles[0])}")
print(f"guard kinds: {sorted(kinds)}")

# %% [markdown]
# Output:
# ```text
# guards log: 2 guard trees; the first has 11 guards
#   TENSOR_MATCH: check_tensor(L['x'], Tensor, torch.float32, device=None, requires_grad=False, size=[8], stride=[1])
#   EQUALS_MATCH: ["L['scale'] == 2.0"]
#   GLOBAL_STATE checks: ['allow_bf16_reduce', 'allow_fp16_reduce', 'allow_tf32', 'autocast_state', 'default_dtype', 'deterministic_algorithms', 'deterministic_algorithms_warn_only', 'grad_mode', 'num_threads', 'torch_function', 'torch_function_all_disabled']
# recompiles log: 1 message; its first line: Recompiling function f
#   failed guard: ['GLOBAL_STATE changed: grad_mode']
# guard kinds: ['DEFAULT_DEVICE', 'DIMENSION_DYNAMIC_MARKING_GUARD', 'EQUALS_MATCH', 'GLOBAL_STATE', 'LAMBDA_GUARD', 'TENSOR_MATCH', 'TORCH_FUNCTION_MODE_STACK']
# ```
#
# Three kinds of facts guard a graph. A `TENSOR_MATCH` checks a tensor input's type, dtype,
# device, `requires_grad`, sizes and strides (its values never); `device=None` is the
# device index, and the device type is in the dispatch key set, which the print leaves out. An `EQUALS_MATCH` checks
# a Python value the trace read, here `L['scale']` (`L` is the frame's locals). And one
# `GLOBAL_STATE` guard compares the state the graph was traced under with the state of the
# call: grad mode, autocast, the default dtype, deterministic mode, the thread count, among
# others. The call under `no_grad` failed that guard (the recompiles log names
# `grad_mode`), because a graph traced with gradients on records different work. The
# other kinds guard the default device (`DEFAULT_DEVICE`), the torch-function modes
# (`TORCH_FUNCTION_MODE_STACK`), the saved-tensor hooks (`LAMBDA_GUARD` here checks that
# no saved-tensor hooks are active), and (`DIMENSION_DYNAMIC_MARKING_GUARD`) the marks
# that section 3's `mark_dynamic` sets.
#
# **Predict.** A Python value need not be an argument. `make_scaler(s)` returns a closure
# that multiplies by `s`, so every closure it makes has the same code; `scale_by_global`
# multiplies by a module global `SCALE`. Compile three closures (2.0, 3.0, 4.0) with one
# backend, and one function while `SCALE` goes 2.0, 3.0, 4.0. How many graphs each?

# %%
def make_scaler(s):
    def scaler(x):
        return x * s  # s: a closure cell

    return scaler


def scale_by_global(x):
    return x * SCALE  # a module global


dynamo.reset()
closures = [make_scaler(s) for s in (2.0, 3.0, 4.0)]
by_closure = CountingBackend()
for scaler in closures:
    assert torch.equal(torch.compile(scaler, backend=by_closure)(x), scaler(x))
closure_failed = recompile_guards(closures[0])  # read now: the next dynamo.reset() clears it
print(f"3 closures of one code: {len(by_closure.graphs)} graphs, "
      f"failed guard {closure_failed}, inputs of the last {graph_inputs(by_closure.graphs[-1])}")
by_global = CountingBackend()
cglobal = torch.compile(scale_by_global, backend=by_global)
for value in (2.0, 3.0, 4.0):
    SCALE = value  # the module global that scale_by_global reads
    assert torch.equal(cglobal(x), scale_by_global(x))
global_failed = recompile_guards(scale_by_global)
print(f"SCALE 2.0, 3.0, 4.0: {len(by_global.graphs)} graphs, "
      f"failed guard {global_failed}, inputs of the last {graph_inputs(by_global.graphs[-1])}")

# %% [markdown]
# Output:
# ```text
# 3 closures of one code: 2 graphs, failed guard ['s == 2.0'], inputs of the last ['l_x_', 'l_s_']
# SCALE 2.0, 3.0, 4.0: 2 graphs, failed guard ["G['SCALE'] == 2.0"], inputs of the last ['l_x_', 'g_scale_']
# ```
#
# The same story as `scale`, two more times. Dynamo keeps compiled graphs per *code
# object*, and the three closures share one: the first graph baked 2.0 in behind the guard
# `s == 2.0` (read from the closure's cell), the second closure failed it, and automatic
# dynamic made `s` an input that served the third. The global is read from the module's
# dictionary, `G['SCALE']`: changing it between calls is a guard failure too, then an
# input (`g_scale_`). Such values are easy to miss in a real model (a closure made per
# layer, a Python number in a global that a schedule changes each step), and each new
# value costs a capture until the number becomes an input.

# %% [markdown]
# ## 3. Guards on shapes: one recompile, then a dynamic dimension
#
# **Predict.** `g(x) = x.square() * 2` is called with lengths 2, 3, ..., 13: twelve shapes.
# How many graphs with the default `dynamic=None`? With `dynamic=True`? With `dynamic=False`,
# where every new shape needs a graph of its own?

# %%
def g(x):
    return x.square() * 2


def count_graphs(dynamic, lengths, mark=False):
    """Call g compiled with this `dynamic` on 1-D inputs of these lengths; graphs captured.
    mark=True marks dimension 0 of the first input dynamic (torch._dynamo.mark_dynamic)."""
    dynamo.reset()  # the recompile limit counts graphs per code object, across compile calls
    counting = CountingBackend()
    cg = torch.compile(g, backend=counting, dynamic=dynamic)
    with captured_logs("torch._dynamo.convert_frame") as logged:
        for i, n in enumerate(lengths):
            xn = torch.ones(n)
            if mark and i == 0:
                dynamo.mark_dynamic(xn, 0)
            assert torch.equal(cg(xn), g(xn))  # right answer either way
    return counting, logged


lengths = list(range(2, 14))  # 12 shapes
by_mode = {d: count_graphs(d, lengths) for d in [None, True, False]}
for d, (backend, _) in by_mode.items():
    last = graph_inputs(backend.graphs[-1])
    n = len(backend.graphs)
    print(f"dynamic={d!s:<5}: {len(lengths)} calls, {n} graph{'s' * (n != 1)}, "
          f"inputs of the last one {last}")
print(f"recompile_limit {dynamo.config.recompile_limit}")
print(by_mode[False][1][0].splitlines()[0])

# %% [markdown]
# Output:
# ```text
# dynamic=None : 12 calls, 2 graphs, inputs of the last one ['s77', 'l_x_']
# dynamic=True : 12 calls, 1 graph, inputs of the last one ['s77', 'l_x_']
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
#   compiling new graphs for this function: the other four calls, whose shapes match none of
#   the eight cached graphs, ran *eagerly*, still correct, with no compiler and no error (a
#   later call with one of the first eight lengths still runs its cached graph: see *A
#   recompile storm* in `lessons/TROUBLESHOOTING.md`). In a real model this silent fallback
#   is a common reason why "compile made nothing faster". The limit is a config value: raise it only when you know
#   the number of variants is bounded (the older name `cache_size_limit` still reads it).
#
# **Predict.** You know in advance that the batch dimension will vary. With the default
# `dynamic=None`, `torch._dynamo.mark_dynamic(x, 0)` on the first input says so before the
# first call. How many graphs for the same twelve lengths, and how many recompiles?

# %%
marked, _ = count_graphs(None, lengths, mark=True)
print(f"mark_dynamic(x, 0): {len(lengths)} calls, {len(marked.graphs)} graph, "
      f"recompiles {len(dynamo.utils.guard_failures[g.__code__])}, inputs {graph_inputs(marked.graphs[0])}")

# %% [markdown]
# Output:
# ```text
# mark_dynamic(x, 0): 12 calls, 1 graph, recompiles 0, inputs ['s77', 'l_x_']
# ```
#
# One graph from the first call, symbolic from the start: the recompile that automatic
# dynamic needed to learn the fact is gone. The mark lives on the tensor: `mark_dynamic`
# sets an attribute that the `DIMENSION_DYNAMIC_MARKING_GUARD`s of section 2 check, so mark
# the tensor of the first call (a tensor marked for a later call fails those guards and
# captures again). The mark is also a promise: if tracing finds that the dimension must be
# a constant (a branch on its size, say), Dynamo raises `ConstraintViolationError` instead
# of specialising quietly.

# %% [markdown]
# ## 4. Graph breaks
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
# ## 5. A guard for tests: `fail_on_recompile`
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
# The stance refuses *any* compile, the first one included, so in a test of your own:
# warm up with every shape you expect, then run the steady state under the stance. A
# recompile there (a shape that changed, a Python scalar that is not constant, a module
# attribute that flips) becomes an error naming the failed guard, instead of a slowdown
# found weeks later. Other stances: `"eager_on_recompile"` (run eagerly instead of
# recompiling) and `"force_eager"` (ignore `torch.compile` entirely, for debugging).

# %% [markdown]
# ## 6. AOTAutograd: a backward graph, and an autocast assumption
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
largest = max(g.abs().max().item() for g in eager_grads)
print(f"largest gradient {largest:.2f}")
for mode, (g1, g2) in gaps.items():
    print(f"{mode:<15}: max |grad w1 gap| {g1:.4f}  max |grad w2 gap| {g2:.4f}")
print(f"same_as_forward: both gaps above 0 and below largest / 32: "
      f"{all(0 < gap < largest / 32 for gap in gaps['same_as_forward'])}")
print(f"restored: backward_pass_autocast = {torch._functorch.config.backward_pass_autocast!r}")

# %% [markdown]
# Output:
# ```text
# largest gradient «number»
# same_as_forward: max |grad w1 gap| «number»  max |grad w2 gap| «number»
# off            : max |grad w1 gap| 0.0000  max |grad w2 gap| 0.0000
# same_as_forward: both gaps above 0 and below largest / 32: True
# restored: backward_pass_autocast = 'same_as_forward'
# ```
#
# With the default, both gradients differ from eager, by a few thousandths of the largest
# gradient (about 1/256 of it): the size of one bf16 rounding, since bf16 keeps 8
# significant bits. The exact values depend on the random weights and on the CPU's bf16
# kernels, so they are «number» above; the line after them states a looser bound, 1/32,
# since the exact gap depends on the weights. The compiled
# backward ran the fp32 region's matmuls (`grad_y @ w2.T` and `h1.T @ grad_y`) under bf16
# autocast, where eager ran them in fp32; the error in the gradient of `h1` then flows on
# into `grad w1`. With `"off"` the compiled backward runs without autocast, as eager's
# did, and both gaps are exactly 0. The knob matters only when the forward changes the
# autocast state inside the compiled region: had `.backward()` been called *inside* the
# autocast block, the default would have matched eager and `"off"` would not; and a forward
# that is bf16 throughout shows no gap with either setting.
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
# its own, so what it lowers is written in more nodes than the model was (here 4 for 3),
# each a simpler operator.
# `aot_autograd` (in `torch._dynamo.backends.common`) builds such a backend from a function
# that receives each graph; `aot_eager` is one with a compiler that just runs it.

# %% [markdown]
# **Predict.** Lesson 07a's `F.scaled_dot_product_attention` (SDPA), compiled with our
# counting backend: how many operations does Dynamo's graph hold for it? AOTAutograd works
# in ATen operators: does its forward graph spell the formula out (matmul, softmax,
# matmul), or keep one operator? What is in its backward graph?

# %%
def attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, S, D)


def aot_graphs(fn, *inputs):
    """fn's output, and the ATen ops of the forward and backward graphs that AOTAutograd
    hands its two compilers (each compiler keeps the list and runs the graph as it is)."""
    seen = {}

    def keep(kind):
        def compiler(gm, example_inputs):
            seen[kind] = [str(n.target) for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)]
            return make_boxed_func(gm.forward)  # AOTAutograd calls compiled graphs with a list

        return compiler

    dynamo.reset()
    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    out = torch.compile(fn, backend=backend)(*inputs)
    out.sum().backward()  # runs the backward graph
    return out, seen


gen = torch.Generator().manual_seed(7)
q, k, v = (torch.randn(1, 2, 8, 16, generator=gen, requires_grad=True) for _ in range(3))
sdpa_capture = CountingBackend()
torch.compile(attend, backend=sdpa_capture)(q, k, v)
print(f"Dynamo's graph: {len(sdpa_capture.graphs)} graph, ops {graph_ops(sdpa_capture.graphs[0])}")
sdpa_out, sdpa_aot = aot_graphs(attend, q, k, v)
for kind, ops in sdpa_aot.items():
    print(f"AOTAutograd's {kind + ':':<9} {ops}")
print(f"equal to eager: {torch.equal(sdpa_out, attend(q, k, v))}")

# %% [markdown]
# Output:
# ```text
# Dynamo's graph: 1 graph, ops ['scaled_dot_product_attention']
# AOTAutograd's forward:  ['aten._scaled_dot_product_flash_attention_for_cpu.default', 'aten.detach.default']
# AOTAutograd's backward: ['aten.detach.default', 'aten._scaled_dot_product_flash_attention_for_cpu_backward.default']
# equal to eager: True
# ```
#
# Dynamo records the call as it was written, one `scaled_dot_product_attention` node.
# AOTAutograd traces it through the dispatcher, and SDPA picks its backend while it is
# dispatched (lesson 07b): the ATen graph names the kernel this call runs on the CPU, the
# flash kernel `_scaled_dot_product_flash_attention_for_cpu`, and the backward graph its
# own backward kernel, not the formula. The `detach` is the output that the backward graph
# receives as a saved tensor. So the backend choice was made once, while tracing, and is
# now part of the graph; `aot_eager` runs that same kernel, hence the bitwise equality.

# %% [markdown]
# ## Summary
#
# - `torch.compile` = Dynamo (bytecode captured into FX graphs, plus guards) → AOTAutograd
#   (ATen graphs, forward and backward) → a backend. A backend of your own sees each graph;
#   `backend="eager"` and `"aot_eager"` check capture without generating code. A Python
#   scalar is a constant guarded by value until it changes, then a graph input.
# - Guards check tensor inputs (dtype, device, `requires_grad`, sizes, strides), every
#   Python value the trace read (arguments, closure cells, module globals) and the global
#   state (grad mode, autocast, default dtype, threads). `TORCH_LOGS=guards,recompiles`
#   or `torch._logging.set_logs(guards=True, recompiles=True)` prints them and the guard
#   that failed.
# - A new shape recompiles once and then becomes a symbolic size (`dynamic=None`);
#   `mark_dynamic` makes it symbolic from the first call; `dynamic=False` recompiles per
#   shape until `recompile_limit` (8), then silently runs eagerly each call that matches
#   none of the cached graphs (a call that matches one still runs it).
# - Graph breaks (`print`, `.item()`, data-dependent branches) split a function into graphs
#   with Python in between; `torch._dynamo.explain` lists them with reasons;
#   `fullgraph=True` makes the first one an error.
# - `set_stance("fail_on_recompile")` refuses every compile, the first included: warm up,
#   then guard the steady state in tests.
# - `aot_eager` matches eager bit for bit. The compiled backward runs under the forward's
#   autocast state by default (`backward_pass_autocast="same_as_forward"`): wrong when the
#   forward disables autocast locally and backward runs outside it; `"off"` fixes that case.
#   AOTAutograd's graph is functional (`add_` becomes `add`) and decomposed by a table;
#   SDPA reaches it as the one ATen kernel the dispatcher chose, with its backward kernel.

# %% [markdown]
# ## References
#
# - [`torch.compile`](https://docs.pytorch.org/docs/2.13/generated/torch.compile.html): its
#   arguments (`backend`, `dynamic`, `fullgraph`, `mode`).
# - [`torch.compiler`](https://docs.pytorch.org/docs/2.13/torch.compiler.html): the
#   compiler's public API and its guides (troubleshooting, dynamic shapes, graph breaks).
# - [`torch.compiler.set_stance`](https://docs.pytorch.org/docs/2.13/generated/torch.compiler.set_stance.html):
#   `fail_on_recompile`, `eager_on_recompile`, `force_eager`.
# - [`torch._logging.set_logs`](https://docs.pytorch.org/docs/2.13/generated/torch._logging.set_logs.html):
#   every log `TORCH_LOGS` can turn on, `guards` and `recompiles` among them.
# - [`torch.fx`](https://docs.pytorch.org/docs/2.13/fx.html): the graphs a backend receives.
# - [`torch.nn.functional.scaled_dot_product_attention`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.functional.scaled_dot_product_attention.html):
#   the operator section 6 sends through the compiler.
# - Dao et al., [FlashAttention](https://arxiv.org/abs/2205.14135) (2022): the algorithm of
#   the CPU flash kernel that AOTAutograd's SDPA graph calls.

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each path is relative to the folder that holds your installed
# `torch` (your site-packages), and the line numbers are those of your installation. The
# stops follow one compiled call: the frame hook and the stance that decides what it does,
# where a graph breaks, how a failed guard is named, the mark that `mark_dynamic` leaves,
# and AOTAutograd's staging.

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
     "`fail_on_recompile` into `fail_callback`, which raises section 5's `Detected recompile ...` "
     "with the failed guards for a frame that holds tensors. The hook calls it only when no "
     "cached graph's guards pass, so a first compile raises too."),
    ("torch/_dynamo/symbolic_convert.py", "def break_graph_if_unsupported(",
     "The decorator on the bytecode handlers that may break a graph (`CALL`, `COMPARE_OP`, "
     "`STORE_ATTR`, ...). When tracing the instruction raises `Unsupported`, `wrapper` logs the "
     "graph break and restarts the analysis; on the second pass `handle_graph_break` compiles "
     "the graph traced so far (`compile_subgraph`), emits the instruction itself for Python to "
     "run, then a call to a generated function that resumes tracing after it "
     "(`create_call_resume_at`): section 4's 3 graphs and 2 breaks. With `fullgraph=True`, "
     "`should_compile_partial_graph()` is False and the `Unsupported` is raised instead."),
    ("torch/_dynamo/guards.py", "def get_guard_fail_reason(",
     "Called for each cached graph when a call passes none of them, by "
     "`get_and_maybe_log_recompilation_reasons` below, which writes the `recompiles` log of "
     "section 2. `get_guard_fail_reason_helper`, above, reruns the graph's guards verbosely, "
     "keeps the first that failed, the guard's own code (section 1's `scale == 2.0`) or a "
     "tensor check's message (section 5's `tensor 'x' rank mismatch ...`), and puts the "
     "compile id in front (`0/0: `). This function appends that line to `guard_failures`, the "
     "record section 1 reads, unless `skip_logging` is set, as the `fail_on_recompile` stance "
     "does."),
    ("torch/_dynamo/decorators.py", "def mark_dynamic(",
     "Its docstring, [Note - on the state of mark_dynamic], lists the rules: the mark must be "
     "made before the compiled call, and a dimension that tracing finds fully constrained "
     "raises. The code only adds the dimension to the tensor's `_dynamo_dynamic_indices` "
     "(with an optional `min`/`max` range): the attribute whose absence section 2's "
     "`DIMENSION_DYNAMIC_MARKING_GUARD` checks, and that section 3's first capture read."),
    ("torch/_functorch/aot_autograd.py", "def aot_module_simplified(",
     "What `aot_eager`, section 6's `aot_autograd(fw_compiler=...)` and Inductor all call with "
     "Dynamo's graph. With a compiler that can be serialized (Inductor's) it first asks "
     "AOTAutograd's cache, `AOTAutogradCache.try_load`. Otherwise `create_aot_state` (its "
     "docstring outlines the plan) and `aot_stage1_graph_capture` trace the ATen graph, joint "
     "forward and backward when gradients are needed, functionalized and decomposed (section "
     "6: `add_` became `add`; with the core table `silu` became `sigmoid` and `mul`). When "
     "gradients are needed, `aot_stage2_compile` then splits the joint graph with "
     "`partition_fn` and hands forward and backward to their compilers, wrapped in one "
     "`torch.autograd.Function`; without gradients one forward graph goes to the inference "
     "compiler."),
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
#     nothing) and `fail_on_recompile` into `fail_callback`, which raises section 5's
#     `Detected recompile ...` with the failed guards for a frame that holds tensors. The
#     hook calls it only when no cached graph's guards pass, so a first compile raises
#     too.
# torch/_dynamo/symbolic_convert.py:«line»  `def break_graph_if_unsupported(`
#     The decorator on the bytecode handlers that may break a graph (`CALL`, `COMPARE_OP`,
#     `STORE_ATTR`, ...). When tracing the instruction raises `Unsupported`, `wrapper`
#     logs the graph break and restarts the analysis; on the second pass
#     `handle_graph_break` compiles the graph traced so far (`compile_subgraph`), emits
#     the instruction itself for Python to run, then a call to a generated function that
#     resumes tracing after it (`create_call_resume_at`): section 4's 3 graphs and 2
#     breaks. With `fullgraph=True`, `should_compile_partial_graph()` is False and the
#     `Unsupported` is raised instead.
# torch/_dynamo/guards.py:«line»  `def get_guard_fail_reason(`
#     Called for each cached graph when a call passes none of them, by
#     `get_and_maybe_log_recompilation_reasons` below, which writes the `recompiles` log
#     of section 2. `get_guard_fail_reason_helper`, above, reruns the graph's guards
#     verbosely, keeps the first that failed, the guard's own code (section 1's `scale ==
#     2.0`) or a tensor check's message (section 5's `tensor 'x' rank mismatch ...`), and
#     puts the compile id in front (`0/0: `). This function appends that line to
#     `guard_failures`, the record section 1 reads, unless `skip_logging` is set, as the
#     `fail_on_recompile` stance does.
# torch/_dynamo/decorators.py:«line»  `def mark_dynamic(`
#     Its docstring, [Note - on the state of mark_dynamic], lists the rules: the mark must
#     be made before the compiled call, and a dimension that tracing finds fully
#     constrained raises. The code only adds the dimension to the tensor's
#     `_dynamo_dynamic_indices` (with an optional `min`/`max` range): the attribute whose
#     absence section 2's `DIMENSION_DYNAMIC_MARKING_GUARD` checks, and that section 3's
#     first capture read.
# torch/_functorch/aot_autograd.py:«line»  `def aot_module_simplified(`
#     What `aot_eager`, section 6's `aot_autograd(fw_compiler=...)` and Inductor all call
#     with Dynamo's graph. With a compiler that can be serialized (Inductor's) it first
#     asks AOTAutograd's cache, `AOTAutogradCache.try_load`. Otherwise `create_aot_state`
#     (its docstring outlines the plan) and `aot_stage1_graph_capture` trace the ATen
#     graph, joint forward and backward when gradients are needed, functionalized and
#     decomposed (section 6: `add_` became `add`; with the core table `silu` became
#     `sigmoid` and `mul`). When gradients are needed, `aot_stage2_compile` then splits
#     the joint graph with `partition_fn` and hands forward and backward to their
#     compilers, wrapped in one `torch.autograd.Function`; without gradients one forward
#     graph goes to the inference compiler.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Tell them apart.** Two reports about compiled code: (a) one call of a function
#    became three graphs; (b) a later call captured again although the function had not
#    changed. Which is a graph break, which a guard failure, and which tool of this lesson
#    names the cause of each?
#
#    <details><summary>Answer</summary>
#
#    (a) Graph breaks: inside one call Dynamo met what it cannot record and split there.
#    `torch._dynamo.explain(h)` printed `graphs 3, graph breaks 2`, with a reason and a line
#    for each break (the `print`: `Failed to trace builtin operator`; `.item()`:
#    `Unsupported Tensor.item() call ...`), and `fullgraph=True` turned the first break into
#    `torch._dynamo.exc.Unsupported` (*§ Graph breaks*). (b) A guard failure: a new call
#    broke a fact the cached graph relied on. The `recompiles` log names it: the call under
#    `torch.no_grad()` failed `GLOBAL_STATE changed: grad_mode`
#    (*§ Reading the guards: closures, globals, global state*); with `scale` 2.0 then 3.0,
#    Dynamo's record named `['scale == 2.0']` (*§ Capture: what the backend receives*).
#
#    </details>
#
# 2. **Predict.** A model multiplies by a module global `LR_SCALE` that a schedule changes
#    once per epoch: 2.0, 3.0, 4.0. Compiled, how many graphs over the three epochs, and
#    what does the `recompiles` log name?
#
#    <details><summary>Answer</summary>
#
#    Two graphs. The trace read the global, so a guard on its value was written next to
#    the first graph; the change fails it, and the recompile makes the global an input that
#    serves the third value. The lesson's `SCALE` went 2.0, 3.0, 4.0: 2 graphs, failed guard
#    `["G['SCALE'] == 2.0"]`, the last graph's inputs `['l_x_', 'g_scale_']`; three closures
#    of one code behaved the same way
#    (*§ Reading the guards: closures, globals, global state*).
#
#    </details>
#
# 3. **Predict.** A function compiled with `dynamic=False` is called on 1-D inputs of
#    twelve different lengths. How many graphs, and what happens to the calls past the
#    limit? With the default `dynamic=None`? With `mark_dynamic` on the first input?
#
#    <details><summary>Answer</summary>
#
#    8 graphs, the `recompile_limit`: Dynamo logged
#    `torch._dynamo hit config.recompile_limit (8)` once and captured nothing for the other
#    four calls, which still returned eager's values (the cell asserts every call against
#    eager). No error, just no compiled code. With `dynamic=None` there are 2 graphs: the
#    first for length 2, then one whose inputs start with a symbolic size,
#    `['s77', 'l_x_']`, that served every later length. With `mark_dynamic(x, 0)` on the
#    first input, 1 graph and 0 recompiles
#    (*§ Guards on shapes: one recompile, then a dynamic dimension*).
#
#    </details>
#
# 4. **Spot the bug.** A test wants to prove that a compiled model never recompiles:
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
# 5. **Spot the bug.** A forward runs under `torch.autocast("cpu", dtype=torch.bfloat16)`
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
#    then above 0 and below 1/32 of the largest gradient, and with `"off"` both were
#    `0.0000` (*§ AOTAutograd: a backward graph, and an autocast assumption*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder:
#
# 1. `h_fullgraph(x)`: rewrite section 4's `h` (without its `print`) so that it returns the
#    same values and compiles with `fullgraph=True` into a single graph. Hint: choose
#    between the two results with a tensor operation instead of a Python `if`.
# 2. `scale_arg(scale)`: what to pass as `f`'s `scale` so that `f` compiled with
#    `dynamic=False` captures one graph for any number of different scales and still gives
#    the values of `f(x, scale)`.
#
# Check your answers with `make exercises N=08a`: the tests compile your code with a
# counting backend (no Inductor) and compare with eager. `solutions.py` has one way.
#
# Without tests: run this script with `TORCH_LOGS=recompiles,graph_breaks` and match each
# log line to a cell.

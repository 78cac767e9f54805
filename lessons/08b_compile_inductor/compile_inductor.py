# %% [markdown]
# # 08b · torch.compile: Inductor, its cache, and where to compile
#
# Part 08a followed a compiled call up to the backend: Dynamo's FX graph and its guards,
# graph breaks, and the ATen graphs AOTAutograd derives, forward and backward, all run by
# backends that generate no code. This part hands the graph to the default backend,
# Inductor, which writes and compiles kernels: C++ loops on a CPU, Triton kernels on a
# GPU. It reads the code Inductor wrote, the key its disk cache files it under, what it
# leaves to ATen, and what fusion buys against what memory allows. Then it asks where in a
# model to put `torch.compile`: each repeated block, or a whole training step.
#
# **What you will learn**
#
# - what the first call of a compiled function costs, and what the disk cache saves;
# - what Inductor makes of an elementwise chain: one fused C++ kernel, as wide as this CPU's
#   vectors, and one allocation per call;
# - what the cache key holds (and why a cache must not travel between machines), and how
#   `torch.compiler.save_cache_artifacts` carries a compile to an empty cache;
# - what Inductor leaves to ATen (lesson 07a's SDPA), what its `perf_hints` log says, and
#   what the compile modes and max-autotune's GEMM backends set;
# - what fusion buys against two one-read-one-write floors (`copy_` and `clone`), in and
#   out of the CPU's last-level cache;
# - regional compilation of repeated blocks, and what a whole training step compiles into
#   (the backward is a break, the optimizer's update a graph of its own, compiled autograd);
# - what a `TORCH_TRACE` structured log holds, the input of `tlparse`.
#
# **Prerequisites:** lesson 08a (capture, guards, graph breaks, AOTAutograd, `aot_eager`;
# the first code cell defines its counting backend again), lesson 06a (honest timing),
# lesson 07a (SDPA).
#
# **How to run:** `python lessons/08b_compile_inductor/compile_inductor.py` or
# `make lesson N=08b` from the repository root, or open `compile_inductor.ipynb`. Everything
# runs on the CPU: the outputs below are CPU facts (C++ kernels). Section 1's first call
# compiles C++ and takes seconds (the cell prints how many), far fewer once the generated
# code is cached on disk; `make lesson` points `TORCHINDUCTOR_CACHE_DIR` at
# `build/inductor-cache` so that later runs reuse it. Each printing cell is followed by an
# *Output* block: what it printed with the pinned PyTorch (2.13.0). Timings, rates and
# anything else that depends on the machine appear there as `«time»`, `«rate»`, `«ratio»`,
# `«number»`, `«isa»`. The lesson also runs under the logging it recommends, e.g.
# `TORCH_LOGS=output_code python lessons/08b_compile_inductor/compile_inductor.py`. Run
# outside the course's venv on a CUDA build without a GPU, `torch.compile` may also log
# PyTorch's own diagnostic line `No CUDA runtime is found` to stderr. It is harmless, and
# the course's venv (`.venv`, made by any `make lesson`) turns it off (the `Profiler record
# function ... will be ignored` warning is another matter: section 6 explains it).
#
# Several tools here are private (`torch._dynamo`, `torch._inductor`): PyTorch's compile
# troubleshooting guides use most of them, and under another PyTorch release what they
# print may differ from the lesson's.

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
import torch.nn.functional as F

try:
    import resource  # Unix only: counts page faults in section 4
except ImportError:  # Windows: that count is not available, the rest runs
    resource = None

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: reproducible results, comparable timings
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
dynamo.reset()  # forget graphs compiled earlier in this process


# From part 08a: a backend that keeps each graph and runs it eagerly, and ways to read it.
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
def captured_logs(name, level=None):
    """Collect what one torch logger emits (instead of printing it to stderr); `level` lowers
    the logger's level meanwhile, for a log that is off by default."""
    records, logger = [], logging.getLogger(name)
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    saved = logger.propagate, logger.level
    logger.addHandler(handler)
    logger.propagate = False
    if level is not None:
        logger.setLevel(level)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.propagate, _ = saved
        logger.setLevel(saved[1])


# %% [markdown]
# ## 1. Inductor: the first call and the generated code
#
# Eager PyTorch runs one kernel per operation: `((x * 1.5 + 0.5).relu() - 0.25) * 2.0` is
# five kernels, each reading a whole tensor and writing a new one. Inductor fuses the
# chain into one loop that reads `x` once and writes the result once.
#
# **Predict.** The first call of the compiled chain traces, lowers, writes C++ and compiles
# it. Seconds or milliseconds? And the same function again after `torch._dynamo.reset()`?

# %%
def chain(x):
    return ((x * 1.5 + 0.5).relu() - 0.25) * 2.0  # 5 elementwise ops


def gelu_chain(x):
    return (F.gelu(x * 1.5 + 0.5) - 0.25) * 2.0  # 5 ops, GELU computes erf


import torch._inductor.compile_fx  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402  (Dynamo's and Inductor's event counts)
from torch._inductor.cpu_vec_isa import pick_vec_isa  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402


def first_call(cfn, *args):
    """Seconds of one call cfn(*args), and the Python wrapper code Inductor generated for it.
    run_and_get_code resets Dynamo before the call, so the call always compiles (from the
    disk cache when it can)."""
    t0 = time.perf_counter()
    _, code = run_and_get_code(cfn, *args)
    return time.perf_counter() - t0, code


def cache_events():
    """AOTAutograd's and Inductor's (FX graph) cache hits and misses counted so far."""
    aot, fx = counters["aot_autograd"], counters["inductor"]
    return collections.Counter({"AOTAutograd hit": aot["autograd_cache_hit"], "AOTAutograd miss": aot["autograd_cache_miss"],
                                "FX graph hit": fx["fxgraph_cache_hit"], "FX graph miss": fx["fxgraph_cache_miss"]})


xs = torch.randn(2048, 1024)  # (2048, 1024) fp32: 8 MiB
cchain = torch.compile(chain, dynamic=False)  # dynamic=False: one kernel per input size
# AOTAutograd's cache logs every entry of its key at DEBUG level: section 2 reads it.
with captured_logs("torch._functorch._aot_autograd.autograd_cache", logging.DEBUG) as key_log:
    t_first, chain_code = first_call(cchain, xs)
print(f"chain, first call: {t_first:.2f} s")
events_before = cache_events()
t_again, again_code = first_call(cchain, xs)  # after a reset: the same graph again
again_events = {k: v - events_before[k] for k, v in cache_events().items()}
print(f"chain, first call after a reset: {t_again:.2f} s (first / again: {t_first / t_again:.1f})")
print(f"  its cache events: {again_events}")
print(f"the same code generated again: {again_code == chain_code}")
cgelu = torch.compile(gelu_chain, dynamic=False)
t_gelu, gelu_code = first_call(cgelu, xs)
print(f"gelu chain, first call: {t_gelu:.2f} s")

# %% [markdown]
# Output:
# ```text
# chain, first call: «time» s
# chain, first call after a reset: «time» s (first / again: «ratio»)
#   its cache events: {'AOTAutograd hit': 1, 'AOTAutograd miss': 0, 'FX graph hit': 1, 'FX graph miss': 0}
# the same code generated again: True
# gelu chain, first call: «time» s
# ```
#
# Seconds, when this is the process's first compile (run the script or a fresh notebook).
# The first call runs the whole pipeline: Dynamo captures the graph, AOTAutograd turns it
# into ATen operators, Inductor decides what to fuse, writes a C++ loop for each fused
# group, compiles it with the system's C++ compiler and loads the library; the first
# compile in a process also sets Inductor up. How long that takes depends on the machine,
# its load and above all the disk cache: with an empty `TORCHINDUCTOR_CACHE_DIR` the C++
# compiler runs, once the cache holds this graph's code it is loaded instead.
#
# `run_and_get_code` (in `torch._inductor.utils`; PyTorch's own tests use it) calls
# `torch._dynamo.reset()` before it runs the function, so each `first_call` really goes
# through the compiler. The reset throws away what Dynamo holds in memory, not the disk
# cache: on the second line Dynamo captures the same graph again and both caches hit (the
# third line counts the hits; section 2 counts such hits again), so nothing is lowered and no C++
# compiler runs. The ratio says how much of the first call was one-time work: Inductor's
# set-up in this process and, with an empty cache, the C++ compile. The GELU chain is a different graph and needs code of its own. On a
# CPU, then: keep the number of distinct compiled functions small, and keep the cache
# directory between runs.
#
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
# `Vectorized` at all; there, the compiled chain runs slower than eager.

# %% [markdown]
# ## 2. The cache: its key, and artifacts to carry
#
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
# records that rule, not what it gave on your CPU.
#
# So two machines with the same PyTorch and settings compute the same key for the chain,
# while the code behind it differs (16 floats per step on one, 8 on another). A cache
# directory shared between different machines (a network home directory, a container image
# or a CI cache built on another host) hands one machine the kernels compiled for another,
# and PyTorch 2.13.0 does not notice: kernels compiled under AVX-512 and loaded under
# `ATEN_CPU_CAPABILITY=avx2` return wrong values without any error. Give each kind of
# machine its own `TORCHINDUCTOR_CACHE_DIR`.
#
# **Predict.** `torch.compiler.save_cache_artifacts()` packs what the compiles so far put
# into the caches into one `bytes` object, and `load_cache_artifacts` writes it into
# another process's caches (a "warm start" for a job on a fresh machine). How large is the
# chain's? Loaded into an empty cache directory, does the chain's next first call compile,
# or hit the caches?

# %%
from torch._inductor.utils import fresh_cache  # noqa: E402
from torch.compiler._cache import CacheArtifactManager  # noqa: E402


with CacheArtifactManager.with_fresh_cache():  # keep only what this block compiles
    first_call(cchain, xs)  # the chain's graph again, from the disk cache
    artifact_bytes, artifact_info = torch.compiler.save_cache_artifacts()
artifact_kinds = {kind: len(keys) for kind, keys in sorted(artifact_info.artifacts.items())}
print(f"artifacts of the chain: {artifact_kinds}; size between 10 kB and 1 MB: {10e3 < len(artifact_bytes) < 1e6}")
before = cache_events()
with fresh_cache():  # an empty cache directory, as on a new machine (then deleted)
    torch.compiler.load_cache_artifacts(artifact_bytes)
    _, loaded_code = first_call(cchain, xs)
after = cache_events()
print(f"first call after loading them into an empty cache: { {k: after[k] - before[k] for k in after} }")
print(f"the same code as section 1's: {loaded_code == chain_code}")

# %% [markdown]
# Output:
# ```text
# artifacts of the chain: {'aot_autograd': 1, 'inductor': 1}; size between 10 kB and 1 MB: True
# first call after loading them into an empty cache: {'AOTAutograd hit': 1, 'AOTAutograd miss': 0, 'FX graph hit': 1, 'FX graph miss': 0}
# the same code as section 1's: True
# ```
#
# Less than a megabyte for one small graph, one entry from each cache: AOTAutograd's and
# Inductor's. Loaded into an empty cache, they make the next compile a hit in both: Dynamo
# still captures, but nothing is lowered and no C++ compiler runs, and the code is the
# same. Where this helps: a job that starts on a fresh machine or container each time can
# load the artifacts of an earlier run instead of compiling everything again. The key of the
# previous cell still applies: the artifacts hold code for the CPU that made them, so load
# them only on the same kind of machine.

# %% [markdown]
# ## 3. What Inductor leaves to ATen, and what its settings choose
#
# Inductor generates code for the operations it has a *lowering* for and calls ATen's
# kernel for the rest, a *fallback*. Its `perf_hints` log (`TORCH_LOGS=perf_hints`) says,
# while it lowers a graph, where it chose something that may cost speed.
#
# **Predict.** Compile lesson 07a's SDPA with Inductor. Will the generated file hold a C++
# attention kernel, or call one? What will `perf_hints` say?

# %%
def attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, S, D)


@contextlib.contextmanager
def perf_hints():
    """What Inductor's perf_hints log says inside the block, as a list (nothing printed):
    each module logs to a logger of its own, '<module>.__perf_hints', off by default."""
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.endswith(".__perf_hints")]
    hints, handler = [], logging.Handler()
    handler.emit = lambda record: hints.append(record.getMessage())
    saved = [(logger, logger.level, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)  # on, as TORCH_LOGS=perf_hints would turn it on
        logger.propagate = False  # to our list, not to stderr
    try:
        yield hints
    finally:
        for logger, level, propagate in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate


gen = torch.Generator().manual_seed(7)
q, k, v = (torch.randn(1, 2, 64, 16, generator=gen) for _ in range(3))
# The log speaks while Inductor lowers a graph, and a graph found in a cache is not lowered:
# both caches off for this one compile (without a C++ kernel, no C++ compiler runs).
with (perf_hints() as hints, torch._inductor.config.patch(fx_graph_cache=False),
      torch._functorch.config.patch(enable_autograd_cache=False)):
    sdpa_out, sdpa_code = run_and_get_code(torch.compile(attend), q, k, v)
sdpa_kernels, _ = kernels_and_buffers(sdpa_code)
sdpa_calls = sorted(set(re.findall(r"torch\.ops\.(aten\.\w+)\.default\(", sdpa_code[0])))
print(f"perf_hints: {hints}")
print(f"generated kernels: {sdpa_kernels}; the wrapper calls {sdpa_calls}")
print(f"equal to eager: {torch.equal(sdpa_out, attend(q, k, v))}")

# %% [markdown]
# Output:
# ```text
# perf_hints: ['Skip comprehensive padding on CPU', 'Using FallbackKernel: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default']
# generated kernels: []; the wrapper calls ['aten._scaled_dot_product_flash_attention_for_cpu']
# equal to eager: True
# ```
#
# No kernel of Inductor's own: the wrapper calls the same CPU flash kernel that lesson 08a
# found in AOTAutograd's graph, and the result is eager's, bit for bit. The log says so
# (`Using FallbackKernel`), and adds that *comprehensive padding* (padding the strides of
# pointwise and reduction outputs) is skipped on a CPU (`disable_padding_cpu`, read from
# `torch/_inductor/config.py`). Other hints, about reductions and tiling, come from the
# code generator for GPUs (read from `torch/_inductor/codegen/simd.py`).
#
# **Predict.** `torch.compile(mode=...)` takes `"default"`, `"reduce-overhead"`,
# `"max-autotune"` and `"max-autotune-no-cudagraphs"`. What does each change?

# %%
for mode in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
    print(f"{mode:<27} {torch._inductor.list_mode_options(mode)}")
print(f"max_autotune_gemm_backends = {torch._inductor.config.max_autotune_gemm_backends!r}")

# %% [markdown]
# Output:
# ```text
# default                     {}
# reduce-overhead             {'triton.cudagraphs': True}
# max-autotune                {'max_autotune': True, 'triton.cudagraphs': True, 'coordinate_descent_tuning': True}
# max-autotune-no-cudagraphs  {'max_autotune': True, 'coordinate_descent_tuning': True}
# max_autotune_gemm_backends = 'ATEN,TRITON,CPP'
# ```
#
# A mode is a bundle of Inductor settings. `reduce-overhead` turns on CUDA graphs: on a
# GPU the compiled function's kernel launches are recorded once and replayed with a single
# launch, which removes per-kernel CPU overhead, the regime of small batches (unverified on
# a GPU). A replayed CUDA graph reuses its output memory: call
# `torch.compiler.cudagraph_mark_step_begin()` before each training or inference step, and
# clone an output you keep across steps.
#
# The `max-autotune` modes benchmark several kernel configurations at compile time, so they
# compile much longer; for matmuls the candidates come from the backends in
# `max_autotune_gemm_backends` (the environment variable
# `TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS` sets it; *Going further* says what each
# backend adds). Without max-autotune, a matmul is a call to ATen's kernel, the fallback of
# the previous cell.

# %% [markdown]
# ## 4. What fusion buys: two floors, in and out of the cache
#
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
    for name in ("compiled", "gelu compiled"):  # warm-up: a reset dropped their compiled code
        if name in ways:
            ways[name]()
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
# not 128 MiB, the 8 MiB case runs from the cache and the 64 MiB case from main memory.
#
# - **8 MiB.** Both floors move data at cache speed and cost about the same (within 2×
#   on a busy machine): `clone` allocates, but the allocator hands it the block the
#   previous call freed, already mapped (no page faults). The compiled chain does one
#   pass, as predicted, and runs close to `clone`. Eager does five passes with five
#   fresh results and costs several times more. The compiled GELU chain also makes one
#   pass but stays well above the floor: `erf` costs enough arithmetic per element that
#   one core cannot keep up with memory. Fusion removed the traffic; what remains is
#   compute.
# - **64 MiB.** `copy_` drops to what main memory delivers, and `clone` drops much further:
#   each call gets a fresh 64 MiB mapping from the operating system, and every page of it
#   faults on first touch (the printed count; on Windows the line says `not counted`).
#   glibc's allocator returns blocks above its mmap threshold (32 MiB at most, by default)
#   to the system when they are freed, so the next call maps them again; 8 MiB stays in the
#   process. The compiled chain allocates its result the same way and runs at `clone`'s
#   speed, many times slower than `copy_`: past the cache, the page faults of a fresh output
#   cost more than all of the arithmetic. Eager pays them five times. On a CPU, reuse
#   buffers (`out=`) for large results in hot loops.
# - The byte count predicts the order, not the exact ratio: how a loop stores, and what the
#   caches keep between passes, move the measured ratios (`eager out=`, five passes into a
#   buffer allocated once, is usually below 5 times `copy_`).
#
# On a GPU, PyTorch's CUDA caching allocator keeps freed blocks and hands them out again
# without asking the driver, so a fresh output should cost nothing there: `clone` should
# keep pace with `copy_` (unverified on a GPU). The results agree with eager to 1e-5, not
# necessarily bit for bit: Inductor's generated loop computes each function with its own
# code, and may round in another order.

# %% [markdown]
# ## 5. Picture it
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
# The figure (`fusion.png`) draws every way as a bandwidth on a log scale. At 8 MiB the
# compiled bar stands next to the two floors and eager far below them. At 64 MiB the bars
# of everything that allocates its result (`clone`, compiled, eager) drop together, and
# `copy_`, which allocates nothing, stays far above them.

# %% [markdown]
# ## 6. Where to apply compile: each repeated block, or the whole training step
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
print(f"regional, grad, 8 blocks: {len(regional_graphs(grad=True, n=8)[0])} graphs")
dynamo.reset()
whole = CountingBackend()
torch.compile(make_blocks(), backend=whole)(torch.randn(2, 8))
print(f"whole model:       {len(whole.graphs)} graph, ops {graph_ops(whole.graphs[0]).count('linear')} linear")

# %% [markdown]
# Output:
# ```text
# regional, no grad: 1 graph, inputs ['l_fn_modules_0_parameters_weight_', 'l_fn_modules_0_parameters_bias_', 'l_args_0_']
# regional, grad:    2 graphs, failed guard: ["tensor 'args[0]' requires_grad mismatch. expected requires_grad=0"]
# regional, grad, 8 blocks: 2 graphs
# whole model:       1 graph, ops 4 linear
# ```
#
# The block's weight and bias are graph *inputs*, not constants, so one graph serves all
# four blocks: the other three pass its guards. With gradients there is one more: block 0
# receives the data (no `requires_grad`), blocks 1 to 3 receive an activation that requires
# grad, and `requires_grad` is guarded. Still two graphs with eight blocks, where the whole
# model is one graph as long as all its blocks together, traced and compiled again for
# each change of depth.
#
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
#   graph 0, as one node.
# - **The update is a graph of its own**, and on purpose: `opt.step()` runs through
#   `_use_grad` in `torch/optim/optimizer.py`, which calls `torch._dynamo.graph_break()`
#   before the update and after it (the 2 user-inserted breaks), so that AOTAutograd sees the
#   update alone, without gradients, and keeps its in-place writes visible to the compiler
#   (its comment says why). Graph 1 holds the whole Adam update of the 4 parameters, 76 ops.
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
# of elementwise ops over every parameter, the kind of chain Inductor fuses (section 1
# fused a chain of five into one kernel), where eager runs each op for each parameter.
# This cell's backend, `aot_eager`, generates no code: it shows the graph, not a speed-up.
# The backward is the part Dynamo never sees. *Compiled autograd*
# (`torch._dynamo.config.compiled_autograd = True`, here patched for the cell only) is for
# that: when `.backward()` runs, it captures the autograd graph that actually exists as one
# more Dynamo graph and hands it to the same backend. The last lines show it: a new graph 1
# between the forward and the update, holding the backward's ATen ops (`mm`,
# `gelu_backward`, `mse_loss_backward`) and the `AccumulateGrad` that writes each `.grad`,
# with the same result within 1e-5.
#
# Data-parallel training wraps the model once more, in DDP or FSDP2, whose hooks send
# gradients while the backward runs; where the compiled regions begin and end then decides
# when those hooks can fire. Lesson 13b shows compile inside DDP and FSDP2, after lessons 09
# to 12 have taught both wrappers.

# %% [markdown]
# ## 7. Where next: structured logs and ahead-of-time compilation
#
# On a real model the tools of these two parts print too much to read: hundreds of graphs,
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
# recompile. Each compile logs its start, its graph, its guards and a record of metrics
# (`compilation_metrics`: op and guard counts, times, cache hits, the reasons); artifacts
# carry longer texts, such as each graph break's reason with its line. The file is written
# for a program: `tlparse`, a separate tool (`pip install tlparse`), turns it into a
# browsable report. It is the first thing to collect when a large model compiles slowly or
# recompiles often.
#
# AOTInductor (`torch._inductor.aoti_compile_and_package`, with a graph from
# `torch.export`) runs the same Inductor pipeline ahead of time and writes the result to a
# package file, for serving a model without Dynamo's tracing at start-up. This lesson does
# not run it.

# %% [markdown]
# ## Summary
#
# - Inductor fuses an elementwise chain into one C++ loop, as wide as the CPU's vectors,
#   with one allocation per call. The first call costs seconds on a CPU; the disk cache
#   makes later runs cheaper. `torch._inductor.utils.run_and_get_code` returns the
#   generated code; `TORCH_LOGS=output_code` prints it.
# - The cache key holds the graph, the inputs' metadata, the settings and the versions, but
#   not the CPU's instruction set: one cache directory per kind of machine.
#   `save_cache_artifacts` / `load_cache_artifacts` carry a compile into an empty cache,
#   where the next compile hits both caches.
# - What Inductor has no lowering for it leaves to ATen: SDPA on the CPU is a call to the
#   flash kernel, and `perf_hints` says `Using FallbackKernel`. `mode=` is a bundle of
#   Inductor settings (`reduce-overhead` = CUDA graphs, `max-autotune` = benchmarked
#   kernels); `max_autotune_gemm_backends` lists where matmul candidates come from.
# - Fused, the chain runs close to a `clone` in the cache and several times faster than
#   eager; compute-heavy ops (erf) stay above that floor. Past the last-level cache a fresh
#   large output costs page faults, compiled or not; preallocated buffers avoid them.
# - The figure draws the same timings as bandwidths.
# - Compiling each repeated block reuses one graph (two with gradients) whatever the depth.
#   A training step compiled whole made three graphs: forward and loss, the optimizer's
#   update (cut out on purpose by `torch.optim`) and the rest; `loss.backward()` is a
#   graph break, and compiled autograd captures the backward as one more graph.
# - `TORCH_TRACE=dir` (read when `torch` is imported) makes every compile write a structured
#   log: one JSON event per line, each compile's graph, guards and metrics, with its
#   recompile reason; `tlparse` renders it as a report.

# %% [markdown]
# ## Going further
#
# ### Where max-autotune's matmul candidates come from
#
# Section 3 printed `max_autotune_gemm_backends = 'ATEN,TRITON,CPP'`. Read from
# `torch/_inductor/config.py` and `torch/_inductor/utils.py`: `ATEN` keeps ATen's own matmul
# among the candidates, `TRITON` adds Inductor's Triton templates (GPUs), `CPP` its C++
# GEMM template for the CPU (`use_cpp_gemm_template`: only under max-autotune, with weight
# prepacking on, for constant weights), and `CUTLASS`, `CK` and others add vendor libraries'
# templates on NVIDIA and AMD GPUs.

# %% [markdown]
# ## References
#
# - [`torch.compile`](https://docs.pytorch.org/docs/2.13/generated/torch.compile.html): the
#   modes and `options`, Inductor's settings.
# - [`torch.compiler.save_cache_artifacts`](https://docs.pytorch.org/docs/2.13/generated/torch.compiler.save_cache_artifacts.html)
#   and [`torch.compiler.load_cache_artifacts`](https://docs.pytorch.org/docs/2.13/generated/torch.compiler.load_cache_artifacts.html):
#   section 2's warm start.
# - [`torch.compiler.cudagraph_mark_step_begin`](https://docs.pytorch.org/docs/2.13/generated/torch.compiler.cudagraph_mark_step_begin.html):
#   the call `reduce-overhead` asks for before each step.
# - [`torch.nn.Module.compile`](https://docs.pytorch.org/docs/2.13/generated/torch.nn.Module.compile.html):
#   compiling a module in place, block by block in section 6.
# - [`torch.export`](https://docs.pytorch.org/docs/2.13/export.html): the whole-graph capture
#   that AOTInductor compiles ahead of time.
# - Dao et al., [FlashAttention](https://arxiv.org/abs/2205.14135) (2022): the algorithm of
#   the CPU kernel that Inductor calls for SDPA in section 3.

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each path is relative to the folder that holds your installed
# `torch` (your site-packages), and the line numbers are those of your installation. The
# stops follow the graph into Inductor: the backend's entry, what its cache key hashes, the
# artifacts that carry a compile, the fallback that section 3's log reported, the GEMM
# backends of max-autotune, and the graph breaks that `torch.optim` asks for.

# %%
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's source map, sourcemap.py
from sourcemap import read_the_source  # noqa: E402

read_the_source([
    ("torch/_inductor/compile_fx.py", "def compile_fx(",
     "Inductor as a backend (`backend=\"inductor\"` calls it; its docstring says it calls into "
     "AOTAutograd). `_compile_fx_main`, below, wraps `compile_fx_inner` as the forward and "
     "backward compilers and passes Inductor's own decomposition table "
     "(`select_decomp_table()`) to the same `aot_autograd` helper that lesson 08a used. The "
     "lowering is `_InProcessFxCompile.codegen_and_compile`: `GraphLowering(gm, ...)`, "
     "`graph.run(*example_inputs)` over the ATen graph, then `graph.compile_to_module()`, which "
     "generates section 1's wrapper and kernel and loads them. It runs only when neither "
     "AOTAutograd's cache nor Inductor's FX graph cache already holds the graph."),
    ("torch/_inductor/codecache.py", "class FxGraphHashDetails:",
     "What the FX graph cache hashes: its `__init__` keeps the graph (`gm`), the inputs' "
     "metadata (`example_inputs`), `deterministic_algorithms_settings`, on a CPU "
     "`cpp_runtime_thread_count`, the `default_dtype`, then `torch_version` (`torch_key()`), "
     "`system_info` and `inductor_config`: section 2's entries, none of which names the CPU's "
     "vector instructions. `AOTAutogradCacheDetails`, in "
     "`torch/_functorch/_aot_autograd/autograd_cache.py`, subclasses it for AOTAutograd's key."),
    ("torch/compiler/_cache.py", "class CacheArtifactManager:",
     "Section 2's artifacts. Every cache that writes an entry calls `record_artifact`, which "
     "appends it to `_new_cache_artifacts` (`_seen_artifacts` keeps duplicates out); "
     "`serialize`, behind `save_cache_artifacts`, turns the list into bytes, and "
     "`populate_caches`, behind `load_cache_artifacts`, writes each artifact back into its "
     "cache. `with_fresh_cache` swaps in an empty record for the block, as the lesson's cell "
     "did."),
    ("torch/_inductor/graph.py", "def warn_fallback(",
     "Section 3's `Using FallbackKernel: ...`: `FallbackKernel.__init__` in `ir.py` calls it "
     "for every ATen op that Inductor calls instead of generating code, and it logs each "
     "op's name once per graph to the `perf_hints` logger."),
    ("torch/_inductor/config.py", "max_autotune_gemm_backends = os.environ.get(",
     "The comment above it lists the GEMM backends section 3 printed and what each one is; "
     "`_use_autotune_backend` in `utils.py` reads the list, and `use_cpp_gemm_template` there "
     "adds the CPU's C++ template only under max-autotune."),
    ("torch/optim/optimizer.py", "def _use_grad_for_differentiable(",
     "The wrapper around every optimizer's `step`. While Dynamo traces it, it calls "
     "`torch._dynamo.graph_break()` before and after the update, and its comment says why: "
     "AOTAutograd should see the update alone, without gradients, so that its in-place "
     "writes stay visible: section 6's graph 1 and its two user-inserted breaks."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/_inductor/compile_fx.py:«line»  `def compile_fx(`
#     Inductor as a backend (`backend="inductor"` calls it; its docstring says it calls
#     into AOTAutograd). `_compile_fx_main`, below, wraps `compile_fx_inner` as the
#     forward and backward compilers and passes Inductor's own decomposition table
#     (`select_decomp_table()`) to the same `aot_autograd` helper that lesson 08a used.
#     The lowering is `_InProcessFxCompile.codegen_and_compile`: `GraphLowering(gm, ...)`,
#     `graph.run(*example_inputs)` over the ATen graph, then `graph.compile_to_module()`,
#     which generates section 1's wrapper and kernel and loads them. It runs only when
#     neither AOTAutograd's cache nor Inductor's FX graph cache already holds the graph.
# torch/_inductor/codecache.py:«line»  `class FxGraphHashDetails:`
#     What the FX graph cache hashes: its `__init__` keeps the graph (`gm`), the inputs'
#     metadata (`example_inputs`), `deterministic_algorithms_settings`, on a CPU
#     `cpp_runtime_thread_count`, the `default_dtype`, then `torch_version`
#     (`torch_key()`), `system_info` and `inductor_config`: section 2's entries, none of
#     which names the CPU's vector instructions. `AOTAutogradCacheDetails`, in
#     `torch/_functorch/_aot_autograd/autograd_cache.py`, subclasses it for AOTAutograd's
#     key.
# torch/compiler/_cache.py:«line»  `class CacheArtifactManager:`
#     Section 2's artifacts. Every cache that writes an entry calls `record_artifact`,
#     which appends it to `_new_cache_artifacts` (`_seen_artifacts` keeps duplicates out);
#     `serialize`, behind `save_cache_artifacts`, turns the list into bytes, and
#     `populate_caches`, behind `load_cache_artifacts`, writes each artifact back into its
#     cache. `with_fresh_cache` swaps in an empty record for the block, as the lesson's
#     cell did.
# torch/_inductor/graph.py:«line»  `def warn_fallback(`
#     Section 3's `Using FallbackKernel: ...`: `FallbackKernel.__init__` in `ir.py` calls
#     it for every ATen op that Inductor calls instead of generating code, and it logs
#     each op's name once per graph to the `perf_hints` logger.
# torch/_inductor/config.py:«line»  `max_autotune_gemm_backends = os.environ.get(`
#     The comment above it lists the GEMM backends section 3 printed and what each one is;
#     `_use_autotune_backend` in `utils.py` reads the list, and `use_cpp_gemm_template`
#     there adds the CPU's C++ template only under max-autotune.
# torch/optim/optimizer.py:«line»  `def _use_grad_for_differentiable(`
#     The wrapper around every optimizer's `step`. While Dynamo traces it, it calls
#     `torch._dynamo.graph_break()` before and after the update, and its comment says why:
#     AOTAutograd should see the update alone, without gradients, so that its in-place
#     writes stay visible: section 6's graph 1 and its two user-inserted breaks.
# ```

# %% [markdown]
# ## Mastery check
#
# 1. **Tell them apart.** Three reports about compiled code: (a) one call of a function
#    became three graphs; (b) a later call captured again although the function had not
#    changed; (c) the first call spent its time after capture, with no more graphs than
#    before. Which is a graph break, which a guard failure, which kernel compilation, and
#    what in this lesson showed each?
#
#    <details><summary>Answer</summary>
#
#    (a) Graph breaks: the whole training step made 3 graphs in one call, split by
#    `Unsupported Tensor.backward() call`, the two `torch._dynamo.graph_break()` calls that
#    `torch.optim` makes around the update, and the skipped `Optimizer.zero_grad`
#    (*§ Where to apply compile: each repeated block, or the whole training step*). (b) A
#    guard failure: with gradients, block 1 of the regionally compiled model failed
#    `tensor 'args[0]' requires_grad mismatch` and captured a second graph (same section).
#    (c) Kernel compilation: Inductor's work on a graph already captured. The chain's first
#    call took seconds, and `run_and_get_code` returned one generated file with one fused
#    kernel, `cpp_fused_add_mul_relu_sub_0`, and the same code again after
#    `torch._dynamo.reset()` (*§ Inductor: the first call and the generated code*).
#
#    </details>
#
# 2. **Explain.** A team keeps `TORCHINDUCTOR_CACHE_DIR` on a network drive that every
#    machine mounts, to save compile time. Why can that return wrong values, and what
#    should they do instead?
#
#    <details><summary>Answer</summary>
#
#    The cache key hashes the graph, the inputs' metadata, the settings and the versions,
#    but none of its entries names an instruction set (`entries that name an instruction
#    set: 0`; `cpp.simdlen = None` records the rule "pick the width from the CPU", not the
#    width). The generated loop's step is the CPU's vector width, so a machine with other
#    vectors finds the same key and loads kernels made for another CPU. One cache
#    directory per kind of machine; artifacts from `save_cache_artifacts` likewise go only
#    to the same kind of machine (*§ The cache: its key, and artifacts to carry*).
#
#    </details>
#
# 3. **Predict.** A model calls `F.scaled_dot_product_attention` on CPU tensors and is
#    compiled with Inductor. Does Inductor generate an attention kernel? How would you find
#    out without reading the generated code?
#
#    <details><summary>Answer</summary>
#
#    No: the generated wrapper had no kernel of its own (`generated kernels: []`) and called
#    `aten._scaled_dot_product_flash_attention_for_cpu`, with a result equal to eager's.
#    The `perf_hints` log said so: `Using FallbackKernel:
#    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default`
#    (*§ What Inductor leaves to ATen, and what its settings choose*).
#
#    </details>
#
# 4. **Predict.** A compiled chain writes a fresh 64 MiB result on every call, on one CPU
#    core. Will it run near `copy_` into a preallocated buffer, as an 8 MiB one did? Why?
#
#    <details><summary>Answer</summary>
#
#    No. At 8 MiB the freed block is handed out again, already mapped, and the compiled
#    chain ran close to `clone`. At 64 MiB every call gets a fresh mapping from the
#    operating system and each page faults on first touch (the printed page-fault count),
#    so `clone` and the compiled chain, which allocates its result the same way, fall far
#    below `copy_` (*§ What fusion buys: two floors, in and out of the cache*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder:
#
# 1. `train_step(model, opt, x, y)`: section 6's training step, written so that, compiled
#    whole, it breaks the graph 3 times instead of 4 (no break at `zero_grad`), with the
#    same parameters as the eager step after several steps. Hint: what does
#    `opt.zero_grad()` do to each parameter by default?
#
# Check your answer with `make exercises N=08b`: the tests compile your step with a
# counting backend that runs `aot_eager` (no Inductor) and compare with eager.
# `solutions.py` has one way.

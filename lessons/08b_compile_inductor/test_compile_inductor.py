"""Tests of lesson 08b: documented outputs; the lesson's key values, read from its run (the
timing tests may call the compiled chain again, from the warm disk cache): the generated
code, the cache key, the cache artifacts, SDPA's fallback and the perf_hints log, the modes
and GEMM backends, the fusion timings against the two floors and their figure, regional
compilation and the whole training step, the structured log; the exercise (a counting
backend that runs aot_eager); slow tests for what needs fresh processes (the lesson under
TORCH_LOGS=output_code, Inductor's vector width and cache under simulated CPUs, TORCH_TRACE
read at import); and, on CUDA, compiled vs eager, the caching allocator against the clone
floor, and mode="reduce-overhead" recording and replaying a CUDA graph."""

import collections
import ctypes
import functools
import importlib
import inspect
import mmap
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

try:
    import resource  # Unix only
except ImportError:
    resource = None

import pytest
import torch
import torch._dynamo as dynamo

from scripts.pytest_course import cuda_median_ms


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_first_calls(lesson):
    ns = lesson.ns
    # The reset really sends the same graph through the compiler again: the same wrapper code
    # comes back. (How much faster the second call is depends on whether this process had
    # compiled before: in the test suite another lesson may have, so times are not compared.)
    assert ns["again_code"] == ns["chain_code"] and len(ns["again_code"]) == 1
    assert ns["gelu_code"] != ns["chain_code"]
    assert min(ns["t_first"], ns["t_again"], ns["t_gelu"]) > 0
    # the prose: after the reset both caches hit, so nothing is lowered again
    assert ns["again_events"] == {"AOTAutograd hit": 1, "AOTAutograd miss": 0, "FX graph hit": 1, "FX graph miss": 0}


X86_LANES = {"AVX512": 16, "AVX2": 8, "DEFAULT": 1}  # fp32 floats per step, by ATen's level


def test_generated_code(lesson):
    ns = lesson.ns
    find = ns["kernels_and_buffers"]
    assert len(ns["chain_code"]) == len(ns["gelu_code"]) == 1  # one wrapper file per graph
    assert find(ns["chain_code"]) == (["cpp_fused_add_mul_relu_sub_0"], 1)
    assert find(ns["gelu_code"]) == (["cpp_fused_add_gelu_mul_sub_0"], 1)
    src, step = ns["chain_code"][0], ns["step"]
    assert step == ns["lanes"] and ns["bits"] == 32 * step
    assert ("at::vec::Vectorized<float>" in src) == (step > 1)
    assert "2097152L" in ns["loop"] and ns["loop"].endswith(f"({step}L))")
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert step == X86_LANES[torch.backends.cpu.get_cpu_capability()]


def test_cache_key(lesson):
    ns = lesson.ns
    entries, fields = ns["entries"], ns["fields"]
    assert set(ns["KEY_FIELDS"]) <= fields  # every field the lesson describes is in the key
    assert ns["settings"]["cpp.simdlen"] == "None" and len(ns["settings"]) > 100
    assert ns["threads"] == "1"
    text = "\n".join(v for *_, v in entries).lower()
    assert not ns["ISA_NAMES"].search(text)
    isa = ns["isa"]
    if isa:  # e.g. "avx512": the ISA Inductor compiled for is nowhere in the key
        assert str(isa).lower() not in text
    assert ns["ISA_NAMES"].search("avx512_vnni avx2 neon sve256")  # the pattern does match ISAs


def test_cache_artifacts(lesson):
    """save_cache_artifacts: one entry from each cache, under 1 MB; loaded into an empty cache,
    the next first call hits both caches and generates section 1's code."""
    ns = lesson.ns
    assert ns["artifact_kinds"] == {"aot_autograd": 1, "inductor": 1}
    assert 10e3 < len(ns["artifact_bytes"]) < 1e6
    after, before = ns["after"], ns["before"]
    delta = {k: after[k] - before[k] for k in after}
    assert delta == {"AOTAutograd hit": 1, "AOTAutograd miss": 0, "FX graph hit": 1, "FX graph miss": 0}
    assert ns["loaded_code"] == ns["chain_code"]


def test_cache_artifacts_are_needed_for_the_hits(lesson):
    """Without loading the artifacts, an empty cache misses (the hits above are the
    artifacts' doing). Compiles the chain for a shape nobody compiled, in a throwaway cache."""
    ns = lesson.ns
    before = ns["cache_events"]()
    with ns["fresh_cache"]():
        torch.compile(ns["chain"], dynamic=False)(torch.randn(8, 8))
    after = ns["cache_events"]()
    assert after["FX graph miss"] - before["FX graph miss"] == 1
    assert after["FX graph hit"] == before["FX graph hit"]


def test_sdpa_is_a_fallback_and_perf_hints_say_so(lesson):
    ns = lesson.ns
    assert "Using FallbackKernel: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default" in ns["hints"]
    assert "Skip comprehensive padding on CPU" in ns["hints"]
    assert ns["sdpa_kernels"] == [] and ns["sdpa_calls"] == ["aten._scaled_dot_product_flash_attention_for_cpu"]
    assert len(ns["sdpa_code"]) == 1 and "cpp_fused" not in ns["sdpa_code"][0]
    assert torch.equal(ns["sdpa_out"], ns["attend"](ns["q"], ns["k"], ns["v"]))
    assert torch._inductor.config.fx_graph_cache is True  # the patch was undone
    assert torch._functorch.config.enable_autograd_cache is True


def test_perf_hints_collects_instead_of_printing(lesson, capfd):
    """The helper leaves the loggers as it found them, and nothing reaches stderr."""
    import logging

    ns = lesson.ns
    name = "torch._inductor.graph.__perf_hints"
    level, propagate = logging.getLogger(name).level, logging.getLogger(name).propagate
    with ns["perf_hints"]() as hints:
        logging.getLogger(name).info("Using FallbackKernel: %s", "probe")
    assert hints == ["Using FallbackKernel: probe"] and capfd.readouterr().err == ""
    assert (logging.getLogger(name).level, logging.getLogger(name).propagate) == (level, propagate)


def test_gemm_backends_read_from_the_source(lesson):
    """The prose 'read from torch/_inductor/config.py and utils.py': the default list, the
    comment that names each backend, and the CPU template's two conditions."""
    import torch._inductor.config as config
    import torch._inductor.utils as utils

    if "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS" not in os.environ:
        assert config.max_autotune_gemm_backends == "ATEN,TRITON,CPP"
    source = inspect.getsource(config)
    comment = source[:source.index("max_autotune_gemm_backends = os.environ.get(")].rsplit("\n\n", 1)[1]
    for name in ("ATen", "Triton", "CUTLASS", "CK", "CPP"):
        assert f"# {name}:" in comment, name
    cpp = inspect.getsource(utils.use_cpp_gemm_template)
    assert '_use_autotune_backend("CPP")' in cpp and "config.cpp.weight_prepack" in cpp
    assert "config.max_autotune or config.max_autotune_gemm" in inspect.getsource(utils._use_template_for_cpu)
    padding = torch._inductor.compile_fx.maybe_disable_comprehensive_padding
    assert "config.disable_padding_cpu" in inspect.getsource(padding)


def remeasured(ns, x, t, ways, burst, holds=lambda t: t["compiled"] <= 1.5 * t["clone"], rounds=3):
    """t's fastest times, lowered by up to `rounds` more measurements of `ways` while
    `holds(t)` is false: load only adds time, so the minimum stands. A busy machine can
    inflate every call of one measurement (the other core streaming memory too: a 64 MiB
    copy_ at 17 ms instead of 12), so a claim is judged on the least disturbed times."""
    t = dict(t)
    for _ in range(rounds):
        if holds(t):
            break
        again = ns["fastest_ms"](ways, burst=burst, repeats=30, budget_s=2.0)
        t = {k: min(t[k], again.get(k, t[k])) for k in t}
    return t


def fresh_mapping_ms(ways, pages, rounds=8):
    """Fastest ms of each of `ways` over the calls that page-faulted at least half of `pages`
    (Linux): calls whose result got a fresh mapping. glibc usually maps a 64 MiB result
    afresh, but a suite run once had a 64 MiB clone as fast as copy_, a call that mapped no
    new pages (which memory served it was not found; a test worker has run other lessons
    first); a claim about fresh results compares such calls only.
    {name: (ms or inf, calls that faulted)}."""
    best = {name: (float("inf"), 0) for name in ways}
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None) if sys.platform == "linux" else None
    for _ in range(rounds):
        for name, fn in ways.items():
            if trim:  # glibc: give free heap pages back, so a reused heap block faults too
                trim(0)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
            if resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before >= pages / 2:
                best[name] = (min(best[name][0], ms), best[name][1] + 1)
    return best


def test_fresh_mapping_ms_keeps_only_faulting_calls():
    if resource is None:
        pytest.skip("no resource module (Windows): no page-fault counts")
    x = torch.randn(8192, 2048)  # 64 MiB
    out = torch.empty_like(x).copy_(x)  # every page of out touched: mapped from now on
    got = fresh_mapping_ms({"copy_": lambda: out.copy_(x), "zeros": lambda: torch.zeros_like(x)},
                           pages=x.nbytes / mmap.PAGESIZE, rounds=2)
    assert got["copy_"] == (float("inf"), 0)  # writes into mapped pages: never counted
    if sys.platform == "linux":
        assert got["zeros"][1] >= 1 and got["zeros"][0] < float("inf"), got


def test_compiled_within_1_5_of_the_clone_floor(lesson):
    """The compiled chain allocates its result as clone does, and makes one pass as clone
    does: within 1.5 times clone's time at both sizes, measured again if the machine was busy.
    At 64 MiB on Linux both are judged on calls that got a fresh mapping (fresh_mapping_ms)."""
    ns = lesson.ns
    if not ns["isa"]:
        pytest.skip("no vector ISA: Inductor's scalar loop is slower than eager here (see the slow tests)")
    cchain = ns["cchain"]
    for label, x in ns["sizes"].items():
        ways = {"clone": lambda: x.clone(), "compiled": lambda: cchain(x)}
        if label == "large" and sys.platform == "linux":
            t = {}
            for _ in range(3):  # load only adds time: stop once the least disturbed calls agree
                got = fresh_mapping_ms(ways, pages=x.nbytes / mmap.PAGESIZE)
                t = {k: min(t.get(k, float("inf")), ms) for k, (ms, _) in got.items()}
                if t["compiled"] <= 1.5 * t["clone"]:
                    break
            assert t["clone"] < float("inf"), ("no clone call page-faulted", got)
        else:
            t = remeasured(ns, x, ns["timings"][label], ways, 3 if x.nbytes <= 16 * 2**20 else 1)
        assert t["compiled"] <= 1.5 * t["clone"], (label, t)


def test_fusion_timings(lesson):
    ns = lesson.ns
    timings, sizes = ns["timings"], ns["sizes"]
    assert list(timings) == ["small", "large"] and ns["same"] == {"small": True, "large": True, "gelu": True}
    assert sizes["small"].nbytes == 8 * 2**20 and sizes["large"].nbytes == 64 * 2**20
    assert "gelu compiled" in timings["small"] and "gelu compiled" not in timings["large"]
    for label, t in timings.items():
        assert set(t) >= {"copy_", "clone", "eager", "eager out=", "compiled"}
        # five passes against one. A busy neighbour can inflate the lesson's one copy_ measurement
        # (a fresh-clone CI run: 64 MiB copy_ 31.5 ms, eager out= 43.7 ms; 12 ms quiet), so the
        # claim is judged on the least disturbed times, as in test_compiled_within_1_5_of_the_clone_floor.
        x, out = sizes[label], torch.empty_like(sizes[label])
        ways = {"copy_": lambda: out.copy_(x), "eager out=": lambda: ns["chain_out"](x, out)}
        t = remeasured(ns, x, {k: t[k] for k in ways}, ways, 3 if x.nbytes <= 16 * 2**20 else 1,
                       holds=lambda t: t["eager out="] > 1.5 * t["copy_"])
        assert t["eager out="] > 1.5 * t["copy_"], (label, t)
    if not ns["isa"]:
        pytest.skip("no vector ISA: Inductor's scalar loop is slower than eager here (see the slow tests)")
    for t in timings.values():
        assert t["eager"] > 1.5 * t["compiled"]  # five passes and five results against one
    # erf: compute, not memory. A busy machine slows the memory-bound chain more than the
    # compute-bound one (a suite run had compiled at 1.44 ms, 0.8 quiet: 1.34x), so the claim
    # is judged on the least disturbed times, as below.
    x, cchain, cgelu = sizes["small"], ns["cchain"], ns["cgelu"]
    ways = {"compiled": lambda: cchain(x), "gelu compiled": lambda: cgelu(x)}
    small = remeasured(ns, x, timings["small"], ways, burst=3,
                       holds=lambda t: t["gelu compiled"] > 1.5 * t["compiled"])
    assert small["gelu compiled"] > 1.5 * small["compiled"], small


def test_past_the_cache(lesson):
    """The prose on the 64 MiB case: copy_ slows down past the last-level cache, and clone
    (a fresh mapping, every page faulted) slows down much more."""
    ns = lesson.ns
    small, large, faults = ns["timings"]["small"], ns["timings"]["large"], ns["faults"]
    per_byte = {k: large[k] / small[k] / 8 for k in ("copy_", "clone")}  # 8x the bytes
    llc = ns["llc_mib"]()
    if 16 < llc < 128:  # 16 MiB in the cache, 128 MiB past it
        assert per_byte["copy_"] > 1.5, per_byte
    assert small["clone"] < 2 * small["copy_"], small  # in the cache, both floors alike
    if sys.platform == "linux":  # glibc: a 64 MiB block is mapped afresh on every call
        pages = ns["sizes"]["small"].nbytes / mmap.PAGESIZE
        assert faults["small"] < pages / 10, faults  # the freed 8 MiB block is reused
        assert faults["large"] >= 10 and faults["large"] > faults["small"]
        x, out, cchain = ns["sizes"]["large"], torch.empty_like(ns["sizes"]["large"]), ns["cchain"]
        fresh = fresh_mapping_ms({"clone": lambda: x.clone(), "compiled": lambda: cchain(x)}, pages=8 * pages)
        assert all(calls for _, calls in fresh.values()), ("a call that never faulted", fresh)
        t = {"copy_": large["copy_"], **{k: ms for k, (ms, _) in fresh.items()}}
        for _ in range(3):  # a busy machine slows copy_ most: judge on its least disturbed time
            if min(t["clone"], t["compiled"]) > 2 * t["copy_"]:
                break
            again = ns["fastest_ms"]({"copy_": lambda: out.copy_(x)}, repeats=30, budget_s=2.0)
            t["copy_"] = min(t["copy_"], again["copy_"])
        assert t["clone"] > 2 * t["copy_"], (t, fresh)
        assert t["compiled"] > 2 * t["copy_"], (t, fresh)


def test_figure_shows_the_bandwidths(lesson):
    ns = lesson.ns
    timings, sizes = ns["timings"], ns["sizes"]
    fig = ns["plot_fusion"](timings, sizes)
    (ax,) = fig.get_axes()
    kinds = ns["KINDS"]
    assert kinds == ["copy_", "clone", "compiled", "eager out=", "eager"]
    assert [c.get_label() for c in ax.containers] == kinds
    for kind, bars in zip(kinds, ax.containers):
        heights = [r.get_height() for r in bars.patches]
        expected = [2 * sizes[label].nbytes / t[kind] / 1e6 for label, t in timings.items()]
        assert heights == pytest.approx(expected)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["x of 8 MiB", "x of 64 MiB"]
    assert ax.get_yscale() == "log" and ax.get_ylabel().startswith("GB/s")
    assert (ns["HERE"] / "fusion.png").is_file()


# ----------------------------------------------------------------------------------------
# Slow: fresh processes (the lesson under TORCH_LOGS, Inductor under simulated CPUs)

ROOT = Path(__file__).resolve().parents[2]
LEVELS = {  # as scripts/portable.py simulates them
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}
PROBE = textwrap.dedent("""
    import re, time, torch
    from torch._inductor.utils import run_and_get_code
    torch.set_num_threads(1)
    def chain(x):
        return ((x * 1.5 + 0.5).relu() - 0.25) * 2.0
    x = torch.randn(2048, 1024, generator=torch.Generator().manual_seed(0))
    cchain = torch.compile(chain)
    out, (code,) = run_and_get_code(cchain, x)
    step = re.search(r"x0\\+=static_cast<int64_t>\\((\\d+)L\\)", code).group(1)
    def fastest(fn):
        times = []
        for _ in range(6):
            t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
        return min(times)
    ratio = fastest(lambda: cchain(x)) / fastest(lambda: chain(x))
    print(torch.backends.cpu.get_cpu_capability(), step, (out - chain(x)).abs().max().item(), ratio)
""")


def probe(cache, level=None):
    """(capability, floats per step, max |compiled - eager|, compiled time / eager time) of
    the chain in a fresh process."""
    env = {**os.environ, **LEVELS.get(level, {}), "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cap, step, err, ratio = proc.stdout.split()
    return cap, int(step), float(err), float(ratio)


@functools.cache
def fresh_probe(level):
    """probe() with an empty cache of its own: one run per level in a test session (the two
    slow tests below both need the AVX2 one; each run is a cold compile of several seconds)."""
    with tempfile.TemporaryDirectory() as cache:
        return probe(cache, level)


def x86_capability():
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("simulated CPU levels are x86 ones")
    return torch.backends.cpu.get_cpu_capability()


@pytest.mark.slow
def test_vector_width_under_simulated_cpus():
    """The prose: 8 floats per step under AVX2, faster than eager; with no vector ISA a scalar
    loop, slower than eager's kernels (each level with its own empty cache); correct results
    in both."""
    host = x86_capability()
    for level, lanes in [("avx2", 8), ("default", 1)]:
        if level == "avx2" and host not in ("AVX512", "AVX2"):
            continue
        cap, step, err, ratio = fresh_probe(level)
        assert (cap, step) == (level.upper(), lanes) and err == 0.0
        assert ratio < 1 if lanes > 1 else ratio > 1, (level, ratio)


@pytest.mark.slow
def test_cache_shared_across_isas_gives_wrong_values():
    """The prose: the cache key ignores the vector ISA, so kernels compiled under AVX-512 and
    loaded under AVX2 return wrong values. (Only this direction: the other one corrupts the
    heap.) A throwaway cache, never the course's."""
    if x86_capability() != "AVX512":
        pytest.skip("needs an AVX-512 host to compile the AVX-512 kernel")
    with tempfile.TemporaryDirectory() as cache:
        assert probe(cache)[:3] == ("AVX512", 16, 0.0)  # written under AVX-512: right
        cap, step, err, _ = probe(cache, "avx2")  # read back under AVX2
    assert cap == "AVX2" and step == 16, "the AVX-512 code was reused"
    assert err > 1.0, f"max error {err}"
    assert fresh_probe("avx2")[:3] == ("AVX2", 8, 0.0)  # its own cache: right


@pytest.mark.slow
def test_lesson_runs_under_torch_logs_output_code():
    """The lesson recommends TORCH_LOGS=output_code: it must run, and print the same, with it
    (TORCH_LOGS overrides every torch._logging.set_logs call in the process)."""
    env = {**os.environ, "TORCH_LOGS": "output_code"}
    script = ROOT / "lessons" / "08b_compile_inductor" / "compile_inductor.py"
    proc = subprocess.run([sys.executable, "-m", "scripts.checker", str(script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "documented outputs match" in proc.stdout
    assert "cpp_fused_add_mul_relu_sub_0" in proc.stderr  # the log did print the code


def test_compile_modes(lesson):
    from torch._inductor import list_mode_options

    assert list_mode_options("reduce-overhead") == {"triton.cudagraphs": True}
    assert list_mode_options("max-autotune-no-cudagraphs").get("max_autotune") is True
    assert callable(torch.compiler.cudagraph_mark_step_begin)


def test_regional_compilation(lesson):
    ns = lesson.ns
    for n in (4, 8):
        graphs, failed = ns["regional_graphs"](grad=False, n=n)
        assert len(graphs) == 1 and failed == []
        graphs, failed = ns["regional_graphs"](grad=True, n=n)
        assert len(graphs) == 2 and len(failed) == 1 and "requires_grad mismatch" in failed[0]
    assert len(ns["whole"].graphs) == 1
    assert ns["graph_ops"](ns["whole"].graphs[0]).count("linear") == 4


def test_whole_training_step(lesson):
    """The prose on the compiled training step: 3 graphs captured in the first step; breaks at
    backward (naming trace_autograd_ops), twice inside torch.optim on purpose, and at
    zero_grad; the update is every parameter's Adam ops with the bias corrections as tensor
    ops (pow); close to eager but not bit for bit; compiled autograd adds the backward."""
    ns = lesson.ns
    ops = [ns["graph_ops"](gm) for gm in ns["step_backend"].graphs]
    assert ns["first"] == 3 and len(ops) == 3
    assert ops[0].count("linear") == 2 and "mse_loss" in ops[0] and ops[2] == ["detach"]
    assert ops[1].count("lerp_") == 4 and ops[1].count("pow") == 8  # 4 parameters, 2 corrections each
    assert "linear" not in ops[1] and "mse_loss" not in ops[1]
    breaks = {r.splitlines()[0]: (r, k) for r, k in ns["step_breaks"].items()}
    assert breaks["Unsupported Tensor.backward() call"][1] == 1
    assert "trace_autograd_ops" in breaks["Unsupported Tensor.backward() call"][0]
    assert breaks["Call to `torch._dynamo.graph_break()`"][1] == 2
    assert "Optimizer.zero_grad" in breaks["Attempted to inline function marked as skipped"][0]
    optimizer = importlib.import_module("torch.optim.optimizer")
    assert inspect.getsource(optimizer._use_grad_for_differentiable).count("torch._dynamo.graph_break()") == 2
    assert "is_compiling()" in inspect.getsource(optimizer._get_value)
    gap = ns["max_gap"](ns["step_end"], ns["eager_end"])
    assert 0 < gap < 1e-5, gap
    ca = [ns["graph_ops"](gm) for gm in ns["ca_backend"].graphs]
    assert len(ca) == 4 and ca[0] == ops[0] and ca[2] == ops[1] and ca[3] == ops[2]
    assert {"AccumulateGrad", "gelu_backward.default", "mm.default", "mse_loss_backward.default"} <= set(ca[1])
    assert ca[1].count("AccumulateGrad") == 4
    assert ns["max_gap"](ns["ca_end"], ns["eager_end"]) < 1e-5
    assert dynamo.config.compiled_autograd is False


def test_torch_trace_structured_log(lesson):
    """The prose on the TORCH_TRACE cell: one file per process, four compiles with their
    recompile reasons, each with its start, graph, guards and metrics (op and guard counts,
    times, cache hits), and artifacts with each break's reason and line."""
    ns = lesson.ns
    (log,) = ns["trace_files"]
    assert log.name.startswith("dedicated_log_torch_trace_") and log.suffix == ".log"
    metrics = [e["compilation_metrics"] for e in ns["events"] if "compilation_metrics" in e]
    assert [m["compile_id"] for m in metrics] == ["0/0", "1/0", "0/1", "1/1"]
    assert [m["co_name"] for m in metrics] == ["f", "torch_dynamo_resume_in_f_at_6"] * 2
    assert [m["recompile_reason"] is None for m in metrics] == [True, True, False, False]
    assert "dtype mismatch" in metrics[2]["recompile_reason"]
    for key in ("graph_op_count", "guard_count", "duration_us", "aotautograd_local_cache_hit_count"):
        assert all(key in m for m in metrics), key
    for kind in ("dynamo_start", "dynamo_output_graph", "dynamo_cpp_guards_str", "compilation_metrics"):
        assert ns["kinds"][kind] == 4, kind
    assert ns["trace_text"].count("Graph break in user code at <string>:6") == 2
    assert ns["TRACED"].splitlines()[5].strip() == "torch._dynamo.graph_break()"  # line 6


@pytest.mark.slow
def test_torch_trace_is_read_when_torch_is_imported(tmp_path):
    """The prose: PyTorch reads TORCH_TRACE once, at import; set afterwards, nothing is written
    (hence the lesson's fresh process)."""
    code = textwrap.dedent(f"""
        import os, torch
        os.environ["TORCH_TRACE"] = {str(tmp_path)!r}
        torch.compile(lambda x: x.sin() * 2, backend="eager")(torch.ones(3))
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True,
                   env={k: v for k, v in os.environ.items() if k != "TORCH_TRACE"})
    assert list(tmp_path.iterdir()) == []


def test_aot_inductor_entry_point_exists():
    import torch._inductor

    assert callable(torch._inductor.aoti_compile_and_package) and callable(torch.export.export)


# ----------------------------------------------------------------------------------------
# Exercise: compiled with a counting backend that runs aot_eager, compared with eager


class AotCounting:
    """Keeps each graph and hands it to aot_eager (a real backward), as the lesson's."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def blocks(n=2):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()) for _ in range(n)])


def whole_step(model, opt, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def run(step, compiled, steps=3, lr=0.01):
    """steps of `step` with Adam on blocks(2): the backend, the graph breaks by reason, the
    losses, the parameters, and the .grad of every parameter after each step."""
    dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
    model, backend = blocks(), AotCounting()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    before = collections.Counter(dynamo.utils.counters["graph_break"])
    fn = torch.compile(step, backend=backend) if compiled else step
    losses, grads = [], []
    for _ in range(steps):
        losses.append(fn(model, opt, x, y))
        grads.append([p.grad for p in model.parameters()])
    breaks = collections.Counter(dynamo.utils.counters["graph_break"]) - before
    dynamo.reset()
    return backend, breaks, losses, [p.detach() for p in model.parameters()], grads


@pytest.mark.exercise("train_step")
def test_train_step_matches_eager(exercise_module):
    *_, losses, params, grads = run(exercise_module.train_step, compiled=False)
    *_, ref_losses, ref_params, _ = run(whole_step, compiled=False)
    for a, b in zip(losses + params, ref_losses + ref_params):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert all(all(g is None or not g.any() for g in step) for step in grads), "grads left after a step"


@pytest.mark.exercise("train_step")
def test_train_step_breaks_three_times(exercise_module):
    backend, breaks, losses, params, grads = run(exercise_module.train_step, compiled=True)
    *_, ref_losses, ref_params, _ = run(whole_step, compiled=False)
    reasons = " ".join(breaks)
    assert "zero_grad" not in reasons, "a graph break at zero_grad is left"
    assert breaks.total() == 3, dict(breaks)
    assert "Unsupported Tensor.backward() call" in reasons  # the step still runs backward
    for a, b in zip(losses + params, ref_losses + ref_params):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # compiled Adam: not bit for bit
    assert all(all(g is None or not g.any() for g in step) for step in grads), "grads left after a step"
    assert losses[0].requires_grad is False


# ----------------------------------------------------------------------------------------
# GPU: the same chain compiled vs eager; CUDA graphs on a launch-bound function


def cuda_ms(fn):
    return cuda_median_ms(fn, warmup=3, repeats=20)


@pytest.mark.cuda
def test_cuda_compiled_chain_and_the_caching_allocator(lesson, record_property):
    """Compiled beats eager on a bandwidth-bound chain, and a fresh output costs nothing
    extra on a GPU: the caching allocator reuses freed blocks, so clone keeps pace with
    copy_ (on the CPU, at 64 MiB, it did not)."""
    chain = lesson.ns["chain"]
    x = torch.randn(8192, 8192, device="cuda")  # 256 MiB: bandwidth-bound
    cchain = torch.compile(chain)
    torch.testing.assert_close(cchain(x), chain(x))
    out = torch.empty_like(x)
    t_eager, t_compiled = cuda_ms(lambda: chain(x)), cuda_ms(lambda: cchain(x))
    t_copy, t_clone = cuda_ms(lambda: out.copy_(x)), cuda_ms(lambda: x.clone())
    print(f"cuda: eager {t_eager:.3f} ms, compiled {t_compiled:.3f} ms, "
          f"copy_ {t_copy:.3f} ms, clone {t_clone:.3f} ms")
    for name, ms in (("eager", t_eager), ("compiled", t_compiled), ("copy_", t_copy), ("clone", t_clone)):
        record_property(f"chain 8192^2 fp32, {name} [ms]", ms)
    record_property("copy_ 8192^2 fp32, read + write bandwidth [GB/s]", 2 * x.nbytes / t_copy / 1e6)
    assert t_compiled < t_eager / 2  # one pass against five
    assert t_compiled < 1.5 * t_clone
    assert t_clone < 1.5 * t_copy  # no page faults: the block comes from the cache


def graph_launches(fn, calls):
    """cudaGraphLaunch calls the CUDA runtime saw while fn ran `calls` times (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("cudaGraphLaunch"))


@pytest.mark.cuda
def test_cuda_reduce_overhead_records_and_replays_a_graph(record_property):
    def small(x):  # four tiny kernels in eager: launch overhead dominates
        return ((x * 2 + 1).relu() - 0.5).sum()

    x = torch.randn(256, device="cuda")
    default = torch.compile(small)
    graphed = torch.compile(small, mode="reduce-overhead")  # records a CUDA graph, then replays it
    for _ in range(3):  # warm-up runs, then the recording
        torch.compiler.cudagraph_mark_step_begin()  # a new step: earlier outputs may be overwritten
        graphed(x).clone()
    torch.testing.assert_close(graphed(x).clone(), small(x))
    # replayed: one cudaGraphLaunch per call, and none for the default mode
    assert graph_launches(lambda: graphed(x), 5) == 5
    assert graph_launches(lambda: default(x), 5) == 0
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(x.device.index, create_if_none_exists=False)
    assert manager is not None and len(manager.roots) >= 1  # recorded: a graph tree exists
    t_eager = cuda_ms(lambda: small(x))
    t_default = cuda_ms(lambda: default(x))
    t_graphed = cuda_ms(lambda: graphed(x))
    print(f"cuda small: eager {t_eager:.4f} ms, compiled {t_default:.4f} ms, "
          f"reduce-overhead {t_graphed:.4f} ms")  # printed, not asserted: host-dependent
    record_property("small chain, eager [ms]", t_eager)
    record_property("small chain, compiled default [ms]", t_default)
    record_property("small chain, compiled reduce-overhead [ms]", t_graphed)
    assert min(t_eager, t_default, t_graphed) > 0



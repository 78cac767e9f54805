"""Tests of lesson 08: documented outputs, the lesson's key values (read from its run; the
timing test may call the compiled chain again, from the warm disk cache), its figure, the
exercises (with a counting backend); slow tests for what needs fresh processes (the lesson
under TORCH_LOGS=output_code, Inductor's vector width and cache under simulated CPUs,
TORCH_TRACE read at import); and,
on CUDA, compiled vs eager, the caching allocator against the clone floor, and
mode="reduce-overhead" recording and replaying a CUDA graph."""

import ctypes
import functools
import importlib
import inspect
import os
import mmap
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

from scripts.pytest_course import autograd_node_names, cuda_median_ms


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


class Counting:
    """A backend that records each FX graph and runs it eagerly (as the lesson's)."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_scalar_capture_and_guard(lesson):
    ns = lesson.ns
    graphs, ops, inputs = ns["counting"].graphs, ns["graph_ops"], ns["graph_inputs"]
    assert len(graphs) == 2  # 3 calls
    assert ops(graphs[0]) == ["square", "mul"] and inputs(graphs[0]) == ["l_x_"]  # 2.0 baked in
    assert ops(graphs[1]) == ["square", "item", "mul"] and len(inputs(graphs[1])) == 2
    assert ns["reasons"] == ["scale == 2.0"]  # read from Dynamo's record, not from a log


def test_new_scalar_value_makes_scale_an_input(lesson):
    """The lesson's prose: after the first change, further values reuse the second graph."""
    f, counting = lesson.ns["f"], Counting()
    dynamo.reset()
    cf = torch.compile(f, backend=counting)
    x = torch.randn(8)
    for scale in [2.0, 2.0, 3.0, 4.0, -0.5]:
        assert torch.equal(cf(x, scale), f(x, scale))
    assert len(counting.graphs) == 2
    assert lesson.ns["graph_ops"](counting.graphs[1]) == ["square", "item", "mul"]


def test_shapes_and_recompile_limit(lesson):
    ns = lesson.ns
    counts = {d: len(c.graphs) for d, (c, _) in ns["by_mode"].items()}
    assert counts == {None: 2, True: 1, False: dynamo.config.recompile_limit} and counts[False] == 8
    assert len(ns["lengths"]) > 8  # past the limit, or the last line proves nothing
    assert ns["graph_inputs"](ns["by_mode"][None][0].graphs[1])[0].startswith("s")  # a SymInt
    warnings = ns["by_mode"][False][1]
    assert len(warnings) == 1
    assert warnings[0].startswith("torch._dynamo hit config.recompile_limit (8)")
    assert ns["by_mode"][None][1] == [] and ns["by_mode"][True][1] == []


def test_graph_breaks(lesson):
    report = lesson.ns["report"]
    assert (report.graph_count, report.graph_break_count) == (3, 2)
    ops = [lesson.ns["graph_ops"](gm) for gm in report.graphs]
    assert ops == [["sin"], ["mul", "sum"], ["sub"]]  # the prose names these three graphs
    reasons = [b.reason for b in report.break_reasons]
    assert reasons[0].startswith("Failed to trace builtin operator") and "print" in reasons[0]
    assert reasons[1].startswith("Unsupported Tensor.item() call")
    with pytest.raises(dynamo.exc.Unsupported, match="Failed to trace builtin operator"):
        torch.compile(lesson.ns["h"], backend="eager", fullgraph=True)(torch.ones(3))


def test_stance_is_restored_and_refuses_first_compile(lesson):
    assert dynamo.eval_frame._stance.stance == "default"

    def fresh(x):
        return x + 1

    cfresh = torch.compile(fresh, backend="eager")
    with torch.compiler.set_stance("fail_on_recompile"):
        with pytest.raises(RuntimeError, match="fail_on_recompile"):
            cfresh(torch.ones(2))
    assert dynamo.eval_frame._stance.stance == "default"


def test_aot_eager_matches_eager_exactly(lesson):
    ref, got = lesson.ns["ref"], lesson.ns["got"]
    assert len(ref) == len(got) == 3
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    assert ref[1].shape == (32, 32) and ref[2].shape == (32, 8)


def test_backward_pass_autocast_gap(lesson):
    ns = lesson.ns
    gaps, largest = ns["gaps"], max(g.abs().max().item() for g in ns["eager_grads"])
    assert torch._functorch.config.backward_pass_autocast == "same_as_forward"  # restored
    assert gaps["off"] == [0.0, 0.0]
    # non-zero, and of the size of bf16 rounding (8 significant bits), not of a bug
    assert all(0 < g < largest * 2**-5 for g in gaps["same_as_forward"])
    assert ns["eager_grads"][0].dtype == torch.float32


def autocast_gaps(ns, forward, backward_inside):
    """Max |compiled - eager| of both gradients, per backward_pass_autocast setting, for a
    forward run under bf16 autocast and a backward run inside or outside that region."""
    xb, w1, w2 = ns["xb"], ns["w1"], ns["w2"]

    def grads(fn):
        w1.grad = w2.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = fn(xb, w1, w2)
            if backward_inside:
                loss.backward()
        if not backward_inside:
            loss.backward()
        return w1.grad.clone(), w2.grad.clone()

    eager, gaps = grads(forward), {}
    for mode in ["same_as_forward", "off"]:
        dynamo.reset()
        with torch._functorch.config.patch(backward_pass_autocast=mode):
            got = grads(torch.compile(forward, backend="aot_eager"))
        gaps[mode] = [(a - b).abs().max().item() for a, b in zip(got, eager)]
    return gaps


def test_backward_pass_autocast_the_other_cases(lesson):
    """The lesson's parenthesis: backward inside autocast reverses the roles of the two
    settings, and a forward that is bf16 throughout shows no gap with either."""
    ns = lesson.ns
    inside = autocast_gaps(ns, ns["mixed_loss"], backward_inside=True)
    assert inside["same_as_forward"] == [0.0, 0.0] and all(g > 0 for g in inside["off"])
    plain = autocast_gaps(ns, ns["mlp_loss"], backward_inside=False)
    assert plain == {"same_as_forward": [0.0, 0.0], "off": [0.0, 0.0]}


def test_first_calls(lesson):
    ns = lesson.ns
    # The reset really sends the same graph through the compiler again: the same wrapper code
    # comes back. (How much faster the second call is depends on whether this process had
    # compiled before: in the test suite another lesson may have, so times are not compared.)
    assert ns["again_code"] == ns["chain_code"] and len(ns["again_code"]) == 1
    assert ns["gelu_code"] != ns["chain_code"]
    assert min(ns["t_first"], ns["t_again"], ns["t_gelu"]) > 0


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
    for t in timings.values():
        assert set(t) >= {"copy_", "clone", "eager", "eager out=", "compiled"}
        assert t["eager out="] > 1.5 * t["copy_"]  # five passes against one
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
    script = ROOT / "lessons" / "08_compile" / "compile.py"
    proc = subprocess.run([sys.executable, "-m", "scripts.checker", str(script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "documented outputs match" in proc.stdout
    assert "cpp_fused_add_mul_relu_sub_0" in proc.stderr  # the log did print the code


# ----------------------------------------------------------------------------------------
# Exercises: compiled with a counting backend, compared with eager


def h_reference(x):
    z = x.sin() * 2
    return z + 1 if z.sum().item() > 0 else z - 1


@pytest.mark.exercise("h_fullgraph")
def test_h_fullgraph_is_one_graph(exercise_module):
    exercise_module.h_fullgraph(torch.ones(2))  # eagerly first: a stub raises plainly here
    dynamo.reset()
    counting = Counting()
    ch = torch.compile(exercise_module.h_fullgraph, backend=counting, fullgraph=True)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(6, generator=gen) for _ in range(6)]
    xs += [torch.zeros(6), torch.full((6,), 0.5), torch.full((6,), -0.5)]  # sum 0, > 0, < 0
    for x in xs:
        got = ch(x)
        assert got.shape == x.shape and got.dtype == x.dtype
        torch.testing.assert_close(got, h_reference(x), rtol=0, atol=1e-6)
    assert len(counting.graphs) == 1, "both branches must come from one graph"


@pytest.mark.exercise("h_fullgraph")
def test_h_fullgraph_eager(exercise_module):
    assert exercise_module.h_fullgraph(torch.zeros(3)).tolist() == [-1.0, -1.0, -1.0]
    x = torch.tensor([1.0, -0.25, 2.0], dtype=torch.float64)
    torch.testing.assert_close(exercise_module.h_fullgraph(x), h_reference(x))


def f_scaled(x, scale):
    return x.square() * scale


@pytest.mark.exercise("scale_arg")
def test_scale_arg_one_graph(exercise_module):
    dynamo.reset()
    counting = Counting()
    cf = torch.compile(f_scaled, backend=counting, dynamic=False)
    x = torch.randn(8, generator=torch.Generator().manual_seed(1))
    for s in [2.0, 3.0, 0.5, -1.25, 7.0]:
        got = cf(x, exercise_module.scale_arg(s))
        assert got.shape == x.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, f_scaled(x, s))
    assert len(counting.graphs) == 1, f"{len(counting.graphs)} graphs for 5 scales"


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


def test_aot_graph_is_functional_and_decomposed(lesson):
    ns = lesson.ns
    ops = ns["aot_forward_ops"](ns["scaled_silu"], torch.randn(4))
    assert ops == ["aten.mul.Tensor", "aten.add.Tensor", "aten.silu.default"]
    assert not any(op.split(".")[1].endswith("_") for op in ops)  # no in-place op survives
    decomposed = ns["aot_forward_ops"](ns["scaled_silu"], torch.randn(4), ns["core_aten_decompositions"]())
    assert "aten.silu.default" not in decomposed and "aten.sigmoid.default" in decomposed


def test_compile_modes():
    from torch._inductor import list_mode_options

    assert list_mode_options("reduce-overhead") == {"triton.cudagraphs": True}
    assert list_mode_options("max-autotune-no-cudagraphs").get("max_autotune") is True
    assert callable(torch.compiler.cudagraph_mark_step_begin)


def test_other_stances_and_the_old_limit_name(lesson):
    """The prose: `cache_size_limit` still reads the recompile limit; "force_eager" ignores
    torch.compile; "eager_on_recompile" runs a would-be recompile eagerly."""
    assert dynamo.config.cache_size_limit == dynamo.config.recompile_limit == 8

    def fresh(x):
        return x * 3

    dynamo.reset()
    counting = Counting()
    cf = torch.compile(fresh, backend=counting)
    with torch.compiler.set_stance("force_eager"):
        assert torch.equal(cf(torch.ones(3)), fresh(torch.ones(3)))
    assert counting.graphs == []
    cf(torch.ones(3))  # compiles: one graph
    with torch.compiler.set_stance("eager_on_recompile"):
        assert torch.equal(cf(torch.ones(2, 2)), fresh(torch.ones(2, 2)))  # a new rank, run eagerly
    assert len(counting.graphs) == 1


def test_capture_scalar_outputs_keeps_item_in_the_graph(lesson):
    """The prose's advice: with capture_scalar_outputs the .item() break disappears (the
    print and the data-dependent branch remain)."""
    dynamo.reset()
    with dynamo.config.patch(capture_scalar_outputs=True):
        report = dynamo.explain(lesson.ns["h"])(torch.ones(3))
    reasons = [b.reason for b in report.break_reasons]
    assert not any("Tensor.item()" in r for r in reasons), reasons


def test_tensor_guards_dtype_stride_not_values(lesson):
    """The prose: tensor inputs are guarded on dtype, device, rank, sizes and strides, not
    on values (sizes and rank are shown in the lesson)."""

    def fresh(x):
        return x * 2

    dynamo.reset()
    counting = Counting()
    cf = torch.compile(fresh, backend=counting, dynamic=False)
    x = torch.randn(4, 4)
    cf(x)
    cf(torch.randn(4, 4))  # new values: no new graph
    assert len(counting.graphs) == 1
    cf(x.double())  # new dtype
    assert len(counting.graphs) == 2
    cf(x.t())  # same sizes, other strides
    assert len(counting.graphs) == 3


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


def test_ddp_optimizer_splits_at_bucket_boundaries(lesson):
    ns = lesson.ns
    ops = ns["graph_ops"]
    for order in ["compile(DDP(model))", "DDP(model.compile())"]:
        split, whole = ns["ddp_runs"][order, True], ns["ddp_runs"][order, False]
        assert [ops(gm).count("linear") for gm in split[0]] == [1, 1, 1, 1]
        assert [ops(gm).count("linear") for gm in whole[0]] == [4]
        assert split[1] < 1e-6 and whole[1] < 1e-6
    # the prose: compiling the DDP module breaks the graph inside DDP's own forward (its
    # logger call, and _inside_ddp_forward, marked not to be traced); compile-then-wrap never
    for opt in [True, False]:
        breaks = ns["ddp_runs"]["compile(DDP(model))", opt][2]
        assert breaks.total() == 3
        assert any("set_runtime_stats_and_log" in reason for reason in breaks)
        assert any("_inside_ddp_forward" in reason for reason in breaks)
        assert ns["ddp_runs"]["DDP(model.compile())", opt][2].total() == 0
    assert ns["layer_bytes"] > 2**20  # each layer fills a 1 MiB bucket on its own
    assert dynamo.config.optimize_ddp is True and not torch.distributed.is_initialized()


def test_each_ddp_piece_is_one_backward_node(lesson):
    """The prose: a compiled region's backward is one autograd node; DDPOptimizer's split
    gives four of them (one per bucket), optimize_ddp=False one."""
    ns = lesson.ns
    counts = {}
    with ns["one_rank_group"]():
        for opt in [True, False]:
            dynamo.reset()
            saved, dynamo.config.optimize_ddp = dynamo.config.optimize_ddp, opt
            try:
                torch.manual_seed(0)
                ddp = torch.compile(ns["DDP"](ns["Stack"](), bucket_cap_mb=1), backend="aot_eager")
                loss = ddp(ns["xd"]).square().mean()
                counts[opt] = autograd_node_names(loss).count("CompiledFunctionBackward")
                loss.backward()
            finally:
                dynamo.config.optimize_ddp = saved
    dynamo.reset()
    assert counts == {True: 4, False: 1}


def test_ddp_split_follows_the_bucket_cap(lesson):
    """The cut moves with bucket_cap_mb: with 2 MiB, two layers share a graph. The last layer
    stays alone: DDPOptimizer's first bucket is 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES)."""
    ns = lesson.ns
    x = ns["xd"]
    with ns["one_rank_group"]():
        torch.manual_seed(0)
        ref = ns["train_step"](ns["DDP"](ns["Stack"](), bucket_cap_mb=2), x)
        graphs, gap, _ = ns["ddp_graphs"]("compile(DDP(model))", True, x, ref, cap=2)
    assert [ns["graph_ops"](gm).count("linear") for gm in graphs] == [1, 2, 1]
    assert gap < 1e-6
    assert torch.distributed._DEFAULT_FIRST_BUCKET_BYTES == 2**20
    assert dynamo.config.optimize_ddp is True and not torch.distributed.is_initialized()


def test_fsdp2_compiled_blocks_keep_the_hooks_outside(lesson):
    ns = lesson.ns
    backend = ns["fsdp_backend"]
    assert [ns["graph_ops"](gm) for gm in backend.graphs] == [["linear", "relu", "add"]] * 2
    names = " ".join(str(n.target) for gm in backend.graphs for n in gm.graph.nodes)
    assert "all_gather" not in names and "reduce_scatter" not in names
    assert ns["at_rest"] == "DTensor" and "DTensor" not in backend.types
    assert ns["fsdp_gap"] < 1e-6
    assert isinstance(ns["fsdp_model"], torch.distributed.fsdp.FSDPModule)


def test_fsdp2_compiled_blocks_share_two_graphs_at_depth_8(lesson):
    """The prose: eight blocks give the same two graphs as four, the second one because block
    0's input does not require grad and block 1's does."""
    ns = lesson.ns
    dynamo.reset()
    backend = ns["InputTypes"]()
    with ns["one_rank_group"]():
        ns["train_step"](ns["fsdp_compiled"](backend, n=8), ns["xf"])
    failed = [r.splitlines()[0] for v in dynamo.utils.guard_failures.values() for r in v]
    dynamo.reset()
    assert [ns["graph_ops"](gm) for gm in backend.graphs] == [["linear", "relu", "add"]] * 2
    assert "DTensor" not in backend.types
    assert len(failed) == 1 and "requires_grad mismatch" in failed[0], failed


def test_fsdp2_whole_model_compile_captures_only_the_blocks(lesson):
    """The prose: FSDP2's hooks are never traced (torch._dynamo.disable), so compiling the whole
    sharded model breaks the graph at each block's hooks inside the root's loop; Dynamo runs
    the root's forward eagerly and captures only the blocks' forwards, never the head."""
    from torch.distributed.fsdp import fully_shard

    ns = lesson.ns
    dynamo.reset()
    backend = ns["AotCounting"]()
    with ns["one_rank_group"]():
        torch.manual_seed(0)
        model = ns["Tower"]()
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        gap = ns["max_gap"](ns["train_step"](torch.compile(model, backend=backend), ns["xf"]), ns["fsdp_ref"])
    dynamo.reset()
    assert [ns["graph_ops"](gm) for gm in backend.graphs] == [["linear", "relu", "add"]] * 2
    assert gap < 1e-6
    assert not torch.distributed.is_initialized()


def test_module_compile_on_sequential_captures_nothing(lesson):
    """pytorch/pytorch#150915 in 2.13.0: when this test fails, a release fixed it; update the
    lesson's prose and its summary."""
    assert lesson.ns["seq_counts"] == (0, 1)

"""Tests of lesson 08: documented outputs, the lesson's key values (read from its single run:
Inductor is never invoked again here), its figure, the exercises (with a counting backend),
and, on CUDA, compiled vs eager and mode="reduce-overhead"."""

import statistics
import time

import pytest
import torch
import torch._dynamo as dynamo


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
    assert len(ns["reasons"]) == 1
    assert ns["failed_guards"](ns["reasons"][0]) == ["scale == 2.0"]


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


def test_generated_code_is_one_kernel_per_chain(lesson):
    ns = lesson.ns
    find = ns["kernels_and_buffers"]
    assert find(ns["chain_files"]) == (["cpp_fused_add_mul_relu_sub_0"], 1, 1)
    assert find(ns["gelu_files"]) == (["cpp_fused_add_gelu_mul_sub_0"], 1, 1)
    assert ns["PyCodeCache"].load_by_key_path.__name__ == "load_by_key_path"  # spy removed


def test_fusion_timings(lesson):
    ns = lesson.ns
    timings, floor = ns["timings"], ns["floor"]
    assert list(timings) == ["chain", "gelu chain"]
    assert all(row["floor"] == floor > 0 for row in timings.values())
    assert ns["same"] == {"chain": True, "gelu chain": True}
    # ratios that hold however noisy the machine: fusing five passes into one beats eager
    chain, gelu = timings["chain"], timings["gelu chain"]
    assert chain["eager"] > 1.5 * chain["compiled"]
    assert gelu["eager"] > gelu["compiled"]
    assert ns["t_first"] > ns["t_again"]  # the first compile in the process costs most


def test_figure_shows_the_timings(lesson):
    ns = lesson.ns
    timings = ns["timings"]
    fig = ns["plot_fusion"](timings)
    (ax,) = fig.get_axes()
    kinds = ["eager", "compiled", "floor"]
    assert [c.get_label() for c in ax.containers] == kinds
    for kind, bars in zip(kinds, ax.containers):
        heights = [r.get_height() for r in bars.patches]
        assert heights == pytest.approx([row[kind] for row in timings.values()])
    labels = [t.get_text() for t in ax.texts]
    expected = [f"{row[k] / row['floor']:.1f}x" for k in kinds for row in timings.values()]
    assert labels == expected
    assert [t.get_text() for t in ax.get_xticklabels()] == list(timings)
    assert ax.get_ylabel() == "fastest of 15 calls (ms)"
    assert (ns["HERE"] / "fusion.png").is_file()


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


def cuda_ms(fn, warmup=3, repeats=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()  # kernels run asynchronously: stop the clock when they end
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@pytest.mark.cuda
def test_cuda_compiled_chain(lesson):
    chain = lesson.ns["chain"]
    x = torch.randn(8192, 8192, device="cuda")  # 256 MiB: bandwidth-bound
    cchain = torch.compile(chain)
    torch.testing.assert_close(cchain(x), chain(x))
    t_eager, t_compiled = cuda_ms(lambda: chain(x)), cuda_ms(lambda: cchain(x))
    out = torch.empty_like(x)
    t_floor = cuda_ms(lambda: out.copy_(x))
    print(f"cuda: eager {t_eager:.3f} ms, compiled {t_compiled:.3f} ms, floor {t_floor:.3f} ms")
    assert t_compiled < t_eager


@pytest.mark.cuda
def test_cuda_reduce_overhead():
    def small(x):  # four tiny kernels in eager: launch overhead dominates
        return ((x * 2 + 1).relu() - 0.5).sum()

    x = torch.randn(256, device="cuda")
    skips = dynamo.utils.counters["inductor"]["cudagraph_skips"]
    default = torch.compile(small)
    graphed = torch.compile(small, mode="reduce-overhead")  # replays a recorded CUDA graph
    for _ in range(3):  # warm-up runs, then the graph is recorded
        graphed(x).clone()
    torch.testing.assert_close(graphed(x).clone(), small(x))
    t_eager = cuda_ms(lambda: small(x))
    t_default = cuda_ms(lambda: default(x))
    t_graphed = cuda_ms(lambda: graphed(x))
    print(f"cuda small: eager {t_eager:.4f} ms, compiled {t_default:.4f} ms, "
          f"reduce-overhead {t_graphed:.4f} ms")
    # a CUDA graph was recorded and replayed (Inductor counts the cases where it gives up);
    # the timings are printed, not asserted: per-call overheads depend on the host CPU
    assert dynamo.utils.counters["inductor"]["cudagraph_skips"] == skips
    assert min(t_eager, t_default, t_graphed) > 0

"""Tests of lesson 07b: documented outputs, the lesson's key values (tiles and the online
softmax, what each backend saves for backward, the backends and their priority, the profiler's
view of each backend, the documented maturity, bf16 inside the kernels and under autocast, block
masks, uncompiled FlexAttention with soft-capping and a prefix LM, the compiled flex check), its
figures, the exercises, and on CUDA the backends' time and peak memory and FlexAttention's
backward.

The lesson compiles FlexAttention once, when the `lesson` fixture runs the script; these tests
read its results from `lesson.ns` and never compile flex again on the CPU. Uncompiled
FlexAttention warns once per process: the lesson's run is the first uncompiled call in it.
"""

import inspect
import math
import platform
import re
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, create_mask
from torch.utils._python_dispatch import TorchDispatchMode

from scripts.pytest_course import cuda_median_ms


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_tiles_and_the_score_count(lesson):
    ns = lesson.ns
    assert ns["score_cells"](1, 2, 8192) == 134_217_728 == 2 * 8192**2  # part 07a's count, re-defined
    assert ns["tile_bytes"]() == (128 + 2 * 128) * 128 * 2 + (128 * 128 + 128 * 128 + 2 * 128) * 4 == 230_400
    # the tile working set does not depend on S, and is far below the S=8192 scores
    assert ns["tile_bytes"]() < 4 * ns["score_cells"](1, 1, 1024)
    qkv3 = (torch.randn(1, 2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5)),) * 3
    torch.testing.assert_close(ns["formula"](*qkv3), F.scaled_dot_product_attention(*qkv3))  # 07a's reference


def test_memory_figure(lesson):
    ns = lesson.ns
    fig = ns["plot_memory"](ns["seq_lens"])
    (ax,) = fig.get_axes()
    lines = {line.get_label(): line for line in ax.get_lines()}
    s = lines["scores, fp32"].get_xdata()
    assert list(s) == ns["seq_lens"]
    assert (lines["scores, fp32"].get_ydata() == 4 * 2 * s**2).all()
    assert (lines["scores, bf16"].get_ydata() == 2 * 2 * s**2).all()
    tile = lines["tiled kernel working set"].get_ydata()
    assert (tile == tile[0]).all() and tile[0] == 2 * ns["tile_bytes"]()
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert (ns["HERE"] / "score_memory.png").is_file()


def test_online_softmax_worked_example(lesson):
    """Every number of the two-chunk example, recomputed by hand; and the function on other
    chunk sizes and random scores equals the softmax."""
    ns = lesson.ns
    e = math.exp
    (s1, m1, r1, p1, l1, acc1), (s2, m2, r2, p2, l2, acc2) = ns["online_steps"]
    assert (s1, m1, r1) == ([1.0, 2.0], 2.0, 0.0) and p1 == pytest.approx([e(-1), 1.0])
    assert l1 == pytest.approx(1 + e(-1)) and acc1 == pytest.approx(10 * e(-1) + 20)
    assert (s2, m2) == ([3.0, 0.0], 3.0) and r2 == pytest.approx(e(-1)) and p2 == pytest.approx([1.0, e(-3)])
    assert l2 == pytest.approx(l1 * e(-1) + 1 + e(-3)) and acc2 == pytest.approx(acc1 * e(-1) + 30 + 40 * e(-3))
    assert ns["out_online"] == pytest.approx(acc2 / l2) == pytest.approx(ns["direct"], abs=1e-12)
    g = torch.Generator().manual_seed(2)
    scores, values = (torch.randn(7, generator=g, dtype=torch.float64) * 4 for _ in range(2))
    direct = (torch.softmax(scores, 0) @ values).item()
    for chunk in (1, 3, 7):
        out, steps = ns["online_softmax"](scores.tolist(), values.tolist(), chunk)
        assert out == pytest.approx(direct, abs=1e-12) and len(steps) == math.ceil(7 / chunk)


def test_flash_saves_no_scores(lesson):
    ns = lesson.ns
    qs = ns["qs"]
    S = qs.shape[2]
    for backend, has_scores in (("MATH", True), ("FLASH_ATTENTION", False)):
        with sdpa_kernel(SDPBackend.__members__[backend]):
            o = F.scaled_dot_product_attention(qs, qs, qs)
        shapes = ns["saved_shapes"](o.grad_fn)
        assert any(s[-2:] == (S, S) for s in shapes) == has_scores, (backend, shapes)
    assert (1, 2, S) in shapes  # flash: one log-sum-exp per query row


def test_backends(lesson):
    ns = lesson.ns
    assert ns["backends"] == ["ERROR", "MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION",
                              "CUDNN_ATTENTION", "OVERRIDEABLE"]
    x = ns["x"]
    assert ns["sdpa_op"](x, x, x) == "aten::_scaled_dot_product_flash_attention_for_cpu"
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), pytest.raises(RuntimeError, match="No viable backend"):
        F.scaled_dot_product_attention(x, x, x)


def test_no_viable_backend_message():
    x = torch.randn(1, 2, 4, 8)
    with (
        sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION),
        pytest.raises(RuntimeError, match="turning off both the math kernel and the fused kernels"),
    ):
        F.scaled_dot_product_attention(x, x, x)


def test_set_priority_reorders_and_the_cpu_ignores_it(lesson):
    """sdpa_kernel's signature on 2.13.0; set_priority=True rewrites the global order for the
    block and restores it; without it the order is unchanged; the CPU chooser keeps its own
    order (flash, then math) whatever the global one says, and runs math only when flash is out.
    The default order printed is the one written in the installed ATen/Context.h."""
    ns = lesson.ns
    params = inspect.signature(sdpa_kernel).parameters
    assert list(params) == ["backends", "set_priority"] and params["set_priority"].default is False
    default = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION", "OVERRIDEABLE"]
    assert ns["priority"]() == ns["default_order"] == default
    x, op = ns["x"], ns["sdpa_op"]
    with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], set_priority=True):
        assert ns["priority"]()[:2] == ["MATH", "FLASH_ATTENTION"] and sorted(ns["priority"]()) == sorted(default)
        assert op(x, x, x) == "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert ns["priority"]() == default and ns["prioritised"] == "aten::_scaled_dot_product_flash_attention_for_cpu"
    with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]):
        assert ns["priority"]() == default  # the list alone enables, it does not reorder
    with sdpa_kernel([SDPBackend.MATH], set_priority=True):
        assert op(x, x, x) == "aten::_scaled_dot_product_attention_math"
    header = (Path(torch.__file__).parent / "include" / "ATen" / "Context.h").read_text()
    written = re.findall(r"SDPBackend::(\w+)", header[header.index("sdp_priority_order = {"):][:400])[:5]
    assert written == ["flash_attention", "efficient_attention", "math", "cudnn_attention", "overrideable"]


def test_profiler_shows_each_backend(lesson):
    """Lesson 06a's profiler on one SDPA call per backend: the composite on top, the backend's
    op under it; the math backend's two bmm and one softmax beneath; under the flash kernel
    only allocations and views."""
    ns = lesson.ns
    math_ops, flash_ops = ns["profiled"]("MATH"), ns["profiled"]("FLASH_ATTENTION")
    assert math_ops[:2] == ["scaled_dot_product_attention", "_scaled_dot_product_attention_math"]
    assert flash_ops[:2] == ["scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu"]
    assert math_ops.count("bmm") == 2 and math_ops.count("_softmax") == 1
    assert set(flash_ops[2:]) == {"empty", "empty_like", "empty_strided", "transpose", "as_strided"}


def test_documented_maturity(lesson):
    """The words quoted from the installed docstrings, and a pattern that finds nothing in a
    docstring that claims no such status."""
    pattern = lesson.ns["MATURITY"]

    def found(api):
        return pattern.findall(" ".join(api.__doc__.split()))

    from torch.nn.attention.flex_attention import flex_attention

    assert found(F.scaled_dot_product_attention) == [
        "This function is beta", "Grouped Query Attention (GQA) is an experimental feature"]
    assert found(sdpa_kernel) == ["This function is beta"]
    assert found(flex_attention) == ["`torch.nn.attention.flex_attention` is a prototype feature"]
    assert found(torch.matmul) == []


def test_sdp_kernel_is_deprecated(lesson):
    """The old call's FutureWarning escapes the lesson (the manifest allows it, and only it)."""
    old = [w for w in lesson.gated_warnings if "sdp_kernel" in w]
    assert len(old) == 1 and old[0].startswith("FutureWarning "), lesson.gated_warnings
    assert "torch.nn.attention.sdpa_kernel" in old[0]
    assert lesson.problems() == []  # allowed, and nothing else escaped


def test_math_backend_upcasts_bf16(lesson):
    ns = lesson.ns
    names = [n for n, _ in ns["log"].ops]
    assert "_safe_softmax" in names and ns["out_bf16"].dtype == torch.bfloat16
    assert all(d == torch.float32 for n, d in ns["log"].ops if n in ("bmm", "_safe_softmax"))
    err = ns["bf16_err"]
    rounded = (ns["ref64"].bfloat16().double() - ns["ref64"]).abs().mean().item()
    assert err["one rounding"] == rounded
    assert abs(err["MATH"] / rounded - 1) < 0.01, err  # measured: equal to 1e-6, on any CPU
    assert err["MATH"] * 1.2 < err["formula in bf16"], err
    assert err["FLASH"] > 1.1 * err["MATH"], err  # the printed line, on the lesson's own draw


def test_flash_rounds_the_probabilities_to_bf16():
    """The prose: the CPU flash kernel's bf16 error is more than 1.1 times the math backend's on
    independent q, k, v (on several draws, not only the lesson's: 1.36 to 1.48 over 40 draws,
    under AVX-512, AVX2 and no vector ISA alike), the math backend's is one bf16 rounding's
    within 1 % (measured: to 1e-6), and the gap vanishes with q = k = v."""
    def errors(q, k, v):
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        out = {}
        for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
            with sdpa_kernel(backend):
                out[backend] = (F.scaled_dot_product_attention(q, k, v).double() - ref).abs().mean().item()
        rounded = (ref.bfloat16().double() - ref).abs().mean().item()  # one bf16 rounding of the exact output
        return out[SDPBackend.MATH], out[SDPBackend.FLASH_ATTENTION], rounded

    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        q, k, v = (torch.randn(1, 2, 64, 64, generator=g).bfloat16() for _ in range(3))
        math_err, flash_err, rounded = errors(q, k, v)
        assert flash_err > 1.1 * math_err, (math_err, flash_err)
        assert abs(math_err / rounded - 1) < 0.01, (math_err, rounded)
    math_err, flash_err, _ = errors(q, q, q)
    assert flash_err < 1.1 * math_err, (math_err, flash_err)
    # why: with q = k = v each query's softmax leans hard on its own key
    p = torch.softmax(q.double() @ q.double().transpose(-2, -1) / 8, dim=-1)  # (1, 2, 64, 64), 1/sqrt(64)
    assert p.diagonal(dim1=-2, dim2=-1).mean() > 0.5


def test_sdpa_under_cpu_autocast(lesson):
    """Lesson 05b's autocast on SDPA: float32 inputs are cast to bf16 and the CPU flash kernel
    returns bf16; autocast switched off inside the region gives float32 back (the prose's way out)."""
    ns = lesson.ns
    x = ns["x"]
    assert x.dtype == torch.float32 and ns["out_autocast"].dtype == torch.bfloat16
    assert ns["autocast_log"].ops == [("_to_copy", torch.bfloat16)] * 3 + [
        ("_scaled_dot_product_flash_attention_for_cpu", torch.bfloat16)]
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autocast("cpu", enabled=False):
        assert F.scaled_dot_product_attention(x, x, x).dtype == torch.float32


def computed_block_fraction(keep, block=128):
    """Fraction of block-sized tiles of a dense (S, S) mask that hold at least one True."""
    n = keep.shape[0] // block
    tiles = keep.view(n, block, n, block).any(dim=3).any(dim=1)  # (n, n)
    return tiles.float().mean().item()


def test_block_masks(lesson):
    """Block sparsity from the dense masks; and the prose's account of create_block_mask: it
    evaluates the mask_mod on every pair (create_mask), then summarises each block."""
    source = inspect.getsource(create_block_mask)
    dense_first = source.index("create_mask(mask_mod, B, H, Q_LEN, KV_LEN, device)")
    assert dense_first < source.index("_convert_mask_to_block_mask(", dense_first)
    ns = lesson.ns
    S, dense, block_masks = ns["S_FLEX"], ns["dense"], ns["block_masks"]
    assert list(dense) == ["causal", "sliding window", "document", "document + causal"]
    for name, bm in block_masks.items():
        assert bm.shape == (1, 1, S, S) and bm.BLOCK_SIZE == (128, 128)
        assert bm.sparsity() == pytest.approx(100 * (1 - computed_block_fraction(dense[name])))
    assert block_masks["causal"].sparsity() == 37.5
    assert dense["causal"].sum() == S * (S + 1) // 2
    assert dense["document"].sum() == sum(n * n for n in ns["doc_lens"].tolist())
    assert dense["sliding window"].sum(dim=1).max() == ns["WINDOW"]


def test_mask_figure(lesson):
    ns = lesson.ns
    fig = ns["plot_masks"](ns["dense"], ns["block_masks"])
    axes = fig.get_axes()
    assert len(axes) == 4
    for ax, (name, keep) in zip(axes, ns["dense"].items()):
        assert ax.get_title() == f"{name}\nblock sparsity {ns['block_masks'][name].sparsity():.2f}%"
        (image,) = ax.get_images()
        assert (image.get_array() == keep.numpy()).all()
        assert ax.get_xlabel() == "key index"
    assert axes[0].get_ylabel() == "query index"
    assert (ns["HERE"] / "masks.png").is_file()


def test_uncompiled_flex_soft_cap_and_prefix_lm(lesson):
    """Uncompiled flex: one UserWarning (flex warns once per process, and the lesson's call is
    the first), the prefix-LM mask's rows, the cap's effect, and flex against the dense formula;
    the comparison can fail (the uncapped formula is far from flex's output). The mechanism the
    prose reads from the source: a warning, then torch.compile with the eager backend."""
    from torch._higher_order_ops import utils as hop_utils
    from torch.nn.attention import flex_attention as flex_module

    ns = lesson.ns
    (w,) = ns["caught"]
    assert w.category is UserWarning and "materializes the full scores matrix" in str(w.message)
    keep, P = ns["prefix_keep"], ns["PREFIX"]
    assert keep.sum(-1)[[0, 31, 32, 127]].tolist() == [32, 32, 33, 128]
    assert keep[:, :P].all() and torch.equal(keep[:, P:], torch.ones_like(keep).tril()[:, P:])
    assert ns["raw"].abs().max() > 40 and ns["capped"].abs().max() < ns["CAP"]
    assert (ns["out_capped"] - ns["dense_capped"]).abs().max() < 1e-5
    uncapped = torch.softmax(ns["raw"].masked_fill(~keep, float("-inf")), dim=-1) @ ns["vp"]
    assert (ns["out_capped"] - uncapped).abs().max() > 1e-2
    source = inspect.getsource(flex_module.flex_attention)
    assert "materializes the full scores matrix" in source and "setup_compilation_env" in source
    assert 'lookup_backend("eager")' in inspect.getsource(hop_utils.setup_compilation_env)


def test_flex_check(lesson):
    ns = lesson.ns
    if ns["FLEX_REFUSED"]:
        pytest.skip("PyTorch refuses compiled FlexAttention on this CPU (the lesson prints why)")
    assert ns["n_graphs"] == 1  # one compile for the four masks
    assert set(ns["errors"]) == set(ns["dense"]) and max(ns["errors"].values()) < 1e-5
    qr = ns["qr"]
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        ns["flex_attention"](qr, qr, qr, block_mask=ns["block_masks"]["causal"])
    # the dense reference really has the ALiBi bias: head 0 penalises distance 3 by 3/16
    bias = ns["dense_bias"](ns["dense"]["causal"])
    assert bias.shape == (1, 2, ns["S_FLEX"], ns["S_FLEX"])
    assert bias[0, 0, 5, 2] == -3 / 16 and bias[0, 1, 5, 2] == -3 / 256 and bias[0, 0, 2, 5] == -math.inf


def test_flex_cpu_requirement(lesson):
    """The prose: Inductor's CPU FlexAttention needs AVX2 and is off on macOS (2.13.0's check);
    the lesson's try-and-catch reaches the same verdict as that check, and as the checker's
    `when=no-cpu-flex-attention` condition that picks the documented block."""
    import inspect

    from scripts.checker import CONDITIONS
    from torch._inductor.kernel.flex import flex_cpu

    source = inspect.getsource(flex_cpu.check_cpu_supported)
    assert "_is_avx2_supported()" in source and '"default"' in source and '"darwin"' in source
    assert flex_cpu.check_cpu_supported() == (not lesson.ns["FLEX_REFUSED"])
    assert CONDITIONS["no-cpu-flex-attention"]() == lesson.ns["FLEX_REFUSED"]


class GraphCount:
    """A torch.compile backend that counts the graphs it is given and runs them as they are."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


@pytest.mark.slow
def test_one_graph_per_mask_function(lesson, monkeypatch):
    """The prose: section 4's four mask functions would compile four graphs, the interval
    masks one (counted with a backend that generates no code, so no Inductor)."""
    ns = lesson.ns
    main = types.ModuleType("__main__")  # the mask functions' globals, where Dynamo's guards look
    main.__dict__.update(ns)
    monkeypatch.setitem(sys.modules, "__main__", main)
    S, q = ns["S_FLEX"], ns["qf"]

    def graphs(mask_mods):
        torch._dynamo.reset()
        counter = GraphCount()
        flex = torch.compile(ns["flex_attention"], backend=counter)
        for mask_mod in mask_mods:
            flex(q, q, q, block_mask=create_block_mask(mask_mod, None, None, S, S, device="cpu"))
        return counter.graphs

    intervals = [ns["interval_mask"](first, last) for first, last in ns["intervals"].values()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # uncompiled flex warns that it materialises the scores
        assert graphs(intervals) == 1
        assert graphs(list(ns["mask_mods"].values())) == 4


def test_fused_not_always_faster(lesson):
    """The prose of Going further's dtype timing: math computes fp16 in fp32, the default still picks the
    flash kernel for fp16, and on an x86 CPU without oneDNN's fp16 matrix path the math
    backend beats flash in fp16 at the shape where flash wins in fp32, because an fp16
    matmul is slow there. Margins far from the measured values (fp16 about 0.55, fp32 1.2 to
    1.4 under AVX-512, AVX2 and no vector ISA; fp16 matmul 15 to 45 times fp32's): they hold
    with the cores loaded. Where oneDNN has the fp16 path (measured on a Xeon with AVX512-FP16),
    fp16 stays on flash's side and its matmul is still slower than fp32's: fp16 1.6 to 1.9
    natively (1.1 with ATEN_CPU_CAPABILITY=default), fp16 matmul 1.9 to 2.3 times fp32's."""
    ns = lesson.ns
    speed = ns["speed"]
    assert list(speed) == [torch.float32, torch.bfloat16, torch.float16]
    assert all(0 < r < 100 for r in speed.values()), speed
    t16 = torch.randn(1, 2, 128, 64, dtype=torch.float16)  # (B, H, S, D)
    assert ns["sdpa_op"](t16, t16, t16) == "aten::_scaled_dot_product_flash_attention_for_cpu"
    with sdpa_kernel(SDPBackend.MATH), ns["DtypeLog"]() as log:
        F.scaled_dot_product_attention(t16, t16, t16)
    assert [d for n, d in log.ops if n == "_to_copy"][:3] == [torch.float32] * 3
    assert all(d == torch.float32 for n, d in log.ops if n in ("bmm", "_safe_softmax"))
    assert log.ops == ns["log16"].ops  # the lesson's printed fp16 op log is this one
    assert 0 < ns["mm_slowdown"] < 1000, ns["mm_slowdown"]
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the timing claims are made for x86 CPUs")
    if ns["FP16_MATMUL"]:  # "fp16 stays on the flash kernel's side ... a small fp16 matmul can still be slower"
        assert speed[torch.float16] > 1.0, speed
        assert ns["mm_slowdown"] > 1.0, ns["mm_slowdown"]
        return
    assert speed[torch.float16] < 0.85, speed
    assert speed[torch.float32] > 1.0 and speed[torch.float32] > 1.5 * speed[torch.float16], speed
    assert ns["mm_slowdown"] > 3, ns["mm_slowdown"]  # the lesson's printed fp16/fp32 matmul ratio


# ----------------------------------------------------------------------------------------
# Exercises


def sdpa_math(*args, **kwargs):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(*args, **kwargs)


def qkv(gen, b=2, hq=2, hkv=None, L=5, S=5, d=4, dv=None):
    hkv = hkv or hq
    q = torch.randn(b, hq, L, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, hkv, S, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, hkv, S, dv or d, generator=gen, dtype=torch.float64)
    return q, k, v


def brute_document_causal(doc_lens):
    doc = [d for d, n in enumerate(doc_lens) for _ in range(n)]
    n = len(doc)
    return torch.tensor([[doc[i] == doc[j] and j <= i for j in range(n)] for i in range(n)])


DOC_CASES = [[3, 5, 2], [1, 1, 1], [7], [4, 1, 3], [1, 6], [2, 2, 2, 2]]


@pytest.mark.exercise("document_causal_mask")
@pytest.mark.parametrize("doc_lens", DOC_CASES, ids=[str(c) for c in DOC_CASES])
def test_document_causal_mask(exercise_module, doc_lens):
    n = sum(doc_lens)
    mask_mod = exercise_module.document_causal_mask(doc_lens)
    got = create_mask(mask_mod, None, None, n, n, device="cpu")[0, 0]
    assert got.dtype == torch.bool
    assert torch.equal(got, brute_document_causal(doc_lens)), got.int()
    as_tensor = create_mask(
        exercise_module.document_causal_mask(torch.tensor(doc_lens)), None, None, n, n, device="cpu"
    )
    assert torch.equal(as_tensor[0, 0], got)


@pytest.mark.exercise("document_causal_mask")
def test_document_causal_block_mask(exercise_module):
    doc_lens = [100, 200, 212]  # 512 tokens: a 4 x 4 grid of 128-blocks
    bm = create_block_mask(exercise_module.document_causal_mask(doc_lens), None, None, 512, 512, device="cpu")
    expected = 100 * (1 - computed_block_fraction(brute_document_causal(doc_lens)))
    assert bm.sparsity() == pytest.approx(expected)


MATRIX_PRODUCTS = {"mm", "bmm", "addmm", "baddbmm", "addbmm"}  # what matmul, @ and einsum dispatch to


class LargestOutput(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op returns, and how many
    matrix products run."""

    def __init__(self):
        super().__init__()
        self.largest = 0
        self.products = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.products += func.overloadpacket.__name__ in MATRIX_PRODUCTS
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


TILED_CASES = {  # name: (L, S, D, Dv, block)
    "even-split": (16, 64, 4, 4, 16),
    "ragged-last-block": (16, 50, 4, 3, 16),
    "block-of-one": (4, 9, 2, 5, 1),
    "block-larger-than-S": (8, 5, 4, 4, 8),
    "few-queries": (1, 40, 8, 8, 7),
}


@pytest.mark.exercise("tiled_attention")
@pytest.mark.parametrize("case", TILED_CASES, ids=list(TILED_CASES))
def test_tiled_attention_matches_sdpa(exercise_module, case):
    L, S, d, dv, block = TILED_CASES[case]
    gen = torch.Generator().manual_seed(9)
    q, k, v = qkv(gen, L=L, S=S, d=d, dv=dv)
    torch.testing.assert_close(exercise_module.tiled_attention(q, k, v, block), sdpa_math(q, k, v))


@pytest.mark.exercise("tiled_attention")
def test_tiled_attention_large_scores(exercise_module):
    """Scores near 2000: exp() of a raw score overflows, so the running maximum is needed; and
    the first chunk's scores are small, so the maximum arrives later (a maximum taken from the
    first chunk only, never updated, overflows)."""
    gen = torch.Generator().manual_seed(10)
    q, k, v = qkv(gen, L=6, S=20, d=4)
    q = q * 400  # scores |q.k| / 2 reach a few thousand
    k[..., :6, :] *= 0.01  # the first chunk of 6 keys: scores a hundred times smaller
    scores = q @ k.transpose(-2, -1) / 2  # (B, H, L, S)
    late = scores[..., 6:].amax(-1) - scores[..., :6].amax(-1)  # (B, H, L): how far the maximum rises later
    assert scores.abs().max() > 1000 and (late > 0).all() and (late > 710).any()  # exp(710) overflows float64
    got = exercise_module.tiled_attention(q, k, v, 6)
    assert not got.isnan().any()
    torch.testing.assert_close(got, sdpa_math(q, k, v))


@pytest.mark.exercise("tiled_attention")
@pytest.mark.parametrize("L", [64, 1], ids=["64-queries", "one-query"])
def test_tiled_attention_never_holds_the_scores(exercise_module, L):
    """No op returns more than a chunk's scores, a chunk of K or V, or the output (with one
    query, a row of all S scores is too many), and one pass over the keys: two matrix
    products per chunk at most (a first pass for the maximum doubles them)."""
    gen = torch.Generator().manual_seed(11)
    b, h, S, d, block = 1, 2, 64, 4, 8
    q, k, v = qkv(gen, b=b, hq=h, L=L, S=S, d=d)
    with LargestOutput() as watch:
        got = exercise_module.tiled_attention(q, k, v, block)
    torch.testing.assert_close(got, sdpa_math(q, k, v))
    full = b * h * L * S  # L = 64: 8192 scores, a chunk's 1024; L = 1: 128 scores, a chunk of K 64
    bound = b * h * max(L * block, L * d, block * d)
    assert watch.largest <= bound, f"an op returned {watch.largest} elements (bound {bound}, all scores {full})"
    passes = 2 * math.ceil(S / block)
    assert watch.products <= passes, f"{watch.products} matrix products: at most {passes}, one pass over the keys"


# ----------------------------------------------------------------------------------------
# CUDA: backends' time and peak memory vs S (bf16, causal), and FlexAttention's backward


CUDA_BACKENDS = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]
CUDA_SEQ = (1024, 2048, 4096, 8192)


def cuda_run(name, q, k, v):
    """(output, median ms, peak extra bytes) of causal SDPA restricted to one backend;
    raises RuntimeError when this GPU or build cannot run that backend for these inputs."""
    run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    with sdpa_kernel(SDPBackend.__members__[name]):
        out = run()
        ms = cuda_median_ms(run, warmup=1, repeats=5)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        return out, ms, torch.cuda.max_memory_allocated() - base


@pytest.mark.cuda
def test_cuda_backends_time_and_memory(record_property):
    """Every SDPA backend on bf16 causal attention, S = 1024 ... 8192: the ones this GPU or
    build cannot run are reported; for each one that runs, output, time and peak memory
    are asserted (math stores the S x S scores, the fused kernels do not)."""
    torch.manual_seed(0)
    b, h, d = 1, 8, 64
    ms, peak, unavailable, rows = {}, {}, {}, []
    for S in CUDA_SEQ:
        q, k, v = (torch.randn(b, h, S, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).float()
        for name in CUDA_BACKENDS:
            try:
                out, ms[name, S], peak[name, S] = cuda_run(name, q, k, v)
            except RuntimeError as err:  # a backend this GPU or build lacks: report it
                unavailable.setdefault(name, f"S={S}: {str(err).splitlines()[0][:100]}")
                continue
            assert (out.float() - ref).abs().max() < 5e-2, (name, S)  # bf16 outputs agree
            rows.append(f"S={S:>5} {name:<19} {ms[name, S]:8.3f} ms  peak +{peak[name, S] / 2**20:8.1f} MiB")
    print("\n".join(rows))
    for (name, S), t in ms.items():
        record_property(f"SDPA bf16 causal {name} S={S} [ms]", t)
        record_property(f"SDPA bf16 causal {name} S={S} peak extra [MiB]", peak[name, S] / 2**20)
    for name, why in unavailable.items():
        record_property(f"SDPA {name} unavailable [reason]", why)
    for name, why in unavailable.items():
        print(f"unavailable: {name}: {why}")
    ran = {name for name in CUDA_BACKENDS if all((name, S) in ms for S in CUDA_SEQ)}  # at every S
    assert "MATH" in ran and ran & {"FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"}
    scores = h * CUDA_SEQ[-1] ** 2 * 2  # bf16 scores at S = 8192: 1 GiB
    for name in ran:
        assert all(0 < ms[name, S] < 10_000 for S in CUDA_SEQ), name
        growth = peak[name, CUDA_SEQ[-1]] / max(peak[name, CUDA_SEQ[-2]], 1)
        if name == "MATH":  # stores the scores: about 4x per doubling of S
            assert growth > 3 and peak[name, CUDA_SEQ[-1]] >= scores
        else:  # tiles: memory linear in S, time and memory far below math at S = 8192
            assert growth < 2.5, (name, growth)
            assert peak[name, CUDA_SEQ[-1]] < peak["MATH", CUDA_SEQ[-1]] / 10, name
            assert ms[name, CUDA_SEQ[-1]] < ms["MATH", CUDA_SEQ[-1]], name


@pytest.mark.cuda
def test_cuda_flex_attention_backward(record_property):
    """FlexAttention's compiled forward and backward on CUDA, against SDPA and a float64
    reference. Everything is fp32: PyTorch leaves TF32 off for matmuls by default (asserted),
    and flex's kernels follow that setting, so the tolerances cover only fp32 rounding in
    different summation orders (tiles, online softmax)."""
    from torch.nn.attention.flex_attention import flex_attention

    assert torch.get_float32_matmul_precision() == "highest"  # no TF32 by default
    torch.manual_seed(0)
    S = 512
    q, k, v = (torch.randn(1, 2, S, 64, device="cuda", requires_grad=True) for _ in range(3))
    bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, S, S, device="cuda")
    grad = torch.randn(1, 2, S, 64, device="cuda")
    out_flex = torch.compile(flex_attention)(q, k, v, block_mask=bm)
    grads_flex = torch.autograd.grad(out_flex, (q, k, v), grad)
    out_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grads_sdpa = torch.autograd.grad(out_sdpa, (q, k, v), grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        out_ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    grads_ref = torch.autograd.grad(out_ref, (q64, k64, v64), grad.double())
    for got in ((out_flex, *grads_flex), (out_sdpa, *grads_sdpa)):
        for a, b in zip(got, (out_ref, *grads_ref)):
            torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=1e-4)
    gap = (grads_flex[0] - grads_sdpa[0]).abs().max().item()
    print(f"flex backward max |dQ - dQ_sdpa| {gap:.2e}")
    record_property("flex vs SDPA fp32 S=512, max |dQ gap| [absolute]", gap)

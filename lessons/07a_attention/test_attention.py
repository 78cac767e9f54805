"""Tests of lesson 07a: documented outputs, the lesson's key values (the √d scale, SDPA against
the formula, the dispatch log and gradcheck of one SDPA call, lesson 01's views, multi-head
attention, mask conventions and the weights figure, all-masked rows, causal alignment, dropout
in eval, GQA's copies and constraints) and the exercise `sdpa_reference`.

The lesson compiles nothing; its profiler cells need no GPU. Bounds that the prose states as
printed invariants (`below 1e-12: True`) are asserted here on the values behind them.
"""

import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile
from torch.utils._python_dispatch import TorchDispatchMode


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_score_cells(lesson):
    ns = lesson.ns
    assert ns["score_cells"](1, 2, 4) == 32
    assert ns["score_cells"](1, 2, 8192) == 134_217_728 == 2 * 8192**2
    assert ns["score_cells"](1, 2, 1, 8) == 16  # one query against 8 keys


class ScalarLog(TorchDispatchMode):
    """Records the scalar each `aten.mul.Scalar` multiplies by."""

    def __init__(self):
        super().__init__()
        self.scalars = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mul.Scalar:
            self.scalars.append(args[1])
        return func(*args, **(kwargs or {}))


def test_dispatch_log_of_one_sdpa_call(lesson):
    """Lesson 02's dispatch log, revisited on SDPA: one default CPU call dispatches one op, the
    CPU flash kernel, in float32 and in float64; SDPA's composite never reaches the mode; under
    MATH the mode sees the formula, Q and K each scaled by the square root of 1/sqrt(d)."""
    ns = lesson.ns
    flash = ["_scaled_dot_product_flash_attention_for_cpu"]
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        assert ns["dispatched"](dtype) == flash, dtype
    ops = ns["math_ops"]
    assert ops == ns["dispatched"](torch.float64, "MATH") and len(ops) == 16
    assert (ops.count("mul"), ops.count("transpose"), ops.count("bmm"), ops.count("_safe_softmax")) == (2, 1, 2, 1)
    assert ops.index("mul") < ops.index("bmm") < ops.index("_safe_softmax") < len(ops) - 1 - ops[::-1].index("bmm")
    assert not {"scaled_dot_product_attention", "_scaled_dot_product_attention_math"} & set(ops)
    x = torch.ones(1, 2, 4, 8, dtype=torch.float64)  # d = 8
    with sdpa_kernel(SDPBackend.MATH), ScalarLog() as log:
        F.scaled_dot_product_attention(x, x, x)
    assert log.scalars == pytest.approx([8**-0.25] * 2)  # sqrt(1/sqrt(d)), once for Q, once for K
    # the mode sees a different backend when there is one: dropout sends SDPA to the math backend
    with ns["OpLog"]() as log:
        F.scaled_dot_product_attention(x, x, x, dropout_p=0.5)
    assert "_scaled_dot_product_flash_attention_for_cpu" not in log.ops and "bmm" in log.ops


def test_gradcheck_passes_and_would_catch_a_wrong_backward(lesson):
    """Lesson 03a's gradcheck on SDPA: both CPU backends pass in float64, and the same call of
    gradcheck fails a backward that is wrong by a factor on dV (so the printed True can fail)."""
    ns = lesson.ns
    assert ns["passed"] == {"MATH": True, "FLASH_ATTENTION": True}
    inputs = (ns["qc"], ns["kc"], ns["vc"])
    assert all(t.dtype == torch.float64 and t.requires_grad for t in inputs)

    class WrongBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return F.scaled_dot_product_attention(q, k, v)

        @staticmethod
        def backward(ctx, grad):
            with torch.enable_grad():
                q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
                dq, dk, dv = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), grad)
            return dq, dk, 2 * dv

    assert not torch.autograd.gradcheck(WrongBackward.apply, inputs, raise_exception=False)


def test_math_backend_is_the_formula(lesson):
    ns = lesson.ns
    assert ns["out_sdpa"].dtype == torch.float64 and ns["out_sdpa"].shape == ns["shape"]
    torch.testing.assert_close(ns["out_sdpa"], ns["out_ref"])
    for a, b in zip(ns["grads_sdpa"], ns["grads_ref"]):
        assert a.abs().sum() > 0  # real gradients, not zeros
        torch.testing.assert_close(a, b)
    # the prose: rounding-level gaps, whatever this CPU's matmul summation order
    pairs = zip([ns["out_sdpa"], *ns["grads_sdpa"]], [ns["out_ref"], *ns["grads_ref"]])
    assert all((a - b).abs().max() < 1e-12 for a, b in pairs)


def test_mask_conventions(lesson):
    ns = lesson.ns
    q2, k2, v2, mha = ns["q2"], ns["k2"], ns["v2"], ns["mha"]
    value0 = v2[0, 0, 0]  # [10, 0]
    assert torch.equal(ns["out_keep"][0, 0], value0.expand(2, 2))
    # the identity MHA is SDPA on the same data ...
    torch.testing.assert_close(mha(q2[0], k2[0], v2[0], need_weights=False)[0][0],
                               F.scaled_dot_product_attention(q2, k2, v2)[0, 0])
    # ... and its key_padding_mask is SDPA's keep mask inverted
    pad = ~ns["keep_key0"][:1]  # (1, S): True = padding
    out_mha = mha(q2[0], k2[0], v2[0], key_padding_mask=pad, need_weights=False)[0]
    torch.testing.assert_close(out_mha[0], ns["out_keep"][0, 0])


def test_causal_alignment(lesson):
    ns = lesson.ns
    v2 = ns["v2"]
    assert torch.equal(ns["upper_left"][0, 0, 0], v2[0, 0, 0])  # sees key 0 only
    torch.testing.assert_close(ns["lower_right"], ns["full"])
    torch.testing.assert_close(ns["no_mask"], ns["full"])
    assert not torch.allclose(ns["upper_left"], ns["full"])
    # causal_lower_right(L, S) is the boolean tril(S - L) mask printed by the lesson
    from torch.nn.attention.bias import causal_lower_right

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, n, 4, generator=gen) for n in (2, 4, 4))
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(2, 4)),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=ns["bottom_right"]))
    assert ns["bottom_right"].sum() == 7


def test_dropout_and_gqa(lesson):
    ns = lesson.ns
    model = ns["Attention"](0.5, False).eval()
    q2, k2, v2 = ns["q2"], ns["k2"], ns["v2"]
    torch.manual_seed(1)  # 2 x 2 weights: unseeded, two dropout masks coincide 1 time in 16
    assert not torch.equal(model(q2, k2, v2), model(q2, k2, v2))
    fixed = ns["Attention"](0.5, True).eval()
    assert torch.equal(fixed(q2, k2, v2), F.scaled_dot_product_attention(q2, k2, v2))
    assert not torch.equal(fixed.train()(q2, k2, v2), fixed(q2, k2, v2))  # training still drops
    assert torch.equal(ns["out_gqa"], ns["interleaved"]) and not torch.equal(ns["out_gqa"], ns["repeated"])
    assert ns["out_gqa"].shape == ns["qg"].shape


def test_gqa_copies_by_backend(lesson):
    ns = lesson.ns
    qg, kg = ns["qg"], ns["kg"]
    kv_at_hq = 2 * qg.shape[1] * kg.shape[2] * kg.shape[3] * 4  # K and V at 4 heads, fp32
    assert ns["kv_at_hq"] == kv_at_hq == 1280
    flash_ops, flash_bytes = ns["gqa_log"]("FLASH_ATTENTION")
    assert flash_bytes == 0 and "_scaled_dot_product_flash_attention_for_cpu" in flash_ops
    copying = {"repeat_interleave", "clone", "copy_", "repeat", "index_select", "contiguous", "cat"}
    assert not copying & set(flash_ops)  # nothing inside the flash call copies K or V
    math_ops, math_bytes = ns["gqa_log"]("MATH")
    assert math_ops.count("repeat_interleave") == 2 and math_bytes == kv_at_hq
    # the same result either way: the copy is the math backend's way, not a different answer
    with sdpa_kernel(SDPBackend.MATH):
        torch.testing.assert_close(F.scaled_dot_product_attention(qg, kg, ns["vg"], enable_gqa=True),
                                   ns["out_gqa"])


def test_all_masked_rows(lesson):
    ns = lesson.ns
    q2, k2, v2, keep_none = ns["q2"], ns["k2"], ns["v2"], ns["keep_none"]
    assert torch.isnan(ns["formula"](q2, k2, v2, keep_none)[0, 0, 1]).all()
    out = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=keep_none)
    assert torch.equal(out[0, 0, 1], torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(out[0, 0, 0], ns["formula"](q2, k2, v2)[0, 0, 0])
    # MHA, every key padded: 0 through SDPA (need_weights=False), NaN through its own softmax (the default)
    pad_all = ns["pad_all"]
    assert torch.equal(pad_all[False], torch.zeros_like(pad_all[False]))
    assert torch.isnan(pad_all[True]).all()
    mha, pad = ns["mha"], torch.tensor([[True, True]])
    assert torch.isnan(mha(q2[0], k2[0], v2[0], key_padding_mask=pad)[0]).all()  # need_weights defaults to True
    source = inspect.getsource(F.multi_head_attention_forward)  # the Read-the-source stop's description
    weights_branch, sdpa_branch = source[source.index("if need_weights:"):].split("\n    else:", 1)
    assert "torch.baddbmm(" in weights_branch and "torch.bmm(" in weights_branch and "softmax(" in weights_branch
    assert "scaled_dot_product_attention(" in sdpa_branch and "scaled_dot_product_attention(" not in weights_branch


def test_gqa_constraints(lesson):
    """The printed refusals and fallbacks, and the two docstring sentences the prose quotes:
    K and V of the same head count, and a "CUDA tensor" note that the CPU runs contradict."""
    doc = " ".join(F.scaled_dot_product_attention.__doc__.split())
    assert "number_of_heads_key == number_of_heads_value" in doc
    assert "It currently works only for Flash_attention and math kernel on CUDA tensor" in doc
    try_ = lesson.ns["gqa_try"]
    assert try_(6, 4, 4).startswith("RuntimeError: Number of heads in key and value must divide")
    assert try_(4, 2, 1, "FLASH_ATTENTION").startswith("RuntimeError")
    assert try_(4, 2, 1) == "4 heads, equal to repeat_interleave True"
    assert try_(4, 2, 2, "FLASH_ATTENTION") == "4 heads, equal to repeat_interleave True"
    # the fallback for K and V of different head counts is the math backend: it copies
    with profile() as prof:
        q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 1, 5, 8)
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    keys = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_attention_math" in keys and "aten::repeat_interleave" in keys


def test_padding_mask_and_eval_dropout(lesson):
    ns = lesson.ns
    assert ns["same"] is True
    x3, mha = ns["x3"], ns["mha_drop"]
    assert not torch.equal(mha.train()(x3, x3, x3)[0], mha(x3, x3, x3)[0])  # training: it drops
    mha.eval()


def test_sdpa_reads_lesson_01s_views(lesson):
    """The revisit of lesson 01's layout: the copies listed are what the profiler saw, SDPA on
    the views ran no copy and matches contiguous inputs bitwise, and the output's layout is
    the projection's, so that the transpose back is contiguous."""
    ns = lesson.ns
    q, k, v = ns["q_view"], ns["k_view"], ns["v_view"]
    B, S, H, D = ns["B1"], ns["S1"], ns["H1"], ns["D1"]
    assert not q.is_contiguous() and q.stride() == (S * H * D, D, H * D, 1)  # a permuted view
    assert ns["copies"](lambda: q @ k.transpose(-2, -1)) == [(B, H, S, D), (B, H, D, S)]
    assert ns["copies"](lambda: F.scaled_dot_product_attention(q, k, v)) == []
    assert torch.equal(ns["out_views"], ns["out_copies"])
    y = ns["out_views"]
    assert y.transpose(1, 2).contiguous().data_ptr() == y.data_ptr()  # contiguous(): no copy


def test_scale_keeps_the_variance_and_the_softmax_spread(lesson):
    """The prose: var(q·k) is about d and about 1 after the scale; unscaled at d = 256 many rows
    are nearly one-hot and the softmax Jacobian is about five times smaller."""
    ns = lesson.ns
    g = torch.Generator().manual_seed(0)  # the lesson's stream: the same draws as it printed
    for d in (16, 64, 256):
        raw, scaled = ns["dot_variance"](d, gen=g)
        assert 0.9 * d < raw < 1.1 * d and 0.9 < scaled < 1.1, (d, raw, scaled)
    (hot_u, top_u, jac_u), (hot_s, top_s, jac_s) = ns["spread"]["unscaled"], ns["spread"]["scaled"]
    assert hot_u > 32 and hot_s == 0 and top_u > 0.8 > 0.2 > top_s, ns["spread"]
    assert 4 < jac_s / jac_u < 7, ns["spread"]  # "here about five times smaller"
    for seed in range(1, 6):  # "the factor depends on the draw; it stays well above 1"
        gen = torch.Generator().manual_seed(seed)
        q, k = (torch.randn(n, 256, generator=gen, dtype=torch.float64) for n in (128, 64))
        ratio = ns["softmax_spread"](q @ k.T / 16)[2] / ns["softmax_spread"](q @ k.T)[2]
        assert ratio > 2, (seed, ratio)
    one_hot = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64) * 100  # a saturated row
    assert ns["softmax_spread"](one_hot)[2] < 1e-12  # its Jacobian is (nearly) zero


def test_multi_head_attention_is_the_module(lesson):
    ns = lesson.ns
    layer, x, E, H = ns["layer"], ns["x_mha"], ns["E"], ns["H_MHA"]
    assert tuple(layer.in_proj_weight.shape) == (3 * E, E)
    ours, _ = ns["multi_head_attention"](x, layer.in_proj_weight, layer.in_proj_bias,
                                         layer.out_proj.weight, layer.out_proj.bias, H)
    theirs, weights = layer(x, x, x, need_weights=True, average_attn_weights=False)
    assert (ours - theirs).abs().max() < 1e-12 and weights.shape == (2, H, 5, 5)
    assert layer.in_proj_bias.abs().min() > 0 and layer.out_proj.bias.abs().min() > 0  # biases tested too
    heads = [torch.randn(2, 5, H, E // H).transpose(1, 2) for _ in range(3)]  # (B, H, S, D) views, as in the layer
    y = torch.nn.functional.scaled_dot_product_attention(*heads)
    assert y.transpose(1, 2).is_contiguous()  # the flash kernel's output: the merge is a view
    with sdpa_kernel(SDPBackend.MATH):  # the math backend's: the merge copies
        y = torch.nn.functional.scaled_dot_product_attention(*heads)
    assert not y.transpose(1, 2).is_contiguous()
    y = torch.nn.functional.scaled_dot_product_attention(*heads, dropout_p=0.5)  # dropout: the math backend
    assert not y.transpose(1, 2).is_contiguous()
    torch.testing.assert_close(ns["probs"], weights, rtol=0, atol=1e-12)
    # one head only: the same layer computes a different function (the split matters)
    one_head, _ = ns["multi_head_attention"](x, layer.in_proj_weight, layer.in_proj_bias,
                                             layer.out_proj.weight, layer.out_proj.bias, 1)
    assert (one_head - theirs).abs().max() > 1e-3


def test_attention_weights_figure(lesson):
    """The figure draws the weights, with exactly the masked cells (the zero ones) masked out
    of the colour scale and painted in a colour of their own; one y label, one colour bar."""
    ns = lesson.ns
    panels, causal, not_padding = ns["panels"], ns["causal_keep"], ns["not_padding"]
    keeps = {"causal": causal, "padding": not_padding, "causal + padding": causal & not_padding}
    assert list(ns["keeps"]) == list(keeps) and all(torch.equal(ns["keeps"][t], keeps[t]) for t in keeps)
    fig = ns["plot_attention_weights"](panels, keeps)
    axes = [ax for ax in fig.get_axes() if ax.get_images()]  # the panels, not the colour bar
    assert len(fig.get_axes()) == len(panels) + 1  # one colour bar for all
    assert [ax.get_title() for ax in axes] == list(panels) == list(keeps)
    assert [ax.get_ylabel() for ax in axes] == ["query", "", ""] and {ax.get_xlabel() for ax in axes} == {"key"}
    for ax, (title, w) in zip(axes, panels.items()):
        (image,) = ax.get_images()
        drawn = image.get_array()
        assert np.ma.isMaskedArray(drawn) and np.array_equal(np.ma.getmaskarray(drawn), ~keeps[title].numpy()), title
        assert np.array_equal(drawn.compressed(), w.numpy()[keeps[title].numpy()])  # the kept weights, as they are
        bad, lowest = image.get_cmap().get_bad(), image.get_cmap()(0.0)
        assert bad[3] == 1 and not np.allclose(bad, lowest), bad  # masked cells: opaque, not the colour of 0
        assert torch.equal(w == 0, ~keeps[title]), title  # exactly the masked cells are 0
        torch.testing.assert_close(w.sum(-1), torch.ones(6, dtype=torch.float64))
    assert int((panels["causal + padding"] == 0).sum()) == 15 + 12 - 9  # union of the two masks
    assert (ns["HERE"] / "attention_weights.png").is_file()


# ----------------------------------------------------------------------------------------
# Exercise


def sdpa_math(*args, **kwargs):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(*args, **kwargs)


def qkv(gen, b=2, hq=2, hkv=None, L=5, S=5, d=4, dv=None):
    hkv = hkv or hq
    q = torch.randn(b, hq, L, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, hkv, S, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, hkv, S, dv or d, generator=gen, dtype=torch.float64)
    return q, k, v


SDPA_CASES = {  # name: (qkv sizes, SDPA keyword arguments built from the generator)
    "plain": (dict(), lambda g, L, S: {}),
    "value-size-differs": (dict(d=4, dv=7), lambda g, L, S: {}),
    "bool-mask": (dict(), lambda g, L, S: {"attn_mask": torch.rand(L, S, generator=g) > 0.4}),
    "bool-mask-per-head": (dict(), lambda g, L, S: {"attn_mask": torch.rand(2, 1, L, S, generator=g) > 0.3}),
    "float-mask": (dict(), lambda g, L, S: {"attn_mask": torch.randn(L, S, generator=g, dtype=torch.float64)}),
    "causal-square": (dict(), lambda g, L, S: {"is_causal": True}),
    "causal-few-queries": (dict(L=2, S=6), lambda g, L, S: {"is_causal": True}),
    "causal-many-queries": (dict(L=6, S=3), lambda g, L, S: {"is_causal": True}),
    "gqa": (dict(hq=6, hkv=2), lambda g, L, S: {"enable_gqa": True}),
    "gqa-three-kv-heads": (dict(hq=6, hkv=3), lambda g, L, S: {"enable_gqa": True}),
    "gqa-causal": (dict(hq=4, hkv=2, L=3, S=5), lambda g, L, S: {"enable_gqa": True, "is_causal": True}),
    "rectangular": (dict(L=3, S=8, dv=2), lambda g, L, S: {}),
}


@pytest.mark.exercise("sdpa_reference")
@pytest.mark.parametrize("case", SDPA_CASES, ids=list(SDPA_CASES))
def test_sdpa_reference(exercise_module, case):
    sizes, make_kwargs = SDPA_CASES[case]
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        q, k, v = qkv(gen, **sizes)
        kwargs = make_kwargs(gen, q.shape[-2], k.shape[-2])
        got = exercise_module.sdpa_reference(q, k, v, **kwargs)
        torch.testing.assert_close(got, sdpa_math(q, k, v, **kwargs))


@pytest.mark.exercise("sdpa_reference")
def test_sdpa_reference_all_masked_rows(exercise_module):
    gen = torch.Generator().manual_seed(8)
    q, k, v = qkv(gen, L=3, S=4)
    keep = torch.tensor([[True, False, True, False], [False] * 4, [True] * 4])  # row 1: no key
    minus_inf = torch.zeros(3, 4, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    for mask in (keep, minus_inf):
        got = exercise_module.sdpa_reference(q, k, v, attn_mask=mask)
        assert not got.isnan().any(), "a fully masked row must give zeros, not NaN"
        torch.testing.assert_close(got, sdpa_math(q, k, v, attn_mask=mask))
        assert torch.equal(got[:, :, 1], torch.zeros_like(got[:, :, 1]))


class AtenOps(TorchDispatchMode):
    """The name of every ATen op that reaches the kernels (the lesson's OpLog)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.exercise("sdpa_reference")
def test_sdpa_reference_writes_the_formula(exercise_module):
    """Calling SDPA itself is not the exercise: no SDPA backend op may run, neither a fused
    kernel's `_scaled_dot_product_*` op nor the math backend's `_safe_softmax` (what a call
    under `sdpa_kernel(SDPBackend.MATH)` dispatches instead)."""
    gen = torch.Generator().manual_seed(12)
    q, k, v = qkv(gen, hq=4, hkv=2, L=3, S=5)  # (B, 4, L, D) queries, (B, 2, S, D) keys and values
    k4, v4 = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)  # at the query head count
    keep = torch.rand(3, 5, generator=gen) > 0.3  # (L, S)
    for kv, kwargs in (((k4, v4), {}), ((k4, v4), {"attn_mask": keep}), ((k4, v4), {"is_causal": True}),
                       ((k, v), {"enable_gqa": True})):
        with AtenOps() as log:
            exercise_module.sdpa_reference(q, *kv, **kwargs)
        sdpa_ops = [op for op in log.ops if op.startswith("_scaled_dot_product") or op == "_safe_softmax"]
        assert not sdpa_ops, f"write the formula with matmul and softmax, not SDPA: {kwargs} ran {sdpa_ops}"

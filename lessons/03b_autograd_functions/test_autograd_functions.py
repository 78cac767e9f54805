"""Tests of lesson 03b: documented outputs, the lesson's key values (vector-Jacobian
products, second derivatives, per-sample gradients, custom Functions and their contracts,
hooks, saved bytes and checkpointing, what hooks keep alive, accumulation and what it does
not make equal, finding a NaN), and the exercises (against PyTorch on random cases)."""

import gc
import re
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_vector_jacobian_product_and_second_derivative(lesson):
    ns = lesson.ns
    v, jac = ns["v3"], ns["jac"]
    assert jac.tolist() == [[2.0, 1.0, 0.0], [0.0, 3.0, 2.0], [3.0, 0.0, 1.0]]
    assert ns["vjp"].tolist() == (v @ jac).tolist() == ns["x3"].grad.tolist() == [302.0, 31.0, 120.0]
    assert (ns["d1"].item(), ns["d2"].item()) == (27.0, 18.0)  # 3x^2 and 6x at x = 3
    assert ns["d1"].requires_grad and not ns["d1_plain"].requires_grad
    assert len(ns["jac_passes"]) == len(v) == 3  # jacobian: one backward pass per output entry
    assert ns["saved_by_backward"](False) == 0 < ns["saved_by_backward"](True)


def test_per_sample_gradients(lesson):
    ns = lesson.ns
    per_sample, weights = ns["per_sample"], ns["weights"]
    for k, w in weights.items():
        assert per_sample[k].shape == (8, *w.shape)
    assert ns["vmap_gap"] <= 4 * np.spacing(ns["vmap_scale"])  # the printed bound
    assert ns["sample_calls"] == [(5,)]  # vmap ran the function once, on one sample's shape
    assert ns["sum_gap"] < 1e-13  # the printed bound
    # summed over the batch: the gradient of the summed loss
    mlp = ns["mlp"]
    mlp.zero_grad()
    F.mse_loss(mlp(ns["xs8"]), ns["ys8"], reduction="sum").backward()
    for k, p in mlp.named_parameters():
        torch.testing.assert_close(per_sample[k].sum(0), p.grad, rtol=1e-12, atol=1e-14)


def test_gelu_function_and_ste(lesson):
    ns = lesson.ns
    x = torch.linspace(-8, 8, 101, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ns["TanhGELU"].apply, (x,))
    assert ns["gc_wrong"] is False  # a backward missing a term is rejected
    torch.testing.assert_close(ns["g_ours"], ns["g_ref"], rtol=1e-12, atol=1e-14)
    assert ns["gelu_gap"] < 1e-15 and ns["gelu_grad_gap"] < 1e-15  # the printed bounds
    ref, g_ref = ns["ref"], ns["g_ref"]  # the ranges the prose gives for the bound's scale
    assert (round(ref.min().item(), 2), round(ref.max().item(), 2)) == (-0.16, 6.0)
    assert (round(g_ref.min().item(), 2), round(g_ref.max().item(), 2)) == (-0.13, 1.13)
    # "float64 spacing is 2.2e-16 at 1, 8.9e-16 at 4 to 8"; 1e-15 is a few of those
    assert f"{np.spacing(1.0):.1e}" == "2.2e-16" and np.spacing(4.0) == np.spacing(7.99) == 2.0**-50
    assert f"{2.0**-50:.1e}" == "8.9e-16" and ns["gelu_grad_gap"] <= 4 * np.spacing(1.13)
    assert ns["g_ste"].tolist() == [3.0] * 4 and ns["g_true"].tolist() == [0.0] * 4
    assert ns["RoundSTE"].apply(ns["xs"]).tolist() == [0.0, 1.0, 1.0, -2.0]


def test_custom_function_contracts(lesson):
    ns = lesson.ns
    assert ns["dirty_grads"] == {False: [5.0] * 3, True: [10.0] * 3}  # 10 is d(5 * 2a)/da
    # "of what the forward did to its inputs only what 03a's version counters catch": the
    # unmarked write still bumps the counter, so a node that saved b before it refuses
    assert ns["unmarked_error"].endswith("is at version 1; expected version 0 instead")
    assert "modified by an inplace operation" in ns["unmarked_error"]
    for dirty in (False, True):
        a = torch.ones(3, requires_grad=True)
        b = a.clone()
        version = b._version
        ns["doubling"](dirty).apply(b)
        assert b._version > version  # marked or not, the write is counted
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="invalid gradient at index 0"):
        ns["Third"].apply(x, "shape").sum().backward()
    ns["Third"].apply(x, "dtype").sum().backward()  # cast to float64 silently
    assert x.grad.dtype == torch.float64 and x.grad[0].item() == float(np.float32(1 / 3))
    y = torch.ones(2, dtype=torch.float64, requires_grad=True)
    ns["Third"].apply(y, None).sum().backward()
    assert y.grad[0].item() == 1 / 3  # the right backward, for contrast
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        ns["FirstTwo"].apply(torch.ones(3, requires_grad=True).clone()).add_(1)


def test_hooks(lesson):
    ns = lesson.ns
    B, D = ns["BATCH"], ns["D"]
    assert ns["acts"] == [(B, D)] * len(ns["blocks"])
    assert ns["grads"] == [((B, D), (B, D))]
    assert ns["grad_hooked"] == [20.0] * 3 and ns["grad_unhooked"] == [2.0] * 3  # the x10 hook
    assert not ns["blocks"][-1]._forward_hooks and not ns["blocks"][-1]._backward_hooks


def test_saved_bytes(lesson):
    ns = lesson.ns
    B, D, HID, n = ns["BATCH"], ns["D"], ns["HID"], len(ns["blocks"])
    per_block = (B * D + 2 * B * HID) * 4  # Linear input, GELU input, GELU output: float32
    assert ns["bytes_full"] == n * per_block + B * D * 4  # + the input of pow
    assert ns["bytes_ckpt"] == (n + 1) * B * D * 4  # each block's input + the input of pow
    assert ns["bytes_nograd"] == 0 and ns["ckpt_identical"] is True
    # the Linear weights but the first (its input needs no gradient), and no bias
    assert ns["params_full"] == 2 * n - 1 and len(list(ns["blocks"].parameters())) == 4 * n


def test_reentrant_checkpoint_cuts_the_graph(lesson):
    run = lesson.ns["checkpointed_first_block"]
    assert run(use_reentrant=False) == (True, [])
    needs_grad, messages = run(use_reentrant=True)
    assert not needs_grad and any("Gradients will be None" in m for _, m in messages)
    left_out = [c for c, m in run()[1] if m.startswith("torch.utils.checkpoint: the use_reentrant")]
    assert left_out == ["UserWarning"]  # in 2.13.0 it still only warns


def test_figure_shows_saved_bytes(lesson):
    ns = lesson.ns
    fig = ns["plot_saved_bytes"](ns["SAVED"])
    (ax,) = fig.get_axes()
    heights = [p.get_height() for p in ax.patches]
    assert heights == [v / 1024 for v in ns["SAVED"].values()]
    assert [t.get_text() for t in ax.get_xticklabels()] == list(ns["SAVED"])
    assert [t.get_text() for t in ax.texts] == [f"{v / 1024:.0f} KiB" for v in ns["SAVED"].values()]
    assert "KiB" in ax.get_ylabel()
    assert (ns["HERE"] / "saved_bytes.png").is_file()


def test_token_weighted_accumulation(lesson):
    ns = lesson.ns
    assert ns["gap_tokens"] < 1e-13 < 0.1 < ns["gap_means"]
    # the prose: averaging means weighs a token of the 2-token micro-batch 6x one of the 12
    c = ns["COUNTS"]
    assert (1 / c[2]) / (1 / c[3]) == 6


def test_finding_the_nan(lesson):
    ns = lesson.ns
    grads_finite = {n: p.grad.isfinite().all().item() for n, p in ns["net"].named_parameters()}
    assert grads_finite == {"0.weight": False, "0.bias": False, "2.weight": True, "2.bias": True}
    assert ns["loss_nan"].isfinite() and ns["found_nan"] == ["1 (SafeSqrt)"]
    error, note = ns["under_anomaly"](lambda: ns["nan_loss"]().backward())
    assert error == "Function 'SqrtBackward0' returned nan values in its 0th output."
    assert "Error detected in SqrtBackward0" in note and ns["last_frame"](note) == "sqrt_where_positive"
    error, note = ns["under_anomaly"](ns["overwritten_saved_tensor"])
    assert "modified by an inplace operation" in error and "Error detected in MulBackward0" in note
    # the traceback's last line is `y = x * x`, two lines below the def, not the write below it
    (line,) = re.findall(r"line (\d+), in overwritten_saved_tensor", note)
    assert int(line) == ns["overwritten_saved_tensor"].__code__.co_firstlineno + 2
    assert not torch.is_anomaly_enabled()  # the lesson left it off
    # the fix the prose gives: clamp the input, and every gradient is finite
    h = torch.tensor([-1.0, 0.0, 4.0], requires_grad=True)
    torch.where(h > 0, torch.sqrt(h.clamp(min=1e-12)), 0.0).sum().backward()
    assert h.grad.isfinite().all()


def test_anomaly_mode_costs_time(lesson):
    """Thread CPU time, fastest of 15: the ratio holds on a loaded machine (4 measured)."""
    assert lesson.ns["anomaly_ratio"] > 1.5


# ----------------------------------------------------------------------------------------
# Exercise: tanh-GELU and its backward, against F.gelu(approximate="tanh")


def gelu_inputs():
    rng = np.random.default_rng(3)
    wide = np.linspace(-50, 50, 4001)  # step 0.025: covers the bend around 0 densely
    extremes = np.array([0.0, 1e-8, -1e-8, 1e-3, -1e-3, 7.5, -7.5, 1e3, -1e3, 1e4, -1e4])
    return np.concatenate([wide, extremes, 3 * rng.normal(size=500)])


@pytest.mark.exercise("gelu_tanh")
def test_gelu_tanh_matches_torch(exercise_module):
    x = gelu_inputs()
    got = exercise_module.gelu_tanh(x)
    ref = F.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    assert got.shape == x.shape
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-13)
    m = x.reshape(-1, 4)[:10]  # any shape
    assert exercise_module.gelu_tanh(m).shape == m.shape


@pytest.mark.exercise("gelu_tanh_backward")
def test_gelu_tanh_backward_matches_torch(exercise_module):
    x = gelu_inputs()
    grad_out = np.random.default_rng(4).normal(size=x.shape)  # not ones: must be multiplied in
    xt = torch.tensor(x, requires_grad=True)
    (ref,) = torch.autograd.grad(F.gelu(xt, approximate="tanh"), xt, torch.from_numpy(grad_out))
    before = (x.copy(), grad_out.copy())
    got = exercise_module.gelu_tanh_backward(x, grad_out)
    assert got.shape == x.shape
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(grad_out, before[1])


@pytest.mark.exercise("gelu_tanh_backward")
def test_gelu_tanh_backward_2d(exercise_module):
    x = np.linspace(-4, 4, 24).reshape(4, 6)
    g = np.full((4, 6), 2.0)
    xt = torch.tensor(x, requires_grad=True)
    (ref,) = torch.autograd.grad((2 * F.gelu(xt, approximate="tanh")).sum(), xt)
    np.testing.assert_allclose(exercise_module.gelu_tanh_backward(x, g), ref.numpy(), rtol=1e-10)


# ----------------------------------------------------------------------------------------
# Exercise: combining micro-batch gradients


def microbatches(rng, counts, shape):
    """Per-token gradients, their full-batch mean, and per-micro-batch means (NaN if empty)."""
    per_token = rng.normal(size=(sum(counts), *shape))  # (T, *shape)
    bounds = np.cumsum([0, *counts])
    means = [per_token[a:b].mean(0) if b > a else np.full(shape, np.nan)
             for a, b in zip(bounds[:-1], bounds[1:])]
    return per_token.mean(0), means


COUNT_CASES = {
    "issue": [3, 7, 2, 12],
    "one": [5],
    "equal": [4, 4, 4],
    "zero-first": [0, 3, 9],
    "zero-middle": [6, 0, 1],
    "zero-last": [2, 5, 0],
    "only-one-nonzero": [0, 0, 7, 0],
    "skewed": [1, 100],
}


@pytest.mark.exercise("combine_microbatch_grads")
@pytest.mark.parametrize("counts", COUNT_CASES.values(), ids=COUNT_CASES.keys())
def test_combine_hand_picked(exercise_module, counts):
    full, means = microbatches(np.random.default_rng(5), counts, (3, 2))
    kept = [m.copy() for m in means]
    got = exercise_module.combine_microbatch_grads(means, list(counts))
    assert np.shape(got) == (3, 2)
    np.testing.assert_allclose(got, full, rtol=1e-12, atol=1e-14)
    for m, k in zip(means, kept):
        np.testing.assert_array_equal(m, k)  # inputs unchanged (NaN == NaN here)


@pytest.mark.exercise("combine_microbatch_grads")
def test_combine_random(exercise_module):
    rng = np.random.default_rng(6)
    for _ in range(200):
        counts = [int(n) for n in rng.integers(0, 13, size=rng.integers(1, 7))]
        if sum(counts) == 0:
            counts[0] = 1
        shape = tuple(int(n) for n in rng.integers(1, 4, size=rng.integers(0, 3)))
        full, means = microbatches(rng, counts, shape)
        kept = [m.copy() for m in means]
        got = exercise_module.combine_microbatch_grads(means, counts)
        np.testing.assert_allclose(got, full, rtol=1e-12, atol=1e-14, err_msg=f"counts {counts}")
        for m, k in zip(means, kept):
            np.testing.assert_array_equal(m, k, err_msg=f"an input changed, counts {counts}")


@pytest.mark.exercise("combine_microbatch_grads")
def test_combine_keeps_a_real_nan(exercise_module):
    """A NaN in a micro-batch that holds tokens is a real one: it must reach the result, not be
    skipped as an empty micro-batch's is (np.nansum would hide it)."""
    f = exercise_module.combine_microbatch_grads
    assert np.isnan(f([np.array([np.nan]), np.array([1.0])], [2, 2])).all()
    got = f([np.array([1.0, 2.0]), np.array([np.nan, 0.0]), np.full(2, np.nan)], [3, 1, 0])
    assert np.isnan(got[0]) and got[1] == 1.5  # the empty micro-batch's NaN still does not count


@pytest.mark.exercise("combine_microbatch_grads")
def test_combine_with_torch_autograd(exercise_module):
    """Real mean-loss gradients from PyTorch; an empty micro-batch gives zeros, not NaN, there."""
    counts = [3, 7, 0, 2, 12]
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(sum(counts), 5, dtype=torch.float64, generator=gen)  # (T, F)
    target = torch.randn(sum(counts), dtype=torch.float64, generator=gen)  # (T,)
    w0 = torch.randn(5, dtype=torch.float64, generator=gen)  # (F,)

    def grad(rows):
        w = w0.clone().requires_grad_()
        ((feats[rows] @ w - target[rows]) ** 2).mean().backward()
        return w.grad.numpy()

    bounds = np.cumsum([0, *counts])
    means = [grad(slice(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]
    got = exercise_module.combine_microbatch_grads(means, counts)
    np.testing.assert_allclose(got, grad(slice(None)), rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------------------
# Added with the split (issue 32 §4): what hooks keep alive, what accumulation cannot make equal


def test_hooks_keep_tensors_alive(lesson):
    ns = lesson.ns
    assert ns["big_kept"] is True and ns["big_freed"] is True  # the closure, then remove()
    assert ns["copy_before"] is True and ns["copy_after"] is False  # the graph's, until backward
    assert ns["stash_kept"] is True and ns["stash_freed"] is True  # the list's, until cleared
    assert len(ns["copies"]) == 1  # tanh saved one tensor: its output
    assert not ns["x_hook"]._backward_hooks  # the handle really removed the hook
    # the control: with no hook holding it, `del` frees the tensor at once
    t = torch.ones(8)
    ref = weakref.ref(t)
    del t
    assert ns["alive"](ref) is False
    # and a hook that is kept (not removed) keeps its closure's tensor through a backward
    x = torch.ones(3, requires_grad=True)
    factor = torch.full((4,), 3.0)
    ref = weakref.ref(factor)
    handle = x.register_hook(ns["scaled_by"](factor))
    del factor
    (2 * x).sum().backward()
    assert x.grad.tolist() == [6.0] * 3 and ns["alive"](ref)  # the hook ran and still holds it
    handle.remove()
    gc.collect()
    assert ref() is None


def test_accumulation_what_it_cannot_make_equal(lesson):
    """The printed bound is 1e-13; the inexact cases miss it by far more than rounding."""
    ns = lesson.ns
    gaps = ns["norm_gaps"]
    assert gaps["LayerNorm", "train"] < 1e-13 and gaps["BatchNorm", "eval"] < 1e-13
    assert gaps["BatchNorm", "train"] > 1e-3
    full, micro = ns["bn_full"], ns["bn_micro"]
    assert (full.num_batches_tracked.item(), micro.num_batches_tracked.item()) == (1, 3)
    assert not torch.equal(full.running_mean, micro.running_mean)
    # the prose's account of the running means: momentum 0.1 towards each batch's mean
    net = ns["small_net"]("BatchNorm")
    with torch.no_grad():
        h = net[0](ns["x24"])  # (24, 16): what BatchNorm sees
    assert full.momentum == 0.1
    torch.testing.assert_close(full.running_mean, 0.1 * h.mean(0), rtol=1e-12, atol=1e-15)
    expected = torch.zeros(16, dtype=torch.float64)
    for rows in torch.arange(24).chunk(3):
        expected = 0.9 * expected + 0.1 * h[rows].mean(0)
    torch.testing.assert_close(micro.running_mean, expected, rtol=1e-12, atol=1e-15)
    # the network with no norm layer and no dropout: accumulation exact (equal micro-batches)
    plain = ns["accumulation_gap"](ns["small_net"](), ns["small_net"]())
    assert plain < 1e-13
    # dropout: every pass a new draw, the accumulated one too; eval mode exact
    g = ns["g_drop"]
    assert (g[0] - g[1]).abs().max() > 1e-3 and (g[2] - g[0]).abs().max() > 1e-3
    assert (g[2] - g[1]).abs().max() > 1e-3
    assert ns["drop_eval_gap"] < 1e-13

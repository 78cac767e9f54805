"""Tests of lesson 05: documented outputs, the formats' facts, loss scaling against GradScaler,
CPU autocast dtypes, the step's bytes, AdamW in NumPy, the figure, the dataset, the exercise
(against torch.amp.GradScaler on scripted sequences), and matmul rates / autocast on GPU."""

import math
import random
import statistics
import time
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scripts.pytest_course import cuda_median_ms


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_format_table_matches_the_formats_behaviour(lesson):
    ns = lesson.ns
    stored, format_row = ns["stored"], ns["format_row"]
    for name, dtype in {**ns["FORMATS"], **ns["FP8"]}.items():
        e, m, big, tiny, sub, eps = format_row(dtype)
        assert 1 + e + m == torch.finfo(dtype).bits, name
        # m mantissa bits: 1 + 2**-m is a number of the format, 1 + 2**-(m+1) rounds to 1
        assert stored(1 + 2.0**-m, dtype) == 1 + eps and stored(1 + 2.0**-(m + 1), dtype) == 1
        # e exponent bits: the largest exponent is 2**(e-1) - 1, the smallest normal 2 - 2**(e-1)
        if dtype == torch.float8_e4m3fn:  # no inf: the top exponent holds numbers, all-ones is NaN
            assert big == (2 - 2.0 ** -(m - 1)) * 2.0 ** (2 ** (e - 1)), name
        else:  # IEEE-style: the top exponent is kept for inf and NaN
            assert big == (2 - 2.0**-m) * 2.0 ** (2 ** (e - 1) - 1), name
        assert tiny == 2.0 ** (2 - 2 ** (e - 1)), name
        assert stored(big, dtype) == big and stored(tiny, dtype) == tiny
        assert stored(sub, dtype) == sub > 0 and stored(sub / 2, dtype) == 0  # the last subnormal
        if dtype == torch.float8_e4m3fn:  # saturates in 2.13.0: no inf in this format
            assert stored(2 * big, dtype) == stored(math.inf, dtype) == big
        elif dtype != torch.float32:
            assert stored(2 * big, dtype) == math.inf


def test_rounding_examples(lesson):
    stored, f16, bf16 = lesson.ns["stored"], torch.float16, torch.bfloat16
    assert stored(1e-8, f16) == 0 and stored(1e-8, bf16) == pytest.approx(1e-8, rel=2e-3)
    assert stored(70_000.0, f16) == math.inf and stored(70_000.0, bf16) == 70_144
    assert stored(1.001, f16) == 1 + 2**-10 and stored(1.001, bf16) == 1


def test_bfloat16_accumulation_stalls(lesson):
    sums = lesson.ns["sums"]
    assert sums["bfloat16"] == 1.0 and abs(sums["float32"] - 2) < 1e-3
    assert lesson.ns["stored"](1 + 1e-4, torch.bfloat16) == 1  # every addition rounds away


def test_bfloat16_weights_stall_under_small_updates(lesson):
    ns = lesson.ns
    stuck, w_bf16 = ns["stuck"], ns["w_bf16"]
    assert all(fp32 == 0 for _, fp32 in stuck.values())  # float32 moves every weight
    assert stuck[1e-3][0] == 0 and 0 < stuck[1e-4][0] < stuck[1e-5][0] and stuck[1e-5][0] > 0.5
    # at lr 1e-4 the stuck ones are the weights of 2**-5 or more, as the prose says
    big = (w_bf16.float().abs() >= 2.0**-5).float().mean().item()
    assert abs(stuck[1e-4][0] - big) < 0.005
    # a bfloat16 step at w is 2**-7 of its binade's start: 0.2% to 0.4% of w
    for v in (0.02, 0.031, 0.05):
        step = ns["stored"](v, torch.bfloat16)
        nxt = torch.nextafter(torch.tensor(step, dtype=torch.bfloat16), torch.tensor(1.0, dtype=torch.bfloat16))
        assert 2.0**-8 <= (nxt.item() - step) / step <= 2.0**-7


def test_float32_drift_is_839_steps_per_addition(lesson):
    ns = lesson.ns
    assert ns["ulp"] == 2.0**-23  # the step in [1, 2), not 2**-22 (the step in [2, 4))
    assert ns["moved"] == 839 * 2.0**-23
    # all partial sums but the last two are in [1, 2): 1 + k * 839 steps < 2 for k <= 9998
    assert 1 + 9998 * ns["moved"] < 2 <= 1 + 9999 * ns["moved"]
    # the drift the lesson prints comes from those steps
    assert abs(ns["sums"]["float32"] - (1 + 10_000 * ns["moved"])) < 1e-6


def test_loss_scaling_keeps_small_gradients(lesson):
    g, plain, scaled = lesson.ns["g"], lesson.ns["plain"], lesson.ns["scaled"]
    assert plain[0] == 0 and abs(plain[1] / g[1] - 1) > 0.05 and plain[2] == pytest.approx(g[2], rel=1e-3)
    torch.testing.assert_close(scaled, g, rtol=2e-3, atol=0)
    assert scaled[1] == pytest.approx(g[1], rel=1e-3)
    # dividing by 1024 is exact: scaled * 1024 is exactly what float16 stored
    assert torch.equal(scaled * 1024, (g * 1024).half().float())
    assert (g[0] * 1024).half().item() == 172 * 2.0**-24  # 172 subnormal steps


def test_lesson_scaler_trace(lesson):
    ns = lesson.ns
    ours, theirs = ns["ours"], ns["theirs"]
    actions = [ns["action"](u) for _, u in theirs]
    assert [k for k, a in enumerate(actions, start=1) if a == "skip"] == [3, 4]
    assert [s for s, _ in theirs] == [s for s, _ in ours]
    assert theirs[4][0] == 2.0**14 and theirs[7][0] == 2.0**15  # halved twice, then grew once
    assert ns["same"] is True
    assert ns["scaler"].get_scale() == 2.0**16  # steps 8-10 clean: grown again for step 11
    for _, u in theirs:  # the 1e-8 gradient survives every step that ran
        assert u is None or u[0].item() == pytest.approx(1e-8, rel=2e-3)


@pytest.mark.parametrize("interval", [1, 2, 4])
def test_lesson_rule_matches_gradscaler_on_other_runs(lesson, interval):
    """our_trace is not tuned to one sequence: other overflow patterns, NaN included."""
    rng = random.Random(interval)
    grads = []
    for _ in range(14):
        big = rng.choice([1e-4, 1e-4, 2.0, 9.0, math.nan])  # 2.0 / 9.0 overflow at high scales
        grads.append(torch.tensor([1e-8, 2e-7, big]))
    ours = lesson.ns["our_trace"](grads, interval)
    theirs = lesson.ns["torch_trace"](grads, interval)
    assert [s for s, _ in ours] == [s for s, _ in theirs]
    for (_, a), (_, b) in zip(ours, theirs):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    assert any(a is None for _, a in ours) and any(a is not None for _, a in ours)


def test_fp8_needs_a_scale(lesson):
    ns = lesson.ns
    codes = torch.tensor([0x7E, 0x7F], dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    assert codes[0] == 448 and codes[1].isnan()  # top exponent: numbers, all-ones: NaN
    e4m3, e5m2 = ns["fp8_errors"]["float8_e4m3fn"], ns["fp8_errors"]["float8_e5m2"]
    assert e4m3[0] > 0.3 and 0.5 < e4m3[1] < 0.75  # direct: most values lost
    assert e4m3[2] < 0.05  # scaled: 3 bits each
    assert e5m2[0] < 0.1 and e5m2[1] < 0.05  # range enough without a scale
    assert 1.5 * e4m3[2] < e5m2[2] < 3 * e4m3[2]  # 2 mantissa bits: about twice the error
    assert ns["stored"](1e-3, torch.float8_e4m3fn) == 2.0**-9  # just over half a step: up
    # nearly all scaled values are normal float8_e4m3fn numbers
    t, amax = ns["t8"], ns["amax"]
    scaled = (t * 448 / amax).abs()
    assert (scaled >= torch.finfo(torch.float8_e4m3fn).tiny).float().mean() > 0.99


def test_cpu_autocast_dtypes(lesson):
    d = lesson.ns["dtypes"]
    bf16, f32 = torch.bfloat16, torch.float32
    assert d["linear(x fp32)"] == d["x @ w.T"] == bf16
    assert d["softmax(logits)"] == d["layer_norm(logits)"] == bf16  # input dtype kept on CPU
    assert d["softmax(x fp32)"] == f32 and d["cross_entropy(logits)"] == f32


def test_autocast_rules_per_device(lesson):
    rule = lesson.ns["autocast_rule"]
    assert rule("aten::cross_entropy_loss", "AutocastCPU") and not rule("aten::cross_entropy_loss", "AutocastCUDA")
    for op in ("aten::log_softmax.int", "aten::nll_loss", "aten::softmax.int", "aten::layer_norm"):
        assert rule(op, "AutocastCUDA"), op
    assert not rule("aten::softmax.int", "AutocastCPU") and not rule("aten::layer_norm", "AutocastCPU")
    assert lesson.ns["composite"] is True
    assert not rule("aten::relu", "AutocastCPU")  # not every op has a rule: a rule is an entry


def test_cross_entropy_passes_the_logits_dtype_to_log_softmax(lesson):
    """The decomposition sets log_softmax's dtype to the logits' own, so CUDA's
    fp32_set_opt_dtype rule for log_softmax keeps it (lesson section 4)."""
    ns = lesson.ns
    arg_of, probe = ns["arg_of"], ns["log_softmax_dtype_arg"]
    assert len(set(map(str, arg_of.values()))) == 3  # None, bfloat16, float32 recorded apart
    assert ns["ce_dtype"] == ns["logits"].dtype == torch.bfloat16
    float_logits = ns["logits"].float()
    assert probe(lambda: F.cross_entropy(float_logits, ns["labels"])) == arg_of[torch.float32]


def cpu_flags():
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    return set(next((ln for ln in text.splitlines() if ln.startswith("flags")), ":").split(":")[1].split())


def test_16bit_matmul_cost(lesson):
    ns = lesson.ns
    t, out = ns["mm_time"], ns["mm_out"]
    assert set(t) == {"float32", "float16", "bfloat16", "bf16 via fp32"} and all(v > 0 for v in t.values())
    assert t["bf16 via fp32"] < 4 * t["float32"]  # two small casts and a float32 product
    exact = ns["a32"].double() @ ns["b32"].double()
    for name, tol in [("float32", 1e-4), ("bfloat16", 0.1), ("float16", 0.02)]:
        assert out[name].dtype == ns["FORMATS"][name]  # a real 16-bit product was timed
        gap = ((out[name].double() - exact).abs().max() / exact.abs().max()).item()
        assert gap < tol, (name, gap)
    assert out["bfloat16"].double().sub(exact).abs().max() > out["float32"].double().sub(exact).abs().max()
    # the direction the prose describes, from what the CPU and PyTorch report
    cap, bf16 = torch.backends.cpu.get_cpu_capability(), t["bfloat16"] / t["float32"]
    if cap == "AVX512" and torch.cpu._is_avx512_bf16_supported():
        # bf16 in hardware: a few times fp32 at most at 128x128 (measured: below 2 on an AMD
        # EPYC, 2.3 to 3.2 on an Intel Xeon, both with AVX-512 BF16; tens without)
        assert bf16 < 4, bf16
    elif not torch.cpu._is_avx512_bf16_supported() and not torch.cpu._is_amx_tile_supported():
        assert bf16 > 2, bf16  # emulated
    native_fp16 = torch.cpu._is_amx_fp16_supported() or "avx512_fp16" in cpu_flags()
    if not native_fp16:
        assert t["float16"] / t["float32"] > 2


def test_training_step_in_order(lesson):
    ns = lesson.ns
    rows, max_norm = ns["fp16_rows"], ns["MAX_NORM"]
    assert [r["scale"] for r in rows] == [2.0**16] * 4  # GradScaler's default, no overflow
    assert [r["lr"] for r in rows] == pytest.approx([0.1, 0.05, 0.1 / 3, 0.025])
    for r in rows:
        assert r["norm"] > max_norm and r["used"] == pytest.approx(max_norm, rel=1e-5)
    # clipping before unscale_ sees the scaled norm and leaves a gradient scale times too small
    wrong, true = ns["wrong_rows"][0], rows[0]
    assert wrong["norm"] == pytest.approx(2.0**16 * true["norm"], rel=1e-6)
    assert wrong["used"] == pytest.approx(max_norm / 2.0**16, rel=1e-4)
    assert wrong["loss"] == true["loss"]  # the same first forward pass


def test_adam_hides_the_clip_order_bug(lesson):
    adam = lesson.ns["adam"]
    right, wrong = adam[1e-8]
    assert 0.8 < (wrong.norm() / right.norm()).item() < 0.98  # shorter, because of eps
    assert F.cosine_similarity(right, wrong, dim=0) > 0.95
    right, wrong = adam[0.0]  # without eps the 1/65536 cancels
    assert (wrong.norm() / right.norm()).item() == pytest.approx(1.0, abs=1e-3)
    assert F.cosine_similarity(right, wrong, dim=0) > 0.9999


def test_forward_overflow_defeats_the_scaler(lesson):
    ns = lesson.ns
    outs = ns["outs"]
    assert outs["float32"].max().item() == outs["bfloat16"].max().item() == 1024 * 80
    assert outs["float16"].isinf().all() and outs["bfloat16"].dtype == torch.bfloat16
    assert ns["x_big"].half().float().equal(ns["x_big"])  # the inputs fit: the sum overflows
    assert [s for s, _ in ns["big_steps"]] == [2.0**16, 2.0**15, 2.0**14]
    assert all(math.isinf(v) for _, v in ns["big_steps"])
    assert torch.equal(ns["w_before"], ns["big"].weight) and ns["scaler_big"].get_scale() == 2.0**13


def test_train_step_updates_with_the_clipped_true_gradient(lesson):
    """One SGD step moves the weights by lr x the clipped norm: scaler.step does not unscale twice."""
    ns = lesson.ns
    model = ns["make_model"]()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    row = ns["train_step"](model, opt, sched, torch.amp.GradScaler("cpu"), ns["xs"][:16],
                           ns["ys"][:16], torch.float16)
    moved = torch.cat([(p.detach() - a).flatten() for a, p in zip(before, model.parameters())])
    assert row["norm"] > ns["MAX_NORM"]
    assert moved.norm().item() == pytest.approx(0.1 * ns["MAX_NORM"], rel=1e-3)


def test_train_step_skips_and_backs_off_on_overflow(lesson):
    """The lesson's step on a batch that overflows float16: no update, scale halved, lr moves on."""
    ns = lesson.ns
    model = ns["make_model"]()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 / (1 + k))
    scaler = torch.amp.GradScaler("cpu")
    before = [p.detach().clone() for p in model.parameters()]
    x = ns["xs"][:16] * 3e4  # inputs past float16's 65,504: the forward pass overflows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the scheduler warns: its step came before any opt.step
        ns["train_step"](model, opt, sched, scaler, x, ns["ys"][:16], torch.float16)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert scaler.get_scale() == 2.0**15 and sched.get_last_lr()[0] == pytest.approx(0.05)
    # and a clean step afterwards does update
    ns["train_step"](model, opt, sched, scaler, ns["xs"][:16], ns["ys"][:16], torch.float16)
    assert not all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_bfloat16_needs_no_scaler(lesson):
    ns = lesson.ns
    tiny = ns["tiny"]
    assert ns["reference"] > 0 and tiny["float16, no scaler"] == 0  # everything underflowed
    assert tiny["float16, scale 65536"] == pytest.approx(ns["reference"], rel=0.01)
    assert tiny["bfloat16, no scaler"] == pytest.approx(ns["reference"], rel=0.02)
    bf16 = ns["bf16_rows"]
    assert all(r["scale"] == 1.0 for r in bf16)  # a disabled scaler passes gradients through
    assert [r["loss"] for r in bf16] == pytest.approx([r["loss"] for r in ns["fp16_rows"]], abs=0.02)


def test_loss_on_fp32_logits(lesson):
    ns = lesson.ns
    exact = F.cross_entropy(ns["logits"].double(), ns["labels"])
    assert ns["loss_bf16"].dtype == torch.bfloat16 and ns["loss_fp32"].dtype == torch.float32
    assert abs(ns["loss_fp32"].item() - exact.item()) < 1e-6
    assert abs(ns["loss_bf16"].item() - exact.item()) > 1e-3
    # one rounding would be within half a step (1/128 near 3.5); the bf16 loss is farther
    nearest, fp32, bf16 = ns["nearest"].item(), ns["loss_fp32"].item(), ns["loss_bf16"].item()
    assert abs(nearest - fp32) <= 2.0**-7 < 2.0**-6 < abs(bf16 - fp32)
    # rounding the terms costs little; nll_loss's bfloat16 sum is a step off the rounded mean
    mean32 = ns["picked"].mean()
    assert abs(mean32.item() - fp32) < 0.005
    nll = F.nll_loss(ns["logp"], ns["labels"])
    assert nll.dtype == torch.bfloat16 and nll.item() != mean32.to(torch.bfloat16).item()
    assert nll.item() == bf16


def test_step_memory(lesson):
    ns = lesson.ns
    mlp, parts, n, nbytes = ns["mlp"], ns["parts"], ns["n"], ns["nbytes"]
    assert n == 8_393_728 == 1024 * 4096 + 4096 + 4096 * 1024 + 1024
    assert all(p.grad.dtype == p.dtype == torch.float32 for p in mlp.parameters())
    assert {k: nbytes(v) for k, v in parts.items()} == {
        "weights": 4 * n, "gradients": 4 * n, "AdamW m and v": 8 * n}
    assert ns["total"] == 16 * n
    # the optimizer's real state: exactly step, exp_avg and exp_avg_sq per parameter
    assert all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in ns["state"])
    assert len(ns["state"]) == 4
    names = [name for name, _ in ns["copies"]]
    assert names == ["2.weight"] and ns["copies"][0][1].dtype == torch.bfloat16
    saved = ns["saved"]
    assert saved[1].data_ptr() == saved[2].data_ptr()  # the ReLU output, saved twice


def test_copies_and_casts_printed(lesson):
    ns = lesson.ns
    assert ns["copies_req"] == ["0.weight", "2.weight"]
    assert ns["cast_counts"] == {"3 calls in 1 region": 3 + 2, "1 call in each of 3 regions": 3 * 3}
    assert ns["casts"](4, 1) == 4 + 2 and ns["casts"](1, 2) == 2 * 3  # the rule, not one count


def test_saved_weight_copies_when_the_input_needs_grad(lesson):
    """The prose's claim: with a requires-grad input, every layer's bf16 weight copy is saved."""
    weight_copies = lesson.ns["weight_copies"]
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    for needs_grad, expected in [(False, ["2.weight"]), (True, ["0.weight", "2.weight"])]:
        x = torch.randn(2, 16, requires_grad=needs_grad)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                mlp(x)
        assert sorted(name for name, _ in weight_copies(saved, mlp)) == expected


def test_adamw_matches_numpy(lesson):
    ns = lesson.ns
    ulp = 2.0**-52
    assert len(ns["gaps"]) == ns["STEPS"] and max(ns["gaps"]) < 16 * ulp
    first, second = ns["halves"]
    assert second <= 2 * first + 2  # the gap does not grow over the run
    assert ns["w_abs"].min() > 1 and ns["w_abs"].max() < 2  # "weights of size 1 to 2"
    assert ns["acc"] == ns["acc_np"] and 0.8 < ns["acc"] < 0.95
    assert len(ns["y_tr"]) == 400 and len(ns["y_val"]) == 200
    assert np.bincount(ns["y_tr"]).tolist() == [100] * 4


@pytest.mark.parametrize("lr, decay, betas", [(1e-2, 0.0, (0.9, 0.999)), (3e-3, 0.5, (0.8, 0.99))])
def test_numpy_adamw_matches_torch_on_random_tensors(lesson, lr, decay, betas):
    gen = np.random.default_rng(1)
    p0 = gen.standard_normal((3, 5))
    p_torch = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = torch.optim.AdamW([p_torch], lr=lr, betas=betas, weight_decay=decay)
    p_np, ours = p0.copy(), lesson.ns["NumpyAdamW"](lr, betas=betas)
    for _ in range(25):
        grad = gen.standard_normal((3, 5)) * gen.choice([1e-3, 1.0, 30.0])
        p_torch.grad = torch.from_numpy(grad.copy())
        opt.step()
        ours.step("p", p_np, grad, decay)
    np.testing.assert_allclose(p_np, p_torch.detach().numpy(), rtol=0, atol=1e-13)


def test_dataset_regenerates_byte_for_byte(lesson):
    from scripts import make_four_classes as make_data

    assert make_data.CSV.read_text() == make_data.render(make_data.make_rows())


def test_figure_shows_the_ranges(lesson):
    ns = lesson.ns
    fig = ns["plot_formats"](ns["FORMATS"])
    ax = fig.get_axes()[0]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "magnitude (log scale)"
    assert [t.get_text() for t in ax.get_yticklabels()] == list(ns["FORMATS"])
    bars = {c.get_label(): c.patches[0] for c in ax.containers}  # one bar per barh call
    for row, (name, dtype) in enumerate(ns["FORMATS"].items()):
        _, _, big, tiny, sub, _ = ns["format_row"](dtype)
        for part, lo, hi in [("subnormal", sub, tiny), ("normal", tiny, big), ("overflow", big, 1e40)]:
            bar = bars[f"{name} {part}"]
            assert bar.get_x() == pytest.approx(lo) and bar.get_x() + bar.get_width() == pytest.approx(hi)
            assert bar.get_y() + bar.get_height() / 2 == pytest.approx(row)
    assert len(bars) == 9
    marks = sorted(line.get_xdata()[0] for line in ax.lines)  # the dotted example values
    assert marks == [1e-8, 7e4]
    assert (ns["HERE"] / "formats.png").is_file()


# ----------------------------------------------------------------------------------------
# Exercise: DynamicLossScaler against torch.amp.GradScaler on scripted gradient sequences


class Recorder(torch.optim.Optimizer):
    """Records the gradients GradScaler lets through (already unscaled); changes nothing."""

    def __init__(self, params):
        super().__init__(params, {})
        self.seen = []

    def step(self, closure=None):
        self.seen.append([p.grad.clone() for p in self.param_groups[0]["params"]])


def replay(scaler_cls, steps, **kw):
    """Run `steps` through GradScaler and through scaler_cls side by side; assert each step.

    steps: [(true grads, corrupt)] where corrupt is None or (tensor index, flat index, value).
    """
    shapes = [g.shape for g in steps[0][0]]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    opt = Recorder(params)
    ref = torch.amp.GradScaler("cpu", **kw)
    mine = scaler_cls(**kw)
    for k, (grads, corrupt) in enumerate(steps):
        ref.scale(torch.ones(()))  # creates the scale tensor on first use, as scaling a loss does
        scale = ref.get_scale()
        assert mine.scale == scale, f"step {k}: scale {mine.scale}, GradScaler {scale}"
        scaled = [g * scale for g in grads]
        if corrupt:
            i, j, value = corrupt
            scaled[i].view(-1)[j] = value
        for p, s in zip(params, scaled):
            p.grad = s.clone()
        n_seen = len(opt.seen)
        ref.step(opt)
        ref.update()
        inputs = [s.clone() for s in scaled]
        out = mine.step(inputs)
        skipped = len(opt.seen) == n_seen
        assert (out is None) == skipped, f"step {k}: skip {out is None}, GradScaler skip {skipped}"
        if out is not None:
            assert len(out) == len(grads)
            for a, b in zip(out, opt.seen[-1]):
                assert a.dtype == b.dtype and torch.equal(a, b), f"step {k}: unscaled {a} != {b}"
        assert all(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) for a, b in zip(inputs, scaled)), \
            f"step {k}: inputs modified"
    assert mine.scale == ref.get_scale()


def clean(n, seed=0, shapes=((3,), (2, 2))):
    gen = torch.Generator().manual_seed(seed)
    return [(([torch.randn(s, generator=gen) for s in shapes]), None) for _ in range(n)]


def bad(value=math.inf, i=0, j=0, shapes=((3,), (2, 2))):
    return [([torch.ones(s) for s in shapes], (i, j, value))]


SCRIPTED = {
    # growth exactly at the interval: 3 clean steps grow at interval 3, not before or after
    "growth-at-interval": (clean(7), {"growth_interval": 3}),
    "growth-interval-1": (clean(4), {"growth_interval": 1}),
    # the clean-step counter restarts after an overflow
    "reset-after-inf": (clean(2) + bad() + clean(2) + clean(2), {"growth_interval": 3}),
    "reset-after-nan": (clean(2) + bad(math.nan, 1, 3) + clean(4), {"growth_interval": 3}),
    "minus-inf": (clean(1) + bad(-math.inf, 1, 2) + clean(2), {"growth_interval": 2}),
    "nan-only": (bad(math.nan) + bad(math.nan, 1, 0) + clean(1), {"growth_interval": 5}),
    "overflow-right-after-growth": (clean(3) + bad() + clean(3), {"growth_interval": 3}),
    "other-factors": (clean(2) + bad() + clean(5) + bad(math.nan), {
        "init_scale": 2.0**10, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 2}),
}


@pytest.mark.exercise("DynamicLossScaler")
@pytest.mark.parametrize("name", SCRIPTED)
def test_scaler_scripted(exercise_module, name):
    steps, kw = SCRIPTED[name]
    replay(exercise_module.DynamicLossScaler, steps, **kw)


@pytest.mark.exercise("DynamicLossScaler")
def test_scaler_defaults(exercise_module):
    """The defaults: 2**16, x2 after exactly 2000 clean steps, x0.5 on overflow."""
    s = exercise_module.DynamicLossScaler()
    assert s.scale == 2.0**16
    one = [torch.ones(2)]
    for _ in range(1999):
        assert s.step(one) is not None
    assert s.scale == 2.0**16
    s.step(one)
    assert s.scale == 2.0**17
    assert s.step([torch.tensor([1.0, math.inf])]) is None and s.scale == 2.0**16
    # a short run through GradScaler with its defaults too
    replay(exercise_module.DynamicLossScaler, clean(3) + bad() + clean(2))


@pytest.mark.exercise("DynamicLossScaler")
def test_scaler_random_sequences(exercise_module):
    rng = random.Random(0)
    for _ in range(20):
        kw = {"init_scale": 2.0 ** rng.randint(4, 20), "growth_interval": rng.choice([1, 2, 3, 5])}
        steps = []
        for _ in range(rng.randint(10, 25)):
            if rng.random() < 0.25:
                steps += bad(rng.choice([math.inf, -math.inf, math.nan]), rng.randrange(2), rng.randrange(3))
            else:
                steps += clean(1, seed=rng.randrange(10**6))
        replay(exercise_module.DynamicLossScaler, steps, **kw)


# ----------------------------------------------------------------------------------------
# GPU: matmul throughput per dtype, and what CUDA autocast does to softmax and layer_norm


def matmul_tflops(device, dtype, n=4096, repeats=10):
    sync = torch.cuda.synchronize if device == "cuda" else torch.mps.synchronize
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b  # warm-up: library selection, clocks
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        sync()  # kernels run asynchronously: stop the clock when the GPU is done
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e12


@pytest.mark.parametrize(
    "device",
    [pytest.param("cuda", marks=pytest.mark.cuda), pytest.param("mps", marks=pytest.mark.mps)],
)
def test_matmul_tflops_per_dtype(device, record_property):
    cases = [("fp32", torch.float32, "highest"), ("fp16", torch.float16, "highest"),
             ("bf16", torch.bfloat16, "highest")]
    if device == "cuda":
        cases.insert(1, ("tf32", torch.float32, "high"))  # fp32 inputs on TF32 tensor cores
    before = torch.get_float32_matmul_precision()
    rates = {}
    try:
        for name, dtype, precision in cases:
            torch.set_float32_matmul_precision(precision)
            try:
                rates[name] = matmul_tflops(device, dtype)
            except (RuntimeError, TypeError) as err:  # e.g. bf16 on an older MPS
                print(f"{device} {name}: not supported ({str(err).splitlines()[0]})")
    finally:
        torch.set_float32_matmul_precision(before)
    print(f"{device} 4096x4096 matmul: " + ", ".join(f"{k} {v:.1f} TFLOP/s" for k, v in rates.items()))
    for name, rate in rates.items():
        record_property(f"{device} {name} matmul 4096^3 [TFLOP/s]", round(rate, 1))
    assert all(v > 0 for v in rates.values()) and "fp32" in rates
    major, minor = torch.cuda.get_device_capability() if device == "cuda" else (0, 0)
    if major >= 8 and minor == 0:  # A100, H100/H200, B200: data-centre tensor cores at full rate
        # (GeForce parts run TF32 at about their fp32 rate and 16-bit products with fp32
        # accumulation at about twice it, so these margins are for data-centre parts only)
        assert rates["fp16"] > 2 * rates["fp32"], rates
        assert rates["bf16"] > 2 * rates["fp32"], rates
        # TF32 rounds fp32 inputs to a 10-bit mantissa and runs them on tensor cores
        assert rates["tf32"] > 1.5 * rates["fp32"], rates
        assert rates["bf16"] > rates["tf32"], rates  # twice TF32's tensor-core rate
    elif device == "cuda":
        assert rates["fp16"] > 0.5 * rates["fp32"], rates  # at least not a broken path


@pytest.mark.cuda
def test_tf32_is_what_high_precision_means(record_property):
    """TF32 is a precision, not only a speed: 'high' makes fp32 matmuls measurably less exact."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 needs compute capability 8.0 (Ampere) or later")
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(1024, 1024, device="cuda", generator=gen)  # (n, n) fp32
    b = torch.randn(1024, 1024, device="cuda", generator=gen)
    exact = a.double() @ b.double()
    before = torch.get_float32_matmul_precision()
    try:
        errors = {}
        for precision in ("highest", "high"):
            torch.set_float32_matmul_precision(precision)
            errors[precision] = ((a @ b).double() - exact).abs().max().item()
    finally:
        torch.set_float32_matmul_precision(before)
    print(f"cuda 1024^2 matmul max error: fp32 {errors['highest']:.2e}, tf32 {errors['high']:.2e}")
    record_property("fp32 matmul 1024^3, max error vs float64 [abs]", errors["highest"])
    record_property("tf32 matmul 1024^3, max error vs float64 [abs]", errors["high"])
    assert errors["high"] > 10 * errors["highest"]  # 10 mantissa bits against 23


@pytest.mark.cuda
def test_cuda_autocast_dtypes(record_property):
    """On CUDA, softmax and layer_norm run in float32 under autocast (on the CPU they do not);
    cross-entropy's float32 comes from nll_loss: the decomposition passes log_softmax the
    logits' own dtype, which CUDA's rule for log_softmax keeps (lesson section 4).
    Written without a GPU: unverified."""
    x = torch.randn(8, 16, device="cuda")
    w = torch.randn(4, 16, device="cuda")
    labels = torch.randint(0, 4, (8,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = F.linear(x, w)
        assert logits.dtype == torch.bfloat16
        assert logits.softmax(-1).dtype == torch.float32
        assert F.layer_norm(logits, (4,)).dtype == torch.float32
        assert F.cross_entropy(logits, labels).dtype == torch.float32
        logp = F.log_softmax(logits, -1)
        assert logp.dtype == torch.float32  # no dtype given: the rule fills in float32
        logp_own = F.log_softmax(logits, -1, dtype=logits.dtype)  # as cross_entropy calls it
        assert logp_own.dtype == torch.bfloat16  # a dtype given is kept
        assert F.nll_loss(logp_own, labels).dtype == torch.float32  # the cast up happens here
        assert (logits @ w).dtype == torch.bfloat16  # matmuls stay low precision
        for name, out in [("softmax", logits.softmax(-1)), ("layer_norm", F.layer_norm(logits, (4,))),
                          ("log_softmax", logp), ("cross_entropy", F.cross_entropy(logits, labels))]:
            record_property(f"CUDA bf16 autocast: {name} output dtype", str(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the contrast, same call on the CPU
        cpu_logits = F.linear(x.cpu(), w.cpu())
        assert cpu_logits.softmax(-1).dtype == F.layer_norm(cpu_logits, (4,)).dtype == torch.bfloat16


def timed_tflops(fn, flops, repeats=10):
    """TFLOP/s of fn on CUDA: its median time by CUDA events after 3 warm-ups."""
    return flops / (cuda_median_ms(fn, repeats=repeats) / 1e3) / 1e12


@pytest.mark.cuda
def test_fp8_scaled_matmul(record_property):
    """float8_e4m3fn products with per-tensor scales (torch._scaled_mm, the lesson's fp8 part):
    as exact as its fp8 inputs allow, and on data-centre Hopper-class parts faster than bf16."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 matmuls need compute capability 8.9 (Ada) or 9.0 (Hopper) or later")
    n, fp8 = 4096, torch.float8_e4m3fn
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", generator=gen)  # (n, n) fp32
    b = torch.randn(n, n, device="cuda", generator=gen)
    sa = (a.abs().max() / torch.finfo(fp8).max).float()  # dequantisation scales: x = x8 * s
    sb = (b.abs().max() / torch.finfo(fp8).max).float()
    a8 = (a / sa).to(fp8)  # row-major
    b8 = (b / sb).to(fp8).t().contiguous().t()  # column-major, as _scaled_mm requires

    def fp8_mm():  # use_fast_accum: Hopper's faster, slightly less exact fp8 accumulation
        return torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                use_fast_accum=True)

    out = fp8_mm()
    ref = (a8.float() * sa) @ (b8.float() * sb)  # the same fp8 values, multiplied in fp32
    err = ((out.float() - ref).norm() / ref.norm()).item()
    err_fp32 = ((out.float() - a @ b).norm() / (a @ b).norm()).item()  # what fp8 inputs cost
    a16, b16 = a.bfloat16(), b.bfloat16()
    rates = {"fp8": timed_tflops(fp8_mm, 2 * n**3), "bf16": timed_tflops(lambda: a16 @ b16, 2 * n**3)}
    print(f"cuda 4096^2: fp8 {rates['fp8']:.0f} TFLOP/s, bf16 {rates['bf16']:.0f} TFLOP/s; "
          f"fp8 error vs its inputs {err:.1e}, vs fp32 inputs {err_fp32:.1e}")
    record_property("fp8 e4m3 scaled matmul 4096^3 [TFLOP/s]", round(rates["fp8"], 1))
    record_property("bf16 matmul 4096^3, same run [TFLOP/s]", round(rates["bf16"], 1))
    record_property("fp8 matmul, error vs the same fp8 values in fp32 [relative]", err)
    record_property("fp8 matmul, error vs the fp32 inputs [relative]", err_fp32)
    assert out.dtype == torch.bfloat16 and err < 1e-2  # bf16 output rounding, not garbage
    assert err_fp32 < 0.1  # 3 mantissa bits per input: a few percent
    major, minor = torch.cuda.get_device_capability()
    if major >= 9 and minor == 0:  # H100/H200, B200: fp8 tensor cores at twice the bf16 peak
        assert rates["fp8"] > 1.2 * rates["bf16"], rates  # 1.2: a margin below that 2

"""Tests of lesson 05a: documented outputs, the formats' facts (bits, ranges, the last
subnormal), rounding and stalled bfloat16 sums, loss scaling against GradScaler, fp8 and its
per-tensor scale, torch._scaled_mm on the CPU, the figure, the exercise (against torch.amp.GradScaler on scripted
sequences), and an fp8 scaled matmul on a GPU.

Lesson 05b (mixed precision: autocast, the training step, its bytes, AdamW) has its own
tests; the GPU rates of 16-bit matmuls and CUDA autocast's dtypes are there."""

import math
import random

import pytest
import torch

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


def test_the_smallest_subnormal_is_kept_and_half_of_it_is_not(lesson):
    """The table cell's last line: tiny * eps is each format's smallest positive number."""
    ns = lesson.ns
    assert ns["last_kept"] is True
    for name, value in ns["subnormal_min"].items():
        dtype = ns["FORMATS"][name]
        assert value == torch.finfo(dtype).tiny * torch.finfo(dtype).eps
        # nothing positive lies below it: the next number down from it is 0
        below = torch.nextafter(torch.tensor(value, dtype=dtype), torch.tensor(0.0, dtype=dtype))
        assert below.item() == 0.0, name




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
    # a bfloat16 step at w is 2**-7 of its binade's start: 2**-8 to 2**-7 of w (0.4% to 0.8%),
    # so an update must exceed half of it, 0.2% to 0.4% of w, as the prose says
    for v in (0.02, 0.031, 0.05):
        step = ns["stored"](v, torch.bfloat16)
        nxt = torch.nextafter(torch.tensor(step, dtype=torch.bfloat16), torch.tensor(1.0, dtype=torch.bfloat16))
        assert 2.0**-8 <= (nxt.item() - step) / step <= 2.0**-7


def test_a_moving_bfloat16_weight_never_moves_by_its_update(lesson):
    """The prose: a bfloat16 weight that moves lands on the nearest bfloat16 number, never
    moving by exactly its update; a float32 weight moves by its update, to rounding."""
    ns = lesson.ns
    w, w_bf16, updates = ns["w"], ns["w_bf16"], ns["updates"]
    assert sorted(updates) == sorted(ns["stuck"])
    for lr, update in updates.items():
        new = (w_bf16.float() + update).to(torch.bfloat16)
        moved = new.float() - w_bf16.float()
        m = moved != 0
        assert m.any() and not (moved[m] == update[m]).any(), lr
        # off by a sizeable part of the update: at lr 1e-4 and 1e-5 up to more than 30%
        off = ((moved[m] - update[m]).abs() / lr).max().item()
        assert off > (0.3 if lr < 1e-3 else 0.05), (lr, off)
        moved32 = (w + update) - w
        assert torch.allclose(moved32, update, rtol=1e-3, atol=0), lr


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


def test_gradscaler_refuses_float16_gradients_only():
    """fp16_scaled's comment: float16 .grad is refused, bfloat16 and float32 are unscaled."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        p = torch.nn.Parameter(torch.zeros(3, dtype=dtype))
        opt = torch.optim.SGD([p], lr=1.0)
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(torch.ones(()))
        p.grad = torch.full((3,), 2.0**15, dtype=dtype)  # half the scale: finite in every dtype
        if dtype == torch.float16:
            with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
                scaler.step(opt)
        else:
            scaler.step(opt)
            assert torch.equal(p.detach(), torch.full((3,), -0.5, dtype=dtype)), dtype  # unscaled


def test_growth_interval_default(lesson):
    assert torch.amp.GradScaler("cpu").get_growth_interval() == 2000
    assert lesson.ns["scaler"].get_growth_interval() == lesson.ns["GROWTH_INTERVAL"] == 3


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


def test_scaled_mm_on_the_cpu(lesson):
    """_scaled_mm's product is the dequantised product (the CPU path: exactly it, here 0),
    and the fp8 inputs cost a few percent against float32 (measured 3.75% under AVX-512,
    AVX2 and no vector ISA): below 5%, and more than 1%."""
    ns = lesson.ns
    prod8, a8, b8 = ns["prod8"], ns["a8"], ns["b8"]
    assert prod8.dtype == torch.float32 and prod8.shape == (64, 32)
    assert a8.dtype == b8.dtype == torch.float8_e4m3fn and b8.stride() == (1, 128)  # column-major
    assert a8.float().abs().max() == b8.float().abs().max() == 448  # each largest value on 448
    assert ns["gap8"] < 1e-6
    assert 0.01 < ns["err8"] < 0.05
    # the factors are what _scaled_mm multiplies by: doubling one doubles the product
    twice = torch._scaled_mm(a8, b8, scale_a=2 * ns["back_a"], scale_b=ns["back_b"], out_dtype=torch.float32)
    torch.testing.assert_close(twice, 2 * prod8, rtol=1e-6, atol=0)


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
# GPU: fp8 products with per-tensor scales


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

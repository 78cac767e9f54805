"""Tests of lesson 05b: documented outputs, CPU autocast dtypes and the per-device rules, the
loss on float32 logits, the 16-bit matmul cost, the float32 matmul precision settings, the
training step in order (clipping, skipping, bfloat16 without a scaler, a forward overflow),
the old `torch.cuda.amp` names, the step's bytes, AdamW in NumPy, the dataset, the exercise
(accumulated_step against one step on the whole batch), and on a GPU the matmul rates per
dtype, TF32's error and CUDA autocast's dtypes.

Lesson 05a (the formats, loss scaling, fp8) has its own tests."""

import inspect
import math
import statistics
import time
import warnings

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
    fp32_set_opt_dtype rule for log_softmax keeps it (section 1 says so; Going further shows it)."""
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



def test_fp32_precision_settings(lesson):
    """The old setting writes the per-backend ones; a new one alone makes the old getter raise;
    the cell restores every setting (this process still has the defaults)."""
    ns = lesson.ns
    rows = ns["rows"]
    assert list(ns["BACKENDS"]) == ["cuda.matmul", "mkldnn.matmul", "cudnn.conv"]
    assert rows == {
        "defaults": ("highest", "none", "none", "tf32"),
        "set_float32_matmul_precision('high')": ("high", "tf32", "tf32", "tf32"),
        "set_float32_matmul_precision('medium')": ("medium", "tf32", "bf16", "tf32"),
        "set_float32_matmul_precision('highest')": ("highest", "ieee", "ieee", "tf32"),
    }
    assert ns["mixed"] == "RuntimeError, mix of the legacy and new APIs: True"
    assert ns["out_dtypes"] == {torch.float32}
    assert isinstance(ns["medium_same"], bool)  # machine-dependent: oneDNN's bf16 path or not
    assert torch.equal(ns["products"]["highest"], ns["a512"] @ ns["b512"])  # "highest" is the default
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":  # no vector ISA: no oneDNN bf16 path
        assert ns["medium_same"] is True
    # 'medium' vs float64: float32 arithmetic (about 3e-7) unless oneDNN took a bfloat16 kernel
    # (about 3e-3), as the prose says. Measured: 4.05e-7 against 2.89e-7 on an AVX-512 BF16 CPU
    # without AMX (ONEDNN_VERBOSE: a float32 brgemm kernel with attr-fpmath:bf16), equal under
    # AVX2 and no vector ISA, where 'medium' leaves the product unchanged.
    err = ns["mm_error"]
    assert isinstance(ns["medium_fp32"], bool)
    assert ns["medium_fp32"] == (err["medium"] < 10 * err["highest"])
    assert err["highest"] < 1e-6 and err["high"] < 1e-6  # no TF32 on a CPU
    bf16_inputs = (ns["a512"].bfloat16() @ ns["b512"].bfloat16()).double()
    bf16_err = ((bf16_inputs - ns["exact512"]).norm() / ns["exact512"].norm()).item()
    assert 1e-3 < bf16_err < 1e-2 and bf16_err > 1000 * err["highest"]  # 10 x tells them apart
    cap = torch.backends.cpu.get_cpu_capability()
    if cap == "DEFAULT" or (cap == "AVX512" and not torch.cpu._is_amx_tile_supported()):
        assert ns["medium_fp32"] is True
    assert ns["fp32_settings"]() == ns["defaults"] == rows["defaults"]
    assert torch.backends.cuda.matmul.allow_tf32 is False  # the legacy flag agrees again
    # the prose's reading of Context.h: NONE is "inherit", cuDNN's DEFAULT is the legacy TF32
    header = (__import__("pathlib").Path(torch.__file__).parent / "include/ATen/Context.h").read_text()
    assert 'NONE means "explicitly set to\n// inherit/no-op"' in header
    assert "bool allow_tf32_cudnn = true;" in header


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
    assert lesson.ns["adam_clipped"] is True  # the premise: every step clipped in both orders
    for (eps, bug), (_, rows) in lesson.ns["runs"].items():
        assert len(rows) == 4 and all(r["used"] == pytest.approx(
            lesson.ns["MAX_NORM"] / (2.0**16 if bug else 1), rel=1e-4) for r in rows), (eps, bug)
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


def test_old_amp_names_warn_and_the_new_ones_do_not(lesson):
    ns = lesson.ns
    for name, (make, new_class) in ns["old_names"].items():
        made, caught = ns["warnings_of"](make)
        future = [w for w in caught if w.category is FutureWarning]
        assert len(future) == 1 and "is deprecated" in str(future[0].message), name
        assert f"torch.amp.{new_class.__name__}('cuda'" in str(future[0].message), name
        assert isinstance(made, new_class) and type(made) is not new_class, name  # a subclass
    assert ns["warnings_of"](ns["old_names"]["torch.cuda.amp.autocast"][0])[0].device == "cuda"
    # the new spelling raises no FutureWarning (without a GPU, a UserWarning says it disables itself)
    for make in (lambda: torch.amp.GradScaler("cuda"), lambda: torch.autocast("cuda", dtype=torch.bfloat16)):
        _, caught = ns["warnings_of"](make)
        assert not [w for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]


def test_is_bf16_supported_as_the_prose_reads_it():
    """Read from torch/cuda/__init__.py: capability 8.0 or later, emulation counted by default."""
    signature = inspect.signature(torch.cuda.is_bf16_supported)
    assert signature.parameters["including_emulation"].default is True
    source = inspect.getsource(torch.cuda.is_bf16_supported)
    assert ".major >= 8" in source and "_check_bf16_tensor_supported" in source
    assert "is_bf16_supported(including_emulation=False)" in inspect.getsource(torch.cuda.is_tf32_supported)
    if not torch.cuda.is_available():
        assert torch.cuda.is_bf16_supported() is False




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
    # the sum alone: bfloat16 running sums land a step off the float32 sum rounded once
    total = ns["nll_sum"]
    picked = ns["picked"]
    once = picked.sum().to(torch.bfloat16)
    assert total.dtype == torch.bfloat16 and total.item() != once.item()
    assert total.item() == 28.5 and once.item() == 28.375 and abs(picked.sum().item() - 28.349) < 5e-4
    # LossNLL.cpp's cascade on 8 terms: term 0 to level 1, terms 1-7 summed in level 0, then
    # level 0 + level 1, every addition rounded to bfloat16
    bf = torch.bfloat16
    level0 = torch.tensor(0.0, dtype=bf)
    for v in picked[1:].to(bf):
        level0 = level0 + v
    assert (level0 + picked[0].to(bf)).item() == total.item()


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


def test_missing_dataset_message(lesson):
    with pytest.raises(FileNotFoundError, match="copy data/absent.csv"):
        lesson.ns["load_data"]("absent.csv")


def test_dataset_found_next_to_the_script(lesson, tmp_path, monkeypatch):
    """A copied lesson folder without the repository's data/: the copy next to the script."""
    ns = lesson.ns
    here = tmp_path / "course" / "lessons" / "05b_mixed_precision"
    here.mkdir(parents=True)
    csv_file = ns["HERE"].parent.parent / "data" / "four_classes.csv"
    (here / "four_classes.csv").write_text(csv_file.read_text())
    monkeypatch.setitem(ns["load_data"].__globals__, "HERE", here)
    x_tr, y_tr, x_val, y_val = ns["load_data"]()
    assert np.array_equal(x_tr, ns["x_tr"]) and np.array_equal(y_val, ns["y_val"])


def test_dataset_regenerates_byte_for_byte(lesson):
    from scripts import make_four_classes as make_data

    assert make_data.CSV.read_text() == make_data.render(make_data.make_rows())


# ----------------------------------------------------------------------------------------
# Exercise: accumulated_step against one step on the whole batch


def make_net():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def whole_batch(n=16, seed=2):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=gen)  # (n, 16)
    return x, x[:, :4].argmax(1)  # (n,) labels: the largest of the first 4 features


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def reference_step(x, y, dtype, max_norm, use_scaler):
    """(weights moved, norm): one SGD step on the whole batch, in section 2's order."""
    model = make_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=use_scaler)
    before = flat(model)
    with torch.autocast("cpu", dtype=dtype):
        logits = model(x)
    scaler.scale(F.cross_entropy(logits.float(), y)).backward()
    scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    return flat(model) - before, norm.item()


def run_exercise(module, micro_batches, dtype, max_norm, scaler, model=None):
    """(model, weights moved, norm, stepped) of the student's step on a fresh model."""
    model = model or make_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = flat(model)
    norm, stepped = module.accumulated_step(model, opt, scaler, micro_batches, dtype, max_norm)
    return model, flat(model) - before, norm, stepped


CASES = [pytest.param(torch.float16, True, id="float16-scaler"),
         pytest.param(torch.bfloat16, False, id="bfloat16-no-scaler")]


@pytest.mark.exercise("accumulated_step")
@pytest.mark.parametrize("dtype, use_scaler", CASES)
def test_accumulated_step_equals_one_step_on_the_whole_batch(exercise_module, dtype, use_scaler):
    """The mean over 4 micro-batches, not their sum nor the last one alone; no clipping here."""
    x, y = whole_batch()
    ref_moved, ref_norm = reference_step(x, y, dtype, 1e6, use_scaler)
    scaler = torch.amp.GradScaler("cpu", enabled=use_scaler)
    _, moved, norm, stepped = run_exercise(exercise_module, list(zip(x.split(4), y.split(4))), dtype, 1e6, scaler)
    assert stepped, "a clean step must run"
    gap = ((moved - ref_moved).norm() / ref_moved.norm()).item()
    assert gap < 0.02, f"the weights moved {gap:.1%} away from one step on the whole batch"
    assert isinstance(norm, float) and norm == pytest.approx(ref_norm, rel=0.02), (norm, ref_norm)
    assert scaler.get_scale() == (2.0**16 if use_scaler else 1.0)  # a clean step: no backoff


class CrossEntropyInputs(torch.overrides.TorchFunctionMode):
    """Records the dtype of every input that F.cross_entropy (or nn.CrossEntropyLoss) gets."""

    def __init__(self):
        super().__init__()
        self.dtypes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.cross_entropy:
            self.dtypes.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


@pytest.mark.exercise("accumulated_step")
@pytest.mark.parametrize("dtype, use_scaler", CASES)
def test_the_forward_runs_in_dtype_and_the_loss_in_float32(exercise_module, dtype, use_scaler):
    """Each micro-batch's linear layers compute in `dtype`; the loss gets float32 logits."""
    x, y = whole_batch()
    model, layer_dtypes = make_net(), set()
    for layer in (model[0], model[2]):
        layer.register_forward_hook(lambda mod, inp, out: layer_dtypes.add(out.dtype))
    with CrossEntropyInputs() as losses:
        run_exercise(exercise_module, list(zip(x.split(4), y.split(4))), dtype, 1e6,
                     torch.amp.GradScaler("cpu", enabled=use_scaler), model=model)
    assert layer_dtypes == {dtype}, f"the linear layers computed in {layer_dtypes}: autocast to {dtype}"
    assert losses.dtypes == [torch.float32] * 4, f"cross_entropy got {losses.dtypes}: one float32 loss per micro-batch"


@pytest.mark.exercise("accumulated_step")
def test_accumulated_step_clips_the_true_gradient(exercise_module):
    """Unscale before clipping: the norm returned is the true one, and SGD moves lr x max_norm."""
    x, y = whole_batch()
    _, ref_norm = reference_step(x, y, torch.float16, 1e6, True)
    max_norm = 0.1
    assert ref_norm > 2 * max_norm  # the premise: this step is clipped
    scaler = torch.amp.GradScaler("cpu")
    _, moved, norm, stepped = run_exercise(exercise_module, list(zip(x.split(8), y.split(8))),
                                           torch.float16, max_norm, scaler)
    assert stepped
    assert norm == pytest.approx(ref_norm, rel=0.02), f"norm {norm}: clipped before unscale_?"
    assert moved.norm().item() == pytest.approx(0.1 * max_norm, rel=1e-3)


@pytest.mark.exercise("accumulated_step")
def test_an_overflowing_micro_batch_skips_the_step(exercise_module):
    """One micro-batch overflows float16 in its forward pass: no update, scale halved; the
    next clean call steps at the halved scale."""
    x, y = whole_batch()
    bad = [(x[:4], y[:4]), (x[4:8] * 3e4, y[4:8]), (x[8:12], y[8:12])]  # past 65,504
    scaler = torch.amp.GradScaler("cpu")
    model, moved, norm, stepped = run_exercise(exercise_module, bad, torch.float16, 1.0, scaler)
    assert not stepped, "an inf gradient must skip the step"
    assert torch.equal(moved, torch.zeros_like(moved)), "the weights must not change on a skipped step"
    assert not math.isfinite(norm)
    assert scaler.get_scale() == 2.0**15, "the scaler must halve its scale after an overflow"
    _, moved, norm, stepped = run_exercise(exercise_module, list(zip(x.split(4), y.split(4))),
                                           torch.float16, 1.0, scaler, model=model)
    assert stepped and math.isfinite(norm) and moved.abs().sum() > 0
    assert scaler.get_scale() == 2.0**15


@pytest.mark.exercise("accumulated_step")
def test_a_disabled_scaler_always_steps(exercise_module):
    """bfloat16 with a disabled scaler and a NaN input: the norm is NaN, but a disabled scaler
    checks nothing and calls opt.step() anyway, so `stepped` is True (not `isfinite(norm)`)."""
    x, y = whole_batch()
    x = x.clone()
    x[5, 0] = math.nan  # one NaN input in the second micro-batch
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    _, moved, norm, stepped = run_exercise(exercise_module, list(zip(x.split(4), y.split(4))),
                                           torch.bfloat16, 1.0, scaler)
    assert math.isnan(norm)
    assert stepped is True, "a disabled scaler never skips: opt.step() ran"
    assert moved.isnan().any(), "the step ran with the NaN gradients"
    assert scaler.get_scale() == 1.0


@pytest.mark.exercise("accumulated_step")
def test_a_step_that_grows_the_scale_still_counts_as_a_step(exercise_module):
    """growth_interval=1: the scale doubles after the clean step, which did run."""
    x, y = whole_batch()
    scaler = torch.amp.GradScaler("cpu", growth_interval=1)
    _, moved, _, stepped = run_exercise(exercise_module, list(zip(x.split(4), y.split(4))),
                                        torch.float16, 1e6, scaler)
    assert stepped and moved.abs().sum() > 0 and scaler.get_scale() == 2.0**17


@pytest.mark.exercise("accumulated_step")
def test_stale_gradients_do_not_count(exercise_module):
    x, y = whole_batch()
    ref_moved, _ = reference_step(x, y, torch.float16, 1e6, True)
    model = make_net()
    for p in model.parameters():
        p.grad = torch.full_like(p, 100.0)  # left over from some earlier step
    _, moved, _, stepped = run_exercise(exercise_module, list(zip(x.split(4), y.split(4))),
                                        torch.float16, 1e6, torch.amp.GradScaler("cpu"), model=model)
    assert stepped
    assert ((moved - ref_moved).norm() / ref_moved.norm()).item() < 0.02, "zero the gradients first"


# ----------------------------------------------------------------------------------------
# GPU: matmul throughput per dtype, TF32's error, and what CUDA autocast does to softmax and layer_norm


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
    logits' own dtype, which CUDA's rule for log_softmax keeps (lesson 05b, section 1).
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

"""Tests of lesson 14: documented outputs; the data file against its generator; the model
(tied, causal); each stage's claims read from the narrative's namespace (accuracy above
the threshold, compiled and 2-rank losses within their tolerances, bf16's dtypes, the drill's
kill, restart and bitwise result, the FLOP count and MFU, the KV cache's tokens and FLOPs);
the figure's data; `train.py` (generated from the lesson's `#@worker train.py` cells: its
teardown, its --help, its refusal of a batch the ranks cannot split, bf16 on the CPU on 1
rank, its GPU paths); the exercises (the schedule's values, the shuffler's state in-process
and through the drill, and that reviewers' wrong answers fail them); the same trainer larger
on one GPU (bf16, compiled, flash attention), recorded for the GPU report.

The narrative launches ranks, so the tests here are `multirank` (that no rank outlives the
lesson, the killed attempt's included, is the `lesson` fixture's check). `train.py` does not
use the kit's `serve`: it is a plain torchrun script; launched by the kit (COURSE_LAUNCHER_PID
set) it starts the kit's launcher watch, so a SIGKILLed lesson leaves no rank (checked by
hand for this commit: parent SIGKILL and SIGINT mid-run, nothing left). The GPU tests
(`cuda`: 1 GPU, NCCL, a world of 1; `multigpu`: 2 GPUs) skip without CUDA and are
unverified until a GPU report has run them."""

import math
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from scripts import make_reversal
from scripts.multirank import kill_when, launch, running
from scripts.pytest_course import import_file

pytestmark = pytest.mark.multirank
HERE = Path(__file__).parent
TRAIN_PY = HERE / "train.py"  # generated from the lesson's #@worker train.py cells


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


def test_data_file_is_what_the_generator_makes():
    assert make_reversal.CSV.read_text() == make_reversal.render(make_reversal.make_rows())


def test_data_and_split(lesson):
    ns = lesson.ns
    gpt = ns["gpt"]
    train, held = ns["TRAIN"], ns["HELD"]
    assert train.shape == (2000, 13) and held.shape == (500, 13)
    for rows in (train, held):  # every row is digits > reversed digits
        text = [gpt.decode(r) for r in rows]
        assert all(t[6] == ">" and t[7:] == t[:6][::-1] and t[:6].isdigit() for t in text)
    assert not ns["texts"]["train"] & ns["texts"]["heldout"]
    x, y = ns["x0"], ns["y0"]
    assert (y[0, :6] == gpt.IGNORE).all() and torch.equal(y[0, 6:], train[0, 7:])
    assert torch.equal(x[0], train[0, :12])


def test_model_is_tied_and_causal(lesson):
    ns = lesson.ns
    model = ns["gpt"].build(seed=0)
    assert sum(p.numel() for p in model.parameters()) == 26_208
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes.count((11, 32)) == 1  # the embedding only: no separate output matrix
    tokens = ns["HELD"][:4, :12]
    with torch.no_grad():
        out = model(tokens)
        model.tok.weight[3] += 1.0  # the output layer is the embedding: logit 3 moves too
        assert not torch.equal(model(tokens)[..., 3], out[..., 3])
    assert ns["same"] is True
    assert abs(ns["gpt"].loss_fn(ns["gpt"].build(seed=0), ns["HELD"]).item() - math.log(11)) < 0.05


def test_stage1_learns_the_held_out_set(lesson):
    ns = lesson.ns
    eager, threshold = ns["eager"], ns["THRESHOLD"]
    assert len(eager["loss"]) == ns["STEPS"] == 150
    assert eager["loss"][-1] < 0.1 * eager["loss"][0]
    final_loss, final_acc = eager["eval"][ns["STEPS"]]
    assert final_acc >= threshold and ns["accuracy"] >= threshold  # a bound, on every CPU
    assert final_loss < 0.1
    assert ns["right"].float().mean().item() == final_acc  # greedy == one pass
    assert torch.equal(ns["right"], ns["one_pass"])
    accs = [eager["eval"][s][1] for s in sorted(eager["eval"])]
    assert accs[0] < 0.5 and max(accs[-5:]) >= threshold  # it rose during the run
    # the figure's remark: the held-out loss follows the training loss (no memorising)
    for step, (held_loss, _) in eager["eval"].items():
        train_loss = eager["loss"][step - 1]
        assert abs(held_loss - train_loss) < 0.15 * train_loss + 0.01, (step, held_loss, train_loss)


def test_stage2_compile_within_tolerance(lesson):
    ns = lesson.ns
    comp = ns["comp"]
    assert len(comp["loss"]) == ns["SHORT"] == 40
    assert 0 < ns["gap_compiled"] < 1e-4  # rounding, not equality
    assert comp["seconds"][0] > 5 * statistics.median(comp["seconds"][5:])  # the compile
    assert ns["breaks"] == 0
    assert 0.1 < ns["compiled_ms"] / ns["eager_ms"] < 10  # a ratio, printed as a placeholder
    # what the compiled step runs: ATen's matmuls and attention, no ATen layer_norm or gelu,
    # which the eager step of stage 5 does call
    assert ns["still"] == ["aten::_scaled_dot_product_flash_attention_for_cpu",
                           "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                           "aten::addmm", "aten::mm"]
    assert ns["fused"] == 0
    eager_keys = {e.key for e in ns["prof"].key_averages()}
    assert {"aten::layer_norm", "aten::gelu", "aten::gelu_backward"} <= eager_keys


def test_stage3_bf16_dtypes_and_gap(lesson):
    ns = lesson.ns
    dtypes = ns["dtypes_in_one_step"](ns["gpt"].build(seed=0))
    bf16, fp32 = torch.bfloat16, torch.float32
    assert dtypes == {"tok": fp32, "blocks.0.norm1": fp32, "blocks.0.qkv": bf16,
                      "blocks.0 (residual stream)": fp32, "model (logits)": bf16, "loss": fp32,
                      "qkv weight": fp32, "qkv weight's gradient": fp32, "AdamW exp_avg": fp32}
    assert 1e-4 < ns["gap_bf16"] < 0.05  # bf16 rounding: not equal, not far
    assert len(ns["low"]["loss"]) == ns["BF16_STEPS"]


def test_stage4_drill(lesson):
    ns = lesson.ns
    drill, section = ns["drill"], ns["section"]
    assert drill.ok and drill.attempts == [0, 1], drill.describe()
    gen = torch.Generator().manual_seed(ns["KILL_SEED"])  # the kill comes from the seed
    stop_at = int(torch.randint(ns["EVERY"] + 1, ns["SHORT"], (1,), generator=gen))
    assert (stop_at, int(torch.randint(0, 2, (1,), generator=gen))) == (ns["stop_at"], ns["victim"])
    pids = {}
    for (attempt, rank), (text, _) in drill.logs.items():
        m = re.search(rf"rank {rank}: TORCHELASTIC_RESTART_COUNT=(\d) pid (\d+)", text)
        assert int(m[1]) == attempt
        pids[attempt, rank] = int(m[2])
    assert ns["killed"] == [pids[0, ns["victim"]]]  # the parent killed the chosen rank
    assert {pids[0, 0], pids[0, 1]}.isdisjoint({pids[1, 0], pids[1, 1]})  # new processes
    first, second, ref = ns["first"], ns["second"], ns["ref"]
    assert sorted(first) == list(range(1, stop_at + 1))
    resumed = stop_at // ns["EVERY"] * ns["EVERY"]
    assert sorted(second) == list(range(resumed + 1, ns["SHORT"] + 1))
    assert all(first[s] == ref[s] for s in first) and all(second[s] == ref[s] for s in second)
    tail = section(drill, "reference", 1)[0][-2:]
    assert tail == ["rank 0: losses of this attempt's steps equal the uninterrupted run's: True",
                    "rank 0: final parameters bitwise equal to the uninterrupted run: True"]
    assert 0 <= ns["gap_ranks"] < 1e-4 and sorted(ref) == list(range(1, ns["SHORT"] + 1))
    for rank in (0, 1):
        assert "Traceback" not in drill.err[rank], drill.describe()
    assert not ns["TMP"].exists()  # the checkpoints are removed at the end


def test_stage5_flops_and_mfu(lesson):
    ns = lesson.ns
    assert ns["step_flops"] == 6 * 24_928 * 768 == 114_868_224
    assert ns["attention"] == 12 * 2 * 12**2 * 32 * 64
    assert set(ns["by_op"]) == {"aten.addmm", "aten.mm"}
    assert ns["ran"] == ["aten::_scaled_dot_product_flash_attention_for_cpu",
                         "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                         "aten::scaled_dot_product_attention"]
    assert sorted(ns["regions"]) == ["backward", "forward", "optimizer"]
    assert ns["trace"].is_file()
    mfu = ns["model_flops"] / ns["step_s"] / ns["peak"]
    assert 0 < mfu < 1


def test_samples_are_seeded_and_right(lesson):
    ns = lesson.ns
    gpt = ns["gpt"]
    again = gpt.generate(ns["model"], ns["HELD"][:5, :7], gen=torch.Generator().manual_seed(0))
    assert torch.equal(again, ns["samples"])  # the same generator seed, the same samples
    assert torch.equal(ns["samples"][:, :7], ns["HELD"][:5, :7])
    assert (ns["samples"] == ns["HELD"][:5]).all(dim=1).sum() >= 4
    # the chance of 30 right characters is the product of their teacher-forced probabilities
    assert ns["all_right"] == pytest.approx(ns["right_p"][:5].prod().item())
    assert 0.5 < ns["all_right"] < 0.9  # printed as «number» with this bound (0.754 here)


def test_figure_plots_the_stages(lesson):
    ns = lesson.ns
    fig = ns["plot_stages"](ns["eager"], ns["comp"], ns["low"], ns["ref"])
    ax, acc_ax = fig.get_axes()
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["1: eager fp32 (train)"].get_ydata()) == ns["eager"]["loss"]
    assert list(lines["2: compiled"].get_ydata()) == ns["comp"]["loss"]
    assert list(lines["3: bf16 autocast"].get_ydata()) == ns["low"]["loss"]
    ranks = lines["4: 2 ranks, FSDP2"]
    assert list(ranks.get_xdata()) == list(range(1, 41))
    assert list(ranks.get_ydata()) == [ns["ref"][s] for s in range(1, 41)]
    held = sorted(ns["eager"]["eval"])
    assert list(lines["1: eager fp32 (held-out)"].get_xdata()) == held
    (acc, threshold) = acc_ax.get_lines()
    assert list(acc.get_ydata()) == [100 * ns["eager"]["eval"][s][1] for s in held]
    assert list(threshold.get_ydata()) == [95.0, 95.0]
    assert ax.get_yscale() == "log" and (HERE / "capstone_stages.png").is_file()


def test_kv_cache_same_tokens_fewer_flops(lesson):
    ns = lesson.ns
    gpt, decoded, flops = ns["gpt"], ns["decoded"], ns["kv_flops"]
    assert torch.equal(decoded[True], decoded[False])  # greedy: the same tokens
    assert torch.equal(ns["resampled"], ns["samples"])  # sampled without the cache = with it
    weights, prompts = ns["WEIGHTS"], len(ns["HELD"])
    positions = sum(range(gpt.DIGITS + 1, gpt.LENGTH))  # 7 + 8 + ... + 12 = 57 without
    assert positions == 57
    assert flops[False] == 2 * weights * prompts * 57  # forward matmuls only
    assert flops[True] == 2 * weights * prompts * 12  # the prompt's 7, then 5 single positions
    # the cache itself: one dict per block holding (B, H, T, D/H) keys and values
    kv = ns["model"].new_cache()
    with torch.no_grad():
        ns["model"](ns["HELD"][:3, :7], kv)
        ns["model"](ns["HELD"][:3, 7:8], kv)
    assert len(kv) == gpt.LAYERS and kv[0]["k"].shape == (3, gpt.HEADS, 8, gpt.WIDTH // gpt.HEADS)
    # a filled cache takes one position at a time: several would get is_causal's top-left mask
    with torch.no_grad(), pytest.raises(ValueError, match="one position at a time"):
        ns["model"](ns["HELD"][:3, 8:10], kv)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 8, generator=gen) for n in (2, 10, 10))  # 2 new queries, 10 keys
    bottom_right = torch.ones(2, 10, dtype=torch.bool).tril(diagonal=8)  # query i sees keys 0..8+i
    right = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right)
    top_left = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(right, top_left)  # what the ValueError prevents


def test_train_py_is_a_plain_torchrun_script(lesson):
    """train.py ends its group on every path (destroy in a finally, a barrier only after
    success), imports the kit only when the kit launched it, and documents the GPU and
    multi-node launches in its --help (the lesson ran its cells: `arguments` is theirs)."""
    text = TRAIN_PY.read_text()
    main = text[text.index("def main():"):]
    assert main.index("dist.barrier()") < main.index("finally:") < main.index("dist.destroy_process_group()")
    assert text.count("from multirank import") == 1
    guard = text.index('if os.environ.get("COURSE_LAUNCHER_PID")')
    assert guard < text.index("from multirank import watch_launcher")
    assert '"nccl"' in text and 'os.environ["LOCAL_RANK"]' in text
    usage = lesson.ns["arguments"]().format_help()
    for needle in ("--rdzv-backend=c10d", "--rdzv-endpoint=HOST:29500", "srun", "--nproc-per-node=N",
                   "(unverified on a GPU, on several machines and under SLURM)"):
        assert needle in usage, needle
    # every command restarts (--max-restarts), so every torchrun starts with the variable
    assert usage.count("torchrun --") == usage.count("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --") == 4
    assert usage.count("--max-restarts=") == 4
    assert "'TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun" in usage  # SLURM: inside bash -c
    # section 6: the timeout is a minute, gloo's default 30 minutes
    from torch.distributed.constants import default_pg_timeout
    assert lesson.ns["arguments"]().parse_args(["unused"]).timeout_s == 60.0
    assert default_pg_timeout.total_seconds() == 30 * 60


def test_train_py_refuses_a_batch_the_ranks_cannot_split(lesson, monkeypatch):
    """main refuses --batch 63 on 2 ranks before it joins a group (in-process: nothing
    launched), instead of dropping the rows that batch // world leaves over."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(sys, "argv", ["train.py", "unused", "--batch", "63"])
    with pytest.raises(SystemExit, match="--batch 63 is not a multiple of the 2 ranks"):
        lesson.ns["main"]()


def test_train_py_bf16_on_cpu():
    """--precision bf16 (what `auto` picks on a GPU) trains on the CPU too: the blocks' policy
    has no output_dtype, so no float32 block output meets the root's bf16 norm (with
    output_dtype on every unit it raised "mixed dtype (CPU)"). One rank, 3 steps, a save."""
    with tempfile.TemporaryDirectory() as tmp:
        run = launch(TRAIN_PY, [tmp, "--device", "cpu", "--precision", "bf16", "--steps", "3", "--every", "2"],
                     nproc=1, timeout=120)
        assert run.ok, run.describe()
        out = run.out[0].splitlines()
        losses = [float(line.split(" loss ")[1]) for line in out if " loss " in line]
        assert len(losses) == 3 and all(math.isfinite(v) for v in losses), run.describe()
        assert "rank 0: saved step_2" in out and (Path(tmp) / "step_2" / ".metadata").is_file()
    assert running(TRAIN_PY) == []


def gpu_drill(tmp, nproc, record_property):
    """The lesson's drill on GPUs: NCCL, bf16, rank 0 killed after step 15, one restart."""
    with kill_when(Path(tmp) / "paused.rank0") as killed:
        run = launch(TRAIN_PY, [tmp, "--device", "cuda", "--steps", "20", "--every", "10", "--stop-at", "15",
                                "--compare"], nproc=nproc, restarts=1, timeout=300)
    assert run.ok and run.attempts == [0, 1] and len(killed) == 1, run.describe()
    out = run.out[0].splitlines()
    assert "rank 0: resumed from step_10: next step 11" in out, run.describe()
    bitwise = out[-1] == "rank 0: final parameters bitwise equal to the uninterrupted run: True"
    record_property(f"capstone train.py, {nproc} GPU(s), NCCL, bf16: resumed run bitwise equal", bitwise)
    losses = [float(line.split(" loss ")[1]) for line in out if " loss " in line]
    assert losses and all(math.isfinite(v) for v in losses)


@pytest.mark.cuda
def test_train_py_on_one_gpu(record_property):
    with tempfile.TemporaryDirectory() as tmp:
        gpu_drill(tmp, 1, record_property)


@pytest.mark.multigpu
def test_train_py_on_two_gpus(record_property):
    with tempfile.TemporaryDirectory() as tmp:
        gpu_drill(tmp, 2, record_property)


# ----------------------------------------------------------------------------------------
# Exercises


@pytest.mark.exercise("lr_at")
def test_lr_at(exercise_module):
    f = exercise_module.lr_at
    assert f(1, 100, 1e-3, 10) == pytest.approx(1e-4)  # warm-up starts at peak / warmup
    assert f(1, 100, 1e-3, 10, floor=1e-5) == pytest.approx(1e-4)  # ... from 0, whatever the floor
    assert f(5, 100, 1e-3, 10) == pytest.approx(5e-4)
    assert f(10, 100, 1e-3, 10) == pytest.approx(1e-3)  # the peak at the warm-up's last step
    assert f(11, 100, 1e-3, 10) == pytest.approx(1e-3 * (1 + math.cos(math.pi / 90)) / 2)
    assert f(55, 100, 1e-3, 10, floor=1e-5) == pytest.approx((1e-3 + 1e-5) / 2)  # halfway
    assert f(100, 100, 1e-3, 10, floor=1e-5) == pytest.approx(1e-5)  # the floor at the end
    assert f(1, 10, 1.0, 0) == pytest.approx((1 + math.cos(math.pi / 10)) / 2)  # no warm-up
    warm = [f(s, 50, 2.0, 8) for s in range(1, 9)]
    decay = [f(s, 50, 2.0, 8, floor=0.1) for s in range(8, 51)]
    assert all(a < b for a, b in zip(warm, warm[1:]))
    assert all(a > b for a, b in zip(decay, decay[1:])) and min(decay) == pytest.approx(0.1)
    # the lesson's recipe: LambdaLR's function gives a factor of the lr and counts from 0
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: f(i + 1, 50, 2.0, 8) / 2.0)
    for step in range(1, 51):
        assert opt.param_groups[0]["lr"] == pytest.approx(f(step, 50, 2.0, 8))
        opt.step()
        sched.step()


def _lr_from_floor(step, total, peak, warmup, floor=0.0):  # wrong: the warm-up starts at the floor
    if step <= warmup:
        return floor + (peak - floor) * step / warmup
    return _right_lr(step, total, peak, warmup, floor)


def _lr_progress_from_0(step, total, peak, warmup, floor=0.0):  # wrong: no warm-up in the decay
    if step <= warmup:
        return peak * step / warmup
    return floor + (peak - floor) * (1 + math.cos(math.pi * step / total)) / 2


def _right_lr(step, total, peak, warmup, floor=0.0):
    if step <= warmup:
        return peak * step / warmup
    return floor + (peak - floor) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2


def _wrong_shufflers():
    """The solution's Shuffler, each with one mistake in its state (a reviewer's variants)."""
    right = import_file(HERE / "solutions.py").Shuffler

    class NoPos(right):  # the position in the epoch is lost
        def state_dict(self):
            return {**super().state_dict(), "pos": 0}

    class NoGenerator(right):  # later epochs come from the new object's own seed
        def load_state_dict(self, sd):
            self.order, self.pos = sd["order"].clone(), int(sd["pos"])

    class RedrawnOrder(right):  # this epoch's order drawn again instead of restored
        def load_state_dict(self, sd):
            self.gen.set_state(sd["gen"])
            self.order, self.pos = torch.randperm(self.n, generator=self.gen), int(sd["pos"])

    return {"no-pos": NoPos, "no-generator": NoGenerator, "redrawn-order": RedrawnOrder}


@pytest.mark.parametrize("wrong", [_lr_from_floor, _lr_progress_from_0], ids=["warm-up-from-floor", "progress-from-0"])
def test_exercise_a_cases_catch_wrong_answers(wrong):
    """test_lr_at rejects the wrong schedules a reviewer wrote, and accepts a right one."""
    with pytest.raises(AssertionError):
        test_lr_at(SimpleNamespace(lr_at=wrong))
    test_lr_at(SimpleNamespace(lr_at=_right_lr))


@pytest.mark.parametrize("name", ["no-pos", "no-generator", "redrawn-order"])
def test_exercise_b_cases_catch_wrong_answers(name):
    with pytest.raises(AssertionError):
        test_shuffler_state_in_process(SimpleNamespace(Shuffler=_wrong_shufflers()[name]))


def draws(shuffler, k):
    return [shuffler.next().clone() for _ in range(k)]


@pytest.mark.exercise("Shuffler")
def test_shuffler_state_in_process(exercise_module):
    cls = exercise_module.Shuffler
    s = cls(100, 16, seed=3)  # 6 batches per epoch
    first = draws(s, 9)  # into the second epoch
    assert all(len(b) == 16 for b in first) and len(set(torch.cat(first[:6]).tolist())) == 96
    sd = s.state_dict()
    later = draws(s, 14)  # past two more epoch boundaries, after the snapshot
    fresh = cls(100, 16, seed=99)  # another seed: nothing may come from its own __init__
    fresh.load_state_dict(sd)
    got = draws(fresh, 14)
    assert all(torch.equal(a, b) for a, b in zip(got, later))


@pytest.mark.exercise("Shuffler")
def test_shuffler_state_through_the_drill(exercise_module):
    exercise_module.Shuffler(10, 2).state_dict()  # a stub says "not attempted" here
    with tempfile.TemporaryDirectory() as tmp, kill_when(Path(tmp) / "paused.rank1") as killed:
        # 2000 rows / 64 = 31 batches an epoch: the kill after step 34 resumes from step_33,
        # in the second epoch
        run = launch(TRAIN_PY, [tmp, "--device", "cpu", "--steps", "36", "--every", "11", "--stop-at", "34",
                                "--compare", "--shuffler", exercise_module.__file__], restarts=1, timeout=180)
    assert run.ok and run.attempts == [0, 1] and len(killed) == 1, run.describe()
    out = run.out[0].splitlines()
    assert "rank 0: resumed from step_33: next step 34" in out, run.describe()
    assert out[-1] == "rank 0: final parameters bitwise equal to the uninterrupted run: True", run.describe()
    assert running(TRAIN_PY) == []


# ----------------------------------------------------------------------------------------
# GPU: the same trainer, larger, on one CUDA device (unverified here: no GPU on the course's
# build machines)

GPU_PEAK_BF16 = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}  # datasheets: dense bf16


def gpu_peak(name):
    """The datasheet's dense bf16 peak for a known device, else the rate of a large bf16
    matmul measured here (an achievable ceiling, so the MFU is then an upper estimate)."""
    for key, value in GPU_PEAK_BF16.items():
        if key in name:
            return value, "datasheet"
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    a @ a
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - start), "measured matmul"


@pytest.mark.cuda
def test_gpu_larger_trainer(record_property):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    gpt = import_file(HERE / "gpt.py")  # the lesson's model and data, without running the lesson
    size = {"width": 512, "heads": 8, "layers": 8}  # head dimension 64: flash attention's kind
    batch, steps = 2048, 60
    data = gpt.load()
    train, held = data["train"].cuda(), data["heldout"].cuda()
    model = gpt.build(seed=0, **size).cuda()
    opt = gpt.optimizer(model, lr=1e-3)
    x, _ = gpt.split(train[:batch])
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", dtype=torch.bfloat16):
        with FlopCounterMode(display=False) as counter:  # eager: the same math, counted
            gpt.loss_fn(model, train[:batch]).backward()
        opt.zero_grad(set_to_none=True)
        compiled = torch.compile(model)
        times = []
        for step in range(1, steps + 1):
            seq = train[gpt.batch_rows(step, len(train), size=batch).cuda()]  # (batch, 13)
            torch.cuda.synchronize()
            start = time.perf_counter()
            gpt.train_step(compiled, opt, seq)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times[10:])  # after the compile and warm-up
    tokens_per_s = batch * x.shape[1] / step_s
    peak, source = gpu_peak(torch.cuda.get_device_name())
    mfu = counter.get_total_flops() / step_s / peak
    acc = gpt.exact_match(model, held)
    with torch.no_grad():
        first, last = gpt.loss_fn(gpt.build(seed=0, **size).cuda(), held).item(), gpt.loss_fn(model, held).item()
    what = "capstone GPT 512x8, bf16, compiled, 2048 x 12 tokens:"  # names the run in the report
    record_property(f"{what} training throughput [tokens/s]", round(tokens_per_s))
    record_property(f"{what} median step [ms]", round(step_s * 1e3, 3))
    record_property(f"{what} MFU (counted FLOPs / step / peak) [%]", round(100 * mfu, 2))
    record_property(f"{what} peak used [TFLOP/s]", round(peak / 1e12, 1))
    record_property(f"{what} peak source", source)
    record_property(f"{what} held-out exact match after {steps} steps [%]", round(100 * acc, 1))
    print(f"cuda: {tokens_per_s:,.0f} tokens/s, step {step_s * 1e3:.2f} ms, MFU {mfu:.2%} of {peak / 1e12:.0f} "
          f"TFLOP/s ({source}), held-out exact match {acc:.1%}")
    assert 0 < mfu < 1
    assert last < 0.8 * first  # it trained (the accuracy is recorded, not asserted: unverified)

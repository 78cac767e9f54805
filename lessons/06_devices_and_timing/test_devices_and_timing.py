"""Tests of lesson 06: documented outputs, the lesson's key values (counts, FLOPs, the
structure of its timings, the profiler's table and trace, the figure), the exercises, and
the GPU measurements that the CPU cannot make (unsynchronised vs synchronised timing,
queued vs waited calls, CUDA events, hidden synchronisations)."""

import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_devices_and_the_helper(lesson):
    ns = lesson.ns
    pick, x = ns["pick_device"], ns["x"]
    assert x.to("cpu") is x and x.cpu() is x
    assert ns["xc"] is not x and torch.equal(ns["xc"], x) and ns["xc"].data_ptr() != x.data_ptr()
    assert [pick(*case).type for case in ns["cases"]] == ["cuda", "mps", "cpu", "cpu"]
    assert pick("cuda:1", False, False) == torch.device("cuda", 1)  # the override is not checked
    has_mps = torch.backends.mps.is_available()
    expected = "cuda" if torch.cuda.is_available() else "mps" if has_mps else "cpu"
    assert pick().type == expected  # no arguments: probe this machine
    assert ns["DEVICE"] == (pick() if ns["choice"] == "auto" else torch.device(ns["choice"]))
    with pytest.raises(RuntimeError, match="not on the expected device"):
        x + ns["m"]
    assert (ns["m"] + torch.tensor(2.0)).device.type == "meta"  # a 0-d CPU tensor is let in
    with pytest.raises(RuntimeError, match="not on the expected device"):
        ns["m"] + torch.tensor([2.0])  # one element, but 1-d: refused


def test_pinning_needs_an_accelerator(lesson):
    assert not torch.randn(4).is_pinned()
    if not torch.accelerator.is_available():  # the lesson's claim: pin_memory() raises here
        with pytest.raises(RuntimeError):
            torch.randn(4).pin_memory()


def test_simulated_gpu_timer_lies(lesson):
    ns = lesson.ns
    work_ms, med = ns["gpu"].work * 1e3, ns["med"]
    assert {k: len(v) for k, v in ns["runs"].items()} == {"no sync": 7, "sync": 7, "4 calls, sync": 7}
    assert med["no sync"] < 0.1 * work_ms  # the launch, not the work
    assert work_ms <= med["sync"] < 10 * work_ms  # the work (sleep never wakes early)
    assert 4 * work_ms <= med["4 calls, sync"]  # the device works through the queue in order


def test_simulated_gpu_queue_model(lesson):
    """The lesson's queue books work back to back from when the device is free."""
    launched = []
    for _ in range(5):  # the fastest of 5: a busy machine can preempt any single try
        gpu = lesson.ns["SimulatedGPU"](work=0.004)
        t0 = time.perf_counter()
        for _ in range(3):
            gpu.launch()
        launched.append(time.perf_counter() - t0)
        assert gpu.free_at >= t0 + 3 * 0.004  # three kernels queued, none overlapping
        gpu.synchronize()
        assert time.perf_counter() >= gpu.free_at and time.perf_counter() - t0 >= 0.012
    assert min(launched) < 0.006  # launching did not wait for the work (12 ms of it)


def test_time_runs_needs_the_right_sync(lesson):
    ns = lesson.ns
    times, meas, work_ms = ns["times"], ns["meas"], ns["gpu"].work * 1e3
    assert len(times) == 21 and min(times) > 0
    assert meas.task_spec.num_threads == 1
    # the Timer and the loop ran at different moments on a shared machine: a factor of 2
    assert 0.5 * min(times) < meas.median < 2 * max(times)
    # the simulated device: its own synchronize times the work, the CPU's times the launch
    assert ns["sim"]["own"] >= work_ms and ns["sim"]["cpu"] < 0.1 * work_ms
    # warm-up calls are not timed; the clock is bracketed by two syncs per repeat
    calls, syncs = [], []
    out = ns["time_runs"](lambda: calls.append(1), lambda: syncs.append(1), warmup=4, repeats=6)
    assert len(out) == 6 and len(calls) == 10 and len(syncs) == 12
    # a function that sleeps 3 ms: every timed repeat holds the whole call
    assert min(ns["time_runs"](lambda: time.sleep(0.003), warmup=0, repeats=3)) >= 0.003
    # Timer's blocks: far more calls of a 64² matmul than of a 512² one
    assert ns["meas64"].number_per_run > ns["meas"].number_per_run


def test_one_stall_moves_the_max_not_the_median(lesson):
    stalled = lesson.ns["stalled"]
    assert len(stalled) == 21 and max(stalled) >= 0.05  # the stall landed in a timed call
    assert statistics.median(stalled) < 0.5 * max(stalled)
    assert statistics.mean(stalled) >= 0.05 / 21  # the mean carries it
    # the stall is in exactly one call: the 11th timed one (warm-up calls are 0-2)
    calls = []
    held = lesson.ns["held_up"](lambda: calls.append(time.perf_counter()), at=4, seconds=0.02)
    times = lesson.ns["time_runs"](held, sync=lambda: None, warmup=1, repeats=6)
    assert [k for k, t in enumerate(times) if t >= 0.02] == [3]


def test_time_runs_sees_the_work_grow(lesson):
    """8x the FLOPs must take clearly longer: a timer that measured nothing would not see it."""
    time_runs = lesson.ns["time_runs"]
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    s, t = torch.randn(256, 256), torch.randn(256, 256)
    big = min(time_runs(lambda: a @ b, repeats=7))
    small = min(time_runs(lambda: s @ t, repeats=7))
    assert big > 2 * small


def local_scalar_reads(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.name == "aten::_local_scalar_dense" for e in prof.events())


def test_hidden_syncs(lesson):
    ns = lesson.ns
    assert ns["reads"] == {"log .item()": 5, "format": 5, "branch": 5, ".cpu()": 0}
    assert ns["ops_in"]["branch"] == ["aten::is_nonzero", "aten::lt"]
    under_is_nonzero = {e.name for e in ns["sync_prof"].events()
                        if e.cpu_parent is not None and e.cpu_parent.name == "aten::is_nonzero"}
    assert under_is_nonzero == {"aten::item"}  # bool() -> is_nonzero -> item
    assert len(ns["log"]) == 5 and ns["text"] == f"loss {ns['log'][-1]:.4f}"
    assert all(k.device.type == "cpu" for k in ns["keep"])

    losses = [torch.tensor(float(i)) for i in range(5)]

    def fixed():  # accumulate on the device, read once
        total = torch.zeros(())
        for loss in losses:
            total += loss.detach()
        return total.item()

    assert local_scalar_reads(fixed) == 1
    assert local_scalar_reads(lambda: [f"{t:.2f}" for t in losses]) == 5
    assert local_scalar_reads(lambda: [float(t) for t in losses]) == 5
    # .tolist() on the CPU does not go through _local_scalar_dense
    assert local_scalar_reads(lambda: torch.randn(8).tolist()) == 0
    assert "aten::_local_scalar_dense" not in {e.name for e in ns["tolist_prof"].events()}
    assert len(ns["values"]) == 64 and isinstance(ns["values"][0][0], float)


def test_profiler_table(lesson):
    ns = lesson.ns
    avg = {e.key: e for e in ns["prof"].key_averages()}
    steps, layers = 3, 2
    assert avg["aten::addmm"].count == steps * layers  # one per layer, forward
    assert avg["aten::mm"].count == steps * (2 * layers - 1)  # no gradient for the input batch
    assert avg["forward"].count == avg["backward"].count == avg["optimizer"].count == steps
    counts = [e.count for e in ns["table"]]
    assert counts == sorted(counts, reverse=True)
    assert ns["matmul"] / ns["total"] > 0.5  # the time is in the matmuls


def test_profiler_schedule(lesson):
    ns = lesson.ns
    assert ns["recorded"] == ["step 2", "step 3"] and ns["ready"] == [4]
    # another cycle: wait 0, warmup 1, active 1, repeat 2 over 6 steps
    from torch.profiler import record_function, schedule
    ready = []
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=1, repeat=2),
                 on_trace_ready=lambda p: ready.append(p.step_num), acc_events=True) as p:
        for k in range(6):
            with record_function(f"step {k}"):
                torch.ones(2).sum()
            p.step()
    assert ready == [2, 4]


def test_profiler_memory(lesson):
    ns = lesson.ns
    B, H, C, mem = ns["B"], ns["H"], ns["C"], ns["mem"]
    assert mem["aten::addmm"] == 4 * (B * H + B * C)  # the two layers' float32 outputs
    assert mem["aten::clamp_min"] == 4 * B * H  # the ReLU's output
    assert -mem["[memory]"] == mem["aten::addmm"] + mem["aten::clamp_min"]  # all freed


def test_profiler_stack(lesson, tmp_path):
    ns = lesson.ns
    frames = ns["frames"]
    assert frames[:3] == ["aten::addmm", "aten::linear", "<built-in function linear>"]
    assert frames[-1] == "forward"  # the record_function region inside mlp_step
    assert "nn.Module: Linear_0" in frames and "nn.Module: Sequential_0" in frames
    assert frames.index("nn.Module: Linear_0") < frames.index("nn.Module: Sequential_0")
    # the Chrome trace holds the Python frames as events of their own
    path = tmp_path / "stack_trace.json"
    ns["stack_prof"].export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    python = [e["name"] for e in events if e.get("cat") == "python_function"]
    assert any(n.endswith("mlp_step") for n in python) and any(n.endswith("_call_impl") for n in python)


def test_chrome_trace(lesson):
    trace = lesson.ns["trace"]
    assert trace.parent == lesson.ns["HERE"] and trace.name.endswith("_trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    names = [e.get("name") for e in events]
    for region in ("forward", "backward", "optimizer"):
        assert names.count(region) == 3
    assert "aten::addmm" in names and "aten::mm" in names
    fwd = next(e for e in events if e.get("name") == "forward")
    assert fwd["ph"] == "X" and fwd["dur"] > 0  # a complete event with a duration


def test_sync_debug_mode_limits(lesson):
    doc = " ".join(torch.cuda.set_sync_debug_mode.__doc__.split())
    assert "not all synchronizing operations will trigger warning or error" in doc
    assert lesson.ns["limit"].startswith("not all synchronizing operations")


def test_flops(lesson):
    ns = lesson.ns
    B, D, H, W = ns["B"], ns["D"], ns["H"], ns["W"]
    with FlopCounterMode(display=False) as fc:
        ns["mlp_step"]()
    total = fc.get_total_flops()
    assert total == 6 * W * B - 2 * B * D * H == ns["step_flops"]
    assert 4 * W * B < total <= 6 * W * B  # "6 x params x tokens" is an upper estimate here
    assert ns["counts"] == {"aten.addmm": 2 * B * W, "aten.mm": 4 * B * W - 2 * B * D * H}


def test_embedding_and_attention_flops(lesson):
    ns = lesson.ns
    emb = ns["emb"]
    with FlopCounterMode(display=False) as fc:
        emb(ns["tokens"]).sum().backward()
    assert fc.get_total_flops() == 0 and emb.weight.grad.abs().sum() > 0  # a gather, trained
    S, d = 64, 16  # another shape: the 12 * S * S * d rule, not one number
    q, k, v = (torch.randn(2, S, d, requires_grad=True) for _ in range(3))
    with FlopCounterMode(display=False) as fc:
        (((q @ k.transpose(1, 2)) / d**0.5).softmax(-1) @ v).sum().backward()
    assert fc.get_total_flops() == 2 * 12 * S * S * d
    # the share attention adds to 6N, from the formulas
    per_token = ns["train_flops_per_token"]
    L, dm, V = ns["L_GPT"], ns["D_GPT"], ns["V_GPT"]
    dense, attn = per_token(L, dm, V, 8192)
    assert dense == 6 * (12 * L * dm * dm + dm * V) and attn == 12 * L * dm * 8192
    assert 0.3 < attn / dense < 0.35 and per_token(L, dm, V, 2048)[1] == attn // 4


def test_achieved_rates(lesson):
    ns = lesson.ns
    rates = ns["rates"]
    assert sorted(rates) == ns["sizes"] and all(r > 0 for r in rates.values())
    # one core: at most 2 FMA units x (8 or 16) fp32 lanes x 2 FLOPs per cycle; 6 GHz is
    # generous. A rate above that would mean a timer that stopped before the work ended.
    lanes = {"AVX2": 8, "AVX512": 16}.get(torch.backends.cpu.get_cpu_capability(), 16)
    assert max(rates.values()) < 2 * lanes * 2 * 6e9 / 1e9
    assert rates[1024] > 3 * rates[16]  # the fixed cost of a call dominates 8,192 FLOPs


def test_figure(lesson):
    ns = lesson.ns
    rates = {32: 10.0, 64: 20.0, 128: 40.0}
    fig = ns["plot_rates"](rates)
    (ax,) = fig.get_axes()
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [32, 64, 128] and list(line.get_ydata()) == [10.0, 20.0, 40.0]
    assert ax.get_xlabel().startswith("matrix size n") and ax.get_ylabel() == "achieved GFLOP/s"
    assert ax.get_xscale() == "log" and ax.get_ylim()[0] == 0
    (real,) = ns["fig"].get_axes()[0].get_lines()
    assert list(real.get_xdata()) == ns["sizes"]
    assert list(real.get_ydata()) == [ns["rates"][n] for n in ns["sizes"]]
    assert (ns["HERE"] / "gflops_vs_size.png").is_file()


def test_peak_and_mfu_of_the_profiled_step(lesson):
    ns = lesson.ns
    cap, ghz, threads, peak = ns["capability"], ns["ghz"], ns["threads"], ns["peak"]
    assert threads == 1 and 0.5 < ghz < 7
    if cap in ("AVX2", "AVX512"):
        assert ns["FLOPS_PER_CYCLE"][cap][0] == {"AVX2": 8, "AVX512": 16}[cap]
    lanes, per_lane = ns["FLOPS_PER_CYCLE"].get(cap, ns["FLOPS_PER_CYCLE"]["DEFAULT"])
    assert peak == pytest.approx(threads * lanes * per_lane * ghz * 1e9)
    step_rate, products_rate = ns["step_rate"], ns["products_rate"]
    B, D, H = ns["B"], ns["D"], ns["H"]
    assert step_rate == pytest.approx(ns["step_flops"] / ns["step_s"])
    assert products_rate == pytest.approx(2 * 2 * B * D * H / ns["products_s"])
    assert len(ns["step_times"]) == len(ns["big_times"]) == 11
    # timed in pairs: the step does those products and more, so it runs below their rate
    # (a margin for noise), and is not negligible either
    assert 0.2 < ns["pair_ratio"] < 1.1
    assert 0.1 < step_rate / products_rate < 2  # the two medians, taken apart: looser
    assert step_rate / peak > 0.005
    assert 0.97 < 2 * (2 * B * D * H) / ns["step_flops"] < 0.98  # the printed 97%
    # big_products really runs two of the step's products, with the step's shapes
    def matmuls(fn):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            fn()
        return [(e.name, e.input_shapes) for e in prof.events() if e.name in ("aten::addmm", "aten::mm")]

    in_step = matmuls(ns["mlp_step"])
    alone = [(name, shapes[:-1]) for name, shapes in matmuls(ns["big_products"])]  # drop out=
    assert len(alone) == 2 and all(op in in_step for op in alone)
    assert ("aten::addmm", [[H], [B, D], [D, H], [], []]) in alone


def test_mfu(lesson):
    ns = lesson.ns
    mfu = ns["mfu"]
    assert mfu(6e9, 1_000, 6e12) == pytest.approx(1.0)
    assert mfu(2.0, 3.0, 12.0) == pytest.approx(0.5)
    params, dense, attn = ns["params"], ns["dense"], ns["attn"]
    L, d, V, S = ns["L1"], ns["D1"], ns["V1"], ns["S1"]
    assert params == L * 12 * d**2 + 2 * d * V  # two vocabulary matrices
    assert dense == 6 * (L * 12 * d**2 + d * V) and attn == 12 * L * d * S  # no embedding in N
    assert ns["H200_BYTES"] == 141 * 2**30  # the lesson's reading of the datasheet's "141 GB": GiB
    assert 16 * params < 0.2 * ns["H200_BYTES"] and 0.8 < 16 * 8e9 / ns["H200_BYTES"] < 0.9  # 8B: 85%, no room
    rate = (dense + attn) * ns["TOKENS_PER_S"]  # FLOP/s the model does
    assert mfu(dense + attn, ns["TOKENS_PER_S"], ns["H200_BF16"]) == pytest.approx(rate / ns["H200_BF16"])
    assert 0.3 < rate / ns["H200_BF16"] < 0.45  # the prose's "38%", from the formula


def test_roofline_regimes(lesson):
    ns = lesson.ns
    points, ridge, peak, bw = ns["points"], ns["ridge"], ns["peak"], ns["bandwidth"]
    intensity = {k: f / b for k, (f, b, _) in points.items()}
    assert intensity == pytest.approx({"1024² matmul": 1024 / 6, "elementwise chain": 0.125,
                                       "16² matmul": 16 / 6})
    assert ridge == pytest.approx(peak / bw)
    assert intensity["elementwise chain"] < ridge < intensity["1024² matmul"]
    assert [ns["regime"](*p) for p in points.values()] == ["compute", "memory", "overhead"]
    rate = {k: f / t for k, (f, _, t) in points.items()}
    # memory-bound: the chain runs near the bandwidth slope, far below the peak
    assert 0.2 < rate["elementwise chain"] / (bw * 0.125) < 2
    assert rate["elementwise chain"] < 0.3 * rate["1024² matmul"]
    # overhead-bound: the 16² matmul takes about as long as a 1x1 one
    assert ns["tiny_s"] < 3 * ns["call_s"] and rate["16² matmul"] < 0.5 * min(peak, bw * 16 / 6)
    assert 1e9 < bw < 1e12  # bytes/s: a real measurement, not a unit slip
    cache = ns["largest_cache_mib"]()
    assert isinstance(cache, int) and cache >= 0


def test_roofline_figure(lesson):
    ns = lesson.ns
    points = {"big": (100.0, 1.0, 1.0), "small": (1.0, 10.0, 1e-3)}
    fig = ns["plot_roofline"](50e9, 10e9, points)
    (ax,) = fig.get_axes()
    (roof,) = ax.get_lines()
    xs, ys = roof.get_xdata(), roof.get_ydata()
    assert min(xs) <= 1e-3 and max(xs) >= 1e3
    assert list(ys) == pytest.approx([min(50.0, 10.0 * x) for x in xs])  # GFLOP/s
    dots = ax.collections
    assert [d.get_label() for d in dots] == ["big", "small"]
    assert dots[0].get_offsets().tolist() == [[100.0, 100.0 / 1e9]]
    assert dots[1].get_offsets().tolist() == [[0.1, 1.0 / 1e-3 / 1e9]]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_xlabel() == "arithmetic intensity (FLOP/byte)" and ax.get_ylabel() == "GFLOP/s"
    # the lesson's own figure plots its measurements
    real = ns["fig_roof"].get_axes()[0]
    for dot, (name, (f, b, t)) in zip(real.collections, ns["points"].items()):
        assert dot.get_label() == name
        assert dot.get_offsets().tolist()[0] == pytest.approx([f / b, f / t / 1e9])
    assert (ns["HERE"] / "roofline.png").is_file()


# ----------------------------------------------------------------------------------------
# Exercises


def counted_matmul_flops(shape_a, shape_b):
    with FlopCounterMode(display=False) as fc:
        torch.matmul(torch.empty(shape_a), torch.empty(shape_b))
    return fc.get_total_flops()


MATMUL_CASES = {
    "square": ((16, 16), (16, 16)),
    "rectangular": ((3, 5), (5, 7)),  # 2*m*k*n, not n**3 of one side
    "batched-a-only": ((4, 3, 5), (5, 2)),
    "batched-b-only": ((3, 5), (4, 5, 2)),
    "bmm": ((6, 3, 5), (6, 5, 2)),
    "broadcast-1": ((2, 1, 3, 5), (4, 5, 2)),  # batch (2, 1) with (4,) -> (2, 4)
    "broadcast-both": ((1, 3, 2, 4), (5, 1, 4, 6)),
    "zero-batch": ((0, 3, 5), (5, 2)),
    "zero-inner": ((3, 0), (0, 4)),
    "ones": ((1, 1), (1, 1)),
}


@pytest.mark.exercise("matmul_flops")
@pytest.mark.parametrize("case", MATMUL_CASES.values(), ids=MATMUL_CASES.keys())
def test_matmul_flops_hand_picked(exercise_module, case):
    assert exercise_module.matmul_flops(*case) == counted_matmul_flops(*case), case


@pytest.mark.exercise("matmul_flops")
def test_matmul_flops_random(exercise_module):
    rng = random.Random(0)
    for _ in range(60):
        m, k, n = (rng.randint(1, 6) for _ in range(3))
        batch = [rng.choice([1, 2, 3]) for _ in range(rng.randint(0, 3))]
        ba = [d if rng.random() < 0.6 else 1 for d in batch][rng.randint(0, len(batch)):]
        bb = [d if rng.random() < 0.6 else 1 for d in batch][rng.randint(0, len(batch)):]
        a, b = (*ba, m, k), (*bb, k, n)
        assert exercise_module.matmul_flops(a, b) == counted_matmul_flops(a, b), (a, b)


def counted_step_flops(sizes, batch):
    layers = []
    for d_in, d_out in zip(sizes, sizes[1:]):
        layers += [nn.Linear(d_in, d_out), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    with FlopCounterMode(display=False) as fc:
        model(torch.randn(batch, sizes[0])).square().mean().backward()
    return fc.get_total_flops()


@pytest.mark.exercise("mlp_step_flops")
@pytest.mark.parametrize(
    "sizes, batch",
    [([512, 512, 10], 256), ([8, 4], 3), ([8, 4, 4], 1), ([3, 5, 7, 2], 4), ([6, 1, 6], 5),
     ([2, 9, 3, 4, 5], 7)],
)
def test_mlp_step_flops(exercise_module, sizes, batch):
    assert exercise_module.mlp_step_flops(sizes, batch) == counted_step_flops(sizes, batch)


class FakeGPU:
    """A device queue and a fake host clock: a launch costs host time, the work runs in the
    queue (overlapping later launches), and sync() waits for the queue plus a round trip."""

    def __init__(self, launch=1e-5, work=2e-3, round_trip=5e-5):
        self.launch, self.work, self.round_trip = launch, work, round_trip
        self.now = 0.0  # the host clock
        self.free_at = 0.0  # when the device will have finished its queue
        self.calls = self.syncs = 0

    def clock(self):
        return self.now

    def fn(self):
        self.now += self.launch
        self.free_at = max(self.free_at, self.now) + self.work
        self.calls += 1

    def sync(self):
        self.now = max(self.now, self.free_at) + self.round_trip
        self.syncs += 1


@pytest.mark.exercise("per_call_time")
@pytest.mark.parametrize("calls, warmup", [(10, 1), (1, 1), (200, 3), (7, 0)])
def test_per_call_time_on_a_queue(exercise_module, calls, warmup):
    gpu = FakeGPU()
    got = exercise_module.per_call_time(gpu.fn, gpu.sync, calls, warmup=warmup, clock=gpu.clock)
    # all the queued work, one launch that cannot overlap, one round trip; no warm-up work
    expected = gpu.work + (gpu.launch + gpu.round_trip) / calls
    assert got == pytest.approx(expected, rel=1e-9)
    assert gpu.calls == warmup + calls


@pytest.mark.exercise("per_call_time")
def test_per_call_time_host_bound(exercise_module):
    """Launches slower than the work: queued calls cost the launch, not launch + work."""
    gpu = FakeGPU(launch=3e-3, work=1e-3, round_trip=5e-5)
    got = exercise_module.per_call_time(gpu.fn, gpu.sync, 10, warmup=2, clock=gpu.clock)
    assert got == pytest.approx(gpu.launch + (gpu.work + gpu.round_trip) / 10, rel=1e-9)


@pytest.mark.exercise("per_call_time")
def test_per_call_time_real_clock(exercise_module):
    """The default clock is a real one: 5 calls that sleep 2 ms each take about 2 ms each."""
    got = exercise_module.per_call_time(lambda: time.sleep(0.002), torch.cpu.synchronize, 5)
    assert 0.0019 < got < 0.05


# ----------------------------------------------------------------------------------------
# GPU: what the CPU cannot show. Standalone (no lesson run needed), printed for the record.

GPU = [pytest.param("cuda", marks=pytest.mark.cuda), pytest.param("mps", marks=pytest.mark.mps)]


def syncer(device):
    return torch.cuda.synchronize if device == "cuda" else torch.mps.synchronize


def median_s(fn, repeats=7):
    return statistics.median(fn() for _ in range(repeats))


@pytest.mark.parametrize("device", GPU)
def test_gpu_unsynchronized_timing_is_the_launch(device, record_property):
    sync = syncer(device)
    a = torch.randn(4096, 4096, device=device)  # (N, N) fp32
    for _ in range(3):
        a @ a  # warm-up: library handles, kernels, the caching allocator's block
    sync()

    def unsynced():
        sync()  # an empty queue before the clock starts
        t0 = time.perf_counter()
        a @ a
        dt = time.perf_counter() - t0  # the call has returned; the work has not finished
        sync()
        return dt

    def synced():
        sync()
        t0 = time.perf_counter()
        a @ a
        sync()
        return time.perf_counter() - t0

    t_launch, t_work = median_s(unsynced), median_s(synced)
    print(f"{device}: 4096^2 matmul, no sync {t_launch * 1e3:.3f} ms, sync {t_work * 1e3:.3f} ms, "
          f"ratio {t_work / t_launch:.0f}")
    record_property(f"{device} fp32 matmul 4096^3, clock without sync [ms]", round(t_launch * 1e3, 4))
    record_property(f"{device} fp32 matmul 4096^3, clock with sync [ms]", round(t_work * 1e3, 4))
    assert t_launch < 0.2 * t_work


@pytest.mark.parametrize("device", GPU)
def test_gpu_queued_calls_beat_waiting_after_each(device, record_property):
    sync = syncer(device)
    a = torch.randn(256, 256, device=device)  # (n, n)
    for _ in range(10):
        a @ a
    sync()

    def queued():
        sync()
        t0 = time.perf_counter()
        for _ in range(200):
            a @ a
        sync()
        return (time.perf_counter() - t0) / 200

    def waiting():
        sync()
        t0 = time.perf_counter()
        for _ in range(200):
            a @ a
            sync()  # a round trip per call: the device idles while the host launches
        return (time.perf_counter() - t0) / 200

    t_q, t_w = median_s(queued, 5), median_s(waiting, 5)
    print(f"{device}: 256^2 matmul per call, queued {t_q * 1e6:.1f} us, waiting {t_w * 1e6:.1f} us")
    record_property(f"{device} 256^2 matmul per call, 200 queued [us]", round(t_q * 1e6, 2))
    record_property(f"{device} 256^2 matmul per call, sync after each [us]", round(t_w * 1e6, 2))
    assert t_q < t_w


@pytest.mark.parametrize("device", GPU)
def test_gpu_copies_are_explicit(device):
    x = torch.randn(3)
    xd = x.to(device)
    assert xd is not x and xd.device.type == device and xd.to(device) is xd
    assert torch.equal(xd.cpu(), x)
    # the lesson quotes CUDA's wording
    with pytest.raises(
        RuntimeError, match="Expected all tensors to be on the same device" if device == "cuda" else "device"
    ):
        xd + x  # a CPU tensor with elements next to a GPU tensor: never moved for you
    if device == "cuda":  # a 0-d CPU tensor acts as a number next to a CUDA tensor
        assert (xd + torch.tensor(1.0)).device.type == device


@pytest.mark.cuda
def test_cuda_events_agree_with_the_synced_host_clock(record_property):
    a = torch.randn(4096, 4096, device="cuda")  # (N, N)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()

    def both():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()  # timestamps taken by the GPU, in its queue
        a @ a
        end.record()
        end.synchronize()
        return start.elapsed_time(end), (time.perf_counter() - t0) * 1e3  # ms, ms

    pairs = [both() for _ in range(7)]
    gpu_ms = statistics.median(p[0] for p in pairs)
    host_ms = statistics.median(p[1] for p in pairs)
    print(f"cuda: 4096^2 matmul, events {gpu_ms:.3f} ms, synced host clock {host_ms:.3f} ms")
    record_property("fp32 matmul 4096^3, CUDA events [ms]", round(gpu_ms, 4))
    record_property("fp32 matmul 4096^3, synced host clock [ms]", round(host_ms, 4))
    # the host clock also holds the launch and the wait's round trip, so it reads a bit more
    assert 0.5 * host_ms < gpu_ms < 1.1 * host_ms


@pytest.mark.cuda
def test_cuda_sync_debug_mode_flags_item(record_property):
    x = torch.randn(64, 8, device="cuda")  # (N, D)
    w = torch.randn(8, 1, device="cuda", requires_grad=True)  # (D, 1)
    (x @ w).square().mean()  # warm-up: library handles are made outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        total = torch.zeros((), device="cuda")
        for _ in range(3):
            loss = (x @ w).square().mean()
            total += loss.detach()  # stays on the device: no sync
        flagged = []
        for name, read in [(".item()", loss.item), (".cpu()", loss.cpu), ("bool()", lambda: bool(loss > 0))]:
            with pytest.raises(RuntimeError, match="synchroniz"):
                read()  # the host needs the value: a sync
            flagged.append(name)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    record_property("set_sync_debug_mode('error') raised on", ", ".join(flagged))
    assert math.isfinite(total.item())


@pytest.mark.cuda
def test_cuda_cpu_copy_ops(record_property):
    """The lesson: .cpu() of a CUDA tensor is aten::_to_copy + aten::copy_, and it reads a value."""
    y = torch.randn(64, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        y.cpu()
    names = {e.name for e in prof.events()}
    record_property("ops of .cpu() on a CUDA tensor", ", ".join(sorted(names)))
    assert {"aten::to", "aten::_to_copy", "aten::copy_"} <= names


# ----------------------------------------------------------------------------------------
# GPU memory (section 9): pinned copies, the caching allocator, expandable segments, snapshots

MiB = 2**20


@pytest.mark.cuda
def test_cuda_pinned_copies(record_property):
    """From pinned memory a non_blocking copy returns before the copy is done; from pageable
    memory the host waits. Both bandwidths recorded; a non_blocking copy back is read after a sync."""
    n = 256 * MiB // 4  # 256 MiB of float32
    pageable = torch.randn(n)
    pinned = pageable.pin_memory()
    assert pinned.is_pinned() and not pageable.is_pinned()
    dev = torch.empty(n, device="cuda")

    def copy(src):
        """(seconds until copy_ returned, seconds until the copy was done)"""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dev.copy_(src, non_blocking=True)
        returned = time.perf_counter() - t0
        torch.cuda.synchronize()
        return returned, time.perf_counter() - t0

    for _ in range(2):  # warm-up: the driver's staging buffers, the first mappings
        copy(pinned), copy(pageable)
    runs = {name: [copy(src) for _ in range(5)] for name, src in [("pinned", pinned), ("pageable", pageable)]}
    ret = {k: statistics.median(r for r, _ in v) for k, v in runs.items()}
    done = {k: statistics.median(d for _, d in v) for k, v in runs.items()}
    gbs = {k: n * 4 / done[k] / 1e9 for k in done}
    print(f"cuda: 256 MiB host->device, pinned {gbs['pinned']:.1f} GB/s (returned after "
          f"{ret['pinned'] * 1e3:.3f} of {done['pinned'] * 1e3:.3f} ms), pageable {gbs['pageable']:.1f} GB/s "
          f"(returned after {ret['pageable'] * 1e3:.3f} of {done['pageable'] * 1e3:.3f} ms)")
    record_property("host->device 256 MiB from pinned memory [GB/s]", round(gbs["pinned"], 2))
    record_property("host->device 256 MiB from pageable memory [GB/s]", round(gbs["pageable"], 2))
    record_property("pinned non_blocking copy: host time until return [ms]", round(ret["pinned"] * 1e3, 4))
    record_property("pageable non_blocking copy: host time until return [ms]", round(ret["pageable"] * 1e3, 4))
    assert ret["pinned"] < 0.5 * done["pinned"]  # queued: the host is free during the copy
    assert ret["pageable"] > 0.5 * done["pageable"]  # staged through the driver: the host waits
    assert torch.equal(dev.cpu(), pageable)
    back = torch.empty(n, pin_memory=True)
    back.copy_(dev * 2, non_blocking=True)
    torch.cuda.synchronize()  # only now is `back` complete
    assert torch.equal(back, pageable * 2)


@pytest.mark.cuda
def test_cuda_caching_allocator(record_property):
    """allocated follows live tensors, reserved what the cache holds; a cached block comes
    back faster than a new segment; empty_cache returns free segments, never live ones."""
    size = 256 * MiB
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    alloc0, res0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()

    def make():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        return t, time.perf_counter() - t0

    x, t_new = make()  # a new segment from cudaMalloc
    alloc1, res1 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    del x
    alloc2, res2 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    x, t_cached = make()  # the same block, from the cache
    res3 = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()  # x is alive: its segment stays
    alloc4, res4 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    del x
    torch.cuda.empty_cache()
    alloc5, res5 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    free, total = torch.cuda.mem_get_info()
    for name, value in [("allocated with the tensor", alloc1), ("reserved with the tensor", res1),
                        ("allocated after del", alloc2), ("reserved after del", res2),
                        ("reserved after del and empty_cache", res5)]:
        record_property(f"{name}, above the start [MiB]", (value - (alloc0 if "allocated" in name else res0)) / MiB)
    record_property("256 MiB tensor, new segment (cudaMalloc) [us]", round(t_new * 1e6, 1))
    record_property("256 MiB tensor, block from the cache [us]", round(t_cached * 1e6, 1))
    assert alloc1 - alloc0 == size and res1 - res0 >= size
    assert alloc2 == alloc0 and res2 == res1  # freed to the cache, not to CUDA
    assert res3 == res1 and t_cached < t_new  # reused: no new segment, and faster
    assert alloc4 == alloc1 and res4 >= res0 + size  # empty_cache keeps live tensors
    assert alloc5 == alloc0 and res5 <= res1 - size  # ...and returns free segments
    assert res1 <= total - free + size  # what CUDA sees in use includes what PyTorch reserved


EXPANDABLE = """
import json, torch
a = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
del a  # a free 512 MiB block in the cache
b = torch.empty(520 * 2**20, dtype=torch.uint8, device="cuda")  # does not fit in it
segs = torch.cuda.memory_snapshot()
print(json.dumps({"reserved": torch.cuda.memory_reserved(), "segments": len(segs),
                  "expandable": any(s.get("is_expandable", False) for s in segs)}))
"""


@pytest.mark.cuda
def test_cuda_expandable_segments(record_property):
    """512 MiB freed, then 520 MiB: a fixed-size cache holds both; an expandable segment grows."""
    out = {}
    for conf in ("", "expandable_segments:True"):
        env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf  # read once, when CUDA starts: a fresh process
        run = subprocess.run([sys.executable, "-c", EXPANDABLE], env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        out[conf or "default"] = json.loads(run.stdout.strip().splitlines()[-1])
    plain, grown = out["default"], out["expandable_segments:True"]
    print(f"cuda: 512 MiB freed then 520 MiB: reserved {plain['reserved'] / MiB:.0f} MiB in "
          f"{plain['segments']} segments; expandable {grown['reserved'] / MiB:.0f} MiB in {grown['segments']}")
    record_property("512 then 520 MiB, default allocator: reserved [MiB]", plain["reserved"] / MiB)
    record_property("512 then 520 MiB, expandable segments: reserved [MiB]", grown["reserved"] / MiB)
    record_property("snapshot marks a segment expandable (default, expandable)",
                    f"{plain['expandable']}, {grown['expandable']}")
    assert plain["reserved"] >= (512 + 520) * MiB  # the freed 512 MiB block stays reserved
    assert grown["reserved"] < 0.75 * plain["reserved"]  # one segment grew instead


@pytest.mark.cuda
def test_cuda_memory_snapshot(record_property, tmp_path):
    """A snapshot holds the live 64 MiB block and the allocation event with this test's frame."""
    size = 64 * MiB
    torch.cuda.memory._record_memory_history(max_entries=10_000)
    try:
        x = torch.empty(size, dtype=torch.uint8, device="cuda")  # the allocation to find
        snap = torch.cuda.memory._snapshot()
        path = tmp_path / "snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)  # stop recording
    blocks = [b for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    events = [e for trace in snap["device_traces"] for e in trace if e["action"] == "alloc" and e["size"] == size]
    record_property("snapshot: segments", len(snap["segments"]))
    record_property("snapshot: recorded alloc events of 64 MiB", len(events))
    record_property("snapshot file [KiB]", round(path.stat().st_size / 1024, 1))
    assert any(b["size"] == size for b in blocks)
    assert events and any("test_devices_and_timing" in f["filename"] for f in events[-1]["frames"])
    assert path.stat().st_size > 0
    del x

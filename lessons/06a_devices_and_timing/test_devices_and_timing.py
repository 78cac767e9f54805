"""Tests of lesson 06a: documented outputs, the lesson's key values (copies and devices,
the structure of its timings on a simulated queue, the host reads a profile finds, the
profiler's table, schedule, memory columns, stacks and trace), the exercise, and the GPU
measurements that the CPU cannot make (unsynchronised vs synchronised timing, queued vs
waited calls, CUDA events, hidden synchronisations)."""

import contextlib
import io
import json
import math
import statistics
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile


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
    # Module.to: a dtype moves the floating-point tensors only, a device moves them all
    bn = torch.nn.BatchNorm1d(3)
    assert bn.to(torch.float64) is bn
    assert {n: v.dtype for n, v in bn.state_dict().items()} == {
        "weight": torch.float64, "bias": torch.float64, "running_mean": torch.float64,
        "running_var": torch.float64, "num_batches_tracked": torch.int64}
    assert ns["on_meta"] and ns["bn"].num_batches_tracked.device.type == "meta"
    assert ns["bn"].num_batches_tracked.dtype == torch.int64


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
    # call 10 counts the 3 warm-up calls (0-2): it is the 8th timed call, repeat 7
    assert stalled[7] >= 0.05
    # the stall is in exactly one call: here call 4, after 1 warm-up, is repeat 3
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
    # print(loss) writes str(loss): the tensor printer reads more than the f-string's one
    loss = ns["loss"]
    assert loss.dim() == 0 and loss.grad_fn is not None
    assert ns["fmt_reads"] == 1 and ns["print_reads"] > 1
    out = io.StringIO()
    with profile(activities=[ProfilerActivity.CPU]) as prof, contextlib.redirect_stdout(out):
        print(loss)
    assert out.getvalue() == str(loss) + "\n"
    assert sum(e.name == "aten::_local_scalar_dense" for e in prof.events()) == ns["print_reads"]


def test_profiler_table(lesson):
    ns = lesson.ns
    avg = {e.key: e for e in ns["prof"].key_averages()}
    steps, layers = 3, 2
    assert avg["aten::addmm"].count == steps * layers  # one per layer, forward
    assert avg["aten::mm"].count == steps * (2 * layers - 1)  # no gradient for the input batch
    assert avg["forward"].count == avg["backward"].count == avg["optimizer"].count == steps
    counts = [e.count for e in ns["table"]]
    assert counts == sorted(counts, reverse=True)
    # resolve_conj: a check the matmuls make on their matrices, a no-op on a real tensor
    parents = {e.cpu_parent.name for e in ns["prof"].events() if e.name == "aten::resolve_conj"}
    assert parents and parents <= {"aten::mm", "aten::addmm"}
    real = torch.randn(2, 2)
    assert real.resolve_conj() is real
    lazy = torch.randn(2, 2, dtype=torch.complex64).conj()
    assert lazy.is_conj() and not lazy.resolve_conj().is_conj()
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
    assert ready == [2, 4]  # the Mastery check's answer
    assert sorted({e.name for e in p.events() if e.name.startswith("step ")}) == ["step 1", "step 3"]


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
    assert gpu.syncs <= 2  # one to drain the warm-up, one to end the clock: no more


@pytest.mark.exercise("per_call_time")
def test_per_call_time_host_bound(exercise_module):
    """Launches slower than the work: queued calls cost the launch, not launch + work."""
    gpu = FakeGPU(launch=3e-3, work=1e-3, round_trip=5e-5)
    got = exercise_module.per_call_time(gpu.fn, gpu.sync, 10, warmup=2, clock=gpu.clock)
    assert got == pytest.approx(gpu.launch + (gpu.work + gpu.round_trip) / 10, rel=1e-9)
    assert gpu.syncs <= 2


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



"""Tests of lesson 10: documented outputs, the ranks' values read from the narrative's one
launch (tensor parallel, both pipeline schedules, scale_grads, unequal micro-batches), the
schedule simulator and its figure, the exercises, and the worker on NCCL with 2 GPUs. (That no
rank outlives the lesson is checked by the `lesson` fixture.)

Every test here launches ranks or reads the narrative's launch: all are `multirank`."""

import re
from pathlib import Path

import pytest
import torch

from scripts.multirank import launch

pytestmark = pytest.mark.multirank
WORKER = Path(__file__).parent / "worker.py"


def lines(lesson, name, rank=0):
    return lesson.ns["section"](lesson.ns["run"], name)[rank]


def gaps(text_lines):
    """Every 'gap X, below B: True' on these lines: (X, B), each checked against its verdict.

    The lesson prints each rounding-level gap but its Output blocks keep only the bound: the
    last digits vary with the CPU's vector instructions."""
    found = []
    for line in text_lines:
        for value, bound, verdict in re.findall(r"gap (\d\.\de[-+]\d+), below (\de[-+]\d+): (\w+)", line):
            assert verdict == str(float(value) < float(bound)), line
            found.append(float(value))
    return found


def test_launch_succeeded(lesson):
    run = lesson.ns["run"]
    assert run.ok and sorted(run.out) == [0, 1], run.describe()  # ok: exit 0, not timed out
    for rank in (0, 1):
        assert "Traceback" not in run.err[rank], run.err[rank]
        assert "Warning" not in run.err[rank], run.err[rank]  # e.g. the backward-hook warning


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


def test_tp_shards_dim0_then_dim1(lesson):
    for rank, (lo, hi) in ((0, (0, 4)), (1, (4, 8))):
        got = lines(lesson, "tp shapes", rank)
        assert f"rank {rank}: up.weight: global [8, 6] S(0), local [4, 6]" in got
        assert f"rank {rank}: up.bias: global [8] S(0), local [4]" in got
        assert f"rank {rank}: down.weight: global [6, 8] S(1), local [6, 4]" in got
        assert f"rank {rank}: down.bias: global [6] R, local [6]" in got
        assert (f"rank {rank}: up.weight local == full rows {lo}:{hi}: True; "
                f"down.weight local == full columns {lo}:{hi}: True") in got
    assert "rank 0: nn.Linear(6, 8).weight shape [8, 6]: [out, in]" in lines(lesson, "tp shapes")


def test_tp_equals_the_unsharded_mlp(lesson):
    got = lines(lesson, "tp equal")
    assert got[0] == "rank 0: output: a DTensor? False, shape [5, 6]"
    labels = ["output max gap", "loss gap", "grad x ", "grad up.weight ", "grad up.bias ", "grad down.weight ",
              "grad down.bias ", "max parameter gap"]
    for label in labels:
        assert sum(label in line for line in got) == 1, label
    found = gaps(got)  # output, loss, x, 4 parameters' grads, parameters after AdamW
    assert len(found) == 8 and all(g < 1e-15 for g in found), found  # rounding level


def test_tp_communicates_once_each_way(lesson):
    assert lines(lesson, "tp comms") == [
        "rank 0: forward ran: all_reduce x1",
        "rank 0: backward ran: all_reduce x1",
        "rank 0: x needs no gradient: forward ran all_reduce x1, backward ran none",
        "rank 0: a rank's own matmul x @ up.weight_local.T ran: none",
    ]


def test_swapped_plan_fails_with_defaults_and_costs_more_with_layouts(lesson):
    assert lines(lesson, "tp swapped", 1) == []  # the same on both ranks: printed by rank 0
    got = lines(lesson, "tp swapped")
    assert "rank 0: defaults: up.weight S(1), down.weight S(0)" in got
    error = [line for line in got if line.startswith("rank 0: defaults: RuntimeError")]
    assert error and "same reduction dim" in error[0] and "[5, 12] X [6, 8]" in error[0], got
    assert "rank 0: up's output on each rank: a plain tensor [5, 8] (all 8 hidden units)" in got
    found = gaps(got)
    assert len(found) == 2 and all(g < 1e-15 for g in found), found
    both = "all_reduce x1, all_gather_into_tensor x1"  # twice section 1's pairing
    assert f"rank 0: forward ran: {both}" in got and f"rank 0: backward ran: {both}" in got


def test_pipeline_schedules_equal_the_full_batch(lesson):
    """The losses are printed to 6 digits only: the model's random initial weights differ in
    their last bits between CPUs (`uniform_` fills a large enough tensor with vectorised
    code); without vector instructions a reviewer saw the reference loss move by 3.8e-9, in
    its 8th significant digit."""
    ns = lesson.ns
    run = ns["run"]
    assert ns["ran"](run, "GPipe") == [["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]] * 2
    assert ns["ran"](run, "1F1B") == [["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"],
                                      ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]]
    for rank, flight in ((0, {"GPipe": 4, "1F1B": 2}), (1, {"GPipe": 4, "1F1B": 1})):
        got = lines(lesson, "pp schedules", rank)
        for kind, n in flight.items():
            assert f"rank {rank}: {kind}: most micro-batches in flight {n}" in got
        grads = [g for line in got if "grads max gap" in line for g in gaps([line])]
        assert len(grads) == 2 and all(g < 1e-15 for g in grads), got
    ref = lines(lesson, "pp schedules")[0].split("reference loss ")[1]
    last = lines(lesson, "pp schedules", 1)
    for kind in ("GPipe", "1F1B"):
        (line,) = [x for x in last if x.startswith(f"rank 1: {kind}: 4 micro-batch losses, mean {ref}, gap ")]
        assert gaps([line])[0] < 1e-15, line
    # the schedule's own plan: right for GPipe and stage 0, shifted by one for 1F1B's last stage
    assert "rank 1: 1F1B: planned F1 B0 F2 B1 F3 B2 F4 B3" in last
    assert "rank 0: 1F1B: planned F0 F1 B0 F2 B1 F3 B2 B3" in lines(lesson, "pp schedules")


def scale_ratios(lesson):
    """{(rank, label): (min, max)} of the scale_grads section."""
    pattern = re.compile(r"rank (\d): (.+): grad / full-batch \w+ grad in \[(\S+), (\S+)\]")
    found = {}
    for rank in (0, 1):
        for line in lines(lesson, "scale_grads", rank):
            m = pattern.fullmatch(line)
            found[(rank, m[2])] = (float(m[3]), float(m[4]))
    return found


PINNED = {  # pipelining is alpha: every order of the multi-stage schedules on 2.13.0
    (0, "Interleaved1F1B"): "F0s0 F1s0 F0s2 F1s2 F2s0 B0s2 F3s0 B1s2 F2s2 B0s0 F3s2 B1s0 B2s2 B3s2 B2s0 B3s0",
    (0, "LoopedBFS"): "F0s0 F1s0 F2s0 F3s0 F0s2 F1s2 F2s2 F3s2 B3s2 B2s2 B1s2 B0s2 B3s0 B2s0 B1s0 B0s0",
    (1, "Interleaved1F1B"): "F0s1 F1s1 F0s3 B0s3 F1s3 B1s3 F2s1 B0s1 F3s1 B1s1 F2s3 B2s3 F3s3 B3s3 B2s1 B3s1",
    (1, "LoopedBFS"): "F0s1 F1s1 F2s1 F3s1 F0s3 F1s3 F2s3 F3s3 B3s3 B2s3 B1s3 B0s3 B3s1 B2s1 B1s1 B0s1",
}


def test_virtual_stage_schedules_are_pinned(lesson):
    held = {(0, "Interleaved1F1B"): 5, (0, "LoopedBFS"): 8, (1, "Interleaved1F1B"): 3, (1, "LoopedBFS"): 8}
    for (rank, kind), order in PINNED.items():
        got = lines(lesson, "pp virtual", rank)
        assert f"rank {rank}: {kind}: ran {order}" in got, got
        assert f"rank {rank}: {kind}: ran as planned (pipeline_order): True" in got
        assert f"rank {rank}: {kind}: most activations held at once (micro-batch, stage) {held[rank, kind]}" in got
        count = [sum(1 if a[0] == "F" else -1 for a in order.split()[: i + 1]) for i in range(16)]
        assert max(count) == held[rank, kind] and count[-1] == 0  # forwards not yet backwarded
        found = gaps(x for x in got if x.startswith(f"rank {rank}: {kind}: stages"))
        assert len(found) == 1 and found[0] < 1e-15


def test_scale_grads_divides_once(lesson):
    expected = {"mean loss, scale_grads=True": 1.0, "mean loss / 4, scale_grads=True": 0.25,
                "sum loss, scale_grads=True": 0.25, "sum loss, scale_grads=False": 1.0}
    found = scale_ratios(lesson)
    assert len(found) == 8
    for (rank, label), (low, high) in found.items():
        assert low == high == expected[label], (rank, label, low, high)


def test_unequal_micro_batches_fail_cleanly(lesson):
    run = lesson.ns["run"]
    r0, r1 = lines(lesson, "unequal", 0), lines(lesson, "unequal", 1)
    assert r0[0] == "rank 0: batch 10 into 4 micro-batches: torch.tensor_split sizes [3, 3, 2, 2]"
    assert r0[1].startswith("rank 0: ran F0 F1 F2 F3, then raised RuntimeError after ")
    assert r1[0].startswith("rank 1: ran F0 F1 F2, then raised RuntimeError after ")
    assert r1[1] == (
        "rank 1:   The size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 0"
    )
    # the receive itself: gloo fills 2 rows of the 3-row buffer and raises nothing
    assert r1[2:] == ["rank 1: recv of [2, 4] into a [3, 4] buffer: no error, 2 rows filled, row 3 kept: True"]
    assert len(r0) == 2
    waited = float(r0[1].split("after ")[1].split(" s")[0])
    # the stages' group timeout, 3 s: not the default group's 60 s (nor gloo's 30 minutes)
    assert 2.5 <= waited < 30, waited
    raised = float(r1[0].split("after ")[1].split(" s")[0])
    assert raised < waited / 2, (raised, waited)  # the last stage: at once, not at a timeout
    assert run.code == 0  # both ranks caught it and tore down normally


def test_simulator_reproduces_the_ranks_and_the_formula(lesson):
    ns = lesson.ns
    for kind in ns["KINDS"]:
        assert ns["orders"](kind, 2, 4) == ns["ran"](ns["run"], kind)
    for kind in ns["KINDS"]:
        for p in (2, 3, 4):
            for m in range(1, 9):
                got = ns["bubble"](ns["simulate"](ns["orders"](kind, p, m)), p)
                assert got == pytest.approx((p - 1) / (m + p - 1), abs=1e-12), (kind, p, m)
    with pytest.raises(ValueError, match="deadlock"):  # a stage waiting for a gradient first
        ns["simulate"]([["B0", "F0"], ["F0", "B0"]])


def test_mastery_transfer_p4_m8(lesson):
    """Mastery 5: p=4, m=8, from the lesson's own orders/simulate/bubble and in_flight."""
    ns = lesson.ns
    for kind, held in (("1F1B", 3), ("GPipe", 8)):
        order = ns["orders"](kind, 4, 8)
        spans = ns["simulate"](order)
        assert max(e for _, e in spans.values()) == 33.0
        assert ns["bubble"](spans, 4) == pytest.approx(3 / 11, abs=1e-12)
        assert f"{3 / 11:.3f}" == "0.273"
        assert ns["in_flight"](order[1]) == held, kind
    assert ns["orders"]("1F1B", 4, 8)[1][:4] == ["F0", "F1", "F2", "B0"]  # 2 warm-up forwards


def test_figure_plots_the_simulated_schedules(lesson):
    ns = lesson.ns
    fig = ns["plot_schedules"](ns["run"])
    axes = fig.get_axes()
    assert len(axes) == 3
    for ax, kind in zip(axes[:2], ns["KINDS"]):
        spans = ns["simulate"](ns["ran"](ns["run"], kind))
        assert ax.get_title() == f"{kind}: bubble 0.200"
        bars = sorted((r.get_x(), r.get_width(), round(r.get_y() + r.get_height() / 2)) for r in ax.patches)
        assert bars == sorted((s0, e - s0, s) for (s, _), (s0, e) in spans.items())
        assert sorted(t.get_text() for t in ax.texts) == sorted(a for _, a in spans)
        assert max(r.get_x() + r.get_width() for r in ax.patches) == 15.0
    ms = list(range(1, 17))
    curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axes[2].lines}
    formula = [1 / (m + 1) for m in ms]
    assert curves["(p-1)/(m+p-1)"] == (ms, formula)
    for kind in ns["KINDS"]:
        assert curves[f"{kind} simulated"][0] == ms
        assert curves[f"{kind} simulated"][1] == pytest.approx(formula, abs=1e-12)
    assert (ns["HERE"] / "schedules.png").is_file()


@pytest.mark.multigpu
def test_worker_on_nccl():
    """Unverified on hardware when written (no GPU on the course's machine)."""
    result = launch(WORKER, ["all", "--backend", "nccl"], timeout=180)
    assert result.ok, result.describe()
    out = result.out
    assert "rank 0: up.weight: global [8, 6] S(0), local [4, 6]" in out[0]
    assert "rank 0: forward ran: all_reduce x1" in out[0]
    assert "rank 1: 1F1B: ran     F0 B0 F1 B1 F2 B2 F3 B3" in out[1]
    assert "rank 0: mean loss / 4, scale_grads=True: grad / full-batch mean_loss grad in [0.250000, 0.250000]" in out[0]
    assert "rank 1:   The size of tensor a (3) must match the size of tensor b (2)" in out[1]


# ----------------------------------------------------------------------------------------
# Exercises: checked against what the ranks printed


@pytest.mark.exercise("local_weight")
def test_local_weight_matches_the_ranks(lesson, exercise_module):
    pattern = re.compile(r"rank (\d): (up|down)\.weight: global \[(\d+), (\d+)\] S\((\d)\), local \[(\d+), (\d+)\]")
    checked = 0
    for rank in (0, 1):
        for line in lines(lesson, "tp shapes", rank):
            if m := pattern.fullmatch(line):
                out, inp, dim = int(m[3]), int(m[4]), int(m[5])
                w = torch.arange(out * inp).reshape(out, inp)
                style = "colwise" if m[2] == "up" else "rowwise"
                got = exercise_module.local_weight(w, rank, 2, style)
                assert list(got.shape) == [int(m[6]), int(m[7])], line
                assert torch.equal(got, w.chunk(2, dim=dim)[rank]), line  # the rows / columns printed
                checked += 1
    assert checked == 4
    w = torch.arange(24).reshape(6, 4)
    assert torch.equal(exercise_module.local_weight(w, 2, 3, "colwise"), w[4:6])
    assert torch.equal(exercise_module.local_weight(w, 1, 4, "rowwise"), w[:, 1:2])


@pytest.mark.exercise("one_f_one_b")
def test_one_f_one_b_matches_the_ranks(lesson, exercise_module):
    ns = lesson.ns
    assert exercise_module.one_f_one_b(2, 4) == ns["ran"](ns["run"], "1F1B")
    for p in (1, 2, 3, 4):
        for m in (1, 2, 3, 5, 8):
            stages = exercise_module.one_f_one_b(p, m)
            assert len(stages) == p
            for s, seq in enumerate(stages):
                assert sorted(seq) == sorted([f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)])
                assert all(seq.index(f"F{i}") < seq.index(f"B{i}") for i in range(m))
                held = peak = 0
                for a in seq:
                    held += 1 if a[0] == "F" else -1
                    peak = max(peak, held)
                assert peak == min(p - s, m), (p, m, s, seq)  # 1F1B's memory bound
            assert ns["bubble"](ns["simulate"](stages), p) == pytest.approx((p - 1) / (m + p - 1))


PRINTED_SCALES = {"mean loss, scale_grads=True": ("mean", False, True, 4),
                  "mean loss / 4, scale_grads=True": ("mean", True, True, 4),
                  "sum loss, scale_grads=True": ("sum", False, True, 4),
                  "sum loss, scale_grads=False": ("sum", False, False, 4)}
GRAD_SCALES = {  # (loss, divide_loss, scale_grads, m): pipeline grad / full-batch grad
    ("mean", False, True, 4): 1.0, ("mean", True, True, 4): 0.25,  # the four the ranks printed
    ("sum", False, True, 4): 0.25, ("sum", False, False, 4): 1.0,
    ("mean", False, False, 4): 4.0,  # m means accumulate to m x the full-batch mean
    ("mean", True, False, 4): 1.0,  # dividing the loss alone is also dividing once
    ("sum", True, True, 4): 1 / 16,  # dividing a sum loss divides too: twice
    # the same rules with another micro-batch count: the factor moves with m where it should
    ("mean", True, True, 8): 1 / 8, ("sum", False, True, 8): 1 / 8, ("mean", False, True, 8): 1.0,
}


def grad_scale_fails_a_case(answer):
    return any(answer(*case) != pytest.approx(want) for case, want in GRAD_SCALES.items())


def test_grad_scale_cases_are_the_ranks_ratios(lesson):
    found = scale_ratios(lesson)
    assert len(found) == 8
    for (_, label), (low, _) in found.items():
        assert GRAD_SCALES[PRINTED_SCALES[label]] == low, label


def wrong_scale_mean_is_always_right(loss, divide_loss, scale_grads, m):
    """'scale_grads exists to make the mean right': mean -> 1 unless the loss is divided too."""
    if loss == "mean":
        return 1 / m if divide_loss else 1.0
    return 1 / m if scale_grads else 1.0


def wrong_scale_only_a_mean_divides(loss, divide_loss, scale_grads, m):
    """Forgets that dividing a sum loss by m divides its gradient too."""
    f = float(m) if loss == "mean" else 1.0
    if scale_grads:
        f /= m
    if divide_loss and loss == "mean":
        f /= m
    return f


@pytest.mark.parametrize("wrong", [wrong_scale_mean_is_always_right, wrong_scale_only_a_mean_divides])
def test_grad_scale_cases_catch_wrong_answers(wrong):
    assert grad_scale_fails_a_case(wrong)


@pytest.mark.exercise("grad_scale")
def test_grad_scale_matches_the_ranks(lesson, exercise_module):
    for case, want in GRAD_SCALES.items():
        assert exercise_module.grad_scale(*case) == pytest.approx(want), case

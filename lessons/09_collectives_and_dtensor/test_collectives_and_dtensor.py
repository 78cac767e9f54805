"""Tests of lesson 09: documented outputs, the ranks' values read from the narrative's
launches, the kit's hard timeout, the placements figure, the exercises, and the worker on
NCCL with 2 GPUs. (That no rank outlives the lesson is checked by the `lesson` fixture.)

The tests that launch ranks or read the narrative's launches are `multirank`; the exercise
tests are not (they check against RANKS_PRINTED, what the ranks printed), and wrong answers
that a simulation could give (an input summed into in place, one tensor shared by every rank,
the inputs handed back) must fail them (test_exercise_cases_catch_wrong_answers)."""

import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.tensor import Shard

from scripts.multirank import GRACE_S, launch

WORKER = Path(__file__).parent / "worker.py"
multirank = pytest.mark.multirank  # the tests that launch ranks or read the lesson's launches

# What the ranks printed in section 3's redistributions, {(src, dst): (collective, {rank:
# (before, after)})}: test_redistributions asserts the lesson's run printed exactly this, and
# the redistribute exercise is checked against it without running the lesson.
RANKS_PRINTED = {
    ("S(0)", "R"): ("all_gather_into_tensor x1", {0: ([0, 1], [0, 1, 2, 3]), 1: ([2, 3], [0, 1, 2, 3])}),
    ("P(sum)", "R"): ("all_reduce x1", {0: ([1, 2], [11, 22]), 1: ([10, 20], [11, 22])}),
    ("P(sum)", "S(0)"): ("reduce_scatter_tensor x1", {0: ([1, 2], [11]), 1: ([10, 20], [22])}),
    ("R", "S(0)"): ("none", {0: ([0, 1, 2, 3], [0, 1]), 1: ([0, 1, 2, 3], [2, 3])}),
}


@multirank
def test_script_outputs(lesson):
    lesson.check()


@multirank
def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


def values(lines, label):
    """The value printed after `label ... ->` on one rank's lines."""
    (line,) = [x for x in lines if x.split(": ", 1)[1].startswith(label)]
    return line.split("-> ")[1].split("  ")[0]


@multirank
def test_collectives_launch_succeeded(lesson):
    run = lesson.ns["run"]
    assert run.code == 0 and sorted(run.out) == [0, 1], run.describe()
    for rank in (0, 1):
        assert "Warning" not in run.err[rank], run.err[rank]  # no FutureWarning from old names
        assert "Traceback" not in run.err[rank], run.err[rank]
        assert f"rank {rank}: leads a process session of its own: True; carries COURSE_LAUNCH_ID: True" in run.out[rank]
    assert run.leftover == 0


@multirank
def test_the_hard_timeout_stops_a_hung_launch(lesson):
    stuck = lesson.ns["stuck"]
    assert stuck.timed_out and stuck.code is None, stuck.describe()
    assert 2 <= stuck.seconds < 2 + GRACE_S + 20, stuck.describe()  # the timeout, then the kill


@multirank
def test_partials_and_collectives(lesson):
    got = lesson.ns["section"](lesson.ns["run"], "collectives")
    for rank, partial, scattered in ((0, "[1, 2]", "[11]"), (1, "[10, 20]", "[22]")):
        lines = got[rank]
        assert lines[0] == f"rank {rank}: partial x = {partial}"
        assert values(lines, "all_reduce") == "[11, 22]"
        assert values(lines, "all_gather ") == "[[1, 2], [10, 20]]"
        assert values(lines, "all_gather_single") == "[1, 2, 10, 20]"  # 4 wrong elements
        assert values(lines, "reduce_scatter_single") == scattered
        assert values(lines, "broadcast") == "[1, 2]"


@multirank
def test_barrier_makes_the_early_rank_wait(lesson):
    got = lesson.ns["section"](lesson.ns["run"], "barrier")
    # the ranks' own clock readings: no rank left before the last one entered (load-proof);
    # how long each waited depends on the load, and is only printed
    assert got[0][1] == "rank 0: every rank left the barrier after the last one entered it: True", got
    assert all(lines[0].startswith(f"rank {r}: waited ") for r, lines in got.items()), got


@multirank
def test_redistributions(lesson):
    steps = lesson.ns["redistributions"](lesson.ns["run"])
    found = {(src, dst): (ran, pieces) for src, dst, ran, pieces in steps}
    assert found == RANKS_PRINTED


@multirank
def test_sharded_matmul_is_partial_and_exact(lesson):
    lines = lesson.ns["section"](lesson.ns["run"], "matmul")[0]
    assert "rank 0: a @ b placement P(sum), ran: none" in lines
    assert "rank 0: full_tensor() [[42.0, 48.0, 54.0], [114.0, 136.0, 158.0]], ran: all_reduce x1" in lines
    assert "rank 0: equal to the single-process a @ b: True" in lines
    assert ("rank 0: random fp32: bitwise equal to the two half-products added: True; "
            "max gap to one process's a @ b below 1e-5: True") in lines


def seconds(line):
    return float(line.split("after ")[1].split(" s")[0])


@multirank
def test_mismatch_fails_fast(lesson):
    bad, section = lesson.ns["bad"], lesson.ns["section"]
    assert bad.code == 1 and not bad.timed_out, bad.describe()  # an error, not a hang, not a success
    assert lesson.ns["default_pg_timeout"] == datetime.timedelta(minutes=30)  # gloo's default, printed
    timeout, detail = section(bad, "timeout"), section(bad, "detail")
    assert sorted(timeout) == sorted(detail) == [0, 1], bad.describe()  # every rank got there
    waits = []
    for rank, op in ((0, "all_reduce"), (1, "all_gather")):
        line = timeout[rank][0]
        assert line.startswith(f"rank {rank}: {op} raised RuntimeError after "), line
        waits.append(seconds(line))
    # the rank that started waiting first waits the group's full 3 s; the other may give up
    # earlier ("Connection closed by peer"); neither waits the default group's 60 s
    assert max(waits) >= 2.5 and max(waits) < 30, waits
    assert detail[0][1] == "rank 0: Op type: ALLREDUCEvs ALLGATHER"
    assert detail[1][1] == "rank 1: Op type: ALLGATHERvs ALLREDUCE"
    for rank in (0, 1):  # found by the check, not by a timeout: far sooner than the 3 s wait
        assert seconds(detail[rank][0]) < max(waits) / 2, (detail, waits)
    monitored = section(bad, "monitored_barrier")[0][0]
    assert monitored.endswith("Rank 1 failed to pass monitoredBarrier in 1000 ms"), monitored


@multirank
def test_figure_draws_the_local_pieces(lesson):
    ns = lesson.ns
    steps = ns["redistributions"](ns["run"])
    fig = ns["plot_redistributions"](steps)
    axes = fig.get_axes()
    assert len(axes) == len(steps) == 4
    for ax, (src, dst, ran, pieces) in zip(axes, steps):
        assert ax.get_title() == f"{src} -> {dst}: {ran}"
        drawn = sorted(t.get_text() for t in ax.texts if t.get_text())  # not the arrow
        expected = sorted(str(v) for rank in pieces for side in (0, 1) for v in pieces[rank][side])
        assert drawn == expected
        assert len(ax.patches) == len(expected)  # one cell per element
    # the shards of the first row sit at their global positions: rank 1's [2, 3] at x 2 and 3
    before = [t for t in axes[0].texts if t.get_text() and t.get_position()[0] < 5]  # left side
    first = {t.get_text(): t.get_position() for t in before if t.get_position()[1] < 1}  # rank 1
    assert first["2"][0] == 2.5 and first["3"][0] == 3.5
    assert (ns["HERE"] / "redistributions.png").is_file()


@multirank
@pytest.mark.multigpu
def test_worker_on_nccl():
    """Unverified on hardware (no GPU on the course's machine)."""
    result = launch(WORKER, ["collectives", "--backend", "nccl"], timeout=120)
    assert result.ok, result.describe()
    expected = {0: {"rank 0: backend nccl, default group ranks [0, 1]", "rank 0: all_reduce            -> [11, 22]",
                    "rank 0: equal to the single-process a @ b: True"},
                1: {"rank 1: reduce_scatter_single -> [22]"}}
    for rank, lines in expected.items():
        assert lines <= set(result.out[rank].splitlines()), result.describe()


# ----------------------------------------------------------------------------------------
# Exercises: the simulation against the real ranks' output and DTensor's sharding rule


def ints(parts):
    return [p.tolist() for p in parts]


def fresh(got, inputs):
    """Each rank's result is a tensor of its own: no two share storage, none is an input's."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    for t in got:
        if t.numel():  # an empty tensor may have no storage at all
            ptr = t.untyped_storage().data_ptr()
            assert ptr not in seen, "a result shares its storage with an input or another rank's result"
            seen.add(ptr)


@pytest.mark.exercise("all_reduce")
def test_all_reduce_simulated(exercise_module):
    parts = [torch.tensor([1, 2]), torch.tensor([10, 20])]
    got = exercise_module.all_reduce(parts)
    assert ints(got) == [[11, 22], [11, 22]]
    assert ints(parts) == [[1, 2], [10, 20]]  # the inputs are left alone
    fresh(got, parts)  # every rank holds its own copy
    gen = torch.Generator().manual_seed(0)
    for world in (1, 3, 4):
        parts = [torch.randint(-9, 9, (5,), generator=gen) for _ in range(world)]
        total = [sum(column) for column in zip(*ints(parts))]
        assert ints(exercise_module.all_reduce(parts)) == [total] * world


@pytest.mark.exercise("reduce_scatter")
def test_reduce_scatter_simulated(exercise_module):
    parts = [torch.tensor([1, 2]), torch.tensor([10, 20])]
    got = exercise_module.reduce_scatter(parts)
    assert ints(got) == [[11], [22]]  # as the ranks printed
    assert ints(parts) == [[1, 2], [10, 20]]  # the inputs are left alone
    fresh(got, parts)
    parts = [torch.arange(6) * (r + 1) for r in range(3)]  # sum: 6 * arange(6)
    assert ints(exercise_module.reduce_scatter(parts)) == [[0, 6], [12, 18], [24, 30]]


@pytest.mark.exercise("shard")
@pytest.mark.parametrize("n, world", [(4, 2), (5, 2), (5, 4), (7, 3), (1, 3), (0, 2), (9, 4), (3, 1)])
def test_shard_matches_dtensor(exercise_module, n, world):
    # Shard._split_tensor is private: DTensor's own rule, used here only as the oracle
    expected, _ = Shard(0)._split_tensor(torch.arange(n), world, with_padding=False)
    assert ints(exercise_module.shard(torch.arange(n), world)) == ints(expected)


@pytest.mark.exercise("redistribute")
def test_redistribute_matches_the_ranks(exercise_module):
    for (src, dst), (_, pieces) in RANKS_PRINTED.items():
        before = [torch.tensor(pieces[r][0]) for r in (0, 1)]
        got = exercise_module.redistribute(before, src[0], dst[0])
        assert ints(got) == [pieces[r][1] for r in (0, 1)], (src, dst)
        assert ints(before) == [pieces[r][0] for r in (0, 1)], (src, dst)  # inputs left alone
        fresh(got, before)


@pytest.mark.exercise("redistribute")
@pytest.mark.parametrize("world", [1, 3, 4])
def test_redistribute_round_trips(exercise_module, world):
    full = torch.arange(7)
    shards, _ = Shard(0)._split_tensor(full, world, with_padding=False)
    assert ints(exercise_module.redistribute(list(shards), "S", "R")) == [full.tolist()] * world
    assert ints(exercise_module.redistribute([full] * world, "R", "S")) == ints(shards)
    partials = [full * (r + 1) for r in range(world)]  # they sum to full * world(world+1)/2
    total = full * (world * (world + 1) // 2)
    assert ints(exercise_module.redistribute(partials, "P", "R")) == [total.tolist()] * world
    expected, _ = Shard(0)._split_tensor(total, world, with_padding=False)
    assert ints(exercise_module.redistribute(partials, "P", "S")) == ints(expected)
    for placement, parts in (("P", partials), ("S", list(shards)), ("R", [full.clone() for _ in range(world)])):
        got = exercise_module.redistribute(parts, placement, placement)
        assert ints(got) == ints(parts), placement
        fresh(got, parts)  # the same values, in tensors of their own


def _solutions():
    from scripts.pytest_course import import_file

    return import_file(Path(__file__).parent / "solutions.py")


def _wrong_reduce_scatter(parts):
    """Sums into rank 0's tensor in place: the right chunks, but rank 0's input is gone."""
    for p in parts[1:]:
        parts[0] += p
    return [c.clone() for c in parts[0].chunk(len(parts))]


def _wrong_all_reduce(parts):
    """The right sum, but one tensor shared by every rank: a write on one rank changes all."""
    total = torch.stack(parts).sum(0)
    return [total] * len(parts)


def _wrong_redistribute(parts, src, dst):
    """Right everywhere, except that src == dst hands back the input tensors themselves."""
    return list(parts) if src == dst else _solutions().redistribute(parts, src, dst)


def _fails(test, **answers):
    module = SimpleNamespace(**{**vars(_solutions()), **answers})
    try:
        test(module)
    except AssertionError:
        return True
    return False


@pytest.mark.parametrize("test, answers", [
    (test_reduce_scatter_simulated, {"reduce_scatter": _wrong_reduce_scatter}),
    (test_all_reduce_simulated, {"all_reduce": _wrong_all_reduce}),
    (lambda m: test_redistribute_round_trips(m, 3), {"redistribute": _wrong_redistribute}),
], ids=["reduce_scatter-in-place", "all_reduce-shared", "redistribute-same-tensors"])
def test_exercise_cases_catch_wrong_answers(test, answers):
    assert _fails(test, **answers)
    assert not _fails(test)  # and the same cases accept the solutions

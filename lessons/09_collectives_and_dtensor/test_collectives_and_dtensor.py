"""Tests of lesson 09: documented outputs, the ranks' values read from the narrative's two
launches, the placements figure, the exercises, and the worker on NCCL with 2 GPUs.

Every test here launches ranks or reads the narrative's launches: all are `multirank`."""

from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import Shard

from scripts.multirank import running

pytestmark = pytest.mark.multirank
WORKER = Path(__file__).parent / "worker.py"


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


def values(lines, label):
    """The value printed after `label ... ->` on one rank's lines."""
    (line,) = [x for x in lines if x.split(": ", 1)[1].startswith(label)]
    return line.split("-> ")[1].split("  ")[0]


def test_collectives_launch_succeeded(lesson):
    run = lesson.ns["run"]
    assert run.code == 0 and sorted(run.out) == [0, 1], run
    for rank in (0, 1):
        assert "Warning" not in run.err[rank], run.err[rank]  # no FutureWarning from old names
        assert "Traceback" not in run.err[rank], run.err[rank]


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


def test_barrier_makes_the_early_rank_wait(lesson):
    got = lesson.ns["section"](lesson.ns["run"], "barrier")
    waited = {r: float(lines[0].split("waited ")[1].split(" s")[0]) for r, lines in got.items()}
    assert waited[0] >= 0.4 and waited[1] < waited[0], waited  # rank 1 sleeps 0.5 s first


def test_redistributions(lesson):
    steps = lesson.ns["redistributions"](lesson.ns["run"])
    found = {(src, dst): (ran, pieces) for src, dst, ran, pieces in steps}
    assert found[("S(0)", "R")] == ("all_gather_into_tensor x1", {0: ([0, 1], [0, 1, 2, 3]), 1: ([2, 3], [0, 1, 2, 3])})
    assert found[("P(sum)", "R")] == ("all_reduce x1", {0: ([1, 2], [11, 22]), 1: ([10, 20], [11, 22])})
    assert found[("P(sum)", "S(0)")] == ("reduce_scatter_tensor x1", {0: ([1, 2], [11]), 1: ([10, 20], [22])})
    assert found[("R", "S(0)")] == ("none", {0: ([0, 1, 2, 3], [0, 1]), 1: ([0, 1, 2, 3], [2, 3])})


def test_sharded_matmul_is_partial_and_exact(lesson):
    lines = lesson.ns["section"](lesson.ns["run"], "matmul")[0]
    assert "rank 0: a @ b placement P(sum), ran: none" in lines
    assert "rank 0: full_tensor() [[42.0, 48.0, 54.0], [114.0, 136.0, 158.0]], ran: all_reduce x1" in lines
    assert "rank 0: equal to the single-process a @ b: True" in lines
    assert "rank 0: random fp32: equal False, allclose True" in lines


def test_mismatch_fails_fast(lesson):
    bad, section = lesson.ns["bad"], lesson.ns["section"]
    assert bad.code == 1, bad  # an error, not a hang, and not a success
    assert bad.seconds < 60 / 2, bad  # well inside launch()'s 60 s timeout
    timeout = section(bad, "timeout")
    for rank, op in ((0, "all_reduce"), (1, "all_gather")):
        line = timeout[rank][0]
        assert line.startswith(f"rank {rank}: {op} raised RuntimeError after "), line
        assert 2.5 <= float(line.split("after ")[1].split(" s")[0]) < 10  # the group's 3 s
    detail = section(bad, "detail")
    assert detail[0][1] == "rank 0: Op type: ALLREDUCEvs ALLGATHER"
    assert detail[1][1] == "rank 1: Op type: ALLGATHERvs ALLREDUCE"
    for rank in (0, 1):
        assert float(detail[rank][0].split("after ")[1].split(" s")[0]) < 1.0  # no timeout
    monitored = section(bad, "monitored_barrier")[0][0]
    assert monitored.endswith("Rank 1 failed to pass monitoredBarrier in 1000 ms"), monitored


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


def test_launcher_leaves_no_rank_behind(lesson):
    """The narrative's two launches are over: no worker process of theirs may still run."""
    assert running(WORKER) == []


@pytest.mark.multigpu
def test_worker_on_nccl():
    from scripts.multirank import launch

    result = launch(WORKER, nproc=2, timeout=120, args=["collectives", "--backend", "nccl"])
    assert result.ok, result.describe()
    out = {r: rank.stdout for r, rank in result.ranks.items()}
    assert "rank 0: backend nccl, default group ranks [0, 1]" in out[0]
    assert "rank 0: all_reduce            -> [11, 22]" in out[0]
    assert "rank 1: reduce_scatter_single -> [22]" in out[1]
    assert "rank 0: equal to the single-process a @ b: True" in out[0]


# ----------------------------------------------------------------------------------------
# Exercises: the simulation against the real ranks' output and DTensor's sharding rule


def ints(parts):
    return [p.tolist() for p in parts]


@pytest.mark.exercise("all_reduce")
def test_all_reduce_simulated(exercise_module):
    parts = [torch.tensor([1, 2]), torch.tensor([10, 20])]
    assert ints(exercise_module.all_reduce(parts)) == [[11, 22], [11, 22]]
    assert ints(parts) == [[1, 2], [10, 20]]  # the inputs are left alone
    gen = torch.Generator().manual_seed(0)
    for world in (1, 3, 4):
        parts = [torch.randint(-9, 9, (5,), generator=gen) for _ in range(world)]
        total = [sum(column) for column in zip(*ints(parts))]
        assert ints(exercise_module.all_reduce(parts)) == [total] * world


@pytest.mark.exercise("reduce_scatter")
def test_reduce_scatter_simulated(exercise_module):
    parts = [torch.tensor([1, 2]), torch.tensor([10, 20])]
    assert ints(exercise_module.reduce_scatter(parts)) == [[11], [22]]  # as the ranks printed
    parts = [torch.arange(6) * (r + 1) for r in range(3)]  # sum: 6 * arange(6)
    assert ints(exercise_module.reduce_scatter(parts)) == [[0, 6], [12, 18], [24, 30]]


@pytest.mark.exercise("shard")
@pytest.mark.parametrize("n, world", [(4, 2), (5, 2), (5, 4), (7, 3), (1, 3), (0, 2), (9, 4), (3, 1)])
def test_shard_matches_dtensor(exercise_module, n, world):
    # Shard._split_tensor is private: DTensor's own rule, used here only as the oracle
    expected, _ = Shard(0)._split_tensor(torch.arange(n), world, with_padding=False)
    assert ints(exercise_module.shard(torch.arange(n), world)) == ints(expected)


@pytest.mark.exercise("redistribute")
def test_redistribute_matches_the_ranks(lesson, exercise_module):
    for src, dst, _, pieces in lesson.ns["redistributions"](lesson.ns["run"]):
        before = [torch.tensor(pieces[r][0]) for r in (0, 1)]
        got = exercise_module.redistribute(before, src[0], dst[0])
        assert ints(got) == [pieces[r][1] for r in (0, 1)], (src, dst)


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
    assert ints(exercise_module.redistribute(partials, "P", "P")) == ints(partials)

"""Tests of lesson 11a: documented outputs, the ranks' values read from the narrative's launch
(DDP, shards, the step, placements and uneven shards, lazy init and the hooks), the exercise.
(That no rank outlives the lesson is checked by the `lesson` fixture.)

Every test here reads the narrative's launch: all are `multirank`."""

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard

from scripts.multirank import section
from scripts.pytest_course import import_file

pytestmark = pytest.mark.multirank
HERE = Path(__file__).parent
WORKER = HERE / "worker.py"
N_PARAMS = 29632  # elements of the model
N_PARAMS_TENSORS = 29  # parameter tensors of the model


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


def lines(lesson, name, rank=0):
    return section(lesson.ns["run"], name).get(rank, [])


def number(line, after):
    return float(line.split(after)[1].split()[0].rstrip(","))


def the(found, start):
    (line,) = [x for x in found if x.startswith(start)]
    return line


def test_launch_succeeded(lesson):
    run = lesson.ns["run"]
    assert run.ok and sorted(run.out) == [0, 1], run.describe()
    for rank in (0, 1):
        assert "Traceback" not in run.err[rank] and "Warning" not in run.err[rank], run.err[rank]


def test_ddp_equals_one_process(lesson):
    got = lines(lesson, "ddp")
    assert got[0] == f"rank 0: holds all {N_PARAMS} parameters, grads all-reduced (averaged) in backward"
    assert number(the(got, "rank 0: one AdamW step"), "max gap ") < 1e-12
    assert number(the(got, "rank 0: no_sync"), "max grad gap ") < 1e-15


def test_parameters_are_shards(lesson):
    for rank in (0, 1):
        got = lines(lesson, "placements", rank)
        assert f"rank {rank}: head.weight global [64, 32], local [32, 32]" in got
        assert f"rank {rank}: holds {N_PARAMS // 2} of {N_PARAMS} parameter elements (0.500)" in got
    got = lines(lesson, "placements")
    assert got[0] == "rank 0: parameter types and placements at rest: [('DTensor', '(Shard(dim=0),)')]"
    assert f"rank 0: sum over ranks {N_PARAMS} = total {N_PARAMS}" in got


def test_step_equals_one_process(lesson):
    """Gradients agree to rounding in both dtypes; one AdamW step amplifies that rounding to
    hundreds of eps of the dtype in both (the prose's claim), float64 still below 1e-12."""
    got = lines(lesson, "step")
    for name, grads, step in (("float64", 1e-15, 1e-12), ("float32", 1e-6, 1e-3)):
        eps = torch.finfo(getattr(torch, name)).eps
        assert number(the(got, f"rank 0: {name}: grads vs one process"), "max gap ") < grads
        line = the(got, f"rank 0: {name}: one AdamW step")
        gap = number(line, "max gap ")
        assert gap < step, line
        assert line.endswith(f" eps of {name} ({eps:.1e})") and number(line, "True, ") > 100, line
    assert "rank 0: optimizer state is sharded too: exp_avg DTensor (Shard(dim=0),), local [32, 32]" in got


def test_step_check_alone_misses_summed_gradients(lesson):
    """The lesson's one-process cell: doubled float32 gradients (summed over 2 ranks, not
    averaged) are far from the right ones, but one AdamW step lands below 2e-3 of the right
    step, under the bound 0.1716 lr that no gradient can exceed (max of 2x/(2x+e) - x/(x+e))."""
    ns = lesson.ns
    lr = ns["opt"].param_groups[0]["lr"]
    x = torch.logspace(-12, -4, 100001, dtype=torch.float64)
    bound = (2 * x / (2 * x + 1e-8) - x / (x + 1e-8)).max().item()
    assert abs(bound - 0.1716) < 1e-4 and lr == 1e-2
    step = ns["max_gap"](ns["summed"], ns["right"])
    assert step < bound * lr * (1 + 1e-3) and step < 2e-3
    assert ns["grad_gap"](ns["summed"], ns["right"]) > 1e-3


def test_float64_reduce_scatter_divides_first():
    """Read the source's last stop: fp32 takes ReduceOp.AVG; float64 divides by 2 before a
    SUM on 2 ranks (no division after), from the installed _get_gradient_divide_factors."""
    from torch.distributed import ReduceOp
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors

    class Two:  # the factors read only the group's size
        def size(self):
            return 2
    assert _get_gradient_divide_factors(Two(), None, torch.float32) == (None, None, ReduceOp.AVG, ReduceOp.AVG)
    pre, post, rs_op, _ = _get_gradient_divide_factors(Two(), None, torch.float64)
    assert (pre, post, rs_op) == (2, 1.0, ReduceOp.SUM)


def test_hooks_live_on_call(lesson):
    got = lines(lesson, "hooks")
    assert "got mixed torch.Tensor and DTensor" in the(got, "rank 0: model.forward(x) on a fresh model: RuntimeError")
    never_called = the(got, "rank 0: unshard() + forward() on a never-called")
    assert never_called.endswith("root DTensor params with a grad 0 of 5")
    assert number(the(got, "rank 0: trap: the blocks' grads"), "max gap ") < 1e-15
    for rank in (0, 1):  # the root's grads stayed on the gathered copy, never averaged
        trap = the(lines(lesson, "hooks", rank), f"rank {rank}: trap: head.weight")
        assert trap.endswith("head.weight is now a Parameter, its grad equal to this rank's own half-batch grad: True")
    for start in ("rank 0: unshard() + forward() after", "rank 0: model(x) through __call__"):
        line = the(got, start)
        assert "5 of 5" in line and number(line, "max gap ") < 1e-15
    enc = the(got, "rank 0: register_fsdp_forward_method")
    assert enc.endswith("encode(x) -> Tensor [4, 8, 32], equal to one process: True"), enc


def test_shard_placement_fn_shards_weights_by_columns(lesson):
    for rank in (0, 1):
        got = lines(lesson, "placement fn", rank)
        assert f"rank {rank}: head.weight: global [64, 32] S(1), local [64, 16]" in got
        assert f"rank {rank}: head.bias: global [64] S(0), local [32]" in got
        assert f"rank {rank}: embed.weight: global [64, 32] S(1), local [64, 16]" in got
    found = [x for x in lines(lesson, "placement fn") if "one AdamW step" in x]
    assert len(found) == 1 and number(found[0], "max gap ") < 1e-12 and found[0].endswith("True")


def test_ddp_knobs(lesson):
    got = lines(lesson, "ddp knobs")
    assert lines(lesson, "ddp knobs", 1) == []  # the same on both ranks: printed by rank 0
    assert the(got, "rank 0: unused layer, DDP(defaults): RuntimeError: Expected to have finished reduction")
    for knob in ("find_unused_parameters=True", "static_graph=True"):
        assert f"rank 0: unused layer, DDP({knob}): 2 backward passes ran, spare.weight.grad None" in got
    # what find_unused_parameters / static_graph cost: counts, not times (robust under load)
    counts = {knob: the(got, f"rank 0: all-reduces in iterations 1, 2, 3, DDP({knob})")
              for knob in ("defaults, every parameter used", "find_unused_parameters=True", "static_graph=True")}
    spare = 4 * (32 * 32 + 32)  # the unused nn.Linear(32, 32), fp32 bytes
    assert counts["defaults, every parameter used"].endswith("[1, 1, 1]; reducer's unused_parameter_size 0 bytes")
    assert counts["find_unused_parameters=True"].endswith(f"[2, 2, 2]; reducer's unused_parameter_size {spare} bytes")
    assert counts["static_graph=True"].endswith(f"[2, 1, 1]; reducer's unused_parameter_size {spare} bytes")
    walk = the(got, "rank 0: find_unused_parameters=True: the graph walked")
    worker = import_file(WORKER)
    logits = worker.make_model(torch.float32, torch.device("cpu"))(torch.zeros(4, 8, dtype=torch.long))
    assert int(number(walk, "each forward has ")) == worker.graph_nodes(logits), walk
    seen, todo = set(), [logits.grad_fn]  # the walk reaches every parameter's AccumulateGrad
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [n for n, _ in node.next_functions]
    assert sum(type(n).__name__ == "AccumulateGrad" for n in seen) == N_PARAMS_TENSORS
    hook = the(got, "rank 0: fp16_compress_hook:")
    assert f"bytes all-reduced {2 * N_PARAMS} vs {4 * N_PARAMS};" in hook
    assert hook.endswith("above 1e-6: True, below 1e-3: True"), hook


def test_uneven_shards(lesson):
    """Shard(0) splits 97 rows as torch.chunk does; Shard(1) on 33 columns over 2 ranks raises."""
    got = lines(lesson, "uneven")
    assert lines(lesson, "uneven", 1) == []
    expected = [len(c) for c in torch.zeros(97).chunk(2)]
    assert expected == [49, 48] and f"rank 0: Shard(0) of a [97, 33] weight: rows per rank {expected}" in got
    assert ("rank 0: Shard(1) of a [97, 33] weight: NotImplementedError: FSDP does not support uneven "
            "sharding on dim 1: torch.Size([97, 33])") in got
    assert [len(c) for c in torch.zeros(97).chunk(3)] == [33, 33, 31]  # the prose's 3-rank split


def test_by_columns_falls_back_where_columns_do_not_divide(monkeypatch):
    """Exercise A runs main on 3 ranks: by_columns must then pick Shard(0) for 32 columns."""
    worker = import_file(WORKER)
    weight = torch.zeros(64, 32)
    for world, placement in ((2, "S(1)"), (3, "None"), (4, "S(1)")):
        monkeypatch.setattr(worker.dist, "get_world_size", lambda world=world: world)  # undone after
        assert str(worker.by_columns(weight)) == placement, world
    assert worker.by_columns(torch.zeros(64)) is None


def test_lazy_init_makes_the_root_at_the_first_call(lesson):
    assert lines(lesson, "lazy init") == [
        "rank 0: after fully_shard, _is_root of model, blocks.0, blocks.1: [None, None, None]",
        "rank 0: after model.unshard(): [None, None, None]",
        "rank 0: after the first model(x): [True, False, False]",
    ]


def model_shapes():
    worker = import_file(WORKER)  # a unique module name; sys.path untouched
    return [tuple(p.shape) for p in worker.Tiny().parameters()]


@pytest.mark.exercise("local_numel")
def test_local_numel_matches_the_ranks(lesson, exercise_module):
    shapes = model_shapes()
    for rank in (0, 1):
        line = the(lines(lesson, "placements", rank), f"rank {rank}: holds ")
        assert exercise_module.local_numel(shapes, 2, rank) == int(number(line, "holds "))


UNEVEN_CASES = [((5, 3), 2), ((7,), 3), ((3, 2, 2), 4), ((9, 1), 4), ((1,), 2), ((97, 33), 3), ((5,), 4)]


def _local_numel_case(answer, shape, world):
    pieces = torch.zeros(shape).chunk(world)  # torch.chunk: DTensor's Shard(0) split
    expected = [p.numel() for p in pieces] + [0] * (world - len(pieces))
    return [answer([shape], world, r) for r in range(world)] == expected


@pytest.mark.exercise("local_numel")
@pytest.mark.parametrize("shape, world", UNEVEN_CASES)
def test_local_numel_uneven(exercise_module, shape, world):
    assert _local_numel_case(exercise_module.local_numel, shape, world)


def _no_clamp(shapes, world, rank):  # ceil pieces, but a rank past the end goes negative
    size = lambda rows: -(-rows // world)  # noqa: E731
    return sum(min(size(s[0]), s[0] - rank * size(s[0])) * math.prod(s[1:]) for s in shapes)


def _floor_even(shapes, world, rank):  # every rank an equal floor share of the elements
    return sum(math.prod(s) // world for s in shapes)


def _last_takes_remainder(shapes, world, rank):  # floor pieces of rows, the last rank the rest
    rows = lambda n: n // world if rank < world - 1 else n - n // world * (world - 1)  # noqa: E731
    return sum(rows(s[0]) * math.prod(s[1:]) for s in shapes)


@pytest.mark.parametrize("wrong", [_no_clamp, _floor_even, _last_takes_remainder],
                         ids=["no max(0, ...)", "even floor split", "last rank takes the remainder"])
def test_exercise_cases_catch_wrong_answers(wrong):
    """Plausible wrong answers each fail one of the exercise's cases; all three still give
    both ranks' 14,816 of this model on 2 ranks, so only the uneven cases tell them apart."""
    shapes = model_shapes()
    assert all(wrong(shapes, 2, r) == N_PARAMS // 2 for r in (0, 1))
    assert not all(_local_numel_case(wrong, shape, world) for shape, world in UNEVEN_CASES)


def test_solution_passes_every_case():
    solution = import_file(HERE / "solutions.py").local_numel
    assert all(_local_numel_case(solution, shape, world) for shape, world in UNEVEN_CASES)


@pytest.mark.parametrize("rank, rows", [(0, 33), (1, 33), (2, 31)])
def test_uneven_shards_on_three_ranks(rank, rows):
    """The prose's 3-rank claims (Exercise A, Mastery check 2), shapes only: each rank of a
    fake group of 3 (one process plays it) holds torch.chunk's rows of a [97, 33] weight;
    Shard(1) of a [96, 32] weight raises, since 32 columns do not divide by 3."""
    dist.init_process_group("fake", rank=rank, world_size=3)
    try:
        mesh = init_device_mesh("cpu", (3,))
        assert fully_shard(nn.Linear(33, 97), mesh=mesh).weight.to_local().shape[0] == rows
        with pytest.raises(NotImplementedError, match=r"uneven sharding on dim 1: torch.Size\(\[96, 32\]\)"):
            fully_shard(nn.Linear(32, 96), mesh=mesh, shard_placement_fn=lambda p: Shard(1) if p.ndim == 2 else None)
    finally:
        dist.destroy_process_group()

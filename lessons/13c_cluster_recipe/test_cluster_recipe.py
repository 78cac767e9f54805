"""Lesson 13c: torchtitan's recipe on a fake 8-rank world, and loss_parallel.

Beyond the Output blocks (every printed placement, shape, collective and byte count is
compared exactly there), these tests check that the lesson's evidence could have come out
otherwise: the "still gathered" test flips on a unit that reshards, the collectives of the
loss are measured again at another vocabulary size (the all-reduces do not grow with V, the
all-gather does), the by-hand reductions are exact for uneven shards too, and the exercise's
checks reject three plausible wrong plans. Each test that needs a process group makes its own
fake 2-rank group and destroys it (the lesson destroys its own 8-rank one in its last cell).
"""

import contextlib
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.testing._internal.distributed.fake_pg import FakeStore

from scripts.pytest_course import import_file


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


@contextlib.contextmanager
def fake_world(size, shape, names):
    assert not dist.is_initialized(), "the lesson must destroy its process group"
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
    try:
        yield init_device_mesh("cpu", shape, mesh_dim_names=names)
    finally:
        dist.destroy_process_group()


def test_the_lesson_ends_its_process_group(lesson):
    assert not dist.is_initialized()
    assert lesson.ns["ones"].tolist() == [1.0, 1.0]  # a real sum over 8 ranks would be 8


def test_only_the_unit_that_keeps_its_parameters_stays_gathered(lesson):
    """With reshard_after_forward=True on [norm, lm_head] too, the lesson's check says False:
    the printed True comes from the unit's setting, not from the check itself. The world is
    the lesson's mesh again: DTensor caches sharding decisions by mesh, and a mesh of a new
    world that compares equal to the lesson's reuses the cached decisions, group names
    included (2.13.0); the same mesh built the same way gets the same group names."""
    ns = lesson.ns
    for keep in (False, True):
        with fake_world(8, (1, 2, 2, 2), ("pp", "dp_replicate", "fsdp", "tp")) as mesh:
            torch.manual_seed(0)
            model = ns["apply_tp"](ns["Decoder"](), mesh["tp"])
            ns["apply_ac"](model)
            from torch.distributed.fsdp import fully_shard
            dp = mesh["dp_replicate", "fsdp"]
            fully_shard(model.tok_embeddings, mesh=dp)
            fully_shard([model.norm, model.lm_head], mesh=dp, reshard_after_forward=not keep)
            for block in model.layers.values():
                fully_shard(block, mesh=dp)
            fully_shard(model, mesh=dp)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "FSDP2-wrapped module", UserWarning)  # shown by the lesson
                model(torch.zeros(2, 4, dtype=torch.long))
            assert (model.lm_head.weight.device_mesh.mesh_dim_names == ("tp",)) is keep
            assert model.tok_embeddings.weight.device_mesh.mesh_dim_names == ("dp_replicate", "fsdp", "tp")


def test_why_three_blocks_compile_two_graphs(lesson):
    """The lesson's reason for 2 graphs: the embedding's TP output reaches block 0 as an
    AsyncCollectiveTensor, and a block returns a plain tensor to the next one."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    ns = lesson.ns
    with fake_world(8, (1, 2, 2, 2), ("pp", "dp_replicate", "fsdp", "tp")) as mesh:
        torch.manual_seed(0)
        model = ns["apply_tp"](ns["Decoder"](), mesh["tp"])
        h = model.tok_embeddings(torch.zeros(2, 4, dtype=torch.long))
        out = model.layers["0"](h)
        assert type(h) is AsyncCollectiveTensor and type(out) is torch.Tensor
        assert type(model.layers["1"](out)) is torch.Tensor
    assert ns["graphs"] == 2


def test_loss_parallel_all_reduces_do_not_grow_with_the_vocabulary(lesson):
    counts = {}
    for vocab in (64, 128):
        with fake_world(2, (2,), ("tp",)) as mesh:
            gen = torch.Generator().manual_seed(0)
            logits = distribute_tensor(torch.randn(64, vocab, generator=gen), mesh, [Shard(1)])
            labels = torch.randint(0, vocab, (64,), generator=gen)
            for parallel in (False, True):
                n, calls = lesson.ns["loss_collectives"](logits, labels, parallel)
                counts[vocab, parallel] = (n, [c[0] for c in calls], sum(c[3] for c in calls))
    assert counts[64, True] == counts[128, True] == (3, ["all_reduce"] * 3, 3 * 64 * 4)
    assert counts[64, False] == (1, ["all_gather_into_tensor"], 64 * 32 * 4)
    assert counts[128, False] == (1, ["all_gather_into_tensor"], 64 * 64 * 4)


def test_the_gathering_path_hands_in_v_over_3_tp_times_more(lesson):
    """The printed ratio is V/(3·tp) exactly (8,192 / 768 = 64 / 6), the formula agrees with the
    measured bytes, and Llama 3's 128,256 on tp 8 gives the 5,344 the prose quotes."""
    from fractions import Fraction

    ns = lesson.ns
    measured = ns["wire_bytes"]
    assert (measured[False], measured[True]) == (8192, 768)
    assert Fraction(measured[False], measured[True]) == Fraction(ns["V"], 3 * ns["tp"])
    assert ns["bytes_per_rank"](64, ns["V"], ns["tp"]) == (8192, 768)
    assert Fraction(ns["LLAMA3_VOCAB"], 3 * 8) == 5344


def test_the_transfer_question_is_answered_by_the_formula(lesson):
    """Mastery check 5 (V = 128,256, tp = 4): measured on a fake tp group of 4, the bytes are the
    formula's, and the answer's numbers are the formula's."""
    import pathlib

    ns = lesson.ns
    vocab, tp = ns["LLAMA3_VOCAB"], 4
    with fake_world(tp, (tp,), ("tp",)) as mesh:
        gen = torch.Generator().manual_seed(0)
        logits = distribute_tensor(torch.randn(64, vocab, generator=gen), mesh, [Shard(1)])
        labels = torch.randint(0, vocab, (64,), generator=gen)
        got = tuple(sum(c[3] for c in ns["loss_collectives"](logits, labels, parallel)[1])
                    for parallel in (False, True))
    gather, parallel = ns["bytes_per_rank"](64, vocab, tp)
    assert got == (gather, parallel) == (8_208_384, 768)
    text = (pathlib.Path(__file__).parent / "cluster_recipe.py").read_text()
    answer = text[text.index("5. **Transfer.**"):text.index("## Exercises")]
    for number in (f"{gather:,}", f"{parallel:,}", f"{gather // parallel:,}", f"{vocab // tp:,}"):
        assert number in answer, number


def test_local_tensor_mode_sums_for_real():
    """The prose's claim about PyTorch's LocalTensorMode: over 8 simulated ranks in one process,
    the all-reduce of ones gives 8 (the fake group alone gives 1)."""
    from torch.distributed._local_tensor import LocalTensorMode

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        with LocalTensorMode(8):
            ones = torch.ones(2)
            dist.all_reduce(ones)
            per_rank = [ones._local_tensors[r].tolist() for r in range(8)]
    finally:
        dist.destroy_process_group()
    assert per_rank == [[8.0, 8.0]] * 8


@pytest.mark.parametrize("cuts", [(32,), (32, 32), (10, 30, 24), (1, 63)])
def test_the_three_reductions_are_the_cross_entropy(lesson, cuts):
    gen = torch.Generator().manual_seed(3)
    full = 4 * torch.randn(64, 64, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 64, (64,), generator=gen)
    labels[:4] = torch.tensor([0, 63, 9, 10])  # the edges of the shards
    got = lesson.ns["sharded_cross_entropy"](full.split(list(cuts) if sum(cuts) == 64 else 32, dim=1), labels)
    assert abs(got - F.cross_entropy(full, labels)).item() < 1e-12


# The exercise ---------------------------------------------------------------------------

WEIGHTS = {
    "self_attn.q_proj.weight": (Shard(0),), "self_attn.k_proj.weight": (Shard(0),),
    "self_attn.v_proj.weight": (Shard(0),), "self_attn.o_proj.weight": (Shard(1),),
    "mlp.gate_proj.weight": (Shard(0),), "mlp.up_proj.weight": (Shard(0),),
    "mlp.down_proj.weight": (Shard(1),),
    "input_layernorm.weight": (Replicate(),), "post_attention_layernorm.weight": (Replicate(),),
}


def plan_problems(plan):
    """What is wrong with a plan for HFBlock on a fake tp mesh of 2: [] when it is right."""
    ex = import_file(__import__("pathlib").Path(__file__).parent / "hf_block.py")
    problems = []
    with fake_world(2, (2,), ("tp",)) as mesh:
        torch.manual_seed(0)
        block = ex.HFBlock()
        parallelize_module(block, mesh, plan)
        block.self_attn.num_heads = ex.HEADS // 2
        for name, placements in WEIGHTS.items():
            p = block.get_parameter(name)
            got = p.placements if isinstance(p, DTensor) else "a plain tensor"
            if got != placements:
                problems.append(f"{name}: {got}, expected {placements}")
        x = torch.randn(2, 4, ex.D)  # this rank's 4 of 8 tokens, a plain tensor as between blocks
        with CommDebugMode() as comm:
            try:
                out = block(x)
            except Exception as error:  # noqa: BLE001 - any failure is a wrong plan
                return [*problems, f"forward failed: {type(error).__name__}: {str(error)[:200]}"]
        if type(out) is not torch.Tensor or tuple(out.shape) != (2, 4, ex.D):
            problems.append(f"output {type(out).__name__} {tuple(out.shape)}, expected a plain (2, 4, 32) shard")
        counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
        if counts != {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}:
            problems.append(f"forward collectives {counts}, expected 2 all-gathers and 2 reduce-scatters")
    return problems


@pytest.mark.exercise("hf_block_plan")
def test_hf_block_plan(exercise_module):
    problems = plan_problems(exercise_module.hf_block_plan())
    assert not problems, "\n".join(problems)


def test_the_exercise_rejects_plausible_wrong_plans():
    solutions = import_file(__import__("pathlib").Path(__file__).parent / "solutions.py")
    right = solutions.hf_block_plan()
    assert plan_problems(right) == []
    wrong = {
        "o_proj colwise like q/k/v": {**right, "self_attn.o_proj": ColwiseParallel()},
        "rowwise projections all-reduce": {**right, "self_attn.o_proj": RowwiseParallel(),
                                           "mlp.down_proj": RowwiseParallel()},
        "no sequence gather at the inputs": {k: v for k, v in right.items() if k not in ("self_attn", "mlp")},
        "norms left out": {k: v for k, v in right.items() if "layernorm" not in k},
    }
    for why, plan in wrong.items():
        assert plan_problems(plan), f"the checks accept a wrong plan: {why}"

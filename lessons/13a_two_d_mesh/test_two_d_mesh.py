"""Tests of lesson 13a: documented outputs; the 4 ranks' values read from the narrative's one
launch (one torchrun agent): the 2-D mesh and its shards, HSDP, the bytes per step of six
strategies against formulas computed here, and the bytes leaving each node under the ring
model (ranks 0-1 and 2-3 counted as two nodes); the figures; the exercises (in process); the
2-D step on NCCL with 4 GPUs. (That no rank outlives the lesson is checked by the `lesson`
fixture.)

The lesson tests read the narrative's launch (`multirank`); the exercise tests run in process."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts.multirank import launch
from scripts.pytest_course import import_file

HERE = Path(__file__).parent
WORKER = HERE / "worker.py"
SOLUTIONS = import_file(HERE / "solutions.py")
N = 4  # ranks
NODE = 2  # ranks per node in the ring model of section 3
MODEL = dict(import_file(HERE / "model.py").Model().named_parameters())  # {name: parameter}: sizes only
P = sum(p.numel() for p in MODEL.values())  # parameters of the model
ROOT = sum(p.numel() for n, p in MODEL.items() if not n.startswith("blocks."))  # FSDP's root unit
BLOCK = sum(p.numel() for n, p in MODEL.items() if n.startswith("blocks.0."))  # one block
N_PARAMS = len(MODEL)
# What the TP plan leaves whole on every tp rank: the norms and the rowwise layers' biases.
REPLICATED = {n for n in MODEL if ".norm" in n or n.startswith("norm.") or n.endswith("down.bias")}
NORMS = [n for n in REPLICATED if "norm" in n]  # their gradients are Partial under SP
H, V, S, BATCH, HEADS, BIG = 16, 32, 8, 8, 4, 32
E = 4  # bytes per float32 element (section 3)


def lines(lesson, name, rank=0):
    return lesson.ns["section"](lesson.ns["run"], name)[rank]


def text(lesson, name, rank=0):
    """The section's lines without the 'rank N: ' prefix."""
    return [line.split(": ", 1)[1] for line in lines(lesson, name, rank)]


def the(found, start):
    (line,) = [x for x in found if x.startswith(start)]
    return line


def gaps(found):
    """Every 'gap X, below B: True' on these lines: (X, B), each checked against its verdict."""
    out = []
    for line in found:
        for value, bound, verdict in re.findall(r"gap (\d\.\de[-+]\d+), below (\de[-+]\d+): (\w+)", line):
            assert verdict == str(float(value) < float(bound)), line
            out.append((float(value), float(bound)))
    return out


@pytest.mark.multirank
def test_script_outputs(lesson):
    lesson.check()


@pytest.mark.multirank
def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


@pytest.mark.multirank
def test_launch_succeeded(lesson):
    run = lesson.ns["run"]
    assert run.ok and sorted(run.out) == [0, 1, 2, 3], run.describe()
    for rank in range(N):
        assert "Traceback" not in run.err[rank], run.err[rank]
        assert not re.search(r"\w+Warning:", run.err[rank]), run.err[rank]  # Python warnings


# ---------------------------------------------------------------------------------- 1, 2


@pytest.mark.multirank
def test_mesh_groups(lesson):
    assert text(lesson, "mesh")[0] == "mesh [[0, 1], [2, 3]], dims ('dp', 'tp')"
    for rank in range(N):  # a tp group is a row of the grid, a dp group a column
        row, col = divmod(rank, 2)
        dp, tp = [col, col + 2], [2 * row, 2 * row + 1]
        assert (f"dp group {dp}, tp group {tp}; all_reduce of the ranks over dp {sum(dp)}, over tp {sum(tp)}"
                in text(lesson, "mesh", rank))


@pytest.mark.multirank
def test_placements(lesson):
    assert text(lesson, "placements")[0] == f"attention heads per rank {HEADS // 2} of {HEADS}"
    got = {line.split()[0]: line for line in text(lesson, "placements")[1:]}
    strided = "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
    for name in ("embed.weight", "blocks.0.attn.wq.weight", "blocks.0.mlp.up.weight", "blocks.0.mlp.up.bias",
                 "head.weight", "head.bias"):
        assert got[name].endswith(strided), got[name]
    for name in ("blocks.0.attn.wo.weight", "blocks.0.mlp.down.weight"):
        assert got[name].endswith("(Shard(dim=0), Shard(dim=1))"), got[name]
    for name in ("blocks.0.norm1.weight", "blocks.0.norm2.bias", "blocks.0.mlp.down.bias", "norm.weight"):
        assert got[name].endswith("(Shard(dim=0), Replicate())"), got[name]
    assert "[64, 16]  local [16, 16]" in got["blocks.0.mlp.up.weight"]  # a quarter of the rows
    assert "[16, 64]  local [8, 32]" in got["blocks.0.mlp.down.weight"]  # half the rows, half the columns
    assert text(lesson, "placements")[-1] == "blocks.1.*: the same placements as blocks.0.*: True"


def rows(first, size):
    return f"{first}-{first + size - 1}"


@pytest.mark.multirank
def test_shards_follow_tp_then_dp(lesson):
    for rank in range(N):
        dp, tp = divmod(rank, 2)
        got = text(lesson, "shards", rank)
        assert got[0] == f"dp {dp} tp {tp}: blocks.0.mlp.up.weight rows {rows(32 * tp + 16 * dp, 16)}"
        assert got[1] == (f"dp {dp} tp {tp}: after an all-gather over dp, rows {rows(32 * tp, 32)}; under plain "
                          f"(Shard(0), Shard(0)) it would hold rows {rows(32 * dp + 16 * tp, 16)}")
        hsdp = f"replicate {dp} shard {tp}: blocks.0.mlp.up.weight rows {rows(32 * tp, 32)}"
        assert hsdp in text(lesson, "hsdp", rank)


@pytest.mark.multirank
@pytest.mark.parametrize("name", ["step", "hsdp"])
def test_step_equals_one_process(lesson, name):
    got = text(lesson, name)
    loss = the(got, "loss: ")
    one, mean = re.fullmatch(r"loss: one process (\S+), mean over ranks (\S+)", loss).groups()
    assert one == mean, loss
    (found,) = gaps([the(got, "after one AdamW step")])
    assert found[0] < 1e-12 == found[1]


@pytest.mark.multirank
def test_hsdp_placements(lesson):
    assert text(lesson, "hsdp")[0] == "placements of every parameter: ['(Replicate(), Shard(dim=0))']"


# ---------------------------------------------------------------------------------- 3. bytes


def ring(nbytes, n, all_reduce=False):
    return nbytes * (n - 1) * (2 if all_reduce else 1) // n


def comm_rows(lesson):
    return lesson.ns["comm_rows"](lesson.ns["run"])


def payloads(lesson, name):
    """{payload kind: bytes} of one strategy's 'by payload' line."""
    line = the(text(lesson, "comms"), f"{name:6s} by payload: ")
    items = line.split("by payload: ")[1].split(";")[0].split(", ")
    return {k: int(v) for k, v in (item.rsplit(" ", 1) for item in items)}


@pytest.mark.multirank
def test_units(lesson):
    got = text(lesson, "comms")
    assert got[0] == (f"P = {P} parameters x 4 B = {P * E} B (float32); "
                      f"global batch {BATCH} x {S} tokens, H {H}, V {V}")
    assert got[1] == f"FSDP units: root (embed, norm, head) {ROOT} elements, each block {BLOCK}"
    assert ROOT + 2 * BLOCK == P


@pytest.mark.multirank
def test_formulas_are_the_textbooks(lesson):
    psi, a1 = P * E, BATCH * S * H * E  # parameter bytes; one B*S*H activation of the global batch
    expect = {"DDP": ring(psi, N, True), "FSDP2": 3 * ring(psi, N), "TP": 2 * 4 * ring(a1, N, True),
              "TP+SP": 2 * 4 * ring(a1, N, True), "2-D": 3 * ring(psi // 2, 2) + 2 * 4 * ring(a1 // 2, 2, True),
              "HSDP": 3 * ring(psi, 2) + ring(psi // 2, 2, True)}
    assert {k: v[1] for k, v in comm_rows(lesson).items()} == expect


@pytest.mark.multirank
def test_ddp_and_fsdp_bytes(lesson):
    got, rows = text(lesson, "comms"), comm_rows(lesson)
    assert "DDP    backward  1 all-reduce" in got
    assert rows["DDP"] == (ring(P * E, N, True),) * 3  # exact; every byte crosses the nodes
    assert "FSDP2  forward   3 all-gather" in got and "FSDP2  backward  2 all-gather, 3 reduce-scatter" in got
    assert rows["FSDP2"][1] - rows["FSDP2"][0] == ring(ROOT * E, N)  # the root is not gathered twice


@pytest.mark.multirank
def test_tp_bytes(lesson):
    got, rows = text(lesson, "comms"), comm_rows(lesson)
    a, logits = BATCH * S * H * E, BATCH * S * V * E
    assert "TP     blocks.0  forward 2 all_reduce; backward 2 all_reduce" in got  # the textbook's block
    assert "TP     embed     forward 1 all_reduce; backward none" in got
    assert "TP     head      forward 1 all_gather_into_tensor; backward 1 all_reduce" in got
    measured, formula, _ = rows["TP"]
    assert measured - formula == 2 * ring(a, N, True) + ring(logits, N)  # embed, head input, logits
    tp, sp = payloads(lesson, "TP"), payloads(lesson, "TP+SP")
    assert tp["activations"] == sp["activations"] == 10 * ring(a, N, True)  # the same bytes
    assert tp["logits"] == sp["logits"] == ring(logits, N)
    assert sp["small grads"] == 30 * ring(H * E, N, True)
    assert "TP+SP  blocks.0  forward 2 all_gather_into_tensor, 2 reduce_scatter_tensor; " \
           "backward 2 all_gather_into_tensor, 2 reduce_scatter_tensor" in got
    assert "TP+SP  optimizer 30 all-reduce" in got
    assert "TP     between the blocks each rank holds a Tensor [8, 8, 16]" in got
    assert "TP+SP  between the blocks each rank holds a Tensor [8, 2, 16]" in got  # a quarter: SP


@pytest.mark.multirank
def test_partial_gradients(lesson):
    got, n = text(lesson, "comms"), len(NORMS)
    assert n == 10  # 2 blocks x 2 norms + the final norm, a weight and a bias each
    # AdamW reads each Partial gradient three times: lerp_ (first moment), addcmul_(g, g) (second)
    assert (f"Partial gradients, TP+SP and AdamW: {n} after backward; all-reduces in the optimizer step "
            f"{3 * n}: addcmul_ {2 * n}, lerp_ {n}") in got
    assert (f"Partial gradients, TP+SP and SGD: {n} after backward; all-reduces in the optimizer step "
            f"{n}: add_ {n}") in got
    assert f", {n} all-reduce, " in the(got, "2-D    backward ")  # with FSDP: once each, in backward
    assert "2-D    optimizer none" in got


@pytest.mark.multirank
def test_two_d_and_hsdp_bytes(lesson):
    got, rows = text(lesson, "comms"), comm_rows(lesson)
    half = {n: p.numel() if n in REPLICATED else p.numel() // 2 for n, p in MODEL.items()}  # one tp rank's
    local = sum(half.values())
    root = sum(v for n, v in half.items() if not n.startswith("blocks."))
    assert f"2-D    a tp rank's parameters {local} elements (P/tp = {P // 2}), root unit {root}" in got
    two = payloads(lesson, "2-D")
    a, logits = BATCH // 2 * S * H * E, BATCH // 2 * S * V * E  # a dp group's 4 sequences
    assert two == {"activations": 20 * ring(a, 2), "logits": ring(logits, 2),
                   "params": 3 * ring(local * E, 2) - ring(root * E, 2), "small grads": 10 * ring(H * E, 2, True)}
    measured, _, across = rows["2-D"]
    # only dp crosses: both ranks of a node send their dp traffic to the other node
    assert measured == sum(two.values()) and across == NODE * two["params"]
    measured, formula, across = rows["HSDP"]
    assert formula - measured == ring(ROOT * E, 2)
    assert across == NODE * ring(P * E // 2, 2, True)  # only the replicate all-reduce crosses, from both ranks
    spanning = {name: int(re.search(r"in groups spanning both nodes (\d+);", the(got, f"{name:6s} by payload"))[1])
                for name in rows}
    assert spanning["HSDP"] == ring(P * E // 2, 2, True) and spanning["2-D"] == two["params"]
    for name in ("DDP", "FSDP2", "TP", "TP+SP"):  # one group of all 4 ranks: every byte is in it
        assert spanning[name] == rows[name][0]
    for name in ("DDP", "FSDP2", "TP", "TP+SP"):  # the ring 0-1-2-3-0: one crossing link out of each node
        assert rows[name][2] == rows[name][0]


@pytest.mark.multirank
def test_bytes_leaving_each_node(lesson):
    """The ring model's count: both nodes send the same, and HSDP sends 30,080 / 64,416 of
    flat FSDP2's bytes out of a node (the issue's 0.47), 2-D 44,032 / 64,416."""
    got = text(lesson, "comms")
    for name in ("DDP", "FSDP2", "TP", "TP+SP", "2-D", "HSDP"):
        line = the(got, f"{name:6s} by payload")
        first, second = map(int, re.search(r"leaving each node \[(\d+), (\d+)\]", line).groups())
        assert first == second, name
    rows = comm_rows(lesson)
    assert (rows["FSDP2"][2], rows["HSDP"][2], rows["2-D"][2]) == (64416, 30080, 44032)
    assert lesson.ns["rows"] == rows


def test_ring_model_in_the_worker_counts_crossing_links():
    """The worker's leaving_each_node, checked against the exercise's solution on the
    lesson's groups (the same ring model, written twice)."""
    sol, psi = SOLUTIONS, P * E
    assert sol.leaving_node("reduce-scatter", psi, [[0, 1, 2, 3]], NODE) == ring(psi, N)
    assert sol.leaving_node("all-reduce", psi // 2, [[0, 2], [1, 3]], NODE) == 2 * ring(psi // 2, 2, True)
    assert sol.leaving_node("all-gather", psi, [[0, 1], [2, 3]], NODE) == 0


def test_mastery_transfer_eight_ranks():
    """Mastery question 5: 8 ranks as 2 nodes of 4 on a (dp 2, tp 4) mesh. The answer's rows
    and crossing groups, from the exercises' solutions (checked above against the lesson's
    launch) and the row-major mesh of section 1."""
    mesh = [[0, 1, 2, 3], [4, 5, 6, 7]]  # (dp, tp) = (2, 4), row-major like init_device_mesh
    tp_groups, dp_groups = mesh, [list(column) for column in zip(*mesh)]
    dp, tp = next((d, t) for d, row in enumerate(mesh) for t, rank in enumerate(row) if rank == 5)
    assert (dp, tp) == (1, 1)
    assert SOLUTIONS.rows_held(64, 4, 2, tp, dp) == (24, 31)
    assert SOLUTIONS.rows_held(64, 4, 1, tp, 0) == (16, 31)  # what an all-gather over dp gives back
    assert dp_groups == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert SOLUTIONS.leaving_node("all-reduce", 4096, tp_groups, 4) == 0  # tp stays inside a node
    assert SOLUTIONS.leaving_node("all-gather", 4096, dp_groups, 4) == 4 * ring(4096, 2)  # all four ranks send
    answer = (HERE / "two_d_mesh.py").read_text()
    assert "rank 5 is dp 1, tp 1" in answer and "rows 24–31" in answer and "rows 16–31" in answer


def test_rowwise_embedding_masks_the_tokens_it_does_not_hold():
    """The Read-the-source stop on the rowwise embedding (section 1's ends), in process: a
    Shard(0) weight gives a _MaskPartial output; token ids outside this rank's rows are
    shifted to row 0 and masked, and the reduction zeroes their rows before the sum."""
    import torch
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._dtensor_spec import TensorMeta
    from torch.distributed.tensor._ops._embedding_ops import embedding_strategy
    from torch.distributed.tensor._ops._mask_buffer import MaskBuffer
    from torch.distributed.tensor.placement_types import _MaskPartial

    weight = TensorMeta(torch.Size([V, H]), (H, 1), torch.float32)
    ids = TensorMeta(torch.Size([BATCH, S]), (S, 1), torch.int64)
    rowwise = [s for s in embedding_strategy(torch.ops.aten.embedding.default, (weight, ids), {}) if s[1] == Shard(0)]
    ((output, _, _),) = rowwise
    assert isinstance(output, _MaskPartial)
    mask, local = _MaskPartial._mask_tensor(torch.tensor([[3, 16, 31]]), V // 2, V // 2)  # tp rank 1: rows 16-31
    assert mask.tolist() == [[True, False, False]] and local.tolist() == [[0, 0, 15]]
    looked_up, buffer = torch.ones(1, 3, H), MaskBuffer()
    buffer.materialize_mask(mask)
    buffer.apply_mask(looked_up)  # what _reduce_value does before the all-reduce
    assert looked_up.sum(-1).tolist() == [[0.0, H, H]]


# ---------------------------------------------------------------------------------- figures


@pytest.mark.multirank
def test_mesh_figure(lesson):
    ns = lesson.ns
    fig = ns["plot_mesh"](ns["run"])
    left, right = fig.get_axes()
    texts = sorted(t.get_text() for t in left.texts)
    assert texts == ["rank 0\nrows 0-15", "rank 1\nrows 32-47", "rank 2\nrows 16-31", "rank 3\nrows 48-63"]
    assert sorted(t.get_text() for t in right.texts) == [
        "rank 0\nrows 0-31", "rank 1\nrows 32-63", "rank 2\nrows 0-31", "rank 3\nrows 32-63"]
    for ax in (left, right):  # each rank's cell sits at its mesh coordinates
        for patch, label in zip(ax.patches, [t.get_text() for t in ax.texts]):
            row, col = divmod(int(label.split()[1]), 2)
            assert (patch.get_x(), patch.get_y()) == (col, 1 - row)
    assert (HERE / "mesh_shards.png").is_file()


@pytest.mark.multirank
def test_bytes_figure(lesson):
    ns = lesson.ns
    rows = comm_rows(lesson)
    fig = ns["plot_bytes"](rows)
    (ax,) = fig.get_axes()
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    names = ["DDP", "FSDP2", "TP", "TP+SP", "2-D", "HSDP"]
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    for i, label in enumerate(("counted, per rank", "formula, per rank", "leaving a node")):
        assert bars[label] == pytest.approx([rows[n][i] / 1024 for n in names])
    assert (HERE / "bytes_per_step.png").is_file()


# ---------------------------------------------------------------------------------- GPUs


@pytest.mark.multigpu(4)
def test_two_d_step_on_nccl(record_property):
    """Unverified on hardware: written on a machine without GPUs. Needs 4 CUDA devices."""
    run = launch(WORKER, ["twod", "--backend", "nccl"], nproc=4, timeout=300)  # section 1 only
    record_property("2-D step on NCCL, 4 ranks: launch wall time [s]", round(run.seconds, 1))
    assert run.ok, run.describe()
    out = run.out[0].splitlines()
    assert "rank 0: mesh [[0, 1], [2, 3]], dims ('dp', 'tp')" in out
    assert f"rank 0: attention heads per rank {HEADS // 2} of {HEADS}" in out
    (found,) = gaps([the(out, "rank 0: after one AdamW step")])
    record_property("2-D step on NCCL vs one process, float64: max parameter gap [abs]", found[0])
    assert found[0] < 1e-12


# ---------------------------------------------------------------------------------- exercises
# In process: the answers are compared with what the lesson's launch printed (its numbers are
# fixed by the model's sizes, so they are written here as the lesson's tests derive them).


@pytest.mark.exercise("ring_bytes")
def test_ring_bytes(exercise_module):
    f = exercise_module.ring_bytes
    assert f("all-reduce", P * E, N) == 45120  # DDP's one all-reduce, per rank
    assert f("all-gather", ROOT * E, N) == 3264  # the root's all-gather FSDP2 skips in backward
    assert f("reduce-scatter", 4096, 2) == 2048
    assert f("all-reduce", 4096, 2) == 4096  # twice a reduce-scatter's
    assert f("all-gather", 1000, 1) == 0  # one rank sends nothing
    assert all(isinstance(f(kind, 4000, 4), int) for kind in ("all-gather", "reduce-scatter", "all-reduce"))


@pytest.mark.exercise("leaving_node")
def test_leaving_node(exercise_module):
    f = exercise_module.leaving_node
    assert f("all-gather", 64416 * 4 // 3, [[0, 1, 2, 3]], 2) == 64416  # one of the ring's links leaves node 0
    assert f("all-reduce", P * E // 2, [[0, 2], [1, 3]], 2) == 30080  # HSDP's replicate: both ranks send
    assert f("all-reduce", 4096, [[0, 1], [2, 3]], 2) == 0  # tp groups inside a node
    assert f("all-reduce", 4096, [[2, 3], [0, 1]], 2) == 0
    assert f("all-gather", 4000, [[0, 1, 2, 3]], 1) == 3000  # one rank per node: rank 0's link crosses
    assert f("all-gather", 4000, [[0, 2, 1, 3]], 2) == 2 * 3000  # a ring in this order crosses on every link
    assert f("all-gather", 4000, [[2, 3, 0, 1]], 2) == 3000  # node 0's crossing link is 1 -> 2, the wrap-around


@pytest.mark.exercise("rows_held")
def test_rows_held(exercise_module):
    f = exercise_module.rows_held
    # what section 1 printed for blocks.0.mlp.up.weight [64, 16] on the (dp, tp) mesh [[0, 1], [2, 3]]
    assert [f(64, 2, 2, tp, dp) for dp, tp in ((0, 0), (0, 1), (1, 0), (1, 1))] == \
        [(0, 15), (32, 47), (16, 31), (48, 63)]
    assert f(32, 2, 2, 1, 1) == (24, 31)  # the embedding's 32 rows
    assert f(64, 4, 1, 3, 0) == (48, 63) and f(64, 1, 4, 0, 3) == (48, 63)  # one dimension alone
    assert f(48, 2, 3, 1, 2) == (40, 47)


def _ring(kind, nbytes, n):
    return nbytes * (n - 1) * (2 if kind == "all-reduce" else 1) // n


def _leaving(kind, nbytes, groups, ranks_per_node, links=lambda group: zip(group, group[1:] + group[:1]),
             ring=_ring, sender=lambda rank, ranks_per_node: rank // ranks_per_node == 0):
    return sum(ring(kind, nbytes, len(group)) for group in groups for rank, after in links(group)
               if sender(rank, ranks_per_node) and after // ranks_per_node != rank // ranks_per_node)


def _rows(rows, tp, dp, tp_rank, dp_rank, index=lambda tp, dp, tp_rank, dp_rank: tp_rank * dp + dp_rank, last=-1):
    piece = rows // (tp * dp)
    first = index(tp, dp, tp_rank, dp_rank) * piece
    return first, first + piece + last


WRONG_ANSWERS = {  # plausible wrong answers, each of which one exercise test must reject
    "ring_bytes returns a float": ("ring_bytes", lambda k, b, n: b * (n - 1) * (2 if k == "all-reduce" else 1) / n),
    "an all-reduce sends once": ("ring_bytes", lambda k, b, n: b * (n - 1) // n),
    "n for n - 1": ("ring_bytes", lambda k, b, n: b * (2 if k == "all-reduce" else 1)),
    "no wrap-around link": ("leaving_node", lambda k, b, g, r: _leaving(k, b, g, r, links=lambda g: zip(g, g[1:]))),
    "every rank of node 0 in a spanning group sends out": ("leaving_node", lambda k, b, g, r: sum(
        _ring(k, b, len(x)) for x in g if len({y // r for y in x}) > 1 for y in x if y < r)),
    "both nodes' crossing links": ("leaving_node", lambda k, b, g, r: _leaving(k, b, g, r, sender=lambda *_: True)),
    "rows under plain (Shard(0), Shard(0))": ("rows_held", lambda *a: _rows(
        *a, index=lambda tp, dp, tp_rank, dp_rank: dp_rank * tp + tp_rank)),
    "last row one too far": ("rows_held", lambda *a: _rows(*a, last=0)),
}
EXERCISE_TESTS = {"ring_bytes": test_ring_bytes, "leaving_node": test_leaving_node, "rows_held": test_rows_held}


def test_wrong_answer_helpers_are_right_by_default():
    """The helpers the wrong answers are built from are right with their defaults."""
    right = SimpleNamespace(ring_bytes=_ring, leaving_node=_leaving, rows_held=_rows)
    for check in EXERCISE_TESTS.values():
        check(right)


@pytest.mark.parametrize("wrong", list(WRONG_ANSWERS))
def test_exercise_tests_catch_wrong_answers(wrong):
    """Each wrong answer, put in place of the solution, fails its exercise's test."""
    name, answer = WRONG_ANSWERS[wrong]
    module = SimpleNamespace(**{n: getattr(SOLUTIONS, n) for n in EXERCISE_TESTS} | {name: answer})
    with pytest.raises(AssertionError):
        EXERCISE_TESTS[name](module)

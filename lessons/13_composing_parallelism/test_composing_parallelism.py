"""Tests of lesson 13: documented outputs; the 4 ranks' values read from the narrative's one
launch (2 torchrun agents): the 2-D mesh and its shards, HSDP, the bytes per step of six
strategies against formulas computed here, overlap order, activation checkpointing, meta
init, clipping, the node mapping; the figures; compile inside DDP and FSDP2 (section 7, on
a one-rank gloo group in the lesson's own process); the graded exercises on 2 ranks against
DDP; the 2-D step on NCCL with 4 GPUs. (That no rank outlives the lesson is checked by the
`lesson` fixture.)

Every test here launches ranks or reads the narrative's launch: all are `multirank`."""

import re
from pathlib import Path

import pytest
import torch
import torch._dynamo as dynamo

from scripts.multirank import launch, section
from scripts.pytest_course import autograd_node_names, import_file

pytestmark = pytest.mark.multirank
HERE = Path(__file__).parent
WORKER = HERE / "worker.py"
N = 4  # ranks
WORKER_MODULE = import_file(WORKER)
MODEL = dict(WORKER_MODULE.Model().named_parameters())  # {name: parameter}: sizes only
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


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


def test_launch_succeeded(lesson):
    run = lesson.ns["run"]
    assert run.ok and sorted(run.out) == [0, 1, 2, 3], run.describe()
    for rank in range(N):
        assert "Traceback" not in run.err[rank], run.err[rank]
        assert not re.search(r"\w+Warning:", run.err[rank]), run.err[rank]  # Python warnings


# ---------------------------------------------------------------------------------- 1, 2


def test_mesh_groups(lesson):
    assert text(lesson, "mesh")[0] == "mesh [[0, 1], [2, 3]], dims ('dp', 'tp')"
    assert text(lesson, "mesh")[2] == f"attention heads per rank {HEADS // 2} of {HEADS}"
    for rank in range(N):  # a tp group is a row of the grid, a dp group a column
        row, col = divmod(rank, 2)
        dp, tp = [col, col + 2], [2 * row, 2 * row + 1]
        assert (f"dp group {dp}, tp group {tp}; all_reduce of the ranks over dp {sum(dp)}, over tp {sum(tp)}"
                in text(lesson, "mesh", rank))


def test_placements(lesson):
    got = {line.split()[0]: line for line in text(lesson, "placements")}
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


def test_shards_follow_tp_then_dp(lesson):
    for rank in range(N):
        dp, tp = divmod(rank, 2)
        got = text(lesson, "shards", rank)
        assert got[0] == f"dp {dp} tp {tp}: blocks.0.mlp.up.weight rows {rows(32 * tp + 16 * dp, 16)}"
        assert got[1] == (f"dp {dp} tp {tp}: after an all-gather over dp, rows {rows(32 * tp, 32)}; under plain "
                          f"(Shard(0), Shard(0)) it would hold rows {rows(32 * dp + 16 * tp, 16)}")
        hsdp = f"replicate {dp} shard {tp}: blocks.0.mlp.up.weight rows {rows(32 * tp, 32)}"
        assert hsdp in text(lesson, "hsdp", rank)


@pytest.mark.parametrize("name", ["step", "hsdp"])
def test_step_equals_one_process(lesson, name):
    got = text(lesson, name)
    loss = the(got, "loss: ")
    one, mean = re.fullmatch(r"loss: one process (\S+), mean over ranks (\S+)", loss).groups()
    assert one == mean, loss
    (found,) = gaps([the(got, "after one AdamW step")])
    assert found[0] < 1e-12 == found[1]


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


def test_units(lesson):
    got = text(lesson, "comms")
    assert got[0] == (f"P = {P} parameters x 4 B = {P * E} B (float32); "
                      f"global batch {BATCH} x {S} tokens, H {H}, V {V}")
    assert got[1] == f"FSDP units: root (embed, norm, head) {ROOT} elements, each block {BLOCK}"
    assert ROOT + 2 * BLOCK == P


def test_formulas_are_the_textbooks(lesson):
    psi, a1 = P * E, BATCH * S * H * E  # parameter bytes; one B*S*H activation of the global batch
    expect = {"DDP": ring(psi, N, True), "FSDP2": 3 * ring(psi, N), "TP": 2 * 4 * ring(a1, N, True),
              "TP+SP": 2 * 4 * ring(a1, N, True), "2-D": 3 * ring(psi // 2, 2) + 2 * 4 * ring(a1 // 2, 2, True),
              "HSDP": 3 * ring(psi, 2) + ring(psi // 2, 2, True)}
    assert {k: v[1] for k, v in comm_rows(lesson).items()} == expect


def test_ddp_and_fsdp_bytes(lesson):
    got, rows = text(lesson, "comms"), comm_rows(lesson)
    assert "DDP    backward  1 all-reduce" in got
    assert rows["DDP"] == (ring(P * E, N, True),) * 3  # exact; every byte crosses the nodes
    assert "FSDP2  forward   3 all-gather" in got and "FSDP2  backward  2 all-gather, 3 reduce-scatter" in got
    assert rows["FSDP2"][1] - rows["FSDP2"][0] == ring(ROOT * E, N)  # the root is not gathered twice


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
    assert measured == sum(two.values()) and across == two["params"]  # only dp crosses the nodes
    measured, formula, across = rows["HSDP"]
    assert formula - measured == ring(ROOT * E, 2)
    assert across == ring(P * E // 2, 2, True)  # only the replicate all-reduce crosses
    for name in ("DDP", "FSDP2", "TP", "TP+SP"):  # one group of all 4 ranks: everything crosses
        assert rows[name][2] == rows[name][0]


# ---------------------------------------------------------------------------------- 4. overlap


def test_prefetch_order(lesson):
    got = text(lesson, "overlap")
    for prefetch, before in (("False", False), ("True ", True)):
        assert f"prefetch {prefetch}: all-gathers 5, reduce-scatters 3" in got
        assert (f"prefetch {prefetch}: blocks.1's all-gather issued before blocks.0's forward began: {before}, "
                f"after it ended: {not before}") in got
        assert f"prefetch {prefetch}: blocks.0 gathered again before blocks.1's backward ended: True" in got
        assert f"prefetch {prefetch}: blocks.1's reduce-scatter issued before blocks.0's backward began: True" in got
    ratio = float(the(got, "step time with prefetch / without: ").split(": ")[1])
    assert ratio > 0  # reported, not judged: 4 ranks on 2 cores have no idle core


def test_async_handle(lesson):
    line, last, gather, scatter = text(lesson, "async")
    began, computed, _, waited = map(float, re.findall(r"(\d+\.\d) ms", line))
    assert began <= computed <= waited, line  # issued, computed, then waited
    assert last == "compute began before the collective completed: True; x after wait() 10 (1 + 2 + 3 + 4)"
    assert gather == "gloo's all-gather handle: get_future() available: True"
    assert scatter == "gloo's reduce-scatter handle: get_future() available: False"  # the timeline's ticks


def test_timeline_figure(lesson):
    ns = lesson.ns
    found = ns["spans"](ns["run"])
    fig = ns["plot_timeline"](found)
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == [f"FSDP2 step, explicit prefetch {p}" for p in (False, True)]
    for ax, prefetch in zip(axes, (False, True)):
        assert sorted(found[prefetch]) == [0, 1, 2, 3]
        events = [e for rank in range(N) for e in found[prefetch][rank]]
        assert sum(e[0] == "compute" for e in events) == 4 * N  # 2 blocks x forward and backward
        assert sum(e[0] == "comm" for e in events) == 8 * N  # 5 all-gathers, 3 reduce-scatters
        assert len(ax.collections) == len(events)
        starts = sorted(c.get_paths()[0].vertices[:, 0].min() for c in ax.collections)
        assert starts == pytest.approx(sorted(e[2] for e in events))
    assert (HERE / "timeline.png").is_file()


# ---------------------------------------------------------------------------------- 5. memory


def test_checkpointing(lesson):
    got = text(lesson, "checkpointing")
    assert got[0] == "block computations per step: without AC 2, with AC 4"
    assert "gradients with AC equal those without, bitwise: True" in got
    line = the(got, "one block, ")
    m = re.fullmatch(rf"one block, {BIG} sequences: kept for backward without AC (\d+) tensors, (\d+) B; "
                     rf"with AC 1, {BIG * S * H * 4} B", line)  # with AC: only the block's float32 input
    assert m, line
    kept_off, kept_on = int(m[2]), BIG * S * H * 4
    saved = the(got, "without AC, saved: ")
    head = H // HEADS
    assert f"[{BIG}, {HEADS}, {S}, {head}] x4, [{BIG}, {HEADS}, {S}] x1" in saved  # q, k, v, output; lse
    assert f"[{BIG}, {S}, {4 * H}] x1" in saved  # the MLP's hidden layer
    assert the(got, "any saved [") == f"any saved [..., {S}, {S}] (attention probabilities, S x S): False"
    for rank in range(N):
        line = the(text(lesson, "checkpointing", rank), "peak bytes")
        off, on = map(int, re.findall(r"AC (\d+)", line))
        assert on < 0.8 * off and line.endswith("lower with AC: True"), line
        assert off - on < 2 * (kept_off - kept_on), line  # less than the two blocks' kept bytes


def test_meta_init(lesson):
    assert text(lesson, "meta")[0] == ("built on meta: every parameter on the meta device: True; "
                                       "collectives meanwhile: 0")
    assert "parameters equal to one process's init, bitwise: True" in text(lesson, "meta")
    rep = sum(MODEL[n].numel() for n in REPLICATED)
    for rank in range(N):
        line = the(text(lesson, "meta", rank), "after to_empty")
        held, full, peak = map(int, re.findall(r"(\d+) B", line))
        # float64: a quarter of what TP splits, half of what it replicates (FSDP splits it over dp)
        assert full == P * 8 and held == ((P - rep) // 4 + rep // 2) * 8, line
        assert peak < full and line.endswith("below the full model: True"), line


def test_clip(lesson):
    got = text(lesson, "clip")
    assert "a DTensor (Replicate(), Replicate())" in got[0]
    found = gaps(got[:2])
    assert len(found) == 2 and all(g < 1e-12 for g, _ in found)
    assert got[2] == (
        f"collectives in clip_grad_norm_: all-reduce of {N_PARAMS} over [0, 2] (from linalg_vector_norm), "
        f"all-reduce of {N_PARAMS} over [0, 1] (from linalg_vector_norm)"
    )  # one norm per gradient
    err = lesson.ns["run"].err[0]
    assert "2 sequential all_reduce operations will be performed" in err  # DTensor's warning, in the log


# ---------------------------------------------------------------------------------- 6. nodes


def test_two_agents_two_nodes(lesson):
    for rank in range(N):
        assert text(lesson, "nodes", rank)[0] == (f"RANK={rank} LOCAL_RANK={rank % 2} GROUP_RANK={rank // 2} "
                                                  "LOCAL_WORLD_SIZE=2 WORLD_SIZE=4")
    got = text(lesson, "nodes")
    assert got[1] == "node = rank // LOCAL_WORLD_SIZE = GROUP_RANK on every rank: True"
    assert got[2:] == [
        "dp        groups [[0, 2], [1, 3]]: nodes [[0, 1], [0, 1]], crosses nodes: True",
        "tp        groups [[0, 1], [2, 3]]: nodes [[0], [1]], crosses nodes: False",
        "replicate groups [[0, 2], [1, 3]]: nodes [[0, 1], [0, 1]], crosses nodes: True",
        "shard     groups [[0, 1], [2, 3]]: nodes [[0], [1]], crosses nodes: False",
    ]


# ---------------------------------------------------------------------------------- figures


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


def test_bytes_figure(lesson):
    ns = lesson.ns
    rows = comm_rows(lesson)
    fig = ns["plot_bytes"](rows)
    (ax,) = fig.get_axes()
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    names = ["DDP", "FSDP2", "TP", "TP+SP", "2-D", "HSDP"]
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    for i, label in enumerate(("measured", "formula", "measured, across nodes")):
        assert bars[label] == pytest.approx([rows[n][i] / 1024 for n in names])
    assert (HERE / "bytes_per_step.png").is_file()


# ---------------------------------------------------------------------------------- 7
# Compile inside DDP and FSDP2: in the lesson's own process, on a one-rank gloo group (moved
# here from lesson 08 with its section).


def test_ddp_optimizer_splits_at_bucket_boundaries(lesson):
    ns = lesson.ns
    ops = ns["graph_ops"]
    for order in ["compile(DDP(model))", "DDP(model.compile())"]:
        split, whole = ns["ddp_runs"][order, True], ns["ddp_runs"][order, False]
        assert [ops(gm).count("linear") for gm in split[0]] == [1, 1, 1, 1]
        assert [ops(gm).count("linear") for gm in whole[0]] == [4]
        assert split[1] < 1e-6 and whole[1] < 1e-6
    # the prose: compiling the DDP module breaks the graph inside DDP's own forward (its
    # logger call, and _inside_ddp_forward, marked not to be traced); compile-then-wrap never
    for opt in [True, False]:
        breaks = ns["ddp_runs"]["compile(DDP(model))", opt][2]
        assert breaks.total() == 3
        assert any("set_runtime_stats_and_log" in reason for reason in breaks)
        assert any("_inside_ddp_forward" in reason for reason in breaks)
        assert ns["ddp_runs"]["DDP(model.compile())", opt][2].total() == 0
    assert ns["layer_bytes"] > 2**20  # each layer fills a 1 MiB bucket on its own
    assert dynamo.config.optimize_ddp is True and not torch.distributed.is_initialized()


def test_each_ddp_piece_is_one_backward_node(lesson):
    """The prose: a compiled region's backward is one autograd node; DDPOptimizer's split
    gives four of them (one per bucket), optimize_ddp=False one."""
    ns = lesson.ns
    counts = {}
    with ns["one_rank_group"]():
        for opt in [True, False]:
            dynamo.reset()
            saved, dynamo.config.optimize_ddp = dynamo.config.optimize_ddp, opt
            try:
                torch.manual_seed(0)
                ddp = torch.compile(ns["DDP"](ns["Stack"](), bucket_cap_mb=1), backend="aot_eager")
                loss = ddp(ns["xd"]).square().mean()
                counts[opt] = autograd_node_names(loss).count("CompiledFunctionBackward")
                loss.backward()
            finally:
                dynamo.config.optimize_ddp = saved
    dynamo.reset()
    assert counts == {True: 4, False: 1}
    for order in ["compile(DDP(model))", "DDP(model.compile())"]:  # what the lesson's lines print
        assert {opt: ns["ddp_runs"][order, opt][3] for opt in [True, False]} == {True: 4, False: 1}


def test_ddp_split_follows_the_bucket_cap(lesson):
    """The cut moves with bucket_cap_mb: with 2 MiB, two layers share a graph. The last layer
    stays alone: DDPOptimizer's first bucket is 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES)."""
    ns = lesson.ns
    x = ns["xd"]
    with ns["one_rank_group"]():
        torch.manual_seed(0)
        ref = ns["train_step"](ns["DDP"](ns["Stack"](), bucket_cap_mb=2), x)
        graphs, gap, *_ = ns["ddp_graphs"]("compile(DDP(model))", True, x, ref, cap=2)
    assert [ns["graph_ops"](gm).count("linear") for gm in graphs] == [1, 2, 1]
    assert gap < 1e-6
    assert torch.distributed._DEFAULT_FIRST_BUCKET_BYTES == 2**20
    assert dynamo.config.optimize_ddp is True and not torch.distributed.is_initialized()


def test_fsdp2_compiled_blocks_keep_the_hooks_outside(lesson):
    ns = lesson.ns
    backend = ns["fsdp_backend"]
    assert [ns["graph_ops"](gm) for gm in backend.graphs] == [["linear", "relu", "add"]] * 2
    names = " ".join(str(n.target) for gm in backend.graphs for n in gm.graph.nodes)
    assert "all_gather" not in names and "reduce_scatter" not in names
    assert ns["at_rest"] == "DTensor" and "DTensor" not in backend.types
    assert ns["fsdp_gap"] < 1e-6
    assert isinstance(ns["fsdp_model"], torch.distributed.fsdp.FSDPModule)


def test_fsdp2_compiled_blocks_share_two_graphs_at_depth_8(lesson):
    """The prose: eight blocks give the same two graphs as four, the second one because block
    0's input does not require grad and block 1's does."""
    ns = lesson.ns
    dynamo.reset()
    backend = ns["InputTypes"]()
    with ns["one_rank_group"]():
        ns["train_step"](ns["fsdp_compiled"](backend, n=8), ns["xf"])
    failed = [r.splitlines()[0] for v in dynamo.utils.guard_failures.values() for r in v]
    dynamo.reset()
    assert [ns["graph_ops"](gm) for gm in backend.graphs] == [["linear", "relu", "add"]] * 2
    assert "DTensor" not in backend.types
    assert len(failed) == 1 and "requires_grad mismatch" in failed[0], failed


def sharded_tower(ns):
    """The lesson's seeded Tower with fully_shard on each block, then on the root (call it
    inside `one_rank_group()`), before anything is compiled."""
    torch.manual_seed(0)
    model = ns["Tower"]()
    for block in model.blocks:
        ns["fully_shard"](block)
    ns["fully_shard"](model)
    return model


def test_fsdp2_either_order_gives_the_same_graphs(lesson):
    """The prose: fully_shard each block and the root first, then compile each block, gives the
    same two graphs, plain tensors in, and the same step as the lesson's order."""
    ns = lesson.ns
    dynamo.reset()
    backend = ns["InputTypes"]()
    with ns["one_rank_group"]():
        model = sharded_tower(ns)
        for block in model.blocks:
            block.compile(backend=backend)
        gap = ns["max_gap"](ns["train_step"](model, ns["xf"]), ns["fsdp_ref"])
    dynamo.reset()
    assert [ns["graph_ops"](gm) for gm in backend.graphs] == [["linear", "relu", "add"]] * 2
    assert "DTensor" not in backend.types and gap < 1e-6
    assert not torch.distributed.is_initialized()


def test_fsdp2_whole_model_compile_captures_only_the_blocks(lesson):
    """The prose: FSDP2's hooks are never traced (torch._dynamo.disable), so compiling the whole
    sharded model breaks the graph at each block's hooks inside the root's loop; Dynamo runs
    the root's forward eagerly and captures only the blocks' forwards, never the head."""
    ns = lesson.ns
    dynamo.reset()
    backend = ns["AotCounting"]()
    with ns["one_rank_group"]():
        model = sharded_tower(ns)
        gap = ns["max_gap"](ns["train_step"](torch.compile(model, backend=backend), ns["xf"]), ns["fsdp_ref"])
    dynamo.reset()
    assert [ns["graph_ops"](gm) for gm in backend.graphs] == [["linear", "relu", "add"]] * 2
    assert gap < 1e-6
    assert not torch.distributed.is_initialized()


def test_module_compile_on_sequential_captures_nothing(lesson):
    """pytorch/pytorch#150915 in 2.13.0: when this test fails, a release fixed it; update the
    lesson's prose and its summary."""
    assert lesson.ns["seq_counts"] == (0, 1)


def test_sequential_with_a_module_of_your_own_captures_only_that_module(lesson):
    """The prose's parenthesis: model.compile() on a Sequential that holds a module of your own
    captures that module's forward only; the torch Linear beside it runs eagerly."""
    ns = lesson.ns

    class Mine(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x).relu()

    dynamo.reset()
    backend = ns["CountingBackend"]()
    seq = torch.nn.Sequential(Mine(), torch.nn.Linear(8, 8))
    seq.compile(backend=backend)
    seq(torch.randn(2, 8))
    dynamo.reset()
    assert [ns["graph_ops"](gm) for gm in backend.graphs] == [["linear", "relu"]]


# ---------------------------------------------------------------------------------- GPUs


@pytest.mark.multigpu(4)
def test_two_d_step_on_nccl(record_property):
    """Unverified on hardware: written on a machine without GPUs. Needs 4 CUDA devices."""
    run = launch(WORKER, ["twod", "--backend", "nccl"], nproc=4, timeout=300)
    record_property("2-D step on NCCL, 4 ranks: launch wall time [s]", round(run.seconds, 1))
    assert run.ok, run.describe()
    out = run.out[0].splitlines()
    assert "rank 0: mesh [[0, 1], [2, 3]], dims ('dp', 'tp')" in out
    assert f"rank 0: attention heads per rank {HEADS // 2} of {HEADS}" in out
    (found,) = gaps([the(out, "rank 0: after one AdamW step")])
    record_property("2-D step on NCCL vs one process, float64: max parameter gap [abs]", found[0])
    assert found[0] < 1e-12


# ---------------------------------------------------------------------------------- exercises
# On 2 gloo ranks, through the kit: the worker imports the tested file (solutions.py in
# `make test`, the student's exercises.py in `make exercises N=13`) and trains beside DDP.

SIZES = (2000, 10_000, 1 << 20)  # bucket bytes: many buckets, a few (the last partly full), one


@pytest.fixture(scope="module")
def answers(exercise_module):
    run = launch(WORKER, ["exercises", "--answers", exercise_module.__file__], nproc=2, timeout=180)
    assert run.ok, run.describe()
    return {name: {r: [line.split(": ", 1)[1] for line in got] for r, got in section(run, name).items()}
            for name in ["naive", *(f"bucketed {s}" for s in SIZES)]}


def attempted(found):
    for got in found.values():
        if got == ["not attempted: NotImplementedError"]:
            raise NotImplementedError("the exercise still raises NotImplementedError")


def counts(line):
    return [int(x) for x in re.search(r"per step \[([\d, ]+)\]", line)[1].split(", ")]


def matches_ddp(got):
    (line,) = [x for x in got if "grads of 3 steps vs DDP" in x]
    found = gaps([line])
    assert len(found) == 2 and all(g < 1e-12 for g, _ in found), line




@pytest.mark.exercise("all_reduce_grads")
def test_naive_equals_ddp(answers):
    attempted(answers["naive"])
    for got in answers["naive"].values():
        matches_ddp(got)
        assert counts(the(got, "naive: all-reduces per step")) == [N_PARAMS] * 3  # one per gradient


@pytest.mark.exercise("Bucketed")
@pytest.mark.parametrize("size", SIZES)
def test_bucketed_equals_ddp(answers, size):
    found = answers[f"bucketed {size}"]
    attempted(found)
    for got in found.values():
        matches_ddp(got)  # also: every bucket flushed, averaged once


@pytest.mark.exercise("Bucketed")
@pytest.mark.parametrize("size", SIZES)
def test_bucketed_overlaps(answers, size):
    found = answers[f"bucketed {size}"]
    attempted(found)
    for got in found.values():
        line = the(got, "bucketed: all-reduces per step")
        per_step = counts(line)
        if size > P * 8:  # the whole model (float64 gradients) fits in one bucket
            assert per_step == [1, 1, 1], line
        else:  # several buckets, fewer than one per gradient
            assert all(2 <= n < N_PARAMS for n in per_step), line
        assert line.endswith("blocking 0"), line  # every all-reduce launched with async_op=True
        timing = the(got, "bucketed: first all-reduce issued")
        assert "before backward ended [True, True, True]" in timing, timing  # overlapped
        assert "waits before it ended [0, 0, 0]" in timing, timing  # no wait inside backward
        assert f"after {per_step}" in timing, timing  # every handle waited, in finish()

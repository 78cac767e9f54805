"""Tests of lesson 13b: documented outputs; the 4 ranks' values read from the narrative's one
launch (2 torchrun agents): FSDP2's issue order and the all-gathers in flight (none, by
default, on gloo), unshard(async_op=True), async handles, the timeline figure, activation
checkpointing, meta init, clipping, the node mapping; compile inside DDP and FSDP2 (section
4, on a one-rank gloo group in the lesson's own process); the graded exercises on 2 ranks
against DDP. (That no rank outlives the lesson is checked by the `lesson` fixture.)

Every test here launches ranks or reads the narrative's launch: all are `multirank`."""

import re
from pathlib import Path

import pytest
import torch
import torch._dynamo as dynamo

from scripts.multirank import launch
from scripts.pytest_course import autograd_node_names, import_file

pytestmark = pytest.mark.multirank
HERE = Path(__file__).parent
WORKER = HERE / "worker.py"
N = 4  # ranks
MODEL = dict(import_file(HERE / "model.py").Model().named_parameters())  # {name: parameter}: sizes only
P = sum(p.numel() for p in MODEL.values())  # parameters of the model
ROOT = sum(p.numel() for n, p in MODEL.items() if not n.startswith("blocks."))  # FSDP's root unit
BLOCK = sum(p.numel() for n, p in MODEL.items() if n.startswith("blocks.0."))  # one block
N_PARAMS = len(MODEL)
# What the TP plan leaves whole on every tp rank: the norms and the rowwise layers' biases.
REPLICATED = {n for n in MODEL if ".norm" in n or n.startswith("norm.") or n.endswith("down.bias")}
NORMS = [n for n in REPLICATED if "norm" in n]  # their gradients are Partial under SP
H, V, S, BATCH, HEADS, BIG = 16, 32, 8, 8, 4, 32


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


# ---------------------------------------------------------------------------------- 1. overlap


def test_prefetch_order(lesson):
    got = text(lesson, "overlap")
    for prefetch, before in (("False", False), ("True ", True)):
        assert f"prefetch {prefetch}: all-gathers 5, reduce-scatters 3" in got
        assert (f"prefetch {prefetch}: blocks.1's all-gather issued before blocks.0's forward began: {before}, "
                f"after it ended: {not before}") in got
        # FSDP2's default backward prefetch: block 1's pre-backward hook gathers block 0 right
        # after block 1 itself, before block 1's backward computes
        assert (f"prefetch {prefetch}: blocks.0's backward all-gather issued after blocks.1's and before "
                "blocks.1's backward began: True") in got
        assert f"prefetch {prefetch}: blocks.1's reduce-scatter issued before blocks.0's backward began: True" in got
        # FSDP2's default (unshard_async_op=False): on gloo the thread waits for each all-gather
        assert (f"prefetch {prefetch}: all-gathers in flight when a block's computation began or ended, "
                "most on any rank: 0 of 5") in got
    ratio = float(the(got, "step time with prefetch / without: ").split(": ")[1])
    assert ratio > 0  # reported, not judged: 4 ranks share a few CPU cores


def test_unshard_async_op_overlaps(lesson):
    """async_op=True returns with the all-gather in flight (the last rank joins 0.3 s late),
    still in flight after the computation; the default returns only once it is done."""
    on, off = text(lesson, "unshard")
    assert on == ("unshard(async_op=True ): all-gathers in flight when the computation began 1, when it ended 1; "
                  "after the wait blocks.1's weights are Parameters")
    assert off == ("unshard(async_op=False): all-gathers in flight when the computation began 0, when it ended 0; "
                   "after the wait blocks.1's weights are Parameters")


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


# ---------------------------------------------------------------------------------- 2. memory


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
    assert got[0].startswith("total L2 norm of the gradients: one process ")
    assert "a DTensor (Replicate(), Replicate())" in got[0]
    found = gaps(got[:2])
    assert len(found) == 2 and all(g < 1e-12 for g, _ in found)
    one = f"all-reduce of {N_PARAMS} elements ({N_PARAMS * 8} B)"  # one float64 norm per gradient
    assert got[2] == (
        f"collectives in clip_grad_norm_: {one} over [0, 2] (from linalg_vector_norm), "
        f"{one} over [0, 1] (from linalg_vector_norm)"
    )
    err = lesson.ns["run"].err[0]
    assert "2 sequential all_reduce operations will be performed" in err  # DTensor's warning, in the log
    said = lesson.ns["said"]  # the part of it the lesson prints
    assert "2 sequential all_reduce operations will be performed" in said and "flatten mesh dimensions" in said


# ---------------------------------------------------------------------------------- 3. nodes


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


# ---------------------------------------------------------------------------------- 4. compile
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


def test_mastery_eight_layers_two_mib_cap(lesson):
    """Mastery check 5: eight Linear(512, 512) layers, model.compile() then DDP with
    bucket_cap_mb=2: graphs of [1, 2, 2, 2, 1] layers (the first piece from the end is 1 MiB)."""
    ns = lesson.ns
    dynamo.reset()
    backend = ns["CountingBackend"]()
    with ns["one_rank_group"]():
        torch.manual_seed(0)
        model = ns["Stack"](n=8)
        model.compile(backend=backend)
        ns["DDP"](model, bucket_cap_mb=2)(ns["xd"]).square().mean().backward()
    dynamo.reset()
    assert [ns["graph_ops"](gm).count("linear") for gm in backend.graphs] == [1, 2, 2, 2, 1]
    assert 2 * ns["layer_bytes"] == 2_101_248 > 2 * 2**20  # two layers fill a 2 MiB piece
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


# ---------------------------------------------------------------------------------- exercises
# On 2 gloo ranks, through the kit: the worker imports the tested file (solutions.py in
# `make test`, the student's exercises.py in `make exercises N=13b`) and trains beside DDP.

SIZES = (2000, 10_000, 1 << 20)  # bucket bytes: many buckets, a few (the last partly full), one
SOLUTIONS = HERE / "solutions.py"
# Wrong answers, each solutions.py with one mistake: {name: (the check that must catch it,
# [(text of solutions.py, what replaces it)])}. They ride along in the exercise launch of
# `make test` (one check each, after the tested file), so catching them costs no launch.
WRONG = {
    "no_division": ("naive", [("            p.grad /= world\n", "")]),
    "buckets_never_reset": ("bucketed 2000", [(
        "        self.launched.clear()\n        self.ready = [0] * len(self.buckets)",
        "        self.launched.clear()")]),
    "waits_in_the_hook": ("bucketed 2000", [(
        "            self.launched.append((i, flat, dist.all_reduce(flat, async_op=True)))",
        "            work = dist.all_reduce(flat, async_op=True)\n            work.wait()\n"
        "            self.launched.append((i, flat, work))")]),
    "elements_not_bytes": ("bucketed 10000", [("q.numel() * q.element_size()", "q.numel()"),
                                              ("p.numel() * p.element_size()", "p.numel()")]),
    "all_at_the_end": ("bucketed 2000", [(
        "        if self.ready[i] == len(self.buckets[i]):  # the bucket is full: send it now\n"
        "            flat = torch.cat([p.grad.flatten() for p in self.buckets[i]])\n"
        "            self.launched.append((i, flat, dist.all_reduce(flat, async_op=True)))",
        "        if sum(self.ready) == sum(map(len, self.buckets)):  # every gradient ready: send all\n"
        "            for j, bucket in enumerate(self.buckets):\n"
        "                flat = torch.cat([p.grad.flatten() for p in bucket])\n"
        "                self.launched.append((j, flat, dist.all_reduce(flat, async_op=True)))")]),
    "sent_at_the_first_gradient": ("bucketed 2000", [("if self.ready[i] == len(self.buckets[i]):",
                                                      "if self.ready[i] == 1:")]),
}


def wrong_answers(folder):
    """Write each wrong answer into folder: ['path::check', ...] for the worker's --answers."""
    entries = []
    for name, (check, edits) in WRONG.items():
        text = SOLUTIONS.read_text()
        for old, new in edits:
            assert text.count(old) == 1, (name, old)  # solutions.py changed: update WRONG
            text = text.replace(old, new)
        (folder / f"wrong_{name}.py").write_text(text)
        entries.append(f"{folder / f'wrong_{name}.py'}::{check}")
    return entries


@pytest.fixture(scope="module")
def checked(exercise_module, tmp_path_factory):
    """{answers file name: {exercise: {rank: [its lines]}}} from the `[name] ...` lines each rank
    printed after `answers from <file>`; the wrong answers ride along when solutions.py is tested."""
    files = [exercise_module.__file__]
    if Path(exercise_module.__file__).resolve() == SOLUTIONS.resolve():
        files += wrong_answers(tmp_path_factory.mktemp("wrong"))
    run = launch(WORKER, ["exercises", "--answers", *files], nproc=2, timeout=240)
    assert run.ok, run.describe()
    found = {}
    for rank, out in run.out.items():
        for line in out.splitlines():
            if m := re.fullmatch(rf"rank {rank}: answers from (\S+)", line):
                mine = found.setdefault(m[1], {})
            elif m := re.fullmatch(rf"rank {rank}: \[([\w ]+)\] (.*)", line):
                mine.setdefault(m[1], {}).setdefault(rank, []).append(m[2])
    return found


@pytest.fixture(scope="module")
def answers(checked, exercise_module):
    """{exercise: {rank: [its lines]}} of the tested file (solutions.py, or yours)."""
    return checked[Path(exercise_module.__file__).name]


def attempted(found):
    for got in found.values():
        if "not attempted: NotImplementedError" in got:
            raise NotImplementedError("the exercise still raises NotImplementedError")


def counts(line):
    return [int(x) for x in re.search(r"per step \[([\d, ]+)\]", line)[1].split(", ")]


def matches_ddp(got):
    (line,) = [x for x in got if x.startswith("grads of 3 steps vs DDP")]
    found = gaps([line])
    assert len(found) == 2 and all(g < 1e-12 for g, _ in found), line


def check_naive(found):
    for got in found.values():
        assert not any(" failed: " in x for x in got), got
        matches_ddp(got)
        assert counts(the(got, "all-reduces per step")) == [N_PARAMS] * 3  # one per gradient


def check_bucketed_equals_ddp(found):
    for got in found.values():
        assert not any(" failed: " in x for x in got), got
        matches_ddp(got)  # also: every bucket flushed, averaged once


def check_bucketed_overlaps(found, size):
    for got in found.values():
        line = the(got, "all-reduces per step")
        per_step = counts(line)
        if size > P * 8:  # the whole model (float64 gradients) fits in one bucket
            assert per_step == [1, 1, 1], line
        else:  # several buckets, fewer than one per gradient
            assert all(2 <= n < N_PARAMS for n in per_step), line
        assert line.endswith("blocking 0"), line  # every all-reduce launched with async_op=True
        timing = the(got, "first all-reduce issued")
        # the checker's own gradient hooks run before the answer's: with several buckets the first
        # all-reduce starts while other gradients are still being computed; with one, it cannot
        ready = "[False, False, False]" if size > P * 8 else "[True, True, True]"
        assert f"before the last gradient was ready {ready}" in timing, timing
        assert "waits before backward ended [0, 0, 0]" in timing, timing  # no wait inside backward
        assert f"after {per_step}" in timing, timing  # every handle waited, in finish()


@pytest.mark.exercise("all_reduce_grads")
def test_naive_equals_ddp(answers):
    attempted(answers["naive"])
    check_naive(answers["naive"])


@pytest.mark.exercise("Bucketed")
@pytest.mark.parametrize("size", SIZES)
def test_bucketed_equals_ddp(answers, size):
    found = answers[f"bucketed {size}"]
    attempted(found)
    check_bucketed_equals_ddp(found)


@pytest.mark.exercise("Bucketed")
@pytest.mark.parametrize("size", SIZES)
def test_bucketed_overlaps(answers, size):
    found = answers[f"bucketed {size}"]
    attempted(found)
    check_bucketed_overlaps(found, size)


@pytest.mark.parametrize("name", WRONG)
def test_exercise_checks_catch_wrong_answers(checked, name):
    """Each wrong answer fails the check it was run with (the tests above, on its lines)."""
    check, _ = WRONG[name]
    found = checked[f"wrong_{name}.py"][check]
    size = int(check.split()[1]) if check.startswith("bucketed") else None
    tests = [lambda: check_naive(found)] if size is None else [
        lambda: check_bucketed_equals_ddp(found), lambda: check_bucketed_overlaps(found, size)]
    caught = 0
    for test in tests:
        try:
            test()
        except (AssertionError, ValueError):  # ValueError: an expected line is missing
            caught += 1
    assert caught, f"wrong answer {name!r} passed every check of {check!r}: {found}"


def test_model_is_13a_s():
    """Each part carries its own model.py so that it runs alone; 13b's is 13a's, unchanged."""
    assert (HERE / "model.py").read_text() == (HERE.parent / "13a_two_d_mesh" / "model.py").read_text()

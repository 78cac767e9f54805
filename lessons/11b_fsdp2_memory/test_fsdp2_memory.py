"""Tests of lesson 11b: documented outputs, the ranks' values read from the narrative's launch
(reshard_after_forward, mixed precision, memory, accumulation, offload), the fake group of 4
and the real one (slow), the figure, a launch that fails cleanly, the exercises, and the
worker on NCCL with 2 GPUs. (That no rank outlives the lesson is checked by the `lesson`
fixture.)

Every test here launches ranks or reads the narrative's launch: all are `multirank`."""

import contextlib
import io
import math
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from scripts.checker import documented_block, read_cells
from scripts.multirank import GROUP_TIMEOUT_S, launch, still_running
from scripts.pytest_course import import_file

pytestmark = pytest.mark.multirank
HERE = Path(__file__).parent
WORKER = HERE / "worker.py"
N_PARAMS, ROOT, BLOCK = 29632, 4224, 12704  # elements: the model, its root unit, one block


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


def lines(lesson, name, rank=0):
    return lesson.ns["section"](lesson.ns["run"], name)[rank]


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


BYTES = re.compile(
    r"rank 0: reshard_after_forward=(\w+): parameter bytes between forward and backward (\d+), "
    r"peak (\d+), without backward prefetch (\d+)"
)
WHOLE = 2 * N_PARAMS + 4 * N_PARAMS  # bytes: the shards plus every unit gathered (fp32, 2 ranks)
ONE_BLOCK = 2 * N_PARAMS + 4 * (ROOT + BLOCK)  # the shards, the root and one block


def reshard_bytes(lesson):
    """{"True"/"False"/"None": (bytes between forward and backward, peak, peak without
    backward prefetch)} from rank 0."""
    found = filter(None, map(BYTES.fullmatch, lines(lesson, "reshard")))
    return {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in found}


def test_reshard_after_forward(lesson):
    got = lines(lesson, "reshard")
    expect = {True: "shard shard shard shard", False: "full full full full", None: "full shard shard full"}
    for mode, states in expect.items():
        names = ("embed", "blocks.0", "blocks.1", "head")
        text = ", ".join(f"'{n}': '{s}'" for n, s in zip(names, states.split()))
        assert f"rank 0: reshard_after_forward={mode}: between forward and backward {{{text}}}" in got
    events = lesson.ns["trace_events"](lesson.ns["run"])
    assert [e[0] for e in events][4:6] == ["after fwd", "bwd head"] and events[-1][0] == "after bwd"
    shards = N_PARAMS // 2 * 4
    assert events[-1] == ("after bwd", [False] * 4, shards)
    # the peak: root, block 1 and block 0's prefetched buffer, the whole model on 2 blocks
    assert max(e[2] for e in events) == shards + 4 * (ROOT + 2 * BLOCK) == WHOLE
    for label, full, nbytes in events[:-1]:  # the root unit (embed, head) is full all step
        assert full[0] and full[3] and sum(full[1:3]) <= 1, label
        ahead = label == "bwd blocks.1"  # block 0's all-gather, issued as block 1's backward starts
        assert nbytes == shards + 4 * (ROOT + BLOCK * (sum(full[1:3]) + ahead)), label
    assert reshard_bytes(lesson) == {  # between forward and backward, peak, peak without prefetch
        "True": (shards, WHOLE, ONE_BLOCK),  # only the shards between forward and backward
        "False": (WHOLE, WHOLE, WHOLE),  # every unit gathered
        "None": (shards + 4 * ROOT, WHOLE, ONE_BLOCK),  # the root stays gathered
    }
    assert reshard_bytes(lesson)["None"][:2] == (events[4][2], max(e[2] for e in events))


def test_prefetched_buffer_is_an_all_gather_output(lesson):
    """At block 1's backward, block 0's parameters are still DTensor shards, but its
    all-gather result is pending: the bytes the trace adds for it (one process, fake group)."""
    ns, seen = lesson.ns, []
    dist.init_process_group("fake", rank=0, world_size=2)
    try:
        mesh = ns["init_device_mesh"]("cpu", (2,), mesh_dim_names=("dp",))
        model = ns["shard"](ns["make_model"](torch.float32, "cpu"), mesh=mesh)
        _, mine = ns["batch"](torch.device("cpu"))
        def hook(module, args, out):  # a forward hook that returns None keeps the output
            out.register_hook(lambda g: seen.append((ns["residency"](model), ns["prefetched_bytes"](model))))

        model.blocks[1].register_forward_hook(hook)
        ns["loss_fn"](model, mine).backward()
        assert ns["prefetched_bytes"](model) == 0  # nothing left pending after the step
    finally:
        dist.destroy_process_group()
    assert seen == [(["full", "shard", "full", "full"], 4 * BLOCK)]


def test_mixed_precision(lesson):
    assert lines(lesson, "mixed") == [
        "rank 0: inside blocks.0.up: weight torch.bfloat16, input torch.bfloat16, output torch.bfloat16",
        "rank 0: logits torch.bfloat16",
        "rank 0: at rest: blocks.0.up.weight DTensor torch.float32, grad torch.float32",
    ]


def test_memory_accounting(lesson):
    rows = lesson.ns["memory_rows"](lesson.ns["run"])
    assert rows[0] == rows[1]
    ddp, fsdp = rows[0]["DDP"], rows[0]["FSDP2"]
    assert ddp[:3] == (4 * N_PARAMS, 4 * N_PARAMS, 8 * N_PARAMS)  # fp32 params, grads, 2 moments
    assert ddp[3] == ddp[4] == sum(ddp[:3])  # DDP never gathers: peak = steady
    assert all(2 * f == d for f, d in zip(fsdp[:4], ddp[:4]))  # everything halved on 2 ranks
    assert fsdp[4] == fsdp[3] + 4 * (ROOT + 2 * BLOCK)  # the root, a block and the prefetched one
    assert f"rank 0: unit sizes (elements): root {ROOT}, block {BLOCK}" in lines(lesson, "memory")


def test_reshard_after_forward_int_is_a_group_size(lesson):
    got = lines(lesson, "reshard int")
    full, sharded = "'full'", "'shard'"
    one = the(got, "rank 0: reshard_after_forward=1:")
    two = the(got, "rank 0: reshard_after_forward=2:")
    assert one.count(full) == 4 and one.endswith(f"parameter bytes {4 * N_PARAMS + 2 * N_PARAMS}")  # False
    assert two.count(sharded) == 4 and two.endswith(f"parameter bytes {2 * N_PARAMS}")  # True
    assert "rank 0: reshard_after_forward=3: ValueError" in the(got, "rank 0: reshard_after_forward=3:")
    assert "resharding parameters to world size 1" in the(got, "rank 0: logged:")
    bools = {k: v[0] for k, v in reshard_bytes(lesson).items()}  # section 1's bytes
    assert bools["False"] == 6 * N_PARAMS and bools["True"] == 2 * N_PARAMS


def fake_int4():
    """What the worker's int4 part prints here, as rank 0 of a fake group of 4 (the lesson's
    cell does the same); the default group is destroyed whatever happens."""
    worker, out = import_file(WORKER), io.StringIO()
    dist.init_process_group("fake", rank=0, world_size=4)
    try:
        with contextlib.redirect_stdout(out):
            worker.int4_part(torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    return out.getvalue().splitlines()


def documented(code):
    """The Output block of the lesson's code cell that contains `code`."""
    cells = read_cells(HERE / "fsdp2_memory.py")
    (i,) = [i for i, c in enumerate(cells) if c.kind == "code" and code in c.source]
    return documented_block(cells[i + 1].source)


def test_reshard_after_forward_int_on_a_fake_group(lesson):
    """reshard_after_forward=2 on 4 ranks played by one process: a (2, 2) post-forward mesh,
    half the model per rank; the group is gone afterwards, in the lesson and here."""
    assert not dist.is_initialized()  # the lesson destroyed its fake groups
    got = fake_int4()
    assert not dist.is_initialized()
    start = "rank 0: reshard_after_forward=2 on 4 ranks, "
    rest = f"holds {N_PARAMS // 4} of {N_PARAMS} elements; head.weight mesh (4,) (Shard(dim=0),), local [16, 32]"
    assert got == [
        start + "at rest: " + rest,
        start + f"between forward and backward: holds {N_PARAMS // 2} of {N_PARAMS} elements; "
                "head.weight mesh (2, 2) (Replicate(), Shard(dim=0)), local [32, 32]",
        start + "after backward: " + rest,
    ]
    assert documented("int4_part(torch.device") == got


def test_fake_collectives_move_no_data(lesson):
    """A fake all_reduce leaves its input (real: 4x), a fake all_gather repeats rank 0's, a
    fake reduce_scatter hands rank 0 its own first chunk, unsummed (real: 4x)."""
    assert lesson.ns["fake_collectives"](4) == ("backend fake, rank 0 of 4", 1.0, [0, 0, 0, 0], 1.0)
    assert lesson.ns["fake_collectives"](2)[1:] == (1.0, [0, 0], 1.0)
    assert not dist.is_initialized()




@pytest.mark.slow  # a launch of 4 ranks: 6 to 9 s on 2 cores, so the lesson itself does not run it
def test_reshard_after_forward_int_on_four_ranks():
    """The fake group tells the truth here: rank 0 of a real 4-rank launch prints, line for
    line, what the lesson's fake-group cell documents and what a fake group prints now."""
    run4 = launch(WORKER, ["int4"], nproc=4, env={"CUDA_VISIBLE_DEVICES": ""})
    assert run4.ok and sorted(run4.out) == [0, 1, 2, 3], run4.describe()
    for rank in range(4):
        assert "Traceback" not in run4.err[rank] and "Warning" not in run4.err[rank], run4.err[rank]
    assert run4.leftover == 0 and still_running(WORKER, run4.mark) == []
    real = run4.out[0].splitlines()
    assert real == documented("int4_part(torch.device"), real
    assert real == fake_int4(), real
    assert not dist.is_initialized()


def test_allocator_beside_the_model(lesson):
    """The profiler's CPU allocator bytes: DDP's bucket copy, the bucket view, FSDP2's peak.
    The smaller of the two ranks' counts, as the lesson prints (one rank's can come out high).

    Method: a free made on one of gloo's threads goes unseen by the profiler and only adds,
    so the worker measures each set-up three times (REPEATS) and keeps the smallest, the
    lesson takes the smaller rank's, and the comparisons allow 1 KiB. In some runs one
    rank's count comes out high, by a few hundred bytes or by a whole buffer, most often
    rank 0's with the bucket view, where in a few runs it matched plain DDP's; why was not
    established. Typical counts, the same on both ranks: DDP 592,756 live and 626,048 at
    the peak, DDP-view 474,228 and 507,520, FSDP2 237,172 and 391,944 (the model's FSDP2
    peak, prefetch included: 355,584)."""
    model, measured = lesson.ns["memory_rows"](lesson.ns["run"]), lesson.ns["measured_rows"](lesson.ns["run"])
    assert sorted(measured) == [0, 1] and all(sorted(m) == ["DDP", "DDP-view", "FSDP2"] for m in measured.values())
    low = lesson.ns["low"]
    assert low == {k: (min(measured[0][k][0], measured[1][k][0]), min(measured[0][k][1], measured[1][k][1]))
                   for k in low}
    steady, grads = model[0]["DDP"][3], model[0]["DDP"][1]
    assert 0 <= low["DDP"][0] - (steady + grads) <= 1024, low  # the bucket: one more copy
    assert 0 <= low["DDP-view"][0] - steady <= 1024, low  # .grad views into the bucket
    # FSDP2: buffers freed on gloo's threads may go unseen, which only adds: floor and ceiling
    assert model[0]["FSDP2"][3] - 1024 <= low["FSDP2"][0] < low["DDP-view"][0], low
    assert all(peak - live > 1024 for live, peak in low.values()), low  # activations at least
    assert model[0]["FSDP2"][4] < low["FSDP2"][1] < low["DDP-view"][0], low
    assert f"rank 0: DDP buckets: sizes {4 * N_PARAMS} bytes, cap {25 * 2**20} bytes" in lines(lesson, "memory")
    counters = [x for x in lines(lesson, "memory") if "AdamW step counters" in x]
    assert counters == ["rank 0: AdamW step counters: 29 x 4 bytes"]


def test_eight_billion_on_eight_gpus(lesson):
    ns = lesson.ns
    f = ns["per_gpu_bytes"]
    assert f(8e9, 8, False) == 128e9 and f(8e9, 8, True) == 16e9
    # the peak's gathered part: the root (embedding + head) plus one block, and the root
    # dominates it (the claim the prose makes)
    assert ns["root"] == 2 * ns["vocab"] * ns["width"] and ns["root"] > 4 * ns["block"]
    assert ns["block"] * ns["blocks"] + ns["root"] == pytest.approx(ns["big"])
    # the peak's gathered part, prefetch included: the root and two blocks, 3.0 GB in bf16
    assert f"{(ns['root'] + 2 * ns['block']) * 2 / 1e9:.1f}" == "3.0"


def test_gradient_accumulation(lesson):
    line = the(lines(lesson, "no_sync"), "rank 0: set_requires_gradient_sync(False)")
    assert number(line, "max grad gap ") < 1e-15


def test_cpu_offload(lesson):
    got = lines(lesson, "offload")
    line = the(got, "rank 0: CPUOffloadPolicy(pin_memory=False): shards on cpu")
    assert number(line, "step gap ") < 1e-12
    # the message depends on torch's build (CPU: "Cannot access accelerator device ...", CUDA:
    # "Found no NVIDIA driver ..."): the lesson prints the failing call, the same in both
    assert ("rank 0: CPUOffloadPolicy() (pin_memory=True): RuntimeError raised by "
            "`padded_sharded_param = padded_sharded_param.pin_memory()`") in got
    assert "rank 0: an accelerator to pin memory for: False" in got


def test_figure_plots_the_ranks_numbers(lesson):
    ns = lesson.ns
    rows, events = ns["memory_rows"](ns["run"]), ns["trace_events"](ns["run"])
    fig = ns["plot_step"](rows, events)
    left, right = fig.get_axes()[:2]
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in left.containers}
    assert sorted(bars) == ["rank 0 DDP", "rank 0 FSDP2", "rank 1 DDP", "rank 1 FSDP2"]
    for label, heights in bars.items():
        _, rank, name = label.split()
        assert heights == pytest.approx([v / 1024 for v in rows[int(rank)][name]])
    (image,) = right.get_images()
    assert image.get_array().tolist() == [[float(e[1][m]) for e in events] for m in range(4)]
    assert [t.get_text() for t in right.get_xticklabels()] == [e[0] for e in events]
    assert [t.get_text() for t in right.get_yticklabels()] == ["embed", "blocks.0", "blocks.1", "head"]
    assert (ns["HERE"] / "fsdp2_step.png").is_file()


def test_failing_launch_ends_cleanly():
    """CPUOffloadPolicy() with pin_memory=True raises on both ranks: exit 1, fast, no stray."""
    # hide any GPU, as the lesson's launch does: with one, pin_memory=True works
    result = launch(WORKER, ["pinned"], env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.code == 1 and not result.timed_out, result.describe()
    # no barrier after a failure: nothing waits for the group's timeout
    assert result.seconds < GROUP_TIMEOUT_S, result.describe()
    # the first rank to fail exits with 1; torchrun then SIGTERMs the other (-15) unless it
    # has failed too (torch/distributed/elastic/multiprocessing/api.py, _poll)
    codes = sorted(result.exit_codes.values())
    assert codes in ([1, 1], [-15, 1]), result.describe()
    for rank, code in result.exit_codes.items():
        if code == 1:  # the message depends on the build; the failing call does not
            assert "padded_sharded_param.pin_memory()" in result.err[rank], result.describe()
            assert "RuntimeError" in result.err[rank], result.describe()
        assert "sharded with pinned CPU offload" not in result.out[rank]
    assert result.leftover == 0 and still_running(WORKER, result.mark) == []


@pytest.mark.multigpu
def test_worker_on_nccl(record_property):
    """Unverified on hardware: the same step on NCCL, and peak CUDA memory vs the formula."""
    result = launch(WORKER, ["main", "--backend", "nccl"], timeout=180)
    assert result.ok, result.describe()
    out = {r: text.splitlines() for r, text in result.out.items()}
    shards = 2 * N_PARAMS  # bytes, as on gloo
    assert (f"rank 0: reshard_after_forward=None: parameter bytes between forward and backward "
            f"{shards + 4 * ROOT}, peak {WHOLE}, without backward prefetch {ONE_BLOCK}") in out[0]
    assert number(the(out[0], "rank 0: set_requires_gradient_sync(False)"), "max grad gap ") < 1e-15
    for rank in (0, 1):
        line = the(out[rank], f"rank {rank}: peak above the sharded params")
        peak, state, gathered = (number(line, k) for k in ("params ", "AdamW ", "gathered "))
        record_property(f"rank {rank} CUDA peak above the sharded params [bytes]", peak)
        record_property(f"rank {rank} formula: grads + AdamW + root and two blocks [bytes]", gathered)
        record_property(f"rank {rank} CUDA peak / formula [ratio]", round(peak / gathered, 3))
        # The step ends holding the sharded grads and moments (state). The formula adds the
        # gathered root, one block and the prefetched one (here the whole model); not in it:
        # activations, a unit's unsharded grads (a block's are 50,816 bytes), AdamW's
        # temporaries and the caching allocator's 512-byte rounding of ~100 small tensors. The
        # CPU allocator measured the same step's peak above the shards at 1.12 x the formula
        # (lesson 11b section 4: 391,944 - 59,264 bytes against 177,792 + 118,528).
        # Twice the formula fails if a copy of the model's state (DDP-like buckets, gathered
        # units never freed, unsharded grads kept) stays live. Not verified on a GPU.
        assert state <= peak < 2 * gathered, line


# ----------------------------------------------------------------------------------------
# Exercises


PEAK_CASES = [  # (root, blocks, world, elem, reshard) -> bytes, with the default backward prefetch
    ((ROOT, [BLOCK, BLOCK], 2, 4, None), WHOLE),  # section 1's peaks: the ranks printed them
    ((ROOT, [BLOCK, BLOCK], 2, 4, False), WHOLE),
    ((ROOT, [BLOCK] * 4, 4, 4, None), 173568),  # mastery question 5 (checked on a fake group below)
    ((ROOT, [BLOCK] * 4, 4, 4, False), 275200),
    ((10, [20, 40, 30], 5, 2, None), 2 * (20 + 10 + 40 + 30)),  # block 2 + prefetched block 1
    ((10, [20, 40, 30], 5, 2, False), 2 * (20 + 100)),
    ((10, [40], 5, 2, None), 2 * (10 + 10 + 40)),  # one block: nothing to prefetch
    ((10, [50, 10, 10, 40], 12, 1, None), 10 + 10 + 50 + 10),  # adjacent blocks, not the two largest
]


def peak_failures(f):
    return [(args, want, f(*args)) for args, want in PEAK_CASES if f(*args) != want]


def _no_prefetch(root, blocks, world, elem, reshard):  # the root and one block
    gathered = root + (sum(blocks) if reshard is False else max(blocks))
    return ((root + sum(blocks)) // world + gathered) * elem


def _two_largest(root, blocks, world, elem, reshard):
    gathered = root + (sum(blocks) if reshard is False else sum(sorted(blocks)[-2:]))
    return ((root + sum(blocks)) // world + gathered) * elem


def _no_shards(root, blocks, world, elem, reshard):
    pairs = [a + b for a, b in zip(blocks, blocks[1:])] or blocks
    return (root + (sum(blocks) if reshard is False else max(pairs))) * elem


def _twice_the_largest(root, blocks, world, elem, reshard):
    gathered = root + (sum(blocks) if reshard is False else 2 * max(blocks))
    return ((root + sum(blocks)) // world + gathered) * elem


@pytest.mark.parametrize("wrong", [_no_prefetch, _two_largest, _no_shards, _twice_the_largest],
                         ids=lambda f: f.__name__)
def test_peak_cases_catch_wrong_answers(wrong):
    """Plausible wrong answers (the prefetch-free peak, the two largest blocks, no shards,
    twice the largest block) each fail a case; the solution passes them all."""
    assert peak_failures(wrong)
    assert not peak_failures(import_file(HERE / "solutions.py").peak_param_bytes)


def test_transfer_answer_on_a_fake_group(lesson):
    """Mastery question 5: 4 blocks on 4 ranks, None and False, traced on a fake group of 4
    with the lesson's own trace (prefetched buffers counted), and the answer's numbers."""
    ns, peaks = lesson.ns, {}
    dist.init_process_group("fake", rank=0, world_size=4)
    try:
        mesh = ns["init_device_mesh"]("cpu", (4,), mesh_dim_names=("dp",))
        _, mine = ns["batch"](torch.device("cpu"))
        for mode in (None, False):
            model = ns["make_model"](torch.float32, "cpu")
            model.blocks = torch.nn.ModuleList([ns["Block"]() for _ in range(4)])
            model = ns["shard"](model, mesh=mesh, reshard_after_forward=mode)
            peaks[mode] = max(b for _, _, b in ns["trace_step"](model, mine))
    finally:
        dist.destroy_process_group()
    assert peaks == {None: 173568, False: 275200}
    text = "".join(c.source for c in read_cells(HERE / "fsdp2_memory.py") if "**Transfer.**" in c.source)
    assert "173,568" in text and "275,200" in text


@pytest.mark.exercise("peak_param_bytes")
def test_peak_param_bytes(lesson, exercise_module):
    measured = reshard_bytes(lesson)  # the peaks the ranks printed
    for mode in (None, False):
        assert measured[str(mode)][1] == WHOLE, mode  # PEAK_CASES' first two are the printed ones
    assert peak_failures(exercise_module.peak_param_bytes) == []


@pytest.mark.exercise("max_params")
def test_max_params(exercise_module):
    assert exercise_module.max_params(16e9, 8) == 8e9
    assert exercise_module.max_params(80e9, 8) == 40e9
    assert exercise_module.max_params(80e9, 1, 16) == 5e9
    assert exercise_module.max_params(100, 3, 16) == math.floor(300 / 16)
    assert isinstance(exercise_module.max_params(100, 3, 16), int)

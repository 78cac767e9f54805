"""lessons/TROUBLESHOOTING.md: every section it links to exists, every symptom issues 26 and
33 list has an entry, and the small runnable claims the guide makes that no lesson prints are
run here, on the CPU, in one process (the recompile limit, FSDP2's backward prefetch, SDPA's
fallback, a DataLoader's timeout and dead worker, the causes of two runs that differ).

A link names a lesson script and one of its headings: `[03a § In-place hazards](03a_autograd_tape/autograd_tape.py)`
(the heading without its section number, so that renumbering keeps the link valid and
renaming breaks it).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import signal
import time
import warnings

import pytest
import torch

from scripts import manifest
from scripts.reading import headings

GUIDE = manifest.LESSONS / "TROUBLESHOOTING.md"
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")  # [text](target)
SECTION = re.compile(r"(\d\d[a-z]?) § (.+)")  # the text of a link to a lesson section
ENTRY = re.compile(r"^### (.+)$", re.M)  # one entry per symptom

# The symptoms issue 26 names (its "Course-level" part) and issue 33 adds (its §2); each must
# head exactly one entry.
REQUIRED = [
    "a view error",
    "an unexpected copy",
    "a slow kernel after a permute",
    "the saved-tensor version error",
    "nan or inf in training",
    "a graph break",
    "a recompile storm",
    "a guard failure",
    "a collective that hangs or times out",
    "a mismatched collective",
    "oom at an all-gather",
    "a restart that does not re-form the group",
    "a resume whose next step differs",
    # issue 33
    "a cuda oom from fragmentation",
    "reading a memory snapshot",
    "a dataloader stall",
    "falls back to math, or finds no kernel",
    "two runs that differ",
]


def links(text: str) -> list[tuple[str, str]]:
    return LINK.findall(text)


def link_problem(text: str, target: str) -> str | None:
    """Why a link of the guide is broken, or None."""
    section = SECTION.fullmatch(text)
    if target.startswith(("http://", "https://")):
        return None if section is None else f"[{text}] points to a web page, not a lesson"
    path = (GUIDE.parent / target).resolve()
    if not path.exists():
        return f"[{text}]({target}): no such file"
    if path.suffix != ".py":
        return None
    if section is None:
        return f"[{text}]({target}): a link to a lesson script must be written `[NN § Heading](...)`"
    number, title = section.groups()
    if not path.parent.name.startswith(f"{number}_"):
        return f"[{text}]({target}): lesson {number} is not {path.parent.name}"
    if title not in headings(path):
        return f"[{text}]({target}): no heading '{title}' in the script's markdown cells"
    return None


def entries(text: str) -> dict[str, str]:
    """{entry heading: its body} for every `### ` entry of the guide."""
    parts = ENTRY.split(text)
    return {title: body.split("\n## ")[0] for title, body in zip(parts[1::2], parts[2::2])}


def test_every_linked_section_exists():
    found = links(GUIDE.read_text())
    assert len(found) >= len(REQUIRED), "the guide links to fewer sections than it has symptoms"
    problems = [p for p in (link_problem(text, target) for text, target in found) if p]
    assert not problems, "TROUBLESHOOTING.md:\n" + "\n".join(problems)


def test_the_check_catches_a_renamed_or_misnumbered_section():
    nan = "03b_autograd_functions/autograd_functions.py"
    assert link_problem("03b § Where does a NaN come from?", nan) is None
    assert link_problem("03b § Where does a NaN come from", nan)  # renamed
    assert link_problem("08a § Where does a NaN come from?", nan)  # wrong number
    assert link_problem("03b § Where does a NaN come from?", "03b_autograd_functions/nothing.py")  # no file
    assert link_problem("autograd", nan)  # not in the § form
    capture = manifest.LESSONS / "08a_compile_capture" / "compile_capture.py"
    assert "Graph breaks" in headings(capture)  # "## 3. Graph breaks"


@pytest.mark.parametrize("symptom", REQUIRED)
def test_every_symptom_has_an_entry(symptom: str):
    matching = [title for title in entries(GUIDE.read_text()) if symptom in title.lower()]
    assert len(matching) == 1, f"TROUBLESHOOTING.md: {len(matching)} entries headed with '{symptom}'"


def test_every_entry_names_layer_tool_and_lesson():
    for title, body in entries(GUIDE.read_text()).items():
        for field in ("**Layer:**", "**Observe:**", "**Shown in:**"):
            assert field in body, f"TROUBLESHOOTING.md, '{title}': no {field}"
        shown = body.split("**Shown in:**")[1]
        assert any(SECTION.fullmatch(text) for text, _ in links(shown)), (
            f"TROUBLESHOOTING.md, '{title}': 'Shown in' links to no lesson section")


def test_readme_links_the_guide():
    assert "(lessons/TROUBLESHOOTING.md)" in (manifest.ROOT / "README.md").read_text()


# The guide's runnable claims. Each test runs in about a second; none leaves global state set.


class Counting:
    """A torch.compile backend that counts the graphs it receives and the calls of each."""

    def __init__(self):
        self.calls: list[int] = []  # calls per graph, by graph number

    def __call__(self, gm, example_inputs):
        number = len(self.calls)
        self.calls.append(0)

        def run(*args):
            self.calls[number] += 1
            return gm.forward(*args)

        return run


def test_after_the_recompile_limit_cached_graphs_still_run():
    """"A recompile storm": past the limit a call that matches a cached graph runs it, a call
    that matches none runs eagerly; fullgraph=True raises instead."""
    dynamo = torch._dynamo
    assert dynamo.config.recompile_limit == 8

    def g(x):
        return x * 2

    dynamo.reset()
    counting = Counting()
    cg = torch.compile(g, backend=counting, dynamic=False)
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    log = logging.getLogger("torch._dynamo.convert_frame")
    log.addHandler(handler)
    try:
        with dynamo.config.patch(recompile_limit=3):  # 3 graphs show what 8 would, sooner
            for n in (2, 3, 4):  # 3 lengths, 3 graphs: the limit
                cg(torch.ones(n))
            assert counting.calls == [1, 1, 1]
            assert torch.equal(cg(torch.ones(5)), g(torch.ones(5)))  # a 4th length: eager
            assert counting.calls == [1, 1, 1]  # no new graph, none of the cached ones ran
            assert any(m.startswith("torch._dynamo hit config.recompile_limit (3)") for m in logged)
            cg(torch.ones(2))  # a length seen before: its cached graph runs
            cg(torch.ones(4))
            assert counting.calls == [2, 1, 2]
    finally:
        log.removeHandler(handler)
    dynamo.reset()
    with dynamo.config.patch(recompile_limit=2):
        strict = torch.compile(g, backend=Counting(), dynamic=False, fullgraph=True)
        strict(torch.ones(2))
        strict(torch.ones(3))
        with pytest.raises(dynamo.exc.FailOnRecompileLimitHit):
            strict(torch.ones(4))
    dynamo.reset()


def test_a_string_recompiles_on_every_value_a_float_once():
    """"A recompile storm": with the default dynamic=None a Python float becomes a graph input
    after one recompile; a string stays a constant and recompiles for every new value."""

    def f(x, scale, mode):
        return x * scale if mode.startswith("a") else x

    graphs = {}
    for name, args in (("float", [(float(i), "a") for i in range(1, 5)]),
                       ("string", [(1.0, f"a{i}") for i in range(4)])):
        torch._dynamo.reset()
        counting = Counting()
        cf = torch.compile(f, backend=counting)
        for scale, mode in args:
            assert torch.equal(cf(torch.ones(3), scale, mode), f(torch.ones(3), scale, mode))
        graphs[name] = len(counting.calls)
    torch._dynamo.reset()
    assert graphs == {"float": 2, "string": 4}


def test_fsdp2_backward_prefetches_the_next_unit():
    """"OOM at an all-gather": as a unit's backward begins, FSDP2 all-gathers the unit that ran
    before it in forward (its whole parameters), before this unit's gradients are computed.
    One process plays rank 0 of 2 on the fake backend: FSDP2's own code, no peer."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import profile

    torch.manual_seed(0)
    dist.init_process_group("fake", rank=0, world_size=2)
    try:
        model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(3)])  # 72 parameters each
        mesh = init_device_mesh("cpu", (2,))
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        x = torch.randn(2, 8)
        model(x).sum().backward()  # warm-up: lazy initialisation
        with profile(profile_memory=True) as prof:
            model(x).sum().backward()
    finally:
        dist.destroy_process_group()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    names = [e.name for e in events]
    backward = names.index("FSDP::pre_backward (2)")
    prefetch = names.index("FSDP::backward_prefetch for 1")
    first_mm = names.index("aten::mm", backward)  # block 2's first gradient product
    reshard = names.index("FSDP::post_backward_reshard (2)")
    assert backward < prefetch < first_mm < reshard
    gather = events[names.index("FSDP::all_gather (1)", prefetch)]
    assert gather.time_range.start < events[first_mm].time_range.start
    assert gather.cpu_memory_usage == 72 * 4  # block 1's whole float32 parameters
    assert names.index("FSDP::backward_prefetch for 0") > reshard  # one unit ahead, not two


def test_sdpa_falls_back_to_math_and_says_why():
    """"An attention call that falls back to math": the default call silently takes the
    math backend for inputs the CPU flash kernel declines; restricted to the flash kernel the
    same call raises after warning why; a backend this build lacks raises another message."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import profile

    def op(q, k, v, **kwargs):
        with profile() as prof:
            F.scaled_dot_product_attention(q, k, v, **kwargs)
        return next(e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product"))

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 4, 8, generator=g)  # (B, H, S, D)
    t = torch.randn(1, 2, 8, 4, generator=g).transpose(-1, -2)  # (B, H, S, D), stride(-1) 4
    assert op(x, x, x) == "aten::_scaled_dot_product_flash_attention_for_cpu"
    cases = {"dropout": ((x, x, x), {"dropout_p": 0.1}, "do not support non-zero dropout"),
             "stride": ((t, t, t), {}, "require the last dimension of the input to have stride 1"),
             "3-D": ((x[0], x[0], x[0]), {}, "to be 4 dimensional"),
             "value head size": ((x, x, torch.randn(1, 2, 4, 16, generator=g)), {},
                                 "to have the same last dimension")}
    for name, (qkv, kwargs, reason) in cases.items():
        assert op(*qkv, **kwargs) == "aten::_scaled_dot_product_attention_math", name
        with warnings.catch_warnings(record=True) as said, sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            warnings.simplefilter("always")
            with pytest.raises(RuntimeError, match="No available kernel"):
                F.scaled_dot_product_attention(*qkv, **kwargs)
        text = " ".join(str(w.message) for w in said)
        assert "Flash attention kernel not used because" in text and reason in text, name
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        with pytest.raises(RuntimeError, match="No viable backend for scaled_dot_product_attention"):
            F.scaled_dot_product_attention(x, x, x)


class Slow(torch.utils.data.Dataset):
    """Items 0 and 1 at once, item 2 after 2 seconds."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 2:
            time.sleep(2)
        return torch.tensor([i])


class Dies(torch.utils.data.Dataset):
    """The worker that loads item 1 is killed, as the kernel's OOM killer would."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([i])


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_dataloader_timeout_and_dead_worker():
    """"A DataLoader stall": `timeout=` turns a wait into an error after the batches already
    built; it needs workers; a dead worker raises at once."""
    from torch.utils.data import DataLoader

    got = []
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 1 seconds$"):
        for batch in DataLoader(Slow(), num_workers=1, timeout=1, multiprocessing_context="fork"):
            got.append(batch.item())
    assert got == [0, 1]
    with pytest.raises(AssertionError, match="_SingleProcessDataLoaderIter requires timeout == 0"):
        iter(DataLoader(Slow(), num_workers=0, timeout=1))
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"):
        list(DataLoader(Dies(), num_workers=1, multiprocessing_context="fork"))


def test_what_makes_two_runs_differ():
    """"Two runs that differ": a loader's iterator draws from the global generator (unless it
    has its own), torch's seed does not seed `random`, dropout in train() mode,
    `warn_only=True` naming an op with no deterministic implementation, and float32 addition
    depending on its order."""
    import random

    from torch import nn
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    plain = torch.rand(1)
    torch.manual_seed(0)
    iter(DataLoader(range(4)))  # num_workers=0, no shuffle: it still draws a base seed
    after_iter = torch.rand(1)
    torch.manual_seed(0)
    iter(DataLoader(range(4), generator=torch.Generator().manual_seed(1)))
    after_own = torch.rand(1)
    assert not torch.equal(plain, after_iter) and torch.equal(plain, after_own)
    random.seed(1)
    torch.manual_seed(0)
    first = random.random()
    random.seed(1)
    torch.manual_seed(5)
    assert random.random() == first
    drop, ones = nn.Dropout(0.5), torch.ones(16)
    assert not torch.equal(drop(ones), drop(ones))
    drop.eval()
    assert torch.equal(drop(ones), drop(ones))
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            torch.zeros(3).put_(torch.tensor([0, 2]), torch.tensor([1.0, 2.0]))
    finally:
        torch.use_deterministic_algorithms(False)
    assert any("put_ does not have a deterministic implementation" in str(w.message) for w in said)
    one, tiny = torch.tensor(1.0), torch.tensor(2.0**-24)  # float32: half of 1's last bit
    assert (one + tiny) + tiny == 1 and one + (tiny + tiny) > 1  # the order of additions

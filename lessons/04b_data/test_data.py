"""Tests of lesson 04b: documented outputs, the lesson's key values (the corpus, samplers and
padding, worker start methods and seeding, sharded streams, batches in flight, workers' threads
and the too-many-workers warning, the determinism switch), the exercises (batches against
PyTorch's samplers, pad_collate), and on a GPU pinned batches, seeding and the determinism
switches."""

import importlib
import inspect
import json
import os
import random
import re
import subprocess
import sys
import time
import tomllib
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from scripts.checker import read_cells


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_corpus_and_collate(lesson):
    ns = lesson.ns
    ds, vocab, lines = ns["ds"], ns["vocab"], ns["lines"]
    corpus = ns["HERE"].parent.parent / "data" / "tiny_corpus.txt"
    assert lines == corpus.read_text().splitlines() and len(ds) == len(lines)
    assert sorted(vocab.values()) == list(range(1, len(vocab) + 1))
    assert ns["collate"].__globals__["PAD"] == 0
    items = [ds[i] for i in (3, 0, 1)]
    b = ns["collate"](items)
    L = max(len(it["ids"]) for it in items)
    assert b["tokens"].shape == b["mask"].shape == (3, L) and b["mask"].dtype == torch.bool
    for row, m, it in zip(b["tokens"], b["mask"], items):
        n = len(it["ids"])
        assert torch.equal(row[:n], it["ids"]) and (row[n:] == 0).all()
        assert m[:n].all() and not m[n:].any()
    assert b["idx"] == [3, 0, 1]
    n = ns["lengths"]
    assert ns["widths"] == [max(n[i : i + 4]) for i in range(0, len(n), 4)]  # per batch
    assert min(ns["widths"]) < max(n)  # some batch is shorter than the corpus's longest line


def test_missing_corpus_message(lesson):
    with pytest.raises(FileNotFoundError, match="copy data/absent.txt"):
        lesson.ns["load_lines"]("absent.txt")


def test_worker_seeding(lesson):
    ns = lesson.ns
    run_0, run_a, run_b = ns["run_0"], ns["run_a"], ns["run_b"]
    assert run_0[0]["py"] != run_0[1]["py"] and ns["replays_random"](run_0)  # seeded per worker
    assert all(b["torch_seed"] == b["seed"] for b in run_a)  # torch.initial_seed() == info.seed
    broken = [dict(b, py=b["py"][::-1]) for b in run_0]
    assert not ns["replays_random"](broken)  # the replay check can fail
    assert [b["worker"][0] for b in run_a] == [0, 1, 0, 1]  # batch k from worker k % 2
    assert all(len(set(b["worker"])) == 1 for b in run_a)  # a batch comes from one worker
    assert run_0[0]["own"] == run_0[1]["own"]  # copied generator: same draws in both workers
    assert run_0[0]["glob"] != run_0[1]["glob"]  # NumPy's global RNG is seeded per worker
    assert run_a[0]["own"] != run_a[1]["own"] and run_a == run_b
    seeds = {b["worker"][0]: b["seed"][0] for b in run_a}
    assert seeds[1] == seeds[0] + 1
    idx = [i for b in run_a for i in b["idx"]]
    assert len(set(idx)) == len(idx)  # no index twice within an epoch
    # the prose: the loader draws base_seed from the generator first, then the permutation
    gen = torch.Generator().manual_seed(0)
    base_seed = torch.empty((), dtype=torch.int64).random_(generator=gen).item()
    assert seeds[0] == base_seed
    assert torch.randperm(len(ns["lines"]), generator=gen).tolist()[:12] == idx


def test_persistent_workers(lesson, text_data):
    ns = lesson.ns
    again = text_data.first_draws_per_epoch(ns["lines"], ns["vocab"], True, epochs=3)
    assert again[0] == ns["run_0"][0]["own"] != again[1] != again[2]  # each epoch moves on
    fresh = text_data.first_draws_per_epoch(ns["lines"], ns["vocab"], False)
    assert fresh[0] == fresh[1] == again[0]  # new workers restart the copy


def test_batches_in_flight(lesson, text_data, monkeypatch):
    ns = lesson.ns
    # what the workers unpickle must be the classes of the module they import (fresh here)
    monkeypatch.setitem(ns, "ds", text_data.Lines(ns["lines"], ns["vocab"]))
    monkeypatch.setitem(ns, "collate", text_data.collate)
    for workers, prefetch in [(0, None), (1, 3), (2, 2)]:
        ahead = workers * (prefetch or 0)  # num_workers x prefetch_factor
        assert ns["taken"](workers, prefetch) == (ahead, ahead + 1), (workers, prefetch)


def test_pinned_batches_need_a_gpu(lesson):
    assert lesson.ns["is_pinned"] is torch.cuda.is_available()
    # the prose, read from the loader's iterator: no pinning on MPS either, with a warning
    from torch.utils.data.dataloader import _BaseDataLoaderIter
    source = inspect.getsource(_BaseDataLoaderIter.__init__)
    assert 'if self._pin_memory_device == "mps":' in source and "not supported on MPS" in source


def test_streams(lesson):
    streams, n = lesson.ns["streams"], len(lesson.ns["lines"])
    dup = [i for _, idx in streams[False] for i in idx]
    assert sorted(dup) == sorted(list(range(n)) * 2)  # every worker read the whole stream
    once = [i for _, idx in streams[True] for i in idx]
    assert sorted(once) == list(range(n))
    for w, idx in streams[True]:
        assert all(i % 2 == w for i in idx)  # worker w keeps lines w, w + 2, ...
    assert [w for w, _ in streams[True]] == [0, 1] * 4  # the loader takes batches in turn


def test_never_forks_the_lesson_process(lesson, text_data, monkeypatch):
    """Python 3.12 warns when a multi-threaded process calls os.fork(); the lesson's workers
    start without it (forkserver on Linux, spawn elsewhere), and give the same batches."""
    if sys.platform.startswith("linux"):
        assert text_data.start_method() == "forkserver"

    def no_fork():
        raise AssertionError("os.fork() called in the lesson's process")

    monkeypatch.setattr(os, "fork", no_fork)
    ns = lesson.ns
    assert text_data.run_loader(ns["lines"], ns["vocab"], init=text_data.reseed) == ns["run_a"]


def test_spawn_gives_the_same_batches(lesson, text_data):
    """Section 3 under spawn (macOS's and Windows's start method), run here on Linux: what
    the workers need is importable, and the batches are the same. One loader: each spawned
    worker imports torch, seconds on a loaded machine. Timed against a loader started by the
    forkserver, whose workers start with torch already imported: the preload in
    `text_data.start_method`, which the lesson's section 3 describes."""
    ns = lesson.ns
    lines, vocab = ns["lines"], ns["vocab"]
    start = time.perf_counter()
    assert text_data.run_loader(lines, vocab, init=text_data.reseed, context="spawn") == ns["run_a"]
    spawn_s = time.perf_counter() - start
    if sys.platform.startswith("linux"):
        start = time.perf_counter()
        assert text_data.run_loader(lines, vocab, init=text_data.reseed) == ns["run_a"]
        forkserver_s = time.perf_counter() - start
        assert forkserver_s < spawn_s, (forkserver_s, spawn_s)


def test_spawn_runs_the_main_script_again(lesson):
    """The printed demonstration: under spawn, an unguarded script's child fails while
    bootstrapping; a guarded one runs its target."""
    spawned = lesson.ns["spawned"]
    assert spawned[True] == (["child ran", "exit code 0"], None)
    out, error = spawned[False]
    assert out == ["exit code 1"] and error.startswith("An attempt has been made to start a new process")


def test_main_script_hidden_restores_main(text_data):
    main = sys.modules["__main__"]
    before = (main.__dict__.get("__file__"), main.__spec__)
    with text_data.main_script_hidden():
        assert "__file__" not in main.__dict__ and main.__spec__ is None
    assert (main.__dict__.get("__file__"), main.__spec__) == before


def test_main_script_hidden_is_what_multiprocessing_reads(text_data, monkeypatch):
    """What spawn and forkserver send a new process (read when it starts): the script to run
    again, unless the script is hidden."""
    from multiprocessing import spawn

    script = types.ModuleType("__main__")
    script.__file__, script.__spec__ = "/somewhere/train.py", None
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert spawn.get_preparation_data("w")["init_main_from_path"].endswith("train.py")
    with text_data.main_script_hidden():
        data = spawn.get_preparation_data("w")
    assert not {"init_main_from_path", "init_main_from_name"} & set(data)
    assert script.__file__ == "/somewhere/train.py"


@pytest.mark.slow
def test_an_unguarded_dataloader_script_fails(tmp_path):
    """The prose's consequence, for real (slow: torch imported three times): a script that
    iterates a 2-worker DataLoader without the guard fails under the forkserver (Linux) or
    spawn; with the guard it works."""
    body = ("import multiprocessing, torch\n"
            "from torch.utils.data import DataLoader\n"
            "{guard}ctx = 'forkserver' if 'forkserver' in multiprocessing.get_all_start_methods() else 'spawn'\n"
            "{indent}print(len(list(DataLoader(list(range(8)), batch_size=2, num_workers=2, "
            "multiprocessing_context=ctx))), 'batches')\n")
    results = {}
    for guarded in (False, True):
        guard, indent = ('if __name__ == "__main__":\n    ', "    ") if guarded else ("", "")
        script = tmp_path / f"train_{guarded}.py"
        script.write_text(body.format(guard=guard, indent=indent))
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        results[guarded] = proc
    assert results[True].returncode == 0 and results[True].stdout.strip() == "4 batches"
    assert results[False].returncode != 0
    assert "bootstrapping phase" in " ".join(results[False].stderr.split())


def test_shown_code_is_the_module_code(course_lesson, text_data):
    """The ```python excerpts in the lesson's prose are verbatim parts of text_data.py."""
    source = inspect.getsource(text_data)
    blocks = []
    for cell in read_cells(course_lesson.script):
        if cell.kind == "markdown":
            blocks += re.findall(r"```python\n(.*?)```", cell.source, flags=re.S)
    assert len(blocks) == 5
    for block in blocks:
        assert block in source, block


@pytest.fixture
def text_data(lesson, monkeypatch):
    """The lesson's text_data module, imported afresh (the lesson run forgets it): workers
    started by spawn or forkserver import it by name from the lesson folder."""
    monkeypatch.syspath_prepend(str(lesson.ns["HERE"]))
    monkeypatch.delitem(sys.modules, "text_data", raising=False)
    return importlib.import_module("text_data")


def test_determinism_switch_restored(lesson):
    ns = lesson.ns
    assert ns["torch"].are_deterministic_algorithms_enabled() is False
    assert ns["acc"].tolist() == [2.0, 0.0, 1.0]
    assert ns["order_1"] == ns["order_2"] and ns["order_1"] != [list(range(i, i + 8)) for i in range(0, 32, 8)]
    assert ns["put_acc"].tolist() == [2.0, 0.0, 1.0]  # accumulate=True ran under the switch
    assert ns["empty_int"] == [torch.iinfo(torch.int32).max] * 2
    torch.use_deterministic_algorithms(True)
    try:  # the prose: put_ without accumulate raises on the CPU too, repeated index or not
        for idx in ([0, 0], [0, 2]):
            for kwargs in ({}, {"accumulate": False}):
                with pytest.raises(RuntimeError, match="put_ does not have a deterministic implementation"):
                    torch.zeros(3).put_(torch.tensor(idx), torch.tensor([1.0, 2.0]), **kwargs)
        # accumulate=True runs, and repeats bitwise: many additions into few cells
        g = torch.Generator().manual_seed(0)
        where, values = torch.randint(0, 4, (10_000,), generator=g), torch.randn(10_000, generator=g)
        sums = [torch.zeros(4).put_(where, values, accumulate=True) for _ in range(3)]
        assert all(torch.equal(sums[0], other) for other in sums[1:])
        assert torch.allclose(sums[0], torch.zeros(4).index_add_(0, where, values), atol=1e-4)
        # torch.empty: NaN for floating point, the largest value for integers
        assert torch.empty(3, dtype=torch.float64).isnan().all()
        for dtype in (torch.int8, torch.uint8, torch.int32, torch.int64):
            assert torch.empty(3, dtype=dtype).tolist() == [torch.iinfo(dtype).max] * 3, dtype
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.zeros(3).put_(torch.tensor([0, 2]), torch.tensor([1.0, 2.0])).tolist() == [1.0, 0.0, 2.0]



def test_default_collate_needs_equal_lengths(lesson):
    """The printed error is the lengths' doing: equal-length items stack."""
    ns = lesson.ns
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        next(iter(DataLoader(ns["ds"], batch_size=4)))
    by_length = {}
    for i, n in enumerate(ns["lengths"]):
        by_length.setdefault(n, []).append(i)
    same = next(idx for idx in by_length.values() if len(idx) >= 2)[:2]
    batch = next(iter(DataLoader(torch.utils.data.Subset(ns["ds"], same), batch_size=2)))
    assert batch["ids"].shape == (2, ns["lengths"][same[0]])


def test_workers_run_torch_on_one_thread(lesson, text_data):
    """What _worker_loop sets, whatever the main process has (3 in the lesson's cell, 2 here);
    in the main process the same probe reports the main process's setting."""
    ns = lesson.ns
    assert ns["threads_in_workers"] == {0: 1, 1: 1}
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert text_data.ThreadCount()[0] == (-1, 2)  # the probe reads the real setting
        assert text_data.worker_threads() == {0: 1, 1: 1}
    finally:
        torch.set_num_threads(before)


def test_too_many_workers_warning(lesson):
    """The constructor compares num_workers with torch._utils.cpu_count(), the usable CPUs."""
    ns = lesson.ns
    usable, too_many = ns["usable"], ns["too_many"]
    assert usable == torch._utils.cpu_count() and usable <= os.cpu_count()
    assert too_many[0] == []
    [w] = too_many[1]
    assert w.category is UserWarning
    assert f"This DataLoader will create {usable + 1} worker processes in total" in str(w.message)
    assert re.search(rf"suggested max number of worker in current system is {usable}\b", str(w.message))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs os.sched_setaffinity and at least 2 usable CPUs")
def test_a_cpuset_lowers_the_usable_cpus():
    """The prose: a cpuset (here the child's own sched_setaffinity, what `taskset` does) lowers
    the CPUs the loader counts, while os.cpu_count() stays. A CPU quota does not show: by hand,
    a process in a cgroup-v1 group with cpu.cfs_quota_us 50000 of cpu.cfs_period_us 100000
    (half a CPU) on a 2-CPU machine still saw 2 in sched_getaffinity and torch._utils.cpu_count()
    (torch 2.13.0, Linux); that needs root, so it is not a test."""
    probe = ("import os, warnings, torch\n"
             "from torch.utils.data import DataLoader\n"
             "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
             "with warnings.catch_warnings(record=True) as caught:\n"
             "    warnings.simplefilter('always')\n"
             "    DataLoader(range(4), num_workers=2)\n"
             "print(torch._utils.cpu_count(), os.cpu_count(), len(caught))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    usable, machine, warned = map(int, proc.stdout.split())
    assert usable == 1 and machine == os.cpu_count() >= 2 and warned == 1


def test_no_resumable_state_in_the_plain_loader():
    """The prose: a DataLoader has no state_dict; torchdata is not one of the course's
    dependencies, so StatefulDataLoader is described, never imported."""
    assert not hasattr(DataLoader, "state_dict") and not hasattr(DataLoader, "load_state_dict")
    root = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    pins = deps["dependencies"] + [d for extra in deps.get("optional-dependencies", {}).values() for d in extra]
    assert not any(d.lower().startswith("torchdata") for d in pins)
    code = "\n".join(c.source for c in read_cells(Path(__file__).with_name("data.py")) if c.kind == "code")
    assert "torchdata" not in code


# ----------------------------------------------------------------------------------------
# Exercise 1: batch indices, against BatchSampler over PyTorch's samplers


def torch_batches(n, batch_size, shuffle, drop_last, seed):
    data = range(n)
    sampler = (RandomSampler(data, generator=torch.Generator().manual_seed(seed))
               if shuffle else SequentialSampler(data))
    return [list(b) for b in BatchSampler(sampler, batch_size, drop_last)]


@pytest.mark.exercise("batch_indices")
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_indices_match_samplers(exercise_module, shuffle, drop_last):
    for n in [1, 2, 3, 5, 9, 10, 11, 20, 32]:
        for batch_size in [1, 2, 3, 5, 10, 40]:
            for seed in [0, 1, 7]:
                got = exercise_module.batch_indices(n, batch_size, shuffle, drop_last, seed)
                assert got == torch_batches(n, batch_size, shuffle, drop_last, seed), \
                    (n, batch_size, shuffle, drop_last, seed)


@pytest.mark.exercise("batch_indices")
def test_batch_indices_leaves_the_global_rngs_alone(exercise_module):
    """Shuffling must draw from a generator of its own: torch.manual_seed(seed) inside
    batch_indices would reset the training run's random stream (dropout, init) every epoch."""
    torch.manual_seed(1234)
    torch.rand(3)  # a state that no seed call reproduces
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    for shuffle in (False, True):
        exercise_module.batch_indices(20, 3, shuffle, False, seed=5)
    assert torch.equal(torch.get_rng_state(), states[0]), \
        "batch_indices changed torch's global RNG: use torch.Generator().manual_seed(seed)"
    assert random.getstate() == states[1] and (np.random.get_state()[1] == states[2]).all()


@pytest.mark.exercise("batch_indices")
def test_batch_indices_properties(exercise_module):
    f = exercise_module.batch_indices
    assert f(0, 4, False, False) == [] and f(0, 4, True, True) == []
    assert f(3, 5, False, True) == []  # only a short batch: dropped
    assert f(6, 3, False, True) == [[0, 1, 2], [3, 4, 5]]  # a full last batch stays
    assert f(7, 3, True, False, seed=5) == f(7, 3, True, False, seed=5)
    assert f(30, 4, True, False, seed=0) != f(30, 4, True, False, seed=1)
    flat = [i for b in f(30, 4, True, False, seed=3) for i in b]
    assert sorted(flat) == list(range(30)) and flat != list(range(30))
    assert all(isinstance(i, int) for s in (False, True) for b in f(5, 2, s, False) for i in b)


# ----------------------------------------------------------------------------------------
# Exercise 2: pad_collate, against batches padded by hand


def reference_pad(seqs, pad_id):
    L = max((len(s) for s in seqs), default=0)
    tokens = [list(map(int, s)) + [pad_id] * (L - len(s)) for s in seqs]
    mask = [[True] * len(s) + [False] * (L - len(s)) for s in seqs]
    return tokens, mask, L


def check_pad(f, seqs, pad_id):
    tokens, mask = f(seqs, pad_id=pad_id)
    want_tokens, want_mask, L = reference_pad(seqs, pad_id)
    assert tokens.dtype == torch.int64 and mask.dtype == torch.bool, (tokens.dtype, mask.dtype)
    assert tuple(tokens.shape) == tuple(mask.shape) == (len(seqs), L), (tokens.shape, mask.shape)
    assert tokens.tolist() == want_tokens and mask.tolist() == want_mask, seqs


@pytest.mark.exercise("pad_collate")
@pytest.mark.parametrize("case", [
    ([[5, 6, 7], [8]], 0),
    ([[5, 6, 7], [8]], -1),  # pad_id is used, not 0
    ([[3, 0, 4], [0]], 0),  # real tokens equal to the pad id: the mask still says True
    ([[1], []], 0),  # an empty sequence: a row of padding
    ([[], []], 0),  # all empty: L == 0
    ([], 0),  # no sequence at all: shape (0, 0)
    ([[2, 2, 2, 2]], 9),  # one sequence: no padding
], ids=["basic", "pad-id", "zero-tokens", "one-empty", "all-empty", "empty-batch", "single"])
def test_pad_collate_hand_picked(exercise_module, case):
    check_pad(exercise_module.pad_collate, *case)


@pytest.mark.exercise("pad_collate")
def test_pad_collate_random_tensors(exercise_module):
    rng = random.Random(4)
    for _ in range(100):
        seqs = [torch.tensor([rng.randrange(5) for _ in range(rng.randint(0, 6))],
                             dtype=rng.choice([torch.int64, torch.int32]))
                for _ in range(rng.randint(1, 5))]
        check_pad(exercise_module.pad_collate, seqs, rng.choice([0, 99]))


@pytest.mark.exercise("pad_collate")
def test_pad_collate_pads_to_the_batch(exercise_module):
    short, _ = exercise_module.pad_collate([[1, 2], [3]])
    long, _ = exercise_module.pad_collate([[1, 2, 3, 4, 5, 6], [7]])
    assert short.shape == (2, 2) and long.shape == (2, 6)


# ----------------------------------------------------------------------------------------
# GPU: pinned batches and the copy, seeding, and the determinism switches beyond
# use_deterministic_algorithms. Written without a GPU: unverified until the
# GPU report runs them. They import text_data alone (no lesson run: the GPU machine has
# torch and pytest, not necessarily the notebook tools or matplotlib).


@pytest.fixture
def text_data_alone(monkeypatch):
    folder = Path(__file__).resolve().parent
    monkeypatch.syspath_prepend(str(folder))  # spawn and forkserver workers import it by name
    monkeypatch.delitem(sys.modules, "text_data", raising=False)
    return importlib.import_module("text_data")


def corpus(td):
    lines = (Path(__file__).resolve().parents[2] / "data" / "tiny_corpus.txt").read_text().split("\n")
    lines = [ln for ln in lines if ln.strip()]
    vocab = {w: k + 1 for k, w in enumerate(sorted({w for ln in lines for w in ln.split()}))}
    return td.Lines(lines, vocab)


def copy_times(src, dst, repeats=10):
    """(fastest full copy src -> dst, fastest return of the copy call alone), in seconds."""
    full = call = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        returned = time.perf_counter()
        torch.cuda.synchronize()
        full, call = min(full, time.perf_counter() - start), min(call, returned - start)
    return full, call


@pytest.mark.cuda
def test_pinned_batches_and_the_copy_on_gpu(text_data_alone, record_property):
    td = text_data_alone
    loader = torch.utils.data.DataLoader(corpus(td), batch_size=4, collate_fn=td.collate, pin_memory=True,
                                         num_workers=2, multiprocessing_context=td.start_method())
    with td.main_script_hidden():
        it = iter(loader)
    batch = next(it)
    del it
    assert batch["tokens"].is_pinned() and batch["mask"].is_pinned()  # pinned by the loader
    on_gpu = batch["tokens"].to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(on_gpu.cpu(), batch["tokens"])
    # 64 MiB host -> device, from pinned and from pageable memory
    pageable = torch.randn(16 * 2**20)  # float32: 64 MiB
    pinned, dst = pageable.pin_memory(), torch.empty(16 * 2**20, device="cuda")
    full_pinned, call_pinned = copy_times(pinned, dst)
    full_pageable, call_pageable = copy_times(pageable, dst)
    gbps = {k: pageable.nbytes / t / 1e9 for k, t in (("pinned", full_pinned), ("pageable", full_pageable))}
    record_property("H2D copy of 64 MiB from pinned memory [GB/s]", round(gbps["pinned"], 1))
    record_property("H2D copy of 64 MiB from pageable memory [GB/s]", round(gbps["pageable"], 1))
    record_property("non_blocking copy call returns after, pinned source [ms]", round(call_pinned * 1e3, 3))
    record_property("non_blocking copy call returns after, pageable source [ms]", round(call_pageable * 1e3, 3))
    assert torch.equal(dst.cpu(), pageable)
    assert gbps["pinned"] > gbps["pageable"], gbps
    assert call_pinned < full_pinned / 2  # the call returned while the copy went on


@pytest.mark.cuda
def test_manual_seed_seeds_the_gpu_too():
    """Section 6's "(and of every GPU)": the list bug on a device and .item()'s wait moved to
    lesson 04a's GPU test."""
    draws = []
    for _ in range(2):
        torch.manual_seed(3)  # seeds every GPU's generator too
        draws.append(torch.randn(5, device="cuda"))
    assert torch.equal(*draws) and torch.cuda.initial_seed() == 3


DETERMINISM_PROBE = r"""
import json, os, torch
out = {"cublas_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}


def attempt(name, fn):  # the result, or the error's start: one failure spoils nothing else
    try:
        out[name] = fn()
    except RuntimeError as err:
        out[name] = "error: " + " ".join(str(err).split())[:400]


def scatter_runs(n=10):  # runs differing bitwise from the first: float atomics into 16 bins
    g = torch.Generator(device="cuda").manual_seed(0)
    src = torch.randn(2**20, device="cuda", generator=g)
    idx = torch.randint(0, 16, (2**20,), device="cuda", generator=g)
    runs = [torch.zeros(16, device="cuda").scatter_add_(0, idx, src) for _ in range(n)]
    return sum(not torch.equal(r, runs[0]) for r in runs[1:])


def conv_wgrad_runs(n=5):  # runs whose weight gradient differs bitwise from the first
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
    x = torch.randn(32, 64, 32, 32, device="cuda")
    grads = []
    for _ in range(n):
        conv.zero_grad()
        conv(x).square().mean().backward()
        grads.append(conv.weight.grad.clone())
    return sum(not torch.equal(g, grads[0]) for g in grads[1:])


torch.use_deterministic_algorithms(True)
a = torch.randn(256, 256, device="cuda")
attempt("mm_equal", lambda: torch.equal(a @ a, a @ a))
attempt("histc", lambda: torch.histc(torch.rand(100, device="cuda")).sum().item())
attempt("scatter_differing_deterministic", scatter_runs)
torch.use_deterministic_algorithms(False)
attempt("scatter_differing_default", scatter_runs)
attempt("conv_differing_default", conv_wgrad_runs)
torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
attempt("conv_differing_cudnn_deterministic", conv_wgrad_runs)
print(json.dumps(out))
"""


def determinism_probe(cublas_config):
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    if cublas_config:
        env["CUBLAS_WORKSPACE_CONFIG"] = cublas_config
    proc = subprocess.run([sys.executable, "-c", DETERMINISM_PROBE], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.cuda
def test_determinism_switches_on_gpu(record_property):
    """In fresh processes: cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when first checked."""
    unset, fixed = determinism_probe(None), determinism_probe(":4096:8")
    assert "CUBLAS_WORKSPACE_CONFIG" in str(unset["mm_equal"]), unset  # cuBLAS refuses without it
    assert fixed["mm_equal"] is True, fixed  # runs, and repeats bitwise, with the variable set
    assert fixed["histc"].startswith("error: histc"), fixed  # no deterministic version on CUDA
    assert fixed["scatter_differing_deterministic"] == 0
    assert fixed["conv_differing_cudnn_deterministic"] == 0
    record_property("scatter_add_ runs differing from the first, default mode [of 9]",
                    fixed["scatter_differing_default"])
    record_property("scatter_add_ runs differing from the first, deterministic mode [of 9]",
                    fixed["scatter_differing_deterministic"])
    record_property("conv weight-grad runs differing from the first, cuDNN defaults [of 4]",
                    fixed["conv_differing_default"])
    record_property("conv weight-grad runs differing from the first, cudnn.deterministic [of 4]",
                    fixed["conv_differing_cudnn_deterministic"])

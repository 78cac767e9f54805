"""Tests of lesson 04: documented outputs, the lesson's key values (registries, the list bug,
tied weights, the three switches, the leak and its figure, padding, worker seeding), and the
exercises (a registry against nn.Module, batches against PyTorch's samplers, pad_collate)."""

import importlib
import inspect
import json
import os
import random
import re
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from scripts.checker import read_cells
from scripts.pytest_course import autograd_node_names


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


# ----------------------------------------------------------------------------------------
# Key values of the lesson, read from the namespace the script left behind


def test_setattr_sorts_values(lesson):
    tiny = lesson.ns["tiny"]
    assert list(tiny._parameters) == ["scale"] and list(tiny._modules) == ["lin"]
    assert list(tiny._buffers) == ["steps", "mask"] and "note" in tiny.__dict__
    assert list(tiny.state_dict()) == ["scale", "steps", "lin.weight", "lin.bias"]
    assert tiny._non_persistent_buffers_set == {"mask"}


def test_plain_list_hides_layers(lesson):
    ns = lesson.ns
    plain, fixed, count = ns["plain"], ns["fixed"], ns["count"]
    assert count(plain.parameters()) == count(plain.head.parameters())
    everything = count(plain.head.parameters()) + sum(count(m.parameters()) for m in plain.layers)
    assert count(fixed.parameters()) == everything == 85
    assert all(not k.startswith("layers") for k in plain.state_dict())
    assert len(fixed.state_dict()) == 2 * (len(fixed.layers) + 1)
    # after the lesson's .to(float64): the hidden list layers were left behind
    assert plain.layers[0].weight.dtype == torch.float32 and plain.head.weight.dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in fixed.parameters())
    # after the lesson's .eval(): the list's layers stayed in training mode
    assert plain.layers[0].training and not plain.head.training
    assert not any(m.training for m in fixed.modules())
    torch.manual_seed(1)
    xb = torch.randn(8, 4)
    step = ns["step_moves_first_layer"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert step(ns["Stack"](wrap=list), xb) == (True, False)  # a gradient, but no update
    assert caught == []  # "no error, no warning"
    assert step(ns["Stack"](wrap=nn.ModuleList), xb) == (True, True)


def test_tied_weights_and_strict_loading(lesson):
    ns = lesson.ns
    lm = ns["TinyLM"]()
    assert len(list(lm.parameters())) == 1 and lm.head.weight is lm.emb.weight
    assert list(lm.state_dict()) == ["emb.weight", "head.weight"]
    assert [n for n, _ in lm.named_buffers()] == ["causal"]
    with pytest.raises(RuntimeError, match=r'(?s)Missing key.*"head.weight".*Unexpected key.*"extra.bias"'):
        lm.load_state_dict(ns["bad"])
    assert (lm.emb.weight == 0).all()  # the matching key was copied before the error
    assert ns["storages_written"](lm.state_dict()) == 1  # two keys, one storage
    untied = {k: v.clone() for k, v in lm.state_dict().items()}
    assert ns["storages_written"](untied) == 2  # the count is not a constant
    assert ns["tied_grad_is_sum"](ns["TinyLM"](), torch.tensor([0, 5, 9, 5]))
    assert ns["TinyLM"]().to("meta").causal.is_meta


def test_three_switches_table(lesson):
    rows = lesson.ns["rows"]
    assert len(rows) == 6
    for label, row in rows.items():
        mode, ctx = label.split(" + ")
        assert row["same output twice"] == (mode == "eval"), label
        assert row["running_mean moved"] == (mode == "train"), label
        assert row["output has grad_fn"] == (ctx == "grad"), label
        assert row["inference tensor"] == (ctx == "inference_mode"), label


def test_inference_tensors(lesson):
    ns = lesson.ns
    assert ns["t_inf"].is_inference() and not ns["t_inf"].clone().is_inference()
    for attempt in ns["attempts"].values():
        with pytest.raises(RuntimeError, match="[Ii]nference tensor"):
            attempt()


def test_leak_counts(lesson):
    leak = lesson.ns["leak"]
    nodes = [n for n, _ in leak["train"]]
    assert [b - a for a, b in zip(nodes, nodes[1:])] == [7] * 4  # one step's graph per step
    assert [n for n, _ in leak["eval"]] == nodes
    assert all(b == 0 for _, b in leak["train"]) and leak["item"] == leak["detach"] == [(0, 0)] * 5
    totals = lesson.ns["totals"]
    assert isinstance(totals["item"], float) and isinstance(totals["detach"], torch.Tensor)
    assert totals["detach"].grad_fn is None and abs(totals["detach"].item() - totals["item"]) < 1e-5
    saved = [b for _, b in leak["eval"]]
    per_step = 32 * 64 * 4 + 32 * 1 * 4  # hidden activation + prediction, float32
    assert [b - a for a, b in zip(saved, saved[1:])] == [per_step] * 4
    # the first step also holds the input (32, 16), the target (32, 1) and the second weight (1, 64)
    assert saved[0] == per_step + (32 * 16 + 32 + 64) * 4


def test_leak_nodes_per_step(lesson):
    """The seven nodes the prose names, one set per step; the four AccumulateGrad shared."""
    graph_stats = lesson.ns["graph_stats"]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    total = 0.0
    for _ in range(2):
        total = total + nn.functional.mse_loss(model(x), y)
    names = autograd_node_names(total)
    per_step = ["AddBackward0", "AddmmBackward0", "AddmmBackward0", "MseLossBackward0",
                "ReluBackward0", "TBackward0", "TBackward0"]
    assert sorted(names) == sorted(per_step * 2 + ["AccumulateGrad"] * 4)
    assert graph_stats(total)[0] == len(names)
    a = torch.ones(2, requires_grad=True)
    stats = lesson.ns["graph_stats"]
    assert stats(a.sum()) == (2, 0)  # SumBackward0 + AccumulateGrad, nothing saved
    assert stats(a * a) == (2, 8)  # self and other: one storage of 2 floats, counted once
    assert stats(a) == stats(1.5) == (0, 0)


def test_leak_figure(lesson):
    ns = lesson.ns
    leak = ns["leak"]
    fig = ns["plot_leak"](leak)
    left, right = fig.get_axes()
    assert [line.get_label() for line in left.lines] == [ns["LABELS"][k] for k in leak]
    for line, stats in zip(left.lines, leak.values()):
        assert list(line.get_ydata()) == [n for n, _ in stats]
    for line, stats in zip(right.lines, leak.values()):
        assert list(line.get_ydata()) == [b / 1024 for _, b in stats]
    assert left.get_xlabel() == "step" and "KiB" in right.get_ylabel()
    assert (ns["HERE"] / "loss_leak.png").is_file()


def test_optimizer_groups(lesson):
    ns = lesson.ns
    mlp, opt = ns["mlp"], ns["opt"]
    names = {id(p): n for n, p in mlp.named_parameters()}
    groups = [[names[id(p)] for p in g["params"]] for g in opt.param_groups]
    assert groups == [["0.weight", "3.weight"], ["0.bias", "1.weight", "1.bias", "3.bias"]]
    assert [g["weight_decay"] for g in opt.param_groups] == [ns["WD"], 0.0]
    assert [g["params"] for g in ns["opt_sd"]["param_groups"]] == [[0, 1], [2, 3, 4, 5]]
    assert ns["opt_sd"]["state"] == {} and ns["shrunk"] is True and ns["kept"] is True
    assert sorted(opt.state_dict()["state"]) == list(range(6))
    # the shrink is AdamW's decoupled decay alone: plain Adam with zero gradients moves nothing
    p = nn.Parameter(torch.ones(3))
    adam = torch.optim.Adam([p], lr=0.01)
    p.grad = torch.zeros(3)
    adam.step()
    assert torch.equal(p, torch.ones(3))
    # loading checks the number and sizes of the groups, nothing else
    others, named = ns["others"], ns["named"]
    for what in ("one group", "groups swapped"):
        assert not others[what].state  # refused: nothing loaded
    wrong = others["same sizes, other params"].state[named["0.bias"]]["exp_avg"]
    assert wrong.shape == named["0.weight"].shape != named["0.bias"].shape


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
    """Section 9 under spawn (macOS's and Windows's start method), run here on Linux: what
    the workers need is importable, and the batches are the same. One loader: each spawned
    worker imports torch, seconds on a loaded machine. Timed against the forkserver, whose
    workers start with torch already imported (the preload in start_method)."""
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
    torch.use_deterministic_algorithms(True)
    try:  # the prose: put_ raises on the CPU too, repeated index or not
        for idx in ([0, 0], [0, 2]):
            with pytest.raises(RuntimeError, match="put_ does not have a deterministic implementation"):
                torch.zeros(3).put_(torch.tensor(idx), torch.tensor([1.0, 2.0]))
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.zeros(3).put_(torch.tensor([0, 2]), torch.tensor([1.0, 2.0])).tolist() == [1.0, 0.0, 2.0]


# ----------------------------------------------------------------------------------------
# Exercise 1: the registry, against nn.Module on the same structures


def build(spec, Mod, List, params):
    """A tree from spec, a list of (name, kind, arg): kind "param" (arg: an index into the
    shared pool `params`, so repeats tie weights), "module" (arg: a sub-spec) or "list"
    (arg: a list of sub-specs). The same Parameter objects go into both trees."""
    m = Mod()
    for name, kind, arg in spec:
        if kind == "param":
            setattr(m, name, params[arg])
        elif kind == "module":
            setattr(m, name, build(arg, Mod, List, params))
        else:
            setattr(m, name, List([build(e, Mod, List, params) for e in arg]))
    return m


def random_spec(rng, depth=0):
    entries, names = [], rng.sample("abcdefgh", rng.randint(1, 5))
    for name in names:
        kind = rng.choice(["param", "param", "module", "list"] if depth < 2 else ["param"])
        if kind == "param":
            entries.append((name, "param", rng.randrange(6)))  # repeats: tied weights
        elif kind == "module":
            sub = random_spec(rng, depth + 1)
            entries.append((name, "module", sub))
        else:
            entries.append((name, "list", [random_spec(rng, depth + 1)
                                           for _ in range(rng.randint(0, 3))]))
    return entries


def check_same(ours, ref):
    got = ours.named_parameters()
    want = list(ref.named_parameters())
    assert [n for n, _ in got] == [n for n, _ in want]
    assert all(a is b for (_, a), (_, b) in zip(got, want))
    assert all(a is b for a, b in zip(ours.parameters(), ref.parameters()))
    assert len(ours.parameters()) == len(list(ref.parameters()))
    sd, ref_sd = ours.state_dict(), ref.state_dict()
    assert list(sd) == list(ref_sd)
    assert all(sd[k].data_ptr() == ref_sd[k].data_ptr() for k in sd)


@pytest.mark.exercise("Module")
def test_registry_matches_nn_module_random(exercise_module):
    rng = random.Random(0)
    for _ in range(200):
        params = [nn.Parameter(torch.full((k + 1,), float(k))) for k in range(6)]
        spec = random_spec(rng)
        ours = build(spec, exercise_module.Module, exercise_module.ModuleList, params)
        ref = build(spec, nn.Module, nn.ModuleList, params)
        check_same(ours, ref)


@pytest.mark.exercise("Module")
def test_registry_hand_picked(exercise_module):
    Module, ModuleList = exercise_module.Module, exercise_module.ModuleList
    w, b, v = (nn.Parameter(torch.ones(n)) for n in (2, 3, 4))
    pairs = []
    for M, L in ((Module, ModuleList), (nn.Module, nn.ModuleList)):
        root = M()
        root.w = w
        root.blocks = L([M(), M()])
        root.blocks[0].w = w  # tied with root.w
        root.blocks[1].b = b
        root.blocks.append(M())
        root.blocks[-1].v = v
        root.head = root.blocks[1]  # the same submodule under a second name
        root.z = b  # a parameter registered after the submodules still comes first
        pairs.append(root)
    ours, ref = pairs
    check_same(ours, ref)
    assert [n for n, _ in ours.named_parameters()] == ["w", "z", "blocks.2.v"]
    assert list(ours.state_dict()) == ["w", "z", "blocks.0.w", "blocks.1.b", "blocks.2.v", "head.b"]
    assert ours.named_parameters(prefix="model")[0][0] == "model.w"


@pytest.mark.exercise("Module")
def test_setattr_and_getattr(exercise_module):
    Module = exercise_module.Module
    m, p, q = Module(), nn.Parameter(torch.ones(1)), nn.Parameter(torch.zeros(1))
    m.a, m.t, m.b, m.sub = p, torch.ones(3), q, Module()
    assert m.a is p and isinstance(m.sub, Module) and m.t.shape == (3,)
    assert list(m._parameters) == ["a", "b"] and list(m._modules) == ["sub"]
    # a plain tensor: not registered
    assert "t" not in m._parameters and [id(x) for x in m.parameters()] == [id(p), id(q)]
    m.a = q  # re-assigning keeps the place
    assert list(m._parameters) == ["a", "b"] and m.a is q
    m.sub = p  # a module name re-used for a parameter moves it
    assert "sub" not in m._modules and list(m._parameters) == ["a", "b", "sub"]
    m.b = 3  # an ordinary value replaces the registration
    assert m.b == 3 and "b" not in m._parameters
    with pytest.raises(AttributeError):
        m.missing  # noqa: B018 - the read itself must raise


@pytest.mark.exercise("Module")
def test_module_list(exercise_module):
    Module, ModuleList = exercise_module.Module, exercise_module.ModuleList
    mods = [Module() for _ in range(3)]
    ml = ModuleList(mods[:2])
    ml.append(mods[2])
    assert len(ml) == 3 and list(ml) == mods and ml[0] is mods[0] and ml[-1] is mods[2]
    assert list(ml._modules) == ["0", "1", "2"] and len(ModuleList()) == 0
    mods[1].w = nn.Parameter(torch.ones(2))
    assert [n for n, _ in ml.named_parameters()] == ["1.w"]


# ----------------------------------------------------------------------------------------
# Exercise 2: batch indices, against BatchSampler over PyTorch's samplers


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
    assert all(isinstance(i, int) for b in f(5, 2, True, False) for i in b)


# ----------------------------------------------------------------------------------------
# Exercise 3: pad_collate, against batches padded by hand


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
# GPU: pinned batches and the copy, the list bug on a device, seeding, and the determinism
# switches beyond use_deterministic_algorithms. Written without a GPU: unverified until the
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
def test_list_layers_seeding_and_item_on_gpu(record_property):
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(4, 4)]  # a plain list: .to() misses it
            self.head = nn.Linear(4, 1)

        def forward(self, x):
            return self.head(torch.tanh(self.layers[0](x)))

    with pytest.raises(RuntimeError, match="same device"):  # the lesson: it names devices
        Stack().to("cuda")(torch.randn(2, 4, device="cuda"))
    draws = []
    for _ in range(2):
        torch.manual_seed(3)  # seeds every GPU's generator too
        draws.append(torch.randn(5, device="cuda"))
    assert torch.equal(*draws) and torch.cuda.initial_seed() == 3
    loss = (torch.randn(64, device="cuda") ** 2).mean()
    torch.cuda.set_sync_debug_mode("error")  # a synchronizing call raises
    try:
        total = loss.detach()  # stays on the GPU: no wait
        with pytest.raises(RuntimeError, match="synchroniz"):
            loss.item()  # copies to the host: waits for the GPU
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert total.is_cuda

    def fastest_us(fn, repeats=20):
        best = float("inf")
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        return best * 1e6

    record_property("loss.item() on an idle GPU, fastest of 20 [us]", round(fastest_us(loss.item), 1))
    record_property("loss.detach(), fastest of 20 [us]", round(fastest_us(loss.detach), 1))


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

"""Tests of lesson 12a: documented outputs; the single-process restore, the full training
state, resharding between one process and 2 FSDP2 ranks (both ways, in one launch), async
save (its writer held at a gate until step 3 ran) and the safety demos, read from the
narrative's namespace and from the ranks' output; the exercises.

The narrative launches ranks (1 launch per run): all tests here are `multirank`. (That no
rank outlives the lesson is checked by the `lesson` fixture.)"""

import re

import pytest
import torch
from safetensors.torch import save_file

from scripts.multirank import section

pytestmark = pytest.mark.multirank


def test_single_process_restore_is_bitwise(lesson):
    ns = lesson.ns
    assert torch.equal(ns["loss2"], ns["loss2_restored"])  # rtol=0, atol=0
    model, fresh, optim, fresh_optim = ns["model"], ns["fresh"], ns["optim"], ns["fresh_optim"]
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(p, q)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optim.state[p][key], fresh_optim.state[q][key]), key
        assert fresh_optim.state[q]["step"].item() == 2
    # the restore really overwrote other weights: seed 1's model differs from seed 0's
    assert not torch.equal(ns["tiny"](1)[0].weight, ns["tiny"](0)[0].weight)


def test_dcp_load_alone_leaves_the_lr_to_set_state_dict(lesson):
    ns = lesson.ns
    assert torch.equal(ns["other"].weight, ns["weight1"])  # filled in place by dcp.load alone
    assert ns["filled"] == (True, True) and ns["exp_avg1"].abs().sum() > 0  # exp_avg too, not zeros
    assert not torch.equal(ns["tiny"](1)[0].weight, ns["weight1"])  # ... over other weights
    assert ns["lr_pair"] == (0.5, 0.1)  # the optimizer kept its lr; the template got the saved one
    assert ns["lr_after"] == 0.1  # set_state_dict handed it over


def test_script_outputs(lesson):
    lesson.check()


def test_notebook_outputs(lesson_notebook):
    lesson_notebook.check()


def test_metadata_lists_model_and_optimizer(lesson):
    one = lesson.ns["meta"].state_dict_metadata  # section 1's single-process checkpoint
    assert {"model.weight", "model.bias", "optim.state.weight.step", "optim.state.weight.exp_avg",
            "optim.state.weight.exp_avg_sq", "optim.param_groups.0.lr",
            "optim.param_groups.0.betas", "optim.param_groups.0.params"} <= set(one)
    assert not hasattr(one["optim.param_groups.0.betas"], "size")  # pickled bytes, not a tensor
    assert list(one["model.weight"].size) == [2, 4] and list(one["optim.state.bias.exp_avg_sq"].size) == [2]
    # every tensor item, 8 floats, 2 or a scalar, has the same byte length, far above its data
    numels = {lesson.ns["meta"].state_dict_metadata[i.fqn].size.numel() for i in lesson.ns["items"]}
    assert numels == {8, 2, 1} and len(lesson.ns["sizes"]) == 1 and lesson.ns["sizes"][0] > 32 * 10
    meta = lesson.ns["sharded"]  # the 2-rank checkpoint's
    keys = set(meta.state_dict_metadata)
    assert {"model.0.weight", "optim.state.0.weight.exp_avg", "optim.state.0.weight.exp_avg_sq",
            "optim.state.0.weight.step", "optim.param_groups.0.lr", "sched.last_epoch", "step"} <= keys
    chunks = meta.state_dict_metadata["model.0.weight"].chunks
    assert [(list(c.offsets), list(c.sizes)) for c in chunks] == [([0, 0], [8, 8]), ([8, 0], [8, 8])]
    # the plain `step` is stored once, by one rank: the file the lesson names
    assert sum(i.fqn == "step" for i in meta.storage_data) == 1


def test_full_state_resumes_exactly_and_partial_states_diverge(lesson):
    ns = lesson.ns
    runs, log = ns["runs"], ns["log"]
    ref = [s["loss"] for s in log[6:]]
    losses = {k: [s["loss"] for s in steps] for k, (_, steps) in runs.items()}
    lrs = {k: [s["lr"] for s in steps] for k, (_, steps) in runs.items()}
    assert losses["full state"] == ref and lrs["full state"] == lrs["uninterrupted"]
    for p, q in zip(runs["full state"][0].model.parameters(), ns["straight"].model.parameters()):
        assert torch.equal(p, q)
    weights = runs["weights only"][1]
    assert weights[0]["batch"] == log[0]["batch"] != log[6]["batch"]  # the epoch started over
    assert lrs["uninterrupted"] == [0.05, 0.05, 0.025, 0.025, 0.025, 0.025]
    assert lrs["weights only"] == [0.05, 0.05, 0.05, 0.05, 0.025, 0.025]  # halved 2 steps late
    no_rng = runs["all but RNG"][1]
    assert no_rng[0]["batch"] == log[6]["batch"] and no_rng[0]["lr"] == log[6]["lr"]
    assert no_rng[0]["loss"] != log[6]["loss"]  # only dropout's mask differs


def test_one_process_checkpoint_is_one_chunk(lesson):
    single = lesson.ns["single"].state_dict_metadata  # step1_one, saved before the launch
    chunks = single["model.0.weight"].chunks
    assert [(list(c.offsets), list(c.sizes)) for c in chunks] == [([0, 0], [16, 8])]
    assert {"optim.state.0.weight.exp_avg", "sched.last_epoch", "step"} <= set(single)


def test_reshard_launch_and_two_rank_reloads(lesson):
    ns = lesson.ns
    run = ns["run"]
    assert run.ok and run.attempts == [0] and sorted(run.out) == [0, 1], run.describe()
    for err in run.err.values():
        assert "Traceback" not in err and "Warning" not in err, err
    reload = section(run, "reload")[0]
    assert reload[0].endswith("equal True"), reload
    assert reload[1] == "rank 0: parameters after step 2 bitwise equal to the uninterrupted run: True"
    for rank in (0, 1):
        assert f"rank {rank}: local weight shard (8, 8) of global (16, 8)" in section(run, "save")[rank]


def test_one_to_two_loads_what_one_process_saved(lesson):
    ns = lesson.ns
    out = section(ns["run"], "one to two")
    for rank in (0, 1):
        assert f"rank {rank}: loaded local weight shard (8, 8) from the full (16, 8)" in out[rank]
    assert re.fullmatch(r"rank 0: restored step 1 of one process; step 2 loss \d\.\d{6}, equal True", out[0][-2])
    assert out[0][-1] == "rank 0: parameters after step 2 bitwise equal to the uninterrupted run: True"


def test_two_to_one_resharding_is_bitwise(lesson):
    ns = lesson.ns
    ref = ns["ref"]
    assert ns["one_loss"] == ref["loss"]
    assert all(torch.equal(p, ref["params"][n]) for n, p in ns["net"].named_parameters())
    assert ns["step"] == 1 and ns["net"][0].weight.shape == (16, 8)
    assert ns["sched"].last_epoch == 2 and ns["opt"].state[ns["net"][0].weight]["step"].item() == 2
    assert 0 < ns["gap"] < 1e-6  # one backward over 8 rows: the same math, other last bits


def test_dcp_to_torch_save(lesson):
    ns = lesson.ns
    flat, before = ns["flat"], ns["before"]
    assert sorted(flat) == ["model", "optim", "sched", "step"] and flat["step"] == 1
    assert all(torch.equal(flat["model"][n], before[n]) for n in before)


def test_async_save_overlaps_and_holds_the_staged_state(lesson):
    ns = lesson.ns
    out = section(ns["run"], "async")
    assert re.fullmatch(r"rank 0: async_save returned after [\d.]+ ms \(state staged\)", out[0][0]), out
    for rank in (0, 1):  # step 3 finished while the writer was held at the gate: not done
        (line,) = [x for x in out[rank] if x.startswith(f"rank {rank}: step 3 done ")]
        assert line.endswith("; checkpoint finished before the gate opened: False"), line
    assert re.fullmatch(r"rank 0: future.result\(\) returned after [\d.]+ ms", out[0][2]), out
    assert out[0][3] == "rank 0: shards written by thread 'AsyncCheckpointExecutor_0', not 'MainThread'"
    assert out[0][4] == "rank 0: step2 has .metadata: True"
    # the checkpoint holds the step-2 parameters although step 3 changed them meanwhile
    assert all(torch.equal(ns["msd2"][n], ns["ref"]["params"][n]) for n in ns["msd2"])
    assert not torch.equal(ns["msd2"]["0.weight"], ns["before"]["0.weight"])  # not step 1's


def test_weights_only_refuses_the_pickle(lesson):
    ns = lesson.ns
    assert ns["load_error"] == "UnpicklingError"  # torch.load(path), its default weights_only=True
    assert ns["refusal"].startswith("WeightsUnpickler error: Unsupported global")
    assert ns["created"] == {"default": False, "weights_only=False": True}


def test_a_dcp_folder_runs_its_metadata_pickle(lesson):
    assert lesson.ns["dcp_ran"] is True  # read_metadata unpickled the planted .metadata
    # a pickled value inside a checkpoint: nothing runs on save, its code runs in dcp.load
    assert lesson.ns["value_ran"] == {"save": False, "load": True}


def test_mastery_three_ranks_read_two_pieces_of_step1(lesson):
    """Mastery 5: rank 1 of 3 holds rows 6-11 (torch.chunk, as FSDP2 splits) and DCP's
    resharding reads rows 6-7 of rank 0's chunk and rows 8-11 of rank 1's."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    meta = lesson.ns["sharded"]
    rows = torch.chunk(torch.arange(16), 3)[1]
    assert rows.tolist() == list(range(6, 12))
    local = ChunkStorageMetadata(offsets=torch.Size([6, 0]), sizes=torch.Size([len(rows), 8]))
    reads = create_read_items_for_chunk_list("model.0.weight", meta.state_dict_metadata["model.0.weight"], [local])
    got = [(meta.storage_data[r.storage_index].relative_path, r.storage_offsets[0], r.lengths[0]) for r in reads]
    assert sorted(got) == [("__0_0.distcp", 6, 2), ("__1_0.distcp", 0, 4)]


def test_safetensors_layout(lesson):
    ns = lesson.ns
    raw, header, n = ns["raw"], ns["header"], ns["n"]
    assert int.from_bytes(raw[:8], "little") == n == 120
    assert header["weight"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [8, 32]}
    assert raw[8 + n + 8:] == torch.arange(6, dtype=torch.float32).numpy().tobytes()


def test_safetensors_metadata_is_strings_only(tmp_path):
    with pytest.raises(TypeError, match="not an instance of 'str'"):
        save_file({"a": torch.ones(1)}, tmp_path / "x.safetensors", metadata={"k": 1})


def test_temporary_files_removed(lesson):
    assert not lesson.ns["TMP"].exists()


# ----------------------------------------------------------------------------------------
# Exercises


@pytest.mark.exercise("safetensors_header")
def test_safetensors_header(exercise_module, tmp_path):
    tensors = {
        "w": torch.zeros(3, 2, dtype=torch.float16),
        "b": torch.ones(5, dtype=torch.int64),
        "s": torch.tensor(1.0),
    }
    save_file(tensors, tmp_path / "t.safetensors", metadata={"format": "pt"})  # a __metadata__ entry
    got = exercise_module.safetensors_header(tmp_path / "t.safetensors")
    assert got == {"b": ("I64", (5,), (0, 40)), "s": ("F32", (), (40, 44)), "w": ("F16", (3, 2), (44, 56))}

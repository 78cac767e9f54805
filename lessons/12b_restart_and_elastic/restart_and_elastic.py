# %% [markdown]
# # 12b · Restart and elastic training
#
# Part 12a saved and restored training state with `torch.distributed.checkpoint` (DCP),
# bitwise, moved checkpoints between one process and 2 FSDP2 ranks, and wrote one in the
# background. This part, which follows it, makes a real failure: the parent kills a rank of
# a 2-rank job in the middle of a checkpoint, torchrun restarts the job, and the resumed run
# ends bitwise equal to one that was never interrupted. Then an elastic job loses a whole
# node and goes on with the one that is left.
#
# **What you will learn**
#
# - what a 2-rank job's checkpoint holds to resume exactly: model, Adam, schedule, every
#   rank's RNG state, the shuffled loader's cursor, and a record of what made it (config,
#   code revision, world size);
# - the restart drill: `torchrun --max-restarts=1`, a rank killed from outside while it
#   writes a checkpoint, a restart from the latest *complete* checkpoint, and a final
#   result bitwise equal to an uninterrupted run (with dropout and a shuffled data order);
# - an elastic job (`--nnodes=1:2`) that loses a node and goes on with one: the survivor's
#   `RANK` and `WORLD_SIZE` change, a file named after a rank now belongs to someone else,
#   and DCP loads the 2 ranks' checkpoint into the one that is left.
#
# **Prerequisites:** part 12a (DCP's save and load, Stateful objects, resharding, the
# `.metadata` file); lessons 09 (process groups, torchrun) and 11a (FSDP2).
#
# **How to run:** `python lessons/12b_restart_and_elastic/restart_and_elastic.py` or
# `make lesson N=12b` from the repository root, or open `restart_and_elastic.ipynb`. It
# writes checkpoints into a temporary folder (removed at the end), launches `worker.py` on
# 2 ranks with one restart allowed, then as an elastic job of two 1-rank nodes (two
# torchrun agents), on the CPU with gloo through the course's multi-rank kit,
# `lessons/multirank.py` (lesson 09 explains it), and saves its figure next to the lesson.
# The code the ranks run is in this lesson: each cell that starts with `#@worker` only
# defines functions, and `worker.py` is written from those cells. Run the drill yourself:
# `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2
# --max-restarts=1 lessons/12b_restart_and_elastic/worker.py drill DIR --hold 12`, DIR an
# empty folder, and within a minute (the ranks give up after 60 s) `kill -9` one of the
# pids it prints from another shell (add `--backend nccl` on a machine with 2 GPUs);
# *Going further* runs the elastic job by hand. Each printing cell is followed by an
# *Output* block: what it printed with the pinned PyTorch (2.13.0).

# %%
import atexit
import re
import shutil
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

# lessons/ on the path: the multi-rank kit (lesson 09) and the source map; a notebook has no __file__
sys.path.insert(0, str((Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()).parent))
from multirank import kill_when, launch, node_of, section, show

# %%
#@worker
# The ranks' imports: worker.py starts with this cell (their code comes in section 1).
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from multirank import heading, say, serve, shared

# %%
torch.manual_seed(0)
torch.set_num_threads(1)  # the ranks get one thread each too (OMP_NUM_THREADS=1): 2 cores
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
TMP = Path(tempfile.mkdtemp(prefix="lesson12b-"))  # the lesson's checkpoints; removed at the end
atexit.register(shutil.rmtree, TMP, ignore_errors=True)  # ... and at exit, should a cell fail
WORKER = HERE / "worker.py"

# %% [markdown]
# ## 1. A checkpoint of 2 ranks that resumes exactly
#
# The drill's job trains 12 steps of a small MLP *with dropout* (each rank draws its own
# masks from its own RNG) on a *shuffled* data set (48 rows, 6 batches of 8 an epoch, a new
# order each epoch, 4 rows of each batch per rank), sharded by FSDP2, and saves after every
# 3rd step into `step_3`, `step_6`, ... Its checkpoint is part 12a's whole training state,
# on 2 ranks, plus a record of what made it. First the constants and the model: `build`
# shards it as in 12a, and `fit` takes one step on this rank's rows and returns the mean
# loss of both ranks.

# %%
#@worker
STEPS, EVERY = 12, 3  # 12 steps, a checkpoint after 3, 6, 9, 12
BATCH, ROWS = 8, 48  # global batch (4 rows per rank); the data set: 6 batches an epoch
HOLD_S = 60.0  # the longest a rank holds for the parent's kill before it gives up
CONFIG = {"sizes": [8, 16, 4], "dropout": 0.25, "lr": 0.05, "lr_halves_every": 4,
          "batch": BATCH, "rows": ROWS, "every": EVERY, "data_seed": 42, "shuffle_seed": 7}


def build(device, seed=0, dropout=None):
    """The model, replicated on every rank from one seed, then sharded by FSDP2 (dim 0).
    With `dropout` (the drill), a Dropout layer before the last Linear."""
    torch.manual_seed(seed)
    d_in, hidden, d_out = CONFIG["sizes"]  # 8, 16, 4
    drop = [torch.nn.Dropout(dropout)] if dropout is not None else []
    model = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(), *drop,
                                torch.nn.Linear(hidden, d_out)).to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in (model[0], model[-1]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=CONFIG["lr"])
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=CONFIG["lr_halves_every"], gamma=0.5)
    return model, optim, sched


def fit(model, optim, sched, x, y):
    """One step on this rank's rows; returns the global mean loss (a float)."""
    optim.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # FSDP2 reduce-scatters the gradients: each rank gets the mean of its shard
    optim.step()
    sched.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return (total / dist.get_world_size()).item()


def full_params(model):
    """{name: full tensor} gathered from the shards (a collective: every rank calls it)."""
    return {n: p.full_tensor().cpu() for n, p in model.named_parameters()}


def bitwise(a, b):
    return all(torch.equal(a[n], b[n]) for n in a)


# %% [markdown]
# `Job` is part 12a's `Trainer` on 2 ranks: one rank's whole training state, Stateful for
# DCP. Two things change with ranks. The RNG state differs per rank, and DCP stores a value
# that is not a DTensor once, from one rank (12a's `step` was in rank 1's file only), so
# `state_dict` gathers every rank's state into one `(world, 5056)` tensor, a row per rank,
# and `load_state_dict` takes its row by its rank *now*. And the checkpoint records what
# made it, checked before anything is restored.

# %%
#@worker
class Job:
    """One rank's whole training state: FSDP2 model with dropout, Adam, StepLR, this rank's
    dropout RNG, and the shuffled data order with its cursor."""

    def __init__(self, device):
        self.model, self.optim, self.sched = build(device, dropout=CONFIG["dropout"])
        torch.manual_seed(100 + dist.get_rank())  # each rank draws its own dropout masks
        d_in, _, d_out = CONFIG["sizes"]
        data_gen = torch.Generator().manual_seed(CONFIG["data_seed"])
        data = torch.randn(ROWS, d_in + d_out, generator=data_gen)  # (48, 12)
        self.x, self.y = data[:, :d_in], data[:, d_in:]  # (48, 8), (48, 4)
        self.gen = torch.Generator().manual_seed(CONFIG["shuffle_seed"])  # the loader's shuffle
        self.step, self.epoch, self.used = 0, 0, 0
        self.new_epoch(self.gen.get_state())

    def new_epoch(self, gen_state):
        self.gen.set_state(gen_state)
        self.epoch_rng = gen_state  # the state that decides this epoch's order
        self.order = torch.randperm(ROWS, generator=self.gen)  # (48,)

    def train_step(self):
        if self.used == ROWS // BATCH:  # epoch over: the next order comes from the generator
            self.epoch, self.used = self.epoch + 1, 0
            self.new_epoch(self.gen.get_state())
        rows = self.order[self.used * BATCH:(self.used + 1) * BATCH]  # the global batch (8,)
        mine = rows[dist.get_rank() * BATCH // 2:(dist.get_rank() + 1) * BATCH // 2]  # (4,)
        self.used, self.step = self.used + 1, self.step + 1
        return fit(self.model, self.optim, self.sched, self.x[mine], self.y[mine])

    def state_dict(self):
        msd, osd = get_state_dict(self.model, self.optim)
        rngs = [torch.empty(5056, dtype=torch.uint8) for _ in range(dist.get_world_size())]
        dist.all_gather(rngs, torch.get_rng_state())  # every rank's dropout RNG
        cursor = {"step": self.step, "epoch": self.epoch, "used": self.used, "rng": self.epoch_rng}
        meta = {"config": json.dumps(CONFIG, sort_keys=True), "revision": revision_of(__file__),
                "world": dist.get_world_size()}
        return {"model": msd, "optim": osd, "sched": self.sched.state_dict(),
                "rng": torch.stack(rngs), "data": cursor, "meta": meta}  # rng (world, 5056)

    def load_state_dict(self, sd):  # DCP calls it with the loaded state_dict()
        check(sd["meta"])
        set_state_dict(self.model, self.optim, model_state_dict=sd["model"],
                       optim_state_dict=sd["optim"])
        self.sched.load_state_dict(sd["sched"])
        # my row, by my rank *now*; cloned: on 2.13.0 set_rng_state of a row view (storage
        # offset > 0) crashes the process (SIGSEGV) or raises "Invalid mt19937 state"
        torch.set_rng_state(sd["rng"][dist.get_rank()].clone())
        c = sd["data"]
        self.step, self.epoch, self.used = c["step"], c["epoch"], c["used"]
        self.new_epoch(c["rng"].clone())  # the same order again, the generator where it was


def revision_of(path):
    """A hash of the code (this worker file): its revision."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def compatible(meta, config, world, revision):
    """Does a checkpoint's record match a run with this config, code revision and world size?"""
    return {"config": meta["config"] == json.dumps(config, sort_keys=True),
            "code revision": meta["revision"] == revision, "world size": meta["world"] == world}


def check(meta):
    """Refuse a checkpoint made by another config, other code or another world size."""
    ok = compatible(meta, CONFIG, dist.get_world_size(), revision_of(__file__))
    shared(f"checkpoint matches this run's {', '.join(f'{k} {v}' for k, v in ok.items())}")
    if not all(ok.values()):
        raise RuntimeError(f"checkpoint made by another run: {ok}")


# %% [markdown]
# ## 2. Kill a rank, let torchrun restart the job
#
# The *parent*, this notebook, kills a rank from outside. It passes the job a step
# (`--hold 12`): on the first attempt every rank stops there (at a checkpoint step, inside
# the write, once its own shard file is on disk), writes its pid and waits, so that the kill
# lands at the same point on every run. A thread of the parent (the kit's `kill_when`, told
# by `held_pid` below which process holds as rank 1) sends it SIGKILL. torchrun runs with
# `--max-restarts=1`: when a rank fails, it stops the others and starts all ranks again,
# new processes with `TORCHELASTIC_RESTART_COUNT=1` (the kit sets
# `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, without which, on 2.13.0, the restarted ranks
# hang before their first line: measured with the by-hand drill; PyTorch issue #135712
# describes the shared store's stale state).
#
# The hold is a `FileSystemWriter` whose `write_data` writes this rank's shard file, then
# holds instead of returning: DCP's coordinator never collects the write results.

# %%
#@worker
def hold(root, where):
    """Stop here until the parent kills a rank (the first attempt only): every rank writes
    its pid, named by the pid, and waits; torchrun then stops the ranks the parent spared."""
    say(f"holding {where}")
    announce(root)
    time.sleep(HOLD_S)
    raise TimeoutError(f"no kill came within {HOLD_S} s")


def announce(root):
    """Tell the parent this rank holds: root/held/<pid> holds its RANK (see held_pid)."""
    (root / "held").mkdir(exist_ok=True)
    (root / "held" / str(os.getpid())).write_text(os.environ["RANK"])


class HoldingWriter(dcp.FileSystemWriter):
    """A FileSystemWriter that holds right after this rank's shard file is on disk: the
    coordinator (rank 0) has not collected the write results, so there is no .metadata."""

    def __init__(self, path, root):
        super().__init__(path)
        self.root = root

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        future.wait()  # this rank's shard file is written
        hold(self.root, f"in checkpoint {path_step(self.path)}, my shard written")


def path_step(path):
    return int(Path(path).name[5:])


# %% [markdown]
# Which checkpoint is complete? DCP's coordinator writes `.metadata` last, only after every
# rank's write succeeded, to `.metadata.tmp` first, then renames it (a rename is atomic on
# one file system): a folder with `.metadata` is whole, a folder without it is not. At each
# start the job reads its identity from the environment (`RANK`, `WORLD_SIZE`, through
# `dist.get_rank()`), lists the folders, resumes from the newest complete one with
# `dcp.load({"app": job})` (DCP calls `job.state_dict()` for the layout, then
# `job.load_state_dict`), trains, and at the end computes an uninterrupted 12-step run from
# a fresh model, with the same code minus the checkpoints, to compare.

# %%
#@worker
def complete(root):
    """Checkpoint steps whose folder has DCP's .metadata (written last, via a rename)."""
    steps = []
    for d in sorted(root.glob("step_*"), key=path_step):
        ok = (d / ".metadata").is_file()
        shards = len(list(d.glob("*.distcp")))
        verdict = "complete" if ok else "INCOMPLETE, skipped"
        shared(f"found {d.name}: {shards} shard files, .metadata {ok} -> {verdict}")
        steps += [path_step(d)] if ok else []
    return steps


def run_steps(root, job, held, record):
    while job.step < STEPS:
        lr = job.optim.param_groups[0]["lr"]  # the LR this step uses (the scheduler steps after)
        loss = job.train_step()
        record[job.step] = loss
        shared(f"step {job.step} loss {loss:.6f} lr {lr:.4f}")
        if job.step % EVERY == 0:
            path = root / f"step_{job.step}"
            writer = HoldingWriter(path, root) if job.step == held else dcp.FileSystemWriter(path)
            dcp.save({"app": job}, storage_writer=writer)  # calls job.state_dict()
            shared(f"saved step_{job.step}")
        elif job.step == held:
            hold(root, f"after step {job.step}")


def drill(device, root, hold_at=None):
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    heading("attempt")
    say(f"attempt {attempt}: RANK={os.environ['RANK']} of WORLD_SIZE="
        f"{os.environ['WORLD_SIZE']}, pid {os.getpid()}")
    job = Job(device)
    found = complete(root)
    if found:
        dcp.load({"app": job}, checkpoint_id=root / f"step_{found[-1]}")
        shared(f"resumed from step_{job.step}: epoch {job.epoch}, {job.used} batches of it used")
    heading("train")
    record = {}
    run_steps(root, job, hold_at if attempt == 0 else None, record)
    heading("reference")
    final = full_params(job.model)
    ref = Job(device)
    losses = {s: ref.train_step() for s in range(1, STEPS + 1)}  # never interrupted
    shared(f"uninterrupted losses: {' '.join(f'{losses[s]:.6f}' for s in losses)}")
    shared(f"resumed losses bitwise equal: {all(record[s] == losses[s] for s in record)}")
    shared(f"final parameters bitwise equal: {bitwise(final, full_params(ref.model))}")
    return 0


def main():
    def args(parser):
        parser.add_argument("root", type=Path, help="the folder for checkpoints (caller made it)")
        parser.add_argument("--hold", dest="hold_at", type=int, help="drill: hold after this step")

    serve({"drill": drill, "elastic": elastic}, args)  # elastic: section 3


# %% [markdown]
# `main` hands the part named on the command line to the kit's `serve`, which joins the
# process group, runs the part on every rank and ends the group on every path. On the
# parent's side, `held_pid` finds the pid of a rank that holds.
#
# **Predict.** Which checkpoint does the drill's second attempt load, and which steps does
# it compute twice (the *replay window*)?


# %%
def held_pid(root, rank):
    """The pid of rank `rank` once it holds (its file in root/held is named by its pid and
    holds its RANK), else None: for the kit's `kill_when`, which then SIGKILLs it."""
    held = root / "held"
    for f in held.glob("*") if held.is_dir() else ():
        if f.read_text() == str(rank):
            return int(f.name)
    return None


drill_dir = TMP / "drill"
drill_dir.mkdir()
with kill_when(lambda: held_pid(drill_dir, 1)) as killed:  # a thread: SIGKILL rank 1 once it holds
    drill_run = launch(WORKER, ["drill", str(drill_dir), "--hold", "12"], restarts=1)
print(f"torchrun exit code {drill_run.code} after {drill_run.seconds:.1f} s; attempts {drill_run.attempts}")

# %% [markdown]
# Output:
# ```text
# torchrun exit code 0 after «time» s; attempts [0, 1]
# ```
#
# torchrun ended normally after two attempts. What did attempt 0 print before the kill?

# %%
show(drill_run, "attempt", 0)
show(drill_run, "train", 0)
pid1 = int(re.search(r"pid (\d+)", section(drill_run, "attempt", 0)[1][0])[1])
print(f"the parent's SIGKILL went to rank 1 of attempt 0: {killed == [pid1]}")
died = "failed (exitcode: -9) local_rank: 1" in drill_run.agent  # torchrun's own log line
print(f"torchrun saw rank 1 exit with -9 (SIGKILL): {died}")

# %% [markdown]
# Output:
# ```text
# rank 0: attempt 0: RANK=0 of WORLD_SIZE=2, pid «pid»
# rank 1: attempt 0: RANK=1 of WORLD_SIZE=2, pid «pid»
# rank 0: step 1 loss «number» lr 0.0500
# rank 0: step 2 loss «number» lr 0.0500
# rank 0: step 3 loss «number» lr 0.0500
# rank 0: saved step_3
# rank 0: step 4 loss «number» lr 0.0500
# rank 0: step 5 loss «number» lr 0.0250
# rank 0: step 6 loss «number» lr 0.0250
# rank 0: saved step_6
# rank 0: step 7 loss «number» lr 0.0250
# rank 0: step 8 loss «number» lr 0.0250
# rank 0: step 9 loss «number» lr 0.0125
# rank 0: saved step_9
# rank 0: step 10 loss «number» lr 0.0125
# rank 0: step 11 loss «number» lr 0.0125
# rank 0: step 12 loss «number» lr 0.0125
# rank 0: holding in checkpoint 12, my shard written
# rank 1: holding in checkpoint 12, my shard written
# the parent's SIGKILL went to rank 1 of attempt 0: True
# torchrun saw rank 1 exit with -9 (SIGKILL): True
# ```
#
# Attempt 0 trained steps 1-12 and saved `step_3`, `step_6` and `step_9`; in checkpoint 12
# both ranks wrote their shards and held, and the parent killed rank 1 (the pids are the
# processes', different on every run). torchrun saw a rank die by signal 9, stopped rank 0
# (SIGTERM) and, with one restart allowed, started a new group.
#
# **Predict.** What does attempt 1 find on disk, and where does it start?

# %%
show(drill_run, "attempt", 1)
show(drill_run, "train", 1)
show(drill_run, "reference", 1)

# %% [markdown]
# Output:
# ```text
# rank 0: attempt 1: RANK=0 of WORLD_SIZE=2, pid «pid»
# rank 0: found step_3: 2 shard files, .metadata True -> complete
# rank 0: found step_6: 2 shard files, .metadata True -> complete
# rank 0: found step_9: 2 shard files, .metadata True -> complete
# rank 0: found step_12: 2 shard files, .metadata False -> INCOMPLETE, skipped
# rank 0: checkpoint matches this run's config True, code revision True, world size True
# rank 0: resumed from step_9: epoch 1, 3 batches of it used
# rank 1: attempt 1: RANK=1 of WORLD_SIZE=2, pid «pid»
# rank 0: step 10 loss «number» lr 0.0125
# rank 0: step 11 loss «number» lr 0.0125
# rank 0: step 12 loss «number» lr 0.0125
# rank 0: saved step_12
# rank 0: uninterrupted losses: «number» «number» «number» «number» «number» «number» «number» «number» «number» «number» «number» «number»
# rank 0: resumed losses bitwise equal: True
# rank 0: final parameters bitwise equal: True
# ```
#
# Attempt 1 runs in *new* processes (other pids, `TORCHELASTIC_RESTART_COUNT=1`). It found
# `step_12` with both shard files but without `.metadata`, skipped it, loaded `step_9` into
# freshly built and sharded models, and replayed steps 10-12. `step_9` lies in the middle of
# epoch 1, 3 of its 6 batches used: the cursor's `rng`, the shuffle generator's state at
# epoch 1's start, drew epoch 1's order again (without it, the fresh `Job` would go on
# with epoch 0's order), and `used` skipped the 3 batches already trained. Every resumed
# loss equals the uninterrupted run's and the final parameters are bitwise equal, dropout
# masks included. (The uninterrupted run is computed by the same ranks at the end of
# attempt 1, from a fresh model, with the same code minus the checkpoints.)
#
# Taking the newest folder, `step_12`, would have been wrong: it holds shard files but no
# index of them. The rule: only a checkpoint that is *known* complete exists.
#
# **Identity comes from the environment, at every start.** A restarted rank is a new
# process: attempt 1's pids are not attempt 0's. Here it came back with the same `RANK`
# and `WORLD_SIZE` (one torchrun agent, a fixed 2 ranks); section 3 shows a job where
# they change. The job does not rely on them staying: it reads `RANK` and `WORLD_SIZE`
# (through `dist.get_rank()`) at each start, never opens a file named after a rank, and
# picks its RNG row by its rank *now*. The checkpoint records the config, a hash of `worker.py` (the
# code revision, `revision_of`) and the world size, and a resume refuses a checkpoint that
# does not match. When a run uses a `GradScaler` (fp16, lesson 05a), its `state_dict()`
# belongs in the checkpoint too.
#
# **Predict.** Read `step_9`'s record with one process. Would a run with another learning
# rate, or on 4 ranks, accept it?

# %%
want = {"app": {"meta": {"config": "", "revision": "", "world": 0}}}
dcp.load(want, checkpoint_id=drill_dir / "step_9", no_dist=True)  # only these keys are read
rec = want["app"]["meta"]
made = json.loads(rec["config"])
REVISION = revision_of(WORKER)  # the hash the ranks computed of their own file
print(f"step_9 was made on {rec['world']} ranks with {len(made)} config values, lr {made['lr']}")
print(f"same code: {rec['revision'] == REVISION}")
print(f"this config: {compatible(rec, CONFIG, 2, REVISION)}")
print(f"lr 0.1:      {compatible(rec, CONFIG | {'lr': 0.1}, 2, REVISION)}")
print(f"4 ranks:     {compatible(rec, CONFIG, 4, REVISION)}")
drill_meta = dcp.FileSystemReader(drill_dir / "step_9").read_metadata().state_dict_metadata
scaler = torch.amp.GradScaler("cpu")
print(f"a GradScaler's state: {sorted(scaler.state_dict())}, scale {scaler.get_scale()}")

# %% [markdown]
# Output:
# ```text
# step_9 was made on 2 ranks with 9 config values, lr 0.05
# same code: True
# this config: {'config': True, 'code revision': True, 'world size': True}
# lr 0.1:      {'config': False, 'code revision': True, 'world size': True}
# 4 ranks:     {'config': True, 'code revision': True, 'world size': False}
# a GradScaler's state: ['_growth_tracker', 'backoff_factor', 'growth_factor', 'growth_interval', 'scale'], scale 65536.0
# ```
#
# The `UserWarning` on stderr (under the cell in the notebook) is DCP's: with `no_dist=True`
# it always warns "assuming the intent is to load in a single process", as in part 12a.
#
# A resume that accepted another learning rate, or other code, would go on silently with
# a run that is not the one it claims to continue; the world size matters here because the
# RNG rows and the data split are per rank. A scaler's `scale` and `_growth_tracker` change
# as training runs; a fresh one starts again at 65536 (printed above), whatever scale the
# run had reached.
#
# The figure below puts the two attempts' losses on the uninterrupted run's curve.

# %%
LOSS = re.compile(r"rank 0: step (\d+) loss (\S+) lr \S+")


def losses(run, attempt):
    """{step: loss} that rank 0 printed in one attempt's training section."""
    lines = section(run, "train", attempt).get(0, [])
    return {int(m[1]): float(m[2]) for line in lines if (m := LOSS.fullmatch(line))}


def reference_losses(run):
    head = "rank 0: uninterrupted losses: "
    (line,) = [x for x in section(run, "reference", -1)[0] if x.startswith(head)]
    return {s + 1: float(v) for s, v in enumerate(line[len(head):].split())}


def plot_drill(run, checkpoint, killed):
    """The drill's losses: the uninterrupted run, attempt 0 up to the kill, attempt 1."""
    ref, first, second = reference_losses(run), losses(run, 0), losses(run, 1)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot(list(ref), list(ref.values()), color="0.75", linewidth=6, label="uninterrupted")
    ax.plot(list(first), list(first.values()), "o-", color="tab:blue", label="attempt 0 (killed)")
    ax.plot(list(second), list(second.values()), "x--", color="tab:orange", markersize=9,
            label="attempt 1 (resumed)")
    ax.axvline(checkpoint, color="tab:green", linestyle=":",
               label=f"checkpoint loaded (step {checkpoint})")
    ax.axvline(killed, color="tab:red", linestyle="-.", label=f"kill (at step {killed})")
    ax.set(xlabel="step", ylabel="loss (mean of 2 ranks)",
           title="Restart drill: the resumed run retraces the uninterrupted one")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


fig = plot_drill(drill_run, checkpoint=9, killed=12)
fig.savefig(HERE / "restart_drill.png")

# %% [markdown]
# The grey band is the run that was never interrupted, the blue dots attempt 0 up to the
# kill, the orange crosses attempt 1 from the checkpoint at step 9 on: steps 10-12 were
# computed twice (the replay window) with the same losses. The replay window is the price
# of a checkpoint interval: saving every N steps loses up to N steps of work per failure
# (here 3, plus the unfinished checkpoint).

# %% [markdown]
# ## 3. An elastic job: a node dies, the job goes on smaller, the ranks are renumbered
#
# The drill restarted a fixed job: one torchrun agent, 2 ranks, the same 2 ranks again. On a
# cluster each machine (a *node*) runs its own agent, and the agents meet in a *rendezvous*:
# a key-value store (c10d's `TCPStore`, hosted by one of them) where they register and
# agree on who takes part. `torchrun --nnodes=1:2` makes the job *elastic*: it starts with 2
# nodes and goes on with 1 if the other is lost. Every restart is a new round of the
# rendezvous, and each round numbers its nodes afresh: it sorts them by host, then by the
# agent's pid, and node 0's ranks come first.
#
# The kit runs 2 agents of 1 rank each, as two simulated nodes on one machine
# (`launch(WORKER, [...], nproc=1, nnodes=2, min_nodes=1, restarts=1)`), with short
# rendezvous timings: a node that misses 2 heartbeats 1 s apart is dropped, and a round
# closes when both nodes are in, or 2 s after the first one joined (torchrun's defaults: 3
# heartbeats 5 s apart, 30 s). Heartbeats matter only when a new round forms: a node whose
# heartbeats stopped is removed from the rendezvous state, so the new round does not wait
# for it, but the running ranks are not told (read from `_sanitize` in
# `torch/distributed/elastic/rendezvous/dynamic_rendezvous.py`). `LOGLEVEL=INFO` in the
# agents' environment makes torchrun's agents log why they restart their ranks.
# The `elastic` part below trains one step of section 1's FSDP2 model (without dropout) and
# saves it with DCP. It also does, on purpose, what the drill never does: each rank writes its part of
# the data set into a file named after its rank (`rank0.json`, `rank1.json`). Then both
# ranks wait in a loop of barriers, and the parent kills *node 0*, its agent and its rank
# at once (the kit's `node_of`), as when a machine loses power. After the restart it reads
# the file named after its rank, computes its part from the environment, and loads the
# 2 ranks' checkpoint into the world that is left.

# %%
#@worker
def rows_of(rank, world):
    """This rank's part of the data set, from its RANK and WORLD_SIZE alone."""
    return f"rows {rank * ROWS // world}-{(rank + 1) * ROWS // world - 1} of {ROWS}"


def elastic(device, root, **_):
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank, world = dist.get_rank(), dist.get_world_size()  # torchrun's RANK, WORLD_SIZE: now
    heading("elastic")
    say(f"attempt {attempt}: RANK={rank} of WORLD_SIZE={world}, pid {os.getpid()}, "
        f"agent {os.getppid()}")
    if attempt == 0:
        elastic_first(device, root, rank, world)
    else:
        elastic_again(device, root, rank, world)
    return 0


def elastic_first(device, root, rank, world):
    """Train a step, save it with DCP, and (the mistake this part shows) keep a note of this
    rank's work in a file named after the rank. Then wait in collectives for the kill."""
    note = {"rows": rows_of(rank, world), "agent": os.getppid()}
    root.mkdir(parents=True, exist_ok=True)  # run by hand, DIR may not exist yet
    (root / f"rank{rank}.json").write_text(json.dumps(note))
    model, optim, sched = build(device)
    gen = torch.Generator().manual_seed(1001)
    x, y = torch.randn(BATCH, 8, generator=gen), torch.randn(BATCH, 4, generator=gen)  # (8, 8), (8, 4)
    per = BATCH // world
    fit(model, optim, sched, x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per])
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=root / "step_1")
    params = full_params(model)
    if rank == 0:
        torch.save(params, root / "params_1.pt")  # for attempt 1's comparison only
    say(f"saved step_1; {rows_of(rank, world)} noted in rank{rank}.json")
    hold_in_barriers(root)


def hold_in_barriers(root):
    """Like hold, but in a loop of barriers: a torchrun agent restarts its ranks when one of
    them fails or a new node waits to join, not when another node dies, so a survivor's agent
    acts once its rank's collective with the dead node fails."""
    announce(root)
    end = time.monotonic() + HOLD_S
    while time.monotonic() < end:
        dist.barrier()  # raises on the survivor once the other node's rank is gone
        time.sleep(0.05)
    raise TimeoutError(f"no kill came within {HOLD_S} s")


def elastic_again(device, root, rank, world):
    """After the restart: what a file named after the rank holds now, what the environment
    says, and the checkpoint of 2 ranks loaded into this world."""
    note = json.loads((root / f"rank{rank}.json").read_text())  # the mistake, on purpose
    say(f"rank{rank}.json, named after my RANK: {note['rows']}, written under another agent: "
        f"{note['agent'] != os.getppid()}")
    say(f"my part, from RANK and WORLD_SIZE now: {rows_of(rank, world)}")
    model, _, _ = build(device)
    sd = {"model": get_model_state_dict(model)}  # the layout of this world's shards
    dcp.load(sd, checkpoint_id=root / "step_1")  # DCP reshards 2 ranks' files into it
    set_model_state_dict(model, sd["model"])
    equal = bitwise(full_params(model), torch.load(root / "params_1.pt"))
    say(f"loaded step_1 (saved by 2 ranks) into {world} rank: parameters bitwise equal: {equal}")


# %% [markdown]
# **Predict.** How does node 1 learn that node 0 is gone? Its agent restarts its rank
# (`--max-restarts=1`): with which `RANK` and `WORLD_SIZE`, and what does it find in the
# file named after its rank?

# %%
elastic_dir = TMP / "elastic"
elastic_dir.mkdir()
with kill_when(lambda: node_of(held_pid(elastic_dir, 0))) as gone:  # node 0: agent and rank
    elastic_run = launch(WORKER, ["elastic", str(elastic_dir)], nproc=1, nnodes=2, min_nodes=1,
                     restarts=1, env={"LOGLEVEL": "INFO"})
print(f"killed {len(gone)} processes; agents' exit codes {list(elastic_run.agent_codes)}; "
      f"attempts {elastic_run.attempts}; processes left {elastic_run.leftover}")
show(elastic_run, "elastic", 0)
agents = [int(re.search(r"agent (\d+)", lines[0])[1])
          for lines in section(elastic_run, "elastic", 0).values()]  # [RANK 0's, RANK 1's]
print(f"RANK 0's agent has the lower pid: {agents[0] < agents[1]}")
print(f"rank 1's attempt 0 failed in a barrier: {'in hold_in_barriers' in elastic_run.logs[0, 1][1]}")
why = re.findall(r"\[default\] (Worker group \w+\..*|Detected \d+ new nodes.*)", elastic_run.agent)
print(f"why node 1's agent restarted its rank: {why}")

# %% [markdown]
# Output:
# ```text
# killed 2 processes; agents' exit codes [-9, 0]; attempts [0, 1]; processes left 0
# rank 0: attempt 0: RANK=0 of WORLD_SIZE=2, pid «pid», agent «pid»
# rank 0: saved step_1; rows 0-23 of 48 noted in rank0.json
# rank 1: attempt 0: RANK=1 of WORLD_SIZE=2, pid «pid», agent «pid»
# rank 1: saved step_1; rows 24-47 of 48 noted in rank1.json
# RANK 0's agent has the lower pid: True
# rank 1's attempt 0 failed in a barrier: True
# why node 1's agent restarted its rank: ['Worker group FAILED. 1/1 attempts left; will restart worker group']
# ```
#
# The kill took 2 processes, node 0's agent and its rank (`gone` lists their pids); the agents'
# exit codes are in the order the kit started them: node 0's agent died by SIGKILL (-9),
# node 1's ended normally (0). Nothing was left running. Node 0's agent had the lower pid,
# so its rank was `RANK=0`.
#
# A torchrun agent restarts its ranks for one of two reasons (`_invoke_run` in
# `torch/distributed/elastic/agent/server/api.py`): one of them failed (a restart that
# counts against `--max-restarts`), or a new node waits to join (one that does not count).
# A node that dies is neither: node 1's agent did nothing about node 0's death until its
# rank's next barrier raised and the rank exited with an error. Its log names that failure
# as the reason (`1/1 attempts left`: this restart is the one `--max-restarts=1` allows).
# The traceback is in that rank's stderr, which the kit keeps with its stdout
# (`elastic_run.logs[0, 1]`: attempt 0, rank 1).
#
# **Predict.** Now the second attempt, on node 1 alone.

# %%
show(elastic_run, "elastic", 1)
again = int(re.search(r"agent (\d+)", section(elastic_run, "elastic", 1)[0][0])[1])
print(f"attempt 1's rank runs under the agent of attempt 0's RANK 1: {again == agents[1]}")

# %% [markdown]
# Output:
# ```text
# rank 0: attempt 1: RANK=0 of WORLD_SIZE=1, pid «pid», agent «pid»
# rank 0: rank0.json, named after my RANK: rows 0-23 of 48, written under another agent: True
# rank 0: my part, from RANK and WORLD_SIZE now: rows 0-47 of 48
# rank 0: loaded step_1 (saved by 2 ranks) into 1 rank: parameters bitwise equal: True
# attempt 1's rank runs under the agent of attempt 0's RANK 1: True
# ```
#
# The same node, the same agent, a new process with another identity: `RANK=1` of 2 became
# `RANK=0` of 1. A rank's number is not the name of a machine or of its work; it is its
# place in the current round.
#
# The file named after its rank, `rank0.json`, was written by node 0's rank, the dead one:
# a worker that reloaded "its" notes from it would take rows 0-23, node 0's old part, and
# rows 24-47 would never be seen. Computed from `RANK` and `WORLD_SIZE` now, its part is
# rows 0-47, the whole data set. So: read identity from the environment at every start,
# never from a file named after an old rank, and keep state that must outlive a restart
# in the checkpoint, stored by what it is (DCP's keys are parameter names) rather than by
# who held it. DCP then loaded the 2 ranks' shard files into the single rank, and the
# parameters are bitwise equal to those saved. Section 2's drill would refuse a world of 1
# as its record check refused 4 ranks: its RNG rows and its data split are per rank, so an
# elastic job must keep such state in a form the new world can split again, or not restore
# it.

# %% [markdown]
# ## Summary
#
# - A 2-rank job's checkpoint that resumes exactly is part 12a's whole training state
#   (model, Adam, scheduler, the shuffled loader's cursor) plus every rank's RNG state as one
#   row of a `(world, 5056)` tensor (DCP stores a plain value once) and a record of the
#   config, the code revision and the world size, which a resume checks: another learning
#   rate or 4 ranks did not match `step_9`.
# - The restart drill: the parent SIGKILLed rank 1 while checkpoint 12 was being written;
#   `torchrun --max-restarts=1` (with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`) restarted the
#   job; attempt 1 skipped the folder without `.metadata`, loaded `step_9` (mid-epoch: the
#   cursor's generator state drew the epoch's order again), replayed steps 10-12 and ended
#   bitwise equal to an uninterrupted run, dropout included. Attempt 1's ranks were new
#   processes with the same `RANK` and `WORLD_SIZE` (one agent, 2 ranks), which the job
#   reads from the environment at every start.
# - An elastic job (`--nnodes=1:2`, two agents of one rank): the parent killed node 0's
#   agent and rank together; node 1's rank saw it only as a failed barrier, and its agent
#   restarted it alone, now `RANK=0` of `WORLD_SIZE=1` (each rendezvous round numbers the
#   nodes by host and pid). The file named after its new rank held node 0's rows 0-23; from
#   the environment its part is rows 0-47. DCP loaded the 2 ranks' checkpoint into the one
#   rank, bitwise.

# %% [markdown]
# ## Going further
#
# **The elastic job by hand.** Two shells play the two nodes; use the same free PORT and
# the same empty DIR in both, and start the `is_host=0` one first:
#
# ```text
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=1:2 --nproc-per-node=1 \
#     --max-restarts=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT --rdzv-id=job \
#     --rdzv-conf=is_host=0,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=2 \
#     lessons/12b_restart_and_elastic/worker.py elastic DIR
# ```
#
# and the same with `is_host=1` in the second shell. Once both ranks have saved, and within
# a minute (they give up after 60 s), `kill -9 AGENT PID` from a third shell, with the two
# pids that `RANK` 0 printed (node 0 dies); the other shell's agent restarts its rank as
# `RANK` 0 of 1. `is_host` says which agent hosts the rendezvous store (the kit makes the
# last agent the host, so that killing node 0 leaves the store alive); on a cluster, every
# node runs the same command with the endpoint of one host all can reach, and
# `--nnodes=1:2` lets the job go on with fewer.

# %% [markdown]
# ## References
#
# - [`torch.distributed.checkpoint`](https://docs.pytorch.org/docs/2.13/distributed.checkpoint.html):
#   `save`, `load`, `FileSystemWriter` (the drill's holding writer subclasses it),
#   `get_state_dict` / `set_state_dict` and `Stateful`, sections 1 to 3.
# - [`torch.distributed.elastic`](https://docs.pytorch.org/docs/2.13/distributed.elastic.html):
#   torchrun and its options (`--max-restarts`, `--nnodes=MIN:MAX`, the c10d rendezvous and
#   its `--rdzv-conf` keys), the agent that restarts the worker group, sections 2 and 3.
# - [`torch.set_rng_state`](https://docs.pytorch.org/docs/2.13/generated/torch.set_rng_state.html):
#   the generator state each rank saves and restores, section 1.

# %% [markdown]
# ## Read the source
#
# Open these in your editor: each stop prints a file of the torch you installed, relative
# to its site-packages folder, and the line where to start reading (the numbers are your
# build's, hence `«line»` below). The stops follow a failure: the `.metadata` file that
# makes a checkpoint complete, the launcher's command line, the agent that restarts the
# ranks, and the rendezvous that numbers the nodes.

# %%
from sourcemap import read_the_source  # noqa: E402  (lessons/ is on sys.path: first cell)

read_the_source([
    ("torch/distributed/checkpoint/filesystem.py", "def finish(self, metadata: Metadata",
     "In a save with collectives, called once, on the coordinator, after every rank has "
     "written: it pickles the global metadata into `.metadata.tmp` and renames that to "
     "`.metadata`, the file the drill takes as proof of a complete checkpoint: the held "
     "`step_12` had both shard files and no `.metadata`."),
    ("torch/distributed/run.py", "def config_from_args(",
     "torchrun's command line becomes a `LaunchConfig`, `--max-restarts` its `max_restarts` "
     "(refused below 0) and `--nnodes=1:2` its `min_nodes`, `max_nodes` "
     "(`parse_min_max_nnodes`). `run` below gives `--standalone` a local c10d rendezvous and "
     "hands the config to `elastic_launch`."),
    ("torch/distributed/elastic/agent/server/api.py", "def _invoke_run(",
     "The agent's loop: it watches its ranks and, after a failure, stops and restarts the "
     "whole worker group while `_remaining_restarts > 0` (the drill's one restart, the "
     "elastic survivor's `1/1 attempts left`), and also, without counting it, when a new "
     "node waits to join (`num_nodes_waiting`). A node that dies is neither: section 3's "
     "survivor acted once its rank's barrier failed."),
    ("torch/distributed/elastic/rendezvous/dynamic_rendezvous.py", "def _mark_rendezvous_complete(",
     "Each restart is a new rendezvous round, and this numbers its nodes by sorting them "
     "(host, then pid): section 3's survivor, node 1 of round 0, was node 0 of round 1, "
     "so its rank became `RANK=0` of `WORLD_SIZE=1`."),
])

# %% [markdown]
# Output:
# ```text
# torch «version» installed in «folder»
# torch/distributed/checkpoint/filesystem.py:«line»  `def finish(self, metadata: Metadata`
#     In a save with collectives, called once, on the coordinator, after every rank has
#     written: it pickles the global metadata into `.metadata.tmp` and renames that to
#     `.metadata`, the file the drill takes as proof of a complete checkpoint: the held
#     `step_12` had both shard files and no `.metadata`.
# torch/distributed/run.py:«line»  `def config_from_args(`
#     torchrun's command line becomes a `LaunchConfig`, `--max-restarts` its
#     `max_restarts` (refused below 0) and `--nnodes=1:2` its `min_nodes`, `max_nodes`
#     (`parse_min_max_nnodes`). `run` below gives `--standalone` a local c10d rendezvous
#     and hands the config to `elastic_launch`.
# torch/distributed/elastic/agent/server/api.py:«line»  `def _invoke_run(`
#     The agent's loop: it watches its ranks and, after a failure, stops and restarts the
#     whole worker group while `_remaining_restarts > 0` (the drill's one restart, the
#     elastic survivor's `1/1 attempts left`), and also, without counting it, when a new
#     node waits to join (`num_nodes_waiting`). A node that dies is neither: section 3's
#     survivor acted once its rank's barrier failed.
# torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:«line»  `def _mark_rendezvous_complete(`
#     Each restart is a new rendezvous round, and this numbers its nodes by sorting them
#     (host, then pid): section 3's survivor, node 1 of round 0, was node 0 of round 1, so
#     its rank became `RANK=0` of `WORLD_SIZE=1`.
# ```

# %% [markdown]
# ## Mastery check
#
# Answer each before you open it; every answer points to the section whose printed lines
# show it.
#
# 1. **Spot the bug.** After a crash, a restart resumes from the newest `step_N` folder. The
#    job was killed while writing `step_12`, and both ranks' shard files of `step_12` are on
#    disk. What is wrong, and what should the restart do?
#
#    <details><summary>Answer</summary>
#
#    `step_12` has no `.metadata`, which DCP's coordinator writes last, once every rank's
#    write has succeeded: the folder is incomplete. The drill's second attempt skipped it
#    (`INCOMPLETE, skipped`), checked that `step_9` was made with this run's config, code
#    revision and world size, resumed from `step_9`, replayed steps 10-12 and ended with its
#    losses and final parameters bitwise equal to an uninterrupted run's
#    (*§ Kill a rank, let torchrun restart the job*).
#
#    </details>
#
# 2. **Predict.** You restart the drill's job from `step_9` with the learning rate changed
#    to 0.1, or on 4 ranks. What should the resume do, and why does the world size matter
#    to this job?
#
#    <details><summary>Answer</summary>
#
#    Refuse: the record `step_9` carries did not match either run (`config False` with
#    lr 0.1, `world size False` with 4 ranks), and a resume that accepted them would go on
#    silently with a run that is not the one it claims to continue. The world size matters
#    because the RNG rows and the data split are per rank
#    (*§ Kill a rank, let torchrun restart the job*).
#
#    </details>
#
# 3. **Spot the bug.** An elastic job (`--nnodes=1:2`, one rank per node) keeps each rank's
#    position in the data in `cursor_{RANK}.json` and reloads it at every start. Node 0
#    dies; node 1's agent restarts its rank. Which file does that rank open, and what
#    should the job do instead? Can it still load the model checkpoint the 2 ranks wrote?
#
#    <details><summary>Answer</summary>
#
#    It opens `cursor_0.json`, node 0's: the restarted rank is `RANK=0` of `WORLD_SIZE=1`
#    now (it was `RANK=1` of 2), because each rendezvous round numbers the nodes that are
#    left. In the lesson the file named after its new rank held rows 0-23, node 0's part,
#    while its part from `RANK` and `WORLD_SIZE` now is rows 0-47. Read identity from the
#    environment at every start and keep what must survive in the checkpoint, keyed by
#    what it is. The model checkpoint loads: DCP's metadata records each shard's offset in
#    the global tensor, and the one rank's parameters were bitwise equal to the 2 ranks'
#    (*§ An elastic job: a node dies, the job goes on smaller, the ranks are renumbered*).
#
#    </details>
#
# 4. **Predict.** The same elastic job on 3 nodes of one rank each (`--nnodes=1:3`), on one
#    machine: node 1 (`RANK=1`) dies, and the others restart their ranks. Which `RANK` and
#    `WORLD_SIZE` does old node 2's rank get, and why?
#
#    <details><summary>Answer</summary>
#
#    `RANK=1` of `WORLD_SIZE=2`. The new round numbers the nodes that are left by sorting
#    them, host then agent pid (`_mark_rendezvous_complete`, *Read the source*): old node 0
#    still sorts first and keeps `RANK=0`, old node 2 comes next. In section 3 the agent with
#    the lower pid got `RANK=0`, and the survivor went from `RANK=1` of 2 to `RANK=0` of 1
#    (*§ An elastic job: a node dies, the job goes on smaller, the ranks are renumbered*).
#
#    </details>

# %% [markdown]
# ## Exercises
#
# Open `exercises.py` in this folder; `make exercises N=12b` checks your answers
# (`solutions.py` has one way).
#
# 1. `latest_complete(root)`: the step of the newest complete checkpoint folder `step_N`
#    under `root` (one with `.metadata`), or None. Beware of sorting names as text.
# 2. `replay_window(every, killed_after, saved_before_kill=True)`: the steps a restart
#    computes twice when a job saving every `every` steps dies after step `killed_after`.
#    When the kill came while the checkpoint of that very step was being written
#    (`saved_before_kill=False`), that checkpoint does not count.
#
# These change the rank code and run it with torchrun (the lesson's output is your
# reference): edit a copy of `worker.py`, which the lesson writes from its `#@worker` cells.
#
# A. Run the drill with `--hold 8` and kill rank 0 (between checkpoints; rank 0 coordinates
#    DCP and hosts the process group's `TCPStore` at `MASTER_ADDR:MASTER_PORT`, while with
#    `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` the agent keeps the rendezvous store). Predict
#    the replay window, then check it.
# B. Let attempt 1 hold too (drop the `attempt == 0` test) and kill a rank in both
#    attempts. What does torchrun do after `--max-restarts=1` is used up, and with what
#    exit code?
# C. Save the drill's checkpoints with `dcp.async_save` (its own gloo group, one future
#    waited before the next save, as in part 12a). Is the final result still bitwise equal?
#    What must the restart logic check when a kill comes during a background write?
# D. In `Job.state_dict`, save this rank's `torch.get_rng_state()` under the key `"rng"`
#    instead of the gathered `(world, 5056)` tensor. Load it back on 2 ranks and compare:
#    what did rank 1 get, and does the drill still end bitwise equal?

# %%
shutil.rmtree(TMP, ignore_errors=True)  # every checkpoint, log and file of the lesson

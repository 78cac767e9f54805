"""The worker of lesson 12: FSDP2 checkpoints with torch.distributed.checkpoint (DCP) on 2 ranks.

    torchrun --standalone --nproc-per-node=2 lessons/12_checkpoint_and_restart/worker.py \\
        reshard DIR
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 \\
        --max-restarts=1 lessons/12_checkpoint_and_restart/worker.py drill DIR --hold 9
    ... add --backend nccl on a machine with 2 CUDA devices. Use an empty DIR each time.
    Elastic, two agents (two shells, the same free PORT and DIR; start the is_host=0 one first):
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=1:2 --nproc-per-node=1 \\
        --max-restarts=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT --rdzv-id=job \\
        --rdzv-conf=is_host=0,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=2 \\
        lessons/12_checkpoint_and_restart/worker.py elastic DIR     (is_host=1 in the second)
    Once both ranks have saved, `kill -9 AGENT PID` from a third shell, with the two pids that
    RANK 0 printed (node 0 dies); the other shell's agent restarts its rank as RANK 0 of 1.
    With --hold K the first attempt stops after step K and waits (60 s) for a kill: `kill -9`
    one of the pids it prints, from another shell.

- `reshard`: one training step of a small FSDP2 model, saved with DCP into DIR/step1 (each
  rank writes its own shards); the uninterrupted steps 2 and 3 are recorded in
  DIR/reference.pt and DIR/ref3.pt; a fresh sharded model loads DIR/step1 back into 2 ranks
  and must take the same step 2 bit for bit; then dcp.async_save stages the step-2 state into
  DIR/step2 and its background thread writes it only after step 3 ran (a gate in the writer).
- `drill DIR [--one RESHARD_DIR] [--hold K]`: with --one (first attempt only), fresh sharded
  models load RESHARD_DIR/step2_one, a checkpoint that ONE process saved after training step
  2, take step 3 and compare it with the ranks' uninterrupted step 3 (2 -> 1 -> 2). Then 12
  steps of a model with dropout on a shuffled data order, a checkpoint after every 3rd. On the
  first attempt every rank holds after step K (inside checkpoint K's write when K is a
  checkpoint step) until the parent SIGKILLs one of them from outside (the kit's
  `kill_when`); torchrun (--max-restarts=1) starts both ranks again; they load the latest
  *complete* checkpoint (with DCP's .metadata), check its config and code revision, replay,
  finish, and compare with an uninterrupted 12-step run computed at the end of the same
  attempt.
- `elastic DIR`: 2 torchrun agents of 1 rank each (two nodes, `--nnodes=1:2`). Attempt 0
  trains a step, saves it with DCP and, as the mistake to show, notes each rank's rows in
  DIR/rank{RANK}.json, then waits in barriers until the parent kills node 0 (agent and
  rank). The survivor's agent restarts its rank alone: it is RANK 0 of WORLD_SIZE 1 now,
  finds node 0's rows in rank0.json, computes its own from the environment, and loads the
  2 ranks' checkpoint.

Rank identity comes from the environment at every start (torchrun's RANK, dist.get_rank());
no file is named after a rank, except in `elastic`, on purpose. Output, process group and
teardown come from the course's kit, lessons/multirank.py (lesson 09): `say` prints
`rank N: ...`, `shared` a fact both ranks share (rank 0 only), `heading` starts a
`== name ==` section; `serve` runs the part.
"""

import datetime
import hashlib
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lessons/: the course's kit
from multirank import GROUP_TIMEOUT_S, heading, say, section, serve, shared

STEPS, EVERY = 12, 3  # the drill: 12 steps, a checkpoint after 3, 6, 9, 12
BATCH, ROWS = 8, 48  # global batch (4 rows per rank); the drill's data set: 6 batches an epoch
GATE_S = 30.0  # the longest async_save's writer waits for the main thread's step 3
HOLD_S = 60.0  # the longest a rank holds for the parent's kill before it gives up
CONFIG = {"sizes": [8, 16, 4], "dropout": 0.25, "lr": 0.05, "lr_halves_every": 4,
          "batch": BATCH, "rows": ROWS, "every": EVERY, "data_seed": 42, "shuffle_seed": 7}
REVISION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]  # this code's version


def build(device, seed=0, dropout=None):
    """The model, replicated on every rank from one seed; then sharded by FSDP2 (dim 0).
    With `dropout` (the drill), a Dropout layer before the last Linear."""
    torch.manual_seed(seed)
    drop = [torch.nn.Dropout(dropout)] if dropout is not None else []
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), *drop,
                                torch.nn.Linear(16, 4)).to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in (model[0], model[-1]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=CONFIG["lr"])
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=4, gamma=0.5)  # halves every 4
    return model, optim, sched


def batch(step, device):
    """The global batch of a step, from the step number alone (the data cursor is the step);
    this rank's half of it."""
    gen = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(BATCH, 8, generator=gen), torch.randn(BATCH, 4, generator=gen)  # (8, 8)
    rows = slice(dist.get_rank() * BATCH // 2, (dist.get_rank() + 1) * BATCH // 2)
    return x[rows].to(device), y[rows].to(device)  # (4, 8), (4, 4)


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


def train_step(model, optim, sched, step, device):
    return fit(model, optim, sched, *batch(step, device))


def full_params(model):
    """{name: full tensor} gathered from the shards (a collective: every rank calls it)."""
    return {n: p.full_tensor().cpu() for n, p in model.named_parameters()}


def state(model, optim, sched, step):
    """What a checkpoint of `reshard` holds: model and optimizer (sharded DTensors), the
    scheduler and the data cursor (plain values, the same on every rank)."""
    msd, osd = get_state_dict(model, optim)
    return {"model": msd, "optim": osd, "sched": sched.state_dict(), "step": step}


def restore(model, optim, sched, path):
    """Load a checkpoint into an already built (sharded) model, optimizer and scheduler."""
    sd = state(model, optim, sched, 0)  # the layout to fill: DCP loads in place
    dcp.load(sd, checkpoint_id=path)
    set_state_dict(model, optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    sched.load_state_dict(sd["sched"])
    return sd["step"]


def bitwise(a, b):
    return all(torch.equal(a[n], b[n]) for n in a)


# ---------------------------------------------------------------------------------------
# reshard: save from 2 ranks, load back into 2 ranks, async save


def save_and_reference(root, device):
    heading("save")
    model, optim, sched = build(device)
    loss1 = train_step(model, optim, sched, 1, device)
    dcp.save(state(model, optim, sched, 1), checkpoint_id=root / "step1")
    shared(f"step 1 loss {loss1:.6f}; saved {root.name}/step1")
    shape = tuple(model[0].weight.to_local().shape)
    say(f"local weight shard {shape} of global {tuple(model[0].weight.shape)}")
    loss2 = train_step(model, optim, sched, 2, device)
    params = full_params(model)
    if dist.get_rank() == 0:  # for the narrative's 1-process check of step 2
        torch.save({"loss": loss2, "params": params}, root / "reference.pt")
    shared(f"uninterrupted step 2 loss {loss2:.6f}")
    return loss2, params, (model, optim, sched)


def reload_two_ranks(root, device, loss2, params):
    heading("reload")
    model, optim, sched = build(device, seed=123)  # other weights: the load must overwrite them
    step = restore(model, optim, sched, root / "step1")
    loss = train_step(model, optim, sched, step + 1, device)
    shared(f"restored step {step}; step 2 loss {loss:.6f}, equal {loss == loss2}")
    equal = bitwise(full_params(model), params)
    shared(f"parameters after step 2 bitwise equal to the uninterrupted run: {equal}")


class GatedWriter(dcp.FileSystemWriter):
    """A FileSystemWriter whose write_data (run by async_save's background thread) first
    waits until the main thread opens the gate: the write cannot finish before that."""

    def __init__(self, path):
        super().__init__(path)
        self.gate, self.thread = threading.Event(), None

    def write_data(self, plan, planner):
        self.thread = threading.current_thread().name  # which thread writes the shards
        if not self.gate.wait(GATE_S):  # bounded: a main thread that died cannot hang us
            raise TimeoutError(f"the gate stayed closed for {GATE_S} s")
        return super().write_data(plan, planner)


def async_checkpoint(root, device, trained):
    heading("async")
    model, optim, sched = trained  # after step 2
    # its own group: async_save's background collectives must not interleave with training's
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    writer = GatedWriter(root / "step2")
    start = time.perf_counter()
    sd = state(model, optim, sched, 2)
    future = dcp.async_save(sd, storage_writer=writer, process_group=group)
    ms = (time.perf_counter() - start) * 1000
    shared(f"async_save returned after {ms:.1f} ms (state staged)")
    loss3 = train_step(model, optim, sched, 3, device)  # the background thread waits at the gate
    say(f"step 3 done (loss {loss3:.6f}); checkpoint finished before the gate opened: "
        f"{future.done()}")
    params = full_params(model)  # the uninterrupted step 3, for the 2 -> 1 -> 2 chain
    if dist.get_rank() == 0:
        torch.save({"loss": loss3, "params": params}, root / "ref3.pt")
    writer.gate.set()  # only now may the shards be written
    future.result()  # wait before the next save (and before anyone reads step2)
    shared(f"future.result() returned after {(time.perf_counter() - start) * 1000:.1f} ms")
    shared(f"shards written by thread {writer.thread!r}, not {threading.current_thread().name!r}")
    shared(f"step2 has .metadata: {(root / 'step2' / '.metadata').is_file()}")


def reshard(device, root, **_):  # (--one and --hold are the drill's)
    loss2, params, trained = save_and_reference(root, device)
    reload_two_ranks(root, device, loss2, params)
    async_checkpoint(root, device, trained)
    return 0


# ---------------------------------------------------------------------------------------
# drill, part 1: 2 -> 1 -> 2, the 2 ranks continue from what one process trained and saved


def one_to_two(device, ck):
    heading("one to two")
    model, optim, sched = build(device, seed=321)  # other weights again
    step = restore(model, optim, sched, ck / "step2_one")  # 1 full chunk -> 2 shards
    shape = tuple(model[0].weight.to_local().shape)
    say(f"loaded local weight shard {shape} from the full (16, 8)")
    ref = torch.load(ck / "ref3.pt")  # the ranks' uninterrupted step 3 (written by `reshard`)
    loss = train_step(model, optim, sched, step + 1, device)
    shared(f"restored step {step}; step 3 loss {loss:.6f}, equal {loss == ref['loss']}")
    equal = bitwise(full_params(model), ref["params"])
    shared(f"parameters after step 3 bitwise equal to the uninterrupted run: {equal}")


# ---------------------------------------------------------------------------------------
# drill, part 2: dropout, a shuffled loader, a kill from outside, a restart


class Job:
    """One rank's whole training state: FSDP2 model with dropout, Adam, StepLR, this rank's
    dropout RNG, and the shuffled data order with its cursor (as lesson section 2's Trainer)."""

    def __init__(self, device):
        self.device = device
        self.model, self.optim, self.sched = build(device, dropout=CONFIG["dropout"])
        torch.manual_seed(100 + dist.get_rank())  # each rank draws its own dropout masks
        data = torch.randn(ROWS, 12, generator=torch.Generator().manual_seed(42))  # (48, 12)
        self.x, self.y = data[:, :8], data[:, 8:]  # (48, 8), (48, 4)
        self.gen = torch.Generator().manual_seed(7)  # the loader's shuffle generator
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
        meta = {"config": json.dumps(CONFIG, sort_keys=True), "revision": REVISION,
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


def compatible(meta, config, world):
    """Does a checkpoint's record match a run with this config, this code and world size?"""
    return {"config": meta["config"] == json.dumps(config, sort_keys=True),
            "code revision": meta["revision"] == REVISION, "world size": meta["world"] == world}


def check(meta):
    """Refuse a checkpoint made by another config, other code or another world size."""
    ok = compatible(meta, CONFIG, dist.get_world_size())
    shared(f"checkpoint matches this run's {', '.join(f'{k} {v}' for k, v in ok.items())}")
    if not all(ok.values()):
        raise RuntimeError(f"checkpoint made by another run: {ok}")


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


def drill(device, root, one=None, hold_at=None):
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if one is not None and attempt == 0:
        one_to_two(device, one)
    heading("attempt")
    say(f"attempt {attempt}: RANK={os.environ['RANK']} of WORLD_SIZE="
        f"{os.environ['WORLD_SIZE']}, pid {os.getpid()}")
    job = Job(device)
    found = complete(root)
    if found:
        # DCP calls job.state_dict() for the layout, then job.load_state_dict(loaded)
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


# ---------------------------------------------------------------------------------------
# elastic: 2 nodes (torchrun agents) of 1 rank each; node 0 dies; the job goes on with 1


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
    train_step(model, optim, sched, 1, device)
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


# ---------------------------------------------------------------------------------------
# the parent's side: lesson section 2's Trainer, the drill's held_pid and figure


class Trainer:
    """Lesson section 2, one process: model + Adam + StepLR + dropout RNG + a shuffling
    DataLoader with its cursor; state_dict()/load_state_dict() make it Stateful for DCP."""

    def __init__(self, seed=0):
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5),
                                         torch.nn.Linear(8, 1))
        self.optim = torch.optim.Adam(self.model.parameters(), lr=0.1)
        self.sched = torch.optim.lr_scheduler.StepLR(self.optim, step_size=4, gamma=0.5)
        data = torch.randn(32, 5, generator=torch.Generator().manual_seed(42))  # (32, 5)
        ds = torch.utils.data.TensorDataset(torch.arange(32), data[:, :4], data[:, 4:])
        self.gen = torch.Generator().manual_seed(7)  # the loader's shuffle generator
        self.loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True,
                                                  generator=self.gen)
        self.step, self.epoch, self.used, self.it = 0, 0, 0, None
        self.epoch_rng = self.gen.get_state()  # the state that decides this epoch's order

    def batch(self):
        if self.it is None:  # (re)start the epoch's iterator at the cursor
            self.gen.set_state(self.epoch_rng)
            self.it = iter(self.loader)
            for _ in range(self.used):
                next(self.it)  # skip what was already consumed
        try:
            idx, x, y = next(self.it)
        except StopIteration:  # a new epoch: record the generator state, then shuffle
            self.epoch, self.used, self.it = self.epoch + 1, 0, None
            self.epoch_rng = self.gen.get_state()
            return self.batch()
        self.used += 1
        return idx, x, y

    def train_step(self):
        idx, x, y = self.batch()  # idx (4,), x (4, 4), y (4, 1)
        lr = self.optim.param_groups[0]["lr"]
        self.optim.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.optim.step()
        self.sched.step()
        self.step += 1
        return {"lr": lr, "batch": idx.tolist(), "loss": loss.item()}

    def state_dict(self):
        msd, osd = get_state_dict(self.model, self.optim)
        cursor = {"step": self.step, "epoch": self.epoch, "used": self.used,
                  "epoch_rng": self.epoch_rng}
        return {"model": msd, "optim": osd, "sched": self.sched.state_dict(),
                "rng": torch.get_rng_state(), "cursor": cursor}

    def load_state_dict(self, sd):
        set_state_dict(self.model, self.optim, model_state_dict=sd["model"],
                       optim_state_dict=sd["optim"])
        self.sched.load_state_dict(sd["sched"])
        torch.set_rng_state(sd["rng"])
        c = sd["cursor"]
        self.step, self.epoch, self.used = c["step"], c["epoch"], c["used"]
        self.epoch_rng, self.it = c["epoch_rng"], None


# (the drill's parent side)


def held_pid(root, rank):
    """The pid of rank `rank` once it holds (its file in root/held is named by its pid and
    holds its RANK), else None: for the kit's `kill_when`, which then SIGKILLs it."""
    held = root / "held"
    for f in held.glob("*") if held.is_dir() else ():
        if f.read_text() == str(rank):
            return int(f.name)
    return None


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
    import matplotlib.pyplot as plt

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


if __name__ == "__main__":
    def args(parser):
        parser.add_argument("root", type=Path, help="the folder for checkpoints (caller made it)")
        parser.add_argument("--one", type=Path, help="drill: first load RESHARD_DIR/step2_one")
        parser.add_argument("--hold", dest="hold_at", type=int, help="drill: hold after this step")

    serve({"reshard": reshard, "drill": drill, "elastic": elastic}, args)

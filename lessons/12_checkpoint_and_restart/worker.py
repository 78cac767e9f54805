"""The worker of lesson 12: FSDP2 checkpoints with torch.distributed.checkpoint (DCP) on 2 ranks.

    torchrun --standalone --nproc-per-node=2 lessons/12_checkpoint_and_restart/worker.py reshard DIR
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 --max-restarts=1 \\
        lessons/12_checkpoint_and_restart/worker.py drill DIR
    ... add --backend nccl on a machine with 2 CUDA devices

- `reshard`: one training step of a small FSDP2 model, saved with DCP into DIR/step1 (each
  rank writes its own shards); the uninterrupted second step is recorded in DIR/reference.pt;
  a fresh sharded model loads DIR/step1 back into 2 ranks and must take the same second step
  bit for bit; rank 0 converts DIR/step1 into a 1-process checkpoint DIR/step1_full
  (dcp_to_torch_save, then torch_save_to_dcp) and fresh sharded models load it on 2 ranks
  (1 -> 2) and take the same second step; then dcp.async_save stages the step-2 state into
  DIR/step2 and its background thread writes it only after step 3 ran (a gate in the writer).
- `drill`: 12 steps, a checkpoint after every 3rd. On the first attempt rank 1 kills itself
  (SIGKILL) in the middle of writing checkpoint 9, once (DIR/killed marks that it happened).
  torchrun (--max-restarts=1) starts both ranks again; they load the latest *complete*
  checkpoint (one with DCP's .metadata file), replay steps 7-9, finish, and compare their final
  parameters with an uninterrupted 12-step run computed at the end of the same attempt.

Output, process group and teardown come from the course's kit, lessons/multirank.py (lesson
09): `say` prints one line prefixed `rank N:`, `shared` a fact both ranks share (rank 0
only), `heading` starts a `== name ==` section; `serve` runs the part between `setup` and
`teardown`.
"""

import datetime
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lessons/: the course's kit
from multirank import GROUP_TIMEOUT_S, heading, say, serve, shared  # noqa: E402

STEPS, EVERY, KILL_AT = 12, 3, 9  # the drill: 12 steps, save after 3, 6, 9; die while saving 9
BATCH = 8  # global batch: each rank takes 4 rows
GATE_S = 30.0  # the longest async_save's writer waits for the main thread's step 3


def build(device, seed=0):
    """The model, replicated on every rank from one seed; then sharded by FSDP2 (dim 0)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=4, gamma=0.5)  # LR halves every 4 steps
    return model, optim, sched


def batch(step, device):
    """The global batch of a step, from the step number alone (the data cursor is the step);
    this rank's half of it."""
    gen = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(BATCH, 8, generator=gen), torch.randn(BATCH, 4, generator=gen)  # (8, 8), (8, 4)
    rows = slice(dist.get_rank() * BATCH // 2, (dist.get_rank() + 1) * BATCH // 2)
    return x[rows].to(device), y[rows].to(device)  # (4, 8), (4, 4)


def train_step(model, optim, sched, step, device):
    """One step on this rank's half batch; returns the global mean loss (a float)."""
    x, y = batch(step, device)
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


def state(model, optim, sched, step):
    """What a checkpoint holds: model and optimizer (sharded DTensors), the scheduler and the
    data cursor (plain values, the same on every rank)."""
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
    say(f"local weight shard {tuple(model[0].weight.to_local().shape)} of global {tuple(model[0].weight.shape)}")
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
    shared(f"parameters after step 2 bitwise equal to the uninterrupted run: {bitwise(full_params(model), params)}")


def one_to_two(root, device, loss2, params):
    heading("one to two")
    if dist.get_rank() == 0:  # one process turns the 2-rank checkpoint into a 1-process one
        dcp_to_torch_save(root / "step1", root / "step1_full.pt")  # full tensors, one file
        torch_save_to_dcp(root / "step1_full.pt", root / "step1_full")  # saved by 1 process, no_dist
        files = sorted(p.name for p in (root / "step1_full").iterdir())
        say(f"wrote step1_full by itself: {files}")
    dist.barrier()  # nobody reads step1_full before it is complete
    model, optim, sched = build(device, seed=321)
    step = restore(model, optim, sched, root / "step1_full")  # 1 full chunk -> 2 shards
    say(f"loaded local weight shard {tuple(model[0].weight.to_local().shape)} from the full (16, 8)")
    loss = train_step(model, optim, sched, step + 1, device)
    shared(f"restored step {step}; step 2 loss {loss:.6f}, equal {loss == loss2}")
    shared(f"parameters after step 2 bitwise equal to the uninterrupted run: {bitwise(full_params(model), params)}")


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
    future = dcp.async_save(state(model, optim, sched, 2), storage_writer=writer, process_group=group)
    shared(f"async_save returned after {(time.perf_counter() - start) * 1000:.1f} ms (state staged)")
    loss3 = train_step(model, optim, sched, 3, device)  # the background thread waits at the gate
    say(f"step 3 done (loss {loss3:.6f}); checkpoint finished before the gate opened: {future.done()}")
    writer.gate.set()  # only now may the shards be written
    future.result()  # wait before the next save (and before anyone reads step2)
    shared(f"future.result() returned after {(time.perf_counter() - start) * 1000:.1f} ms")
    shared(f"shards written by thread {writer.thread!r}, not {threading.current_thread().name!r}")
    shared(f"step2 has .metadata: {(root / 'step2' / '.metadata').is_file()}")


def reshard(device, root):
    loss2, params, trained = save_and_reference(root, device)
    reload_two_ranks(root, device, loss2, params)
    one_to_two(root, device, loss2, params)
    async_checkpoint(root, device, trained)
    return 0


# ---------------------------------------------------------------------------------------
# drill: die while saving, restart, resume from the latest complete checkpoint


class DyingWriter(dcp.FileSystemWriter):
    """A FileSystemWriter that, on rank 1, kills its process right after writing its shard
    file: the coordinator (rank 0) never gets rank 1's write results, so no .metadata."""

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        future.wait()  # this rank's __1_0.distcp is on disk now
        say("killing myself (SIGKILL) after writing my shard of checkpoint 9")
        os.kill(os.getpid(), signal.SIGKILL)
        return future


def complete(root):
    """Checkpoint steps whose folder has DCP's .metadata (written last, via a rename)."""
    steps = []
    for d in sorted(root.glob("step_*"), key=lambda p: int(p.name[5:])):
        ok = (d / ".metadata").is_file()
        shard = (d / "__1_0.distcp").is_file()
        shared(f"found {d.name}: rank 1's shard {shard}, .metadata {ok} -> {'complete' if ok else 'INCOMPLETE, skipped'}")
        steps += [int(d.name[5:])] if ok else []
    return steps


def save(root, trained, step, dying):
    path = root / f"step_{step}"
    writer = DyingWriter(path) if dying else dcp.FileSystemWriter(path)
    dcp.save(state(*trained, step), storage_writer=writer)
    shared(f"saved step_{step}")


def run_steps(root, device, trained, first, record):
    for step in range(first, STEPS + 1):
        lr = trained[1].param_groups[0]["lr"]  # the LR this step uses (the scheduler steps after)
        loss = train_step(*trained, step, device)
        record[step] = loss
        shared(f"step {step} loss {loss:.6f} lr {lr:.4f}")
        if step % EVERY == 0:
            marker = root / "killed"
            dying = step == KILL_AT and dist.get_rank() == 1 and not marker.exists()
            if dying:
                marker.write_text(f"{step}\n")  # before the kill: it happens once
            save(root, trained, step, dying)


def drill(device, root):
    heading("attempt")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    say(f"TORCHELASTIC_RESTART_COUNT={attempt} pid {os.getpid()}")
    trained = build(device)
    found = complete(root)
    start = 0
    if found:
        start = restore(*trained, root / f"step_{found[-1]}")
        killed = int((root / "killed").read_text())  # the step the marker recorded
        shared(f"resumed from step_{start}; the kill came after step {killed}: replay window steps {start + 1}-{killed}")
    heading("train")
    record = {}
    run_steps(root, device, trained, start + 1, record)
    heading("reference")
    final = full_params(trained[0])
    ref = build(device)
    ref_losses = {s: train_step(*ref, s, device) for s in range(1, STEPS + 1)}  # never interrupted
    shared(f"uninterrupted losses: {' '.join(f'{ref_losses[s]:.6f}' for s in range(1, STEPS + 1))}")
    shared(f"resumed losses equal the uninterrupted ones: {all(record[s] == ref_losses[s] for s in record)}")
    shared(f"final parameters bitwise equal to the uninterrupted run: {bitwise(final, full_params(ref[0]))}")
    return 0


if __name__ == "__main__":
    serve({"reshard": reshard, "drill": drill},
          lambda parser: parser.add_argument("root", type=Path, help="the folder for checkpoints (made by the caller)"))

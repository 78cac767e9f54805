"""The worker of lesson 14: the capstone's GPT trained on 2 ranks with FSDP2 and DCP checkpoints.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 --max-restarts=1 \\
        lessons/14_capstone/worker.py drill DIR [--steps 40] [--every 10] [--stop-at K]
    ... add --backend nccl on a machine with 2 GPUs

`drill` trains `gpt.GPT` (the lesson's model, from the same seed) for --steps steps on a global
batch of gpt.BATCH sequences, half on each rank, sharded with `fully_shard` (each block, then
the root), and saves a DCP checkpoint into DIR/step_N after every --every steps. Each attempt
first resumes from the newest *complete* checkpoint in DIR (one with `.metadata`).

--stop-at K: on the first attempt only, both ranks stop after step K, write their pid into
DIR/paused.rankR and wait to be killed from outside (the lesson's parent SIGKILLs one of
them; you can `kill -9` one by hand). Then torchrun (--max-restarts=1) starts a new attempt.
At the end, the same ranks train an uninterrupted run from scratch and compare.

--shuffler PATH (exercise B): batches come from the `Shuffler` class in the file PATH, whose
state goes into every checkpoint, instead of from gpt.batch_rows (a function of the step).

Output, process group and teardown come from the course's kit, lessons/multirank.py (lesson
09): `say` prints one line prefixed `rank N:`, `shared` a fact both ranks share (rank 0
only), `heading` starts a `== name ==` section; `serve` runs the part between `setup` and
`teardown`.
"""

import importlib.util
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # lessons/: the course's kit
sys.path.insert(0, str(HERE))  # the lesson's model and data
import gpt  # noqa: E402
from multirank import heading, say, serve, shared  # noqa: E402

WAIT_S = 60.0  # how long a paused rank waits for its kill before it gives up (an error)


class StepRows:
    """The lesson's data order: step s's rows come from gpt.batch_rows(s), nothing to save."""

    def __init__(self, n, size, seed=0):
        self.n, self.size, self.seed, self.step = n, size, seed, 0

    def next(self):
        self.step += 1
        return gpt.batch_rows(self.step, self.n, self.size, self.seed)

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, sd):
        self.step = sd["step"]


def loader(path):
    """The data order: the lesson's (path None) or the Shuffler class of the file path."""
    if path is None:
        return StepRows
    spec = importlib.util.spec_from_file_location("answers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Shuffler


def build(device):
    """The lesson's GPT from its seed, sharded: one FSDP2 unit per block, then the root
    (embeddings, tied output, final norm); AdamW made after sharding (it holds the shards)."""
    model = gpt.build(seed=0).to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, gpt.optimizer(model)


def my_half(seq):
    """This rank's rows of the global batch (B, 13): (B / 2, 13)."""
    per = seq.shape[0] // dist.get_world_size()
    return seq[dist.get_rank() * per:(dist.get_rank() + 1) * per]


def step_once(model, opt, seq, device):
    """One step on this rank's half; FSDP2 averages the gradients over the ranks, so the
    update is the whole batch's. Returns the global mean loss (a float)."""
    loss = gpt.train_step(model, opt, my_half(seq).to(device))
    dist.all_reduce(loss)  # sum of the two halves' means
    return (loss / dist.get_world_size()).item()


def state(model, opt, data, step):
    """A checkpoint: model and AdamW (sharded DTensors), the data order, the step."""
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "data": data, "step": step}


def complete(root):
    """Steps of the checkpoints under root that have DCP's .metadata (written last)."""
    found = sorted(int(d.name[5:]) for d in root.glob("step_*") if (d / ".metadata").is_file())
    shared(f"complete checkpoints: {', '.join(f'step_{s}' for s in found) or 'none'}")
    return found


def resume(root, model, opt, data):
    """Load the newest complete checkpoint in place; returns its step (0: none)."""
    found = complete(root)
    if not found:
        return 0
    sd = state(model, opt, data, 0)  # the layout DCP fills in place (data: Stateful)
    dcp.load(sd, checkpoint_id=root / f"step_{found[-1]}")
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return sd["step"]


def pause(root, step):
    """Stop after `step` and wait to be killed from outside (first attempt only)."""
    flag, tmp = root / f"paused.rank{dist.get_rank()}", root / f"writing.rank{dist.get_rank()}"
    tmp.write_text(f"{os.getpid()}\n")
    tmp.rename(flag)  # atomic: the parent never reads half a pid
    say(f"paused after step {step}: waiting to be killed (kill -9 {os.getpid()})")
    time.sleep(WAIT_S)
    raise TimeoutError(f"paused for {WAIT_S:.0f} s and nobody killed this rank")


def run(root, device, data_cls, steps, every, stop_at, resume_from=True):
    """Train up to `steps`, checkpoints every `every`; {step: loss} of the steps it ran."""
    model, opt = build(device)
    data = data_cls(len(TRAIN), gpt.BATCH)
    start = resume(root, model, opt, data) if resume_from else 0
    if start:
        shared(f"resumed from step_{start}: next step {start + 1}")
    losses = {}
    for step in range(start + 1, steps + 1):
        losses[step] = step_once(model, opt, TRAIN[data.next()], device)
        shared(f"step {step} loss {losses[step]!r}")
        if every and step % every == 0:
            dcp.save(state(model, opt, data, step), checkpoint_id=root / f"step_{step}")
            shared(f"saved step_{step}")
        if step == stop_at:
            pause(root, step)
    return losses, {n: p.full_tensor() for n, p in model.named_parameters()}  # gathered


def drill(device, root, steps, every, stop_at, shuffler):
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    heading("attempt")
    say(f"TORCHELASTIC_RESTART_COUNT={attempt} pid {os.getpid()}")
    data_cls = loader(shuffler)
    heading("train")
    losses, params = run(root, device, data_cls, steps, every, stop_at if attempt == 0 else None)
    heading("reference")  # the same ranks, from scratch, never stopped, no checkpoints
    ref_losses, ref_params = run(root, device, data_cls, steps, 0, None, resume_from=False)
    shared(f"losses of this attempt's steps equal the uninterrupted run's: "
           f"{all(losses[s] == ref_losses[s] for s in losses)}")
    same = all(torch.equal(params[n], ref_params[n]) for n in params)
    shared(f"final parameters bitwise equal to the uninterrupted run: {same}")
    return 0


def add_args(parser):
    parser.add_argument("root", type=Path, help="the folder for checkpoints (made by the caller)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="save after every N-th step")
    parser.add_argument("--stop-at", type=int, default=None, help="first attempt: pause after this step")
    parser.add_argument("--shuffler", type=Path, default=None, help="a file with a Shuffler class")


TRAIN = gpt.load()["train"]  # (2000, 13) tokens, the same file the lesson reads

if __name__ == "__main__":
    serve({"drill": drill}, add_args)

"""The worker of lesson 09: collectives, DeviceMesh and DTensor on 2 ranks.

    torchrun --standalone --nproc-per-node=2 lessons/09_collectives_and_dtensor/worker.py collectives
    torchrun --standalone --nproc-per-node=2 lessons/09_collectives_and_dtensor/worker.py mismatch
    ... worker.py collectives --backend nccl   # 2 CUDA devices; --backend auto picks nccl there

- `collectives`: world, rank, local rank, backend; all_reduce, all_gather, reduce_scatter,
  broadcast, barrier on the sum-partials [1, 2] (rank 0) and [10, 20] (rank 1); a DeviceMesh,
  DTensor placements, three redistributions and a sharded matmul.
- `mismatch`: rank 0 calls all_reduce while rank 1 calls all_gather, on a group with a 3 s
  timeout, then on a group checked by the DETAIL debug wrapper; then monitored_barrier names a
  rank that never arrives. The part ends with exit code 1: a mismatch is a failure.

Output: every line is one print() that starts with `rank N:` (ranks' prints interleave inside
a line otherwise); facts shared by both ranks come from rank 0 only; `== name ==` lines start
a section (the lesson's narrative shows one section at a time).

Teardown: dist.barrier() then dist.destroy_process_group() on every exit path, then flush and
os._exit(code). A rank that falls off the end of the script can die after its work with
"terminate called without an active exception" (a gloo thread still frees a finished
collective while Python shuts down); after the DTensor part this happened even after
destroy_process_group() (1 launch in 20 under load), never with os._exit (0 in 20).
"""

import argparse
import datetime
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

TIMEOUT = datetime.timedelta(seconds=30)  # the default group's: gloo's default is 30 minutes
SHORT = datetime.timedelta(seconds=3)  # the mismatch demos' groups


def say(text):
    """One line, one print, prefixed with this rank."""
    print(f"rank {dist.get_rank()}: {text}", flush=True)


def shared(text):
    """A fact both ranks share: printed once, by rank 0."""
    if dist.get_rank() == 0:
        say(text)


def section(name):
    say(f"== {name} ==")


def setup(backend):
    """Join the group torchrun describes in the environment; return the device for tensors."""
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = int(os.environ["LOCAL_RANK"])
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=TIMEOUT, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=TIMEOUT)
    return device


def partial_vector(device):
    """The sum-partials of the logical vector [11, 22]: [1, 2] on rank 0, [10, 20] on rank 1."""
    return torch.tensor([1, 2] if dist.get_rank() == 0 else [10, 20], device=device)


def comms(counts):
    """CommDebugMode's counts as text: 'all_reduce x1', or 'none' when nothing was sent."""
    text = ", ".join(f"{str(op).split('.')[-1]} x{n}" for op, n in counts.items())
    return text or "none"


def show_world(device):
    section("world")
    env = " ".join(f"{k}={os.environ[k]}" for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    say(f"rank {dist.get_rank()} of {dist.get_world_size()}, env {env}, device {device.type}")
    shared(f"backend {dist.get_backend()}, default group ranks {dist.get_process_group_ranks(dist.group.WORLD)}")


def show_collectives(device):
    section("collectives")
    x = partial_vector(device)
    say(f"partial x = {x.tolist()}")
    y = x.clone()  # every collective here writes in place or into an output we allocate
    dist.all_reduce(y)  # SUM by default
    say(f"all_reduce            -> {y.tolist()}")
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    say(f"all_gather            -> {[p.tolist() for p in parts]}")
    cat = torch.empty(2 * x.numel(), dtype=x.dtype, device=device)
    dist.all_gather_single(cat, x)  # the current name; all_gather_into_tensor is deprecated
    say(f"all_gather_single     -> {cat.tolist()}  ({cat.numel()} elements: the partials side by side)")
    mine = torch.empty(x.numel() // 2, dtype=x.dtype, device=device)
    dist.reduce_scatter_single(mine, x)  # the current name; reduce_scatter_tensor is deprecated
    say(f"reduce_scatter_single -> {mine.tolist()}")
    b = x.clone()
    dist.broadcast(b, src=0)
    say(f"broadcast(src=0)      -> {b.tolist()}")


def show_barrier():
    section("barrier")
    time.sleep(0.5 * dist.get_rank())  # rank 1 is late: it has "more work" to do
    start = time.perf_counter()
    dist.barrier()
    say(f"waited {time.perf_counter() - start:.2f} s at the barrier")


def show_placements(mesh, device):
    section("placements")
    shared(f"mesh {mesh}")
    say(f"mesh coordinate dp={mesh.get_local_rank('dp')}")
    full = torch.arange(4, device=device)
    for placement in (Shard(0), Replicate()):
        d = distribute_tensor(full, mesh, [placement])
        say(f"{placement}: global {list(d.shape)} local {d.to_local().tolist()}")
    p = DTensor.from_local(partial_vector(device), mesh, [Partial()])
    say(f"{p.placements[0]}: global {list(p.shape)} local {p.to_local().tolist()}")
    return distribute_tensor(full, mesh, [Shard(0)]), p


def redistribute(d, mesh, placement):
    """Redistribute, print before/after local pieces, and which collective it ran."""
    with CommDebugMode() as counter:
        out = d.redistribute(mesh, [placement])
    say(f"{d.placements[0]} -> {placement}: local {d.to_local().tolist()} -> {out.to_local().tolist()}")
    shared(f"{d.placements[0]} -> {placement} ran: {comms(counter.get_comm_counts())}")
    return out


def show_redistributions(mesh, sharded, partial):
    section("redistribute")
    redistribute(sharded, mesh, Replicate())  # all-gather
    redistribute(partial, mesh, Replicate())  # all-reduce
    redistribute(partial, mesh, Shard(0))  # reduce-scatter
    redistribute(distribute_tensor(torch.arange(4, device=sharded.device), mesh, [Replicate()]),
                 mesh, Shard(0))  # no communication: each rank keeps its slice


def show_matmul(mesh, device):
    section("matmul")
    a = torch.arange(8.0, device=device).reshape(2, 4)  # (2, 4): small integers, exact sums
    b = torch.arange(12.0, device=device).reshape(4, 3)  # (4, 3)
    da = distribute_tensor(a, mesh, [Shard(1)])  # each rank: 2 of a's 4 columns
    db = distribute_tensor(b, mesh, [Shard(0)])  # each rank: the matching 2 of b's 4 rows
    with CommDebugMode() as counter:
        dc = da @ db
    say(f"a local {da.to_local().tolist()}, b local {db.to_local().tolist()}")
    say(f"a @ b local {dc.to_local().tolist()}")
    shared(f"a @ b placement {dc.placements[0]}, ran: {comms(counter.get_comm_counts())}")
    with CommDebugMode() as counter:
        full = dc.full_tensor()
    shared(f"full_tensor() {full.tolist()}, ran: {comms(counter.get_comm_counts())}")
    shared(f"equal to the single-process a @ b: {torch.equal(full, a @ b)}")
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 64, generator=gen).to(device), torch.randn(64, 3, generator=gen).to(device)
    full = (distribute_tensor(a, mesh, [Shard(1)]) @ distribute_tensor(b, mesh, [Shard(0)])).full_tensor()
    shared(f"random fp32: equal {torch.equal(full, a @ b)}, allclose {torch.allclose(full, a @ b)}")


def collectives(device):
    show_world(device)
    show_collectives(device)
    show_barrier()
    mesh = init_device_mesh(device.type, (2,), mesh_dim_names=("dp",))
    sharded, partial = show_placements(mesh, device)
    show_redistributions(mesh, sharded, partial)
    show_matmul(mesh, device)
    return 0


def mismatched_call(group):
    """Rank 0 all_reduce, rank 1 all_gather, on the same group: the contract is broken."""
    x = partial_vector(torch.device("cpu"))
    start = time.perf_counter()
    try:
        if dist.get_rank() == 0:
            dist.all_reduce(x, group=group)
        else:
            dist.all_gather([torch.empty_like(x) for _ in range(2)], x, group=group)
    except RuntimeError as err:
        return time.perf_counter() - start, str(err)
    return time.perf_counter() - start, None


def show_timeout():
    section("timeout")
    group = dist.new_group(backend="gloo", timeout=SHORT)  # gloo: works beside an NCCL default
    seconds, err = mismatched_call(group)
    # the message varies ("Timed out waiting 3000ms for recv ..." or "Connection closed by
    # peer"): stable is that it raises, after about the group's timeout
    verb = "raised RuntimeError" if err else "returned (no error)"
    say(f"{'all_reduce' if dist.get_rank() == 0 else 'all_gather'} {verb} after {seconds:.1f} s")
    return err is not None


def show_detail():
    section("detail")
    dist.set_debug_level(dist.DebugLevel.DETAIL)  # what TORCH_DISTRIBUTED_DEBUG=DETAIL sets at import
    group = dist.new_group(backend="gloo", timeout=SHORT)  # wrapped: fingerprints checked first
    dist.set_debug_level(dist.DebugLevel.OFF)
    seconds, err = mismatched_call(group)
    say(f"raised after {seconds:.2f} s: {err.split('. ')[0] if err else 'no error'}")
    if err:
        say(" ".join(err.split("following aspects:")[-1].split()))
    return err is not None


def show_monitored_barrier():
    section("monitored_barrier")
    group = dist.new_group(backend="gloo", timeout=SHORT)
    if dist.get_rank() == 1:
        time.sleep(1.5)  # stuck elsewhere: never enters the monitored barrier
        say("was busy and never entered the monitored barrier")
        return False
    start = time.perf_counter()
    try:
        dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=1))
    except RuntimeError as err:
        say(f"raised after {time.perf_counter() - start:.1f} s: {str(err).splitlines()[0]}")
        return True
    say("monitored barrier passed")
    return False


def mismatch(device):
    found = [show_timeout(), show_detail(), show_monitored_barrier()]
    say(f"raised in {sum(found)} of {len(found)} demos; exiting with 1")
    return 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["collectives", "mismatch"])
    parser.add_argument("--backend", choices=["gloo", "nccl", "auto"], default="gloo")
    args = parser.parse_args()
    device = setup(args.backend)
    code = 1
    try:
        code = {"collectives": collectives, "mismatch": mismatch}[args.part](device)
    except Exception:
        traceback.print_exc()  # os._exit below would otherwise swallow the error
    finally:
        try:
            dist.barrier()  # no rank tears down while the other still talks to it
        finally:
            dist.destroy_process_group()  # stop gloo's threads before Python's exit
            # Even so, after the DTensor part one rank in 20 launches still died at exit under
            # load with "terminate called without an active exception": a background thread
            # touched Python while the interpreter was finalizing. All work and output are
            # done here, so skip the interpreter's finalization: flush, then os._exit.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


if __name__ == "__main__":
    main()

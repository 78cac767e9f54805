"""The worker of lesson 09: collectives, DeviceMesh and DTensor on 2 ranks.

    torchrun --standalone --nproc-per-node=2 lessons/09_collectives_and_dtensor/worker.py collectives
    torchrun --standalone --nproc-per-node=2 lessons/09_collectives_and_dtensor/worker.py mismatch
    ... worker.py collectives --backend nccl   # 2 CUDA devices; --backend auto picks nccl there
    ... worker.py hang                         # never ends: the kit's hard timeout stops it

- `collectives`: world, rank, local rank, backend; all_reduce, all_gather, reduce_scatter,
  broadcast, barrier on the sum-partials [1, 2] (rank 0) and [10, 20] (rank 1); a DeviceMesh,
  DTensor placements, three redistributions and a sharded matmul.
- `mismatch`: rank 0 calls all_reduce while rank 1 calls all_gather, on a group with a 3 s
  timeout, then on a group checked by the DETAIL debug wrapper; then monitored_barrier names a
  rank that never arrives. The part ends with exit code 1: a mismatch is a failure.

The boilerplate of every worker of the course comes from the kit, lessons/multirank.py:
`serve` reads the part and `--backend` from the command line, joins the process group
(`setup`: gloo on the CPU, a 60 s timeout instead of gloo's 30 minutes), runs the part and
tears down (`teardown`: a barrier only if the part returned normally, then always
destroy_process_group(), then os._exit with the part's exit code); `say` prints one line
prefixed `rank N:` (ranks' prints interleave inside a line otherwise), `shared` prints a
fact both ranks share from rank 0 only, `heading` starts a `== name ==` section (the
lesson's narrative shows one section at a time).
"""

import datetime
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lessons/: the course's kit
from multirank import MARK, heading, say, serve, shared

SHORT = datetime.timedelta(seconds=3)  # the mismatch demos' groups


def partial_vector(device):
    """The sum-partials of the logical vector [11, 22]: [1, 2] on rank 0, [10, 20] on rank 1."""
    return torch.tensor([1, 2] if dist.get_rank() == 0 else [10, 20], device=device)


def comms(counts):
    """CommDebugMode's counts as text: 'all_reduce x1', or 'none' when nothing was sent."""
    text = ", ".join(f"{str(op).split('.')[-1]} x{n}" for op, n in counts.items())
    return text or "none"


def show_world(device):
    heading("world")
    env = " ".join(f"{k}={os.environ[k]}" for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    say(f"rank {dist.get_rank()} of {dist.get_world_size()}, env {env}, device {device.type}")
    shared(f"backend {dist.get_backend()}, default group ranks {dist.get_process_group_ranks(dist.group.WORLD)}")
    # what the kit relies on to kill a launch: each rank leads a session of its own (torchrun
    # starts it so), and carries the launch's mark in its environment
    say(f"leads a process session of its own: {os.getsid(0) == os.getpid()}; carries {MARK}: {MARK in os.environ}")


def show_collectives(device):
    heading("collectives")
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
    heading("barrier")
    time.sleep(0.5 * dist.get_rank())  # rank 1 is late: it has "more work" to do
    entered = time.monotonic()  # one clock for every process of this machine
    dist.barrier()
    left = time.monotonic()
    say(f"waited {left - entered:.2f} s at the barrier")
    times = [torch.zeros(2, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(times, torch.tensor([entered, left], dtype=torch.float64))
    last_in = max(t[0] for t in times)
    shared(f"every rank left the barrier after the last one entered it: {all(t[1] >= last_in for t in times)}")


def show_placements(mesh, device):
    heading("placements")
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
    heading("redistribute")
    redistribute(sharded, mesh, Replicate())  # all-gather
    redistribute(partial, mesh, Replicate())  # all-reduce
    redistribute(partial, mesh, Shard(0))  # reduce-scatter
    redistribute(distribute_tensor(torch.arange(4, device=sharded.device), mesh, [Replicate()]),
                 mesh, Shard(0))  # no communication: each rank keeps its slice


def show_matmul(mesh, device):
    heading("matmul")
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
    halves = a[:, :32].contiguous() @ b[:32] + a[:, 32:].contiguous() @ b[32:]  # the two ranks' products, added
    # Bitwise equality with one process's a @ b depends on the order the BLAS sums in (it
    # differs between CPUs), so it is not printed as a fact: the gap is, against a bound.
    shared(f"random fp32: bitwise equal to the two half-products added: {torch.equal(full, halves)}; "
           f"max gap to one process's a @ b below 1e-5: {(full - a @ b).abs().max().item() < 1e-5}")


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
    heading("timeout")
    group = dist.new_group(backend="gloo", timeout=SHORT)  # gloo: works beside an NCCL default
    seconds, err = mismatched_call(group)
    # the message varies ("Timed out waiting 3000ms for recv ..." or "Connection closed by
    # peer"): stable is that it raises, after about the group's timeout
    verb = "raised RuntimeError" if err else "returned (no error)"
    say(f"{'all_reduce' if dist.get_rank() == 0 else 'all_gather'} {verb} after {seconds:.1f} s")
    return err is not None


def show_detail():
    heading("detail")
    dist.set_debug_level(dist.DebugLevel.DETAIL)  # what TORCH_DISTRIBUTED_DEBUG=DETAIL sets at import
    group = dist.new_group(backend="gloo", timeout=SHORT)  # wrapped: fingerprints checked first
    dist.set_debug_level(dist.DebugLevel.OFF)
    seconds, err = mismatched_call(group)
    say(f"raised after {seconds:.2f} s: {err.split('. ')[0] if err else 'no error'}")
    if err:
        say(" ".join(err.split("following aspects:")[-1].split()))
    return err is not None


def show_monitored_barrier():
    heading("monitored_barrier")
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


def hang(device):
    """A rank that never finishes, as one stuck before its first collective would."""
    heading("hang")
    say("hanging")
    while True:
        time.sleep(1)


if __name__ == "__main__":
    serve({"collectives": collectives, "mismatch": mismatch, "hang": hang})

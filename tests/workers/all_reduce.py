"""The harness's demo worker: sum-partials [1, 2] and [10, 20] all-reduced to [11, 22].

    torchrun --standalone --nproc-per-node=2 tests/workers/all_reduce.py [--no-teardown]

Teardown: a barrier, then destroy_process_group(), before the interpreter exits. Falling
off the end of the script instead (--no-teardown) let one rank die *after* its work with
"terminate called without an active exception" (SIGABRT) in 33 of 120 launches on this
machine; with destroy_process_group() 0 of 240 (`python -m scripts.soak` shows both).
"""

import datetime
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
x = torch.tensor([1.0, 2.0]) if rank == 0 else torch.tensor([10.0, 20.0])
dist.all_reduce(x)  # SUM by default
print(f"rank {rank}: all_reduce -> {x.tolist()}", flush=True)
if "--no-teardown" not in sys.argv:
    dist.barrier()  # no rank starts tearing down while another still talks to it
    dist.destroy_process_group()  # stop gloo's threads before Python's exit destroys them

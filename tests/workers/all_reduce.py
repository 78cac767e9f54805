"""The harness's demo worker: sum-partials [1, 2] and [10, 20] all-reduced to [11, 22].

    torchrun --standalone --nproc-per-node=2 tests/workers/all_reduce.py
"""

import datetime

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
x = torch.tensor([1.0, 2.0]) if rank == 0 else torch.tensor([10.0, 20.0])
dist.all_reduce(x)  # SUM by default
print(f"rank {rank}: all_reduce -> {x.tolist()}", flush=True)
dist.barrier()
dist.destroy_process_group()

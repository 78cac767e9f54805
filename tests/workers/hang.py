"""A worker that never finishes: the harness must stop it within its timeout, leaving nothing."""

import datetime
import time

import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
print(f"rank {dist.get_rank()}: initialised, now hanging", flush=True)
while True:
    time.sleep(1)

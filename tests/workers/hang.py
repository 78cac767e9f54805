"""A worker that never finishes: the kit must stop it within its timeout, leaving nothing.

It says it started before importing torch, so that a test on a loaded machine still sees
that the ranks were running when the timeout struck."""

import os

print(f"rank {os.environ['RANK']}: started", flush=True)

import datetime  # noqa: E402
import time  # noqa: E402

import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
print(f"rank {dist.get_rank()}: initialised, now hanging", flush=True)
while True:
    time.sleep(1)

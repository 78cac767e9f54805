"""Rank 1 exits with the code given on the command line; rank 0 waits for it at a barrier."""

import datetime
import sys

import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
if dist.get_rank() == 1:
    print(f"rank 1: exiting with {sys.argv[1]}", flush=True)
    dist.destroy_process_group()  # on every exit path, or the exit code may become -6 (SIGABRT)
    sys.exit(int(sys.argv[1]))
dist.barrier()  # never completes: the agent stops rank 0 once rank 1 has failed

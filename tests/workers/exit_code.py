"""Rank 1 exits with the code given on the command line; rank 0 waits to be stopped.

Rank 0 sleeps rather than waiting in a collective: a barrier would fail as soon as rank 1
leaves, and rank 0's own error (exit 1) could then reach torchrun before rank 1's exit code.
"""

import datetime
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
if rank == 1:
    print(f"rank 1: exiting with {sys.argv[1]}", flush=True)
dist.destroy_process_group()  # on every exit path, or an exit code may become -6 (SIGABRT)
if rank == 1:
    sys.exit(int(sys.argv[1]))
time.sleep(30)  # torchrun stops rank 0 (SIGTERM) once rank 1 has failed

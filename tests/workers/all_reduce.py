"""The harness's demo worker: sum-partials [1, 2] and [10, 20] all-reduced to [11, 22].

    torchrun --standalone --nproc-per-node=2 tests/workers/all_reduce.py [--no-teardown]

Teardown: a barrier, then destroy_process_group(), before the interpreter exits. Falling
off the end of the script instead (--no-teardown) let a rank die *after* its work with
"terminate called without an active exception" (SIGABRT) in 40 of 160 launches on this
machine; every variant that called destroy_process_group() passed 640 of 640.

Why (from core dumps of the aborted ranks): a gloo worker thread frees the finished
all_reduce's work object *after* the main thread has seen the result and moved on. Freeing
it drops the last reference to the Python tensor, which needs the GIL; if the main thread is
already finalizing the interpreter, Python 3.11 ends the thread that asks for the GIL, the
unwind crosses a noexcept destructor and C++ calls std::terminate. A barrier alone does not
help (3 of 60 still aborted): it waits for the collective, not for its cleanup.
destroy_process_group() stops gloo's threads, so nothing touches Python during shutdown.
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

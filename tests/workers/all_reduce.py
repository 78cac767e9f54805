"""The harness's demo worker: rank r holds [1, 2] * 10**r; all_reduce sums them.

    torchrun --standalone --nproc-per-node=2 tests/workers/all_reduce.py all_reduce   # [11, 22]
    ... all_reduce --fail          # rank 1 raises while rank 0 enters its next collective
    ... plain                      # no teardown at all: the script just ends

`all_reduce` ends through the kit's teardown (lessons/multirank.py): a barrier only when the
part returned normally, then always destroy_process_group(), then os._exit. `plain` falls
off the end of the script instead: a rank may then die *after* its work with "terminate
called without an active exception" (SIGABRT): in 40 of 160 launches when measured, where
every variant that called destroy_process_group() passed 640 of 640.

Why (from core dumps of the aborted ranks): a gloo worker thread frees the finished
all_reduce's work object *after* the main thread has seen the result and moved on. Freeing
it drops the last reference to the Python tensor, which needs the GIL; if the main thread is
already finalizing the interpreter, Python 3.11 ends the thread that asks for the GIL, the
unwind crosses a noexcept destructor and C++ calls std::terminate. A barrier alone does not
help (3 of 60 still aborted): it waits for the collective, not for its cleanup.
destroy_process_group() stops gloo's threads, so nothing touches Python during shutdown.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lessons"))  # the course's kit
from multirank import say, serve


def all_reduce(device, fail=False):
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    env = " ".join(f"{k}={os.environ[k]}" for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE"))
    say(f"{env}")
    x = torch.tensor([1.0, 2.0], device=device) * 10**rank
    dist.all_reduce(x)  # SUM by default
    say(f"all_reduce -> {x.tolist()}")
    if fail and rank == 1:  # rank 0 is in its next collective meanwhile: a barrier in rank 1's
        raise RuntimeError("rank 1 fails on purpose")  # teardown would be matched with it
    dist.all_reduce(x)  # the next collective of the work
    return 0


def plain():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    x = torch.tensor([1.0, 2.0]) * 10 ** dist.get_rank()
    dist.all_reduce(x)
    say(f"all_reduce -> {x.tolist()}")


if __name__ == "__main__":
    if sys.argv[1:] == ["plain"]:
        plain()
    else:
        serve({"all_reduce": all_reduce}, lambda p: p.add_argument("--fail", action="store_true"))

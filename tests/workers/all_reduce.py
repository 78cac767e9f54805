"""The harness's demo worker: rank r holds [1, 2] * 10**r; all_reduce sums them.

    torchrun --standalone --nproc-per-node=2 tests/workers/all_reduce.py all_reduce   # [11, 22]
    ... all_reduce --fail          # rank 1 raises while rank 0 enters its next collective
    ... plain                      # no teardown at all: the script just ends

`all_reduce` ends through the kit's teardown (lessons/multirank.py): a barrier only when the
part returned normally, then always destroy_process_group(), then os._exit. `plain` falls
off the end of the script instead. This docstring is the one home of the teardown's measured
history (lessons/AUTHORING.md and lesson 09 link here); `python -m scripts.soak` reproduces
each count (`--plain`, `--fail`, default), nothing retried.

What was measured:
- `plain`: a rank may die *after* its work with "terminate called without an active
  exception" (SIGABRT): 40 of 160 launches when first measured, 14 of 30 when measured again
  (`--plain`) with the 2 cores loaded by other jobs. Every variant that called
  destroy_process_group() passed: 0 aborts in 640 launches.
- `all_reduce --fail` (rank 1 raises while rank 0 waits in an all-reduce; no barrier on the
  failure path): 30 of 30 launches ended with exit code 1 and no abort, in 5.0 to 12.4 s
  against the group's 60 s timeout. With a barrier on that path every rank waited out the
  group's timeout (30 to 45 s when the lesson workers did it).
- os._exit is needed as soon as something else holds the group: after lesson 09's DTensor
  part one launch in 20 aborted at exit with destroy_process_group() alone (none in 20 with
  os._exit). Lesson 14's train.py (a DeviceMesh, FSDP2, DCP), which ended with a barrier and
  destroy_process_group() but no os._exit, aborted at exit in 3 of 47 attempts that ended
  normally (2026-12-02, 2 to 3 launches at once on 2 cores; one of them failed a CI run),
  each after all its work and output; with os._exit added after success, 0 of 100 (80
  short runs and 20 drills, the same load). Core dumps of two of the aborts: see below.
- The whole teardown, `make soak` (30 launches of `all_reduce`, the 2 cores loaded by other
  jobs, load average about 8): 0 aborts, launches of 4.6 to 13.6 s. Run it again after
  touching the teardown; never hide such failures with retries.

Why (from core dumps of the aborted ranks): a gloo worker thread frees the finished
all_reduce's work object *after* the main thread has seen the result and moved on. Freeing
it drops the last reference to the Python tensor, which needs the GIL; if the main thread is
already finalizing the interpreter, Python 3.11 ends the thread that asks for the GIL, the
unwind crosses a noexcept destructor and C++ calls std::terminate. A barrier alone does not
help (3 of 60 still aborted): it waits for the collective, not for its cleanup.
destroy_process_group() stops gloo's threads, so nothing touches Python during shutdown,
but only when it drops the last reference to the group. Seen in train.py's two cores: gloo's
runLoop threads still alive after destroy_process_group(), the main thread in
Py_FinalizeEx's garbage collection, and a runLoop thread destroying the final barrier's
AsyncBarrierWork (and the AsyncBroadcastWork it held) when it asked for the GIL. Inferred,
not traced: the DeviceMesh and the FSDP2 model (DTensors), in reference cycles that only the
final collection frees, were what still held the group. os._exit skips that finalization.
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

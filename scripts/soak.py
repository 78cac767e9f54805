"""Launch the 2-rank demo worker many times in a row; any abnormal end is a failure.

    python -m scripts.soak --runs 30 [--fail] [--plain] [--load]

Each run goes through the course's kit (lessons/multirank.py) and ends through its teardown:
a barrier only when the part returned normally, then destroy_process_group(), then
os._exit. A run passes only when no rank's stderr mentions an abort (``terminate called``)
and the launch ended as it should:

- default: torchrun exits 0 and both ranks print the all-reduced [11, 22];
- ``--fail``: rank 1 raises after the all-reduce while rank 0 waits in its next one (the
  failure path: no barrier); torchrun exits 1, rank 1 with 1, well before the group's
  timeout;
- ``--plain``: no teardown at all (the script just ends), to see the abort the teardown
  guards against; a run passes when it exits 0.

``--load`` keeps the other core busy with a spinning process, which made the teardown abort
more frequent when it was measured. Nothing is retried: the count of failures is the result.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

from scripts.manifest import ROOT
from scripts.multirank import GROUP_TIMEOUT_S, Run, launch

WORKER = ROOT / "tests" / "workers" / "all_reduce.py"


def failure(result: Run, mode: str) -> str | None:
    """Why a demo run is not clean, or None."""
    for rank, err in result.err.items():
        if "terminate called" in err:
            return f"rank {rank} aborted at exit (exit code {result.exit_codes.get(rank)}): {err.strip()[:120]}"
    if mode == "fail":
        if result.code != 1 or result.exit_codes.get(1) != 1:
            return f"expected a failed launch: torchrun exit {result.code}, ranks {result.exit_codes}"
        if result.seconds >= GROUP_TIMEOUT_S:
            return f"the failure took {result.seconds:.1f} s: a group timeout was waited out"
        return None
    if mode == "all_reduce":
        for rank, out in result.out.items():
            if f"rank {rank}: all_reduce -> [11.0, 22.0]" not in out.splitlines():
                return f"rank {rank} printed {out!r}"
    if not result.ok:
        return f"torchrun exit {result.code}, timed out {result.timed_out}"
    return None


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--load", action="store_true", help="keep one core busy meanwhile")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--fail", action="store_true", help="rank 1 raises: the failure path")
    kind.add_argument("--plain", action="store_true", help="no teardown at all")
    args = parser.parse_args(argv)
    mode = "fail" if args.fail else "plain" if args.plain else "all_reduce"
    worker_args = {"fail": ["all_reduce", "--fail"], "plain": ["plain"], "all_reduce": ["all_reduce"]}[mode]
    load = mp.Process(target=spin, args=(3600,), daemon=True) if args.load else None
    if load:
        load.start()
    failures, times = 0, []
    try:
        for i in range(1, args.runs + 1):
            result = launch(WORKER, worker_args, timeout=120)
            why = failure(result, mode)
            failures += why is not None
            times.append(result.seconds)
            print(f"run {i:3d}/{args.runs}: {'FAILED ' + why if why else 'ok'} ({result.seconds:.1f} s)", flush=True)
    finally:
        if load:
            load.terminate()
    setup = {"fail": ", failure path", "plain": ", no teardown", "all_reduce": ""}[mode]
    setup += ", other core loaded" if args.load else ""
    print(f"{args.runs} runs, {failures} failures{setup}; launch {min(times):.1f}-{max(times):.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

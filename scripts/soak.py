"""Launch the 2-rank demo worker many times in a row; any abnormal end is a failure.

    python -m scripts.soak --runs 30 [--load] [--no-teardown]

A run passes only when torchrun exits 0, both ranks print the all-reduced [11, 22], and no
rank's stderr mentions an abort (``terminate called``). ``--load`` keeps the other core busy
with a spinning process, which made the teardown abort more frequent when it was measured.
``--no-teardown`` runs the worker without its barrier + destroy_process_group() teardown,
to see the abort this guards against. Nothing is retried: the count of failures is the result.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

from scripts.manifest import ROOT
from scripts.multirank import Launch, launch

WORKER = ROOT / "tests" / "workers" / "all_reduce.py"


def failure(result: Launch) -> str | None:
    """Why a demo run is not clean, or None."""
    for r in result.ranks.values():
        if "terminate called" in r.stderr:
            return f"rank {r.rank} aborted at exit (exit code {r.exit_code}): {r.stderr.strip()[:120]}"
        if r.stdout != f"rank {r.rank}: all_reduce -> [11.0, 22.0]\n":
            return f"rank {r.rank} printed {r.stdout!r}"
    if not result.ok:
        return f"torchrun exit {result.returncode}, timed out {result.timed_out}"
    return None


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--load", action="store_true", help="keep one core busy meanwhile")
    parser.add_argument("--no-teardown", action="store_true", help="skip the worker's teardown")
    args = parser.parse_args(argv)
    load = mp.Process(target=spin, args=(3600,), daemon=True) if args.load else None
    if load:
        load.start()
    failures = 0
    try:
        for i in range(1, args.runs + 1):
            extra = ["--no-teardown"] if args.no_teardown else []
            result = launch(WORKER, nproc=2, timeout=60, args=extra)
            why = failure(result)
            failures += why is not None
            print(f"run {i:3d}/{args.runs}: {'FAILED ' + why if why else 'ok'} ({result.seconds:.1f} s)", flush=True)
    finally:
        if load:
            load.terminate()
    setup = ", other core loaded" if args.load else ""
    setup += ", no teardown" if args.no_teardown else ""
    print(f"{args.runs} runs, {failures} failures{setup}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Lesson 06a solution: one way to write the exercise in `exercises.py` (same contract)."""

from __future__ import annotations

import time
from collections.abc import Callable


def per_call_time(
    fn: Callable[[], object],
    sync: Callable[[], None],
    calls: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds per call of `calls` queued calls, synchronised only before and after them."""
    for _ in range(warmup):
        fn()
    sync()  # drain the warm-up's work so it does not land inside the clock
    t0 = clock()
    for _ in range(calls):
        fn()  # queued: no wait between calls
    sync()  # the work is done only now
    return (clock() - t0) / calls

"""Lesson 06a exercise: timing queued work.

Replace the `raise NotImplementedError` with your code, then run `make exercises N=06a`.
The tests run your function on a simulated GPU queue with a fake clock, so they are exact
and fast.
"""

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
    """Seconds per call when `calls` calls of `fn` are queued back to back.

    On a GPU `fn()` returns as soon as its work is queued and `sync()` waits until the queue
    is empty. Do: `warmup` untimed calls; then time `calls` calls of `fn` with no wait
    between them, so that the device can overlap them, such that the time contains all the
    work of those calls and none of the warm-up's. Read the time with `clock()` (seconds; in
    real use `time.perf_counter`, the default) and return the elapsed time divided by
    `calls`. Call `sync` as few times as that allows.
    """
    raise NotImplementedError("per_call_time")

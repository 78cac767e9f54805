"""Lesson 12 exercises: finding the checkpoint to resume from, the replay window, and a
safetensors header read by hand. Check your answers with `make exercises N=12`."""

import json  # noqa: F401  (you will need these)
import struct  # noqa: F401
from pathlib import Path  # noqa: F401


def latest_complete(root):
    """The step N of the newest complete checkpoint folder `root/step_N` (complete: it holds
    DCP's `.metadata` file), or None when there is none. Ignore anything else in root."""
    raise NotImplementedError


def replay_window(every, killed_after, saved_before_kill=True):
    """The list of steps a restarted job computes a second time.

    The job saves a checkpoint after every `every`-th step (every, 2 * every, ...), and died
    after step `killed_after`. If `saved_before_kill` is False, the kill came while the
    checkpoint of step `killed_after` itself was being written, so that one is incomplete.
    Steps are numbered from 1; with no complete checkpoint the job restarts from step 1."""
    raise NotImplementedError


def safetensors_header(path):
    """{name: (dtype, shape, (start, end))} for every tensor of a safetensors file, read by
    hand: 8 bytes of little-endian header length, then a JSON header. Skip the optional
    "__metadata__" entry; shape as a tuple of ints."""
    raise NotImplementedError

"""Lesson 12b exercises: finding the checkpoint to resume from, and the replay window.
Check your answers with `make exercises N=12b`."""

from pathlib import Path  # noqa: F401  (you will need it)


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

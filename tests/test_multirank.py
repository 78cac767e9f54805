"""The multi-rank harness, proven on 2 CPU ranks with gloo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts.multirank import launch, marked_processes, running, session_alive

WORKERS = Path(__file__).parent / "workers"
pytestmark = pytest.mark.multirank


def test_all_reduce_on_two_ranks():
    result = launch(WORKERS / "all_reduce.py", nproc=2, timeout=60)
    assert result.ok, result.describe()
    assert result.ranks[0].stdout == "rank 0: all_reduce -> [11.0, 22.0]\n"
    assert result.ranks[1].stdout == "rank 1: all_reduce -> [11.0, 22.0]\n"
    assert [r.exit_code for r in result.ranks.values()] == [0, 0]
    assert result.stragglers == 0, "a rank outlived a successful launch"


def test_a_hung_worker_is_stopped_and_leaves_nothing():
    worker = WORKERS / "hang.py"
    result = launch(worker, nproc=2, timeout=8)
    assert result.timed_out and result.returncode is None
    assert result.seconds < 8 + 5, result.describe()
    # both ranks were really running before the harness killed them
    assert all("initialised, now hanging" in r.stdout for r in result.ranks.values()), result.describe()
    assert not session_alive(result.pgid)
    assert marked_processes(result.mark) == []
    assert running(worker) == []  # checked independently of the mark, by command line


def test_a_failing_rank_is_reported_with_its_exit_code():
    result = launch(WORKERS / "exit_code.py", nproc=2, timeout=60, args=["3"])
    assert not result.ok and not result.timed_out
    assert result.ranks[1].exit_code == 3, result.describe()
    assert result.ranks[0].exit_code == -15, result.describe()  # stopped by torchrun's SIGTERM
    assert "rank 1: exiting with 3" in result.ranks[1].stdout
    assert result.seconds < 30, "torchrun stopped rank 0 instead of waiting for it"


def test_running_finds_a_process_by_its_command_line(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        found = running(script)
        assert len(found) == 1 and found[0].split()[0] == str(proc.pid), found
    finally:
        proc.kill()
        proc.wait()
    assert running(script) == []

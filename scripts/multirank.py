"""Launch a worker on N ranks with torchrun, never hang, never leave a process behind.

    result = launch(Path("worker.py"), nproc=2, timeout=60)
    result.ranks[0].stdout, result.ranks[1].exit_code, result.timed_out

- torchrun runs as ``python -m torch.distributed.run --standalone --nproc-per-node=N`` in a
  process session of its own. torchrun starts each rank in a session of *its own* too, so
  killing the agent's session is not enough (measured: both ranks of a hung worker survived
  it). Every process of a launch therefore carries a mark in its environment,
  ``COURSE_LAUNCH_ID``, and when the launch ends — on timeout (after SIGTERM to the agent
  and a short grace) or normally — every process still carrying the mark is killed.
- Each rank's stdout and stderr are collected separately (torchrun's ``--log-dir`` with
  ``--redirects 3``): ranks' prints never interleave.
- A rank's exit code comes from torchrun's failure summary; a rank that is not listed there
  exited 0 when the launch succeeded (otherwise it was stopped by the agent: ``None``).
- ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: without it a group restarted by
  ``--max-restarts`` reads stale addresses from the first attempt and fails or hangs
  (pytorch/pytorch#135712, measured on this machine).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from scripts.manifest import BUILD

MARK = "COURSE_LAUNCH_ID"
GRACE_S = 3.0  # after SIGTERM, how long torchrun gets to stop its ranks itself
FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", re.S)


@dataclass
class Rank:
    rank: int
    stdout: str
    stderr: str
    exit_code: int | None  # None: the launch failed and the agent stopped this rank


@dataclass
class Launch:
    returncode: int | None  # torchrun's exit status; None when it was killed on timeout
    timed_out: bool
    seconds: float
    output: str  # torchrun's own stdout and stderr
    pgid: int  # the agent's process session (see session_alive)
    mark: str  # the COURSE_LAUNCH_ID every process of this launch carried
    stragglers: int = 0  # processes still alive after a normal exit (killed; should be 0)
    ranks: dict[int, Rank] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        """Everything a failing test should show: the agent's output and each rank's."""
        parts = [f"returncode {self.returncode}, timed out {self.timed_out}, {self.seconds:.1f} s",
                 f"--- torchrun ---\n{self.output}"]
        for r in self.ranks.values():
            parts.append(f"--- rank {r.rank} (exit {r.exit_code}) ---\n{r.stdout}{r.stderr}")
        return "\n".join(parts)


def command(worker: Path, nproc: int, log_dir: Path, max_restarts: int, args: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
        "--log-dir", str(log_dir), "--redirects", "3", str(worker), *args,
    ]


def marked_processes(mark: str) -> list[int]:
    """Pids of the live processes whose environment carries this launch's mark (Linux /proc)."""
    needle = f"{MARK}={mark}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue  # gone meanwhile, or not ours
    return pids


def kill_all(pgid: int, mark: str) -> int:
    """SIGKILL the agent's session and every marked process; return how many were marked."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # nothing left in the session
    pids = marked_processes(mark)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def stop(proc: subprocess.Popen, mark: str) -> str:
    """On timeout: ask torchrun to stop its ranks (SIGTERM), then kill whatever is left."""
    proc.send_signal(signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        kill_all(proc.pid, mark)
        output, _ = proc.communicate()
    return output


def launch(
    worker: Path, nproc: int = 2, timeout: float = 60.0, args: list[str] | None = None,
    env: dict[str, str] | None = None, max_restarts: int = 0, keep_logs: bool = False,
) -> Launch:
    BUILD.mkdir(exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="multirank-", dir=BUILD))
    mark = uuid.uuid4().hex
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **(env or {}), MARK: mark}
    cmd = command(Path(worker), nproc, log_dir, max_restarts, list(args or []))
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=full_env, start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        output = stop(proc, mark)
    finally:
        stragglers = kill_all(proc.pid, mark)  # also when the caller is interrupted
    result = Launch(None if timed_out else proc.returncode, timed_out, time.monotonic() - start,
                    output, pgid=proc.pid, mark=mark, stragglers=0 if timed_out else stragglers)
    result.ranks = collect_ranks(log_dir, nproc, result)
    if not keep_logs:
        shutil.rmtree(log_dir, ignore_errors=True)
    return result


def collect_ranks(log_dir: Path, nproc: int, result: Launch) -> dict[int, Rank]:
    """Per-rank output of the last attempt, and exit codes from torchrun's failure summary."""
    failed = {int(r): int(code) for r, code in FAILURE.findall(result.output)}
    attempts = sorted(log_dir.glob("*/attempt_*"), key=lambda p: int(p.name.split("_")[1]))
    ranks = {}
    for rank in range(nproc):
        folder = attempts[-1] / str(rank) if attempts else log_dir / "missing"
        read = lambda name: (folder / name).read_text() if (folder / name).exists() else ""  # noqa: E731
        code = failed.get(rank, 0 if result.ok else None)
        ranks[rank] = Rank(rank, read("stdout.log"), read("stderr.log"), code)
    return ranks


def session_alive(pgid: int) -> bool:
    """True while any process of the agent's session still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def running(path: Path) -> list[str]:
    """`pid args` of every live process whose command line names `path` (e.g. a worker script).

    The lessons' own launchers do not mark their processes; after a lesson has run, its tests
    use this to prove that none of its ranks is left."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True, check=True)
    return [line.strip() for line in ps.stdout.splitlines() if str(path) in line and "ps -ww" not in line]

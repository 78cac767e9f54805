"""The multi-rank kit (lessons/multirank.py), proven on CPU ranks with gloo: results, several
torchrun agents on one rendezvous, the hard timeout, exit codes, the failure path's teardown,
no process left after an interrupted parent (SIGINT, SIGTERM, an alarm) or a SIGKILLed one,
and the parts of an elastic launch."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from scripts.manifest import LESSONS
from scripts.multirank import GRACE_S, GROUP_TIMEOUT_S, kill_when, launch, marked, running

import multirank

WORKERS = Path(__file__).parent / "workers"
pytestmark = pytest.mark.multirank


def test_all_reduce_on_two_ranks():
    result = launch(WORKERS / "all_reduce.py", ["all_reduce"])
    assert result.ok, result.describe()
    for rank in (0, 1):
        assert result.out[rank].splitlines()[-1] == f"rank {rank}: all_reduce -> [11.0, 22.0]"
    assert result.exit_codes == {0: 0, 1: 0}
    assert result.leftover == 0, "a rank outlived a successful launch"


def test_two_agents_join_one_rendezvous():
    """Lesson 13b's launch: 2 torchrun agents ('nodes'), 2 ranks each, one c10d rendezvous."""
    result = launch(WORKERS / "all_reduce.py", ["all_reduce"], nproc=2, nnodes=2)
    assert result.ok, result.describe()
    assert sorted(result.out) == [0, 1, 2, 3]
    for rank, text in result.out.items():  # each log is filed under the rank that wrote it
        assert text.splitlines() == [
            f"rank {rank}: RANK={rank} LOCAL_RANK={rank % 2} GROUP_RANK={rank // 2} WORLD_SIZE=4",
            f"rank {rank}: all_reduce -> [1111.0, 2222.0]",
        ], result.describe()
    assert result.leftover == 0 and marked(result.mark) == []


def test_a_hung_worker_is_stopped_and_leaves_nothing():
    worker = WORKERS / "hang.py"
    result = launch(worker, nproc=2, timeout=8)
    assert result.timed_out and result.code is None
    # stopped at the timeout: SIGTERM, GRACE_S for torchrun, then SIGKILL (generous under load)
    assert 8 <= result.seconds < 8 + GRACE_S + 20, result.describe()
    assert sorted(result.out) == [0, 1], result.describe()  # both ranks were running
    assert all(f"rank {r}: started" in text for r, text in result.out.items()), result.describe()
    assert marked(result.mark) == []
    assert running(worker) == []  # checked independently of the mark, by command line


def test_a_failing_rank_is_reported_with_its_exit_code():
    result = launch(WORKERS / "exit_code.py", ["3"])
    assert not result.ok and not result.timed_out
    assert result.exit_codes[1] == 3, result.describe()
    assert result.exit_codes[0] == -15, result.describe()  # stopped by torchrun's SIGTERM
    assert "rank 1: exiting with 3" in result.out[1]
    assert result.seconds < 30, "torchrun stopped rank 0 instead of waiting for it"


def test_the_failure_path_skips_the_barrier():
    """Rank 1 raises while rank 0 waits in its next all_reduce. Rank 1's teardown skips the
    barrier (it would be matched with that all_reduce, and both would wait out the group's
    timeout) and destroys its group: rank 0's all_reduce fails at once."""
    result = launch(WORKERS / "all_reduce.py", ["all_reduce", "--fail"])
    assert result.code == 1 and not result.timed_out, result.describe()
    assert "rank 1 fails on purpose" in result.err[1]
    assert "terminate called" not in result.err[0] + result.err[1], result.describe()
    assert result.exit_codes[0] in (1, -15), result.describe()  # its collective raised, or torchrun stopped it
    # with a barrier in rank 1's teardown both ranks would wait the group's full timeout
    assert result.seconds < GROUP_TIMEOUT_S, result.describe()
    assert result.leftover == 0


PARENT = """
import signal, sys
sys.path.insert(0, {lessons!r})
import multirank

def alarm(signum, frame):  # what pytest-timeout's signal method does: raise in the main thread
    raise RuntimeError("Timeout")

signal.signal(signal.SIGALRM, alarm)
multirank.launch({worker!r}, nproc=2, nnodes={nnodes}, timeout=120)
"""


def wait_for(predicate, seconds):
    end = time.monotonic() + seconds
    while not (found := predicate()) and time.monotonic() < end:
        time.sleep(0.2)
    return found


@pytest.mark.parametrize("signum, nnodes", [(signal.SIGINT, 1), (signal.SIGTERM, 2), (signal.SIGALRM, 1)],
                         ids=["SIGINT", "SIGTERM-2-agents", "SIGALRM"])
def test_an_interrupted_parent_leaves_no_process(tmp_path, signum, nnodes):
    """Ctrl-C (a notebook's Interrupt), SIGTERM (CI, a killed kernel) or pytest-timeout's alarm
    reaches the parent while ranks hang: every agent and rank of the launch goes with it."""
    worker = tmp_path / "hang.py"  # a path of its own: no other test's processes match it
    worker.write_text((WORKERS / "hang.py").read_text())
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT.format(lessons=str(LESSONS), worker=str(worker), nnodes=nnodes))
    proc = subprocess.Popen([sys.executable, str(parent)], stderr=subprocess.PIPE, text=True)
    try:
        expected = nnodes * 3  # each agent and its 2 ranks name the worker on their command line
        assert wait_for(lambda: len(running(worker)) >= expected, 60), running(worker)
        time.sleep(1.0)  # the ranks are importing torch or already hanging: either way, in flight
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        assert wait_for(lambda: running(worker) == [], 5), running(worker)
        if signum == signal.SIGTERM:
            assert proc.returncode == -signal.SIGTERM  # the handler killed the launch, then died by it
        else:
            assert proc.returncode != 0 and ("KeyboardInterrupt" in err or "Timeout" in err), err
    finally:
        proc.kill()
        for line in running(worker):  # never leave anything behind, even when failing
            subprocess.run(["kill", "-9", line.split()[0]], check=False)


SLEEPER = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {lessons!r})
from multirank import MARK, serve

def sleep(device):
    import torch.distributed as dist
    Path({flags!r}, f"up.rank{{dist.get_rank()}}").write_text(os.environ[MARK])
    time.sleep(600)

serve({{"sleep": sleep}})
"""

KILLED = """
import sys
sys.path.insert(0, {lessons!r})
import multirank
if not {pdeathsig}:  # the ranks' watchdog alone, as on macOS
    multirank._die_with_launcher = lambda: None
multirank.launch({worker!r}, ["sleep"], nproc=2, nnodes={nnodes}, restarts=1, timeout=300)
"""


@pytest.mark.parametrize("pdeathsig, nnodes", [(True, 1), (False, 2)], ids=["linux", "watchdog-only-2-agents"])
def test_a_sigkilled_parent_leaves_no_process(tmp_path, pdeathsig, nnodes):
    """SIGKILL (Jupyter restarting a busy kernel) runs no code in the parent: the ranks see it
    gone, SIGKILL their agent before it can restart them (restarts=1), then end. The parent
    is left a zombie, never reaped, while we look (as a kernel may be)."""
    worker, flags, parent = tmp_path / "sleeper.py", tmp_path / "flags", tmp_path / "parent.py"
    flags.mkdir()
    worker.write_text(SLEEPER.format(lessons=str(LESSONS), flags=str(flags)))
    parent.write_text(KILLED.format(lessons=str(LESSONS), worker=str(worker), nnodes=nnodes, pdeathsig=pdeathsig))
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the launch's logs, left behind by SIGKILL
    proc = subprocess.Popen([sys.executable, str(parent)], env=env)
    marks = []
    try:
        assert wait_for(lambda: len(list(flags.glob("up.rank*"))) == 2 * nnodes, 90), running(worker)
        marks = {f.read_text() for f in flags.glob("up.rank*")}
        assert len(marks) == 1 and len(running(worker)) == 3 * nnodes, running(worker)  # agents + ranks
        proc.kill()
        assert wait_for(lambda: running(worker) == [], 15), running(worker)
        assert proc.poll() == -signal.SIGKILL  # reaped only now
        assert all(marked(mark) == [] for mark in marks)
        assert list(tmp_path.glob("multirank-*/agent*/*/attempt_0")), "no log of the first attempt"
        assert not list(tmp_path.glob("multirank-*/agent*/*/attempt_1")), "an agent restarted its ranks"
    finally:
        proc.kill()
        proc.wait()
        for pid in {int(line.split()[0]) for line in running(worker)} | {p for m in marks for p in marked(m)}:
            subprocess.run(["kill", "-9", str(pid)], check=False)  # never leave anything behind


def test_kill_when_kills_the_pid_a_process_wrote(tmp_path):
    """Lessons 12b and 14's drills: a thread SIGKILLs a process once it wrote its pid."""
    flag = tmp_path / "paused"
    script = f"import os, pathlib, time\npathlib.Path({str(flag)!r}).write_text(str(os.getpid()))\ntime.sleep(60)\n"
    with kill_when(flag) as killed:
        proc = subprocess.Popen([sys.executable, "-c", script])
        code = proc.wait(30)
    assert code == -signal.SIGKILL and killed == [proc.pid]
    with kill_when(lambda: None) as nobody:  # nothing found before the block ends: no kill
        time.sleep(0.2)
    assert nobody == []


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


# ---------------------------------------------------------------- elastic launches (lesson 12b)
# The whole elastic run (a node killed, the survivor renumbered) is lesson 12b's section 3,
# checked by its tests; these check the kit's parts of it, in well under a second each.


def test_commands_of_an_elastic_launch(tmp_path):
    fixed = multirank.commands("w.py", ["part"], 1, 2, 1, tmp_path, "m" * 32)
    elastic = multirank.commands("w.py", ["part"], 1, 2, 1, tmp_path, "m" * 32, min_nodes=1)
    assert [c.count("--nnodes=2") for c in fixed] == [1, 1]
    assert [c.count("--nnodes=1:2") for c in elastic] == [1, 1]
    conf = [next(a for a in c if a.startswith("--rdzv-conf=")) for c in fixed + elastic]
    # fixed: the first agent hosts the store; elastic: the last, so that node 0 may die
    assert conf == ["--rdzv-conf=is_host=1", "--rdzv-conf=is_host=0",
                    f"--rdzv-conf=is_host=0,{multirank.ELASTIC_RDZV}",
                    f"--rdzv-conf=is_host=1,{multirank.ELASTIC_RDZV}"]
    assert multirank.commands("w.py", [], 2, 2, 0, tmp_path, "m" * 32, min_nodes=2) != elastic
    for wrong in (0, 3):  # refused before anything starts
        with pytest.raises(ValueError, match="min_nodes"):
            launch("w.py", nnodes=2, min_nodes=wrong)


@pytest.mark.parametrize("elastic", [False, True])
def test_wait_stops_the_other_nodes_unless_elastic(elastic, monkeypatch):
    """One 'agent' fails at once, the other would run GRACE_S + 1 s: a fixed job stops it
    (SIGTERM, -15) after GRACE_S, an elastic one lets it end by itself (0)."""
    monkeypatch.setattr(multirank, "GRACE_S", 0.5)  # the real 3 s would only make it slower
    failing = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    try:
        assert multirank._wait([failing, other], time.monotonic() + 30, stop_others=not elastic)
        assert (failing.returncode, other.returncode) == (1, 0 if elastic else -signal.SIGTERM)
    finally:
        for p in (failing, other):
            p.kill()
            p.wait()


def test_node_of_is_the_agent_then_its_ranks():
    script = ("import subprocess, sys, time\n"
              "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])"
              " for _ in range(2)]\n"
              "print(*[k.pid for k in kids], flush=True)\ntime.sleep(30)\n")
    agent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    ranks = sorted(map(int, agent.stdout.readline().split()))
    try:
        assert multirank.node_of(ranks[1]) == [agent.pid, *ranks]
        assert multirank.node_of(None) is None
        with kill_when(lambda: multirank.node_of(ranks[0])) as killed:
            assert agent.wait(30) == -signal.SIGKILL
        assert killed == [agent.pid, *ranks]
        assert wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in ranks), 5) \
            or not Path("/proc").is_dir()
    finally:
        for pid in [agent.pid, *ranks]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        agent.wait()


class _Agent:  # what _collect reads of a finished Popen
    def __init__(self, pid, returncode):
        self.pid, self.returncode = pid, returncode


def test_logs_are_numbered_by_the_nodes_of_each_attempt(tmp_path):
    """Attempt 0 had both agents (node 0: the lower pid), attempt 1 only the survivor, which
    the rendezvous made node 0: its log is rank 0's."""
    for agent, attempt, text in [(0, 0, "a0"), (1, 0, "b0"), (1, 1, "b1")]:
        folder = tmp_path / f"agent{agent}" / f"run_{agent}" / f"attempt_{attempt}" / "0"
        folder.mkdir(parents=True)
        (folder / "stdout.log").write_text(text)
        (tmp_path / f"agent{agent}.log").write_text("")
    run = multirank._collect(tmp_path, [_Agent(100, -9), _Agent(200, 0)], 1, 1.0, False, 0)
    assert {k: out for k, (out, _) in run.logs.items()} == {(0, 0): "a0", (0, 1): "b0", (1, 0): "b1"}
    assert run.agent_codes == (-9, 0) and run.code == -9 and run.attempts == [0, 1]


def test_a_launch_removes_the_logs_of_launchers_that_are_gone():
    """A SIGKILLed parent cannot remove its launch's log folder; the next launch does."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    tmp = Path(tempfile.gettempdir())
    stale, mine = tmp / f"multirank-{gone.pid}-test", tmp / f"multirank-{os.getpid()}-test"
    for folder in (stale, mine):
        (folder / "agent0").mkdir(parents=True, exist_ok=True)
    try:
        new = multirank._log_dir()
        assert not stale.exists() and mine.exists() and new.name.startswith(f"multirank-{os.getpid()}-")
        new.rmdir()
    finally:
        for folder in (stale, mine):
            shutil.rmtree(folder, ignore_errors=True)


def _can_rename_host() -> bool:
    try:
        probe = subprocess.run(["unshare", "--uts", "hostname", "course-probe"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _can_rename_host(),
                    reason="needs Linux and `unshare --uts` (root, or user namespaces) to give this "
                           "process a host name that does not resolve")
def test_a_host_name_that_does_not_resolve_changes_nothing():
    """torchrun gives the ranks the host's fully qualified name as MASTER_ADDR unless told
    --local-addr: with a name that does not resolve, the ranks retried it until the launch's
    timeout (60, 90 and 120 s launches all failed). In a UTS namespace of its own a child
    renames its host and launches."""
    child = (f"import socket, sys; sys.path.insert(0, {str(LESSONS)!r}); from multirank import launch\n"
             "try:\n    socket.gethostbyname(socket.getfqdn()); print('resolves')\n"
             "except OSError:\n    print('does not resolve')\n"
             "for n in (1, 2):\n"
             f"    run = launch({str(WORKERS / 'all_reduce.py')!r}, ['all_reduce'], nnodes=n, timeout=40)\n"
             "    print(n, run.ok, run.out[0].splitlines()[-1] if run.out else run.describe())\n")
    script = f"hostname course-no-such-host-{os.getpid()} && exec {sys.executable} -c \"$0\""
    done = subprocess.run(["unshare", "--uts", "sh", "-c", script, child], capture_output=True, text=True,
                          timeout=150)
    assert done.stdout.splitlines() == ["does not resolve", "1 True rank 0: all_reduce -> [11.0, 22.0]",
                                        "2 True rank 0: all_reduce -> [1111.0, 2222.0]"], done.stdout + done.stderr

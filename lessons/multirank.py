"""The course's multi-rank kit: start ranks with torchrun, never hang, never leave a process.

Lesson 09 introduces it (why a launch never hangs or leaks, in one paragraph; every
precaution, why it is here and what proves it, below); lessons 10 and later import it, and
so do the tests (`scripts/multirank.py`). A lesson script or notebook is the *parent*;
`torchrun` starts the *ranks*, each running the lesson's `worker.py` (generated from the
lesson's `#@worker` cells, scripts/workers.py).

In the parent (a lesson, a test):

    run = launch(WORKER, ["part"])               # 1 torchrun agent, 2 ranks
    run = launch(WORKER, ["part"], nnodes=2)     # 2 agents joining one rendezvous: 4 ranks
    run = launch(WORKER, ["part"], nnodes=2, min_nodes=1, restarts=1)  # elastic: 1 node may go
    run.code, run.seconds, run.out[rank], run.err[rank]
    show(run, "name")                            # print one `== name ==` section of each rank
    with kill_when(pid_file) as killed:          # SIGKILL a rank from outside once it wrote
        run = launch(WORKER, ["drill"], restarts=1)  # its pid there (a failing machine)
    with kill_when(lambda: node_of(pid)) ...     # SIGKILL a rank's agent and its ranks (a node)

In a worker (one rank):

    from multirank import heading, say, serve, shared
    serve({"part": part})   # argv, process group, part(device), teardown, exit code

The precautions, each measured on the course's machine (lesson 09 says in one paragraph
why a launch never hangs or leaks; this is the whole story, with where each is proved):
- A hard timeout bounds every launch from outside (`timeout=`, 120 s unless said
  otherwise): a rank stuck in a collective waits as long as its group's timeout (gloo's
  default is 30 minutes; `setup` gives the default group GROUP_TIMEOUT_S, 60 s), and a rank
  stuck before that applies (at start-up, in a rendezvous that never completes) can wait
  forever. At the deadline `_stop` sends torchrun SIGTERM, which torchrun forwards to its
  ranks, waits GRACE_S (3 s), then SIGKILLs what is left. A hung re-initialisation once
  ignored a 30 s group timeout, which is why the bound is outside the ranks.
  (tests/test_multirank.py::test_a_hung_worker_is_stopped_and_leaves_nothing; lesson 09's
  `hang` part and test_the_hard_timeout_stops_a_hung_launch.)
- Killing a launch kills all of it. Each agent (torchrun) runs in a process session of its
  own (`start_new_session=True`), so that one `killpg` reaches it. But torchrun starts each
  rank in a session of its own as well (lesson 09's ranks print it), so killing torchrun's
  session leaves the ranks running (measured: both ranks of a hung worker survived it).
  Every process of a launch carries a mark in its environment (`COURSE_LAUNCH_ID`, which
  torchrun and the ranks inherit); `kill_launch` SIGKILLs the agents' sessions, every
  descendant of an agent (from `ps`) and, on Linux, every process whose /proc/<pid>/environ
  holds the mark. It runs on any exit of the parent: a normal end, the timeout, an
  exception, Ctrl-C or a notebook's Interrupt (KeyboardInterrupt), pytest-timeout (an
  exception raised from SIGALRM) and SIGTERM: without a handler Python dies on SIGTERM
  without running any `finally`, so while ranks run `launch` installs one that kills the
  launch, then lets the signal do what it would have done. Before the kit, a parent that
  caught only `TimeoutExpired` left torchrun and both ranks running (reparented to init)
  when it got SIGINT, twice in a row; SIGTERM to pytest left an in-flight launch running
  until it ended by itself. (tests/test_multirank.py::test_an_interrupted_parent_leaves_no_process,
  SIGINT and SIGTERM, 1 and 2 agents.)
- Even SIGKILL of the parent (Jupyter restarting a busy kernel) runs no code in it, so the
  ranks watch it: `launch` tells them its pid (`COURSE_LAUNCHER_PID`), and `setup` starts a
  thread in each rank that checks twice a second (WATCH_S) that its torchrun agent is still
  that process's child; once it is not, the thread SIGKILLs the agent and then the rank
  itself. On Linux the agents also get SIGKILL from the kernel when the parent dies
  (PR_SET_PDEATHSIG), a second line for an agent that has no ranks yet. Its logs' folder
  (named after its pid) is removed by the next launch.
  (tests/test_multirank.py::test_a_sigkilled_parent_leaves_no_process, with and without
  PR_SET_PDEATHSIG; test_a_launch_removes_the_logs_of_launchers_that_are_gone.)
- One log file per rank (`--log-dir` with `--redirects 3`): each rank's stdout and stderr
  go to `<log dir>/<run id>/attempt_<n>/<rank>/stdout.log` and `stderr.log`, which `launch`
  reads into `run.out[rank]` and `run.err[rank]` (every attempt in `run.logs`) and deletes:
  two ranks printing to one terminal can interleave inside a line. A worker still prints
  each line with one `print` call, prefixed `rank N:` (`say`), for when it is run by hand.
- `OMP_NUM_THREADS=1`: one thread per rank on a small CPU (two ranks on two cores: more
  threads per rank only fight).
- `--local-addr=127.0.0.1`: otherwise torchrun gives the ranks the machine's fully
  qualified host name (`socket.getfqdn()`) as MASTER_ADDR (and the rendezvous as the
  node's address); where that name does not resolve (reported on macOS:
  pytorch/pytorch#26049), the ranks retry it until a timeout ends the launch. Measured on
  Linux with a host name that does not resolve: without the flag the same launch ran for
  over a minute and failed (60, 90 and 120 s launches), with it it succeeded in 2.7 s. Every
  agent of a launch runs on this machine, so the loopback address always works.
  (tests/test_multirank.py::test_a_host_name_that_does_not_resolve_changes_nothing, where
  the system lets a process rename its host.)
- `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`: without it a group restarted by `--max-restarts`
  reads the first attempt's stale addresses and fails or hangs (pytorch/pytorch#135712).
- In a rank, `serve` tears down with a barrier only when the part ended normally, then
  always `destroy_process_group()`, then `os._exit` (AUTHORING.md says why; the measured
  counts live in the docstring of tests/workers/all_reduce.py, which `python -m
  scripts.soak` reproduces; tests/test_multirank.py::test_the_failure_path_skips_the_barrier).

Standard library only (torch is imported inside the rank's functions), so that a test can
use the launcher without importing torch.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ELASTIC_RDZV", "GRACE_S", "GROUP_TIMEOUT_S", "LAUNCHER", "MARK", "Run", "heading", "kill_launch",
           "kill_when", "launch", "marked", "node_of", "parent_of", "running", "say", "section", "serve", "setup",
           "shared", "show", "still_running", "teardown"]

MARK = "COURSE_LAUNCH_ID"  # the environment variable every process of a launch carries
LAUNCHER = "COURSE_LAUNCHER_PID"  # the pid of the process that called launch(), for the ranks
WATCH_S = 0.5  # how often a rank checks that the process that called launch() is alive
GRACE_S = 3.0  # after SIGTERM, how long torchrun gets to stop its ranks itself
GROUP_TIMEOUT_S = 60  # a rank's default process group: an error after this, never gloo's 30 min
# An elastic launch's rendezvous: a node that misses 2 heartbeats 1 s apart is dropped, and a
# round closes 2 s after it has min_nodes (torchrun's defaults: 5 s x 3 and 30 s). The 2 s is
# also how late the second agent of a launch may join the first round without it closing.
ELASTIC_RDZV = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=2"
HEADER = re.compile(r"rank (\d+): == (.*) ==")  # a worker's section heading
FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", re.S)
_ACTIVE: dict[str, list[subprocess.Popen]] = {}  # mark -> agents of the launches in flight


# ---------------------------------------------------------------------------- the parent


@dataclass
class Run:
    """What a launch left: exit status, time, and every rank's output of every attempt."""

    code: int | None  # torchrun's exit status (the first failing agent's); None: timed out
    seconds: float  # wall time of the whole launch
    timed_out: bool
    agent: str  # what torchrun itself printed (every agent's, one after the other)
    logs: dict  # {(attempt, rank): (stdout, stderr)}; attempts count restarts from 0
    exit_codes: dict  # {rank: exit code}; None: the launch failed and torchrun stopped it
    leftover: int = 0  # processes of the launch alive after torchrun exited (killed): 0
    mark: str = ""  # the COURSE_LAUNCH_ID its processes carried (see marked)
    agent_codes: tuple = ()  # each agent's exit status, in the order they were started

    @property
    def attempts(self) -> list[int]:
        return sorted({a for a, _ in self.logs})

    def out_of(self, attempt: int = -1) -> dict[int, str]:
        """{rank: stdout} of one attempt (-1: the last)."""
        a = self.attempts[attempt] if self.attempts else 0
        return {r: text for (b, r), (text, _) in sorted(self.logs.items()) if b == a}

    @property
    def out(self) -> dict[int, str]:  # {rank: stdout} of the last attempt
        return self.out_of()

    @property
    def err(self) -> dict[int, str]:  # {rank: stderr} of the last attempt
        last = self.attempts[-1] if self.attempts else 0
        return {r: text for (a, r), (_, text) in sorted(self.logs.items()) if a == last}

    @property
    def ok(self) -> bool:
        return self.code == 0 and not self.timed_out

    def describe(self) -> str:
        """Everything a failing test should show: torchrun's output and each rank's."""
        parts = [f"exit code {self.code}, timed out {self.timed_out}, {self.seconds:.1f} s, "
                 f"leftover {self.leftover}", f"--- torchrun ---\n{self.agent}"]
        for (a, r), (out, err) in sorted(self.logs.items()):
            parts.append(f"--- attempt {a} rank {r} (exit {self.exit_codes.get(r)}) ---\n{out}{err}")
        return "\n".join(parts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def commands(worker, args, nproc, nnodes, restarts, logs: Path, mark: str,
             min_nodes: int | None = None) -> list[list[str]]:
    """One torchrun command per agent. nnodes > 1: agents on this machine that join one c10d
    rendezvous, exactly as the nodes of a multi-node job do (the first one hosts its store).
    min_nodes < nnodes: an elastic job (`--nnodes=min:max`) that goes on while min_nodes
    remain; the *last* agent hosts the store, so that the first one (node 0: c10d numbers
    nodes by pid) can die without taking the rendezvous with it. Two assumptions, never
    seen to fail here (a loaded 2-core machine included): pids grow from one agent's start
    to the next (no wrap-around), and every agent joins the first round within
    ELASTIC_RDZV's 2 s last call (a later one makes a second round: other ranks)."""
    run = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           f"--max-restarts={restarts}", "--redirects", "3", "--local-addr=127.0.0.1"]
    tail = [str(worker), *map(str, args)]
    if nnodes == 1:
        return [[*run, "--standalone", "--log-dir", str(logs / "agent0"), *tail]]
    port, elastic = free_port(), min_nodes is not None and min_nodes < nnodes
    size, host = (f"{min_nodes}:{nnodes}", nnodes - 1) if elastic else (str(nnodes), 0)
    conf = f",{ELASTIC_RDZV}" if elastic else ""
    return [[*run, f"--nnodes={size}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
             f"--rdzv-id={mark[:12]}", f"--rdzv-conf=is_host={int(i == host)}{conf}",
             "--log-dir", str(logs / f"agent{i}"), *tail] for i in range(nnodes)]


def launch(worker, args=(), *, nproc: int = 2, nnodes: int = 1, min_nodes: int | None = None,
           timeout: float = 120.0, restarts: int = 0, env: dict | None = None) -> Run:
    """Run `worker args` on nnodes x nproc ranks under a hard timeout; leave no process.
    min_nodes < nnodes makes the job elastic: when an agent dies, the others go on (each may
    restart its ranks, `restarts` times) and the launch waits for all of them."""
    if min_nodes is not None and not 1 <= min_nodes <= nnodes:
        raise ValueError(f"min_nodes must be between 1 and nnodes={nnodes}, not {min_nodes}")
    logs = _log_dir()
    mark = uuid.uuid4().hex
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **(env or {}), MARK: mark,
                LAUNCHER: str(os.getpid())}
    agents: list[subprocess.Popen] = []
    _ACTIVE[mark] = agents
    start, timed_out, leftover = time.monotonic(), False, None
    try:
        with _sigterm_kills_launches():
            for i, cmd in enumerate(commands(worker, args, nproc, nnodes, restarts, logs, mark, min_nodes)):
                with open(logs / f"agent{i}.log", "w") as out:
                    agents.append(subprocess.Popen(cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                                   start_new_session=True, preexec_fn=_die_with_launcher()))
            timed_out = not _wait(agents, start + timeout, stop_others=min_nodes in (None, nnodes))
            if timed_out:
                _stop(agents, mark)
        leftover = kill_launch(agents, mark)
        run = _collect(logs, agents, nproc, time.monotonic() - start, timed_out, leftover)
        run.mark = mark
        return run
    finally:
        if leftover is None:  # any other exit: an exception, Ctrl-C, pytest-timeout's alarm
            kill_launch(agents, mark)
        _ACTIVE.pop(mark, None)
        shutil.rmtree(logs, ignore_errors=True)


def _log_dir() -> Path:
    """A new folder for a launch's logs, named after this process. A launch removes its own
    at the end, but a SIGKILLed parent runs no code: first remove the folders of launchers
    that are gone."""
    for old in Path(tempfile.gettempdir()).glob("multirank-*-*"):
        pid = old.name.split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"multirank-{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _die_with_launcher():
    """Linux: a function for Popen's preexec_fn that asks the kernel to SIGKILL the agent
    when this thread (the one blocked in launch) ends, SIGKILL included. Elsewhere None.
    prctl is looked up here, before the fork: the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl, launcher = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()

    def preexec():
        prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
        if os.getppid() != launcher:  # the launcher died before the call: no signal will come
            os._exit(1)

    return preexec


def _wait(agents, deadline: float, stop_others: bool = True) -> bool:
    """Wait for every agent; False at the deadline. Once one agent fails, the others (other
    'nodes') get GRACE_S to notice before they are stopped (stop_others; not in an elastic
    job, whose survivors carry on)."""
    if len(agents) == 1:
        try:
            agents[0].wait(max(deadline - time.monotonic(), 0))
            return True
        except subprocess.TimeoutExpired:
            return False
    failed_at, stopped = None, False
    while any(a.poll() is None for a in agents):
        now = time.monotonic()
        if now >= deadline:
            return False
        if failed_at is None and any(a.poll() not in (None, 0) for a in agents):
            failed_at = now
        if stop_others and failed_at is not None and now - failed_at > GRACE_S and not stopped:
            for a in agents:
                if a.poll() is None:
                    a.send_signal(signal.SIGTERM)
            stopped = True
        time.sleep(0.05)
    return True


def _stop(agents, mark: str) -> None:
    """At the timeout: SIGTERM the agents (torchrun forwards it to its ranks), GRACE_S, kill."""
    known = _descendants([a.pid for a in agents])  # before they can be orphaned
    for a in agents:
        if a.poll() is None:
            a.send_signal(signal.SIGTERM)
    end = time.monotonic() + GRACE_S
    while any(a.poll() is None for a in agents) and time.monotonic() < end:
        time.sleep(0.05)
    _kill(agents, known | set(marked(mark)))


def kill_launch(agents, mark: str, reap: bool = True) -> int:
    """SIGKILL every process of a launch still alive: the agents' sessions, their descendants
    and every process carrying the mark. Returns how many there were besides the agents.
    reap=False (in a signal handler): do not wait for the agents, Popen.wait's lock may be held."""
    found: set[int] = set()
    blocked = _block_interrupts()  # a second Ctrl-C must not stop the kill half-way
    try:
        for _ in range(3):  # again: a restarting agent may have started ranks meanwhile
            pids = _descendants([a.pid for a in agents]) | set(marked(mark))
            if not pids and all(a.poll() is not None for a in agents):
                break
            found |= pids
            _kill(agents, pids)
        for a in agents if reap else ():
            a.wait()
    finally:
        _unblock(blocked)
    return len(found)


def _kill(agents, pids) -> None:
    for a in agents:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(a.pid, signal.SIGKILL)  # the agent's session (start_new_session=True)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def marked(mark: str, var: str = MARK) -> list[int]:
    """Pids of live processes whose environment has var=mark (Linux: /proc; elsewhere none)."""
    needle, pids = f"{var}={mark}".encode(), []
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else ():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
    return [p for p in pids if p != os.getpid()]


def _descendants(roots: list[int]) -> set[int]:
    """Every live process below these pids (ps: Linux and macOS)."""
    ps = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True)
    children: dict[int, list[int]] = {}
    for line in ps.stdout.splitlines():
        pid, ppid = map(int, line.split())
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found - {os.getpid()}


def _block_interrupts():
    """Hold SIGINT and SIGTERM back (main thread only); they arrive once the kill is done."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def _unblock(previous) -> None:
    if previous is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def _sigterm_kills_launches():
    """SIGTERM (CI stopping a job, a kernel being shut down) ends Python without running any
    `finally`: while a launch is in flight, a handler kills it first, then the signal does
    what it would have done (the previous handler runs, or the process dies by SIGTERM)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; the finally still covers exceptions
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        for mark, agents in list(_ACTIVE.items()):
            kill_launch(agents, mark, reap=False)
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        else:
            os.kill(os.getpid(), signum)  # SIG_DFL: die by SIGTERM, as without the handler

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _collect(logs: Path, agents, nproc: int, seconds: float, timed_out: bool, leftover: int) -> Run:
    """Each rank's stdout and stderr of every attempt; exit codes from torchrun's summary."""
    agent = "".join((logs / f"agent{i}.log").read_text() for i in range(len(agents)))
    folders = [(int(f.parent.name.split("_")[1]), a.pid, int(f.name), f)
               for i, a in enumerate(agents) for f in (logs / f"agent{i}").glob("*/attempt_*/*")]
    found = {}
    for attempt, pid, local, folder in folders:
        # c10d numbers the agents ('nodes') of a round in the order of their pids: the
        # rendezvous sorts its participants by (host, pid), and every agent here has the same
        # host. A round's nodes are the agents that started that attempt (in an elastic job,
        # the survivors)
        nodes = sorted({p for a, p, _, _ in folders if a == attempt})
        read = lambda name: (folder / name).read_text() if (folder / name).exists() else ""  # noqa: E731
        found[attempt, nodes.index(pid) * nproc + local] = (read("stdout.log"), read("stderr.log"))
    codes = [a.returncode for a in agents]
    code = None if timed_out else next((c for c in codes if c != 0), 0)
    failed = {int(r): int(c) for r, c in FAILURE.findall(agent)}
    ranks = {r for _, r in found} | set(range(nproc * len(agents)))
    exits = {r: failed.get(r, 0 if code == 0 else None) for r in sorted(ranks)}
    return Run(code, seconds, timed_out, agent, found, exits, 0 if timed_out else leftover,
               agent_codes=tuple(codes))


def section(run: Run, name: str, attempt: int = -1) -> dict[int, list[str]]:
    """{rank: [lines]} of one `== name ==` section of each rank's output (ranks without it
    are left out); `attempt` picks a restart (-1: the last)."""
    found = {}
    for rank, text in run.out_of(attempt).items():
        lines = text.splitlines()
        head = f"rank {rank}: == {name} =="
        if head in lines:
            start = lines.index(head) + 1
            end = next((i for i in range(start, len(lines)) if HEADER.fullmatch(lines[i])), len(lines))
            found[rank] = lines[start:end]
    return found


def show(run: Run, name: str, attempt: int = -1) -> None:
    """Print one section, rank after rank."""
    for lines in section(run, name, attempt).values():
        for line in lines:
            print(line)


@contextlib.contextmanager
def kill_when(found, every: float = 0.05):
    """`with kill_when(path) as killed: run = launch(...)`. While the block runs, a thread
    waits for a rank's pid, then SIGKILLs that process from outside, as a failing machine
    would. `found` is the file the rank writes its pid into (renamed into place, so that it
    is never read half-written), or a function that returns the pid or None. `killed`
    holds the pid once it is sent (empty: none came before the block ended). The function
    may return a list of pids instead (`node_of`: a machine dies with all its processes):
    they are killed in that order and all land in `killed`."""
    find = found if callable(found) else lambda: _pid_in(Path(found))
    done, killed = threading.Event(), []

    def watch():
        while not done.wait(every):
            if pids := find():
                for pid in [pids] if isinstance(pids, int) else pids:
                    killed.append(pid)
                    with contextlib.suppress(ProcessLookupError):  # it may have ended by itself
                        os.kill(pid, signal.SIGKILL)
                return

    thread = threading.Thread(target=watch, daemon=True, name="multirank-kill")
    thread.start()
    try:
        yield killed
    finally:
        done.set()  # however the block ended
        thread.join()


def _pid_in(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text())
    return None


def parent_of(pid: int) -> int | None:
    """The parent pid of a process (Linux: /proc; elsewhere, or once it is gone: ps), or None."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    ps = subprocess.run(["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True, text=True)
    return int(ps.stdout) if ps.stdout.strip() else None


def node_of(rank_pid: int | None) -> list[int] | None:
    """A rank's torchrun agent, then the agent's ranks (this one among them): what dies when
    the machine running that agent dies. For kill_when: the agent first, so that it cannot
    restart the ranks; None while rank_pid is None."""
    if rank_pid is None or (agent := parent_of(rank_pid)) is None:
        return None
    return [agent, *sorted(_descendants([agent]))]


def running(path) -> list[str]:
    """`pid args` of every live process whose command line names `path` (a worker script,
    a lesson folder), this process and its parents excepted."""
    ps = subprocess.run(["ps", "-ww", "-A", "-o", "pid=,ppid=,args="], capture_output=True, text=True, check=True)
    rows = [line.strip().split(None, 2) + [""] for line in ps.stdout.splitlines() if line.strip()]
    parent = {int(r[0]): int(r[1]) for r in rows}
    mine, pid = set(), os.getpid()
    while pid > 1 and pid not in mine:
        mine.add(pid)
        pid = parent.get(pid, 0)
    return [f"{r[0]} {r[2]}" for r in rows if str(path) in r[2] and int(r[0]) not in mine and r[2][:2] != "ps"]


def still_running(path, mark: str, var: str = MARK) -> list[str]:
    """`pid args` of the processes of one launch (or one run, for another var) still alive:
    their command line names `path`, and on Linux they carry var=mark, so that another run
    of the same worker is not counted."""
    found = running(path)
    if Path("/proc").is_dir():
        ours = {str(pid) for pid in marked(mark, var)}
        found = [line for line in found if line.split()[0] in ours]
    return found


# ---------------------------------------------------------------------------- in a rank


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def say(text: str) -> None:
    """One line, one print, prefixed with this rank (ranks' prints interleave otherwise)."""
    print(f"rank {_rank()}: {text}", flush=True)


def shared(text: str) -> None:
    """A fact every rank shares: printed once, by rank 0."""
    if _rank() == 0:
        say(text)


def heading(name: str) -> None:
    """Start a section: `section(run, name)` in the parent finds the lines that follow."""
    say(f"== {name} ==")


def watch_launcher() -> None:
    """If launch() started this rank, a daemon thread ends the launch once launch()'s process
    is gone. The rank's parent is its torchrun agent, the agent's parent is that process:
    while it lives the agent stays its child; once it dies (even as a zombie not yet reaped)
    the agent is re-parented, or gone too. No pid to reuse, no clock to compare."""
    launcher, agent = int(os.environ.get(LAUNCHER, 0)), os.getppid()
    if launcher:
        threading.Thread(target=_end_when_orphaned, args=(launcher, agent), daemon=True,
                         name="multirank-watch").start()


def _end_when_orphaned(launcher: int, agent: int) -> None:
    while parent_of(agent) == launcher:
        time.sleep(WATCH_S)
    # the agent only if it is still this rank's parent (so not a reused pid) and torchrun's
    ps = subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(agent)], capture_output=True, text=True)
    if os.getppid() == agent and "torch.distributed.run" in ps.stdout:
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, signal.SIGKILL)  # first, or it would restart or stop this rank
    os._exit(1)


def setup(backend: str = "gloo", timeout_s: float = GROUP_TIMEOUT_S):
    """Join the group torchrun describes in the environment, with a timeout of seconds (gloo's
    default is 30 minutes); one thread per rank; a thread that ends the launch if the process
    that called launch() dies. Returns the device for this rank's tensors."""
    watch_launcher()  # first: importing torch takes seconds
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return device


def teardown(code: int, clean: bool):
    """End this rank: a barrier only if it got here normally (after a failure the barrier
    would meet the other ranks' next collective and wait out the group's timeout), then
    always destroy_process_group(), flush, and os._exit(code). Never returns."""
    import torch.distributed as dist

    try:
        if clean and dist.is_initialized():
            dist.barrier()  # no rank tears down while another still talks to it
    except Exception:  # noqa: BLE001 - a peer that died first: say so, fail
        traceback.print_exc()
        code = code or 1
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()  # stop gloo's threads before the process ends
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # skip the interpreter's finalization (tests/workers/all_reduce.py)


def serve(parts: dict, add_args=None, timeout_s: float = GROUP_TIMEOUT_S):
    """A worker's main: `worker.py PART [--backend gloo|nccl|auto] [extra]`. Joins the group,
    runs parts[PART](device, **extra), prints any traceback, tears down with its exit code
    (what the part returned; 1 if it raised)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("part", choices=sorted(parts))
    parser.add_argument("--backend", choices=["gloo", "nccl", "auto"], default="gloo")
    if add_args:
        add_args(parser)
    args = parser.parse_args()
    device = setup(args.backend, timeout_s)
    extra = {k: v for k, v in vars(args).items() if k not in ("part", "backend")}
    code, clean = 1, False
    try:
        code, clean = parts[args.part](device, **extra) or 0, True
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - os._exit below would swallow the error: print it
        traceback.print_exc()
    teardown(code, clean)

"""The course's pytest plugin, loaded for every run by ``-p scripts.pytest_course`` (pyproject).

- Markers: ``cuda``, ``mps``, ``multigpu`` skip with a reason when the device is absent;
  ``multirank`` (launches ranks on CPU with gloo, never skipped), ``slow``, ``exercise(name)``.
- Fixtures for lesson tests: ``lesson`` (the script run once per test module),
  ``lesson_notebook`` (the notebook executed once per test module) and ``exercise_module``
  (``solutions.py``, or the student's ``exercises.py`` with ``--exercises``). For a lesson
  whose manifest has ranks > 1, both runs also fail if any process they launched is still
  alive afterwards (``no_rank_left``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from scripts import checker, manifest

MARKERS = {
    "cuda": "needs a CUDA device; skipped when torch.cuda.is_available() is False",
    "mps": "needs an Apple MPS device; skipped when torch.backends.mps.is_available() is False",
    "multigpu(n=2)": "needs at least n CUDA devices (2 unless given: multigpu(4))",
    "multirank": "launches several ranks (torchrun, gloo on CPU); runs on CPU, never skipped",
    "slow": "left out of `make test`; run with `make test-slow`",
    "exercise(name)": "tests of one exercise, run against solutions.py or exercises.py",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--exercises", action="store_true",
        help="test the student's exercises.py instead of solutions.py",
    )


def pytest_configure(config: pytest.Config) -> None:
    for key, value in manifest.tool_env().items():
        if key != "MPLBACKEND":  # notebooks keep their inline backend; scripts set Agg themselves
            os.environ.setdefault(key, value)
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


def missing_device(marker: str, gpus: int = 2) -> str | None:
    """Why a test with this marker cannot run here, or None when it can. ``gpus`` is how many
    CUDA devices a ``multigpu`` test needs (``@pytest.mark.multigpu(4)``; 2 by default)."""
    import torch

    if marker == "cuda" and not torch.cuda.is_available():
        return "needs CUDA: torch.cuda.is_available() is False"
    if marker == "mps" and not torch.backends.mps.is_available():
        return "needs MPS: torch.backends.mps.is_available() is False"
    if marker == "multigpu" and torch.cuda.device_count() < gpus:
        return f"needs {gpus} CUDA devices: torch.cuda.device_count() is {torch.cuda.device_count()}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip device tests at collection, so the report names the test and the reason."""
    for item in items:
        for marker in ("cuda", "mps", "multigpu"):
            mark = item.get_closest_marker(marker)
            gpus = mark.args[0] if mark and mark.args else 2
            if mark and (reason := missing_device(marker, gpus)):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Tag exercise reports with the exercise's name and whether it was attempted."""
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("exercise")
    if marker and call.when == "call":
        stub = call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError)
        report.user_properties += [("exercise", marker.args[0]), ("not_attempted", stub)]
        if stub and item.config.getoption("--exercises"):
            # A stub is "not attempted yet", not a bug: show it as a skip with that reason.
            # Against solutions.py (make test) a NotImplementedError stays a failure.
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, "Skipped: not attempted yet")


@pytest.fixture(scope="module")
def course_lesson(request: pytest.FixtureRequest) -> manifest.Lesson:
    return manifest.for_path(request.path)


RUN_MARK = "COURSE_LESSON_RUN"  # set while a lesson runs: its kernel, torchrun and ranks inherit it


def leftovers(lesson: manifest.Lesson, token: str) -> list[str]:
    """`pid args` of the processes a lesson's run left: naming the lesson's folder on their
    command line (torchrun and the ranks do) and, on Linux, carrying the run's token (not
    another run of the same lesson)."""
    from scripts import multirank  # the course's kit: the lessons launch with it

    return multirank.still_running(lesson.dir, token, RUN_MARK)


@contextlib.contextmanager
def no_rank_left(lesson: manifest.Lesson):
    """For a lesson whose manifest has ranks > 1: after its script or notebook has run, no
    process it launched may still be alive. Any that is gets killed, and the run fails."""
    if lesson.ranks <= 1:
        yield
        return
    token, previous = uuid.uuid4().hex, os.environ.get(RUN_MARK)
    os.environ[RUN_MARK] = token
    try:
        yield
    finally:
        if previous is None:
            del os.environ[RUN_MARK]
        else:
            os.environ[RUN_MARK] = previous
        end = time.monotonic() + 5  # SIGKILLed processes take a moment to vanish
        while (left := leftovers(lesson, token)) and time.monotonic() < end:
            time.sleep(0.2)
        for line in left:  # never leave them running, whatever the outcome
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not left, f"lesson {lesson.number} left {len(left)} processes running (now killed): {left}"


@pytest.fixture(scope="module")
def lesson(course_lesson: manifest.Lesson) -> checker.LessonRun:
    with no_rank_left(course_lesson):
        run = checker.run_script(course_lesson.script)
    run.allowed_warnings = course_lesson.allowed_warnings
    return run


@pytest.fixture(scope="module")
def lesson_notebook(course_lesson: manifest.Lesson) -> checker.LessonRun:
    with no_rank_left(course_lesson):
        run = checker.run_notebook(course_lesson.script.with_suffix(".ipynb"))
    run.allowed_warnings = course_lesson.allowed_warnings
    return run


def import_file(path: Path) -> ModuleType:
    """Import a lesson's file under a unique name (every lesson has its own solutions.py)."""
    name = f"course_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader, f"cannot import {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # inspect.getsource needs it to find classes' source
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def exercise_module(request: pytest.FixtureRequest) -> ModuleType:
    stem = "exercises" if request.config.getoption("--exercises") else "solutions"
    return import_file(request.path.parent / f"{stem}.py")


def cuda_median_ms(fn, warmup: int = 3, repeats: int = 10) -> float:
    """Median GPU time of one call of ``fn`` in ms, by CUDA events, after ``warmup`` calls (the
    first calls pick kernels and allocate workspaces). One helper for every GPU test and the
    GPU report: kernels run asynchronously, so a host clock alone would time the launch."""
    import statistics

    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()  # read the events once the GPU has reached the end one
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def autograd_node_names(tensor) -> list[str]:
    """The class name of every autograd node behind ``tensor``, each node once (a depth-first
    walk of ``grad_fn.next_functions``): what the lessons' tests count in a graph."""
    seen, todo, names = set(), [tensor.grad_fn], []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        todo += [n for n, _ in node.next_functions]
    return names

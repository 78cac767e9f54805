"""The course's pytest plugin, loaded for every run by ``-p scripts.pytest_course`` (pyproject).

- Markers: ``cuda``, ``mps``, ``multigpu`` skip with a reason when the device is absent;
  ``multirank`` (launches ranks on CPU with gloo, never skipped), ``slow``, ``exercise(name)``.
- Fixtures for lesson tests: ``lesson`` (the script run once per test module),
  ``lesson_notebook`` (the notebook executed once per test module) and ``exercise_module``
  (``solutions.py``, or the student's ``exercises.py`` with ``--exercises``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from scripts import checker, manifest

MARKERS = {
    "cuda": "needs a CUDA device; skipped when torch.cuda.is_available() is False",
    "mps": "needs an Apple MPS device; skipped when torch.backends.mps.is_available() is False",
    "multigpu": "needs at least 2 CUDA devices",
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


def missing_device(marker: str) -> str | None:
    """Why a test with this marker cannot run here, or None when it can."""
    import torch

    if marker == "cuda" and not torch.cuda.is_available():
        return "needs CUDA: torch.cuda.is_available() is False"
    if marker == "mps" and not torch.backends.mps.is_available():
        return "needs MPS: torch.backends.mps.is_available() is False"
    if marker == "multigpu" and torch.cuda.device_count() < 2:
        return f"needs 2 CUDA devices: torch.cuda.device_count() is {torch.cuda.device_count()}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip device tests at collection, so the report names the test and the reason."""
    for item in items:
        for marker in ("cuda", "mps", "multigpu"):
            if item.get_closest_marker(marker) and (reason := missing_device(marker)):
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


@pytest.fixture(scope="module")
def lesson(course_lesson: manifest.Lesson) -> checker.LessonRun:
    run = checker.run_script(course_lesson.script)
    run.allowed_warnings = course_lesson.allowed_warnings
    return run


@pytest.fixture(scope="module")
def lesson_notebook(course_lesson: manifest.Lesson) -> checker.LessonRun:
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

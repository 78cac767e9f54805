"""Check a student's answers: ``make exercises N=01``.

Runs the lesson's exercise tests (the same tests `make test` runs against ``solutions.py``)
against ``lessons/NN_slug/exercises.py`` and prints, per exercise, whether it passes, fails
or is not attempted yet (its stub still raises NotImplementedError). Exit status 0 only when
every exercise passes.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest

from scripts.manifest import ROOT, find


class Collector:
    """A pytest plugin that records each exercise test's outcome by exercise name."""

    def __init__(self) -> None:
        self.outcomes: dict[str, list[str]] = defaultdict(list)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if "exercise" in props:
            outcome = "not attempted" if props["not_attempted"] else report.outcome
            self.outcomes[props["exercise"]].append(outcome)
        elif report.failed:  # an error in setup: count it against the test file
            self.outcomes["(test setup)"].append("failed")


def verdict(outcomes: list[str]) -> str:
    if "not attempted" in outcomes:
        return "not attempted"
    return "passed" if all(o == "passed" for o in outcomes) else "failed"


def report(outcomes: dict[str, list[str]]) -> tuple[str, bool]:
    rows = [f"{'exercise':<24} {'result':<14} tests passed"]
    for name, results in outcomes.items():
        passed = sum(o == "passed" for o in results)
        rows.append(f"{name:<24} {verdict(results):<14} {passed}/{len(results)}")
    done = bool(outcomes) and all(verdict(r) == "passed" for r in outcomes.values())
    return "\n".join(rows), done


def lesson_folder(arg: str) -> Path:
    """``01`` names a lesson of the manifest; a path names a lesson folder (e.g. a copy)."""
    return Path(arg).resolve() if Path(arg).is_dir() else find(arg).dir


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: make exercises N=01   (or: python -m scripts.exercises LESSON_FOLDER)")
        return 2
    folder = lesson_folder(argv[0])
    if not (folder / "exercises.py").exists():
        print(f"{folder.name} has no exercises.py")
        return 2
    collector = Collector()
    (test_file,) = folder.glob("test_*.py")
    pytest.main(
        [str(test_file), "-m", "exercise", "--exercises", "-q", "--tb=short",
         "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)],
        plugins=[collector],
    )
    table, done = report(collector.outcomes)
    print(f"\nExercises in {folder.name}/exercises.py")
    print(table)
    print("All exercises pass." if done else "Not done yet: fix the failures, fill in the stubs.")
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

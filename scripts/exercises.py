"""Check a student's answers: ``make exercises N=01``.

Runs the lesson's exercise tests (the same tests `make test` runs against ``solutions.py``)
against ``lessons/NN_slug/exercises.py`` and prints, per exercise, whether it passes, fails
or is not attempted yet (its stub still raises NotImplementedError), in the order the
exercises appear in the file. Exit status 0 only when every exercise passes. A file that does
not import (a SyntaxError, a NameError at the top level) is reported once, with its line.
"""

from __future__ import annotations

import ast
import sys
import traceback
from collections import defaultdict
from pathlib import Path

import pytest

from scripts.manifest import ROOT, UnknownLesson, find
from scripts.pytest_course import import_file


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


def file_order(source: str) -> list[str]:
    """Names of the functions and classes a file defines at its top level, in order."""
    return [node.name for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def in_file_order(outcomes: dict[str, list[str]], order: list[str]) -> dict[str, list[str]]:
    """The outcomes, exercises in the order of ``order``; others after them, as they ran."""
    rank: dict[str, int] = {}
    for i, name in enumerate(order):
        rank.setdefault(name, i)  # a name defined twice counts where it first appears
    return dict(sorted(outcomes.items(), key=lambda item: rank.get(item[0], len(rank))))


def count(names: list[str], one: str, many: str) -> str:
    return f"{len(names)} {'exercise' if len(names) == 1 else 'exercises'} " \
           f"{one if len(names) == 1 else many} ({', '.join(names)})"


def report(outcomes: dict[str, list[str]]) -> tuple[str, bool]:
    """The table and its closing sentence (which says what is true), and whether all pass."""
    rows = [f"{'exercise':<24} {'result':<14} tests passed"]
    for name, results in outcomes.items():
        passed = sum(o == "passed" for o in results)
        rows.append(f"{name:<24} {verdict(results):<14} {passed}/{len(results)}")
    done = bool(outcomes) and all(verdict(r) == "passed" for r in outcomes.values())
    failed = [n for n, r in outcomes.items() if verdict(r) == "failed"]
    todo = [n for n, r in outcomes.items() if verdict(r) == "not attempted"]
    parts = [count(failed, "fails", "fail")] if failed else []
    parts += [count(todo, "not attempted yet", "not attempted yet")] if todo else []
    if done:
        rows.append(f"All {len(outcomes)} exercises pass.")
    else:
        rows.append("Not done yet: " + ("; ".join(parts) if parts else "no exercise test ran") + ".")
    return "\n".join(rows), done


def import_problem(path: Path) -> str | None:
    """Why the student's file does not import, once, with its line; None when it imports."""
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    try:
        import_file(path)
    except SyntaxError as e:
        text = (e.text or "").rstrip("\n")
        return f"{name}, line {e.lineno}: SyntaxError: {e.msg}\n    {text.strip()}"
    except Exception as e:  # noqa: BLE001 - whatever the student's top level raises
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == path]
        line = f", line {frames[-1].lineno}" if frames else ""
        return f"{name}{line}: {type(e).__name__}: {e}"
    return None


def lesson_folder(arg: str) -> Path:
    """``01`` names a lesson of the manifest; a path names a lesson folder (e.g. a copy)."""
    return Path(arg).resolve() if arg.strip() and Path(arg).is_dir() else find(arg).dir


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: make exercises N=01   (or: python -m scripts.exercises LESSON_FOLDER)")
        return 2
    try:
        folder = lesson_folder(argv[0])
    except UnknownLesson as e:
        print(e, file=sys.stderr)
        return 2
    if not (folder / "exercises.py").exists():
        print(f"{folder.name} has no exercises.py")
        return 2
    if problem := import_problem(folder / "exercises.py"):
        print(f"{problem}\nFix it, then run the exercises again: nothing was tested.")
        return 1
    collector = Collector()
    (test_file,) = folder.glob("test_*.py")
    pytest.main(
        [str(test_file), "-m", "exercise", "--exercises", "-q", "--tb=short",
         "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)],
        plugins=[collector],
    )
    order = file_order((folder / "exercises.py").read_text())
    table, done = report(in_file_order(collector.outcomes, order))
    print(f"\nExercises in {folder.name}/exercises.py")
    print(table)
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

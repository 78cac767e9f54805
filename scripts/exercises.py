"""Check a student's answers: ``make exercises N=01``.

Runs the lesson's exercise tests (the same tests `make test` runs against ``solutions.py``)
against ``lessons/NN_slug/exercises.py`` and prints, per exercise, whether it passes, fails
or is not attempted yet (its stub still raises NotImplementedError). Exit status 0 only when
every exercise passes.
"""

from __future__ import annotations

import sys
from collections import defaultdict

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


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: make exercises N=01")
        return 2
    lesson = find(argv[0])
    if not (lesson.dir / "exercises.py").exists():
        print(f"lesson {lesson.number} has no exercises.py")
        return 2
    collector = Collector()
    test_file = lesson.dir / f"test_{lesson.slug}.py"
    pytest.main(
        [str(test_file), "-m", "exercise", "--exercises", "-q", "--tb=short", "-p", "no:cacheprovider"],
        plugins=[collector],
    )
    table, done = report(collector.outcomes)
    print(f"\nExercises of lesson {lesson.number} ({lesson.dir.relative_to(ROOT)}/exercises.py)")
    print(table)
    print("All exercises pass." if done else "Not done yet: fix the failures, fill in the stubs.")
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

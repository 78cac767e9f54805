"""Run the course's lessons in order, as a student would: ``python lessons/NN_slug/slug.py``.

    python -m scripts.run_lessons            # every ready lesson, one progress line each
    python -m scripts.run_lessons --show 01  # one lesson, its output on the terminal

Each run's output goes to ``build/logs/NN_slug.log``. The summary table gives each lesson's
status, wall time and budget from ``lessons/course.toml``; the exit status is 1 if any
lesson failed. Time over budget is reported, not failed: timings vary with the machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from scripts.deps import pin_problems
from scripts.manifest import BUILD, ROOT, Lesson, UnknownLesson, find, ready, tool_env


@dataclass
class Result:
    lesson: Lesson
    status: str  # "ok", "failed (exit N)", "timed out"
    seconds: float


def hard_limit(lesson: Lesson) -> float:
    """Generous wall limit so a hung lesson cannot hang the runner."""
    return max(120.0, 5 * lesson.budget_s)


def run(lesson: Lesson, show: bool) -> Result:
    log = BUILD / "logs" / f"{lesson.folder}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **tool_env()}
    start = time.perf_counter()
    with open(log, "w") as f:
        out = None if show else f
        try:
            proc = subprocess.run(
                [sys.executable, str(lesson.script.relative_to(ROOT))], cwd=ROOT, env=env,
                stdout=out, stderr=subprocess.STDOUT if out else None, timeout=hard_limit(lesson),
            )
            status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            status = "timed out"
    return Result(lesson, status, time.perf_counter() - start)


def table(results: list[Result]) -> str:
    names = [f"{r.lesson.number} {r.lesson.title}" for r in results]
    width = max([34, *map(len, names)])  # the longest title sets the column, so columns line up
    rows = [f"{'lesson':<{width}} {'status':<16} {'seconds':>8} {'budget':>7}"]
    for name, r in zip(names, results):
        over = "  over budget" if r.seconds > r.lesson.budget_s else ""
        rows.append(f"{name:<{width}} {r.status:<16} {r.seconds:>8.1f} {r.lesson.budget_s:>7.0f}{over}")
    total = sum(r.seconds for r in results)
    rows.append(f"{'total':<{width}} {'':<16} {total:>8.1f}")
    return "\n".join(rows)


def torch_problem() -> str | None:
    """One line when the installed torch is not the course's pin, else None."""
    torch_pin = [p for p in pin_problems([]) if p.startswith("torch ")]
    return f"{torch_pin[0]}: run `make install`" if torch_pin else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the course's lessons in order.")
    parser.add_argument("--show", metavar="N", help="run lesson N only, showing its output")
    args = parser.parse_args(argv)
    try:
        lessons = [find(args.show)] if args.show is not None else ready()
    except UnknownLesson as e:
        print(e, file=sys.stderr)
        return 2
    if problem := torch_problem():
        print(problem, file=sys.stderr)
        return 2
    results = []
    for i, lesson in enumerate(lessons, start=1):
        if lesson.status != "ready":
            print(f"lesson {lesson.number} ({lesson.title}) is planned, not written yet")
            return 2
        # one progress line per lesson (with --show the lesson's own output comes between)
        print(f"[{i}/{len(lessons)}] {lesson.number} {lesson.title} ...", end="\n" if args.show else " ", flush=True)
        results.append(r := run(lesson, show=bool(args.show)))
        log = "" if args.show else f"  (log: build/logs/{lesson.folder}.log)"
        print(f"{r.status} in {r.seconds:.1f} s{log}", flush=True)
    print()
    print(table(results))
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

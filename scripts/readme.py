"""Regenerate the README's course map from ``lessons/course.toml``.

    python -m scripts.readme           # rewrite the table between the course-map markers
    python -m scripts.readme --check   # exit 1 when the README's table is stale
"""

from __future__ import annotations

import argparse
import sys

from scripts.manifest import ROOT, Lesson, load

README = ROOT / "README.md"
START, END = "<!-- course-map:start -->", "<!-- course-map:end -->"


def row(lesson: Lesson) -> str:
    name = f"[{lesson.title}](lessons/{lesson.folder}/)" if lesson.status == "ready" else lesson.title
    prereq = ", ".join(lesson.prerequisites) or "—"
    extras = ", ".join(lesson.devices) or "—"
    ranks = f"{lesson.ranks} (gloo)" if lesson.ranks > 1 else "1"
    return (f"| {lesson.number} | {name} | {lesson.summary} | {prereq} | {ranks} | {extras} "
            f"| {lesson.budget_s:.0f} s | {lesson.status} |")


def course_map(lessons: list[Lesson]) -> str:
    head = ("| # | lesson | what you will see | after | CPU ranks | GPU sections | budget | status |\n"
            "|---|---|---|---|---|---|---|---|")
    return "\n".join([head, *map(row, lessons)])


def render(text: str) -> str:
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    return f"{before}{START}\n{course_map(load())}\n{END}{after}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = README.read_text()
    if args.check:
        if render(text) != text:
            print("README.md's course map is stale: run `make readme`")
            return 1
        return 0
    README.write_text(render(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())

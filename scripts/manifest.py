"""The course manifest, ``lessons/course.toml``: one ``[[lesson]]`` table per lesson.

Every tool reads the lessons from here (the runner, the notebook generator, the README's
course map), so the order of the course is written down exactly once.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
MANIFEST = LESSONS / "course.toml"
STATUSES = ("ready", "planned")


@dataclass(frozen=True)
class Lesson:
    number: str  # "01": two digits, the teaching order
    folder: str  # "01_tensor_views"
    title: str
    summary: str
    prerequisites: tuple[str, ...]  # lesson numbers
    devices: tuple[str, ...]  # optional accelerator sections: "cuda", "mps", "multigpu"
    ranks: int  # processes the lesson launches (1 = single process)
    budget_s: float  # CPU seconds `make lessons` allows the script
    status: str  # "ready" (its folder exists) or "planned" (not written yet)
    allowed_warnings: tuple[str, ...] = ()  # regexes of warnings that are the lesson's point
    budget_note: str = ""  # why a lesson needs more than the usual 30 s

    @property
    def slug(self) -> str:
        return self.folder.split("_", 1)[1]

    @property
    def dir(self) -> Path:
        return LESSONS / self.folder

    @property
    def script(self) -> Path:
        return self.dir / f"{self.slug}.py"


def load(path: Path = MANIFEST) -> list[Lesson]:
    tables = tomllib.loads(path.read_text())["lesson"]
    lessons = []
    for t in tables:
        t = dict(t)
        for key in ("prerequisites", "devices", "allowed_warnings"):
            t[key] = tuple(t.get(key, ()))
        lessons.append(Lesson(**t))
    return lessons


def ready() -> list[Lesson]:
    return [lesson for lesson in load() if lesson.status == "ready"]


class UnknownLesson(KeyError):
    """``N`` names no lesson: the message is one line listing the valid numbers and titles."""

    def __str__(self) -> str:  # KeyError's own str() would quote the message
        return str(self.args[0])


def find(number: str) -> Lesson:
    """The lesson numbered ``number`` ("01" or "1"); UnknownLesson names the valid ones."""
    lessons = load()
    for lesson in lessons:
        if number.strip().isdigit() and lesson.number == number.strip().zfill(2):
            return lesson
    valid = ", ".join(f"{lesson.number} {lesson.title}" for lesson in lessons)
    given = f"no lesson {number!r}" if number.strip() else "say which lesson with N=NN"
    raise UnknownLesson(f"{given}: N is one of {valid}")


def lesson_scripts() -> list[Path]:
    return [lesson.script for lesson in ready()]


def for_path(path: Path) -> Lesson:
    """The lesson whose folder holds ``path``."""
    for lesson in load():
        if lesson.dir == path.resolve().parent:
            return lesson
    raise KeyError(f"{path} is not in a lesson folder listed in {MANIFEST.relative_to(ROOT)}")


BUILD = ROOT / "build"


def tool_env() -> dict[str, str]:
    """Environment every lesson run gets from the tools: one shared Inductor cache, headless
    figures. Lessons run without it too; it only saves time and windows."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(BUILD / "inductor-cache"), "MPLBACKEND": "Agg"}

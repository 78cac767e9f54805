"""The course manifest, ``lessons/course.toml``: one ``[[lesson]]`` table per lesson.

Every tool reads the lessons from here (the runner, the notebook generator, the README's
course map), so the order of the course is written down exactly once.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
MANIFEST = LESSONS / "course.toml"
STATUSES = ("ready", "planned")
# A lesson's number: two digits, and a letter for the parts of a lesson split in two or more
# ("03a", "03b"). A folder starts with its number: 03a_autograd_tape.
NUMBER = re.compile(r"\d\d[a-z]?")


@dataclass(frozen=True)
class Lesson:
    number: str  # "01", or "03a" for a part: the teaching order (NUMBER)
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


def normalize(number: str) -> str:
    """"3", "03", "3A" -> "03", "03", "03a": the form the manifest writes; other text unchanged."""
    m = re.fullmatch(r"(\d{1,2})([a-zA-Z]?)", number.strip())
    return f"{int(m[1]):02d}{m[2].lower()}" if m else number.strip()


def order_key(number: str) -> tuple[int, str]:
    """Sorts lesson numbers in teaching order: 03 < 03a < 03b < 04."""
    return int(number[:2]), number[2:]


def find(number: str, lessons: list[Lesson] | None = None) -> Lesson:
    """The lesson numbered ``number`` ("01", "1", "03a"); UnknownLesson names the valid ones
    (and, for the number of a lesson taught in parts, its parts)."""
    lessons = load() if lessons is None else lessons
    wanted = normalize(number)
    for lesson in lessons:
        if lesson.number == wanted:
            return lesson
    parts = [lesson.number for lesson in lessons if NUMBER.fullmatch(wanted) and lesson.number[:2] == wanted]
    if parts:
        raise UnknownLesson(f"lesson {wanted} is taught in parts: N is one of {', '.join(parts)}")
    valid = ", ".join(f"{lesson.number} {lesson.title}" for lesson in lessons)
    given = f"no lesson {number!r}" if number.strip() else "say which lesson with N=NN"
    raise UnknownLesson(f"{given}: N is one of {valid}")


def lesson_scripts() -> list[Path]:
    return [lesson.script for lesson in ready()]


def shown(path: Path) -> str:
    """``path`` relative to the repository root where it lies inside it (for messages)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


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

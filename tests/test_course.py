"""Course-wide checks: the manifest, every lesson complete, notebooks and README in sync, pin."""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import re
import sys
import tomllib

import pytest

from scripts import manifest, notebooks, prose, readme
from scripts.checker import read_cells
from scripts.pytest_course import import_file

READY = manifest.ready()
ALLOWED_IMPORTS = set(sys.stdlib_module_names) | {"torch", "numpy", "matplotlib", "safetensors"}


def test_torch_is_the_pinned_version():
    pins = tomllib.loads((manifest.ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = next(p.split("==")[1] for p in pins if p.startswith("torch=="))
    installed = importlib.metadata.version("torch").split("+")[0]
    assert installed == pinned, (
        f"torch {installed} is installed but the course is pinned to {pinned}: run `make install`"
    )


def test_manifest_lists_exactly_the_lesson_folders():
    folders = {p.name for p in manifest.LESSONS.iterdir() if p.is_dir() and re.match(r"\d\d[a-z]?_", p.name)}
    listed = {lesson.folder for lesson in READY}
    assert folders - listed == set(), f"lesson folders missing from lessons/course.toml: {folders - listed}"
    assert listed - folders == set(), f"ready lessons without a folder: {listed - folders}"


PARTS = "expected one lesson or parts a, b, ..."


def numbering_problems(numbers: list[str]) -> list[str]:
    """What breaks the numbering: 01, 02, ... with no gap, each either whole or in parts a, b, ...
    (never both), listed in teaching order."""
    problems = [f"{n!r} is not NN or NNa" for n in numbers if not manifest.NUMBER.fullmatch(n)]
    if problems:
        return problems
    if numbers != sorted(numbers, key=manifest.order_key) or len(set(numbers)) != len(numbers):
        problems.append(f"not in teaching order or repeated: {numbers}")
    wholes = sorted({int(n[:2]) for n in numbers})
    if wholes != list(range(1, len(wholes) + 1)):
        problems.append(f"lesson numbers with a gap: {wholes}")
    for whole in wholes:
        suffixes = [n[2:] for n in numbers if int(n[:2]) == whole]
        if suffixes != [""] and suffixes != [chr(ord("a") + i) for i in range(len(suffixes))]:
            problems.append(f"lesson {whole:02d}: parts {suffixes}, {PARTS}")
    return problems


def test_numbering_problems_finds_each_kind():
    assert numbering_problems(["01", "02", "03a", "03b", "04"]) == []
    assert numbering_problems(["01", "03"]) == ["lesson numbers with a gap: [1, 3]"]
    assert numbering_problems(["01", "02a", "02c"]) == [f"lesson 02: parts ['a', 'c'], {PARTS}"]
    assert numbering_problems(["01", "01a"]) == [f"lesson 01: parts ['', 'a'], {PARTS}"]
    assert numbering_problems(["02", "01"]) == ["not in teaching order or repeated: ['02', '01']"]
    assert numbering_problems(["1"]) == ["'1' is not NN or NNa"]


def test_find_takes_parts():
    lesson = manifest.Lesson("03a", "03a_autograd_tape", "Autograd: the tape", "", (), (), 1, 10, "planned")
    lessons = [lesson, dataclasses.replace(lesson, number="03b", folder="03b_autograd_functions")]
    assert manifest.find("3A", lessons) is lesson and manifest.find("03a", lessons) is lesson
    assert lesson.script.name == "autograd_tape.py"
    with pytest.raises(manifest.UnknownLesson, match="lesson 03 is taught in parts: N is one of 03a, 03b"):
        manifest.find("3", lessons)
    assert manifest.find("1").number == "01" and manifest.find(" 01 ").number == "01"


def test_manifest_is_in_teaching_order():
    lessons = manifest.load()
    assert numbering_problems([lesson.number for lesson in lessons]) == []
    for lesson in lessons:
        assert lesson.folder.startswith(f"{lesson.number}_")
        assert lesson.status in manifest.STATUSES, lesson
        assert all(p < lesson.number for p in lesson.prerequisites), lesson
        assert set(lesson.devices) <= {"cuda", "mps", "multigpu"}, lesson
        assert lesson.budget_s <= 30 or lesson.budget_note, f"{lesson.number}: say why in budget_note"
        if lesson.status == "planned":
            assert not lesson.dir.exists(), f"{lesson.folder} exists: mark it ready"


@pytest.mark.parametrize("lesson", READY, ids=lambda lesson: lesson.number)
def test_lesson_is_complete(lesson: manifest.Lesson):
    test_file = lesson.dir / f"test_{lesson.slug}.py"
    for path in (lesson.script, notebooks.notebook_path(lesson.script), test_file):
        assert path.exists(), f"{path.relative_to(manifest.ROOT)} is missing"
    tests = {n.name for n in ast.parse(test_file.read_text()).body if isinstance(n, ast.FunctionDef)}
    assert {"test_script_outputs", "test_notebook_outputs"} <= tests, f"{test_file.name} must check both"
    cells = read_cells(lesson.script)
    opening = cells[0].source
    for heading in ("What you will learn", "Prerequisites", "How to run"):
        assert heading in opening, f"{lesson.folder}: the opening cell needs '{heading}'"
    text = "\n".join(c.source for c in cells if c.kind == "markdown")
    assert "## Summary" in text and "## Exercises" in text, f"{lesson.folder}: Summary and Exercises"
    code = "\n".join(c.source for c in cells if c.kind == "code")
    assert "torch.set_num_threads(1)" in code and "torch.manual_seed(" in code


def imported_modules(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("lesson", READY, ids=lambda lesson: lesson.number)
def test_lesson_is_self_contained(lesson: manifest.Lesson):
    """A lesson imports only stdlib, torch, numpy, matplotlib, safetensors, the files of its own
    folder and the course's two shared modules, the multi-rank kit lessons/multirank.py and
    the source map lessons/sourcemap.py (each imports only stdlib and torch): a student can
    copy the folder together with them."""
    kits = {manifest.LESSONS / "multirank.py", manifest.LESSONS / "sourcemap.py"}
    own = {p.stem for p in lesson.dir.glob("*.py")}
    for path in lesson.dir.glob("*.py"):
        if path.name.startswith("test_"):
            continue  # tests use the course tooling
        imported = imported_modules(path)
        extra = imported - ALLOWED_IMPORTS - own - {kit.stem for kit in kits}
        assert not extra, f"{path.relative_to(manifest.ROOT)} imports {sorted(extra)}"
        for kit in kits:
            if kit.stem in imported:
                extra = imported_modules(kit) - set(sys.stdlib_module_names) - {"torch"}
                assert not extra, f"lessons/{kit.name} imports {sorted(extra)}"


@pytest.mark.parametrize("lesson", [lesson for lesson in READY if (lesson.dir / "exercises.py").exists()],
                         ids=lambda lesson: lesson.number)
def test_exercises_are_stubs_matching_the_solutions(lesson: manifest.Lesson):
    def public(module):
        return {n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                and getattr(v, "__module__", None) == module.__name__}

    stubs, answers = import_file(lesson.dir / "exercises.py"), import_file(lesson.dir / "solutions.py")
    assert public(stubs) == public(answers)
    for name in public(stubs):
        body = ast.parse(__import__("inspect").getsource(getattr(stubs, name))).body[0].body
        raises = [n for n in ast.walk(body[-1]) if isinstance(n, ast.Name) and n.id == "NotImplementedError"]
        assert raises, f"exercises.py: {name} must still raise NotImplementedError"


def test_notebooks_are_in_sync():
    stale = [str(p.relative_to(manifest.ROOT)) for p in notebooks.stale(manifest.lesson_scripts())]
    assert not stale, f"stale notebooks {stale}: regenerate them with `make notebooks`"


def test_readme_course_map_is_in_sync():
    text = readme.README.read_text()
    assert readme.render(text) == text, "README.md's course map is stale: run `make readme`"


# Lessons the re-cut issues have not reached yet (issue 32 re-cut 01-08, issue 33 09-14). Every other
# lesson keeps scripts/prose.py's rules; a listed lesson that already keeps them fails here
# until it leaves the list, so the list only shrinks.
NOT_YET_RECUT: dict[str, str] = {}  # number -> the issue that will re-cut it; empty: every lesson is re-cut
RELEASE = prose.pinned_release()


@pytest.mark.parametrize("lesson", READY, ids=lambda lesson: lesson.number)
def test_lesson_prose_keeps_the_rules(lesson: manifest.Lesson):
    """At most 3,600 words on the main path (1,200 in Going further), prose that speaks to the
    student (no talk of the course's tests, targets or machines), References of the pinned
    documentation and papers (scripts/prose.py)."""
    problems = prose.problems(lesson, RELEASE)
    if lesson.number in NOT_YET_RECUT:
        assert problems, f"{lesson.number} keeps the prose rules now: take it off NOT_YET_RECUT"
    else:
        assert problems == [], "\n".join(problems)


def calls_sdpa(lesson: manifest.Lesson) -> bool:
    code = "\n".join(c.source for c in read_cells(lesson.script) if c.kind == "code")
    return "scaled_dot_product_attention" in code


def test_no_lesson_calls_sdpa_before_lesson_07_teaches_it():
    """07 and 08 revisit the earlier lessons' tools on SDPA (01's layout, 02's dispatch log,
    06a's profiler); no earlier lesson runs it."""
    before = [lesson for lesson in READY if manifest.order_key(lesson.number) < (7, "")]
    assert before, "no lesson before 07"
    calling = [lesson.number for lesson in before if calls_sdpa(lesson)]
    assert calling == [], f"lessons before 07 that call SDPA, which 07 teaches: {calling}"
    assert calls_sdpa(manifest.find("07a"))  # the rule's premise: 07 teaches it

"""The course's reading path, ``lessons/READING.md``, and the checks of every lesson's closing cells.

Each lesson's *Read the source* cell calls ``read_the_source([...])`` (``lessons/sourcemap.py``)
with a literal list of stops; this module reads those lists from the scripts (without running
them), checks every stop against the installed torch, and writes READING.md from them in the
order of ``PATH``, with the mastery rubric of ``RUBRIC``.

    python -m scripts.reading           # rewrite lessons/READING.md
    python -m scripts.reading --check   # exit 1 when READING.md is stale or a stop is broken
"""

from __future__ import annotations

import argparse
import ast
import functools
import mmap
import re
import sys
import tomllib
from pathlib import Path

from scripts.checker import read_cells
from scripts.manifest import LESSONS, ROOT, Lesson, find, ready

sys.path.insert(0, str(LESSONS))
import sourcemap

READING = LESSONS / "READING.md"
Stop = tuple[str, str, str]  # (path, text to find, what to look for there)
# The closing cells, in order; the optional ones may be left out (References is required of
# a lesson re-cut under issue 32: tests/test_course.py).
CLOSING = ("Summary", "Going further", "References", "Read the source", "Mastery check", "Exercises")
OPTIONAL = ("Going further", "References")
HEADING = re.compile(r"#{2,4}\s+(?:\d+\.\s+)?(.+?)\s*")  # "## 5. Title" -> "Title"
REFERENCE = re.compile(r"\*(?:(\d\d[a-z]?) )?§ ([^*]+)\*")  # *§ Title* or *03a § Title*: a backing cell
QUESTION = re.compile(r"^\d+\.\s", re.M)
REPO_PATH = re.compile(r"(?:aten|c10|torch/csrc|caffe2)/[\w/.-]+\.(?:cpp|cu|cuh|h)")

# The path through PyTorch's source, in reading order: (stop, lesson that demonstrates it, path).
# Each path must be one of that lesson's stops; READING.md takes the text and what to look for
# from the lesson's cell, so they are written once.
PATH: list[tuple[str, str, str]] = [
    ("The Python tensor façade", "01", "torch/_tensor.py"),
    ("Tensor metadata: sizes, strides, offset, storage", "01", "torch/include/c10/core/TensorImpl.h"),
    ("Interception hooks: `__torch_function__`", "02", "torch/overrides.py"),
    ("The dispatcher", "02", "torch/include/ATen/core/dispatch/Dispatcher.h"),
    ("Dispatch keys and their order", "02", "torch/include/c10/core/DispatchKey.h"),
    ("Operator schemas", "02", "torchgen/packaged/ATen/native/native_functions.yaml"),
    ("From schema to registered kernel: torchgen", "02", "torchgen/gen.py"),
    ("Autograd: the graph and saved tensors", "03a", "torch/autograd/graph.py"),
    ("Autograd: the engine that schedules backward", "03a", "torch/include/torch/csrc/autograd/engine.h"),
    ("Scaled dot-product attention", "07a", "torch/nn/functional.py"),
    ("Capture: Dynamo", "08a", "torch/_dynamo/eval_frame.py"),
    ("Staging: AOTAutograd", "08a", "torch/_functorch/aot_autograd.py"),
    ("Lowering: Inductor", "08b", "torch/_inductor/compile_fx.py"),
    ("Device meshes", "09", "torch/distributed/device_mesh.py"),
    ("Tensor-parallel plans", "10", "torch/distributed/tensor/parallel/style.py"),
    ("Pipelining schedules", "10", "torch/distributed/pipelining/schedules.py"),
    ("FSDP2", "11a", "torch/distributed/fsdp/_fully_shard/_fully_shard.py"),
    ("Distributed checkpoints", "12a", "torch/distributed/checkpoint/state_dict_saver.py"),
    ("The launcher: torchrun", "12b", "torch/distributed/run.py"),
]

# The mastery rubric: what a student who finished the course can do, and the lesson whose
# Mastery check asks it (the capstone's asks the items that span lessons).
RUBRIC: list[tuple[str, str, int, str]] = [  # (item, lesson, question number, text the question holds)
    ("Show that a transpose shares its base's storage, and predict when `reshape` copies", "01", 1, "y = x.t()"),
    ("Reproduce the saved-tensor mutation error and explain its version counter", "03a", 1,
     "has been modified by an"),
    ("Compare SDPA and its gradients with the formula, within a stated bound", "07a", 1, "written by hand"),
    ("Tell a graph break, a guard failure and kernel compilation apart", "08b", 1, "Tell them apart"),
    ("Explain what FSDP2 keeps resident on each rank, and when it gathers", "11b", 1, "resident"),
    ("Verify that a restored optimizer's next update equals the uninterrupted one", "12a", 1, "Adam optimizer"),
    ("Place a failure in its layer, from the tensor to the launcher", "14", 1, "Place a failure in its layer"),
]


@functools.lru_cache(maxsize=None)
def stops(script: Path) -> tuple[Stop, ...]:
    """The literal list a lesson script passes to read_the_source (exactly one call)."""
    calls = [n for n in ast.walk(ast.parse(script.read_text(encoding="utf-8")))
             if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == "read_the_source"]
    if len(calls) != 1:
        raise ValueError(f"{script.name}: {len(calls)} calls of read_the_source (one expected)")
    return tuple(tuple(stop) for stop in ast.literal_eval(calls[0].args[0]))


def stop_problem(stop: Stop) -> str | None:
    """Why a stop does not hold in the installed torch, or None."""
    if len(stop) != 3 or not all(isinstance(s, str) and s.strip() for s in stop):
        return f"{stop!r}: a stop is (path, text, what to look for), three non-empty strings"
    path, text, _ = stop
    if path.startswith(sourcemap.REPO):
        repo_path = path.removeprefix(sourcemap.REPO)
        if not REPO_PATH.fullmatch(repo_path):
            return f"{path}: a repository stop is a C++/CUDA file under aten/, c10/, torch/csrc/ or caffe2/"
        include = sourcemap.site_root() / "torch" / "include"
        if any((include / p).exists() for p in (repo_path, repo_path.removeprefix("aten/src/"))):
            return f"{path}: the wheel ships it under torch/include/: name that path instead"
        if compiled_in(repo_path) is False:
            return f"{path}: no library of the installed torch was built from it (a wrong path?)"
        return None
    try:
        sourcemap.find_line(path, text)
    except LookupError as error:
        return str(error)
    return None


def libraries() -> list[Path]:
    lib = sourcemap.site_root() / "torch" / "lib"
    return [p for p in lib.iterdir() if re.search(r"\.(so|dylib|dll)(\.\d+)*$", p.name)]


@functools.lru_cache(maxsize=None)
def compiled_in(repo_path: str) -> bool | None:
    """Whether the installed torch was built from ``repo_path``: its libraries' error messages
    carry the source file's path (``__FILE__``), so a file of the pinned release leaves it
    there. A check without the network: the links point at that release's tag. None when it
    cannot tell (a CUDA source in a build without CUDA libraries)."""
    names = [repo_path.encode(), repo_path.replace("/", "\\").encode()]  # Windows builds: backslashes
    for lib in libraries():
        with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as text:
            if any(text.find(name) >= 0 for name in names):
                return True
    cuda = any("cuda" in lib.name for lib in libraries())
    return None if repo_path.endswith((".cu", ".cuh")) and not cuda else False


@functools.lru_cache(maxsize=None)
def headings(script: Path) -> frozenset[str]:
    """The headings of a lesson script's markdown cells, without their section numbers."""
    found = set()
    for cell in read_cells(script):
        if cell.kind == "markdown":
            found |= {m[1] for line in cell.source.splitlines() if (m := HEADING.fullmatch(line))}
    return frozenset(found)


def section(script: Path, title: str) -> str:
    """The markdown of the cell headed `## title` (the whole cell); '' when there is none."""
    for cell in read_cells(script):
        if cell.kind == "markdown" and cell.source.splitlines()[:1] == [f"## {title}"]:
            return cell.source
    return ""


def closing_problems(lesson: Lesson) -> list[str]:
    """What is wrong with a lesson's closing cells: Summary, Going further (optional),
    References (optional here), Read the source, Mastery check, Exercises, in this order,
    each once, each a `## ` heading opening a markdown cell."""
    order = [c.source.splitlines()[0].removeprefix("## ") for c in read_cells(lesson.script)
             if c.kind == "markdown" and c.source.startswith("## ")]
    found = [title for title in order if title in CLOSING]
    expected = [title for title in CLOSING if title in found or title not in OPTIONAL]
    if found != expected:
        return [f"{lesson.folder}: closing cells {found}, expected {expected}"]
    return []


def answer_problems(lesson: Lesson, answer: str) -> list[str]:
    """Every answer names the cell that backs it, as *§ Heading* (or *NN § Heading* for another
    lesson's), and every heading it names exists."""
    refs = REFERENCE.findall(answer)
    if not refs:
        return [f"{lesson.folder}: an answer names no backing section (*§ Heading*): {answer[:60]!r}"]
    problems = []
    for number, title in refs:
        script = find(number).script if number else lesson.script
        if title.strip() not in headings(script):
            problems.append(f"{lesson.folder}: *{number} § {title}*: no such heading in {script.name}")
    return problems


def mastery_problems(lesson: Lesson) -> list[str]:
    """3 to 5 numbered questions, each followed by its answer in a collapsed block."""
    text = section(lesson.script, "Mastery check")
    answers = re.findall(r"<details><summary>Answer</summary>(.*?)</details>", text, re.S)
    questions = QUESTION.findall(text)
    if not 3 <= len(questions) <= 5 or len(answers) != len(questions):
        return [f"{lesson.folder}: Mastery check has {len(questions)} questions and "
                f"{len(answers)} answers (3 to 5, one collapsed answer each)"]
    return [p for answer in answers for p in answer_problems(lesson, answer)]


def question(lesson: Lesson, k: int) -> str:
    """The text of question k of a lesson's Mastery check (without its answer); '' if none."""
    parts = QUESTION.split(section(lesson.script, "Mastery check"))[1:]
    return parts[k - 1].split("<details>")[0] if 0 < k <= len(parts) else ""


def rubric_problems() -> list[str]:
    """Each rubric item is the question RUBRIC says it is."""
    return [f"rubric: question {k} of lesson {number} does not ask {item!r} (no {text!r} in it)"
            for item, number, k, text in RUBRIC if text not in " ".join(question(find(number), k).split())]


def stop_by_path(lesson: Lesson, path: str) -> Stop:
    for stop in stops(lesson.script):
        if stop[0] == path:
            return stop
    raise LookupError(f"{path} is on the reading path for lesson {lesson.number}, "
                      f"whose Read the source cell does not list it")


def link(lesson: Lesson) -> str:
    return f"[{lesson.number} {lesson.title}]({lesson.folder}/{lesson.script.name})"


def where(path: str, text: str) -> str:
    """A stop as READING.md shows it: the file (a link for a repository file) and the text."""
    if path.startswith(sourcemap.REPO):
        name = f"[`{path.removeprefix(sourcemap.REPO)}`]({sourcemap.link(path)})"
    else:
        name = f"`{path}`"
    return f"{name}, at `{text}`"


def render() -> str:
    """READING.md, from PATH, RUBRIC and the lessons' Read the source cells."""
    out = [HEADER]
    for i, (title, number, path) in enumerate(PATH, start=1):
        lesson = find(number)
        out.append(f"{i}. **{title}**: {where(*stop_by_path(lesson, path)[:2])} ({link(lesson)})")
    out += ["", "## Every lesson's stops", "", STOPS_INTRO, ""]
    for lesson in ready():
        out.append(f"### {link(lesson)}\n")
        out += [f"- {where(p, t)}: {look}" for p, t, look in stops(lesson.script)]
        out.append("")
    out += ["## The mastery rubric", "", RUBRIC_INTRO, ""]
    out += [f"- {item}: {link(find(number))}, *Mastery check*, question {k}" for item, number, k, _ in RUBRIC]
    return "\n".join(out) + "\n"


HEADER = """# Reading PyTorch's source

<!-- Generated by `make reading` (scripts/reading.py) from every lesson's Read the source
cell: edit those, not this file. -->

Every lesson ends with a *Read the source* cell that prints where, in the torch you installed,
the behaviour it showed is implemented: a path under your site-packages folder and a line
number (open it in your editor), or, for C++ the wheel does not ship, a link at the release's
tag. The tests check every path and every named text against the pinned torch, so a stop that
moves in a new release fails the suite (and `make drift` reports it).

## The path

Follow one small operation from the Python call down to the kernel, back up through
autograd, then out into compilation and the distributed layers. Read each stop after the
lesson named beside it, with that lesson's notebook open.
"""

STOPS_INTRO = """What to look for at each stop, lesson by lesson: the path above in order, and the
stops beside it. The lesson's cell prints the same list with the line numbers of your install."""

RUBRIC_INTRO = """What you can do after the course. Each item is a question of the named lesson's
*Mastery check*, answered there from a cell the lesson ran."""


def problems() -> list[str]:
    """Every broken stop, every lesson's closing-cell problems, and a stale READING.md."""
    found = []
    for lesson in ready():
        found += [f"{lesson.folder}: {p}" for stop in stops(lesson.script) if (p := stop_problem(stop))]
        found += closing_problems(lesson) + mastery_problems(lesson)
    found += rubric_problems()
    if not found and (not READING.exists() or READING.read_text() != render()):
        found.append("lessons/READING.md is stale: run `make reading`")
    return found


def pinned_torch() -> str:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(p.split("==")[1] for p in pins if p.startswith("torch=="))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.check:
        found = problems()
        print("\n".join(found) or "reading path and closing cells: ok")
        return 1 if found else 0
    READING.write_text(render())
    print(f"wrote {READING.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The size and the voice of a lesson's prose, and the form of its References.

    python -m scripts.prose            # every ready lesson: words, machinery phrases, references
    python -m scripts.prose 03a        # one lesson, with each problem (a phrase: its cell and text)

A lesson's *main path* is its markdown from the opening cell through the Summary cell, fenced
blocks (Output blocks, a shell command) left out: at most WORDS_MAIN words, about 45 minutes
of reading beside running the cells. An optional ``## Going further`` cell after the Summary
is counted on its own (at most WORDS_GOING_FURTHER). The closing cells after it (References,
Read the source, Mastery check, Exercises) are not counted.

Teaching cells speak to a student. MACHINERY lists the phrases that talk about how the course
checks itself instead (its tests, its `make` targets other than `make lesson` and
`make exercises`, the machines it was built on); ALLOWED names the few lines where such a
phrase is what the student needs, each with its reason.

References (the ``## References`` cell) are links of two kinds: the PyTorch documentation at
the pinned release (``https://docs.pytorch.org/docs/X.Y/...``) whose page name resolves to an
object in the installed torch (``generated/torch.Tensor.view.html``; ``library.html`` for the
module torch.library, ``checkpoint.html`` for torch.utils.checkpoint),
and papers by arXiv ID (``https://arxiv.org/abs/2205.14135``).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from scripts.checker import read_cells
from scripts.manifest import ROOT, Lesson, find, ready
from scripts.reading import CLOSING, section

WORDS_MAIN = 3600
WORDS_GOING_FURTHER = 1200
WORD = re.compile(r"\S*\w\S*")  # a token with a letter or digit in it: not `#`, `-` or `·`
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)

MACHINERY = re.compile(
    r"`make (?!lesson\b|exercises\b)[a-z-]+"  # a course target: `make test`, `make outputs`
    r"|\b(?:the|this lesson's|these|its|a|exercise) tests?\b(?! of\b)|\bchecked by\b|\bthe course fails\b"
    r"|course's (?:own )?(?:machines?|tests?|CI)\b|\bthis machine\b|machine (?:this|the) lesson was written on"
    r"|\bwritten without a GPU\b|\bno GPU was available\b|\bportability gate\b|\bsimulated CPUs?\b",
    re.I,
)
# (lesson number, text the line holds): a phrase that belongs there, and why
ALLOWED: dict[tuple[str, str], str] = {}


def pinned_release() -> str:
    """"2.13" from pyproject.toml's torch pin: the documentation the References link."""
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    version = next(p.split("==")[1] for p in pins if p.startswith("torch=="))
    return ".".join(version.split(".")[:2])


def heading(markdown: str) -> str:
    first = markdown.splitlines()[:1]
    return first[0].removeprefix("## ").strip() if first and first[0].startswith("## ") else ""


def prose(markdown: str) -> str:
    """The markdown a student reads as prose: fenced blocks left out."""
    return FENCE.sub("", markdown)


@dataclass
class Counts:
    main: int  # words from the opening cell through the Summary cell
    going_further: int  # words of the Going further cell (0: none)


def words(script: Path) -> Counts:
    main = going = 0
    part = "main"
    for cell in read_cells(script):
        if cell.kind != "markdown":
            continue
        title = heading(cell.source)
        if title == "Going further":
            part = "going"
        elif title in CLOSING[2:]:  # References and the cells after it
            part = "closing"
        n = len(WORD.findall(prose(cell.source)))
        if part == "main":
            main += n
        elif part == "going":
            going += n
        if title == "Summary":
            part = "after summary"  # only a Going further cell counts from here
    return Counts(main, going)


def teaching_cells(script: Path):
    """The markdown cells a student reads as the lesson: all but Mastery check and Exercises
    (their questions may name a test, as an exercise's checker does)."""
    for cell in read_cells(script):
        if cell.kind == "markdown" and heading(cell.source) not in ("Mastery check", "Exercises"):
            yield cell


def machinery(lesson: Lesson) -> list[str]:
    """'cell N: «phrase» in: ...text around it...' for each machinery phrase outside ALLOWED.
    A cell's prose is searched as one line, so that a phrase broken across lines is found."""
    found = []
    for cell in teaching_cells(lesson.script):
        text = " ".join(" ".join(line.split()) for line in prose(cell.source).splitlines())
        excused = [range(i, i + len(allowed)) for n, allowed in ALLOWED if n == lesson.number
                   for i in (j.start() for j in re.finditer(re.escape(allowed), text))]
        for m in MACHINERY.finditer(text):
            if not any(m.start() in span and m.end() - 1 in span for span in excused):
                around = text[max(m.start() - 60, 0):m.end() + 60]
                found.append(f"cell {cell.number}: «{m[0]}» in: ...{around}...")
    return found


LINK = re.compile(r"\[([^\]]+)\]\((\S+?)\)")
DOCS = re.compile(r"https://docs\.pytorch\.org/docs/(\d+\.\d+)/(?:generated/)?([\w.]+)\.html(?:#[\w.-]+)?")
ARXIV = re.compile(r"https://arxiv\.org/abs/\d{4}\.\d{4,5}")


def resolves(dotted: str) -> bool:
    """Whether `torch.a.b.c` names a module or an attribute reachable from one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def module_pages(page: str) -> tuple[str, ...]:
    """The objects a page name may document: itself (``torch.Tensor.view``), a module of
    torch (``library`` -> torch.library) or of torch.utils (``checkpoint`` ->
    torch.utils.checkpoint, ``data`` -> torch.utils.data)."""
    if page.startswith("torch."):
        return (page,)
    # never the bare name: "data" would import the repository's own data/ folder
    return (f"torch.{page}", f"torch.utils.{page}")


def reference_problems(markdown: str, release: str) -> list[str]:
    """What is wrong with a References cell: every list item holds a link, every link is the
    pinned release's documentation of an object the installed torch has, or an arXiv paper."""
    problems = []
    items = [line for line in markdown.splitlines() if line.lstrip().startswith("- ")]
    if not items:
        return ["References lists nothing (one `- [title](link)` per line)"]
    for item in items:
        links = LINK.findall(item)
        if not links:
            problems.append(f"no link in: {item.strip()}")
        for _, url in links:
            docs = DOCS.fullmatch(url)
            if docs:
                if docs[1] != release:
                    problems.append(f"{url}: not the pinned release's documentation ({release})")
                elif not any(resolves(name) for name in module_pages(docs[2])):
                    problems.append(f"{url}: {docs[2]} is not an object in the installed torch")
            elif not ARXIV.fullmatch(url):
                problems.append(f"{url}: neither docs.pytorch.org/docs/{release}/<object>.html nor arxiv.org/abs/<id>")
    return problems


def references(lesson: Lesson) -> str:
    """The References cell's markdown ('' if none)."""
    return section(lesson.script, "References")


def problems(lesson: Lesson, release: str | None = None) -> list[str]:
    """Every rule of this module the lesson breaks, one line each ([]: none)."""
    release = release or pinned_release()
    counts, found = words(lesson.script), []
    if counts.main > WORDS_MAIN:
        found.append(f"main path: {counts.main} words, more than {WORDS_MAIN} (split it into parts, NNa_, NNb_)")
    if counts.going_further > WORDS_GOING_FURTHER:
        found.append(f"Going further: {counts.going_further} words, more than {WORDS_GOING_FURTHER}")
    found += machinery(lesson)
    refs = references(lesson)
    found += [f"References: {p}" for p in reference_problems(refs, release)] if refs else ["no References cell"]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="*", help="lesson numbers (default: every ready lesson)")
    args = parser.parse_args(argv)
    chosen = [find(n) for n in args.lessons] or ready()
    release, bad = pinned_release(), 0
    for lesson in chosen:
        counts, found = words(lesson.script), problems(lesson, release)
        bad += bool(found)
        print(f"{lesson.number} {lesson.title}: {counts.main} words (at most {WORDS_MAIN}), Going further "
              f"{counts.going_further} (at most {WORDS_GOING_FURTHER}): {len(found) or 'no'} problems")
        for problem in found if args.lessons else ():
            print(f"  {problem}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

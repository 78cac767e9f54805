"""Generate each lesson's notebook from its script, or check that none is stale.

    python -m scripts.notebooks           # write every lessons/NN_slug/slug.ipynb that changed
    python -m scripts.notebooks --check   # exit 1 naming each stale notebook or worker
    python -m scripts.notebooks 09 11a    # only these lessons

It also writes (or checks) the workers of multi-rank lessons from their ``#@worker`` cells
(``scripts/workers.py``), so `make notebooks` regenerates everything derived from a script.

Notebooks are committed without outputs, with cell ids numbered in order and no jupytext
metadata, so regenerating an unchanged script writes the same bytes (no git diff).

In the notebook, each expected block of an ``Output:`` cell is collapsed in a
``<details><summary>Expected output</summary>`` element, so that a student predicts before
seeing the answer (a notebook renders markdown before the cell above it runs); prose after
the block stays visible. The script keeps its plain form, and the checker takes the
expected blocks from the script.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat

from scripts import workers
from scripts.checker import fenced_blocks
from scripts.manifest import ROOT, find, lesson_scripts, shown

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
SUMMARIES = {None: "Expected output", "no-vector-isa": "Expected output on a CPU without vector instructions"}


def collapse_expected(markdown: str) -> str:
    """An Output: cell with each fenced ``text`` block inside a collapsed <details>."""
    lines = markdown.splitlines()
    if not lines or lines[0].strip() != "Output:":
        return markdown
    for condition, (start, end) in sorted(fenced_blocks(lines).items(), key=lambda b: -b[1][0]):
        summary = SUMMARIES.get(condition, f"Expected output when {condition}")
        # Blank lines around the fences (markdown inside an HTML block renders only so) and
        # around the element (an HTML block runs on to the next blank line).
        after = [""] if end + 1 < len(lines) and lines[end + 1].strip() else []
        before = [""] if lines[start - 2].strip() else []
        lines[end + 1 : end + 1] = ["", "</details>", *after]
        lines[start - 1 : start - 1] = [*before, f"<details><summary>{summary}</summary>", ""]
    return "\n".join(lines)


def build(script: Path) -> nbformat.NotebookNode:
    nb = jupytext.read(script, fmt="py:percent")
    nb.metadata = nbformat.from_dict({"kernelspec": KERNELSPEC, "language_info": {"name": "python"}})
    for i, cell in enumerate(nb.cells, start=1):
        cell.id = f"cell-{i:02d}"
        cell.metadata = nbformat.from_dict({})
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        else:
            cell.source = collapse_expected(cell.source)
    return nb


def render(script: Path) -> str:
    return nbformat.writes(build(script)) + "\n"


def notebook_path(script: Path) -> Path:
    return script.with_suffix(".ipynb")


def stale(scripts: list[Path]) -> list[Path]:
    """Notebooks missing or different from what their script generates."""
    out = []
    for script in scripts:
        nb = notebook_path(script)
        if not nb.exists() or nb.read_text() != render(script):
            out.append(nb)
    return out


def write(scripts: list[Path]) -> list[Path]:
    """Regenerate the notebooks of ``scripts``; return those whose bytes changed."""
    changed = []
    for script in scripts:
        nb, text = notebook_path(script), render(script)
        if not nb.exists() or nb.read_text() != text:
            nb.write_text(text)
            changed.append(nb)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale notebooks")
    parser.add_argument("numbers", nargs="*", help="lesson numbers (default: every lesson)")
    args = parser.parse_args(argv)
    scripts = [find(n).script for n in args.numbers] if args.numbers else lesson_scripts()
    numbers = ["--numbers", *args.numbers] if args.numbers else []
    if args.check:
        bad = stale(scripts)
        for nb in bad:
            print(f"stale notebook: {nb.relative_to(ROOT)} (regenerate with `make notebooks`)")
        return workers.main(["--check", *numbers]) or (1 if bad else 0)
    changed = write(scripts)
    for nb in changed:
        print(f"wrote {shown(nb)}")
    print(f"{len(changed)} of {len(scripts)} notebooks changed")
    return workers.main(numbers)


if __name__ == "__main__":
    sys.exit(main())

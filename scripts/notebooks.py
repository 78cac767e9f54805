"""Generate each lesson's notebook from its script, or check that none is stale.

    python -m scripts.notebooks           # write every lessons/NN_slug/slug.ipynb
    python -m scripts.notebooks --check   # exit 1 naming each stale notebook

Notebooks are committed without outputs, with cell ids numbered in order and no jupytext
metadata, so regenerating an unchanged script writes the same bytes (no git diff).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat

from scripts.manifest import ROOT, lesson_scripts

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def build(script: Path) -> nbformat.NotebookNode:
    nb = jupytext.read(script, fmt="py:percent")
    nb.metadata = nbformat.from_dict({"kernelspec": KERNELSPEC, "language_info": {"name": "python"}})
    for i, cell in enumerate(nb.cells, start=1):
        cell.id = f"cell-{i:02d}"
        cell.metadata = nbformat.from_dict({})
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale notebooks")
    args = parser.parse_args(argv)
    scripts = lesson_scripts()
    if args.check:
        bad = stale(scripts)
        for nb in bad:
            print(f"stale notebook: {nb.relative_to(ROOT)} (regenerate with `make notebooks`)")
        return 1 if bad else 0
    for script in scripts:
        notebook_path(script).write_text(render(script))
        print(f"wrote {notebook_path(script).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rewrite a lesson's Output blocks from what it prints now: ``make outputs N=NN``.

    python -m scripts.outputs 01                                  # lesson 01
    python -m scripts.outputs lessons/01_tensor_views/tensor_views.py   # a script (e.g. a copy)
    python -m scripts.outputs                                     # every ready lesson

For an intended change (a print's format, a PyTorch bump): the script runs as the checker
runs it; each code cell's printed lines replace the ``text`` block of the ``Output:`` cell
after it (the block that applies on this machine, when a cell has a ``when=`` alternative).
A documented line with a ``«placeholder»`` that still matches what was printed is kept as it
is; one that no longer matches stops everything, naming the cell and the line: edit it by
hand (keeping its placeholder) and run again. Nothing is created: a printing cell without an
Output block is an error, as it is for the checker. Only the comment lines of the changed
blocks are edited in the .py file (prose stays byte-identical), then the lesson's notebook is
regenerated. If the script raises, or anything is refused, no file changes.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jupytext

from scripts import checker, notebooks
from scripts.manifest import ROOT, UnknownLesson, find, ready, tool_env


class Refused(Exception):
    """The lesson's blocks cannot be rewritten safely; the message says where and why."""


@dataclass
class Edit:
    code: int  # number of the code cell that printed
    cell: checker.Cell  # the Output: cell after it
    span: tuple[int, int]  # lines of cell.source between the applicable block's fences
    old: list[str]
    new: list[str]


def has_placeholder(line: str) -> bool:
    return checker.PLACEHOLDER.search(line) is not None


def align(documented: list[str], printed: list[str]) -> list[tuple[int, int]]:
    """The longest run of (documented, printed) index pairs, in order, whose lines match."""
    n, m = len(documented), len(printed)
    best = [[0] * (m + 1) for _ in range(n + 1)]  # best[i][j]: pairs in documented[i:], printed[j:]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            hit = checker.line_matches(documented[i], printed[j])
            best[i][j] = max(best[i + 1][j], best[i][j + 1], best[i + 1][j + 1] + 1 if hit else 0)
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if checker.line_matches(documented[i], printed[j]) and best[i][j] == best[i + 1][j + 1] + 1:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif best[i + 1][j] >= best[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


def new_block(code: int, documented: list[str], printed: list[str]) -> tuple[list[str], list[str]]:
    """The block's new lines (placeholder lines kept where they match) and the refusals."""
    pairs = align(documented, printed)
    matched = dict(pairs)
    refusals = [
        f"cell {code}, line {i + 1} of its Output block: {line!r} has a placeholder and no longer "
        f"matches what the cell printed ({printed[i] if i < len(printed) else 'nothing'!r} at that "
        f"line): edit that line by hand, keeping its placeholder, then run again"
        for i, line in enumerate(documented) if has_placeholder(line) and i not in matched
    ]
    kept = {j: documented[i] for i, j in pairs if has_placeholder(documented[i])}
    return [kept.get(j, line) for j, line in enumerate(printed)], refusals


def plan(run: checker.LessonRun) -> list[Edit]:
    """One Edit per Output block that the run documents differently; Refused on any problem."""
    name, cells, edits, problems = checker.lesson_name(run.source), run.cells, [], []
    for i, cell in enumerate(cells):
        if cell.kind != "code" or cell.number not in run.printed:
            continue
        printed = [line.rstrip() for line in run.printed[cell.number].splitlines()]
        nxt = cells[i + 1] if i + 1 < len(cells) and cells[i + 1].kind == "markdown" else None
        span = checker.applicable_block(nxt.source) if nxt else None
        if not printed:
            if span is not None:
                problems.append(f"cell {nxt.number}: an Output: block after cell {cell.number}, "
                                f"which printed nothing: remove the block")
        elif span is None:
            problems.append(f"cell {cell.number} prints but no Output: block follows it: add a "
                            f"markdown cell `Output:` with an empty ```text block, then run again")
        elif span == (0, 0):
            problems.append(f"cell {nxt.number}: its Output: cell has no well-formed ```text block")
        else:
            old = checker.documented_block(nxt.source)
            new, refusals = new_block(cell.number, old, printed)
            problems += refusals
            if new != old:
                edits.append(Edit(cell.number, nxt, span, old, new))
    if problems:
        raise Refused("\n".join(f"{name}, {p}" for p in problems))
    return edits


def uncomment(line: str) -> str | None:
    """The markdown text of a percent-format comment line, or None for another line."""
    if line == "#":
        return ""
    return line[2:] if line.startswith("# ") else None


def comment(line: str) -> str:
    return f"# {line}" if line else "#"


def rewrite(text: str, cells: list[checker.Cell], edits: list[Edit]) -> str:
    """``text`` with only the comment lines of each edited block replaced."""
    lines = text.splitlines(keepends=True)
    headers = [i for i, line in enumerate(lines) if line.startswith("# %%")]
    if len(headers) != len(cells):
        raise Refused(f"found {len(headers)} '# %%' cell headers for {len(cells)} cells")
    for edit in sorted(edits, key=lambda e: -e.cell.number):  # bottom up: indices stay valid
        source = edit.cell.source.splitlines()
        start = headers[edit.cell.number - 1] + 1
        body = [line.rstrip("\r\n") for line in lines[start : start + len(source)]]
        if [uncomment(line) for line in body] != source:
            raise Refused(f"cell {edit.cell.number}: its comment lines are not its markdown")
        end = "\r\n" if lines[start].endswith("\r\n") else "\n"
        lines[start + edit.span[0] : start + edit.span[1]] = [comment(x) + end for x in edit.new]
    return "".join(lines)


def verify(text: str, cells: list[checker.Cell], edits: list[Edit]) -> None:
    """The rewritten script reads back as the same cells, with the new blocks."""
    new_cells = jupytext.reads(text, fmt="py:percent").cells
    edited = {e.cell.number: e for e in edits}
    ok = len(new_cells) == len(cells)
    for cell, new in zip(cells, new_cells):
        if cell.number in edited:
            ok = ok and checker.documented_block(new.source) == edited[cell.number].new
        else:
            ok = ok and new.source == cell.source
    if not ok:
        raise Refused("the rewritten script does not read back as intended (a printed line that "
                      "looks like a cell header or a fence?)")


def summary(edit: Edit) -> str:
    changed = added = removed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=edit.old, b=edit.new).get_opcodes():
        if tag != "equal":
            changed += min(i2 - i1, j2 - j1)
            added += max(0, (j2 - j1) - (i2 - i1))
            removed += max(0, (i2 - i1) - (j2 - j1))
    words = [f"{n} line{'s' * (n != 1)} {what}" for n, what in
             ((changed, "changed"), (added, "added"), (removed, "removed")) if n]
    return f"  cell {edit.code}: " + ", ".join(words)


def update(script: Path) -> int:
    """Rewrite one lesson's blocks; 0 when done (or nothing to do), 1 when refused."""
    script = script.resolve()
    name = checker.lesson_name(script)
    run = checker.run_script(script)
    if run.errors:
        print("\n".join(run.errors) + f"\n{name}: the script raised; nothing changed")
        return 1
    try:
        edits = plan(run)
        text = script.read_bytes().decode()
        new_text = rewrite(text, run.cells, edits)
        verify(new_text, run.cells, edits)
    except Refused as e:
        print(f"{e}\n{name}: refused; nothing changed")
        return 1
    blocks = sum(1 for c in run.cells if c.kind == "markdown" and checker.documented_block(c.source) is not None)
    if edits:
        script.write_bytes(new_text.encode())
        print(f"{name}: {len(edits)} of {blocks} Output blocks updated")
        print("\n".join(summary(e) for e in edits))
    else:
        print(f"{name}: all {blocks} Output blocks match what it printed")
    written = notebooks.write([script])  # also a notebook left stale by an earlier edit
    for nb in written:
        print(f"  regenerated {notebooks.shown(nb)}")
    print("Review the change with `git diff`." if edits or written else "Nothing changed.")
    return 0


def target(arg: str) -> Path:
    """A lesson number ("01") or the path of a lesson script."""
    path = Path(arg)
    return path if path.suffix == ".py" and path.is_file() else find(arg).script


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tool_env()["TORCHINDUCTOR_CACHE_DIR"])
    if argv and argv[0].strip():
        try:
            return update(target(argv[0]))
        except UnknownLesson as e:
            print(e, file=sys.stderr)
            return 2
    lessons, codes = ready(), []  # each in a process of its own: lessons set global state
    for lesson in lessons:
        cmd = [sys.executable, "-m", "scripts.outputs", str(lesson.script)]
        codes.append(subprocess.run(cmd, cwd=ROOT).returncode)
    failed = [lesson.number for lesson, code in zip(lessons, codes) if code]
    print(f"\n{len(codes) - len(failed)} of {len(codes)} lessons done" +
          (f"; refused or failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

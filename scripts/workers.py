"""Write each multi-rank lesson's worker from the lesson's own code cells, and check them.

    python -m scripts.workers           # write every lessons/<folder>/worker.py that changed
    python -m scripts.workers --check   # exit 1 naming each stale worker
    python -m scripts.workers --numbers 09 11a   # only these lessons

`make notebooks` runs both this and the notebook generator. A code cell of a lesson script
whose first line is ``#@worker`` is code the ranks run: the student reads it, executed (it
defines functions and constants, it calls nothing), just before the launch or the output it
explains. The generator copies those cells, in the lesson's order and without the marker
line, into ``worker.py`` beside the lesson (``#@worker train.py`` sends a cell to
``train.py`` instead), below a generated docstring and the line that puts ``lessons/`` on
``sys.path`` for the kit, and ends the file with ``if __name__ == "__main__": main()``. So
the cells must define ``main()`` (usually ``serve({"part": function, ...})``). A worker is
never edited by hand: like a stale notebook, a stale worker fails the tests
(``tests/test_course.py``), and so does a distributed call a worker makes that the lesson's
code cells do not (``distributed_calls``, compared by AST, so printed source and comments do
not count).

This is d2l's ``#@save`` reversed: there the book's cells are saved into a library the next
chapters import; here the lesson's cells are written into the script torchrun launches.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import jupytext

from scripts.manifest import ROOT, Lesson, find, ready

MARKER = "#@worker"
DEFAULT = "worker.py"
# Names that resolve to these modules are distributed calls (the AST comparison).
DISTRIBUTED = "torch.distributed"
# In the lesson, a #@worker cell of imports that follows other code needs an E402
# suppression comment; in the worker it follows only the kit's sys.path line, where ruff
# would call that comment unused (RUF100): the generator drops it.
NOQA_E402 = re.compile(r"  # noqa: E402\b[^\n]*$", re.M)
# What a #@worker cell may hold at its top level: executing it in the notebook defines, runs nothing.
TOP_LEVEL = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign, ast.Expr)


def cells(script: Path) -> list[tuple[str, str]]:
    """(kind, source) of each cell of a jupytext percent script."""
    nb = jupytext.read(script, fmt="py:percent")
    return [(cell.cell_type, cell.source) for cell in nb.cells]


def worker_cells(script: Path) -> dict[str, list[str]]:
    """{file name: [cell source without its marker line, ...]} of the script's #@worker cells."""
    out: dict[str, list[str]] = {}
    for kind, source in cells(script):
        first, _, rest = source.partition("\n")
        if kind != "code" or not first.startswith(MARKER):
            continue
        name = first[len(MARKER):].strip() or DEFAULT
        if not re.fullmatch(r"[a-z_][a-z0-9_]*\.py", name):
            raise ValueError(f"{script.name}: `{first}` must name a module file, like `{MARKER} train.py`")
        out.setdefault(name, []).append(NOQA_E402.sub("", rest.strip("\n")))
    return out


def parts(body: str) -> list[str]:
    """The part names of the ``serve({...})`` call in ``main()``, for the docstring."""
    for node in ast.walk(ast.parse(body)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "serve" and node.args:
            keys = getattr(node.args[0], "keys", [])
            return [k.value for k in keys if isinstance(k, ast.Constant)]
    return []


def render(lesson: Lesson, name: str, sources: list[str]) -> str:
    """The text of one generated worker file."""
    body = "\n\n\n".join(sources)
    tree = ast.parse(body)
    for node in tree.body:
        if not isinstance(node, TOP_LEVEL) or (isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant)):
            raise ValueError(f"{lesson.script.name}: a {MARKER} cell only defines (imports, functions, classes, "
                             f"constants); line {node.lineno} of {name}'s cells runs something")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
        raise ValueError(f"{lesson.script.name}: the {MARKER} cells of {name} must define main()")
    found = parts(body)
    run = f"torchrun --standalone --nproc-per-node={max(lesson.ranks, 2)} lessons/{lesson.folder}/{name}"
    if found:
        usage = f"    {run} PART\n\nwhere PART is one of: {', '.join(found)}."
        if "add_args" in body:
            usage += "\nSome parts take more arguments: run it with --help."
    else:
        usage = (f"    python lessons/{lesson.folder}/{name} --help\n\n"
                 "prints its arguments and the torchrun commands that run it.")
    header = (
        f'"""The code each rank runs in lesson {lesson.number}, {lesson.title}.\n\n'
        f"Generated by `make notebooks` from the cells of {lesson.script.name} that start with\n"
        f"`{MARKER}{'' if name == DEFAULT else ' ' + name}`: edit them there, not here. "
        f"Run it by hand from the repository root:\n\n{usage}\n"
        f'"""\n\n'
        "import sys\n"
        "from pathlib import Path\n\n"
        "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lessons/: the course's kit\n"
    )
    return f'{header}\n\n{body}\n\n\nif __name__ == "__main__":\n    main()\n'


def generated(lesson: Lesson) -> dict[Path, str]:
    """{path: text} of every file the lesson's #@worker cells generate."""
    return {lesson.dir / name: render(lesson, name, sources)
            for name, sources in worker_cells(lesson.script).items()}


def stale(lessons: list[Lesson]) -> list[Path]:
    return [path for lesson in lessons for path, text in generated(lesson).items()
            if not path.exists() or path.read_text() != text]


def write(lessons: list[Lesson]) -> list[Path]:
    changed = []
    for lesson in lessons:
        for path, text in generated(lesson).items():
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                changed.append(path)
    return changed


def aliases(tree: ast.AST) -> dict[str, str]:
    """{local name: dotted module path} from a module's imports."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    names[a.asname] = a.name
                else:
                    names[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def distributed_calls(code: str) -> set[str]:
    """The fully qualified torch.distributed names that ``code`` calls (functions, classes:
    ``torch.distributed.all_reduce``, ``torch.distributed.fsdp.fully_shard``, ...), resolved
    through its imports. Calls of methods on objects (``d.redistribute()``) cannot be
    resolved without running the code and are not counted."""
    tree = ast.parse(code)
    names = aliases(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (name := dotted(node.func)):
            head, _, tail = name.partition(".")
            full = ".".join(filter(None, [names.get(head, head), tail]))
            if full == DISTRIBUTED or full.startswith(DISTRIBUTED + "."):
                found.add(full)
    return found


def lesson_code(script: Path) -> str:
    """The lesson's code cells, as one module (IPython magics dropped)."""
    return "\n\n".join(source for kind, source in cells(script)
                       if kind == "code" and not source.lstrip().startswith(("%", "!")))


def headings(code: str) -> list[str | None]:
    """The names passed to ``heading(...)``: a string, or None where it is not a literal."""
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "heading" and node.args:
            arg = node.args[0]
            out.append(arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None)
    return out


def shown_sections(code: str) -> set[str]:
    """Section names the lesson's code shows: the literal second argument of show() / section()."""
    out = set()
    for node in ast.walk(ast.parse(code)):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("show", "section")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            out.add(node.args[1].value)
    return out


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale workers")
    parser.add_argument("--numbers", nargs="*", default=[], help="lesson numbers (default: every lesson)")
    args = parser.parse_args(argv)
    lessons = [find(n) for n in args.numbers] if args.numbers else ready()
    if args.check:
        bad = stale(lessons)
        for path in bad:
            print(f"stale worker: {shown(path)} (regenerate with `make notebooks`)")
        return 1 if bad else 0
    changed = write(lessons)
    for path in changed:
        print(f"wrote {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

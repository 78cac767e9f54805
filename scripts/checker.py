"""The documented-output checker: what a lesson prints must be what its text says it prints.

A lesson is a jupytext percent script. Each code cell that prints is followed by a markdown
cell that starts with the line ``Output:`` and holds one fenced ``text`` block with the exact
lines. A placeholder ``«name»`` stands for a volatile part of a line (a timing, an address)
and matches any non-empty text; the rest of the line is compared exactly (trailing spaces
are ignored).

Two ways to run a lesson, both checked against the same blocks:
- ``run_script``: the code cells, one by one, as ``__main__`` with ``__file__`` set and the
  repository root as working directory; stdout is captured per cell and warnings recorded.
- ``run_notebook``: the notebook generated from the script, top to bottom in a fresh
  ``python3`` kernel (nbclient), with the lesson folder as working directory.

Either run also fails on PyTorch's own diagnostic lines that scripts/quiet.py keeps out of a
student's view (libkineto's ``USDT: ... profiler_start``, the CUDA build's no-GPU lines):
in the notebook's stderr, on the script's file descriptor 2 and torch's log records, and in
the stderr of every rank of a multi-rank launch the script keeps (the kit's ``Run``).

Command line: ``python -m scripts.checker lessons/01_tensor_views/tensor_views.py [--notebook]``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import logging
import os
import re
import sys
import tempfile
import threading
import traceback
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from scripts import quiet

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = re.compile(r"«([^»]*)»")
NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
# Each placeholder matches one narrow kind of text, so the literal text around it still
# counts: `(«number»)` does not match `5)`. Add a name here when a lesson needs a new kind.
PLACEHOLDERS = {
    "time": NUMBER,  # a duration, printed with fixed precision
    "rate": NUMBER,  # FLOP/s, bytes/s, it/s
    "ratio": NUMBER,  # a ratio of two timings
    "number": NUMBER,  # any other machine-dependent number
    "address": r"0x[0-9a-fA-F]+",
    "pid": r"\d+",
    "version": r"\d+\.\d+\.\d+",  # the installed torch's release (`make drift` runs another)
    "line": r"\d+",  # a line number in the installed torch's files (lessons/sourcemap.py)
    "path": r"\S+",  # a file path outside the repository (a temporary folder)
    "folder": r".+",  # an install folder, which may hold spaces (site-packages on Windows, macOS)
    "isa": r"[A-Z][A-Z0-9_]*(?: [A-Z0-9_]+)?",  # torch.backends.cpu.get_cpu_capability(): AVX512, Z VECTOR
    "name": r"[A-Za-z_][\w.+-]*",  # one machine-dependent word: a clock source, a CPU flag
}
GATED_WARNINGS = (DeprecationWarning, FutureWarning)
DIFFERS = "printed output differs from its documented block"
NOISE = "printed PyTorch's diagnostic lines that scripts/quiet.py keeps out of a student's view"


class LessonError(AssertionError):
    """A lesson broke the contract; the message names the lesson and the cell."""


@dataclass
class Cell:
    number: int  # 1-based position among all cells, as a student counts them in the notebook
    kind: str  # "code" or "markdown"
    source: str


def read_cells(script: Path) -> list[Cell]:
    try:
        import jupytext  # imported here: the GPU machine's Python has no jupytext
    except ImportError:  # there, the lessons' subset of the format is read by hand
        return read_percent(script.read_text(encoding="utf-8"), str(script))
    nb = jupytext.read(script, fmt="py:percent")
    return [Cell(i + 1, c.cell_type, c.source) for i, c in enumerate(nb.cells)]


MARKER = re.compile(r"\s*#\s*%%(?:\s+(\[(?:markdown|md)\]))?\s*")
LOOKS_LIKE_MARKER = re.compile(r"\s*#\s*(%%|<codecell>|In\[)")
# A commented line in a code cell that jupytext would uncomment as an IPython magic or shell
# command (a superset of its rules: `# %time`, `# !ls`, `# cd x`, `# why?`, `# x = %y`).
MAGIC_LIKE = re.compile(r"\s*#[# ]*(?:[%!?]|[A-Za-z_]\w*\s*=\s*[%!]|(?:cat|cd|cp|mv|rm|rmdir|mkdir"
                        r"|copy|ddir|echo|ls|ldir|ren)(?:\s|$)|\S*\?\s*$)")


def read_percent(text: str, name: str = "<script>") -> list[Cell]:
    """The cells jupytext reads from a percent script, for the subset the lessons use: `# %%` and
    `# %% [markdown]` markers (the first on line 1), markdown lines commented with `#`, and
    jupytext's trimming of one or two blank lines before a marker. Anything else (a header, cell
    options, a line jupytext would uncomment as a magic) raises ValueError rather than differ.
    tests/test_gpu_report.py proves it equals jupytext on every lesson script."""
    lines, starts = text.splitlines(), []
    for i, line in enumerate(lines):
        if m := MARKER.fullmatch(line):
            starts.append((i, "markdown" if m.group(1) else "code"))
        elif LOOKS_LIKE_MARKER.match(line):
            raise ValueError(f"{name}:{i + 1}: a cell marker only jupytext reads: {line!r}")
    if lines and (not starts or starts[0][0] != 0):
        raise ValueError(f"{name}: line 1 is not a `# %%` marker (read it with jupytext)")
    cells = []
    for n, (i, kind) in enumerate(starts):
        seg = lines[i : starts[n + 1][0] if n + 1 < len(starts) else len(lines)]
        body = seg[1 : len(seg) - blank_tail(seg)]
        if kind == "markdown":
            body = [line[2:] if line.startswith("# ") else line[1:] if line.startswith("#") else line for line in body]
        for j, line in enumerate(body if kind == "code" else []):
            if MAGIC_LIKE.match(line):
                raise ValueError(f"{name}:{i + j + 2}: jupytext would read this line as a magic: {line!r}")
        cells.append(Cell(n + 1, kind, "\n".join(body)))
    return cells


def blank_tail(seg: list[str]) -> int:
    """How many blank lines at the end of a cell (marker line first) jupytext leaves out: two
    when exactly the last two are blank, else one when the last one is."""
    blank = [not line.strip() for line in seg]
    if len(seg) >= 3 and blank[-2] and blank[-1] and not blank[-3]:
        return 2
    return int(len(seg) > 1 and blank[-1])


def cpu_capability() -> str:
    """The vector ISA PyTorch's CPU kernels use here: "AVX512", "AVX2", "DEFAULT" (none), ..."""
    import torch  # imported here: the checker's text functions need no torch

    return torch.backends.cpu.get_cpu_capability()


# Conditions an alternative Output block may name ("```text when=NAME"): a cell that cannot do
# its work on some machines prints a skip line with its reason there, and documents it so.
def cpu_flex_attention_unsupported() -> bool:
    """Whether compiled FlexAttention refuses this CPU, by PyTorch's own check (2.13.0: it
    needs AVX2 and not macOS, so Apple silicon, Intel Macs and Arm Linux are refused too)."""
    try:
        from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported
    except ImportError:  # moved in another torch: fall back to the rule it encoded
        return cpu_capability() not in ("AVX2", "AVX512") or sys.platform == "darwin"
    return not check_cpu_supported()


CONDITIONS = {
    "no-vector-isa": lambda: cpu_capability() == "DEFAULT",
    "no-cpu-flex-attention": cpu_flex_attention_unsupported,
}
FENCE = re.compile(r"```text(?:\s+when=(\S+))?\s*$")


def fenced_blocks(lines: list[str]) -> dict[str | None, tuple[int, int]]:
    """Each ```text block of a cell: condition (None for the plain block) -> (start, end) of
    the lines between its fences. A block without a closing fence is left out."""
    blocks, i = {}, 1
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if m is None:
            i += 1
            continue
        try:
            end = lines.index("```", i + 1)
        except ValueError:
            break
        blocks.setdefault(m.group(1), (i + 1, end))
        i = end + 1
    return blocks


def applicable_block(markdown: str) -> tuple[int, int] | None:
    """Where, in ``markdown.splitlines()``, the Output block that applies on this machine lies:
    (start, end) of the lines between its fences. None for a cell that is not an Output: cell;
    (0, 0) for an Output: cell without a well-formed plain block."""
    lines = markdown.splitlines()
    if not lines or lines[0].strip() != "Output:":
        return None
    blocks = fenced_blocks(lines)
    for condition, span in blocks.items():
        if condition is not None and condition in CONDITIONS and CONDITIONS[condition]():
            return span
    return blocks.get(None, (0, 0))


def unknown_conditions(markdown: str) -> list[str]:
    lines = markdown.splitlines()
    return sorted(c for c in fenced_blocks(lines) if c is not None and c not in CONDITIONS)


def documented_block(markdown: str) -> list[str] | None:
    """The lines of the ``text`` block of an ``Output:`` cell that applies on this machine,
    or None for any other cell."""
    span = applicable_block(markdown)
    if span is None:
        return None
    return [line.rstrip() for line in markdown.splitlines()[span[0] : span[1]]]


def line_pattern(expected: str) -> str:
    """A regular expression for a documented line; unknown placeholder names are literal."""
    pattern, pos = [], 0
    for m in PLACEHOLDER.finditer(expected):
        pattern.append(re.escape(expected[pos : m.start()]))
        kind = PLACEHOLDERS.get(m.group(1))
        pattern.append(f"(?:{kind})" if kind else re.escape(m.group(0)))
        pos = m.end()
    pattern.append(re.escape(expected[pos:]))
    return "".join(pattern)


def line_matches(expected: str, actual: str) -> bool:
    return re.fullmatch(line_pattern(expected), actual) is not None


def unknown_placeholders(cells: list[Cell]) -> list[str]:
    names = {m.group(1) for c in cells if c.kind == "markdown" for m in PLACEHOLDER.finditer(c.source)}
    return sorted(names - PLACEHOLDERS.keys())


def diff(expected: list[str], actual: list[str], cell: int) -> str:
    """A unified diff in which lines matching their placeholder pattern show as equal."""
    shown = [
        e if i < len(expected) and line_matches(e := expected[i], a) else a
        for i, a in enumerate(actual)
    ]
    return "\n".join(
        difflib.unified_diff(
            expected, shown, f"documented (cell {cell + 1})", f"printed (cell {cell})", lineterm=""
        )
    )


def misplaced_block(lesson: str, cell: Cell, prev: Cell | None, printed: dict[int, str]) -> str | None:
    """Why this markdown cell's Output: block documents nothing, or None."""
    if documented_block(cell.source) is None:
        return None
    if prev is None or prev.kind != "code":
        return f"{lesson}, cell {cell.number}: an Output: block that follows no code cell"
    if prev.number in printed and not printed[prev.number]:
        return f"{lesson}, cell {cell.number}: an Output: block after a cell that printed nothing"
    return None


def check_outputs(lesson: str, cells: list[Cell], printed: dict[int, str]) -> list[str]:
    """Compare what each code cell printed with the block documented right after it.

    ``printed`` holds an entry for every code cell that ran; cells after a failure are skipped.
    """
    problems = []
    for i, cell in enumerate(cells):
        prev = cells[i - 1] if i > 0 else None
        nxt = cells[i + 1] if i + 1 < len(cells) else None
        if cell.kind == "markdown":
            if why := misplaced_block(lesson, cell, prev, printed):
                problems.append(why)
            continue
        actual = [line.rstrip() for line in printed.get(cell.number, "").splitlines()]
        block = documented_block(nxt.source) if nxt and nxt.kind == "markdown" else None
        if not actual:
            continue
        if block is None:
            problems.append(f"{lesson}, cell {cell.number}: prints but no Output: block follows it\n"
                            + "\n".join(actual))
        elif len(block) != len(actual) or not all(map(line_matches, block, actual)):
            problems.append(f"{lesson}, cell {cell.number}: {DIFFERS}\n" + diff(block, actual, cell.number))
    return problems


def update_hint(lesson: str) -> str:
    """What to do when the new output is the intended one."""
    m = re.search(r"lessons/(\d\d[a-z]?)_", lesson.replace(os.sep, "/"))
    target = f"make outputs N={m.group(1)}" if m else "make outputs"
    return f"{lesson}: if the change is intended, run `{target}` and review `git diff`"


def lesson_name(script: Path) -> str:
    try:
        return str(script.resolve().relative_to(ROOT))
    except ValueError:
        return str(script)


@dataclass
class LessonRun:
    """One run of a lesson (script or notebook): what each cell printed, and what went wrong."""

    source: Path  # the .py script or the .ipynb notebook that ran
    cells: list[Cell]
    printed: dict[int, str] = field(default_factory=dict)  # cell number -> stdout
    ns: dict = field(default_factory=dict)  # the script's globals after the run (scripts only)
    gated_warnings: list[str] = field(default_factory=list)  # "Category: message"
    errors: list[str] = field(default_factory=list)
    allowed_warnings: tuple[str, ...] = ()  # regexes from the manifest

    def problems(self) -> list[str]:
        name = lesson_name(self.source)
        found = list(self.errors) + check_outputs(name, self.cells, self.printed)
        found += [f"{name}: unknown placeholder «{n}» (known: {', '.join(PLACEHOLDERS)})"
                  for n in unknown_placeholders(self.cells)]
        found += [f"{name}, cell {c.number}: unknown Output condition when={n} (known: {', '.join(CONDITIONS)})"
                  for c in self.cells if c.kind == "markdown" for n in unknown_conditions(c.source)]
        found += [
            f"{name}: {w}"
            for w in self.gated_warnings
            if not any(re.search(p, w) for p in self.allowed_warnings)
        ]
        return found

    def report(self) -> str:
        """The problems, one paragraph each, ending with how to accept an intended change."""
        found = self.problems()
        if any(DIFFERS in p for p in found):
            found.append(update_hint(lesson_name(self.source)))
        return "\n\n".join(found)

    def check(self) -> None:
        if found := self.report():
            raise LessonError(found)


@contextlib.contextmanager
def as_main(script: Path, module: types.ModuleType):
    """Make the interpreter look as it does for ``python script`` run from the repo root.

    ``module`` stands in for ``sys.modules["__main__"]`` meanwhile, as runpy does, so that
    code which finds a function's globals through its module (torch.compile, pickle) works.
    """
    saved = (list(sys.path), list(sys.argv), os.getcwd(), set(sys.modules), dict(os.environ),
             sys.modules["__main__"])
    sys.modules["__main__"] = module
    sys.path.insert(0, str(script.parent))
    sys.argv[:] = [str(script)]
    os.chdir(ROOT)
    os.environ["MPLBACKEND"] = "Agg"  # headless; set only here so notebook kernels stay inline
    try:
        yield
    finally:
        sys.modules["__main__"] = saved[5]
        sys.path[:], sys.argv[:] = saved[0], saved[1]
        os.chdir(saved[2])
        os.environ.clear()
        os.environ.update(saved[4])
        # Forget modules imported from the lesson folder (another lesson may have a worker.py).
        for name in set(sys.modules) - saved[3]:
            file = getattr(sys.modules[name], "__file__", None) or ""
            if Path(file).parent == script.parent:
                del sys.modules[name]


def run_script(script: Path) -> LessonRun:
    script = script.resolve()
    run = LessonRun(script, read_cells(script))
    module = types.ModuleType("__main__")
    module.__file__ = str(script)
    run.ns = module.__dict__  # the script's globals, kept after the run for the tests
    with (as_main(script, module), warnings.catch_warnings(record=True) as caught,
          stderr_noise() as noise):
        warnings.simplefilter("always")
        for cell in run.cells:
            if cell.kind != "code":
                continue
            out = io.StringIO()
            try:
                code = compile(cell.source, f"{script} [cell {cell.number}]", "exec")
                with contextlib.redirect_stdout(out):
                    exec(code, run.ns)
            except BaseException:  # noqa: BLE001 - a lesson's SystemExit is a failure too
                run.errors.append(f"{lesson_name(script)}, cell {cell.number} raised:\n{traceback.format_exc()}")
                break
            run.printed[cell.number] = out.getvalue()
    run.gated_warnings = [
        f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, GATED_WARNINGS)
    ]
    noise += launch_noise(run.ns)
    if noise:
        run.errors.append(noise_problem(lesson_name(script), noise))
    return run


def noise_problem(where: str, lines: list[str]) -> str:
    shown = "\n".join(f"  {line}" for line in lines[:5])
    more = f"\n  ... and {len(lines) - 5} more" if len(lines) > 5 else ""
    return (f"{where} {NOISE} ({len(lines)} lines):\n{shown}{more}\n"
            f"  (this process has {quiet.switches()}: unset both, or run `make install`)")


class _TorchRecords(logging.Handler):
    """The messages of every log record that reaches the ``torch`` logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


@contextlib.contextmanager
def stderr_noise(poll_s: float = 0.1):
    """Yield a list that, at exit, holds the noise lines written meanwhile to file descriptor
    2 (C++ libraries such as libkineto write there, past ``sys.stderr``) or logged by torch.

    File descriptor 2 points at a temporary file meanwhile, and a thread copies what lands
    there to the real stderr every ``poll_s`` seconds, so the output still shows as it comes
    (and survives a crash of the run up to the last copy). A temporary file, not a pipe: a
    process started meanwhile that outlives the run (Inductor's compile workers) inherits it,
    and would keep a pipe's reader waiting for ever. What such a process writes after the run
    is neither shown nor scanned."""
    found: list[str] = []
    records = _TorchRecords()
    torch_logger = logging.getLogger("torch")
    torch_logger.addHandler(records)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        copied, stop = 0, threading.Event()

        def copy_new() -> None:
            nonlocal copied
            while chunk := os.pread(tmp.fileno(), 1 << 16, copied):
                _write_all(saved, chunk)
                copied += len(chunk)

        def copier() -> None:
            while not stop.wait(poll_s):
                copy_new()

        os.dup2(tmp.fileno(), 2)
        thread = threading.Thread(target=copier, name="checker-stderr", daemon=True)
        thread.start()
        try:
            yield found
        finally:
            sys.stderr.flush()
            stop.set()
            thread.join()
            os.dup2(saved, 2)
            copy_new()
            os.close(saved)
            torch_logger.removeHandler(records)
            text = os.pread(tmp.fileno(), copied, 0).decode(errors="replace")
            found += quiet.noise_lines(text)
            # a torch record also reaches file descriptor 2 when torch's handler writes there
            found += [m for m in records.messages if quiet.is_noise(m) and m not in text]


def launch_noise(ns: dict) -> list[str]:
    """Noise in what the ranks and agents of each multi-rank launch the script kept printed
    (every ``Run`` of the kit, lessons/multirank.py, among the script's globals; a launch
    kept in a list or overwritten by a later one under the same name is not seen)."""
    kit = sys.modules.get("multirank")  # the kit, when the lesson imported it
    if kit is None:
        return []
    found = []
    for value in list(ns.values()):
        if isinstance(value, kit.Run):
            texts = [err for _, err in value.logs.values()] + [value.agent]
            found += [line for text in texts for line in quiet.noise_lines(text or "")]
    return found


GATED_IN_STDERR = re.compile(r"\b(DeprecationWarning|FutureWarning): .*")


def run_notebook(notebook: Path, cell_timeout: int = 300) -> LessonRun:
    """Execute a notebook top to bottom in a fresh python3 kernel, from its own folder.

    The expected blocks come from the script beside it (``slug.py``), the single source of
    truth: the generated notebook may present them differently (collapsed, so that a student
    predicts before seeing them). A notebook whose cells are not the script's is stale.
    """
    import nbformat
    from nbclient import NotebookClient  # imported here: only notebook runs need them

    notebook = notebook.resolve()
    nb = nbformat.read(notebook, as_version=4)
    run = LessonRun(notebook, read_cells(notebook.with_suffix(".py")))
    if stale := notebook_mismatch(run.cells, nb):
        run.errors.append(f"{lesson_name(notebook)} is stale ({stale}): regenerate it with `make notebooks`")
        return run
    client = NotebookClient(
        nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(notebook.parent)}},
    )
    # The kernel starts without pytest's marker: with it, ipykernel would not forward what
    # C++ code writes to file descriptors 1 and 2 into the cells, as it does for a student.
    client.execute(env={k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"})
    noise = []
    for number, cell in enumerate(nb.cells, start=1):
        if cell.cell_type == "code":
            run.printed[number] = ""
        for out in cell.get("outputs", []):
            collect_output(run, number, out)
        # joined first: ipykernel forwards C++ output in chunks that may split a line
        err = "".join(o["text"] for o in cell.get("outputs", []) if o["output_type"] == "stream"
                      and o["name"] == "stderr")
        noise += [f"cell {number}: {line}" for line in quiet.noise_lines(err)]
    if noise:
        run.errors.append(noise_problem(lesson_name(notebook), noise))
    return run


def notebook_mismatch(cells: list[Cell], nb) -> str | None:
    """Why the notebook's cells are not the script's cells, or None when they are."""
    if len(cells) != len(nb.cells):
        return f"{len(nb.cells)} cells, the script has {len(cells)}"
    for cell, nb_cell in zip(cells, nb.cells):
        if cell.kind != nb_cell.cell_type:
            return f"cell {cell.number} is {nb_cell.cell_type}, the script's is {cell.kind}"
        if cell.kind == "code" and cell.source != nb_cell.source:
            return f"cell {cell.number}'s code differs from the script's"
    return None


def collect_output(run: LessonRun, number: int, out: dict) -> None:
    name = lesson_name(run.source)
    if out["output_type"] == "stream" and out["name"] == "stdout":
        run.printed[number] += out["text"]
    elif out["output_type"] == "stream":
        run.gated_warnings += [m.group(0) for m in GATED_IN_STDERR.finditer(out["text"])]
    elif out["output_type"] == "error":
        tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out["traceback"]))  # strip ANSI colours
        run.errors.append(f"{name}, cell {number} raised:\n{tb}")
        run.printed.pop(number, None)  # a failed cell's output is not compared
    elif out["output_type"] == "execute_result" and "image/png" not in out["data"]:
        run.errors.append(
            f"{name}, cell {number} ends with a bare expression the notebook displays but the "
            f"script does not: print it instead\n{out['data'].get('text/plain', '')}"
        )


def allowed_warnings(script: Path) -> tuple[str, ...]:
    """The manifest's allowed warnings for the lesson holding ``script`` (none for a script
    outside the course's lesson folders, e.g. a test fixture)."""
    from scripts import manifest  # imported here: manifest does not import the checker

    try:
        return manifest.for_path(script).allowed_warnings
    except KeyError:
        return ()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check a lesson's documented outputs.")
    parser.add_argument("script", type=Path, help="lessons/NN_slug/slug.py")
    parser.add_argument("--notebook", action="store_true", help="also execute the notebook")
    args = parser.parse_args(argv)
    runs = [run_script(args.script)]
    if args.notebook:
        runs.append(run_notebook(args.script.with_suffix(".ipynb")))
    for run in runs:  # the manifest's allowed warnings apply here as in the tests
        run.allowed_warnings = allowed_warnings(args.script)
    found = [text for run in runs if (text := run.report())]
    print("\n\n".join(found) if found else f"{lesson_name(args.script)}: documented outputs match")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

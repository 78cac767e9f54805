"""What a PyTorch bump would change: ``make drift TORCH=2.14.1``.

    python -m scripts.drift 2.14.1                       # build the candidate, check every lesson
    python -m scripts.drift 2.14.1 --python PATH 01 03   # an existing interpreter, some lessons

Builds a separate venv, ``build/venv-torch-X.Y.Z``, with the course's pins but the candidate
torch (the first time only: minutes, and several GB for a CUDA build), runs every lesson's
documented-output check there (``scripts.checker``, with an Inductor cache of its own), and
writes ``build/drift-X.Y.Z.md``: per lesson, whether its outputs match, which cells differ,
and the checker's report with the diffs. The course's own venv and files are not touched and
the exit status is 0 whatever differs: the pin bump itself stays a deliberate human change
(then ``make outputs`` rewrites the blocks that should change). Exit status 1 only when the
candidate could not be built.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.checker import DIFFERS
from scripts.deps import requirements
from scripts.manifest import BUILD, ROOT, UnknownLesson, find, ready


@dataclass
class Check:
    name: str  # "03 Autograd", or a script's file name
    status: str  # "matches", "differs", "fails", "timed out"
    cells: list[int]  # the code cells whose printed output differs or that raised
    seconds: float
    report: str  # the checker's output


def candidate_pins(torch: str) -> list[str]:
    return [f"torch=={torch}" if r.startswith("torch==") else r for r in requirements(["dev"])]


def build_venv(torch: str) -> Path:
    """The candidate's interpreter, in build/venv-torch-X.Y.Z (made once; reused after)."""
    venv = BUILD / f"venv-torch-{torch}"
    python, stamp = venv / "bin" / "python", venv / ".installed"
    if stamp.exists():
        site(python)
        return python
    pins = candidate_pins(torch)
    print(f"Building {venv.relative_to(ROOT)} with {' '.join(pins)}\n"
          f"This takes minutes and several GB (the course's .venv is not touched).", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    quiet = [] if sys.stdout.isatty() else ["--quiet"]
    subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", *quiet, *pins],
                   check=True)
    site(python)
    stamp.touch()
    return python


def site(python: Path) -> None:
    """Give the candidate venv the course venv's course-root.pth (scripts/deps.py --site): the
    repository on its path, and PyTorch's diagnostic noise kept out of its runs as in .venv."""
    subprocess.run([str(python), str(ROOT / "scripts" / "deps.py"), "--site"], check=True)


def torch_version(python: Path) -> str:
    out = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or f"(torch does not import: {out.stderr.strip().splitlines()[-1:]})"


def check(python: Path, script: Path, name: str, limit: float, cache: Path) -> Check:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "MPLBACKEND": "Agg"}
    start = time.perf_counter()
    try:
        proc = subprocess.run([str(python), "-m", "scripts.checker", str(script)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=limit)
        report, code = (proc.stdout + proc.stderr).strip(), proc.returncode
    except subprocess.TimeoutExpired:
        report, code = f"timed out after {limit:.0f} s", None
    differ = sorted({int(n) for n in re.findall(rf"cell (\d+): {DIFFERS}", report)})
    raised = sorted({int(n) for n in re.findall(r"cell (\d+) raised", report)})
    if code is None:
        status = "timed out"
    elif code == 0:
        status = "matches"
    else:
        status = "differs" if differ and not raised else "fails"
    return Check(name, status, sorted(set(differ + raised)), time.perf_counter() - start, report)


def render(torch: str, installed: str, python: Path, checks: list[Check]) -> str:
    pinned = next(r.split("==")[1] for r in requirements([]) if r.startswith("torch=="))
    where = python.relative_to(ROOT) if python.is_relative_to(ROOT) else python
    today = datetime.date.today().isoformat()
    out = [f"# Documented outputs on torch {torch}", "",
           f"Candidate: torch {installed} ({where}); the course is pinned to torch {pinned}.",
           f"Made by `make drift TORCH={torch}` on {today}; the course was not changed.", "",
           "| lesson | result | cells | seconds |", "|---|---|---|---|"]
    for c in checks:
        cells = ", ".join(map(str, c.cells)) or "—"
        out.append(f"| {c.name} | {c.status} | {cells} | {c.seconds:.1f} |")
    same = sum(c.status == "matches" for c in checks)
    out += ["", f"{same} of {len(checks)} lessons match."]
    for c in checks:
        if c.status != "matches":
            fence = "````" if "```" in c.report else "```"
            out += ["", f"## {c.name}: {c.status}", "", f"{fence}text", c.report, fence]
    return "\n".join(out) + "\n"


def targets(names: list[str]) -> list[tuple[Path, str, float]]:
    """(script, name, time limit) for each lesson number or script path; all ready lessons."""
    if not names:
        return [(lesson.script, f"{lesson.number} {lesson.title}", max(300.0, 5 * lesson.budget_s))
                for lesson in ready()]
    out = []
    for n in names:
        if n.endswith(".py"):
            out.append((Path(n).resolve(), Path(n).name, 300.0))
        else:
            lesson = find(n)
            out.append((lesson.script, f"{lesson.number} {lesson.title}", max(300.0, 5 * lesson.budget_s)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check every lesson's outputs on another torch.")
    parser.add_argument("torch", nargs="?", default="", help="the candidate version, e.g. 2.14.1")
    parser.add_argument("lessons", nargs="*", help="lesson numbers or script paths (default: all)")
    parser.add_argument("--python", type=Path, help="an interpreter that already has the candidate")
    parser.add_argument("--out", type=Path, help="the report (default build/drift-X.Y.Z.md)")
    args = parser.parse_intermixed_args(argv)
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", args.torch):
        print("say which torch to try: make drift TORCH=X.Y.Z (e.g. TORCH=2.14.1)", file=sys.stderr)
        return 2
    try:
        jobs = targets(args.lessons)
        python = args.python.absolute() if args.python else build_venv(args.torch)
    except UnknownLesson as e:
        print(e, file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"could not build the candidate venv ({e}); the course was not changed", file=sys.stderr)
        return 1
    installed = torch_version(python)
    cache = BUILD / f"inductor-cache-torch-{args.torch}"
    checks = []
    for script, name, limit in jobs:
        checks.append(c := check(python, script, name, limit, cache))
        print(f"{name:<40} {c.status:<10} {c.seconds:6.1f} s", flush=True)
    out = args.out or BUILD / f"drift-{args.torch}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(args.torch, installed, python, checks))
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

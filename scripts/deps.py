"""The course's pinned requirements, from pyproject.toml, and the checks `make install` makes.

    python scripts/deps.py dev                    # the pins (+ the dev extra), one per line
    python scripts/deps.py --check-python [VENV]  # refuse Python < 3.11, here and in VENV
    python scripts/deps.py --announce VENV dev    # say what is about to be installed
    python scripts/deps.py --verify dev           # exit 1 naming each package off its pin
    python scripts/deps.py --site                 # (in the venv) write its course-root.pth

The Makefile feeds the pins to pip. We do not `pip install .` because the course is not a
package: this keeps setup to `python3 -m venv` + `pip install <pins>`, nothing else.
This file runs under whatever `python3` the student has, before any venv exists: it must
import nothing outside the standard library at the top, and run on Python 3.6+ as far as
the --check-python message (no `tomllib` at the top, quoted annotations, no walrus).
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MINIMUM = (3, 11)


def python_problem(version: "tuple[int, ...]") -> "str | None":
    """One line when ``version`` is too old for the course, else None."""
    if tuple(version[:2]) >= MINIMUM:
        return None
    found = ".".join(str(v) for v in version[:3])
    return f"Python {MINIMUM[0]}.{MINIMUM[1]} or newer is needed (found {found})"


def venv_version(venv: Path) -> "tuple[int, ...] | None":
    """The Python version of an existing venv, or None when there is none."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    out = subprocess.run([str(python), "-c", "import sys; print(*sys.version_info[:3])"],
                         capture_output=True, text=True)
    return tuple(int(v) for v in out.stdout.split()) if out.returncode == 0 else None


def requirements(extras: "list[str]") -> "list[str]":
    import tomllib  # Python 3.11+: imported here so that --check-python runs on older ones

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return reqs


def installed(name: str) -> "str | None":
    """The installed version of a distribution, without a local tag ("2.13.0+cpu" -> "2.13.0")."""
    import importlib.metadata

    try:
        return importlib.metadata.version(name).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def pin_problems(extras: "list[str]") -> "list[str]":
    """One line per pinned package that is missing or installed at another version."""
    problems = []
    for req in requirements(extras):
        name, pinned = req.split("==")
        have = installed(name)
        if have is None:
            problems.append(f"{name} is not installed (the course is pinned to {req})")
        elif have != pinned:
            problems.append(f"{name} {have} is installed but the course is pinned to {req}")
    return problems


PTH_NAME = "course-root.pth"


def pth_text(root: Path = ROOT) -> str:
    """The venv's course-root.pth: the repository root on the path (so that `scripts`
    imports from anywhere: pytest's plugin, the notebook tools), then a line Python runs at
    start-up that keeps PyTorch's diagnostic noise out of every run (scripts/quiet.py)."""
    quiet = str(root / "scripts" / "quiet.py")
    # One line, as a .pth needs: nothing is loaded under COURSE_TORCH_NOISE=1, a missing file
    # (a moved repository, an old checkout) is skipped, and no error of it can break start-up.
    code = f"try:\n    import runpy; runpy.run_path({quiet!r})['install']()\nexcept Exception:\n    pass"
    return (f"{root}\nimport os; os.environ.get('COURSE_TORCH_NOISE') == '1' or not "
            f"os.path.exists({quiet!r}) or exec({code!r})\n")


def write_site(root: Path = ROOT) -> Path:
    """Write course-root.pth into the running Python's site-packages (the venv's)."""
    import sysconfig

    path = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    if not path.exists() or path.read_text() != pth_text(root):
        path.write_text(pth_text(root))
    return path


def announcement(venv: str, extras: "list[str]") -> str:
    reqs = requirements(extras)
    return (f"Installing {len(reqs)} pinned packages into {venv}: {' '.join(reqs)}\n"
            f"This may take a few minutes the first time (torch is a large download).")


def main(argv: "list[str]") -> int:
    if argv[:1] == ["--check-python"]:
        problem = python_problem(sys.version_info)
        found = venv_version(Path(argv[1])) if problem is None and len(argv) > 1 else None
        if found and python_problem(found):
            problem = f"{python_problem(found)} in {argv[1]}: remove it with `make clean-venv`"
        if problem:
            print(problem, file=sys.stderr)
            return 1
        return 0
    if argv[:1] == ["--announce"]:
        print(announcement(argv[1], argv[2:]), flush=True)
        return 0
    if argv[:1] == ["--site"]:
        write_site()
        return 0
    if argv[:1] == ["--verify"]:
        problems = pin_problems(argv[1:])
        for line in problems:
            print(line)
        return 1 if problems else 0
    print("\n".join(requirements(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

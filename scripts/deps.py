"""Print the course's pinned requirements from pyproject.toml, one per line.

The Makefile feeds them to pip. We do not `pip install .` because the course is not a
package: this keeps setup to `python3 -m venv` + `pip install <pins>`, nothing else.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return reqs


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))

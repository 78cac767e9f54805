"""The linter: ruff, pinned in the dev extra and configured in pyproject.toml, passes on the course."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from scripts import manifest

PYPROJECT = manifest.ROOT / "pyproject.toml"


def ruff(*args: str, cwd: Path = manifest.ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=60)


def test_ruff_passes():
    done = ruff("--output-format", "concise", ".")
    assert done.returncode == 0, f"ruff found problems (fix them, or `ruff check --fix .`):\n{done.stdout}{done.stderr}"


def test_an_unneeded_noqa_fails(tmp_path):
    # RUF100: a noqa that silences nothing is an error, so each one left names a live rule.
    (tmp_path / "example.py").write_text("value = 1  # noqa: E731\nsquare = lambda x: x * x  # noqa: E731\n")
    done = ruff("--config", str(PYPROJECT), "--output-format", "concise", "example.py", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout.count("RUF100") == 1 and "example.py:1:" in done.stdout, done.stdout


def test_a_blanket_noqa_fails(tmp_path):
    (tmp_path / "example.py").write_text("import os  # noqa\n")
    done = ruff("--config", str(PYPROJECT), "--output-format", "concise", "example.py", cwd=tmp_path)
    assert done.returncode == 1 and "PGH004" in done.stdout, done.stdout


def test_only_lesson_scripts_may_have_long_lines():
    """Output-block lines are what a cell prints and cannot be wrapped; everything else keeps
    ruff's line length. The per-file list names exactly the manifest's lesson scripts."""
    ignores = tomllib.loads(PYPROJECT.read_text())["tool"]["ruff"]["lint"]["per-file-ignores"]
    scripts = {str(p.relative_to(manifest.ROOT)) for p in manifest.lesson_scripts()}
    long_lines = {path for path, rules in ignores.items() if "E501" in rules}
    assert long_lines == scripts, (
        f"pyproject.toml's [tool.ruff.lint.per-file-ignores] must list E501 for exactly the lesson "
        f"scripts: add {sorted(scripts - long_lines)}, remove {sorted(long_lines - scripts)}"
    )
    assert all(rules == ["E501"] for rules in ignores.values()), ignores

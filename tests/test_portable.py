"""The portability gate (scripts/portable.py): it must catch a last-digit-sensitive output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts import checker, portable
from scripts.manifest import ROOT

FIXTURE = Path(__file__).parent / "fixtures" / "last_digits.py"


def test_levels_below_the_host():
    assert portable.levels_below("AVX512") == ["avx2", "default"]
    assert portable.levels_below("AVX512_BF16") == ["avx2", "default"]
    assert portable.levels_below("AVX2") == ["default"]
    assert portable.levels_below("DEFAULT") == []
    assert portable.levels_below("SVE256") == ["default"]


def documented_here(tmp_path: Path) -> Path:
    """The fixture with its Output block filled in from what this machine prints."""
    run = checker.run_script(FIXTURE)
    (printed,) = [text for text in run.printed.values() if text]
    script = tmp_path / "last_digits.py"
    script.write_text(FIXTURE.read_text().replace(
        "# gelu sum «filled in by the test»", "# " + printed.splitlines()[0]))
    assert checker.run_script(script).problems() == []  # the native run passes
    return script


@pytest.mark.parametrize("level", list(portable.LEVELS))
def test_the_gate_catches_last_digits_under_each_level(tmp_path, level, monkeypatch):
    if level not in portable.levels_below(host := portable.host_capability()):
        pytest.skip(f"{level} is not below this host's {host}: the gate does not simulate it here")
    script = documented_here(tmp_path)
    monkeypatch.setattr(portable, "OUT", tmp_path / "out")
    portable.OUT.mkdir()
    result = portable.check(script, "last_digits", level, limit=120)
    assert not result.ok, f"{level}: the gate did not catch a last-digit-sensitive line"
    report = result.log.read_text()
    assert "cell 2: printed output differs" in report and "-gelu sum" in report
    assert "+gap" not in report and "-gap" not in report  # the portable line held


def test_the_command_line_fails_and_names_the_failure(tmp_path):
    if "default" not in portable.levels_below(portable.host_capability()):
        pytest.skip("this host has no vector ISA: nothing below it to simulate")
    script = documented_here(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "scripts.portable", "--level", "default", str(script)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "default  last_digits" in proc.stdout and "FAILED" in proc.stdout
    assert proc.stdout.rstrip().endswith("portability: 0 passed, 1 failed")

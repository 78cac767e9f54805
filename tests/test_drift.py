"""`make drift`: the report is built from a stand-in candidate (this interpreter), on small
synthetic lessons, so that no other torch is installed and the test takes seconds."""

from __future__ import annotations

import sys
from pathlib import Path

from scripts import drift, manifest

GOOD = '''# %%
print("strides (3, 1)")

# %% [markdown]
# Output:
# ```text
# strides (3, 1)
# ```
'''


def lessons(tmp_path: Path) -> list[str]:
    texts = {"good.py": GOOD, "drifted.py": GOOD.replace('print("strides (3, 1)")', 'print("strides (1, 3)")'),
             "broken.py": GOOD.replace('print(', 'raise RuntimeError("gone in the candidate")\nprint(')}
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    return [str(tmp_path / name) for name in texts]


def test_the_report_names_what_differs_and_the_course_is_untouched(tmp_path, capsys):
    out = tmp_path / "drift.md"
    venv = manifest.BUILD / "venv-torch-9.9.9"
    code = drift.main(["9.9.9", "--python", sys.executable, "--out", str(out), *lessons(tmp_path)])
    assert code == 0  # differences are reported, not failed
    report = out.read_text()
    assert report.startswith("# Documented outputs on torch 9.9.9\n")
    assert "Candidate: torch 2.13.0" in report and "pinned to torch 2.13.0" in report
    assert "| good.py | matches | — |" in report
    assert "| drifted.py | differs | 1 |" in report
    assert "| broken.py | fails | 1 |" in report
    assert "1 of 3 lessons match." in report
    assert "## good.py" not in report
    assert "-strides (3, 1)\n+strides (1, 3)" in report.split("## drifted.py: differs")[1]
    assert "RuntimeError: gone in the candidate" in report.split("## broken.py: fails")[1]
    assert not venv.exists()  # a stand-in candidate builds nothing
    assert f"wrote {out}" in capsys.readouterr().out


def test_the_candidate_keeps_every_pin_but_torch():
    pins = drift.candidate_pins("2.14.1")
    assert "torch==2.14.1" in pins and "torch==2.13.0" not in pins
    assert "numpy==2.3.5" in pins and "jupytext==1.17.3" in pins  # the checker needs the dev pins


def test_a_missing_version_is_one_line(capsys):
    assert drift.main([]) == 2
    assert capsys.readouterr().err == "say which torch to try: make drift TORCH=X.Y.Z (e.g. TORCH=2.14.1)\n"

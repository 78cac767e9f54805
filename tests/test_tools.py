"""The course tooling: pins, manifest, runner table, exercise reports."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib

import pytest

from scripts import deps, exercises, manifest, run_lessons

LESSON_01 = manifest.find("01")


def test_requirements_are_exact_pins():
    reqs = deps.requirements(["dev"])
    assert "torch==2.13.0" in reqs
    assert all("==" in r for r in reqs), "every dependency is pinned exactly"


def test_manifest_fields_round_trip():
    raw = tomllib.loads(manifest.MANIFEST.read_text())["lesson"]
    assert [l.number for l in manifest.load()] == [t["number"] for t in raw]
    assert LESSON_01.script == manifest.ROOT / "lessons/01_tensor_views/tensor_views.py"
    assert manifest.for_path(LESSON_01.script) == LESSON_01


def test_runner_table_reports_time_against_budget():
    results = [run_lessons.Result(LESSON_01, "ok", 3.0),
               run_lessons.Result(LESSON_01, "failed (exit 1)", LESSON_01.budget_s + 1)]
    lines = run_lessons.table(results).splitlines()
    assert lines[0].split() == ["lesson", "status", "seconds", "budget"]
    assert "ok" in lines[1] and "over budget" not in lines[1]
    assert "failed (exit 1)" in lines[2] and lines[2].endswith("over budget")
    assert lines[-1].split() == ["total", f"{3.0 + LESSON_01.budget_s + 1:.1f}"]


def test_exercise_verdicts():
    assert exercises.verdict(["passed", "passed"]) == "passed"
    assert exercises.verdict(["passed", "failed"]) == "failed"
    assert exercises.verdict(["passed", "not attempted"]) == "not attempted"
    _, done = exercises.report({"a": ["passed"], "b": ["failed"]})
    assert not done
    _, done = exercises.report({"a": ["passed"]})
    assert done
    assert exercises.report({})[1] is False  # no exercise test ran: not done


# Appended to solutions.py: element_offset stays solved, the other two are overridden.
OVERRIDES = '''

def contiguous_strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size + 1  # off by one
    return tuple(reversed(strides))

def can_view(shape, strides, new_shape):
    raise NotImplementedError
'''


def test_make_exercises_reports_passed_failed_and_not_attempted(tmp_path):
    folder = tmp_path / LESSON_01.folder
    shutil.copytree(LESSON_01.dir, folder, ignore=shutil.ignore_patterns("*.ipynb", "*.png", "__pycache__"))
    (folder / "exercises.py").write_text((folder / "solutions.py").read_text() + OVERRIDES)
    proc = subprocess.run([sys.executable, "-m", "scripts.exercises", str(folder)],
                          cwd=manifest.ROOT, capture_output=True, text=True, timeout=120)
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.split()[:1]}
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "passed" in rows["element_offset"]
    assert "failed" in rows["contiguous_strides"]
    assert "not attempted" in rows["can_view"]

"""The course tooling: pins, install checks, manifest, runner, exercise reports, notebooks."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from scripts import deps, exercises, manifest, notebooks, run_lessons

LESSON_01 = manifest.find("01")
PYTHON_310 = Path("/root/.pyenv/versions/3.10.13/bin/python3")
ROOT = manifest.ROOT


def run(*cmd: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw)


def make(*args: str, **kw) -> subprocess.CompletedProcess:
    """`make` in the repository, without inheriting the caller's make flags."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return run("make", "--no-print-directory", *args, env=env, **kw)


def test_requirements_are_exact_pins():
    reqs = deps.requirements(["dev"])
    assert "torch==2.13.0" in reqs
    assert all("==" in r for r in reqs), "every dependency is pinned exactly"


def test_manifest_fields_round_trip():
    raw = tomllib.loads(manifest.MANIFEST.read_text())["lesson"]
    assert [lesson.number for lesson in manifest.load()] == [t["number"] for t in raw]
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


def test_runner_table_columns_line_up_past_a_long_title():
    long = dataclasses.replace(LESSON_01, title="A title much longer than the default column of the table")
    results = [run_lessons.Result(long, "ok", 3.0), run_lessons.Result(LESSON_01, "ok", 4.0)]
    lines = run_lessons.table(results).splitlines()
    assert len({line.index(" ok ") for line in lines[1:3]}) == 1  # the status column starts at one place
    assert len({len(line) for line in lines[:3]}) == 1


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
    # rows in the order the exercises appear in the file, then a sentence that says what is true
    table = proc.stdout[proc.stdout.index("exercise "):].splitlines()
    # (the test file runs can_view's tests first)
    assert [line.split()[0] for line in table[1:4]] == ["element_offset", "contiguous_strides", "can_view"]
    assert table[4] == ("Not done yet: 1 exercise fails (contiguous_strides); "
                        "1 exercise not attempted yet (can_view).")


def test_exercise_closing_sentence_says_what_is_true():
    text, done = exercises.report({"a": ["not attempted"], "b": ["not attempted"], "c": ["skipped", "not attempted"]})
    assert not done and text.splitlines()[-1] == "Not done yet: 3 exercises not attempted yet (a, b, c)."
    text, _ = exercises.report({"a": ["passed", "failed"], "b": ["failed"]})
    assert text.splitlines()[-1] == "Not done yet: 2 exercises fail (a, b)."
    text, done = exercises.report({"a": ["passed"], "b": ["passed"]})
    assert done and text.splitlines()[-1] == "All 2 exercises pass."
    assert "fix the failures" not in exercises.report({"a": ["not attempted"]})[0]


def test_exercise_rows_follow_the_file():
    source = "class Zeta:\n    pass\n\ndef alpha():\n    pass\n\ndef _helper():\n    pass\n"
    outcomes = {"alpha": ["passed"], "(test setup)": ["failed"], "Zeta": ["failed"]}
    assert list(exercises.in_file_order(outcomes, exercises.file_order(source))) == ["Zeta", "alpha", "(test setup)"]


def test_exercises_with_a_syntax_error_report_it_once_with_file_and_line(tmp_path):
    folder = tmp_path / LESSON_01.folder
    shutil.copytree(LESSON_01.dir, folder, ignore=shutil.ignore_patterns("*.ipynb", "*.png", "__pycache__"))
    lines = (folder / "exercises.py").read_text().splitlines()
    bad = next(i for i, line in enumerate(lines) if line.startswith("def contiguous_strides("))
    lines[bad] = "def contiguous_strides(shape:"
    (folder / "exercises.py").write_text("\n".join(lines) + "\n")
    proc = run(sys.executable, "-m", "scripts.exercises", str(folder), timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert out.count("SyntaxError") == 1, out
    assert f"exercises.py, line {bad + 1}: SyntaxError" in out
    assert "(test setup)" not in out and "Traceback" not in out


@pytest.mark.parametrize("n", ["99", "abc", "attention", ""])
def test_unknown_lesson_is_one_line_naming_the_lessons(n):
    with pytest.raises(manifest.UnknownLesson) as caught:
        manifest.find(n)
    message = str(caught.value)
    assert "\n" not in message
    assert all(f"{lesson.number} {lesson.title}" in message for lesson in manifest.load())
    assert ("N=NN" in message) if n == "" else (f"no lesson {n!r}" in message)
    assert manifest.find("1") == manifest.find("01") == LESSON_01


@pytest.mark.parametrize("tool", ["scripts.run_lessons --show", "scripts.exercises", "scripts.outputs"])
@pytest.mark.parametrize("n", ["99", "abc", "attention", ""])
def test_a_bad_n_is_one_line_and_a_non_zero_exit(tool, n):
    if tool == "scripts.outputs" and n == "":
        pytest.skip("`make outputs` without N updates every lesson")
    proc = run(sys.executable, "-m", *tool.split(), n)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out
    assert len(out.splitlines()) == 1 and "Traceback" not in out, out
    assert "01 Tensor views" in out and "12a Distributed checkpoint" in out


def test_the_runner_refuses_another_torch_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(deps, "installed", lambda name: "2.12.0" if name == "torch" else "0")
    assert run_lessons.main(["--show", "01"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no lesson ran
    assert captured.err == ("torch 2.12.0 is installed but the course is pinned to torch==2.13.0: "
                            "run `make install`\n")


def test_pin_problems_name_each_package_off_its_pin(monkeypatch):
    versions = {"torch": "2.12.0", "numpy": None}
    monkeypatch.setattr(deps, "installed", lambda name: versions.get(name, dict(
        r.split("==") for r in deps.requirements(["dev"]))[name]))
    assert deps.pin_problems(["dev"]) == [
        "torch 2.12.0 is installed but the course is pinned to torch==2.13.0",
        "numpy is not installed (the course is pinned to numpy==2.3.5)",
    ]
    versions.clear()
    assert deps.pin_problems(["dev"]) == []


def test_the_installed_local_tag_is_ignored():
    assert deps.installed("torch") == "2.13.0"  # the wheel says 2.13.0+cpu
    assert deps.installed("no-such-distribution") is None


def test_old_pythons_are_refused_in_one_line():
    assert deps.python_problem((3, 10, 13, "final", 0)) == "Python 3.11 or newer is needed (found 3.10.13)"
    assert deps.python_problem((3, 11, 0)) is None and deps.python_problem((4, 0, 0)) is None


@pytest.mark.skipif(not PYTHON_310.exists(), reason=f"needs {PYTHON_310}")
def test_make_refuses_python_310_before_creating_anything(tmp_path):
    venv = tmp_path / "venv"
    proc = make("install", f"PYTHON={PYTHON_310}", f"VENV={venv}")
    assert proc.returncode != 0
    assert proc.stderr.count("Python 3.11 or newer is needed (found 3.10.13)") == 1, proc.stderr
    ours = [line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("make")]
    assert ours == ["Python 3.11 or newer is needed (found 3.10.13)"]
    assert not venv.exists()


@pytest.mark.skipif(not PYTHON_310.exists(), reason=f"needs {PYTHON_310}")
def test_a_venv_left_by_python_310_is_named_with_its_remedy(tmp_path, capsys):
    venv = tmp_path / "venv"
    run(str(PYTHON_310), "-m", "venv", "--without-pip", str(venv), timeout=120)
    assert deps.main(["--check-python", str(venv)]) == 1
    assert capsys.readouterr().err == (f"Python 3.11 or newer is needed (found 3.10.13) in {venv}: "
                                       f"remove it with `make clean-venv`\n")
    proc = make("clean-venv", f"VENV={venv}")
    assert proc.returncode == 0 and not venv.exists()


def test_make_install_rechecks_the_pins_even_when_the_stamp_is_fresh(tmp_path):
    """A venv whose stamp is newer than everything, but without torch: `make install`
    notices and reinstalls (pip stubbed out here), instead of "Nothing to be done"."""
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", str(venv), timeout=120)
    (venv / ".installed").touch()
    proc = make("install", f"VENV={venv}", "PIP_INSTALL=echo pip install stubbed")
    out = proc.stdout + proc.stderr
    assert "torch is not installed (the course is pinned to torch==2.13.0)" in out
    assert "Reinstalling the pinned packages" in out and "pip install stubbed" in out
    assert proc.returncode != 0  # still off the pin after the (stubbed) reinstall


def test_make_install_says_what_it_installs_and_shows_pip_on_a_terminal(tmp_path):
    venv = tmp_path / "venv"
    text = deps.announcement(str(venv), ["dev"])
    assert all(req in text for req in deps.requirements(["dev"])) and "few minutes" in text
    proc = make("-n", "install", f"VENV={venv}", f"PYTHON={sys.executable}")
    lines = proc.stdout.splitlines()
    steps = ["--check-python", "-m venv", "--announce", "-m pip install"]
    at = [next(i for i, line in enumerate(lines) if step in line) for step in steps]
    assert at == sorted(at), proc.stdout  # refuse, create, announce, install: in that order
    pip = lines[at[-1]]
    assert "test -t 1 || echo --quiet" in pip  # quiet only when stdout is not a terminal
    assert not venv.exists()


def test_the_venv_and_python_are_overridable(tmp_path):
    """A venv that does not exist yet (build/venv-3.12 may: `make test-pythons` makes it, and
    then `make -n` has no creation step to show)."""
    venv = tmp_path / "venv-3.12"
    proc = make("-n", "test", f"VENV={venv}", "PYTHON=/opt/python3.12")
    assert f"/opt/python3.12 scripts/deps.py --check-python {venv}" in proc.stdout
    assert f"{venv}/bin/python -m pytest" in proc.stdout
    assert ".venv/" not in proc.stdout.replace("venv-3.12/", "")


def test_make_notebooks_reports_only_the_notebooks_that_changed(tmp_path):
    scripts = []
    for name in ("a", "b"):
        scripts.append(tmp_path / f"{name}.py")
        scripts[-1].write_text(f"# %% [markdown]\n# # Lesson {name}\n\n# %%\nx = 1\n")
    assert notebooks.write(scripts) == [notebooks.notebook_path(s) for s in scripts]
    assert notebooks.write(scripts) == []
    scripts[1].write_text(scripts[1].read_text().replace("x = 1", "x = 2"))
    assert notebooks.write(scripts) == [notebooks.notebook_path(scripts[1])]


OUTPUT_CELL = """Output:
```text
strides (3, 1)
```

```text when=no-vector-isa
skipped: no vector ISA
```
The *explanation* stays visible."""


def test_notebooks_collapse_each_expected_block_and_keep_the_prose_visible():
    from markdown_it import MarkdownIt  # jupytext's own markdown parser

    html = MarkdownIt("commonmark").render(notebooks.collapse_expected(OUTPUT_CELL))
    details = html.split("<details>")[1:]
    assert len(details) == 2
    assert details[0].startswith(
        "<summary>Expected output</summary>\n<pre><code class=\"language-text\">strides (3, 1)\n"
    )
    assert "<summary>Expected output on a CPU without vector instructions</summary>\n<pre><code" in details[1]
    assert html.rstrip().endswith("<p>The <em>explanation</em> stays visible.</p>")  # outside any <details>
    assert notebooks.collapse_expected("Some prose\n```text\nx\n```") == "Some prose\n```text\nx\n```"


def test_the_generated_notebook_collapses_lesson_01s_blocks_and_the_script_stays_plain():
    from scripts.checker import read_cells

    cells, nb = read_cells(LESSON_01.script), notebooks.build(LESSON_01.script)
    outputs = [i for i, c in enumerate(cells) if c.source.startswith("Output:")]
    assert outputs and all("<summary>Expected output" not in c.source for c in cells)
    for i in outputs:
        assert nb.cells[i].source == notebooks.collapse_expected(cells[i].source) != cells[i].source
        assert nb.cells[i].source.count("<details><summary>Expected output</summary>") == 1


def test_a_collapsed_notebook_passes_the_notebook_check(tmp_path):
    from scripts import checker

    script = tmp_path / "lesson.py"
    script.write_text("# %%\nprint('strides (3, 1)')\n\n# %% [markdown]\n# Output:\n# ```text\n"
                      "# strides (3, 1)\n# ```\n#\n# Prose.\n")
    notebooks.write([script])
    assert "<details>" in notebooks.notebook_path(script).read_text()
    assert checker.run_notebook(notebooks.notebook_path(script)).problems() == []
    script.write_text(script.read_text().replace("# strides (3, 1)", "# strides (1, 3)"))
    (found,) = checker.run_notebook(notebooks.notebook_path(script)).problems()  # from the script
    assert "cell 1: printed output differs" in found


def test_multigpu_takes_a_gpu_count():
    """`@pytest.mark.multigpu(4)` (lesson 13a's 2-D step) asks for 4 GPUs; plain multigpu, 2."""
    import torch

    from scripts.pytest_course import missing_device

    have = torch.cuda.device_count()
    for need in (2, 4):
        reason = missing_device("multigpu", need)
        assert (reason is None) == (have >= need)
        if reason:
            assert reason.startswith(f"needs {need} CUDA devices")

"""The documented-output checker, on a tiny synthetic lesson (no torch: fast)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scripts import checker, notebooks

LESSON = '''# %% [markdown]
# # A synthetic lesson

# %%
from pathlib import Path
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
print(f"strides (3, 1), storage {48} bytes")
print(f"median {1.25:.2f} ms over 7 runs")

# %% [markdown]
# Output:
# ```text
# strides (3, 1), storage 48 bytes
# median «time» ms over 7 runs
# ```
#
# Prose may follow the block.

# %%
quiet = 1
'''
DOCUMENTED = ["strides (3, 1), storage 48 bytes", "median «time» ms over 7 runs"]


def write(tmp_path: Path, text: str) -> Path:
    script = tmp_path / "lesson.py"
    script.write_text(text)
    return script


def problems(tmp_path: Path, text: str) -> list[str]:
    return checker.run_script(write(tmp_path, text)).problems()


def test_a_faithful_lesson_passes(tmp_path):
    run = checker.run_script(write(tmp_path, LESSON))
    assert run.problems() == []
    assert run.ns["HERE"] == tmp_path.resolve()  # __file__ is set as for `python lesson.py`
    assert run.printed[2].splitlines()[1] == "median 1.25 ms over 7 runs"


def mutations(line: str):
    """Every one-character substitution, deletion and insertion of a line."""
    for i in range(len(line) + 1):
        if i < len(line):
            yield line[:i] + ("x" if line[i] != "x" else "y") + line[i + 1 :]
            yield line[:i] + line[i + 1 :]
        yield line[:i] + "x" + line[i:]


@pytest.mark.parametrize("line", DOCUMENTED)
def test_every_one_character_edit_of_a_documented_line_fails(tmp_path, line):
    run = checker.run_script(write(tmp_path, LESSON))
    for i, mutated in enumerate(mutations(line)):
        run.cells = checker.read_cells(write(tmp_path, LESSON.replace(f"# {line}\n", f"# {mutated}\n")))
        assert run.problems(), f"edit {i} went unnoticed: {mutated!r}"


def test_a_mismatch_names_lesson_and_cell_and_shows_a_diff(tmp_path):
    (found,) = problems(tmp_path, LESSON.replace("48 bytes\n", "64 bytes\n"))
    assert "lesson.py, cell 2: printed output differs" in found
    assert "-strides (3, 1), storage 64 bytes" in found
    assert "+strides (3, 1), storage 48 bytes" in found
    assert "median «time» ms" in found and "+median 1.25" not in found  # placeholder lines match


def test_a_printing_cell_without_a_block_is_an_error(tmp_path):
    (found,) = problems(tmp_path, LESSON.replace("quiet = 1", "print('new')"))
    assert "cell 4: prints but no Output: block follows it" in found


def test_a_block_after_a_silent_cell_is_an_error(tmp_path):
    (found,) = problems(tmp_path, LESSON + "\n# %% [markdown]\n# Output:\n# ```text\n# 1\n# ```\n")
    assert "cell 5: an Output: block after a cell that printed nothing" in found


def test_an_unknown_placeholder_is_an_error(tmp_path):
    found = problems(tmp_path, LESSON.replace("«time»", "«tme»"))
    assert any("unknown placeholder «tme»" in p for p in found)


def test_placeholders_match_only_their_kind():
    assert checker.line_matches("took «time» s", "took 0.031 s")
    assert not checker.line_matches("took «time» s", "took fast s")
    assert not checker.line_matches("(«number»)", "5)")
    assert checker.line_matches("at «address»", "at 0x7f3a2c")
    assert not checker.line_matches("at «address»", "at 7f3a2c")


def test_an_exception_names_the_cell_and_stops_the_run(tmp_path):
    (found,) = problems(tmp_path, LESSON.replace('HERE = Path', '1 / 0\nHERE = Path'))
    assert "lesson.py, cell 2 raised" in found and "ZeroDivisionError" in found


def test_deprecation_and_future_warnings_fail_unless_allowed(tmp_path):
    text = LESSON.replace("quiet = 1", "import warnings\nwarnings.warn('old api', FutureWarning)")
    run = checker.run_script(write(tmp_path, text))
    assert any("FutureWarning" in p and "old api" in p for p in run.problems())
    run.allowed_warnings = ("old api",)
    assert run.problems() == []


def test_the_notebook_is_checked_the_same_way(tmp_path):
    script = write(tmp_path, LESSON.replace("48 bytes\n", "64 bytes\n"))
    notebooks.notebook_path(script).write_text(notebooks.render(script))
    (found,) = checker.run_notebook(notebooks.notebook_path(script)).problems()
    assert "lesson.ipynb, cell 2: printed output differs" in found


def test_a_bare_expression_in_the_notebook_is_an_error(tmp_path):
    script = write(tmp_path, LESSON.replace("quiet = 1", "quiet = 1\nquiet"))
    notebooks.notebook_path(script).write_text(notebooks.render(script))
    (found,) = checker.run_notebook(notebooks.notebook_path(script)).problems()
    assert "cell 4 ends with a bare expression" in found


def test_notebooks_are_deterministic_and_staleness_is_detected(tmp_path):
    script = write(tmp_path, LESSON)
    assert notebooks.render(script) == notebooks.render(script)
    notebooks.notebook_path(script).write_text(notebooks.render(script))
    assert notebooks.stale([script]) == []
    script.write_text(LESSON.replace("quiet = 1", "quiet = 2"))
    assert notebooks.stale([script]) == [notebooks.notebook_path(script)]


def test_a_block_after_prose_is_an_error(tmp_path):
    text = LESSON.replace("# # A synthetic lesson\n",
                          "# # A synthetic lesson\n\n# %% [markdown]\n# Output:\n# ```text\n# x\n# ```\n")
    (found,) = problems(tmp_path, text)
    assert "cell 2: an Output: block that follows no code cell" in found


def test_the_script_runs_as_the_main_module(tmp_path):
    """Code that looks a function's globals up through its module (torch.compile, pickle)
    finds the lesson's globals, as under `python lesson.py`."""
    text = LESSON.replace("quiet = 1", "import sys\nquiet = sys.modules[quiet_fn().__module__].HERE\n"
                          "print(quiet == HERE)")
    text = text.replace("from pathlib import Path\n",
                        "from pathlib import Path\ndef quiet_fn():\n    return quiet_fn\n")
    text += "\n# %% [markdown]\n# Output:\n# ```text\n# True\n# ```\n"
    run = checker.run_script(write(tmp_path, text))
    assert run.problems() == []
    assert sys.modules["__main__"].__dict__ is not run.ns  # restored afterwards


def test_a_failure_ends_with_how_to_accept_an_intended_change(tmp_path):
    run = checker.run_script(write(tmp_path, LESSON.replace("48 bytes\n", "64 bytes\n")))
    assert run.report().endswith("if the change is intended, run `make outputs` and review `git diff`")
    assert checker.update_hint("lessons/07b_attention_kernels/attention_kernels.py").endswith(
        "run `make outputs N=07b` and review `git diff`")
    with pytest.raises(checker.LessonError, match="make outputs"):
        run.check()
    assert "make outputs" not in checker.run_script(write(tmp_path, LESSON.replace("1 / 0", ""))).report()


# A cell that cannot do its work on a CPU without vector instructions documents what it prints
# there in a second block; the checker picks the block by the machine it runs on.
CONDITIONAL = LESSON + '''
# %%
import torch
print("skipped: no vector ISA" if torch.backends.cpu.get_cpu_capability() == "DEFAULT" else "compiled")

# %% [markdown]
# Output:
# ```text
# compiled
# ```
#
# ```text when=no-vector-isa
# skipped: no vector ISA
# ```
'''


@pytest.mark.parametrize("isa", ["AVX2", "DEFAULT"])
def test_a_conditional_block_is_expected_exactly_where_its_condition_holds(tmp_path, monkeypatch, isa):
    monkeypatch.setattr(checker, "cpu_capability", lambda: isa)
    monkeypatch.setattr("torch.backends.cpu.get_cpu_capability", lambda: isa)
    assert checker.run_script(write(tmp_path, CONDITIONAL)).problems() == []
    # the other machine's line is wrong here, in either direction
    other = "compiled" if isa == "DEFAULT" else "skipped: no vector ISA"
    swapped = CONDITIONAL.replace('else "compiled")', f'else "{other}")').replace(
        '"skipped: no vector ISA" if', f'"{other}" if')
    (found,) = checker.run_script(write(tmp_path, swapped)).problems()
    assert "cell 5: printed output differs" in found


def test_conditional_blocks_are_located_for_rewriting(monkeypatch):
    cell = "Output:\n```text\na\n```\n\n```text when=no-vector-isa\nb\nc\n```\nprose"
    monkeypatch.setattr(checker, "cpu_capability", lambda: "AVX512")
    assert checker.applicable_block(cell) == (2, 3) and checker.documented_block(cell) == ["a"]
    monkeypatch.setattr(checker, "cpu_capability", lambda: "DEFAULT")
    assert checker.applicable_block(cell) == (6, 8) and checker.documented_block(cell) == ["b", "c"]
    assert checker.applicable_block("prose\n```text\na\n```") is None
    assert checker.applicable_block("Output:\nno block") == (0, 0)


def test_an_unknown_condition_is_an_error(tmp_path):
    text = CONDITIONAL.replace("when=no-vector-isa", "when=quantum")
    found = checker.run_script(write(tmp_path, text)).problems()
    assert any("unknown Output condition when=quantum" in p for p in found)


def test_the_notebook_takes_its_expected_blocks_from_the_script(tmp_path):
    """The notebook may hide its blocks (collapsed for predict-before-reveal); the script
    decides what is expected, and a notebook whose code differs from the script is stale."""
    script = write(tmp_path, LESSON)
    nb = notebooks.build(script)
    nb.cells[2].source = "<details><summary>Expected output</summary>\n\nanything\n\n</details>"
    import nbformat

    nbformat.write(nb, notebooks.notebook_path(script))
    assert checker.run_notebook(notebooks.notebook_path(script)).problems() == []
    script.write_text(LESSON.replace("48 bytes\n", "64 bytes\n"))
    (found,) = checker.run_notebook(notebooks.notebook_path(script)).problems()
    assert "cell 2: printed output differs" in found
    script.write_text(LESSON.replace("quiet = 1", "quiet = 2"))
    (found,) = checker.run_notebook(notebooks.notebook_path(script)).problems()
    assert "is stale (cell 4's code differs from the script's)" in found


def test_the_command_line_applies_the_manifests_allowed_warnings(monkeypatch):
    from scripts import manifest

    lesson = next(candidate for candidate in manifest.ready() if candidate.allowed_warnings)
    assert checker.allowed_warnings(lesson.script) == lesson.allowed_warnings
    assert checker.allowed_warnings(Path("/tmp/elsewhere.py")) == ()


def test_the_word_placeholders_match_one_word_only():
    for isa in ("AVX512", "AVX2", "DEFAULT", "SVE256", "Z VECTOR", "NO AVX"):
        assert checker.line_matches("kernels «isa»", f"kernels {isa}")
    for bad in ("avx2", "AVX2 and more", "", "AVX2,"):
        assert not checker.line_matches("kernels «isa»", f"kernels {bad}")
    assert checker.line_matches("clock from «name»", "clock from cpufreq")
    assert not checker.line_matches("clock from «name»", "clock from two words")


def test_compiled_flex_attention_condition_follows_pytorchs_own_check(monkeypatch):
    import sys as _sys

    import torch._inductor.kernel.flex.flex_cpu as flex_cpu

    for supported in (True, False):
        monkeypatch.setattr(flex_cpu, "check_cpu_supported", lambda: supported)
        assert checker.CONDITIONS["no-cpu-flex-attention"]() is (not supported)
    monkeypatch.setitem(_sys.modules, "torch._inductor.kernel.flex.flex_cpu", None)  # import fails
    monkeypatch.setattr(checker, "cpu_capability", lambda: "DEFAULT")
    assert checker.cpu_flex_attention_unsupported()

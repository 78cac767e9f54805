"""`make outputs`: Output blocks rewritten from what the lesson prints, placeholders kept or
refused, prose untouched. Synthetic lessons (no torch: fast) and a copy of lesson 01."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts import checker, manifest, notebooks, outputs

LESSON = '''# %% [markdown]
# # A synthetic lesson
#
# Prose with a fence-like line:
# ```text
# not an output
# ```

# %%
print("strides (3, 1), storage 48 bytes")
print(f"median {1.25:.2f} ms over 7 runs")
print("count 3")

# %% [markdown]
# Output:
# ```text
# strides (3, 1), storage 64 bytes
# median «time» ms over 7 runs
# count 2
# ```
#
# Prose after the block: `count` went up.

# %%
quiet = 1
'''


def write(tmp_path: Path, text: str) -> Path:
    script = tmp_path / "lesson.py"
    script.write_text(text)
    return script


def block(script: Path, number: int) -> list[str]:
    return checker.documented_block(checker.read_cells(script)[number - 1].source)


def changed_lines(before: str, after: str) -> list[str]:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def test_blocks_are_rewritten_placeholders_kept_prose_untouched(tmp_path, capsys):
    script = write(tmp_path, LESSON)
    assert outputs.main([str(script)]) == 0
    after = script.read_text()
    assert block(script, 3) == ["strides (3, 1), storage 48 bytes", "median «time» ms over 7 runs", "count 3"]
    assert changed_lines(LESSON, after) == [
        "-# strides (3, 1), storage 64 bytes", "+# strides (3, 1), storage 48 bytes",
        "-# count 2", "+# count 3",
    ]
    assert checker.run_script(script).problems() == []
    assert notebooks.notebook_path(script).read_text() == notebooks.render(script)
    out = capsys.readouterr().out
    assert "1 of 1 Output blocks updated" in out and "  cell 2: 2 lines changed" in out
    # a second run finds nothing to do and writes nothing
    assert outputs.main([str(script)]) == 0
    assert script.read_text() == after and "Nothing changed." in capsys.readouterr().out
    # with the blocks right, a stale notebook is still brought in line
    notebooks.notebook_path(script).write_text("{}")
    assert outputs.main([str(script)]) == 0
    assert notebooks.notebook_path(script).read_text() == notebooks.render(script)
    assert "  regenerated " in capsys.readouterr().out


def test_a_placeholder_line_that_no_longer_matches_is_refused(tmp_path, capsys):
    text = LESSON.replace("over 7 runs\")", "over 9 runs\")")
    script = write(tmp_path, text)
    assert outputs.main([str(script)]) == 1
    out = capsys.readouterr().out
    assert "cell 2, line 2 of its Output block: 'median «time» ms over 7 runs' has a placeholder" in out
    assert "'median 1.25 ms over 9 runs'" in out and "refused; nothing changed" in out
    assert script.read_text() == text and not notebooks.notebook_path(script).exists()


def test_placeholder_lines_are_aligned_when_lines_are_added_before_them(tmp_path):
    script = write(tmp_path, LESSON.replace('print("strides', 'print("new line")\nprint("strides'))
    assert outputs.main([str(script)]) == 0
    assert block(script, 3) == ["new line", "strides (3, 1), storage 48 bytes",
                                "median «time» ms over 7 runs", "count 3"]


def test_a_script_that_raises_changes_nothing(tmp_path, capsys):
    text = LESSON.replace("quiet = 1", "quiet = 1 / 0")
    script = write(tmp_path, text)
    assert outputs.main([str(script)]) == 1
    out = capsys.readouterr().out
    assert "cell 4 raised" in out and "ZeroDivisionError" in out and "nothing changed" in out
    assert script.read_text() == text


def test_a_printing_cell_without_a_block_is_an_error_not_a_new_block(tmp_path, capsys):
    text = LESSON.replace("quiet = 1", "print('new')")
    script = write(tmp_path, text)
    assert outputs.main([str(script)]) == 1
    assert "cell 4 prints but no Output: block follows it" in capsys.readouterr().out
    assert script.read_text() == text


def test_an_empty_block_is_filled(tmp_path):
    text = LESSON.replace("quiet = 1", "print('new')") + "\n# %% [markdown]\n# Output:\n# ```text\n# ```\n"
    script = write(tmp_path, text)
    assert outputs.main([str(script)]) == 0
    assert block(script, 5) == ["new"]
    assert checker.run_script(script).problems() == []


CONDITIONAL = '''# %%
print("fast path: 3 kernels")

# %% [markdown]
# Output:
# ```text
# fast path: 2 kernels
# ```
#
# ```text when=no-vector-isa
# skipped: no vector ISA
# ```
'''


@pytest.mark.parametrize("no_vector_isa", [False, True])
def test_only_the_block_that_applies_here_is_rewritten(tmp_path, monkeypatch, no_vector_isa):
    monkeypatch.setitem(checker.CONDITIONS, "no-vector-isa", lambda: no_vector_isa)
    script = write(tmp_path, CONDITIONAL)
    assert outputs.main([str(script)]) == 0
    plain = "fast path: 3 kernels" if not no_vector_isa else "fast path: 2 kernels"
    other = "fast path: 3 kernels" if no_vector_isa else "skipped: no vector ISA"
    assert f"# {plain}\n# ```\n#\n# ```text when=no-vector-isa\n# {other}\n" in script.read_text()


def test_make_outputs_on_a_copy_of_lesson_01_changes_one_block(tmp_path, capsys):
    lesson = manifest.find("01")
    folder = tmp_path / lesson.folder
    shutil.copytree(lesson.dir, folder, ignore=shutil.ignore_patterns("*.png", "__pycache__"))
    script = folder / lesson.script.name
    assert outputs.main([str(script)]) == 0  # nothing to do, unless lesson 01 is being edited
    before = script.read_text()
    old_print = 'print(f"x {x.tolist()}")'
    assert before.count(old_print) == 1
    script.write_text(before.replace(old_print, 'print(f"x = {x.tolist()}")'))
    capsys.readouterr()
    assert outputs.main([str(script)]) == 0
    assert changed_lines(before, script.read_text()) == [
        '-print(f"x {x.tolist()}")', '+print(f"x = {x.tolist()}")',
        "-# x [[0, 1, 2], [3, 4, 5]]", "+# x = [[0, 1, 2], [3, 4, 5]]",
    ]
    assert "  cell 4: 1 line changed\n" in capsys.readouterr().out
    # the blocks read back as printed (outputs.verify), and the notebook follows the script
    assert notebooks.notebook_path(script).read_text() == notebooks.render(script)


def test_make_outputs_without_n_updates_every_lesson_in_turn(tmp_path, monkeypatch, capfd):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    drifted = write(tmp_path / "a", LESSON)
    refused = write(tmp_path / "b", LESSON.replace("over 7 runs\")", "over 9 runs\")"))
    before = refused.read_text()
    fake = [SimpleNamespace(number="01", script=drifted), SimpleNamespace(number="02", script=refused)]
    monkeypatch.setattr(outputs, "ready", lambda: fake)
    assert outputs.main([]) == 1
    out = capfd.readouterr().out
    assert "1 of 1 Output blocks updated" in out and "refused; nothing changed" in out
    assert out.rstrip().endswith("1 of 2 lessons done; refused or failed: 02")
    assert block(drifted, 3)[2] == "count 3" and refused.read_text() == before

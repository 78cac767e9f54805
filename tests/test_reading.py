"""Issue 25: every lesson's closing cells (Summary, Read the source, Mastery check, Exercises),
every source stop verified against the installed torch, and lessons/READING.md in sync."""

from __future__ import annotations

import re

import pytest

from scripts import manifest, reading
from scripts.reading import sourcemap

READY = manifest.ready()
ids = {"ids": lambda lesson: lesson.number}

# The stops issue 25 names: the reading path must visit each.
ISSUE_STOPS = ["torch/_tensor.py", "torch/include/c10/core/TensorImpl.h", "torch/overrides.py",
               "torch/include/ATen/core/dispatch/Dispatcher.h", "torch/include/c10/core/DispatchKey.h",
               "torchgen/packaged/ATen/native/native_functions.yaml", "torchgen/gen.py",
               "torch/autograd/graph.py", "torch/include/torch/csrc/autograd/engine.h",
               "torch/nn/functional.py", "torch/_dynamo/eval_frame.py",
               "torch/_functorch/aot_autograd.py", "torch/_inductor/compile_fx.py",
               "torch/distributed/device_mesh.py", "torch/distributed/tensor/parallel/",
               "torch/distributed/fsdp/", "torch/distributed/pipelining/schedules.py",
               "torch/distributed/checkpoint/", "torch/distributed/run.py"]


@pytest.mark.parametrize("lesson", READY, **ids)
def test_closing_cells_in_order(lesson):
    assert reading.closing_problems(lesson) == []


@pytest.mark.parametrize("lesson", READY, **ids)
def test_read_the_source_stops_exist_in_the_installed_torch(lesson):
    stops = reading.stops(lesson.script)
    assert 3 <= len(stops) <= 6, f"{lesson.folder}: {len(stops)} stops (3 to 6)"
    assert [p for stop in stops if (p := reading.stop_problem(stop))] == []
    assert len({stop[0] for stop in stops}) == len(stops), "one stop per file"


@pytest.mark.parametrize("lesson", READY, **ids)
def test_mastery_check_answers_are_collapsed_and_backed(lesson):
    assert reading.mastery_problems(lesson) == []


def test_stop_problems_are_caught():
    """The checks can fail: a moved file, a renamed symbol, a malformed or shipped repo path."""
    assert "no file" in reading.stop_problem(("torch/no_such.py", "x", "y"))
    assert "no longer contains" in reading.stop_problem(("torch/_tensor.py", "def no_such_fn(", "y"))
    assert "three non-empty" in reading.stop_problem(("torch/_tensor.py", "", "y"))
    assert "C++/CUDA file" in reading.stop_problem(("pytorch:README.md", "x", "y"))
    assert "ships it" in reading.stop_problem(("pytorch:c10/core/TensorImpl.h", "x", "y"))
    assert "no library" in reading.stop_problem(("pytorch:aten/src/ATen/native/NoSuchFile.cpp", "x", "y"))
    assert reading.stop_problem(("pytorch:aten/src/ATen/native/TensorShape.cpp", "Tensor view(", "y")) is None
    assert reading.stop_problem(("torch/_tensor.py", "class Tensor(", "y")) is None


def test_repository_links_use_the_pinned_release_tag():
    """No test reaches the network: the form of every link is what is checked."""
    pinned = reading.pinned_torch()
    repo = [s for lesson in READY for s in reading.stops(lesson.script) if s[0].startswith(sourcemap.REPO)]
    for path, _, _ in repo:
        url = sourcemap.link(path)
        assert re.fullmatch(rf"https://github\.com/pytorch/pytorch/blob/v{re.escape(pinned)}/"
                            rf"{re.escape(path.removeprefix(sourcemap.REPO))}", url), url


def test_find_line_points_at_the_text():
    line = sourcemap.find_line("torchgen/packaged/ATen/native/native_functions.yaml",
                               "func: mm(Tensor self, Tensor mat2) -> Tensor")
    text = (sourcemap.site_root() / "torchgen/packaged/ATen/native/native_functions.yaml").read_text()
    assert "func: mm(Tensor self, Tensor mat2) -> Tensor" in text.splitlines()[line - 1]
    assert sourcemap.release() == reading.pinned_torch()


def test_read_the_source_prints_paths_and_links(capsys):
    sourcemap.read_the_source([("torch/_tensor.py", "class Tensor(", "look here"),
                               ("pytorch:aten/src/ATen/native/TensorShape.cpp", "Tensor view(", "and here")])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"torch {sourcemap.release()} installed in {sourcemap.site_root()}"
    assert re.fullmatch(r"torch/_tensor\.py:\d+  `class Tensor\(`", out[1]) and out[2] == "    look here"
    assert out[3] == sourcemap.link("pytorch:aten/src/ATen/native/TensorShape.cpp")
    assert out[4] == "    search for `Tensor view(`: and here"


def test_what_to_look_for_is_wrapped_under_its_stop(capsys):
    look = " ".join(["word"] * 60)
    sourcemap.read_the_source([("torch/_tensor.py", "class Tensor(", look)])
    out = capsys.readouterr().out.splitlines()[2:]
    assert len(out) > 1 and all(len(line) <= sourcemap.WIDTH and line.startswith("    ") for line in out)
    assert " ".join(line.strip() for line in out) == look


def test_reading_path_covers_the_issue_and_is_in_sync():
    on_path = [path for _, _, path in reading.PATH]
    missing = [s for s in ISSUE_STOPS if not any(p.startswith(s) for p in on_path)]
    assert missing == []
    for _, number, path in reading.PATH:
        reading.stop_by_path(manifest.find(number), path)  # raises when the lesson lacks it
    assert reading.READING.read_text() == reading.render(), "lessons/READING.md is stale: run `make reading`"


def test_each_rubric_item_is_the_question_named():
    assert reading.rubric_problems() == []
    lesson = manifest.find("01")
    assert "y = x.t()" in reading.question(lesson, 1) and reading.question(lesson, 9) == ""


def test_mastery_answers_must_name_a_real_section():
    lesson = manifest.find("01")
    assert reading.answer_problems(lesson, "Because it copies.")  # names nothing
    assert reading.answer_problems(lesson, "It copies (*§ No such heading*).")
    assert reading.answer_problems(lesson, "See *03a § No such heading*.")

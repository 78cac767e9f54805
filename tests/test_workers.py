"""The code each rank runs is in its lesson: workers are generated from #@worker cells
(scripts/workers.py), in sync, and make no distributed call the lesson's code does not show."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scripts import manifest, workers

MULTIRANK = [lesson for lesson in manifest.ready() if lesson.ranks > 1]
NOT_GENERATED = ("test_", "exercises", "solutions")  # tests and exercise files are not rank code


def own_modules(lesson: manifest.Lesson) -> list:
    """The lesson folder's Python files other than its script, tests and exercises."""
    return [p for p in sorted(lesson.dir.glob("*.py"))
            if p != lesson.script and not p.stem.startswith(NOT_GENERATED)]


def test_distributed_calls_resolve_imports_and_skip_text():
    code = (
        "import torch\nimport torch.distributed as dist\n"
        "from torch.distributed.fsdp import fully_shard as shard\n"
        "from torch.distributed import tensor\n"
        "def f(model, x):\n"
        "    dist.all_reduce(x)\n    shard(model)\n    torch.distributed.barrier()\n"
        "    tensor.distribute_tensor(x, None)\n    x.redistribute()\n    torch.ones(2)\n"
        "    print('dist.broadcast(x)')  # dist.all_gather(x)\n"
    )
    assert workers.distributed_calls(code) == {
        "torch.distributed.all_reduce", "torch.distributed.fsdp.fully_shard",
        "torch.distributed.barrier", "torch.distributed.tensor.distribute_tensor"}


def lesson_with(tmp_path, script_text: str, ranks: int = 2) -> manifest.Lesson:
    folder = tmp_path / "09_demo"
    folder.mkdir()
    (folder / "demo.py").write_text(script_text)
    lesson = manifest.Lesson("09", "09_demo", "Demo", "", (), (), ranks, 10, "ready")
    return lesson, folder


SCRIPT = '''# %% [markdown]
# # Demo

# %%
#@worker
import torch.distributed as dist
from multirank import heading, say, serve  # noqa: E402 - after the lesson's first cell

# %%
x = 1

# %%
#@worker
def total():
    heading("total")
    t = torch.ones(1)
    dist.all_reduce(t)
    say(f"{t.item()}")


def main():
    serve({"total": total})
'''


def test_render_keeps_the_cells_in_order_and_ends_with_main(tmp_path):
    lesson, folder = lesson_with(tmp_path, SCRIPT)
    sources = workers.worker_cells(folder / "demo.py")
    assert list(sources) == ["worker.py"] and len(sources["worker.py"]) == 2
    text = workers.render(lesson, "worker.py", sources["worker.py"])
    assert "#@worker" not in text.split('"""', 2)[2]  # the marker lines are dropped
    assert text.index("import torch.distributed") < text.index("def total") < text.index("def main")
    assert text.endswith('if __name__ == "__main__":\n    main()\n')
    assert "where PART is one of: total." in text and "--nproc-per-node=2" in text
    assert "noqa" not in text  # needed in the lesson, unused in the worker (RUF100)
    compile(text, "worker.py", "exec")


def test_a_worker_cell_that_runs_something_is_refused(tmp_path):
    lesson, folder = lesson_with(tmp_path, SCRIPT.replace("def main():", "print('hi')\n\n\ndef main():"))
    with pytest.raises(ValueError, match="runs something"):
        workers.render(lesson, "worker.py", workers.worker_cells(folder / "demo.py")["worker.py"])


def test_worker_cells_without_main_are_refused(tmp_path):
    lesson, folder = lesson_with(tmp_path, SCRIPT.replace("def main():\n    serve", "def other():\n    serve"))
    with pytest.raises(ValueError, match="must define main"):
        workers.render(lesson, "worker.py", workers.worker_cells(folder / "demo.py")["worker.py"])


@dataclasses.dataclass(frozen=True)
class TmpLesson(manifest.Lesson):
    """A lesson whose folder is a temporary one (manifest.Lesson's folder is under lessons/)."""
    root: Path = Path()

    @property
    def dir(self) -> Path:
        return self.root / self.folder


def test_the_check_names_a_stale_worker(tmp_path, monkeypatch, capsys):
    (tmp_path / "09_demo").mkdir()
    (tmp_path / "09_demo" / "demo.py").write_text(SCRIPT)
    lesson = TmpLesson("09", "09_demo", "Demo", "", (), (), 2, 10, "ready", root=tmp_path)
    worker = tmp_path / "09_demo" / "worker.py"
    monkeypatch.setattr(workers, "ready", lambda: [lesson])
    assert workers.stale([lesson]) == [worker]  # missing
    assert workers.main(["--check"]) == 1 and "stale worker:" in capsys.readouterr().out
    assert workers.main([]) == 0 and worker.exists() and workers.stale([lesson]) == []
    worker.write_text(worker.read_text().replace("dist.all_reduce(t)", "dist.broadcast(t, 0)"))  # edited by hand
    assert workers.stale([lesson]) == [worker]
    assert workers.main(["--check"]) == 1 and str(worker) in capsys.readouterr().out


def test_workers_are_in_sync():
    stale = [str(p.relative_to(manifest.ROOT)) for p in workers.stale(manifest.ready())]
    assert not stale, f"stale workers {stale}: regenerate them with `make notebooks`"


@pytest.mark.parametrize("lesson", MULTIRANK, ids=lambda lesson: lesson.number)
def test_rank_code_is_in_the_lesson(lesson: manifest.Lesson):
    """Every distributed call of the folder's own modules (the generated worker, a shared
    model) is also a call in the lesson's code cells, and only generated files make them."""
    generated = set(workers.generated(lesson))
    assert generated, f"{lesson.folder}: a multi-rank lesson writes its worker from #@worker cells"
    shown = workers.distributed_calls(workers.lesson_code(lesson.script))
    for path in own_modules(lesson):
        calls = workers.distributed_calls(path.read_text())
        if path not in generated:
            assert not calls, f"{path.name} is written by hand but calls {sorted(calls)}: move it into #@worker cells"
        hidden = calls - shown
        assert not hidden, f"{path.name} calls {sorted(hidden)}, which no code cell of {lesson.script.name} shows"


@pytest.mark.parametrize("lesson", MULTIRANK, ids=lambda lesson: lesson.number)
def test_every_worker_section_is_shown(lesson: manifest.Lesson):
    """Each `heading("name")` a worker prints is a section the lesson's code shows."""
    shown = workers.shown_sections(workers.lesson_code(lesson.script))
    for path, text in workers.generated(lesson).items():
        names = workers.headings(text)
        assert None not in names, f"{path.name}: heading() takes a literal name, so the lesson can be checked"
        missing = sorted(set(names) - shown)
        assert not missing, f"{path.name} prints sections {missing} that {lesson.script.name} never shows"

"""scripts/gpu_report.py without a GPU: the CPU path, the report writer on synthetic results,
the collector on a synthetic lesson, a dry run with the GPU machine's package set (no notebook
tools), and the checker's jupytext-free reader of lesson scripts, cell for cell against jupytext."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts import checker, gpu_report, manifest
from scripts.gpu_report import Device, LessonResult, Result

ROOT = Path(__file__).resolve().parents[1]
# What the GPU machine's python3 lacks (it has torch, numpy, matplotlib, pytest, pytest-timeout,
# pytest-xdist, safetensors): importing any of these fails there, so it fails here too.
ABSENT = ("jupytext", "nbformat", "nbclient", "ipykernel", "IPython", "jupyter_client", "jupyter_core")


@pytest.fixture
def device_env(tmp_path):
    """The environment of a process (and its children) that cannot import the notebook tools."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nfor n in {ABSENT!r}:\n    sys.modules[n] = None\n")
    return {**os.environ, "PYTHONPATH": str(site)}


def tree(folder: Path) -> dict:
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.exists() else {}


# ------------------------------------------------------------------------------------------
# The CPU path and the dry run


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_one_line_exit_0_nothing_written(device_env):
    before = tree(ROOT / "results"), tree(gpu_report.WORK)
    out = subprocess.run([sys.executable, "-m", "scripts.gpu_report"], cwd=ROOT, env=device_env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [gpu_report.NO_GPU]
    assert "no CUDA GPU found" in out.stdout and "nothing measured" in out.stdout
    assert (tree(ROOT / "results"), tree(gpu_report.WORK)) == before


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_dry_run_collects_without_the_notebook_tools(device_env, tmp_path):
    results = tree(ROOT / "results")
    probe = subprocess.run([sys.executable, "-c", "import jupytext"], env=device_env, capture_output=True, text=True)
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr  # the poison works
    out = subprocess.run([sys.executable, "-m", "scripts.gpu_report", "--dry-run", "--lessons", "06a",
                          "--out", str(tmp_path)],
                         cwd=ROOT, env=device_env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    text = (tmp_path / "dry-run.md").read_text()
    assert "**Nothing was measured**" in text and "## 06a Devices and honest timing" in text
    # every GPU test of the lesson collected, none passed, failed or erred: all skipped
    row = re.search(r"^\| 06a Devices and honest timing \| (\d+) \| 0 \| 0 \| 0 \| (\d+) \|", text, re.M)
    assert row and int(row[1]) == int(row[2]) > 0, text
    assert text.count("needs CUDA: torch.cuda.is_available() is False") == int(row[1])
    assert tree(ROOT / "results") == results


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_dry_run_of_every_gpu_lesson(device_env, tmp_path):
    out = subprocess.run([sys.executable, "-m", "scripts.gpu_report", "--dry-run", "--out", str(tmp_path)],
                         cwd=ROOT, env=device_env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    text = (tmp_path / "dry-run.md").read_text()
    for lesson in manifest.ready():
        if {"cuda", "multigpu"} & set(lesson.devices):
            assert f"## {lesson.number} {lesson.title}" in text
    assert "did not complete" not in text and "— failed" not in text and "— error" not in text


# ------------------------------------------------------------------------------------------
# The collector and the lesson runner, on a synthetic lesson (no torch in its process)

SYNTHETIC = '''
import math, os, time
import pytest

@pytest.mark.cuda
def test_slow():  # first: under load it is reached well before the runner's time limit
    time.sleep(float(os.environ.get("SYNTHETIC_SLEEP", "0")))

@pytest.mark.cuda
def test_figure(record_property):
    record_property("bf16 matmul [TFLOP/s]", 612.5)
    record_property("backend", "FLASH_ATTENTION")
    print("cuda: 4096x4096 matmul, bf16 612.5 TFLOP/s")

@pytest.mark.cuda
def test_no_figure():
    assert True

@pytest.mark.cuda
def test_missing_api():
    math.no_such_api()

@pytest.fixture
def broken():
    raise RuntimeError("setup broke")

@pytest.mark.cuda
def test_setup_error(broken):
    pass

@pytest.mark.multigpu
def test_two_gpus():
    pass

def test_cpu_only():  # not marked: never selected
    pass
'''

CONFTEST = '''
import pytest

def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("multigpu"):
            item.add_marker(pytest.mark.skip(reason="needs 2 CUDA devices: torch.cuda.device_count() is 1"))
'''


@pytest.fixture
def synthetic(tmp_path):
    folder = tmp_path / "99_synthetic"
    folder.mkdir()
    (folder / "test_synthetic.py").write_text(SYNTHETIC)
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    cuda: x\n    multigpu: y\n")
    work = tmp_path / "work"
    work.mkdir()
    return SimpleNamespace(number="99", title="Synthetic", devices=("cuda", "multigpu"), dir=folder), work


def test_collector_records_outcomes_reasons_and_figures(synthetic):
    lesson, work = synthetic
    r = gpu_report.run_lesson(lesson, work, lesson_s=120, test_s=60)
    assert not r.problem, r.log_tail
    got = {t.nodeid.split("::")[-1]: t for t in r.tests}
    assert set(got) == {"test_figure", "test_no_figure", "test_missing_api", "test_setup_error",
                        "test_two_gpus", "test_slow"}  # test_cpu_only was deselected
    assert got["test_figure"].outcome == "passed"
    assert got["test_figure"].figures == [["bf16 matmul [TFLOP/s]", 612.5], ["backend", "FLASH_ATTENTION"]]
    assert got["test_figure"].printed == "cuda: 4096x4096 matmul, bf16 612.5 TFLOP/s\n"
    assert got["test_figure"].markers == ["cuda"]
    assert got["test_no_figure"].figures == []
    assert got["test_missing_api"].outcome == "failed"
    assert got["test_missing_api"].reason == "AttributeError: module 'math' has no attribute 'no_such_api'"
    assert "math.no_such_api()" in got["test_missing_api"].details
    assert got["test_setup_error"].outcome == "error"
    assert got["test_setup_error"].reason == "RuntimeError: setup broke (in setup)"
    assert got["test_two_gpus"].outcome == "skipped" and got["test_two_gpus"].markers == ["multigpu"]
    assert got["test_two_gpus"].reason == "needs 2 CUDA devices: torch.cuda.device_count() is 1"
    assert r.count("passed") == 3 and r.count("failed") == 1 and r.count("error") == 1
    assert "1 failed" in r.log_tail  # pytest's own summary, kept for a run that failed


def test_a_lesson_that_hangs_is_stopped_and_reported(synthetic, monkeypatch):
    lesson, work = synthetic
    monkeypatch.setenv("SYNTHETIC_SLEEP", "120")
    r = gpu_report.run_lesson(lesson, work, lesson_s=6, test_s=60)
    assert r.problem == "timed out after 6 s and was stopped"
    assert r.seconds < 60
    assert "test_synthetic.py::test_slow" in r.log_tail  # the log names the test that hung
    text = gpu_report.render(None, [r], "today", r.seconds, "cmd")
    assert "**The run did not complete: timed out after 6 s and was stopped.**" in text


# ------------------------------------------------------------------------------------------
# The report writer, on synthetic device info and results


def h200(torch="2.11.0+cu130", count=1):
    return Device("NVIDIA H200", count, "compute capability 9.0, 132 multiprocessors, 139.8 GiB",
                  "580.159.03", "13.0", "91002", torch, "2.13.0", "3.12.3",
                  ceilings=[["bf16 matmul 8192x8192x8192, random data [TFLOP/s]", 781.2]])


def synthetic_results():
    mixed = "lessons/05b_mixed_precision/test_mixed_precision.py"
    kernels = "lessons/07b_attention_kernels/test_attention_kernels.py"
    fig = Result(f"{mixed}::test_matmul_tflops_per_dtype[cuda]", "passed", ["cuda"], 2.5,
                 figures=[["bf16 matmul 4096 [TFLOP/s]", 612.34], ["peak memory [MiB]", 1536.0], ["backend", "FLASH"]],
                 printed="cuda 4096x4096 matmul: bf16 612.3 TFLOP/s\n")
    bare = Result(f"{mixed}::test_cuda_autocast_dtypes", "passed", ["cuda"], 0.1)
    api = Result(f"{kernels}::test_cuda_flex_attention_backward", "failed", ["cuda"], 3.0,
                 reason="AttributeError: module 'torch.nn.attention' has no attribute 'new_thing'",
                 details="E   AttributeError: module 'torch.nn.attention' has no attribute 'new_thing'")
    plain = Result(f"{kernels}::test_cuda_backends_time_and_memory", "failed",
                   ["cuda"], 9.0, reason="AssertionError: assert 120.0 < 100.0",
                   details="E   AssertionError: assert 120.0 < 100.0")
    two = Result("lessons/09_collectives_and_dtensor/test_collectives_and_dtensor.py::test_worker_on_nccl", "skipped",
                 ["multigpu"], 0.0, reason="needs 2 CUDA devices: torch.cuda.device_count() is 1")
    return [
        LessonResult("05b", "Mixed-precision training", ["cuda"], [fig, bare], 12.0),
        LessonResult("07b", "Attention kernels", ["cuda"], [api, plain], 30.0),
        LessonResult("08b", "Inductor", ["cuda"], [], 200.0, problem="timed out after 200 s and was stopped",
                     log_tail="... Timeout ..."),
        LessonResult("09", "Collectives and DTensor", ["multigpu"], [two], 4.0),
    ]


def test_report_on_synthetic_results():
    text = gpu_report.render(h200(), synthetic_results(), "2026-12-01 10:00 UTC", 251.0, "python -m scripts.gpu_report")
    assert text.startswith("# GPU report: NVIDIA H200 × 1\n")
    assert "on 2026-12-01 10:00 UTC, in 251 s" in text
    for row in ("| device | 1 × NVIDIA H200: compute capability 9.0, 132 multiprocessors, 139.8 GiB |",
                "| driver | 580.159.03 |", "| CUDA (torch's build) | 13.0 |", "| cuDNN | 91002 |",
                "| Python | 3.12.3 |"):
        assert row in text
    assert "| torch | 2.11.0+cu130: **not the course's pin (torch==2.13.0)**" in text
    # the summary: one row per lesson, counts and notes
    assert "| 05b Mixed-precision training | 2 | 2 | 0 | 0 | 0 | 3 | 12 s |  |" in text
    assert "| 07b Attention kernels | 2 | 0 | 2 | 0 | 0 | 0 | 30 s | failures naming a missing API: 1 |" in text
    assert "| 08b Inductor | 0 | 0 | 0 | 0 | 0 | 0 | 200 s | timed out after 200 s and was stopped |" in text
    assert "| 09 Collectives and DTensor | 1 | 0 | 0 | 0 | 1 | 0 | 4 s | needs ≥ 2 GPUs (unverified): 1 |" in text
    # figures, with the unit split off the name, the ceilings, and what a test printed
    assert "| bf16 matmul 4096 | 612.3 | TFLOP/s |" in text
    assert "| peak memory | 1536 | MiB |" in text and "| backend | FLASH |  |" in text
    assert "| bf16 matmul 8192x8192x8192, random data | 781.2 | TFLOP/s |" in text
    assert "```text\ncuda 4096x4096 matmul: bf16 612.3 TFLOP/s\n```" in text
    assert "### `test_cuda_autocast_dtypes` — passed (0.1 s)\n\nIt recorded no figure" in text
    # failures: an API the torch that ran lacks is called the version; any other says to rerun on the pin
    flex = text.split("### `test_cuda_flex_attention_backward` — failed (3.0 s)\n\n")[1].splitlines()[0]
    assert flex.startswith("AttributeError: module 'torch.nn.attention' has no attribute 'new_thing' — ")
    assert "**looks like the torch version**: an API missing or changed in torch 2.11.0+cu130" in flex
    backends = text.split("### `test_cuda_backends_time_and_memory` — failed (9.0 s)\n\n")[1].splitlines()[0]
    assert backends.endswith("ran on torch 2.11.0+cu130, not the pin 2.13.0: rerun on 2.13.0 before blaming the lesson")
    assert "<details><summary>traceback (end)</summary>" in text
    assert "**The run did not complete: timed out after 200 s and was stopped.**" in text
    assert "... Timeout ..." in text
    assert "needs ≥ 2 GPUs: unverified here (needs 2 CUDA devices: torch.cuda.device_count() is 1)" in text


def test_report_on_the_pin_blames_no_version():
    text = gpu_report.render(h200(torch="2.13.0+cu130"), synthetic_results(), "d", 1.0, "c")
    assert "| torch | 2.13.0+cu130: the course's pin |" in text
    assert "looks like the torch version" not in text and "rerun on" not in text
    assert "AttributeError: module 'torch.nn.attention' has no attribute 'new_thing'\n" in text


def test_device_slug_and_pin():
    assert h200().slug == "nvidia-h200" and h200(count=2).slug == "nvidia-h200-x2"
    assert h200().off_pin and not h200(torch="2.13.0+cu130").off_pin
    assert gpu_report.pinned_torch() == "2.13.0"


def test_the_gpu_lessons_are_chosen_from_the_manifest_and_the_markers():
    chosen = {lesson.number for lesson in gpu_report.gpu_lessons(None)}
    for lesson in manifest.ready():
        tests = "".join(p.read_text() for p in lesson.dir.glob("test_*.py"))
        gpu = ({"cuda", "multigpu"} & set(lesson.devices)
               or "pytest.mark.cuda" in tests or "pytest.mark.multigpu" in tests)
        assert (lesson.number in chosen) == bool(gpu), lesson.number
    assert [lesson.number for lesson in gpu_report.gpu_lessons(["08b", "01"])] == ["01", "08b"]


# ------------------------------------------------------------------------------------------
# The checker without jupytext: the same cells as jupytext for every lesson script

try:
    import jupytext
except ImportError:  # the course's venv has it; without it there is nothing to compare with
    jupytext = None
needs_jupytext = pytest.mark.skipif(jupytext is None, reason="needs jupytext to compare with")


def percent_scripts():
    scripts = manifest.lesson_scripts() + sorted((ROOT / "tests" / "fixtures").glob("*.py"))
    return [s for s in scripts if "# %%" in s.read_text()]


def cells_by_jupytext(text):
    return [(c.cell_type, c.source) for c in jupytext.reads(text, fmt="py:percent").cells]


@needs_jupytext
@pytest.mark.parametrize("script", percent_scripts(), ids=lambda p: p.parent.name)
def test_fallback_reader_equals_jupytext_on_every_lesson(script):
    text = script.read_text(encoding="utf-8")
    cells = checker.read_percent(text, str(script))
    assert [(c.kind, c.source) for c in cells] == cells_by_jupytext(text)
    assert [c.number for c in cells] == list(range(1, len(cells) + 1))


@needs_jupytext
@pytest.mark.parametrize("text", [
    "# %%\nx = 1\n\n\n\n# %% [markdown]\n# hi\n#\n#  two\n\n# %%\ny = 2\n",  # 3 blank lines: one dropped
    "# %%\nx = 1\n\n\ny = 2\n\n# %%\nz\n",  # blank lines inside a cell stay
    "# %%\n\n# %%\nx\n", "# %%\n\n\n# %%\nx\n", "# %%\n\n\n\n# %%\nx\n\n\n",  # empty cells
    "# %% [markdown]\n# a\nplain\n\n# %%\nx\n", "# %% [md]\n# a\n", "# %%\n## x\n#x\n",
    "# %% [markdown]\n# %time x\n# cd here\n# why?\n",  # markdown is only uncommented
    "# %%\nx\n  # %%\ny\n", "#%%\nx\n", "# %%  \nx\n# %% [markdown]  \n# y\n", "# %%\r\nx = 1\r\n",
    "# %%\nx\n \t\n# %%\ny\n", "# %%\nx = 1", "# %%", "",
])
def test_fallback_reader_equals_jupytext_on_edge_cases(text):
    assert [(c.kind, c.source) for c in checker.read_percent(text)] == cells_by_jupytext(text)


@pytest.mark.parametrize("text", [
    "x = 1\n# %%\ny\n",  # code before the first marker
    "# ---\n# jupyter:\n# ---\n# %%\nx\n",  # a jupytext header
    "# %% title\nx\n", "# %%[markdown]\n# a\n", "# %% [raw]\nx\n", "# In[1]:\nx\n",  # markers it does not read
    "# %%\n# %time x\n", "# %%\n# !ls\n", "# %%\n# cd here\n", "# %%\n# why?\n", "# %%\n# y = %who\n",  # magics
])
def test_fallback_reader_refuses_what_it_would_read_differently(text):
    with pytest.raises(ValueError):
        checker.read_percent(text)


@needs_jupytext
def test_read_cells_without_jupytext_gives_jupytext_cells(device_env):
    scripts = percent_scripts()
    code = ("import json, sys; from pathlib import Path; from scripts import checker; "
            "print(json.dumps([[(c.kind, c.source) for c in checker.read_cells(Path(p))] for p in sys.argv[1:]]))")
    out = subprocess.run([sys.executable, "-c", code, *map(str, scripts)], cwd=ROOT, env=device_env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == [[list(c) for c in cells_by_jupytext(s.read_text(encoding="utf-8"))] for s in scripts]


# ------------------------------------------------------------------------------------------
# The GPU path's wiring, with a fake device in this process and the synthetic lesson


def test_main_with_a_fake_gpu_writes_the_device_report(synthetic, monkeypatch, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    lesson, work = synthetic
    monkeypatch.setattr(gpu_report, "gpu_lessons", lambda numbers: [lesson] if numbers == ["99"] else [])
    monkeypatch.setattr(gpu_report, "WORK", work)
    props = SimpleNamespace(name="Fake GPU 9000", major=9, minor=0, multi_processor_count=132, total_memory=141 * 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    monkeypatch.setattr(gpu_report, "driver_version", lambda: "580.159.03")
    code = gpu_report.main(["--lessons", "99", "--no-ceilings", "--out", str(tmp_path)])
    assert code == 1, capsys.readouterr().out  # the synthetic lesson has a failure and an error
    text = (tmp_path / "fake-gpu-9000.md").read_text()
    assert text.startswith("# GPU report: Fake GPU 9000 × 1\n")
    assert "| device | 1 × Fake GPU 9000: compute capability 9.0, 132 multiprocessors, 141.0 GiB |" in text
    assert "| driver | 580.159.03 |" in text and "| cuDNN | 91002 |" in text
    assert "| torch | 2.11.0+cu130: **not the course's pin (torch==2.13.0)**" in text
    assert "python -m scripts.gpu_report --lessons 99 --no-ceilings --out" in text
    assert "| 99 Synthetic | 6 | 3 | 1 | 1 | 1 | 2 |" in text
    assert "failures naming a missing API: 1" in text  # math.no_such_api, on a torch off the pin
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"gpu-report: wrote {tmp_path / 'fake-gpu-9000.md'} (2 failed, erred or incomplete)"

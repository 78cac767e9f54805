"""PyTorch's diagnostic noise stays out of a course run (scripts/quiet.py), and the checks see it.

Each probe is a fresh `python` of the course's venv, as a student's terminal run is: the venv's
course-root.pth runs scripts.quiet at start-up. The noisy variant turns that off
(COURSE_TORCH_NOISE=1, KINETO_LOG_LEVEL unset) and must show the lines, so a probe that
could not see them fails instead of passing.
"""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import sysconfig
import tokenize
from pathlib import Path

import pytest
import torch

from scripts import checker, deps, manifest, quiet
from scripts.checker import read_cells

# Starts and stops the profiler once, then imports the module that looks for a CUDA toolkit.
PROBE = """
import torch
from torch.profiler import profile
with profile():
    torch.ones(3) + 1
import torch.utils.cpp_extension
print("probe ran")
"""
CUDA_BUILD_WITHOUT_GPU = torch.version.cuda is not None and not torch.cuda.is_available()


def probe(tmp_path: Path, noisy: bool) -> str:
    """The probe's stderr. CUDA_HOME names an existing folder, so that a CUDA build without a
    GPU always meets the 'No CUDA runtime' case, whatever toolkit this machine has."""
    env = {k: v for k, v in os.environ.items() if k not in ("KINETO_LOG_LEVEL", "COURSE_TORCH_NOISE")}
    env["CUDA_HOME"] = str(tmp_path)
    if noisy:
        env["COURSE_TORCH_NOISE"] = "1"
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "probe ran", done.stderr
    return done.stderr


def test_the_venv_runs_the_quieting_at_start_up():
    pth = Path(sysconfig.get_paths()["purelib"]) / deps.PTH_NAME
    root = Path(pth.read_text().splitlines()[0])  # the checkout that made the venv (this one, or a worktree's)
    assert pth.read_text() == deps.pth_text(root), f"{pth} is not what `make install` writes: run it"
    assert os.environ.get("KINETO_LOG_LEVEL") == quiet.KINETO_SILENT, (
        f"this process has {quiet.switches()}: unset both to run the suite as students run it")


def test_a_plain_run_prints_no_profiler_lines(tmp_path):
    noisy = quiet.noise_lines(probe(tmp_path, noisy=True))
    assert any(line.startswith("USDT:") and "profiler_start" in line for line in noisy), noisy
    assert quiet.noise_lines(probe(tmp_path, noisy=False)) == []


@pytest.mark.skipif(not CUDA_BUILD_WITHOUT_GPU, reason="needs a CUDA build of torch on a machine "
                    f"without a GPU (torch.version.cuda is {torch.version.cuda}, "
                    f"cuda available: {torch.cuda.is_available()})")
def test_a_cuda_build_without_a_gpu_prints_no_cuda_lines(tmp_path):
    noisy = probe(tmp_path, noisy=True)
    assert "gpuGetDeviceCount failed" in noisy and quiet.NO_CUDA_RUNTIME in noisy, noisy
    assert quiet.noise_lines(probe(tmp_path, noisy=False)) == []


def test_the_filter_drops_only_the_no_cuda_runtime_record():
    logger = logging.getLogger(quiet.CPP_EXTENSION_LOGGER)
    quiet.install()
    quiet.install()  # idempotent: one filter
    assert sum(getattr(f, "course_quiet", False) for f in logger.filters) == 1  # start-up's included
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)  # called only for records the logger's filters let through
    try:
        logger.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local/cuda")
        logger.warning("Error checking compiler version for %s", "c++")
    finally:
        logger.removeHandler(handler)
    assert seen == ["Error checking compiler version for c++"]


@pytest.mark.parametrize("line, expected", [
    ("USDT:2026-12-01 18:24:54 23882:23882 SyncActivityProfilerHandler.cpp:52] profiler_start", True),
    ("STAGE:2026-12-01 18:24:54 23882:23882 SyncActivityProfilerHandler.cpp:51] Completed Stage: Warm Up", True),
    ("ERROR:2026-12-01 20:18:21 5673:5673 DeviceProperties.cpp:50] gpuGetDeviceCount failed with code 35", True),
    ("W1201 20:18:28.069000 5727 torch/utils/cpp_extension.py:178] No CUDA runtime is found, "
     "using CUDA_HOME='/usr/local'", True),
    ("UserWarning: 'pin_memory' argument is set as true but no accelerator is found", False),  # lesson 04b's
    ("rank 0: USDT: is a word a lesson may print", False),
])
def test_noise_lines_are_recognised(line, expected):
    assert quiet.is_noise(line) is expected


NOISY_LESSON = '''# %%
import logging, os
os.write(2, b"USDT:2026-12-01 18:24:54 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\\n")
logging.getLogger("torch.somewhere").warning("No CUDA runtime is found, using CUDA_HOME='/x'")
'''


def test_the_checker_fails_a_script_run_that_shows_noise(tmp_path):
    script = tmp_path / "lesson.py"
    script.write_text(NOISY_LESSON)
    (found,) = checker.run_script(script).problems()
    assert checker.NOISE in found and "(2 lines)" in found and "profiler_start" in found, found
    script.write_text(NOISY_LESSON.replace("USDT:", "plain:").replace("No CUDA", "Some CUDA"))
    assert checker.run_script(script).problems() == []


def test_the_capture_passes_stderr_on_as_it_comes(tmp_path):
    """What a lesson writes to file descriptor 2 reaches the real stderr during the run, so
    that a run that dies takes nothing of it along (the copy runs every 0.1 s)."""
    script = tmp_path / "lesson.py"
    script.write_text('# %%\nimport os, time\nos.write(2, b"written before the crash\\n")\ntime.sleep(0.5)\n'
                      'os.abort()\n')
    done = subprocess.run([sys.executable, "-m", "scripts.checker", str(script)], capture_output=True,
                          text=True, cwd=manifest.ROOT, timeout=120)
    assert done.returncode < 0 and "written before the crash" in done.stderr, done


def test_the_checker_fails_a_launch_whose_ranks_show_noise():
    from scripts import multirank  # the kit, as the lessons import it

    logs = {(0, 0): ("rank 0: fine\n", ""), (0, 1): ("", "USDT:2026 1:1 X.cpp:52] profiler_stop\n")}
    run = multirank.Run(code=0, seconds=1.0, timed_out=False, agent="", logs=logs, exit_codes={0: 0, 1: 0})
    assert checker.launch_noise({"run": run, "other": 3}) == ["USDT:2026 1:1 X.cpp:52] profiler_stop"]
    quiet_run = multirank.Run(code=0, seconds=1.0, timed_out=False, agent="", logs={(0, 0): ("", "")},
                              exit_codes={0: 0})
    assert checker.launch_noise({"run": quiet_run}) == []


def test_the_checker_fails_a_notebook_whose_kernel_shows_real_profiler_lines(tmp_path, monkeypatch):
    from scripts import notebooks

    script = tmp_path / "lesson.py"
    script.write_text("# %%\nimport torch\nwith torch.profiler.profile():\n    torch.ones(2) + 1\n")
    notebooks.notebook_path(script).write_text(notebooks.render(script))
    # (the quiet case is every lesson's notebook test; this one needs only the noisy kernel)
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    monkeypatch.setenv("COURSE_TORCH_NOISE", "1")  # the kernel starts as a plain python would
    (found,) = checker.run_notebook(notebooks.notebook_path(script)).problems()
    assert checker.NOISE in found and "cell 1: USDT:" in found, found


# What starts libkineto, and what imports torch.utils.cpp_extension (Inductor does), in code.
PROFILES = re.compile(r"torch\.profiler|profiler\.profile")
COMPILES = re.compile(r"torch\.compile\b|(?<!\bre)\.compile\(|_inductor|cpp_extension")
HOW_TO_RUN_MARK = "PyTorch's own diagnostic line"


def code_of(path: Path) -> str:
    """The code of a Python file without its comments and strings."""
    kept = (tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.NEWLINE)
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return "".join(t.string if t.type != tokenize.NEWLINE else "\n" for t in tokens if t.type in kept)


def how_to_run(lesson: manifest.Lesson) -> str:
    opening = read_cells(lesson.script)[0].source
    return " ".join(opening[opening.index("**How to run:**"):].split())


@pytest.mark.parametrize("lesson", manifest.ready(), ids=lambda lesson: lesson.number)
def test_how_to_run_says_what_a_plain_run_may_print(lesson):
    """What the student runs — the lesson script, and a worker whose `torchrun` command the
    How to run gives — decides the sentence: the profiler's lines where it profiles, the
    compiler's where it compiles, and no such sentence where it does neither."""
    text, script = how_to_run(lesson), code_of(lesson.script)
    worker = lesson.dir / "worker.py"
    by_hand = code_of(worker) if "torchrun" in text and worker.exists() else ""
    profiles, compiles = bool(PROFILES.search(script + by_hand)), bool(COMPILES.search(script))
    if profiles:
        assert "USDT: ... profiler_start" in text, f"lesson {lesson.number} profiles: say what that may print"
    if compiles:
        assert "No CUDA runtime is found" in text, f"lesson {lesson.number} compiles: say what that may print"
    if not (profiles or compiles):
        assert HOW_TO_RUN_MARK not in text, f"lesson {lesson.number} neither profiles nor compiles"


def test_the_code_scan_sees_profiling_and_compiling(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("# torch.profiler in a comment\nPATTERN = re.compile('x')\ns = 'torch.compile('\n")
    assert not PROFILES.search(code_of(sample)) and not COMPILES.search(code_of(sample))
    sample.write_text("with torch.profiler.profile():\n    pass\n")
    assert PROFILES.search(code_of(sample))
    sample.write_text("fast = model.compile(backend='aot_eager')\n")
    assert COMPILES.search(code_of(sample))
    sample.write_text("@torch.compile\ndef f(x):\n    return x\n")
    assert COMPILES.search(code_of(sample))

"""Keep PyTorch's own diagnostic noise out of what a student sees, in every Python of the venv.

`make install` writes a line into the venv's ``course-root.pth`` that runs this file (by its
path, with ``runpy``, so that the ``scripts`` package is not imported at start-up; skipped
under ``COURSE_TORCH_NOISE=1`` or when the file is gone, and never an error) and calls
:func:`install`, so a lesson run from a terminal, a notebook kernel, a torchrun agent and its
ranks, and the course's tools all start quiet. Nothing here is imported by a lesson:
a lesson may import only the kit and the source map, and a student should not have to read
filtering code to follow one.

What it hides, and why it cannot be switched off one line at a time:

- libkineto (the profiler's C++ side) writes ``USDT:... profiler_start`` and
  ``profiler_stop`` to the process's stderr each time a profiler starts and stops (tens of
  lines in a lesson that profiles), and on a CUDA build without a GPU
  ``ERROR:... gpuGetDeviceCount failed with code 35``. Its level switch is the environment
  variable ``KINETO_LOG_LEVEL`` (0 verbose, 1 info, 2 warning, 3 stage, 4 error, 5 USDT, read
  when the profiler first starts); USDT is its highest level, so only 6 silences it, and with
  it libkineto's own warnings and errors. On a GPU that includes CUPTI's ("CUPTI
  initialization failed", insufficient privileges): a profile that shows no CUDA kernels is
  the sign; rerun with ``COURSE_TORCH_NOISE=1`` to see why (lessons/TROUBLESHOOTING.md).
  Python-level profiler warnings are not affected.
- ``torch.utils.cpp_extension`` logs ``No CUDA runtime is found, using CUDA_HOME=...`` when a
  CUDA build that finds a CUDA toolkit on disk runs without a GPU (Inductor imports it, so
  every compiling lesson would show it). A logging filter drops that one record; every other
  warning of that logger, and of PyTorch, still shows.

Both respect the student: a ``KINETO_LOG_LEVEL`` already set is kept, and
``COURSE_TORCH_NOISE=1`` turns this module off (to see what a plain run prints).
"""

from __future__ import annotations

import logging
import os

KINETO_SILENT = "6"  # above libkineto's highest level (USDT = 5)
CPP_EXTENSION_LOGGER = "torch.utils.cpp_extension"
NO_CUDA_RUNTIME = "No CUDA runtime is found"

# What marks the lines a student must never see from a course run: the first two start a line
# (libkineto's level names), the others stand within one (tests and the checker look for them).
NOISE_MARKERS = ("USDT:", "STAGE:", "gpuGetDeviceCount failed", NO_CUDA_RUNTIME)


def is_noise(line: str) -> bool:
    """Whether ``line`` is one of the diagnostic lines this module keeps out of a run."""
    text = line.strip()
    return text.startswith(("USDT:", "STAGE:")) or any(m in text for m in NOISE_MARKERS[2:])


def noise_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if is_noise(line)]


def switches() -> str:
    """This process's settings of the two switches, for a message about noise that got out."""
    return (f"KINETO_LOG_LEVEL={os.environ.get('KINETO_LOG_LEVEL', '(unset)')}, "
            f"COURSE_TORCH_NOISE={os.environ.get('COURSE_TORCH_NOISE', '(unset)')}")


class NoCudaRuntimeFilter(logging.Filter):
    """Drops cpp_extension's 'No CUDA runtime is found' record, and nothing else."""

    course_quiet = True  # how install() recognises it, whichever copy of this file made it

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NO_CUDA_RUNTIME)


def install() -> None:
    """Quiet this process and the processes it starts (idempotent; never raises)."""
    if os.environ.get("COURSE_TORCH_NOISE") == "1":
        return
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_SILENT)
    logger = logging.getLogger(CPP_EXTENSION_LOGGER)
    if not any(getattr(f, "course_quiet", False) for f in logger.filters):
        logger.addFilter(NoCudaRuntimeFilter())

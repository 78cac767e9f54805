"""The portability gate: every lesson's documented outputs, checked as on other CPUs.

    python -m scripts.portable               # every ready lesson, every simulated level
    python -m scripts.portable 03 07         # some lessons
    python -m scripts.portable --level default path/to/script.py

Students run the course on CPUs other than the one its outputs were written on. PyTorch can
be told to use fewer vector instructions than the host has, which reproduces most of what
differs between machines: which kernels run (``ATEN_CPU_CAPABILITY``), and what oneDNN and MKL
may use (``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``). Each level below the host's own
is simulated (on an AVX-512 host: AVX2, then no vector ISA at all; on an AVX2 host the AVX2
pass is the native run, so only the no-vector pass is left), and each run gets a fresh,
empty Inductor cache: on 2.13.0 the cache key ignores the vector ISA, so a kernel compiled
under one level and reloaded under another returns wrong values or corrupts the heap.

A lesson passes when its script's documented-output check passes (``scripts.checker``), and
each failure's full report is kept in ``build/portable/<level>-<name>.log``. Exit status 1 when
any run failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from scripts.manifest import BUILD, ROOT, find, ready

# From the most capable to the least. Each is (ATen kernels, oneDNN cap, MKL cap).
LEVELS: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}
OUT = BUILD / "portable"


def host_capability() -> str:
    """What PyTorch's CPU kernels use on this machine, e.g. "AVX512", "AVX2", "DEFAULT"."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {k: v for k, v in os.environ.items() if k not in LEVELS["avx2"]}
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, check=True).stdout.strip()


def levels_below(capability: str) -> list[str]:
    """The simulated levels that differ from the host's own."""
    if capability.startswith("AVX512"):
        return ["avx2", "default"]
    if capability == "DEFAULT":
        return []  # nothing below: the native run is the no-vector run
    return ["default"]  # AVX2, or another family (Arm's SVE, POWER's VSX): no vectors at all


@dataclass
class Result:
    level: str
    name: str  # "03" for a lesson, the file name for another script
    ok: bool
    seconds: float
    log: Path


def check(script: Path, name: str, level: str, limit: float) -> Result:
    """Run the checker on one script under one simulated level, with a fresh Inductor cache."""
    cache = OUT / "inductor" / f"{level}-{name}"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, **LEVELS[level], "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    log = OUT / f"{level}-{name}.log"
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "scripts.checker", str(script)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=limit)
        ok, text = proc.returncode == 0, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        ok, text = False, f"timed out after {limit:.0f} s\n{e.stdout or ''}{e.stderr or ''}"
    log.write_text(text if isinstance(text, str) else text.decode())
    shutil.rmtree(cache, ignore_errors=True)
    return Result(level, name, ok, time.perf_counter() - start, log)


def targets(names: list[str]) -> list[tuple[Path, str, float]]:
    """(script, name, time limit) for each lesson number or script path asked for."""
    if not names:
        return [(lesson.script, lesson.number, max(300.0, 5 * lesson.budget_s)) for lesson in ready()]
    out = []
    for n in names:
        if n.endswith(".py"):
            out.append((Path(n).resolve(), Path(n).stem, 300.0))
        else:
            lesson = find(n)
            out.append((lesson.script, lesson.number, max(300.0, 5 * lesson.budget_s)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check documented outputs under simulated CPUs.")
    parser.add_argument("lessons", nargs="*", help="lesson numbers or script paths (default: all)")
    parser.add_argument("--level", action="append", choices=list(LEVELS),
                        help="simulate only this level (repeatable); default: every level below the host's")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    args = parser.parse_args(argv)
    host = host_capability()
    levels = args.level or levels_below(host)
    print(f"host CPU capability {host}; simulating: {', '.join(levels) or 'nothing below it'}", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    jobs = [(s, n, lvl, lim) for lvl in levels for s, n, lim in targets(args.lessons)]
    results = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for r in pool.map(lambda j: check(*j[:2], j[2], j[3]), jobs):
            status = "ok" if r.ok else f"FAILED (see {r.log.relative_to(ROOT)})"
            print(f"{r.level:<8} {r.name:<24} {status} in {r.seconds:.1f} s", flush=True)
            results.append(r)
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(f"\n--- {r.level} {r.name} ---\n{r.log.read_text().strip()}")
    print(f"\nportability: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

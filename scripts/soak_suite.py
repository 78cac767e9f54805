"""Run the whole `make test` suite many times, on one or more venvs, and name every test that failed.

    python -m scripts.soak_suite --runs 10 [--markers "not slow"] [--venv .venv --venv build/venv-3.12 ...]
    make soak-suite RUNS=10 [PYTHONS='...']      # .venv, then build/venv-X.Y of each PYTHONS

The runs go round-robin over the venvs (so a machine's state drifts over all of them alike).
Each run is `pytest -n 2 --dist loadfile -m MARKERS`, as `make test` runs it (the Makefile
passes its PYTEST_MARKERS), with a JUnit report under build/soak-suite/; nothing is retried.
The Inductor cache is the tools' shared one, warm after the first run: a flake that needs a
cold cache shows in the first run only (the portability gate runs cold). At the end: one line per run (venv,
Python, torch, counts, seconds) and every test that failed or errored, with the runs it failed
in and the first line of its message. The exit status is 1 when any run failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from scripts.manifest import ROOT

OUT = ROOT / "build" / "soak-suite"


@dataclass
class Result:
    run: int
    venv: str
    version: str  # "Python 3.12.1, torch 2.13.0+cu130"
    seconds: float
    code: int
    counts: dict = field(default_factory=dict)  # tests, failures, errors, skipped
    failed: dict = field(default_factory=dict)  # test id -> first line of its message


def failures(report: Path) -> tuple[dict, dict]:
    """The counts and the failed or errored tests ({id: message}) of a JUnit report."""
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = {}
    for case in suite.iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            text = (bad.get("message") or bad.text or "").strip()
            failed[name] = text.splitlines()[0][:160] if text else ""
    return counts, failed


def describe(python: Path) -> str:
    code = "import sys, torch; print(f'Python {sys.version.split()[0]}, torch {torch.__version__}')"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or f"(cannot import torch: {done.stderr.strip()[-200:]})"


def run_once(number: int, venv: Path, markers: str, extra: list[str]) -> Result:
    python = venv / "bin" / "python"
    report = OUT / f"run-{number:02d}.xml"
    report.unlink(missing_ok=True)
    command = [str(python), "-m", "pytest", "-n", "2", "--dist", "loadfile", "-m", markers, "-q",
               f"--junitxml={report}", *extra]
    start = time.monotonic()
    with open(OUT / f"run-{number:02d}.log", "w") as log:
        code = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    result = Result(number, str(venv), describe(python), time.monotonic() - start, code)
    if report.exists():
        result.counts, result.failed = failures(report)
    elif code != 0:
        result.failed = {"(no report)": f"pytest exited {code}: see {OUT / f'run-{number:02d}.log'}"}
    return result


def summary(results: list[Result]) -> str:
    lines = ["run  venv                  version                                 tests  failed  seconds  exit"]
    for r in results:
        bad = r.counts.get("failures", 0) + r.counts.get("errors", 0) if r.counts else len(r.failed)
        lines.append(f"{r.run:>3}  {r.venv:<20}  {r.version:<38}  {r.counts.get('tests', 0):>5}  "
                     f"{bad:>6}  {r.seconds:>7.0f}  {r.code:>4}")
    seen: dict[str, list[Result]] = {}
    for r in results:
        for name in r.failed:
            seen.setdefault(name, []).append(r)
    if seen:
        lines.append("\nFailed at least once:")
        for name, where in sorted(seen.items()):
            runs = ", ".join(f"run {r.run} ({Path(r.venv).name})" for r in where)
            lines.append(f"- {name}: {runs}\n    {where[0].failed[name]}")
    else:
        lines.append(f"\nNo test failed in {len(results)} runs.")
    if exits := [r for r in results if r.code != 0 and not r.failed]:
        lines.append("Runs that exited non-zero with no failed test (see their logs): "
                     + ", ".join(f"run {r.run} (exit {r.code})" for r in exits))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--markers", default="not slow", help='pytest -m, as `make test` (default "not slow")')
    parser.add_argument("--venv", type=Path, action="append", help="a venv with the course installed "
                        "(repeat for several; default: .venv)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    args = parser.parse_args(argv)
    venvs = args.venv or [ROOT / ".venv"]
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    for number in range(1, args.runs + 1):
        venv = venvs[(number - 1) % len(venvs)]
        result = run_once(number, venv, args.markers, args.pytest_args)
        results.append(result)
        print(f"run {number}/{args.runs} on {venv}: exit {result.code}, {result.seconds:.0f} s, "
              f"failed: {', '.join(result.failed) or 'none'}", flush=True)
    text = summary(results)
    (OUT / "summary.txt").write_text(text + "\n")
    print(text)
    return 0 if all(not r.failed and r.code == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

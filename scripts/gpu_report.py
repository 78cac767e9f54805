"""The GPU half of the course in one command: every `cuda` and `multigpu` test, lesson by
lesson, and what the GPU did, written to ``results/gpu/<device-slug>.md``.

    python -m scripts.gpu_report                  # make gpu-report / make gpu-report-here
    python -m scripts.gpu_report --lessons 07b 08b  # some lessons only
    python -m scripts.gpu_report --dry-run        # no GPU needed: every GPU test is collected
                                                  # and skipped; the report goes under build/

Without a CUDA device it prints one line and writes nothing. With one, it records the device,
the driver, CUDA, cuDNN and torch versions next to the course's pin (the GPU machine that can
be lent has its own torch, not the pin), measures two ceilings (copy bandwidth, matmul rate),
then runs each lesson's GPU tests in a pytest process of its own (a crash or a hang costs one
lesson, not the report) and writes, per lesson, what passed, failed or was skipped and why,
with every figure the tests recorded (``record_property(name, value)``, a unit in brackets at
the end of the name: ``"bf16 matmul [TFLOP/s]"``) and what they printed.

This module is also the pytest plugin that collects those reports in each lesson's process
(``-p scripts.gpu_report --gpu-report-json PATH``). It imports only the standard library at the
top: the GPU machine's python3 has torch and pytest but none of the notebook tools.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "gpu"
WORK = ROOT / "build" / "gpu-report"
MARKS = "cuda or multigpu"  # mps is Apple's: another machine, another report
GPU_MARKERS = ("cuda", "multigpu")
NO_GPU = "gpu-report: no CUDA GPU found (torch.cuda.is_available() is False): nothing measured, nothing written"
# Failure texts that point at an API the torch that ran lacks (or has changed): with another
# torch than the pin, such a failure is the version before it is the lesson.
MISSING_API = re.compile(
    r"has no attribute|cannot import name|No module named|unexpected keyword argument"
    r"|positional argument|is not a valid|KeyError: '[A-Z_]+'|NotImplementedError"
)
# Seconds: all lessons together (the whole report stays under 5 minutes on one H200), one
# lesson's pytest process, one test (pytest-timeout).
BUDGET_S, LESSON_S, TEST_S = 270, 180, 150


# ------------------------------------------------------------------------------------------
# The plugin: one lesson's pytest process writes its reports as JSON


@dataclass
class Result:
    nodeid: str
    outcome: str = "passed"  # passed, failed, error (in setup or teardown), skipped
    markers: list[str] = field(default_factory=list)
    seconds: float = 0.0
    reason: str = ""  # the skip reason, or the failure's exception line
    figures: list[list] = field(default_factory=list)  # [name, value] from record_property
    printed: str = ""  # what the test printed (captured stdout)
    details: str = ""  # the end of the failure's traceback


def pytest_addoption(parser) -> None:
    parser.addoption("--gpu-report-json", default=None, help="write each test's report here (scripts/gpu_report.py)")


def pytest_configure(config) -> None:
    if path := config.getoption("--gpu-report-json"):
        config.pluginmanager.register(Collector(Path(path)), "gpu-report-collector")


def crash_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash else str(report.longrepr)
    return text.strip().splitlines()[0] if text.strip() else "(no message)"


def skip_reason(report) -> str:
    if isinstance(report.longrepr, tuple):  # (path, line, "Skipped: why")
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return crash_line(report)


class Collector:
    def __init__(self, path: Path):
        self.path, self.tests, self.markers = path, {}, {}

    def pytest_collection_finish(self, session) -> None:
        for item in session.items:
            self.markers[item.nodeid] = [m for m in GPU_MARKERS if item.get_closest_marker(m)]

    def pytest_runtest_logreport(self, report) -> None:
        t = self.tests.setdefault(report.nodeid, Result(report.nodeid, markers=self.markers.get(report.nodeid, [])))
        t.seconds += report.duration
        if report.skipped:
            t.outcome, t.reason = "skipped", skip_reason(report)
        elif report.failed and t.outcome not in ("failed", "error"):  # the first failure counts
            t.outcome = "failed" if report.when == "call" else "error"
            t.reason = crash_line(report) + ("" if report.when == "call" else f" (in {report.when})")
            t.details = "\n".join(report.longreprtext.splitlines()[-40:])
        if report.when == "call":
            t.figures = [[k, v] for k, v in report.user_properties if k not in ("exercise", "not_attempted")]
            t.printed = "".join(text for name, text in report.sections if name == "Captured stdout call")

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        tests = [asdict(t) for t in self.tests.values()]
        self.path.write_text(json.dumps({"exit": int(exitstatus), "tests": tests}, default=repr, indent=1))


# ------------------------------------------------------------------------------------------
# The device, its versions and two ceilings


@dataclass
class Device:
    name: str
    count: int
    detail: str  # compute capability, multiprocessors, memory
    driver: str
    cuda: str
    cudnn: str
    torch: str
    pin: str  # the course's torch pin, e.g. "2.13.0"
    python: str
    ceilings: list[list] = field(default_factory=list)  # [name, value] measured by this script

    @property
    def slug(self) -> str:
        base = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        return base + (f"-x{self.count}" if self.count > 1 else "")

    @property
    def off_pin(self) -> bool:
        return self.torch.split("+")[0] != self.pin


def pinned_torch() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next((d.split("==")[1] for d in deps if d.startswith("torch==")), "unpinned")


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown (no nvidia-smi)"


def probe(torch) -> Device:
    p = torch.cuda.get_device_properties(0)
    detail = (f"compute capability {p.major}.{p.minor}, {p.multi_processor_count} multiprocessors, "
              f"{p.total_memory / 2**30:.1f} GiB")
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return Device(p.name, torch.cuda.device_count(), detail, driver_version(), str(torch.version.cuda),
                  str(cudnn or "not available"), torch.__version__, pinned_torch(), platform.python_version())


def event_ms(torch, fn, warmup=3, repeats=10) -> float:
    """Median GPU time of one call of ``fn`` (the course's one CUDA timing helper)."""
    from scripts.pytest_course import cuda_median_ms

    return cuda_median_ms(fn, warmup, repeats)


def copy_gbps(torch) -> float:
    """GB/s of a device-to-device copy of 1 GiB, read + write; the buffers are freed on return."""
    x = torch.empty(2**28, device="cuda")  # 1 GiB of float32
    y = torch.empty_like(x)
    ms = event_ms(torch, lambda: y.copy_(x))
    return round(2 * x.nbytes / ms / 1e6, 1)


def ceilings(torch) -> list[list]:
    """What this device does at best, as references for the lessons' figures."""
    found = [["device-to-device copy, 1 GiB, read + write [GB/s]", copy_gbps(torch)]]
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")  # plain fp32, no TF32
        for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            n = 8192
            a, b = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))  # (n, n)
            ms = event_ms(torch, lambda: a @ b)
            found.append([f"{name} matmul {n}x{n}x{n}, random data [TFLOP/s]", round(2 * n**3 / ms / 1e9, 1)])
    finally:
        torch.set_float32_matmul_precision(before)
        torch.cuda.empty_cache()
    return found


# ------------------------------------------------------------------------------------------
# Running the lessons


@dataclass
class LessonResult:
    number: str
    title: str
    devices: list[str]
    tests: list[Result] = field(default_factory=list)
    seconds: float = 0.0
    problem: str = ""  # why the run gave no (complete) report
    log_tail: str = ""

    def count(self, outcome: str) -> int:
        return sum(t.outcome == outcome for t in self.tests)


def gpu_lessons(numbers: list[str] | None):
    """The ready lessons with a GPU section in the manifest or a GPU-marked test."""
    from scripts import manifest

    chosen = []
    for lesson in manifest.ready():
        tests = "".join(p.read_text() for p in lesson.dir.glob("test_*.py"))
        marked = any(f"pytest.mark.{m}" in tests for m in GPU_MARKERS)
        if (numbers is None and (marked or set(lesson.devices) & set(GPU_MARKERS))) or (
            numbers is not None and (lesson.number in numbers or lesson.number[:2] in numbers)  # 03: 03a, 03b
        ):
            chosen.append(lesson)
    return chosen


def lesson_command(lesson_dir: Path, out_json: Path, test_s: int) -> list[str]:
    """pytest with the course's plugin (pyproject), this one and pytest-timeout, and no other:
    the GPU machine's python3 holds many pytest plugins the course never asked for."""
    cmd = [sys.executable, "-m", "pytest", str(lesson_dir), "-m", MARKS, "-v", "-p", "no:cacheprovider",
           "-p", "scripts.gpu_report", "--gpu-report-json", str(out_json)]
    if importlib.util.find_spec("pytest_timeout"):
        cmd += ["-p", "pytest_timeout", "--timeout", str(test_s)]
    return cmd


def run_lesson(lesson, work: Path, lesson_s: int, test_s: int) -> LessonResult:
    result = LessonResult(lesson.number, lesson.title, list(lesson.devices))
    out_json, log = work / f"{lesson.number}.json", work / f"{lesson.number}.log"
    out_json.unlink(missing_ok=True)
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1",  # a hung test's log names it
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # plugins: only those lesson_command names
    with log.open("w") as sink:
        proc = subprocess.Popen(lesson_command(lesson.dir, out_json, test_s), cwd=ROOT, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            code = proc.wait(timeout=lesson_s)
        except subprocess.TimeoutExpired:
            stop(proc)
            code, result.problem = None, f"timed out after {lesson_s} s and was stopped"
    result.seconds = time.perf_counter() - t0
    if out_json.exists():
        data = json.loads(out_json.read_text())
        result.tests = [Result(**t) for t in data["tests"]]
        code = data["exit"]
    elif not result.problem:
        result.problem = f"pytest exited with code {code} before writing its report"
    if code not in (0, 5) or result.problem:  # 5: no test selected
        result.log_tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    return result


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the lesson's process group (its multi-rank harness cleans up on it), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def run_all(lessons, work: Path, budget_s: int, lesson_s: int, test_s: int) -> list[LessonResult]:
    results, t0 = [], time.perf_counter()
    for lesson in lessons:
        left = budget_s - (time.perf_counter() - t0)
        if left < 20:
            skipped = LessonResult(lesson.number, lesson.title, list(lesson.devices))
            skipped.problem = f"not run: the report's time budget ({budget_s} s) was spent"
            results.append(skipped)
            continue
        print(f"gpu-report: lesson {lesson.number} {lesson.title} ...", flush=True)
        results.append(run_lesson(lesson, work, int(min(lesson_s, left)), test_s))
        r = results[-1]
        print(f"gpu-report: lesson {lesson.number}: {r.count('passed')} passed, {r.count('failed')} failed, "
              f"{r.count('error')} errors, {r.count('skipped')} skipped ({r.seconds:.0f} s) {r.problem}", flush=True)
    return results


# ------------------------------------------------------------------------------------------
# The report


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return str(value)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def version_suspect(t: Result, device: Device | None) -> bool:
    """A failure that names an API the torch that ran lacks, when that torch is not the pin."""
    return bool(device and device.off_pin and t.outcome in ("failed", "error")
                and MISSING_API.search(t.reason + "\n" + t.details))


def name_unit(name: str) -> tuple[str, str]:
    m = re.fullmatch(r"(.*?)\s*\[([^\]]+)\]", name)
    return (m.group(1), m.group(2)) if m else (name, "")


def figure_rows(figures: list[list]) -> list[str]:
    rows = ["| figure | value | unit |", "|---|---:|---|"]
    for name, value in figures:
        label, unit = name_unit(str(name))
        rows.append(f"| {cell(label)} | {cell(fmt(value))} | {cell(unit)} |")
    return rows


def explain(t: Result, device: Device | None) -> str:
    """Why a test did not pass, in the words the report uses."""
    if t.outcome == "skipped":
        if "multigpu" in t.markers:
            return f"needs ≥ 2 GPUs: unverified here ({t.reason})"
        return t.reason
    why = t.reason
    if device and device.off_pin:
        if version_suspect(t, device):
            why += (f" — **looks like the torch version**: an API missing or changed in torch {device.torch} "
                    f"(the course is pinned to {device.pin})")
        else:
            why += (f" — ran on torch {device.torch}, not the pin {device.pin}: "
                    f"rerun on {device.pin} before blaming the lesson")
    return why


def result_section(t: Result, device: Device | None) -> list[str]:
    name = t.nodeid.split("::", 1)[-1]
    lines = [f"### `{name}` — {t.outcome} ({t.seconds:.1f} s)", ""]
    if t.outcome != "passed":
        lines += [explain(t, device).replace("\n", " "), ""]
    if t.figures:
        lines += figure_rows(t.figures) + [""]
    elif t.outcome == "passed":
        lines += ["It recorded no figure (`record_property`).", ""]
    if t.printed.strip():
        lines += ["Printed:", "", "```text", t.printed.rstrip(), "```", ""]
    if t.details:
        lines += ["<details><summary>traceback (end)</summary>", "", "```text", t.details, "```", "", "</details>", ""]
    return lines


def lesson_section(r: LessonResult, device: Device | None) -> list[str]:
    lines = [f"## {r.number} {r.title}", "",
             f"GPU sections in the manifest: {', '.join(r.devices) or 'none'}. "
             f"Tests marked {' or '.join(GPU_MARKERS)}: {len(r.tests)}, in {r.seconds:.0f} s.", ""]
    if r.problem:
        lines += [f"**The run did not complete: {r.problem}.**", ""]
    if not r.tests and not r.problem:
        lines += ["No test marked cuda or multigpu was found in this lesson.", ""]
    for t in r.tests:
        lines += result_section(t, device)
    if r.log_tail:
        lines += ["<details><summary>pytest output (end)</summary>", "", "```text", r.log_tail, "```", "",
                  "</details>", ""]
    return lines


def summary(results: list[LessonResult], device: Device | None) -> list[str]:
    rows = ["| lesson | tests | passed | failed | errors | skipped | figures | time | note |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        figures = sum(len(t.figures) for t in r.tests)
        multi = sum(t.outcome == "skipped" and "multigpu" in t.markers for t in r.tests)
        notes = [r.problem, f"needs ≥ 2 GPUs (unverified): {multi}" if multi else "",
                 f"failures naming a missing API: {n}"
                 if (n := sum(version_suspect(t, device) for t in r.tests)) else ""]
        note = "; ".join(n for n in notes if n)
        rows.append(f"| {r.number} {r.title} | {len(r.tests)} | {r.count('passed')} | {r.count('failed')} | "
                    f"{r.count('error')} | {r.count('skipped')} | {figures} | {r.seconds:.0f} s | {note} |")
    return rows


def header(device: Device | None, when: str, seconds: float, command: str) -> list[str]:
    if device is None:
        return ["# GPU report: dry run, no GPU", "",
                f"Written by `{command}` on {when} in {seconds:.0f} s on a machine without CUDA: every GPU test",
                "was collected and skipped. **Nothing was measured**; this file only shows the report's shape.", ""]
    pin = (f"**not the course's pin (torch=={device.pin})**: the lessons' documented outputs were made on "
           f"{device.pin}; a failure below may be the version (each says so)") if device.off_pin else "the course's pin"
    return [
        f"# GPU report: {device.name} × {device.count}", "",
        f"Written by `{command}` (scripts/gpu_report.py) on {when}, in {seconds:.0f} s. Every figure below",
        "was measured on this device with these versions, by the test or the step named.", "",
        "| | |", "|---|---|",
        f"| device | {device.count} × {device.name}: {device.detail} |",
        f"| driver | {device.driver} |",
        f"| CUDA (torch's build) | {device.cuda} |",
        f"| cuDNN | {device.cudnn} |",
        f"| torch | {device.torch}: {pin} |",
        f"| Python | {device.python} |", "",
    ]


def render(device: Device | None, results: list[LessonResult], when: str, seconds: float, command: str) -> str:
    lines = header(device, when, seconds, command)
    lines += ["## Summary", ""] + summary(results, device) + [""]
    if device and device.ceilings:
        lines += ["## Ceilings measured by this report (references for the figures)", "",
                  "CUDA events, median of 10 after 3 warm-ups.", ""] + figure_rows(device.ceilings) + [""]
    for r in results:
        lines += lesson_section(r, device)
    return "\n".join(lines).rstrip() + "\n"


# ------------------------------------------------------------------------------------------
# The command


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Run the course's GPU tests and write results/gpu/<device>.md")
    p.add_argument("--lessons", nargs="*", help="lesson numbers (default: every lesson with a GPU test)")
    p.add_argument("--out", type=Path,
                   help="folder for the report (default results/gpu; build/gpu-report on a dry run)")
    p.add_argument("--dry-run", action="store_true",
                   help="without a GPU: collect and skip everything, report under build/")
    p.add_argument("--budget", type=int, default=BUDGET_S, help="seconds for all lessons together")
    p.add_argument("--no-ceilings", action="store_true", help="skip the copy and matmul ceilings")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        import torch
    except ImportError as err:
        print(f"gpu-report: torch is not importable here ({err}): nothing measured, nothing written "
              "(the course's venv has it: make gpu-report)")
        return 2
    if not torch.cuda.is_available() and not args.dry_run:
        print(NO_GPU)
        return 0
    t0 = time.perf_counter()
    device = probe(torch) if torch.cuda.is_available() else None
    if device and not args.no_ceilings:
        try:
            device.ceilings = ceilings(torch)
        except Exception as err:  # noqa: BLE001 - the report says what failed and goes on
            device.ceilings = [["ceilings not measured", f"{type(err).__name__}: {err}"]]
    WORK.mkdir(parents=True, exist_ok=True)
    from scripts.manifest import normalize  # here: the report imports only the standard library at its top

    numbers = [normalize(n) for n in args.lessons] if args.lessons else None
    results = run_all(gpu_lessons(numbers), WORK, args.budget, LESSON_S, TEST_S)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = " ".join(["python -m scripts.gpu_report", *(sys.argv[1:] if argv is None else argv)])
    out = args.out or (WORK if device is None else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (f"{device.slug}.md" if device else "dry-run.md")
    path.write_text(render(device, results, when, time.perf_counter() - t0, command))
    bad = sum(r.count("failed") + r.count("error") + bool(r.problem) for r in results)
    print(f"gpu-report: wrote {path} ({bad} failed, erred or incomplete)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

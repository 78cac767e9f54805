"""The CI workflow for forks (.github/workflows/ci.yml), validated offline: it cannot run here.

check-jsonschema validates it against the GitHub-workflow schema it ships (no network), and
the tests below pin what it must do: the README's two test commands on Linux with Python
3.11 to 3.13 and the CPU wheel, and `make test` without the MPS tests on Apple silicon.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML  # comes with check-jsonschema (its YAML reader), pinned in the dev extra

from scripts import manifest

WORKFLOW = manifest.ROOT / ".github" / "workflows" / "ci.yml"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def validate(path: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def workflow() -> dict:
    return YAML(typ="safe").load(WORKFLOW.read_text())


def runs(job: dict) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def test_the_workflow_matches_githubs_schema(tmp_path):
    done = validate(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "ci.yml"  # the validation can fail: a misspelt key is caught
    broken.write_text(WORKFLOW.read_text().replace("runs-on: ubuntu-latest", "run-on: ubuntu-latest"))
    assert validate(broken).returncode != 0


def test_linux_runs_both_readme_commands_on_every_supported_python(workflow):
    linux = workflow["jobs"]["linux"]
    assert linux["strategy"]["matrix"]["python"] == ["3.11", "3.12", "3.13"]  # the README's range
    assert runs(linux) == [f"make test TORCH_INDEX={CPU_INDEX}", f"make test-portable TORCH_INDEX={CPU_INDEX}"]
    assert CPU_INDEX in (manifest.ROOT / "README.md").read_text()  # the index the README describes
    assert all(job.get("timeout-minutes") for job in workflow["jobs"].values())


def test_macos_runs_make_test_without_the_mps_tests(workflow):
    macos = workflow["jobs"]["macos"]
    assert macos["runs-on"] == "macos-14"  # Apple silicon
    assert runs(macos) == ['make test PYTEST_MARKERS="not slow and not mps"']
    # the Makefile passes the markers on to pytest as they are
    dry = subprocess.run(["make", "-n", "test", "PYTEST_MARKERS=not slow and not mps"], cwd=manifest.ROOT,
                         capture_output=True, text=True, timeout=60)
    assert re.search(r'pytest .*-m "not slow and not mps"', dry.stdout), dry.stdout

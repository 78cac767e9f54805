"""lessons/TROUBLESHOOTING.md: every section it links to exists, and every symptom issue 26
lists has an entry.

A link names a lesson script and one of its headings: `[03a § In-place hazards](03a_autograd_tape/autograd_tape.py)`
(the heading without its section number, so that renumbering keeps the link valid and
renaming breaks it).
"""

from __future__ import annotations

import re

import pytest

from scripts import manifest
from scripts.reading import headings

GUIDE = manifest.LESSONS / "TROUBLESHOOTING.md"
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")  # [text](target)
SECTION = re.compile(r"(\d\d[a-z]?) § (.+)")  # the text of a link to a lesson section
ENTRY = re.compile(r"^### (.+)$", re.M)  # one entry per symptom

# The symptoms issue 26 names (its "Course-level" part); each must head exactly one entry.
REQUIRED = [
    "a view error",
    "an unexpected copy",
    "a slow kernel after a permute",
    "the saved-tensor version error",
    "nan or inf in training",
    "a graph break",
    "a recompile storm",
    "a guard failure",
    "a collective that hangs or times out",
    "a mismatched collective",
    "oom at an all-gather",
    "a restart that does not re-form the group",
    "a resume whose next step differs",
]


def links(text: str) -> list[tuple[str, str]]:
    return LINK.findall(text)


def link_problem(text: str, target: str) -> str | None:
    """Why a link of the guide is broken, or None."""
    section = SECTION.fullmatch(text)
    if target.startswith(("http://", "https://")):
        return None if section is None else f"[{text}] points to a web page, not a lesson"
    path = (GUIDE.parent / target).resolve()
    if not path.exists():
        return f"[{text}]({target}): no such file"
    if path.suffix != ".py":
        return None
    if section is None:
        return f"[{text}]({target}): a link to a lesson script must be written `[NN § Heading](...)`"
    number, title = section.groups()
    if not path.parent.name.startswith(f"{number}_"):
        return f"[{text}]({target}): lesson {number} is not {path.parent.name}"
    if title not in headings(path):
        return f"[{text}]({target}): no heading '{title}' in the script's markdown cells"
    return None


def entries(text: str) -> dict[str, str]:
    """{entry heading: its body} for every `### ` entry of the guide."""
    parts = ENTRY.split(text)
    return {title: body.split("\n## ")[0] for title, body in zip(parts[1::2], parts[2::2])}


def test_every_linked_section_exists():
    found = links(GUIDE.read_text())
    assert len(found) >= len(REQUIRED), "the guide links to fewer sections than it has symptoms"
    problems = [p for p in (link_problem(text, target) for text, target in found) if p]
    assert not problems, "TROUBLESHOOTING.md:\n" + "\n".join(problems)


def test_the_check_catches_a_renamed_or_misnumbered_section():
    nan = "03b_autograd_functions/autograd_functions.py"
    assert link_problem("03b § Where does a NaN come from?", nan) is None
    assert link_problem("03b § Where does a NaN come from", nan)  # renamed
    assert link_problem("08a § Where does a NaN come from?", nan)  # wrong number
    assert link_problem("03b § Where does a NaN come from?", "03b_autograd_functions/nothing.py")  # no file
    assert link_problem("autograd", nan)  # not in the § form
    capture = manifest.LESSONS / "08a_compile_capture" / "compile_capture.py"
    assert "Graph breaks" in headings(capture)  # "## 3. Graph breaks"


@pytest.mark.parametrize("symptom", REQUIRED)
def test_every_symptom_has_an_entry(symptom: str):
    matching = [title for title in entries(GUIDE.read_text()) if symptom in title.lower()]
    assert len(matching) == 1, f"TROUBLESHOOTING.md: {len(matching)} entries headed with '{symptom}'"


def test_every_entry_names_layer_tool_and_lesson():
    for title, body in entries(GUIDE.read_text()).items():
        for field in ("**Layer:**", "**Observe:**", "**Shown in:**"):
            assert field in body, f"TROUBLESHOOTING.md, '{title}': no {field}"
        shown = body.split("**Shown in:**")[1]
        assert any(SECTION.fullmatch(text) for text, _ in links(shown)), (
            f"TROUBLESHOOTING.md, '{title}': 'Shown in' links to no lesson section")


def test_readme_links_the_guide():
    assert "(lessons/TROUBLESHOOTING.md)" in (manifest.ROOT / "README.md").read_text()

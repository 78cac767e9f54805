"""The suite soak (scripts/soak_suite.py) names every failed test from pytest's JUnit reports."""

from __future__ import annotations

from scripts import soak_suite

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="4">
<testcase classname="lessons.05_precision.test_precision" name="test_16bit_matmul_cost">
  <failure message="AssertionError: 2.77&#10;assert 2.77 &lt; 2">trace</failure></testcase>
<testcase classname="tests.test_multirank" name="test_launch"><error message="">boom
second line</error></testcase>
<testcase classname="tests.test_course" name="test_pin"/>
<testcase classname="tests.test_course" name="test_gpu"><skipped message="needs CUDA"/></testcase>
</testsuite></testsuites>
"""


def test_failures_and_errors_are_named_with_their_first_line(tmp_path):
    report = tmp_path / "run.xml"
    report.write_text(REPORT)
    counts, failed = soak_suite.failures(report)
    assert counts == {"tests": 4, "failures": 1, "errors": 1, "skipped": 1}
    assert failed == {
        "lessons.05_precision.test_precision::test_16bit_matmul_cost": "AssertionError: 2.77",
        "tests.test_multirank::test_launch": "boom",
    }


def test_the_summary_lists_each_failed_test_once_with_its_runs():
    ok = soak_suite.Result(1, ".venv", "Python 3.11.7, torch 2.13.0", 200.0, 0, {"tests": 4})
    bad = soak_suite.Result(2, "build/venv-3.12", "Python 3.12.1, torch 2.13.0+cu130", 210.0, 1,
                            {"tests": 4, "failures": 1}, {"t::x": "AssertionError: 2.77"})
    worse = soak_suite.Result(3, "build/venv-3.12", "Python 3.12.1, torch 2.13.0+cu130", 215.0, 1,
                              {"tests": 4, "failures": 1}, {"t::x": "AssertionError: 2.9"})
    text = soak_suite.summary([ok, bad, worse])
    assert "- t::x: run 2 (venv-3.12), run 3 (venv-3.12)\n    AssertionError: 2.77" in text
    assert text.count("t::x") == 1
    assert "No test failed in 1 runs." in soak_suite.summary([ok])
    crashed = soak_suite.Result(4, ".venv", "Python 3.11.7, torch 2.13.0", 10.0, 2, {"tests": 4})
    assert "run 4 (exit 2)" in soak_suite.summary([ok, crashed])

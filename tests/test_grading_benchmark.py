"""The grading-throughput benchmark runs end to end and both graders agree (timings are printed, not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autograder.course import ROOT

pytestmark = pytest.mark.slow


def test_throughput_benchmark_runs_and_graders_agree(tmp_path):
    out = tmp_path / "t.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grading_throughput.py"), "--submissions", "2",
                           "--workers", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert rows["plain_nbgrader_serial"]["total_score"] == rows["autograder"]["total_score"] > 0
    assert rows["speedup"] > 0 and "disagree" not in proc.stdout


def test_scaling_and_records_modes_print_per_submission_times_and_ratios(tmp_path):
    """The linearity benchmark's two modes run end to end at tiny sizes (figures are printed, never asserted)."""
    for args in (["--records", "3", "6"], ["--scaling", "1", "3", "--workers", "1"]):
        out = tmp_path / "t.json"
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grading_throughput.py"), *args,
                               "--json", str(out)], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = json.loads(out.read_text())
        assert rows["ratio"] > 0 and "ratio" in proc.stdout and len(rows["sizes"]) == 2


def test_against_a_revision_grades_the_same_class_with_both_graders(tmp_path):
    """``--against REV`` (the cost of a change to the grader, issue 34): both graders grade the same class, in one run,
    and agree on the total score; the ratio is printed, never asserted."""
    out = tmp_path / "t.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grading_throughput.py"), "--against", "HEAD",
                           "--submissions", "1", "--workers", "1", "--rounds", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert len(set(rows["total_score"].values())) == 1 and rows["ratio"] > 0 and "ratio" in proc.stdout

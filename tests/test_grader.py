"""The grading command end to end, for every assignment: reference answers get full marks, blanks get zero,
and a batch killed mid-way resumes to the same grades as one that ran straight through."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder import course
from autograder.records.written import is_manual
from checking import answered_release

pytestmark = pytest.mark.slow
ROOT = course.ROOT


def grade(subs: Path, assignment: str, out: Path, *extra: str, **popen) -> subprocess.CompletedProcess | subprocess.Popen:
    cmd = [sys.executable, "-m", "autograder", "grade", str(subs), "--assignment", assignment, "--out", str(out),
           "--cell-timeout", "30", "--call-timeout", "20", *extra]
    if popen:
        return subprocess.Popen(cmd, cwd=ROOT, **popen)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


def make_student(subs: Path, student: str, assignment: str, answered: bool) -> None:
    folder = subs / student / assignment
    folder.mkdir(parents=True)
    for src in course.source_notebooks(assignment):
        nb = answered_release(assignment, src.name) if answered else json.loads((course.RELEASE / assignment / src.name).read_text())
        (folder / src.name).write_text(json.dumps(nb))


@pytest.mark.parametrize("assignment", course.assignments())
def test_reference_full_marks_blank_zero(assignment, tmp_path):
    subs = tmp_path / "submitted"
    make_student(subs, "reference", assignment, answered=True)
    make_student(subs, "blank", assignment, answered=False)
    out = subs / "grades.csv"  # inside the submissions folder: its grading/ must not be taken for a student
    proc = grade(subs, assignment, out, "--workers", "2", "--workdir", str(subs / "grading"), "--separate-gradebook")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = rows(out)
    assert sorted(got) == ["blank", "reference"]
    assert float(got["reference"]["max_score"]) > 0
    # Full marks on everything the judge grades; written answers wait for a manual grade.
    by_hand = sum(float(c["metadata"]["nbgrader"].get("points", 0)) for src in course.source_notebooks(assignment)
                  for c in json.loads((course.RELEASE / assignment / src.name).read_text())["cells"]
                  if is_manual(c))
    assert float(got["reference"]["score"]) == float(got["reference"]["max_score"]) - by_hand, (got, proc.stderr[-3000:])
    assert float(got["blank"]["score"]) == 0.0
    html = next((subs / "grading" / "feedback" / "blank" / assignment).glob("*.html")).read_text()
    assert "not implemented yet" in html


def test_killed_batch_resumes_to_the_same_grades(tmp_path):
    assignment = "01_single_head"
    subs = tmp_path / "submitted"
    for i in range(6):
        make_student(subs, f"s{i}", assignment, answered=i % 2 == 0)
    # An uninterrupted run, for comparison.
    straight = grade(subs, assignment, tmp_path / "straight.csv", "--workdir", str(tmp_path / "w1"), "--separate-gradebook")
    assert straight.returncode == 0, straight.stderr[-2000:]
    # A run killed (SIGKILL, no chance to clean up) once two results are on disk.
    out, work = tmp_path / "resumed.csv", tmp_path / "w2"
    proc = grade(subs, assignment, out, "--workdir", str(work), "--separate-gradebook", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                 start_new_session=True)
    results = work / "results" / assignment
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(results.glob("*.json"))) < 2 and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list(results.glob("*.json")))
    assert 2 <= done < 6, f"the batch was not killed mid-way ({done} results)"
    resumed = grade(subs, assignment, out, "--workdir", str(work), "--separate-gradebook")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"{done} already graded, {6 - done} to grade" in resumed.stderr
    strip = lambda r: {s: (v["score"], v["max_score"], v["reason"]) for s, v in r.items()}  # noqa: E731
    assert strip(rows(out)) == strip(rows(tmp_path / "straight.csv"))
    assert len(list((work / "feedback").glob(f"*/{assignment}/*.html"))) == 6

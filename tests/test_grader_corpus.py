"""The grader against a class of faulty, hostile and unusual submissions (tests/corpus.py), end to end.

One batch grades the whole corpus through the sandbox, in parallel; each case
then checks its CSV row, its reason and its feedback. Further tests re-run the
batch (idempotent), re-submit (re-graded) and check the gradebook agrees.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from autograder.batch import run
from autograder.isolation.sandbox import Limits, can_isolate
from corpus import A, A09, CASES, CASES09, ESCAPES, FULL, MARKER, TOTAL

pytestmark = pytest.mark.slow
LIMITS = Limits(cell_timeout=8, call_timeout=4, notebook_timeout=120, memory_bytes=3 << 30, max_processes=128)
ISOLATION_CASES = {"reads_course_files", "plants_marker_for_next_student", "sees_no_marker", "ipython_startup_file",
                   "network_blocked"}


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("class")
    subs = base / "submitted"
    MARKER.unlink(missing_ok=True)
    for case in CASES:
        case.build(subs / case.name / A)
    out = base / "grades.csv"
    logs: list[str] = []
    results = run(subs, A, out, base / "grading", LIMITS, workers=2, log=logs.append)
    yield {"base": base, "subs": subs, "out": out, "results": results, "rows": read_csv(out), "logs": logs}
    for case in CASES:
        if case.probe is not None and case.probe.exists() and case.probe != MARKER:
            case.probe.unlink()


def test_corpus_is_large_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_gets_its_grade_and_reason(graded, case):
    if case.name in ISOLATION_CASES and not can_isolate():
        pytest.skip("namespaces unavailable here: filesystem and network isolation cannot be tested")
    row = graded["rows"][case.name]
    result = graded["results"][case.name]
    messages = " | ".join(t["message"] for nb in result["notebooks"] for t in nb["tests"])
    detail = f"reason={row['reason']!r} messages={messages[:600]!r}"
    assert float(row["max_score"]) == TOTAL  # the written answer's points too, though no one has graded it yet
    assert 0.0 <= float(row["score"]) <= FULL
    assert float(row["score"]) == case.score, detail
    assert case.reason.lower() in row["reason"].lower(), detail
    assert case.message.lower() in messages.lower(), detail
    if case.probe is not None:
        assert not case.probe.exists(), f"{case.name} planted {case.probe} outside its sandbox"


def test_feedback_for_everyone_without_hidden_tests(graded):
    feedback = graded["base"] / "grading" / "feedback"
    for case in CASES:
        pages = list((feedback / case.name / A).glob("*.html"))
        assert pages, f"no feedback for {case.name}"
        html = pages[0].read_text()
        assert "run_local" not in html and "HIDDEN TESTS" not in html, "hidden tests leaked into feedback"
        assert "points" in html


def test_student_text_is_escaped_in_feedback_and_csv(graded):
    """A cell id with markup and a lone surrogate: shown as text in the feedback, and the CSV is still written."""
    html = next((graded["base"] / "grading" / "feedback" / "markup_and_surrogate_in_cell_id" / A).glob("*.html")).read_text()
    assert "<script>alert(2)" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(2)" in html
    assert "\\ud800" in graded["rows"]["markup_and_surrogate_in_cell_id"]["reason"]


def test_feedback_names_the_failure(graded):
    html = next((graded["base"] / "grading" / "feedback" / "blank_exercise" / A).glob("*.html")).read_text()
    assert "not implemented yet" in html


def test_csv_agrees_with_gradebook(graded):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{graded['base'] / 'grading' / 'gradebook.db'}") as gb:
        for student, row in graded["rows"].items():
            sub = gb.find_submission(A, student)
            assert float(sub.score) == float(row["score"])
            assert float(sub.max_score) == float(row["max_score"])


def test_rerun_is_idempotent_and_resubmission_is_regraded(graded):
    base, subs, out = graded["base"], graded["subs"], graded["out"]
    before = out.read_text()
    logs: list[str] = []
    run(subs, A, out, base / "grading", LIMITS, workers=1, log=logs.append)
    assert out.read_text() == before
    assert f"{len(CASES)} already graded, 0 to grade" in logs[0]
    # blank_exercise re-submits the reference answer: graded again, full marks now.
    shutil.copy(subs / "reference" / A / "single_head.ipynb", subs / "blank_exercise" / A / "single_head.ipynb")
    logs.clear()
    run(subs, A, out, base / "grading", LIMITS, workers=1, log=logs.append)
    assert "1 to grade" in logs[0]
    assert float(read_csv(out)["blank_exercise"]["score"]) == FULL
    stored = json.loads((base / "grading" / "results" / A / "blank_exercise.json").read_text())
    assert sum(t["points"] for nb in stored["notebooks"] for t in nb["tests"]) == FULL


@pytest.fixture(scope="module")
def graded09(tmp_path_factory):
    """Exercise 09's forgeries (tests/corpus.py, CASES09), graded in one batch through the sandbox."""
    base = tmp_path_factory.mktemp("class09")
    for case in CASES09:
        case.build(base / "submitted" / case.name / A09)
    results = run(base / "submitted", A09, base / "grades.csv", base / "grading", LIMITS, workers=2, log=lambda m: None)
    return {"results": results, "rows": read_csv(base / "grades.csv")}


@pytest.mark.parametrize("case", CASES09, ids=[c.name for c in CASES09])
def test_09_case_gets_its_grade_and_reason(graded09, case):
    row, result = graded09["rows"][case.name], graded09["results"][case.name]
    messages = " | ".join(t["message"] for nb in result["notebooks"] for t in nb["tests"])
    detail = f"reason={row['reason']!r} messages={messages[:600]!r}"
    assert float(row["score"]) == case.score, detail
    assert case.reason.lower() in row["reason"].lower(), detail
    assert case.message.lower() in messages.lower(), detail

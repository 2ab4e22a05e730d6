"""The judge's own faults stay local: a check that breaks on an odd answer fails that check alone."""

from __future__ import annotations

import json

import pytest

from autograder.checks import load_suite
from autograder.course import RELEASE, SOURCE
from autograder.judge import grade_notebook
from autograder.notebook import SourceNotebook
from autograder.sandbox import Limits
from corpus import A, FULL, NB, notebook

pytestmark = pytest.mark.slow


def test_a_check_that_raises_fails_alone(tmp_path, monkeypatch):
    suite = load_suite(A)
    gid = "test_sdpa_values"
    points = {c.grade_id: c.points for c in SourceNotebook.load(SOURCE / A / NB, RELEASE / A / NB).tests()}

    def broken(trial):
        raise ZeroDivisionError("the check tripped over the answer")

    monkeypatch.setattr(suite.checks[gid], "fn", broken)
    path = tmp_path / NB
    path.write_text(json.dumps(notebook()))
    result = grade_notebook(path, SourceNotebook.load(SOURCE / A / NB, RELEASE / A / NB), A, files=RELEASE / A,
                            limits=Limits(cell_timeout=20, call_timeout=10, notebook_timeout=120), secret="t")
    by_id = {t.grade_id: t for t in result.tests}
    assert by_id[gid].points == 0 and "could not be checked (ZeroDivisionError" in by_id[gid].message
    assert sum(t.points for t in result.tests) == FULL - points[gid]  # every other check still counted
    assert any("the check itself failed" in line for line in result.log)


@pytest.mark.parametrize("error, says", [
    ("NotImplementedError: ", "not implemented yet"),
    ("NotImplementedError", "not implemented yet"),
    ("NotImplementedError: Cannot copy out of meta tensor; no data!", "your code raised NotImplementedError: Cannot copy"),
    ("ValueError: bad", "your code raised ValueError: bad"),
])
def test_error_sentences_name_the_real_error(error, says):
    from autograder.checks import describe_error

    assert describe_error(error).startswith(says)

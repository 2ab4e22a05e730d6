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


@pytest.mark.parametrize("local", [True, False])
def test_a_conceptual_answer_is_read_as_a_plain_value(local):
    """``Trial.value`` reads what the student assigned, the same in the sandbox and in a notebook kernel."""
    from autograder.checks import LocalBackend, StudentError, Trial
    from autograder.judge import SandboxBackend
    from autograder.sandbox import Sandbox

    code = "import numpy as np, torch\nq1 = 0.25\nq2 = (3, 4)\nq3 = 'b'\nq4 = np.float64(2.5)\nq5 = torch.ones(2)\n"
    if local:
        ns: dict = {}
        exec(code, ns)
        trial = Trial(LocalBackend(ns), 0)
        check = lambda: None  # noqa: E731
    else:
        box = Sandbox(limits=Limits(cell_timeout=20, call_timeout=10, notebook_timeout=120)).__enter__()
        assert box.request({"op": "exec", "code": code, "label": "<t>"}, timeout=20)["ok"]
        trial = Trial(SandboxBackend(box, box.limits), 0)
        check = lambda: box.__exit__(None, None, None)  # noqa: E731
    try:
        assert trial.value("q1") == 0.25 and tuple(trial.value("q2")) == (3, 4) and trial.value("q3") == "b"
        assert trial.value("q4") == 2.5 and trial.value("q5").tolist() == [1.0, 1.0]
        with pytest.raises(StudentError, match="assign your answer to q9"):
            trial.value("q9")
    finally:
        check()


def test_conceptual_answer_helpers_name_wrong_answers_and_hide_the_right_one():
    from autograder.checks import CheckFailed, expect_choice, expect_number, expect_tuple

    expect_number(0.2500001, 0.25, "q")
    expect_number(torch_scalar := __import__("torch").tensor(0.25), 0.25, "q")  # a 0-d tensor is a number
    with pytest.raises(CheckFailed, match="that is Var without the scaling"):
        expect_number(16, 1.0, "q", mistakes={"that is Var without the scaling": 16.0})
    with pytest.raises(CheckFailed, match="not right") as err:
        expect_number(3, 1.0, "q")
    assert "1.0" not in str(err.value) or "3" in str(err.value)
    with pytest.raises(CheckFailed, match="should be a number"):
        expect_number(True, 1.0, "q")
    expect_tuple([2, 4, 8], (2, 4, 8), "shape")
    with pytest.raises(CheckFailed, match="heads first"):
        expect_tuple((4, 2, 8), (2, 4, 8), "shape", mistakes={"heads first": (4, 2, 8)})
    expect_choice(" B ", "b", "pattern", "abc")
    with pytest.raises(CheckFailed, match="should be one of"):
        expect_choice("z", "b", "pattern", "abc")
    with pytest.raises(CheckFailed, match="that is the causal one"):
        expect_choice("a", "b", "pattern", "abc", mistakes={"a": "that is the causal one"})
    del torch_scalar

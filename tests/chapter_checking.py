"""What the grading tests of every chapter share, on top of ``checking.py``: the conceptual questions
(issue 14) and the walk of the stated requirements (issue 13).

``tests/test_chNN_grading.py`` keeps its own data (the mutants, the wrong answers and the words their
messages must contain); the way each is run and judged lives here once.
"""

from __future__ import annotations

from typing import Any

from autograder.judging.checks import CheckFailed, load_suite, run_local
from autograder.course import SOURCE
from checking import assert_mistake_named, namespace, reference_answers


def question_answers(assignment: str, notebook: str) -> str:
    """The reference answers to the conceptual questions (``q_*`` cells) of a source notebook, as code."""
    return "".join(code for gid, code in reference_answers(SOURCE / assignment / notebook).items()
                   if gid.startswith("q_"))


def grade_answer(assignment: str, gid: str, **values: Any) -> str:
    """The message of question check ``gid`` for a namespace holding ``values`` ("" when it passes)."""
    try:
        run_local(assignment, gid, {"__name__": "__main__", **values})
    except CheckFailed as e:
        return str(e)
    return ""


def assert_questions_pass(assignment: str, code: str) -> None:
    """Every question check (at least three) passes on the value ``code`` assigns to its variable."""
    ns = namespace(code)
    questions = [gid for gid in load_suite(assignment).checks if gid.startswith("test_q_")]
    assert len(questions) >= 3, questions
    for gid in questions:
        var = gid.removeprefix("test_")
        assert grade_answer(assignment, gid, **{var: ns[var]}) == "", gid


def assert_answer_named(assignment: str, gid: str, value: Any, words: str) -> None:
    """Question check ``gid`` fails on ``value`` with a message containing ``words``."""
    message = grade_answer(assignment, gid, **{gid.removeprefix("test_"): value})
    assert words in message, message


def assert_requirement_broken_alone(assignment: str, stated: dict[str, str],
                                    mutants: dict[str, tuple[str, str]], name: str) -> None:
    """The mutant that breaks requirement ``name`` alone fails the check ``stated`` lists for it, naming it."""
    assert set(mutants) == set(stated), "the walk and the check module's requirement list differ"
    code, words = mutants[name]
    assert_mistake_named(assignment, name, code, stated[name], words)

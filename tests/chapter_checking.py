"""What the grading tests of every chapter share, on top of ``checking.py``: the conceptual questions
(issue 14) and the walk of the stated requirements (issue 13).

``tests/test_chNN_grading.py`` keeps its own data (the mutants, the wrong answers and the words their
messages must contain); the way each is run and judged lives here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autograder.judging.checks import CheckFailed, Requirement, load_suite, run_local
from autograder.course import SOURCE
from checking import namespace, reference_answers, run_checks


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


def assert_requirement_broken_alone(assignment: str, stated: Mapping[str, Requirement], mutants: Mapping[str, str],
                                    name: str) -> None:
    """The one walk of the stated requirements, for every chapter (issue 20).

    ``stated`` is the chapter's ``STATED_REQUIREMENTS``, ``mutants`` the test's requirement -> a mutant of the
    reference that breaks that requirement alone; both name the same requirements, so one dropped from the table
    fails here. The mutant of ``name`` fails each check the table maps it to, with the table's words in the
    message, fails the checks it lists under ``also``, and passes every other check of the parts those exercise."""
    assert set(mutants) == set(stated), ("the test's mutants and the checks' STATED_REQUIREMENTS differ: "
                                         f"{sorted(set(mutants) ^ set(stated))}")
    req, suite = stated[name], load_suite(assignment)
    parts = {p for gid in req.checks for p in suite.checks[gid].parts}
    gids = [gid for gid, c in suite.checks.items() if gid in req.checks + req.also or parts & set(c.parts)]
    results = run_checks(assignment, mutants[name], gids)
    for gid in req.checks:
        assert results[gid], f"{name}: {gid} passed but the mutant breaks it"
        assert req.message.lower() in results[gid].lower(), f"{name}: {gid}'s message lacks {req.message!r}: {results[gid]!r}"
    assert all(results[gid] for gid in req.also), f"{name}: a check listed under also passes: {results}"
    others = {gid: msg for gid, msg in results.items() if msg and gid not in req.checks + req.also}
    assert not others, f"{name}: the mutant also fails checks the table does not map it to: {others}"


def assert_earns_only(assignment: str, code: str, parts: set[str] | str, passing: set[str] = frozenset()) -> dict:
    """Issue 34: an answer that ignores its inputs (or computes nothing) earns nothing on the checks of ``parts``
    beyond ``passing`` (a shapes check), and passes those."""
    parts = {parts} if isinstance(parts, str) else set(parts)
    suite = load_suite(assignment)
    gids = [gid for gid, c in suite.checks.items() if parts & set(c.parts)]
    results = run_checks(assignment, code, gids)
    earned = {gid for gid, msg in results.items() if not msg}
    assert earned == set(passing), f"earned {sorted(earned)}, expected only {sorted(passing)}: {results}"
    return results


# A layer's answer that ignores the queries and keys (issue 34): weights uniform over the allowed keys, the output the
# layer's projections of those weights times the values. ``_uniform(attn, query, key, value, mask)`` for a module
# ``attn`` holding q_proj, k_proj, v_proj, out_proj and num_heads.
UNIFORM_LAYER = '''

def _uniform(attn, query, key, value, mask=None):
    B, n, E = query.shape
    H, m = attn.num_heads, key.shape[1]
    v = attn.v_proj(value).view(B, m, H, E // H).transpose(1, 2)
    allowed = torch.ones(B, H, n, m, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & (mask.unsqueeze(1) if mask.dim() == 3 else mask)
    w = allowed.to(query.dtype) / allowed.sum(-1, keepdim=True).clamp_min(1).to(query.dtype)
    return attn.out_proj((w @ v).transpose(1, 2).reshape(B, n, E)), w
'''

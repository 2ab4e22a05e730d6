"""Exercise 04's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest

from autograder.judging.checks.ch04_masked_attention import STATED_REQUIREMENTS
from chapter_checking import (assert_answer_named, assert_earns_only, assert_questions_pass, assert_requirement_broken_alone,
                              grade_answer, question_answers)
from checking import assert_delegation_named, assert_full_marks, assert_mistake_named, mutate, run_suite, source_code

A = "04_masked_attention"
REF = source_code(A)
SETUP = REF.split("def causal_mask")[0]  # the given setup cell
# the reference answers to the conceptual questions, appended to the unusual (otherwise complete) answer below
QUESTIONS = question_answers(A, "masked_attention.ipynb")

UNUSUAL = SETUP + '''
def causal_mask(n, device=None):
    i = torch.arange(n, device=device)
    return i[:, None] >= i[None, :]

def padding_mask(lengths, max_len):
    rows = [[pos < int(length) for pos in range(max_len)] for length in lengths.tolist()]
    return torch.tensor(rows, dtype=torch.bool, device=lengths.device).reshape(len(rows), 1, max_len)

def masked_attention(query, key, value, mask):
    q, k, v = query.double(), key.double(), value.double()
    scores = torch.einsum("...nd,...md->...nm", q, k) / math.sqrt(q.shape[-1])
    scores = torch.where(mask, scores, torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device))
    top = scores.amax(-1, keepdim=True).clamp_min(-1e300)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    e = torch.exp(scores - top)
    total = e.sum(-1, keepdim=True)
    w = torch.where(total > 0, e / total, torch.zeros_like(e))
    return (w @ v).to(query.dtype), w.to(query.dtype)
''' + QUESTIONS

CAUSAL = "return torch.ones(n, n, dtype=torch.bool, device=device).tril()  # (n, n)"
PAD = "return (positions < lengths[:, None])[:, None, :]  # (B, 1, max_len)"
SOFTMAX = 'weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)'
FILL = 'scores = scores.masked_fill(~mask, float("-inf"))'
MISTAKES = {
    # name: (mutated code, the checks that must fail, words each message must contain)
    "inverted causal mask": (mutate(REF, CAUSAL, "return ~torch.ones(n, n, dtype=torch.bool, device=device).tril()"),
                             ["test_causal_mask", "test_causality"], "inverted"),
    "strictly lower causal mask": (mutate(REF, CAUSAL, "return torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)"),
                                   ["test_causal_mask", "test_causality"], "diagonal is hidden"),
    "causal mask sees the next position": (mutate(REF, CAUSAL, "return torch.ones(n, n, dtype=torch.bool, device=device).tril(1)"),
                                           ["test_causal_mask", "test_causality"], "see the next (future) position"),
    "upper triangle": (mutate(REF, CAUSAL, "return torch.ones(n, n, dtype=torch.bool, device=device).triu()"),
                       ["test_causal_mask", "test_causality"], "future"),
    "float causal mask": (mutate(REF, CAUSAL, "return torch.ones(n, n, device=device).tril()"),
                          ["test_causal_mask", "test_causality"], "bool"),
    "padding off by one (<=)": (mutate(REF, PAD, "return (positions <= lengths[:, None])[:, None, :]"),
                                ["test_padding_mask"], "off by one"),
    "padding off by one (< L-1)": (mutate(REF, PAD, "return (positions < lengths[:, None] - 1)[:, None, :]"),
                                   ["test_padding_mask"], "off by one"),
    "padding inverted": (mutate(REF, PAD, "return (positions >= lengths[:, None])[:, None, :]"),
                         ["test_padding_mask"], "inverted"),
    "padding without query axis": (mutate(REF, PAD, "return positions < lengths[:, None]"),
                                   ["test_padding_mask"], "(B, 1, max_len)"),
    "NaN rows": (mutate(REF, SOFTMAX, "weights = torch.softmax(scores, dim=-1)"),
                 ["test_masked_attention_fully_masked", "test_masked_mha"], "NaN"),
    "mask after the softmax": (mutate(mutate(REF, FILL, "pass"), SOFTMAX,
                                      "weights = torch.softmax(scores, dim=-1) * mask"),
                               ["test_masked_attention"], "after the softmax"),
    "mask polarity in attention": (mutate(REF, FILL, 'scores = scores.masked_fill(mask, float("-inf"))'),
                                   ["test_masked_attention"], "inverted"),
    "mask ignored": (mutate(REF, FILL, "pass"), ["test_masked_attention", "test_causality"], "mask"),
    "mask transposed in attention": (mutate(REF, FILL, 'scores = scores.masked_fill(~mask.transpose(-2, -1), float("-inf"))'),
                                     ["test_masked_attention"], "mask is used transposed"),
    "no scaling": (mutate(REF, "scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])",
                          "scores = query @ key.transpose(-2, -1)"),
                   ["test_masked_attention"], "not scaled"),  # only there: the others compare at the student's scale
    "large negative fill, no zero rows": (mutate(REF, FILL, "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)"),
                                          ["test_masked_attention_fully_masked", "test_masked_mha"], "equal weights"),
}


def test_reference_gets_full_marks():
    assert_full_marks(A, REF)


def test_unusual_correct_answer_gets_full_marks():
    assert_full_marks(A, UNUSUAL)


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *MISTAKES[name])


@pytest.mark.parametrize("diagonal", [-1, 1])
def test_causal_mask_off_by_one_is_named_not_called_inverted(diagonal):
    code = mutate(REF, CAUSAL, f"return torch.ones(n, n, dtype=torch.bool, device=device).tril({diagonal})")
    results = run_suite(A, code)
    assert "off by one" in results["test_causal_mask"], results
    assert "inverted" not in results["test_causality"], results


def test_delegation_earns_nothing_for_that_part():
    code = REF + ("\nimport torch.nn.functional as F\ndef masked_attention(query, key, value, mask):\n"
                  "    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)\n    return out, None\n")
    results = assert_delegation_named(A, code, "masked_attention")
    assert results["test_causal_mask"] == "" and results["test_padding_mask"] == ""


def test_a_mask_of_no_dimensions_is_told_its_shape():
    """A 0-d tensor from padding_mask used to crash the check (it read the mask's first dimension)."""
    assert "has shape ()" in run_suite(A, mutate(REF, PAD, "return torch.tensor(True)"))["test_padding_mask"]


# -- stated requirements (issue 13): each one broken alone loses points on its check, named -------------

SCORES = "scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])"
REQUIREMENTS = {
    # requirement (as in STATED_REQUIREMENTS, which names its check and message): a mutant of the reference
    # that breaks only it
    "causal: bool": MISTAKES["float causal mask"][0],
    "causal: on and below the diagonal": MISTAKES["strictly lower causal mask"][0],
    "causal: device honoured": mutate(REF, CAUSAL, "return torch.ones(n, n, dtype=torch.bool).tril()"),
    "padding: (B, 1, max_len)": MISTAKES["padding without query axis"][0],
    "padding: True at the real tokens": MISTAKES["padding off by one (<=)"][0],
    "attention: scaled scores": MISTAKES["no scaling"][0],
    "attention: -inf before the softmax, True = may attend": MISTAKES["mask after the softmax"][0],
    "attention: rows are queries": MISTAKES["mask transposed in attention"][0],
    "attention: n != m, d_v != d_k, broadcast masks": mutate(REF, FILL, 'scores = scores.masked_fill(~mask.squeeze(1), '
                                                                         'float("-inf"))'),
    "attention: any leading dimensions": mutate(REF, SCORES, "scores = torch.bmm(query, key.transpose(1, 2)) / "
                                                              "math.sqrt(query.shape[-1])"),
    "attention: fully masked row gives zeros": MISTAKES["NaN rows"][0],
    "causality end to end": MISTAKES["upper triangle"][0],
}


@pytest.mark.parametrize("name", list(REQUIREMENTS))
def test_stated_requirement_broken_alone_loses_points_on_its_check(name):
    assert_requirement_broken_alone(A, STATED_REQUIREMENTS, REQUIREMENTS, name)


def test_a_causal_mask_that_cannot_be_built_on_meta_is_not_marked_down():
    """The device is read back on the meta device; a correct mask built in a way meta cannot run keeps the point."""
    code = mutate(REF, CAUSAL, "m = torch.ones(n, n, dtype=torch.bool, device=device).tril()\n"
                               "    assert m.device.type != 'meta' or False, 'no meta here'\n    return m")
    assert run_suite(A, code)["test_causal_mask"] == ""
    missing = mutate(REF, "def causal_mask(n: int, device=None)", "def causal_mask(n: int)")
    missing = missing.replace("device=device).tril()  # (n, n)", ").tril()  # (n, n)")
    assert "device" in run_suite(A, missing)["test_causal_mask"]


# -- conceptual questions (issue 14) ------------------------------------------------------------------


def test_reference_answers_to_questions_get_full_marks():
    assert_questions_pass(A, SETUP + QUESTIONS)


@pytest.mark.parametrize("gid, value", [
    ("test_q_keys_seen", [1, 2, 3, 4, 4, 4]), ("test_q_mask_pattern", " B "), ("test_q_finite_fill_weight", 0.25),
    ("test_q_nan_step", "B"), ("test_q_causal_swap", (3, 2)),
])
def test_right_answers_in_other_forms_get_the_point(gid, value):
    assert grade_answer(A, gid, **{gid.removeprefix("test_"): value}) == ""


QUESTION_MISTAKES = [
    # (check, wrong value, words its message must contain)
    ("test_q_keys_seen", (1, 2, 3, 4, 5, 6), "ignores the padding mask"),
    ("test_q_keys_seen", (4, 4, 4, 4, 4, 4), "ignores the causal mask"),
    ("test_q_keys_seen", (1, 2, 3, 4, 0, 0), "hides keys (columns)"),
    ("test_q_keys_seen", (0, 1, 2, 3, 3, 3), "hides the diagonal"),
    ("test_q_mask_pattern", "a", "causal mask alone"),
    ("test_q_mask_pattern", "c", "hides query 3"),
    ("test_q_mask_pattern", "d", "padding mask alone"),
    ("test_q_finite_fill_weight", 0, "cannot tell"),
    ("test_q_finite_fill_weight", float("nan"), "NaN is what a fill of -inf gives"),
    ("test_q_finite_fill_weight", 1, "four scores are equal"),
    ("test_q_nan_step", "a", "exactly 0.0"),
    ("test_q_nan_step", "c", "already in the weights"),
    ("test_q_causal_swap", (), "without a mask"),
    ("test_q_causal_swap", (0, 1, 2, 3), "did not move"),
    ("test_q_causal_swap", (1, 0), "stay the same"),
    ("test_q_causal_swap", (3,), "incomplete"),
]


@pytest.mark.parametrize("gid, value, words", QUESTION_MISTAKES)
def test_usual_wrong_answer_is_named(gid, value, words):
    assert_answer_named(A, gid, value, words)


@pytest.mark.parametrize("gid, value", [("test_q_keys_seen", (1, 2, 3, 4, 4, 5)), ("test_q_mask_pattern", "e"),
                                        ("test_q_mask_pattern", 2), ("test_q_finite_fill_weight", 0.5),
                                        ("test_q_nan_step", "d"), ("test_q_causal_swap", (1, 3))])
def test_other_wrong_answers_fail_without_giving_the_answer_away(gid, value):
    message = grade_answer(A, gid, **{gid.removeprefix("test_"): value})
    assert message and "(1, 2, 3, 4, 4, 4)" not in message and "0.25" not in message \
        and "(2, 3)" not in message and "'b'" not in message.split("should be one of")[0], message


# -- issue 34: every check anchored to the reference ------------------------------------------------------

UNIFORM = REF + '''
def masked_attention(query, key, value, mask):
    """Weights uniform over the allowed keys, whatever the queries and keys are; zero rows where none is allowed."""
    allowed = torch.ones(*query.shape[:-1], key.shape[-2], dtype=torch.bool) & mask
    w = allowed.to(query.dtype) / allowed.sum(-1, keepdim=True).clamp_min(1).to(query.dtype)
    return w @ value, w
'''
ZERO_OUTPUT = mutate(REF, "return weights @ value, weights", "return torch.zeros_like(weights @ value), weights")


@pytest.mark.parametrize("code", [UNIFORM, ZERO_OUTPUT], ids=["uniform-weights", "zero-output"])
def test_an_attention_that_ignores_its_inputs_earns_nothing(code):
    """Issue 34: the fully-masked check compares the other rows with the student's own answer on those rows alone, so
    weights uniform over the allowed keys (zero on a fully masked row) earned it: it first anchors that answer."""
    results = assert_earns_only(A, code, "masked_attention")
    assert any(words in results["test_masked_attention_fully_masked"]
               for words in ("do not follow the scores", "weights times the values")), results

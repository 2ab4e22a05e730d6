"""Exercise 01's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import contextlib

import pytest
import torch

from autograder.judging.checks.ch01_single_head import STATED_REQUIREMENTS
from chapter_checking import (assert_answer_named, assert_earns_only, assert_questions_pass, assert_requirement_broken_alone, grade_answer,
                              question_answers)
from checking import (assert_delegation_named, assert_full_marks, assert_mistake_named, mutate, namespace, run_suite,
                      source_code)

A = "01_single_head"
REF = source_code(A)
# the reference answers to the conceptual questions, appended to the unusual (otherwise complete) answers below
QUESTIONS = question_answers(A, "single_head.ipynb")

SETUP = "import math\nimport torch\n"

EINSUM_FLOAT64 = SETUP + '''
def softmax(x, dim=-1):
    top = x.amax(dim=dim, keepdim=True).nan_to_num(0.0, neginf=0.0)
    log_total = torch.log(torch.exp(x - top).sum(dim=dim, keepdim=True)) + top  # a log-sum-exp, by hand
    return torch.exp(x - log_total).nan_to_num(0.0)

def scaled_dot_product_attention(query, key, value, mask=None):
    q, k, v = query.double(), key.double(), value.double()
    scores = torch.einsum("...nd,...md->...nm", q, k) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), -float("inf"))
    w = softmax(scores, dim=-1)
    return torch.einsum("...nm,...mv->...nv", w, v).to(query.dtype), w.to(query.dtype)
''' + QUESTIONS

LOOP = SETUP + '''
def softmax(x, dim=-1):
    x = x.movedim(dim, -1)
    flat = x.reshape(-1, x.shape[-1])
    rows = []
    for row in flat:
        if torch.isinf(row).all() and (row < 0).all():
            rows.append(torch.zeros_like(row))
            continue
        e = torch.exp(row - row.max())
        rows.append(e / e.sum())
    return torch.stack(rows).reshape(x.shape).movedim(-1, dim)

def scaled_dot_product_attention(query, key, value, mask=None):
    scores = torch.matmul(query, key.mT) * (1.0 / math.sqrt(key.size(-1)))
    if mask is not None:
        scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
    weights = softmax(scores)
    return torch.matmul(weights, value), weights
''' + QUESTIONS


def test_reference_gets_full_marks():
    assert run_suite(A, REF) == {gid: "" for gid in run_suite(A, REF)}


@pytest.mark.parametrize("code", [EINSUM_FLOAT64, LOOP], ids=["einsum-logsumexp-float64", "loops-matmul-where"])
def test_unusual_correct_answers_get_full_marks(code):
    assert_full_marks(A, code)


@pytest.mark.parametrize("call", ["torch.logsumexp(x, dim=dim, keepdim=True)", "x.logsumexp(dim, keepdim=True)",
                                  "torch.special.logsumexp(x, dim, keepdim=True)"])
def test_torchs_log_sum_exp_is_outside_the_softmaxs_vocabulary(call):
    """The log-sum-exp is the softmax's normaliser (a distribution built from logits computes it): the exercise's
    vocabulary leaves it out of the softmax, so the softmax earns nothing, the attention built on it keeps its points."""
    code = EINSUM_FLOAT64.replace(
        "log_total = torch.log(torch.exp(x - top).sum(dim=dim, keepdim=True)) + top", f"log_total = {call}")
    results = run_suite(A, code)
    softmax_checks = [gid for gid in results if gid.startswith("test_softmax")]
    assert softmax_checks and all("logsumexp" in results[gid] and "vocabulary" in results[gid] for gid in softmax_checks)
    assert all(not results[gid] for gid in results if gid.startswith("test_sdpa")), results


SDPA_SCALE = "scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)"
MISTAKES = {
    # name: (mutated code, a check that must fail, words its message must contain)
    "no scaling": (mutate(REF, SDPA_SCALE, "scores = query @ key.transpose(-2, -1)"), "test_sdpa_values", "not scaled"),
    "scale by d_k": (mutate(REF, SDPA_SCALE, "scores = query @ key.transpose(-2, -1) / d_k"), "test_sdpa_values", "divided by d_k"),
    "scores times sqrt(d_k)": (mutate(REF, SDPA_SCALE, "scores = query @ key.transpose(-2, -1) * math.sqrt(d_k)"),
                               "test_sdpa_values", "multiplied by sqrt(d_k)"),
    "wrong operand transposed": (mutate(REF, SDPA_SCALE, "scores = (key @ query.transpose(-2, -1)) / math.sqrt(d_k)"),
                                 "test_sdpa_batch_dims", "wrong operand is transposed"),
    "large negative fill, no zero rows": (mutate(REF, 'masked_fill(~mask, float("-inf"))',
                                                 "masked_fill(~mask, torch.finfo(scores.dtype).min)"),
                                          "test_sdpa_fully_masked", "equal weights"),
    "scale by sqrt(d_v)": (mutate(REF, SDPA_SCALE, "scores = query @ key.transpose(-2, -1) / math.sqrt(value.shape[-1])"),
                           "test_sdpa_values", "d_v"),
    "softmax over queries": (mutate(REF, "weights = softmax(scores, dim=-1)", "weights = softmax(scores, dim=-2)"),
                             "test_sdpa_values", "over the keys"),
    "only 3-D inputs": (mutate(REF, "query @ key.transpose(-2, -1)", "torch.bmm(query, key.transpose(1, 2))"),
                        "test_sdpa_batch_dims", "leading dimension"),
    "mask polarity": (mutate(REF, "masked_fill(~mask,", "masked_fill(mask,"), "test_sdpa_mask", "polarity"),
    "mask after softmax": (mutate(REF, '''        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores, dim=-1)  # (..., n, m)''', '''        pass
    weights = softmax(scores, dim=-1)  # (..., n, m)
    if mask is not None:
        weights = weights * mask'''), "test_sdpa_mask", "after the softmax"),
    "NaN for fully masked row": (mutate(REF, '''    x_max = torch.where(torch.isfinite(x_max), x_max, torch.zeros_like(x_max))
    e = torch.exp(x - x_max)
    total = e.sum(dim=dim, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))''', '''    e = torch.exp(x - x_max)
    return e / e.sum(dim=dim, keepdim=True)'''), "test_sdpa_fully_masked", "NaN"),
    "weights applied to keys": (mutate(REF, "return weights @ value, weights", "return weights @ key, weights"),
                                "test_sdpa_values", "keys"),
    "unstable softmax": (mutate(REF, '''    x_max = x.amax(dim=dim, keepdim=True)
    x_max = torch.where(torch.isfinite(x_max), x_max, torch.zeros_like(x_max))
    e = torch.exp(x - x_max)''', '''    e = torch.exp(x)'''), "test_softmax_stable", "overflow"),
    "softmax ignores dim": (mutate(REF, "x_max = x.amax(dim=dim, keepdim=True)", "dim = -1\n    x_max = x.amax(dim=dim, keepdim=True)"),
                            "test_softmax_dim", "dim"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *MISTAKES[name])


@pytest.mark.parametrize("code, part", [
    (SETUP + "from attnkit import softmax\n" + REF.split("def scaled_dot_product_attention")[0].split("def softmax")[0]
     + "def scaled_dot_product_attention" + REF.split("def scaled_dot_product_attention")[1], "softmax"),
    (REF + "\nimport torch.nn.functional as F\ndef scaled_dot_product_attention(q, k, v, mask=None):\n"
           "    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None\n", "scaled_dot_product_attention"),
    (REF + "\ndef softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n", "softmax"),
    (REF + "\nimport importlib\ndef _helper(*a):\n    return getattr(importlib.import_module('attn' + 'kit'), 'scaled_dot_product_attention')(*a)\n"
           "def scaled_dot_product_attention(q, k, v, mask=None):\n    return _helper(q, k, v, mask)\n", "scaled_dot_product_attention"),
], ids=["import-attnkit", "torch-sdpa", "torch-softmax", "helper-getattr"])
def test_delegation_earns_nothing_for_that_part(code, part):
    assert_delegation_named(A, code, part)


def test_batch_dims_hint_only_when_it_applies():
    """The bmm / transpose(1, 2) hint is for code that works on 3-D inputs only, not for every error."""
    wrong_operand = MISTAKES["wrong operand transposed"][0]
    assert "bmm" not in run_suite(A, wrong_operand)["test_sdpa_batch_dims"]
    assert "bmm" in run_suite(A, MISTAKES["only 3-D inputs"][0])["test_sdpa_batch_dims"]


# -- stated requirements (issue 13): each one broken alone loses points on its check, named -------------

SM_RETURN = "return e / torch.where(total > 0, total, torch.ones_like(total))"
REQUIREMENTS = {
    # requirement (as in STATED_REQUIREMENTS, which names its check and message): a mutant of the reference
    # that breaks only it
    "softmax along dim": MISTAKES["softmax ignores dim"][0],
    "softmax stable near 1e4": MISTAKES["unstable softmax"][0],
    "softmax of an all -inf slice is zero": MISTAKES["NaN for fully masked row"][0],
    "softmax keeps shape and dtype": mutate(REF, SM_RETURN, f"return ({SM_RETURN[7:]}).float()"),
    "attention returns a pair": mutate(REF, "return weights @ value, weights", "return weights @ value"),
    "shapes with n != m and d_v != d_k": MISTAKES["wrong operand transposed"][0],
    "any number of leading dimensions": MISTAKES["only 3-D inputs"][0],
    "scale 1/sqrt(d_k)": MISTAKES["no scaling"][0],
    "softmax over the keys": MISTAKES["softmax over queries"][0],
    "mask True means may attend": MISTAKES["mask polarity"][0],
    "mask before the softmax": MISTAKES["mask after softmax"][0],
    "mask broadcast, per-example mask": mutate(REF, '        scores = scores.masked_fill(~mask, float("-inf"))',
                                                '        mask = mask[:1] if mask.dim() == 3 else mask  # example 0\'s only\n'
                                                '        scores = scores.masked_fill(~mask, float("-inf"))'),
    "fully masked row gives zeros": MISTAKES["large negative fill, no zero rows"][0],
    "float64 in, float64 out": mutate(REF, "    d_k = query.shape[-1]\n",
                                       "    query, key, value = query.float(), key.float(), value.float()\n"
                                       "    d_k = query.shape[-1]\n"),
    "large scores stay finite": mutate(REF, "weights = softmax(scores, dim=-1)  # (..., n, m)",
                                        "weights = torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True)"),
}


@pytest.mark.parametrize("name", list(REQUIREMENTS))
def test_stated_requirement_broken_alone_loses_points_on_its_check(name):
    assert_requirement_broken_alone(A, STATED_REQUIREMENTS, REQUIREMENTS, name)


# -- conceptual questions (issue 14) ------------------------------------------------------------------


def test_reference_answers_to_questions_get_full_marks():
    assert_questions_pass(A, SETUP + QUESTIONS)


@pytest.mark.parametrize("gid, value", [
    ("test_q_score_variance", 64), ("test_q_variance_over_dk", 0.015625), ("test_q_weight", 0.731),
    ("test_q_output_shape", [8, 3, 5, 32]), ("test_q_output_shape", torch.Size([8, 3, 5, 32])),
])
def test_right_answers_in_other_forms_get_the_point(gid, value):
    assert grade_answer(A, gid, **{gid.removeprefix("test_"): value}) == ""


QUESTION_MISTAKES = [
    # (check, wrong value, words its message must contain)
    ("test_q_score_variance", 1.0, "after dividing by sqrt(d_k)"),
    ("test_q_score_variance", 8.0, "standard deviation"),
    ("test_q_score_variance", 4096, "d_k^2"),
    ("test_q_score_variance", 0, "mean"),
    ("test_q_variance_over_dk", 1.0, "d_k^2"),
    ("test_q_variance_over_dk", 0.125, "standard deviation"),
    ("test_q_variance_over_dk", 64, "without any scaling"),
    ("test_q_variance_over_dk", 8, "not by sqrt(c)"),
    ("test_q_weight", 0.8808, "without the 1/sqrt(d_k) scaling"),
    ("test_q_weight", 0.6225, "by d_k = 4"),
    ("test_q_weight", 0.2689, "second key"),
    ("test_q_weight", 1.0, "normalises the scores themselves"),
    ("test_q_weight", 0.5, "alike"),
    ("test_q_output_shape", (8, 3, 5, 16), "d_v"),
    ("test_q_output_shape", (8, 3, 7, 32), "one row per query"),
    ("test_q_output_shape", (8, 3, 5, 7), "shape of the weights"),
    ("test_q_output_shape", (5, 32), "leading"),
]


@pytest.mark.parametrize("gid, value, words", QUESTION_MISTAKES)
def test_usual_wrong_answer_is_named(gid, value, words):
    assert_answer_named(A, gid, value, words)


@pytest.mark.parametrize("gid, value", [("test_q_score_variance", 17.0), ("test_q_weight", 0.3),
                                        ("test_q_output_shape", (1, 2)), ("test_q_score_variance", "64"),
                                        ("test_q_output_shape", 64)])
def test_other_wrong_answers_fail_without_giving_the_answer_away(gid, value):
    message = grade_answer(A, gid, **{gid.removeprefix("test_"): value})
    assert message and "64.0" not in message and "0.731" not in message and "(8, 3, 5, 32)" not in message, message


def test_unanswered_question_says_so():
    assert "assign your answer to q_weight" in grade_answer(A, "test_q_weight")


NUMPY_ANSWERS = ("import numpy as np\nq_score_variance = np.int64(64)\nq_variance_over_dk = np.float32(0.015625)\n"
                 "q_weight = np.float64(0.731)\n"
                 "q_output_shape = (np.int64(8), np.int32(3), np.float64(5.0), np.int64(32))\n")


@pytest.mark.slow
@pytest.mark.parametrize("sandboxed", [False, True], ids=["local", "sandbox"])
def test_numpy_scalars_answer_questions_like_python_numbers(sandboxed):
    """A numpy scalar is a number (issue 20): alone or inside a tuple, it earns the point, whether the answer
    is read in a notebook kernel or across the sandbox's wire."""
    from autograder.judging.checks import LocalBackend, load_suite, seed_for
    from autograder.judging.judge import SandboxBackend
    from autograder.isolation.sandbox import Limits, Sandbox

    suite = load_suite(A)
    questions = [gid for gid in suite.checks if gid.startswith("test_q_")]
    with Sandbox(limits=Limits(cell_timeout=20, call_timeout=10, notebook_timeout=120)) if sandboxed \
            else contextlib.nullcontext() as box:
        if sandboxed:
            assert box.request({"op": "exec", "code": NUMPY_ANSWERS, "label": "<t>"}, timeout=20)["ok"]
            backend = SandboxBackend(box, box.limits)
            assert backend.value("q_output_shape") == (8, 3, 5.0, 32)  # what the judge receives: plain numbers
            assert type(backend.value("q_weight")) is float and type(backend.value("q_score_variance")) is int
        else:
            backend = LocalBackend(namespace(NUMPY_ANSWERS))
        for gid in questions:
            suite.run(gid, backend, seed_for("t", A, gid))  # raises CheckFailed if marked down


# -- issue 34: every check anchored to the reference ------------------------------------------------------

UNIFORM = REF + '''
def scaled_dot_product_attention(query, key, value, mask=None):
    """Weights uniform over the allowed keys, whatever the queries and keys are."""
    allowed = torch.ones(*query.shape[:-1], key.shape[-2], dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    w = allowed.to(query.dtype) / allowed.sum(-1, keepdim=True).clamp_min(1).to(query.dtype)
    return w @ value, w
'''
ZERO_OUTPUT = mutate(REF, "return weights @ value, weights", "return torch.zeros_like(weights @ value), weights")


@pytest.mark.parametrize("code", [UNIFORM, ZERO_OUTPUT], ids=["uniform-weights", "zero-output"])
def test_an_answer_that_ignores_its_inputs_earns_only_the_shapes(code):
    """Issue 34: the mask, fully-masked and dtype checks compare the answer with itself; they first establish that it
    is attention of its inputs (the weights follow the scores at the student's own fitted scale)."""
    results = assert_earns_only(A, code, "scaled_dot_product_attention", {"test_sdpa_shapes"})
    assert "do not follow the scores" in results["test_sdpa_mask"] or "weights times the values" in results["test_sdpa_mask"]

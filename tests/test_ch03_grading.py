"""Exercise 03's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest

from autograder.judging.checks.ch03_self_attention import STATED_REQUIREMENTS
from chapter_checking import (UNIFORM_LAYER, assert_answer_named, assert_earns_only, assert_questions_pass, assert_requirement_broken_alone, grade_answer,
                              question_answers)
from checking import assert_delegation_named, assert_full_marks, assert_mistake_named, mutate, namespace, source_code

A = "03_self_attention"
REF = source_code(A)
SETUP = REF.split("class SelfAttention")[0]  # the given setup cell
# the reference answers to the conceptual questions, appended to the unusual (otherwise complete) answers below
QUESTIONS = question_answers(A, "self_attention.ipynb")

UNUSUAL = SETUP + '''
class SelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = MultiHeadAttention(embed_dim, num_heads)

    def forward(self, x, mask=None):
        if mask is None:
            return self.attn(x, x, x)
        return self.attn(query=x, key=x, value=x, mask=mask)


def design_weights(x, targets):
    # queries pick the target directly, keys are a scaled copy of the embeddings; float64 inside
    x64 = x.double()
    onehot = torch.nn.functional.one_hot(targets.long(), x.shape[0]).double()  # (n, n)
    W_q = (x64.T @ onehot @ x64) * 6.0                 # (d, d)
    W_k = x64.T @ x64 * 6.0 * x.shape[1] ** 0.5        # (d, d) projects onto the span of the rows
    return W_q.to(x.dtype), W_k.to(x.dtype)
''' + QUESTIONS

# The key side does the choosing instead: key j is the embedding of every position that targets j.
KEY_SIDE = SETUP + REF.split("def design_weights")[0].split(SETUP)[1] + '''
def design_weights(x, targets):
    n, d = x.shape
    S = torch.zeros(n, n)
    for i, t in enumerate(targets.tolist()):
        S[i, t] = 1.0
    W_q = torch.eye(d) * 5 * d ** 0.25
    W_k = x.cpu().T @ S.T @ x.cpu() * 5 * d ** 0.25
    return W_q.to(x.device), W_k.to(x.device)
''' + QUESTIONS

# The text leaves d_k free (any width of at least 1): keys one-hot in n dimensions, d_k = n != d.
NARROW_KEYS = SETUP + REF.split("def design_weights")[0].split(SETUP)[1] + '''
def design_weights(x, targets):
    n, d = x.shape
    S = torch.nn.functional.one_hot(targets.long().cpu(), n).to(x.dtype)  # (n, n) S[i, targets[i]] = 1
    W_k = x.cpu().T.contiguous()  # (d, n): the keys x W_k = x x^T = I, one-hot
    W_q = 12.0 * n ** 0.5 * x.cpu().T @ S  # (d, n): the query of i is 12 sqrt(n) times key targets[i]
    return W_q.to(x.device), W_k.to(x.device)
''' + QUESTIONS


def test_reference_gets_full_marks():
    assert_full_marks(A, REF)


@pytest.mark.parametrize("code", [UNUSUAL, KEY_SIDE, NARROW_KEYS],
                         ids=["keywords-onehot-float64", "key-side-loop", "d_k-equals-n"])
def test_unusual_correct_answers_get_full_marks(code):
    assert_full_marks(A, code)


FWD = "return self.attn(x, x, x, mask)  # (B, n, E), (B, H, n, n)"
DESIGN = "W_q = strength * math.sqrt(d) * x.T @ select @ x"
MISTAKES = {
    "mask ignored": (mutate(REF, FWD, "return self.attn(x, x, x)"), ["test_self_attention_mask"], "mask is ignored"),
    "attn built in forward": (mutate(REF, FWD, "self.attn = MultiHeadAttention(x.shape[-1], self.attn.num_heads)\n"
                                     "        return self.attn(x, x, x, mask)"),
                              ["test_self_attention_values"], "in __init__"),
    "only the output": (mutate(REF, FWD, "return self.attn(x, x, x, mask)[0]"),
                        ["test_self_attention_shapes", "test_self_attention_values"], "pair"),
    "wrong attribute name": (mutate(mutate(REF, "self.attn = MultiHeadAttention", "self.mha = MultiHeadAttention"),
                                    FWD, "return self.mha(x, x, x, mask)"), ["test_self_attention_shapes"], "attn"),
    "attends to itself": (mutate(REF, DESIGN, "W_q = strength * math.sqrt(d) * x.T @ x"), ["test_design_weights"],
                          "attends to itself"),
    "transposed pattern": (mutate(REF, DESIGN, "W_q = strength * math.sqrt(d) * x.T @ select.T @ x"),
                           ["test_design_weights"], "transposed"),
    "too weak": (mutate(REF, "strength = 12.0", "strength = 1.0"), ["test_design_weights"], "scale"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *MISTAKES[name])


def test_delegation_earns_nothing_for_that_part():
    code = REF + "\nclass SelfAttention(nn.Module):\n    def __init__(self, e, h):\n        super().__init__()\n" \
                 "        self.attn = nn.MultiheadAttention(e, h, batch_first=True)\n"
    results = assert_delegation_named(A, code, "SelfAttention")
    assert results["test_design_weights"] == ""


# -- stated requirements (issue 13): each one broken alone loses points on its check, named -------------

REQUIREMENTS = {
    # requirement (as in STATED_REQUIREMENTS, which names its check and message): a mutant of the reference
    # that breaks only it
    "attribute attn": MISTAKES["wrong attribute name"][0],
    "returns (output, weights) of the right shapes": MISTAKES["only the output"][0],
    "x is query, key and value": mutate(REF, FWD, "out, w = self.attn(x, x, x, mask)\n        return out + x, w"),
    "attn created once in __init__": MISTAKES["attn built in forward"][0],
    "mask passed on": MISTAKES["mask ignored"][0],
    "fully masked row gives zeros": mutate(REF, FWD, "if mask is not None:  # switch empty rows back on, no NaN\n"
                                                      "            mask = mask | ~mask.any(-1, keepdim=True)\n        " + FWD),
    "permutation equivariance": mutate(REF, FWD, "x = x + 0.1 * torch.arange(x.shape[1], dtype=x.dtype)[:, None]\n"
                                                  "        " + FWD),
    "design: a pair of (d, d_k) matrices": mutate(REF, "    return W_q, W_k\n", "    return W_q\n"),
    "design: at least 0.9 on the target": MISTAKES["too weak"][0],
    "design: shared targets": mutate(REF, DESIGN, "W_q = strength * math.sqrt(d) * x[torch.argsort(targets)].T @ x"),
}


@pytest.mark.parametrize("name", list(REQUIREMENTS))
def test_stated_requirement_broken_alone_loses_points_on_its_check(name):
    assert_requirement_broken_alone(A, STATED_REQUIREMENTS, REQUIREMENTS, name)


def test_shared_target_mutant_is_right_on_permutations():
    """The argsort mutant above breaks only the shared-targets requirement: on a permutation it is right."""
    import torch

    ns = namespace(REQUIREMENTS["design: shared targets"])
    x, targets = torch.eye(4), torch.tensor([2, 0, 3, 1])
    W_q, W_k = ns["design_weights"](x, targets)
    weights = torch.softmax((x @ W_q) @ (x @ W_k).T / 2.0, dim=-1)
    assert bool((weights[torch.arange(4), targets] >= 0.9).all())


# -- conceptual questions (issue 14) ------------------------------------------------------------------


def test_reference_answers_to_questions_get_full_marks():
    assert_questions_pass(A, SETUP + QUESTIONS)


@pytest.mark.parametrize("gid, value", [
    ("test_q_changed_rows", (2, 0)), ("test_q_changed_rows", [0, 2]), ("test_q_weights_memory", 1024),
    ("test_q_scores_flops", 134217728.0), ("test_q_margin", 3.296),
])
def test_right_answers_in_other_forms_get_the_point(gid, value):
    assert grade_answer(A, gid, **{gid.removeprefix("test_"): value}) == ""


QUESTION_MISTAKES = [
    # (check, wrong value, words its message must contain)
    ("test_q_changed_rows", (), "equivariant, not invariant"),
    ("test_q_changed_rows", (0, 1, 2, 3), "set"),
    ("test_q_changed_rows", (3, 1), "stay the same"),
    ("test_q_changed_rows", (0,), "two inputs"),
    ("test_q_weights_memory", 256, "entries"),
    ("test_q_weights_memory", 64, "one head"),
    ("test_q_weights_memory", 1073.741824, "MB"),
    ("test_q_weights_memory", 0.25, "linearly"),
    ("test_q_weights_memory", 2048, "8 bytes"),
    ("test_q_scores_flops", 1024 * 1024 * 64, "multiply-adds"),
    ("test_q_scores_flops", 2 * 1024 * 64 * 64, "projection"),
    ("test_q_scores_flops", 1024 * 1024, "number of scores"),
    ("test_q_scores_flops", 2 * 1024 * 64, "one query's row"),
    ("test_q_margin", 2.197, "one other key"),
    ("test_q_margin", 0.9, "weight itself"),
    ("test_q_margin", -0.1054, "denominator"),
    ("test_q_margin", 27, "logarithm"),
    ("test_q_margin", 1.281, "solve"),
]


@pytest.mark.parametrize("gid, value, words", QUESTION_MISTAKES)
def test_usual_wrong_answer_is_named(gid, value, words):
    assert_answer_named(A, gid, value, words)


@pytest.mark.parametrize("gid, value", [("test_q_changed_rows", (0, 3)), ("test_q_weights_memory", 1000),
                                        ("test_q_scores_flops", 12345), ("test_q_margin", "ln 27")])
def test_other_wrong_answers_fail_without_giving_the_answer_away(gid, value):
    message = grade_answer(A, gid, **{gid.removeprefix("test_"): value})
    assert message and "(0, 2)" not in message and "1024" not in message and "134217728" not in message \
        and "3.29" not in message, message


# -- issue 34: every check anchored to the reference ------------------------------------------------------

UNIFORM = mutate(REF, FWD, "return _uniform(self.attn, x, x, x, mask)") + UNIFORM_LAYER


def test_an_answer_that_ignores_its_inputs_earns_only_the_shapes():
    """Issue 34: uniform weights earned the mask check (its own weights renormalised) and the permutation check (a
    mean over the keys is permutation equivariant)."""
    results = assert_earns_only(A, UNIFORM, "SelfAttention", {"test_self_attention_shapes"})
    assert all("not attention of its inputs" in results[g] for g in
               ("test_self_attention_mask", "test_self_attention_permutation")), results
